"""Two samples compared with confidence: the ratio of two quantiles (order-statistic bounds of
each sample) and the ratio of two locations (Hodges-Lehmann / Mann-Whitney on logs).

**Quantile ratio** (:func:`judge_quantile_ratio`): is ``new``'s ``q``-quantile within
``ratio_max`` x ``base``'s? Both quantiles are estimates, so both samples' bounds count: each
sample's distribution-free order-statistic bound (:func:`kvgate.stats.confidence.bound`) at
``1 - (1 - c) / 2`` (Bonferroni over the two samples), and

- PASS when ``new.upper <= ratio_max x base.lower`` (the ratio's upper bound is within),
- FAIL when ``new.lower > ratio_max x base.upper`` (the ratio's lower bound is above),
- otherwise UNDECIDED.

Each error is within ``1 - c``: a wrong FAIL at the allowance needs new's lower bound above its
true quantile or base's upper bound below its own, each at most ``(1 - c) / 2``
(tests/test_stats_decisions.py simulates it at the allowance). With ``fail_confidence`` (a run's
false-alarm budget share) the two bounds that can FAIL (new's lower, base's upper) are at
``1 - (1 - fail_confidence) / 2``, the two that can PASS stay at ``1 - (1 - c) / 2``. pools/isolation (mixed vs alone)
and compare/latency (new revision vs baseline) both judge with it. Samples in any one unit (ms).

**Location ratio** (:func:`shift_ratio`): ``x / y`` as a scale factor between two positive
samples, estimated by the Hodges-Lehmann estimator on logs (the median of every ``log x_i - log
y_j``) with the exact Mann-Whitney confidence bounds (the k-th smallest and largest of those
``m n`` differences), distribution-free under a shift of the log distributions; valid at small
samples (8 and 8: the one-sided 95% bounds are the 16th smallest and largest of 64 differences).
A location ratio's bounds assume independent values: requests of one round that share its
queue are not (ICC 0.92-0.98 within a priority round on the embedded server).

**Ratio over independent units** (:func:`ratio_over_units`): one ratio per independent unit (a pair
of rounds run back to back, each pair's ratio its :func:`shift_ratio` point), the factor their
geometric mean, its bounds a one-sided Student-t interval on the logs (``n - 1`` degrees of
freedom; no bound below 2 units). Whatever the dependence *within* a unit, the units are the
sample; the t interval is exact for log-normal unit ratios and close for Hodges-Lehmann points
(tests/test_stats_decisions.py checks its coverage at 4 units). The priority gate's gain
(TTFT without priority / with priority) is judged on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from kvgate.stats.confidence import DEFAULT_CONFIDENCE, PercentileBound, bound
from kvgate.stats.dependence import dependent_bound

PASS, FAIL, UNDECIDED = "PASS", "FAIL", "UNDECIDED"


@dataclass(frozen=True)
class QuantileRatio:
    """``new q-quantile / base q-quantile <= ratio_max`` judged on both samples' order-statistic
    bounds, each at ``side`` = ``1 - (1 - c) / 2``: ``decision`` PASS (new.upper <= ratio_max x
    base.lower), FAIL (new.lower > ratio_max x base.upper) or UNDECIDED; ``point``: the ratio of
    the point estimates (shown, never judged). ``fail_confidence``: the FAIL side's level when it
    is not ``confidence`` (new's lower and base's upper bound then at ``fail_side``), else None."""

    new: PercentileBound
    base: PercentileBound
    ratio_max: float
    decision: str
    confidence: float
    fail_confidence: float | None = None

    @property
    def point(self) -> float | None:
        m, a = self.new.point, self.base.point
        return m / a if m and a and not math.isnan(m) and not math.isnan(a) else None

    @property
    def side(self) -> float:
        """Each sample's bound level, ``1 - (1 - confidence) / 2`` (the PASS side's: base's lower
        bound's, when the FAIL side has a level of its own)."""
        return self.base.confidence

    @property
    def fail_side(self) -> float:
        """The level of the bounds that can FAIL (new's lower, base's upper): ``1 - (1 -
        fail_confidence) / 2``; :attr:`side` without a ``fail_confidence``."""
        return self.new.confidence

    def to_dict(self) -> dict[str, Any]:
        out = {"new": self.new.to_dict(), "base": self.base.to_dict(), "ratio_max": self.ratio_max,
               "point": self.point, "decision": self.decision, "confidence": self.confidence,
               "rule": "PASS: new upper <= ratio_max x base lower; FAIL: new lower > ratio_max x base upper; "
                       "each bound one-sided at 1 - (1 - confidence) / 2"}
        if self.fail_confidence is not None:
            out["fail_confidence"] = self.fail_confidence
            out["rule"] += " (new lower and base upper at 1 - (1 - fail_confidence) / 2)"
        return out


def judge_quantile_ratio(base: Sequence[float], new: Sequence[float], q: float, ratio_max: float,
                         confidence: float = DEFAULT_CONFIDENCE, new_n_eff: float | None = None,
                         new_pass_confidence: float | None = None,
                         fail_confidence: float | None = None) -> QuantileRatio:
    """:class:`QuantileRatio` of ``new`` against ``base`` (same unit) at ``confidence`` for the
    ratio (each sample's bound at ``1 - (1 - confidence) / 2``). ``new_n_eff``: ``new`` is worth
    that many independent values (dependent, e.g. shorts in waves: its bound's ranks at the
    effective n, :func:`kvgate.stats.dependence.dependent_bound`; its ``n`` is then the effective
    n); None: independent. ``new_pass_confidence``: the level of ``new``'s upper bound when it is
    dependent (a declared floor, lower than its side's; the caller states it). ``fail_confidence``
    (a run's false-alarm budget share; None or ``confidence``: as before): the bounds that can FAIL
    (new's lower, base's upper) at ``1 - (1 - fail_confidence) / 2``, the PASS side's at ``1 - (1 -
    confidence) / 2``. Raises ValueError on ``q`` or ``confidence`` out of range
    (:func:`kvgate.stats.confidence.bound`)."""
    side = 1 - (1 - confidence) / 2
    fc = None if fail_confidence is None or fail_confidence == confidence else fail_confidence
    if fc is None:
        a = bound(base, q, side)
        m = bound(new, q, side) if new_n_eff is None or new_n_eff >= len(new) else \
            dependent_bound(new, q, side, new_pass_confidence, new_n_eff)
    else:
        fside = 1 - (1 - fc) / 2
        a = bound(base, q, side, fside)
        m = bound(new, q, fside, side) if new_n_eff is None or new_n_eff >= len(new) else \
            dependent_bound(new, q, fside, side if new_pass_confidence is None else new_pass_confidence, new_n_eff)
    if m.upper is not None and a.lower is not None and m.upper <= ratio_max * a.lower:
        d = PASS
    elif m.lower is not None and a.upper is not None and m.lower > ratio_max * a.upper:
        d = FAIL
    else:
        d = UNDECIDED
    return QuantileRatio(m, a, ratio_max, d, confidence, fc)


# ----------------------------------------------------------------------------- location ratio


@lru_cache(maxsize=256)
def _mw_cdf(m: int, n: int) -> tuple[float, ...]:
    """The exact null distribution of the Mann-Whitney U for samples of ``m`` and ``n`` (no ties):
    ``cdf[u] = P(U <= u)``, u = 0..m n (counting lattice paths)."""
    # f[j][u]: arrangements of i x's and j y's with U = u, built up over i
    f = [[1] + [0] * (m * n) for _ in range(n + 1)]  # i = 0: U = 0 only
    for i in range(1, m + 1):
        g = [[0] * (m * n + 1) for _ in range(n + 1)]
        for j in range(n + 1):
            for u in range(i * j + 1):
                # the largest element is an x (it beats all j y's) or a y
                c = f[j][u - j] if u >= j else 0
                if j:
                    c += g[j - 1][u]
                g[j][u] = c
        f = g
    counts = np.array(f[n], dtype=float)
    return tuple(np.cumsum(counts) / counts.sum())


def _mw_rank(m: int, n: int, confidence: float) -> int:
    """The 1-based rank ``k`` of the sorted ``m n`` differences that bounds the shift from below at
    one-sided ``confidence`` (largest ``k`` with ``P(U <= k - 1) <= 1 - c``; 0: none). Exact for
    ``m n <= 2500``, else the normal approximation with continuity correction."""
    alpha = 1 - confidence
    if m * n <= 2500:
        cdf = _mw_cdf(m, n)
        k = 0
        while k < m * n and cdf[k] <= alpha:  # cdf[k] = P(U <= k): rank k + 1 still bounds
            k += 1
        return k
    from scipy import stats as _st
    mu, sd = m * n / 2, math.sqrt(m * n * (m + n + 1) / 12)
    return max(0, int(math.floor(mu + float(_st.norm.ppf(alpha)) * sd - 0.5)) + 1)


@dataclass(frozen=True)
class ShiftRatio:
    """The scale factor ``x / y`` between two positive samples: ``point`` (Hodges-Lehmann on logs,
    exponentiated), ``lower``/``upper`` its exact Mann-Whitney bounds each one-sided at
    ``confidence`` (None: too few samples for a bound), ``m``/``n`` the sample sizes, ``rank``
    the order statistic of the ``m n`` log differences used."""

    point: float | None
    lower: float | None
    upper: float | None
    confidence: float
    m: int
    n: int
    rank: int

    def to_dict(self) -> dict[str, Any]:
        return {"point": self.point, "lower": self.lower, "upper": self.upper, "confidence": self.confidence,
                "m": self.m, "n": self.n, "rank": self.rank,
                "method": "Hodges-Lehmann on log values, exact Mann-Whitney bounds, each one-sided"}


def shift_ratio(x: Sequence[float], y: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> ShiftRatio:
    """:class:`ShiftRatio` of ``x`` over ``y`` (positive values, any one unit). Empty input or a
    value <= 0 raises ValueError."""
    xs, ys = np.asarray(list(x), dtype=float), np.asarray(list(y), dtype=float)
    if xs.size == 0 or ys.size == 0:
        raise ValueError(f"both samples need values, got {xs.size} and {ys.size}")
    if (xs <= 0).any() or (ys <= 0).any():
        raise ValueError("values must be positive (a ratio of scales)")
    d = np.sort((np.log(xs)[:, None] - np.log(ys)[None, :]).ravel())
    m, n = xs.size, ys.size
    k = _mw_rank(m, n, confidence)
    lo = float(math.exp(d[k - 1])) if k >= 1 else None
    hi = float(math.exp(d[m * n - k])) if k >= 1 else None
    return ShiftRatio(float(math.exp(np.median(d))), lo, hi, confidence, m, n, k)


@dataclass(frozen=True)
class UnitRatio:
    """A ratio measured once per independent unit: ``point`` (the geometric mean of ``ratios``),
    ``lower``/``upper`` (each one-sided at ``confidence``: Student t on the log ratios, ``n - 1``
    degrees of freedom; None below 2 units), ``n`` units, ``sd_log`` (the log ratios' sample
    standard deviation), ``unit`` (what one ratio is). ``upper_confidence``: the level ``upper`` is
    one-sided at when it is not ``confidence`` (a FAIL side judged at a run's false-alarm budget
    share), else None."""

    point: float | None
    lower: float | None
    upper: float | None
    confidence: float
    n: int
    sd_log: float | None
    ratios: tuple[float, ...]
    unit: str
    upper_confidence: float | None = None

    @property
    def upper_level(self) -> float:
        """The level ``upper`` is one-sided at: ``upper_confidence``, else ``confidence``."""
        return self.confidence if self.upper_confidence is None else self.upper_confidence

    def to_dict(self) -> dict[str, Any]:
        out = {"point": self.point, "lower": self.lower, "upper": self.upper, "confidence": self.confidence,
               "n": self.n, "n_eff": self.n, "sd_log": self.sd_log, "ratios": list(self.ratios), "unit": self.unit,
               "method": "geometric mean of one ratio per independent unit, one-sided Student t bounds on the logs"}
        if self.upper_confidence is not None:
            out["upper_confidence"] = self.upper_confidence
        return out


def ratio_over_units(ratios: Sequence[float], confidence: float = DEFAULT_CONFIDENCE,
                     unit: str = "pair of rounds", upper_confidence: float | None = None) -> UnitRatio:
    """:class:`UnitRatio` of ``ratios`` (positive, one per independent ``unit``), both bounds
    one-sided at ``confidence``; the upper at ``upper_confidence`` when given and different (the
    caller's FAIL side at a level of its own: priority FAILs a gain whose upper bound is below
    ``min_gain``). Numbers: 6, 7, 5, 8 -> upper 8.12x at 95%, 17.4x at 99.89% (t at 3 df 2.35,
    9.85). Empty input or a ratio <= 0 raises ValueError."""
    from kvgate.stats import t_quantile

    xs = np.asarray([float(r) for r in ratios], dtype=float)
    if xs.size == 0:
        raise ValueError("need at least one unit's ratio")
    if (xs <= 0).any() or not np.isfinite(xs).all():
        raise ValueError("ratios must be positive and finite")
    logs = np.log(xs)
    mean = float(logs.mean())
    uc = None if upper_confidence is None or upper_confidence == confidence else upper_confidence
    if xs.size < 2:
        return UnitRatio(math.exp(mean), None, None, confidence, 1, None, tuple(xs.tolist()), unit, uc)
    sd = float(logs.std(ddof=1))
    half = t_quantile(2 * confidence - 1, xs.size - 1) * sd / math.sqrt(xs.size)  # one-sided at confidence
    up = half if uc is None else t_quantile(2 * uc - 1, xs.size - 1) * sd / math.sqrt(xs.size)
    return UnitRatio(math.exp(mean), math.exp(mean - half), math.exp(mean + up), confidence, int(xs.size), sd,
                     tuple(xs.tolist()), unit, uc)


__all__ = ["FAIL", "PASS", "QuantileRatio", "ShiftRatio", "UNDECIDED", "UnitRatio", "judge_quantile_ratio",
           "ratio_over_units", "shift_ratio"]
