"""``k3a sign``: a published revision or a release tuple signed after the fact, planned, then
signed.

The plan loads the key, reads what is signed (the revision's manifest, or the tuple, refused if
tampered) and any signature already stored: by this key over the same statement, there is
nothing to do; by another key, it is refused (a signature is created once). The act signs and
stores (``signing/revision.py``, :mod:`.signatures`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from k3artifacts.errors import AlreadyExists, ConfigError, K3AError
from k3artifacts.releases import signatures
from k3artifacts.releases.tuples import TUPLE_ID, TupleStore
from k3artifacts.revisions.manifest import ShardManifest
from k3artifacts.revisions.refs import match_revision_ref
from k3artifacts.signing.dsse import BundleError, verify_bundle
from k3artifacts.signing.keys import KeyReference, ReleaseSigner
from k3artifacts.signing.revision import (
    published_manifest_bytes,
    revision_statement,
    sign_revision,
    signature_key,
)
from k3artifacts.stores.base import Store
from k3artifacts.trust.keys import release_signer


@dataclass(frozen=True)
class SignPlan:
    #: As given: ``org/name@<commit>`` or a tuple id.
    target: str
    kind: Literal["revision", "tuple"]
    signer: ReleaseSigner
    #: Where the signature is stored.
    key: str
    #: Signed already by this key over the same statement: nothing to write.
    signed: bool
    #: A revision: the files its signature covers.
    files: int | None = None


@dataclass(frozen=True)
class Signed:
    target: str
    signature: str
    key_hint: str
    new: bool
    files: int | None = None


def _same_revision_signature(store: Store, key: str, signer: ReleaseSigner,
                             statement: dict) -> bool:  # type: ignore[type-arg]
    found = store.read(key)
    if found is None:
        return False
    try:
        same = verify_bundle(found.data, {"signer": signer.public_key}).statement == statement
    except BundleError:
        same = False
    if not same:
        raise AlreadyExists(key)
    return True


def _same_tuple_signature(store: Store, tuple_id: str, signer: ReleaseSigner) -> bool:
    key = signatures.signature_key(tuple_id)
    if store.read(key) is None:
        return False
    try:
        signatures.check_tuple_signature(store, tuple_id, {"signer": signer.public_key})
    except K3AError:
        raise AlreadyExists(key) from None
    return True


def plan_sign(store: Store, target: str, signing_key: str | KeyReference | None) -> SignPlan:
    """``signing_key`` None: this process's identity key (``K3A_IDENTITY_KEY``, else the
    personal key). ConfigError (exit 9) for an unusable key (one that is not ECDSA P-256/P-384
    included) or a target that is neither a revision nor a tuple id; NotFound (exit 7) for a
    revision not published, an unknown tuple or no identity key; AlreadyExists (exit 6) when
    another key signed it."""
    signer = release_signer(signing_key)
    ref = match_revision_ref(target)
    if ref is not None:
        raw = published_manifest_bytes(store, ref.repo_id, ref.commit)
        statement = revision_statement(ShardManifest.parse(
            raw, f"the manifest of {ref.repo_id}@{ref.commit} in {store.url}"), raw)
        key = signature_key(ref.repo_id, ref.commit)
        return SignPlan(str(ref), "revision", signer, key,
                        _same_revision_signature(store, key, signer, statement),
                        files=len(statement["predicate"]["resources"]))
    if not TUPLE_ID.match(target):
        raise ConfigError(
            f"{target!r} is neither org/name@<40-hex commit> nor a tuple id",
            hint="e.g. k3a sign moonshotai/Kimi-K3@<commit> --signing-key KEY.pem")
    TupleStore(store).get(target)  # refuses a body that no longer derives its id
    return SignPlan(target, "tuple", signer, signatures.signature_key(target),
                    _same_tuple_signature(store, target, signer))


def act_sign(store: Store, plan: SignPlan) -> Signed:
    hint = plan.signer.key_hint
    if plan.signed:
        return Signed(plan.target, plan.key, hint, new=False, files=plan.files)
    if plan.kind == "revision":
        ref = match_revision_ref(plan.target)
        assert ref is not None
        done = sign_revision(store, ref.repo_id, ref.commit, plan.signer)
        return Signed(plan.target, done.key, hint, new=done.new, files=done.files)
    signed = signatures.sign_tuple(store, plan.target, plan.signer)
    return Signed(plan.target, signed.key, hint, new=signed.new)


def sign(store: Store, target: str, signing_key: str | KeyReference | None) -> Signed:
    """The sign move: :func:`plan_sign`, then :func:`act_sign`."""
    return act_sign(store, plan_sign(store, target, signing_key))
