"""One canary step's analysis (``k3a traffic analyze``), planned, then measured and recorded.

The plan checks who analyses may sign traffic analyses (role ``traffic``), reads the channel's
``traffic:`` policy from the store's policy, the tuple and the step, and checks the window's
end; a refusal there asks Prometheus nothing. The act asks the step's queries (:mod:`.queries`,
the AnalysisTemplate's own) of Prometheus at the end of the window, judges each against the
channel's bound and records the analysis create-once beside the tuple, signed
(``releases/analyses.py``), pass or fail: the ``traffic`` gate reads these.

Besides the bounds, each step compares the canary with the stable pods it replaces: the tuple
on the channel now, whose pods carry its id as the rendered Rollout labels them. vLLM's e2e and
TTFT histograms of both, over the same window, go to the one judge (:mod:`k3artifacts.judging`)
as counted observations: each bucket's requests are tied at the bucket's upper bound, so the
U test sees the two distributions at the buckets' resolution (a shift inside one bucket is
invisible, and a shift across buckets is seen in every request that moved), and the
Hodges-Lehmann shift is a difference of bounds. Quantiles interpolated inside buckets
(``histogram_quantile``) would invent a precision the histogram does not have. The bucket
counts are recorded, so the gate judges them again by the policy in force. The last step
(100%) sends the stable pods nothing, so it is judged by its bounds alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from k3artifacts.errors import BadAnswer, ConfigError
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.record import channel_section
from k3artifacts.policy.rollout import TrafficPolicy
from k3artifacts.policy.signed import require_role
from k3artifacts.releases.analyses import (
    AnalysisRecord,
    MetricResult,
    StableComparison,
    TrafficAnalysis,
    implausible,
    judge_histograms,
    record_analysis,
)
from k3artifacts.releases.channels import read_state
from k3artifacts.releases.lookup import resolve_tuple
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.stores.base import Store
from k3artifacts.traffic.prometheus import Prometheus
from k3artifacts.traffic.queries import COMPARED, by_tuple, histogram_query, step_queries


@dataclass(frozen=True)
class AnalysisPlan:
    release: ReleaseTuple
    channel: str
    traffic: TrafficPolicy
    step: int
    #: The end of the window, UTC.
    at: datetime
    prometheus_url: str
    by: Acting
    #: The tuple the channel serves now (its pods are the stable ones), when another.
    stable: str | None = None


@dataclass(frozen=True)
class Analyzed:
    analysis: TrafficAnalysis
    record: AnalysisRecord
    written: bool


def channel_traffic(store: Store, channel: str) -> TrafficPolicy:
    """The ``traffic:`` section of ``channel`` in the store's policy; ConfigError (exit 9)
    when it has none."""
    section: TrafficPolicy = channel_section(
        store, channel, "traffic", "{steps: [...], prometheus: URL, thresholds: ...}")
    return section


def plan_analysis(store: Store, tuple_or_channel: str, channel: str, step: int, *,
                  prometheus_url: str, by: Acting, at: datetime | None = None) -> AnalysisPlan:
    """RoleRefused (exit 9) for an analyst without the role ``traffic``; ConfigError (exit 9)
    for a channel without traffic policy, a step it does not have or a window end without a
    time zone; NotFound (exit 7) for an unknown tuple."""
    require_role(by, "traffic-analysis", "a traffic analysis")
    traffic = channel_traffic(store, channel)
    if not 0 <= step < len(traffic.steps):
        raise ConfigError(
            f"channel {channel} has {len(traffic.steps)} traffic steps; there is no step {step}",
            hint=f"steps: {', '.join(f'{i} ({s.weight}%)' for i, s in enumerate(traffic.steps))}",
        )
    if at is not None and at.tzinfo is None:
        raise ConfigError(f"the window's end {at.isoformat()} has no time zone",
                          hint="end it in Z or +00:00")
    release = resolve_tuple(store, tuple_or_channel)
    current = read_state(store, channel).tuple_id
    return AnalysisPlan(release=release, channel=channel, traffic=traffic, step=step,
                        at=(at or datetime.now(UTC)).astimezone(UTC),
                        prometheus_url=prometheus_url, by=by,
                        stable=current if current != release.id else None)


def analyze_step(
    prometheus: Prometheus,
    tuple_id: str,
    channel: str,
    traffic: TrafficPolicy,
    step: int,
    at: datetime,
    stable: str | None = None,
) -> TrafficAnalysis:
    """The step's queries asked of ``prometheus`` at ``at``, each judged against its bound
    (no data is a failure, never a pass), and the canary's latency histograms against those of
    ``stable``'s pods (the tuple on the channel; None: nothing to compare with)."""
    metrics = []
    for q in step_queries(tuple_id, traffic.window, traffic.thresholds):
        value = prometheus.value(q.promql, at)
        why = implausible(q.name, value, traffic.window)
        if why is not None:
            # Nothing is recorded: a metric outside its meaning is a broken exporter or a
            # hostile Prometheus, never evidence for the gate.
            raise BadAnswer(f"Prometheus at {prometheus.shown} answered {q.name} = {why}",
                            hint="check the exporter and the recording rules behind "
                            f"{q.promql!r}; nothing was recorded")
        metrics.append(MetricResult(name=q.name, query=q.promql, bound=q.bound, limit=q.limit,
                                    value=value, passed=value is not None and q.holds(value)))
    # At 100% the stable pods get no traffic in the window: nothing to compare with.
    compared = [] if (stable is None or traffic.against_stable is None
                      or traffic.steps[step].weight >= 100) else [
        _against_stable(prometheus, name, metric, tuple_id, stable, traffic, at)
        for name, metric in COMPARED]
    return TrafficAnalysis(
        tuple_id=tuple_id, channel=channel, step=step, weight=traffic.steps[step].weight,
        window=traffic.window, thresholds=traffic.thresholds, at=at,
        prometheus=prometheus.shown, metrics=metrics, against_stable=compared,
    )


def per_bucket(cumulative: dict[float, float]) -> list[tuple[float, float]]:
    """Cumulative counts under each bound as requests in each bucket, by its upper bound;
    the ``+Inf`` bucket's counted at the last finite bound (a request beyond it took at least
    that long). Empty buckets are left out."""
    finite = sorted(b for b in cumulative if b != float("inf"))
    out: list[tuple[float, float]] = []
    below = 0.0
    for bound in finite:
        out.append((bound, round(max(0.0, cumulative[bound] - below), 3)))
        below = max(below, cumulative[bound])
    if finite and float("inf") in cumulative:
        last, count = out[-1]
        out[-1] = (last, round(count + max(0.0, cumulative[float("inf")] - below), 3))
    return [(b, c) for b, c in out if c > 0]


def _against_stable(prometheus: Prometheus, name: str, metric: str, tuple_id: str, stable: str,
                    traffic: TrafficPolicy, at: datetime) -> StableComparison:
    assert traffic.against_stable is not None
    queries = [histogram_query(metric, by_tuple(t), traffic.window) for t in (tuple_id, stable)]
    canary, base = (per_bucket(prometheus.buckets(q, at)) for q in queries)
    return StableComparison(
        name=name, stable_tuple_id=stable, canary_query=queries[0], stable_query=queries[1],
        canary=canary, stable=base,
        judgement=judge_histograms(name, base, canary, traffic.against_stable.criteria()))


def act_analysis(store: Store, plan: AnalysisPlan) -> Analyzed:
    analysis = analyze_step(Prometheus(plan.prometheus_url), plan.release.id, plan.channel,
                            plan.traffic, plan.step, plan.at, stable=plan.stable)
    record, written = record_analysis(store, analysis, by=plan.by)
    return Analyzed(analysis, record, written)


def analyze(store: Store, tuple_or_channel: str, channel: str, step: int, *,
            prometheus_url: str, by: Acting, at: datetime | None = None) -> Analyzed:
    """The traffic-analysis move: :func:`plan_analysis`, then :func:`act_analysis`."""
    return act_analysis(store, plan_analysis(store, tuple_or_channel, channel, step,
                                             prometheus_url=prometheus_url, by=by, at=at))


def describe(m: MetricResult) -> str:
    op = "<=" if m.bound == "max" else ">="
    why = implausible(m.name, m.value)
    if why is not None:
        return f"{m.name} refused: {why}"
    shown = "no data" if m.value is None else f"{m.value:.4g}"
    return f"{m.name} {shown} (must be {op} {m.limit:g})"
