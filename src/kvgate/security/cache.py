"""The security gate's ``cache`` measurement: is anything between the client and the engine
answering from a response cache, and is that cache keyed by the caller and by every field that
changes the answer?

Why (public reports, 2026): LiteLLM's response-cache key omits the caller, so team B gets team A's
response (litellm#29955); a semantic router served another user a byte-identical answer
(semantic-router#2134); a gateway's key omits ``response_format``, ``stop``, ``seed``,
``logit_bias``, ``tools`` (lunargate-ai/gateway#2). MLCommons' endpoint audits reject a run whose
repeated identical queries come back more than 10% faster than the first (an output cache).

Three looks, each a handful of short chat requests (:data:`MAX_TOKENS` tokens):

- *fields*: one request at temperature 1 with a seed, then (all at once) the same messages with
  one field changed each (:data:`FIELDS`); an answer that carries the first one's ``id`` (or its whole body) was
  served from a cache that does not key that field;
- *callers*: the same request at temperature 1 from the first caller, then from a second key;
  the second answer carrying the first one's ``id`` (or body) is the other caller's body;
- *timing*: one request (ignore_eos, :data:`TIMED_TOKENS` tokens, temperature 0), then, in turn,
  :data:`REPEATS` identical repeats and as many fresh requests of the same shape (another nonce up
  front, no shared prefix); end-to-end seconds each.

A vLLM answer's ``id`` is new for every request (``chatcmpl-<uuid>``), so a repeated ``id`` is a
replayed body. A cache that rewrites ids is seen by the timing look only. Pure I/O through
:class:`~kvgate.http.client.KvClient`; :func:`kvgate.gates.security.cache_verdict` judges.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from kvgate.http.client import EndpointUnreachable, KvClient, Reply

#: Tokens each fields/callers request asks for (sampled at temperature 1).
MAX_TOKENS = 6
#: Tokens each timed request generates (ignore_eos): enough decode that a replayed body stands out
#: (SmolLM2 on two CPU cores: ~0.5 s a request; a replayed body: milliseconds).
TIMED_TOKENS = 8
#: Identical repeats (and as many fresh requests) in the timing look.
REPEATS = 2
#: The fields a cache key must hold: name -> the change made to the base request.
FIELDS: dict[str, dict[str, Any]] = {
    "response_format": {"response_format": {"type": "json_object"}},
    "stop": {"stop": ["kvgate-stop"]},
    "seed": {"seed": 12},
    "tools": {"tools": [{"type": "function", "function": {"name": "kvgate_probe", "description": "never called",
                                                          "parameters": {"type": "object", "properties": {}}}}],
              "tool_choice": "none"},
    "max_tokens": {"max_tokens": MAX_TOKENS - 1},
}


@dataclass(frozen=True)
class Answer:
    """One request's answer: ``label`` (what was sent), ``reply`` (body kept whole: it is short)."""

    label: str
    reply: Reply

    @property
    def id(self) -> str | None:
        body = self.reply.json
        rid = body.get("id") if isinstance(body, dict) else None
        return rid if isinstance(rid, str) and rid else None

    @property
    def text(self) -> str | None:
        body = self.reply.json
        try:
            return str(body["choices"][0]["message"].get("content") or "")
        except (KeyError, IndexError, TypeError, AttributeError):
            return None


def replayed(first: Answer, later: Answer) -> bool:
    """Whether ``later`` is ``first``'s body again: both 200 and the same ``id``, or the same body
    byte for byte."""
    if first.reply.status != 200 or later.reply.status != 200:
        return False
    return (first.id is not None and first.id == later.id) or (bool(first.reply.text) and first.reply.text == later.reply.text)


@dataclass
class CacheRun:
    """``base`` and ``variants`` (field -> answer) of the fields look; ``callers``: (first caller's,
    second caller's) answers (None: no second key); ``second_key_note``: why not; ``timing``:
    (kind, seconds) in order, kind ``first``, ``repeat`` or ``fresh`` (only 200s are timed:
    ``timing_errors`` holds the others)."""

    base: Answer | None = None
    variants: dict[str, Answer] = field(default_factory=dict)
    callers: tuple[Answer, Answer] | None = None
    second_key_note: str = ""
    timing: list[tuple[str, float]] = field(default_factory=list)
    timing_errors: list[str] = field(default_factory=list)


def _ask(client: KvClient, body: dict[str, Any], label: str, timeout_s: float) -> Answer:
    try:
        r = client.post(client.api("/chat/completions"), body, timeout_s=timeout_s)
    except EndpointUnreachable as exc:
        r = Reply(0, str(exc), timeout_s)
    return Answer(label, r)


def probe_cache(client: KvClient, model: str, *, timeout_s: float, second: KvClient | None = None,
                second_key_note: str = "", nonce: Callable[[], str] = lambda: uuid.uuid4().hex[:12]) -> CacheRun:
    """The three looks (module docstring) in order: fields, callers (``second``: a client with the
    second caller's key; None -> not run, ``second_key_note`` says why), timing. ``nonce``: the
    per-run marker that keeps this run's requests from an earlier run's cache entries."""
    out = CacheRun(second_key_note=second_key_note)
    tag = nonce()

    def chat(text: str, **kw: Any) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS, **kw}

    base = chat(f"[{tag}] Write one sentence about any animal.", temperature=1.0, seed=11)
    out.base = _ask(client, base, "the base request", timeout_s)
    with ThreadPoolExecutor(max_workers=len(FIELDS)) as pool:  # at once: each is a lookup against the base's entry
        futures = {name: pool.submit(_ask, client, {**base, **change}, f"the same messages with another {name}",
                                     timeout_s) for name, change in FIELDS.items()}
        out.variants = {name: f.result() for name, f in futures.items()}
    if second is not None:
        same = chat(f"[{tag}] Name any colour and any city.", temperature=1.0)
        out.callers = (_ask(client, same, "the first caller", timeout_s), _ask(second, same, "the second caller", timeout_s))
    timed = {"temperature": 0, "ignore_eos": True, "max_tokens": TIMED_TOKENS}
    first = chat(f"{tag} Count from one to twenty.", **timed)
    plan = [("first", first)]
    for i in range(REPEATS):
        plan += [("repeat", first), ("fresh", chat(f"{nonce()} Count from one to twenty.", **timed))]
    for kind, body in plan:
        a = _ask(client, body, kind, timeout_s)
        if a.reply.status == 200:
            out.timing.append((kind, a.reply.elapsed_s))
        else:
            out.timing_errors.append(f"{kind}: {a.reply.status or 'no answer'}")
    return out


__all__ = ["Answer", "CacheRun", "FIELDS", "MAX_TOKENS", "REPEATS", "TIMED_TOKENS", "probe_cache", "replayed"]
