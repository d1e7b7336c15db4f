"""The coordinator: workers join it, it publishes batches with a shared start instant, waits for
every worker's part within a deadline and merges them.

**Control plane** (JSON over HTTP, :class:`http.server.ThreadingHTTPServer`, bound to
``host:port``; port 0 picks a free one)::

    GET  /scale/v1/clock                      {"t1", "t2"}: the coordinator's wall clock on receipt and
                                              on reply (the worker's NTP-style exchange, kvgate.scale.clock)
    POST /scale/v1/hello      {worker, of, host, pid, clock}   -> {run_id, endpoint, n}; 409 wrong N / twice
    GET  /scale/v1/batch?worker=K&after=B     the next batch after id B (kvgate.scale.batch.Batch JSON),
                                              {"done": true} at the end, 204 after a long-poll of poll_s
    POST /scale/v1/heartbeat  {worker, batch, sent}            while a worker waits and sends
    POST /scale/v1/part?worker=K&batch=B      a part's gzip JSONL bytes (kvgate.scale.ship); 400 unreadable
    GET  /scale/v1/health                     200

The API key of the endpoint never goes out: :meth:`Coordinator.endpoint_json` has the URL, route
prefix and Host header only.

**Batches.** :meth:`Coordinator.closed_loop` / :meth:`Coordinator.open_loop` take the arguments of
:func:`kvgate.load.closed_loop` / :func:`kvgate.load.open_loop` (so a gate's sampling loop runs on
the workers unchanged: ``sample_latency(..., loop=coordinator.closed_loop)``): the first waits until
every worker joined (``join_timeout_s``; one that did not is ``never joined``), each publishes a
:class:`~kvgate.scale.batch.Batch` whose shared start is ``lead_s`` after now, and waits for every
worker's part until ``start + deadline_s + grace_s``. A worker is **lost** when its process is
gone (``liveness``, the local launcher's exit codes), its heartbeats stop for
``heartbeat_timeout_s`` after the start, or no part came by the deadline; the reason names which.
A soak's rounds overlap: :meth:`Coordinator.publish` then :meth:`Coordinator.collect`, one thread
per round in flight (:mod:`kvgate.scale.soak`); ids follow publication, outcomes are kept in id order.
After a loss no further batch is published (each returns an empty result, so sampling stops):
the verdict is INVALID naming the worker (:mod:`kvgate.gates.scale`), never a PASS on a partial
merge.

Everything it learns goes to its run directory (``run.json`` after every change, the parts under
``worker-KKK/``), which :func:`kvgate.scale.merge.load_run` and ``kvgate merge DIR`` read.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import parse_qs, urlsplit

from kvgate.http.client import Endpoint
from kvgate.load.record import RequestSpec
from kvgate.load.schedule import LoadResult, poisson_offsets
from kvgate.scale.batch import API, Batch
from kvgate.scale.merge import RUN_FILE, BatchOutcome, ScaleRun, merge_parts
from kvgate.scale.ship import Part, PartError, loads, part_path, write_part

#: Seconds a ``GET /batch`` waits for a batch before answering 204.
POLL_S = 2.0
#: Part bodies larger than this are refused (bytes; a batch of 10k long streams stays far below).
MAX_PART_BYTES = 1 << 30


class Coordinator:
    """See the module docstring. ``n``: workers expected; ``run_dir``: where ``run.json`` and the
    parts go (emptied of a previous run's at :meth:`start`); ``endpoint``: the one the workers load
    (announced without its key); ``advertise``: the URL workers reach it at (default
    ``http://host:port``); ``kind``: ``local`` or ``k8s`` (recorded). Times: ``wall`` (seconds,
    the shared clock; ``time.time``), ``sleep``; ``lead_s`` (shared start after publishing),
    ``join_timeout_s``, ``grace_s`` (after a batch's deadline, for shipping), ``heartbeat_timeout_s``,
    ``poll_s`` (how often waits look). ``liveness(k)``: None while worker ``k`` runs, else why not
    (``exited with SIGKILL``). ``on_event(name, data)``: called on ``hello``, ``heartbeat``,
    ``part``, ``published``, ``lost`` (tests use it to act mid-run)."""

    def __init__(self, n: int, run_dir: Path, endpoint: Endpoint, *, host: str = "127.0.0.1", port: int = 0,
                 advertise: str | None = None, kind: str = "local", wall: Callable[[], float] = time.time,
                 sleep: Callable[[float], Any] = time.sleep, lead_s: float = 0.5, join_timeout_s: float = 120.0,
                 grace_s: float = 15.0, heartbeat_timeout_s: float = 10.0, poll_s: float = 0.02,
                 long_poll_s: float = POLL_S, liveness: Callable[[int], str | None] | None = None,
                 on_event: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.n, self.run_dir, self.endpoint = int(n), Path(run_dir), endpoint
        self.host, self.port, self._advertise, self.kind = host, port, advertise, kind
        self.wall, self.sleep = wall, sleep
        self.lead_s, self.join_timeout_s, self.grace_s = lead_s, join_timeout_s, grace_s
        self.heartbeat_timeout_s, self.poll_s, self.long_poll_s = heartbeat_timeout_s, poll_s, long_poll_s
        self.liveness = liveness
        self.on_event = on_event
        self.run_id = uuid.uuid4().hex[:12]
        self.cond = threading.Condition()
        self._save_lock = threading.Lock()
        self.joined: dict[int, dict[str, Any]] = {}
        self.never_joined: dict[int, str] = {}
        self.heard: dict[int, float] = {}
        self.progress: dict[int, dict[str, Any]] = {}
        self.batches: list[Batch] = []
        self.outcomes: list[BatchOutcome] = []
        self.lost_ever: dict[int, str] = {}
        self.notes: list[str] = []
        self.done = False
        self.acked: set[int] = set()
        self._next_id = 0
        self._skipped: dict[int, list[int]] = {}  # batch id -> the workers missing when it was published
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._started_wall = 0.0

    # ------------------------------------------------------------------ life cycle
    @property
    def url(self) -> str:
        """Where workers reach the coordinator."""
        if self._advertise:
            return self._advertise.rstrip("/")
        return f"http://{self.host}:{self.port}"

    def start(self) -> "Coordinator":
        """Empty the run directory of an earlier run's files, bind, serve in a thread."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for old in [*self.run_dir.glob("worker-*"), self.run_dir / "batches", self.run_dir / RUN_FILE]:
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            elif old.exists():
                old.unlink()
        (self.run_dir / "batches").mkdir()
        self._server = ThreadingHTTPServer((self.host, self.port), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="kvgate-coordinator", daemon=True)
        self._thread.start()
        self._started_wall = self.wall()
        self._save()
        return self

    def finish(self) -> None:
        """Tell every worker there is no more work (``GET /batch`` answers done)."""
        with self.cond:
            self.done = True
            self.cond.notify_all()
        self._save()

    def drain(self, timeout_s: float = 5.0) -> set[int]:
        """After :meth:`finish`: wait up to ``timeout_s`` until every joined worker not lost has
        been told it is done (so it exits by itself, 0). Returns the ones that were not."""
        end = time.monotonic() + timeout_s
        with self.cond:
            while True:
                left = {k for k in self.joined if k not in self.lost_ever and k not in self.acked}
                if not left or time.monotonic() >= end:
                    return left
                self.cond.wait(min(0.1, max(0.0, end - time.monotonic())))

    def stop(self) -> None:
        """:meth:`finish`, then stop serving."""
        self.finish()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "Coordinator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def endpoint_json(self) -> dict[str, Any]:
        """The endpoint as announced to workers: no API key."""
        e = self.endpoint
        return {"base_url": e.base_url, "route_prefix": e.route_prefix, "host_header": e.host_header}

    # ------------------------------------------------------------------ state written to disk
    def _save(self) -> None:
        with self._save_lock:  # handler threads and the gates' threads (a soak's rounds) save alike: the state is
            with self.cond:    # read under the same lock as it is written, so a later state is never overwritten
                data = {"run_id": self.run_id, "n": self.n, "kind": self.kind, "endpoint": self.endpoint.display,
                        "started_wall": self._started_wall, "joined": {str(k): v for k, v in self.joined.items()},
                        "never_joined": {str(k): v for k, v in self.never_joined.items()}, "notes": self.notes,
                        "batches": [{**o.meta, "lost": {str(k): v for k, v in o.lost.items()}} for o in self.outcomes]}
            tmp = self.run_dir / f".{RUN_FILE}.tmp"
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(self.run_dir / RUN_FILE)

    def report(self, phase: str | None = None) -> ScaleRun:
        """What happened so far, as :func:`kvgate.scale.merge.load_run` would read it; ``phase``:
        only the batches published with that ``meta["phase"]`` (``"soak"``; None: every batch)."""
        with self.cond:
            run = ScaleRun(self.n, self.kind, dict(self.joined), dict(self.never_joined), list(self.outcomes),
                           list(self.notes), self.run_id)
        return run if phase is None else run.only(phase)

    def note(self, line: str) -> None:
        """A run-wide line for the report (how the workers were started)."""
        with self.cond:
            self.notes.append(line)
        self._save()

    def _event(self, name: str, data: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(name, data)

    # ------------------------------------------------------------------ requests (handler thread)
    def hello(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        k, n = int(body.get("worker", -1)), int(body.get("of", -1))
        with self.cond:
            if n != self.n or not 0 <= k < self.n:
                return 409, {"error": f"worker {k}/{n}: this coordinator runs {self.n} workers (0..{self.n - 1})"}
            if k in self.joined and self.joined[k].get("pid") != body.get("pid"):
                return 409, {"error": f"worker {k} already joined (pid {self.joined[k].get('pid')} on "
                                      f"{self.joined[k].get('host')})"}
            self.joined[k] = {"host": str(body.get("host", "")), "pid": body.get("pid"), "clock": body.get("clock"),
                              "joined_wall": self.wall()}
            self.never_joined.pop(k, None)
            self.heard[k] = self.wall()
            self.cond.notify_all()
        self._save()
        self._event("hello", {"worker": k})
        return 200, {"run_id": self.run_id, "n": self.n, "endpoint": self.endpoint_json()}

    def next_batch(self, k: int, after: int) -> tuple[int, dict[str, Any] | None]:
        deadline = time.monotonic() + self.long_poll_s
        with self.cond:
            self.heard[k] = self.wall()
            while True:
                for b in self.batches:
                    if b.id > after:
                        return 200, b.to_json()
                if self.done:
                    self.acked.add(k)
                    self.cond.notify_all()
                    return 200, {"done": True}
                left = deadline - time.monotonic()
                if left <= 0:
                    return 204, None
                self.cond.wait(left)

    def heartbeat(self, body: dict[str, Any]) -> None:
        k = int(body.get("worker", -1))
        with self.cond:
            self.heard[k] = self.wall()
            self.progress[k] = body
        self._event("heartbeat", body)

    def receive_part(self, k: int, batch: int, data: bytes) -> tuple[int, dict[str, Any]]:
        try:
            part = loads(data, f"worker {k}'s part of batch {batch}")
        except PartError as exc:
            return 400, {"error": str(exc)}
        if part.worker.k != k or part.batch != batch:
            return 400, {"error": f"the part is worker {part.worker.k}'s of batch {part.batch}, posted as {k}/{batch}"}
        write_part(self.run_dir, k, batch, data)
        with self.cond:
            self.heard[k] = self.wall()
            self.cond.notify_all()
        self._event("part", {"worker": k, "batch": batch})
        return 200, {"ok": True}

    # ------------------------------------------------------------------ batches (the gate's thread)
    def wait_joined(self) -> dict[int, str]:
        """Wait until every worker said hello or ``join_timeout_s`` passed; the ones that did not
        are ``never_joined`` (index -> why). Returns them."""
        end = self.wall() + self.join_timeout_s
        while True:
            with self.cond:
                missing = [k for k in range(self.n) if k not in self.joined]
                gone = {k: why for k in missing if self.liveness is not None and (why := self.liveness(k))}
            if not missing:
                return {}
            if gone or self.wall() >= end:
                with self.cond:
                    for k in missing:
                        self.never_joined[k] = gone.get(k) or (
                            f"never joined the coordinator within {self.join_timeout_s:g} s")
                self._save()
                return dict(self.never_joined)
            self.sleep(self.poll_s)

    def run_batch(self, mode: str, specs: Sequence[RequestSpec], n: int, deadline_s: float, *,
                  concurrency: int | None = None, offsets_s: Sequence[float] | None = None, max_in_flight: int = 512,
                  request_timeout_s: float | None = None, idle_timeout_s: float | None = None,
                  rate_rps: float | None = None, start_wall: float | None = None,
                  meta: dict[str, Any] | None = None) -> BatchOutcome:
        """Publish one batch, wait for every worker's part, merge (see the module docstring):
        :meth:`publish`, then :meth:`collect`."""
        if not self.outcomes and not self.never_joined:
            self.wait_joined()
        return self.collect(self.publish(mode, specs, n, deadline_s, concurrency=concurrency, offsets_s=offsets_s,
                                         max_in_flight=max_in_flight, request_timeout_s=request_timeout_s,
                                         idle_timeout_s=idle_timeout_s, rate_rps=rate_rps, start_wall=start_wall,
                                         meta=meta))

    def publish(self, mode: str, specs: Sequence[RequestSpec], n: int, deadline_s: float, *,
                concurrency: int | None = None, offsets_s: Sequence[float] | None = None, max_in_flight: int = 512,
                request_timeout_s: float | None = None, idle_timeout_s: float | None = None,
                rate_rps: float | None = None, start_wall: float | None = None,
                meta: dict[str, Any] | None = None) -> Batch:
        """Publish one batch (nothing waited for): its id is the next in publication order, taken
        with the publication under one lock, so batches published from several threads (a soak's
        overlapping rounds) reach the workers in id order. ``start_wall``: the shared start instant
        (coordinator wall clock, seconds; default ``lead_s`` after now); ``meta``: labels kept with
        the batch (``phase``, ``round``, ``overlap``: the worker runs it beside the batches before it,
        ``label``: how verdicts name it). After a loss (or a worker that never joined) the batch is
        recorded as skipped and not published: :meth:`collect` then returns its empty outcome."""
        issued = self.wall()
        with self.cond:
            batch = Batch(self._next_id, mode, list(specs), int(n),
                          issued + self.lead_s if start_wall is None else float(start_wall), float(deadline_s),
                          concurrency=concurrency, offsets_s=None if offsets_s is None else [float(x) for x in offsets_s],
                          max_in_flight=max_in_flight, request_timeout_s=request_timeout_s,
                          idle_timeout_s=idle_timeout_s, issued_wall=issued, meta={"rate_rps": rate_rps, **(meta or {})})
            self._next_id += 1
            gone = sorted({*self.never_joined, *self.lost_ever})
            if not gone:
                (self.run_dir / "batches" / f"batch-{batch.id:03d}.json").write_text(json.dumps(batch.to_json()))
                self.batches.append(batch)
                self.cond.notify_all()
            else:  # the merge can no longer be whole: send nothing more
                self._skipped[batch.id] = gone
        if not gone:
            self._event("published", {"batch": batch.id, "start_wall": batch.start_wall})
        return batch

    def collect(self, batch: Batch) -> BatchOutcome:
        """Wait for every worker's part of the published ``batch`` (or its loss), merge, record the
        outcome in id order. Safe to call from several threads at once (one per batch)."""
        meta = batch.to_json(with_specs=False)
        with self.cond:
            gone = self._skipped.pop(batch.id, None)
        if gone is not None:
            why = {k: f"not run: worker{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} missing"
                   for k in range(self.n)}
            outcome = merge_parts({**meta, "skipped": True}, {}, why)
        else:
            parts, lost = self._collect(batch)
            outcome = merge_parts(meta, parts, lost)
        with self.cond:
            self.outcomes.append(outcome)
            self.outcomes.sort(key=lambda o: o.id)
            if gone is None:
                self.lost_ever.update(outcome.lost)
        self._save()
        return outcome

    def _collect(self, batch: Batch) -> tuple[dict[int, Part], dict[int, str]]:
        parts: dict[int, Part] = {}
        lost: dict[int, str] = {}
        end = batch.start_wall + batch.deadline_s + self.grace_s
        while True:
            now = self.wall()
            for k in range(self.n):
                if k in parts or k in lost:
                    continue
                path = part_path(self.run_dir, k, batch.id)
                if path.exists():
                    try:
                        parts[k] = loads(path.read_bytes(), str(path))
                    except PartError as exc:
                        lost[k] = str(exc)
                    continue
                why = self.liveness(k) if self.liveness is not None else None
                with self.cond:
                    heard = self.heard.get(k)
                    prog = self.progress.get(k) or {}
                    sent = prog.get("sent") if prog.get("batch") == batch.id else None
                if why:
                    lost[k] = f"{why} during {batch.label}" + _heard(heard, batch, sent)
                elif heard is not None and now - max(heard, batch.start_wall) > self.heartbeat_timeout_s:
                    lost[k] = (f"no heartbeat for {now - heard:.1f} s during {batch.label} (timeout "
                               f"{self.heartbeat_timeout_s:g} s)" + _heard(heard, batch, sent))
                elif now >= end:
                    lost[k] = (f"no records within {batch.label}'s deadline ({batch.deadline_s:g} s + "
                               f"{self.grace_s:g} s to ship)" + _heard(heard, batch, sent))
                if k in lost:
                    self._event("lost", {"worker": k, "batch": batch.id, "why": lost[k]})
            if len(parts) + len(lost) >= self.n:
                return parts, lost
            self.sleep(self.poll_s)

    def closed_loop(self, endpoint: Endpoint | None, requests: RequestSpec | Sequence[RequestSpec], *,
                    concurrency: int, n: int | None = None, deadline_s: float = 600.0,
                    request_timeout_s: float | None = None, idle_timeout_s: float | None = None,
                    think: dict[str, float] | None = None, **_: Any) -> LoadResult:
        """:func:`kvgate.load.closed_loop` on the workers: ``n`` requests (``requests`` cycled) at
        ``concurrency`` in all, split (:func:`kvgate.scale.split.closed_slice`); the merged
        :class:`LoadResult` (records on the shared start's time base). ``endpoint`` is ignored: the
        workers load the coordinator's. ``think`` (``share``, ``first_s``, ``seed``): the one
        process's random think before every send (:class:`kvgate.load.desync.ThinkTransport`),
        which each worker then draws from its own seeded stream (batch ``meta["think"]``)."""
        specs, n = _specs(requests, n)
        return self.run_batch("closed", specs, n, deadline_s, concurrency=concurrency,
                              request_timeout_s=request_timeout_s, idle_timeout_s=idle_timeout_s,
                              meta={"think": dict(think)} if think else None).merged

    def open_loop(self, endpoint: Endpoint | None, requests: RequestSpec | Sequence[RequestSpec], *,
                  rate_rps: float | None = None, n: int | None = None, rng: Any = 0,
                  offsets_s: Sequence[float] | None = None, max_in_flight: int = 512, deadline_s: float = 600.0,
                  request_timeout_s: float | None = None, idle_timeout_s: float | None = None, **_: Any) -> LoadResult:
        """:func:`kvgate.load.open_loop` on the workers: the arrivals (``offsets_s``, or seeded
        Poisson at ``rate_rps`` drawn here, once, as one process would) thinned by index
        (:func:`kvgate.scale.split.open_slice`); the merged :class:`LoadResult`."""
        specs, n = _specs(requests, n)
        if offsets_s is not None:
            offs = [float(x) for x in offsets_s][:n]
            if len(offs) < n:
                raise ValueError(f"offsets_s has {len(offs)} entries for {n} requests")
        elif rate_rps is not None:
            offs = poisson_offsets(n, rate_rps, rng)
        else:
            raise ValueError("rate_rps or offsets_s is required")
        return self.run_batch("open", specs, n, deadline_s, offsets_s=offs, max_in_flight=max_in_flight,
                              request_timeout_s=request_timeout_s, idle_timeout_s=idle_timeout_s,
                              rate_rps=rate_rps).merged


def _heard(heard: float | None, batch: Batch, sent: Any) -> str:
    if heard is None:
        return ""
    at = heard - batch.start_wall
    when = f"{at:.1f} s after the shared start" if at >= 0 else f"{-at:.1f} s before the shared start"
    return f"; last heard {when}" + (f" with {sent} requests sent" if sent is not None else "")


def _specs(requests: RequestSpec | Sequence[RequestSpec], n: int | None) -> tuple[list[RequestSpec], int]:
    if isinstance(requests, RequestSpec):
        if n is None:
            raise ValueError("n is required with a single RequestSpec")
        return [requests], int(n)
    specs = list(requests)
    if not specs:
        raise ValueError("no requests")
    return specs, len(specs) if n is None else int(n)


def _handler(coord: Coordinator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the run's log is the report
            return

        def _reply(self, status: int, obj: Any = None) -> None:
            body = b"" if obj is None else json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            if body:
                self.wfile.write(body)

        def _body(self) -> bytes:
            size = int(self.headers.get("content-length") or 0)
            if size > MAX_PART_BYTES:
                raise ValueError(f"body of {size} bytes")
            return self.rfile.read(size) if size else b""

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            t1 = coord.wall()
            u = urlsplit(self.path)
            q = {k: v[-1] for k, v in parse_qs(u.query).items()}
            try:
                if u.path == f"{API}/clock":
                    self._reply(200, {"t1": t1, "t2": coord.wall()})
                elif u.path == f"{API}/batch":
                    status, obj = coord.next_batch(int(q["worker"]), int(q.get("after", -1)))
                    self._reply(status, obj)
                elif u.path == f"{API}/health":
                    self._reply(200, {"ok": True, "run_id": coord.run_id})
                else:
                    self._reply(404, {"error": f"no route {u.path}"})
            except (KeyError, ValueError) as exc:
                self._reply(400, {"error": f"{type(exc).__name__}: {exc}"})

        def do_POST(self) -> None:  # noqa: N802
            u = urlsplit(self.path)
            q = {k: v[-1] for k, v in parse_qs(u.query).items()}
            try:
                data = self._body()
                if u.path == f"{API}/hello":
                    self._reply(*coord.hello(json.loads(data or b"{}")))
                elif u.path == f"{API}/heartbeat":
                    coord.heartbeat(json.loads(data or b"{}"))
                    self._reply(HTTPStatus.NO_CONTENT)
                elif u.path == f"{API}/part":
                    self._reply(*coord.receive_part(int(q["worker"]), int(q["batch"]), data))
                else:
                    self._reply(404, {"error": f"no route {u.path}"})
            except (KeyError, ValueError) as exc:
                self._reply(400, {"error": f"{type(exc).__name__}: {exc}"})

    return Handler
