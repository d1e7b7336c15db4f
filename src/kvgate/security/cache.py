"""The security gate's ``cache`` measurement: is anything between the client and the engine
answering from a response cache, and is that cache keyed by the caller and by every field that
changes the answer?

Why (public reports, 2026): LiteLLM's response-cache key omits the caller, so team B gets team A's
response (litellm#29955); a semantic router served another user a byte-identical answer
(semantic-router#2134); a gateway's key omits ``response_format``, ``stop``, ``seed``,
``logit_bias``, ``tools`` (lunargate-ai/gateway#2). MLCommons' endpoint audits reject a run whose
repeated identical queries come back more than 10% faster than the first (an output cache).

Four looks, each a handful of short chat requests:

- *fields*: one request at temperature 1 with a seed, then (all at once) the same messages with
  one field changed each (:data:`FIELDS`); an answer that carries the first one's ``id`` (or its whole body) was
  served from a cache that does not key that field;
- *callers*: the same request at temperature 1 from the first caller, then from a second key;
  the second answer carrying the first one's ``id`` (or body) is the other caller's body;
- *sampled*: one unseeded request at temperature 1 (``top_p`` 1, logprobs on, :data:`SAMPLED_TOKENS`
  tokens) sent :data:`SAMPLES` times in turn. vLLM draws each answer afresh: a later text byte-identical
  to the first comes at most with the first's probability (its logprobs), a response cache repeats it
  every time -- even one that writes a fresh ``id`` and ``created`` into each replay;
- *timing*: one request (ignore_eos, :data:`TIMED_TOKENS` tokens, temperature 0), then
  :data:`REPEATS` pairs, each in random order: the identical request (*repeat*) and a *control* --
  the same messages and parameters with a ``stop`` string of its own that never occurs. The control
  has the same prompt tokens, so vLLM's prefix cache serves it exactly as it serves the repeat, and
  the same decode; a response cache keyed on the body misses it. Each answer is kept (``id``,
  ``created``, ``usage.prompt_tokens_details.cached_tokens``) with its end-to-end seconds and its
  send time.

A vLLM answer's ``id`` is new for every request (``chatcmpl-<uuid>``), so a repeated ``id`` is a
replayed body. Pure I/O through :class:`~kvgate.http.client.KvClient`;
:func:`kvgate.gates.security.cache_verdict` judges.
"""

from __future__ import annotations

import random
import time
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
#: Pairs (identical repeat, same-prompt control) in the timing look: 5 and 5 give the exact
#: Mann-Whitney bound of the repeat/control time ratio at one-sided 99% (4 and 4 give none).
REPEATS = 5
#: Tokens each sampled request asks for (temperature 1): a healthy repeat of the text is then rare.
SAMPLED_TOKENS = 12
#: Sends of the one sampled request (the first and SAMPLES - 1 repeats).
SAMPLES = 3
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
    #: When it was sent (seconds, monotonic; 0.0: not recorded).
    sent_at: float = 0.0

    @property
    def created(self) -> int | None:
        body = self.reply.json
        c = body.get("created") if isinstance(body, dict) else None
        return c if isinstance(c, int) and not isinstance(c, bool) else None

    @property
    def cached_tokens(self) -> int | None:
        """``usage.prompt_tokens_details.cached_tokens`` (None: not reported)."""
        body = self.reply.json
        try:
            c = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        except (KeyError, TypeError):
            return None
        return c if isinstance(c, int) and not isinstance(c, bool) else None

    @property
    def logprobs(self) -> list[float] | None:
        """The chosen tokens' logprobs (nats) of ``choices[0].logprobs.content`` (None: none)."""
        body = self.reply.json
        try:
            content = body["choices"][0]["logprobs"]["content"]
            out = [float(t["logprob"]) for t in content]
        except (KeyError, IndexError, TypeError, ValueError):
            return None
        return out or None

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
    second caller's) answers (None: no second key); ``second_key_note``: why not; ``sampled``: the
    sampled look's answers in order (200s and not); ``timed``: the timing look's (kind, answer) in
    order, kind ``first``, ``repeat`` or ``control``; ``timing``: (kind, seconds) of its 200s
    (``timing_errors`` holds the others)."""

    base: Answer | None = None
    variants: dict[str, Answer] = field(default_factory=dict)
    callers: tuple[Answer, Answer] | None = None
    second_key_note: str = ""
    timing: list[tuple[str, float]] = field(default_factory=list)
    timing_errors: list[str] = field(default_factory=list)
    sampled: list[Answer] = field(default_factory=list)
    timed: list[tuple[str, Answer]] = field(default_factory=list)
    #: What ran beside the timing look on the server, as ``before_timing`` measured it (None: not measured).
    beside: dict[str, Any] | None = None


def _ask(client: KvClient, body: dict[str, Any], label: str, timeout_s: float,
         clock: Callable[[], float] = time.monotonic) -> Answer:
    t = clock()
    try:
        r = client.post(client.api("/chat/completions"), body, timeout_s=timeout_s)
    except EndpointUnreachable as exc:
        r = Reply(0, str(exc), timeout_s)
    return Answer(label, r, t)


def probe_cache(client: KvClient, model: str, *, timeout_s: float, second: KvClient | None = None,
                second_key_note: str = "", nonce: Callable[[], str] = lambda: uuid.uuid4().hex[:12],
                rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic,
                before_timing: Callable[[], dict[str, Any]] | None = None) -> CacheRun:
    """The four looks (module docstring) in order: fields, callers (``second``: a client with the
    second caller's key; None -> not run, ``second_key_note`` says why), sampled, timing. ``nonce``:
    the per-run marker that keeps this run's requests from an earlier run's cache entries (and each
    control's stop string); ``rng``: the order within each timing pair (default: fresh randomness);
    ``clock``: the send times (monotonic seconds); ``before_timing``: called right before the timing
    look, its answer (what else the server was running: :meth:`kvgate.run.quiet.Quiet.to_dict`) kept
    as ``beside``."""
    out = CacheRun(second_key_note=second_key_note)
    tag, rng = nonce(), rng or random.Random()

    def chat(text: str, **kw: Any) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS, **kw}

    base = chat(f"[{tag}] Write one sentence about any animal.", temperature=1.0, seed=11)
    out.base = _ask(client, base, "the base request", timeout_s, clock)
    with ThreadPoolExecutor(max_workers=len(FIELDS)) as pool:  # at once: each is a lookup against the base's entry
        futures = {name: pool.submit(_ask, client, {**base, **change}, f"the same messages with another {name}",
                                     timeout_s, clock) for name, change in FIELDS.items()}
        out.variants = {name: f.result() for name, f in futures.items()}
    if second is not None:
        same = chat(f"[{tag}] Name any colour and any city.", temperature=1.0)
        out.callers = (_ask(client, same, "the first caller", timeout_s, clock),
                       _ask(second, same, "the second caller", timeout_s, clock))
    sampled = chat(f"[{tag}] Write two sentences about any city.", temperature=1.0, top_p=1.0, logprobs=True,
                   max_tokens=SAMPLED_TOKENS)
    out.sampled = [_ask(client, sampled, f"sampled {i + 1}", timeout_s, clock) for i in range(SAMPLES)]
    timed = {"temperature": 0, "ignore_eos": True, "max_tokens": TIMED_TOKENS}
    # long enough (~40 tokens) to fill whole KV blocks (16 tokens on vLLM) that the prefix cache can hit
    first = chat(f"{tag} Count from one to twenty in English words, one number a line, lower case, with nothing "
                 "before the list and nothing after it, no punctuation and no commentary at all.", **timed)
    plan = [("first", first)]
    for _ in range(REPEATS):
        pair = [("repeat", first), ("control", {**first, "stop": [f"kvgate-never-{nonce()}"]})]
        rng.shuffle(pair)  # neither kind always second: drift on the server falls on both alike
        plan += pair
    out.beside = before_timing() if before_timing is not None else None
    for kind, body in plan:
        a = _ask(client, body, kind, timeout_s, clock)
        out.timed.append((kind, a))
        if a.reply.status == 200:
            out.timing.append((kind, a.reply.elapsed_s))
        else:
            out.timing_errors.append(f"{kind}: {a.reply.status or 'no answer'}")
    return out


__all__ = ["Answer", "CacheRun", "FIELDS", "MAX_TOKENS", "REPEATS", "SAMPLED_TOKENS", "SAMPLES", "TIMED_TOKENS", "probe_cache",
           "replayed"]
