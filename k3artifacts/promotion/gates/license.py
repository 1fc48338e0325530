"""``license``: the tuple's license text (by sha256) has a review record in the store
(``k3a review license``; ``releases/reviews.py``), signed by an identity the policy in force
lets review. A review that does not verify is refused by name (UntrustedRecord, exit 4); none
at all fails the gate."""

from __future__ import annotations

from k3artifacts.policy.results import GateResult
from k3artifacts.promotion.gates.context import GateContext
from k3artifacts.releases.reviews import list_reviews, read_review, review_key

NAME = "license"


def check(ctx: GateContext) -> GateResult:
    release = ctx.release
    sha = release.binding.license_sha256
    if sha is None:
        return GateResult(name=NAME, passed=False, reason="the revision carries no license text")
    review = read_review(ctx.store, "license", sha, trust=ctx.trust, tuple_id=release.id)
    if review is None:
        repo = release.binding.weights.repo_id
        earlier = [r for r in list_reviews(ctx.store, "license", trust=ctx.trust)
                   if r.repo_id == repo]
        changed = (
            f"; the text differs from the one {earlier[-1].reviewed_by} reviewed for {repo} "
            f"on {earlier[-1].reviewed_at:%Y-%m-%d} ({earlier[-1].sha256[:12]})"
            if earlier
            else ""
        )
        return GateResult(
            name=NAME,
            passed=False,
            reason=f"license sha256 {sha} has not been reviewed (no record "
            f"{review_key('license', sha)} in the store){changed}; read it "
            f"(`k3a review license {release.id} --show`), then `k3a review license {release.id}`",
        )
    return GateResult(
        name=NAME,
        passed=True,
        reason=f"sha256 {sha[:12]} reviewed by {review.reviewed_by} on "
        f"{review.reviewed_at:%Y-%m-%d} (store record)",
    )
