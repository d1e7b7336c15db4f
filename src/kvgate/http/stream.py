"""Fold an OpenAI-style SSE stream (completions or chat) into what the gates compare.

What each event is (``[DONE]``, error, malformed, role/content/finish/usage chunk) is decided by
:func:`kvgate.http.sse.classify`; this module only folds a single probe's events into a
:class:`StreamSummary`. Tolerant by design: a server that sends garbage yields a summary with
``undecodable`` entries, never an exception, so the gate can report a conformance failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvgate.http.client import StreamReply
from kvgate.http.sse import DONE, ERROR, MALFORMED, classify


@dataclass
class StreamSummary:
    """``text``: concatenated deltas; ``finish_reasons``: every non-null finish_reason seen, in
    order; ``usage``: the last usage object; ``tokens_received``: tokens counted from per-chunk
    logprobs (None when the server sent no logprobs); ``content_chunks``: chunks carrying a choice;
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
            s.content_chunks += 1
            if choice.text is not None:
                s.text += choice.text
            if choice.logprob_tokens is not None:
                s.tokens_received = (s.tokens_received or 0) + choice.logprob_tokens
            if choice.finish_reason:
                s.finish_reasons.append(choice.finish_reason)
    s.done = seen_done
    return s
