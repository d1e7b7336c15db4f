"""Pure verdicts of the pools gates: does the router send each request to the pool its rule
names (``pools/routing``), and does the split keep short requests fast while the long pool is
loaded (``pools/isolation``)? Inputs: :class:`~kvgate.pools.routing.RoutingObservation` and the
``(alone, mixed)`` :class:`~kvgate.load.scenarios.LoadObservation` pair; no I/O.

Splitting short chat and long-context batch into separate pools is the common cure for the
interference the latency gate measures; it fails silently when the router sends everything to one
pool, has its threshold on the wrong side, or drops what it cannot place -- the answers may even
be 200. Where a request landed is therefore read from each pool's own counters, never assumed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kvgate.stats.confidence import PASS as PASS_, FAIL as FAIL_, UNDECIDED, Judgement, LookPlan, PercentileBound, \
    judge, min_samples_to_pass, plan_looks
from kvgate.stats.twosample import judge_quantile_ratio
from kvgate.pools.routing import RoutingObservation
from kvgate.profile.models import PoolsSpec, Profile
from kvgate.load.scenarios import LoadObservation, interference_judgement, ttft_by_wave
from kvgate.stats.dependence import Dependence, DependentJudgement, independent, wave_dependence
from kvgate.stats.dependence import pass_confidence as dep_pass_confidence
from kvgate.stats import request_metrics, summarize
from kvgate.verdict import Status, Verdict
from kvgate.gates.common import FAIL, PASS
from kvgate.gates.load import HOL_MIN_JUDGED, HOL_SHARE, contended, head_of_line, host_evidence

ROUTING = "pools/routing"
ISOLATION = "pools/isolation"


def _unit(obs: RoutingObservation) -> str:
    return "tokens" if obs.rule.by == "prompt_tokens" else "bytes"


def routing_verdict(obs: RoutingObservation) -> Verdict:
    """FAIL when any request landed on the other pool than the rule names (counted both ways:
    short requests on the long pool, long requests on the short pool -- a long request the short
    pool rejected 400 included), reached no pool (the router dropped it or answered itself), or
    was not answered 200 by the right pool; also when the rule itself sends a pool's own workload
    to the other pool. INVALID when a pool serves no usable ``/metrics`` (nothing can be
    attributed) or a request moved both pools' counters (other traffic on the pools).
    ``measured``: misrouted requests, ``limit``: 0."""
    unit, thr = _unit(obs), obs.rule.threshold
    rule = f"rule: at most {thr:,} {unit} -> short pool, more -> long pool"
    rows = obs.rows()
    ev: dict[str, Any] = {"rule": obs.rule.model_dump(), "requests": rows, "workload_sizes": obs.workload_sizes,
                          "cases": [{"name": c.name, "expect": c.expect, "prompt_tokens": c.prompt_tokens,
                                     "size": c.size} for c in obs.cases]}
    n = len(obs.routed)
    if obs.no_metrics:
        return Verdict(ROUTING, Status.INVALID, f"pool(s) {', '.join(obs.no_metrics)} serve no "
                       "vllm:request_success_total on /metrics, so where a request lands cannot be read; no request "
                       f"sent ({rule}) -> INVALID (point --pool-endpoint at each pool's own server)",
                       limit=0, unit="requests", evidence=ev)
    ambiguous = [r for r in obs.routed if len(r.landed) > 1]
    if ambiguous:
        return Verdict(ROUTING, Status.INVALID, f"{n} requests through the router ({rule}); {len(ambiguous)} moved "
                       "both pools' counters at once -- other traffic reaches the pools, so landings cannot be told "
                       "apart -> INVALID (gate the pools before they take traffic)", limit=0, unit="requests",
                       evidence=ev)
    shorts = [r for r in obs.routed if r.expect == "short"]
    longs = [r for r in obs.routed if r.expect == "long"]
    s_on_long = [r for r in shorts if r.where == "long"]
    l_on_short = [r for r in longs if r.where == "short"]
    l_rejected = [r for r in l_on_short if r.landed.get("short") == "rejected"]
    lost = [r for r in obs.routed if r.where == "none"]
    bad_answer = [r for r in obs.routed if r.where == r.expect and r.status != 200]
    misrouted = len(s_on_long) + len(l_on_short) + len(lost)
    problems = []
    for pool, other in (("short", "long"), ("long", "short")):
        size = obs.workload_sizes.get(pool)
        if size is not None and (size <= thr) != (pool == "short"):
            problems.append(f"the rule itself sends the {pool} pool's own workload ({size:,} {unit}) to the {other} "
                            "pool (threshold on the wrong side of it)")
    if s_on_long:
        problems.append(f"{len(s_on_long)} of {len(shorts)} short requests reached the long pool "
                        f"({_cases(s_on_long)})")
    if l_on_short:
        rej = f"; {len(l_rejected)} of them rejected there ({l_rejected[0].status}: " \
              f"{(l_rejected[0].error or '')[:100]})" if l_rejected else ""
        problems.append(f"{len(l_on_short)} of {len(longs)} long requests reached the short pool "
                        f"({_cases(l_on_short)}){rej}")
    if lost:
        first = lost[0]
        problems.append(f"{len(lost)} request(s) reached neither pool ({_cases(lost)}; the router answered "
                        f"{first.status or 'nothing'}: {(first.error or '')[:100]})")
    if bad_answer:
        problems.append(f"{len(bad_answer)} request(s) reached the right pool but were answered "
                        f"{sorted({r.status for r in bad_answer})} ({_cases(bad_answer)})")
    where = (f"{len(shorts) - len(s_on_long)}/{len(shorts)} short on the short pool, "
             f"{len(longs) - len(l_on_short)}/{len(longs)} long on the long pool")
    what = f"{n} requests through the router ({rule}; read from each pool's request_success_total)"
    if problems:
        return Verdict(ROUTING, FAIL, f"{what}: " + "; ".join(problems) + f" -> FAIL ({where})", measured=misrouted,
                       limit=0, unit="requests", evidence=ev)
    at = [c for c in obs.cases if c.name in ("at threshold", "above threshold")]
    edge = ", ".join(f"{c.size:,} {unit} -> {c.expect}" for c in at)
    return Verdict(ROUTING, PASS, f"{what}: {where}, all answered 200 ({edge}) -> PASS", measured=0, limit=0,
                   unit="requests", evidence=ev)


def _cases(rows: list[Any]) -> str:
    names: dict[str, int] = {}
    for r in rows:
        names[r.case] = names.get(r.case, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in names.items())


def short_slo_ms(short: Profile) -> float | None:
    """The short pool's TTFT target under load: ``slo.short_ttft_p95_ms``, else ``slo.ttft_p95_ms`` (ms)."""
    return short.slo.short_ttft_p95_ms or short.slo.ttft_p95_ms


#: The percentile both isolation checks judge (TTFT p95).
Q = 0.95


def _ttfts(obs: LoadObservation) -> list[float]:
    """Short requests' TTFT (ms) of ``obs``: the successful ones, as :func:`kvgate.stats.summarize` counts them."""
    ms = (request_metrics(r).ttft_s for r in obs.result.records if r.tag == "short" and not r.hung_up and r.ok)
    return [t * 1e3 for t in ms if t is not None]


@dataclass(frozen=True)
class RatioJudgement:
    """``mixed p95 / alone p95 <= ratio_max`` judged on both runs' order-statistic bounds, each at
    ``side`` confidence (``1 - (1 - c) / 2``: Bonferroni over the two samples, so the ratio's bound
    holds at ``c``): PASS when mixed's upper bound <= ``ratio_max`` x alone's *lower* bound (the
    ratio's upper bound is within), FAIL when mixed's lower bound > ``ratio_max`` x alone's *upper*
    bound (its lower bound is above), else UNDECIDED. ``point``: the ratio of the point estimates."""

    mixed: PercentileBound
    alone: PercentileBound
    ratio_max: float
    decision: str
    #: The declared floor (``slo.pass_confidence_floor``) a PASS too few effective samples allow was taken
    #: at, as the *ratio's* level (:func:`judge_ratio`), else None.
    floor: float | None = None
    #: With ``floor``: the confidence the ratio's PASS has on these samples (the mixed side's highest
    #: level whose upper bound is within, less alone's ``1 - side``) and the level stated (``c``).
    achieved: float | None = None
    stated: float | None = None
    #: The ratio's FAIL-side level when a run's false-alarm budget sets it apart (mixed's lower and alone's
    #: upper bound then at ``1 - (1 - fail_confidence) / 2``), else None.
    fail_confidence: float | None = None

    @property
    def point(self) -> float | None:
        m, a = self.mixed.point, self.alone.point
        return m / a if m and a and not math.isnan(m) and not math.isnan(a) else None

    def text(self, final: bool = True) -> str:
        """E.g. ``TTFT p95 ratio 2.1x; 97.5% bounds: with the long load upper 75 ms (n=100) <= 4x alone lower
        25 ms (n=100) = 100 ms -> PASS``."""
        m, a, r = self.mixed, self.alone, self.ratio_max
        c = f"{m.confidence * 100:.4g}%"
        pt = "n/a" if self.point is None else f"{self.point:.1f}x"
        head = f"TTFT p95 ratio {pt} (allowed {r:g}x); {c} bounds of each run"
        if self.fail_confidence is not None:  # the FAIL side (mixed lower, alone upper) at the budget's share
            cp = f"{a.confidence * 100:.4g}%"  # alone's lower bound: the PASS side's level
            levels = {PASS_: f"{cp} bounds of each run", FAIL_: f"{c} bounds of each run"}.get(
                self.decision, f"bounds of each run at {c} (with the load lower, alone upper) and {cp} (with the load "
                               "upper, alone lower)")
            head = f"TTFT p95 ratio {pt} (allowed {r:g}x); {levels}"

        def ms(x: float | None) -> str:
            return "none" if x is None else f"{x:,.0f} ms"
        if self.decision == PASS_:
            at = (f" at the {self.floor * 100:.4g}% the profile declares for too few independent samples (the short "
                  f"pool's slo.pass_confidence_floor; the ratio's level: mixed side at {m.upper_level * 100:.4g}%, alone "
                  f"at {a.confidence * 100:.4g}%; these samples give "
                  f"{(self.achieved or 0.0) * 100:.1f}%)") if self.floor is not None else ""
            return (f"{head}: with the long load upper{at} {ms(m.upper)} (n={m.n} effective) <= {r:g}x alone lower "
                    f"{ms(a.lower)} (n={a.n}) = {ms(r * a.lower)} -> PASS" if at else
                    f"{head}: with the long load upper {ms(m.upper)} (n={m.n}) <= {r:g}x alone lower {ms(a.lower)} "
                    f"(n={a.n}) = {ms(r * a.lower)} -> PASS")
        if self.decision == FAIL_:
            return (f"{head}: with the long load lower {ms(m.lower)} (n={m.n}) > {r:g}x alone upper {ms(a.upper)} "
                    f"(n={a.n}) = {ms(r * a.upper)} -> FAIL")
        return (f"{head}: with the long load {ms(m.lower)}..{ms(m.upper)} (n={m.n}), {r:g}x alone "
                f"{ms(None if a.lower is None else r * a.lower)}..{ms(None if a.upper is None else r * a.upper)} "
                f"(n={a.n}) overlap -> {'INCONCLUSIVE' if final else 'undecided'}")

    def to_dict(self) -> dict[str, Any]:
        out = {"mixed": self.mixed.to_dict(), "alone": self.alone.to_dict(), "ratio_max": self.ratio_max,
               "point": self.point, "decision": self.decision, "pass_confidence_floor_used": self.floor,
               "pass_confidence_achieved": self.achieved, "pass_confidence_stated": self.stated,
               "rule": "PASS: mixed upper <= ratio_max x alone lower; FAIL: mixed lower > ratio_max x alone upper; "
                       "each bound one-sided at 1 - (1 - confidence) / 2"}
        if self.fail_confidence is not None:
            out["fail_confidence"] = self.fail_confidence
            out["rule"] += " (mixed lower and alone upper at 1 - (1 - fail_confidence) / 2)"
        return out


def judge_ratio(alone_ms: list[float], mixed_ms: list[float], ratio_max: float, confidence: float,
                mixed_n_eff: float | None = None, floor: float | None = None, at_end: bool = False,
                fail_confidence: float | None = None) -> RatioJudgement:
    """:class:`RatioJudgement` of the two runs' TTFT samples (ms) at ``confidence`` for the ratio
    (each run's bound at ``1 - (1 - confidence) / 2``): the two-sample rule of
    :func:`kvgate.stats.twosample.judge_quantile_ratio`, mixed as the new sample, alone as the base.
    ``mixed_n_eff``: the mixed shorts' effective n (they come in waves behind the same long
    prefills: :func:`mixed_dependence`), their bound's ranks taken at it (its ``n=`` is then the
    effective n); None: independent. The alone shorts are sent one at a time: independent. At the
    last look (``at_end``), when the effective n allows no mixed upper bound at its side's level and
    the short pool declares a lower ``floor`` (``slo.pass_confidence_floor``), a PASS may be taken
    at ``floor`` *for the ratio*: the mixed upper bound at ``floor + (1 - side)`` with alone's lower
    bound still at ``side`` (Bonferroni: the two errors sum to at most ``1 - floor``; the mixed side
    alone at ``floor`` left the ratio at ``floor - (1 - side)``, 57.5% for a stated 60%), stated with
    the confidence these samples give (:attr:`RatioJudgement.achieved`); its FAIL side never moves.
    Lock-step waves of identical values (ICC 1.0, no within-wave variance) are measured as ICC 1
    (:func:`kvgate.stats.dependence.icc_oneway`), one value per wave; not estimable: the same worst case.
    ``fail_confidence`` (a run's false-alarm budget share; None or ``confidence``: both sides at
    ``confidence``): the FAIL side's level (mixed's lower and alone's upper bound at ``1 - (1 -
    fail_confidence) / 2``), ``confidence`` then the PASS side's only."""
    fc = None if fail_confidence is None or fail_confidence == confidence else fail_confidence
    r = judge_quantile_ratio(alone_ms, mixed_ms, Q, ratio_max, confidence, new_n_eff=mixed_n_eff, fail_confidence=fc)
    side = 1 - (1 - confidence) / 2
    if (r.decision == UNDECIDED and r.new.upper is None and at_end and floor is not None and floor < confidence
            and mixed_n_eff is not None and mixed_n_eff < len(mixed_ms)):
        mixed_level = floor + (1 - side)
        low = judge_quantile_ratio(alone_ms, mixed_ms, Q, ratio_max, confidence, new_n_eff=mixed_n_eff,
                                   new_pass_confidence=mixed_level, fail_confidence=fc)
        if low.decision == PASS_ and low.base.lower is not None:
            got = dep_pass_confidence(mixed_ms, Q, ratio_max * low.base.lower, mixed_n_eff) - (1 - side)
            return RatioJudgement(low.new, low.base, ratio_max, low.decision, floor, got, confidence, fc)
    return RatioJudgement(r.new, r.base, ratio_max, r.decision, fail_confidence=fc)


def mixed_dependence(mixed: LoadObservation, n: int) -> Dependence:
    """The mixed shorts' dependence with the wave as the cluster (ICC within waves,
    :func:`kvgate.stats.dependence.wave_dependence` over ``extra["short_waves"]``), its effective n
    rescaled to the ``n`` TTFTs judged (``n`` / design effect); waves not recorded: independent,
    stated so."""
    ex = mixed.extra or {}
    if ex.get("short_waves") is None:
        return dataclasses.replace(independent(n, "short request"), measure="waves not recorded, taken as independent")
    dep = wave_dependence(ttft_by_wave(mixed.result.records, ex["short_waves"], ex.get("shorts_per_wave")))
    return dataclasses.replace(dep, n=n, n_eff=n / dep.design_effect if n else 0.0)


def isolation_plan(first: int, short: Profile, fail_confidence: float | None = None) -> LookPlan:
    """The looks of the isolation run: from ``first`` short requests (``waves`` x ``shorts_per_wave``)
    up to the short pool's ``slo.request_cap``, within its ``slo.max_duration_s``, at most 4 looks.
    Spaced for the stricter of the two checks (the ratio's per-run bounds at ``1 - (1 - c) / (2K)``:
    its first possible PASS is 99 requests at 95%, 4 looks, where the SLO alone needs 86), and
    ``per_look`` = ``1 - (1 - c) / K``, the SLO check's level (the ratio's per-run level follows
    from it, :func:`judge_ratio`). ``fail_confidence`` (the run's false-alarm budget share for this
    family, ``profile.verdicts.fail_confidence(c)`` of the run's profile; None or at most ``c``: as
    without): ``per_look`` is then the FAIL side's, ``1 - (1 - fail_confidence) / K``, and
    ``per_look_pass`` keeps ``1 - (1 - c) / K`` for the PASS side (the looks as without it)."""
    slo = short.slo
    c = slo.confidence
    plan = plan_looks(first, slo.request_cap, Q, 1 - (1 - c) / 2, max_s=slo.max_duration_s)
    k = len(plan.looks)
    if fail_confidence is None or fail_confidence <= c:
        return dataclasses.replace(plan, confidence=c, per_look=1 - (1 - c) / k)
    return dataclasses.replace(plan, confidence=c, per_look=1 - (1 - fail_confidence) / k,
                               per_look_pass=1 - (1 - c) / k, pass_looks=k, fail_confidence=fail_confidence)


@dataclass(frozen=True)
class IsolationChecks:
    """What the isolation verdict decides from: the SLO :class:`~kvgate.stats.confidence.Judgement`
    (None without a short SLO), the :class:`RatioJudgement`, the other problems (failed requests,
    head-of-line blocking: decided FAILs), and the overall ``decision`` (FAIL if anything FAILs,
    PASS if everything PASSes, else UNDECIDED)."""

    slo: Judgement | None
    ratio: RatioJudgement
    problems: list[str]
    hol: dict[str, Any]
    decision: str
    #: The SLO check at the effective n of the waves (unit, ICC within waves, effective n); None without a short SLO.
    slo_dependent: DependentJudgement | None = None
    #: The mixed shorts' dependence the ratio's mixed bound is taken at (unit, ICC within waves, effective n).
    ratio_dependence: Dependence | None = None


def isolation_checks(alone: LoadObservation, mixed: LoadObservation, spec: PoolsSpec, short: Profile,
                     confidence: float, at_end: bool = False, pass_confidence: float | None = None) -> IsolationChecks:
    """Judge the runs so far at ``confidence`` (a look's level; the PASS side at ``pass_confidence``
    when given: the plan's :attr:`~kvgate.stats.confidence.LookPlan.pass_level`, ``confidence`` then
    the FAIL side's at the run's false-alarm budget share): the sampler's ``decide`` and the
    verdict use the same checks. The SLO check is taken at the effective n of the mixed waves
    (:func:`kvgate.load.scenarios.interference_judgement`); ``at_end`` (sampling over): a PASS too
    few independent samples allow at ``confidence`` may be taken at the short profile's
    ``slo.pass_confidence_floor``, stated."""
    a = summarize([r for r in alone.result.records if r.tag == "short"])
    m = summarize([r for r in mixed.result.records if r.tag == "short"])
    lm = summarize([r for r in mixed.result.records if r.tag == "long"])
    problems = []
    if a["errors"] or m["errors"]:
        problems.append(f"short requests failed: {a['errors']} alone, {m['errors']} with the long load "
                        f"({(m['error_samples'] or a['error_samples'])[:2]})")
    if lm["errors"]:
        problems.append(f"{lm['errors']} of {lm['requests']} long requests failed, so the long load did not run "
                        f"({lm['error_samples'][:2]})")
    hol = head_of_line(mixed.result.records)
    if hol["judged"] >= HOL_MIN_JUDGED and hol["share"] >= HOL_SHARE:
        problems.append(f"head-of-line blocking: {hol['blocked']} of {hol['judged']} short requests got their first "
                        "token only after a long request sent ahead of them completed")
    slo = short_slo_ms(short)
    mixed_ms = _ttfts(mixed)
    ex = mixed.extra or {}
    # the mixed shorts come in waves behind the same long prefills: the SLO's bound at the effective n
    # of the waves (ICC within waves), as latency/interference judges it
    up = None if pass_confidence is None or pass_confidence == confidence else pass_confidence
    dj = (interference_judgement(mixed.result.records, ex.get("short_waves"), slo, confidence, up,
                                 short.slo.pass_confidence_floor, at_end=at_end, per_wave=ex.get("shorts_per_wave"))
          if slo is not None else None)
    sj = dj.judgement if dj is not None else None
    # the mixed shorts' bound at the effective n of their waves, as the SLO's (F2 on the ratio's mixed side)
    mdep = mixed_dependence(mixed, len(mixed_ms))
    rj = judge_ratio(_ttfts(alone), mixed_ms, spec.isolation.ttft_ratio_max, confidence if up is None else up,
                     mdep.n_eff, short.slo.pass_confidence_floor, at_end, fail_confidence=confidence)
    decisions = [d for d in (sj.decision if sj else None, rj.decision) if d]
    if problems or FAIL_ in decisions:
        d = FAIL_
    elif all(x == PASS_ for x in decisions):
        d = PASS_
    else:
        d = UNDECIDED
    return IsolationChecks(sj, rj, problems, hol, d, dj, mdep)


def isolation_decide(alone: LoadObservation, mixed: LoadObservation, spec: PoolsSpec, short: Profile,
                     schedule_lag_max_s: float, confidence: float, pass_confidence: float | None = None) -> str:
    """The sampler's ``decide`` (:func:`kvgate.pools.routing.run_isolation`): the
    :attr:`IsolationChecks.decision` at a look's ``confidence`` (the PASS side at
    ``pass_confidence``, the plan's ``pass_level``, when given); a run the client fell behind in is
    decided (INVALID: more samples cannot mend it), so its sampling stops."""
    if any(o.result.invalid_verdict(ISOLATION, schedule_lag_max_s) for o in (alone, mixed)):
        return FAIL_
    return isolation_checks(alone, mixed, spec, short, confidence, pass_confidence=pass_confidence).decision


def isolation_verdict(alone: LoadObservation, mixed: LoadObservation, spec: PoolsSpec, short: Profile,
                      schedule_lag_max_s: float, fail_confidence: float | None = None) -> Verdict:
    """Short requests' TTFT p95 through the router while the long pool serves its declared long
    load, with confidence (:mod:`kvgate.stats.confidence`: distribution-free order-statistic bounds):

    - **SLO**: PASS needs the p95's upper bound within the short pool's SLO (:func:`short_slo_ms`),
      FAIL its lower bound above it;
    - **ratio** to the short-alone p95 (``pools.isolation.ttft_ratio_max``): two estimates compared,
      so both runs' bounds count (:class:`RatioJudgement`): PASS when even mixed's upper bound is
      within ``ratio_max`` x alone's lower bound, FAIL when mixed's lower bound is above
      ``ratio_max`` x alone's upper bound -- the point-estimate ratio is in the message, not judged;
    - FAIL also when short or long requests failed, or when short requests consistently got their
      first token only after a long request queued ahead of them completed
      (:func:`kvgate.gates.load.head_of_line`: the router or a shared pool serialises them).

    Judged at the per-look level of the sampling in ``mixed.extra["sampling"]``
    (:func:`kvgate.pools.routing.run_isolation` with :func:`isolation_plan`; without it, one look at
    ``slo.confidence``); the FAIL side at the plan's ``per_look_confidence``, the PASS side at its
    ``per_look_pass_confidence`` when it has one (the FAIL side then at the run's false-alarm budget
    share, :func:`isolation_plan`); without sampling the FAIL side at ``fail_confidence`` when given
    (``profile.verdicts.fail_confidence(slo.confidence)`` of the run's profile). Undecided at the
    last look: INCONCLUSIVE with both bounds. INVALID when the
    client fell behind its schedule, or when either window ran on a contended host
    (:func:`kvgate.gates.load.contended`; before judging: a contended alone run would shrink the ratio,
    so here not even a PASS stands; the pools behind the router are not a process tree kvgate
    watches yet, so their evidence says "not measured"). ``measured``: the mixed p95 point (ms)."""
    for obs in (alone, mixed):
        if (busy := contended(obs, ISOLATION, short)) is not None:  # a contended host: not judged
            return busy
        v = obs.result.invalid_verdict(ISOLATION, schedule_lag_max_s)
        if v is not None:
            return Verdict(ISOLATION, Status.INVALID, v.message + f" ({obs.name})", measured=v.measured,
                           limit=v.limit, unit=v.unit, evidence=v.evidence)
    ex = mixed.extra or {}
    sampling = ex.get("sampling")
    if sampling:
        level = sampling["per_look_confidence"]
        up = sampling.get("per_look_pass_confidence") or level
    else:
        up = short.slo.confidence
        level = up if fail_confidence is None or fail_confidence <= up else fail_confidence
    chk = isolation_checks(alone, mixed, spec, short, level,
                           at_end=not sampling or sampling.get("why_stopped") in ("cap", "time")
                           or len(sampling.get("history") or ()) >= len(sampling.get("looks") or ()),
                           pass_confidence=up)
    a = summarize([r for r in alone.result.records if r.tag == "short"])
    m = summarize([r for r in mixed.result.records if r.tag == "short"])
    pa, pm = a["ttft_ms"]["p95"], m["ttft_ms"]["p95"]
    slo, ratio_max = short_slo_ms(short), spec.isolation.ttft_ratio_max
    ev: dict[str, Any] = {"short_alone": a, "short_mixed": m,
                          "long_mixed": summarize([r for r in mixed.result.records if r.tag == "long"]),
                          "mixed_plan": {k: v for k, v in ex.items() if k != "sampling"},
                          "short_ttft_p95_ms": {"alone": pa, "mixed": pm, "ratio": chk.ratio.point},
                          "head_of_line": chk.hol, "ttft_ratio_max": ratio_max, "short_slo_ms": slo,
                          "host_contention": host_evidence(alone, mixed),
                          "dependence": {"slo": chk.slo_dependent.dependence.to_dict() if chk.slo_dependent else None,
                                         "ratio": {**chk.ratio_dependence.to_dict(),
                                                   "applied_to": "the mixed side's bound (ranks at the effective n); "
                                                                 "alone: one at a time, independent"}
                                         if chk.ratio_dependence else None},
                          "confidence": {"slo": chk.slo_dependent.to_dict() if chk.slo_dependent else None,
                                         "ratio": chk.ratio.to_dict(),
                                         "sampling": sampling, "level": short.slo.confidence, "per_look": level,
                                         **({"per_look_pass": up} if up != level else {})}}
    load = (f"{ex.get('long_per_wave')} long {ex.get('long_prompt_tokens', 0):,}-token requests at a time "
            f"({ex.get('waves')} waves)")
    if pa and pm:
        what = (f"short-request TTFT p95 through the router {pa:,.0f} ms alone, {pm:,.0f} ms while the long pool "
                f"serves {load}")
    else:
        what = f"short-request TTFT p95 through the router alone {pa}, with the long load {pm}"
    looks = ""
    if sampling:
        each = (f"{level * 100:.4g}%" if up == level else
                f"{level * 100:.4g}% for a FAIL (the run's false-alarm budget share), {up * 100:.4g}% for a PASS")
        looks = (f" [{len(sampling['history'])} of {len(sampling['looks'])} planned looks, each at "
                 f"{each}, stopped: {sampling['why_stopped']}]")
    clauses = ["short SLO: " + chk.slo_dependent.text("short TTFT", final=False,
                                                      floor_field="the short pool's slo.pass_confidence_floor")
               if chk.slo_dependent
               else "no short SLO declared",
               chk.ratio.text(final=False)]
    body = f"{what}; " + "; ".join(clauses) + looks
    if chk.decision == FAIL_:
        problems = list(chk.problems)
        if chk.slo is not None and chk.slo.decision == FAIL_:
            problems.insert(0, f"short SLO {slo:,.0f} ms broken")
        if chk.ratio.decision == FAIL_:
            problems.insert(1 if problems and problems[0].startswith("short SLO") else 0,
                            f"the split does not isolate: short requests {chk.ratio.point or 0:.1f}x slower with the "
                            f"long pool busy (allowed {ratio_max:g}x) -- the pools share compute, or the router sends "
                            "long requests to the short pool")
        return Verdict(ISOLATION, FAIL, f"{body}; " + "; ".join(problems) + " -> FAIL", measured=pm, limit=slo,
                       unit="ms", evidence=ev)
    if chk.decision == UNDECIDED:
        a = chk.ratio.alone
        no_fail = ""
        if chk.ratio.decision == UNDECIDED and a.upper is None:  # a ratio FAIL needs alone's upper bound
            no_fail = (f"; no ratio FAIL was possible: the alone run's {a.upper_level * 100:.4g}% upper bound on a "
                       f"p{a.q * 100:g} needs at least {min_samples_to_pass(a.q, a.upper_level):,} requests, it had "
                       f"{a.n:,} (raise the short pool's slo.max_requests)")
        return Verdict(ISOLATION, Status.INCONCLUSIVE, f"{body}; undecided after {m['requests']} short requests "
                       f"(sampling bounded by the short pool's slo.max_requests and slo.max_duration_s){no_fail} "
                       "-> INCONCLUSIVE",
                       measured=pm, limit=slo, unit="ms", evidence=ev)
    return Verdict(ISOLATION, PASS, f"{body}; {chk.hol['blocked']} of {chk.hol['judged']} short requests "
                   "head-of-line blocked -> PASS", measured=pm, limit=slo, unit="ms", evidence=ev)


__all__ = ["ISOLATION", "IsolationChecks", "ROUTING", "RatioJudgement", "isolation_checks", "isolation_decide",
           "isolation_plan",
           "isolation_verdict", "judge_ratio", "routing_verdict", "short_slo_ms"]
