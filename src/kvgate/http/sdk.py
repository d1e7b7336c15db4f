"""Conformance with the official ``openai`` Python SDK: can it parse what the server streams?

Clients in the wild use the SDK, so a stream that kvgate's tolerant parser accepts but the SDK
chokes on is still a failure. :func:`sdk_stream` never raises: it returns what the SDK produced,
the exception it raised, if any, and what came back on the wire (status, content-type, the body's
first bytes): an SDK that parsed nothing from an HTML page raises nothing either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import httpx
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
    #: What came back on the wire, whatever the SDK made of it: the HTTP status (None: no answer),
    #: the content-type and the body's first :data:`HEAD_BYTES` bytes (decoded, replacement chars).
    status: int | None = None
    content_type: str = ""
    head: str = ""


#: Bytes of the answer's body kept for the verdict (an HTML page's title sits in its first few hundred).
HEAD_BYTES = 512


class _Tee(httpx.HTTPTransport):
    """httpx's transport, keeping the status, content-type and first :data:`HEAD_BYTES` body bytes
    of the last response as the SDK reads it (the SDK parses the bytes; this only looks)."""

    def __init__(self) -> None:
        super().__init__()
        self.status: int | None = None
        self.content_type = ""
        self.head = b""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        resp = super().handle_request(request)
        self.status, self.content_type, self.head = resp.status_code, resp.headers.get("content-type", ""), b""
        inner = resp.stream

        class _Stream(httpx.SyncByteStream):
            def __iter__(s) -> Iterator[bytes]:  # noqa: N805 -- the tee's own self is the outer one
                for chunk in inner:  # type: ignore[union-attr]
                    if len(self.head) < HEAD_BYTES:
                        self.head += chunk[:HEAD_BYTES - len(self.head)]
                    yield chunk

            def close(s) -> None:  # noqa: N805
                inner.close()  # type: ignore[union-attr]

        resp.stream = _Stream()
        return resp


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
    tee = _Tee()
    client = openai.OpenAI(base_url=endpoint.base_url.rstrip("/") + endpoint.route_prefix,
                           api_key=endpoint.api_key or "EMPTY", timeout=timeout_s, max_retries=0,
                           default_headers=headers, http_client=httpx.Client(transport=tee, timeout=timeout_s))
    text, chunks, reasons = "", 0, []

    def seen(error: str | None) -> SdkStream:
        return SdkStream(text, chunks, reasons, error, tee.status, tee.content_type,
                         tee.head.decode("utf-8", errors="replace"))

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
        return seen(f"{type(exc).__name__}: {str(exc)[:300]}")
    finally:
        client.close()
    return seen(None)
