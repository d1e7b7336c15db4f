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
