"""Traffic analyses of a tuple: what ``k3a traffic analyze`` read from Prometheus for one canary
step, and the verdict against the channel's bounds. The ``traffic`` gate reads these.

Stored create-once under ``releases/traffic/<tuple-id>/<channel>/<step>/<sha256 of the
canonical analysis>.json``: a step analysed again is a new record (a later window), never an
edit; the gate takes the newest measurement of each step. Each is a signed record of the
identity that analysed it (role ``traffic``, ``policy/signed.py``), read only through that
signature: one written by hand is refused by name (UntrustedRecord, exit 4).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from k3artifacts.canonical import canonical_digest
from k3artifacts.errors import UntrustedRecord
from k3artifacts.judging.compare import Criteria, Judgement, compare_counts
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.rollout import TrafficThresholds, duration_seconds
from k3artifacts.policy.signed import Family, RecordTrust
from k3artifacts.releases.channels import check_channel
from k3artifacts.releases.records import create_record, read_records
from k3artifacts.releases.tuples import TupleStore, check_tuple_id
from k3artifacts.stores.records import RecordStore

TRAFFIC_PREFIX = "releases/traffic/"
#: More finished requests a second than one tuple is believed to serve: a count above this
#: over a window is not a measurement.
MAX_REQUEST_RATE = 1e6
#: What each metric is, for the refusal of a value it cannot take.
_MEANING = {"requests": "a count", "e2e_latency": "a latency", "time_to_first_token": "a latency",
            "error_rate": "a share of requests"}


def implausible(name: str, value: float | None, window: str | None = None) -> str | None:
    """Why ``value`` cannot be what the metric ``name`` measures (over ``window``), or None.
    No value at all is not implausible: it is no data, which no bound passes."""
    if value is None:
        return None
    meaning = _MEANING.get(name, "a measurement")
    if not math.isfinite(value):
        return f"{value!r} is not a finite number; {meaning} is"
    if value < 0:
        return f"{value:g} is negative; {meaning} cannot be"
    if name == "error_rate" and value > 1:
        return f"{value:g} is above 1; {meaning} cannot be"
    if name == "requests" and window is not None and (
            value > MAX_REQUEST_RATE * duration_seconds(window)):
        return (f"{value:g} is more than {MAX_REQUEST_RATE:g} requests a second over the "
                f"{window} window")
    return None


class MetricResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    query: str
    bound: Literal["max", "min"]
    limit: float
    #: None: Prometheus returned no sample or NaN (no traffic reached the tuple in the window).
    value: float | None
    passed: bool


class StableComparison(BaseModel):
    """One of vLLM's latency histograms of the canary against the stable pods' over the same
    window (:mod:`k3artifacts.judging`, each bucket a group of tied observations at its upper
    bound; what fell beyond the last finite bound counts at that bound)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    stable_tuple_id: str
    canary_query: str
    stable_query: str
    #: (bucket upper bound in seconds, requests in that bucket over the window).
    canary: list[tuple[float, float]]
    stable: list[tuple[float, float]]
    #: The judgement by the policy the analysis ran under (the gate judges again by its own).
    judgement: Judgement

    def judged(self, criteria: Criteria) -> Judgement:
        return judge_histograms(self.name, self.stable, self.canary, criteria)


def judge_histograms(name: str, stable: list[tuple[float, float]],
                     canary: list[tuple[float, float]], criteria: Criteria) -> Judgement:
    return compare_counts(dict(stable), dict(canary), criteria,
                          what=f"{name} against the stable pods")


class TrafficAnalysis(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    tuple_id: str
    channel: str
    step: int = Field(ge=0)
    weight: int
    window: str
    thresholds: TrafficThresholds
    #: The end of the window (the query's evaluation time).
    at: datetime
    prometheus: str
    metrics: list[MetricResult]
    #: The canary against the stable pods it replaces (none: no stable tuple on the channel,
    #: comparison off, or an analysis from before comparisons).
    against_stable: list[StableComparison] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.metrics) and not self.failed and all(
            c.judgement.passed for c in self.against_stable)

    @property
    def failed(self) -> list[MetricResult]:
        """Metrics that missed their bound, or that hold a value the metric cannot take (a
        record written before such values were refused is judged again on every read)."""
        return [m for m in self.metrics
                if not m.passed or implausible(m.name, m.value, self.window) is not None]


class AnalysisRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    analysis_sha256: str
    #: The identity whose key signed the record (the reader checks they agree).
    recorded_by: str
    recorded_at: datetime
    analysis: TrafficAnalysis


ANALYSES = Family(TRAFFIC_PREFIX, "traffic-analysis", AnalysisRecord, "recorded_by")


def _prefix(tuple_id: str, channel: str, step: int | None = None) -> str:
    base = f"{TRAFFIC_PREFIX}{check_tuple_id(tuple_id)}/{check_channel(channel)}/"
    return base if step is None else f"{base}{step}/"


def record_analysis(
    store: RecordStore, analysis: TrafficAnalysis, *, by: Acting, now: datetime | None = None
) -> tuple[AnalysisRecord, bool]:
    """Store ``analysis`` beside its tuple, signed by ``by``; returns (record, written)."""
    TupleStore(store).get(analysis.tuple_id)  # the tuple must exist and be intact
    sha = canonical_digest(analysis.model_dump(mode="json"))
    key = f"{_prefix(analysis.tuple_id, analysis.channel, analysis.step)}{sha}.json"
    record = AnalysisRecord(analysis_sha256=sha, recorded_by=by.name,
                            recorded_at=now or datetime.now(UTC), analysis=analysis)
    return create_record(store, key, ANALYSES, record, tuple_id=analysis.tuple_id, by=by)


def list_analyses(store: RecordStore, tuple_id: str, channel: str, *,
                  trust: RecordTrust | None = None) -> list[AnalysisRecord]:
    """Every recorded analysis of ``tuple_id`` on ``channel``, oldest window first, each
    verified (``trust``: the store's policy in force unless given)."""
    records = []
    for key, record in read_records(store, _prefix(tuple_id, channel), ANALYSES,
                                    tuple_id=tuple_id, trust=trust):
        a = record.analysis
        sha = canonical_digest(a.model_dump(mode="json"))
        if (sha != record.analysis_sha256 or a.tuple_id != tuple_id or a.channel != channel
                or key != f"{_prefix(tuple_id, channel, a.step)}{sha}.json"):
            raise UntrustedRecord(key, "wrong-key", f"an analysis of {a.tuple_id} on "
                                  f"{a.channel} step {a.step} with sha256 {sha[:12]}, not the "
                                  "one its key names")
        records.append(record)
    return sorted(records, key=lambda r: r.analysis.at)
