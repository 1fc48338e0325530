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

from k3artifacts.policy.rollout import TrafficThresholds

TUPLE_LABEL = "k3a_io_tuple_id"
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


def histogram_query(metric: str, tuple_id: str, window: str) -> str:
    """Requests under each bucket bound over ``window``, of the pods serving ``tuple_id``."""
    return f'sum by (le) (increase({metric}_bucket{{{TUPLE_LABEL}="{tuple_id}"}}[{window}]))'


#: The histograms a canary is compared with the stable pods by: (name, metric).
COMPARED = (("e2e_latency", E2E), ("time_to_first_token", TTFT))


def step_queries(tuple_id: str, window: str, t: TrafficThresholds) -> list[Query]:
    sel = f'{TUPLE_LABEL}="{tuple_id}"'
    http = f'{sel},handler=~"{COMPLETIONS_HANDLER}"'

    def quantile(metric: str) -> str:
        return (f"histogram_quantile({t.quantile!r}, "
                f"sum by (le) (rate({metric}_bucket{{{sel}}}[{window}])))")

    errors = (f'(sum(rate({HTTP_REQUESTS}{{{http},status="5xx"}}[{window}])) or vector(0)) / '
              f"sum(rate({HTTP_REQUESTS}{{{http}}}[{window}]))")
    return [
        Query("requests", f"sum(increase({E2E}_count{{{sel}}}[{window}]))", "min",
              float(t.min_requests)),
        Query("e2e_latency", quantile(E2E), "max", t.max_e2e_s),
        Query("time_to_first_token", quantile(TTFT), "max", t.max_ttft_s),
        Query("error_rate", errors, "max", t.max_error_rate),
    ]
