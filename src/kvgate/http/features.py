"""The requests of the features gate, returning raw observations (verdicts: :mod:`kvgate.gates.features`).

Bounded: every request has the ``features.deadline_s`` client timeout and no retry; the LoRA
over-slots burst is one request per adapter and a second round; the prefix ladder is three
lengths x three requests. Randomness (the prefix ladder's nonce) is injected, so a test can fix it.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from kvgate.http.client import KvClient, StreamReply
from kvgate.http.metrics import MetricsError, cache_config, parse, parse_or_none
from kvgate.http.probes import Exchange, canary, send
from kvgate.http.prompts import TOKEN_IDS
from kvgate.kv.arithmetic import vllm_block_size
from kvgate.profile.models import Profile


def max_loras(profile: Profile) -> int:
    """``engine.max_loras``, else vLLM's default (1, vllm/config/lora.py)."""
    return profile.engine.max_loras or 1


def lora_body(profile: Profile, model: str) -> dict[str, Any]:
    """The completion request sent to the base model and to each adapter: temperature 0,
    ``ignore_eos``, special tokens kept and the token ids returned (a random model's tokens may
    decode to nothing: the outputs are compared by id, vLLM's ``return_token_ids``)."""
    lo = profile.features.lora
    return {"model": model, "prompt": lo.prompt, "max_tokens": lo.tokens, "temperature": 0, "ignore_eos": True,
            "skip_special_tokens": False, "return_token_ids": True}


@dataclass(frozen=True)
class PrefixTry:
    """One request of the prefix ladder: the shared prefix length (tokens), ``cold`` (first time
    this prefix is seen), the prompt tokens, ``cached_tokens`` from usage (None when the server
    does not report it), the time to the full answer of a 1-token generation (TTFT, seconds), and
    the ``vllm:prefix_cache_hits`` / ``_queries`` counter deltas over this request (tokens; None
    without /metrics)."""

    prefix_tokens: int
    cold: bool
    prompt_tokens: int | None
    cached_tokens: int | None
    ttft_s: float
    status: int
    hits_delta: float | None = None
    queries_delta: float | None = None
    error: str | None = None


@dataclass
class PrefixObservation:
    """The prefix ladder: ``block_size`` (tokens, and where it came from), the tries in order
    (per prefix length: one cold, then warm ones with other suffixes)."""

    block_size: int
    block_source: str
    tries: list[PrefixTry]

    def evidence(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "block_source": self.block_source,
                "tries": [t.__dict__ for t in self.tries]}


def prefix_lengths(profile: Profile, block: int) -> list[int]:
    """The shared-prefix lengths tried, in tokens: half a block (below one block: never cached by
    vLLM, which caches whole blocks), one and a half blocks, and the long prefix
    (``features.prefix_caching.prefix_tokens``, else 8 blocks, at most half of max_model_len; at
    least 4 blocks either way, up to max_model_len - 8: a shorter prefill's TTFT drop is noise)."""
    max_len = profile.engine.max_model_len
    long = profile.features.prefix_caching.prefix_tokens or min(8 * block, max_len // 2)
    long = min(max(long, 4 * block), max_len - 8)
    return sorted({max(1, block // 2), block + block // 2, long})


@dataclass(frozen=True)
class Halt:
    """Stands for a case's observation when its requests were not sent: a request of ``after`` (a
    case name) got no answer in time, or the endpoint went away (``why``), so every later request
    would wait the same deadline -- the gate stops sending instead (a hung engine costs one)."""

    after: str
    why: str


def stalled(observation: Any) -> str | None:
    """Why the engine looks hung after ``observation`` (an Exchange, a tuple of them, or an
    object with Exchange fields): a request (the canary after a grammar included) that got no
    full answer within its timeout; None when every request was answered (a refused or garbled
    answer is a verdict of its own case, not a hang)."""
    exchanges: list[Exchange] = []

    def collect(o: Any) -> None:
        if isinstance(o, Exchange):
            exchanges.append(o)
        elif isinstance(o, (tuple, list)):
            for x in o:
                collect(x)
        elif isinstance(o, dict):
            for x in o.values():
                collect(x)
        elif hasattr(o, "__dataclass_fields__"):
            for name in o.__dataclass_fields__:
                collect(getattr(o, name))

    collect(observation)
    for ex in exchanges:
        r = ex.reply
        err = getattr(r, "transport_error", None) or (r.text if r.status == 0 else None)
        if err and "Timeout" in err:
            return f"{ex.body.get('model')!r} request {'streamed ' if ex.stream else ''}got no full answer ({err[:120]})"
    return None


def tool_loop(client: KvClient, body: dict[str, Any], turns: int, timeout_s: float, stream: bool,
              follow: Callable[[Exchange, int], list[dict[str, Any]] | None]) -> list[Exchange]:
    """An agent loop of ``turns`` chat requests, streamed or not, one after the other, each bounded
    by ``timeout_s`` seconds: ``body``, then ``body`` with its messages extended by ``follow(the
    last exchange, its turn number from 1)`` -- the assistant turn with its calls and a tool result
    per call, echoing the server's ids. Stops early when ``follow`` returns None (nothing to echo)."""
    out: list[Exchange] = []
    messages = list(body["messages"])
    for turn in range(1, turns + 1):
        sent = {**body, "messages": messages}
        out.append(stream_within(client, sent, timeout_s) if stream else send(client, "chat", sent, timeout_s=timeout_s))
        more = follow(out[-1], turn) if turn < turns else None
        if more is None:
            break
        messages = messages + more
    return out


def stream_within(client: KvClient, body: dict[str, Any], deadline_s: float) -> Exchange:
    """The chat request streamed, hung up once it has run ``deadline_s`` seconds (httpx's timeout
    is per read: a stream that trickles a token a second would otherwise run as long as it
    likes); a stream cut so carries ``transport_error`` ``DeadlineTimeout: ...``."""
    ex = send(client, "chat", body, stream=True, timeout_s=deadline_s, on_event=lambda t, _: t > deadline_s)
    r = ex.reply
    if isinstance(r, StreamReply) and not r.done and not r.transport_error and r.elapsed_s > deadline_s:
        r.transport_error = (f"DeadlineTimeout: still streaming after {r.elapsed_s:.1f} s "
                             f"(features.deadline_s {deadline_s:g} s); hung up")
    return ex


def both_ways(client: KvClient, body: dict[str, Any], timeout_s: float) -> tuple[Exchange, Exchange]:
    """``(non-streamed, streamed)``: the same chat request sent twice, one after the other, each
    bounded by ``timeout_s`` seconds (:func:`stream_within`)."""
    return send(client, "chat", body, timeout_s=timeout_s), stream_within(client, body, timeout_s)


def with_canary(client: KvClient, body: dict[str, Any], profile: Profile) -> tuple[Exchange, Exchange]:
    """``(the request, a canary generation after it)``: a grammar that wedges the engine shows in
    the canary even when its own request answered."""
    ex = send(client, "chat", body, timeout_s=profile.features.deadline_s)
    return ex, canary(client, profile.model.served_name, profile.limits.canary_deadline_s)


@dataclass
class LoraObservation:
    """``listed``: adapter -> parent from ``/v1/models``; ``base``: the base model's completion;
    ``adapters``: adapter -> its completion (declared adapters, else every listed one);
    ``burst``: the over-max-loras requests (empty when there are not more adapters than slots)."""

    listed: dict[str, str | None]
    base: Exchange
    adapters: dict[str, Exchange]
    burst: list[Exchange]


def observe_lora(client: KvClient, profile: Profile, listed: dict[str, str | None]) -> LoraObservation:
    """The base model and each adapter once (sequentially: their outputs are compared), then all
    declared adapters at once, twice over, when there are more of them than ``max_loras`` slots."""
    t = profile.features.deadline_s
    base = send(client, "completions", lora_body(profile, profile.model.served_name), timeout_s=t)
    names = list(profile.engine.lora_modules) or list(listed)
    adapters = {n: send(client, "completions", lora_body(profile, n), timeout_s=t) for n in names}
    burst: list[Exchange] = []
    declared = list(profile.engine.lora_modules)
    if len(declared) > max_loras(profile):
        wave = declared * 2
        with ThreadPoolExecutor(max_workers=len(wave)) as pool:
            burst = list(pool.map(lambda n: send(client, "completions", lora_body(profile, n), timeout_s=t), wave))
    return LoraObservation(listed, base, adapters, burst)


def block_size(profile: Profile, metrics_text: str | None) -> tuple[int, str]:
    """``(tokens per KV block, where from)``: the server's ``vllm:cache_config_info`` label, else
    what vLLM 0.32 uses for the profile (:func:`kvgate.kv.arithmetic.vllm_block_size`: an explicit
    ``engine.block_size``, else 128 on the CPU, 16 on a GPU; MLA's own sizes)."""
    if metrics_text:
        try:
            cfg = cache_config(parse(metrics_text))
        except MetricsError:
            cfg = None
        if cfg and str(cfg.get("block_size", "")).isdigit():
            return int(cfg["block_size"]), "the server's vllm:cache_config_info"
    arch = profile.model.architecture
    return vllm_block_size(profile.hardware.gpu.lower() != "cpu", arch is not None and arch.attention == "mla",
                           profile.engine.block_size)


def _counters(client: KvClient) -> tuple[float | None, float | None]:
    text = client.metrics_text()
    scrape = parse_or_none(text)
    if scrape is None:
        return None, None
    return scrape.total("prefix_hits"), scrape.total("prefix_queries")


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def observe_prefix(client: KvClient, profile: Profile, *, nonce: int | None = None, warm: int = 2,
                   rng: Callable[[int], random.Random] = random.Random) -> PrefixObservation:
    """The prefix ladder, alone on the server (TTFT is compared): for each length of
    :func:`~kvgate.gates.features.prefix_lengths`, a token-id prompt of that many fresh ids (drawn
    with ``rng(nonce + length)``: ``nonce`` defaults to a random one, so no earlier run has cached
    it) plus a 4-token suffix, sent cold once then ``warm`` times with other suffixes;
    ``max_tokens: 1``, so the answer time is the TTFT. The prefix-cache counters are read from
    /metrics around each request."""
    model = profile.model.served_name
    t = profile.features.deadline_s
    text = client.metrics_text()
    block, source = block_size(profile, text)
    nonce = random.SystemRandom().randrange(1 << 30) if nonce is None else nonce
    tries: list[PrefixTry] = []
    for n in prefix_lengths(profile, block):
        r = rng(nonce + n)
        prefix = [r.choice(TOKEN_IDS) for _ in range(n)]
        for i in range(1 + warm):
            suffix = [r.choice(TOKEN_IDS) for _ in range(4)]
            before = _counters(client)
            ex = send(client, "completions", {"model": model, "prompt": prefix + suffix, "max_tokens": 1,
                                              "temperature": 0}, timeout_s=t)
            after = _counters(client)
            body = ex.reply.json  # parsed once: Reply.json decodes on every access
            usage = body.get("usage") if isinstance(body, dict) else None
            usage = usage if isinstance(usage, dict) else {}
            details = usage.get("prompt_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            tries.append(PrefixTry(n, i == 0, usage.get("prompt_tokens"),
                                   cached if isinstance(cached, int) else None, ex.reply.elapsed_s, ex.reply.status,
                                   _delta(before[0], after[0]), _delta(before[1], after[1]),
                                   None if ex.reply.status == 200 else ex.reply.error_message[:200]))
    return PrefixObservation(block, source, tries)
