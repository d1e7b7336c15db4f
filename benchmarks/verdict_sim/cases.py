"""One thin adapter per statistical case: simulated observations in, the case's own decision
code called, its status out (PASS / FAIL / INCONCLUSIVE, anything else as itself).

Each adapter says which kvgate functions decide. The rule for an adapter: it may build inputs
(records, observations, profiles with one limit set) and drive the looks the way the gate's
scenario drives them (the same plan function, the same sampling driver); it never judges a
number itself. Where a scenario's ``decide`` is a closure (interference), the adapter calls the
gate's *verdict* function at every planned look instead and stops at the first look whose
verdict is not INCONCLUSIVE -- the status the gate would print had its sampling stopped there.

Truth points (:data:`verdict_sim.TRUTHS`): ``limit`` puts the case's true quantity exactly at its
limit; ``1.5x``/``2x`` that far on the wrong side (power); ``healthy`` on the right side with room
(each case's :attr:`Case.healthy` says how much). Profiles: the main job's ``smollm2-cpu`` for
the cases it runs (latency/slo, interference, soak, answers/accuracy) and for capacity and compare;
``tiny-cpu-pools`` and ``tiny-cpu-priority`` for pools and priority.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from verdict_sim import (AR_05, AR_08, AR_08_NO_ASSUMPTION, FAIL, IID, INCONCLUSIVE, PASS, WAVES_09, WAVES_10, WAVES_10_FLOOR, Design,
                         lognormal_ms)

#: How far the truth is from the limit, per truth point ("worse" direction; healthy: better).
FACTOR = {"healthy": 0.5, "limit": 1.0, "1.5x": 1.5, "2x": 2.0, "3x": 3.0}


def _status(v: Any) -> str:
    """A Verdict's (or a status's) name: ``PASS``, ``FAIL``, ``INCONCLUSIVE``, ``INVALID``, ..."""
    s = getattr(v, "status", v)
    return str(getattr(s, "value", s)).upper()


@functools.lru_cache(maxsize=None)
def profile(name: str) -> Any:
    from kvgate.profile.models import load_profile
    return load_profile(name)


def with_slo(p: Any, **fields: Any) -> Any:
    """``p`` with ``slo`` fields replaced (model_copy: the profile's own object, one field changed)."""
    return p.model_copy(update={"slo": p.slo.model_copy(update=fields)})


def run_verdicts() -> Any:
    """The run's false-alarm budget (``verdicts``) as the main job's profile, smollm2-cpu, sets it:
    the cases judged on other profiles (pools, priority) take their FAIL side's level from it."""
    return profile("smollm2-cpu").verdicts


# ----------------------------------------------------------------------------------- records

def record(i: int, sent_s: float, ttft_ms: float, gaps_ms: Any = (), tag: str = "") -> Any:
    """A finished, successful :class:`kvgate.load.RequestRecord`: first token ``ttft_ms`` after
    ``sent_s``, then one token per gap (ms); e2e = TTFT + the gaps."""
    from kvgate.load import RequestRecord
    t0 = sent_s + ttft_ms / 1e3
    times = [t0]
    for g in gaps_ms:
        times.append(times[-1] + float(g) / 1e3)
    r = RequestRecord(index=i, scheduled_s=sent_s, tag=tag, sent_s=sent_s, first_byte_s=t0, end_s=times[-1] + 1e-4,
                      status=200, content_type="text/event-stream")
    r.finalized = True
    r.first_token_s, r.content_s, r.chunk_s, r.tokens, r.done = t0, times, list(times), len(times), True
    return r


def load_result(records: list[Any], concurrency: int | None = None) -> Any:
    from kvgate.load import LoadResult
    wall = max((r.end_s for r in records), default=0.0)
    return LoadResult("closed", records, len(records), wall, 600.0, concurrency=concurrency)


def trace() -> Any:
    from kvgate.http.metrics import MetricsTrace
    z = {"running": 1, "waiting": 0, "kv_usage": 0.1, "preemptions": 0.0}
    return MetricsTrace(samples=[(0.0, dict(z)), (1.0, dict(z))])


def observation(name: str, records: list[Any], concurrency: int, sampling: Any = None, extra: Any = None) -> Any:
    from kvgate.load.scenarios import LoadObservation
    return LoadObservation(name, load_result(records, concurrency), trace(), 64, 8, concurrency, extra=extra,
                           sampling=sampling)


# ----------------------------------------------------------------------------- latency/slo

_SLO_FIELD = {"TTFT": "ttft_p95_ms", "ITL": "itl_p95_ms", "e2e": "e2e_p95_ms"}
#: Tokens per simulated request (the main job's chat-short: 8 out), and the ITL design's
#: within-request correlation of log-gaps (a prefill stalls every gap of a stream alike).
TOKENS, ITL_WITHIN_RHO = 8, 0.5


def _slo_case_profile(metric: str) -> Any:
    """smollm2-cpu with one latency SLO set (``metric``'s), the others unset."""
    p = profile("smollm2-cpu")
    limits = {f: None for f in _SLO_FIELD.values()}
    limits[_SLO_FIELD[metric]] = getattr(p.slo, _SLO_FIELD[metric])
    return with_slo(p, **limits)


def _request_values(rng: np.random.Generator, metric: str, z: np.ndarray, target_ms: float) -> list[tuple[float, list[float]]]:
    """Per request ``(ttft_ms, gaps_ms)`` whose judged metric has marginal p95 ``target_ms``:
    TTFT: the TTFT itself (gaps fixed); e2e: the whole request (a quarter of it to the first
    token, the rest spread over the gaps); ITL: every pooled inter-token gap (lognormal per gap,
    the request's latent ``z`` shared by its gaps with correlation :data:`ITL_WITHIN_RHO`, so the
    pooled gaps' marginal p95 is ``target_ms``: the field's definition, ``vllm bench serve``'s)."""
    n = len(z)
    if metric == "TTFT":
        x = lognormal_ms(z, target_ms)
        return [(float(v), [20.0] * (TOKENS - 1)) for v in x]
    if metric == "e2e":
        x = lognormal_ms(z, target_ms)
        return [(0.25 * float(v), [0.75 * float(v) / (TOKENS - 1)] * (TOKENS - 1)) for v in x]
    g = TOKENS - 1
    u = math.sqrt(ITL_WITHIN_RHO) * z[:, None] + math.sqrt(1 - ITL_WITHIN_RHO) * rng.standard_normal((n, g))
    gaps = lognormal_ms(u, target_ms)
    return [(100.0, [float(v) for v in row]) for row in gaps]


def looks_by_verdict(plan: Any, verdict_at: Callable[[int, Any], Any]) -> str:
    """Drive ``plan``'s looks as the gate's sampling loop does, judging each look by the gate's own
    verdict: ``verdict_at(n, sampling)`` is the verdict on the first ``n`` samples with ``sampling``
    (a :class:`kvgate.stats.confidence.Sampling` at that look: ``why_stopped`` "cap" at the last
    look, "decided" before it -- the verdict reads its level and whether the sampling ended from
    it). Stops at the first look whose verdict is not INCONCLUSIVE (the loop stops at the first
    decided look, and a FAIL stands at once). Returns that status."""
    from kvgate.stats.confidence import Sampling
    status = INCONCLUSIVE
    history: list[dict[str, Any]] = []
    for k, n in enumerate(plan.looks):
        last = k == len(plan.looks) - 1
        history.append({"n": n, "decisions": {}, "t_s": 0.0})
        s = Sampling(plan, history=list(history), n=n, why_stopped="cap" if last else "decided")
        status = _status(verdict_at(n, s))
        if status != INCONCLUSIVE:
            break
    return status


def latency_slo(metric: str) -> Callable[[np.random.Generator, Design, str], str]:
    """latency/slo, one metric SLO'd (the others unset): the scenario's plan
    (:func:`kvgate.load.scenarios.latency_plan`), judged at each planned look by the gate's verdict
    (:func:`kvgate.gates.load.latency_verdict`, which judges the same numbers as the scenario's
    ``decide``: :func:`kvgate.load.sampling.slo_decisions` and the dependence-aware
    :func:`kvgate.load.scenarios.latency_judgements` where present), stopping at the first look
    that decides (:func:`looks_by_verdict`). Closed loop at ``slo.concurrency``: a batch's
    requests leave together, and lock-step designs move them in waves of that size."""
    from kvgate.gates.load import latency_verdict
    from kvgate.load.scenarios import latency_plan

    base = _slo_case_profile(metric)
    plan = latency_plan(base)
    limit = getattr(base.slo, _SLO_FIELD[metric])
    c = base.slo.concurrency
    profs = {}

    def one(rng: np.random.Generator, design: Design, truth: str) -> str:
        prof = profs.get(design.floor) or profs.setdefault(design.floor, with_slo(base, pass_confidence_floor=design.floor))
        cap = plan.looks[-1]
        vals = _request_values(rng, metric, design.latent(rng, cap, wave=c), FACTOR[truth] * limit)
        recs = [record(i, (i // c) * 2.0, ttft, gaps) for i, (ttft, gaps) in enumerate(vals)]
        return looks_by_verdict(plan, lambda n, s: latency_verdict(
            observation("latency (sim)", recs[:n], c, s), prof))

    return one


# ---------------------------------------------------------------------------- interference

def interference() -> Callable[[np.random.Generator, Design, str], str]:
    """latency/interference: the scenario's plan (:func:`kvgate.load.scenarios.interference_plan`,
    waves of 4 shorts, each wave's count in ``extra["short_waves"]`` as the scenario records it); at
    each planned look the gate's verdict (:func:`kvgate.gates.load.interference_verdict`) on the
    shorts so far (:func:`looks_by_verdict`; the scenario's ``decide`` is a closure over the same
    judgement). Truth: the mixed shorts' TTFT p95 against
    ``slo.short_ttft_p95_ms``; the alone run well inside it (context only)."""
    from kvgate.gates.load import interference_verdict
    from kvgate.load.scenarios import interference_plan

    base = profile("smollm2-cpu")
    waves, per = 4, 4
    plan = interference_plan(base, waves, per)
    limit = base.slo.short_ttft_p95_ms
    profs = {}

    def one(rng: np.random.Generator, design: Design, truth: str) -> str:
        prof = profs.get(design.floor) or profs.setdefault(design.floor, with_slo(base, pass_confidence_floor=design.floor))
        cap = plan.looks[-1]
        x = lognormal_ms(design.latent(rng, cap, wave=per), FACTOR[truth] * limit)
        mixed = [record(i, (i // per) * 10.0 + (i % per) * 0.0125, float(v), [20.0], tag="short")
                 for i, v in enumerate(x)]
        alone_x = lognormal_ms(rng.standard_normal(waves * per), 0.05 * limit)
        alone = observation("short alone (sim)", [record(i, i * 1.0, float(v), tag="short")
                                                  for i, v in enumerate(alone_x)], 1)

        def verdict_at(n: int, s: Any) -> Any:
            extra = {"waves": n // per, "shorts_per_wave": per, "long_per_wave": 2, "long_prompt_tokens": 384,
                     "short_waves": [per] * (n // per)}  # what the scenario's _waves counts per wave
            return interference_verdict(alone, observation("short with long prefills (sim)", mixed[:n], per, s, extra),
                                        prof)

        return looks_by_verdict(plan, verdict_at)

    return one


# -------------------------------------------------------------------------------- capacity

def capacity() -> Callable[[np.random.Generator, Design, str], str]:
    """capacity: the step at ``need`` = ceil(peak x margin) (smollm2-cpu with ``slo.peak_concurrency``
    4, TTFT p95 the one SLO), sampled in the step's planned looks as the search samples it
    (:func:`kvgate.load.capacity.step_plan` from :func:`~kvgate.load.capacity.requests_for`'s n),
    each look judged by :func:`kvgate.gates.capacity.judge_step` (at the look's levels, from
    ``obs.sampling``) and the gate's :func:`kvgate.gates.capacity.capacity_verdict` over that step
    (:func:`looks_by_verdict`; the steps below it are not simulated: their outcome would only add
    to the need step's). Truth: that step's TTFT p95 against the limit; lock-step waves of the
    step's concurrency."""
    from kvgate.gates.capacity import capacity_verdict, judge_step, min_samples, need_of
    from kvgate.load import capacity as cap_mod

    base = profile("smollm2-cpu")
    prof = with_slo(base, peak_concurrency=4, itl_p95_ms=None, e2e_p95_ms=None)
    need = need_of(prof)
    n = cap_mod.requests_for(prof, need, min_samples(prof))
    step_plan = getattr(cap_mod, "step_plan", None)
    if step_plan is not None:
        plan = step_plan(prof, n, 600.0)
    else:  # one look of n (the search before 2475e61)
        from kvgate.stats.confidence import LookPlan
        plan = LookPlan((n,), prof.slo.confidence, prof.slo.confidence)
    limit = prof.slo.ttft_p95_ms
    profs: dict[float | None, Any] = {}

    def one(rng: np.random.Generator, design: Design, truth: str) -> str:
        # each design at its own slo.pass_confidence_floor (strict: unset), as the latency/slo case
        fp = profs.get(design.floor) or profs.setdefault(design.floor, with_slo(prof, pass_confidence_floor=design.floor))
        cap = plan.looks[-1]
        x = lognormal_ms(design.latent(rng, cap, wave=need), FACTOR[truth] * limit)
        recs = [record(i, (i // need) * 2.0, float(v), [20.0] * (TOKENS - 1)) for i, v in enumerate(x)]

        def verdict_at(k: int, s: Any) -> Any:
            step = judge_step(observation(f"capacity step {need} (sim)", recs[:k], need, s), fp)
            return capacity_verdict([step], fp, {"why_stopped": "cap"})

        return looks_by_verdict(plan, verdict_at)

    return one


# ------------------------------------------------------------------------------------ soak

#: The soak's noise: a slope ceiling equal to this many OLS standard errors of the slope at the
#: planned rounds (independent rounds). 2: a leak at the ceiling is about as hard to tell from
#: none as the latency cases' boundary.
SOAK_CEILING_SE = 2.0


def _soak_setup() -> tuple[Any, Any, Any]:
    from kvgate.soak.runner import plan_for
    prof = profile("smollm2-cpu")
    spec = prof.soak
    return prof, spec, plan_for(prof, spec, mix=())


def _soak_noise_sd(spec: Any, ceiling: float) -> float:
    """Per-round noise sd (series units) that makes ``ceiling`` (units/h) = :data:`SOAK_CEILING_SE`
    OLS standard errors of the slope over the planned measured rounds."""
    m = spec.rounds - spec.warmup_rounds
    xs = np.arange(m) * spec.round_s / 3600.0
    sxx = float(((xs - xs.mean()) ** 2).sum())
    return ceiling * math.sqrt(sxx) / SOAK_CEILING_SE


def soak(part: str) -> Callable[[np.random.Generator, Design, str], str]:
    """soak/memory or soak/latency on smollm2-cpu's soak (rounds of ``soak.round``, warm-up, sample
    until decided up to ``soak.max_duration``): round rows built as the runner writes them, the
    runner's look after every round past the planned ones (:func:`kvgate.gates.soak.undecided`,
    while it names a part and rounds are left), then the gate's verdicts
    (:func:`kvgate.gates.soak.analyze`, :func:`~kvgate.gates.soak.memory_verdict`,
    :func:`~kvgate.gates.soak.latency_verdict`). Truth: the judged series' slope (retained memory
    MB/h, TTFT p95 ms/h) against its ceiling, the other series flat; noise per round from the
    design (independent, AR(1) in rounds), scaled by :data:`SOAK_CEILING_SE`. The FAIL side (every
    slope interval's lower end) at the profile's false-alarm budget share, as the suite judges it
    (``verdicts.fail_confidence(soak.confidence)`` to :func:`~kvgate.gates.soak.analyze`; the looks'
    judge reads it from the profile)."""
    from kvgate.gates.soak import analyze, latency_verdict, memory_verdict, undecided
    from kvgate.soak.runner import ROUND_FIELDS, SoakResult

    prof, spec, plan = _soak_setup()
    mem_c, lat_c = spec.memory_slope_max_mb_per_h, spec.ttft_p95_slope_max_ms_per_h
    mem_sd, lat_sd = _soak_noise_sd(spec, mem_c), _soak_noise_sd(spec, lat_c)
    rs, warm, planned, cap = spec.round_s, spec.warmup_rounds, spec.rounds, spec.max_rounds
    samplers = {"server-memory": {"source": "simulated process tree", "quantity": "PSS + swap", "reads": 1000,
                                  "last_error": None}}

    specs: dict[Any, Any] = {}

    def one(rng: np.random.Generator, design: Design, truth: str) -> str:
        # the design's soak.autocorrelation_max (default: the profile's own)
        sp = spec if design.soak_rho_max == "profile" else specs.setdefault(
            design.soak_rho_max, spec.model_copy(update={"autocorrelation_max": design.soak_rho_max}))
        f = 0.0 if truth == "healthy" else FACTOR[truth]
        mem_slope, lat_slope = (f * mem_c, 0.0) if part == "memory" else (0.0, f * lat_c)
        zm, zl = design.latent(rng, cap), design.latent(rng, cap)
        rows: list[dict[str, Any]] = []

        def add(k: int) -> None:
            t_h = (k + 0.5) * rs / 3600.0
            r = {f_: None for f_ in ROUND_FIELDS}
            mem = 1500.0 + mem_slope * t_h + mem_sd * zm[k]
            r.update(round=k, warmup=k < warm, t_start_s=k * rs, t_end_s=(k + 1) * rs, requests=4, errors=0, ok=4,
                     ttft_p95_ms=800.0 + lat_slope * t_h + lat_sd * zl[k], mem_min_mb=mem, mem_max_mb=mem + 30.0,
                     client_kept_up=True, lag_p99_ms=1.0, loop_lag_p99_ms=1.0, preemptions=0, waiting_max=0.0)
            rows.append(r)

        def result() -> Any:
            return SoakResult(plan=plan, rows=list(rows), complete=True, stopped=None, samplers=samplers,
                              ticks=len(rows) * int(rs), wall_s=len(rows) * rs)

        for k in range(planned):
            add(k)
        while len(rows) < cap and undecided(result(), sp, prof):
            add(len(rows))
        a = analyze(result(), sp, prof.verdicts.fail_confidence(sp.confidence))  # the FAIL side at the budget share
        return _status(memory_verdict(a) if part == "memory" else latency_verdict(a, prof))

    return one


def soak_gpu() -> Callable[[np.random.Generator, Design, str], str]:
    """soak/gpu-memory: the peak GPU memory used per device (NVML's reading) against
    ``gpu_memory_utilization`` x total + ``soak.gpu_slack_mib`` by :func:`kvgate.gates.soak.gpu_verdict`.
    Truth: the device's true peak at the truth point's multiple of that budget (capped at the
    card); "at the limit" is one MiB over it (a PASS there is wrong, a FAIL right). A measured maximum, not an estimate: no sampling error to simulate, the design does not
    enter."""
    from kvgate.gates.soak import analyze, gpu_verdict
    from kvgate.soak.runner import ROUND_FIELDS, SoakResult

    prof, spec, plan = _soak_setup()
    rows = []
    for k in range(spec.rounds):
        r = {f_: None for f_ in ROUND_FIELDS}
        r.update(round=k, warmup=k < spec.warmup_rounds, t_start_s=k * spec.round_s, t_end_s=(k + 1) * spec.round_s,
                 requests=4, errors=0, ok=4, ttft_p95_ms=800.0, mem_min_mb=1500.0 + (k % 3) * 0.5,
                 mem_max_mb=1530.0, client_kept_up=True, lag_p99_ms=1.0, loop_lag_p99_ms=1.0, preemptions=0,
                 waiting_max=0.0)
        rows.append(r)
    total = 80 * 2**30
    util = prof.engine.gpu_memory_utilization or 0.92
    budget = util * total + spec.gpu_slack_mib * 2**20

    def one(rng: np.random.Generator, design: Design, truth: str) -> str:
        # an exact check has no boundary to straddle: "at the limit" is one MiB over the budget
        peak = min(total, FACTOR[truth] * budget + (2**20 if truth == "limit" else 0))
        res = SoakResult(plan=plan, rows=rows, complete=True, stopped=None,
                         samplers={"server-memory": {"source": "sim", "reads": 10, "last_error": None}},
                         ticks=40, wall_s=40.0, gpu=[{"index": 0, "name": "sim", "total_bytes": total,
                                                       "peak_used_bytes": peak}])
        return _status(gpu_verdict(analyze(res, spec), prof))

    return one


# --------------------------------------------------------------------------------- compare

#: Baseline p95 per compared metric (ms): TTFT, TPOT, e2e of an unloaded small model, and the
#: sd of their log (0.1: one request in flight at a time is steady; the review's F6 used 0.1-0.5).
COMPARE_BASE = {"ttft": 300.0, "itl": 50.0, "e2e": 700.0}
COMPARE_SIGMA = 0.1


def compare_latency() -> Callable[[np.random.Generator, Design, str], str]:
    """compare/latency: the suite's plan (``plan_looks(compare.latency_requests,
    compare.latency_requests_max, compare.quantile, slo.confidence)``, as
    ``suites/test_compare.py`` builds it, the FAIL side at ``verdicts.fail_confidence(slo.confidence)``:
    smollm2-cpu's false-alarm budget share), :func:`kvgate.stats.confidence.sample_until_decided`
    with :func:`kvgate.gates.compare.latency_decisions` (PASS side at the plan's ``pass_level``), then the gate's
    :func:`kvgate.gates.compare.latency_verdict`. Truth: every metric's new p95 = the truth
    point's multiple of ``(1 + compare.max_regression)`` x the baseline's (healthy: no regression,
    ratio 1.0); lognormal with :data:`COMPARE_SIGMA`. Pairs interleaved one at a time: ``ar1`` designs are a drift of the machine shared
    by both sides (half the variance), independent metrics."""
    from kvgate.compare.latency import Pairs, Timing
    from kvgate.gates.compare import latency_decisions, latency_verdict
    from kvgate.stats.confidence import plan_looks, sample_until_decided

    prof = profile("smollm2-cpu")
    c = prof.compare
    plan = plan_looks(c.latency_requests, c.latency_requests_max, c.quantile, prof.slo.confidence,
                      max_s=c.latency_max_s, fail_confidence=prof.verdicts.fail_confidence(prof.slo.confidence))
    allowed = 1 + c.max_regression

    def one(rng: np.random.Generator, design: Design, truth: str) -> str:
        cap = plan.looks[-1]
        ratio = 1.0 if truth == "healthy" else FACTOR[truth] * allowed
        vals: dict[str, dict[str, np.ndarray]] = {"new": {}, "base": {}}
        for m, b in COMPARE_BASE.items():
            if design.kind == "iid":
                zn, zb = rng.standard_normal(cap), rng.standard_normal(cap)
            else:
                d = design.latent(rng, cap)
                zn = math.sqrt(0.5) * d + math.sqrt(0.5) * rng.standard_normal(cap)
                zb = math.sqrt(0.5) * d + math.sqrt(0.5) * rng.standard_normal(cap)
            vals["new"][m] = lognormal_ms(zn, ratio * b, COMPARE_SIGMA)
            vals["base"][m] = lognormal_ms(zb, b, COMPARE_SIGMA)
        pairs = Pairs()

        def timing(side: str, i: int) -> Any:
            v = vals[side]
            return Timing(float(v["ttft"][i]), float(v["itl"][i]), float(v["e2e"][i]), TOKENS)

        def take(k: int, left: float | None) -> int:
            i0 = len(pairs.order)
            for i in range(i0, min(cap, i0 + k)):
                pairs.new.append(timing("new", i))
                pairs.base.append(timing("base", i))
                pairs.order.append("new" if i % 2 == 0 else "base")
            return len(pairs.order) - i0

        s = sample_until_decided(plan, take, lambda conf: latency_decisions(prof, pairs, conf, plan.pass_level),
                                 clock=lambda: 0.0)
        return _status(latency_verdict(prof, pairs, s.to_dict(), "baseline (sim)"))

    return one


# -------------------------------------------------------------------------------- accuracy

def accuracy() -> Callable[[np.random.Generator, Design, str], str]:
    """answers/accuracy: :func:`kvgate.gates.answers.accuracy_verdict` on scored rows, smollm2-cpu's
    task size (``recorded_items``, 65) and its recorded accuracy ``p0`` = 47/65. Designs:
    ``fixed`` -- the profile's ``min_accuracy`` (0.55; ``p0 (1 - tolerance)`` when unset), a known
    floor, as the main job judges it; ``recorded`` -- the limit ``recorded x (1 - tolerance)`` from a
    recorded run that is itself a draw (``recorded_correct`` ~ Bin(65, p0)), ``min_accuracy``
    unset. Truth: the served accuracy ``p0 - x (p0 - limit)`` (x = 1 at the limit, 1.5, 2: that
    many times the allowed drop; healthy x = 0: the recorded accuracy). The FAIL side at
    ``verdicts.fail_confidence(accuracy.confidence)`` (smollm2-cpu's false-alarm budget share), as
    the suite passes it."""
    from kvgate.gates.answers import accuracy_verdict
    from kvgate.profile.models import AnswersSpec

    prof = profile("smollm2-cpu")
    acc = prof.answers.accuracy
    n0, k0 = acc.recorded_items, acc.recorded_correct
    p0, tol = k0 / n0, acc.tolerance
    floor = acc.min_accuracy if acc.min_accuracy is not None else p0 * (1 - tol)
    fc = prof.verdicts.fail_confidence(acc.confidence)

    def one(rng: np.random.Generator, design: Design, truth: str) -> str:
        x = 0.0 if truth == "healthy" else FACTOR[truth]
        limit = floor if design.kind == "fixed" else p0 * (1 - tol)
        p = max(0.0, p0 - x * (p0 - limit))
        correct = rng.random(n0) < p
        rows = [{"id": f"item-{i}", "correct": bool(ok), "answer": "a" if ok else "b", "expected": "a",
                 "answered": True} for i, ok in enumerate(correct)]
        if design.kind == "fixed":
            spec = acc.model_copy(update={"min_accuracy": floor})
        else:
            spec = acc.model_copy(update={"min_accuracy": None, "recorded_correct": int(rng.binomial(n0, p0))})
        return _status(accuracy_verdict(AnswersSpec(accuracy=spec), rows, "task (sim)", fail_confidence=fc))

    return one


FIXED = Design("fixed")
RECORDED = Design("recorded")


# ----------------------------------------------------------------------------------- pools

def pools_isolation() -> Callable[[np.random.Generator, Design, str], str]:
    """pools/isolation: tiny-cpu-pools with its short pool's profile; the gate's plan
    (:func:`kvgate.gates.pools.isolation_plan`), :func:`kvgate.stats.confidence.sample_until_decided`
    with :func:`kvgate.gates.pools.isolation_decide` (each look adds as many shorts alone as with the
    long load, as ``run_isolation`` does), then :func:`kvgate.gates.pools.isolation_verdict`. The
    short SLO unset: the ratio is the case. Truth: the mixed shorts' TTFT p95 = the truth point's
    multiple of ``isolation.ttft_ratio_max`` x the alone p95 (healthy: half of it). Alone shorts
    are sequential (independent); the mixed ones in waves of ``shorts_per_wave``. The FAIL side at
    the run's false-alarm budget share for the short pool's ``slo.confidence``, the budget
    smollm2-cpu's (:func:`run_verdicts`: tiny-cpu-pools sets none), as the suite passes it."""
    from kvgate.gates.pools import isolation_decide, isolation_plan, isolation_verdict
    from kvgate.stats.confidence import sample_until_decided

    top = profile("tiny-cpu-pools")
    spec = top.pools
    short = with_slo(profile(spec.short.profile), short_ttft_p95_ms=None, ttft_p95_ms=None)
    iso, lag = spec.isolation, short.limits.schedule_lag_max_s
    # each design at its own slo.pass_confidence_floor (strict: unset; the short pool ships 0.6), as capacity
    shorts: dict[float | None, Any] = {}
    per = iso.shorts_per_wave
    fc = run_verdicts().fail_confidence(short.slo.confidence)
    plan = isolation_plan(iso.waves * per, short, fail_confidence=fc)
    alone_p95 = 10.0

    def one(rng: np.random.Generator, design: Design, truth: str) -> str:
        sp = shorts.get(design.floor) or shorts.setdefault(design.floor, with_slo(short, pass_confidence_floor=design.floor))
        cap = plan.looks[-1]
        ax = lognormal_ms(rng.standard_normal(cap), alone_p95)
        mx = lognormal_ms(design.latent(rng, cap, wave=per), FACTOR[truth] * iso.ttft_ratio_max * alone_p95)
        alone_recs: list[Any] = []
        mixed_recs: list[Any] = []
        alone = observation("short alone (sim)", alone_recs, 1)
        waves_seen: list[int] = []
        mixed = observation("short with the long load (sim)", mixed_recs, per,
                            extra={"waves": 0, "shorts_per_wave": per, "short_waves": waves_seen})

        def take(k: int, left: float | None) -> int:
            i0 = len(mixed_recs)
            for i in range(i0, min(cap, i0 + k)):
                alone_recs.append(record(i, i * 1.0, float(ax[i]), tag="short"))
                mixed_recs.append(record(i, (i // per) * 5.0 + (i % per) * 0.0125, float(mx[i]), tag="short"))
            waves_seen[:] = [per] * (len(mixed_recs) // per)
            mixed.extra["waves"] = len(waves_seen)
            return len(mixed_recs) - i0

        s = sample_until_decided(plan, take, lambda c: {"isolation": isolation_decide(alone, mixed, spec, sp, lag, c,
                                                                                      plan.pass_level)},
                                 clock=lambda: 0.0)
        mixed.extra["sampling"] = s.to_dict()  # where run_isolation leaves it, and the verdict reads it
        return _status(isolation_verdict(alone, mixed, spec, sp, lag, fail_confidence=fc))

    return one


# -------------------------------------------------------------------------------- priority

def priority() -> Callable[[np.random.Generator, Design, str], str]:
    """priority: tiny-cpu-priority, the short SLO unset (the gain is the case): ``priority.pairs``
    pairs of rounds as :func:`kvgate.load.scenarios.run_priority` leaves them (each side's rounds
    merged, ``round_sizes``), judged by :func:`kvgate.gates.priority.priority_verdict` (the gain
    over the pairs, :func:`kvgate.stats.twosample.ratio_over_units`). Truth: the gain (short TTFT
    without priority / with, every quantile alike) = ``priority.min_gain`` at the limit, ``min_gain
    / 1.5`` and ``/ 2`` (power), ``3 x min_gain`` healthy (measured 6-10x against 3). A round's
    shorts in waves of 4, each round its own draw. The FAIL side at the run's false-alarm budget
    share, the budget smollm2-cpu's (:func:`run_verdicts`: tiny-cpu-priority sets none; copied into
    the profile, whose ``verdicts`` the gate reads)."""
    from kvgate.gates.priority import priority_verdict
    from kvgate.profile.models import PrioritySpec

    base = profile("tiny-cpu-priority")
    prof = with_slo(base, short_ttft_p95_ms=None).model_copy(update={"verdicts": run_verdicts()})
    pspec = prof.priority or PrioritySpec()
    per_round, gain_min, pairs = pspec.shorts, pspec.min_gain, pspec.pairs
    with_p95 = 100.0

    def side(name: str, values: list[np.ndarray]) -> Any:
        recs = [record(len_i, 0.5 + len_i * 0.1, float(v), tag="short")
                for len_i, v in enumerate(x for vals in values for x in vals)]
        return observation(name, recs, per_round, extra={"round_sizes": [per_round] * len(values), "pairs": pairs,
                                                         "shorts": per_round, "why_stopped": "pairs"})

    def one(rng: np.random.Generator, design: Design, truth: str) -> str:
        gain = 3 * gain_min if truth == "healthy" else gain_min / FACTOR[truth]
        w = [lognormal_ms(design.latent(rng, per_round, wave=4), with_p95) for _ in range(pairs)]
        o = [lognormal_ms(design.latent(rng, per_round, wave=4), gain * with_p95) for _ in range(pairs)]
        return _status(priority_verdict(side("without priority (sim)", o), side("with priority (sim)", w), prof))

    return one


# ------------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class Case:
    """A statistical case of the benchmark: its ``name`` (gate/case), the ``designs`` it is run
    under, its ``truths``, the adapter factory ``make`` (called once per process), ``main_job``
    (runs in the main job, smollm2-cpu: counted in the false-alarm budget), ``stated`` (the rate the
    gate claims for a wrong PASS and a wrong FAIL at the limit) and ``claim`` (where that
    claim comes from), ``healthy`` (what the healthy truth is), ``max_runs``."""

    name: str
    designs: tuple[Design, ...]
    make: Callable[[], Callable[[np.random.Generator, Design, str], str]]
    main_job: bool
    claim: str
    healthy: str
    truths: tuple[str, ...] = ("healthy", "limit", "1.5x", "2x")
    stated: float = 0.05
    #: At most this many runs a cell whatever ``--runs`` asks (None: no cap): a case whose decision
    #: code costs a tenth of a second or more a run (the soak's look after every round, ITL's cluster
    #: bootstrap) -- the doc gives every row's runs and its Monte-Carlo tolerance.
    max_runs: int | None = None
    #: False where "at the limit" is just past it (an exact check): a FAIL there is right, so only
    #: the wrong PASS is held to ``stated`` at the limit (the wrong FAIL at the healthy point).
    fail_at_limit_is_wrong: bool = True
    #: The kvgate functions that decide, as the doc's table names them.
    decided_by: str = ""
    #: The design keys the main job runs this case under, for the budget (None: every design,
    #: the worst counted).
    main_job_designs: tuple[str, ...] | None = None
    #: The wrong-FAIL rate the case claims at the limit when it differs from ``stated``: the case's
    #: share of its profile's false-alarm budget (``verdicts.false_alarm_budget`` / 9, :func:`budget_share`);
    #: None: ``stated`` (no budget in the adapter's profile).
    stated_fail: float | None = None

    @property
    def fail_stated(self) -> float:
        """The wrong-FAIL rate held at the limit (and at the healthy point)."""
        return self.stated if self.stated_fail is None else self.stated_fail


def budget_share(name: str = "smollm2-cpu", own: float = 0.95) -> float | None:
    """The wrong-FAIL rate a family of profile ``name`` (own level ``own``) states under the
    profile's false-alarm budget: ``1 - verdicts.fail_confidence(own)``; None when the profile sets
    no budget (the family states ``1 - own``)."""
    v = profile(name).verdicts
    return None if v.false_alarm_budget is None else round(1 - v.fail_confidence(own), 8)


#: smollm2-cpu's budget share per family (the adapters below judge on that profile).
_SHARE = budget_share()


REQ = (IID, WAVES_09, WAVES_10)
#: The cases that honour ``slo.pass_confidence_floor``: judged strict (unset) and as smollm2-cpu ships.
REQ_FLOOR = REQ + (WAVES_10_FLOOR,)
_LAT = "scenarios.latency_plan, gates.load.latency_verdict at every look"
_SOAK = "gates.soak.undecided after every round past the planned ones, analyze + memory_verdict / latency_verdict"
CASES: dict[str, Case] = {c.name: c for c in (
    Case("latency/slo TTFT", REQ_FLOOR, lambda: latency_slo("TTFT"), True,
         "1 - slo.confidence per side over the planned looks (split_levels)", "TTFT p95 at half the limit",
         stated_fail=_SHARE, decided_by=_LAT),
    Case("latency/slo ITL", REQ, lambda: latency_slo("ITL"), True,
         "1 - slo.confidence per side; truth = pooled inter-token gaps' p95 (vllm bench serve's ITL p95)",
         "pooled ITL p95 at half the limit", max_runs=200, stated_fail=_SHARE, decided_by=_LAT),
    Case("latency/slo e2e", REQ_FLOOR, lambda: latency_slo("e2e"), True,
         "1 - slo.confidence per side over the planned looks", "e2e p95 at half the limit", stated_fail=_SHARE, decided_by=_LAT),
    Case("latency/interference", REQ_FLOOR, interference, True,
         "1 - slo.confidence per side over the planned looks (16/60 shorts)", "mixed short TTFT p95 at half the limit",
         stated_fail=_SHARE, decided_by="scenarios.interference_plan, gates.load.interference_verdict at every look"),
    Case("capacity", REQ_FLOOR, capacity, False,
         "1 - slo.confidence per side at the need step over its planned looks", "the need step's TTFT p95 at half the limit",
         stated_fail=_SHARE, decided_by="load.capacity.step_plan, gates.capacity.judge_step + capacity_verdict at every look"),
    Case("soak/memory", (IID, AR_05, AR_08, AR_08_NO_ASSUMPTION), lambda: soak("memory"), True,
         "1 - soak.confidence over all looks (Bonferroni, soak.look_confidence)", "no growth (slope 0)",
         truths=("healthy", "limit", "1.5x", "2x", "3x"), max_runs=500, stated_fail=_SHARE, decided_by=_SOAK,
         main_job_designs=("iid", "ar10.5")),
    Case("soak/latency", (IID, AR_05, AR_08, AR_08_NO_ASSUMPTION), lambda: soak("latency"), True,
         "1 - soak.confidence over all looks (Bonferroni, soak.look_confidence)", "no drift (slope 0)",
         truths=("healthy", "limit", "1.5x", "2x", "3x"), max_runs=500, stated_fail=_SHARE, decided_by=_SOAK,
         main_job_designs=("iid", "ar10.5")),
    Case("soak/gpu-memory", (IID,), soak_gpu, False,
         "exact: a measured peak against a fixed budget (no estimate; at the limit = 1 MiB over it)",
         "peak at half the budget", stated=0.0, fail_at_limit_is_wrong=False,
         decided_by="gates.soak.analyze + gpu_verdict"),
    Case("compare/latency", (IID, AR_05, AR_08), compare_latency, False,
         "1 - slo.confidence per side over the planned looks", "no regression (ratio 1.0)",
         stated_fail=_SHARE, decided_by="plan_looks as suites/test_compare.py, sample_until_decided + gates.compare.latency_decisions, "
                    "gates.compare.latency_verdict"),
    Case("answers/accuracy", (FIXED, RECORDED), accuracy, True,
         "1 - accuracy.confidence per side (one-sided Clopper-Pearson; Newcombe non-inferiority for a recorded run)",
         "the recorded accuracy 47/65 (no drop)",
         stated_fail=_SHARE, decided_by="gates.answers.accuracy_verdict", main_job_designs=("fixed",)),
    Case("pools/isolation", REQ_FLOOR, pools_isolation, False,
         "1 - slo.confidence per side for the ratio (each run's bound at 1 - alpha/2)",
         "mixed p95 at half of ratio_max x alone",
         stated_fail=_SHARE, decided_by="gates.pools.isolation_plan, sample_until_decided + isolation_decide, "
                                        "isolation_verdict"),
    Case("priority", REQ, priority, False,
         "1 - slo.confidence per side for the gain (one-sided Student t over the pairs of rounds)",
         "gain 3 x min_gain",
         stated_fail=_SHARE, decided_by="load.scenarios.run_priority's pairs of rounds, gates.priority.priority_verdict "
                    "(stats.twosample.ratio_over_units)"),
)}


def design_label(d: Design) -> str:
    return {"fixed": "the profile's floor (min_accuracy)", "recorded": "recorded run, itself a draw"}.get(d.kind, d.label)


__all__ = ["CASES", "Case", "FACTOR", "design_label", "profile", "record"]
