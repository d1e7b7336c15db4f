"""Dependent samples: how many independent values a sample of requests is worth, and a
percentile bound taken at that many.

Requests sent together move together: the shorts of one interference wave queue behind the same
long prefills (an intraclass correlation of 0.998 measured on the embedded smollm2-cpu server,
2026-12-06: 60 shorts worth 15 values), and a closed loop whose workers start at once runs in
lock-step waves (lag-4 autocorrelation of TTFT in send order 0.99). An order-statistic bound
(:mod:`kvgate.stats.confidence`) over such a sample claims ``n`` independent values where there
are far fewer: at the limit it PASSed wrongly 27-46% of the time where 5% was stated.

- :func:`icc_oneway`: the intraclass correlation of values grouped in clusters (waves), by one-way
  ANOVA (ICC(1); unequal cluster sizes use the ``n0`` of Snedecor & Cochran).
- :func:`lag_autocorr`: the lag-``k`` autocorrelation of a series in send order.
- :func:`kish_n_eff`: Kish's effective n, ``n / (1 + (m - 1) rho)`` for clusters of ``m``.
- :func:`wave_dependence` / :func:`send_order_dependence`: the measured :class:`Dependence` of a
  sample (unit, what was measured, its value, the design effect, the effective n).
- :func:`judge_dependent`: :func:`kvgate.stats.confidence.judge` with the order-statistic ranks
  taken at the effective n and mapped back onto the whole sample (the design-effect adjustment of
  Woodruff's quantile interval): exact for clusters of identical values (ICC 1), close for
  ICC 0.9 (tests/test_dependence.py simulates both: lock-step waves of 4 at the true p95 give
  wrong PASS and wrong FAIL within the stated rate). An effective n below what a PASS needs at
  its level makes a PASS impossible (UNDECIDED): :func:`n_to_decide` says how many would do.
- :func:`pass_confidence`: the highest confidence at which a PASS holds on the sample (what the
  samples give, for a verdict that cannot reach its stated level).
- :func:`one_per_cluster`: a random member of each cluster (independent values, for a bound
  that needs none of the above).

Every function takes plain sequences of floats (any unit) and imports nothing from kvgate but
:mod:`kvgate.stats`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy import stats as _st

from kvgate.stats.confidence import (FAIL, PASS, UNDECIDED, Judgement, decide, PercentileBound, lower_rank,
                                     min_samples_to_pass, upper_rank)
from kvgate.stats import percentile


def icc_oneway(groups: Sequence[Sequence[float]]) -> float | None:
    """ICC(1) of ``groups`` (clusters of values, any unit) by one-way ANOVA:
    ``(MSB - MSW) / (MSB + (n0 - 1) MSW)``, ``n0`` the Snedecor-Cochran mean cluster size for
    unequal sizes. Clusters of one value add to the between-cluster part only. Returns the raw
    estimate (it can be below 0 when clusters are less alike than chance), 1.0 when every cluster
    holds one repeated value that differs between clusters, None when it cannot be estimated
    (fewer than 2 clusters, no cluster of 2 or more, or no variation at all)."""
    gs = [np.asarray(g, dtype=float) for g in groups if len(g)]
    k = len(gs)
    sizes = np.array([len(g) for g in gs], dtype=float)
    n = sizes.sum()
    if k < 2 or n - k < 1:
        return None
    grand = np.concatenate(gs).mean()
    ssb = float(sum(len(g) * (g.mean() - grand) ** 2 for g in gs))
    ssw = float(sum(((g - g.mean()) ** 2).sum() for g in gs))
    msb, msw = ssb / (k - 1), ssw / (n - k)
    n0 = (n - (sizes ** 2).sum() / n) / (k - 1)
    if msb == 0 and msw == 0:
        return None
    if msw == 0:
        return 1.0
    return float((msb - msw) / (msb + (n0 - 1) * msw))


def lag_autocorr(xs: Sequence[float], k: int) -> float | None:
    """The lag-``k`` autocorrelation of ``xs`` (a series in send order, any unit): the sample
    autocovariance at lag ``k`` over the variance (the usual biased estimator, as
    ``statsmodels.tsa.acf``). None when the series is shorter than ``k + 2`` or constant.
    Raises ValueError on ``k < 1``."""
    if k < 1:
        raise ValueError(f"lag must be >= 1, got {k}")
    x = np.asarray(xs, dtype=float)
    if len(x) < k + 2:
        return None
    d = x - x.mean()
    var = float((d ** 2).sum())
    if var == 0:
        return None
    return float((d[:-k] * d[k:]).sum() / var)


def kish_n_eff(n: int, m: float, rho: float) -> float:
    """Kish's effective sample size of ``n`` values in clusters of (mean) size ``m`` with
    intraclass correlation ``rho`` (clipped to [0, 1]): ``n / (1 + (m - 1) rho)``."""
    r = min(1.0, max(0.0, rho))
    return n / (1.0 + (max(1.0, m) - 1.0) * r)


@dataclass(frozen=True)
class Dependence:
    """How dependent a sample is and what it is worth. ``unit``: what one value is (``short
    request``, ``request``); ``cluster``: what groups them (``wave``; ``send order`` for a series);
    ``n`` values in ``clusters`` clusters (None for a series); ``measure``: what was measured
    (``ICC within waves (one-way ANOVA)``, ``lag-1..4 autocorrelation in send order``);
    ``value``: its estimate (None: not estimable -- the worst case was assumed); ``design_effect``
    (>= 1) and ``n_eff`` = ``n / design_effect``."""

    unit: str
    cluster: str
    n: int
    clusters: int | None
    measure: str
    value: float | None
    design_effect: float
    n_eff: float
    lags: tuple[float | None, ...] = ()
    #: The effective n a FAIL's (lower) bound is taken at, when below ``n_eff``: for a send-order
    #: series, one value per ``max_lag`` requests (:func:`send_order_dependence`, the worst a
    #: lock-step loop can be). At a false-alarm budget's FAIL level (0.028% a look) the PASS side's
    #: estimate -- the lag sum beyond its noise allowance, biased low at 32 requests -- made wrong
    #: FAILs 2.3% at ICC 1 where 0.11% is stated; the sum counted whole still 0.47%; the worst case
    #: 0.0% (tests/test_dependence.py). None: ``n_eff``.
    fail_n_eff: float | None = None

    @property
    def n_eff_fail(self) -> float:
        """The effective n the FAIL side uses: ``fail_n_eff``, else ``n_eff``."""
        return self.n_eff if self.fail_n_eff is None else min(self.n_eff, self.fail_n_eff)

    def text(self) -> str:
        """``60 short requests in 15 waves, ICC within waves 0.42 (one-way ANOVA): effective n 26``."""
        where = f" in {self.clusters} {self.cluster}s" if self.clusters is not None else ""
        val = "not estimable (worst case assumed)" if self.value is None else f"{self.value:.2f}"
        if self.cluster == "send order" and self.value is not None:
            # the value is a sum over lags; only its part beyond the noise allowance counts
            # (send_order_dependence: design effect 1 + 2 * beyond)
            val = (f"{'sum ' if len(self.lags) > 1 else ''}{self.value:.2f} "
                   f"({(self.design_effect - 1.0) / 2.0:.2f} beyond noise)")
            fail = ""
            if self.fail_n_eff is not None and self.fail_n_eff < self.n_eff:  # a budget's FAIL side: the worst case
                fail = (f" (a FAIL: one value per {self.n / self.fail_n_eff:,.0f} {self.unit}s, the worst case: "
                        f"effective n {self.fail_n_eff:,.1f})")
            return f"{self.n:,} {self.unit}s, {self.measure}: {val}: effective n {self.n_eff:,.1f}{fail}"
        return (f"{self.n:,} {self.unit}s{where}, {self.measure} {val}: effective n {self.n_eff:,.1f}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Dependence":
        """The :class:`Dependence` a :meth:`to_dict` wrote (a step's evidence read back); raises
        KeyError when a field it needs is missing."""
        return cls(d["unit"], d["cluster"], d["n"], d.get("clusters"), d["measure"], d.get("value"),
                   d["design_effect"], d["n_eff"], tuple(d.get("lag_autocorr") or ()), d.get("n_eff_fail"))

    def to_dict(self) -> dict[str, Any]:
        out = {"unit": self.unit, "cluster": self.cluster, "n": self.n, "clusters": self.clusters,
               "measure": self.measure, "value": self.value, "design_effect": self.design_effect,
               "n_eff": self.n_eff, "formula": ("Kish: n / (1 + (m - 1) * rho)" if self.clusters is not None
                                                 else "n / (1 + 2 * max(0, sum_k (1 - k/n) r_k - 1.645 * sqrt(K / n))): "
                                                      "the lag-1..K autocorrelation sum beyond its noise allowance")}
        if self.cluster == "send order" and self.value is not None:
            out["autocorr_sum"] = self.value
            out["autocorr_sum_beyond_noise"] = (self.design_effect - 1.0) / 2.0
        if self.lags:
            out["lag_autocorr"] = list(self.lags)
        if self.fail_n_eff is not None:
            out["n_eff_fail"] = self.fail_n_eff
        return out


def independent(n: int, unit: str = "request") -> Dependence:
    """A sample of independent values by design (one per cluster): effective n = ``n``."""
    return Dependence(unit, "none", n, None, "independent by design", 0.0, 1.0, float(n))


def wave_dependence(groups: Sequence[Sequence[float]], unit: str = "short request",
                    cluster: str = "wave") -> Dependence:
    """The :class:`Dependence` of values sent in clusters (``groups``, one list per wave): the
    ICC by :func:`icc_oneway`, the design effect ``1 + (m - 1) rho`` with ``m`` the mean cluster
    size and ``rho`` the ICC clipped to [0, 1] (not estimable: ``rho`` = 1, the worst case: one
    value per cluster)."""
    gs = [list(g) for g in groups if len(g)]
    n = sum(len(g) for g in gs)
    m = n / len(gs) if gs else 1.0
    icc = icc_oneway(gs)
    rho = 1.0 if icc is None else min(1.0, max(0.0, icc))
    deff = 1.0 + (m - 1.0) * rho
    return Dependence(unit, cluster, n, len(gs), f"ICC within {cluster}s (one-way ANOVA)", icc, deff,
                      n / deff if n else 0.0)


#: The autocorrelations' sum is counted beyond this many of its standard errors under independence
#: (``sqrt(K / n)``) only: a sum that noise alone would reach is not taken as dependence.
NOISE_Z = 1.645


def send_order_dependence(xs: Sequence[float], max_lag: int, unit: str = "request",
                          noise_z: float = NOISE_Z, fail_worst: bool = False) -> Dependence:
    """The :class:`Dependence` of a series in send order (a closed loop's requests): the
    autocorrelations at lags 1..``max_lag`` (the loop's concurrency: requests sent together are
    neighbours, and a lock-step loop repeats its wave every ``concurrency`` requests), the design
    effect ``1 + 2 * max(0, sum_k (1 - k/n) r_k - noise_z * sqrt(max_lag / n))`` (the variance
    inflation of a stationary series, truncated at ``max_lag``; 4 identical values per wave give
    about 4, Kish's ``m`` at ICC 1), the sum counted beyond what independent values reach by chance
    one time in 20 (``noise_z`` standard errors): independent requests keep their n (at 80
    requests the sum's noise alone cost a healthy server its PASS), while lock-step waves -- the
    sum 1.5 against a noise allowance of 0.37 at 80 -- still lose most of theirs (simulated in
    tests/test_dependence.py at the limit: within the stated error rates). Fewer
    than ``max_lag + 2`` values: not estimable, design effect ``max_lag`` (the worst case of waves
    of ``max_lag``). ``fail_worst`` (a run with a false-alarm budget): the FAIL side's effective n
    (:attr:`Dependence.n_eff_fail`) is that worst case, ``n / max_lag``, whatever the estimate --
    a FAIL at a budget's level (0.028% a look) cannot rest on an estimate that small samples bias
    low; False: both sides at ``n_eff`` (validated at 95%: tests/test_dependence.py)."""
    n, k = len(xs), max(1, int(max_lag))
    lags = tuple(lag_autocorr(xs, j) for j in range(1, k + 1)) if n >= k + 2 else ()
    what = f"lag-1..{k} autocorrelation in send order" if k > 1 else "lag-1 autocorrelation in send order"
    if not lags or any(r is None for r in lags):
        deff = float(k)
        return Dependence(unit, "send order", n, None, what, None, deff, n / deff if n else 0.0, lags)
    s = sum((1 - j / n) * float(r) for j, r in enumerate(lags, 1) if r is not None)
    deff = 1.0 + 2.0 * max(0.0, s - noise_z * math.sqrt(k / n))
    worse = fail_worst and float(k) > deff
    return Dependence(unit, "send order", n, None, what, float(s), deff, n / deff, lags, n / k if worse else None)


def _floor_n(n_eff: float, n: int) -> int:
    return max(1, min(n, int(math.floor(n_eff + 1e-9))))


def dependent_bound(values: Sequence[float], q: float, confidence: float, pass_confidence: float | None,
                    n_eff: float, fail_n_eff: float | None = None) -> PercentileBound:
    """The ``q``-quantile's one-sided bounds of ``values`` worth ``n_eff`` independent values:
    :func:`judge_dependent`'s ranks (those of ``m`` = floor(``n_eff``) mapped onto the ``n`` sorted
    values, the conservative end of each block); the upper at ``pass_confidence`` when given; the
    lower at ``fail_n_eff`` when given (:attr:`Dependence.n_eff_fail`). Its ``n`` is ``m``. Used where a dependent sample is one side of a comparison
    (:func:`kvgate.stats.twosample.judge_quantile_ratio`'s ``new_n_eff``)."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    hi = confidence if pass_confidence is None else pass_confidence
    if n == 0:
        return PercentileBound(q, 0, None, None, None, confidence, None, None, None if hi == confidence else hi)
    m = _floor_n(n_eff, n)
    mf = m if fail_n_eff is None else min(m, _floor_n(fail_n_eff, n))
    km, jm = upper_rank(m, q, hi), lower_rank(mf, q, confidence)
    k = None if km is None else min(n, math.ceil(km * n / m - 1e-9))
    j = None if jm is None else min(n, int(math.floor((jm - 1) * n / mf + 1e-9)) + 1)
    return PercentileBound(q, m, percentile(xs, q * 100), xs[j - 1] if j else None, xs[k - 1] if k else None,
                           confidence, j, k, None if hi == confidence else hi)


def judge_dependent(values: Sequence[float], q: float, limit: float, confidence: float,
                    pass_confidence: float | None, dep: Dependence) -> Judgement:
    """Judge the ``q``-quantile of ``values`` against ``limit`` as
    :func:`kvgate.stats.confidence.judge` does, with the order-statistic ranks of ``m`` =
    floor(``dep.n_eff``) independent values mapped onto the ``n`` sorted values: the upper bound
    is value ``ceil(k_m * n / m)`` for the upper rank ``k_m`` among ``m``, the lower bound value
    ``floor((j_m - 1) * n / m) + 1`` for the lower rank ``j_m`` (both the conservative end of the
    block of ``n / m`` values one independent value stands for). ``m`` below what a PASS needs
    at ``pass_confidence`` (:func:`~kvgate.stats.confidence.min_samples_to_pass`): no upper bound,
    no PASS. The :class:`~kvgate.stats.confidence.Judgement`'s ``bound.n`` is ``m`` (what
    its text prints as ``n=``). ``dep.n_eff >= n`` gives :func:`~kvgate.stats.confidence.judge`'s
    own ranks. Raises ValueError like :func:`~kvgate.stats.confidence.upper_rank`."""
    exceed = sum(1 for v in values if float(v) > limit)
    b = dependent_bound(values, q, confidence, pass_confidence, dep.n_eff, dep.n_eff_fail)
    if b.n == 0:
        return Judgement(b, limit, UNDECIDED, 0)
    d = decide(b.lower, b.upper, limit)
    return Judgement(b, limit, d, exceed)


def pass_confidence(values: Sequence[float], q: float, limit: float, n_eff: float) -> float:
    """The highest confidence at which the ``q``-quantile's upper bound of ``values`` (worth
    ``n_eff`` independent values, :func:`judge_dependent`'s mapping) is within ``limit``:
    ``P(Bin(m, q) <= r - 1)`` for ``r`` the highest rank among ``m`` = floor(``n_eff``) whose
    mapped value is within the limit (0.0 when none is). 60 values in 15 identical waves, all
    within the limit: ``1 - 0.95**15`` = 53.7% at p95."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        return 0.0
    m = _floor_n(n_eff, n)
    best = 0
    for r in range(1, m + 1):
        if xs[min(n, math.ceil(r * n / m - 1e-9)) - 1] <= limit:
            best = r
    return float(_st.binom.cdf(best - 1, m, q)) if best else 0.0


def n_to_decide(q: float, level: float, dep: Dependence) -> int:
    """How many values (in ``dep.unit``) a PASS at ``level`` needs at the design effect measured:
    :func:`~kvgate.stats.confidence.min_samples_to_pass` independent ones times
    ``dep.design_effect``, rounded up."""
    return math.ceil(min_samples_to_pass(q, level) * dep.design_effect - 1e-9)


def one_per_cluster(groups: Sequence[Sequence[float]], rng: np.random.Generator) -> list[float]:
    """One value drawn at random (``rng``, injected) from each non-empty cluster of ``groups``:
    independent values when the clusters are."""
    return [float(g[int(rng.integers(len(g)))]) for g in groups if len(g)]


__all__ = ["Dependence", "DependentJudgement", "dependent_bound", "icc_oneway", "independent", "judge_dependent", "judge_sample", "kish_n_eff", "lag_autocorr",
           "n_to_decide", "one_per_cluster", "pass_confidence", "send_order_dependence", "wave_dependence"]


@dataclass(frozen=True)
class DependentJudgement:
    """A percentile judged at the effective n (:func:`judge_sample`): the ``judgement``, the
    ``dependence`` measured, ``need`` (values in ``dependence.unit`` a PASS at the stated level
    would need at this dependence; None when a PASS was possible), ``achieved`` (the confidence a
    PASS has on these samples, :func:`pass_confidence`) and ``floor`` (the lower PASS level the
    caller allowed and used; None: not used)."""

    judgement: Judgement
    dependence: Dependence
    need: int | None
    achieved: float
    floor: float | None = None
    #: The PASS level stated (the plan's), when the judgement's own is the ``floor``.
    stated: float | None = None

    @property
    def decision(self) -> str:
        return self.judgement.decision

    def text(self, what: str, unit: str = "ms", final: bool = True, floor_field: str = "") -> str:
        """The judgement's clause (:meth:`~kvgate.stats.confidence.Judgement.text`, ``n=`` the
        effective n), then the dependence (unit, measure, effective n), then -- when no PASS was
        possible -- the n that would decide and the confidence these samples give; a PASS at the
        declared lower level names it (``floor_field``)."""
        dep = self.dependence
        out = f"{self.judgement.text(what, unit, final)}; {dep.text()}"
        b = self.judgement.bound
        if self.floor is not None:
            out += (f"; a PASS at the {self.floor * 100:.4g}% the profile declares for too few independent samples"
                    f"{f' ({floor_field})' if floor_field else ''}: these samples give {self.achieved * 100:.1f}%"
                    + (f", {(self.stated or b.upper_level) * 100:.4g}% would need about {self.need:,} {dep.unit}s"
                       if self.need is not None else ""))
        elif self.need is not None:
            out += (f"; a PASS at {b.upper_level * 100:.4g}% needs about {self.need:,} {dep.unit}s at this "
                    f"dependence (effective n {min_samples_to_pass(b.q, b.upper_level)}); these samples give "
                    f"{self.achieved * 100:.1f}%")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**self.judgement.to_dict(), "dependence": self.dependence.to_dict(), "n_to_decide": self.need,
                "pass_confidence_achieved": self.achieved, "pass_confidence_floor_used": self.floor,
                "pass_confidence_stated": self.stated}


def judge_sample(values: Sequence[float], q: float, limit: float, confidence: float, pass_confidence_: float | None,
                 dep: Dependence, floor: float | None = None, at_end: bool = True) -> DependentJudgement:
    """:func:`judge_dependent`; when no PASS is possible at the effective n (too few independent
    values for ``pass_confidence_``), ``floor`` is given, lower, and ``at_end`` (the sampling's
    last look: no more values will come), the PASS side at ``floor`` instead -- a PASS then
    errs at most ``1 - floor`` and says so. The FAIL side is never lowered."""
    j = judge_dependent(values, q, limit, confidence, pass_confidence_, dep)
    hi = confidence if pass_confidence_ is None else pass_confidence_
    achieved = pass_confidence(values, q, limit, dep.n_eff) if len(values) else 0.0
    need = n_to_decide(q, hi, dep) if j.bound.upper_rank is None and len(values) else None
    if (j.decision == UNDECIDED and need is not None and floor is not None and at_end and floor < hi):
        low = judge_dependent(values, q, limit, confidence, floor, dep)
        if low.decision == PASS:
            return DependentJudgement(low, dep, need, achieved, floor, hi)
    return DependentJudgement(j, dep, need, achieved)
