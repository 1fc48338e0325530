"""The one-sided Mann-Whitney U test (Wilcoxon rank-sum), with its tie correction, and the
Hodges-Lehmann shift estimator that goes with it.

Why this test and not a bootstrap interval: latency samples are skewed, heavy-tailed and
tied (a server's clock, our rounding to 0.1 ms), so a test on means or a normal model is
wrong, and a bootstrap's interval moves with its random resamples (the same evidence could be
judged twice with two answers). U is distribution-free under the null hypothesis "the two
samples come from one distribution", deterministic, and what Kayenta's canary judge uses per
metric. Its p-value here is the normal approximation with the tie-corrected variance and a
continuity correction: already within 0.015 of the exact permutation p-value at 8 samples a
side, with ties (``tests/test_judging.py`` checks it against complete enumeration), and the
judge decides on no fewer than its minimum samples (40 a side by default), where it is closer.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

#: Observations as value -> how many times it was seen: raw samples (each value once or a
#: few times) or a histogram's buckets (each bucket's bound, with its count).
Counts = Mapping[float, float]


@dataclass(frozen=True)
class UTest:
    #: U of the candidate: how many (baseline, candidate) pairs the candidate is slower in
    #: (a tie counts one half).
    u: float
    z: float
    #: P(U >= u) if both came from one distribution: small means "the candidate is slower".
    p_value: float


def counted(values: list[float]) -> dict[float, float]:
    return dict(Counter(values))


def ranks(values: list[float]) -> tuple[list[float], float]:
    """Ranks from 1 (ties get the mean of the ranks they span), and sum(t^3 - t) over the
    groups of t tied values, which the variance of U is corrected by."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    ties = 0.0
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    return out, ties


def candidate_slower_counts(baseline: Counts, candidate: Counts) -> UTest:
    """H1: the candidate's values tend to be larger than the baseline's. Each distinct value
    is one group of ties, so a histogram's buckets are judged as the samples they count
    (every observation in a bucket tied with the others there)."""
    n, m = sum(baseline.values()), sum(candidate.values())
    if n <= 0 or m <= 0:
        raise ValueError("both sides need samples")
    u = ties = below = 0.0  # below: baseline observations under the current value
    for value in sorted(set(baseline) | set(candidate)):
        b, c = baseline.get(value, 0.0), candidate.get(value, 0.0)
        u += c * (below + b / 2)
        below += b
        ties += (b + c) ** 3 - (b + c)
    total = n + m
    variance = n * m / 12 * ((total + 1) - ties / (total * (total - 1)))
    if variance <= 0:  # every value equal: no evidence either way
        return UTest(u, 0.0, 1.0)
    z = (u - n * m / 2 - 0.5) / math.sqrt(variance)
    return UTest(u, z, 0.5 * math.erfc(z / math.sqrt(2)))


def candidate_slower(baseline: list[float], candidate: list[float]) -> UTest:
    return candidate_slower_counts(counted(baseline), counted(candidate))


def weighted_quantile(counts: Counts, q: float) -> float:
    """The value with ``q`` of the weight at or below it; where that falls exactly between
    two values, their mean (a median of an even count, as :func:`statistics.median`)."""
    ordered = sorted(counts)
    target = q * sum(counts.values())
    seen = 0.0
    for i, value in enumerate(ordered):
        seen += counts[value]
        if seen > target:
            return value
        if seen == target and i + 1 < len(ordered):
            return (value + ordered[i + 1]) / 2
    return ordered[-1]


def shift_counts(baseline: Counts, candidate: Counts) -> float:
    """Hodges-Lehmann: the median of every pairwise difference candidate - baseline, the
    shift U tests for (robust to the outliers a median of each side would also ignore, and
    less noisy than the difference of the two medians); each pair weighted by how often its
    two values were seen."""
    pairs: dict[float, float] = {}
    for b, nb in baseline.items():
        for c, nc in candidate.items():
            pairs[c - b] = pairs.get(c - b, 0.0) + nb * nc
    return weighted_quantile(pairs, 0.5)


def shift(baseline: list[float], candidate: list[float]) -> float:
    return shift_counts(counted(baseline), counted(candidate))
