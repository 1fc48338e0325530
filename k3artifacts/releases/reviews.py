"""Recording that a person read a tuple's license text or its remote code.

A review binds a sha256, not a repo or a version: a license text that changes by one byte needs
a new review, and the same text reviewed once passes for every later revision that carries it.
Recording is idempotent: content already reviewed (in any file) is not recorded again.
"""

from __future__ import annotations

import hashlib
from datetime import date
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from k3artifacts.errors import NotFound, VerifyMismatch
from k3artifacts.releases.policies import (
    CODE_REVIEWS_DIR,
    LICENSES_DIR,
    CodeReview,
    CodeReviewFile,
    LicenseReview,
    LicenseReviewFile,
    append_reviews,
    load_code_reviews,
    load_license_reviews,
    review_file_for,
)
from k3artifacts.releases.tuples import ReleaseTuple, TupleStore
from k3artifacts.revisions.manifest import ShardManifest, manifest_key, revision_prefix
from k3artifacts.stores.base import Store


class LicenseReviewOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    tuple_id: str
    review: LicenseReview
    file: str
    #: False: this sha256 was already reviewed; ``review`` is the earlier one.
    written: bool


class CodeReviewOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    tuple_id: str
    recorded: list[CodeReview]
    already_reviewed: list[CodeReview]
    file: str | None


def _manifest(store: Store, release: ReleaseTuple) -> ShardManifest:
    w = release.binding.weights
    manifest = store.read_manifest(w.repo_id, w.commit)
    if manifest is None:
        raise NotFound(
            f"the weights of {release.id} ({w.repo_id}@{w.commit}) are not in {store.url}: "
            f"no {manifest_key(w.repo_id, w.commit)}",
            hint=f"stage the revision first: `k3a stage {w.repo_id} --revision {w.commit}`",
        )
    return manifest


def license_text(store: Store, tuple_id: str) -> str:
    """The license file of ``tuple_id``'s revision, read from the store and checked against
    the tuple's license sha256: the bytes a review is about, decoded for reading."""
    release = TupleStore(store).get(tuple_id)
    path = _manifest(store, release).license.path
    sha = release.binding.license_sha256
    if path is None or sha is None:
        raise NotFound(f"tuple {tuple_id} binds no license text (its revision has no LICENSE)")
    w = release.binding.weights
    with store.open_read(f"{revision_prefix(w.repo_id, w.commit)}/{path}") as fh:
        raw = fh.read()
    if hashlib.sha256(raw).hexdigest() != sha:
        raise VerifyMismatch(
            f"{path} of {w.repo_id}@{w.commit} in {store.url} does not hash to the license "
            f"sha256 {sha} that {tuple_id} binds; do not review it"
        )
    return raw.decode("utf-8", errors="replace")


def review_license(
    store: Store,
    tuple_id: str,
    *,
    by: str,
    policies_dir: Path,
    note: str | None = None,
    today: date | None = None,
) -> LicenseReviewOutcome:
    release = TupleStore(store).get(tuple_id)
    sha = release.binding.license_sha256
    if sha is None:
        raise NotFound(
            f"tuple {tuple_id} binds no license text (its revision has no LICENSE file)",
            hint="a release without a license cannot pass the license gate; ask upstream",
        )
    existing = load_license_reviews(policies_dir)
    if sha in existing:
        review, path = existing[sha]
        return LicenseReviewOutcome(tuple_id=tuple_id, review=review, file=str(path), written=False)
    w = release.binding.weights
    manifest = store.read_manifest(w.repo_id, w.commit)
    card = None if manifest is None else manifest.license
    review = LicenseReview(
        sha256=sha,
        reviewed_by=by,
        reviewed_on=today or date.today(),
        repo_id=w.repo_id,
        commit=w.commit,
        license=None if card is None else (card.card_license_name or card.card_license),
        note=note,
    )
    path = review_file_for(policies_dir, LICENSES_DIR, w.repo_id)
    append_reviews(path, LicenseReviewFile, [review])
    return LicenseReviewOutcome(tuple_id=tuple_id, review=review, file=str(path), written=True)


def review_code(
    store: Store,
    tuple_id: str,
    *,
    by: str,
    policies_dir: Path,
    note: str | None = None,
    today: date | None = None,
) -> CodeReviewOutcome:
    """Record every remote-code file of the tuple's revision that no review covers yet."""
    release = TupleStore(store).get(tuple_id)
    manifest = _manifest(store, release)
    existing = load_code_reviews(policies_dir)
    w = release.binding.weights
    recorded: list[CodeReview] = []
    already: list[CodeReview] = []
    for entry in manifest.remote_code:
        if entry.sha256 in existing:
            already.append(existing[entry.sha256][0])
        elif all(r.sha256 != entry.sha256 for r in recorded):
            recorded.append(
                CodeReview(
                    sha256=entry.sha256,
                    path=entry.path,
                    reviewed_by=by,
                    reviewed_on=today or date.today(),
                    repo_id=w.repo_id,
                    commit=w.commit,
                    note=note,
                )
            )
    path = review_file_for(policies_dir, CODE_REVIEWS_DIR, w.repo_id) if recorded else None
    if path is not None:
        append_reviews(path, CodeReviewFile, recorded)
    return CodeReviewOutcome(
        tuple_id=tuple_id,
        recorded=recorded,
        already_reviewed=already,
        file=None if path is None else str(path),
    )
