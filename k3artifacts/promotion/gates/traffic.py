"""``traffic``: the tuple carried real traffic through every canary step of the channel's
``traffic`` policy, and the newest analysis of each step (``k3a traffic analyze``) passed,
measured with the policy's window and bounds as they are now, and its canary latencies not
slower than the stable pods' in the same window: the recorded histograms of both judged again
by the policy's ``against_stable`` now (an analysis made with no tuple on the channel, or
before comparisons were recorded, is judged by its bounds). Analyses are read only through
their signatures (role ``traffic``): one that does not verify is refused by name
(UntrustedRecord, exit 4), never counted."""

from __future__ import annotations

from k3artifacts.policy.results import GateResult
from k3artifacts.promotion.gates.context import GateContext, summarize
from k3artifacts.releases.analyses import ANALYSES, list_analyses
from k3artifacts.traffic.analysis import describe

NAME = "traffic"


def check(ctx: GateContext) -> GateResult:
    traffic = ctx.policy.traffic
    if traffic is None:  # the policy model refuses this; a clear reason all the same
        return GateResult(name=NAME, passed=False, reason="the channel has no traffic policy")
    analyses = list_analyses(ctx.store, ctx.release.id, ctx.channel, trust=ctx.trust)
    records = [
        r for r in ctx.signed_here(analyses, ANALYSES)
        if r.analysis.window == traffic.window and r.analysis.thresholds == traffic.thresholds
    ]
    problems, missing, shown = [], [], []
    for index, step in enumerate(traffic.steps):
        mine = [r for r in records if r.analysis.step == index]
        if not mine:
            missing.append(f"{index} ({step.weight}%)")
            continue
        latest = mine[-1].analysis
        criteria = traffic.against_stable.criteria() if traffic.against_stable else None
        verdicts = [c.judged(criteria) for c in latest.against_stable] if criteria else []
        failed = [describe(m) for m in latest.failed] + [v.line for v in verdicts if not v.passed]
        if failed or not latest.metrics:
            problems.append(f"step {index} ({step.weight}%) at {latest.at:%Y-%m-%dT%H:%M:%SZ}: "
                            + ", ".join(failed))
        else:
            stable = (f" (not slower than {latest.against_stable[0].stable_tuple_id})"
                      if verdicts else "")
            shown.append(f"{step.weight}%{stable}")
    if missing:
        problems.append(f"no analysis under the current bounds of step {', '.join(missing)} "
                        f"(k3a traffic analyze {ctx.release.id} --channel {ctx.channel} "
                        "--step N, when the step's pause ends)")
    if problems:
        return GateResult(name=NAME, passed=False, reason=summarize(problems))
    return GateResult(name=NAME, passed=True,
                      reason=f"every step passed its analysis: {', '.join(shown)}")
