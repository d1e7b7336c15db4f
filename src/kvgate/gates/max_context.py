"""Gate ``max-context``: a prompt of exactly ``max_model_len - max_tokens`` tokens completes; one of
``max_model_len + 1`` is answered 4xx within the deadline. Asserted by ``suites/test_max_context.py``
(which also runs the :mod:`kvgate.gates.health` canary after it).
"""

from __future__ import annotations

import dataclasses

from kvgate.http.probes import Exchange, QueueSample
from kvgate.verdict import Status, Verdict
from kvgate.http.client import clip
from kvgate.gates.common import FAIL, PASS, completion_facts, finish_reason, num, server_error




def fits_verdict(ex: Exchange, max_model_len: int, max_tokens: int, queue: list[QueueSample] | None = None,
                 deadline_s: float | None = None) -> Verdict:
    """A prompt of exactly ``max_model_len - max_tokens`` tokens completes: 200, usage.prompt_tokens
    equals the verified length, ``max_tokens`` tokens generated (``ignore_eos``), finish "length".

    ``queue``: the scheduler gauges sampled while it was outstanding
    (:func:`kvgate.http.probes.send_watched`); a request with no answer by ``deadline_s`` that the
    server held as waiting with nothing running was admitted but never scheduled -- vLLM 0.32 does
    that when its KV pool holds exactly one full-length sequence, since one block is its null block."""
    gate = f"max-context/{ex.api}{'-stream' if ex.stream else ''}"
    n = ex.prompt_tokens
    r = ex.reply
    ev = ex.evidence()
    what = f"{num(n)}-token {ex.api} prompt + max_tokens {max_tokens} (= max_model_len {num(max_model_len)})"
    if queue:
        ev["queue"] = [dataclasses.asdict(q) for q in queue[-20:]]
    if r.status == 0:
        return _no_answer_verdict(gate, what, r.text, queue or [], deadline_s, ev)
    if r.status != 200:
        return Verdict(gate, FAIL, f"{what} answered {r.status} ({server_error(r, 160)}); "
                       "must complete 200 -> FAIL", measured=r.status, limit=200, unit="HTTP status", evidence=ev)
    usage, _, problem = completion_facts(ex)
    if problem:
        return Verdict(gate, FAIL, f"{what}: {problem} -> FAIL", measured=problem, limit="valid completion", evidence=ev)
    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    fr = finish_reason(ex)
    if pt != n:
        return Verdict(gate, FAIL, f"{what}: server counted {pt} prompt tokens, /tokenize said {num(n)} -> FAIL "
                       "(prompt altered or truncated)", measured=pt, limit=n, unit="tokens", evidence=ev)
    if ct != max_tokens or fr != "length":
        return Verdict(gate, FAIL, f"{what}: {ct} completion tokens, finish_reason {fr!r}; expected {max_tokens} "
                       "and 'length' (ignore_eos) -> FAIL", measured=ct, limit=max_tokens, unit="tokens", evidence=ev)
    return Verdict(gate, PASS, f"{what} -> 200, {ct} tokens, finish 'length' in {r.elapsed_s:.2f} s -> PASS",
                   measured=pt + ct, limit=max_model_len, unit="tokens", evidence=ev)


def _no_answer_verdict(gate: str, what: str, error: str, queue: list[QueueSample], deadline_s: float | None,
                       ev: dict) -> Verdict:
    by = f"within its {deadline_s:g} s deadline" if deadline_s else "at all"
    last = queue[-1] if queue else None
    if last is not None and last.waiting and last.waiting >= 1 and last.running == 0:
        return Verdict(gate, FAIL, f"{what}: no answer {by}; /metrics while it waited: waiting {last.waiting:g}, "
                       f"running {last.running:g} -> admitted but never scheduled (the KV pool cannot hold one "
                       "full-length sequence: vLLM keeps one block as its null block) -> FAIL",
                       measured="waiting 1, running 0", limit="a completion", evidence=ev)
    seen = (f"; /metrics while it waited: waiting {last.waiting}, running {last.running}" if last is not None
            else "; no /metrics sample")
    return Verdict(gate, FAIL, f"{what}: no answer {by} ({clip(error, 100)}){seen} -> FAIL", measured="no answer",
                   limit="a completion", evidence=ev)


def over_length_verdict(ex: Exchange, max_model_len: int, deadline_s: float, control: Exchange | None = None) -> Verdict:
    """A prompt of ``max_model_len + 1`` tokens is answered 4xx within ``deadline_s`` seconds,
    before any stream starts (vLLM: 400 BadRequestError naming the limit).

    A 4xx counts as the *length* refused only when ``control`` -- the same prompt form (API, text or
    token ids) under the limit (the max-context case's request of ``max_model_len - max_tokens``
    tokens, or one of ``max_model_len - 1`` tokens and ``max_tokens`` 1, streamed and hung up at its status
    line) -- was answered 200: a server
    that refuses the form itself (token ids: ``400 prompt must be a string.``, HF transformers serve)
    says nothing about its limit. Refused too -> SKIP quoting both answers; no control, or one with no
    answer -> INVALID (the rejection is not shown to be the length's)."""
    gate = f"max-context/over-length/{ex.api}{'-stream' if ex.stream else ''}"
    r = ex.reply
    ev = ex.evidence()
    what = f"{num(ex.prompt_tokens)}-token {ex.api}{' streaming' if ex.stream else ''} prompt (max_model_len {num(max_model_len)})"
    if 400 <= r.status < 500:
        if r.elapsed_s > deadline_s:
            return Verdict(gate, FAIL, f"{what} rejected {r.status} after {r.elapsed_s:.2f} s; deadline {deadline_s:g} s -> FAIL",
                           measured=round(r.elapsed_s, 3), limit=deadline_s, unit="s", evidence=ev)
        msg = server_error(r, 100)
        form = "token-id" if isinstance(ex.body.get("prompt"), list) else "text"
        if control is None or control.reply.status != 200:
            ev["control"] = control.evidence() if control is not None else None
            seen = f"{what} rejected {r.status} ({msg})"
            if control is not None and 400 <= control.reply.status < 500:
                return Verdict(gate, Status.SKIP, f"{seen}, but the same {form} prompt under the limit "
                               f"({num(control.prompt_tokens)} tokens) was refused too ({control.reply.status}: "
                               f"{server_error(control.reply, 100)}): the server refuses the prompt's form, not its "
                               "length -> SKIP (over-length not measurable with this form)", evidence=ev)
            why = (f"the same {form} prompt under the limit got {control.reply.status or 'no answer'}" if control is not None
                   else f"no {form} prompt under the limit was sent to show the form is served")
            return Verdict(gate, Status.INVALID, f"{seen}; {why}: the rejection is not shown to be the length's "
                           "-> INVALID", measured=r.status, limit="4xx after the form is served", unit="HTTP status",
                           evidence=ev)
        ev["control"] = {"prompt_tokens": control.prompt_tokens, "status": control.reply.status}
        return Verdict(gate, PASS, f"{what} -> {r.status} in {r.elapsed_s * 1000:.0f} ms ({msg}) -> PASS",
                       measured=r.status, limit="4xx", unit="HTTP status", evidence=ev)
    if r.status == 200:
        usage, summary, problem = completion_facts(ex)
        if summary is not None and summary.errors:
            why = f"answered 200 and reported the error inside the stream ({summary.errors[0]!r:.120})"
        else:
            pt = (usage or {}).get("prompt_tokens")
            why = (f"answered 200 (server counted {pt} prompt tokens: silently truncated)"
                   if isinstance(pt, int) and pt <= max_model_len else "answered 200")
        return Verdict(gate, FAIL, f"{what} {why}; must be rejected 4xx -> FAIL", measured=200, limit="4xx",
                       unit="HTTP status", evidence=ev)
    return Verdict(gate, FAIL, f"{what} answered {r.status or 'nothing'} "
                   f"({server_error(r, 120) if r.status else clip(r.text, 120)}); must be 4xx -> FAIL",
                   measured=r.status, limit="4xx", unit="HTTP status", evidence=ev)
