"""Gate ``streaming``: TTFT within the SLO, the longest silence below the gateway idle timeout,
exactly one finish chunk then ``[DONE]``, deltas concatenate to the non-streamed text, the official
``openai`` SDK parses the stream. Asserted by ``suites/test_streaming.py``.
"""

from __future__ import annotations

from typing import Any

from kvgate.http.client import Reply, StreamReply
from kvgate.http.probes import Exchange
from kvgate.http.sse import classify
from kvgate.http.stream import summarize
from kvgate.verdict import Verdict
from kvgate.gates.common import FAIL, PASS, SKIP, json_body




def _plain_text(ex: Exchange) -> str | None:
    body = json_body(ex.reply) if isinstance(ex.reply, Reply) else None
    try:
        ch = body["choices"][0]
        return ch["message"]["content"] if "message" in ch else ch["text"]
    except (TypeError, KeyError, IndexError):
        return None


def first_token_s(reply: StreamReply) -> float | None:
    """Seconds from send to the first event that is a decode step (:attr:`kvgate.http.sse.SseEvent.is_content`:
    chat's role announcement is not a token), or None. The same rule as the load client's TTFT."""
    for t, data in reply.events:
        if classify(data).is_content:
            return t
    return None


def stream_gaps(reply: StreamReply) -> list[float]:
    """Silences a gateway sees, seconds: send -> first event, then between consecutive events, and
    the silence the client cut the stream at (its idle timeout, ``idle_cut_s``) last."""
    ts = [t for t, _ in reply.events]
    gaps = [ts[0]] + [b - a for a, b in zip(ts, ts[1:])] if ts else []
    return gaps + [reply.idle_cut_s] if gaps and reply.idle_cut_s is not None else gaps


def _answered(r: Reply | StreamReply) -> str:
    """``answered 200``, or for a stream that got no answer the client's words: ``answered 0 (not
    sent: the server stalls streams since ...)``, ``answered 0 (ReadTimeout: ...)``."""
    why = r.text if r.status == 0 and r.text else getattr(r, "transport_error", None) if r.status == 0 else None
    return f"answered {r.status}" + (f" ({why})" if why else "")


def stream_ttft_verdict(ex: Exchange, ttft_ms_limit: float | None) -> Verdict:
    """TTFT of one stream (ms) within the profile's ``slo.ttft_p95_ms``."""
    gate = f"streaming/ttft/{ex.api}"
    r = ex.reply
    ttft = first_token_s(r) if isinstance(r, StreamReply) and r.status == 200 else None
    ev = ex.evidence()
    if ttft is None:
        return Verdict(gate, FAIL, f"stream {_answered(r)} with no token chunk -> FAIL", measured=None,
                       limit=ttft_ms_limit, unit="ms", evidence=ev)
    if ttft_ms_limit is None:
        return Verdict(gate, SKIP, f"TTFT {ttft * 1000:.0f} ms; profile sets no slo.ttft_p95_ms", measured=ttft * 1000,
                       unit="ms", evidence=ev)
    ok = ttft * 1000 <= ttft_ms_limit
    return Verdict(gate, PASS if ok else FAIL, f"TTFT {ttft * 1000:,.0f} ms; SLO {ttft_ms_limit:,.0f} ms -> "
                   f"{'PASS' if ok else 'FAIL'}", measured=round(ttft * 1000, 2), limit=ttft_ms_limit, unit="ms",
                   evidence=ev)


def stream_idle_verdict(ex: Exchange, idle_timeout_s: float | None) -> Verdict:
    """The longest silence of the stream (before the first event included) stays below the
    gateway's idle timeout (``limits.stream_idle_timeout_s``)."""
    gate = f"streaming/idle-gap/{ex.api}"
    r = ex.reply
    gaps = stream_gaps(r) if isinstance(r, StreamReply) else []
    ev = {**ex.evidence(), "gaps_s_top5": sorted((round(g, 4) for g in gaps), reverse=True)[:5]}
    if not gaps:
        return Verdict(gate, FAIL, f"stream {_answered(r)} with no events -> FAIL", evidence=ev)
    worst = max(gaps)
    where = "before the first event" if gaps.index(worst) == 0 else f"after event {gaps.index(worst)}"
    if idle_timeout_s is None:
        return Verdict(gate, SKIP, f"longest gap {worst:.2f} s ({where}); profile sets no limits.stream_idle_timeout_s",
                       measured=worst, unit="s", evidence=ev)
    ok = worst < idle_timeout_s
    cut = getattr(r, "idle_cut_s", None) is not None and gaps.index(worst) == len(gaps) - 1
    if cut:  # the client cut the stream there (kvgate.http.watch): the silence lasted at least this long
        where += ", still silent when cut"
    return Verdict(gate, PASS if ok else FAIL, f"longest stream gap {'>= ' if cut else ''}{worst:.3f} s ({where}); "
                   f"gateway idle timeout {idle_timeout_s:g} s -> "
                   f"{'PASS' if ok else 'FAIL (the gateway would cut this stream)'}",
                   measured=round(worst, 4), limit=idle_timeout_s, unit="s", evidence=ev)


def stream_framing_verdict(ex: Exchange) -> Verdict:
    """Exactly one chunk with a finish_reason, then ``data: [DONE]`` last, nothing after it, no
    in-stream errors, every event JSON."""
    gate = f"streaming/framing/{ex.api}"
    r = ex.reply
    ev = ex.evidence()
    if not isinstance(r, StreamReply) or r.status != 200:
        return Verdict(gate, FAIL, f"stream {_answered(r)} -> FAIL", evidence=ev)
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
        return Verdict(gate, FAIL, "; ".join(problems) + " -> FAIL", measured="; ".join(problems),
                       limit="one finish chunk, then [DONE]", evidence=ev)
    return Verdict(gate, PASS, f"{len(r.events)} events, one finish chunk ({s.finish_reasons[0]!r}), then [DONE] -> PASS",
                   measured="one finish chunk, then [DONE]", limit="one finish chunk, then [DONE]", evidence=ev)


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
                       measured=len(got), limit=len(want), unit="chars", evidence=ev)
    return Verdict(gate, PASS, f"streamed deltas == non-streamed text ({len(got)} chars) -> PASS", measured=len(got),
                   limit=len(want), unit="chars", evidence=ev)


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
                       f"({len(want)} chars) -> FAIL", measured=len(sdk.text), limit=len(want), unit="chars", evidence=ev)
    return Verdict(gate, PASS, f"openai SDK parsed {sdk.chunks} chunks, same text -> PASS",
                   measured=len(sdk.text), limit=len(want) if want is not None else None, unit="chars",
                   evidence=ev)
