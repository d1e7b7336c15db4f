"""The capacity gate's measurement: closed-loop steps of rising concurrency, and the bounded
search over them for the knee (the most load that still meets the SLO).

:func:`run_step` sends one step -- ``n`` requests of the SLO workload (``slo.workload``, exact
prompt lengths, ``ignore_eos``) at ``concurrency`` in flight, closed loop (:func:`kvgate.load.closed_loop`)
-- while a :class:`~kvgate.http.metrics.MetricsSampler` scrapes ``/metrics`` (running, waiting,
KV usage, preemptions), and returns a :class:`~kvgate.load.scenarios.LoadObservation`. Each
step's prompts carry a salt of their own, so no step finds the previous one's prompts in vLLM's
prefix cache.

:func:`search` drives the steps: the ladder in order (:func:`ladder`: doubling from a start to a
cap, the concurrency the verdict needs inserted), stopping at the first step shown to miss the SLO
(FAIL) or not trusted (INVALID) -- an UNDECIDED step (bounds straddling a limit) ends the knee but
not the ladder, so a step above it can still be shown to miss (a declared peak above an undecided
step is then a FAIL, not left unmeasured); then ``bisect_steps`` steps between the last PASS and the
first step that was not one. Measuring and deciding are
injected (``measure(concurrency, seconds_left)``, ``decide(observation)`` -> PASS/FAIL/UNDECIDED/
INVALID), so the search is tested without a server; the wall clock is injectable too. Bounded:
at most ``len(ladder) + bisect_steps`` steps, each given only the seconds the search has left.
A Ctrl-C (or SIGTERM, which kvgate turns into one) during a step ends the search with the steps
finished so far (``why_stopped`` ``interrupted``): the caller writes them, records the gate
INCOMPLETE and re-raises the interrupt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

from kvgate.http.client import Endpoint, KvClient
from kvgate.load import LoadResult, RequestSpec, closed_loop
from kvgate.load.sampling import Q, sample_latency
from kvgate.load.scenarios import LoadObservation, _sampler, _specs, short_workload
from kvgate.stats.confidence import UNDECIDED, LookPlan, plan_looks
from kvgate.profile.models import Profile

T = TypeVar("T")

PASS = "PASS"

#: Kept for callers that read it: a step no longer cycles prompts -- every request of a step has
#: its own (:func:`run_step`; 16 cycled made at least 73% of each step prefix-cache repeats, vLLM's
#: prefix cache hit 50.8% of the 2026-12-06 main job with latency/slo's and interference's).
PROMPTS_PER_STEP = 16


def ladder(start: int, cap: int, need: int | None = None) -> list[int]:
    """Step concurrencies: ``start``, doubling, up to ``cap`` (the cap itself the last step); with
    ``need`` (the concurrency a verdict needs), that is a step too and the cap is raised to it.
    Raises ValueError on ``start < 1`` or ``cap < start``."""
    if start < 1 or cap < start:
        raise ValueError(f"need 1 <= start <= cap, got start {start}, cap {cap}")
    cap = max(cap, need or 0)
    steps, c = [], start
    while c < cap:
        steps.append(c)
        c *= 2
    steps.append(cap)
    if need is not None and need >= start:
        steps.append(need)
    return sorted(set(steps))


@dataclass
class SearchStep(Generic[T]):
    """One measured step: its ``concurrency``, the ``observation`` ``measure`` returned, the
    ``decision`` (PASS/FAIL/UNDECIDED/INVALID), ``phase`` (``ladder`` or ``bisect``), ``t_s``
    (seconds since the search started, when the step ended)."""

    concurrency: int
    observation: T
    decision: str
    phase: str
    t_s: float


@dataclass
class Search(Generic[T]):
    """What :func:`search` did: ``steps`` in the order measured, ``why_stopped`` (``not met``: a
    step FAILed or was INVALID, or a step was UNDECIDED and the ladder ended; ``cap``: every ladder
    step PASSed; ``time``: ``max_duration_s`` ran out
    before the ladder ended; ``interrupted``: a Ctrl-C/SIGTERM cut a step short, which is not
    kept), ``ladder``, ``max_duration_s`` and ``wall_s``."""

    ladder: list[int]
    max_duration_s: float
    steps: list[SearchStep[T]] = field(default_factory=list)
    why_stopped: str = ""
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"ladder": self.ladder, "max_duration_s": self.max_duration_s, "why_stopped": self.why_stopped,
                "wall_s": self.wall_s, "steps": [{"concurrency": s.concurrency, "decision": s.decision,
                                                  "phase": s.phase, "t_s": s.t_s} for s in self.steps]}


def search(measure: Callable[[int, float], T], decide: Callable[[T], str], steps: list[int], *,
           bisect_steps: int = 0, max_duration_s: float = 300.0,
           clock: Callable[[], float] = time.monotonic) -> Search[T]:
    """Measure the ``steps`` (ascending concurrencies) in order until one FAILs or is INVALID (an
    UNDECIDED step is passed over: it ends the knee, not the ladder), then bisect ``bisect_steps``
    times between the last PASS below the first step that did not PASS (0 when none) and that step. ``measure(c, seconds_left)``
    runs a step; ``decide(obs)`` judges it. A step is started only while time is left. A
    ``KeyboardInterrupt`` in a step ends the search there (``why_stopped`` ``interrupted``, the
    finished steps kept) instead of losing them; the caller re-raises it."""
    s: Search[T] = Search(list(steps), max_duration_s)
    t0 = clock()
    try:
        _search(s, measure, decide, steps, bisect_steps, clock, t0)
    except KeyboardInterrupt:
        s.why_stopped = "interrupted"
    s.wall_s = round(clock() - t0, 3)
    return s


def _search(s: Search[T], measure: Callable[[int, float], T], decide: Callable[[T], str], steps: list[int],
            bisect_steps: int, clock: Callable[[], float], t0: float) -> None:
    max_duration_s = s.max_duration_s

    def left() -> float:
        return max_duration_s - (clock() - t0)

    def step(c: int, phase: str) -> str | None:
        if left() <= 0:
            return None
        obs = measure(c, left())
        d = decide(obs)
        s.steps.append(SearchStep(c, obs, d, phase, round(clock() - t0, 3)))
        return d

    lo, hi = 0, None
    for c in steps:
        d = step(c, "ladder")
        if d is None:
            s.why_stopped = "time"
            break
        if d != PASS and hi is None:
            hi = c  # the first step not shown to meet the SLO: the knee lies below it
        if d not in (PASS, UNDECIDED):
            s.why_stopped = "not met"  # FAIL (shown to miss) or INVALID: nothing above it is worth a step
            break
        if hi is None:
            lo = c
    else:
        s.why_stopped = "cap" if hi is None else "not met"
    if hi is not None:
        for _ in range(bisect_steps):
            mid = (lo + hi) // 2
            if mid <= lo or mid < (steps[0] if steps else 1):
                break
            d = step(mid, "bisect")
            if d is None:
                break
            if d == PASS:
                lo = mid
            else:
                hi = mid


def requests_for(profile: Profile, concurrency: int, min_samples: int) -> int:
    """Requests one step sends: ``capacity.requests_per_step``, else the larger of ``min_samples``
    (the fewest with which a p95 PASS is possible at ``slo.confidence``) and two rounds of the
    step's concurrency (so the step is not one burst of simultaneous prefills)."""
    given = profile.capacity.requests_per_step
    return given if given is not None else max(min_samples, 2 * concurrency)


def step_plan(profile: Profile, n: int, deadline_s: float) -> LookPlan:
    """A step's planned looks (F1): the first at ``n`` requests (:func:`requests_for`), then up to
    ``max(n, slo.request_cap)`` (:func:`~kvgate.stats.confidence.plan_looks` at p95 and
    ``slo.confidence``, ``split``: the FAIL side Bonferroni over every look, the PASS side over the
    looks that can PASS), bounded by the step's ``deadline_s`` (what the search has left); the FAIL
    side at the family's share of the run's false-alarm budget (``verdicts.false_alarm_budget``)."""
    c = profile.slo.confidence
    return plan_looks(n, max(n, profile.slo.request_cap), Q, c, max_s=deadline_s, split=True,
                      fail_confidence=profile.verdicts.fail_confidence(c))


def run_step(client: KvClient, endpoint: Endpoint, profile: Profile, concurrency: int, n: int,
             deadline_s: float, salt: str = "",
             decide: Callable[[list[Any], float, float | None], dict[str, str]] | None = None,
             clock: Callable[[], float] = time.monotonic, loop: Callable[..., LoadResult] = closed_loop) -> LoadObservation:
    """``n`` requests of the SLO workload at ``concurrency`` in flight (closed loop) while
    ``/metrics`` is sampled; bounded by ``deadline_s`` seconds. Every request has a prompt of its
    own (``capacity request i<salt>: ``): none shares a first KV block with another, and ``salt``
    keeps this step's prompts out of the prefix cache of earlier steps. A traffic sample on the
    workload is not replayed here: the capacity search uses the declared lengths (prompt_tokens +
    output_tokens).

    With ``decide`` (``(records, per-look level, PASS-side level) -> decisions``, e.g.
    :func:`kvgate.gates.capacity.step_decisions`): the step is sampled in the planned looks of
    :func:`step_plan` (:func:`kvgate.load.sampling.sample_batches`, closed-loop batches of fresh
    prompts), stopping at the first look that decides, at the plan's cap or when ``deadline_s`` is
    spent; the observation's ``sampling`` says what was done and the verdict judges at its per-look
    level. Without it, one batch of ``n``. ``clock`` and ``loop`` (the batch runner) are injected in
    tests."""
    name, wl = short_workload(profile)
    model = profile.model.served_name
    sampler, own = _sampler(endpoint)
    sampling = None
    try:
        if decide is None:
            specs = _specs(client, endpoint, model, wl.prompt_tokens, wl.output_tokens, n, "capacity", salt=salt)
            with sampler:
                result = loop(endpoint, specs, n=n, concurrency=concurrency, deadline_s=deadline_s,
                              request_timeout_s=profile.limits.request_timeout_s,
                              idle_timeout_s=profile.limits.stream_idle_timeout_s)
        else:
            plan = step_plan(profile, n, deadline_s)
            built: list[RequestSpec] = []

            def batch(ep: Any, _given: Any, *, n: int, **kw: Any) -> LoadResult:
                i = len(built)  # the next n requests, each its own prompt, built before the batch's clock
                built.extend(_specs(client, endpoint, model, wl.prompt_tokens, wl.output_tokens, n, "capacity",
                                    salt=f"{salt} {i}"))
                return loop(ep, built[i:i + n], n=n, **kw)

            with sampler:
                got = sample_latency(endpoint, [], concurrency, plan,
                                     lambda recs, level: decide(recs, level, plan.pass_level), deadline_s=deadline_s,
                                     request_timeout_s=profile.limits.request_timeout_s,
                                     idle_timeout_s=profile.limits.stream_idle_timeout_s, clock=clock, loop=batch)
            result, sampling = got.result, got.sampling
    finally:
        own.close()
    return LoadObservation(f"capacity c={concurrency} ({name})", result, sampler.trace, wl.prompt_tokens,
                           wl.output_tokens, concurrency, sampling=sampling)


__all__ = ["PROMPTS_PER_STEP", "Search", "SearchStep", "ladder", "requests_for", "run_step", "search", "step_plan"]
