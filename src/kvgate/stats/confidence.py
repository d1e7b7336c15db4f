"""Percentile verdicts with statistical confidence: distribution-free order-statistic bounds and a
bounded sequential sampling rule.

**The bound.** Of ``n`` independent samples, the number at or below the true ``q``-quantile
``x_q`` is Binomial(n, q) whatever the distribution. So the ``k``-th smallest sample ``X(k)`` is
at or above ``x_q`` with probability ``P(Bin(n, q) <= k - 1)``; the *upper* bound at level
``c`` is ``X(k)`` for the smallest ``k`` with ``P(Bin(n, q) <= k - 1) >= c`` (none when even
``k = n`` is not enough). Likewise the *lower* bound is ``X(j)`` for the largest ``j`` with
``P(Bin(n, q) >= j) >= c``. Both are one-sided at level ``c`` (each side errs with probability at
most ``1 - c``; together a ``2c - 1`` two-sided interval), as MLPerf Inference's early-stopping
criterion uses the one-sided binomial bound for its server scenario's latency percentile.
Numbers (``q`` = 0.95, ``c`` = 0.95): with 32 samples no upper bound exists (PASS is
impossible); 59 samples with no exceedance PASS (``0.95**59 = 0.048``); 100 allow one
exceedance, 300 allow eight (:func:`min_samples_to_pass`, tests/test_confidence.py).

**The verdict** (:func:`judge`): PASS when the upper bound is within the limit, FAIL when the
lower bound is above it, otherwise UNDECIDED -- the gate samples more, and a gate still undecided
at its cap says INCONCLUSIVE (:attr:`kvgate.verdict.Status.INCONCLUSIVE`) with the numbers.

**Sequential looks** (:func:`plan_looks`, :func:`sample_until_decided`): judging after every
batch and stopping at the first decision would err more often than ``1 - c`` (optional
stopping). The looks are planned up front (sample sizes ``n_1 < n_2 < ... <= cap``) and each is
judged at ``1 - (1 - c) / K`` for ``K`` looks (Bonferroni: the overall error of a wrong PASS, or of
a wrong FAIL, stays within ``1 - c``). With ``split=True`` the two errors are spent apart: a wrong
FAIL can happen at every look (each at ``1 - (1 - c) / K``), a wrong PASS only at a look large
enough for a PASS at all (:func:`min_samples_to_pass`), so the PASS side is corrected over those
``K_pass`` looks only (each upper bound at ``1 - (1 - c) / K_pass``; :func:`split_levels`) -- each
error still within ``1 - c``, and a first look too small to PASS (32 requests at p95) costs the
PASS side nothing: looks 32/80/160/256 PASS from 80 requests (98.33%), not 86 (98.75%). The point
estimate is numpy's linear-interpolated percentile (:func:`kvgate.stats.percentile`).

Samples must be roughly independent: TTFT and e2e per request are; pooled inter-token gaps are
correlated within a request, so an ITL bound from them is optimistic (gates that judge ITL say so).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from scipy import stats as _st

from kvgate.stats import percentile

PASS, FAIL, UNDECIDED = "PASS", "FAIL", "UNDECIDED"

#: Default confidence level of percentile verdicts (profile ``slo.confidence``).
DEFAULT_CONFIDENCE = 0.95


def _check(n: int, q: float, confidence: float) -> None:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 0 < q < 1:
        raise ValueError(f"q must be a fraction in (0, 1), got {q!r} (p95 is q=0.95)")
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence!r}")


def upper_rank(n: int, q: float, confidence: float = DEFAULT_CONFIDENCE) -> int | None:
    """1-based rank ``k`` of the order statistic that bounds the ``q``-quantile from above at
    ``confidence`` among ``n`` samples (smallest ``k`` with ``P(Bin(n, q) <= k - 1) >= confidence``),
    or None when no sample rank is high enough (too few samples: PASS impossible). Raises
    ValueError on ``n < 0`` or ``q``/``confidence`` out of range."""
    _check(n, q, confidence)
    if n == 0:
        return None
    k = int(_st.binom.ppf(confidence, n, q)) + 1  # smallest m with cdf(m) >= c, as a rank m + 1
    while k > 1 and _st.binom.cdf(k - 2, n, q) >= confidence:  # guard ppf's float edge
        k -= 1
    while k <= n and _st.binom.cdf(k - 1, n, q) < confidence:
        k += 1
    return k if k <= n else None


def lower_rank(n: int, q: float, confidence: float = DEFAULT_CONFIDENCE) -> int | None:
    """1-based rank ``j`` of the order statistic that bounds the ``q``-quantile from below at
    ``confidence`` (largest ``j`` with ``P(Bin(n, q) >= j) >= confidence``), or None when even the
    smallest sample is not a bound. Raises ValueError like :func:`upper_rank`."""
    _check(n, q, confidence)
    if n == 0:
        return None
    j = n
    while j >= 1 and _st.binom.sf(j - 1, n, q) < confidence:  # sf(j - 1) = P(Bin >= j)
        j -= 1
    return j if j >= 1 else None


def max_exceedances(n: int, q: float, confidence: float = DEFAULT_CONFIDENCE) -> int | None:
    """How many of ``n`` samples may lie above the limit while the upper bound still holds it
    (``n - upper_rank``); None when no PASS is possible at ``n``."""
    k = upper_rank(n, q, confidence)
    return None if k is None else n - k


def min_samples_to_pass(q: float, confidence: float = DEFAULT_CONFIDENCE, exceedances: int = 0) -> int:
    """The fewest samples with which a PASS is possible with ``exceedances`` samples over the
    limit (0: ``ceil(log(1 - c) / log(q))``, 59 at p95/95%). Raises ValueError like :func:`upper_rank`."""
    _check(1, q, confidence)
    n = max(1, exceedances + 1)
    if exceedances == 0:
        n = max(1, math.ceil(math.log(1 - confidence) / math.log(q) - 1e-12))
    while (m := max_exceedances(n, q, confidence)) is None or m < exceedances:
        n += 1
    return n


class QuantileLevels:
    """What a one-sided quantile bound's fields ``q`` (fraction), ``confidence`` and
    ``upper_confidence`` (None: ``confidence``) name: its label and its upper bound's level. Mixed
    into :class:`PercentileBound` and :class:`kvgate.stats.cluster.ClusterBound`."""

    q: float
    confidence: float
    upper_confidence: float | None

    @property
    def label(self) -> str:
        """``p95`` (``p99.9`` for fractional percentiles)."""
        return f"p{self.q * 100:g}"

    @property
    def upper_level(self) -> float:
        """The level of the upper bound (``upper_confidence`` when set, else ``confidence``)."""
        return self.confidence if self.upper_confidence is None else self.upper_confidence


@dataclass(frozen=True)
class PercentileBound(QuantileLevels):
    """The ``q``-quantile (fraction: 0.95 = p95) of ``n`` samples: ``point`` (interpolated
    percentile), ``lower``/``upper`` one-sided bounds at ``confidence`` (None: no order statistic
    is a bound at this ``n``), their 1-based ranks, and ``exceed`` = samples above ``limit``
    (when judged). Values are in the caller's unit (ms throughout kvgate)."""

    q: float
    n: int
    point: float | None
    lower: float | None
    upper: float | None
    confidence: float
    lower_rank: int | None
    upper_rank: int | None
    #: The upper bound's level when it differs from the lower's (``split`` looks); None: ``confidence``.
    upper_confidence: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"q": self.q, "n": self.n, "point": self.point, "lower": self.lower, "upper": self.upper,
               "confidence": self.confidence, "lower_rank": self.lower_rank, "upper_rank": self.upper_rank,
               "method": "order statistics, exact binomial, one-sided"}
        if self.upper_confidence is not None:
            out["upper_confidence"] = self.upper_confidence
        return out


def bound(values: Sequence[float], q: float, confidence: float = DEFAULT_CONFIDENCE,
          upper_confidence: float | None = None) -> PercentileBound:
    """:class:`PercentileBound` of ``values`` (any unit): the lower bound at ``confidence``, the
    upper at ``upper_confidence`` (default: ``confidence``). Raises ValueError like :func:`upper_rank`."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    hi = confidence if upper_confidence is None else upper_confidence
    _check(n, q, confidence)
    _check(n, q, hi)
    k, j = upper_rank(n, q, hi), lower_rank(n, q, confidence)
    return PercentileBound(q, n, percentile(xs, q * 100) if n else None, xs[j - 1] if j else None,
                           xs[k - 1] if k else None, confidence, j, k, None if hi == confidence else hi)


def _distinct(value: float, limit: float) -> tuple[str, str]:
    """``value`` and ``limit`` as whole numbers, with as many decimals (up to 3) as it takes for a
    value above the limit not to read as equal to it (``100.0001 > 100`` is not ``100 > 100``)."""
    for d in range(4):
        a, b = f"{value:,.{d}f}", f"{limit:,.{d}f}"
        if a != b:
            return a, b
    return f"{value}", f"{limit:,.3f}"


@dataclass(frozen=True)
class Judgement:
    """A percentile against its limit: ``decision`` PASS (upper bound <= limit), FAIL (lower bound
    > limit) or UNDECIDED; ``exceed``: samples above the limit."""

    bound: PercentileBound
    limit: float
    decision: str
    exceed: int

    def text(self, what: str, unit: str = "ms", final: bool = True) -> str:
        """The verdict clause, e.g. ``TTFT p95 412 ms, 95% upper bound 468 ms (n=120) <= 500 ms -> PASS``;
        FAIL cites the lower bound; UNDECIDED both (``-> INCONCLUSIVE`` when ``final``, else ``-> undecided``)."""
        b = self.bound
        c, cu = f"{b.confidence * 100:.4g}%", f"{b.upper_level * 100:.4g}%"
        pt = "n/a" if b.point is None else f"{b.point:,.0f} {unit}"
        head = f"{what} {b.label} {pt}"
        if self.decision == PASS:
            return f"{head}, {cu} upper bound {b.upper:,.0f} {unit} (n={b.n}) <= {self.limit:,.0f} {unit} -> PASS"
        if self.decision == FAIL:
            lo, lim = _distinct(b.lower, self.limit)
            return f"{head}, {c} lower bound {lo} {unit} (n={b.n}; {self.exceed} over) > {lim} {unit} -> FAIL"
        lo = "none" if b.lower is None else f"{b.lower:,.0f} {unit}"
        hi = (f"none (fewer than {min_samples_to_pass(b.q, b.upper_level)} samples: no PASS possible)"
              if b.upper is None else f"{b.upper:,.0f} {unit}")
        levels = f"{c} bounds" if cu == c else f"bounds ({c} lower, {cu} upper)"
        return (f"{head}, {levels} {lo}..{hi} (n={b.n}; {self.exceed} over) straddle {self.limit:,.0f} {unit} -> "
                f"{'INCONCLUSIVE' if final else 'undecided'}")

    def to_dict(self) -> dict[str, Any]:
        return {**self.bound.to_dict(), "limit": self.limit, "decision": self.decision, "exceed": self.exceed}


def family_level(confidence: float, m: int) -> float:
    """The FAIL side's level when ``m`` metrics are judged and any one FAIL fails the whole (a
    union of ``m`` FAIL tests): ``1 - (1 - confidence) / m`` (Bonferroni), so a wrong FAIL of the
    whole stays within ``1 - confidence``. The PASS side needs no correction (every metric must
    PASS: an intersection-union test). ``m`` < 2 returns ``confidence``. Raises ValueError when
    ``confidence`` is not in (0, 1)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return confidence if m < 2 else 1.0 - (1.0 - confidence) / m


def budget_level(confidence: float, budget: float | None, families: int) -> float:
    """The FAIL side's level of one statistical family when a run's false-alarm ``budget`` (the
    chance that a deployment sitting on every limit gets any statistical FAIL in the run) is split
    equally over ``families`` families (Bonferroni: ``1 - budget / families``), never below the
    family's own ``confidence``; ``budget`` None: ``confidence`` (nothing allocated). Numbers:
    budget 0.01 over 9 families -> 0.99889 (a FAIL at 99.89%, where 95% alone allows 5%). The
    PASS side is not a false alarm and keeps ``confidence``. Raises ValueError on ``budget`` outside
    (0, 1) or ``families`` < 1."""
    if budget is None:
        return confidence
    if not 0.0 < budget < 1.0 or families < 1:
        raise ValueError(f"budget must be in (0, 1) and families >= 1, got {budget}, {families}")
    return max(confidence, 1.0 - budget / families)


def decide(lower: float | None, upper: float | None, limit: float) -> str:
    """The three-outcome rule every bound-based verdict uses: PASS when the ``upper`` bound is within
    ``limit``, FAIL when the ``lower`` bound is above it, otherwise (a bound missing, or the two
    straddling the limit) UNDECIDED. Bounds and limit in one unit; None: no such bound."""
    if upper is not None and upper <= limit:
        return PASS
    if lower is not None and lower > limit:
        return FAIL
    return UNDECIDED


def judge(values: Sequence[float], q: float, limit: float, confidence: float = DEFAULT_CONFIDENCE,
          pass_confidence: float | None = None) -> Judgement:
    """Judge the ``q``-quantile of ``values`` against ``limit`` (same unit) at ``confidence``; the
    PASS side (the upper bound) at ``pass_confidence`` when given (:attr:`LookPlan.pass_level`)."""
    b = bound(values, q, confidence, pass_confidence)
    exceed = sum(1 for v in values if v > limit)
    d = decide(b.lower, b.upper, limit)
    return Judgement(b, limit, d, exceed)


@dataclass(frozen=True)
class LookPlan:
    """Planned looks: cumulative sample sizes ``looks`` (ascending, the last = the cap), each
    judged at ``per_look`` = ``1 - (1 - confidence) / len(looks)``; ``max_s``: wall-time bound of the
    whole sampling (seconds; None = unbounded, for synthetic tests). ``per_look_pass``: the PASS
    side's level when the errors are spent apart (:func:`split_levels`: Bonferroni over the
    ``pass_looks`` looks that can PASS), else None (both sides at ``per_look``). ``fail_confidence``:
    the FAIL side's overall level when a run's false-alarm budget sets it above ``confidence``
    (:func:`budget_level`; ``per_look`` is then ``1 - (1 - fail_confidence) / len(looks)``), else None."""

    looks: tuple[int, ...]
    confidence: float
    per_look: float
    max_s: float | None = None
    per_look_pass: float | None = None
    pass_looks: int | None = None
    fail_confidence: float | None = None

    @property
    def pass_level(self) -> float:
        """The level a PASS (the upper bound) is judged at: ``per_look_pass``, else ``per_look``."""
        return self.per_look if self.per_look_pass is None else self.per_look_pass

    def to_dict(self) -> dict[str, Any]:
        out = {"looks": list(self.looks), "confidence": self.confidence, "per_look_confidence": self.per_look,
               "max_s": self.max_s, "correction": "Bonferroni over the planned looks"}
        if self.per_look_pass is not None:
            out["per_look_pass_confidence"] = self.per_look_pass
            out["pass_looks"] = self.pass_looks
            out["correction"] = ("Bonferroni over the planned looks for a FAIL, over the looks that can PASS "
                                 "for a PASS")
        if self.fail_confidence is not None:
            out["fail_confidence"] = self.fail_confidence
            out["correction"] += " (the FAIL side at the run's false-alarm budget share)"
        return out


def split_levels(looks: Sequence[int], q: float, confidence: float = DEFAULT_CONFIDENCE,
                 max_s: float | None = None, fail_confidence: float | None = None) -> LookPlan:
    """``looks`` with the two errors spent apart: every look's lower bound (FAIL) at ``1 - (1 - c)
    / K`` for its ``K`` looks; the upper bound (PASS) at ``1 - (1 - c) / K_pass``, ``K_pass`` the
    looks at least :func:`min_samples_to_pass` at that level -- the smallest ``K_pass`` for which
    between 1 and ``K_pass`` looks are that large (a look smaller cannot PASS at all: it spends no
    PASS error). No look large enough at any ``K_pass``: both sides at ``1 - (1 - c) / K``.
    Numbers (p95, 95%): 16/60 -> FAIL at 97.5%, PASS at 95% (one look can PASS: 60 >= 59);
    32/80/160/256 -> FAIL at 98.75%, PASS at 98.33% (three looks >= 80). ``fail_confidence`` (a
    run's false-alarm budget share, :func:`budget_level`; None: ``confidence``): the FAIL side's
    overall level instead of ``confidence`` -- 16/60 at 0.99889 -> FAIL at 99.94%, PASS at 95%.
    Raises ValueError on empty or non-ascending ``looks``."""
    ns = tuple(int(n) for n in looks)
    if not ns or ns[0] < 1 or any(b <= a for a, b in zip(ns, ns[1:])):
        raise ValueError(f"looks must be ascending sample sizes >= 1, got {list(looks)}")
    fc = None if fail_confidence is None or fail_confidence <= confidence else fail_confidence
    alpha, k = 1 - confidence, len(ns)
    per = 1 - (1 - (confidence if fc is None else fc)) / k
    for k_pass in range(1, k + 1):
        level = 1 - alpha / k_pass
        can = sum(1 for n in ns if n >= min_samples_to_pass(q, level))
        if 1 <= can <= k_pass:
            return LookPlan(ns, confidence, per, max_s, per_look_pass=level, pass_looks=k_pass, fail_confidence=fc)
    if fc is None:
        return LookPlan(ns, confidence, per, max_s)
    return LookPlan(ns, confidence, per, max_s, per_look_pass=1 - alpha / k, pass_looks=k, fail_confidence=fc)


def plan_looks(first: int, cap: int, q: float, confidence: float = DEFAULT_CONFIDENCE, max_looks: int = 4,
               max_s: float | None = None, split: bool = False, fail_confidence: float | None = None) -> LookPlan:
    """Looks from ``first`` samples up to ``cap``: the first at ``first``; then the smallest size at
    which a PASS with no exceedance is possible at the per-look level (when above ``first``);
    then doubling; always ending at ``cap``; at most ``max_looks`` (``max_looks`` 1: one look, at
    ``cap``). ``first >= cap`` gives one look at ``first``. ``split``: the PASS side corrected
    over the looks that can PASS only (:func:`split_levels`; the second look at the smallest size
    that can PASS at that level): 32 up to 256 at p95/95% -> 32/80/160/256, PASS from 80, not 86.
    ``fail_confidence`` (a run's false-alarm budget share, :func:`budget_level`; None or at most
    ``confidence``: ``confidence``): the FAIL side's overall level; the looks are planned for the
    PASS side as without it. Raises ValueError on ``first < 1`` or ``max_looks < 1``."""
    if first < 1 or max_looks < 1:
        raise ValueError(f"first and max_looks must be >= 1, got {first}, {max_looks}")
    cap = max(cap, first)
    if split:
        return _split_plan(first, cap, q, confidence, max_looks, max_s, fail_confidence)
    plan = _plan_one_level(first, cap, q, confidence, max_looks, max_s)
    if fail_confidence is None or fail_confidence <= confidence:
        return plan
    k = len(plan.looks)
    return dataclasses.replace(plan, per_look=1 - (1 - fail_confidence) / k, per_look_pass=plan.per_look,
                               pass_looks=k, fail_confidence=fail_confidence)


def _plan_one_level(first: int, cap: int, q: float, confidence: float, max_looks: int,
                    max_s: float | None) -> LookPlan:
    """:func:`plan_looks` without ``split``: both sides at ``1 - (1 - confidence) / K``."""
    k, best = 1, None
    for _ in range(2 * max_looks + 2):
        per = 1 - (1 - confidence) / k
        looks = [first]
        need = min_samples_to_pass(q, per)
        if need > looks[-1]:
            looks.append(min(need, cap))
        while looks[-1] < cap and len(looks) < max_looks:
            looks.append(min(cap, 2 * looks[-1]))
        if looks[-1] < cap:
            looks[-1] = cap
        if len(looks) > max_looks:  # the smallest passing size pushed it over: keep the first looks and the cap
            looks = looks[:max_looks - 1] + [cap]
        looks = sorted(set(looks))
        if len(looks) <= k:  # judged at least as strictly as its number of looks needs
            best = LookPlan(tuple(looks), confidence, per, max_s)
            if len(looks) == k:
                return best
        k = len(looks) if best is None else k - 1
        if best is not None and k < len(best.looks):
            return best
    assert best is not None
    return best


def _looks(first: int, cap: int, need: int, max_looks: int) -> list[int]:
    """``first``, then ``need`` (when above it, at most ``cap``), then doubling, ending at ``cap``,
    at most ``max_looks`` (the cap replaces the last when there are too many; ``max_looks`` 1: the cap
    alone)."""
    looks = [first]
    if need > first and max_looks > 1:
        looks.append(min(need, cap))
    while looks[-1] < cap and len(looks) < max_looks:
        looks.append(min(cap, 2 * looks[-1]))
    if looks[-1] < cap:
        looks[-1] = cap
    return sorted(set(looks))


def _split_plan(first: int, cap: int, q: float, confidence: float, max_looks: int, max_s: float | None,
                fail_confidence: float | None = None) -> LookPlan:
    """:func:`plan_looks` with ``split``: for ``K_pass`` = 1, 2, ...: looks with the second at the
    smallest size that can PASS at ``1 - (1 - c) / K_pass``; the first whose looks that large
    number between 1 and ``K_pass`` (:func:`split_levels` then gives that level)."""
    for k_pass in range(1, max_looks + 1):
        need = min_samples_to_pass(q, 1 - (1 - confidence) / k_pass)
        looks = _looks(first, cap, need, max_looks)
        if 1 <= sum(1 for n in looks if n >= need) <= k_pass:
            return split_levels(looks, q, confidence, max_s, fail_confidence)
    return split_levels(_looks(first, cap, first, max_looks), q, confidence, max_s, fail_confidence)


@dataclass
class Sampling:
    """What :func:`sample_until_decided` did: the ``plan``, per look ``{"n", "decisions", "t_s"}``,
    the final ``decisions`` (metric -> PASS/FAIL/UNDECIDED), ``n`` samples taken, ``why_stopped``
    (``decided``, ``cap``, ``time`` -- the plan's ``max_s`` ran out -- or ``source`` -- ``take`` had
    no more), ``wall_s``."""

    plan: LookPlan
    history: list[dict[str, Any]] = field(default_factory=list)
    decisions: dict[str, str] = field(default_factory=dict)
    n: int = 0
    why_stopped: str = ""
    wall_s: float = 0.0

    @property
    def final(self) -> bool:
        """True when stopping left something undecided at the cap or the time bound: INCONCLUSIVE."""
        return any(d == UNDECIDED for d in self.decisions.values())

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "history": self.history, "decisions": self.decisions, "n": self.n,
                "why_stopped": self.why_stopped, "wall_s": self.wall_s}


def sample_until_decided(plan: LookPlan, take: Callable[[int, float | None], int],
                         decide: Callable[[float], dict[str, str]],
                         clock: Callable[[], float] = time.monotonic) -> Sampling:
    """Drive the looks: ``take(k, seconds_left)`` adds ``k`` more samples (returns how many it
    added; fewer = it ran out of time or source), then ``decide(per_look_confidence)`` judges all
    samples so far, returning metric -> PASS/FAIL/UNDECIDED. Stops at the first look where nothing
    is UNDECIDED, or when the cap, the time bound or the source is reached. Time and sampling are
    injected (no sleeping here)."""
    s = Sampling(plan)
    t0 = clock()
    for target in plan.looks:
        left = None if plan.max_s is None else plan.max_s - (clock() - t0)
        if left is not None and left <= 0:
            s.why_stopped = "time"
            break
        want = target - s.n
        got = take(want, left) if want > 0 else 0
        s.n += got
        s.decisions = decide(plan.per_look)
        s.history.append({"n": s.n, "decisions": dict(s.decisions), "t_s": round(clock() - t0, 3)})
        if not any(d == UNDECIDED for d in s.decisions.values()):
            s.why_stopped = "decided"
            break
        if got < want:
            s.why_stopped = "time" if plan.max_s is not None and clock() - t0 >= plan.max_s else "source"
            break
    else:
        s.why_stopped = "cap"
    s.wall_s = round(clock() - t0, 3)
    return s


__all__ = [
    "DEFAULT_CONFIDENCE", "FAIL", "Judgement", "LookPlan", "PASS", "PercentileBound", "Sampling", "UNDECIDED", "budget_level",
    "decide", "bound",
    "family_level", "judge", "lower_rank", "max_exceedances", "min_samples_to_pass", "plan_looks", "sample_until_decided",
    "split_levels", "upper_rank",
]
