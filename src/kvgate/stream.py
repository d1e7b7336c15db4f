"""Decode an OpenAI-style SSE stream (completions or chat) into what the gates compare.

Tolerant by design: a server that sends garbage yields a summary with ``undecodable`` entries,
never an exception, so the gate can report a conformance failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .client import StreamReply


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


def _choice_tokens(choice: dict[str, Any]) -> int | None:
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if isinstance(lp.get("tokens"), list):  # completions
        return len(lp["tokens"])
    if isinstance(lp.get("content"), list):  # chat
        return len(lp["content"])
    return None


def summarize(reply: StreamReply) -> StreamSummary:
    """Fold the events of ``reply`` into a :class:`StreamSummary`."""
    s = StreamSummary()
    seen_done = False
    for _, data in reply.events:
        if seen_done:
            s.events_after_done += 1
            continue
        if data.strip() == "[DONE]":
            seen_done = True
            continue
        try:
            obj = json.loads(data)
        except ValueError:
            s.undecodable.append(data[:200])
            continue
        if not isinstance(obj, dict):
            s.undecodable.append(data[:200])
            continue
        if "error" in obj:
            s.errors.append(obj["error"])
            continue
        if isinstance(obj.get("usage"), dict):
            s.usage = obj["usage"]
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict):
                s.undecodable.append(str(choice)[:200])
                continue
            s.content_chunks += 1
            delta = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(piece, str):
                s.text += piece
            n = _choice_tokens(choice)
            if n is not None:
                s.tokens_received = (s.tokens_received or 0) + n
            if choice.get("finish_reason"):
                s.finish_reasons.append(str(choice["finish_reason"]))
    s.done = seen_done
    return s
