"""Conformance with the official ``openai`` and ``anthropic`` Python SDKs: can they parse what
the server streams?

Clients in the wild use the SDKs, so a stream that kvgate's tolerant parser accepts but an SDK
chokes on is still a failure. :func:`sdk_stream`, :func:`sdk_responses_stream` and
:func:`sdk_messages_stream` never raise: they return what the SDK produced and the exception it
raised, if any; :func:`sdk_stream` also what came back on the wire (status, content-type, the
body's first bytes): an SDK that parsed nothing from an HTML page raises nothing either.

:class:`SdkType` (:data:`RESPONSE_EVENT`, :data:`MESSAGE_EVENT`, :data:`RESPONSE`, :data:`MESSAGE`,
:data:`CHAT_COMPLETION`, :data:`COMPLETION`): an SDK's type for what a server sends, the concrete
class its ``type`` selects, and the SDK's own default parse of it (what a client gets).
"""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import httpx
import openai
import openai._models
import pydantic
from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.responses import Response, ResponseStreamEvent

from kvgate.http.client import Endpoint

if TYPE_CHECKING:
    import anthropic


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
    if (refused := _refused(endpoint)) is not None:
        return SdkStream("", 0, [], refused)
    std = {"model", "prompt", "messages", "max_tokens", "temperature", "seed", "stream_options", "logprobs", "n"}
    kwargs = {k: v for k, v in body.items() if k in std}
    extra = {k: v for k, v in body.items() if k not in std and k != "stream"}
    tee = _Tee()
    client = openai_client(endpoint, timeout_s, http_client=httpx.Client(transport=tee, timeout=timeout_s))
    got = _Fold()

    def seen(error: str | None) -> SdkStream:
        return SdkStream(got.text, got.chunks, got.reasons, error, tee.status, tee.content_type,
                         tee.head.decode("utf-8", errors="replace"))

    try:
        create = client.chat.completions.create if api == "chat" else client.completions.create
        got.read(create(stream=True, extra_body=extra, **kwargs), api)
    except Exception as exc:  # the SDK's failure is the finding, whatever its type
        return seen(f"{type(exc).__name__}: {str(exc)[:300]}")
    finally:
        client.close()
    return seen(None)


def sdk_replay(api: str, body: bytes, model: str = "kvgate-replay") -> SdkStream:
    """Parse ``body`` -- the raw bytes of an SSE answer kvgate already received -- with the
    ``openai`` SDK exactly as a client streaming it would (``create(stream=True)`` over an
    ``httpx.MockTransport`` that answers those bytes, 200 ``text/event-stream``): no request is
    sent, nothing generated. ``api``: "chat" or "completions". Never raises: the SDK's exception is
    ``error``, with the chunks it yielded before it."""
    transport = httpx.MockTransport(lambda request: httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=body))
    client = openai.OpenAI(base_url="http://kvgate.replay/v1", api_key="EMPTY", max_retries=0,
                           http_client=httpx.Client(transport=transport))
    got = _Fold()
    try:
        if api == "chat":
            got.read(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "."}],
                                                    stream=True), api)
        else:
            got.read(client.completions.create(model=model, prompt=".", stream=True), api)
    except Exception as exc:  # the SDK's failure is the finding, whatever its type
        return SdkStream(got.text, got.chunks, got.reasons, f"{type(exc).__name__}: {str(exc)[:300]}", 200,
                         "text/event-stream")
    finally:
        client.close()
    return SdkStream(got.text, got.chunks, got.reasons, None, 200, "text/event-stream",
                     body[:HEAD_BYTES].decode("utf-8", "replace"))


@dataclass
class _Fold:
    """What a client streaming through the SDK has read so far (kept when the SDK raises midway):
    the concatenated text, the chunks, the finish reasons."""

    text: str = ""
    chunks: int = 0
    reasons: list[str] = field(default_factory=list)

    def read(self, stream: Any, api: str) -> None:
        """Fold the SDK's chunk iterator; ``api``: "chat" (``delta.content``) or "completions" (``text``)."""
        for chunk in stream:
            self.chunks += 1
            for ch in chunk.choices:
                self.text += (ch.delta.content if api == "chat" else ch.text) or ""
                if ch.finish_reason:
                    self.reasons.append(ch.finish_reason)


def _refused(endpoint: Endpoint) -> str | None:
    """Why nothing may be sent now (the run's :class:`~kvgate.http.watch.EngineWatch` found the
    engine hung or the server stalling streams), else None."""
    return endpoint.watch.refusal(stream=True) if endpoint.watch is not None else None


def openai_client(endpoint: Endpoint, timeout_s: float, http_client: httpx.Client | None = None) -> openai.OpenAI:
    """``openai.OpenAI`` for ``endpoint`` (its route prefix, key, Host header; no retries);
    ``http_client``: the transport to read through (sdk_stream's tee of the wire)."""
    headers = {"Host": endpoint.host_header} if endpoint.host_header else None
    return openai.OpenAI(base_url=endpoint.base_url.rstrip("/") + endpoint.route_prefix,
                         api_key=endpoint.api_key or "EMPTY", timeout=timeout_s, max_retries=0,
                         default_headers=headers, http_client=http_client)


def anthropic_client(endpoint: Endpoint, timeout_s: float) -> anthropic.Anthropic:
    """``anthropic.Anthropic`` for ``endpoint``: the SDK appends ``/v1/messages`` to its base URL,
    so the base is the route prefix without its ``/v1``; the key goes as ``Authorization: Bearer``
    (what vLLM's ``--api-key`` checks on every route)."""
    import anthropic  # ~2 s to import (more than openai): only when a /v1/messages case runs (_anthropic)

    _anthropic()  # the SDK's types read before the SDK itself parses a reply, as when they were built at import
    headers = {"Host": endpoint.host_header} if endpoint.host_header else None
    prefix = endpoint.route_prefix.rstrip("/").removesuffix("/v1")
    return anthropic.Anthropic(base_url=endpoint.base_url.rstrip("/") + prefix, api_key=None,
                               auth_token=endpoint.api_key or "EMPTY", timeout=timeout_s, max_retries=0,
                               default_headers=headers)


@dataclass
class SdkFinal:
    """What an SDK's stream helper ended with: ``text`` (its final object's text), ``finish``
    (Responses ``status`` / Messages ``stop_reason``), ``error`` (``"Type: message"`` if it raised)."""

    text: str
    finish: str | None
    error: str | None


def _failed(exc: Exception) -> SdkFinal:
    return SdkFinal("", None, f"{type(exc).__name__}: {str(exc)[:300]}")


def sdk_responses_stream(endpoint: Endpoint, body: dict[str, Any], timeout_s: float = 60.0) -> SdkFinal:
    """Stream a Responses ``body`` through ``client.responses.stream`` (its accumulator checks the
    events' identities) and read the response of the terminal event (``response.completed`` /
    ``incomplete`` / ``failed``: its ``output_text`` and ``status``); non-SDK fields go through
    ``extra_body``. Not ``get_final_response()``: openai 3.57 raises there unless the stream ended
    with ``response.completed``, although the spec ends an incomplete response with
    ``response.incomplete`` (lib/streaming/responses/_responses.py)."""
    if (refused := _refused(endpoint)) is not None:
        return SdkFinal("", None, refused)
    std = {"model", "input", "instructions", "max_output_tokens", "temperature"}
    client = openai_client(endpoint, timeout_s)
    final = None
    try:
        with client.responses.stream(extra_body={k: v for k, v in body.items() if k not in std and k != "stream"},
                                     **{k: v for k, v in body.items() if k in std}) as stream:
            for event in stream:
                if event.type in ("response.completed", "response.incomplete", "response.failed"):
                    final = event.response
        if final is None:
            return SdkFinal("", None, "the SDK's stream ended without a terminal response event")
        return SdkFinal(final.output_text, final.status, None)
    except Exception as exc:  # the SDK's failure is the finding, whatever its type
        return _failed(exc)
    finally:
        client.close()


def sdk_messages_stream(endpoint: Endpoint, body: dict[str, Any], timeout_s: float = 60.0) -> SdkFinal:
    """Stream a Messages ``body`` through ``client.messages.stream`` and read
    ``get_final_message()`` (its text blocks and ``stop_reason``); non-SDK fields (``temperature``
    included: anthropic 2.x dropped it from the signature) go through ``extra_body``."""
    if (refused := _refused(endpoint)) is not None:
        return SdkFinal("", None, refused)
    std = {"model", "messages", "max_tokens", "system", "stop_sequences"}
    client = anthropic_client(endpoint, timeout_s)
    try:
        with client.messages.stream(extra_body={k: v for k, v in body.items() if k not in std and k != "stream"},
                                    **{k: v for k, v in body.items() if k in std}) as stream:
            final = stream.get_final_message()
        text = "".join(getattr(b, "text", "") for b in final.content if getattr(b, "type", None) == "text")
        return SdkFinal(text, final.stop_reason, None)
    except Exception as exc:  # the SDK's failure is the finding, whatever its type
        return _failed(exc)
    finally:
        client.close()


# ---------------------------------------------------------------- the SDKs' types and default parse


@dataclass(frozen=True)
class SdkType:
    """An official SDK's type for one JSON object a server sends, and what the SDK hands its caller.

    ``sdk``: the SDK and its installed version (``"openai 3.60.0"``); ``name``: the type
    (``ResponseStreamEvent``); ``members``: the concrete class for each value of the object's
    ``type`` field when the type is a union the SDK discriminates by ``type`` (59 members for
    ``ResponseStreamEvent``, 6 for ``RawMessageStreamEvent``), or ``{None: cls}`` for one model;
    ``construct(cls, obj)``: the SDK's default parse of ``obj`` as ``cls`` -- its ``construct_type``,
    what ``client.responses.create(stream=True)`` / ``client.messages.create`` hand the caller while
    ``_strict_response_validation`` is off (the default): nothing validated, a missing field read as
    None, a value of the wrong kind kept as it came."""

    sdk: str
    name: str
    members: Mapping[str | None, type[pydantic.BaseModel]]
    construct: Callable[[type, Any], Any] = field(repr=False)

    def member(self, obj: Any) -> type[pydantic.BaseModel] | None:
        """The class ``obj`` is validated against: the member its ``type`` selects (None: no member
        has that type), or the one model."""
        if None in self.members:
            return self.members[None]
        kind = obj.get("type") if isinstance(obj, dict) else None
        return self.members.get(kind) if isinstance(kind, str) else None


def _members(union: Any) -> dict[str | None, type[pydantic.BaseModel]]:
    """``type`` literal -> class of an ``Annotated[Union[...], discriminator]`` the SDKs generate."""
    inner = typing.get_args(union)[0] if typing.get_origin(union) is typing.Annotated else union
    out: dict[str | None, type[pydantic.BaseModel]] = {}
    for cls in typing.get_args(inner):
        for value in typing.get_args(cls.model_fields["type"].annotation):
            out.setdefault(value, cls)
    return out


def _openai_construct(cls: type, obj: Any) -> Any:
    return openai._models.construct_type(type_=cls, value=obj)


_OPENAI = f"openai {openai.__version__}"
#: A ``/v1/responses`` stream event (openai-python's ``ResponseStreamEvent``).
RESPONSE_EVENT = SdkType(_OPENAI, "ResponseStreamEvent", _members(ResponseStreamEvent), _openai_construct)
#: A non-streamed ``/v1/responses`` reply.
RESPONSE = SdkType(_OPENAI, "Response", {None: Response}, _openai_construct)
#: A non-streamed chat completion.
CHAT_COMPLETION = SdkType(_OPENAI, "ChatCompletion", {None: ChatCompletion}, _openai_construct)
#: A non-streamed completion.
COMPLETION = SdkType(_OPENAI, "Completion", {None: Completion}, _openai_construct)


@functools.cache
def _anthropic() -> dict[str, SdkType]:
    """The anthropic SDK's types, built on first use: ``import anthropic`` takes ~2 s (measured
    2026-12-05, python -X importtime on the 2-core host: 2.05 s, openai 0.59 s), and every
    ``pytest --profile`` run imports this module while it collects suites/test_api.py -- most runs
    (``-m compare``, ``-m drain``, ...) never send a /v1/messages request."""
    import anthropic
    import anthropic._models
    from anthropic.types import Message, RawMessageStreamEvent

    models = anthropic._models  # the module these types came from (not one re-imported later)

    def _anthropic_construct(cls: type, obj: Any) -> Any:
        return models.construct_type(type_=cls, value=obj)

    sdk = f"anthropic {anthropic.__version__}"
    return {
        # a /v1/messages stream event (anthropic-sdk-python's RawMessageStreamEvent)
        "MESSAGE_EVENT": SdkType(sdk, "RawMessageStreamEvent", _members(RawMessageStreamEvent), _anthropic_construct),
        # a non-streamed /v1/messages reply
        "MESSAGE": SdkType(sdk, "Message", {None: Message}, _anthropic_construct),
    }


def __getattr__(name: str) -> SdkType:
    """:data:`MESSAGE_EVENT` (a ``/v1/messages`` stream event, anthropic-sdk-python's
    ``RawMessageStreamEvent``) and :data:`MESSAGE` (a non-streamed ``/v1/messages`` reply), built
    on first access (:func:`_anthropic`). Raises AttributeError for any other name."""
    if name in ("MESSAGE_EVENT", "MESSAGE"):
        return _anthropic()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
