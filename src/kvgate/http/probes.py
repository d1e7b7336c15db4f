"""The HTTP interactions the gates need, returning raw observations (no verdicts here).

Each probe sends a bounded number of requests (no hidden retries) and returns :class:`Reply` /
:class:`StreamReply` objects plus what was asked, so :mod:`kvgate.gates` can decide purely.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from kvgate.http.client import EndpointUnreachable, KvClient, RawStream, Reply, StreamReply
from kvgate.http.extensions import Refusal
from kvgate.http.metrics import GaugePoll, poll_gauge, scrape_value
from kvgate.http.prompts import (Api, ExactPrompt, PromptUnavailable, exact_prompt, local_counter, server_counter,
                      token_id_prompt)
from kvgate.http.tokenizers import detect, llamacpp_chat_counter, server_text_counter

ROUTES: dict[Api, str] = {"completions": "/completions", "chat": "/chat/completions"}
CANARY_PROMPT = "kv cache canary"
CANARY_MAX_TOKENS = 4


@dataclass
class Exchange:
    """One request and its answer. ``body`` is what was sent (the prompt text elided)."""

    api: Api
    stream: bool
    body: dict[str, Any]
    reply: Reply | StreamReply
    prompt_tokens: int | None = None  # verified with /tokenize, tokens
    #: vLLM extensions the request carried that the server refuses (:mod:`kvgate.http.extensions`),
    #: by name; ``dropped``: those sent in their portable form (left out of ``body``).
    refused: dict[str, Refusal] = dataclasses.field(default_factory=dict)
    dropped: tuple[str, ...] = ()

    def evidence(self) -> dict[str, Any]:
        r = self.reply
        ev: dict[str, Any] = {
            "api": self.api, "stream": self.stream, "status": r.status, "elapsed_s": round(r.elapsed_s, 4),
            "request": {k: v for k, v in self.body.items() if k not in ("prompt", "messages")},
            "prompt_tokens_verified": self.prompt_tokens,
        }
        if self.refused:
            ev["refused_extensions"] = {p: {**x.evidence(), "sent": "without it" if p in self.dropped else "as is"}
                                        for p, x in self.refused.items()}
        if isinstance(r, StreamReply):
            ev["events"] = len(r.events)
            ev["done"] = r.done
            ev["transport_error"] = r.transport_error
            ev["first_events"] = [d[:300] for _, d in r.events[:2]]
            ev["last_events"] = [d[:300] for _, d in r.events[-3:]]
            if r.status != 200:
                ev["body"] = r.text[:500]
        else:
            ev["body"] = r.text[:800]
        return ev


def send(client: KvClient, api: Api, body: dict[str, Any], *, stream: bool = False,
         timeout_s: float | None = None, prompt_tokens: int | None = None,
         on_event: Callable[[float, str], bool | None] | None = None, admitted_only: bool = False,
         own_connection: bool = False) -> Exchange:
    """Send ``body`` to the ``api`` route, streamed or not. A chat body gets the client's
    ``chat_template_kwargs`` (the profile's) unless it names its own. ``on_event(t, data)``
    (streamed only) may return True to hang up (:meth:`KvClient.stream`); ``admitted_only``
    (streamed only) hangs up as soon as the status line arrives: 200 says the server admitted the
    request (vLLM validates a prompt's form and length before it answers a stream's headers), a 4xx
    comes with its body, and no generation is waited for. With the run's
    :class:`~kvgate.http.extensions.Extensions` on the endpoint, a vLLM extension the server refuses
    goes in its portable form where it has one (the exchange's ``refused`` and ``dropped`` say so).
    ``own_connection`` (not streamed): on a new connection (:meth:`KvClient.request`)."""
    path = client.api(ROUTES[api])
    if api == "chat" and client.chat_template_kwargs and "chat_template_kwargs" not in body:
        body = {**body, "chat_template_kwargs": client.chat_template_kwargs}
    refused: dict[str, Refusal] = {}
    dropped: tuple[str, ...] = ()
    if client.endpoint.extensions is not None:
        body, refused, dropped = client.endpoint.extensions.adapt(client, body)
    if stream:
        body = {**body, "stream": True}
        reply: Reply | StreamReply = client.stream(path, body, timeout_s=timeout_s, on_event=on_event,
                                                   hang_up_after_headers=admitted_only)
    else:
        reply = client.post(path, body, timeout_s=timeout_s, own_connection=own_connection)
    return Exchange(api, stream, body, reply, prompt_tokens, refused, dropped)


def portable_body(client: KvClient, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as :func:`send` would send it to this server (a refused extension with a portable
    form left out), for a request that goes another way (the openai SDK's)."""
    ext = client.endpoint.extensions
    return ext.adapt(client, body)[0] if ext is not None else body


def send_bytes(client: KvClient, api: Api, body: dict[str, Any], *, timeout_s: float | None = None) -> RawStream:
    """:func:`send` streamed, keeping the raw body bytes as they arrive
    (:meth:`kvgate.http.client.KvClient.stream_bytes`): ``stream: true`` added, a chat body given
    the client's ``chat_template_kwargs`` unless it names its own."""
    if api == "chat" and client.chat_template_kwargs and "chat_template_kwargs" not in body:
        body = {**body, "chat_template_kwargs": client.chat_template_kwargs}
    return client.stream_bytes(client.api(ROUTES[api]), {**body, "stream": True}, timeout_s=timeout_s)


@dataclass(frozen=True)
class QueueSample:
    """The server's scheduler gauges while a request was outstanding: ``t_s`` seconds after it
    was sent; ``waiting``/``running``: ``vllm:num_requests_waiting``/``_running`` (None without
    metrics)."""

    t_s: float
    waiting: float | None
    running: float | None


def send_watched(client: KvClient, api: Api, body: dict[str, Any], *, deadline_s: float, poll_s: float = 0.5,
                 prompt_tokens: int | None = None) -> tuple[Exchange, list[QueueSample]]:
    """:func:`send` with ``deadline_s`` as its timeout, while a daemon thread scrapes ``/metrics``
    every ``poll_s`` seconds (bounded: it stops when the request ends, so at most
    ``deadline_s / poll_s + 1`` scrapes), so a request that never answers ends at its deadline with
    the pattern that held it: admitted but never scheduled shows ``waiting 1, running 0``. The
    request itself runs on the calling thread, so Ctrl-C/SIGTERM interrupt it at once. Returns the
    exchange (status 0 when the deadline passed) and the samples taken while it was outstanding
    (for an unanswered request, those whose scrape had returned by its deadline)."""
    samples: list[QueueSample] = []
    stop = threading.Event()
    t0 = time.monotonic()

    def watch() -> None:
        while not stop.wait(poll_s):
            try:
                text = client.metrics_text()
            except EndpointUnreachable:
                text = None
            samples.append(QueueSample(round(time.monotonic() - t0, 3), scrape_value(text, "waiting"),
                                       scrape_value(text, "running")))

    watcher = threading.Thread(target=watch, name="kvgate-queue-watch", daemon=True)
    watcher.start()
    try:
        ex = send(client, api, body, timeout_s=deadline_s, prompt_tokens=prompt_tokens)
    finally:
        stop.set()
    watcher.join(timeout=1.0)  # a scrape in flight may finish; never wait on it longer
    # only what the server said while the request was outstanding: a request past its deadline makes
    # the run's EngineWatch check the engine before the call returns (kvgate.http.watch), and the
    # hang-up has released the request by then -- a sample from that window reads waiting 0
    outstanding = ex.reply.elapsed_s if ex.reply.status == 0 and ex.reply.elapsed_s else None
    return ex, [q for q in samples if outstanding is None or q.t_s <= outstanding]


def send_raw(client: KvClient, api: Api, text: str, *, timeout_s: float | None = None) -> Exchange:
    """POST ``text`` as it is (not JSON-encoded; e.g. a body that is not JSON) to the ``api``
    route. The exchange's ``body`` records it as ``{"raw": text}``."""
    reply = client.request("POST", client.api(ROUTES[api]), content=text.encode(), timeout_s=timeout_s)
    return Exchange(api, False, {"raw": text[:200]}, reply)


#: The filler length of the last exact prompt built per (server, model, api, tokens, counter):
#: the next one of that length (another prefix: the next request of a load run) starts its
#: search there (:func:`kvgate.http.prompts.exact_prompt` ``hint``). Bounded; a hint is only
#: where the search begins, the count is the server's either way.
_FILLER_HINTS: dict[tuple[str, str, str, int, str], int] = {}
_HINTS_MAX = 512


def _hinted(key: tuple[str, str, str, int, str], build: Callable[[int | None], ExactPrompt]) -> ExactPrompt:
    p = build(_FILLER_HINTS.get(key))
    if p.filler_words is not None:
        if len(_FILLER_HINTS) >= _HINTS_MAX:
            _FILLER_HINTS.clear()
        _FILLER_HINTS[key] = p.filler_words
    return p


def build_prompt(client: KvClient, model: str, api: Api, tokens: int, prefix: str = "") -> ExactPrompt:
    """An ``api`` prompt of exactly ``tokens`` tokens (starting with ``prefix``), counted by the
    server's own tokenizer where it has an endpoint for it (:func:`kvgate.http.tokenizers.detect`:
    vLLM's ``/tokenize``, llama.cpp's ``/tokenize`` + ``/apply-template``, llama-cpp-python's
    ``/extras/tokenize``); else a completions prompt is a token-id prompt (exact by construction,
    :func:`kvgate.http.prompts.token_id_prompt`) and a chat prompt is counted by the profile's
    local tokenizer (``model.tokenizer``, carried as ``Endpoint.tokenizer``). A chat prompt nothing can count
    raises :class:`kvgate.http.prompts.PromptUnavailable` naming the server and what it lacks --
    the check that needs it SKIPs with that reason. The search starts where the last prompt of
    this length ended (:data:`_FILLER_HINTS`): a load run's prompts differ only in their prefix,
    so each after the first takes ~4 ``/tokenize`` calls instead of ~12."""
    found = detect(client, model)
    base = client.endpoint.base_url

    def key(counter: str) -> tuple[str, str, str, int, str]:
        return (base, model, api, tokens, counter)

    if found.route == "vllm":
        return _hinted(key("vllm"), lambda h: exact_prompt(server_counter(client, model, api), tokens, api,
                                                           prefix=prefix, hint=h))
    if found.route is not None and api == "completions":
        return _hinted(key(found.route), lambda h: exact_prompt(server_text_counter(client, model, found.route),
                                                                tokens, api, prefix=prefix, hint=h))
    if found.route == "llama.cpp" and found.chat:
        return _hinted(key("llama.cpp-chat"), lambda h: exact_prompt(llamacpp_chat_counter(client), tokens, api,
                                                                     prefix=prefix, hint=h))
    if api == "completions":
        return token_id_prompt(tokens, seed=prefix)
    path = getattr(client.endpoint, "tokenizer", None)
    if path:
        return _hinted(key(f"local:{path}"), lambda h: exact_prompt(local_counter(path, api), tokens, api,
                                                                    prefix=prefix, hint=h))
    raise PromptUnavailable(f"{found.missing(api)} and the profile sets no model.tokenizer: an exact-length "
                            f"{api} prompt cannot be built")


def has_tokenize(client: KvClient, model: str) -> bool:
    """Whether the server counts tokens at an endpoint of its own (vLLM's or llama.cpp's
    ``/tokenize``, llama-cpp-python's ``/extras/tokenize``; asked once per client)."""
    return detect(client, model).route is not None


def canary(client: KvClient, model: str, deadline_s: float) -> Exchange:
    """Health truth: a short generation that must succeed within ``deadline_s`` seconds, on a
    connection of its own (the probe before it may have left its pooled connection closed)."""
    body = {"model": model, "prompt": CANARY_PROMPT, "max_tokens": CANARY_MAX_TOKENS, "temperature": 0}
    return send(client, "completions", body, timeout_s=deadline_s, own_connection=True)


@dataclass
class DeploymentObservation:
    """What the server says about itself: ``/v1/models``, ``/tokenize``, ``/metrics``, ``/version``."""

    models: Reply
    tokenize: Reply | None
    metrics_text: str | None
    version: str | None
    models_path: str = "/v1/models"


def observe_deployment(client: KvClient, model: str) -> DeploymentObservation:
    """One call each to ``/v1/models``, ``/tokenize``, ``/metrics``, ``/version``."""
    models = client.models()
    tok = client.tokenize(model=model, prompt="kvgate")
    return DeploymentObservation(models=models, tokenize=tok, metrics_text=client.metrics_text(),
                                 version=client.version(), models_path=client.api("/models"))


#: The conversation ``deployment/served-config`` renders through ``/tokenize`` to show the chat template
#: at work: a system turn, a finished exchange and a new user turn (a template that drops roles, the
#: system turn or earlier turns renders it differently). ``model.chat_template.probe_tokens`` states
#: its expected token strings.
TEMPLATE_PROBE: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "You are a probe."},
    {"role": "user", "content": "Say OK."},
    {"role": "assistant", "content": "OK."},
    {"role": "user", "content": "Again."},
)


@dataclass
class ServedProbes:
    """What the server shows of the configuration it runs beyond :class:`DeploymentObservation`:
    ``server_info`` -- ``GET /server_info?config_format=json`` (vLLM's dev-mode route, exposed only
    with ``VLLM_SERVER_DEV_MODE=1``: a 404 is the usual answer); ``rendering`` -- ``POST /tokenize``
    of :data:`TEMPLATE_PROBE` with ``return_token_strs`` and the generation prompt (the chat
    template's rendering, token by token); ``messages``: the conversation sent."""

    server_info: Reply | None
    rendering: Reply | None
    messages: list[dict[str, str]] = dataclasses.field(default_factory=lambda: [dict(m) for m in TEMPLATE_PROBE])


def observe_served(client: KvClient, model: str) -> ServedProbes:
    """One ``GET /server_info?config_format=json`` and one ``POST /tokenize`` of :data:`TEMPLATE_PROBE`
    (with the client's ``chat_template_kwargs``, as every chat request of the run)."""
    messages = [dict(m) for m in TEMPLATE_PROBE]
    body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": True,
                            "return_token_strs": True}
    if client.chat_template_kwargs:
        body["chat_template_kwargs"] = client.chat_template_kwargs
    info = client.get("/server_info?config_format=json", timeout_s=10.0)
    rendering = client.post("/tokenize", body, timeout_s=30.0)
    return ServedProbes(server_info=info, rendering=rendering, messages=messages)


#: Two events less than this many seconds apart arrived in one read (one burst), not one decode step apart.
BURST_GAP_S = 0.0005
#: Token events must span at least this many seconds for their spacing to be timed.
MIN_RATE_SPAN_S = 0.01


@dataclass(frozen=True)
class DecodeRate:
    """A decode-rate estimate: ``tps`` tokens/s after the first token, or None with ``why`` (one
    clause saying what was seen). ``events``: token events used; ``span_s``: seconds from the first
    to the last; ``bunched``: events that arrived less than :data:`BURST_GAP_S` after the previous;
    ``reply``: the probe stream the estimate came from (None when estimated from times alone)."""

    tps: float | None
    why: str | None = None
    events: int = 0
    span_s: float = 0.0
    bunched: int = 0
    reply: StreamReply | None = dataclasses.field(default=None, repr=False, compare=False)

    def evidence(self) -> dict[str, Any]:
        return {"tps": None if self.tps is None else round(self.tps, 2), "why": self.why, "events": self.events,
                "span_s": round(self.span_s, 6), "bunched": self.bunched}


def estimate_rate(times_s: list[float]) -> DecodeRate:
    """Tokens/s from the arrival times (seconds) of a stream's token events, or an honest reason
    why it cannot be estimated: fewer than 3 events; no time between first and last; more than
    half of them arriving in bursts (the client read them in bunches: a starved client times its
    reads, not the server's decoding); or all of them within :data:`MIN_RATE_SPAN_S`."""
    n = len(times_s)
    if n < 3:
        return DecodeRate(None, f"only {n} token event{'s' if n != 1 else ''} arrived (3 needed)", n)
    span = times_s[-1] - times_s[0]
    gaps = [b - a for a, b in zip(times_s, times_s[1:])]
    bunched = sum(1 for g in gaps if g < BURST_GAP_S)
    if span <= 0:
        return DecodeRate(None, f"all {n} token events carry the same arrival time", n, span, bunched)
    if bunched * 2 > len(gaps):
        return DecodeRate(None, f"{bunched + 1} of {n} token events arrived in bursts (less than "
                          f"{BURST_GAP_S * 1e3:g} ms apart): the client read them in bunches (a client starved of "
                          "CPU, or a proxy that buffers the stream), so their spacing does not time the server's "
                          "decoding", n, span, bunched)
    if span < MIN_RATE_SPAN_S:
        return DecodeRate(None, f"all {n} token events arrived within {span * 1e3:.2f} ms, too close together to time",
                          n, span, bunched)
    return DecodeRate((n - 1) / span, None, n, span, bunched)


def decode_rate(client: KvClient, model: str, tokens: int = 32) -> DecodeRate:
    """The decode rate of one greedy stream of ``tokens`` tokens after its first token
    (:func:`estimate_rate`); a stream that fails gives ``tps=None`` with the status."""
    ex = send(client, "completions", {"model": model, "prompt": CANARY_PROMPT, "max_tokens": tokens,
                                      "temperature": 0, "ignore_eos": True}, stream=True)
    r = ex.reply
    if not isinstance(r, StreamReply) or r.status != 200:
        return DecodeRate(None, f"the rate probe stream answered {r.status}", reply=r if isinstance(r, StreamReply) else None)
    return dataclasses.replace(estimate_rate([t for t, d in r.events if d.strip() != "[DONE]"]), reply=r)


@dataclass
class DisconnectObservation:
    """One hang-up: ``case``; ``baseline`` running requests before (None without metrics);
    ``hung`` the cut exchange; ``cut`` whether it really was cut before completing; ``hangup_s``
    seconds from send to hang-up; ``natural_s`` estimated seconds it would have run on after the
    hang-up (None when no decode rate; negative when the rate says it should already have
    finished); ``poll`` the gauge poll after; ``canary`` a generation after; ``rate`` the decode-rate
    estimate ``natural_s`` came from."""

    case: str
    baseline: float | None
    hung: Exchange
    cut: bool
    hangup_s: float
    natural_s: float | None
    poll: GaugePoll | None
    canary: Exchange
    rate: DecodeRate | None = None


DISCONNECT_CASES = ("mid-stream", "before-first-token", "mid-request")


def disconnect(client: KvClient, model: str, case: str, *, max_tokens: int, rate: DecodeRate | float | None,
               deadline_s: float, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> DisconnectObservation:
    """Hang up one long generation (``case`` in :data:`DISCONNECT_CASES`) and poll
    ``vllm:num_requests_running`` back to its baseline (bounded by ``deadline_s``).

    mid-stream: stream, hang up after 3 events. before-first-token: stream, hang up when the
    status line arrives. mid-request: non-streamed, the client closes the socket after 0.3 s.
    ``max_tokens`` should be the most the deployment will generate (cap included), so that the
    request outlives the hang-up by as much as possible. ``rate``: the decode rate
    (:func:`decode_rate`, or tokens/s) the time the request would have run on is estimated from.
    """
    if not isinstance(rate, DecodeRate):
        rate = DecodeRate(rate, None if rate else "no decode rate was measured")
    rate_tps = rate.tps
    body = {"model": model, "prompt": CANARY_PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    baseline = scrape_value(client.metrics_text(), "running")
    seen = {"n": 0}

    def after_three(t: float, data: str) -> bool:
        seen["n"] += 1
        return seen["n"] >= 3

    path = client.api(ROUTES["completions"])
    if case == "mid-stream":
        r: Reply | StreamReply = client.stream(path, {**body, "stream": True}, on_event=after_three)
        cut = isinstance(r, StreamReply) and r.status == 200 and not r.done
        received = len(r.events)
    elif case == "before-first-token":
        r = client.stream(path, {**body, "stream": True}, hang_up_after_headers=True)
        cut, received = r.status == 200, 0
    elif case == "mid-request":
        r = client.hang_up_request(path, body, after_s=0.3)
        cut, received = r.status == 0, 0  # 0: the client closed the connection before any answer
    else:
        raise ValueError(f"unknown disconnect case {case!r}; known: {', '.join(DISCONNECT_CASES)}")
    hung = Exchange("completions", case != "mid-request", body, r)
    natural = (max_tokens - received) / rate_tps - (r.elapsed_s if case == "mid-request" else 0) if rate_tps else None
    poll = None
    if baseline is not None:
        poll = poll_gauge(client.metrics_text, "running", baseline, deadline_s, clock=clock, sleep=sleep)
    return DisconnectObservation(case, baseline, hung, cut, r.elapsed_s,
                                 round(natural, 3) if natural is not None else None, poll,
                                 canary(client, model, deadline_s), rate)
