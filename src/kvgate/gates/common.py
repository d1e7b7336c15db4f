"""What the per-gate verdict modules share: status shorthands, number formatting, the server's
error text, and what a 200 completion answer says (usage, stream summary, garbage).

Pure: observations in, values out; no I/O. A server answering garbage (non-JSON, missing fields)
is reported as a *problem string* for the calling gate to FAIL on, never an exception.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvgate.http.client import Reply, StreamReply, clip
from kvgate.http.probes import Exchange
from kvgate.http.stream import StreamSummary, summarize
from kvgate.verdict import Status, Verdict

PASS, FAIL, SKIP = Status.PASS, Status.FAIL, Status.SKIP


def num(x: Any) -> str:
    """An int with thousands separators (``32,768``); anything else as ``str``."""
    return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else str(x)


def server_error(reply: Reply | StreamReply, limit: int | None = None) -> str:
    """The server's own error text (``error.message`` or the body's start), whole or -- with
    ``limit`` characters -- cut at a word with an ellipsis, never mid-word."""
    return clip(reply.error_message, limit)


def json_body(reply: Reply) -> dict | None:
    """The reply's JSON object, or None when the body is not a JSON object."""
    b = reply.json
    return b if isinstance(b, dict) else None




def preparation_verdict(gate: str, refused: Any, max_model_len: int) -> Verdict:
    """FAIL: the endpoint's answer to a request kvgate sent to prepare ``gate`` (``refused``, a
    :class:`kvgate.http.prompts.PreparationRefused`: a ``/tokenize`` count for an exact-length
    prompt) broke that preparation -- a deployment defect a client meets too, never a harness
    error. The clause in brackets says what it means: a 413 while building a prompt of at most
    ``max_model_len`` tokens (the profile's ``engine.max_model_len``) refuses a body the profile
    allows."""
    st, target = refused.status, refused.target_tokens
    if st == 413 and target is not None and target <= max_model_len:
        why = f"the endpoint refuses a body the profile allows: a {num(target)}-token prompt, max_model_len {num(max_model_len)}"
    elif st == 413:
        why = "the endpoint refuses the body by its size before the engine can judge the prompt"
    elif st >= 500:
        why = "the endpoint failed a request kvgate needs to prepare this gate"
    elif st == 0:
        why = "the endpoint did not answer a request kvgate needs to prepare this gate"
    else:
        why = "the endpoint's answer cannot be used to prepare this gate"
    return Verdict(gate, FAIL, f"{refused} -> FAIL ({why})", measured=st, limit=200, unit="HTTP status",
                   evidence={"route": refused.route, "status": st, "body_bytes": refused.body_bytes,
                             "answer": refused.answer, "target_tokens": target, "api": refused.api,
                             "max_model_len": max_model_len})


def completion_facts(ex: Exchange) -> tuple[dict | None, StreamSummary | None, str | None]:
    """``(usage, stream_summary, problem)`` of a 200 answer; ``problem`` names garbage."""
    r = ex.reply
    if isinstance(r, StreamReply):
        s = summarize(r)
        if s.errors:
            return s.usage, s, f"in-stream error {s.errors[0]!r}"
        if s.undecodable:
            return s.usage, s, f"undecodable stream event {s.undecodable[0]!r}"
        if r.transport_error:
            return s.usage, s, f"stream broke: {r.transport_error}"
        return s.usage, s, None
    body = json_body(r)
    if body is None:
        return None, None, f"non-JSON body {r.text[:120]!r}"
    usage = body.get("usage")
    choices = body.get("choices")
    if not isinstance(usage, dict) or not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None, None, f"body lacks usage/choices: {r.text[:160]!r}"
    return usage, None, None


def completed(gate: str, what: str, ex: Exchange) -> tuple[dict | None, Verdict | None]:
    """``(usage, None)`` for a 200 completion, else ``(None, a FAIL verdict)`` naming the status
    and the server's error, or the garbage that came back (``what`` opens the message)."""
    r, ev = ex.reply, ex.evidence()
    if r.status != 200:
        return None, Verdict(gate, FAIL, f"{what} answered {r.status} ({server_error(r, 120)}) -> FAIL",
                             measured=r.status, limit=200, unit="HTTP status", evidence=ev)
    usage, _, problem = completion_facts(ex)
    if problem:
        return None, Verdict(gate, FAIL, f"{what}: {problem} -> FAIL", measured=problem, limit="valid completion",
                             evidence=ev)
    return usage, None


def finish_reason(ex: Exchange) -> str | None:
    """The first choice's finish_reason (non-streamed) or the last one seen (streamed)."""
    if isinstance(ex.reply, StreamReply):
        fr = summarize(ex.reply).finish_reasons
        return fr[-1] if fr else None
    body = json_body(ex.reply) or {}
    ch = (body.get("choices") or [{}])[0]
    return ch.get("finish_reason") if isinstance(ch, dict) else None


def exchanges_in(*observed: Any) -> list[Exchange]:
    """Every :class:`Exchange` in ``observed``: exchanges, and tuples, lists and dict values holding
    them (a case's observation as its suite keeps it), in order; anything else is passed over."""
    out: list[Exchange] = []
    for o in observed:
        if isinstance(o, Exchange):
            out.append(o)
        elif isinstance(o, (tuple, list)):
            out += exchanges_in(*o)
        elif isinstance(o, dict):
            out += exchanges_in(*o.values())
    return out


def refused_verdict(verdict: Verdict, *observed: Any) -> Verdict:
    """``verdict`` of a case whose requests met a vLLM extension the server refuses
    (:mod:`kvgate.http.extensions`; the ``refused`` of the exchanges in ``observed``,
    :func:`exchanges_in`), or ``verdict`` unchanged when none did.

    A PASS stands: it was measured on what came back (the portable form is noted in its evidence).
    A non-PASS becomes SKIP -- a capability the server lacks, not its failure -- when the refusal took
    the measurement away: a request sent as is with a refused extension (no portable form) was
    answered 4xx, or one sent in its portable form (``ignore_eos`` left out) ended on its own
    (finish_reason ``stop``) before its ``max_tokens``, the length the case needed. The SKIP names the
    refused parameter and quotes the server's 4xx. Any other non-PASS stands: what came back decides
    it (a generation past its cap FAILs with or without ``ignore_eos``)."""
    met = [ex for ex in exchanges_in(*observed) if ex.refused]
    if not met:
        return verdict
    refusals = {p: r for ex in met for p, r in ex.refused.items()}
    note = {"refused_extensions": {p: r.evidence() for p, r in refusals.items()}}
    if verdict.status is Status.PASS:
        return dataclasses.replace(verdict, evidence={**verdict.evidence, **note})
    took: list[str] = []
    for ex in met:
        for p, r in ex.refused.items():
            if p not in ex.dropped and 400 <= ex.reply.status < 500:
                took.append(f"{r.describe()}; the {ex.api} request carrying it was answered {ex.reply.status}")
            elif p in ex.dropped and ex.reply.status == 200 and finish_reason(ex) not in (None, "length"):
                took.append(f"{r.describe()}; sent without it, the {ex.api} generation ended "
                            f"{finish_reason(ex)!r} before its max_tokens {num(ex.body.get('max_tokens'))}, "
                            "the length the case needs")
    if not took:
        return dataclasses.replace(verdict, evidence={**verdict.evidence, **note})
    took = list(dict.fromkeys(took))
    return Verdict(verdict.gate, SKIP, f"{'; '.join(took)} -> SKIP (a capability the server lacks; not measured)",
                   evidence={**verdict.evidence, **note, "unmeasured_verdict": verdict.message[:500]})
