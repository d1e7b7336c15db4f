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

**Two levels** (``fail_confidence``): every verdict here may judge its FAIL side at a level of its
own, above ``c`` (a run's false-alarm budget share,
:meth:`kvgate.profile.models.VerdictsSpec.fail_confidence`): the bound that can FAIL is then
one-sided at ``fail_confidence``, the bound that can PASS stays at ``c``; a wrong FAIL at the
limit is then within ``1 - fail_confidence``, a wrong PASS still within ``1 - c``. None (or
equal to ``c``): both at ``c``, as before.

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
    ceiling of 0: any one FAILs). ``fail_confidence``: the level of the bound that can FAIL (the
    lower at ``at most``, the upper at ``at least``) when it is not ``confidence`` (a run's
    false-alarm budget share); ``confidence`` is then the PASS side's level only. None: both at
    ``confidence``."""

    k: int
    n: int
    limit: float
    lower: float
    upper: float
    confidence: float
    kind: str
    decision: str
    exact: bool = False
    fail_confidence: float | None = None

    @property
    def fail_level(self) -> float:
        """The level the FAIL side's bound is one-sided at: ``fail_confidence``, else ``confidence``."""
        return self.confidence if self.fail_confidence is None else self.fail_confidence

    @property
    def rate(self) -> float | None:
        return self.k / self.n if self.n else None

    def text(self, what: str, unit: str = "requests", final: bool = True) -> str:
        """E.g. ``error rate 1/80 = 1.2%, 95% upper bound 6.8% > 5.0% max ... -> INCONCLUSIVE``."""
        r = "n/a" if self.rate is None else f"{self.rate:.1%}"
        head = f"{what} {self.k}/{self.n} {unit} = {r}"
        c = f"{self.confidence * 100:.4g}%"
        cf = f"{self.fail_level * 100:.4g}%"
        lim = f"{self.limit:.1%}"
        if self.exact:
            rel = "> 0" if self.decision == FAIL else "= 0"
            return f"{head} (limit 0: any one counts) {rel} -> {self.decision}"
        if self.kind == "at most":
            if self.decision == PASS:
                return f"{head}, {c} upper bound {self.upper:.1%} <= {lim} -> PASS"
            if self.decision == FAIL:
                return f"{head}, {cf} lower bound {self.lower:.2%} > {lim} -> FAIL"
        else:
            if self.decision == PASS:
                return f"{head}, {c} lower bound {self.lower:.1%} >= {lim} -> PASS"
            if self.decision == FAIL:
                return f"{head}, {cf} upper bound {self.upper:.1%} < {lim} -> FAIL"
        end = 'INCONCLUSIVE' if final else 'undecided'
        if self.fail_confidence is None:
            return f"{head}, {c} bounds {self.lower:.1%}..{self.upper:.1%} straddle {lim} -> {end}"
        lc, uc = (cf, c) if self.kind == "at most" else (c, cf)
        return f"{head}, bounds {self.lower:.1%} ({lc} lower)..{self.upper:.1%} ({uc} upper) straddle {lim} -> {end}"

    def to_dict(self) -> dict[str, Any]:
        out = {"k": self.k, "n": self.n, "rate": self.rate, "limit": self.limit, "lower": self.lower,
               "upper": self.upper, "confidence": self.confidence, "kind": self.kind, "decision": self.decision,
               "method": "count (limit 0)" if self.exact else "Clopper-Pearson, exact, each bound one-sided"}
        if self.fail_confidence is not None:
            out["fail_confidence"] = self.fail_confidence
        return out


def _fail_level(confidence: float, fail_confidence: float | None) -> float | None:
    """``fail_confidence`` when it is a level of its own, else None (both sides at ``confidence``)."""
    return None if fail_confidence is None or fail_confidence == confidence else fail_confidence


def judge_at_most(k: int, n: int, limit: float, confidence: float = 0.95,
                  fail_confidence: float | None = None) -> RateJudgement:
    """``k`` of ``n`` (e.g. failed requests) against the ceiling ``limit`` (fraction): PASS when
    the one-sided upper bound (at ``confidence``) is at or below it, FAIL when the one-sided lower
    bound (at ``fail_confidence``; None: ``confidence``) is above it, else UNDECIDED. ``limit`` 0:
    FAIL on any ``k > 0``, PASS on ``k == 0`` (a measured fact); ``n == 0``: UNDECIDED (nothing
    measured). Numbers: 9 of 80 against 5% -- 95% lower bound 6.0% > 5% FAILs; at 99.89% (a 1%
    budget's share) 3.2%: UNDECIDED. Raises ValueError like :func:`one_sided`."""
    fc = _fail_level(confidence, fail_confidence)
    lo, hi = one_sided(k, n, confidence)
    if fc is not None:
        lo = one_sided(k, n, fc)[0]
    if limit <= 0:
        d = FAIL if k > 0 else (PASS if n else UNDECIDED)
        return RateJudgement(k, n, limit, lo, hi, confidence, "at most", d, exact=True, fail_confidence=fc)
    d = PASS if n and hi <= limit else FAIL if n and lo > limit else UNDECIDED
    return RateJudgement(k, n, limit, lo, hi, confidence, "at most", d, fail_confidence=fc)


def judge_at_least(k: int, n: int, limit: float, confidence: float = 0.95,
                   fail_confidence: float | None = None) -> RateJudgement:
    """``k`` of ``n`` (e.g. items right) against the floor ``limit`` (fraction): PASS when the
    one-sided lower bound (at ``confidence``) is at or above it, FAIL when the one-sided upper
    bound (at ``fail_confidence``; None: ``confidence``) is below it, else UNDECIDED (also
    ``n == 0``). Numbers: 26 of 65 against 55% -- upper bound 51.0% at 95%, 59.6% at 99.89%:
    FAIL, then UNDECIDED. Raises ValueError like :func:`one_sided`."""
    fc = _fail_level(confidence, fail_confidence)
    lo, hi = one_sided(k, n, confidence)
    if fc is not None:
        hi = one_sided(k, n, fc)[1]
    d = PASS if n and lo >= limit else FAIL if n and hi < limit else UNDECIDED
    return RateJudgement(k, n, limit, lo, hi, confidence, "at least", d, fail_confidence=fc)


@dataclass(frozen=True)
class NonInferiority:
    """``p1 - p0`` (``k1/n1`` new, ``k0/n0`` reference) against ``-margin``: ``low``/``high`` the
    Newcombe bounds, each one-sided at ``confidence`` (the ``2c - 1`` two-sided interval);
    ``decision`` PASS (low >= -margin: not worse by the margin), FAIL (high < -margin: worse by
    more), else UNDECIDED. ``fail_confidence``: the level ``high`` (the bound that can FAIL) is
    one-sided at when it is not ``confidence`` (a run's false-alarm budget share), else None."""

    diff: float
    low: float
    high: float
    margin: float
    confidence: float
    decision: str
    fail_confidence: float | None = None

    @property
    def fail_level(self) -> float:
        """The level ``high`` is one-sided at: ``fail_confidence``, else ``confidence``."""
        return self.confidence if self.fail_confidence is None else self.fail_confidence

    def to_dict(self) -> dict[str, Any]:
        out = {"difference": self.diff, "low": self.low, "high": self.high, "margin": self.margin,
               "confidence": self.confidence, "decision": self.decision,
               "method": "Newcombe hybrid score (method 10), each bound one-sided; PASS low >= -margin, "
                         "FAIL high < -margin"}
        if self.fail_confidence is not None:
            out["fail_confidence"] = self.fail_confidence
        return out


def judge_not_worse(k1: int, n1: int, k0: int, n0: int, margin: float, confidence: float = 0.95,
                    fail_confidence: float | None = None) -> NonInferiority:
    """Non-inferiority of ``k1/n1`` to ``k0/n0`` by ``margin`` (fraction points, >= 0) on the
    Newcombe interval at ``2c - 1`` two-sided (each bound one-sided at ``confidence``); the upper
    bound (the FAIL side) one-sided at ``fail_confidence`` when given (None: ``confidence``).
    Raises ValueError when ``n1`` or ``n0`` is 0."""
    if n1 <= 0 or n0 <= 0:
        raise ValueError(f"both samples need items, got n1={n1}, n0={n0}")
    fc = _fail_level(confidence, fail_confidence)
    d, lo, hi = difference_interval(k1, n1, k0, n0, 2 * confidence - 1)
    if fc is not None:
        hi = difference_interval(k1, n1, k0, n0, 2 * fc - 1)[2]
    dec = PASS if lo >= -margin else FAIL if hi < -margin else UNDECIDED
    return NonInferiority(d, lo, hi, margin, confidence, dec, fail_confidence=fc)


__all__ = ["FAIL", "NonInferiority", "PASS", "RateJudgement", "UNDECIDED", "difference_interval", "interval",
           "judge_at_least", "judge_at_most", "judge_not_worse", "one_sided"]
