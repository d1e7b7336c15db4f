"""A worker: join the coordinator, run each batch's share from the shared start instant, ship it.

:func:`run_worker` (``kvgate worker``):

1. measures its clock against the coordinator (:func:`kvgate.scale.clock.measure`, over
   ``GET /scale/v1/clock``) and says hello (its index, host, pid, clock offset);
2. long-polls ``GET /scale/v1/batch`` for the next batch; for each:
3. takes its share (:func:`kvgate.scale.batch.assignment`), measures its clock again, waits until
   the shared start (the coordinator's instant, corrected by the offset), heartbeats every
   ``heartbeat_s`` while it waits and sends, and runs its share with kvgate's own loop
   (:func:`kvgate.load.closed_loop` / :func:`~kvgate.load.open_loop`, the raw HTTP/1.1 client) --
   its loop's first clock reading is its start, mapped onto the coordinator's wall clock;
4. measures its clock a third time, puts the global request indices on the records, and ships a
   :class:`~kvgate.scale.ship.Part` (records, lag samples, CPU, its host's load from
   :class:`~kvgate.scale.host.WorkerHostSampler`): ``POST /scale/v1/part``, or written to the
   shared volume ``ship_dir`` (the coordinator's run directory);
5. a batch marked ``overlap`` (a soak's round: its stragglers may still run when the next round
   starts, as in one process) is not run in turn but on one event loop of its own thread
   (:class:`_Overlapping`), beside the rounds before it, while the worker polls for the next: each
   round waits for its shared start there, sends its share (``freeze_gc=False``: rounds overlap;
   the heap is collected and frozen once, before the first round) and ships its part when its
   last request ends; a batch that does not overlap waits for them first;
6. exits 0 when the coordinator says done (after its rounds shipped); 1 when it cannot reach the coordinator for
   ``max_silence_s``; 2 when the coordinator refuses it (wrong N, index taken).

A batch that breaks in the worker (an exception) ships a part with ``error`` set and no records:
the verdict names it. The endpoint's API key is the worker's own (``--api-key-env``), never
received from the coordinator. Clocks, sleep, the loops and the transport are injectable
(tests/fakes/fake_scale.py injects its faults that way).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import gc
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kvgate.http.client import Endpoint
from kvgate.load.desync import ThinkTransport
from kvgate.load.record import RequestRecord, RequestSpec
from kvgate.load.raw_http import new_event_loop
from kvgate.load.schedule import LoadResult, closed_loop, make_transport, open_loop, run_closed_loop, run_open_loop
from kvgate.scale.batch import API, Assignment, Batch, assignment
from kvgate.scale.clock import ClockOffset, measure
from kvgate.scale.host import WorkerHostSampler
from kvgate.scale.ship import Part, dumps, write_part
from kvgate.scale.split import WorkerId

OK, FAILED, USAGE = 0, 1, 2


class ControlError(Exception):
    """The coordinator could not be reached or refused; ``status`` is its HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Control:
    """The coordinator's control plane over HTTP (stdlib ``urllib``; ``timeout_s`` per request)."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, body: bytes | None = None, ctype: str = "application/json",
             timeout_s: float | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + API + path, data=body, method=method,
                                     headers={"content-type": ctype} if body is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                obj = json.loads(raw) if raw else None
            except ValueError:
                obj = None
            msg = (obj or {}).get("error") if isinstance(obj, dict) else None
            raise ControlError(f"coordinator {self.url} answered {exc.code} to {method} {path}: {msg or raw[:200]!r}",
                               exc.code) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ControlError(f"coordinator {self.url}: {method} {path}: {exc}") from None

    def clock(self) -> tuple[float, float]:
        _, obj = self.call("GET", "/clock")
        return float(obj["t1"]), float(obj["t2"])

    def post_json(self, path: str, obj: Any, timeout_s: float | None = None) -> Any:
        return self.call("POST", path, json.dumps(obj).encode(), timeout_s=timeout_s)[1]


@dataclass
class WorkerOptions:
    """``coordinator`` URL; ``worker`` (k of N); ``endpoint`` (override of the announced base URL,
    e.g. the in-cluster Service of the fleet; None: the coordinator's); ``api_key`` (the worker's
    own); ``ship_dir`` (the shared volume; None: POST); ``heartbeat_s``; ``exchanges`` per clock
    reading; ``max_silence_s``: give up after this long without the coordinator."""

    coordinator: str
    worker: WorkerId
    endpoint: str | None = None
    api_key: str | None = None
    ship_dir: Path | None = None
    heartbeat_s: float = 1.0
    exchanges: int = 8
    max_silence_s: float = 120.0


class _Counting:
    """A load transport that counts the requests it sends (the heartbeat's ``sent``) and keeps the
    loop's start (``t0``, handed to :meth:`bind` when the loop's clock starts)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self.sent = 0
        self.t0: float | None = None

    def bind(self, clock: Any, t0: float, max_connections: int) -> None:
        self.t0 = t0  # the loop's start on its clock
        self.inner.bind(clock, t0, max_connections)

    def warm(self, specs: Any) -> None:
        """Prepare (serialise) every distinct spec now; :meth:`prepare` then returns it."""
        self._ready = {id(s): (s, self.inner.prepare(s)) for s in specs}

    def prepare(self, spec: Any) -> Any:
        got = getattr(self, "_ready", {}).get(id(spec))
        return got[1] if got is not None and got[0] is spec else self.inner.prepare(spec)

    async def send(self, prepared: Any, rec: RequestRecord, timeout_s: float) -> None:
        self.sent += 1
        await self.inner.send(prepared, rec, timeout_s)

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def opened(self) -> int | None:
        return getattr(self.inner, "opened", None)


class _Heartbeat:
    """POST a heartbeat every ``every_s`` seconds in a thread until stopped (errors ignored: a
    missed heartbeat is the coordinator's evidence)."""

    def __init__(self, ctl: Control, k: int, batch: int, every_s: float, sent: Callable[[], int]) -> None:
        self.ctl, self.k, self.batch, self.every_s, self.sent = ctl, k, batch, every_s, sent
        self.stop_ = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="kvgate-worker-heartbeat", daemon=True)

    def _loop(self) -> None:
        while not self.stop_.wait(self.every_s):
            try:
                self.ctl.post_json("/heartbeat", {"worker": self.k, "batch": self.batch, "sent": self.sent()},
                                   timeout_s=max(1.0, self.every_s * 2))
            except ControlError:
                continue

    def __enter__(self) -> "_Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_.set()
        self.thread.join(timeout=5)


def _thinking(batch: Batch, k: int, tr: Any) -> Any:
    """``tr`` as the batch asks it sent: a closed batch whose ``meta["think"]`` carries the one
    process's think design (``share``, ``first_s``, ``seed``; :class:`kvgate.load.desync.ThinkTransport`)
    waits the same kind of random think before every send, drawn from this worker's own stream
    (``numpy.random.default_rng([seed, k])``: the workers' phases independent, the run repeatable
    from its seed); anything else is sent as it is."""
    think = batch.meta.get("think") if batch.mode == "closed" else None
    if not think:
        return tr
    rng = np.random.default_rng([int(think["seed"]), int(k)])
    return ThinkTransport(tr, rng, share=float(think["share"]), first_s=float(think["first_s"]))


class _Overlapping:
    """The overlapping batches of a worker (a soak's rounds) on one event loop
    (:func:`kvgate.load.new_event_loop`) in a thread of its own: :meth:`submit` schedules a round
    there and returns at once; :meth:`wait` waits until every submitted round shipped its part."""

    def __init__(self, worker: "Worker") -> None:
        self.worker = worker
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kvgate-worker-rounds", daemon=True)
        self.thread.start()
        self.pending: list[concurrent.futures.Future[Any]] = []

    def submit(self, batch: Batch) -> None:
        self.pending.append(asyncio.run_coroutine_threadsafe(self.worker.round_and_ship(batch), self.loop))

    def wait(self) -> None:
        for f in self.pending:
            f.result()
        self.pending.clear()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            if not self.thread.is_alive():
                self.loop.close()


class Worker:
    """One worker process's state (see the module docstring). ``wall``: its wall clock (seconds);
    ``perf``: the loop's monotonic clock; ``sleep``; ``closed``/``opened``: the loops
    (``closed_async``/``opened_async``: their coroutines, for overlapping batches);
    ``transport``: ``endpoint -> LoadTransport`` (default the raw HTTP/1.1 client);
    ``host_sampler``: ``() -> WorkerHostSampler``; ``log``: one line per event; ``freeze_heap``:
    collect and freeze the heap before the first overlapping batch (off for workers that are threads
    of a test process, whose heap is not theirs)."""

    def __init__(self, opts: WorkerOptions, *, wall: Callable[[], float] = time.time,
                 perf: Callable[[], float] = time.perf_counter, sleep: Callable[[float], Any] = time.sleep,
                 closed: Callable[..., LoadResult] = closed_loop, opened: Callable[..., LoadResult] = open_loop,
                 closed_async: Callable[..., Any] = run_closed_loop, opened_async: Callable[..., Any] = run_open_loop,
                 transport: Callable[[Endpoint], Any] = make_transport,
                 host_sampler: Callable[[], WorkerHostSampler] = WorkerHostSampler,
                 log: Callable[[str], None] = lambda line: None, freeze_heap: bool = True) -> None:
        self.opts, self.w = opts, opts.worker
        self.wall, self.perf, self.sleep = wall, perf, sleep
        self.closed, self.opened, self.transport = closed, opened, transport
        self.closed_async, self.opened_async = closed_async, opened_async
        self.host_sampler, self.log = host_sampler, log
        self.freeze_heap = freeze_heap
        self.ctl = Control(opts.coordinator)
        self.endpoint: Endpoint | None = None
        self.last_clock: ClockOffset | None = None  # the latest clock reading (the join's, a batch's after)

    def clock(self) -> ClockOffset:
        return measure(self.ctl.clock, self.wall, self.opts.exchanges)

    def _clocked(self) -> ClockOffset:
        """:meth:`clock`, kept as the latest reading (an overlapping round starts from it)."""
        self.last_clock = self.clock()
        return self.last_clock

    def join(self) -> None:
        """Clock, hello, the endpoint. Retries an unreachable coordinator for ``max_silence_s``
        (pods start in any order); raises :class:`ControlError` when it refuses or stays away."""
        end = time.monotonic() + self.opts.max_silence_s
        while True:
            try:
                offset = self._clocked()
                reply = self.ctl.post_json("/hello", {"worker": self.w.k, "of": self.w.n, "host": socket.gethostname(),
                                                      "pid": os.getpid(), "clock": offset.to_dict()})
                break
            except ControlError as exc:
                if exc.status or time.monotonic() >= end:
                    raise
                self.sleep(0.5)
        ep = reply["endpoint"]
        self.endpoint = Endpoint(base_url=self.opts.endpoint or ep["base_url"], route_prefix=ep.get("route_prefix") or "/v1",
                                 api_key=self.opts.api_key, host_header=ep.get("host_header"))
        self.log(f"kvgate worker {self.w}: joined {self.opts.coordinator} (run {reply.get('run_id')}), clock "
                 f"{offset.text()}, loading {self.endpoint.display}")

    def next_batch(self, after: int) -> Batch | None:
        """The next batch after id ``after``; None when the coordinator says done."""
        end = time.monotonic() + self.opts.max_silence_s
        while True:
            try:
                status, obj = self.ctl.call("GET", f"/batch?worker={self.w.k}&after={after}", timeout_s=30.0)
                end = time.monotonic() + self.opts.max_silence_s
            except ControlError as exc:
                if exc.status or time.monotonic() >= end:
                    raise
                self.sleep(0.5)
                continue
            if status == 200 and obj is not None:
                return None if obj.get("done") else Batch.from_json(obj)

    def _assignment(self, batch: Batch) -> Assignment:
        """This worker's share of ``batch``, its specs given the batch's idle timeout (what the loop
        would do to each spec, done before the clock starts)."""
        a = assignment(batch, self.w)
        if batch.idle_timeout_s is not None:
            idled: dict[int, RequestSpec] = {}
            a = dataclasses.replace(a, specs=tuple(
                s if s.idle_timeout_s is not None else
                idled.setdefault(id(s), dataclasses.replace(s, idle_timeout_s=batch.idle_timeout_s)) for s in a.specs))
        return a

    def _ready(self, a: Assignment) -> tuple["_Counting | None", str | None]:
        """The transport for a share, every distinct spec serialised now (the loop's own preparation
        is then a lookup: a worker starts on time); or the error that broke it."""
        try:
            tr = _Counting(self.transport(self._endpoint()))
            tr.warm(a.specs)
            return tr, None
        except Exception as exc:  # noqa: BLE001 - the part says what broke
            return None, f"{type(exc).__name__}: {exc}"

    def _waited(self) -> None:
        """Called once the shared start instant is reached, before the loop starts (a hook: the
        fake's ``start_late`` holds the worker here)."""

    def _part(self, batch: Batch, a: Assignment, before: ClockOffset, after: ClockOffset | None, result: LoadResult,
              started_local: float, load: dict[str, Any], error: str | None) -> Part:
        for r in result.records:
            r.index = a.indices[r.index]
        return Part(self.w, batch.id, batch.start_wall, started_local + before.offset_s, before, after, len(a.indices),
                    a.concurrency, result, load, socket.gethostname(), os.getpid(), error)

    def run_share(self, batch: Batch) -> Part:
        """This worker's share of ``batch``, as a part (``error`` set when it broke)."""
        a = self._assignment(batch)
        before = self._clocked()
        tr, error = self._ready(a)
        with _Heartbeat(self.ctl, self.w.k, batch.id, self.opts.heartbeat_s, lambda: tr.sent if tr is not None else 0):
            host = self.host_sampler()
            # the loop collects and freezes the heap before its clock starts (kvgate.load.schedule._start):
            # do the costly full collection now, so the loop starts at the instant (measured: a fresh
            # worker's first loop began ~230 ms late without this, 2 cores)
            gc.collect()
            gc.freeze()
            self._wait_until(batch.start_wall - before.offset_s)
            self._waited()
            host.start()
            result, started_local = LoadResult(batch.mode, [], len(a.indices), 0.0, batch.deadline_s), self.wall()
            if error is None and tr is not None:
                try:
                    result, started_local = self._run(batch, a, tr)
                except Exception as exc:  # noqa: BLE001 - the part says what broke; the verdict names it
                    error = f"{type(exc).__name__}: {exc}"
            load = host.stop()
        try:
            after: ClockOffset | None = self._clocked()
        except ControlError:
            after = None
        return self._part(batch, a, before, after, result, started_local, load, error)

    async def run_round(self, batch: Batch) -> Part:
        """:meth:`run_share` for an overlapping batch, on the rounds' event loop
        (:class:`_Overlapping`): the wait for the shared start and the loop (``freeze_gc=False``) on
        the event loop, beside the rounds still running; the heartbeat's end and the clock reading
        after the round in threads. The reading *before* is the latest one taken (the join's, or the
        last round's after), not a new exchange: nothing between the hand-over and the start waits
        on the coordinator (measured: a fresh exchange there, answered by a coordinator busy with
        the rounds in flight, once put a worker's round 816 ms past the instant, lead 0.5 s); the
        residual of before and after still bounds the drift over the round."""
        a = self._assignment(batch)
        before = self.last_clock if self.last_clock is not None else await asyncio.to_thread(self._clocked)
        tr, error = self._ready(a)
        beat = _Heartbeat(self.ctl, self.w.k, batch.id, self.opts.heartbeat_s, lambda: tr.sent if tr is not None else 0)
        beat.__enter__()
        try:
            host = self.host_sampler()
            while (left := batch.start_wall - before.offset_s - self.wall()) > 0:
                await asyncio.sleep(min(left, 0.25))
            self._waited()
            host.start()
            result, started_local = LoadResult(batch.mode, [], len(a.indices), 0.0, batch.deadline_s), self.wall()
            if error is None and tr is not None and a.indices:
                try:
                    ref_perf, ref_wall = self.perf(), self.wall()
                    kw: dict[str, Any] = {"deadline_s": batch.deadline_s, "request_timeout_s": batch.request_timeout_s,
                                          "clock": self.perf, "transport": _thinking(batch, self.w.k, tr),
                                          "freeze_gc": False}
                    if batch.mode == "closed":
                        result = await self.closed_async(self._endpoint(), list(a.specs),
                                                         concurrency=max(1, a.concurrency), **kw)
                    else:
                        result = await self.opened_async(self._endpoint(), list(a.specs),
                                                         offsets_s=list(a.offsets_s or ()),
                                                         max_in_flight=a.max_in_flight, **kw)
                    started_local = ref_wall + ((tr.t0 if tr.t0 is not None else ref_perf) - ref_perf)
                except Exception as exc:  # noqa: BLE001 - the part says what broke; the verdict names it
                    error = f"{type(exc).__name__}: {exc}"
            load = host.stop()
        finally:
            await asyncio.to_thread(beat.__exit__, None, None, None)
        try:
            after: ClockOffset | None = await asyncio.to_thread(self._clocked)
        except ControlError:
            after = None
        return self._part(batch, a, before, after, result, started_local, load, error)

    async def round_and_ship(self, batch: Batch) -> None:
        """:meth:`run_round`, then ship its part (in a thread); a part the coordinator cannot take
        is logged (the coordinator names the worker lost)."""
        part = await self.run_round(batch)
        try:
            await asyncio.to_thread(self.ship, part)
        except ControlError as exc:
            self.log(f"kvgate worker {self.w}: {batch.label}: shipping failed: {exc}")
            return
        self._logged(batch, part)

    def _logged(self, batch: Batch, part: Part) -> None:
        self.log(f"kvgate worker {self.w}: {batch.label}: {len(part.result.records)} of {part.assigned} "
                 f"requests sent, started {part.start_offset_s * 1e3:+.1f} ms from the shared start"
                 + (f"; error: {part.error}" if part.error else ""))

    def _endpoint(self) -> Endpoint:
        assert self.endpoint is not None, "join() first"
        return self.endpoint

    def _wait_until(self, local_wall: float) -> None:
        while (left := local_wall - self.wall()) > 0:
            self.sleep(min(left, 0.25))

    def _run(self, batch: Batch, a: Assignment, tr: "_Counting") -> tuple[LoadResult, float]:
        """Run the share on transport ``tr``; returns the result and the loop's start on this
        worker's wall clock."""
        endpoint = self._endpoint()
        if not a.indices:
            return LoadResult(batch.mode, [], 0, 0.0, batch.deadline_s, concurrency=0), self.wall()
        ref_perf, ref_wall = self.perf(), self.wall()
        # the loop's own clock is self.perf (time.perf_counter): the raw client then stamps arrivals
        # when the poll returned (kvgate.load.raw_http); its start t0 comes back through bind()
        kw: dict[str, Any] = {"deadline_s": batch.deadline_s, "request_timeout_s": batch.request_timeout_s,
                              "clock": self.perf, "transport": _thinking(batch, self.w.k, tr)}
        if batch.mode == "closed":
            result = self.closed(endpoint, list(a.specs), concurrency=max(1, a.concurrency), **kw)
        else:
            result = self.opened(endpoint, list(a.specs), offsets_s=list(a.offsets_s or ()),
                                 max_in_flight=a.max_in_flight, **kw)
        t0 = tr.t0
        return result, ref_wall + ((t0 if t0 is not None else ref_perf) - ref_perf)

    def ship(self, part: Part) -> None:
        data = dumps(part)
        if self.opts.ship_dir is not None:
            write_part(self.opts.ship_dir, self.w.k, part.batch, data)
            return
        self.ctl.call("POST", f"/part?worker={self.w.k}&batch={part.batch}", data, "application/gzip", timeout_s=300.0)

    def run(self) -> int:
        """The whole life (see the module docstring); returns the exit code."""
        rounds: _Overlapping | None = None
        try:
            self.join()
            after = -1
            while (batch := self.next_batch(after)) is not None:
                after = batch.id
                if batch.overlaps:
                    if rounds is None:  # once, before the first round: rounds overlap, no loop collects later
                        if self.freeze_heap:
                            gc.collect()
                            gc.freeze()
                        rounds = _Overlapping(self)
                    rounds.submit(batch)
                    continue
                if rounds is not None:
                    rounds.wait()
                part = self.run_share(batch)
                self.ship(part)
                self._logged(batch, part)
            if rounds is not None:
                rounds.wait()
        except ControlError as exc:
            self.log(f"kvgate worker {self.w}: {exc}")
            return USAGE if exc.status in (400, 409) else FAILED
        finally:
            if rounds is not None:
                rounds.close()
        self.log(f"kvgate worker {self.w}: done")
        return OK


def run_worker(opts: WorkerOptions, **kw: Any) -> int:
    """:meth:`Worker.run` of a new :class:`Worker` (``kw``: its injectables)."""
    return Worker(opts, **kw).run()
