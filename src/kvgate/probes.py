"""The HTTP interactions the gates need, returning raw observations (no verdicts here).

Each probe sends a bounded number of requests (no hidden retries) and returns :class:`Reply` /
:class:`StreamReply` objects plus what was asked, so :mod:`kvgate.gates` can decide purely.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from .client import KvClient, Reply, StreamReply
from .metrics import GaugePoll, poll_gauge, scrape_value
from .prompts import Api, ExactPrompt, exact_prompt, server_counter

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

    def evidence(self) -> dict[str, Any]:
        r = self.reply
        ev: dict[str, Any] = {
            "api": self.api, "stream": self.stream, "status": r.status, "elapsed_s": round(r.elapsed_s, 4),
            "request": {k: v for k, v in self.body.items() if k not in ("prompt", "messages")},
            "prompt_tokens_verified": self.prompt_tokens,
        }
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
         timeout_s: float | None = None, prompt_tokens: int | None = None) -> Exchange:
    """Send ``body`` to the ``api`` route, streamed or not."""
    path = client.api(ROUTES[api])
    if stream:
        body = {**body, "stream": True}
        reply: Reply | StreamReply = client.stream(path, body, timeout_s=timeout_s)
    else:
        reply = client.post(path, body, timeout_s=timeout_s)
    return Exchange(api, stream, body, reply, prompt_tokens)


def build_prompt(client: KvClient, model: str, api: Api, tokens: int, prefix: str = "") -> ExactPrompt:
    """An ``api`` prompt of exactly ``tokens`` tokens (starting with ``prefix``), verified with
    the server's ``/tokenize``."""
    return exact_prompt(server_counter(client, model, api), tokens, api, prefix=prefix)


def canary(client: KvClient, model: str, deadline_s: float) -> Exchange:
    """Health truth: a short generation that must succeed within ``deadline_s`` seconds."""
    body = {"model": model, "prompt": CANARY_PROMPT, "max_tokens": CANARY_MAX_TOKENS, "temperature": 0}
    return send(client, "completions", body, timeout_s=deadline_s)


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


def decode_rate(client: KvClient, model: str, tokens: int = 32) -> float | None:
    """Tokens per second of one greedy stream after its first token (None if not measurable)."""
    ex = send(client, "completions", {"model": model, "prompt": CANARY_PROMPT, "max_tokens": tokens,
                                      "temperature": 0, "ignore_eos": True}, stream=True)
    r = ex.reply
    ts = [t for t, d in r.events if d.strip() != "[DONE]"] if isinstance(r, StreamReply) else []
    if len(ts) < 3 or ts[-1] <= ts[0]:
        return None
    return (len(ts) - 1) / (ts[-1] - ts[0])


@dataclass
class DisconnectObservation:
    """One hang-up: ``case``; ``baseline`` running requests before (None without metrics);
    ``hung`` the cut exchange; ``cut`` whether it really was cut before completing; ``hangup_s``
    seconds from send to hang-up; ``natural_s`` estimated seconds it would have run on after the
    hang-up; ``poll`` the gauge poll after; ``canary`` a generation after."""

    case: str
    baseline: float | None
    hung: Exchange
    cut: bool
    hangup_s: float
    natural_s: float | None
    poll: GaugePoll | None
    canary: Exchange


DISCONNECT_CASES = ("mid-stream", "before-first-token", "mid-request")


def disconnect(client: KvClient, model: str, case: str, *, max_tokens: int, rate_tps: float | None,
               deadline_s: float, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> DisconnectObservation:
    """Hang up one long generation (``case`` in :data:`DISCONNECT_CASES`) and poll
    ``vllm:num_requests_running`` back to its baseline (bounded by ``deadline_s``).

    mid-stream: stream, hang up after 3 events. before-first-token: stream, hang up when the
    status line arrives. mid-request: non-streamed, the client closes the socket after 0.3 s.
    ``max_tokens`` should be the most the deployment will generate (cap included), so that the
    request outlives the hang-up by as much as possible.
    """
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
                                 canary(client, model, deadline_s))
