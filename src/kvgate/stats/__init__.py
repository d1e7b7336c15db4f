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
(:func:`find_step`: growth in one or two rounds, flat after).
"""

from __future__ import annotations

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
    """The ``q``-th percentile (0-100, linear interpolation, numpy's default); NaN when empty."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return math.nan
    return float(np.percentile(arr, q))


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
        from scipy import stats as _st  # type: ignore[import-not-found]

        return float(_st.t.ppf(0.5 + confidence / 2.0, df))
    except ImportError:
        pass
    key = round(confidence, 4)
    if key not in _T_TABLE:
        raise ValueError(f"confidence {confidence} needs scipy; without it use one of 0.90, 0.95, 0.99")
    return _t_from_table(key, df)


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


@dataclass(frozen=True)
class Slope:
    """Least-squares fit ``y = intercept + slope * x``.

    ``slope`` in y-units per x-unit; ``ci_low``/``ci_high``: the two-sided ``confidence``
    interval of the slope (NaN with fewer than 3 points); ``stderr``: standard error of the
    slope; ``r2``: coefficient of determination; ``n``: points used.
    """

    slope: float
    intercept: float
    ci_low: float
    ci_high: float
    stderr: float
    r2: float
    n: int
    confidence: float

    @property
    def excludes_zero(self) -> bool:
        """True when the whole confidence interval lies on one side of 0 (a significant trend)."""
        return (self.ci_low > 0 or self.ci_high < 0) and not math.isnan(self.ci_low)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def linear_fit(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> Slope:
    """Ordinary least squares of ``y`` on ``x`` with a ``confidence`` interval on the slope.

    Needs at least 2 points with distinct ``x``; the interval needs 3 (``df = n - 2``).
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
        return Slope(slope, intercept, math.nan, math.nan, math.nan, r2, n, confidence)
    stderr = math.sqrt(sse / (n - 2) / sxx)
    half = t_quantile(confidence, n - 2) * stderr
    return Slope(slope, intercept, slope - half, slope + half, stderr, r2, n, confidence)


def residual_sd(x: Sequence[float], y: Sequence[float], fit: Slope) -> float:
    """The residual standard deviation of ``fit`` over the points ``(x, y)`` it was fitted to:
    ``sqrt(SSE / (n - 2))`` in y-units (the round-to-round scatter around the line); NaN with
    fewer than 3 points."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xa.size < 3:
        return math.nan
    resid = ya - (fit.intercept + fit.slope * xa)
    return math.sqrt(float((resid ** 2).sum()) / (xa.size - 2))


def slope_half_width(n: int, spacing: float, sd: float, confidence: float = 0.95) -> float:
    """Half-width of the least-squares slope's ``confidence`` interval over ``n`` points evenly
    ``spacing`` apart (x-units) whose residuals scatter ``sd`` (y-units): ``t(confidence, n - 2) x sd
    / sqrt(Sxx)``, ``Sxx = spacing**2 x n (n**2 - 1) / 12``. y-units per x-unit; inf for ``n < 3``."""
    if n < 3:
        return math.inf
    sxx = spacing ** 2 * n * (n ** 2 - 1) / 12.0
    return t_quantile(confidence, n - 2) * sd / math.sqrt(sxx)


def points_to_decide(gap: float, spacing: float, sd: float, confidence: float = 0.95, at_least: int = 3,
                     most: int = 1_000_000) -> int | None:
    """The fewest evenly spaced points (at least ``at_least``) at which a slope's interval
    (:func:`slope_half_width` at residual scatter ``sd``) is narrower than ``gap`` -- the distance
    from the slope to the ceiling it is judged against, so the interval would lie on one side of
    it if the slope and the scatter stayed as measured. None when no number up to ``most`` does
    (``gap`` 0: the slope sits on the ceiling) or the inputs are not finite and positive."""
    if not all(math.isfinite(v) and v > 0 for v in (gap, spacing, sd)):
        return None
    lo = max(3, at_least)
    if slope_half_width(lo, spacing, sd, confidence) < gap:
        return lo
    hi = lo
    while slope_half_width(hi, spacing, sd, confidence) >= gap:
        if hi >= most:
            return None
        lo, hi = hi, min(most, hi * 2)
    while hi - lo > 1:  # the half-width falls with n: lo does not decide, hi does
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if slope_half_width(mid, spacing, sd, confidence) < gap else (mid, hi)
    return hi


# ----------------------------------------------------------------------------- soak trends


@dataclass(frozen=True)
class Trend:
    """A series' trend two ways: :class:`Slope` (least squares, with its ``confidence`` interval)
    and the Theil-Sen slope (median of pairwise slopes, robust to a few outliers) with its own
    interval (scipy's ``theilslopes``). Units: y-units per x-unit (the soak uses MB/hour and
    ms/hour, x in hours)."""

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
                "theil_high": self.theil_high, "theil_intercept": self.theil_intercept}


def theil_sen(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """Theil-Sen slope of ``y`` on ``x``: ``(slope, low, high, intercept)`` (scipy
    ``stats.theilslopes``; ``low``/``high`` its ``confidence`` interval). Needs 2 points."""
    from scipy import stats as _st

    xa = np.asarray(x, dtype=float)
    ya = np.asarray(y, dtype=float)
    if xa.size < 2:
        raise ValueError("need at least 2 points")
    res = _st.theilslopes(ya, xa, alpha=confidence)
    return float(res[0]), float(res[2]), float(res[3]), float(res[1])


def trend(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> Trend:
    """:func:`linear_fit` and :func:`theil_sen` of the same points (needs 3 for an interval)."""
    ols = linear_fit(x, y, confidence)
    ts, lo, hi, b = theil_sen(x, y, confidence)
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
    series rose but stopped: the last part's upper bound lies below the whole run's slope and
    its Theil-Sen slope is within the ceiling (a bounded cache that filled); ``exceeds``: the
    growth is shown and sustained (:meth:`Trend.sustained`) over the whole run and not a
    plateau, or over the last part alone (growth that started late), and no :class:`Step`
    explains it. ``kind``: ``"growth"`` (a ramp: rising round after round), ``"step"`` (growth
    shown, but concentrated in at most :data:`STEP_ROUNDS_MAX` rounds with at least
    :data:`STEP_FLAT_AFTER` flat rounds after: ``step`` says where and how much), ``"bounded"``
    (rose significantly, but plateaued, not in one or two rounds: a cache filling) or ``"flat"``.

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

    def to_dict(self) -> dict[str, Any]:
        return {"full": self.full.to_dict(), "last": self.last.to_dict() if self.last else None,
                "ceiling": self.ceiling, "plateau": self.plateau, "exceeds": self.exceeds, "kind": self.kind,
                "step": self.step.to_dict() if self.step else None}


def _shape(x: Sequence[float], y: Sequence[float], ceiling: float, confidence: float, last_frac: float,
           min_last: int) -> Growth:
    """The slopes' judgement alone (no step detection); see :class:`Growth`."""
    full = trend(x, y, confidence)
    n = len(x)
    k = max(min_last, int(math.ceil(n * last_frac)))
    last = trend(x[n - k:], y[n - k:], confidence) if min_last <= k < n else None
    rose = full.above(ceiling)
    plateau = bool(rose and last is not None and not math.isnan(last.ci_high)
                   and last.ci_high < full.slope and last.theil_sen <= ceiling)
    shown = (full.sustained(ceiling) and not plateau) or bool(last is not None and last.sustained(ceiling))
    kind = "growth" if shown else ("bounded" if rose else "flat")
    return Growth(full, last, ceiling, plateau, shown, kind)


def find_step(x: Sequence[float], y: Sequence[float], ceiling: float, confidence: float = 0.95,
              last_frac: float = 1 / 3, min_last: int = 4, max_points: int = STEP_ROUNDS_MAX,
              flat_after: int = STEP_FLAT_AFTER) -> Step | None:
    """The fewest (up to ``max_points``) largest rises between consecutive points whose removal
    leaves a flat series (no rise above ``ceiling`` shown, not even one that plateaued) and carry
    :data:`STEP_SHARE` of its rises, with ``flat_after`` points or more after the last of
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
        rest = _shape(x, (ya - removed).tolist(), ceiling, confidence, last_frac, min_last)
        if rest.kind == "flat" and rises[[p - 1 for p in points]].sum() >= STEP_SHARE * rises[rises > 0].sum():
            up = tuple(float(rises[p - 1]) for p in points)
            return Step(points, up, float(sum(up)), float(ya[-1] - ya[0]), len(ya) - 1 - points[-1], rest)
    return None


def growth(x: Sequence[float], y: Sequence[float], ceiling: float, confidence: float = 0.95,
           last_frac: float = 1 / 3, min_last: int = 4, steps: bool = True) -> Growth:
    """Judge the trend of ``y`` on ``x`` against ``ceiling`` (see :class:`Growth`). Needs 3
    points; the last part is fitted only when it has ``min_last`` points and fewer than all.
    ``steps``: a rise (shown growth, or one that plateaued) that :func:`find_step` explains is a
    ``"step"``, never ``exceeds``."""
    g = _shape(x, y, ceiling, confidence, last_frac, min_last)
    if not (steps and (g.exceeds or g.kind == "bounded")):
        return g
    step = find_step(x, y, ceiling, confidence, last_frac, min_last)
    if step is None:
        return g
    return Growth(g.full, g.last, ceiling, g.plateau, False, "step", step)


__all__ = [
    "STEP_FLAT_AFTER", "STEP_ROUNDS_MAX", "STEP_SHARE", "Growth", "RequestMetrics", "Slope", "Step", "Trend", "distribution",
    "find_step", "growth", "linear_fit", "low_envelope", "max_gap_s", "percentile", "points_to_decide", "request_metrics",
    "residual_sd", "slope_half_width", "summarize", "t_quantile", "theil_sen", "trend",
]
