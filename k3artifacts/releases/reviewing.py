"""``k3a review license | code``: recording that a person read a tuple's license text or its
remote code, planned, then recorded (records: :mod:`.reviews`).

The plan checks the reviewer may sign reviews (role ``review``), then reads the tuple, what it
carries (its license sha256, its revision's remote-code files) and the reviews that already
cover some of it; a tuple without a license, or unknown, is refused there. The act records a
review of each sha256 not reviewed yet, signed by the reviewer's key (the first review stands).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime

from k3artifacts.errors import NotFound, StoredRecordRefused, VerifyMismatch
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.signed import record_trust, require_role
from k3artifacts.releases.record_log import log_record
from k3artifacts.releases.reviews import (
    REVIEWS,
    CodeReviewOutcome,
    LicenseReviewOutcome,
    Review,
    ReviewKind,
    create_review,
    read_review,
    review_key,
)
from k3artifacts.releases.tuples import TupleStore, tuple_manifest
from k3artifacts.stores.base import Store


@dataclass(frozen=True)
class ReviewPlan:
    tuple_id: str
    kind: ReviewKind
    #: Who reviews, with the key the reviews are signed with.
    by: Acting
    #: A review for each sha256 nobody reviewed yet.
    new: tuple[Review, ...]
    #: The reviews that already cover the rest.
    existing: tuple[Review, ...]


def license_text(store: Store, tuple_id: str) -> str:
    """The license file of ``tuple_id``'s revision, read from the store and checked against
    the tuple's license sha256: the bytes a review is about, decoded for reading
    (``k3a review license --show``)."""
    release = TupleStore(store).get(tuple_id)
    path = tuple_manifest(store, release).license.path
    sha = release.binding.license_sha256
    if path is None or sha is None:
        raise NotFound(f"tuple {tuple_id} binds no license text (its revision has no LICENSE)")
    w = release.binding.weights
    records = store.object_records(w.repo_id, w.commit)  # the object the revision reads
    with store.open_file(w.repo_id, w.commit, path, records) as fh:
        raw = fh.read()
    if hashlib.sha256(raw).hexdigest() != sha:
        raise VerifyMismatch(
            f"{path} of {w.repo_id}@{w.commit} in {store.url} does not hash to the license "
            f"sha256 {sha} that {tuple_id} binds; do not review it"
        )
    return raw.decode("utf-8", errors="replace")


def _plan(tuple_id: str, kind: ReviewKind, by: Acting, wanted: list[Review],
          reviewed: list[Review | None]) -> ReviewPlan:
    return ReviewPlan(tuple_id, kind, by,
                      new=tuple(w for w, r in zip(wanted, reviewed, strict=True) if r is None),
                      existing=tuple(r for r in reviewed if r is not None))


def plan_license_review(store: Store, tuple_id: str, *, by: Acting, note: str | None = None,
                        now: datetime | None = None) -> ReviewPlan:
    """RoleRefused (exit 9) for a reviewer without the role ``review``; NotFound (exit 7) for
    an unknown tuple or one that binds no license text."""
    require_role(by, "review", "a license review")
    release = TupleStore(store).get(tuple_id)
    sha = release.binding.license_sha256
    if sha is None:
        raise NotFound(
            f"tuple {tuple_id} binds no license text (its revision has no LICENSE file)",
            hint="a release without a license cannot pass the license gate; ask upstream",
        )
    w = release.binding.weights
    try:
        card = tuple_manifest(store, release).license
    except NotFound:  # the license sha256 in the tuple is what is reviewed; the path is a note
        card = None
    review = Review(
        kind="license", sha256=sha, path=None if card is None else card.path, reviewed_by=by.name,
        reviewer_source="key", reviewed_at=now or datetime.now(UTC), tuple_id=release.id,
        repo_id=w.repo_id, commit=w.commit,
        license=None if card is None else (card.card_license_name or card.card_license),
        note=note)
    return _plan(release.id, "license", by, [review], [read_review(store, "license", sha)])


def plan_code_review(store: Store, tuple_id: str, *, by: Acting, note: str | None = None,
                     now: datetime | None = None) -> ReviewPlan:
    """Every remote-code file of the tuple's revision, once per sha256; RoleRefused (exit 9)
    for a reviewer without the role ``review``, NotFound (exit 7) for an unknown tuple or a
    revision not in the store."""
    require_role(by, "review", "a code review")
    release = TupleStore(store).get(tuple_id)
    manifest = tuple_manifest(store, release)
    w = release.binding.weights
    wanted: dict[str, Review] = {}
    for entry in manifest.remote_code:
        wanted.setdefault(entry.sha256, Review(
            kind="code", sha256=entry.sha256, path=entry.path, reviewed_by=by.name,
            reviewer_source="key", reviewed_at=now or datetime.now(UTC),
            tuple_id=release.id, repo_id=w.repo_id, commit=w.commit, note=note))
    reviews = list(wanted.values())
    trust = record_trust(store)
    return _plan(release.id, "code", by, reviews,
                 [read_review(store, "code", r.sha256, trust=trust) for r in reviews])


def _record(store: Store, plan: ReviewPlan) -> tuple[list[Review], list[Review]]:
    """(recorded now, already reviewed): a review recorded by someone else since the plan
    stands, and counts as already reviewed. Reviews made for another tuple that cover this
    one are logged in this tuple's record log too, so their deletion is noticed here."""
    recorded, already = [], list(plan.existing)
    for review in plan.existing:
        log_record(store, plan.tuple_id, key=review_key(review.kind, review.sha256),
                   kind=REVIEWS.kind, signed_by=review.reviewed_by, by=plan.by)
    for review in plan.new:
        stands, written = create_review(store, review, by=plan.by)
        (recorded if written else already).append(stands)
    return recorded, already


def act_license_review(store: Store, plan: ReviewPlan) -> LicenseReviewOutcome:
    recorded, already = _record(store, plan)
    (review,) = recorded or already
    return LicenseReviewOutcome(tuple_id=plan.tuple_id, review=review,
                                key=review_key("license", review.sha256), written=bool(recorded))


def act_code_review(store: Store, plan: ReviewPlan) -> CodeReviewOutcome:
    recorded, already = _record(store, plan)
    return CodeReviewOutcome(tuple_id=plan.tuple_id, recorded=recorded, already_reviewed=already)


def review_license(store: Store, tuple_id: str, *, by: Acting, note: str | None = None,
                   now: datetime | None = None) -> LicenseReviewOutcome:
    """The license-review move: :func:`plan_license_review`, then :func:`act_license_review`."""
    return act_license_review(store, plan_license_review(store, tuple_id, by=by, note=note,
                                                         now=now))


def review_code(store: Store, tuple_id: str, *, by: Acting, note: str | None = None,
                now: datetime | None = None) -> CodeReviewOutcome:
    """The code-review move: :func:`plan_code_review`, then :func:`act_code_review`."""
    return act_code_review(store, plan_code_review(store, tuple_id, by=by, note=note, now=now))


def unreviewed_code(store: Store, repo_id: str, commit: str) -> list[str]:
    """The remote-code files of a published revision that no review the policy trusts covers
    yet (by sha256: a file unchanged since a reviewed commit is reviewed): what the
    ``remote_code`` gate would name. A review record that does not verify covers nothing."""
    manifest = store.read_manifest(repo_id, commit)
    if manifest is None or not manifest.remote_code:
        return []
    trust = record_trust(store)

    def reviewed(sha256: str) -> bool:
        try:
            return read_review(store, "code", sha256, trust=trust) is not None
        except StoredRecordRefused:
            return False

    return [entry.path for entry in manifest.remote_code if not reviewed(entry.sha256)]
