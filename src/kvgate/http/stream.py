"""Fold an OpenAI-style SSE stream (completions or chat) into what the gates compare.

What each event is (``[DONE]``, error, malformed, role/content/finish/usage chunk) is decided by
:func:`kvgate.http.sse.classify`; this module only folds a single probe's events into a
:class:`StreamSummary`, and reads one raw stream three ways -- kvgate's framer, the ``openai`` SDK,
``httpx-sse`` -- beside its grammar (:func:`read_keepalive`, the streaming gate's keepalive case). Tolerant by design: a server that sends garbage yields a summary with
``undecodable`` entries, never an exception, so the gate can report a conformance failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvgate.http.client import RawStream, StreamReply
from kvgate.http.sse import CHUNK, DONE, ERROR, MALFORMED, Grammar, classify, grammar, second_parser, split_sse


@dataclass
class StreamSummary:
    """``text``: concatenated deltas; ``finish_reasons``: every non-null finish_reason seen, in
    order; ``usage``: the last usage object; ``tokens_received``: tokens counted from per-chunk
    logprobs (None when the server sent no logprobs); ``content_chunks``: choices carrying text (a
    chat stream's role-only first chunk and a finish-only last chunk with empty text -- HF
    ``transformers serve`` sends one apart from the last token -- are no token);
    ``errors``: in-stream ``{"error": ...}`` events; ``undecodable``: events that were not JSON."""

    text: str = ""
    finish_reasons: list[str] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    tokens_received: int | None = None
    content_chunks: int = 0
    errors: list[Any] = field(default_factory=list)
    undecodable: list[str] = field(default_factory=list)
    done: bool = False
    events_after_done: int = 0


def summarize(reply: StreamReply) -> StreamSummary:
    """Fold the events of ``reply`` into a :class:`StreamSummary`. Events after ``[DONE]`` are
    counted (``events_after_done``), not decoded."""
    s = StreamSummary()
    seen_done = False
    for _, data in reply.events:
        if seen_done:
            s.events_after_done += 1
            continue
        ev = classify(data)
        if ev.kind == DONE:
            seen_done = True
            continue
        if ev.kind == MALFORMED:
            s.undecodable.append(data[:200])
            continue
        if ev.kind == ERROR:
            s.errors.append(ev.error)
            continue
        if ev.usage is not None:
            s.usage = ev.usage
        s.undecodable.extend(str(bad)[:200] for bad in ev.bad_choices)
        for choice in ev.choices:
            if choice.text:
                s.content_chunks += 1
            if choice.text is not None:
                s.text += choice.text
            if choice.logprob_tokens is not None:
                s.tokens_received = (s.tokens_received or 0) + choice.logprob_tokens
            if choice.finish_reason:
                s.finish_reasons.append(choice.finish_reason)
    s.done = seen_done
    return s


@dataclass(frozen=True)
class Parsed:
    """One parser's reading of a raw stream: ``parser`` (``kvgate``, ``openai SDK``, ``httpx-sse``),
    ``events``: the chunks it yielded before ``[DONE]``, ``text``: their deltas concatenated,
    ``error``: why it stopped early (an exception, an event that is not JSON; None: it read the
    stream whole)."""

    parser: str
    events: int
    text: str
    error: str | None = None


def parse_datas(parser: str, datas: list[str]) -> Parsed:
    """Fold event ``datas`` as a client would: each a JSON chunk whose deltas are the text, up to
    ``[DONE]``; an event that is not a JSON object, or an in-stream error, stops it (``error``)."""
    text, n = "", 0
    for i, data in enumerate(datas):
        ev = classify(data)
        if ev.kind == DONE:
            break
        if ev.kind == MALFORMED:
            return Parsed(parser, n, text, f"event {i + 1} is not a JSON object: {data[:60]!r}")
        if ev.kind == ERROR:
            return Parsed(parser, n, text, f"event {i + 1} is an in-stream error: {ev.error_text}")
        if ev.kind == CHUNK:
            n += 1
            text += "".join(c.piece for c in ev.choices)
    return Parsed(parser, n, text)


@dataclass
class KeepaliveRead:
    """A raw long-prefill stream (``raw``), its :func:`kvgate.http.sse.grammar`, and the three
    parsers' readings (``parsed``: kvgate's framer, the openai SDK, httpx-sse), for the streaming
    gate's keepalive case. ``prompt_tokens``: the prompt's length (verified with /tokenize)."""

    api: str
    raw: RawStream
    grammar: Grammar
    parsed: list[Parsed]
    prompt_tokens: int | None = None


def read_keepalive(api: str, raw: RawStream, prompt_tokens: int | None = None) -> KeepaliveRead:
    """Read ``raw`` (``api``: "chat" or "completions") with its grammar and the three parsers; no
    request is sent (the SDK reads the same bytes over a mock transport, :func:`kvgate.http.sdk.sdk_replay`)."""
    body = raw.body
    _, kv = split_sse([t for t, _ in raw.pieces], [b for _, b in raw.pieces])
    from kvgate.http.sdk import sdk_replay  # the openai + anthropic SDKs: ~1.4 s to import, only when a stream is read

    sdk = sdk_replay(api, body)
    try:
        second = parse_datas("httpx-sse", second_parser(body))
    except Exception as exc:  # the parser's failure is the finding
        second = Parsed("httpx-sse", 0, "", f"{type(exc).__name__}: {str(exc)[:200]}")
    return KeepaliveRead(api, raw, grammar(raw.pieces), [parse_datas("kvgate", kv),
                                                         Parsed("openai SDK", sdk.chunks, sdk.text, sdk.error), second],
                         prompt_tokens)
