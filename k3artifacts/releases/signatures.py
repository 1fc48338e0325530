"""Release tuple signatures: ``releases/tuples/<id>.sig`` beside ``<id>.json``, create-once.

The statement's subject is the tuple record (its id, and the sha256 of its stored canonical
bytes, so who/when are covered too); the predicate repeats the binding in the terms a reviewer
reads: revision, manifest digest, image digest, serving args, license sha256. A tuple body
edited after signing no longer hashes to the subject; a signature moved to another tuple names
another id.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.errors import AlreadyExists, K3AError, StoredRecordRefused
from k3artifacts.releases.tuples import TUPLE_PREFIX, ReleaseTuple, TupleStore, tuple_key
from k3artifacts.signing.attestation import statement, verify_statement
from k3artifacts.signing.dsse import BundleError
from k3artifacts.signing.keys import ReleaseSigner
from k3artifacts.stores.records import RecordStore

PREDICATE_TYPE = "urn:k3artifacts:release-tuple:v1"


def signature_key(tuple_id: str) -> str:
    return f"{TUPLE_PREFIX}{tuple_id}.sig"


def tuple_predicate(release: ReleaseTuple) -> dict[str, Any]:
    b = release.binding
    return {
        "revision": f"{b.weights.repo_id}@{b.weights.commit}",
        "manifest_digest": b.weights.manifest_digest,
        "location": b.weights.location,
        "image": b.image.reference,
        "image_digest": b.image.digest,
        "serving_profile": b.serving.profile,
        "serving_args": list(b.serving.args),
        "serving_env": dict(b.serving.env),
        "license_sha256": b.license_sha256,
    }


def _subject(store: RecordStore, tuple_id: str) -> tuple[ReleaseTuple, str]:
    release = TupleStore(store).get(tuple_id)  # refuses a body that no longer derives its id
    found = store.read(tuple_key(tuple_id))
    assert found is not None  # get() just read it
    return release, hashlib.sha256(found.data).hexdigest()


@dataclass(frozen=True)
class TupleSignature:
    key: str
    key_hint: str
    new: bool


def sign_tuple(store: RecordStore, tuple_id: str, signer: ReleaseSigner) -> TupleSignature:
    release, digest = _subject(store, tuple_id)
    predicate = tuple_predicate(release)
    key = signature_key(tuple_id)
    try:
        store.create(key, signer.sign(statement(tuple_id, digest, PREDICATE_TYPE, predicate)))
    except AlreadyExists:
        try:
            check_tuple_signature(store, tuple_id, {"signer": signer.public_key})
        except K3AError:
            raise AlreadyExists(key) from None
        return TupleSignature(key, signer.key_hint, new=False)
    return TupleSignature(key, signer.key_hint, new=True)


class TupleSignatureRefused(StoredRecordRefused):
    """A tuple's signature record that is missing, by a key not trusted, or over other bytes."""

    hint = "do not promote or serve this tuple; re-create and re-sign it with a trusted key"


def check_tuple_signature(
    store: RecordStore, tuple_id: str, trusted: dict[str, ec.EllipticCurvePublicKey]
) -> str:
    """Name of the trusted key that signed ``tuple_id``; :class:`TupleSignatureRefused`
    (naming the record and the reason) if the signature is missing, untrusted or over other
    bytes."""
    key = signature_key(tuple_id)
    found = store.read(key)
    if found is None:
        raise TupleSignatureRefused(f"{key}: missing: tuple {tuple_id} is not signed")
    release, digest = _subject(store, tuple_id)
    try:
        verified = verify_statement(
            found.data, trusted, name=tuple_id, sha256=digest,
            predicate_type=PREDICATE_TYPE, predicate=tuple_predicate(release),
        )
    except BundleError as exc:
        raise TupleSignatureRefused(f"{key}: {exc}") from None
    return verified.key_name
