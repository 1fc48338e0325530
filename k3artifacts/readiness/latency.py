"""Per-request latency samples of an eval run: requests sent one at a time (the sweep's
request, so a sample means what a sweep level's p50 means), after the suite's cases and before
the sweep loads the endpoint. Where a baseline has samples, each round is judged against them
(:mod:`k3artifacts.judging`), and an inconclusive judgement draws another round, up to the
policy's bound: what "inconclusive" means is "not enough evidence yet"."""

from __future__ import annotations

from dataclasses import dataclass

import openai

from k3artifacts.judging.compare import Judgement
from k3artifacts.readiness.sweep import one_request
from k3artifacts.releases.evaluations import Baseline, LatencySamples, latency_judgement


@dataclass(frozen=True)
class Sampling:
    """Requests per round (the policy's ``min_samples``) and in all (``max_samples``)."""

    per_round: int
    max_samples: int


def sample_latency(client: openai.OpenAI, model: str, max_tokens: int, sampling: Sampling,
                   baseline: Baseline | None) -> tuple[LatencySamples, Judgement | None]:
    e2e: list[float] = []
    ttft: list[float] = []
    errors = rounds = 0
    while True:
        rounds += 1
        for _ in range(sampling.per_round):
            sample = one_request(client, model, max_tokens)
            if sample.status == "ok" and sample.e2e is not None and sample.ttft is not None:
                e2e.append(round(sample.e2e, 5))
                ttft.append(round(sample.ttft, 5))
            else:
                errors += 1
        samples = LatencySamples(max_tokens=max_tokens, e2e=e2e, ttft=ttft, errors=errors,
                                 rounds=rounds)
        verdict = latency_judgement(samples, baseline) if baseline else None
        sent = rounds * sampling.per_round
        if (verdict is None or verdict.outcome != "inconclusive"
                or sent + sampling.per_round > sampling.max_samples):
            return samples, verdict
