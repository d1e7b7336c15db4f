"""Gate ``disconnect``: a client hanging up mid-stream, before the first token or mid-request frees
its slot (``vllm:num_requests_running`` back to baseline) well before the request would have ended
on its own, and a canary generates after. Asserted by ``suites/test_disconnect.py``; observations
from :func:`kvgate.http.probes.disconnect`.
"""

from __future__ import annotations

from typing import Any

from kvgate.verdict import Status, Verdict
from kvgate.gates.common import FAIL, PASS, SKIP
from kvgate.gates.health import canary_verdict
from kvgate.gates.streaming import BUFFERING_FIX, delivery




def disconnect_verdict(obs: Any, deadline_s: float) -> Verdict:
    """After a client hangs up, ``vllm:num_requests_running`` returns to its baseline in time and a
    canary still generates.

    The limit is ``min(deadline_s, natural_s / 2)``: a server that ignores the hang-up and simply
    finishes the request must not pass, so the slot has to be freed well before the request would
    have ended on its own (``natural_s``, estimated from the measured decode rate). When the
    request was not actually cut (it finished first) the verdict is INVALID. Without ``/metrics``
    the release is not observable at all: SKIP (before any INVALID: no measurement could have
    been trusted), unless the canary fails. When the decode-rate probe's
    stream was buffered (:attr:`kvgate.gates.streaming.Delivery.buffered`: a proxy in front held its
    SSE bytes) the verdict is INVALID naming the buffering: the client's arrival times then time the
    proxy's flushes, not the decoding, so a release cannot be told from completion -- the hang-up
    itself was never judged, so it is not a FAIL; ``streaming/buffering`` FAILs for the proxy.
    """
    gate = f"disconnect/{obs.case}"
    can = canary_verdict(obs.canary, deadline_s, after=f"a client disconnect ({obs.case})")
    limit = min(deadline_s, obs.natural_s / 2) if obs.natural_s is not None else deadline_s
    rate = getattr(obs, "rate", None)
    ev = {"baseline_running": obs.baseline, "samples": getattr(obs.poll, "samples", None), "canary": can.to_dict(),
          "hung_up": obs.hung.evidence(), "hang_up_after_s": round(obs.hangup_s, 4),
          "natural_remaining_s": obs.natural_s, "limit_s": limit,
          "decode_rate": rate.evidence() if rate is not None else None}
    if can.status is FAIL:
        return Verdict(gate, FAIL, can.message, measured=can.measured, limit=can.limit, unit=can.unit,
                       limit_unit=can.limit_unit, evidence=ev)
    if obs.baseline is None or obs.poll is None:
        return Verdict(gate, SKIP, "server exposes no vllm:num_requests_running (no /metrics, or no such series); slot release not observable "
                       "(canary after disconnect succeeded)", evidence=ev)
    probe = delivery(rate.reply) if rate is not None and rate.reply is not None else None
    if probe is not None and probe.buffered:
        ev["decode_rate_delivery"] = probe.evidence()
        return Verdict(gate, Status.INVALID, f"the decode-rate probe's stream was buffered: {probe.burst()} "
                       f"(a proxy in front holds the SSE bytes; {BUFFERING_FIX}); the client's arrival times time "
                       f"the proxy's flushes, not the decoding, so a slot release cannot be told from the request "
                       f"finishing on its own ({obs.case})", measured=round(probe.held_s, 4), unit="s", evidence=ev)
    if not obs.cut:
        return Verdict(gate, Status.INVALID, f"the request finished before the client hung up ({obs.case}); "
                       "nothing was disconnected, so nothing was measured", evidence=ev)
    if obs.natural_s is None:
        why = (rate.why if rate is not None and rate.why else None) or "no decode rate was measured"
        return Verdict(gate, Status.INVALID, f"the decode rate could not be estimated ({why}); without it a slot "
                       f"release cannot be told from the request finishing on its own ({obs.case})", evidence=ev)
    tps = f"{rate.tps:,.1f} tokens/s" if rate is not None and rate.tps else "the measured decode rate"
    if obs.natural_s < 0:
        return Verdict(gate, Status.INVALID, f"at {tps} the request should have finished {-obs.natural_s:.2f} s before "
                       f"the hang-up, yet it was still running ({obs.case}): the rate estimate does not hold for this "
                       "request, so a release cannot be told from completion", evidence=ev)
    if obs.natural_s < 0.2:
        return Verdict(gate, Status.INVALID, f"at {tps} the request would have finished {obs.natural_s:.2f} s after the "
                       f"hang-up anyway ({obs.case}); a release cannot be told from completion", evidence=ev)
    natural = f"; it would have run {obs.natural_s:.1f} s more" if obs.natural_s is not None else ""
    if not obs.poll.reached or obs.poll.elapsed_s > limit:
        return Verdict(gate, FAIL, f"num_requests_running still {obs.poll.last:g} {obs.poll.elapsed_s:.2f} s after the "
                       f"client hung up ({obs.case}){natural}; must return to {obs.baseline:g} within {limit:.2f} s "
                       "-> FAIL (slot not freed)", measured=round(obs.poll.elapsed_s, 3), limit=round(limit, 3),
                       unit="s", evidence={**ev, "running_last": obs.poll.last})
    return Verdict(gate, PASS, f"num_requests_running back to {obs.baseline:g} {obs.poll.elapsed_s:.2f} s after the "
                   f"client hung up ({obs.case}){natural}; limit {limit:.2f} s -> PASS",
                   measured=round(obs.poll.elapsed_s, 3), limit=round(limit, 3), unit="s", evidence=ev)


STORM_GATE = "disconnect/cancellation-storm"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.2f}%"


def _bound_text(obs: Any) -> str:
    """How the release bound was sized, in words (:func:`kvgate.load.storm.release_bound`)."""
    p = obs.probe
    if p is None or p.step_s is None:
        why = p.why if p is not None and p.why else "no step probe ran"
        return f"{obs.bound_s:.2f} s (the {obs.floor_s:g} s floor: the decode step could not be measured, {why})"
    sized = (p.prefill_s or 0.0) + obs.steps * p.step_s
    return (f"{obs.bound_s:.2f} s = max({obs.floor_s:g} s floor, {p.prefill_s or 0.0:.3f} s prefill of a "
            f"{p.prompt_tokens:,}-token prompt + {obs.steps} x {p.step_s * 1e3:.1f} ms decode step = {sized:.2f} s)")


def _canary_text(obs: Any) -> tuple[str, bool]:
    """The max-context canary in words and whether it was refused (not admitted, an error, or no answer)."""
    if obs.canary is None:
        return (obs.canary_error or "the max-context canary was not sent"), True
    r, n = obs.canary.reply, obs.canary.prompt_tokens
    what = f"max-context canary ({n:,}-token prompt)" if n else "max-context canary"
    if r.status == 200:
        return f"{what} completed in {r.elapsed_s:.2f} s", False
    last = obs.canary_queue[-1] if obs.canary_queue else None
    seen = f"; /metrics while it waited: waiting {last.waiting:g}, running {last.running:g}" if (
        last is not None and last.waiting is not None and last.running is not None) else ""
    if r.status == 0:
        held = " (not admitted: the pool cannot hold it)" if last is not None and (last.waiting or 0) >= 1 else ""
        return f"{what} refused: no answer within its {obs.canary_deadline_s:g} s deadline{held}{seen}", True
    return f"{what} refused: HTTP {r.status} ({(r.text or '')[:120]}){seen}", True


def storm_verdict(obs: Any) -> Verdict:
    """``disconnect/cancellation-storm``: after ``k`` cancellations at staged moments
    (:mod:`kvgate.load.storm`) ``vllm:kv_cache_usage_perc`` is back to its pre-storm baseline
    (within half a KV block) within a bound sized from the server's own measured step
    (``obs.bound_s``), and a max-context canary is admitted and completes.

    FAIL names the usage before and after, the bound, the stage(s) whose cancellations left the
    usage up (each stage is polled back to the level it began at, so each stage's leak is its own)
    with where its requests really were when cut, and whether the canary was refused. A canary
    refused FAILs even without the gauge. Without ``kv_cache_usage_perc`` (or ``/metrics``) the
    release is not observable: SKIP saying so. INVALID when no request was really cut (all completed
    before their hang-up) or when the gauge never rose above its baseline across the storm and the
    canary (a return to baseline then proves nothing). ``measured``: the slowest stage's release [s]
    (PASS) or the usage after [fraction of the pool] (FAIL); ``limit``: the bound [s] or the baseline."""
    can_text, refused = _canary_text(obs)
    stages = getattr(obs, "stages", [])
    ev = {"k": obs.k, "kv_baseline": obs.baseline, "kv_final": obs.final, "kv_peak": obs.peak,
          "tolerance": obs.tolerance, "num_gpu_blocks": obs.num_gpu_blocks, "bound_s": round(obs.bound_s, 4),
          "release_steps": obs.steps, "floor_s": obs.floor_s,
          "probe": obs.probe.evidence() if obs.probe is not None else None,
          "probe_released": None if obs.probe_release is None else obs.probe_release.reached,
          "stages": [s.evidence() for s in stages],
          "canary": obs.canary.evidence() if obs.canary is not None else obs.canary_error,
          "canary_refused": refused, "canary_queue": [vars(q) for q in obs.canary_queue[-10:]]}
    if obs.baseline is None:
        absent = ("the server's /metrics has no vllm:kv_cache_usage_perc (nor vllm:gpu_cache_usage_perc)"
                  if obs.metrics else "the server exposes no /metrics")
        if refused:
            return Verdict(STORM_GATE, FAIL, f"{can_text} -> FAIL ({absent}: KV release not observable, no storm "
                           "sent)", measured="refused", limit="a completion", evidence=ev)
        return Verdict(STORM_GATE, SKIP, f"{absent}: whether cancelled requests free their KV blocks is not "
                       f"observable, so no storm was sent ({can_text})", evidence=ev)
    per = ", ".join(f"{s.stage} {len(s.moments)}" for s in stages)
    if stages and obs.cut == 0 and not refused:
        return Verdict(STORM_GATE, Status.INVALID, f"none of the {obs.k} storm requests was cut before it completed "
                       f"({'; '.join(f'{s.stage}: {s.moments}' for s in stages)}): nothing was cancelled, so a "
                       "release was not measured", evidence=ev)
    tol = obs.tolerance
    leaks = [s for s in stages if s.leaked]
    final_up = obs.final is not None and obs.final > obs.baseline + tol
    head = (f"vllm:kv_cache_usage_perc {_pct(obs.baseline)} before the storm, {_pct(obs.final)} after {obs.cut} "
            f"cancellations of {obs.k} ({per})")
    if leaks or final_up or refused:
        where = "; ".join(
            f"{s.stage} {_pct(s.before)} -> {_pct(s.after)} after {s.poll.elapsed_s:.2f} s "
            f"(cut {', '.join(sorted(set(s.moments)))})" for s in leaks)
        parts = [head]
        if leaks or final_up:
            parts.append(f"not back within {_bound_text(obs)}; left up by: {where or 'the stages together'}")
        else:
            parts.append(f"back to baseline within {_bound_text(obs)}")
        parts.append(can_text)
        cause = ("cancelled requests' KV blocks never freed" if leaks or final_up
                 else "the KV pool refuses a max-length prompt after the storm")
        measured = obs.final if leaks or final_up else "refused"
        return Verdict(STORM_GATE, FAIL, "; ".join(parts) + f" -> FAIL ({cause})", measured=measured,
                       limit=obs.baseline if leaks or final_up else "a completion",
                       unit="fraction of the KV pool" if leaks or final_up else None, evidence=ev)
    if obs.peak is None or obs.peak <= obs.baseline + tol:
        return Verdict(STORM_GATE, Status.INVALID, f"vllm:kv_cache_usage_perc read {_pct(obs.peak)} at most across "
                       f"the storm and the max-context canary, baseline {_pct(obs.baseline)}: the gauge never moved, "
                       "so its return to baseline proves nothing", evidence=ev)
    slowest = max((s.poll.elapsed_s for s in stages if s.poll is not None), default=0.0)
    return Verdict(STORM_GATE, PASS, f"{head}: back to baseline (within {tol * 100:.2f}%) after every stage, the "
                   f"slowest in {slowest:.2f} s, bound {_bound_text(obs)}; peak {_pct(obs.peak)} during; "
                   f"{can_text} -> PASS", measured=round(slowest, 3), limit=round(obs.bound_s, 3), unit="s",
                   evidence=ev)
