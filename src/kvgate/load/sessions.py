"""Conversations under load: sessions whose later turns wait for the earlier turns' replies.

A :class:`SessionPlan` is one conversation: its first request (built and serialised before the
clock starts, like every request of :mod:`kvgate.load.schedule`), how many turns it has, and a
``follow(turn, earlier_records)`` callable that builds turn ``n``'s request from the records of
turns ``0..n-1`` (decoded: the replies' text is in ``record.text``). :func:`run_sessions` sends them with
the same transports, records and :class:`~kvgate.load.schedule.LoadResult` as the closed and
open loops, bounded in count (the plan) and time (``deadline_s``).

**How dependent turns are scheduled.** Turn ``n + 1`` of a session is sent only after turn ``n``'s
reply arrived (its ``end_s``) and its prompt was built from it (``follow`` runs in a worker thread,
:func:`asyncio.to_thread`, because it may call ``/tokenize``, and the previous reply is decoded
there too: the event loop keeps serving -- and timestamping -- the other sessions meanwhile). In the open loop it is also not sent before its own planned offset
(``offsets_s[n]``); if the reply came later than that, it goes as soon as its prompt is ready.
In the closed loop it goes as soon as its prompt is ready, on the same worker (a worker runs a
whole session, turn after turn, then takes the next session).

**What lag means for them.** A dependent turn's ``scheduled_s`` is ``max(planned offset,
prompt ready)`` (closed loop: prompt ready), so its schedule lag (``sent_s - scheduled_s -
connect_s``, as everywhere) is the client's own delay in dispatching a request that was due and
ready -- not the wait for the previous reply, which is the server's time and the conversation's
nature. That wait is kept per turn in :class:`TurnTiming` (``ready_s``: the previous reply
complete; ``built_s``: the prompt ready; ``due_s``: the planned offset). A client that falls
behind still shows: in the schedule lag of every first turn and single request (scheduled on the
recorded arrivals as in :func:`~kvgate.load.run_open_loop`), in the dispatch lag of dependent
turns, and in the event-loop lag ticker -- so :meth:`LoadResult.invalid_verdict` judges a
session run exactly as it judges the other loops. Prompt-building time (``built_s - ready_s``)
is the harness's, kept in :class:`TurnTiming` and summarised by the replay
(:mod:`kvgate.traffic.replay`), not counted as lag.

A turn whose predecessor failed (no reply to continue from) is not sent; nor is any turn once the
deadline passed. :attr:`SessionRun.not_sent` says which and why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from kvgate.http.client import Endpoint
from kvgate.load.record import RequestRecord, RequestSpec
from kvgate.load.schedule import (LoadResult, Sleep, _cancel, _decode, _drive, _run_sync, _spawn, _start,
                                  make_transport)
from kvgate.load.transport import Clock, LoadTransport

#: ``follow(turn, earlier)``: the request of ``turn`` (>= 1) from the records of the turns before it.
Follow = Callable[[int, list[RequestRecord]], RequestSpec]
#: How ``follow`` is run: ``await build(follow, turn, earlier)`` (default :func:`asyncio.to_thread`).
Build = Callable[..., Awaitable[RequestSpec]]


def _next_turn(follow: Follow, turn: int, earlier: list[RequestRecord]) -> RequestSpec | None:
    """Turn ``turn``'s request, or None when the turn before it failed. Runs where ``build`` runs
    (a worker thread): decoding the previous reply (:meth:`RequestRecord.finalize`, its text for
    the new prompt) stays off the event loop, which the other sessions' timestamps need."""
    prev = earlier[-1].finalize()
    return follow(turn, earlier) if prev.ok else None


@dataclass(frozen=True)
class SessionPlan:
    """One conversation to send. ``first``: turn 0's request. ``turns``: how many turns (1: a
    single request). ``offsets_s``: open loop, each turn's planned send time, seconds from the
    run's start (turn ``n`` is sent at ``offsets_s[n]`` or when its prompt is ready, whichever is
    later). ``follow``: builds turn ``n >= 1`` from the records of turns ``< n`` (needed when
    ``turns > 1``; runs in a worker thread). ``indices``: the record index of each turn, so
    records map back to the caller's plan (default: ``index0 + turn``)."""

    first: RequestSpec
    turns: int = 1
    offsets_s: tuple[float, ...] | None = None
    follow: Follow | None = None
    index0: int = 0
    indices: tuple[int, ...] | None = None

    def index(self, turn: int) -> int:
        """The record index of ``turn``."""
        return self.indices[turn] if self.indices is not None else self.index0 + turn


@dataclass(frozen=True)
class TurnTiming:
    """When one sent turn became possible, seconds since the run's start. ``due_s``: its planned
    offset (None in the closed loop). ``ready_s``: the previous turn's reply complete (None for
    turn 0). ``built_s``: its prompt built (None for turn 0, built before the run)."""

    index: int
    session: int
    turn: int
    due_s: float | None
    ready_s: float | None
    built_s: float | None

    @property
    def build_s(self) -> float | None:
        """Seconds spent building this turn's prompt after the previous reply arrived."""
        return None if self.built_s is None or self.ready_s is None else self.built_s - self.ready_s


@dataclass
class SessionRun:
    """A finished session run: ``result`` (records in send order, indices as planned),
    ``timing`` (record index -> :class:`TurnTiming`), ``not_sent`` (record index -> why that
    turn was never sent: an earlier turn failed, or the deadline passed)."""

    result: LoadResult
    timing: dict[int, TurnTiming] = field(default_factory=dict)
    not_sent: dict[int, str] = field(default_factory=dict)


async def run_sessions(endpoint: Endpoint | None, sessions: Sequence[SessionPlan], *, mode: str = "closed",
                       concurrency: int = 1, max_in_flight: int = 512, deadline_s: float = 600.0,
                       request_timeout_s: float | None = None, idle_timeout_s: float | None = None,
                       clock: Clock = time.perf_counter, sleep: Sleep = asyncio.sleep,
                       transport: LoadTransport | None = None, loop_monitor_s: float | None = 0.005,
                       freeze_gc: bool = True, build: Build = asyncio.to_thread) -> SessionRun:
    """Send ``sessions`` (see the module docstring for how turns are scheduled).

    ``mode``: ``open`` (every session's first turn at ``offsets_s[0]``, whatever the server does;
    at most ``max_in_flight`` requests outstanding, beyond which the schedule slips and the lag
    shows it) or ``closed`` (``concurrency`` workers, each running whole sessions back to back,
    in the given order). ``deadline_s``: the whole run's budget, seconds; nothing is sent after
    it and every request times out by it. ``request_timeout_s`` / ``idle_timeout_s`` /
    ``clock`` / ``sleep`` / ``transport`` / ``loop_monitor_s`` / ``freeze_gc``: as in
    :func:`~kvgate.load.run_closed_loop`. ``build``: how ``follow`` is awaited (default
    :func:`asyncio.to_thread`; tests may run it inline)."""
    if mode not in ("open", "closed"):
        raise ValueError(f"mode must be 'open' or 'closed', not {mode!r}")
    if deadline_s <= 0:
        raise ValueError("deadline_s must be > 0")
    if mode == "closed" and concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    for s in sessions:
        if s.turns < 1:
            raise ValueError("a session has at least one turn")
        if s.turns > 1 and s.follow is None:
            raise ValueError("a session of several turns needs follow")
        if mode == "open" and (s.offsets_s is None or len(s.offsets_s) < s.turns):
            raise ValueError("an open-loop session needs an offset per turn")
        if s.indices is not None and len(s.indices) < s.turns:
            raise ValueError("a session's indices need one per turn")
    if transport is None:
        if endpoint is None:
            raise ValueError("endpoint or transport is required")
        transport = make_transport(endpoint)
    tr: LoadTransport = transport

    def idled(spec: RequestSpec) -> RequestSpec:
        if idle_timeout_s is None or spec.idle_timeout_s is not None:
            return spec
        return dataclasses.replace(spec, idle_timeout_s=idle_timeout_s)

    firsts = [tr.prepare(idled(s.first)) for s in sessions]  # serialised before the clock starts
    n_total = sum(s.turns for s in sessions)
    req_timeout = deadline_s if request_timeout_s is None else request_timeout_s
    width = concurrency if mode == "closed" else max_in_flight
    records: list[RequestRecord] = []
    timing: dict[int, TurnTiming] = {}
    not_sent: dict[int, str] = {}
    lag_samples: list[float] = []
    state = {"deadline_hit": False}
    cpu0, t0, monitor = _start(clock, tr, width, freeze_gc, loop_monitor_s, lag_samples)
    deadline = t0 + deadline_s
    sem = asyncio.Semaphore(max_in_flight) if mode == "open" else None

    def give_up(s: SessionPlan, n: int, why: str) -> None:
        for k in range(n, s.turns):
            not_sent[s.index(k)] = why

    async def session(si: int, s: SessionPlan) -> None:
        earlier: list[RequestRecord] = []
        for n in range(s.turns):
            due = s.offsets_s[n] if s.offsets_s is not None and mode == "open" else None
            ready = built = None
            if n == 0:
                prepared, tag = firsts[si], s.first.tag
                scheduled = due if due is not None else clock() - t0
            else:
                prev = earlier[-1]
                ready = prev.end_s
                assert s.follow is not None
                nxt = await build(_next_turn, s.follow, n, list(earlier))
                if nxt is None:
                    give_up(s, n, f"not sent: turn {n - 1} failed ({prev.error or 'hung up'}), no reply to continue")
                    return
                spec = idled(nxt)
                prepared, tag = tr.prepare(spec), spec.tag
                built = clock() - t0
                scheduled = built if due is None else max(due, built)
            wait = t0 + scheduled - clock()
            if wait > 0:
                await sleep(wait)
            if t0 + scheduled >= deadline or clock() >= deadline:
                state["deadline_hit"] = True
                give_up(s, n, "not sent: the run's deadline passed")
                return
            if sem is not None:
                await sem.acquire()
            try:
                if clock() >= deadline:
                    state["deadline_hit"] = True
                    give_up(s, n, "not sent: the run's deadline passed")
                    return
                rec = RequestRecord(index=s.index(n), scheduled_s=scheduled, tag=tag)
                records.append(rec)
                timing[rec.index] = TurnTiming(rec.index, si, n, due, ready, built)
                left = deadline - clock()
                await tr.send(prepared, rec, min(req_timeout, left))
                if left < req_timeout and rec.error is not None and rec.error.startswith("timeout"):
                    state["deadline_hit"] = True
            finally:
                if sem is not None:
                    sem.release()
            earlier.append(rec)

    async def open_dispatcher() -> None:
        tasks: set[asyncio.Task[None]] = set()
        order = sorted(range(len(sessions)), key=lambda i: (sessions[i].offsets_s or (0.0,))[0])
        try:
            for k, si in enumerate(order):
                s = sessions[si]
                due = t0 + (s.offsets_s or (0.0,))[0]
                if due >= deadline:
                    state["deadline_hit"] = True
                    for sj in order[k:]:
                        give_up(sessions[sj], 0, "not sent: the run's deadline passed")
                    break
                delay = due - clock()
                if delay > 0:
                    await sleep(delay)
                await _spawn(tasks, session(si, s))
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            await _cancel(tasks)

    queue = iter(range(len(sessions)))

    async def closed_worker() -> None:
        for si in queue:
            if clock() >= deadline:
                state["deadline_hit"] = True
                give_up(sessions[si], 0, "not sent: the run's deadline passed")
                for sj in queue:
                    give_up(sessions[sj], 0, "not sent: the run's deadline passed")
                return
            await session(si, sessions[si])

    if mode == "closed":
        jobs = [asyncio.ensure_future(closed_worker()) for _ in range(concurrency)]
    else:
        jobs = [asyncio.ensure_future(open_dispatcher())]
    t_end, cpu_s = await _drive(jobs, deadline_s, state, monitor, clock, tr, freeze_gc, cpu0)
    _decode(records, t_end - t0)
    for s in sessions:  # turns of sessions cut by the real-time safety net
        for n in range(s.turns):
            if s.index(n) not in timing:
                not_sent.setdefault(s.index(n), "not sent: the run's deadline passed")
    ends = [r.end_s for r in records if r.end_s is not None]
    result = LoadResult(
        mode=mode, records=records, n_requested=n_total, wall_s=max(ends, default=t_end - t0),
        deadline_s=deadline_s, deadline_hit=state["deadline_hit"],
        concurrency=concurrency if mode == "closed" else None, rate_rps=None, loop_lag_s=lag_samples,
        cpu_s=cpu_s, transport=getattr(tr, "name", type(tr).__name__),
        connections_opened=getattr(tr, "opened", None))
    return SessionRun(result, timing, not_sent)


def sessions_loop(endpoint: Endpoint | None, sessions: Sequence[SessionPlan], **kw: Any) -> SessionRun:
    """Synchronous :func:`run_sessions` on its own :func:`~kvgate.load.new_event_loop`."""
    return _run_sync(run_sessions(endpoint, sessions, **kw))
