"""``remote_code``: every ``*.py`` in the manifest's remote-code inventory has a review record
in the store, by sha256 (``k3a review code``; ``releases/reviews.py``), signed by an identity
the policy in force lets review; one that does not verify is refused by name."""

from __future__ import annotations

from k3artifacts.policy.results import GateResult
from k3artifacts.promotion.gates.context import GateContext, summarize
from k3artifacts.releases.reviews import read_review

NAME = "remote_code"


def check(ctx: GateContext) -> GateResult:
    manifest = ctx.manifest
    if manifest is None:
        return GateResult(
            name=NAME, passed=False, reason=f"no remote-code inventory: {ctx.missing}"
        )
    if not manifest.remote_code:
        return GateResult(name=NAME, passed=True, reason="the revision has no *.py files")
    reviews = {e.sha256: read_review(ctx.store, "code", e.sha256, trust=ctx.trust,
                                     tuple_id=ctx.release.id)
               for e in manifest.remote_code}
    unreviewed = [e for e in manifest.remote_code if reviews[e.sha256] is None]
    if unreviewed:
        names = [f"{e.path} ({e.sha256[:12]})" for e in unreviewed]
        return GateResult(
            name=NAME,
            passed=False,
            reason=f"not reviewed: {summarize(names)} (no review record in the store); read "
            f"them, then `k3a review code {ctx.release.id}`",
        )
    reviewers = sorted({r.reviewed_by for r in reviews.values() if r is not None})
    return GateResult(
        name=NAME,
        passed=True,
        reason=f"{len(manifest.remote_code)} file(s) reviewed by {', '.join(reviewers)}",
    )
