"""Concurrency sweep: 1, 2, 4, ... workers streaming short completions, until the limit or the
first level that breaks the SLO. Each request is sent once (no retries), so 429s and errors are
counted as the endpoint gave them."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import openai

from k3artifacts.readiness.client import describe
from k3artifacts.readiness.suite import Slo, SweepSettings
from k3artifacts.releases.evaluations import Sweep, SweepPoint

#: A doubling of concurrency that adds less than this to throughput is past the knee.
KNEE_GAIN = 1.10


@dataclass(frozen=True)
class Sample:
    status: str  # ok | rate_limited | error
    ttft: float | None = None
    e2e: float | None = None
    tokens: int = 0
    error: str | None = None


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (no interpolation: a p99 of 4 samples is the worst one)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def one_request(client: openai.OpenAI, model: str, max_tokens: int) -> Sample:
    start = time.monotonic()
    ttft = None
    tokens = 0
    try:
        stream = client.chat.completions.create(
            model=model, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Write one sentence about the sea."}],
        )
        usage = None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                if choice.delta.content:
                    tokens += 1
                    ttft = ttft if ttft is not None else time.monotonic() - start
    except openai.RateLimitError:
        return Sample("rate_limited")
    except Exception as exc:  # any other failure counts against the error rate
        return Sample("error", error=describe(exc, 0))
    if ttft is None:
        return Sample("error", error="no token streamed")
    return Sample("ok", ttft, time.monotonic() - start,
                  usage.completion_tokens if usage else tokens)


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def measure_level(client: openai.OpenAI, model: str, concurrency: int,
                  settings: SweepSettings, slo: Slo) -> SweepPoint:
    n = max(4, concurrency * settings.requests_per_worker)
    start = time.monotonic()
    with ThreadPoolExecutor(concurrency, thread_name_prefix="k3a-sweep") as pool:
        samples = list(pool.map(lambda _: one_request(client, model, settings.max_tokens),
                                range(n)))
    wall = max(time.monotonic() - start, 1e-9)
    ok = [s for s in samples if s.status == "ok"]
    limited = sum(1 for s in samples if s.status == "rate_limited")
    errors = sum(1 for s in samples if s.status == "error")
    ttft = [s.ttft for s in ok if s.ttft is not None]
    e2e = [s.e2e for s in ok if s.e2e is not None]
    point = SweepPoint(
        concurrency=concurrency, requests=n, ok=len(ok), errors=errors, rate_limited=limited,
        ttft_p50=_r(percentile(ttft, 0.5)), ttft_p99=_r(percentile(ttft, 0.99)),
        e2e_p50=_r(percentile(e2e, 0.5)), e2e_p99=_r(percentile(e2e, 0.99)),
        tokens_per_s=round(sum(s.tokens for s in ok) / wall, 2),
        first_error=next((s.error for s in samples if s.error), None),
    )
    return point.model_copy(update={"breach": breach(point, slo)})


def breach(p: SweepPoint, slo: Slo) -> str | None:
    problems = []
    failed = (p.errors + p.rate_limited) / p.requests
    if failed > slo.max_error_rate:
        problems.append(f"{failed:.0%} of requests failed ({p.rate_limited} rate-limited 429, "
                        f"{p.errors} errors) > {slo.max_error_rate:.0%}"
                        + (f" (first error: {p.first_error})" if p.first_error else ""))
    if p.ttft_p99 is not None and p.ttft_p99 > slo.ttft_p99_s:
        problems.append(f"TTFT p99 {p.ttft_p99:.2f} s > {slo.ttft_p99_s:g} s")
    if p.e2e_p99 is not None and p.e2e_p99 > slo.e2e_p99_s:
        problems.append(f"end-to-end p99 {p.e2e_p99:.2f} s > {slo.e2e_p99_s:g} s")
    return "; ".join(problems) or None


def knee(points: list[SweepPoint]) -> int | None:
    found, prev = None, None
    for p in points:
        if p.breach or (prev is not None and p.tokens_per_s < KNEE_GAIN * prev.tokens_per_s):
            break
        found, prev = p.concurrency, p
    return found


def levels(limit: int) -> list[int]:
    out, c = [], 1
    while c < limit:
        out.append(c)
        c *= 2
    return [*out, limit]


def sweep(client: openai.OpenAI, model: str, settings: SweepSettings, slo: Slo,
          on_point: Callable[[SweepPoint], None] | None = None) -> Sweep:
    points: list[SweepPoint] = []
    for concurrency in levels(settings.max_concurrency):
        point = measure_level(client, model, concurrency, settings, slo)
        points.append(point)
        if on_point:
            on_point(point)
        if point.breach:
            break
    return Sweep(points=points, knee=knee(points), slo=slo.model_dump())
