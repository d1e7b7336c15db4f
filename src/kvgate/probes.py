"""The HTTP interactions the gates need, returning raw observations (no verdicts here).

Each probe sends a bounded number of requests (no hidden retries) and returns :class:`Reply` /
:class:`StreamReply` objects plus what was asked, so :mod:`kvgate.gates` can decide purely.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .client import KvClient, Reply, StreamReply
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


def build_prompt(client: KvClient, model: str, api: Api, tokens: int) -> ExactPrompt:
    """An ``api`` prompt of exactly ``tokens`` tokens, verified with the server's ``/tokenize``."""
    return exact_prompt(server_counter(client, model, api), tokens, api)


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
    notes: list[str] = field(default_factory=list)


def observe_deployment(client: KvClient, model: str) -> DeploymentObservation:
    """One call each to ``/v1/models``, ``/tokenize``, ``/metrics``, ``/version``."""
    models = client.models()
    tok = client.tokenize(model=model, prompt="kvgate")
    return DeploymentObservation(models=models, tokenize=tok, metrics_text=client.metrics_text(),
                                 version=client.version())
