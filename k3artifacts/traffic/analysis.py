"""One canary step's analysis: the step's queries (:mod:`.queries`, the AnalysisTemplate's own)
asked of Prometheus at the end of the window, each judged against the channel's bound."""

from __future__ import annotations

from datetime import datetime

from k3artifacts.errors import BadAnswer, ConfigError
from k3artifacts.policy.rollout import TrafficPolicy
from k3artifacts.releases.analyses import MetricResult, TrafficAnalysis, implausible
from k3artifacts.traffic.prometheus import Prometheus
from k3artifacts.traffic.queries import step_queries


def analyze_step(
    prometheus: Prometheus,
    tuple_id: str,
    channel: str,
    traffic: TrafficPolicy,
    step: int,
    at: datetime,
) -> TrafficAnalysis:
    if not 0 <= step < len(traffic.steps):
        raise ConfigError(
            f"channel {channel} has {len(traffic.steps)} traffic steps; there is no step {step}",
            hint=f"steps: {', '.join(f'{i} ({s.weight}%)' for i, s in enumerate(traffic.steps))}",
        )
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
    return TrafficAnalysis(
        tuple_id=tuple_id, channel=channel, step=step, weight=traffic.steps[step].weight,
        window=traffic.window, thresholds=traffic.thresholds, at=at,
        prometheus=prometheus.shown, metrics=metrics,
    )


def describe(m: MetricResult) -> str:
    op = "<=" if m.bound == "max" else ">="
    why = implausible(m.name, m.value)
    if why is not None:
        return f"{m.name} refused: {why}"
    shown = "no data" if m.value is None else f"{m.value:.4g}"
    return f"{m.name} {shown} (must be {op} {m.limit:g})"
