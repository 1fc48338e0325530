"""``infrastructure``: the newest ``k3a preflight`` of the tuple for this channel passed every
named check (capacity, storage throughput, IAM, private networking, node health), against the
channel's ``infrastructure`` policy as it is now, and is younger than ``max_age_hours``.
Preflights are read only through their signatures (role ``preflight``): one that does not
verify is refused by name (UntrustedRecord, exit 4), never counted."""

from __future__ import annotations

from datetime import timedelta

from pydantic import ValidationError

from k3artifacts.policy.results import GateResult
from k3artifacts.preflight.model import PreflightReport
from k3artifacts.promotion.gates.context import GateContext, summarize
from k3artifacts.releases.preflights import PREFLIGHTS, list_preflights

NAME = "infrastructure"


def check(ctx: GateContext) -> GateResult:
    policy = ctx.policy.infrastructure
    if policy is None:
        return GateResult(name=NAME, passed=False, reason="the channel has no infrastructure "
                          "policy")
    how = f"run `k3a preflight {ctx.release.id} --channel {ctx.channel} --kubeconfig PATH`"
    records = ctx.signed_here(
        list_preflights(ctx.store, ctx.release.id, ctx.channel, trust=ctx.trust), PREFLIGHTS)
    if not records:
        return GateResult(name=NAME, passed=False, reason=f"no preflight recorded; {how}")
    latest = records[-1]
    try:
        report = PreflightReport.model_validate(latest.report)
    except ValidationError:
        return GateResult(name=NAME, passed=False, reason=f"preflight "
                          f"{latest.report_sha256[:12]} is not a preflight report; {how}")
    if report.policy != policy:
        return GateResult(name=NAME, passed=False, reason="the newest preflight checked another "
                          f"infrastructure policy than the channel's now; {how}")
    age = ctx.now - report.at
    if age > timedelta(hours=policy.max_age_hours):
        return GateResult(name=NAME, passed=False, reason=f"the newest preflight is "
                          f"{age.total_seconds() / 3600:.1f} h old (max {policy.max_age_hours:g} "
                          f"h); {how}")
    failed = [f"{c.name}: {c.reason}" for c in report.checks if not c.passed]
    if failed or not report.passed:
        return GateResult(name=NAME, passed=False,
                          reason=summarize(failed or ["a named check is missing"]))
    return GateResult(name=NAME, passed=True, reason="preflight passed: " + ", ".join(
        c.name for c in report.checks))
