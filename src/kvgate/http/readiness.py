"""Ready is not serving: the seconds from the instant a server first reports ready to its first
completed generation.

Kubernetes routes traffic to a pod the moment its readiness probe passes; a server that lists its
model while its engine still refuses generations (ROCm/rocm-cli PR#150: listed in 4 s, no answer for
6 minutes; kserve#5634) turns that traffic into errors. "Ready" here is what such a probe sees:
``GET /health`` answers 200 *and* ``GET {route_prefix}/models`` lists the served model. "Serving"
is a 1-token generation (``POST {route_prefix}/completions``, ``max_tokens`` 1, temperature 0; the
chat route when the server has no completions route: 404, 405 or 501) answered 200 with a choice.
Everything else after ready -- a 503, a 500, no answer within the attempt's timeout -- is a refusal.

Who measures (:class:`Readiness` is what each leaves):

- every server kvgate starts: the embedded launcher (:meth:`kvgate.launch.local.EmbeddedServer._wait`,
  right after ``/health`` first answers 200: :func:`watch_serving`) and the docker launcher (its
  start-up loop already waits for a generation; it feeds a :class:`Recorder`). The onset of ready is
  seen: the poll before it was not ready, so the ready instant is known to within the poll interval;
- an endpoint given with ``--endpoint`` (or ``--isvc``): :func:`watch_serving` with ``launched=False``
  once the run's items are collected, before its first gate (:mod:`kvgate.run.lifecycle`). If the
  first look already finds it ready, the onset was not seen: a gap measured from there is a lower
  bound, and a server that serves at the first look shows no gap at all.

Bounded: generations are tried every ``poll_s`` seconds until one completes or ``bound_s`` seconds
after ready (:func:`watch_bound_s`); each attempt waits at most what is left of the bound.
The clock, the sleep and the transport are injected (:class:`ClientProbes` over a
:class:`kvgate.http.client.KvClient`, whose transport tests replace).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kvgate.http.client import EndpointUnreachable, KvClient

#: Seconds between looks and between generation attempts.
POLL_S = 0.25
#: A route the server does not have (the completions route -> try chat).
ABSENT = (404, 405, 501)
#: The prompt of the 1-token generation.
PROMPT = "Hello"


def watch_bound_s(limit_s: float) -> float:
    """Seconds a watch waits after ready for the first completed generation: 6 x the limit, at least
    30 s and at most 600 s -- far enough past the limit that a FAIL names how long refusals lasted,
    short enough that a server that never serves costs the run at most that."""
    return min(600.0, max(30.0, 6.0 * limit_s))


@dataclass(frozen=True)
class Look:
    """One look at readiness: ``health`` the ``/health`` status (0: no answer), ``listed`` whether
    ``/v1/models`` answered 200 with the served model in its list."""

    health: int
    listed: bool

    @property
    def ready(self) -> bool:
        return self.health == 200 and self.listed

    def words(self) -> str:
        return f"/health {self.health or 'no answer'}, model {'listed' if self.listed else 'not listed'}"


@dataclass(frozen=True)
class Attempt:
    """One generation attempt: ``served`` (200 with a choice), ``status`` (0: no answer), ``detail``
    (the refusal in a few words), ``elapsed_s`` (its own seconds)."""

    served: bool
    status: int
    detail: str
    elapsed_s: float


@dataclass
class Readiness:
    """What one watch saw (times in seconds on the watcher's monotonic clock).

    ``where``: who watched (``embedded launcher``, ``docker launcher``, ``--endpoint first look``).
    ``onset_seen``: the server was seen not ready and then ready (a launched server), so ``gap_s``
    is the whole gap; False: ready at the first look, ``gap_s`` counts from that look (a lower
    bound). ``ready``: ready was seen at all (within the bound). ``gap_s``: ready -> the first
    completed generation's answer; None: none completed within ``bound_s`` (then ``watched_s``
    seconds of refusals were seen). ``refusals``: attempts refused after ready, ``statuses`` their
    count by status (``"0"``: no answer), ``first_refusal`` the first in words. ``generation_s``:
    the serving generation's own latency. ``not_ready``: what the looks saw when ready never came."""

    where: str
    onset_seen: bool
    bound_s: float
    poll_s: float = POLL_S
    ready: bool = False
    gap_s: float | None = None
    watched_s: float = 0.0
    refusals: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    first_refusal: str | None = None
    generation_s: float | None = None
    not_ready: str | None = None
    route: str = "completions"

    @property
    def served_at_first_look(self) -> bool:
        """Ready at the first look and its first generation served: no gap can be observed."""
        return self.ready and not self.onset_seen and self.refusals == 0 and self.gap_s is not None

    def evidence(self) -> dict[str, Any]:
        """The verdict's and summary.json's form (seconds rounded to ms)."""
        r3 = (lambda v: None if v is None else round(v, 3))
        return {"where": self.where, "onset_seen": self.onset_seen, "ready": self.ready, "gap_s": r3(self.gap_s),
                "watched_s": r3(self.watched_s), "bound_s": self.bound_s, "poll_s": self.poll_s,
                "refusals": self.refusals, "refusal_statuses": dict(self.statuses),
                "first_refusal": self.first_refusal, "generation_s": r3(self.generation_s),
                "not_ready": self.not_ready, "generation_route": self.route,
                "ready_means": "/health 200 and /v1/models listing the served model",
                "serving_means": "a 1-token generation answered 200 with a choice"}


class Recorder:
    """Builds a :class:`Readiness` from events, for a watcher that runs its own loop (the docker
    launcher). ``clock``: monotonic seconds."""

    def __init__(self, where: str, *, onset_seen: bool, bound_s: float, poll_s: float = POLL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.out = Readiness(where, onset_seen, bound_s, poll_s)
        self.clock = clock
        self.ready_at: float | None = None

    def ready(self) -> None:
        """Ready seen now (only the first call counts)."""
        if self.ready_at is None:
            self.ready_at = self.clock()
            self.out.ready = True

    def attempt(self, a: Attempt) -> bool:
        """Record a generation attempt that just ended; True once one served after ready (an
        attempt before ready is not counted)."""
        if self.ready_at is None:
            return False
        now = self.clock()
        self.out.watched_s = now - self.ready_at
        if a.served:
            if self.out.gap_s is None:
                self.out.gap_s, self.out.generation_s = now - self.ready_at, a.elapsed_s
            return True
        self.out.refusals += 1
        key = str(a.status)
        self.out.statuses[key] = self.out.statuses.get(key, 0) + 1
        if self.out.first_refusal is None:
            self.out.first_refusal = a.detail
        return False

    def expired(self) -> bool:
        """Whether ``bound_s`` seconds have passed since ready."""
        return self.ready_at is not None and self.clock() - self.ready_at >= self.out.bound_s


def watch_serving(look: Callable[[], Look], generate: Callable[[float], Attempt], *, where: str, launched: bool,
                  bound_s: float, poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> Readiness:
    """Look until ready (at most ``bound_s`` seconds), then try a generation every ``poll_s``
    seconds until one serves or ``bound_s`` seconds have passed since ready.

    ``look()``: one :class:`Look`; ``generate(timeout_s)``: one :class:`Attempt`, waiting at most
    ``timeout_s``. ``launched``: the caller saw the server not ready before (a launcher whose
    ``/health`` poll just turned 200), so the ready instant is an onset; else the first look's
    readiness decides (ready at once: onset not seen). Never raises for the server's answers."""
    rec = Recorder(where, onset_seen=launched, bound_s=bound_s, poll_s=poll_s, clock=clock)
    t0 = clock()
    first = True
    while True:
        seen = look()
        if seen.ready:
            if first and not launched:
                rec.out.onset_seen = False
            elif not launched:
                rec.out.onset_seen = True  # seen not ready, then ready
            rec.ready()
            break
        rec.out.not_ready = seen.words()
        if first and not launched and seen.health in ABSENT:
            # a given endpoint with no /health (llama-cpp-python answers 404) has no ready signal to
            # time: waiting the bound for one cost every such run 30 s (2026-12-06) and measures nothing
            rec.out.not_ready += " (no readiness endpoint: nothing to time)"
            return rec.out
        first = False
        if clock() - t0 >= bound_s:
            return rec.out
        sleep(poll_s)
    rec.out.not_ready = None
    while True:
        left = bound_s - (clock() - (rec.ready_at or t0))
        if rec.attempt(generate(max(left, 1.0))):
            return rec.out
        if rec.expired():
            return rec.out
        sleep(poll_s)


class ClientProbes:
    """``look`` and ``generate`` for :func:`watch_serving` over a :class:`KvClient` (its endpoint's
    route prefix, key and Host header; its transport injectable). ``served_name``: the model the
    list must hold and the generation names. Switches to the chat route after the completions route
    answers 404, 405 or 501 (:data:`ABSENT`)."""

    def __init__(self, client: KvClient, served_name: str) -> None:
        self.client = client
        self.served_name = served_name
        self.route = "completions"

    def look(self) -> Look:
        try:
            health = self.client.get("/health", timeout_s=5.0).status
            models = self.client.get(self.client.api("/models"), timeout_s=5.0)
        except EndpointUnreachable:
            return Look(0, False)
        body = models.json
        ids = [m.get("id") for m in body.get("data") or [] if isinstance(m, dict)] \
            if models.status == 200 and isinstance(body, dict) and isinstance(body.get("data"), list) else []
        return Look(health, self.served_name in ids)

    def generate(self, timeout_s: float) -> Attempt:
        if self.route == "completions":
            path, body = "/completions", {"model": self.served_name, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
        else:
            path, body = "/chat/completions", {"model": self.served_name, "max_tokens": 1, "temperature": 0,
                                               "messages": [{"role": "user", "content": PROMPT}]}
        t0 = self.client.clock()
        try:
            r = self.client.post(self.client.api(path), body, timeout_s=timeout_s)
        except EndpointUnreachable as exc:
            return Attempt(False, 0, f"no answer ({str(exc)[:120]})", self.client.clock() - t0)
        body_in = r.json
        if r.status == 200 and isinstance(body_in, dict) and body_in.get("choices"):
            return Attempt(True, 200, "served", r.elapsed_s)
        if r.status in ABSENT and self.route == "completions":
            self.route = "chat"
        detail = (f"{r.status} ({r.error_message[:120]})" if r.status
                  else f"no answer ({r.text.splitlines()[0][:120] if r.text else 'timed out'})")
        if r.status == 200:
            detail = "200 without a choice"
        return Attempt(False, r.status, f"{self.client.api(path)}: {detail}", r.elapsed_s)


def watch_client(client: KvClient, served_name: str, *, where: str, launched: bool, bound_s: float,
                 poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> Readiness:
    """:func:`watch_serving` through ``client`` (:class:`ClientProbes`)."""
    probes = ClientProbes(client, served_name)
    out = watch_serving(probes.look, probes.generate, where=where, launched=launched, bound_s=bound_s,
                        poll_s=poll_s, clock=clock, sleep=sleep)
    out.route = probes.route
    return out


__all__ = ["ABSENT", "Attempt", "ClientProbes", "Look", "POLL_S", "Readiness", "Recorder", "watch_bound_s",
           "watch_client", "watch_serving"]
