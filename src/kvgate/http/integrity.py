"""The requests gate's ``integrity`` observation: does the path in front of the engine deliver every
byte while requests overlap?

Why (public reports, 2026): two chained Envoy ext_proc filters (the inference gateway's default
BBR + EPP) truncated ~80% of responses to 0-94 KB of ~130 KB, all HTTP 200 (envoy#43983); an AI
gateway on a two-hop HTTP/2 path delivered only the first two events of a ``/v1/responses`` stream
(envoyproxy/ai-gateway#2391); request bodies vanished at depth 4 under rapid requests
(praxis-proxy/ai#459). One request at a time sees none of it.

:func:`observe_overlap`: the long temperature-0 request (``ignore_eos``, logprobs) answered alone;
then ``concurrency`` requests sent at once (a barrier): that long request twice (not streamed and
streamed), the rest short ones of their own, alternately streamed and not; each body kept as it
came off the wire (:meth:`~kvgate.http.client.KvClient.stream_bytes`: the bytes, the declared
Content-Length, a broken connection), each conversation counted by ``/tokenize``. Where a
direct-to-pod endpoint is given, the long request once more, there. Judged by
:func:`kvgate.gates.requests.integrity_verdict`.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kvgate.http.client import EndpointUnreachable, KvClient
from kvgate.http.rendering import tokenize

#: Alternatives asked at each position of the long answer (a near tie needs the other's token).
TOP_LOGPROBS = 5
#: The long request's conversation (long enough to fill any cap with text).
LONG_PROMPT = "Tell a long story about a lighthouse keeper and the ships she guided home, in many sentences."
#: The fewest requests in flight at once (a profile at concurrency 1 still overlaps two).
MIN_CONCURRENCY = 2


@dataclass(frozen=True)
class Delivery:
    """One answer as delivered: ``label`` (which request), ``stream``, ``long`` (the long request),
    HTTP ``status``, ``content_length`` (declared; None: chunked), ``body`` (bytes received; a non-200's
    text), ``error`` (the connection broke, or nothing answered), ``rendered`` ([tokens] /tokenize's
    count of the conversation sent; None: no /tokenize), ``elapsed_s``."""

    label: str
    stream: bool
    long: bool
    status: int
    content_length: int | None
    body: bytes
    error: str | None
    rendered: int | None
    elapsed_s: float = 0.0


@dataclass
class Overlap:
    """``alone``: the long request answered alone; ``bodies``: the overlapped ones, in slot order;
    ``direct``: the long request on the direct-to-pod endpoint (None: none given); ``concurrency``:
    requests in flight at once."""

    concurrency: int
    alone: Delivery | None = None
    bodies: list[Delivery] = field(default_factory=list)
    direct: Delivery | None = None


def _body(model: str, text: str, max_tokens: int, kwargs: dict[str, Any] | None, *, stream: bool,
          logprobs: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}], "temperature": 0,
                            "max_tokens": max_tokens, "ignore_eos": True}
    if logprobs:
        body.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return body


def deliver(client: KvClient, label: str, body: dict[str, Any], rendered: int | None, *, long: bool,
            timeout_s: float) -> Delivery:
    """POST ``body`` to chat and keep what came off the wire (never raises). On a server that refuses
    one of vLLM's extensions (``ignore_eos``, probed once per run: :mod:`kvgate.http.extensions`) the
    body goes in its portable form -- the alone and the overlapped answers alike, so they still compare."""
    stream = bool(body.get("stream"))
    if client.endpoint.extensions is not None:
        body = client.endpoint.extensions.adapt(client, body)[0]
    try:
        r = client.stream_bytes(client.api("/chat/completions"), body, timeout_s=timeout_s)
    except EndpointUnreachable as exc:
        return Delivery(label, stream, long, 0, None, b"", str(exc), rendered)
    data = r.body if r.status == 200 else r.text.encode("utf-8", "replace")
    return Delivery(label, stream, long, r.status, r.content_length, data, r.transport_error, rendered, r.elapsed_s)


def observe_overlap(client: KvClient, model: str, *, concurrency: int, max_tokens: int, timeout_s: float,
                    direct: KvClient | None = None) -> Overlap:
    """The long request alone, then ``max(concurrency, MIN_CONCURRENCY)`` requests at once (module
    docstring), then the long request on ``direct``. ``max_tokens``: every request's output (tokens,
    ``ignore_eos``); ``timeout_s``: each request's bound."""
    c = max(concurrency, MIN_CONCURRENCY)
    kwargs = client.chat_template_kwargs
    texts = [LONG_PROMPT, LONG_PROMPT] + [f"Request {i}: name as many fruits as you can, one per line."
                                          for i in range(2, c)]
    counts: dict[str, int | None] = {}
    for text in dict.fromkeys(texts):
        counts[text] = tokenize(client, model, messages=[{"role": "user", "content": text}]).count
    out = Overlap(c)
    long_body = _body(model, LONG_PROMPT, max_tokens, kwargs, stream=False, logprobs=True)
    out.alone = deliver(client, "the long request alone", long_body, counts[LONG_PROMPT], long=True, timeout_s=timeout_s)
    slots = []
    for i, text in enumerate(texts):
        stream = i % 2 == 1
        long = text == LONG_PROMPT
        what = "the long request" if long else f"short request {i}"
        label = f"{what} in overlap ({'streamed' if stream else 'not streamed'})"
        slots.append((label, _body(model, text, max_tokens, kwargs, stream=stream, logprobs=long), counts[text], long))
    gate = threading.Barrier(len(slots))

    def one(slot: tuple[str, dict[str, Any], int | None, bool]) -> Delivery:
        label, body, rendered, long = slot
        gate.wait(timeout=timeout_s)
        return deliver(client, label, body, rendered, long=long, timeout_s=timeout_s)

    with ThreadPoolExecutor(max_workers=len(slots)) as pool:
        out.bodies = list(pool.map(one, slots))
    if direct is not None:
        out.direct = deliver(direct, "the long request on the direct endpoint", long_body, counts[LONG_PROMPT],
                             long=True, timeout_s=timeout_s)
    return out


__all__ = ["Delivery", "LONG_PROMPT", "MIN_CONCURRENCY", "Overlap", "TOP_LOGPROBS", "deliver", "observe_overlap"]
