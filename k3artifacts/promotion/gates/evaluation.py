"""``evaluation``: the latest evaluation report attached to the tuple (of the policy's suite)
has a pass rate at or above the channel's threshold."""

from __future__ import annotations

from k3artifacts.promotion.gates.context import GateContext
from k3artifacts.releases.channels import GateResult
from k3artifacts.releases.evaluations import list_evaluations

NAME = "evaluation"


def check(ctx: GateContext) -> GateResult:
    policy, release = ctx.policy.evaluation, ctx.release
    assert policy is not None  # ChannelPolicy refuses the gate without its settings
    records = [
        r
        for r in list_evaluations(ctx.store, release.id)
        if policy.suite is None or r.parsed().suite == policy.suite
    ]
    suite = f"suite {policy.suite!r}" if policy.suite else "any suite"
    if not records:
        return GateResult(
            name=NAME,
            passed=False,
            reason=f"no evaluation report ({suite}) attached; "
            f"`k3a eval attach {release.id} report.json`",
        )
    latest = records[-1]
    report = latest.parsed()
    verdict = f"{report.suite}: {report.passed}/{report.total} = {report.pass_rate:.1%}"
    threshold = f"{policy.min_pass_rate:.1%}"
    if report.pass_rate < policy.min_pass_rate:
        return GateResult(
            name=NAME,
            passed=False,
            reason=f"{verdict} is below the required {threshold} "
            f"(report attached by {latest.attached_by} at {latest.attached_at:%Y-%m-%d %H:%M})",
        )
    return GateResult(name=NAME, passed=True, reason=f"{verdict} >= {threshold}")
