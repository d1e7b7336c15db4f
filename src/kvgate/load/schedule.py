"""Offering load: closed loop and open loop, and the finished run (:class:`LoadResult`).

Two ways to offer load, both bounded in request count **and** total time (``deadline_s``); both
stop by themselves:

- **closed loop** (:func:`run_closed_loop`): ``concurrency`` workers, each sends its next request
  as soon as its previous one ends, until ``n`` requests were sent or the deadline passed. In
  flight never exceeds ``concurrency``.
- **open loop** (:func:`run_open_loop`): requests are sent at scheduled offsets (Poisson arrivals
  at ``rate_rps`` from a seeded :class:`numpy.random.Generator`, or an explicit schedule),
  whatever the server does. ``max_in_flight`` bounds sockets; when it is reached the schedule
  slips, which shows up as schedule lag.

Every request becomes a :class:`~kvgate.load.record.RequestRecord`; records are decoded
(:meth:`~kvgate.load.record.RequestRecord.finalize`) only after the run's clock stopped.

**Schedule lag** is ``sent_s - scheduled_s - connect_s`` (opening a TCP connection is the
server's/network's time, not the client's). A run whose client could not keep its schedule is not
evidence about the server: :meth:`LoadResult.client_kept_up` compares the p99 schedule lag and
the p99 event-loop lag (a ticker that measures how late the loop wakes up; in a closed loop this
is the only starvation signal) with a bound; :meth:`LoadResult.invalid_verdict` turns a miss
into an INVALID :class:`~kvgate.verdict.Verdict`.

Clock and sleep are injectable (``clock=``, ``sleep=``) so scheduling is unit-tested without
sleeping.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator, Sequence
from urllib.parse import urlsplit

import numpy as np

from kvgate.http.client import Endpoint
from kvgate.verdict import Status, Verdict
from kvgate.load.httpx_fallback import HttpxTransport
from kvgate.load.raw_http import RawHttpTransport, new_event_loop
from kvgate.load.record import RequestRecord, RequestSpec
from kvgate.load.transport import Clock, LoadTransport

Sleep = Callable[[float], Awaitable[Any]]

#: A reasonable bound for :meth:`LoadResult.client_kept_up`, seconds. asyncio wakes timers up to
#: ~1 ms late (epoll has millisecond resolution), so bounds below ~3 ms flag healthy runs.
DEFAULT_LAG_BOUND_S = 0.010


def make_transport(endpoint: Endpoint, **kw: Any) -> LoadTransport:
    """The raw HTTP/1.1 transport for ``http://``, httpx for anything else (``https://``)."""
    if urlsplit(endpoint.base_url).scheme == "http":
        return RawHttpTransport(endpoint, **kw)
    return HttpxTransport(endpoint, **kw)


# ----------------------------------------------------------------------------- results


def _percentile(xs: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``xs`` (seconds in, seconds out); 0.0 when empty."""
    return float(np.percentile(xs, q)) if len(xs) else 0.0


@dataclass
class LoadResult:
    """A finished run.

    ``records``: one per request that was sent (in send order); ``n_requested``: how many were
    asked for (fewer are sent when the deadline passes first: ``deadline_hit``). ``wall_s``:
    seconds from run start to the last request's end. ``loop_lag_s``: event-loop lag samples,
    seconds (how late a periodic ticker woke up). ``cpu_s``: process CPU seconds during the run
    (all threads of this process). ``transport``: which client sent the requests.
    """

    mode: str
    records: list[RequestRecord]
    n_requested: int
    wall_s: float
    deadline_s: float
    deadline_hit: bool = False
    concurrency: int | None = None
    rate_rps: float | None = None
    loop_lag_s: list[float] = field(default_factory=list, repr=False)
    cpu_s: float = 0.0
    transport: str = ""
    connections_opened: int | None = None

    @property
    def lags_s(self) -> list[float]:
        """Schedule lag of every sent request, seconds."""
        return [lag for r in self.records if (lag := r.lag_s) is not None]

    @property
    def max_lag_s(self) -> float:
        return max(self.lags_s, default=0.0)

    @property
    def p99_lag_s(self) -> float:
        return _percentile(self.lags_s, 99)

    @property
    def max_loop_lag_s(self) -> float:
        return max(self.loop_lag_s, default=0.0)

    @property
    def p99_loop_lag_s(self) -> float:
        return _percentile(self.loop_lag_s, 99)

    @property
    def chunks(self) -> int:
        """SSE events received, all requests."""
        return sum(len(r.chunk_s) for r in self.records)

    def client_kept_up(self, bound_s: float = DEFAULT_LAG_BOUND_S, q: float = 99.0) -> bool:
        """True when the ``q``-th percentile of the schedule lag **and** of the event-loop lag are
        both within ``bound_s`` seconds (``q=100`` checks the maximum), and no request missed
        its slot because the deadline passed first."""
        return max(_percentile(self.lags_s, q), _percentile(self.loop_lag_s, q)) <= bound_s

    def invalid_verdict(self, gate: str, bound_s: float = DEFAULT_LAG_BOUND_S, q: float = 99.0) -> Verdict | None:
        """An INVALID verdict when the client fell behind (see :meth:`client_kept_up`), else None."""
        if self.client_kept_up(bound_s, q):
            return None
        sched, loop = _percentile(self.lags_s, q), _percentile(self.loop_lag_s, q)
        return Verdict(
            gate, Status.INVALID,
            f"client fell behind its schedule: p{q:g} schedule lag {sched * 1e3:.1f} ms, "
            f"event-loop lag {loop * 1e3:.1f} ms > bound {bound_s * 1e3:.1f} ms -> INVALID",
            measured=f"{max(sched, loop) * 1e3:.1f} ms", limit=f"{bound_s * 1e3:.1f} ms",
            evidence={"p_schedule_lag_s": sched, "p_loop_lag_s": loop, "max_schedule_lag_s": self.max_lag_s,
                      "max_loop_lag_s": self.max_loop_lag_s, "q": q, "mode": self.mode,
                      "n_sent": len(self.records), "n_requested": self.n_requested, "cpu_s": self.cpu_s})

    def rows(self) -> list[dict[str, Any]]:
        """Per-request rows (see :meth:`RequestRecord.row`)."""
        return [r.row() for r in self.records]


# ----------------------------------------------------------------------------- scheduling


def poisson_offsets(n: int, rate_rps: float, rng: np.random.Generator | int | None = 0) -> list[float]:
    """Arrival offsets (seconds from run start) of ``n`` Poisson arrivals at ``rate_rps`` req/s.

    The first request is due at 0; gaps are exponential with mean ``1/rate_rps``. ``rng``: a
    :class:`numpy.random.Generator` or a seed (same seed -> same schedule). ``rate_rps=inf``: all
    at 0 (a burst).
    """
    if n <= 0:
        return []
    if rate_rps <= 0:
        raise ValueError("rate_rps must be > 0")
    if math.isinf(rate_rps):
        return [0.0] * n
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    gaps = gen.exponential(1.0 / rate_rps, size=n - 1)
    return [0.0] + np.cumsum(gaps).tolist()


def _specs(requests: RequestSpec | Sequence[RequestSpec], n: int | None) -> list[RequestSpec]:
    if isinstance(requests, RequestSpec):
        if n is None:
            raise ValueError("n is required with a single RequestSpec")
        return [requests] * n
    reqs = list(requests)
    if not reqs:
        raise ValueError("no requests")
    if n is None:
        return reqs
    return [reqs[i % len(reqs)] for i in range(n)]


async def _monitor(interval_s: float, out: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(interval_s)
        out.append(max(0.0, loop.time() - t - interval_s))


#: How many :func:`frozen_heap` blocks are open (runs inside one leave the heap as it froze it).
_FROZEN = {"depth": 0}


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect and :func:`gc.freeze` the heap once for runs sent one after another (the
    interference waves, the latency-SLO looks), unfrozen at the end: a ``freeze_gc`` run inside
    skips its own full collection, freeze and unfreeze, so the next batch starts at once. What
    the runs allocate meanwhile (records) is left to the collector's younger generations, which
    skip the frozen heap. A full collection of the main job's ~2 M objects took 0.2-0.4 s before
    every wave (measured: 15 waves of 6 requests on the fake, 388 ms between waves with 2 M
    objects, 47 ms with 0.1 M); with one freeze for the series, the waves follow each other.
    Nests (the outermost collects and unfreezes); main thread only, like the runs."""
    outer = _FROZEN["depth"] == 0
    if outer:
        gc.collect()
        gc.freeze()
    _FROZEN["depth"] += 1
    try:
        yield
    finally:
        _FROZEN["depth"] -= 1
        if outer:
            gc.unfreeze()


def _start(clock: Clock, transport: LoadTransport, width: int | None, freeze_gc: bool, loop_monitor_s: float | None,
           lag_samples: list[float]) -> tuple[float, float, asyncio.Future[Any] | None]:
    """Start a run's clock (the twin of :func:`_drive`'s end): collect and :func:`gc.freeze` the
    heap when ``freeze_gc`` (older objects out of the collector's way: no long gen-2 pauses
    mid-run; inside :func:`frozen_heap` it is frozen already), bind ``transport`` to the clock with
    ``width`` connections, start the loop-lag ticker (every ``loop_monitor_s`` seconds into
    ``lag_samples``; None: off). Returns ``(cpu0, t0, monitor)``: process CPU seconds and the run
    clock at the start (seconds), the ticker task."""
    if freeze_gc and not _FROZEN["depth"]:
        gc.collect()
        gc.freeze()
    cpu0 = time.process_time()
    t0 = clock()
    transport.bind(clock, t0, max(1, int(width or 1)))
    monitor = asyncio.ensure_future(_monitor(loop_monitor_s, lag_samples)) if loop_monitor_s else None
    return cpu0, t0, monitor


async def _spawn(tasks: set[asyncio.Task[Any]], coro: Awaitable[Any]) -> None:
    """Start ``coro`` as a task kept in ``tasks`` until it ends, then yield once so it writes its
    request before the dispatcher computes its next wait (open-loop dispatchers)."""
    task = asyncio.ensure_future(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    await asyncio.sleep(0)


async def _cancel(tasks: set[asyncio.Task[Any]]) -> None:
    """Cancel what is left of ``tasks`` and wait for it (a dispatcher's ``finally``)."""
    for task in list(tasks):
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


async def _drive(jobs: list[asyncio.Future[Any]], deadline_s: float, state: dict[str, bool],
                 monitor: asyncio.Future[Any] | None, clock: Clock, transport: LoadTransport, freeze_gc: bool,
                 cpu0: float) -> tuple[float, float]:
    """Await a run's ``jobs`` with a real-time safety net of ``deadline_s`` + 5 s (what is still
    pending then is cancelled and ``state["deadline_hit"]`` set; every request already carries a
    timeout within the deadline), re-raise a job's exception; then stop the loop-lag ``monitor``,
    close the transport and unfreeze the collector. Returns ``(t_end, cpu_s)``: the run clock at
    the end (seconds) and this process's CPU seconds since ``cpu0``. Shared by the closed/open
    loops and :func:`kvgate.load.sessions.run_sessions`."""
    t_end = cpu_s = 0.0
    try:
        _, pending = await asyncio.wait(jobs, timeout=deadline_s + 5.0)
        if pending:
            state["deadline_hit"] = True
            for j in pending:
                j.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for j in jobs:
            if not j.cancelled() and j.exception() is not None:
                raise j.exception()  # type: ignore[misc]
    finally:
        if monitor is not None:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
        t_end = clock()
        cpu_s = time.process_time() - cpu0
        await transport.aclose()
        if freeze_gc and not _FROZEN["depth"]:
            gc.unfreeze()
    return t_end, cpu_s


def _decode(records: Sequence[RequestRecord], end_s: float) -> None:
    """Off the hot path, once the run's clock stopped: a record still open ends at ``end_s``
    (seconds since the run start) with "not finished when the run ended"; every record's SSE and
    JSON are decoded (:meth:`RequestRecord.finalize`)."""
    for r in records:
        if r.end_s is None:
            r.end_s = end_s
            if r.error is None:
                r.error = "not finished when the run ended"
                r.censored = True  # the run's own end cut it: kvgate's bound, not the server's error
        r.finalize()


async def _run(mode: str, endpoint: Endpoint | None, requests: RequestSpec | Sequence[RequestSpec],
               n: int | None, *, concurrency: int | None, offsets: list[float] | None, rate_rps: float | None,
               max_in_flight: int, deadline_s: float, request_timeout_s: float | None, clock: Clock,
               sleep: Sleep, transport: LoadTransport | None, loop_monitor_s: float | None,
               freeze_gc: bool, idle_timeout_s: float | None = None,
               expected_e2e_s: Sequence[float] | None = None) -> LoadResult:
    specs = _specs(requests, n)
    if idle_timeout_s is not None:  # specs without their own idle timeout get the run's
        idled: dict[int, RequestSpec] = {}
        specs = [s if s.idle_timeout_s is not None else
                 idled.setdefault(id(s), dataclasses.replace(s, idle_timeout_s=idle_timeout_s)) for s in specs]
    if deadline_s <= 0:
        raise ValueError("deadline_s must be > 0")
    if transport is None:
        if endpoint is None:
            raise ValueError("endpoint or transport is required")
        transport = make_transport(endpoint)
    prepared: list[Any] = []
    cache: dict[int, Any] = {}
    for s in specs:  # serialise every body before the clock starts
        if id(s) not in cache:
            cache[id(s)] = transport.prepare(s)
        prepared.append(cache[id(s)])
    req_timeout = deadline_s if request_timeout_s is None else request_timeout_s
    width = concurrency if mode == "closed" else max_in_flight
    records: list[RequestRecord] = []
    lag_samples: list[float] = []
    state = {"deadline_hit": False}
    cpu0, t0, monitor = _start(clock, transport, width, freeze_gc, loop_monitor_s, lag_samples)
    deadline = t0 + deadline_s

    finish_rule = expected_e2e_s is not None  # opt-in: start no request that cannot finish in the time left
    finished_e2e: list[float] = [float(x) for x in (expected_e2e_s or ())]

    async def one(i: int, rec: RequestRecord) -> None:
        left = deadline - clock()
        await transport.send(prepared[i], rec, min(req_timeout, left))
        by_deadline = request_timeout_s is None or left < req_timeout  # the run's deadline was this request's bound
        if by_deadline and rec.error is not None and rec.error.startswith("timeout"):
            state["deadline_hit"] = True  # cut short by the run deadline, not by its own timeout
            rec.censored = True  # kvgate's time bound, not the server: neither ok nor an error
        elif finish_rule and rec.error is None and rec.status == 200 and rec.sent_s is not None \
                and rec.end_s is not None:
            finished_e2e.append(rec.end_s - rec.sent_s)

    def cannot_finish(now: float) -> bool:
        """A request started now would not end before the deadline: the p99 of the e2e seen so far
        (this run's finished requests and ``expected_e2e_s``) exceeds the time left. Nothing seen
        yet (a run's first wave with no prior): it starts -- the only way to learn the e2e. Only
        with ``expected_e2e_s`` given (even empty): a run that must hold its load until the
        deadline (health under load) keeps starting requests."""
        if not finish_rule or not finished_e2e:
            return False
        return float(np.percentile(finished_e2e, 99)) > deadline - now

    async def closed_worker(it: Any) -> None:
        for i in it:
            now = clock()
            if now >= deadline or cannot_finish(now):
                state["deadline_hit"] = True
                return
            rec = RequestRecord(index=i, scheduled_s=now - t0, tag=specs[i].tag)
            records.append(rec)
            await one(i, rec)

    async def open_dispatcher() -> None:
        assert offsets is not None
        sem = asyncio.Semaphore(max_in_flight)
        tasks: set[asyncio.Task[None]] = set()

        async def run_one(i: int, rec: RequestRecord) -> None:
            try:
                await one(i, rec)
            finally:
                sem.release()

        try:
            for i in range(len(specs)):
                due = t0 + offsets[i]
                delay = due - clock()
                if due >= deadline:
                    state["deadline_hit"] = True
                    break
                if delay > 0:
                    await sleep(delay)
                await sem.acquire()
                if clock() >= deadline:
                    sem.release()
                    state["deadline_hit"] = True
                    break
                rec = RequestRecord(index=i, scheduled_s=offsets[i], tag=specs[i].tag)
                records.append(rec)
                await _spawn(tasks, run_one(i, rec))
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            await _cancel(tasks)

    if mode == "closed":
        it = iter(range(len(specs)))
        jobs = [asyncio.ensure_future(closed_worker(it)) for _ in range(max(1, int(concurrency or 1)))]
    else:
        jobs = [asyncio.ensure_future(open_dispatcher())]
    t_end, cpu_s = await _drive(jobs, deadline_s, state, monitor, clock, transport, freeze_gc, cpu0)
    _decode(records, t_end - t0)
    ends = [r.end_s for r in records if r.end_s is not None]
    return LoadResult(
        mode=mode, records=records, n_requested=len(specs), wall_s=max(ends, default=t_end - t0),
        deadline_s=deadline_s, deadline_hit=state["deadline_hit"], concurrency=concurrency, rate_rps=rate_rps,
        loop_lag_s=lag_samples, cpu_s=cpu_s, transport=getattr(transport, "name", type(transport).__name__),
        connections_opened=getattr(transport, "opened", None))


async def run_closed_loop(endpoint: Endpoint | None, requests: RequestSpec | Sequence[RequestSpec], *,
                          concurrency: int, n: int | None = None, deadline_s: float = 600.0,
                          request_timeout_s: float | None = None, clock: Clock = time.perf_counter,
                          sleep: Sleep = asyncio.sleep, transport: LoadTransport | None = None,
                          loop_monitor_s: float | None = 0.005, freeze_gc: bool = True,
                          idle_timeout_s: float | None = None,
                          expected_e2e_s: Sequence[float] | None = None) -> LoadResult:
    """Closed loop: ``concurrency`` workers send ``n`` requests in total (or one per spec).

    ``requests``: one spec (repeated ``n`` times) or a sequence (cycled to ``n``). A request's
    ``scheduled_s`` is when its worker became free. ``deadline_s``: the whole run's budget,
    seconds; no request starts after it and every request times out by it.
    ``request_timeout_s``: per request, seconds (default: the deadline). ``loop_monitor_s``:
    event-loop lag ticker period, seconds (None: off). ``freeze_gc``: collect, then
    :func:`gc.freeze` the heap for the run, so no long full collection pauses the timestamps.
    ``idle_timeout_s``: cut any request silent this long, seconds (the gateway's idle timeout,
    :attr:`RequestSpec.idle_timeout_s`): it fails with an ``"idle timeout: ..."`` error, so a
    server that stalls every stream costs the run one idle timeout per request, not the stall.

    **Censoring.** A request the deadline cuts (its timeout was the time left, not
    ``request_timeout_s``) or that the run's end leaves open is ``censored``
    (:attr:`RequestRecord.censored`): kvgate's bound, not a server error. With ``expected_e2e_s``
    given (seconds, e.g. earlier batches' e2e; may be empty) a worker starts no request that
    cannot finish in the time left: the p99 of the e2e seen so far (this run's finished requests
    plus ``expected_e2e_s``) above the seconds left stops it (``deadline_hit``); with nothing seen
    yet the first wave starts. None (default): requests start until the deadline (a load that
    must last until then).
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    return await _run("closed", endpoint, requests, n, concurrency=concurrency, offsets=None, rate_rps=None,
                      max_in_flight=concurrency, deadline_s=deadline_s, request_timeout_s=request_timeout_s,
                      clock=clock, sleep=sleep, transport=transport, loop_monitor_s=loop_monitor_s,
                      freeze_gc=freeze_gc, idle_timeout_s=idle_timeout_s, expected_e2e_s=expected_e2e_s)


async def run_open_loop(endpoint: Endpoint | None, requests: RequestSpec | Sequence[RequestSpec], *,
                        rate_rps: float | None = None, n: int | None = None,
                        rng: np.random.Generator | int | None = 0, offsets_s: Sequence[float] | None = None,
                        max_in_flight: int = 512, deadline_s: float = 600.0,
                        request_timeout_s: float | None = None, clock: Clock = time.perf_counter,
                        sleep: Sleep = asyncio.sleep, transport: LoadTransport | None = None,
                        loop_monitor_s: float | None = 0.005, freeze_gc: bool = True,
                        idle_timeout_s: float | None = None) -> LoadResult:
    """Open loop: requests sent at Poisson arrivals of ``rate_rps`` req/s (seeded by ``rng``), or
    at the explicit ``offsets_s`` (seconds from run start), whatever the server does.

    ``max_in_flight``: most requests outstanding at once (sockets); when reached, the schedule
    slips and the lag shows it. Other arguments as in :func:`run_closed_loop`.
    """
    specs_n = len(_specs(requests, n))
    if offsets_s is not None:
        offs = [float(x) for x in offsets_s]
        if len(offs) < specs_n:
            raise ValueError(f"offsets_s has {len(offs)} entries for {specs_n} requests")
        offs = offs[:specs_n]
    elif rate_rps is not None:
        offs = poisson_offsets(specs_n, rate_rps, rng)
    else:
        raise ValueError("rate_rps or offsets_s is required")
    return await _run("open", endpoint, requests, n, concurrency=None, offsets=offs, rate_rps=rate_rps,
                      max_in_flight=max_in_flight, deadline_s=deadline_s, request_timeout_s=request_timeout_s,
                      clock=clock, sleep=sleep, transport=transport, loop_monitor_s=loop_monitor_s,
                      freeze_gc=freeze_gc, idle_timeout_s=idle_timeout_s)


def _run_sync(coro: Any) -> Any:
    """Run ``coro`` to completion on a fresh :func:`new_event_loop`."""
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(coro)
    loop = new_event_loop()  # pragma: no cover - Python 3.10
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def closed_loop(endpoint: Endpoint | None, requests: RequestSpec | Sequence[RequestSpec], **kw: Any) -> LoadResult:
    """Synchronous :func:`run_closed_loop` on its own :func:`new_event_loop`."""
    return _run_sync(run_closed_loop(endpoint, requests, **kw))


def open_loop(endpoint: Endpoint | None, requests: RequestSpec | Sequence[RequestSpec], **kw: Any) -> LoadResult:
    """Synchronous :func:`run_open_loop` on its own :func:`new_event_loop`."""
    return _run_sync(run_open_loop(endpoint, requests, **kw))
