"""Recording that a person read a tuple's license text or its remote code.

A review is a create-once signed record in the store (``policy/signed.py``), like tuples and
history::

    releases/reviews/license/<sha256>.json     one per license text
    releases/reviews/code/<sha256>.json        one per remote-code file

It binds a sha256, not a repo or a version: a license text that changes by one byte needs a
new review, and the same text reviewed once passes for every later revision that carries it.
It is signed by the key of the identity that reviewed (role ``review``), and read only through
that signature, checked against the store's policy in force: so the reviewer a gate compares
with the promoter is an identity, never a typed name. A review written by hand, under another
name or edited after signing is refused by name (UntrustedRecord, exit 4). Only ``k3a review``
writes them (the moves: :mod:`.reviewing`); a file under ``policies/`` counts for nothing.
Recording is idempotent: content already reviewed is not recorded again (the first review
stands).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from k3artifacts.errors import UntrustedRecord
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.signed import Family, RecordTrust, read_signed, record_trust
from k3artifacts.releases.record_log import check_present
from k3artifacts.releases.records import create_record
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
    #: The identity whose key signed the review (the reader checks they agree).
    reviewed_by: str = Field(min_length=1)
    #: ``key``: an identity of the store's policy. Reviews written before records were signed
    #: say ``sts``, ``os-user`` or ``claimed``.
    reviewer_source: str
    reviewed_at: datetime
    tuple_id: str = Field(pattern=TUPLE_ID.pattern)
    repo_id: str
    commit: str
    #: The model card's license name at review time, for people reading the record.
    license: str | None = None
    note: str | None = None


REVIEWS = Family(REVIEWS_PREFIX, "review", Review, "reviewed_by")


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


def read_review(store: RecordStore, kind: ReviewKind, sha256: str, *,
                trust: RecordTrust | None = None, tuple_id: str | None = None) -> Review | None:
    """The review of ``sha256``, or None. A record that does not verify (unsigned, signed by a
    key the policy does not trust to review, edited), or that is about another sha256 or kind
    than its key, is refused naming its key (UntrustedRecord, exit 4); one ``tuple_id``'s
    record log names that is gone is named missing (RecordMissing, exit 4)."""
    key = review_key(kind, sha256)
    trust = trust or record_trust(store)
    review = read_signed(store, key, REVIEWS, trust=trust)
    if review is None and tuple_id is not None:
        check_present(store, tuple_id, key, (), trust=trust)
    if review is not None and (review.kind, review.sha256) != (kind, sha256):
        raise UntrustedRecord(key, "wrong-key", f"a review of {review.kind} {review.sha256}, "
                              "not of its key's")
    return review


def list_reviews(store: RecordStore, kind: ReviewKind, *,
                 trust: RecordTrust | None = None) -> list[Review]:
    """Every review of ``kind``, oldest first."""
    prefix = f"{REVIEWS_PREFIX}{kind}/"
    trust = trust or record_trust(store)
    found = []
    for key in store.list_keys(prefix):
        sha = key[len(prefix) :].removesuffix(".json")
        review = read_review(store, kind, sha, trust=trust)
        if review is not None:
            found.append(review)
    return sorted(found, key=lambda r: r.reviewed_at)


def create_review(store: RecordStore, review: Review, *, by: Acting) -> tuple[Review, bool]:
    """Record ``review``, signed by ``by``, unless its sha256 is reviewed already: (the review
    that stands, whether this call wrote it)."""
    return create_record(store, review_key(review.kind, review.sha256), REVIEWS, review,
                         tuple_id=review.tuple_id, by=by)


def reviewers_of(
    store: RecordStore, release: ReleaseTuple, manifest: ShardManifest | None, *,
    trust: RecordTrust | None = None,
) -> dict[str, set[str]]:
    """Who reviewed what ``release`` carries, as the identities that signed the reviews:
    ``{"license": {...}, "code": {...}}``."""
    trust = trust or record_trust(store)
    found: dict[str, set[str]] = {"license": set(), "code": set()}
    sha = release.binding.license_sha256
    if sha is not None and (review := read_review(store, "license", sha, trust=trust,
                                                  tuple_id=release.id)):
        found["license"].add(review.reviewed_by)
    for entry in [] if manifest is None else manifest.remote_code:
        if (review := read_review(store, "code", entry.sha256, trust=trust,
                                  tuple_id=release.id)) is not None:
            found["code"].add(review.reviewed_by)
    return found
