"""Health truth: after a fault-prone step a short generation canary must succeed within a deadline;
``/health`` alone proves little (vLLM's API server answers it while the engine is wedged). Used by the max-context, disconnect and load gates.

The same truth at start-up (:func:`ready_to_serving_verdict`, case ``health/ready-to-serving``): the
seconds between the endpoint reporting ready and its first completed generation, measured by
:mod:`kvgate.http.readiness`, held to ``limits.ready_to_serving_max_s``.
"""

from __future__ import annotations

from typing import Any

from kvgate.http.probes import Exchange
from kvgate.verdict import Status, Verdict
from kvgate.gates.common import FAIL, PASS, SKIP, completion_facts, server_error


def canary_verdict(ex: Exchange, deadline_s: float, after: str) -> Verdict:
    """Health truth: the canary generation answered 200 with a completion within ``deadline_s``."""
    gate = "health/canary"
    r = ex.reply
    usage, _, problem = completion_facts(ex) if r.status == 200 else (None, None, None)
    ev = {"canary": ex.evidence(), "after": after}
    if r.status != 200 or problem or r.elapsed_s > deadline_s or not usage or not usage.get("completion_tokens"):
        why = problem or (f"answered {r.status} ({server_error(r, 120)})" if r.status != 200
                          else f"took {r.elapsed_s:.2f} s" if r.elapsed_s > deadline_s else "produced no tokens")
        if r.status != 200:
            seen: dict = {"measured": r.status, "limit": 200, "unit": "HTTP status"}
        elif r.elapsed_s > deadline_s:
            seen = {"measured": round(r.elapsed_s, 3), "limit": deadline_s, "unit": "s"}
        else:
            seen = {"measured": why, "limit": "a completion with tokens"}
        return Verdict(gate, FAIL, f"after {after} a {ex.body.get('max_tokens')}-token canary generation {why}; "
                       f"must succeed within {deadline_s:g} s -> FAIL (server unhealthy, whatever /health says)",
                       evidence=ev, **seen)
    return Verdict(gate, PASS, f"canary generation 200 in {r.elapsed_s:.2f} s after {after} -> PASS",
                   measured=round(r.elapsed_s, 3), limit=deadline_s, unit="s", evidence=ev)


#: The ready-to-serving case's gate id.
READY_GATE = "health/ready-to-serving"
#: What kvgate's own look takes for ready (a probe without ``--isvc``).
OWN_LOOK = "kvgate's readiness look (GET /health 200 and GET /v1/models listing the model, every 0.25 s)"


def ready_to_serving_verdict(obs: Any, limit_s: float, limit_where: str, *, probe: Any = None,
                             missing: str = "no readiness was observed in this run") -> Verdict:
    """Health truth at start-up: the seconds from the endpoint reporting ready to its first
    completed generation, against ``limit_s`` (``limits.ready_to_serving_max_s``).

    ``obs``: a :class:`kvgate.http.readiness.Readiness` (or None: SKIP with ``missing``, the
    reason none was taken). ``probe``: the InferenceService's readiness probe
    (:class:`kvgate.launch.kserve.ReadinessProbe`, anything with ``words()`` and ``evidence()``),
    named in the message and evidence; None: kvgate's own look (:data:`OWN_LOOK`).

    - the onset of ready seen (a server kvgate started; an endpoint not ready at the first look)
      and a generation served within the limit -> PASS, measured the gap [s];
    - refusals (or no answer) for longer than the limit after ready -- also counted from the
      first look when ready came before it (then the gap is at least that) -- or none served
      within the watch's bound -> FAIL, measured the gap (or the seconds watched);
    - ready before the first look and refused there, but served within the limit -> INCONCLUSIVE:
      the gap is at least that and its start was not seen (it straddles the limit);
    - ready before the first look and its first generation served: the gap is not observable (no
      refusal, no onset) -> SKIP; ready never seen (``/health`` not 200 or the model not listed
      within the bound) -> SKIP, saying what the looks saw.
    """
    gate = READY_GATE
    probe_words = probe.words() if probe is not None else OWN_LOOK
    lim = f"limit {limit_s:g} s ({limit_where})"
    if obs is None:
        return Verdict(gate, SKIP, f"ready -> serving not measured: {missing} -> SKIP", limit=limit_s, unit="s",
                       evidence={"probe": probe.evidence() if probe is not None else OWN_LOOK})
    ev = {"readiness": obs.evidence(), "probe": probe.evidence() if probe is not None else OWN_LOOK,
          "limit_where": limit_where}
    if not obs.ready:
        return Verdict(gate, SKIP, f"ready -> serving not observable: the endpoint never reported ready to "
                       f"{obs.where} within {obs.bound_s:g} s (last look: {obs.not_ready}); {lim} -> SKIP",
                       limit=limit_s, unit="s", evidence=ev)
    if obs.served_at_first_look:
        return Verdict(gate, SKIP, f"ready -> serving not observable: the endpoint already served at {obs.where} "
                       f"(ready, and its first 1-token generation answered in {obs.generation_s:.2f} s: 0 refusals); "
                       "its onset of ready came before kvgate looked -- measured on a server kvgate starts, or with "
                       f"--endpoint pointed at one while it starts; {lim}; probe: {probe_words} -> SKIP", limit=limit_s,
                       unit="s", evidence=ev)
    refused = _refusals(obs)
    from_where = "after its onset of ready" if obs.onset_seen else \
        f"from {obs.where} (ready before it: the onset was not seen, the gap is at least this)"
    if obs.gap_s is None:
        return Verdict(gate, FAIL, f"the endpoint reported ready while generations were refused for {obs.watched_s:.1f} s "
                       f"{from_where}, none served by the watch's bound ({obs.bound_s:g} s; {refused}); {lim}; probe: "
                       f"{probe_words} -> FAIL (Kubernetes routes traffic the moment the readiness probe passes)",
                       measured=round(obs.watched_s, 3), limit=limit_s, unit="s", evidence=ev, cause=_cause(obs))
    if obs.gap_s > limit_s:
        return Verdict(gate, FAIL, f"the endpoint reported ready while generations were refused for {obs.gap_s:.2f} s "
                       f"{from_where} before the first served ({refused}); {lim}; probe: {probe_words} -> FAIL "
                       "(Kubernetes routes traffic the moment the readiness probe passes)",
                       measured=round(obs.gap_s, 3), limit=limit_s, unit="s", evidence=ev, cause=_cause(obs))
    if not obs.onset_seen:
        return Verdict(gate, Status.INCONCLUSIVE, f"generations were refused for {obs.gap_s:.2f} s from {obs.where} "
                       f"({refused}), the endpoint ready before it: the gap is at least {obs.gap_s:.2f} s and its start "
                       f"was not seen, so it straddles the {lim}; probe: {probe_words} -> INCONCLUSIVE",
                       measured=round(obs.gap_s, 3), limit=limit_s, unit="s", evidence=ev, cause=_cause(obs))
    return Verdict(gate, PASS, f"ready -> serving {obs.gap_s:.2f} s: the first 1-token generation answered "
                   f"{obs.gap_s:.2f} s after {obs.where} saw ready (onset seen to within {obs.poll_s:g} s; {refused}); "
                   f"{lim}; probe: {probe_words} -> PASS", measured=round(obs.gap_s, 3), limit=limit_s, unit="s",
                   evidence=ev)


def _refusals(obs: Any) -> str:
    """``"3 refusals: 503 x 3; first: /completions: 503 (...)"``, or ``"0 refusals"``."""
    if not obs.refusals:
        return "0 refusals"
    counts = ", ".join(f"{'no answer' if k == '0' else k} x {n}" for k, n in sorted(obs.statuses.items()))
    return f"{obs.refusals} refusal{'s' if obs.refusals != 1 else ''}: {counts}; first: {obs.first_refusal}"


def _cause(obs: Any) -> str | None:
    """The refusals' most likely cause, from what the server answered after ready."""
    if not obs.refusals:
        return None
    if all(k == "0" for k in obs.statuses):
        return ("readiness ahead of the engine: /health and /v1/models answer from the API server while generations "
                "get no answer (the engine still loading or warming up)")
    if "503" in obs.statuses:
        return ("readiness ahead of the engine: /health and /v1/models answer 200 while generations are refused 503 "
                "(the server says it is not ready to serve); the readiness probe should exercise a generation")
    return ("readiness ahead of the engine: /health and /v1/models answer 200 while generations fail "
            f"({', '.join(sorted(obs.statuses))}); the readiness probe does not exercise the engine")
