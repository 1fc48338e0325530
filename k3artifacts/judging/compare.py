"""Pass, fail or inconclusive: is the candidate slower than the baseline by more than the
criteria tolerate, with the evidence to say so?

``fail`` needs both: the test says slower (one-sided Mann-Whitney U, p < ``alpha``: the
false-alarm rate when nothing changed), and the effect is larger than the tolerance: the
Hodges-Lehmann shift exceeds ``margin`` times the baseline's median AND ``floor_ms``. The
test alone would fail a real but harmless 0.3 ms; the effect alone would fail noise.
``inconclusive``: fewer than ``min_samples`` on a side, or an effect beyond the tolerance the
test cannot tell from noise (draw more samples). ``pass``: otherwise (no shift beyond the
tolerance, whatever the test says). Each judgement carries its numbers, for the record.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from k3artifacts.judging.utest import (
    Counts,
    candidate_slower_counts,
    counted,
    shift_counts,
    weighted_quantile,
)

Outcome = Literal["pass", "fail", "inconclusive"]


class Criteria(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The false-alarm rate of the test: P(it says "slower" | nothing changed), one-sided.
    alpha: float = Field(default=0.01, gt=0, lt=0.5)
    #: The shift tolerated, as a fraction of the baseline's median...
    margin: float = Field(default=0.10, ge=0)
    #: ...and in milliseconds: a shift must exceed both to fail.
    floor_ms: float = Field(default=1.0, ge=0)
    #: Fewer samples than this on either side: inconclusive.
    min_samples: int = Field(default=40, ge=2)
    #: What an inconclusive judgement counts as, once no more samples will come.
    inconclusive: Literal["fail", "pass"] = "fail"


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


class Judgement(BaseModel):
    """A comparison's outcome and its numbers (milliseconds), as recorded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    outcome: Outcome
    reason: str
    criteria: Criteria
    n_baseline: int
    n_candidate: int
    baseline_p50_ms: float | None = None
    candidate_p50_ms: float | None = None
    baseline_p90_ms: float | None = None
    candidate_p90_ms: float | None = None
    #: Hodges-Lehmann shift (candidate - baseline) and the tolerance it is held against.
    shift_ms: float | None = None
    tolerance_ms: float | None = None
    u: float | None = None
    p_value: float | None = None

    @property
    def passed(self) -> bool:
        return self.outcome == "pass" or (
            self.outcome == "inconclusive" and self.criteria.inconclusive == "pass")

    @property
    def line(self) -> str:
        counted = (f" (counted as {self.criteria.inconclusive}, as the policy says)"
                   if self.outcome == "inconclusive" else "")
        return f"{self.outcome}{counted}: {self.reason}"


def compare(baseline: list[float], candidate: list[float], criteria: Criteria,
            what: str = "latency") -> Judgement:
    """Judge ``candidate`` against ``baseline`` (samples in seconds; larger is worse)."""
    return compare_counts(counted(baseline), counted(candidate), criteria, what)


def compare_counts(baseline: Counts, candidate: Counts, criteria: Criteria,
                   what: str = "latency") -> Judgement:
    """:func:`compare` of observations counted by value (a histogram's buckets: each
    bucket's upper bound with the requests it counts)."""
    n, m = round(sum(baseline.values())), round(sum(candidate.values()))
    if min(n, m) < criteria.min_samples:
        return Judgement(outcome="inconclusive", criteria=criteria, n_baseline=n, n_candidate=m,
                         reason=f"{what}: {n} baseline and {m} candidate samples, fewer than "
                                f"the {criteria.min_samples} a side the policy asks for")
    base50 = weighted_quantile(baseline, 0.5)
    cand50 = weighted_quantile(candidate, 0.5)
    moved = shift_counts(baseline, candidate)
    tolerance = max(criteria.margin * base50, criteria.floor_ms / 1000)
    test = candidate_slower_counts(baseline, candidate)
    significant = test.p_value < criteria.alpha
    numbers = (f"{what} shift {_ms(moved):+.2f} ms (p50 {_ms(base50):.2f} -> {_ms(cand50):.2f} "
               f"ms; tolerance {_ms(tolerance):.2f} ms = max({criteria.margin:.0%} of the "
               f"baseline's p50, {criteria.floor_ms:g} ms)), Mann-Whitney p = "
               f"{test.p_value:.2g} (alpha {criteria.alpha:g}), n = {n}/{m}")
    if moved <= tolerance:
        outcome: Outcome = "pass"
        why = "within tolerance"
    elif significant:
        outcome, why = "fail", "slower beyond tolerance"
    else:
        outcome, why = "inconclusive", "beyond tolerance but not significant"
    return Judgement(
        outcome=outcome, reason=f"{why}: {numbers}", criteria=criteria,
        n_baseline=n, n_candidate=m,
        baseline_p50_ms=_ms(base50), candidate_p50_ms=_ms(cand50),
        baseline_p90_ms=_ms(weighted_quantile(baseline, 0.9)),
        candidate_p90_ms=_ms(weighted_quantile(candidate, 0.9)),
        shift_ms=_ms(moved), tolerance_ms=_ms(tolerance),
        u=test.u, p_value=round(test.p_value, 6))
