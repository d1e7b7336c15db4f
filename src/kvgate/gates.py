"""Pure verdicts: observations in, :class:`~kvgate.verdict.Verdict` out. No I/O here.

Each function names the measured value, the limit and the evidence in its message, in the house
style ``<what was seen>; <what the profile says> -> FAIL (<why>)``. A server answering garbage
(non-JSON, missing fields) is a FAIL with the body in the evidence, never an exception.
"""

from __future__ import annotations

from typing import Any

from .client import Reply, StreamReply
from .metrics import MetricsError, cache_config, parse
from .probes import DeploymentObservation, Exchange
from .profile import Profile
from .stream import StreamSummary, summarize
from .verdict import Status, Verdict

PASS, FAIL, SKIP = Status.PASS, Status.FAIL, Status.SKIP


def _n(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else str(x)


def _reason(reply: Reply | StreamReply) -> str:
    """The server's own error text (``error.message`` or the body's start)."""
    return reply.error_message


def _body(reply: Reply) -> dict | None:
    b = reply.json
    return b if isinstance(b, dict) else None


# ------------------------------------------------------------------ deployment matches profile


def served_model_verdict(obs: DeploymentObservation, profile: Profile) -> Verdict:
    """The profile's ``model.served_name`` is listed by ``/v1/models``."""
    gate, want = "deployment/served-model", profile.model.served_name
    body = _body(obs.models)
    ev = {"status": obs.models.status, "body": obs.models.text[:800], "version": obs.version}
    if obs.models.status != 200 or body is None or not isinstance(body.get("data"), list):
        return Verdict(gate, FAIL, f"{obs.models_path} answered {obs.models.status} without a model list "
                       f"({obs.models.text[:120]!r}) -> FAIL", measured=obs.models.status, limit=200, evidence=ev)
    ids = [m.get("id") for m in body["data"] if isinstance(m, dict)]
    if want not in ids:
        return Verdict(gate, FAIL, f"served models {ids}; profile declares {want!r} -> FAIL (model not served)",
                       measured=ids, limit=want, evidence=ev)
    return Verdict(gate, PASS, f"serves {want!r} (vLLM {obs.version or 'version unknown'}) -> PASS",
                   measured=want, limit=want, evidence=ev)


def max_model_len_verdict(obs: DeploymentObservation, profile: Profile) -> Verdict:
    """``max_model_len`` advertised by the ``/v1/models`` card and by ``/tokenize`` equals the
    profile's ``engine.max_model_len`` (tokens). Either source may be absent (KServe's route has
    no ``max_model_len``); both absent -> SKIP with the reason."""
    gate, want = "deployment/max-model-len", profile.engine.max_model_len
    seen: dict[str, Any] = {}
    body = _body(obs.models)
    if body and isinstance(body.get("data"), list):
        for card in body["data"]:
            if isinstance(card, dict) and card.get("id") == profile.model.served_name and "max_model_len" in card:
                seen["/v1/models"] = card["max_model_len"]
    if obs.tokenize is not None:
        tb = _body(obs.tokenize)
        if obs.tokenize.status == 200 and tb and "max_model_len" in tb:
            seen["/tokenize"] = tb["max_model_len"]
    ev = {"advertised": seen, "profile": want, "version": obs.version}
    if not seen:
        return Verdict(gate, SKIP, "server advertises no max_model_len (/v1/models card and /tokenize lack it); "
                       "the max-context gate checks enforcement instead", limit=want, evidence=ev)
    wrong = {src: v for src, v in seen.items() if v != want}
    if wrong:
        parts = ", ".join(f"{src} says {_n(v)}" for src, v in wrong.items())
        return Verdict(gate, FAIL, f"max_model_len: {parts}; profile declares {_n(want)} tokens -> FAIL",
                       measured=seen, limit=want, evidence=ev)
    srcs = " and ".join(seen)
    return Verdict(gate, PASS, f"max_model_len {_n(want)} tokens per {srcs} -> PASS", measured=want, limit=want, evidence=ev)


#: profile engine field -> vllm:cache_config_info label
CACHE_LABELS = {
    "block_size": "block_size",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "kv_cache_dtype": "cache_dtype",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
}


def _same(declared: Any, label: str) -> bool:
    try:
        return abs(float(declared) - float(label)) < 1e-9
    except (TypeError, ValueError):
        return str(declared) == label


def cache_config_verdict(obs: DeploymentObservation, profile: Profile) -> Verdict:
    """Cache settings the profile states (block_size, gpu_memory_utilization, kv_cache_dtype,
    kv_cache_memory_bytes) equal the labels of ``vllm:cache_config_info``. Settings the profile
    leaves unset are not checked; a server without that metric -> SKIP, named."""
    gate = "deployment/cache-config"
    declared = {f: getattr(profile.engine, f) for f in CACHE_LABELS if getattr(profile.engine, f) is not None}
    if obs.metrics_text is None:
        return Verdict(gate, SKIP, "server exposes no /metrics; cache config not verifiable", limit=declared)
    try:
        labels = cache_config(parse(obs.metrics_text))
    except MetricsError as exc:
        return Verdict(gate, FAIL, f"{exc} -> FAIL", evidence={"metrics_head": obs.metrics_text[:500]})
    if labels is None:
        return Verdict(gate, SKIP, "/metrics has no vllm:cache_config_info; cache config not verifiable",
                       limit=declared)
    ev = {"cache_config_info": labels, "declared": declared, "version": obs.version}
    wrong = {f: (v, labels.get(CACHE_LABELS[f])) for f, v in declared.items()
             if not _same(v, labels.get(CACHE_LABELS[f], ""))}
    if wrong:
        parts = ", ".join(f"{f} is {got!r}, profile declares {want!r}" for f, (want, got) in wrong.items())
        return Verdict(gate, FAIL, f"cache config: {parts} -> FAIL", measured={f: g for f, (_, g) in wrong.items()},
                       limit={f: w for f, (w, _) in wrong.items()}, evidence=ev)
    shown = ", ".join(f"{f}={v}" for f, v in declared.items()) or "nothing stated"
    return Verdict(gate, PASS, f"cache config matches ({shown}; block_size {labels.get('block_size')}, "
                   f"{labels.get('num_gpu_blocks')} blocks) -> PASS", measured=labels, limit=declared, evidence=ev)


# ------------------------------------------------------------------ completions, shared


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
    body = _body(r)
    if body is None:
        return None, None, f"non-JSON body {r.text[:120]!r}"
    usage = body.get("usage")
    choices = body.get("choices")
    if not isinstance(usage, dict) or not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None, None, f"body lacks usage/choices: {r.text[:160]!r}"
    return usage, None, None


def finish_reason(ex: Exchange) -> str | None:
    """The first choice's finish_reason (non-streamed) or the last one seen (streamed)."""
    if isinstance(ex.reply, StreamReply):
        fr = summarize(ex.reply).finish_reasons
        return fr[-1] if fr else None
    body = _body(ex.reply) or {}
    ch = (body.get("choices") or [{}])[0]
    return ch.get("finish_reason") if isinstance(ch, dict) else None


def canary_verdict(ex: Exchange, deadline_s: float, after: str) -> Verdict:
    """Health truth: the canary generation answered 200 with a completion within ``deadline_s``."""
    gate = "health/canary"
    r = ex.reply
    usage, _, problem = completion_facts(ex) if r.status == 200 else (None, None, None)
    ev = {"canary": ex.evidence(), "after": after}
    if r.status != 200 or problem or r.elapsed_s > deadline_s or not usage or not usage.get("completion_tokens"):
        why = problem or (f"answered {r.status} ({_reason(r)[:120]})" if r.status != 200
                          else f"took {r.elapsed_s:.2f} s" if r.elapsed_s > deadline_s else "produced no tokens")
        return Verdict(gate, FAIL, f"after {after} a {ex.body.get('max_tokens')}-token canary generation {why}; "
                       f"must succeed within {deadline_s:g} s -> FAIL (server unhealthy, whatever /health says)",
                       measured=f"{r.status} in {r.elapsed_s:.2f} s", limit=f"200 within {deadline_s:g} s", evidence=ev)
    return Verdict(gate, PASS, f"canary generation 200 in {r.elapsed_s:.2f} s after {after} -> PASS",
                   measured=f"200 in {r.elapsed_s:.2f} s", limit=f"{deadline_s:g} s", evidence=ev)


# ------------------------------------------------------------------ max context


def fits_verdict(ex: Exchange, max_model_len: int, max_tokens: int) -> Verdict:
    """A prompt of exactly ``max_model_len - max_tokens`` tokens completes: 200, usage.prompt_tokens
    equals the verified length, ``max_tokens`` tokens generated (``ignore_eos``), finish "length"."""
    gate = f"max-context/{ex.api}{'-stream' if ex.stream else ''}"
    n = ex.prompt_tokens
    r = ex.reply
    ev = ex.evidence()
    what = f"{_n(n)}-token {ex.api} prompt + max_tokens {max_tokens} (= max_model_len {_n(max_model_len)})"
    if r.status != 200:
        return Verdict(gate, FAIL, f"{what} answered {r.status} ({_reason(r)[:160]}); "
                       "must complete 200 -> FAIL", measured=r.status, limit=200, evidence=ev)
    usage, _, problem = completion_facts(ex)
    if problem:
        return Verdict(gate, FAIL, f"{what}: {problem} -> FAIL", measured=problem, limit="valid completion", evidence=ev)
    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    fr = finish_reason(ex)
    if pt != n:
        return Verdict(gate, FAIL, f"{what}: server counted {pt} prompt tokens, /tokenize said {_n(n)} -> FAIL "
                       "(prompt altered or truncated)", measured=pt, limit=n, evidence=ev)
    if ct != max_tokens or fr != "length":
        return Verdict(gate, FAIL, f"{what}: {ct} completion tokens, finish_reason {fr!r}; expected {max_tokens} "
                       "and 'length' (ignore_eos) -> FAIL", measured=ct, limit=max_tokens, evidence=ev)
    return Verdict(gate, PASS, f"{what} -> 200, {ct} tokens, finish 'length' in {r.elapsed_s:.2f} s -> PASS",
                   measured=pt + ct, limit=max_model_len, evidence=ev)


def over_length_verdict(ex: Exchange, max_model_len: int, deadline_s: float) -> Verdict:
    """A prompt of ``max_model_len + 1`` tokens is answered 4xx within ``deadline_s`` seconds,
    before any stream starts (vLLM: 400 BadRequestError naming the limit)."""
    gate = f"max-context/over-length/{ex.api}{'-stream' if ex.stream else ''}"
    r = ex.reply
    ev = ex.evidence()
    what = f"{_n(ex.prompt_tokens)}-token {ex.api}{' streaming' if ex.stream else ''} prompt (max_model_len {_n(max_model_len)})"
    if 400 <= r.status < 500:
        if r.elapsed_s > deadline_s:
            return Verdict(gate, FAIL, f"{what} rejected {r.status} after {r.elapsed_s:.2f} s; deadline {deadline_s:g} s -> FAIL",
                           measured=f"{r.elapsed_s:.2f} s", limit=f"{deadline_s:g} s", evidence=ev)
        msg = _reason(r)
        return Verdict(gate, PASS, f"{what} -> {r.status} in {r.elapsed_s * 1000:.0f} ms ({msg[:100]}) -> PASS",
                       measured=r.status, limit="4xx", evidence=ev)
    if r.status == 200:
        usage, summary, problem = completion_facts(ex)
        if summary is not None and summary.errors:
            why = f"answered 200 and reported the error inside the stream ({summary.errors[0]!r:.120})"
        else:
            pt = (usage or {}).get("prompt_tokens")
            why = (f"answered 200 (server counted {pt} prompt tokens: silently truncated)"
                   if isinstance(pt, int) and pt <= max_model_len else "answered 200")
        return Verdict(gate, FAIL, f"{what} {why}; must be rejected 4xx -> FAIL", measured=200, limit="4xx", evidence=ev)
    return Verdict(gate, FAIL, f"{what} answered {r.status or 'nothing'} "
                   f"({(_reason(r) if r.status else r.text)[:120]}); must be 4xx -> FAIL",
                   measured=r.status, limit="4xx", evidence=ev)


# ------------------------------------------------------------------ max_tokens caps


def cap_hit_verdict(ex: Exchange, max_tokens: int) -> Verdict:
    """With ``ignore_eos``: ``completion_tokens == max_tokens`` (so ``<=`` holds) and finish "length"."""
    gate = f"max-tokens/cap-hit/{ex.api}"
    r, ev = ex.reply, ex.evidence()
    if r.status != 200:
        return Verdict(gate, FAIL, f"max_tokens={max_tokens} request answered {r.status} -> FAIL", measured=r.status,
                       limit=200, evidence=ev)
    usage, _, problem = completion_facts(ex)
    if problem:
        return Verdict(gate, FAIL, f"max_tokens={max_tokens}: {problem} -> FAIL", evidence=ev)
    ct, fr = usage.get("completion_tokens"), finish_reason(ex)
    if not isinstance(ct, int) or ct > max_tokens:
        return Verdict(gate, FAIL, f"{ct} completion tokens for max_tokens={max_tokens} -> FAIL (cap ignored)",
                       measured=ct, limit=max_tokens, evidence=ev)
    if ct < max_tokens:
        return Verdict(gate, FAIL, f"{ct} completion tokens for max_tokens={max_tokens} with ignore_eos -> FAIL "
                       "(stopped early)", measured=ct, limit=max_tokens, evidence=ev)
    if fr != "length":
        return Verdict(gate, FAIL, f"{ct} tokens = max_tokens but finish_reason {fr!r}; must be 'length' at the cap -> FAIL",
                       measured=fr, limit="length", evidence=ev)
    return Verdict(gate, PASS, f"{ct}/{max_tokens} tokens, finish_reason 'length' -> PASS", measured=ct,
                   limit=max_tokens, evidence=ev)


def stream_usage_verdict(plain: Exchange, streamed: Exchange, max_tokens: int) -> Verdict:
    """Streamed usage (``stream_options.include_usage``) == non-streamed usage == tokens actually
    received (counted from per-chunk logprobs), for the same greedy request."""
    gate = f"max-tokens/stream-usage/{plain.api}"
    ev = {"non_streamed": plain.evidence(), "streamed": streamed.evidence()}
    for ex in (plain, streamed):
        if ex.reply.status != 200:
            return Verdict(gate, FAIL, f"{'streamed' if ex.stream else 'non-streamed'} request answered "
                           f"{ex.reply.status} -> FAIL", measured=ex.reply.status, limit=200, evidence=ev)
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
                       measured={"streamed": b, "non_streamed": a, "received": got}, limit="equal", evidence=ev)
    return Verdict(gate, PASS, f"usage streamed == non-streamed == received ({got} completion tokens, "
                   f"{a['prompt_tokens']} prompt tokens) -> PASS", measured=got, limit=max_tokens, evidence=ev)


def over_cap_verdict(ex: Exchange, cap: int, mode: str) -> Verdict:
    """A request for ``cap + k`` tokens: ``reject`` -> 4xx; ``clamp`` -> 200 with at most ``cap``
    completion tokens and finish "length"."""
    gate = f"max-tokens/over-cap/{ex.api}"
    r, ev = ex.reply, ex.evidence()
    asked = ex.body.get("max_tokens")
    if mode == "reject":
        if 400 <= r.status < 500:
            return Verdict(gate, PASS, f"max_tokens={asked} above cap {cap} -> {r.status} -> PASS", measured=r.status,
                           limit="4xx", evidence=ev)
        return Verdict(gate, FAIL, f"max_tokens={asked} above cap {cap} answered {r.status}; profile says reject (4xx) -> FAIL",
                       measured=r.status, limit="4xx", evidence=ev)
    if r.status != 200:
        return Verdict(gate, FAIL, f"max_tokens={asked} above cap {cap} answered {r.status} "
                       f"({_reason(r)[:160]}); profile says clamp (200) -> FAIL",
                       measured=r.status, limit=200, evidence=ev)
    usage, _, problem = completion_facts(ex)
    if problem:
        return Verdict(gate, FAIL, f"max_tokens={asked}: {problem} -> FAIL", evidence=ev)
    ct = usage.get("completion_tokens")
    if not isinstance(ct, int) or ct > cap:
        return Verdict(gate, FAIL, f"max_tokens={asked} produced {ct} tokens; profile cap is {cap} -> FAIL (cap not enforced)",
                       measured=ct, limit=cap, evidence=ev)
    return Verdict(gate, PASS, f"max_tokens={asked} clamped to {ct} tokens (cap {cap}) -> PASS", measured=ct,
                   limit=cap, evidence=ev)


# ------------------------------------------------------------------ streaming


def _plain_text(ex: Exchange) -> str | None:
    body = _body(ex.reply) if isinstance(ex.reply, Reply) else None
    try:
        ch = body["choices"][0]
        return ch["message"]["content"] if "message" in ch else ch["text"]
    except (TypeError, KeyError, IndexError):
        return None


def first_token_s(reply: StreamReply) -> float | None:
    """Seconds from send to the first chunk that carries a choice (vLLM sends none before the
    first token), or None."""
    for t, obj in reply.chunks():
        if isinstance(obj, dict) and obj.get("choices"):
            return t
    return None


def stream_gaps(reply: StreamReply) -> list[float]:
    """Silences a gateway sees, seconds: send -> first event, then between consecutive events."""
    ts = [t for t, _ in reply.events]
    return [ts[0]] + [b - a for a, b in zip(ts, ts[1:])] if ts else []


def stream_ttft_verdict(ex: Exchange, ttft_ms_limit: float | None) -> Verdict:
    """TTFT of one stream (ms) within the profile's ``slo.ttft_p95_ms``."""
    gate = f"streaming/ttft/{ex.api}"
    r = ex.reply
    ttft = first_token_s(r) if isinstance(r, StreamReply) and r.status == 200 else None
    ev = ex.evidence()
    if ttft is None:
        return Verdict(gate, FAIL, f"stream answered {r.status} with no token chunk -> FAIL", measured=None,
                       limit=ttft_ms_limit, evidence=ev)
    if ttft_ms_limit is None:
        return Verdict(gate, SKIP, f"TTFT {ttft * 1000:.0f} ms; profile sets no slo.ttft_p95_ms", measured=ttft * 1000,
                       evidence=ev)
    ok = ttft * 1000 <= ttft_ms_limit
    return Verdict(gate, PASS if ok else FAIL, f"TTFT {ttft * 1000:,.0f} ms; SLO {ttft_ms_limit:,.0f} ms -> "
                   f"{'PASS' if ok else 'FAIL'}", measured=round(ttft * 1000, 2), limit=ttft_ms_limit, evidence=ev)


def stream_idle_verdict(ex: Exchange, idle_timeout_s: float | None) -> Verdict:
    """The longest silence of the stream (before the first event included) stays below the
    gateway's idle timeout (``limits.stream_idle_timeout_s``)."""
    gate = f"streaming/idle-gap/{ex.api}"
    r = ex.reply
    gaps = stream_gaps(r) if isinstance(r, StreamReply) else []
    ev = {**ex.evidence(), "gaps_s_top5": sorted((round(g, 4) for g in gaps), reverse=True)[:5]}
    if not gaps:
        return Verdict(gate, FAIL, f"stream answered {r.status} with no events -> FAIL", evidence=ev)
    worst = max(gaps)
    where = "before the first event" if gaps.index(worst) == 0 else f"after event {gaps.index(worst)}"
    if idle_timeout_s is None:
        return Verdict(gate, SKIP, f"longest gap {worst:.2f} s ({where}); profile sets no limits.stream_idle_timeout_s",
                       measured=worst, evidence=ev)
    ok = worst < idle_timeout_s
    return Verdict(gate, PASS if ok else FAIL, f"longest stream gap {worst:.3f} s ({where}); gateway idle timeout "
                   f"{idle_timeout_s:g} s -> {'PASS' if ok else 'FAIL (the gateway would cut this stream)'}",
                   measured=round(worst, 4), limit=idle_timeout_s, evidence=ev)


def stream_framing_verdict(ex: Exchange) -> Verdict:
    """Exactly one chunk with a finish_reason, then ``data: [DONE]`` last, nothing after it, no
    in-stream errors, every event JSON."""
    gate = f"streaming/framing/{ex.api}"
    r = ex.reply
    ev = ex.evidence()
    if not isinstance(r, StreamReply) or r.status != 200:
        return Verdict(gate, FAIL, f"stream answered {r.status} -> FAIL", evidence=ev)
    s = summarize(r)
    problems = []
    if len(s.finish_reasons) != 1:
        problems.append(f"{len(s.finish_reasons)} chunks carry a finish_reason {s.finish_reasons} (must be exactly 1)")
    if not s.done:
        problems.append("no 'data: [DONE]' at the end" + (f" ({r.transport_error})" if r.transport_error else ""))
    if s.events_after_done:
        problems.append(f"{s.events_after_done} events after [DONE]")
    if s.errors:
        problems.append(f"in-stream error {s.errors[0]!r:.120}")
    if s.undecodable:
        problems.append(f"non-JSON event {s.undecodable[0]!r}")
    if problems:
        return Verdict(gate, FAIL, "; ".join(problems) + " -> FAIL", measured=problems, limit="1 finish chunk, then [DONE]",
                       evidence=ev)
    return Verdict(gate, PASS, f"{len(r.events)} events, one finish chunk ({s.finish_reasons[0]!r}), then [DONE] -> PASS",
                   measured=len(r.events), limit="1 finish chunk, then [DONE]", evidence=ev)


def stream_text_verdict(streamed: Exchange, plain: Exchange) -> Verdict:
    """At temperature 0 with a seed, the concatenated deltas equal the non-streamed text."""
    gate = f"streaming/deltas/{streamed.api}"
    ev = {"streamed": streamed.evidence(), "non_streamed": plain.evidence()}
    want = _plain_text(plain)
    if plain.reply.status != 200 or want is None:
        return Verdict(gate, FAIL, f"non-streamed request answered {plain.reply.status} without text -> FAIL", evidence=ev)
    if not isinstance(streamed.reply, StreamReply) or streamed.reply.status != 200:
        return Verdict(gate, FAIL, f"streamed request answered {streamed.reply.status} -> FAIL", evidence=ev)
    got = summarize(streamed.reply).text
    if got != want:
        i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        ev["first_difference_at_char"] = i
        return Verdict(gate, FAIL, f"streamed deltas ({len(got)} chars) differ from the non-streamed text ({len(want)} chars) "
                       f"at char {i}: {got[max(0, i - 10):i + 20]!r} vs {want[max(0, i - 10):i + 20]!r} -> FAIL",
                       measured=len(got), limit=len(want), evidence=ev)
    return Verdict(gate, PASS, f"streamed deltas == non-streamed text ({len(got)} chars) -> PASS", measured=len(got),
                   limit=len(want), evidence=ev)


def sdk_verdict(api: str, sdk: Any, plain: Exchange) -> Verdict:
    """The official openai SDK parses the stream without error and gets the same text."""
    gate = f"streaming/openai-sdk/{api}"
    want = _plain_text(plain)
    ev = {"sdk_chunks": sdk.chunks, "sdk_error": sdk.error, "sdk_finish_reasons": sdk.finish_reasons}
    if sdk.error:
        return Verdict(gate, FAIL, f"openai SDK failed on the stream after {sdk.chunks} chunks: {sdk.error} -> FAIL",
                       measured=sdk.error, limit="parses", evidence=ev)
    if want is not None and sdk.text != want:
        return Verdict(gate, FAIL, f"openai SDK text ({len(sdk.text)} chars) differs from the non-streamed text "
                       f"({len(want)} chars) -> FAIL", measured=len(sdk.text), limit=len(want), evidence=ev)
    return Verdict(gate, PASS, f"openai SDK parsed {sdk.chunks} chunks, same text -> PASS", measured=sdk.chunks, evidence=ev)


# ------------------------------------------------------------------ disconnect


def disconnect_verdict(obs: Any, deadline_s: float) -> Verdict:
    """After a client hangs up, ``vllm:num_requests_running`` returns to its baseline in time and a
    canary still generates.

    The limit is ``min(deadline_s, natural_s / 2)``: a server that ignores the hang-up and simply
    finishes the request must not pass, so the slot has to be freed well before the request would
    have ended on its own (``natural_s``, estimated from the measured decode rate). When the
    request was not actually cut (it finished first) the verdict is INVALID. Without ``/metrics``
    the release is not observable: SKIP, unless the canary fails.
    """
    gate = f"disconnect/{obs.case}"
    can = canary_verdict(obs.canary, deadline_s, after=f"a client disconnect ({obs.case})")
    limit = min(deadline_s, obs.natural_s / 2) if obs.natural_s is not None else deadline_s
    ev = {"baseline_running": obs.baseline, "samples": getattr(obs.poll, "samples", None), "canary": can.to_dict(),
          "hung_up": obs.hung.evidence(), "hang_up_after_s": round(obs.hangup_s, 4),
          "natural_remaining_s": obs.natural_s, "limit_s": limit}
    if can.status is FAIL:
        return Verdict(gate, FAIL, can.message, measured=can.measured, limit=can.limit, evidence=ev)
    if not obs.cut:
        return Verdict(gate, Status.INVALID, f"the request finished before the client hung up ({obs.case}); "
                       "nothing was disconnected, so nothing was measured", evidence=ev)
    if obs.natural_s is not None and obs.natural_s < 0.2:
        return Verdict(gate, Status.INVALID, f"the request would have finished {obs.natural_s:.2f} s after the hang-up "
                       "anyway; a release cannot be told from completion", evidence=ev)
    if obs.baseline is None or obs.poll is None:
        return Verdict(gate, SKIP, "server exposes no vllm:num_requests_running; slot release not observable "
                       "(canary after disconnect succeeded)", evidence=ev)
    natural = f"; it would have run {obs.natural_s:.1f} s more" if obs.natural_s is not None else ""
    if not obs.poll.reached or obs.poll.elapsed_s > limit:
        return Verdict(gate, FAIL, f"num_requests_running still {obs.poll.last:g} {obs.poll.elapsed_s:.2f} s after the "
                       f"client hung up ({obs.case}){natural}; must return to {obs.baseline:g} within {limit:.2f} s "
                       "-> FAIL (slot not freed)", measured=obs.poll.last, limit=obs.baseline, evidence=ev)
    return Verdict(gate, PASS, f"num_requests_running back to {obs.baseline:g} {obs.poll.elapsed_s:.2f} s after the "
                   f"client hung up ({obs.case}){natural}; limit {limit:.2f} s -> PASS",
                   measured=round(obs.poll.elapsed_s, 3), limit=round(limit, 3), evidence=ev)
