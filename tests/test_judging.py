"""The statistical judge (k3artifacts/judging): its U test against complete enumeration of
the permutation distribution, and its three outcomes."""

from __future__ import annotations

import itertools
import random

import pytest

from k3artifacts.judging.compare import Criteria, compare
from k3artifacts.judging.utest import candidate_slower, ranks, shift


def exact_p(baseline: list[float], candidate: list[float]) -> float:
    """P(U >= observed) over every way of splitting the pooled values: the test's definition,
    computed without its normal approximation."""
    pooled = [*baseline, *candidate]
    observed = candidate_slower(baseline, candidate).u
    splits = list(itertools.combinations(range(len(pooled)), len(candidate)))
    count = 0
    for chosen in splits:
        cand = [pooled[i] for i in chosen]
        base = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        count += candidate_slower(base, cand).u >= observed - 1e-9
    return count / len(splits)


def test_ranks_average_ties_and_count_them():
    r, ties = ranks([3.0, 1.0, 3.0, 2.0, 3.0])
    assert r == [4.0, 1.0, 4.0, 2.0, 4.0]
    assert ties == 3 ** 3 - 3


@pytest.mark.parametrize("seed", range(6))
def test_the_normal_approximation_is_close_to_the_exact_p_value(seed):
    rng = random.Random(seed)
    # Rounded to whole milliseconds so there are ties, as recorded latencies have.
    base = [round(rng.gauss(10, 2)) / 1000 for _ in range(8)]
    cand = [round(rng.gauss(10 + seed * 0.6, 2)) / 1000 for _ in range(8)]
    assert abs(candidate_slower(base, cand).p_value - exact_p(base, cand)) < 0.02


def test_every_value_equal_is_no_evidence():
    assert candidate_slower([0.01] * 5, [0.01] * 5).p_value == 1.0


def test_hodges_lehmann_is_the_median_pairwise_difference():
    assert shift([1.0, 2.0], [2.0, 4.0]) == pytest.approx(1.5)


def _samples(rng: random.Random, n: int, base_ms: float, jitter_ms: float = 5.0) -> list[float]:
    return [(base_ms + rng.uniform(0, jitter_ms)) / 1000 for _ in range(n)]


def test_the_same_distribution_passes():
    rng = random.Random(1)
    verdict = compare(_samples(rng, 40, 10), _samples(rng, 40, 10), Criteria())
    assert verdict.outcome == "pass", verdict.reason
    assert verdict.n_baseline == verdict.n_candidate == 40


def test_a_slower_candidate_fails_with_its_numbers():
    rng = random.Random(2)
    verdict = compare(_samples(rng, 40, 10), _samples(rng, 40, 13), Criteria())
    assert verdict.outcome == "fail", verdict.reason
    assert verdict.shift_ms > verdict.tolerance_ms and verdict.p_value < 0.01
    assert "Mann-Whitney p" in verdict.reason


def test_a_significant_shift_within_the_floor_passes():
    # 0.5 ms slower, every time: real, and below the 1 ms floor.
    base = [0.010 + i / 1e6 for i in range(40)]
    verdict = compare(base, [b + 0.0005 for b in base], Criteria(margin=0.0))
    assert verdict.p_value < 0.01 and verdict.outcome == "pass", verdict.reason


def test_the_effect_must_beat_the_margin_as_well_as_the_floor():
    rng = random.Random(3)
    base, cand = _samples(rng, 60, 100, 1), _samples(rng, 60, 105, 1)
    assert compare(base, cand, Criteria(margin=0.10)).outcome == "pass"
    assert compare(base, cand, Criteria(margin=0.02)).outcome == "fail"


def test_too_few_samples_is_inconclusive():
    rng = random.Random(4)
    verdict = compare(_samples(rng, 10, 10), _samples(rng, 10, 30), Criteria())
    assert verdict.outcome == "inconclusive" and "fewer than the 40" in verdict.reason


def test_a_large_shift_the_test_cannot_confirm_is_inconclusive():
    # Two slow outliers among many fast answers: a large Hodges-Lehmann shift from a few
    # samples that no longer count as evidence at this alpha.
    base = [0.010, 0.011, 0.012, 0.013]
    cand = [0.009, 0.030, 0.031, 0.032]
    verdict = compare(base, cand, Criteria(min_samples=4, alpha=0.01))
    assert verdict.outcome == "inconclusive", verdict.reason


def test_counted_observations_are_judged_as_the_samples_they_count():
    """A histogram's buckets (each bound with its count) judge as those samples would."""
    from k3artifacts.judging.compare import compare_counts

    base = {0.01: 30.0, 0.02: 10.0}
    cand = {0.02: 25.0, 0.04: 15.0}
    expanded = compare([0.01] * 30 + [0.02] * 10, [0.02] * 25 + [0.04] * 15, Criteria())
    counted = compare_counts(base, cand, Criteria())
    assert counted == expanded and counted.outcome == "fail"
