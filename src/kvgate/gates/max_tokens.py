"""Gate ``max-tokens``: ``completion_tokens <= max_tokens`` and ``finish_reason == "length"`` at the
cap; streamed usage == non-streamed usage == tokens received; the profile's cap enforced (reject or
clamp). Asserted by ``suites/test_max_tokens.py``.
"""

from __future__ import annotations

from kvgate.http.probes import Exchange
from kvgate.verdict import Verdict
from kvgate.gates.common import FAIL, PASS, completion_facts, finish_reason, server_error




def cap_hit_verdict(ex: Exchange, max_tokens: int) -> Verdict:
    """With ``ignore_eos``: ``completion_tokens == max_tokens`` (so ``<=`` holds) and finish "length"."""
    gate = f"max-tokens/cap-hit/{ex.api}"
    r, ev = ex.reply, ex.evidence()
    if r.status != 200:
        return Verdict(gate, FAIL, f"max_tokens={max_tokens} request answered {r.status} -> FAIL", measured=r.status,
                       limit=200, unit="HTTP status", evidence=ev)
    usage, _, problem = completion_facts(ex)
    if problem:
        return Verdict(gate, FAIL, f"max_tokens={max_tokens}: {problem} -> FAIL", evidence=ev)
    ct, fr = usage.get("completion_tokens"), finish_reason(ex)
    if not isinstance(ct, int) or ct > max_tokens:
        return Verdict(gate, FAIL, f"{ct} completion tokens for max_tokens={max_tokens} -> FAIL (cap ignored)",
                       measured=ct, limit=max_tokens, unit="tokens", evidence=ev)
    if ct < max_tokens:
        return Verdict(gate, FAIL, f"{ct} completion tokens for max_tokens={max_tokens} with ignore_eos -> FAIL "
                       "(stopped early)", measured=ct, limit=max_tokens, unit="tokens", evidence=ev)
    if fr != "length":
        return Verdict(gate, FAIL, f"{ct} tokens = max_tokens but finish_reason {fr!r}; must be 'length' at the cap -> FAIL",
                       measured=fr, limit="length", evidence=ev)
    return Verdict(gate, PASS, f"{ct}/{max_tokens} tokens, finish_reason 'length' -> PASS", measured=ct,
                   limit=max_tokens, unit="tokens", evidence=ev)


def stream_usage_verdict(plain: Exchange, streamed: Exchange, max_tokens: int) -> Verdict:
    """Streamed usage (``stream_options.include_usage``) == non-streamed usage == tokens actually
    received (counted from per-chunk logprobs), for the same greedy request."""
    gate = f"max-tokens/stream-usage/{plain.api}"
    ev = {"non_streamed": plain.evidence(), "streamed": streamed.evidence()}
    for ex in (plain, streamed):
        if ex.reply.status != 200:
            return Verdict(gate, FAIL, f"{'streamed' if ex.stream else 'non-streamed'} request answered "
                           f"{ex.reply.status} -> FAIL", measured=ex.reply.status, limit=200, unit="HTTP status",
                           evidence=ev)
    u_plain, _, p1 = completion_facts(plain)
    u_stream, summary, p2 = completion_facts(streamed)
    if p1 or p2:
        return Verdict(gate, FAIL, f"{p1 or p2} -> FAIL", evidence=ev)
    if u_stream is None:
        return Verdict(gate, FAIL, "streamed request with include_usage sent no usage chunk -> FAIL",
                       measured=None, limit="usage chunk", evidence=ev)
    got = summary.tokens_received if summary.tokens_received is not None else summary.content_chunks
    ev["tokens_received"] = got
    ev["counted_by"] = "logprobs" if summary.tokens_received is not None else "content chunks"
    keys = ("prompt_tokens", "completion_tokens")
    a = {k: u_plain.get(k) for k in keys}
    b = {k: u_stream.get(k) for k in keys}
    if a != b or b["completion_tokens"] != got:
        return Verdict(gate, FAIL, f"usage streamed {b}, non-streamed {a}, tokens received {got} "
                       f"(by {ev['counted_by']}); all must agree -> FAIL",
                       measured=b["completion_tokens"], limit=got, unit="tokens",
                       evidence={**ev, "usage": {"streamed": b, "non_streamed": a, "received": got}})
    return Verdict(gate, PASS, f"usage streamed == non-streamed == received ({got} completion tokens, "
                   f"{a['prompt_tokens']} prompt tokens) -> PASS", measured=got, limit=max_tokens, unit="tokens",
                   evidence=ev)


def over_cap_verdict(ex: Exchange, cap: int, mode: str) -> Verdict:
    """A request for ``cap + k`` tokens: ``reject`` -> 4xx; ``clamp`` -> 200 with at most ``cap``
    completion tokens and finish "length"."""
    gate = f"max-tokens/over-cap/{ex.api}"
    r, ev = ex.reply, ex.evidence()
    asked = ex.body.get("max_tokens")
    if mode == "reject":
        if 400 <= r.status < 500:
            return Verdict(gate, PASS, f"max_tokens={asked} above cap {cap} -> {r.status} -> PASS", measured=r.status,
                           limit="4xx", unit="HTTP status", evidence=ev)
        return Verdict(gate, FAIL, f"max_tokens={asked} above cap {cap} answered {r.status}; profile says reject (4xx) -> FAIL",
                       measured=r.status, limit="4xx", unit="HTTP status", evidence=ev)
    if r.status != 200:
        return Verdict(gate, FAIL, f"max_tokens={asked} above cap {cap} answered {r.status} "
                       f"({server_error(r, 160)}); profile says clamp (200) -> FAIL",
                       measured=r.status, limit=200, unit="HTTP status", evidence=ev)
    usage, _, problem = completion_facts(ex)
    if problem:
        return Verdict(gate, FAIL, f"max_tokens={asked}: {problem} -> FAIL", evidence=ev)
    ct = usage.get("completion_tokens")
    if not isinstance(ct, int) or ct > cap:
        return Verdict(gate, FAIL, f"max_tokens={asked} produced {ct} tokens; profile cap is {cap} -> FAIL (cap not enforced)",
                       measured=ct, limit=cap, unit="tokens", evidence=ev)
    return Verdict(gate, PASS, f"max_tokens={asked} clamped to {ct} tokens (cap {cap}) -> PASS", measured=ct,
                   limit=cap, unit="tokens", evidence=ev)
