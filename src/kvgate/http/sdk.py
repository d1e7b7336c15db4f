"""Conformance with the official ``openai`` Python SDK: can it parse what the server streams?

Clients in the wild use the SDK, so a stream that kvgate's tolerant parser accepts but the SDK
chokes on is still a failure. :func:`sdk_stream` never raises: it returns what the SDK produced
and the exception it raised, if any.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import openai

from kvgate.http.client import Endpoint


@dataclass
class SdkStream:
    """``text``: concatenated deltas as the SDK parsed them; ``chunks``: chunk objects seen;
    ``finish_reasons``: non-null finish reasons; ``error``: ``"Type: message"`` if the SDK raised."""

    text: str
    chunks: int
    finish_reasons: list[str]
    error: str | None


def sdk_stream(endpoint: Endpoint, api: str, body: dict[str, Any], timeout_s: float = 60.0) -> SdkStream:
    """Stream ``body`` through ``openai.OpenAI`` (completions or chat); vLLM-only fields such as
    ``ignore_eos`` go through ``extra_body``. Refused at once (``error`` ``not sent: ...``) when the
    run's :class:`~kvgate.http.watch.EngineWatch` found the engine hung or the server stalling streams."""
    refused = endpoint.watch.refusal(stream=True) if endpoint.watch is not None else None
    if refused:
        return SdkStream("", 0, [], refused)
    std = {"model", "prompt", "messages", "max_tokens", "temperature", "seed", "stream_options", "logprobs", "n"}
    kwargs = {k: v for k, v in body.items() if k in std}
    extra = {k: v for k, v in body.items() if k not in std and k != "stream"}
    headers = {"Host": endpoint.host_header} if endpoint.host_header else None
    client = openai.OpenAI(base_url=endpoint.base_url.rstrip("/") + endpoint.route_prefix,
                           api_key=endpoint.api_key or "EMPTY", timeout=timeout_s, max_retries=0,
                           default_headers=headers)
    text, chunks, reasons = "", 0, []
    try:
        if api == "chat":
            stream = client.chat.completions.create(stream=True, extra_body=extra, **kwargs)
            for chunk in stream:
                chunks += 1
                for ch in chunk.choices:
                    text += ch.delta.content or ""
                    if ch.finish_reason:
                        reasons.append(ch.finish_reason)
        else:
            stream = client.completions.create(stream=True, extra_body=extra, **kwargs)
            for chunk in stream:
                chunks += 1
                for ch in chunk.choices:
                    text += ch.text or ""
                    if ch.finish_reason:
                        reasons.append(ch.finish_reason)
    except Exception as exc:  # the SDK's failure is the finding, whatever its type
        return SdkStream(text, chunks, reasons, f"{type(exc).__name__}: {str(exc)[:300]}")
    finally:
        client.close()
    return SdkStream(text, chunks, reasons, None)
