"""Sample what a kubelet's probes would see while the server is under load: ``GET /health`` and
``GET /v1/models`` latency, from a bounded background thread with its own connection.

A saturated engine can answer ``/health`` so late that the liveness probe (``timeoutSeconds``,
Kubernetes' default 1 s) gives up and restarts a healthy pod (gonka PR#1421; litellm PR#12669:
"the liveness probe hangs under stress"). The health/under-load gate
(:mod:`kvgate.gates.health_load`) judges the samples taken here against the deployment's probe
timeout; :mod:`kvgate.run.health_watch` runs a sampler while each load gate saturates the server.

Each probe waits at most ``probe_wait_s`` (a bit above the probe timeout), so a slow answer is
measured, not waited for forever; one that does not come in time is a sample with ``status`` 0
and its ``latency_s`` the wait.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from kvgate.http.client import Endpoint, EndpointUnreachable, KvClient

#: Seconds between the starts of two probe rounds (each round: /health, then /v1/models). 0.25 s
#: gives ~4 samples a second per route: a 10 s load gate yields ~40, enough for a p99 that is
#: not just the max, at ~8 cheap requests a second beside the load.
INTERVAL_S = 0.25
#: The most rounds one sampler takes (bounded whatever the gate's length: 4000 x 0.25 s = 16 min).
MAX_ROUNDS = 4000
#: The routes a kubelet's probes use on a vLLM pod (KServe's vLLM runtimes probe /health; a
#: readiness probe on the model list is common too).
ROUTES = ("/health", "/v1/models")


def probe_wait_s(probe_timeout_s: float) -> float:
    """How long one sample waits for its answer, seconds: 1.5 x the probe timeout, at least 0.5 s
    more -- above the limit, so a late answer is measured as late, yet bounded."""
    return max(1.5 * probe_timeout_s, probe_timeout_s + 0.5)


@dataclass
class ProbeSample:
    """One probe: ``route`` (``/health`` or ``/v1/models``), ``t_s`` (seconds since the run's
    sampling began, monotonic), ``latency_s`` (send to full answer, seconds; the wait when none
    came), ``status`` (HTTP status; 0: no answer within the wait, or the connection failed),
    ``error`` (why there was no answer) and ``during`` (the gate whose load was running)."""

    route: str
    t_s: float
    latency_s: float
    status: int
    during: str
    error: str = ""

    def row(self) -> dict[str, Any]:
        """A CSV row (latency in ms)."""
        return {"t_s": round(self.t_s, 3), "route": self.route, "latency_ms": round(self.latency_s * 1000, 3),
                "status": self.status, "during": self.during, "error": self.error}


class HealthSampler:
    """Probe ``/health`` and the model list every ``interval_s`` seconds in a daemon thread, with
    a client of its own (``timeout_s`` = :func:`probe_wait_s`), until :meth:`stop` (or
    ``max_rounds``). ``during`` labels the samples; ``clock`` gives ``t_s`` (pass a shared one so
    samples of several samplers share a time base). ``client``: an injected client (tests); the
    sampler closes only a client it made itself."""

    def __init__(self, endpoint: Endpoint, probe_timeout_s: float, during: str, *, interval_s: float = INTERVAL_S,
                 max_rounds: int = MAX_ROUNDS, clock: Callable[[], float] = time.monotonic, t0: float | None = None,
                 client: KvClient | None = None) -> None:
        self.wait_s = probe_wait_s(probe_timeout_s)
        self.during = during
        self.interval_s = interval_s
        self.max_rounds = max_rounds
        self.clock = clock
        self.t0 = clock() if t0 is None else t0
        self._own = client is None
        self.client = client or KvClient(endpoint, timeout_s=self.wait_s)
        self.samples: list[ProbeSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvgate-health", daemon=True)

    def probe(self, route: str) -> ProbeSample:
        """One probe of ``route`` (``/v1/models`` goes through the endpoint's route prefix)."""
        path = self.client.api("/models") if route == "/v1/models" else route
        t = self.clock() - self.t0
        start = time.monotonic()
        try:
            r = self.client.get(path, timeout_s=self.wait_s)
        except EndpointUnreachable as exc:
            return ProbeSample(route, t, time.monotonic() - start, 0, self.during, str(exc)[:160])
        error = "" if r.status else f"no answer within {self.wait_s:g} s ({r.text.split(':', 1)[0]})"
        return ProbeSample(route, t, r.elapsed_s, r.status, self.during, error)

    def _loop(self) -> None:
        rounds = 0
        while not self._stop.is_set() and rounds < self.max_rounds:
            began = time.monotonic()
            for route in ROUTES:
                if self._stop.is_set():
                    break
                self.samples.append(self.probe(route))
            rounds += 1
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def start(self) -> "HealthSampler":
        self._thread.start()
        return self

    def stop(self) -> list[ProbeSample]:
        """Stop (waits for the probe in flight: at most ``wait_s`` per route), close the client, and
        return the samples."""
        self._stop.set()
        self._thread.join(timeout=2 * self.wait_s + 5.0)
        if self._own:
            self.client.close()
        return self.samples

    def __enter__(self) -> "HealthSampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["INTERVAL_S", "MAX_ROUNDS", "ROUTES", "HealthSampler", "ProbeSample", "probe_wait_s"]
