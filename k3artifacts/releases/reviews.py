"""Recording that a person read a tuple's license text or its remote code.

A review is a create-once record in the store, like tuples and history::

    releases/reviews/license/<sha256>.json     one per license text
    releases/reviews/code/<sha256>.json        one per remote-code file

It binds a sha256, not a repo or a version: a license text that changes by one byte needs a
new review, and the same text reviewed once passes for every later revision that carries it.
It records who reviewed, as the same identity source that records who promotes (STS on S3,
the account of the real uid on file stores; ``policy/actor.py``), so a gate can tell the two
apart. Only ``k3a review`` writes them (the moves: :mod:`.reviewing`); a file under
``policies/`` counts for nothing. Recording is idempotent: content already reviewed is not
recorded again (the first review stands).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import AlreadyExists, K3AError
from k3artifacts.releases.tuples import TUPLE_ID, ReleaseTuple
from k3artifacts.revisions.manifest import ShardManifest
from k3artifacts.stores.records import RecordStore

REVIEWS_PREFIX = "releases/reviews/"
SHA256_HEX = r"^[0-9a-f]{64}$"
ReviewKind = Literal["license", "code"]


class Review(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = 1
    kind: ReviewKind
    sha256: str = Field(pattern=SHA256_HEX)
    #: The file reviewed, as named in the revision (``LICENSE``, ``modeling_kimi.py``).
    path: str | None = None
    reviewed_by: str = Field(min_length=1)
    #: Where ``reviewed_by`` came from: ``sts``, ``os-user`` or ``claimed``.
    reviewer_source: str
    reviewed_at: datetime
    tuple_id: str = Field(pattern=TUPLE_ID.pattern)
    repo_id: str
    commit: str
    #: The model card's license name at review time, for people reading the record.
    license: str | None = None
    note: str | None = None


class CorruptReview(K3AError):
    exit_code = 9
    hint = "review records are written only by `k3a review`; inspect or remove the key named"


class LicenseReviewOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    tuple_id: str
    review: Review
    key: str
    #: False: this sha256 was already reviewed; ``review`` is the earlier one.
    written: bool


class CodeReviewOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    tuple_id: str
    recorded: list[Review]
    already_reviewed: list[Review]


def review_key(kind: ReviewKind, sha256: str) -> str:
    return f"{REVIEWS_PREFIX}{kind}/{sha256}.json"


def read_review(store: RecordStore, kind: ReviewKind, sha256: str) -> Review | None:
    """The review of ``sha256``, or None. A record that does not parse, or that is filed under
    another sha256 or kind than it says, is refused naming its key (someone edited the store)."""
    key = review_key(kind, sha256)
    found = store.read(key)
    if found is None:
        return None
    try:
        review = Review.model_validate_json(found.data)
    except ValidationError as exc:
        raise CorruptReview(f"review record {key} is malformed: {exc.errors()[0]['msg']}") from None
    if (review.kind, review.sha256) != (kind, sha256):
        raise CorruptReview(
            f"review record {key} is about {review.kind} {review.sha256}, not its key's"
        )
    return review


def list_reviews(store: RecordStore, kind: ReviewKind) -> list[Review]:
    """Every review of ``kind``, oldest first."""
    prefix = f"{REVIEWS_PREFIX}{kind}/"
    found = []
    for key in store.list_keys(prefix):
        sha = key[len(prefix) :].removesuffix(".json")
        review = read_review(store, kind, sha)
        if review is not None:
            found.append(review)
    return sorted(found, key=lambda r: r.reviewed_at)


def create_review(store: RecordStore, review: Review) -> tuple[Review, bool]:
    """Record ``review`` unless its sha256 is reviewed already: (the review that stands,
    whether this call wrote it)."""
    try:
        store.create(review_key(review.kind, review.sha256), canonical_json(review))
    except AlreadyExists:
        earlier = read_review(store, review.kind, review.sha256)
        if earlier is None:
            raise
        return earlier, False
    return review, True


def reviewers_of(
    store: RecordStore, release: ReleaseTuple, manifest: ShardManifest | None
) -> dict[str, set[str]]:
    """Who reviewed what ``release`` carries: ``{"license": {...}, "code": {...}}``."""
    found: dict[str, set[str]] = {"license": set(), "code": set()}
    sha = release.binding.license_sha256
    if sha is not None and (review := read_review(store, "license", sha)) is not None:
        found["license"].add(review.reviewed_by)
    for entry in [] if manifest is None else manifest.remote_code:
        if (review := read_review(store, "code", entry.sha256)) is not None:
            found["code"].add(review.reviewed_by)
    return found
