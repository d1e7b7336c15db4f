"""The engine's condition, one record per run, shared by everything that sends: :class:`EngineWatch`.

A hung engine behind a healthy ``/health`` (a deadlocked tensor-parallel worker: vllm PR#36451,
"/health returns 200 even when EngineCore's busy loop is completely frozen"; gonka PR#1421) makes
every request wait out its timeout; a server that stalls streams makes every stream wait out the
gateway's idle timeout. Without a shared record each gate pays that again (measured with a proxy
that holds every generation after the 60th: 12 FAILs and still going after 9 min at a 120 s
request timeout). The rule, with its numbers (profile ``limits``):

- **Suspect.** A request passes its deadline (no complete answer within its timeout --
  ``request_timeout_s`` by default, the canary's ``canary_deadline_s``, a probe's own deadline;
  or a stream silent for ``stream_idle_timeout_s`` before its first event) -> **check once**:
  ``GET /health`` (:data:`HEALTH_TIMEOUT_S`) and a 4-token *streamed* canary generation
  (``POST <prefix>/completions``, ``max_tokens`` 4, ``stream``) judged on its **first token**
  within ``canary_deadline_s``. Suspects that arrive while a check runs share its outcome (one
  check answers every request that timed out before it started), so a wave of timed-out load
  requests costs one check, not one each.
- **Not hung.** The canary shows progress within ``canary_deadline_s`` -- its first token chunk
  (any ``data:`` line; SSE comments such as ``: ping`` are not progress, a gateway sends those),
  or any HTTP answer other than 200 (a failing server answers; the gates' verdicts name it): the
  engine is making progress; the slow request was slow, nothing is classified (the check is kept
  in :attr:`EngineWatch.checks`). An engine that recovers within the canary deadline is not hung.
  Progress is a token, not a complete answer: a server that pauses every generation mid-way (a
  stalling-streams server, which delays non-streamed replies the same) answers the first token
  at once and is *not* hung -- it is classified stalling streams below, or its slow requests FAIL
  the gates that judge them; a complete 4-token answer would have charged it the whole pause and
  called it hung whenever the pause reached the canary deadline.
- **Hung.** The canary gets no token within ``canary_deadline_s`` (200 headers and then silence
  is what a frozen EngineCore gives: vLLM's API server sends the headers itself) while
  ``/health`` answers 200:
  the engine is classified HUNG **once** (:class:`Hang`: the gate, the request, how long it
  waited, what ``/health`` said, ``vllm:num_requests_running`` / ``waiting`` from ``/metrics``
  when readable). From then on every send through :class:`~kvgate.http.client.KvClient` or the
  load client returns at once without touching the network (``not sent: engine hung since
  <gate> (...)``), in-flight load requests are cut (:meth:`EngineWatch.on_hang`), and the run
  records every later live gate as FAIL with that one reason without running it. A ``/health``
  that does not answer 200 is a dead server, not a hidden hang: not classified here (the gates'
  own verdicts name it).
- **Gone.** A request that gets no connection at all (connection refused or reset before an
  answer) while the run is under way -> ``GET /health`` once: when that gets no connection either,
  the server is classified GONE **once** (:class:`Gone`: the process died or the endpoint went
  away), and everything the hang rule does follows (nothing more sent, in-flight load cut, later
  live gates FAIL with the one reason) -- one reason instead of one harness error per gate. A
  ``/health`` that answers means the refusal was the request's own: nothing is classified.
- **Bound.** A hung engine costs the run the first request's timeout plus one check:
  ``request_timeout_s + HEALTH_TIMEOUT_S + canary_deadline_s`` (under ``2 x request_timeout_s``
  when ``canary_deadline_s <= request_timeout_s - 2``), not one timeout per gate.
- **Stalling streams.** A single probe's stream that stays silent for ``stream_idle_timeout_s``
  after its first event is cut there (as the gateway in front and the load client cut it), and
  the first such cut classifies the server as STALLING streams (:class:`Stall`: gate, request,
  events before the pause, seconds of silence). Later *streamed* sends are refused at once naming
  that cause (``not sent: the server stalls streams since <gate> (...)``); non-streamed requests
  still go. A stalling server costs the run one idle timeout per stream in flight when it is
  first seen, not one per stream sent. The run passes no idle timeout in ``--gate-mode=record``
  (calibration measures the whole gap for the overlay; each wait is bounded by the request timeout).

Thread-safe: the load client's event loop, the gates' threads and the checker may call at once;
one check runs at a time and a suspect that arrives while one runs waits for its outcome. The
transport (``httpx.BaseTransport``) and clock are injectable, so unit tests never sleep.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from kvgate.http.metrics import scrape_value

Clock = Callable[[], float]

#: Seconds ``GET /health`` may take in a check (vLLM answers it from the API server in ~2 ms,
#: measured on the embedded server: p50 1.7 ms, max 3.7 ms with 16 long requests running).
HEALTH_TIMEOUT_S = 2.0
#: Seconds the ``/metrics`` scrape of a check may take.
METRICS_TIMEOUT_S = 2.0
CANARY_PROMPT = "kv cache canary"
CANARY_MAX_TOKENS = 4


@dataclass(frozen=True)
class Hang:
    """The engine was classified hung: ``gate`` (test id) where, ``request`` (``POST /v1/...``)
    that passed its deadline after ``waited_s`` seconds, ``health`` what ``GET /health`` said,
    ``canary`` what the check's canary got (``no token within 3 s (ReadTimeout)``), ``running`` /
    ``waiting`` the scheduler gauges (None when ``/metrics`` could not be read), ``at_s`` when
    (watch clock)."""

    gate: str
    request: str
    waited_s: float
    health: str
    canary: str
    running: float | None
    waiting: float | None
    at_s: float
    condition = "hung"

    def reason(self) -> str:
        """The one reason every later refusal and gate names."""
        gauges = ("scheduler gauges unreadable" if self.running is None and self.waiting is None else
                  f"running {_num(self.running)}, waiting {_num(self.waiting)}")
        return (f"engine hung since {self.gate} ({self.request} got no answer in {self.waited_s:.1f} s; a "
                f"{CANARY_MAX_TOKENS}-token canary then got {self.canary} while /health answered {self.health}; "
                f"{gauges})")

    def evidence(self) -> dict[str, Any]:
        return {"gate": self.gate, "request": self.request, "waited_s": round(self.waited_s, 3),
                "health": self.health, "canary": self.canary, "num_requests_running": self.running,
                "num_requests_waiting": self.waiting}


@dataclass(frozen=True)
class Gone:
    """The server was classified gone: ``gate`` (test id) where, ``request`` that got no
    connection, ``detail`` what the connection got (``ConnectError: [Errno 111] Connection
    refused``), ``health`` what ``GET /health`` got then, ``at_s`` when (watch clock)."""

    gate: str
    request: str
    detail: str
    health: str
    at_s: float
    condition = "gone"

    def reason(self) -> str:
        """The one reason every later refusal and gate names."""
        return (f"server gone since {self.gate} ({self.request}: {self.detail}; GET /health then got {self.health}: "
                "the server process died or the endpoint went away)")

    def evidence(self) -> dict[str, Any]:
        return {"gate": self.gate, "request": self.request, "connection": self.detail, "health": self.health}


@dataclass(frozen=True)
class Stall:
    """The server was classified as stalling streams: ``gate`` where, ``request``, ``events``
    received before the pause, ``silence_s`` seconds of silence when it was cut, ``idle_timeout_s``."""

    gate: str
    request: str
    events: int
    silence_s: float
    idle_timeout_s: float
    condition = "stalling-streams"

    def reason(self) -> str:
        return (f"the server stalls streams since {self.gate} ({self.request}: silent for {self.silence_s:.3g} s "
                f"after {self.events} events; the gateway would cut it at its idle timeout {self.idle_timeout_s:g} s)")

    def evidence(self) -> dict[str, Any]:
        return {"gate": self.gate, "request": self.request, "events_before_pause": self.events,
                "silence_s": round(self.silence_s, 3), "idle_timeout_s": self.idle_timeout_s}


def _num(v: float | None) -> str:
    return "?" if v is None else f"{v:g}"


@dataclass
class EngineWatch:
    """The run-wide record of the engine's condition (see the module docstring for the rule).

    ``model``: the served model name the canary asks for. ``canary_deadline_s``,
    ``stream_idle_timeout_s``: the profile's ``limits``. ``transport``/``clock``: injectable.
    ``gate``: the test id of the gate now running (the run sets it). ``base_url``,
    ``route_prefix``, ``headers``: where the checks go (:meth:`bind`, from the endpoint)."""

    model: str
    canary_deadline_s: float = 30.0
    stream_idle_timeout_s: float | None = None
    health_timeout_s: float = HEALTH_TIMEOUT_S
    transport: httpx.BaseTransport | None = field(default=None, repr=False)
    clock: Clock = field(default=time.monotonic, repr=False)
    gate: str = "start-up"
    base_url: str | None = None
    route_prefix: str = "/v1"
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    #: The engine hung (:class:`Hang`) or the server gone (:class:`Gone`): either ends the run's sending.
    hung: Hang | Gone | None = None
    stalling: Stall | None = None
    #: Checks made that found the engine answering: ``{"gate", "request", "waited_s", "canary_s"}``.
    checks: list[dict[str, Any]] = field(default_factory=list)
    #: The run is stopping the server itself (the drain gate's SIGTERM): refused connections are expected, not "gone".
    exit_expected: bool = False
    #: Sends refused, per gate: ``{gate: count}``.
    refused: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _hooks: list[Callable[[str], None]] = field(default_factory=list, repr=False)
    _checking: threading.Lock = field(default_factory=threading.Lock, repr=False)  # one check at a time
    _finished: int = field(default=0, repr=False)  # checks finished (a suspect shares a later one's outcome)

    def bind(self, base_url: str, route_prefix: str, headers: dict[str, str]) -> "EngineWatch":
        """Point the checks at the endpoint (its root, OpenAI prefix and auth headers)."""
        self.base_url, self.route_prefix, self.headers = base_url.rstrip("/"), route_prefix, dict(headers)
        return self

    # ------------------------------------------------------------------ refusals
    def refusal(self, stream: bool) -> str | None:
        """``not sent: <reason>`` when a send must not go (engine hung; or a streamed send to a
        server that stalls streams), else None. Counts the refusal against the current gate."""
        cause = self.hung or (self.stalling if stream else None)
        if cause is None:
            return None
        with self._lock:
            self.refused[self.gate] = self.refused.get(self.gate, 0) + 1
        return f"not sent: {cause.reason()}"

    def cause(self) -> Hang | Gone | Stall | None:
        """What was classified: the hang, else the stall, else None."""
        return self.hung or self.stalling

    # ------------------------------------------------------------------ hooks
    def on_hang(self, fn: Callable[[str], None]) -> Callable[[], None]:
        """Call ``fn(reason)`` once when the engine is classified hung (at once if it already is;
        from whatever thread classifies it). Returns a function that unregisters it."""
        with self._lock:
            hung = self.hung
            if hung is None:
                self._hooks.append(fn)
        if hung is not None:
            fn(hung.reason())

        def remove() -> None:
            with self._lock:
                if fn in self._hooks:
                    self._hooks.remove(fn)
        return remove

    # ------------------------------------------------------------------ classification
    def stalled(self, request: str, events: int, silence_s: float) -> Stall:
        """A stream was cut after ``events`` events and ``silence_s`` seconds of silence; the first
        classifies the server as stalling streams. Returns the (first) :class:`Stall`."""
        with self._lock:
            if self.stalling is None:
                self.stalling = Stall(self.gate, request, events, silence_s, self.stream_idle_timeout_s or silence_s)
            return self.stalling

    def suspect(self, request: str, waited_s: float) -> Hang | None:
        """``request`` (``POST /v1/completions``) passed its deadline after ``waited_s`` s: check
        the engine once (``/health``, a streamed canary's first token within ``canary_deadline_s``)
        unless it is already classified, or a check that finishes after this call began found the
        engine answering (then that outcome is shared: no second check). Returns the :class:`Hang`,
        or None when the engine answered. Never raises."""
        if self.hung is not None or self.base_url is None:
            return self.hung
        gate = self.gate
        with self._lock:
            seen = self._finished
        with self._checking:
            if self.hung is not None:
                return self.hung
            if self._finished > seen:  # a check that finished after this request timed out found it answering
                return None
            try:
                health, canary_s, canary, (running, waiting) = self._check()
            finally:
                with self._lock:
                    self._finished += 1
            if canary_s is not None:  # the engine answered: slow, not hung
                self.checks.append({"gate": gate, "request": request, "waited_s": round(waited_s, 3),
                                    "health": health, "canary_s": round(canary_s, 3)})
                return None
            if health != "200":
                return None  # a dead or failing server: the gates' verdicts say so; not a hidden hang
            hooks = self._classify(Hang(gate, request, waited_s, health, canary, running, waiting, self.clock()))
        return self._notify(hooks)

    def unreachable(self, request: str, detail: str) -> Gone | None:
        """``request`` got no connection (``detail``: what it got): ask ``GET /health`` once; no
        connection there either classifies the server :class:`Gone` (once; the hang hooks run).
        Returns the classification (hung or gone), or None when ``/health`` answered (the refusal
        was the request's own) or the watch is not bound. Never raises."""
        if self.hung is not None or self.base_url is None:
            return self.hung
        if self.exit_expected:
            return None  # the run stopped the server itself (the drain gate): a refusal is what it measures
        gate = self.gate
        with self._checking:
            if self.hung is not None:
                return self.hung
            try:
                with self._client() as c:
                    health = f"HTTP {c.get('/health', timeout=self.health_timeout_s).status_code}"
            except httpx.HTTPError as exc:
                health = f"no answer ({type(exc).__name__})"
            if health.startswith("HTTP "):
                return None
            hooks = self._classify(Gone(gate, request, detail, health, self.clock()))
        return self._notify(hooks)

    def _classify(self, down: Hang | Gone) -> list[Callable[[str], None]]:
        """Record ``down`` as the run's one classification; hand back the hooks to call (outside
        the check's lock: :meth:`_notify`)."""
        with self._lock:
            self.hung = down
            hooks, self._hooks = self._hooks, []
        return hooks

    def _notify(self, hooks: list[Callable[[str], None]]) -> Hang | Gone:
        """Call each :meth:`on_hang` hook with the classification's reason; return it."""
        down = self.hung
        assert down is not None
        for fn in hooks:
            try:
                fn(down.reason())
            except Exception:  # a hook of a finished run: nothing left to cut
                pass
        return down

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url or "", headers=self.headers, transport=self.transport)

    def _check(self) -> tuple[str, float | None, str, tuple[float | None, float | None]]:
        """``(health, canary seconds or None, what the canary got, (running, waiting))``. The
        canary runs on a worker thread; when it has not answered within half its deadline the
        scheduler gauges are scraped while it is still held (a hang shows as requests running or
        waiting that never finish), else they are not scraped at all."""
        with self._client() as c:
            try:
                r = c.get("/health", timeout=self.health_timeout_s)
                health = str(r.status_code)
            except httpx.HTTPError as exc:
                health = f"nothing ({type(exc).__name__})"
            timeout = httpx.Timeout(self.canary_deadline_s, connect=min(10.0, self.canary_deadline_s))
            t0 = self.clock()
            gauges: tuple[float | None, float | None] = (None, None)
            with ThreadPoolExecutor(1, thread_name_prefix="kvgate-watch") as pool:
                fut = pool.submit(self._canary, c, timeout)
                try:
                    fut.result(timeout=self.canary_deadline_s / 2)
                except FutureTimeout:
                    gauges = self._gauges()  # while the canary is held
                except httpx.HTTPError:
                    pass
                try:
                    got = fut.result()
                except httpx.HTTPError as exc:
                    if gauges == (None, None):
                        gauges = self._gauges()
                    return (health, None, f"no token within {self.canary_deadline_s:g} s ({type(exc).__name__})",
                            gauges)
            took = self.clock() - t0
            if took > self.canary_deadline_s:
                return (health, None, f"its first token only after {took:.1f} s (deadline {self.canary_deadline_s:g} s)",
                        gauges if gauges != (None, None) else self._gauges())
            return health, took, f"{got} in {took:.2f} s", gauges

    def _canary(self, c: httpx.Client, timeout: httpx.Timeout) -> str:
        """Send the streamed canary and stop at its first sign of progress: ``"HTTP 200, first
        token"``; ``"HTTP <status>"`` for any other answer; ``"HTTP 200, ended without a token"``
        when the server closed the stream (an answer too: a frozen engine ends nothing). Raises
        ``httpx.HTTPError`` (the read timeout: no token within the deadline). The deadline is a
        total one: a gateway's keep-alive comments (``: ping`` every few seconds) reset the read
        timeout, so without it a hung engine behind such a gateway kept the check -- and every
        request waiting on it -- open for ever."""
        body = {"model": self.model, "prompt": CANARY_PROMPT, "max_tokens": CANARY_MAX_TOKENS, "temperature": 0,
                "stream": True}
        t0 = self.clock()
        with c.stream("POST", self.route_prefix.rstrip("/") + "/completions", json=body, timeout=timeout) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}"
            for line in r.iter_lines():
                if line.strip() and not line.startswith(":"):  # an SSE comment is a gateway's, not a token
                    return "HTTP 200, first token"
                if self.clock() - t0 >= self.canary_deadline_s:
                    raise httpx.ReadTimeout(f"only SSE comments for {self.canary_deadline_s:g} s")
        return "HTTP 200, ended without a token"

    def _gauges(self) -> tuple[float | None, float | None]:
        try:
            with self._client() as c:
                r = c.get("/metrics", timeout=METRICS_TIMEOUT_S)
            text = r.text if r.status_code == 200 else None
        except httpx.HTTPError:
            text = None
        return scrape_value(text, "running"), scrape_value(text, "waiting")

    # ------------------------------------------------------------------ reports
    def summary(self) -> dict[str, Any] | None:
        """summary.json's ``engine`` entry: ``{"condition": "hung"|"gone"|"stalling-streams", "reason",
        "gate", "evidence", "refused"}``, or None when nothing was classified."""
        cause = self.cause()
        if cause is None:
            return None
        return {"condition": cause.condition, "reason": cause.reason(),
                "gate": cause.gate, "evidence": cause.evidence(), "refused": dict(self.refused),
                "checks_answered": list(self.checks)}
