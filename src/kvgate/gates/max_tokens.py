"""Gate ``max-tokens``: ``completion_tokens <= max_tokens`` and ``finish_reason == "length"`` at the
cap; streamed usage == non-streamed usage == tokens received; the profile's cap enforced (reject or
clamp); under speculative decoding, tokens delivered == usage == the engine's generation counter
(``speculative-usage``). Asserted by ``suites/test_max_tokens.py``.
"""

from __future__ import annotations

from typing import Any

from kvgate.http.probes import Exchange
from kvgate.http.usage import SpecUsageObservation
from kvgate.verdict import Status, Verdict
from kvgate.gates.common import FAIL, PASS, completion_facts, finish_reason, server_error

SKIP, INVALID = Status.SKIP, Status.INVALID




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


SPEC_GATE = "max-tokens/speculative-usage"


def _spec_words(spec: dict) -> str:
    """``ngram, 3 speculative tokens`` from an ``engine.speculative_config``."""
    method = spec.get("method") or spec.get("model") or "speculation"
    k = spec.get("num_speculative_tokens")
    return f"{method}, {k} speculative tokens" if k is not None else str(method)


def speculative_usage_verdict(obs: SpecUsageObservation | None, spec: dict | None) -> Verdict:
    """Under speculative decoding (``engine.speculative_config``), per probe: tokens delivered (logprob
    entries; the text re-tokenised when none came back) == ``usage.completion_tokens`` <= ``max_tokens``;
    over the probes: the ``vllm:generation_tokens_total`` delta between two idle scrapes == the tokens
    delivered. SKIP when the profile declares no ``speculative_config`` (``obs`` then None). INVALID when
    no probe's tokens could be counted, or when vLLM's draft counter exists and never moved (no draft was
    proposed: nothing was measured under speculation). The counter comparison is left unjudged (named
    in the evidence) when the server was not idle around the probes, ``/metrics`` lacks the counter, or
    other requests finished meanwhile (``vllm:request_success_total`` moved by more than the probes).
    FAIL names, per request, delivered vs counted vs ``max_tokens``."""
    if spec is None or obs is None:
        return Verdict(SPEC_GATE, SKIP, "profile declares no engine.speculative_config: the server does not run "
                       "speculative decoding, so draft tokens cannot enter usage; nothing to check")
    rows = [d.row() for d in obs.deliveries]
    n = len(rows)
    ev: dict[str, Any] = {"speculative_config": spec, "requests": rows, "prompt": obs.prompt,
                          "counters_before": obs.before, "counters_after": obs.after,
                          "settle_scrapes": obs.settle_scrapes, "notes": list(obs.notes),
                          "exchanges": [d.exchange.evidence() for d in obs.deliveries]}
    broken = [d for d in obs.deliveries if d.problem]
    if broken:
        return Verdict(SPEC_GATE, FAIL, "; ".join(f"{d.label} {d.problem}" for d in broken) + " -> FAIL",
                       measured=broken[0].exchange.reply.status, limit=200, unit="HTTP status", evidence=ev)
    counted = [d for d in obs.deliveries if d.delivered is not None]
    if not counted:
        return Verdict(SPEC_GATE, INVALID, f"none of {n} answers carried logprobs and /tokenize could not re-count "
                       "their text: the tokens delivered were not counted, usage cannot be checked", evidence=ev)
    bad = [d for d in counted if d.usage_tokens != d.delivered or d.delivered > d.max_tokens
           or (d.usage_tokens is not None and d.usage_tokens > d.max_tokens)]
    delivered = sum(d.delivered for d in counted)
    billed = sum(d.usage_tokens or 0 for d in counted)
    drafts, draft_tokens, accepted = obs.delta("drafts"), obs.delta("draft_tokens"), obs.delta("accepted_tokens")
    ev["spec_decode"] = {"drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted}
    if bad:
        over = [d for d in bad if d.delivered > d.max_tokens]
        more = [d for d in bad if d.usage_tokens is not None and d.usage_tokens > d.delivered]
        cause = ("a verify step's accepted drafts delivered past max_tokens" if over else
                 "usage counts drafted tokens the verifier rejected (billed, never delivered)" if more else
                 "usage counts fewer tokens than were delivered, or none")
        per = "; ".join(f"{d.label}: delivered {d.delivered} (by {d.counted_by}), usage.completion_tokens "
                        f"{d.usage_tokens}, max_tokens {d.max_tokens}" for d in bad)
        ev["cause"] = cause
        if over:  # the worst overshoot: delivered against max_tokens
            worst = max(over, key=lambda d: d.delivered - d.max_tokens)
            measured, limit = worst.delivered, worst.max_tokens
        else:  # the worst disagreement: usage against delivered
            worst = max(bad, key=lambda d: abs((d.usage_tokens or 0) - d.delivered))
            measured, limit = worst.usage_tokens, worst.delivered
        return Verdict(SPEC_GATE, FAIL, f"under speculative decoding ({_spec_words(spec)}) {len(bad)} of {n} requests "
                       f"disagree: {per} -> FAIL ({cause})", measured=measured, limit=limit, unit="tokens", evidence=ev)
    gen, finished = obs.delta("generation_tokens"), obs.delta("requests_finished")
    quiet = all(q is not None and q.reached for q in (obs.quiet_before, obs.quiet_after))
    counter_words = ""
    if gen is None:
        ev["skipped_checks"] = {"generation_tokens_total": "GET /metrics has no vllm:generation_tokens_total"}
    elif not quiet:
        ev["skipped_checks"] = {"generation_tokens_total": "vllm:num_requests_running did not reach 0 before and "
                                "after the probes within the wait: other traffic would move the counter"}
    elif finished is not None and finished != n:
        ev["skipped_checks"] = {"generation_tokens_total": f"vllm:request_success_total moved by {finished:g}, the "
                                f"probes were {n}: other requests finished meanwhile"}
    elif gen != delivered:
        ev["cause"] = ("the engine counts drafted tokens as generated" if gen > delivered else
                       "the engine counts fewer tokens than it delivered")
        return Verdict(SPEC_GATE, FAIL, f"under speculative decoding ({_spec_words(spec)}) vllm:generation_tokens_total "
                       f"moved by {gen:g} over {n} idle-bracketed requests that delivered {delivered} tokens "
                       f"(usage {billed}) -> FAIL ({ev['cause']})", measured=gen, limit=delivered, unit="tokens",
                       evidence=ev)
    else:
        counter_words = f"; vllm:generation_tokens_total +{gen:g} == delivered"
    if "skipped_checks" in ev:
        counter_words = f"; generation counter not judged ({ev['skipped_checks']['generation_tokens_total']})"
    if drafts is not None and drafts <= 0:
        return Verdict(SPEC_GATE, INVALID, f"vllm:spec_decode_num_drafts_total did not move over {n} requests "
                       f"({delivered} tokens): no draft was proposed, so usage was not measured under speculation",
                       measured=drafts, limit="> 0 drafts", unit="drafts", evidence=ev)
    if drafts is None:
        spec_words = "; drafts not observable (no vllm:spec_decode_* series)"
    else:
        rate = f" ({accepted / draft_tokens:.0%})" if accepted is not None and draft_tokens else ""
        spec_words = f"; {drafts:g} drafts, {accepted if accepted is None else f'{accepted:g}'} of {draft_tokens:g} " \
                     f"draft tokens accepted{rate}"
    return Verdict(SPEC_GATE, PASS, f"under speculative decoding ({_spec_words(spec)}) {n} requests delivered == "
                   f"usage.completion_tokens <= max_tokens {counted[0].max_tokens} each ({delivered} tokens, by "
                   f"{counted[0].counted_by}){counter_words}{spec_words} -> PASS", measured=billed, limit=delivered,
                   unit="tokens", evidence=ev)
