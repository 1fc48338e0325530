"""A channel's rollout settings (``traffic:`` under a channel in ``promotion-gates.yaml``):
the canary steps the EKS ``Rollout`` walks, the window each step's analysis reads, and the
bounds vLLM's own metrics must stay inside. The renderer and ``k3a traffic analyze`` read the
same object, so the cluster's AnalysisTemplate and the recorded evidence judge alike."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from k3artifacts.judging.compare import Criteria

#: A Go duration as Argo Rollouts accepts in ``pause.duration`` and a PromQL range: whole
#: seconds, minutes or hours (one unit, so both parsers read it the same way).
DURATION = re.compile(r"^([1-9][0-9]{0,5})(s|m|h)$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}


def duration_seconds(text: str) -> int:
    found = DURATION.match(text)
    if not found:
        raise ValueError(f"{text!r} is not a duration like 30s, 10m or 1h")
    return int(found.group(1)) * _UNIT_SECONDS[found.group(2)]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TrafficStep(_Strict):
    """One canary step: send ``weight`` percent to the candidate, hold ``pause``, analyse."""

    weight: int = Field(ge=1, le=100)
    pause: str
    #: Who this share is (``internal``: the first cohort is our own users); shown in the
    #: rendered step's analysis labels and the docs, not interpreted.
    cohort: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9-]{0,30}$")

    @field_validator("pause")
    @classmethod
    def _pause(cls, value: str) -> str:
        duration_seconds(value)
        return value


class TrafficThresholds(_Strict):
    """Bounds over one analysis window, from vLLM's histograms and the request counters."""

    #: Which quantile of the latency histograms is bounded (0.99: p99).
    quantile: float = Field(default=0.99, gt=0, lt=1)
    max_e2e_s: float = Field(gt=0)
    max_ttft_s: float = Field(gt=0)
    #: Share of completion requests answered 5xx.
    max_error_rate: float = Field(ge=0, le=1)
    #: Fewer finished requests than this in the window is no evidence at all.
    min_requests: int = Field(default=20, ge=1)


class ComparisonPolicy(_Strict):
    """How a candidate's latencies are judged against a baseline's (:mod:`k3artifacts.judging`):
    fail only when a one-sided Mann-Whitney U test says slower at ``alpha`` AND the
    Hodges-Lehmann shift exceeds both ``margin`` of the baseline's median and ``floor_ms``."""

    #: The test's false-alarm rate (one-sided): higher fails more.
    alpha: float = Field(default=0.01, gt=0.0, lt=0.5)
    #: The shift tolerated, as a fraction of the baseline's median...
    margin: float = Field(default=0.10, ge=0.0)
    #: ...and in milliseconds: a shift must exceed both to fail.
    floor_ms: float = Field(default=1.0, ge=0.0)
    #: The fewest observations a side the judge decides on (fewer: inconclusive).
    min_samples: int = Field(default=20, ge=2)
    #: What an inconclusive comparison counts as.
    inconclusive: Literal["fail", "pass"] = "fail"

    def criteria(self) -> Criteria:
        return Criteria(alpha=self.alpha, margin=self.margin, floor_ms=self.floor_ms,
                        min_samples=self.min_samples, inconclusive=self.inconclusive)


class TrafficPolicy(_Strict):
    steps: list[TrafficStep] = Field(min_length=1)
    #: The range each step's queries read (PromQL ``[window]``), ending at the measurement.
    window: str = "5m"
    #: Prometheus as the Argo Rollouts controller reaches it (in-cluster address).
    prometheus: str = Field(pattern=r"^https?://[^\s]+$")
    thresholds: TrafficThresholds
    #: Each step's canary latencies (vLLM's e2e and TTFT histograms) against the stable pods'
    #: in the same window; null: bounds only.
    against_stable: ComparisonPolicy | None = ComparisonPolicy()

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        duration_seconds(value)
        return value

    @model_validator(mode="after")
    def _ascending(self) -> TrafficPolicy:
        weights = [s.weight for s in self.steps]
        if any(b <= a for a, b in zip(weights, weights[1:], strict=False)):
            raise ValueError(f"traffic step weights must rise: {weights}")
        if weights[-1] != 100:
            raise ValueError(f"the last traffic step must send 100%, not {weights[-1]}%")
        return self


class InfrastructurePolicy(_Strict):
    """Where the channel's endpoint runs, for the ``infrastructure`` gate's preflight
    (``k3a preflight``): the facts a release engineer checks before betting a reservation."""

    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]$")
    #: The cluster's subnets for GPU nodes: their zones and VPC are what capacity and the S3
    #: gateway endpoint must match.
    subnet_ids: list[str] = Field(min_length=1)
    #: The IAM role the inference pods run as (IRSA / HyperPod execution role), by name.
    inference_role: str = Field(min_length=1)
    #: The capacity must stay active for warm-up + soak + the production window.
    warmup_hours: float = Field(ge=0)
    soak_hours: float = Field(ge=0)
    production_hours: float = Field(gt=0)
    #: Reading the whole checkpoint from FSx for Lustre must take no longer than this.
    max_load_seconds: int = Field(gt=0)
    #: A preflight older than this is no evidence of the cluster as it is now.
    max_age_hours: float = Field(default=24, gt=0)

    @property
    def window_hours(self) -> float:
        return self.warmup_hours + self.soak_hours + self.production_hours
