"""Load scenarios the load gates measure: concurrent long sequences, latency at the SLO's
concurrency, and short requests alone vs. while long prefills run.

Each scenario builds exact-length prompts (verified with ``/tokenize``; a distinct prefix per
request so prefix caching cannot share KV blocks between them), runs :mod:`kvgate.load` while a
:class:`~kvgate.http.metrics.MetricsSampler` scrapes ``/metrics``, and returns raw observations. Every
run is bounded in requests and in time (``deadline_s``).

A workload with ``traffic:`` (:class:`~kvgate.profile.models.TrafficSpec`) is replayed instead of
its fixed lengths (:mod:`kvgate.traffic`): the scenario reads the sample, plans the replay with the
gate's own cap (see :data:`LONG_REPLAY_ROUNDS`), and -- before anything is sent -- checks
that every recorded request fits the deployment (:func:`~kvgate.traffic.sample.overlong`); a sample
that does not is returned unsent, for the verdict to FAIL. The observation carries a
:class:`Traffic` (sample, plan, replay result) so the verdict can say what was replayed.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from kvgate.stats.confidence import LookPlan, Sampling, min_samples_to_pass, plan_looks, split_levels
from kvgate.http.client import Endpoint, KvClient
from kvgate.host.contention import for_endpoint as contention_for
from kvgate.load import LoadResult, RequestSpec, closed_loop, completion_request, frozen_heap, open_loop
from kvgate.load.desync import FIRST_THINK_S, THINK_SHARE, ThinkTransport
from kvgate.load.schedule import make_transport
from kvgate.http.metrics import MetricsSampler, MetricsScrape, MetricsTrace, histogram_buckets, take_scrape
from kvgate.http.probes import Exchange, build_prompt, canary
from kvgate.http.tokenizers import ABSENT
from kvgate.profile.models import Profile, Workload
from kvgate.stats.confidence import FAIL, PASS
from kvgate.stats.dependence import (DependentJudgement, independent, judge_sample, send_order_dependence,
                                    wave_dependence)
from kvgate.load.sampling import (ERRORS, Q, errors_pass_level, sample_batches, sample_latency, slo_decisions, slo_levels,
                                 slo_samples, with_failures)
from kvgate.traffic.replay import ReplayPlan, ReplayResult, plan_replay, run_replay
from kvgate.traffic.sample import TrafficSample, overlong, sample_for


if TYPE_CHECKING:
    from kvgate.stats.confidence import LookPlan


class ScenarioError(Exception):
    """The profile does not describe the scenario (e.g. no long workload). Message says what is missing."""


@dataclass
class Traffic:
    """What a scenario replayed for ``workload`` (its ``traffic:``): the ``sample``, the ``plan``
    (which requests, when), the ``replay`` once sent (None: nothing was sent), and ``overlong``
    (:func:`~kvgate.traffic.sample.overlong` against ``max_model_len`` and ``max_tokens_cap``,
    tokens): when set, the scenario sent nothing. ``outputs_capped_at``: the scenario sent at most
    this many output tokens per request (interference: TTFT is judged), None when as recorded."""

    workload: str
    sample: TrafficSample
    plan: ReplayPlan
    max_model_len: int
    max_tokens_cap: int | None
    overlong: dict[str, Any] | None = None
    replay: ReplayResult | None = None
    outputs_capped_at: int | None = None


#: The most requests each gate replays from a traffic sample (the smaller of it and the sample's
#: ``traffic.max_requests`` applies): latency replays ``slo.requests`` (the SLO's own sample
#: size); interference draws ``waves x shorts_per_wave`` short requests (16) and sends them with 8
#: output tokens, alone and among long prefills, as without traffic; the long-sequence gate
#: replays two rounds of the long workload's concurrency (LONG_REPLAY_ROUNDS). Open-loop replays
#: are further cut by ``traffic.max_duration_s`` (seconds of the sped-up schedule).
LONG_REPLAY_ROUNDS = 2


@dataclass
class LoadObservation:
    """A load run with the server's gauges around it. ``prompt_tokens``/``output_tokens`` per
    request (tokens; a replay: the replayed requests' p50); ``canary``: health-truth generation
    after the run (None if not taken); ``traffic``: what was replayed (None: fixed lengths);
    ``sampling``: the looks a percentile gate took (:class:`~kvgate.stats.confidence.Sampling`; None: one
    fixed-size run)."""

    name: str
    result: LoadResult
    trace: MetricsTrace
    prompt_tokens: int
    output_tokens: int
    concurrency: int
    canary: Exchange | None = None
    extra: dict[str, Any] | None = None
    traffic: Traffic | None = None
    sampling: Sampling | None = None


def long_workload(profile: Profile) -> tuple[str, Workload]:
    """The profile's long-sequence workload with the highest concurrency."""
    longs = [(n, w) for n, w in profile.workloads.items() if w.long]
    if not longs:
        raise ScenarioError(f"profile {profile.name} declares no long workload (workloads.*.long: true)")
    return max(longs, key=lambda nw: nw[1].concurrency)


def short_workload(profile: Profile) -> tuple[str, Workload]:
    """``slo.workload`` if named, else the first non-long workload."""
    if profile.slo.workload:
        if profile.slo.workload not in profile.workloads:
            raise ScenarioError(f"slo.workload {profile.slo.workload!r} is not in workloads "
                                f"({', '.join(profile.workloads)})")
        return profile.slo.workload, profile.workloads[profile.slo.workload]
    shorts = [(n, w) for n, w in profile.workloads.items() if not w.long]
    if not shorts:
        raise ScenarioError(f"profile {profile.name} declares no short workload (workloads without long: true)")
    return shorts[0]


def _specs(client: KvClient, endpoint: Endpoint, model: str, prompt_tokens: int, output_tokens: int, n: int,
           tag: str, salt: str = "") -> list[RequestSpec]:
    """``n`` completion requests of exactly ``prompt_tokens`` prompt tokens, ``output_tokens`` out
    (``ignore_eos``), tagged ``tag``. Each prompt opens with ``"<tag> request <i><salt>: "``, so no
    two of them -- and, with distinct ``salt``, no two runs of them -- share a KV block that vLLM's
    prefix cache (on by default) could serve instead of a prefill."""
    specs = []
    for i in range(n):
        p = build_prompt(client, model, "completions", prompt_tokens, prefix=f"{tag} request {i}{salt}: ")
        specs.append(completion_request(endpoint, model=model, prompt=p.text, max_tokens=output_tokens, tag=tag,
                                        temperature=0, ignore_eos=True))
    return specs


def _specs_of(client: KvClient, endpoint: Endpoint, model: str, lengths: list[tuple[int, int]], tag: str,
              salt: str = "", start: int = 0) -> list[RequestSpec]:
    """Like :func:`_specs`, one request per ``(prompt_tokens, output_tokens)`` of ``lengths``
    (a traffic sample's recorded lengths, tokens), numbered from ``start``."""
    specs = []
    for i, (prompt_tokens, output_tokens) in enumerate(lengths, start):
        p = build_prompt(client, model, "completions", prompt_tokens, prefix=f"{tag} request {i}{salt}: ")
        specs.append(completion_request(endpoint, model=model, prompt=p.text, max_tokens=output_tokens, tag=tag,
                                        temperature=0, ignore_eos=True))
    return specs


def _traffic(profile: Profile, name: str, wl: Workload, concurrency: int, cap: int | None) -> Traffic | None:
    """The replay of workload ``name``'s ``traffic:`` (None without one): the sample read, the
    plan cut at ``cap`` requests, and whether the sample fits ``engine.max_model_len`` and
    ``limits.max_tokens_cap`` -- checked before anything is sent. Raises
    :class:`~kvgate.traffic.sample.TrafficError` naming the profile field and file."""
    sample = sample_for(profile, name)
    if sample is None or wl.traffic is None:
        return None
    limit, cap_tokens = profile.engine.max_model_len, profile.limits.max_tokens_cap
    return Traffic(name, sample, plan_replay(sample, wl.traffic, concurrency, cap), limit, cap_tokens,
                   overlong=overlong(sample, limit, cap_tokens))


def _p50(xs: list[int]) -> int:
    return sorted(xs)[(len(xs) - 1) // 2] if xs else 0


def _unsent(name: str, t: Traffic, concurrency: int, deadline_s: float) -> LoadObservation:
    """The observation of a replay refused before sending (``t.overlong``): no records."""
    rows = [it.trace for it in t.plan.items]
    return LoadObservation(name, LoadResult("open" if t.plan.mode == "open" else "closed", [], 0, 0.0, deadline_s),
                           MetricsTrace(samples=[]), _p50([r.prompt_tokens for r in rows]),
                           _p50([r.output_tokens for r in rows]), concurrency, traffic=t)


def _replayed(client: KvClient, endpoint: Endpoint, profile: Profile, name: str, t: Traffic, tag: str,
              deadline_s: float, after: bool = False) -> LoadObservation:
    """Send ``t.plan`` (:func:`~kvgate.traffic.replay.run_replay`) while ``/metrics`` is sampled;
    ``after``: a canary follows. ``t.replay`` is set."""
    sampler, own = _sampler(endpoint)
    try:
        with sampler:
            t.replay = run_replay(client, endpoint, profile, t.plan, tag=tag, deadline_s=deadline_s)
    finally:
        own.close()
    can = canary(client, profile.model.served_name, profile.limits.canary_deadline_s) if after else None
    rows = [it.trace for it in t.plan.items]
    return LoadObservation(name, t.replay.result, sampler.trace, _p50([r.prompt_tokens for r in rows]),
                           _p50([r.output_tokens for r in rows]), t.plan.concurrency, can, traffic=t)


def _sampler(endpoint: Endpoint) -> tuple[MetricsSampler, KvClient]:
    """A ``/metrics`` sampler with its own client, measuring the host contention of a launched
    server's CPUs over the same window (``trace.host``, :func:`kvgate.host.contention.for_endpoint`)."""
    own = KvClient(endpoint, timeout_s=10.0)  # the sampler's thread gets its own connection pool
    return MetricsSampler(own.metrics_text, interval_s=0.1, alongside=contention_for(endpoint)), own


def run_concurrent_long(client: KvClient, endpoint: Endpoint, profile: Profile, deadline_s: float = 300.0) -> LoadObservation:
    """The long workload's declared concurrency of near-max-length sequences, all at once.

    Prompt = ``min(workload.prompt_tokens, max_model_len - output_tokens)`` tokens, so each
    sequence reaches close to ``max_model_len``; ``ignore_eos`` so each generates exactly
    ``output_tokens``.

    With ``traffic:`` on the long workload: its sample replayed instead (at most
    ``LONG_REPLAY_ROUNDS`` x the workload's concurrency requests, each of its recorded lengths),
    a canary after; a sample that does not fit is not sent (the observation's ``traffic.overlong``).
    """
    name, wl = long_workload(profile)
    t = _traffic(profile, name, wl, wl.concurrency, wl.concurrency * LONG_REPLAY_ROUNDS)
    if t is not None:
        label = f"concurrent-long ({name}, replayed)"
        if t.overlong:
            return _unsent(label, t, wl.concurrency, deadline_s)
        return _replayed(client, endpoint, profile, label, t, "long", deadline_s, after=True)
    model, limit = profile.model.served_name, profile.engine.max_model_len
    out = min(wl.output_tokens, limit - 1)
    prompt = min(wl.prompt_tokens, limit - out)
    specs = _specs(client, endpoint, model, prompt, out, wl.concurrency, "long")
    sampler, own = _sampler(endpoint)
    try:
        with sampler:
            result = closed_loop(endpoint, specs, concurrency=wl.concurrency, deadline_s=deadline_s,
                                 request_timeout_s=profile.limits.request_timeout_s,
                                 idle_timeout_s=profile.limits.stream_idle_timeout_s)
    finally:
        own.close()
    after = canary(client, model, profile.limits.canary_deadline_s)
    return LoadObservation(f"concurrent-long ({name})", result, sampler.trace, prompt, out, wl.concurrency, after)


#: The latency-SLO metrics judged one value per request in send order, here at their effective n
#: (ITL's bound is the pooled-gap definition's own: :func:`kvgate.load.sampling.judge_slo`).
PER_REQUEST = (("ttft_ms", "ttft_p95_ms", "TTFT"), ("e2e_ms", "e2e_p95_ms", "e2e"))


def latency_judgements(records: Sequence[Any], slo: Any, level: float, pass_level: float | None, concurrency: int,
                       at_end: bool = True, fail_worst: bool = False) -> dict[str, DependentJudgement]:
    """label (``TTFT``, ``e2e``) -> its p95 (ms) against ``slo.<field>`` judged at the effective n
    of the requests in send order: the autocorrelation at lags 1..``concurrency`` (requests in
    flight together are neighbours; a lock-step loop repeats every ``concurrency`` sends),
    :func:`~kvgate.stats.dependence.send_order_dependence`, :func:`~kvgate.stats.dependence.judge_sample`
    (FAIL side at ``level``, PASS side at ``pass_level``; at the last look, ``at_end``, a PASS
    at ``slo.pass_confidence_floor`` when too few for ``pass_level``). Shared by the sampling
    loop (:func:`run_latency`) and the verdict (:func:`kvgate.gates.load.latency_verdict`).
    The FAIL side is corrected over the SLO'd metrics (:func:`kvgate.load.sampling.slo_levels`,
    F11), as :func:`kvgate.load.sampling.judge_slo`. With ``slo.error_rate_max`` > 0 every failed
    request counts as an exceedance (+inf, :func:`kvgate.load.sampling.with_failures`, F10) as
    judge_slo counts it: the dependence is measured on the measured values in send order (a +inf
    has no autocorrelation) and its design effect applied to all ``n`` values judged. ``fail_worst``
    (a run with a false-alarm budget, ``verdicts.false_alarm_budget``): the FAIL side at one value
    per ``concurrency`` requests (:func:`~kvgate.stats.dependence.send_order_dependence`)."""
    ordered = sorted(records, key=lambda r: r.index)
    xs = slo_samples(ordered)
    level, pass_level = slo_levels(slo, level, pass_level)
    out = {}
    for key, field_name, label in PER_REQUEST:
        limit = getattr(slo, field_name, None)
        if limit is None:
            continue
        dep = send_order_dependence(xs[key], max(1, int(concurrency)), unit="request", fail_worst=fail_worst)
        values = with_failures(xs[key], ordered, slo)
        if len(values) > len(xs[key]):  # the failures join the sample at the measured design effect
            dep = dataclasses.replace(dep, n=len(values), n_eff=len(values) / dep.design_effect)
        out[label] = judge_sample(values, Q, limit, level, pass_level, dep,
                                  getattr(slo, "pass_confidence_floor", None), at_end)
    return out


def latency_decide(profile: Profile, plan: LookPlan) -> Callable[[list[Any], float], dict[str, str]]:
    """latency/slo's decision at a look, ``(records, level) -> {metric: decision}``: the SLO
    decisions of :func:`kvgate.load.sampling.slo_decisions`, TTFT/e2e (and ITL) replaced by the
    judgements at the send-order effective n (:func:`latency_judgements`). The live sampling and
    ``kvgate merge``'s replay of it call this one function, so both stop at the same look."""
    def decide(records: list[Any], level: float) -> dict[str, str]:
        out = slo_decisions(records, profile.slo, level, plan.pass_level, errors_pass_level(plan))
        at_end = len(records) >= plan.looks[-1]
        for label, dj in latency_judgements(records, profile.slo, level, plan.pass_level,
                                            profile.slo.concurrency, at_end=at_end,
                                            fail_worst=profile.verdicts.raises(profile.slo.confidence)).items():
            out[label] = dj.decision
        return out
    return decide


def latency_plan(profile: Profile) -> LookPlan:
    """The latency-SLO gate's looks: the first at ``slo.requests`` requests, then up to
    ``slo.request_cap`` (:func:`~kvgate.stats.confidence.plan_looks` at p95 and ``slo.confidence``,
    bounded by ``slo.max_duration_s``), the PASS side corrected over the looks that can PASS only
    (``split``): 32 up to 256 -> 32/80/160/256, a healthy deployment PASSes at 80 requests (86
    with one level for both sides). The FAIL side at the family's share of the run's false-alarm
    budget (``verdicts.false_alarm_budget``; :meth:`~kvgate.profile.models.VerdictsSpec.fail_confidence`)."""
    slo = profile.slo
    return plan_looks(slo.requests, slo.request_cap, Q, slo.confidence, max_s=slo.max_duration_s, split=True,
                      fail_confidence=profile.verdicts.fail_confidence(slo.confidence))


def run_latency(client: KvClient, endpoint: Endpoint, profile: Profile, deadline_s: float = 300.0,
                clock: Callable[[], float] = time.monotonic,
                loop: Callable[..., LoadResult] | None = None,
                rng: np.random.Generator | None = None) -> LoadObservation:
    """The SLO workload at ``slo.concurrency`` (closed loop), sampled until every SLO'd p95 is
    decided (:func:`~kvgate.load.sampling.sample_latency`, :func:`latency_plan`): the first look
    sends ``slo.requests`` requests (bounded by ``deadline_s``); while a metric is undecided, more
    closed-loop batches of the same prompts at the same concurrency, up to ``slo.request_cap``
    requests and ``slo.max_duration_s`` seconds. The observation's ``sampling`` says what was
    done; its records are every batch's, on one time base.

    With ``traffic:`` on that workload: its sample replayed as its ``traffic.replay`` says (open
    loop on the recorded arrivals, or closed at ``slo.concurrency``), the first ``slo.requests``
    of the plan (planned up to ``slo.request_cap``) first, each later look the plan's next
    requests (whole sessions; an open-loop slice starts at once, its arrivals kept relative to its
    first); when the sample runs out the sampling stops (``why_stopped`` ``source``). A sample
    that does not fit is not sent (the observation's ``traffic.overlong``).

    ``loop``: what runs each closed-loop batch (default :func:`kvgate.load.closed_loop`; a split
    run passes :meth:`kvgate.scale.session.ScaleOut.closed_loop`, which sends it from N workers and
    returns their merged records -- the same looks, the same judging).

    Every request has a prompt of its own (``slo request i: ``, ``i`` counted over all batches,
    built before its batch's clock starts): none shares a first KV block with another, so the
    prefix cache serves no TTFT of the sample (it cycled 16 prompts: 80-94% repeats, vLLM's prefix
    cache hit 50.8%, 2026-12-06). The default loop is de-synchronised: a random think time before
    every send (:class:`kvgate.load.desync.ThinkTransport`, drawn with ``rng``, injected), so the
    workers do not run in lock-step waves; the dependence left is measured in send order and the
    percentiles judged at the effective n (:func:`latency_judgements`)."""
    name, wl = short_workload(profile)
    model = profile.model.served_name
    n, c = profile.slo.requests, profile.slo.concurrency
    plan = latency_plan(profile)

    def decide(records: list[Any], level: float) -> dict[str, str]:
        return slo_decisions(records, profile.slo, level, plan.pass_level, errors_pass_level(plan))

    t = _traffic(profile, name, wl, c, profile.slo.request_cap)
    if t is not None:
        label = f"latency ({name}, replayed)"
        return _unsent(label, t, c, deadline_s) if t.overlong else \
            _replayed_looks(client, endpoint, profile, label, t, plan, decide, deadline_s, clock)
    built: list[RequestSpec] = []

    def fresh(k: int) -> list[RequestSpec]:  # the next k requests, each its own prompt
        i = len(built)
        built.extend(_specs_of(client, endpoint, model, [(wl.prompt_tokens, wl.output_tokens)] * k, "slo", start=i))
        return built[i:i + k]

    gen = rng if rng is not None else np.random.default_rng()
    thinks: list[float] = []

    def batch(ep: Any, _specs_given: Any, *, n: int, **kw: Any) -> LoadResult:
        specs_k = fresh(n)
        if loop is not None:  # split: each worker draws the same think design from its own seeded stream
            think = {"share": THINK_SHARE, "first_s": FIRST_THINK_S, "seed": int(gen.integers(2**31))}
            return loop(ep, specs_k, n=n, think=think, **kw)
        transport = ThinkTransport(make_transport(ep), gen)
        try:
            return closed_loop(ep, specs_k, n=n, transport=transport, **kw)
        finally:
            thinks.extend(transport.thinks_s)

    decide_dep = latency_decide(profile, plan)

    sampler, own = _sampler(endpoint)
    try:
        with sampler:  # each batch builds its prompts before its own clock starts (batch)
            got = sample_latency(endpoint, [], c, plan, decide_dep, deadline_s=deadline_s,
                                 request_timeout_s=profile.limits.request_timeout_s,
                                 idle_timeout_s=profile.limits.stream_idle_timeout_s, clock=clock,
                                 loop=batch)
    finally:
        own.close()
    return LoadObservation(f"latency ({name})", got.result, sampler.trace, wl.prompt_tokens, wl.output_tokens, c,
                           sampling=got.sampling,
                           extra={"prompts": "one per request", "think_s": {
                               "n": len(thinks), "mean": float(np.mean(thinks)) if thinks else None,
                               "max": max(thinks, default=None), "share_of_median_e2e": THINK_SHARE}
                               if loop is None else {"drawn_on": "each worker, seeded per batch from the run's stream",
                                                     "share_of_median_e2e": THINK_SHARE}})


def _slices(plan: ReplayPlan, done: set[int], k: int) -> ReplayPlan:
    """The next at least ``k`` requests of ``plan`` not in ``done`` (item indices, updated), whole
    units (a session is never cut), in the plan's unit order, as a plan of their own (open loop:
    offsets relative to the slice's first)."""
    taken: list[int] = []
    for u in plan.units():
        if len(taken) >= k:
            break
        if u[0] not in done:
            taken += u
    done.update(taken)
    items = [plan.items[i] for i in sorted(taken)]
    if plan.mode == "open" and items:
        base = min(it.offset_s or 0.0 for it in items)
        items = [dataclasses.replace(it, offset_s=(it.offset_s or 0.0) - base) for it in items]
    return dataclasses.replace(plan, items=tuple(items))


def _replayed_looks(client: KvClient, endpoint: Endpoint, profile: Profile, name: str, t: Traffic, plan: LookPlan,
                    decide: Callable[[list[Any], float], dict[str, str]], deadline_s: float,
                    clock: Callable[[], float]) -> LoadObservation:
    """The replay sent in looks (:func:`run_latency`): each look the plan's next requests via
    :func:`~kvgate.traffic.replay.run_replay`. ``t.plan`` becomes the requests sent, ``t.replay``
    one :class:`~kvgate.traffic.replay.ReplayResult` of them all (records merged; per-request rows
    joined; the per-turn rows and cache summary are the first look's)."""
    full = t.plan
    done: set[int] = set()
    replays: list[ReplayResult] = []

    def send(k: int, left: float | None) -> tuple[LoadResult, int]:
        part = _slices(full, done, k)
        if not part.items:
            return LoadResult(full.mode, [], 0, 0.0, 0.0), 0
        budget = deadline_s if left is None else max(0.001, min(left, deadline_s))
        rr = run_replay(client, endpoint, profile, part, tag="slo", deadline_s=budget, salt=f" look {len(replays)}")
        replays.append(rr)
        return rr.result, len(rr.result.records)

    sampler, own = _sampler(endpoint)
    try:
        with sampler:
            got = sample_batches(plan, send, decide, first_deadline_s=deadline_s, clock=clock)
    finally:
        own.close()
    sent = [full.items[i] for i in sorted(done)]
    t.plan = dataclasses.replace(full, items=tuple(sent),
                                 left_out={**full.left_out, "requests": full.left_out.get("requests", 0)
                                           + len(full.items) - len(sent)})
    first = replays[0] if replays else ReplayResult(t.plan, got.result)
    t.replay = ReplayResult(t.plan, got.result, first.turns, first.cache,
                            [row for rr in replays for row in rr.requests])
    rows = [it.trace for it in t.plan.items]
    return LoadObservation(name, got.result, sampler.trace, _p50([r.prompt_tokens for r in rows]),
                           _p50([r.output_tokens for r in rows]), full.concurrency, traffic=t, sampling=got.sampling)


#: [s] The interference shorts' send offsets are drawn across ``(SHORT_OFFSET_MIN_S, window)``, the
#: window the long prefills of a wave take: the median long TTFT of the waves sent so far; before
#: the first, :func:`prefill_window_guess`. Clipped to ``PREFILL_WINDOW_S`` (seconds).
SHORT_OFFSET_MIN_S = 0.005
PREFILL_WINDOW_S = (0.05, 10.0)
#: [s] The most the first wave's window may be guessed at: the guess scales the alone TTFT, fixed
#: overheads and all (a fake: 57 ms alone, 2 x 1,000 / 16 tokens -> 7.8 s guessed, 0.84 s measured),
#: and a wave lasts at least its last short's offset.
FIRST_WINDOW_MAX_S = 1.0


def prefill_window_guess(alone_ttft_s: float | None, short_tokens: int, long_tokens: int, longs: int) -> float:
    """Seconds the ``longs`` long prefills of a wave are expected to take before any was measured:
    the alone shorts' median TTFT (``alone_ttft_s``) scaled by the tokens (``longs x long_tokens /
    short_tokens``: prefill time grows with the tokens prefilled), clipped to :data:`PREFILL_WINDOW_S`;
    at most :data:`FIRST_WINDOW_MAX_S`; 0.5 s when nothing was measured. Only the first wave's
    offsets use it."""
    lo = PREFILL_WINDOW_S[0]
    if not alone_ttft_s or alone_ttft_s <= 0:
        return 0.5
    return min(FIRST_WINDOW_MAX_S, max(lo, alone_ttft_s * longs * long_tokens / max(1, short_tokens)))


def long_ttft_window(records: Sequence[Any], guess: float) -> float:
    """The prefill window of the next wave (seconds): the median TTFT of the long requests in
    ``records`` that got a first token, clipped to :data:`PREFILL_WINDOW_S`; ``guess`` when none did."""
    xs = sorted(r.first_token_s - r.sent_s for r in records
                if r.tag == "long" and r.first_token_s is not None and r.sent_s is not None)
    if not xs:
        return guess
    lo, hi = PREFILL_WINDOW_S
    return min(hi, max(lo, xs[len(xs) // 2]))


def short_offsets(rng: np.random.Generator, k: int, window_s: float) -> list[float]:
    """``k`` send offsets (seconds after the wave's longs, ascending) drawn independently and
    uniformly across ``(SHORT_OFFSET_MIN_S, window_s)`` with ``rng`` (injected): each short meets
    the long prefills at a point of its own, so the shorts of one wave do not share one engine
    step (four shorts 5-42.5 ms after the longs got their first token in the same step: ICC 0.998
    within waves on the embedded smollm2-cpu, 2026-12-06)."""
    hi = max(SHORT_OFFSET_MIN_S * 2, window_s)
    return sorted(float(x) for x in rng.uniform(SHORT_OFFSET_MIN_S, hi, size=k))


def _waves(endpoint: Endpoint, waves: list[tuple[list[RequestSpec], list[RequestSpec]]], deadline_s: float,
           rng: np.random.Generator | None = None, window: dict[str, Any] | None = None,
           short_waves: list[int] | None = None, **kw: Any) -> LoadResult:
    """Each wave ``(longs, shorts)`` as one open-loop run (longs at 0 s, each short at its own
    random offset across the long prefill window: :func:`short_offsets` with ``rng``, the window
    ``window["s"]`` updated after each wave from the longs' TTFT, :func:`long_ttft_window`), the
    next starting when it ends (one :func:`~kvgate.load.frozen_heap` for them all, so no full
    collection comes between two waves); records merged onto one time base (seconds since the
    first wave's start), re-indexed in send order. ``short_waves``: appended, per wave, the number
    of short records it sent (the clusters of the interference verdict's ICC). ``window["offsets"]``
    collects each wave's offsets. Bounded: the waves share ``deadline_s``. ``kw``: passed to
    :func:`~kvgate.load.open_loop` (timeouts)."""
    import time

    gen = rng if rng is not None else np.random.default_rng()
    win = window if window is not None else {"s": 0.5}
    records: list[Any] = []
    lags: list[float] = []
    cpu, requested, hit, last = 0.0, 0, False, None
    with frozen_heap():
        t0 = time.monotonic()  # after the collection: the first wave starts at 0
        for longs, shorts in waves:
            left = deadline_s - (time.monotonic() - t0)
            if left <= 0:
                hit = True
                break
            offs = short_offsets(gen, len(shorts), float(win.get("s", 0.5)))
            win.setdefault("offsets", []).append([round(x, 4) for x in offs])
            offsets = [0.0] * len(longs) + offs
            start = time.monotonic() - t0
            last = open_loop(endpoint, [*longs, *shorts], offsets_s=offsets, deadline_s=left, **kw)
            if short_waves is not None:
                short_waves.append(sum(1 for r in last.records if r.tag == "short"))
            win["s"] = long_ttft_window([r for r in [*records, *last.records]], float(win.get("s", 0.5)))
            records += [r.shift(start) for r in last.records]
            lags += last.loop_lag_s
            cpu += last.cpu_s
            requested += last.n_requested
            hit = hit or last.deadline_hit
    for i, r in enumerate(records):
        r.index = i
    ends = [r.end_s for r in records if r.end_s is not None]
    return LoadResult("open", records, requested, max(ends, default=0.0), deadline_s, deadline_hit=hit,
                      loop_lag_s=lags, cpu_s=cpu, transport=last.transport if last else "")


def by_wave(records: Sequence[Any], short_waves: Sequence[int], per_wave: int | None = None) -> list[list[Any]]:
    """The short records of ``records`` (tag ``short``, in send order) cut into waves of
    ``short_waves`` records each (what :func:`_waves` counted); shorts beyond the counts (waves
    sent by a caller that did not count them) in groups of ``per_wave``, else one more group."""
    shorts = [r for r in records if r.tag == "short"]
    out, i = [], 0
    for k in short_waves:
        out.append(shorts[i:i + k])
        i += k
    step = max(1, per_wave or len(shorts))
    while i < len(shorts):
        out.append(shorts[i:i + step])
        i += step
    return [g for g in out if g]


def ttft_by_wave(records: Sequence[Any], short_waves: Sequence[int], per_wave: int | None = None) -> list[list[float]]:
    """Per wave (:func:`by_wave`), the TTFTs (ms) of its shorts that succeeded
    (:func:`~kvgate.load.sampling.slo_samples`): the clusters of the interference ICC."""
    return [xs for g in by_wave(records, short_waves, per_wave) if (xs := slo_samples(g)["ttft_ms"])]


def interference_judgement(records: Sequence[Any], short_waves: Sequence[int] | None, limit: float, level: float,
                           pass_level: float | None, floor: float | None = None,
                           at_end: bool = True, per_wave: int | None = None) -> DependentJudgement:
    """The interference shorts' TTFT p95 (ms) against ``limit`` at the effective n of their waves:
    the ICC within waves (:func:`ttft_by_wave`, :func:`~kvgate.stats.dependence.wave_dependence`)
    and :func:`~kvgate.stats.dependence.judge_sample` (FAIL side at ``level``, PASS side at
    ``pass_level``; ``floor`` at the last look, ``at_end``; ``per_wave``: the size of waves not
    counted in ``short_waves``, :func:`by_wave`). Shared by the sampling loop and the verdicts
    (:func:`kvgate.gates.load.interference_verdict`, pools isolation), so all judge the same numbers."""
    if short_waves is None:  # hand-built records with no waves recorded: one cluster each, stated so
        xs = slo_samples([r for r in records if r.tag == "short"])["ttft_ms"]
        dep = dataclasses.replace(independent(len(xs), "short request"), measure="waves not recorded, taken as independent")
        return judge_sample(xs, Q, limit, level, pass_level, dep, floor, at_end)
    groups = ttft_by_wave(records, short_waves, per_wave)
    dep = wave_dependence(groups)
    return judge_sample([x for g in groups for x in g], Q, limit, level, pass_level, dep, floor, at_end)


#: Output tokens of the interference scenario's short requests (TTFT is what is judged).
SHORT_OUTPUT_TOKENS = 8
#: Output tokens of the interference scenario's short requests *alone* (their TTFT is the context
#: the mixed p95 is set against; a request's first token is its TTFT whatever follows, and alone
#: nothing shares the engine with them). Measured on smollm2-cpu: the 16 alone shorts of 8 tokens
#: took 14.3 s of the main job, 7 of their 8 tokens (~88 ms each) after the TTFT they are sent for.
ALONE_OUTPUT_TOKENS = 1


def wave_errors(records: Sequence[Any]) -> str:
    """Interference's error decision at a look: FAIL when any request failed
    (:attr:`kvgate.load.record.RequestRecord.failed`: the server's error), else PASS -- a request
    cut by the waves' own deadline is censored (kvgate's time bound, not the server), and one hung
    up on purpose is no error either."""
    return FAIL if any(r.failed for r in records) else PASS


def interference_plan(profile: Profile, waves: int = 4, shorts_per_wave: int = 4,
                      max_waves: int | None = None) -> LookPlan:
    """The interference gate's looks, in short requests, whole waves each. With
    ``slo.short_ttft_p95_ms``: a first look at ``waves x shorts_per_wave`` (16), which can only
    FAIL, then the cap: the fewest whole waves that can PASS a p95 bound at ``slo.confidence``
    (:func:`~kvgate.stats.confidence.min_samples_to_pass`; 60 shorts at 95%) -- the errors spent
    apart (:func:`~kvgate.stats.confidence.split_levels`): FAIL at 97.5% at either look, PASS at
    95% at the one look that can. A deployment that breaks the SLO FAILs after 4 waves, a healthy
    one PASSes after 15, as with one look; undecided at the cap, INCONCLUSIVE. With ``max_waves``:
    looks up to ``max_waves`` waves (:func:`~kvgate.stats.confidence.plan_looks`, ``split``; each
    rounded up to whole waves): more chances to decide, a later PASS (16/72/120 at 30 waves: PASS
    from 18 waves). Bounded by ``slo.max_duration_s``. Without the SLO: one look of ``waves``.

    Why not more looks by default: a wave costs ~3.3 s on the embedded smollm2-cpu server (2 fresh
    384-token prefills and 4 short ones, 2 cores), and a PASS-capable look beyond the first
    splits the PASS error too (16/72/144: PASS from 18 waves, ~10 s more on every healthy run).

    The FAIL side at the family's share of the run's false-alarm budget
    (``verdicts.false_alarm_budget``; :meth:`~kvgate.profile.models.VerdictsSpec.fail_confidence`)."""
    first = waves * shorts_per_wave
    conf, max_s = profile.slo.confidence, profile.slo.max_duration_s
    fc = profile.verdicts.fail_confidence(conf)
    if profile.slo.short_ttft_p95_ms is None:
        return plan_looks(first, first, Q, conf, max_s=max_s, fail_confidence=fc)

    def whole(n: int) -> int:
        return -(-n // shorts_per_wave) * shorts_per_wave

    if max_waves is None:
        one = max(first, whole(min_samples_to_pass(Q, conf)))
        return split_levels(sorted({first, one}), Q, conf, max_s=max_s, fail_confidence=fc)
    p = plan_looks(first, max(first, max_waves * shorts_per_wave), Q, conf, max_s=max_s, split=True)
    return split_levels(sorted({whole(n) for n in p.looks}), Q, conf, max_s=max_s, fail_confidence=fc)


def run_interference(client: KvClient, endpoint: Endpoint, profile: Profile, waves: int = 4,
                     shorts_per_wave: int = 4, deadline_s: float = 300.0, max_waves: int | None = None,
                     clock: Callable[[], float] = time.monotonic,
                     rng: np.random.Generator | None = None) -> tuple[LoadObservation, LoadObservation]:
    """Short requests alone, then the same short requests while long prefills run.

    Alone run: ``waves x shorts_per_wave`` short requests one at a time, each
    :data:`ALONE_OUTPUT_TOKENS` token out (its TTFT is what it is sent for), with prompts of their
    own (salt ``(alone)``: the mixed shorts never find them in the prefix cache). Mixed run:
    ``waves`` waves; each sends the long workload's concurrency of long requests at the wave's
    start and ``shorts_per_wave`` short requests, each at a random offset across the long
    prefill window (:func:`short_offsets` with ``rng``, injected; the window is the median long
    TTFT of the waves so far, before the first :func:`prefill_window_guess` from the alone TTFT),
    so every short meets fresh long prefills at a point of its own and the shorts of one wave do
    not share one engine step (the ICC within waves is measured and judged by the verdict:
    :mod:`kvgate.stats.dependence`). Every request of the run has a prompt of its own (the
    ``i``-th short ``short request i: ``, the ``i``-th long ``long request i: ``): no two share a
    first KV block. A wave starts when the previous one has ended, so no more than the declared
    long concurrency runs at once (waves 1 s apart overlapped on a busy 2-core machine: 8 longs
    filled max_num_seqs 8 and the shorts waited for whole long generations -- a load the profile
    never declared). The waves' records share one time base (seconds since the first wave's
    start). Returns ``(alone, mixed)``; short requests carry tag ``short``, long ones ``long``.

    Sampling (:func:`interference_plan`, :func:`~kvgate.load.sampling.sample_batches`): waves are
    the unit; a first look of ``waves`` waves, and while the short requests' TTFT p95 against
    ``slo.short_ttft_p95_ms`` is undecided, more waves in the planned looks (by default up to the
    fewest waves that can PASS, 15 at 95%; with ``max_waves``, up to that); within
    ``slo.max_duration_s``. Each look is judged at the effective n of its waves
    (:func:`~kvgate.stats.dependence.wave_dependence`); at the last look a PASS may be taken at
    ``slo.pass_confidence_floor`` (stated). The mixed observation's ``sampling`` says what was
    done; its ``extra``: ``short_waves`` (short records per wave, in send order), ``offsets_s``
    (each wave's short offsets) and ``prefill_window_s``.

    With ``traffic:`` on the short (or long) workload, its requests' prompt lengths come from the
    sample (the first ``waves x shorts_per_wave`` of its replay plan, cycled if the sample is
    smaller; sessions sent as single requests with prompts of their own) in the same waves: the
    gate judges TTFT, so outputs stay capped and arrival times are the waves'. A sample that does
    not fit is not sent: both observations come back empty with ``traffic.overlong`` set.
    """
    sname, short = short_workload(profile)
    lname, long = long_workload(profile)
    model, limit = profile.model.served_name, profile.engine.max_model_len
    n_short = waves * shorts_per_wave
    # the gate judges short-request TTFT only: a few output tokens suffice, and the "alone" run
    # (sequential) then takes ~2 s instead of ~10 s on the embedded server
    sout = min(short.output_tokens, SHORT_OUTPUT_TOKENS)
    lout = min(long.output_tokens, 16)
    st = _traffic(profile, sname, short, 1, n_short)
    lt = _traffic(profile, lname, long, long.concurrency, waves * long.concurrency)
    for t in (st, lt):
        if t is not None and t.overlong:
            return (_unsent(f"short alone ({sname}, replayed)", t, 1, deadline_s),
                    _unsent(f"short with long prefills ({sname} + {lname}, replayed)", t, 1, deadline_s))

    def drawn(t: Traffic, n: int, out: int) -> list[tuple[int, int]]:
        t.outputs_capped_at = out
        rows = [it.trace for it in t.plan.items]
        return [(max(1, min(rows[i % len(rows)].prompt_tokens, limit - out)), out) for i in range(n)]

    short_lengths = drawn(st, n_short, sout) if st else [(short.prompt_tokens, sout)] * n_short
    long_lengths = (drawn(lt, waves * long.concurrency, lout) if lt else
                    [(min(long.prompt_tokens, limit - lout), lout)] * (waves * long.concurrency))
    lprompt = min(long.prompt_tokens, limit - lout)
    conc = long.concurrency
    shorts: list[RequestSpec] = []

    def shorts_for(w: int) -> list[RequestSpec]:  # wave w's short requests, each its own prompt
        while len(shorts) < (w + 1) * shorts_per_wave:
            i = len(shorts)
            lens = (drawn(st, i + shorts_per_wave, sout)[i:] if st else [(short.prompt_tokens, sout)] * shorts_per_wave)
            shorts.extend(_specs_of(client, endpoint, model, lens, "short", start=i))
        return shorts[w * shorts_per_wave:(w + 1) * shorts_per_wave]

    longs: list[RequestSpec] = []

    def longs_for(w: int) -> list[RequestSpec]:  # wave w's long requests, built when first needed
        while len(longs) < (w + 1) * conc:
            i = len(longs)
            lens = drawn(lt, i + conc, lout)[i:] if lt else [(lprompt, lout)] * conc
            longs.extend(_specs_of(client, endpoint, model, lens, "long", start=i))
        return longs[w * conc:(w + 1) * conc]

    longs_for(waves - 1)  # the first look's prompts are built before anything is timed
    shorts_for(waves - 1)
    plan = interference_plan(profile, waves, shorts_per_wave, max_waves)
    slo_limit = profile.slo.short_ttft_p95_ms
    sent = {"waves": 0}
    short_waves: list[int] = []
    window: dict[str, Any] = {"s": 0.5}
    gen = rng if rng is not None else np.random.default_rng()

    def send(k: int, left: float | None) -> tuple[LoadResult, int]:
        n_w = max(1, -(-k // shorts_per_wave))
        w0 = sent["waves"]
        batch = [(longs_for(w), shorts_for(w)) for w in range(w0, w0 + n_w)]
        budget = deadline_s if left is None else max(0.001, min(left, deadline_s))
        res = _waves(endpoint, batch, budget, rng=gen, window=window, short_waves=short_waves,
                     request_timeout_s=profile.limits.request_timeout_s,
                     idle_timeout_s=profile.limits.stream_idle_timeout_s)
        sent["waves"] += len(batch)
        return res, sum(1 for r in res.records if r.tag == "short")

    def decide(records: list[Any], level: float) -> dict[str, str]:
        out = {ERRORS: wave_errors(records)}
        if slo_limit is not None:
            out["short TTFT"] = interference_judgement(records, short_waves, slo_limit, level, plan.pass_level,
                                                       profile.slo.pass_confidence_floor,
                                                       at_end=sum(short_waves) >= plan.looks[-1]).decision
        return out

    alone_out = min(sout, ALONE_OUTPUT_TOKENS)
    alone_lengths = short_lengths if st else [(short.prompt_tokens, alone_out)] * n_short
    solo = [dataclasses.replace(s, body={**s.body, "max_tokens": alone_out})
            for s in _specs_of(client, endpoint, model, alone_lengths, "short", salt=" (alone)")]
    sampler, own = _sampler(endpoint)
    try:
        with sampler:
            alone = closed_loop(endpoint, solo, concurrency=1, deadline_s=deadline_s,
                                request_timeout_s=profile.limits.request_timeout_s,
                                idle_timeout_s=profile.limits.stream_idle_timeout_s)
        trace_alone = sampler.trace
        alone_ttft = sorted(slo_samples(alone.records)["ttft_ms"])
        window["s"] = prefill_window_guess(alone_ttft[len(alone_ttft) // 2] / 1e3 if alone_ttft else None,
                                           _p50([p for p, _ in short_lengths]), lprompt, conc)
        window["first_s"] = window["s"]
        sampler2, own2 = _sampler(endpoint)
        try:
            with sampler2:
                got = sample_batches(plan, send, decide, first_deadline_s=deadline_s, clock=clock)
        finally:
            own2.close()
    finally:
        own.close()
    mixed = got.result
    sprompt = _p50([p for p, _ in short_lengths]) if st else short.prompt_tokens
    rep = ", replayed" if st or lt else ""
    return (LoadObservation(f"short alone ({sname}{rep})", alone, trace_alone, sprompt, alone_out, 1, traffic=st or lt),
            LoadObservation(f"short with long prefills ({sname} + {lname}{rep})", mixed, sampler2.trace, sprompt,
                            sout, long.concurrency + shorts_per_wave,
                            extra={"long_prompt_tokens": _p50([p for p, _ in long_lengths]),
                                   "long_per_wave": long.concurrency, "waves": sent["waves"],
                                   "shorts_per_wave": shorts_per_wave, "short_waves": list(short_waves),
                                   "offsets_s": window.get("offsets", []),
                                   "prefill_window_s": {"first_guess": window.get("first_s"),
                                                        "last": window.get("s")},
                                   "long_traffic": lt.plan.provenance() if lt else None}, traffic=st or lt,
                            sampling=got.sampling))


@dataclass
class BurstObservation:
    """A burst for the autoscale-signal gate. Times in seconds on the sampler's clock (the time
    base of ``trace.samples``): ``burst_start_s`` when the requests went out, ``burst_end_s`` when
    the last one ended; the sampler kept scraping after it until the metric drained or the drain
    time passed. ``metric``: the tracked name in ``trace.samples``."""

    workload: str
    requests: int
    result: LoadResult
    trace: MetricsTrace
    metric: str
    burst_start_s: float
    burst_end_s: float
    max_num_seqs: int | None


def run_autoscale_burst(client: KvClient, endpoint: Endpoint, profile: Profile, deadline_s: float = 300.0,
                        sleep: Any = None) -> BurstObservation:
    """``autoscale.burst_requests`` requests of the burst workload sent at once (open loop, all at
    t=0), ``/metrics`` scraped every 0.1 s with ``autoscale.metric`` tracked; after the last request
    ends, scraping goes on until the metric is at or below ``autoscale.drain_to`` or
    ``autoscale.drain_within_s`` + 1 s pass. Bounded in requests and time (``deadline_s``, each
    request ``limits.request_timeout_s``). The stream idle timeout is not applied: requests queued
    by the burst are meant to wait (the streaming gate judges idle gaps)."""
    import time

    spec = profile.autoscale
    if spec is None:
        raise ScenarioError(f"profile {profile.name} declares no autoscale section")
    if spec.burst_workload:
        name, wl = spec.burst_workload, profile.workloads[spec.burst_workload]
    else:
        name, wl = short_workload(profile)
    model, n = profile.model.served_name, spec.burst_requests
    base = _specs(client, endpoint, model, wl.prompt_tokens, wl.output_tokens, min(n, 16), "burst")
    specs = [base[i % len(base)] for i in range(n)]
    own = KvClient(endpoint, timeout_s=10.0)
    sampler = MetricsSampler(own.metrics_text, interval_s=0.1, extra=(spec.metric,))
    pause = sleep or time.sleep
    try:
        with sampler:
            start = sampler.elapsed()
            result = open_loop(endpoint, specs, offsets_s=[0.0] * n, deadline_s=deadline_s,
                               request_timeout_s=profile.limits.request_timeout_s,
                               idle_timeout_s=profile.limits.stream_idle_timeout_s)
            end = sampler.elapsed()
            while sampler.elapsed() - end < spec.drain_within_s + 1.0:
                last = [v.get(spec.metric) for t, v in sampler.trace.samples if t >= end]
                if last and last[-1] is not None and last[-1] <= spec.drain_to:
                    break
                if not sampler.trace.available:
                    break
                pause(0.1)
    finally:
        own.close()
    return BurstObservation(name, n, result, sampler.trace, spec.metric, start, end, profile.engine.max_num_seqs)


def merged_results(first: LoadResult, more: LoadResult) -> LoadResult:
    """``more``'s records after ``first``'s on one time base (shifted to start at ``first``'s last
    end: runs sent one after the other), re-indexed in send order; counts, lags and CPU added up.
    For a percentile gate that samples more in looks (:mod:`kvgate.stats.confidence`)."""
    import dataclasses

    at = max((r.end_s for r in first.records if r.end_s is not None), default=0.0)
    records = [*first.records, *(r.shift(at) for r in more.records)]
    for i, r in enumerate(records):
        r.index = i
    return dataclasses.replace(first, records=records, n_requested=first.n_requested + more.n_requested,
                               wall_s=max((r.end_s for r in records if r.end_s is not None), default=0.0),
                               deadline_hit=first.deadline_hit or more.deadline_hit,
                               loop_lag_s=[*first.loop_lag_s, *more.loop_lag_s], cpu_s=first.cpu_s + more.cpu_s)


def run_priority(client: KvClient, endpoint: Endpoint, profile: Profile, deadline_s: float = 300.0,
                 clock: Callable[[], float] | None = None) -> tuple[LoadObservation, LoadObservation]:
    """Low-priority long requests fill the server, high-priority short ones arrive while they run;
    the same pattern in ``priority.pairs`` pairs of rounds, each pair one round with the ``priority``
    field (longs ``priority.low``, shorts ``priority.high``) and one without it (every request
    priority 0: what the server does on arrival order), back to back, the order alternating (pair 1
    with first, pair 2 without first, ...: a server's first heavy run is the slower one -- a cold
    tiny-cpu server's short TTFT p95 1.28x slower, measured -- and a slow drift of the host hits
    both sides of a pair alike). Every round has prompts of its own, so the prefix cache favours
    neither. Longs: ``priority.longs`` requests of the long workload (prompt so that prompt + output
    <= max_model_len, at most 64 output tokens) at 0 s; shorts: ``priority.shorts`` requests of the
    short workload (8 output tokens: TTFT is judged) from ``priority.shorts_after_s``, every
    ``priority.shorts_every_s``. A canary follows all rounds (priority preemption under KV pressure
    must not take the engine down; it is reported on the "with" observation).

    Why pairs: a round's shorts share its queue (ICC 0.92-0.98 within a round on the embedded
    server), so the pair of rounds is the independent unit the gain is judged on
    (:func:`kvgate.stats.twosample.ratio_over_units`). Bounded: the rounds share ``deadline_s``; a
    round is started only while time is left and gets what is left (``extra["why_stopped"]``
    ``time`` when pairs were left unsent).

    Returns ``(without, with)``, each the rounds of its side merged in send order (records tagged
    ``short``/``long``); each ``extra``: ``round_sizes`` (records per round, in order),
    ``preemptions`` (the vllm:num_preemptions delta summed over its rounds; None when /metrics has
    none), ``pairs`` (complete pairs), ``rounds``, the plan's sizes. ``clock`` is injected in tests."""
    import dataclasses
    import time

    from kvgate.profile.models import PrioritySpec

    now = clock or time.monotonic
    spec = profile.priority or PrioritySpec()
    sname, short = short_workload(profile)
    lname, long = long_workload(profile)
    model, limit = profile.model.served_name, profile.engine.max_model_len
    lout = min(long.output_tokens, 64)
    lprompt = min(long.prompt_tokens, limit - lout)
    sout = min(short.output_tokens, SHORT_OUTPUT_TOKENS)
    offsets = [0.0] * spec.longs + [spec.shorts_after_s + j * spec.shorts_every_s for j in range(spec.shorts)]

    def pattern(run: str, low: int | None, high: int | None) -> list[RequestSpec]:
        # fresh prompts per round: a round re-sending another's would find them in the prefix cache
        # (a measured 1.9x "gain" on an FCFS server, CI 2026-12-01), not in the queue order
        longs = _specs(client, endpoint, model, lprompt, lout, spec.longs, "long", salt=f" ({run})")
        shorts = _specs(client, endpoint, model, short.prompt_tokens, sout, spec.shorts, "short", salt=f" ({run})")
        if low is None or high is None:
            return [*longs, *shorts]
        return [*(dataclasses.replace(s, body={**s.body, "priority": low}) for s in longs),
                *(dataclasses.replace(s, body={**s.body, "priority": high}) for s in shorts)]

    def send(specs: list[RequestSpec], within_s: float) -> tuple[LoadResult, MetricsTrace]:
        sampler, own = _sampler(endpoint)
        try:
            with sampler:
                result = open_loop(endpoint, specs, offsets_s=offsets, deadline_s=within_s,
                                   request_timeout_s=profile.limits.request_timeout_s)
        finally:
            own.close()
        return result, sampler.trace

    sides: dict[str, LoadObservation] = {}
    t0, why, pairs = now(), "pairs", 0
    for k in range(spec.pairs):
        order = (("with", spec.low, spec.high), ("without", None, None))
        for key, low, high in (order if k % 2 == 0 else order[::-1]):
            left = deadline_s - (now() - t0)
            if left <= 0:
                why = "time"
                break
            result, trace = send(pattern(f"{key}, pair {k + 1}", low, high), left)
            pre = trace.delta("preemptions")
            obs = sides.get(key)
            if obs is None:
                label = "with priority" if key == "with" else "without priority"
                sides[key] = LoadObservation(
                    f"{sname} among {lname}, {label}", result, trace, short.prompt_tokens, sout, len(offsets),
                    extra={"longs": spec.longs, "long_prompt_tokens": lprompt, "long_output_tokens": lout,
                           "shorts": spec.shorts, "max_num_seqs": profile.engine.max_num_seqs,
                           "policy": profile.engine.scheduling_policy, "high": spec.high, "low": spec.low,
                           "pairs_planned": spec.pairs, "round_sizes": [len(result.records)], "preemptions": pre})
            else:
                assert obs.extra is not None
                obs.result = merged_results(obs.result, result)
                obs.extra["round_sizes"].append(len(result.records))
                p0 = obs.extra["preemptions"]
                obs.extra["preemptions"] = None if p0 is None or pre is None else p0 + pre
        else:
            pairs += 1
            continue
        break
    for key in ("with", "without"):  # a side the time never reached: no rounds (the verdict: no pair to judge)
        if key not in sides:
            sides[key] = LoadObservation(f"{sname} among {lname}, {key} priority",
                                         LoadResult("open", [], 0, 0.0, deadline_s), MetricsTrace(samples=[]),
                                         short.prompt_tokens, sout, len(offsets),
                                         extra={"round_sizes": [], "preemptions": None, "pairs_planned": spec.pairs})
    with_, without = sides["with"], sides["without"]
    for obs in (with_, without):
        assert obs.extra is not None
        obs.extra.update(pairs=pairs, rounds=len(obs.extra["round_sizes"]), why_stopped=why,
                         wall_s=round(now() - t0, 3))
    with_.canary = canary(client, model, profile.limits.canary_deadline_s)
    return without, with_


#: The histograms the metrics gate compares with the client (vLLM 0.32's names, v1/metrics/loggers.py).
TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
E2E_HISTOGRAM = "vllm:e2e_request_latency_seconds"


@dataclass
class MetricsStep:
    """The metrics gate's load step. ``before``: the scrape before any request; ``during``: scrapes
    taken while the streams ran (every ``interval_s``); ``after``: the last scrape once they ended
    (repeated up to ~1 s until both histograms' counts caught up). Scrape times and ``result``'s
    records share one time base: seconds since the load run's start. ``result`` is None when the
    endpoint serves no ``/metrics`` (``before.status`` 404, 405 or 501: nothing was sent)."""

    before: MetricsScrape
    during: list[MetricsScrape]
    after: MetricsScrape
    result: LoadResult | None
    requests: int
    max_num_seqs: int | None
    prompt_tokens: int
    max_tokens: int
    interval_s: float
    #: [tokens/s] the decode rate the held streams' length was sized from (None: not measured, the
    #: profile's metrics.max_tokens used as it is) and the sizing in words, for the verdicts.
    decode_tps: float | None = None
    sized: str = ""


#: [s] How long each held stream must decode at the single-stream rate measured before the step, at
#: least: the window in which all of them run then covers several scrapes on a server of any speed
#: (with all of them running each decodes slower still). Issue 33: 64 tokens on the faster embedded
#: server left a 0.10 s window, no scrape in it -> INVALID on a healthy server. Measured on tiny-cpu
#: (2-core host, 8 of 10 streams running): 1 s at the probe's 277 tokens/s (278 tokens) held all 8
#: for 2.6 s, 21 scrapes -- 2.7x the single-stream time, and 5.7 s more for the step than 64 tokens.
HOLD_S = 0.5
#: Scrape intervals the hold must cover at least (with a slower scrape interval, a longer hold).
HOLD_SCRAPES = 8
#: Tokens of the rate probe sent before the step.
RATE_PROBE_TOKENS = 32


def held_tokens(least: int, most: int, tps: float | None, interval_s: float) -> int:
    """Output tokens of each held stream: enough to decode for ``max(HOLD_S, HOLD_SCRAPES x
    interval_s)`` at ``tps`` (tokens/s, one stream), at least ``least`` (``metrics.max_tokens``),
    at most ``most`` (the server's cap, the context); ``least`` when no rate was measured."""
    if not tps or tps <= 0:
        return min(least, most)
    return max(1, min(most, max(least, math.ceil(tps * max(HOLD_S, HOLD_SCRAPES * interval_s)))))


def probe_rate(client: KvClient, model: str) -> float | None:
    """Tokens/s of one greedy stream of :data:`RATE_PROBE_TOKENS` tokens
    (:func:`kvgate.http.probes.decode_rate`); when its token events cannot time it (too close
    together, bunched by a proxy) the tokens over the stream's whole duration, a lower bound;
    None when it failed."""
    from kvgate.http.probes import decode_rate

    rate = decode_rate(client, model, RATE_PROBE_TOKENS)
    if rate.tps:
        return rate.tps
    r = rate.reply
    return RATE_PROBE_TOKENS / r.elapsed_s if r is not None and r.status == 200 and r.elapsed_s > 0 else None


def _metrics_get(client: KvClient):
    def get() -> tuple[int, str, str]:
        r = client.get("/metrics", timeout_s=10.0)
        if r.status == 0:
            raise RuntimeError(r.text)
        return r.status, r.headers.get("content-type", ""), r.text
    return get


def run_metrics_step(client: KvClient, endpoint: Endpoint, profile: Profile, interval_s: float = 0.1,
                     deadline_s: float = 120.0, sleep: Any = None) -> MetricsStep:
    """``metrics.held_requests`` streamed completions sent at once (short workload prompt, output
    with ``ignore_eos`` sized by :func:`held_tokens` from the decode rate of a probe stream sent first
    (:func:`probe_rate`; ``metrics.max_tokens`` at least; capped by ``limits.max_tokens_cap`` and the
    context) and held open while ``/metrics`` is scraped every ``interval_s`` seconds from a thread
    with its own connection. Bounded: the run by ``deadline_s`` (each request by
    ``limits.request_timeout_s``), the scrapes by count (``deadline_s / interval_s``) and the
    catch-up after it by ~1 s. The stream idle timeout is not applied: streams beyond max_num_seqs
    are meant to wait (the streaming gate judges idle gaps)."""
    import threading
    import time

    spec = profile.metrics
    pause = sleep or time.sleep
    _, wl = short_workload(profile)
    model, limit = profile.model.served_name, profile.engine.max_model_len
    most = min(profile.limits.max_tokens_cap or limit, limit - 1 - min(wl.prompt_tokens, limit // 2))
    out = min(spec.max_tokens, profile.limits.max_tokens_cap or spec.max_tokens, limit - 1)
    n = spec.held_requests
    own = KvClient(endpoint, timeout_s=10.0)  # the scraper's own connection pool
    get = _metrics_get(own)
    origin: dict[str, float] = {}

    def clock() -> float:  # the load run's clock; its first call is the run's start
        t = time.perf_counter()
        origin.setdefault("t0", t)
        return t

    def now() -> float:
        return time.perf_counter() - origin.get("t0", time.perf_counter())

    try:
        before = take_scrape(get, lambda: 0.0)
        prompt = max(1, min(wl.prompt_tokens, limit - out))
        if before.status in ABSENT:  # no /metrics route (llama.cpp without --metrics: 501): nothing to judge
            return MetricsStep(before, [], before, None, n, profile.engine.max_num_seqs, prompt, out, interval_s)
        tps = probe_rate(client, model)
        out = held_tokens(out, most, tps, interval_s)
        prompt = max(1, min(wl.prompt_tokens, limit - out))
        hold = max(HOLD_S, HOLD_SCRAPES * interval_s)
        sized = (f"sized for {hold:g} s at the {tps:,.0f} tokens/s a {RATE_PROBE_TOKENS}-token probe stream measured"
                 + (f", capped at {most}" if out == most and tps * hold > most else "") if tps else
                 f"the probe stream measured no decode rate: metrics.max_tokens {out}")
        # the probe's own request must be in the histograms' counts before the step: wait for it
        want = {h: histogram_buckets(before.families or {}, h)[1] + 1 for h in (TTFT_HISTOGRAM, E2E_HISTOGRAM)}
        before = _caught_up(get, lambda: 0.0, want, pause)
        specs = _specs(client, endpoint, model, prompt, out, n, "metrics")
        during: list[MetricsScrape] = []
        stop = threading.Event()

        def scrape_loop() -> None:
            for _ in range(int(deadline_s / interval_s) + 1):
                if stop.wait(interval_s):
                    return
                if "t0" in origin:
                    during.append(take_scrape(get, now))

        thread = threading.Thread(target=scrape_loop, name="kvgate-metrics-step", daemon=True)
        thread.start()
        try:
            result = open_loop(endpoint, specs, offsets_s=[0.0] * n, deadline_s=deadline_s, clock=clock,
                               request_timeout_s=profile.limits.request_timeout_s)
        finally:
            stop.set()
            thread.join(timeout=30)
        want = {h: histogram_buckets(before.families or {}, h)[1] + n for h in (TTFT_HISTOGRAM, E2E_HISTOGRAM)}
        after = _caught_up(get, now, want, pause)
    finally:
        own.close()
    return MetricsStep(before, during, after, result, n, profile.engine.max_num_seqs, prompt, out, interval_s, tps,
                       sized)


def _caught_up(get: Any, now: Callable[[], float], want: dict[str, float], pause: Callable[[float], Any]) -> MetricsScrape:
    """A scrape whose histograms count ``want`` (name -> count) or more, retried 10 times 0.1 s apart
    (the engine records a request's histograms as it finishes: let them land); the last one taken."""
    scrape = take_scrape(get, now)
    for _ in range(10):
        fams = scrape.families
        if fams is not None and all(histogram_buckets(fams, h)[1] >= c for h, c in want.items()):
            break
        pause(0.1)
        scrape = take_scrape(get, now)
    return scrape
