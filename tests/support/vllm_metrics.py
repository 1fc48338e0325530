"""vLLM's Prometheus metrics, as the test server exports them on ``/metrics``: the names, labels
and histogram buckets of vLLM's ``vllm/v1/metrics/loggers.py`` (0.11) and of the HTTP counter
its API server adds (prometheus-fastapi-instrumentator: ``http_requests_total`` with the status
grouped as ``2xx``/``4xx``/``5xx``), in the Prometheus text format a real server scrapes."""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass, field

E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip(self.buckets, self.counts, strict=True):
            running += count
            out.append(f'{name}_bucket{{{labels},le="{bound}"}} {running}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.n}')
        out.append(f"{name}_sum{{{labels}}} {self.total}")
        out.append(f"{name}_count{{{labels}}} {self.n}")
        return out


@dataclass
class VllmMetrics:
    model_name: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    e2e: _Histogram = field(default_factory=lambda: _Histogram(E2E_BUCKETS))
    ttft: _Histogram = field(default_factory=lambda: _Histogram(TTFT_BUCKETS))
    success: dict[str, int] = field(default_factory=dict)
    http: dict[tuple[str, str, str], int] = field(default_factory=dict)
    running: int = 0

    def started(self) -> None:
        with self.lock:
            self.running += 1

    def finished(self, *, e2e: float, ttft: float, reason: str) -> None:
        with self.lock:
            self.running -= 1
            self.e2e.observe(e2e)
            self.ttft.observe(ttft)
            self.success[reason] = self.success.get(reason, 0) + 1

    def failed(self) -> None:
        with self.lock:
            self.running -= 1

    def answered(self, handler: str, method: str, status: int) -> None:
        key = (handler, method, f"{status // 100}xx")
        with self.lock:
            self.http[key] = self.http.get(key, 0) + 1

    def exposition(self) -> bytes:
        model = f'model_name="{self.model_name}"'
        with self.lock:
            lines = [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{model}}} {self.running}",
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{{{model}}} 0",
                "# HELP vllm:request_success_total Count of successfully processed requests.",
                "# TYPE vllm:request_success_total counter",
                *(f'vllm:request_success_total{{{model},finished_reason="{r}"}} {n}'
                  for r, n in sorted(self.success.items())),
                "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in "
                "seconds.",
                "# TYPE vllm:e2e_request_latency_seconds histogram",
                *self.e2e.lines("vllm:e2e_request_latency_seconds", model),
                "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in "
                "seconds.",
                "# TYPE vllm:time_to_first_token_seconds histogram",
                *self.ttft.lines("vllm:time_to_first_token_seconds", model),
                "# HELP http_requests_total Total number of requests by method, status and "
                "handler.",
                "# TYPE http_requests_total counter",
                *(f'http_requests_total{{handler="{h}",method="{m}",status="{s}"}} {n}'
                  for (h, m, s), n in sorted(self.http.items())),
            ]
        return ("\n".join(lines) + "\n").encode()
