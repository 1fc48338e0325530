"""A published revision's signature, in the OpenSSF model-signing format, from known digests.

The statement is what ``model_signing sign key`` would write for the published directory: one
resource per file with its sha256, plus ``.k3a/manifest.json``, with the signature file and the
S3 bookkeeping record listed as ignored. The digests come from the manifest staging already
wrote (every sha256 was computed as the bytes arrived), so signing a 1.56 TB revision reads
one small file, not 1.56 TB. The signature is stored at ``<revision>/.k3a/model.sig`` (create
once), where ``model_signing verify key <dir> --signature <dir>/.k3a/model.sig`` finds it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from k3artifacts.errors import AlreadyExists
from k3artifacts.revisions.manifest import (
    MANIFEST_NAME,
    META_DIR,
    PROVENANCE_NAME,
    ShardManifest,
    revision_prefix,
)
from k3artifacts.signing.dsse import STATEMENT_TYPE, BundleError, verify_bundle
from k3artifacts.signing.keys import ReleaseSigner
from k3artifacts.stores.base import OBJECT_RECORDS_REL, Store

SIGNATURE_NAME = "model.sig"
SIGNATURE_REL = f"{META_DIR}/{SIGNATURE_NAME}"
MANIFEST_REL = f"{META_DIR}/{MANIFEST_NAME}"
#: Files of a revision directory that the signature does not cover: itself, and what differs
#: between stores holding the same weights (the store's record of where the bytes live, and
#: of where they came from): one signature then verifies in every store.
IGNORED = (SIGNATURE_REL, OBJECT_RECORDS_REL, f"{META_DIR}/{PROVENANCE_NAME}")
PREDICATE_TYPE = "https://model_signing/signature/v1.0"


def signature_key(repo_id: str, commit: str) -> str:
    return f"{revision_prefix(repo_id, commit)}/{SIGNATURE_REL}"


def _order(name: str) -> tuple[str, ...]:
    # model-signing sorts resources as PurePosixPath objects (by path components), which is
    # not plain string order ("a/b" < "a.b/c"); its root digest follows that order.
    return PurePosixPath(name).parts


def signed_digests(manifest: ShardManifest, manifest_bytes: bytes) -> dict[str, str]:
    """Every covered path of the revision with its sha256: the files, then the manifest."""
    digests = {record.path: record.sha256 for record in manifest.files}
    digests[MANIFEST_REL] = hashlib.sha256(manifest_bytes).hexdigest()
    return digests


def revision_statement(manifest: ShardManifest, manifest_bytes: bytes) -> dict[str, Any]:
    digests = signed_digests(manifest, manifest_bytes)
    names = sorted(digests, key=_order)
    root = hashlib.sha256(b"".join(bytes.fromhex(digests[n]) for n in names)).hexdigest()
    return {
        "_type": STATEMENT_TYPE,
        # The directory's name, as model-signing records it: the published tree ends in it.
        "subject": [{"name": manifest.commit, "digest": {"sha256": root}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "serialization": {
                "method": "files",
                "hash_type": "sha256",
                "allow_symlinks": False,
                "ignore_paths": list(IGNORED),
            },
            "resources": [
                {"name": n, "algorithm": "sha256", "digest": digests[n]} for n in names
            ],
        },
    }


@dataclass(frozen=True)
class RevisionSignature:
    key: str
    key_hint: str
    files: int
    #: False when an equivalent signature by the same key was already stored.
    new: bool


def published_manifest_bytes(store: Store, repo_id: str, commit: str) -> bytes:
    return store.published_manifest_bytes(
        repo_id, commit, hint="stage it first (`k3a stage`); only a published revision is signed"
    )


def sign_revision(store: Store, repo_id: str, commit: str,
                  signer: ReleaseSigner) -> RevisionSignature:
    """Sign a published revision and store ``.k3a/model.sig``; reads only its manifest."""
    raw = published_manifest_bytes(store, repo_id, commit)
    statement = revision_statement(
        ShardManifest.parse(raw, f"the manifest of {repo_id}@{commit} in {store.url}"), raw)
    key = signature_key(repo_id, commit)
    files = len(statement["predicate"]["resources"])
    try:
        store.add_to_revision(repo_id, commit, SIGNATURE_REL, signer.sign(statement))
    except AlreadyExists:
        existing = store.read(key)
        public = {"signer": signer.public_key}
        try:
            same = existing is not None and (
                verify_bundle(existing.data, public).statement == statement
            )
        except BundleError:
            same = False
        if not same:
            raise AlreadyExists(key) from None
        return RevisionSignature(key, signer.key_hint, files, new=False)
    return RevisionSignature(key, signer.key_hint, files, new=True)


@dataclass(frozen=True)
class SignatureProblem:
    path: str
    reason: str


def check_revision_statement(
    statement: dict[str, Any], manifest: ShardManifest, manifest_bytes: bytes
) -> list[SignatureProblem]:
    """What differs between a verified statement and the revision's manifest, by path."""
    try:
        predicate = statement["predicate"]
        resources = {r["name"]: (r["algorithm"], r["digest"]) for r in predicate["resources"]}
        serialization = predicate["serialization"]
    except (KeyError, TypeError) as exc:
        return [SignatureProblem(SIGNATURE_REL, f"signed statement lacks {exc}")]
    if statement.get("predicateType") != PREDICATE_TYPE:
        return [SignatureProblem(SIGNATURE_REL, f"predicate {statement.get('predicateType')!r} "
                                 f"is not a model signature ({PREDICATE_TYPE})")]
    if serialization.get("method") != "files" or serialization.get("hash_type") != "sha256":
        return [SignatureProblem(SIGNATURE_REL, f"signed with serialization {serialization}, "
                                 "not files/sha256")]
    problems = []
    expected = signed_digests(manifest, manifest_bytes)
    for path in sorted(expected.keys() | resources.keys(), key=_order):
        signed = resources.get(path)
        if signed is None:
            problems.append(SignatureProblem(path, "in the manifest but not signed"))
        elif path not in expected:
            problems.append(SignatureProblem(path, "signed but absent from the manifest"))
        elif signed != ("sha256", expected[path]):
            problems.append(SignatureProblem(
                path, f"sha256 {expected[path]}, the signature says {signed[1]}"
            ))
    return problems
