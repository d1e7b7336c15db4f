"""Latency statistics over load records, and a regression slope with a confidence interval.

Per request (from a :class:`kvgate.load.RequestRecord`, all in seconds):

- **TTFT** = ``first_token_s - sent_s`` (first event carrying generated text; from the moment the
  request was written, so schedule lag is *not* in it — see ``LoadResult.lags_s`` for that);
- **ITL** = the gaps between consecutive content events of one request; pooled over requests
  (:func:`summarize`, :mod:`kvgate.stats.cluster`) as ``vllm bench serve`` does;
- **TPOT** = ``(e2e - ttft) / (tokens - 1)`` when ``tokens > 1``;
- **e2e** = ``end_s - sent_s`` (response complete).

:func:`summarize` pools them over requests into p50/p95/p99/mean/max **in milliseconds**.
:mod:`kvgate.stats.confidence` bounds a percentile from order statistics (exact binomial) and
plans the sequential looks of the percentile gates.
:func:`linear_fit` gives a least-squares slope with a two-sided confidence interval (scipy's t
quantile when scipy is installed, else a built-in t table for 90/95/99 %), for soak rounds;
:func:`points_to_decide` says how many evenly spaced rounds would narrow that interval below a
given distance at the scatter measured (:func:`residual_sd`, :func:`slope_half_width`).

Soak trends: :func:`trend` puts a robust Theil-Sen slope (scipy) beside the least-squares one,
:func:`low_envelope` reduces memory samples to the floor of each round (what is *retained*), and
:func:`growth` decides whether a series grows faster than a ceiling, fitting the last part of the
run separately, testing for a plateau (a bounded cache that fills and stops) and for a one-off step
(:func:`find_step`: growth in one or two rounds, flat after). Every slope interval allows for
autocorrelated rounds (:func:`round_dependence`: lag-1 autocorrelation, effective n) and a PASS
rests on an upper bound (:attr:`Growth.below`).
"""

from __future__ import annotations

import contextlib
import contextvars

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Protocol, Sequence

import numpy as np


class _Record(Protocol):  # what kvgate.load.RequestRecord provides
    sent_s: float | None
    first_token_s: float | None
    end_s: float | None
    content_s: list[float]
    tokens: int | None
    status: int
    error: str | None
    hung_up: bool
    tag: str

    @property
    def ok(self) -> bool: ...


# ----------------------------------------------------------------------------- percentiles


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100, linear interpolation, numpy's default); NaN when empty;
    +inf when it falls between two +inf values (failed requests counted as exceedances,
    :func:`kvgate.load.sampling.with_failures`: numpy's interpolation would give NaN there)."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return math.nan
    with np.errstate(invalid="ignore"):  # inf - inf in the interpolation: answered below
        v = float(np.percentile(arr, q))
    if math.isnan(v) and not np.isnan(arr).any():
        return math.inf
    return v


def distribution(values: Iterable[float], qs: Sequence[float] = (50, 95, 99), scale: float = 1.0) -> dict[str, Any]:
    """``{"n", "p50", "p95", "p99", "mean", "max"}`` of ``values`` times ``scale``.

    Keys are ``p<q>`` for each ``q`` in ``qs`` (``p99.9`` style for fractional q). Empty input
    gives ``n=0`` and ``None`` for every statistic (JSON-friendly).
    """
    arr = np.asarray(list(values), dtype=float) * scale
    out: dict[str, Any] = {"n": int(arr.size)}
    for q in qs:
        out[f"p{q:g}"] = float(np.percentile(arr, q)) if arr.size else None
    out["mean"] = float(arr.mean()) if arr.size else None
    out["max"] = float(arr.max()) if arr.size else None
    return out


# ----------------------------------------------------------------------------- per request


@dataclass
class RequestMetrics:
    """Latencies of one request, seconds (None where not defined)."""

    ttft_s: float | None
    e2e_s: float | None
    tpot_s: float | None
    itl_s: list[float] = field(default_factory=list)
    tokens: int | None = None
    ok: bool = False


def request_metrics(rec: _Record) -> RequestMetrics:
    """TTFT, ITL, TPOT and e2e of one record (see the module docstring for the definitions)."""
    sent = rec.sent_s
    ttft = rec.first_token_s - sent if sent is not None and rec.first_token_s is not None else None
    e2e = rec.end_s - sent if sent is not None and rec.end_s is not None else None
    c = rec.content_s
    itl = [c[i + 1] - c[i] for i in range(len(c) - 1)]
    tokens = rec.tokens
    tpot = None
    if ttft is not None and e2e is not None and tokens is not None and tokens > 1:
        tpot = (e2e - ttft) / (tokens - 1)
    return RequestMetrics(ttft, e2e, tpot, itl, tokens, bool(rec.ok))


def summarize(records: Sequence[_Record], qs: Sequence[float] = (50, 95, 99)) -> dict[str, Any]:
    """Pooled latency summary of the records that succeeded, in **milliseconds**.

    Returns ``{"requests", "ok", "errors", "hung_up", "censored", "error_rate", "tokens", "ttft_ms",
    "itl_ms", "tpot_ms", "e2e_ms", "max_gap_ms", "error_samples"}``; each ``*_ms`` is a
    :func:`distribution`; ``itl_ms`` pools every gap of every successful request (its p95 is
    ``vllm bench serve``'s ITL p95), ``tpot_ms`` is one value per request. ``error_rate`` = errors /
    (requests - deliberate hang-ups - censored): a record cut by kvgate's own deadline (``censored``)
    is neither ok nor an error.
    ``max_gap_ms`` is the longest silence within a successful stream, the wait for the first
    event included (``first event - sent``, then between consecutive events).
    """
    ttft: list[float] = []
    itl: list[float] = []
    tpot: list[float] = []
    e2e: list[float] = []
    gaps: list[float] = []
    tokens = 0
    errors = 0
    hung = 0
    censored = 0
    samples: list[str] = []
    for r in records:
        if r.hung_up:
            hung += 1
            continue
        if getattr(r, "censored", False):
            censored += 1
            continue
        if not r.ok:
            errors += 1
            if r.error and len(samples) < 5 and r.error not in samples:
                samples.append(r.error)
            continue
        m = request_metrics(r)
        if m.ttft_s is not None:
            ttft.append(m.ttft_s)
        if m.e2e_s is not None:
            e2e.append(m.e2e_s)
        if m.tpot_s is not None:
            tpot.append(m.tpot_s)
        itl.extend(m.itl_s)
        tokens += m.tokens or 0
        g = max_gap_s(r)
        if g is not None:
            gaps.append(g)
    judged = len(records) - hung - censored
    return {
        "requests": len(records),
        "ok": judged - errors,
        "errors": errors,
        "hung_up": hung,
        "censored": censored,
        "error_rate": errors / judged if judged else 0.0,
        "tokens": tokens,
        "ttft_ms": distribution(ttft, qs, 1e3),
        "itl_ms": distribution(itl, qs, 1e3),
        "tpot_ms": distribution(tpot, qs, 1e3),
        "e2e_ms": distribution(e2e, qs, 1e3),
        "max_gap_ms": distribution(gaps, qs, 1e3),
        "error_samples": samples,
    }


def max_gap_s(rec: Any) -> float | None:
    """Longest silence of one stream, seconds: the wait from send to the first SSE event, then
    between consecutive events (``[DONE]`` included). None when nothing was sent or received."""
    times = getattr(rec, "chunk_s", None) or []
    if rec.sent_s is None or not times:
        return None
    prev = rec.sent_s
    best = 0.0
    for t in times:
        best = max(best, t - prev)
        prev = t
    return best


# ----------------------------------------------------------------------------- regression

# Two-sided t quantiles t_{1-(1-c)/2, df} for c = 0.90, 0.95, 0.99 (standard tables).
_T_DF = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
         29, 30, 40, 60, 120]
_T_TABLE = {
    0.90: [6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761,
           1.753, 1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701,
           1.699, 1.697, 1.684, 1.671, 1.658],
    0.95: [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
           2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
           2.045, 2.042, 2.021, 2.000, 1.980],
    0.99: [63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169, 3.106, 3.055, 3.012, 2.977,
           2.947, 2.921, 2.898, 2.878, 2.861, 2.845, 2.831, 2.819, 2.807, 2.797, 2.787, 2.779, 2.771, 2.763,
           2.756, 2.750, 2.704, 2.660, 2.617],
}
_Z = {0.90: 1.645, 0.95: 1.960, 0.99: 2.576}


def t_quantile(confidence: float, df: int) -> float:
    """Two-sided Student-t critical value for ``confidence`` (e.g. 0.95) and ``df`` degrees of
    freedom. scipy when installed; else the table above (0.90/0.95/0.99 only), interpolated
    linearly in ``1/df`` between tabulated rows and towards the normal quantile beyond 120."""
    if df < 1:
        raise ValueError("df must be >= 1")
    try:
        return _scipy_t(confidence, float(df))
    except ImportError:
        pass
    key = round(confidence, 4)
    if key not in _T_TABLE:
        raise ValueError(f"confidence {confidence} needs scipy; without it use one of 0.90, 0.95, 0.99")
    return _t_from_table(key, df)


@functools.lru_cache(maxsize=4096)
def _scipy_t(confidence: float, df: float) -> float:
    """scipy's two-sided t critical value (cached: the soak refits the same sizes look after look)."""
    from scipy import stats as _st  # type: ignore[import-not-found]

    return float(_st.t.ppf(0.5 + confidence / 2.0, df))


def _t_from_table(confidence: float, df: int) -> float:
    row = _T_TABLE[confidence]
    if df in _T_DF:
        return row[_T_DF.index(df)]
    xs = [1.0 / d for d in _T_DF] + [0.0]
    ys = row + [_Z[confidence]]
    x = 1.0 / df
    for i in range(len(xs) - 1):  # xs decreasing
        if xs[i] >= x >= xs[i + 1]:
            w = (xs[i] - x) / (xs[i] - xs[i + 1])
            return ys[i] + w * (ys[i + 1] - ys[i])
    return _Z[confidence]


#: The most lag-1 autocorrelation of the rounds a slope's interval is widened for (:func:`round_dependence`):
#: beyond it the widening would be unbounded; a series that dependent is a random walk, not a trend.
RHO_MAX = 0.9
#: The fewest degrees of freedom of the t rule :func:`ar1_critical` falls back to beyond ``AR1_MAX_N``
#: rounds (``n_eff - 2`` below it; the rule short soaks used before the bootstrap): at 1
#: (t = 12.7 at 95%) a tenth of independent 9-round series had their interval widened 11x; at 2, 3.8x,
#: with the same error rates under AR(1) rounds (tests/test_stats_soak.py).
MIN_DF = 2.0
#: The fewest rounds of a soak's last part that show a plateau on their own measured dependence.
MIN_OWN_RHO = 8


#: Draws of the AR(1) bootstrap behind a dependent slope's critical value (:func:`ar1_critical`): 48 of
#: them lie beyond a 99.76% two-sided quantile (at 4,000, ten: its value moved 15% with the seed).
AR1_DRAWS = 20000
#: Above this many rounds the critical value is Student's t at ``n_eff - 2`` degrees of freedom
#: (:func:`ar1_critical` there agrees with it within a few percent, and the bootstrap's cost grows with n).
AR1_MAX_N = 200
#: How many standard errors (``sqrt((1 - rho**2) / n)``) above the measured ``rho_used`` the bootstrap
#: draws its rounds at (:func:`ar1_critical`): the plug-in estimate alone is noisy at 8-40 rounds and
#: under-covers (wrong PASS 8.4-9.4% at AR(1) 0.8, 1,000 series a cell, where 5% is stated).
AR1_RHO_SE = 1.0
#: The grid the dependence is rounded up to before :func:`ar1_critical` (its cache key).
AR1_GRID = 0.01
#: The fewest of the :data:`AR1_DRAWS` draws that must lie beyond a level for :func:`ar1_critical` to read
#: it off the draws (40: levels up to 99.8%; every shipped profile's per-look level, 99.76% at most, is
#: read so). A level beyond (a FAIL side at a run's false-alarm budget share, 99.995% a look) is the
#: quantile at ``1 - AR1_TAIL / AR1_DRAWS`` scaled by Student's t tail at ``(n - 2) / (1 + rho)``
#: degrees of freedom: against 2,000,000 draws, 8-28 rounds, rho 0.3-0.8, within -5..+11% at 99.89%
#: and -14..+32% at 99.995% (mostly wider), where the 20,000 draws' own extreme reads -24..+15%.
AR1_TAIL = 40

#: The most round-to-round autocorrelation a deployment's soak design assumes (``soak.autocorrelation_max``),
#: set for a fit by :func:`assumed_autocorrelation`; None: assume nothing (allow up to :data:`RHO_MAX`).
_RHO_CAP: contextvars.ContextVar[float | None] = contextvars.ContextVar("kvgate_rho_cap", default=None)


@contextlib.contextmanager
def assumed_autocorrelation(cap: float | None):
    """Within the block, :func:`linear_fit` allows for lag-1 autocorrelation of the rounds up to ``cap``
    (in ``[0, RHO_MAX]``) instead of up to :data:`RHO_MAX` -- a stated design assumption (the profile's
    ``soak.autocorrelation_max``), used only while the residuals do not contradict it: a fit whose
    measured lag-1 autocorrelation lies above ``cap`` by more than its one-sided 95% noise
    (``1.645 sqrt((1 - cap**2) / n)``) allows for the dependence it measured, as without the
    assumption (:attr:`Slope.assumed`). Short soaks need it: at 8-12 rounds the measured ``rho`` is too
    noisy to rule out AR(1) 0.9, and a slope interval that allows for 0.9 is ~12x as wide as for
    independent rounds (an 11-round TTFT series of the embedded tiny-cpu: +/-385,000 ms/h). None: no
    assumption. Raises ValueError outside ``[0, RHO_MAX]``."""
    if cap is not None and not 0.0 <= cap <= RHO_MAX:
        raise ValueError(f"assumed autocorrelation must be in [0, {RHO_MAX}], got {cap!r}")
    token = _RHO_CAP.set(cap)
    try:
        yield
    finally:
        _RHO_CAP.reset(token)


def _rho_used_rows(r: np.ndarray, cap: float = RHO_MAX) -> np.ndarray:
    """:func:`round_dependence`'s ``rho_used`` of each row of residuals ``r`` (draws x rounds, one line),
    at most ``cap``."""
    n = r.shape[1]
    ss = (r ** 2).sum(axis=1)
    rho = np.where(ss > 0, (r[:, 1:] * r[:, :-1]).sum(axis=1) / np.where(ss > 0, ss, 1.0), 0.0)
    b = 1.0 / n
    used = (rho + 2.0 * b) / (1.0 - 4.0 * b) if n > 4 else np.where(rho + 2.0 * b > 0, RHO_MAX, 0.0)
    return np.clip(used, 0.0, cap)


@functools.lru_cache(maxsize=8192)
def _ar1_critical(n: int, phi: float, confidence: float, floor: float, cap: float = RHO_MAX) -> float:
    seed = int(n * 1_000_003 + round(phi * 1000) * 1009 + round(confidence * 1e6) + round(floor * 1000) * 7
               + (0 if cap >= RHO_MAX else round(cap * 1000) * 131))
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((AR1_DRAWS, n))
    u = np.empty_like(e)
    u[:, 0] = e[:, 0] / math.sqrt(1.0 - phi * phi)  # stationary start
    for t in range(1, n):
        u[:, t] = phi * u[:, t - 1] + e[:, t]
    x = np.arange(n, dtype=float) - (n - 1) / 2.0
    sxx = float((x ** 2).sum())
    um = u.mean(axis=1, keepdims=True)
    b = (u @ x) / sxx  # the true slope is 0
    resid = u - um - b[:, None] * x
    se = np.sqrt((resid ** 2).sum(axis=1) / (n - 2) / sxx)
    used = np.maximum(_rho_used_rows(resid, cap), floor)
    stat = np.abs(b) / (se * np.sqrt((1.0 + used) / (1.0 - used)))
    return float(np.quantile(stat[np.isfinite(stat)], confidence))


def ar1_critical(n: int, rho: float, confidence: float, floor: float = 0.0, cap: float | None = None,
                 base: float | None = None) -> float:
    """The two-sided ``confidence`` critical value of a least-squares slope over ``n`` evenly spaced
    rounds whose errors are AR(1) with lag-1 autocorrelation ``rho`` (a fit's ``rho_used``, ``(0,
    RHO_MAX]``), studentised as :func:`linear_fit` studentises it: the independent-rounds standard
    error times ``sqrt((1 + r) / (1 - r))``, ``r`` each series' own ``rho_used`` (:func:`round_dependence`;
    at least ``floor``). A parametric (sieve) bootstrap: :data:`AR1_DRAWS` Gaussian AR(1) series of
    ``n`` rounds at ``rho`` (rounded up to :data:`AR1_GRID`), the quantile of ``|slope| / widened SE``;
    deterministic (seeded from ``(n, rho, confidence, floor)``) and cached. So the critical value
    carries both what the short series' residual scatter and its noisy, bias-corrected ``rho`` miss
    (Santer et al.'s ``t`` at ``n_eff - 2`` degrees of freedom, floored at :data:`MIN_DF`, is ~2x too
    wide at 28 rounds and ``rho`` 0.8). Above :data:`AR1_MAX_N` rounds that t rule. A ``confidence`` beyond
    what the draws resolve (fewer than :data:`AR1_TAIL` of them beyond it): the quantile at a level they
    resolve times Student's t tail ratio (:data:`AR1_TAIL`) -- at ``base`` when given and resolved (the
    level whose draws a caller already holds: :func:`linear_fit` passes its upper end's, so a lower end
    at a run's false-alarm budget share costs no second bootstrap), else at ``1 - AR1_TAIL / AR1_DRAWS``.
    ``cap``: the design's
    assumed most autocorrelation (:func:`assumed_autocorrelation`): the draws' dependence and each draw's
    own allowance at most that. Dimensionless."""
    if n < 3:
        return math.inf
    rho = rho + AR1_RHO_SE * math.sqrt(max(0.0, 1.0 - rho * rho) / n)  # its estimate's noise, one-sided
    top = RHO_MAX if cap is None else min(RHO_MAX, cap)
    phi = min(top, math.ceil(round(rho / AR1_GRID, 6)) * AR1_GRID)
    fl = min(top, math.ceil(round(max(0.0, floor) / AR1_GRID, 6)) * AR1_GRID)
    if n > AR1_MAX_N:
        n_eff = n * (1.0 - phi) / (1.0 + phi)
        return _t_real_df(confidence, max(MIN_DF, n_eff - 2.0))
    resolved = 1.0 - AR1_TAIL / AR1_DRAWS
    if confidence <= resolved:
        return _ar1_critical(int(n), round(phi, 4), round(confidence, 6), round(fl, 4), round(top, 4))
    # beyond what the draws resolve (:data:`AR1_TAIL`): a resolved quantile, Student's t tail beyond it
    at = base if base is not None and 0.5 < base <= resolved else resolved
    nu = max(MIN_DF, (n - 2.0) / (1.0 + phi))
    crit = _ar1_critical(int(n), round(phi, 4), round(at, 6), round(fl, 4), round(top, 4))
    return crit * _t_real_df(confidence, nu) / _t_real_df(at, nu)


def round_dependence(resid: Sequence[float], lines: int = 1) -> tuple[float, float]:
    """``(rho, rho_used)`` of a fit's residuals in round order: ``rho`` the lag-1 autocorrelation
    ``sum r[t] r[t-1] / sum r[t]**2`` (NaN with fewer than 3 residuals or none non-zero); ``rho_used``
    the autocorrelation the interval allows for: ``rho`` corrected for the first-order bias of a
    detrended series' lag-1 autocorrelation (``E[rho] ~ phi - (2 + 4 phi) / n``, solved for ``phi``:
    ``(rho + 2/n) / (1 - 4/n)``), clipped to ``[0, RHO_MAX]`` -- never below 0 (negative dependence
    never narrows an interval), and ``RHO_MAX`` at ``n <= 4`` when ``rho + 2/n > 0``. ``lines``:
    residuals of that many lines fitted apart, one after the other (the bias is ``lines`` times as large). The correction
    doubles the noise of ``rho`` at 8 rounds: it widens a quarter of independent 8-round series'
    intervals more than 3x (the price of holding the error rate under dependence it cannot see).

    Why the correction: a short detrended series hides its dependence (AR(1) 0.8 over 8 rounds reads
    rho ~ 0 on average), so the raw estimate would leave the interval as narrow as independent rounds'."""
    r = np.asarray(resid, dtype=float)
    n = int(r.size)
    ss = float((r ** 2).sum())
    if n < 3 or ss <= 0.0:
        return math.nan, 0.0
    rho = float((r[1:] * r[:-1]).sum() / ss)
    b = float(lines) / n  # the bias grows with the lines fitted: each takes its own two parameters
    used = (rho + 2.0 * b) / (1.0 - 4.0 * b) if n > 4 * lines else (RHO_MAX if rho + 2.0 * b > 0 else 0.0)
    return rho, float(min(RHO_MAX, max(0.0, used)))


@dataclass(frozen=True)
class Slope:
    """Least-squares fit ``y = intercept + slope * x`` over rounds (one point per round).

    ``slope`` in y-units per x-unit; ``ci_low``/``ci_high``: the two-sided ``confidence``
    interval of the slope (NaN with fewer than 3 points), allowing for autocorrelated rounds (see
    :func:`linear_fit`); ``stderr``: the slope's standard error as for independent rounds (before
    widening); ``r2``: coefficient of determination; ``n``: points used. ``rho``: the residuals'
    lag-1 autocorrelation as measured (NaN when undefined); ``rho_used``: what the interval allowed
    for (:func:`round_dependence`); ``n_eff``: the effective number of independent rounds,
    ``n (1 - rho_used) / (1 + rho_used)``; ``widening``: the interval's half-width over the one
    independent rounds would give (1.0: none).
    """

    slope: float
    intercept: float
    ci_low: float
    ci_high: float
    stderr: float
    r2: float
    n: int
    confidence: float
    rho: float = math.nan
    rho_used: float = 0.0
    n_eff: float = math.nan
    widening: float = 1.0
    #: The design's assumed most autocorrelation the interval allowed for (``soak.autocorrelation_max``),
    #: when one was set and the residuals did not contradict it; None otherwise.
    assumed: float | None = None
    #: The level of ``ci_low`` when it differs from ``confidence`` (:func:`linear_fit`'s
    #: ``lower_confidence``: the FAIL side at a run's false-alarm budget share); None: ``confidence``.
    lower_confidence: float | None = None

    @property
    def excludes_zero(self) -> bool:
        """True when the whole confidence interval lies on one side of 0 (a significant trend)."""
        return (self.ci_low > 0 or self.ci_high < 0) and not math.isnan(self.ci_low)

    @property
    def low_level(self) -> float:
        """The level ``ci_low`` is at: ``lower_confidence``, else ``confidence``."""
        return self.confidence if self.lower_confidence is None else self.lower_confidence

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.lower_confidence is None:
            del out["lower_confidence"]
        return out


def linear_fit(x: Sequence[float], y: Sequence[float], confidence: float = 0.95,
               autocorrelated: bool = True, rho_floor: float = 0.0, lower_confidence: float | None = None) -> Slope:
    """Ordinary least squares of ``y`` on ``x`` with a ``confidence`` interval on the slope.

    Needs at least 2 points with distinct ``x``; the interval needs 3 (``df = n - 2``). The points
    are taken in the order given (rounds in time). ``autocorrelated`` (default): the rounds may be
    dependent (memory and cache state carry from round to round), so the interval is widened for
    the residuals' lag-1 autocorrelation (:func:`round_dependence`, ``rho_used``): the standard error
    by ``sqrt((1 + rho) / (1 - rho))`` (AR(1) errors about a trend) and the critical value
    :func:`ar1_critical` (a parametric AR(1) bootstrap at this ``n`` and ``rho_used``, studentised the
    same way; at least ``t(confidence, n - 2)``) -- a small-sample critical value that grows as the
    dependence eats the rounds. Independent rounds (``rho_used`` 0) get the textbook interval
    ``t(confidence, n - 2) x stderr``. Measured through :func:`growth` with the slope on the ceiling
    (wrong FAIL / wrong memory PASS, 1,000 AR(1) series a cell, 95%, 8-40 rounds; tests/test_stats_soak.py's
    cells): see docs/soak.md; the high ends sit at 8-12 rounds of phi 0.8, which cannot see strong
    dependence; as independent rounds the same cells read 10-34% / 14-35%. ``rho_floor``: the least autocorrelation to allow for (a
    short part of a series allows at least the whole series'). ``autocorrelated=False``: the
    independent-rounds interval. ``lower_confidence`` (None, or equal to ``confidence``: a symmetric
    interval): the level of the lower end, the two-sided interval's at that level (so it errs
    ``(1 - lower_confidence) / 2`` below), the upper end staying at ``confidence`` -- the FAIL side
    (a slope shown above a ceiling) judged at a run's false-alarm budget share while the PASS side
    keeps its own level; the same dependence, a critical value at each level.
    """
    xa = np.asarray(x, dtype=float)
    ya = np.asarray(y, dtype=float)
    if xa.shape != ya.shape or xa.ndim != 1:
        raise ValueError("x and y must be 1-D and the same length")
    n = int(xa.size)
    if n < 2:
        raise ValueError("need at least 2 points")
    xm, ym = xa.mean(), ya.mean()
    sxx = float(((xa - xm) ** 2).sum())
    if sxx == 0.0:
        raise ValueError("x has no spread")
    slope = float(((xa - xm) * (ya - ym)).sum() / sxx)
    intercept = float(ym - slope * xm)
    resid = ya - (intercept + slope * xa)
    sse = float((resid ** 2).sum())
    syy = float(((ya - ym) ** 2).sum())
    r2 = 1.0 - sse / syy if syy > 0 else 1.0
    if n < 3:
        return Slope(slope, intercept, math.nan, math.nan, math.nan, r2, n, confidence, math.nan, 0.0, float(n), 1.0,
                     None, None if lower_confidence == confidence else lower_confidence)
    stderr = math.sqrt(sse / (n - 2) / sxx)
    rho, used = round_dependence(resid) if autocorrelated else (math.nan, 0.0)
    if autocorrelated:
        used = min(RHO_MAX, max(used, rho_floor))
    cap = _RHO_CAP.get() if autocorrelated else None
    if cap is not None and not (math.isfinite(rho) and rho > cap + 1.645 * math.sqrt(max(0.0, 1.0 - cap * cap) / n)):
        used = min(used, cap)  # the design's assumption, not contradicted by these residuals
    else:
        cap = None
    n_eff = n * (1.0 - used) / (1.0 + used)
    floor = min(used, rho_floor) if autocorrelated else 0.0

    def half_at(level: float) -> float:
        t_iid = t_quantile(level, n - 2)
        if used > 0.0:  # never narrower than independent rounds' interval
            crit = ar1_critical(n, used, level, floor, cap, base=confidence)
            return max(t_iid, crit * math.sqrt((1.0 + used) / (1.0 - used))) * stderr
        return t_iid * stderr

    half = half_at(confidence)
    widening = half / (t_quantile(confidence, n - 2) * stderr) if stderr > 0 else 1.0
    low = None if lower_confidence is None or lower_confidence == confidence else lower_confidence
    half_low = half if low is None else half_at(low)
    return Slope(slope, intercept, slope - half_low, slope + half, stderr, r2, n, confidence, rho, used, n_eff,
                 widening, cap, low)


def _t_real_df(confidence: float, df: float) -> float:
    """:func:`t_quantile` at a real-valued ``df`` (scipy takes it; the table, between its integer rows)."""
    try:
        return _scipy_t(confidence, round(df, 3))
    except ImportError:
        lo = max(1, int(math.floor(df)))
        a, b = t_quantile(confidence, lo), t_quantile(confidence, lo + 1)
        return a + (df - lo) * (b - a)


def residual_sd(x: Sequence[float], y: Sequence[float], fit: Slope) -> float:
    """The residual standard deviation of ``fit`` over the points ``(x, y)`` it was fitted to:
    ``sqrt(SSE / (n - 2))`` in y-units (the round-to-round scatter around the line); NaN with
    fewer than 3 points."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xa.size < 3:
        return math.nan
    resid = ya - (fit.intercept + fit.slope * xa)
    return math.sqrt(float((resid ** 2).sum()) / (xa.size - 2))


def slope_half_width(n: int, spacing: float, sd: float, confidence: float = 0.95, rho: float = 0.0) -> float:
    """Half-width of the least-squares slope's ``confidence`` interval over ``n`` points evenly
    ``spacing`` apart (x-units) whose residuals scatter ``sd`` (y-units): ``t(confidence, n - 2) x sd
    / sqrt(Sxx)``, ``Sxx = spacing**2 x n (n**2 - 1) / 12``; with lag-1 autocorrelation ``rho`` (a
    fit's ``rho_used``, in ``[0, 1)``) widened as :func:`linear_fit` widens it (``sqrt((1 + rho) /
    (1 - rho))``, critical value :func:`ar1_critical`). y-units per x-unit; inf for ``n < 3``."""
    if n < 3:
        return math.inf
    sxx = spacing ** 2 * n * (n ** 2 - 1) / 12.0
    if rho > 0.0:
        crit = max(t_quantile(confidence, n - 2), ar1_critical(n, rho, confidence) * math.sqrt((1.0 + rho) / (1.0 - rho)))
        return crit * sd / math.sqrt(sxx)
    return t_quantile(confidence, n - 2) * sd / math.sqrt(sxx)


def points_to_decide(gap: float, spacing: float, sd: float, confidence: float = 0.95, at_least: int = 3,
                     most: int = 1_000_000, rho: float = 0.0) -> int | None:
    """The fewest evenly spaced points (at least ``at_least``) at which a slope's interval
    (:func:`slope_half_width` at residual scatter ``sd`` and lag-1 autocorrelation ``rho``) is
    narrower than ``gap`` -- the distance from the slope to the ceiling it is judged against, so the
    interval would lie on one side of it if the slope, the scatter and the dependence stayed as
    measured (advice: the slope measured is plugged in, so the count is optimistic when the slope sits
    near the ceiling by chance). None when no number up to ``most`` does (``gap`` 0: the slope sits
    on the ceiling) or the inputs are not finite and positive."""
    if not all(math.isfinite(v) and v > 0 for v in (gap, spacing, sd)):
        return None
    rho = rho if math.isfinite(rho) else 0.0

    def width(k: int) -> float:
        return slope_half_width(k, spacing, sd, confidence, rho)

    lo = max(3, at_least)
    if width(lo) < gap:
        return lo
    hi = lo
    while width(hi) >= gap:
        if hi >= most:
            return None
        lo, hi = hi, min(most, hi * 2)
    while hi - lo > 1:  # the half-width falls with n: lo does not decide, hi does
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if width(mid) < gap else (mid, hi)
    return hi


# ----------------------------------------------------------------------------- soak trends


@dataclass(frozen=True)
class Trend:
    """A series' trend two ways: :class:`Slope` (least squares, with its ``confidence`` interval)
    and the Theil-Sen slope (median of pairwise slopes, robust to a few outliers) with its own
    interval (scipy's ``theilslopes``, a Kendall-type interval that assumes independent points,
    widened about the Theil-Sen slope by the least-squares fit's ``widening`` for autocorrelated
    rounds). Units: y-units per x-unit (the soak uses MB/hour and ms/hour, x in hours)."""

    ols: Slope
    theil_sen: float
    theil_low: float
    theil_high: float
    theil_intercept: float

    @property
    def slope(self) -> float:
        return self.ols.slope

    @property
    def ci_low(self) -> float:
        return self.ols.ci_low

    @property
    def ci_high(self) -> float:
        return self.ols.ci_high

    @property
    def n(self) -> int:
        return self.ols.n

    @property
    def rho(self) -> float:
        return self.ols.rho

    @property
    def n_eff(self) -> float:
        return self.ols.n_eff

    def below(self, ceiling: float) -> bool:
        """True when the trend is *shown* to stay at or below ``ceiling``: the least-squares
        interval's upper bound is (a PASS rests on a bound, never on a point estimate)."""
        return (not math.isnan(self.ols.ci_high)) and self.ols.ci_high <= ceiling

    def above(self, ceiling: float) -> bool:
        """True when the trend is *shown* to exceed ``ceiling``: the least-squares interval's lower
        bound lies above it **and** the robust Theil-Sen slope agrees (is above it too). A positive
        point estimate alone is never enough."""
        return (not math.isnan(self.ols.ci_low)) and self.ols.ci_low > ceiling and self.theil_sen > ceiling

    def sustained(self, ceiling: float) -> bool:
        """:meth:`above`, and the Theil-Sen interval's lower bound above ``ceiling`` too: the rise is
        spread over the run. A single step (an allocator arena, a cache growing once) makes least
        squares look significant -- flat, jump, flat -- but leaves most pairwise slopes at zero, so
        the rank-based Theil-Sen interval reaches down to the ceiling."""
        return self.above(ceiling) and self.theil_low > ceiling

    def to_dict(self) -> dict[str, Any]:
        return {"slope": self.ols.slope, "ci_low": self.ols.ci_low, "ci_high": self.ols.ci_high,
                "stderr": self.ols.stderr, "r2": self.ols.r2, "n": self.ols.n, "confidence": self.ols.confidence,
                "intercept": self.ols.intercept, "theil_sen": self.theil_sen, "theil_low": self.theil_low,
                "theil_high": self.theil_high, "theil_intercept": self.theil_intercept, "unit": "round",
                "rho": None if math.isnan(self.ols.rho) else self.ols.rho, "rho_used": self.ols.rho_used,
                "n_eff": self.ols.n_eff, "widening": self.ols.widening,
                **({} if self.ols.lower_confidence is None else {"lower_confidence": self.ols.lower_confidence})}


def theil_sen(x: Sequence[float], y: Sequence[float], confidence: float = 0.95,
              lower_confidence: float | None = None) -> tuple[float, float, float, float]:
    """Theil-Sen slope of ``y`` on ``x``: ``(slope, low, high, intercept)`` -- scipy's
    ``stats.theilslopes(y, x, alpha=confidence)`` computed the same way (Sen 1968 eq. 2.6, ties
    corrected; intercept ``median(y) - slope x median(x)``) without its per-call overhead (the soak's
    operating-characteristic tests fit tens of thousands of series); ``low``/``high`` its
    ``confidence`` interval for independent points (NaN where the ranks fall outside); ``lower_confidence``
    (None: ``confidence``): ``low`` from the two-sided interval at that level instead. Needs 2 points."""
    xa = np.asarray(x, dtype=float).ravel()
    ya = np.asarray(y, dtype=float).ravel()
    if xa.size != ya.size:
        raise ValueError("x and y must be the same length")
    if xa.size < 2:
        raise ValueError("need at least 2 points")
    dx = xa[:, None] - xa
    dy = ya[:, None] - ya
    pos = dx > 0
    slopes = np.sort(dy[pos] / dx[pos])
    if not slopes.size:
        raise ValueError("x has no spread")
    med = float(np.median(slopes))
    inter = float(np.median(ya) - med * np.median(xa))
    alpha = 1.0 - confidence if confidence > 0.5 else confidence
    z = _norm_ppf(alpha / 2.0)
    lc = confidence if lower_confidence is None else lower_confidence
    alpha_low = 1.0 - lc if lc > 0.5 else lc
    z_low = z if alpha_low == alpha else _norm_ppf(alpha_low / 2.0)
    n, nt = ya.size, slopes.size

    def ties(a: np.ndarray) -> float:
        _, counts = np.unique(a, return_counts=True)
        k = counts[counts > 1].astype(float)
        return float((k * (k - 1) * (2 * k + 5)).sum())

    sigsq = (n * (n - 1) * (2 * n + 5) - ties(xa) - ties(ya)) / 18.0
    if sigsq < 0:
        return med, math.nan, math.nan, inter
    sigma = math.sqrt(sigsq)
    hi_i = min(int(np.round((nt - z * sigma) / 2.0)), nt - 1)
    lo_i = max(int(np.round((nt + z_low * sigma) / 2.0)) - 1, 0)
    if not (0 <= lo_i < nt and 0 <= hi_i < nt):
        return med, math.nan, math.nan, inter
    return med, float(slopes[lo_i]), float(slopes[hi_i]), inter


@functools.lru_cache(maxsize=256)
def _norm_ppf(p: float) -> float:
    from scipy import stats as _st

    return float(_st.norm.ppf(p))


def trend(x: Sequence[float], y: Sequence[float], confidence: float = 0.95, rho_floor: float = 0.0,
          lower_confidence: float | None = None) -> Trend:
    """:func:`linear_fit` and :func:`theil_sen` of the same points (needs 3 for an interval), in
    round order; the Theil-Sen interval widened about its slope by the least-squares fit's
    ``widening`` (autocorrelated rounds, :func:`linear_fit`). ``lower_confidence`` (None:
    ``confidence``): both lower ends at that level (the FAIL side), the upper ends at ``confidence``;
    the Theil-Sen lower end widened by the least-squares lower end's own widening."""
    ols = linear_fit(x, y, confidence, rho_floor=rho_floor, lower_confidence=lower_confidence)
    ts, lo, hi, b = theil_sen(x, y, confidence, ols.lower_confidence)
    w = ols.widening
    if w > 1.0 and math.isfinite(w):
        w_low = w
        if ols.lower_confidence is not None and ols.stderr > 0 and ols.n >= 3:
            w_low = (ols.slope - ols.ci_low) / (t_quantile(ols.lower_confidence, ols.n - 2) * ols.stderr)
        lo, hi = ts - (ts - lo) * w_low, ts + (hi - ts) * w
    return Trend(ols, ts, lo, hi, b)


def low_envelope(times: Sequence[float], values: Sequence[float | None], edges: Sequence[float]) -> list[float | None]:
    """The minimum of ``values`` within each window ``[edges[i], edges[i+1])`` (None where a
    window holds no value). Memory a process *retains* is the floor it returns to, not its
    peaks: allocators and caches sawtooth, so a soak fits the per-round low envelope."""
    out: list[float | None] = []
    pairs = [(t, v) for t, v in zip(times, values) if v is not None]
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = [v for t, v in pairs if lo <= t < hi]
        out.append(min(inside) if inside else None)
    return out


#: Rounds a one-off step of a soak series may span: growth concentrated in this many rounds, flat
#: before and after, is a step (an allocator arena, a cache sized once), not a leak. Measured on the
#: embedded tiny-cpu server with its long requests: retained memory steps +40..+68 MB once per soak,
#: within one or two 8 s rounds (profiles/tiny-cpu.yaml).
STEP_ROUNDS_MAX = 2
#: The least share of a series' rises (the sum of its positive point-to-point rises) a step must
#: carry: the rest of the growth, spread over the other rounds, is noise and creep, not a fill.
STEP_SHARE = 0.75
#: How many times the rest's round-to-round scatter (:func:`residual_sd` around its fit) each of a
#: step's rises must be: a rise inside the noise is noise, and taking out the largest noisy rises
#: would leave a series that falls, not a flat one (measured step +2..+68 MB over a scatter of 0.01-0.03 MB).
STEP_NOISE = 4.0
#: Points after a step's last rise that must be flat for it to count as a step: growth that is still
#: rising in the last rounds cannot be told from the start of a leak.
STEP_FLAT_AFTER = 2


@dataclass(frozen=True)
class Step:
    """A one-off step explaining a series' growth: removing the rises at ``points`` (indices into
    the series; point ``i`` rose by ``rises[i]`` y-units from point ``i - 1``) leaves a series
    with no growth shown (``rest``, :func:`growth` without step detection). ``rise``: their sum;
    ``total``: the whole series' rise (last - first); ``after``: points after the last step."""

    points: tuple[int, ...]
    rises: tuple[float, ...]
    rise: float
    total: float
    after: int
    rest: "Growth"

    def to_dict(self) -> dict[str, Any]:
        return {"points": list(self.points), "rises": [round(r, 3) for r in self.rises], "rise": self.rise,
                "total": self.total, "after": self.after, "rest": self.rest.to_dict()}


@dataclass(frozen=True)
class Growth:
    """Is a soak series growing faster than ``ceiling`` (y-units per x-unit)?

    ``full``: the trend over all measured points; ``last``: the trend of the last
    ``last_frac`` of them (at least ``min_last`` points), fitted separately; ``plateau``: the
    series rose but stopped: the last part's upper bound lies at or below the ceiling and below the
    whole run's slope, its Theil-Sen slope within the ceiling (a bounded cache that filled; the whole
    run's rise need not be shown by a straight line: a fill-then-flat curve leaves its residuals
    autocorrelated, which widens that fit); ``exceeds``: the
    growth is shown and sustained (:meth:`Trend.sustained`) over the whole run and not a
    plateau, or over the last part alone (growth that started late), and no :class:`Step`
    explains it. ``kind``: ``"growth"`` (a ramp: rising round after round), ``"step"`` (growth
    shown, but concentrated in at most :data:`STEP_ROUNDS_MAX` rounds with at least
    :data:`STEP_FLAT_AFTER` flat rounds after: ``step`` says where and how much), ``"bounded"``
    (rose, then plateaued: the last part's upper bound at or below the ceiling and below the
    whole run's slope: a cache that filled), ``"rose"`` (least squares shows a rise above the ceiling, but
    neither a sustained one nor a plateau below it is shown: one or two outlying rounds, or a
    levelling-off not yet shown) or ``"flat"`` (no rise shown).

    :attr:`below` is what a PASS rests on: an upper bound at or below the ceiling -- the whole run's,
    or the last part's after a plateau (``bounded``: that bound also below the whole run's slope) --
    or, for a ``step``, those of the series without the step's rounds. Each fit's interval is two-sided at ``confidence``, so each spends ``(1 - c) / 2`` on
    either side: FAIL (the whole run's or the last part's lower bound, two fits) and PASS each err
    at most ``1 - c`` at a slope equal to the ceiling (measured in tests/test_stats_soak.py).

    Why rounds, not a floor on the total rise: at 80 s a leak of 2 MB/min and a one-off +60 MB step
    both fit a slope far above the ceiling with a tight interval; only their shape differs -- the
    step's rise sits in one or two rounds and the rest is flat, a leak's is spread over the rounds
    and goes on to the end.
    """

    full: Trend
    last: Trend | None
    ceiling: float
    plateau: bool
    exceeds: bool
    kind: str
    step: Step | None = None

    @property
    def below(self) -> bool:
        """The absence of growth above the ceiling is shown (see the class docstring): never when it
        :attr:`exceeds` or only ``rose``."""
        if self.exceeds or self.kind in ("growth", "rose"):
            return False
        g = self
        if self.kind == "step":
            if self.step is None:
                return False
            g = self.step.rest
        return g.full.below(g.ceiling) or g.plateau

    def to_dict(self) -> dict[str, Any]:
        return {"full": self.full.to_dict(), "last": self.last.to_dict() if self.last else None,
                "ceiling": self.ceiling, "plateau": self.plateau, "exceeds": self.exceeds, "kind": self.kind,
                "step": self.step.to_dict() if self.step else None}


def _segments_rho(x: Sequence[float], y: Sequence[float], cut: int) -> float:
    """``rho_used`` (:func:`round_dependence`) of the residuals of two lines fitted apart, the points
    before ``cut`` and from it on, in round order (each part needs 3 points with spread in x, else the
    whole series' one line)."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    parts = []
    for xs, ys in ((xa[:cut], ya[:cut]), (xa[cut:], ya[cut:])):
        if xs.size < 3 or np.ptp(xs) == 0 or cut < 3:
            return linear_fit(x, y).rho_used
        f = linear_fit(xs, ys, autocorrelated=False)
        parts.append(ys - (f.intercept + f.slope * xs))
    return round_dependence(np.concatenate(parts), lines=2)[1]


def _shape(x: Sequence[float], y: Sequence[float], ceiling: float, confidence: float, last_frac: float,
           min_last: int, lower_confidence: float | None = None) -> Growth:
    """The slopes' judgement alone (no step detection); see :class:`Growth`."""
    lc = lower_confidence
    full = trend(x, y, confidence, lower_confidence=lc)
    n = len(x)
    k = max(min_last, int(math.ceil(n * last_frac)))
    last = last_fail = None
    if min_last <= k < n:
        # a short last part measures its dependence poorly: it allows at least the rounds' dependence
        # measured over the whole run. To show growth (FAIL) the larger of the whole run's line's and the
        # one around the two parts' own lines; to show a plateau (PASS) the latter (so that the bend of
        # a cache that filled, then held, is not read as dependence), or from MIN_OWN_RHO rounds its own
        seg = _segments_rho(x, y, n - k)
        last = trend(x[n - k:], y[n - k:], confidence, 0.0 if k >= MIN_OWN_RHO else seg, lc)
        worst = max(seg, full.ols.rho_used)
        last_fail = last if worst <= last.ols.rho_used else trend(x[n - k:], y[n - k:], confidence, worst, lc)
    rose = full.above(ceiling)
    plateau = bool(last is not None and last.below(ceiling) and last.ci_high < full.slope
                   and last.theil_sen <= ceiling)
    shown = (full.sustained(ceiling) and not plateau) or bool(last_fail is not None and last_fail.sustained(ceiling))
    if shown:
        kind = "growth"
    elif plateau and not full.below(ceiling):
        kind = "bounded"
    else:
        kind = "rose" if rose else "flat"
    return Growth(full, last, ceiling, plateau, shown, kind)


def find_step(x: Sequence[float], y: Sequence[float], ceiling: float, confidence: float = 0.95,
              last_frac: float = 1 / 3, min_last: int = 4, max_points: int = STEP_ROUNDS_MAX,
              flat_after: int = STEP_FLAT_AFTER, lower_confidence: float | None = None) -> Step | None:
    """The fewest (up to ``max_points``) largest rises between consecutive points whose removal
    leaves a flat series (no rise above ``ceiling`` shown, not even one that plateaued), each
    :data:`STEP_NOISE` times the rest's scatter, and carry :data:`STEP_SHARE` of its rises, with ``flat_after`` points or more after the last of
    them; None when no such step explains the series (it ramps, or is still rising at the end)."""
    ya = np.asarray(y, dtype=float)
    rises = np.diff(ya)
    order = [int(i) + 1 for i in np.argsort(-rises, kind="stable") if rises[i] > 0]
    for m in range(1, max_points + 1):
        points = tuple(sorted(order[:m]))
        if len(points) < m or len(ya) - 1 - points[-1] < flat_after:
            continue
        removed = np.zeros_like(ya)
        for p in points:
            removed[p:] += rises[p - 1]
        rest_y = ya - removed
        rest = _shape(x, rest_y.tolist(), ceiling, confidence, last_frac, min_last, lower_confidence)
        scatter = residual_sd(x, rest_y.tolist(), rest.full.ols)
        stands_out = all(rises[p - 1] > STEP_NOISE * scatter for p in points)
        if rest.kind == "flat" and stands_out and \
                rises[[p - 1 for p in points]].sum() >= STEP_SHARE * rises[rises > 0].sum():
            up = tuple(float(rises[p - 1]) for p in points)
            return Step(points, up, float(sum(up)), float(ya[-1] - ya[0]), len(ya) - 1 - points[-1], rest)
    return None


def growth(x: Sequence[float], y: Sequence[float], ceiling: float, confidence: float = 0.95,
           last_frac: float = 1 / 3, min_last: int = 4, steps: bool = True,
           lower_confidence: float | None = None) -> Growth:
    """Judge the trend of ``y`` on ``x`` against ``ceiling`` (see :class:`Growth`). Needs 3
    points; the last part is fitted only when it has ``min_last`` points and fewer than all.
    ``steps``: a rise (shown growth, one that plateaued, one least squares shows alone, or a slope
    above the ceiling shown neither way whose rest is then shown under it) that :func:`find_step` explains is a ``"step"``, never ``exceeds``.
    ``lower_confidence`` (None: ``confidence``): every fit's lower ends -- what shows growth, a rise,
    a FAIL -- at that level (a run's false-alarm budget share), the upper ends -- what shows its
    absence, a plateau, a PASS -- at ``confidence`` (:func:`linear_fit`)."""
    g = _shape(x, y, ceiling, confidence, last_frac, min_last, lower_confidence)
    # a slope above the ceiling whose (widened) interval shows nothing either way: a step explains it
    # only when the series without the step is shown under the ceiling (else noise reads as "steps")
    undecided = g.kind == "flat" and g.full.slope > ceiling and not g.below
    if not (steps and (g.exceeds or g.kind in ("bounded", "rose") or undecided)):
        return g
    step = find_step(x, y, ceiling, confidence, last_frac, min_last, lower_confidence=lower_confidence)
    if step is None:
        return g
    out = Growth(g.full, g.last, ceiling, g.plateau, False, "step", step)
    if undecided and not out.below:
        return g
    return out


__all__ = [
    "AR1_DRAWS", "AR1_GRID", "AR1_TAIL", "assumed_autocorrelation", "AR1_MAX_N", "MIN_DF", "ar1_critical", "MIN_OWN_RHO", "RHO_MAX", "STEP_FLAT_AFTER", "STEP_NOISE", "STEP_ROUNDS_MAX", "STEP_SHARE", "Growth", "RequestMetrics", "Slope", "Step", "Trend", "distribution",
    "find_step", "growth", "linear_fit", "low_envelope", "max_gap_s", "percentile", "points_to_decide", "request_metrics",
    "residual_sd", "round_dependence", "slope_half_width", "summarize", "t_quantile", "theil_sen", "trend",
]
