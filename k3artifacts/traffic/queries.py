"""The queries of a canary step, one definition for the AnalysisTemplate and ``k3a traffic
analyze``.

Series are picked by the pod label ``k3a.io/tuple-id`` as Prometheus's usual
``labelmap: __meta_kubernetes_pod_label_(.+)`` relabelling writes it (``k3a_io_tuple_id``), so a
candidate's metrics never mix with the stable tuple's even when both serve the same model name.
Error rate comes from the HTTP request counter vLLM's API server exports
(``http_requests_total``, status grouped as ``2xx``/``4xx``/``5xx``): vLLM's ``vllm:`` counters
count finished requests only, and a request that fails never finishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from k3artifacts.policy.rollout import ComparisonPolicy, TrafficThresholds

TUPLE_LABEL = "k3a_io_tuple_id"
#: The label Argo Rollouts puts on each ReplicaSet's pods (relabelled as above): the one thing
#: that tells the stable pods from the canary's inside the cluster, where the stable tuple's
#: id is not known when the Rollout is rendered.
HASH_LABEL = "rollouts_pod_template_hash"
E2E = "vllm:e2e_request_latency_seconds"
TTFT = "vllm:time_to_first_token_seconds"
HTTP_REQUESTS = "http_requests_total"
COMPLETIONS_HANDLER = "/v1/(chat/)?completions"


@dataclass(frozen=True)
class Query:
    name: str
    promql: str
    #: ``max``: the value must be <= limit; ``min``: >= limit.
    bound: Literal["max", "min"]
    limit: float

    def holds(self, value: float) -> bool:
        # NaN (no samples) compares false either way: never a pass.
        return value <= self.limit if self.bound == "max" else value >= self.limit

    def condition(self) -> str:
        """Argo Rollouts' successCondition (expr): one sample, a number, within the bound."""
        op = "<=" if self.bound == "max" else ">="
        return f"len(result) == 1 && !isNaN(result[0]) && result[0] {op} {self.limit!r}"


def by_tuple(tuple_id: str) -> str:
    """The series selector of the pods serving ``tuple_id``."""
    return f'{TUPLE_LABEL}="{tuple_id}"'


def by_pod_hash(pod_template_hash: str) -> str:
    """The series selector of one ReplicaSet's pods of a Rollout."""
    return f'{HASH_LABEL}="{pod_template_hash}"'


def histogram_query(metric: str, selector: str, window: str) -> str:
    """Requests under each bucket bound over ``window``, of the pods ``selector`` picks."""
    return f"sum by (le) (increase({metric}_bucket{{{selector}}}[{window}]))"


def quantile_query(metric: str, quantile: float, selector: str, window: str) -> str:
    return (f"histogram_quantile({quantile!r}, "
            f"sum by (le) (rate({metric}_bucket{{{selector}}}[{window}])))")


def finished_query(selector: str, window: str) -> str:
    """Finished requests over ``window``: what every latency figure of these pods rests on."""
    return f"sum(increase({E2E}_count{{{selector}}}[{window}]))"


#: The histograms a canary is compared with the stable pods by: (name, metric).
COMPARED = (("e2e_latency", E2E), ("time_to_first_token", TTFT))


def step_queries(tuple_id: str, window: str, t: TrafficThresholds) -> list[Query]:
    sel = by_tuple(tuple_id)
    http = f'{sel},handler=~"{COMPLETIONS_HANDLER}"'
    errors = (f'(sum(rate({HTTP_REQUESTS}{{{http},status="5xx"}}[{window}])) or vector(0)) / '
              f"sum(rate({HTTP_REQUESTS}{{{http}}}[{window}]))")
    return [
        Query("requests", finished_query(sel, window), "min", float(t.min_requests)),
        Query("e2e_latency", quantile_query(E2E, t.quantile, sel, window), "max", t.max_e2e_s),
        Query("time_to_first_token", quantile_query(TTFT, t.quantile, sel, window), "max",
              t.max_ttft_s),
        Query("error_rate", errors, "max", t.max_error_rate),
    ]


@dataclass(frozen=True)
class StableQuery:
    """One histogram of the canary against the stable pods', as one number the cluster can
    judge: the canary's quantile over the most the stable pods' quantile tolerates,
    ``max(stable * (1 + margin), stable + floor)``, so above 1 is slower beyond both the margin
    and the floor (the judge's rule, on the quantile instead of a rank test, which PromQL
    cannot compute). NaN when either side finished fewer than ``min_samples`` requests in the
    window: no evidence, counted as the policy's ``inconclusive`` says."""

    name: str
    promql: str
    inconclusive: Literal["fail", "pass"]

    def condition(self) -> str:
        """Argo Rollouts' successCondition: within tolerance (NaN: as ``inconclusive``)."""
        within = "result[0] <= 1.0"
        if self.inconclusive == "pass":
            within = f"(isNaN(result[0]) || {within})"
        else:
            within = f"!isNaN(result[0]) && {within}"
        return f"len(result) == 1 && {within}"


def stable_queries(canary: str, stable: str, window: str, quantile: float,
                   c: ComparisonPolicy) -> list[StableQuery]:
    """The :data:`COMPARED` histograms of the pods ``canary`` selects against ``stable``'s."""
    enough = " and on() ".join(f"({finished_query(s, window)} >= {c.min_samples})"
                               for s in (canary, stable))
    out = []
    for name, metric in COMPARED:
        base = quantile_query(metric, quantile, stable, window)
        tolerated = f"({base} + clamp_min({base} * {c.margin!r}, {c.floor_ms / 1000!r}))"
        ratio = f"{quantile_query(metric, quantile, canary, window)} / {tolerated}"
        out.append(StableQuery(name, f"(({ratio}) and on() {enough}) or on() vector(NaN)",
                               c.inconclusive))
    return out
