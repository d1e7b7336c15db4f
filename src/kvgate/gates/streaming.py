"""Gate ``streaming``: TTFT within the SLO, the longest silence below the gateway idle timeout,
exactly one finish chunk then ``[DONE]``, deltas concatenate to the non-streamed text, the official
``openai`` SDK parses the stream, the content is not held back by a buffering proxy, and a
long-prefill stream's keepalives keep to the SSE grammar and keep an event-counting idle timer
fed (:func:`keepalive_verdict`). Asserted by ``suites/test_streaming.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvgate.http.client import Reply, StreamReply
from kvgate.http.probes import BURST_GAP_S, Exchange
from kvgate.http.sse import GrammarProblem, classify, largest_gap
from kvgate.http.stream import KeepaliveRead, summarize
from kvgate.http.text import clip, describe_answer
from kvgate.verdict import Status, Verdict, combine, printable
from kvgate.gates.common import FAIL, PASS, SKIP, json_body

INVALID = Status.INVALID



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
    """At temperature 0 with a seed, the concatenated deltas equal the non-streamed text. Two empty
    texts are not equal evidence: both empty (a generation asked for ``max_tokens`` with
    ``ignore_eos``) FAILs."""
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
    if not got:
        return Verdict(gate, FAIL, f"streamed deltas and the non-streamed text are both empty ({len(streamed.reply.events)} "
                       "events): nothing was generated to compare -> FAIL", measured=0, limit=">0", unit="chars",
                       evidence=ev)
    return Verdict(gate, PASS, f"streamed deltas == non-streamed text ({len(got)} chars) -> PASS", measured=len(got),
                   limit=len(want), unit="chars", evidence=ev)


def sdk_verdict(api: str, sdk: Any, plain: Exchange) -> Verdict:
    """The official openai SDK parses the stream without error and gets the same text. Never a
    PASS on nothing: a stream the SDK parsed no chunk (or no finish_reason) from FAILs naming what
    came back (status, content-type, the body described and clipped: an HTML page answered 200
    parses as zero events, no exception, an empty text); no answer at all is INVALID. The
    non-streamed text must exist to compare with."""
    gate = f"streaming/openai-sdk/{api}"
    want = _plain_text(plain)
    got = printable(describe_answer(sdk.status or 0, sdk.head or sdk.error or "", {"content-type": sdk.content_type}))
    ev = {"sdk_chunks": sdk.chunks, "sdk_error": sdk.error, "sdk_finish_reasons": sdk.finish_reasons,
          "status": sdk.status, "content_type": printable(clip(sdk.content_type, 80)),
          "body_head": printable(clip(sdk.head, 300))}
    if sdk.error and sdk.status is None:
        return Verdict(gate, INVALID, f"the openai SDK's stream got no answer ({clip(sdk.error, 200)}) -> INVALID "
                       "(nothing was parsed to judge)", measured=None, limit="parses", evidence=ev)
    if sdk.error:
        return Verdict(gate, FAIL, f"openai SDK failed on the stream after {sdk.chunks} chunks: {sdk.error} -> FAIL",
                       measured=sdk.error, limit="parses", evidence=ev)
    if sdk.chunks == 0 or not sdk.finish_reasons:
        what = "no chunk" if sdk.chunks == 0 else f"{sdk.chunks} chunks but no finish_reason"
        return Verdict(gate, FAIL, f"openai SDK parsed {what} from the stream: it answered {sdk.status} "
                       f"{printable(clip(sdk.content_type, 60)) or 'with no content-type'}, {got} -> FAIL (a client sees an empty "
                       "answer and no error)", measured=sdk.chunks, limit="chunks and a finish_reason", unit="chunks",
                       evidence=ev)
    if want is None:
        return Verdict(gate, FAIL, f"openai SDK parsed {sdk.chunks} chunks ({len(sdk.text)} chars), but the "
                       f"non-streamed request answered {plain.reply.status} without text to compare with -> FAIL",
                       measured=len(sdk.text), unit="chars", evidence=ev)
    if not sdk.text and not want:
        return Verdict(gate, FAIL, f"openai SDK parsed {sdk.chunks} chunks with no text, and the non-streamed text is "
                       "empty too: nothing was generated to compare -> FAIL", measured=0, limit=">0", unit="chars",
                       evidence=ev)
    if sdk.text != want:
        return Verdict(gate, FAIL, f"openai SDK text ({len(sdk.text)} chars) differs from the non-streamed text "
                       f"({len(want)} chars) -> FAIL", measured=len(sdk.text), limit=len(want), unit="chars", evidence=ev)
    return Verdict(gate, PASS, f"openai SDK parsed {sdk.chunks} chunks, finish_reason {sdk.finish_reasons[-1]!r}, "
                   f"the non-streamed text ({len(want)} chars) -> PASS", measured=len(sdk.text), limit=len(want),
                   unit="chars", evidence=ev)


#: A stream is judged for buffering only with at least this many content chunks: a short answer fits
#: in one TCP segment and may reach the client in one read from any server.
BUFFER_MIN_CHUNKS = 16
#: Content chunks per read, on average, from which a stream counts as delivered in bursts (a healthy
#: stream arrives about one decode step per read: vLLM writes each chunk as it is made, one per step by default).
BUFFER_MIN_BURST = 8
#: Seconds content must have been held back (the silence before a burst) for the stream to be judged
#: buffered. A client starved of CPU reads a healthy stream in bunches too -- this project measured one
#: reading 32 events at once 0.5 s after the server sent the first (tests/test_gates_disconnect.py) --
#: so a hold is judged only from twice that; a shorter hold costs the user at most that much TTFT,
#: which ``streaming/ttft`` judges against the SLO.
BUFFER_MIN_HOLD_S = 1.0
#: Bytes a read must carry to count as a buffer's flush (nginx's proxy buffers are 4 or 8 KB pages;
#: a healthy stream reads one event, ~250 bytes for vLLM, at a time).
BUFFER_MIN_PIECE_BYTES = 2048
#: [s] Least silence that separates two of a proxy's flushes when the pieces are sized: wider than
#: :data:`kvgate.http.probes.BURST_GAP_S` (one read), because a client on a loaded host parses the events of
#: one 16 KB read over milliseconds (6.6 ms measured with two CPU hogs on a 2-core host); a 16 KB
#: buffer in front of a server at 1 ms a token flushes ~60 ms apart. The pieces are split at silences
#: of a quarter of the :data:`BUFFER_MIN_PIECES`-th longest or more (:func:`delivery`), this at least.
PIECE_GAP_S = 0.005
#: Flushes (pieces before the last) of one size a stream must show for a fixed-size buffer to be named.
BUFFER_MIN_PIECES = 3
#: Framing bytes an SSE event carries besides its data (``data: `` and the blank line).
SSE_FRAMING_BYTES = 8
#: [s] Generation the buffering probe asks for, at the server's measured decode rate: long enough that
#: a 16 KB buffer fills and flushes several times (a 64-token answer, ~16 KB, fits one buffer whole, and
#: a fast server makes it in 0.4 s: one burst held less than :data:`BUFFER_MIN_HOLD_S`).
BUFFER_PROBE_S = 1.5
#: Bytes of events the buffering probe asks for at least: four 16 KB buffers (the issue-33 gateway's),
#: so such a buffer flushes :data:`BUFFER_MIN_PIECES` times before the rest comes at the end.
BUFFER_PROBE_BYTES = 4 * 16384
#: What a user must change when the stream is buffered (nginx / ingress-nginx; Envoy streams by default).
BUFFERING_FIX = "set proxy_buffering off / X-Accel-Buffering: no"


@dataclass(frozen=True)
class Delivery:
    """How a stream's content chunks reached the client, from the arrival times the client recorded
    (:attr:`kvgate.http.client.StreamReply.events`; seconds since the request was sent).

    ``chunks``: content chunks (decode steps, :func:`first_token_s`'s rule); ``bursts``: runs of them
    less than :data:`kvgate.http.probes.BURST_GAP_S` apart (one read each); ``first_s``/``last_s``:
    arrival of the first and last; ``widest_s``: the longest span of one burst; ``held_s``: the
    longest silence before a burst (send -> first content chunk, or between bursts) and
    ``held_chunks`` the size of that burst; ``e2e_s``: the whole stream; ``pieces``: bytes of the
    events of each piece -- split at silences of :data:`PIECE_GAP_S`, or of a quarter of the
    :data:`BUFFER_MIN_PIECES`-th longest silence, whichever is longer -- (every event, framing
    counted, :data:`SSE_FRAMING_BYTES`), the last piece left out (it holds the rest when the
    response ended); ``event_max``: the largest event's bytes."""

    chunks: int
    bursts: int
    first_s: float | None
    last_s: float | None
    widest_s: float
    held_s: float
    held_chunks: int
    e2e_s: float
    pieces: tuple[int, ...] = ()
    event_max: int = 0

    @property
    def fixed_pieces(self) -> bool:
        """The reads before the last carry one size: :data:`BUFFER_MIN_PIECES` or more of them, each
        :data:`BUFFER_MIN_PIECE_BYTES` or more, differing by at most one event (a flush may split an
        event, whose rest comes with the next). A proxy's buffer flushed each time it filled -- a client
        that reads late reads whatever arrived, in sizes that follow its stalls. In front of a fast
        server the flushes come less than :data:`BUFFER_MIN_HOLD_S` apart: this names them anyway."""
        p = self.pieces
        return (len(p) >= BUFFER_MIN_PIECES and min(p) >= BUFFER_MIN_PIECE_BYTES
                and max(p) - min(p) <= 1.5 * self.event_max)

    @property
    def bunched(self) -> bool:
        """Enough chunks, and on average :data:`BUFFER_MIN_BURST` or more of them per read."""
        return self.chunks >= BUFFER_MIN_CHUNKS and self.bursts * BUFFER_MIN_BURST <= self.chunks

    @property
    def buffered(self) -> bool:
        """Delivered in bursts after a hold of :data:`BUFFER_MIN_HOLD_S` or more, or in pieces of one
        size (:attr:`fixed_pieces`): a proxy in front held the SSE bytes (until a buffer filled, or the
        response ended)."""
        return self.bunched and (self.held_s >= BUFFER_MIN_HOLD_S or self.fixed_pieces)

    def burst(self) -> str:
        """The burst in words: ``all 128 content chunks arrived within 3 ms, 2.41 s after the
        request`` (one burst) or ``128 content chunks arrived in 3 bursts (each within 2 ms); 70 of
        them after 1.42 s of silence``."""
        if self.bursts == 1:
            return (f"all {self.chunks} content chunks arrived within {_ms(self.widest_s)}, {self.first_s:.2f} s after "
                    "the request")
        if self.fixed_pieces:  # sized flushes name the buffer, however long a loaded host made the holds
            lo, hi = min(self.pieces) / 1024, max(self.pieces) / 1024
            return (f"{self.chunks} content chunks arrived in {self.bursts} bursts (each within {_ms(self.widest_s)}), "
                    f"the {len(self.pieces)} before the last {lo:.1f}-{hi:.1f} KB each (a buffer of ~{hi:.0f} KB "
                    f"flushed each time it filled), {self.held_s:.2f} s apart at most")
        return (f"{self.chunks} content chunks arrived in {self.bursts} bursts (each within {_ms(self.widest_s)}); "
                f"{self.held_chunks} of them after {self.held_s:.2f} s of silence")

    def evidence(self) -> dict[str, Any]:
        return {"content_chunks": self.chunks, "bursts": self.bursts, "first_content_s": _r(self.first_s),
                "last_content_s": _r(self.last_s), "widest_burst_s": _r(self.widest_s), "held_s": _r(self.held_s),
                "held_chunks": self.held_chunks, "e2e_s": _r(self.e2e_s), "burst_gap_s": BURST_GAP_S,
                "min_chunks": BUFFER_MIN_CHUNKS, "min_per_burst": BUFFER_MIN_BURST, "min_hold_s": BUFFER_MIN_HOLD_S,
                "piece_bytes": list(self.pieces), "event_max_bytes": self.event_max,
                "fixed_pieces": self.fixed_pieces}


def _ms(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s >= 0.001 else "1 ms"


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def reads(times: list[float], gap_s: float = BURST_GAP_S) -> list[list[float]]:
    """Arrival times (seconds, ascending) grouped into the reads they came in: runs of chunks less
    than ``gap_s`` (:data:`kvgate.http.probes.BURST_GAP_S`) apart."""
    runs: list[list[float]] = []
    for i, t in enumerate(times):
        if runs and t - times[i - 1] < gap_s:
            runs[-1].append(t)
        else:
            runs.append([t])
    return runs


def delivery(reply: StreamReply) -> Delivery:
    """Fold a stream's content-chunk arrival times into a :class:`Delivery` (pure; no I/O)."""
    times = [t for t, data in reply.events if classify(data).is_content]
    if not times:
        return Delivery(0, 0, None, None, 0.0, 0.0, 0, reply.elapsed_s)
    runs = reads(times)
    silences = [(runs[0][0], len(runs[0]))] + [(b[0] - a[-1], len(b)) for a, b in zip(runs, runs[1:])]
    held_s, held_chunks = max(silences)
    sizes = [len(data.encode()) + SSE_FRAMING_BYTES for _, data in reply.events]
    pieces, at = [], 0
    stamps = [t for t, _ in reply.events]
    quiet = sorted((b - a for a, b in zip(stamps, stamps[1:])), reverse=True)
    gap = max(PIECE_GAP_S, quiet[BUFFER_MIN_PIECES - 1] / 4 if len(quiet) >= BUFFER_MIN_PIECES else 0.0)
    for run in reads(stamps, gap):
        pieces.append(sum(sizes[at:at + len(run)]))
        at += len(run)
    return Delivery(len(times), len(runs), times[0], times[-1], max(r[-1] - r[0] for r in runs), held_s, held_chunks,
                    reply.elapsed_s, tuple(pieces[:-1]), max(sizes))


def buffer_probe_tokens(tokens: int, took_s: float | None, most: int, event_bytes: float = 0.0) -> int | None:
    """Tokens the buffering probe asks for so that it generates for :data:`BUFFER_PROBE_S` or more
    at the decode rate a request of ``tokens`` tokens that took ``took_s`` seconds measured (its
    duration includes the TTFT, so the rate is a lower bound and the length errs long) and makes
    :data:`BUFFER_PROBE_BYTES` of events at ``event_bytes`` a token (measured on a stream of it),
    at most ``most`` (the server's cap, the context). None when the request already took that
    long (its stream is the probe) or was not timed (``took_s`` None: it failed; the stream itself
    is judged), or when ``most`` leaves no room for more."""
    took = took_s
    if took is None or took >= BUFFER_PROBE_S or took <= 0:
        return None
    want = max(math.ceil(tokens * BUFFER_PROBE_S / took), math.ceil(BUFFER_PROBE_BYTES / event_bytes) if event_bytes else 0)
    return min(want, most) if min(want, most) > tokens else None


def undecided(reply: Any) -> bool:
    """Whether a stream's delivery leaves buffering undecided: its content came bunched (as from a
    buffer, or to a client that read late) but was not judged buffered. A stream read as it was
    generated, one event a read, rules a buffer out: no longer probe is needed."""
    if not isinstance(reply, StreamReply) or reply.status != 200:
        return False
    d = delivery(reply)
    return d.bunched and not d.buffered


def event_bytes(reply: Any) -> float:
    """Mean bytes of a stream's content events on the wire (data and framing), 0.0 without any."""
    sizes = [len(d.encode()) + SSE_FRAMING_BYTES for _, d in getattr(reply, "events", []) if classify(d).is_content]
    return sum(sizes) / len(sizes) if sizes else 0.0


def buffering_verdict(ex: Exchange, plain: Exchange | None = None) -> Verdict:
    """The stream's content reaches the client as it is generated, not held back by a proxy in
    front that buffers the SSE bytes until a buffer fills or the response ends (dstack#4269).

    FAIL: :data:`BUFFER_MIN_CHUNKS` or more content chunks, :data:`BUFFER_MIN_BURST` or more per
    read on average, after a silence of :data:`BUFFER_MIN_HOLD_S` or more. A stream spread over its
    reads PASSes; a bunched one held less than that PASSes with the reason (a client that read late
    looks the same, and the TTFT check judges what it cost); fewer chunks SKIP. ``plain``: the same
    request non-streamed, whose duration says how long the generation itself took."""
    gate = f"streaming/buffering/{ex.api}"
    r = ex.reply
    if not isinstance(r, StreamReply) or r.status != 200:
        return Verdict(gate, FAIL, f"stream {_answered(r)} -> FAIL", evidence=ex.evidence())
    d = delivery(r)
    ev = {**ex.evidence(), "delivery": d.evidence()}
    took = (f"generation took {plain.reply.elapsed_s:.2f} s, timed non-streamed" if plain is not None
            and plain.reply.status == 200 else f"the stream ended {d.e2e_s:.2f} s after the request")
    if d.chunks == 0:
        return Verdict(gate, FAIL, f"stream {_answered(r)} with no content chunk -> FAIL", evidence=ev)
    if d.chunks < BUFFER_MIN_CHUNKS:
        return Verdict(gate, SKIP, f"only {d.chunks} content chunks; buffering is judged from {BUFFER_MIN_CHUNKS} "
                       "(fewer fit in one read from any server)", measured=d.chunks, unit="chunks", evidence=ev)
    common = dict(measured=round(d.held_s, 4), limit=BUFFER_MIN_HOLD_S, unit="s", evidence=ev)
    if d.buffered:
        return Verdict(gate, FAIL, f"{d.burst()} ({took}) -> FAIL (the stream is buffered: a proxy in front holds "
                       f"the SSE bytes; {BUFFERING_FIX})", **common)
    if d.bunched:
        return Verdict(gate, PASS, f"{d.burst()}: held back less than {BUFFER_MIN_HOLD_S:g} s, which cannot be told "
                       "from a client that read late (streaming/ttft judges the wait) -> PASS", **common)
    return Verdict(gate, PASS, f"{d.chunks} content chunks arrived in {d.bursts} reads over "
                   f"{d.last_s - d.first_s:.2f} s (first {d.first_s:.2f} s after the request; longest wait "
                   f"{d.held_s:.2f} s): streamed as generated -> PASS", **common)


# ------------------------------------------------------------------------------------------ keepalive

#: What each grammar problem says when it decides the verdict (its ``cause``), before the frame.
_GRAMMAR_CAUSES = {
    "data-colon": "a keepalive comment is sent as a data: event",
    "empty-event": "an event carries empty data",
    "no-data-dispatch": "a frame carries a field but no data: (a keepalive after an id: line)",
    "not-a-field": "a keepalive is a bare line, not a ':' comment",
}


def keepalive_verdict(read: KeepaliveRead | None, idle_timeout_s: float | None, skip: str | None = None) -> Verdict:
    """A long-prefill stream (the max-context prompt, streamed) read byte for byte: its frames keep
    to the SSE grammar (:func:`kvgate.http.sse.grammar`: comments only as ``:`` lines, no ``data:``
    starting with ``:``, no empty event, no dispatch on ``id:`` alone); kvgate's framer, the openai
    SDK and httpx-sse agree on its events and text; the largest gap between *data events* (the
    wait for the first included) stays below ``limits.stream_idle_timeout_s`` -- an idle timer that
    counts events is not reset by comment keepalives, so it is judged beside the largest byte gap.

    Parts (``streaming/keepalive/grammar``, ``/parsers``, ``/gap``) folded by
    :func:`kvgate.verdict.combine`. FAIL: a frame breaking the grammar (named raw, line ends written
    out), a parser that failed or disagrees (each named with its count, text length and error), a
    data-event gap at or past the timeout (named with the byte gap), a stream that was not 200 or
    carried no data event. The gap part SKIPs without a timeout in the profile; the whole case
    SKIPs with ``skip`` (no exact-length prompt could be built: the reason)."""
    gate = "streaming/keepalive"
    if skip is not None or read is None:
        return Verdict(gate, SKIP, f"no long-prefill stream to read: {skip or 'not sent'} -> SKIP")
    raw, g = read.raw, read.grammar
    prompt = f"the {read.prompt_tokens:,}-token prompt" if read.prompt_tokens else "the max-context prompt"
    byte_gap, bi = largest_gap([t for t, _ in raw.pieces])
    data_gap, di = largest_gap(g.data_times)
    ev = {"api": read.api, "status": raw.status, "prompt_tokens": read.prompt_tokens, "bytes": len(raw.body),
          "pieces": len(raw.pieces), "frames": len(g.frames), "data_events": len(g.data_times),
          "keepalive_comments": g.keepalives, "largest_data_gap_s": round(data_gap, 4),
          "largest_byte_gap_s": round(byte_gap, 4), "idle_timeout_s": idle_timeout_s,
          "transport_error": raw.transport_error,
          "problems": [{"kind": p.kind, "frame": printable(p.frame.shown), "t_s": round(p.frame.t, 4)} for p in g.problems],
          "parsers": {p.parser: {"events": p.events, "chars": len(p.text), "error": p.error} for p in read.parsed},
          "first_frames": [printable(f.shown) for f in g.frames[:4]]}
    if raw.status != 200:
        return Verdict(gate, FAIL, f"the long-prefill stream ({prompt}) {_answered(raw)}: "
                       f"{describe_answer(raw.status, raw.text, {'content-type': raw.content_type})} -> FAIL", evidence=ev)
    if not g.data_times:
        return Verdict(gate, FAIL, f"the long-prefill stream ({prompt}) carried no data event in {len(raw.body):,} bytes"
                       f"{f' ({raw.transport_error})' if raw.transport_error else ''} -> FAIL", evidence=ev)
    return combine(gate, [_grammar_part(g.problems, len(g.frames), g.keepalives, ev),
                          _parsers_part(read, g.problems, ev),
                          _gap_part(data_gap, di, byte_gap, bi, g.keepalives, idle_timeout_s, prompt, ev)],
                   headline=f"{gate}/gap")


def _grammar_part(problems: list[GrammarProblem], frames: int, keepalives: int, ev: dict[str, Any]) -> Verdict:
    gid = "streaming/keepalive/grammar"
    if problems:
        first: dict[str, GrammarProblem] = {}
        for p in problems:
            first.setdefault(p.kind, p)
        named = [f"`{p.frame.shown[:80]}` at {p.frame.t:.3f} s: {p.what}" for p in first.values()]
        cause = "; ".join(f"{_GRAMMAR_CAUSES[k]} (`{p.frame.shown[:60]}`)" for k, p in first.items())
        return Verdict(gid, FAIL, f"{len(problems)} of {frames} SSE frames break the grammar clients parse: "
                       f"{'; '.join(named)} -> FAIL", measured=len(problems), limit=0, unit="frames", evidence=ev,
                       cause=cause)
    return Verdict(gid, PASS, f"{frames} SSE frames ({keepalives} comment keepalives) keep to the grammar -> PASS",
                   measured=0, limit=0, unit="frames", evidence=ev)


def _parsers_part(read: KeepaliveRead, problems: list[GrammarProblem], ev: dict[str, Any]) -> Verdict:
    gid = "streaming/keepalive/parsers"
    ps = read.parsed
    said = [f"{p.parser} {p.events} events ({len(p.text)} chars)" + (f", then {p.error}" if p.error else "") for p in ps]
    agree = len({(p.events, p.text) for p in ps}) == 1 and not any(p.error for p in ps)
    if not agree:
        cause = f"{_GRAMMAR_CAUSES[problems[0].kind]} (`{problems[0].frame.shown[:60]}`)" if problems else None
        return Verdict(gid, FAIL, f"the SSE parsers do not read the stream alike: {'; '.join(said)} -> FAIL (a client "
                       "on one of them breaks or sees another answer)", measured="; ".join(said), limit="all agree",
                       evidence=ev, cause=cause)
    return Verdict(gid, PASS, f"kvgate, the openai SDK and httpx-sse read the same {ps[0].events} events "
                   f"({len(ps[0].text)} chars) -> PASS", measured=ps[0].events, limit=ps[0].events, unit="events",
                   evidence=ev)


def _gap_part(data_gap: float, di: int, byte_gap: float, bi: int, keepalives: int, limit: float | None,
              prompt: str, ev: dict[str, Any]) -> Verdict:
    gid = "streaming/keepalive/gap"
    where = "before the first data event" if di == 0 else f"after data event {di}"
    both = (f"largest gap between data events {data_gap:.3f} s ({where}), largest gap between bytes {byte_gap:.3f} s "
            f"({keepalives} comment keepalives)")
    if limit is None:
        return Verdict(gid, SKIP, f"{both}; the profile sets no limits.stream_idle_timeout_s -> SKIP", measured=round(data_gap, 4),
                       unit="s", evidence=ev)
    if data_gap >= limit:
        hidden = byte_gap < limit
        tail = (f"the keepalives kept bytes flowing, but an idle timer that counts events (stream_idle_timeout_s "
                f"{limit:g} s) cuts this stream" if hidden else f"nothing came for {byte_gap:.3f} s: any idle timer "
                f"({limit:g} s) cuts this stream")
        wait = f"{where} (the TTFT of {prompt})" if di == 0 else where
        cause = (f"comment keepalives hid a {data_gap:.3f} s wait for data {wait}: bytes came every {byte_gap:.3f} s "
                 "at most" if hidden else None)
        return Verdict(gid, FAIL, f"{both}: {tail} -> FAIL", measured=round(data_gap, 4), limit=limit, unit="s",
                       evidence=ev, cause=cause)
    return Verdict(gid, PASS, f"{both} on {prompt}; an event-counting idle timeout of {limit:g} s is not reached -> PASS",
                   measured=round(data_gap, 4), limit=limit, unit="s", evidence=ev)
