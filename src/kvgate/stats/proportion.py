"""Proportions with exact confidence: Clopper-Pearson bounds of one rate, Newcombe's hybrid score
interval of a difference of two, and the three-outcome verdicts kvgate's gates take from them.

**One rate** (``k`` of ``n`` independent trials): the Clopper-Pearson bounds invert the binomial
test, so each one-sided bound errs with probability at most ``1 - c`` whatever the true rate
(conservative for discrete ``k``). :func:`one_sided` gives the lower and the upper bound each
one-sided at ``c`` (together a ``2c - 1`` two-sided interval), :func:`interval` the two-sided
``c`` interval (each side at ``(1 + c) / 2``).

**The verdicts** (:class:`RateJudgement`): a rate against a *ceiling* (:func:`judge_at_most`: the
error rate against ``slo.error_rate_max``) PASSes when its upper bound is at or below the ceiling,
FAILs when its lower bound is above it, else UNDECIDED; a ceiling of 0 is a measured fact, not
a bound (any one failure FAILs, none PASSes). A rate against a *floor* (:func:`judge_at_least`:
an accuracy against ``min_accuracy``) PASSes when its lower bound is at or above the floor,
FAILs when its upper bound is below it. Both errors (a wrong PASS at the limit, a wrong FAIL at
the limit) are each within ``1 - c``: tests/test_stats_decisions.py simulates them.

**A difference** (``k1/n1 - k0/n0``, two independent samples): :func:`difference_interval`,
Newcombe (1998) method 10 (Wilson score intervals combined); :func:`judge_not_worse` is the
non-inferiority test on it: PASS when the difference's lower bound (one-sided at ``c``) is at
or above ``-margin``, FAIL when its upper bound is below ``-margin``, else UNDECIDED.

Rates are fractions in [0, 1]; counts are whole trials. Only scipy beyond the standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from scipy import stats as _st

PASS, FAIL, UNDECIDED = "PASS", "FAIL", "UNDECIDED"


def _check(k: int, n: int, confidence: float) -> None:
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def one_sided(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """``(lower, upper)`` Clopper-Pearson bounds of the rate ``k/n``, **each one-sided** at
    ``confidence`` (lower = Beta(1 - c; k, n - k + 1), upper = Beta(c; k + 1, n - k); 0 and 1 at
    the edges). ``n == 0`` gives ``(0.0, 1.0)``. Raises ValueError on counts out of range."""
    _check(k, n, confidence)
    if n == 0:
        return (0.0, 1.0)
    lo = 0.0 if k == 0 else float(_st.beta.ppf(1 - confidence, k, n - k + 1))
    hi = 1.0 if k == n else float(_st.beta.ppf(confidence, k + 1, n - k))
    return (lo, hi)


def interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) **two-sided** interval of ``k``/``n`` at ``confidence`` (each side
    one-sided at ``(1 + c) / 2``); ``(0.0, 1.0)`` when ``n <= 0``."""
    if n <= 0:
        return (0.0, 1.0)
    return one_sided(k, n, (1 + confidence) / 2)


def _wilson(k: int, n: int, z: float) -> tuple[float, float]:
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (c - h, c + h)


def difference_interval(k1: int, n1: int, k0: int, n0: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """``(d, low, high)``: the difference ``k1/n1 - k0/n0`` with Newcombe's hybrid score interval
    (method 10 of Newcombe 1998, Wilson intervals combined), **two-sided** at ``confidence``
    (each side about ``(1 + c) / 2``). Raises ZeroDivisionError when ``n1`` or ``n0`` is 0."""
    z = float(_st.norm.ppf(1 - (1 - confidence) / 2))
    p1, p0 = k1 / n1, k0 / n0
    l1, u1 = _wilson(k1, n1, z)
    l0, u0 = _wilson(k0, n0, z)
    d = p1 - p0
    low = d - math.sqrt((p1 - l1) ** 2 + (u0 - p0) ** 2)
    high = d + math.sqrt((u1 - p1) ** 2 + (p0 - l0) ** 2)
    return (d, low, high)


@dataclass(frozen=True)
class RateJudgement:
    """A rate ``k/n`` (fraction) against ``limit``: ``lower``/``upper`` its Clopper-Pearson bounds,
    each one-sided at ``confidence``; ``kind`` ``at most`` (a ceiling: PASS when upper <= limit,
    FAIL when lower > limit) or ``at least`` (a floor: PASS when lower >= limit, FAIL when upper <
    limit); ``decision`` PASS / FAIL / UNDECIDED; ``exact``: decided by the count alone (a
    ceiling of 0: any one FAILs)."""

    k: int
    n: int
    limit: float
    lower: float
    upper: float
    confidence: float
    kind: str
    decision: str
    exact: bool = False

    @property
    def rate(self) -> float | None:
        return self.k / self.n if self.n else None

    def text(self, what: str, unit: str = "requests", final: bool = True) -> str:
        """E.g. ``error rate 1/80 = 1.2%, 95% upper bound 6.8% > 5.0% max ... -> INCONCLUSIVE``."""
        r = "n/a" if self.rate is None else f"{self.rate:.1%}"
        head = f"{what} {self.k}/{self.n} {unit} = {r}"
        c = f"{self.confidence * 100:.4g}%"
        lim = f"{self.limit:.1%}"
        if self.exact:
            rel = "> 0" if self.decision == FAIL else "= 0"
            return f"{head} (limit 0: any one counts) {rel} -> {self.decision}"
        if self.kind == "at most":
            if self.decision == PASS:
                return f"{head}, {c} upper bound {self.upper:.1%} <= {lim} -> PASS"
            if self.decision == FAIL:
                return f"{head}, {c} lower bound {self.lower:.2%} > {lim} -> FAIL"
        else:
            if self.decision == PASS:
                return f"{head}, {c} lower bound {self.lower:.1%} >= {lim} -> PASS"
            if self.decision == FAIL:
                return f"{head}, {c} upper bound {self.upper:.1%} < {lim} -> FAIL"
        return (f"{head}, {c} bounds {self.lower:.1%}..{self.upper:.1%} straddle {lim} -> "
                f"{'INCONCLUSIVE' if final else 'undecided'}")

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "n": self.n, "rate": self.rate, "limit": self.limit, "lower": self.lower,
                "upper": self.upper, "confidence": self.confidence, "kind": self.kind, "decision": self.decision,
                "method": "count (limit 0)" if self.exact else "Clopper-Pearson, exact, each bound one-sided"}


def judge_at_most(k: int, n: int, limit: float, confidence: float = 0.95) -> RateJudgement:
    """``k`` of ``n`` (e.g. failed requests) against the ceiling ``limit`` (fraction): PASS when
    the one-sided upper bound is at or below it, FAIL when the one-sided lower bound is above it,
    else UNDECIDED. ``limit`` 0: FAIL on any ``k > 0``, PASS on ``k == 0`` (a measured fact);
    ``n == 0``: UNDECIDED (nothing measured). Raises ValueError like :func:`one_sided`."""
    lo, hi = one_sided(k, n, confidence)
    if limit <= 0:
        d = FAIL if k > 0 else (PASS if n else UNDECIDED)
        return RateJudgement(k, n, limit, lo, hi, confidence, "at most", d, exact=True)
    d = PASS if n and hi <= limit else FAIL if n and lo > limit else UNDECIDED
    return RateJudgement(k, n, limit, lo, hi, confidence, "at most", d)


def judge_at_least(k: int, n: int, limit: float, confidence: float = 0.95) -> RateJudgement:
    """``k`` of ``n`` (e.g. items right) against the floor ``limit`` (fraction): PASS when the
    one-sided lower bound is at or above it, FAIL when the one-sided upper bound is below it,
    else UNDECIDED (also ``n == 0``). Raises ValueError like :func:`one_sided`."""
    lo, hi = one_sided(k, n, confidence)
    d = PASS if n and lo >= limit else FAIL if n and hi < limit else UNDECIDED
    return RateJudgement(k, n, limit, lo, hi, confidence, "at least", d)


@dataclass(frozen=True)
class NonInferiority:
    """``p1 - p0`` (``k1/n1`` new, ``k0/n0`` reference) against ``-margin``: ``low``/``high`` the
    Newcombe bounds, each one-sided at ``confidence`` (the ``2c - 1`` two-sided interval);
    ``decision`` PASS (low >= -margin: not worse by the margin), FAIL (high < -margin: worse by
    more), else UNDECIDED."""

    diff: float
    low: float
    high: float
    margin: float
    confidence: float
    decision: str

    def to_dict(self) -> dict[str, Any]:
        return {"difference": self.diff, "low": self.low, "high": self.high, "margin": self.margin,
                "confidence": self.confidence, "decision": self.decision,
                "method": "Newcombe hybrid score (method 10), each bound one-sided; PASS low >= -margin, "
                          "FAIL high < -margin"}


def judge_not_worse(k1: int, n1: int, k0: int, n0: int, margin: float, confidence: float = 0.95) -> NonInferiority:
    """Non-inferiority of ``k1/n1`` to ``k0/n0`` by ``margin`` (fraction points, >= 0) on the
    Newcombe interval at ``2c - 1`` two-sided (each bound one-sided at ``confidence``). Raises
    ValueError when ``n1`` or ``n0`` is 0."""
    if n1 <= 0 or n0 <= 0:
        raise ValueError(f"both samples need items, got n1={n1}, n0={n0}")
    d, lo, hi = difference_interval(k1, n1, k0, n0, 2 * confidence - 1)
    dec = PASS if lo >= -margin else FAIL if hi < -margin else UNDECIDED
    return NonInferiority(d, lo, hi, margin, confidence, dec)


__all__ = ["FAIL", "NonInferiority", "PASS", "RateJudgement", "UNDECIDED", "difference_interval", "interval",
           "judge_at_least", "judge_at_most", "judge_not_worse", "one_sided"]
