"""A traffic sample: the requests a deployment really serves, read from a file, to be replayed.

:class:`TrafficSample` holds :class:`TraceRequest` rows (prompt and output tokens, optional arrival
time, session and turn, shared-prefix id) plus where they came from (path, SHA-256 of the bytes,
format). :func:`load_sample` reads one; :func:`sample_for` reads a profile workload's
``traffic:``. Every bad record is a :class:`TrafficError` naming the file, the line and the field.

Formats (``TrafficSpec.format``; ``auto`` tells from the content, :func:`detect_format`):

- ``jsonl``: one request per line, ``{"prompt_tokens": N, "output_tokens": M}`` (also
  ``input_tokens``/``completion_tokens`` or an OpenAI ``usage`` object), optional ``arrival_s``
  (seconds, any origin), ``session`` (id) and ``turn`` (0-based order within it), ``prefix_id`` and
  ``prefix_tokens`` (a shared prefix, e.g. a system prompt, counted inside ``prompt_tokens``).
- ``openai-log``: one OpenAI request per line as sent, ``{"messages": [...], "max_tokens": N}`` or
  ``{"prompt": "...", "max_tokens": N}`` (``max_completion_tokens`` too), or wrapped as
  ``{"request": {...}, "response": {...}, "timestamp": ... | "arrival_s": ...}``. The response's
  ``usage`` gives exact prompt and output tokens; without it the output is ``max_tokens`` as sent
  (an upper bound) and the prompt is counted (see *counting*). ``session`` / ``conversation_id`` /
  ``user`` group requests into sessions (turns in file order). ``messages`` are kept.
- ``sharegpt``: a JSON array (or JSON lines) of ``{"id", "conversations": [{"from": "human" |
  "gpt" | "system", "value": "..."}]}``: each human turn with a reply is one request of session
  ``id``: prompt = the system prompt, every earlier turn and this one; output = the reply. No
  arrival times.
- ``metrics``: a vLLM ``/metrics`` text: the ``vllm:request_prompt_tokens`` and
  ``vllm:request_generation_tokens`` histograms read as :data:`METRICS_ROWS` quantile levels,
  prompt paired with output level by level (:func:`histogram_quantiles`). No arrival times.

Counting: where a source carries text but no token counts, ``count`` (text -> tokens) counts each
message's content; the replaying gate passes the server's ``/tokenize`` counter
(:func:`kvgate.http.prompts.server_counter`). Without one the
prompt is estimated as UTF-8 bytes / :data:`BYTES_PER_TOKEN` and a note says so
(:attr:`TrafficSample.notes`). A system prompt shared by several requests becomes their
``prefix_id`` (``sys-`` and 8 hex digits of its SHA-256) with its counted tokens.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

#: The formats :func:`load_sample` reads (``auto`` picks one of them).
FORMATS = ("jsonl", "openai-log", "sharegpt", "metrics")
#: Quantile levels a ``metrics`` sample becomes (rows of equal weight).
METRICS_ROWS = 200
#: The estimate without a tokenizer: ~4 bytes of English text per BPE token (OpenAI's rule of
#: thumb, "1 token ~= 4 chars in English", help.openai.com "What are tokens and how to count them").
BYTES_PER_TOKEN = 4
#: vLLM's request length histograms (vllm/v1/metrics/loggers.py).
METRIC_PROMPT = "vllm:request_prompt_tokens"
METRIC_OUTPUT = "vllm:request_generation_tokens"

#: ShareGPT speaker names -> OpenAI roles.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
                  "system": "system"}


class TrafficError(ValueError):
    """A traffic sample cannot be read or is malformed; the message names the file (and line, field)."""


@dataclass(frozen=True)
class TraceRequest:
    """One recorded request. ``prompt_tokens`` / ``output_tokens`` (tokens): the whole prompt as
    the server counted it (a later turn's includes the history) and what it generated.
    ``arrival_s``: seconds on the sample's own clock (None: not recorded). ``session``/``turn``: a
    conversation and the 0-based position in it. ``prefix_id``/``prefix_tokens``: a prefix
    (tokens, inside ``prompt_tokens``) shared by every request with the same id. ``messages``: the
    OpenAI messages as sent, when the source carries text. ``line``: 1-based line in the file."""

    prompt_tokens: int
    output_tokens: int
    arrival_s: float | None = None
    session: str | None = None
    turn: int | None = None
    prefix_id: str | None = None
    prefix_tokens: int = 0
    messages: tuple[dict[str, Any], ...] | None = None
    line: int | None = None


@dataclass(frozen=True)
class RateWindow:
    """A window of the sample's arrivals: ``start_s``/``end_s`` (seconds from the sample's first
    arrival), ``requests`` arriving in [start, end), and the sample's ``mean_rate_per_s``
    (requests over the first-to-last arrival span)."""

    start_s: float
    end_s: float
    requests: int
    mean_rate_per_s: float

    @property
    def rate_per_s(self) -> float:
        """Requests per second inside the window."""
        return self.requests / (self.end_s - self.start_s)

    @property
    def ratio(self) -> float:
        """The window's rate over the mean rate (x)."""
        return self.rate_per_s / self.mean_rate_per_s if self.mean_rate_per_s else math.inf

    def describe(self) -> str:
        """``7 requests in 73.2-74.2 s (7.0/s, 3.5x the mean 2.00/s)``."""
        return (f"{_n(self.requests, 'request')} in {self.start_s:.1f}-{self.end_s:.1f} s ({self.rate_per_s:.1f}/s, "
                f"{self.ratio:.1f}x the mean {self.mean_rate_per_s:.2f}/s)")


@dataclass(frozen=True)
class TrafficSample:
    """The requests of one sample, in file order, and its provenance: ``path`` (as given),
    ``sha256`` (hex of the file's bytes), ``format`` (the one read). ``represents``: the requests
    the rows stand for when that is not one each (``metrics``: the histograms' count)."""

    requests: tuple[TraceRequest, ...]
    path: str
    sha256: str
    format: str
    notes: tuple[str, ...] = field(default=())
    represents: float | None = None

    @property
    def has_arrivals(self) -> bool:
        """Every request carries an arrival time (an open-loop replay needs them)."""
        return bool(self.requests) and all(r.arrival_s is not None for r in self.requests)

    def sessions(self) -> dict[str, list[TraceRequest]]:
        """Session id -> its turns in order (requests without a session left out)."""
        out: dict[str, list[TraceRequest]] = {}
        for r in self.requests:
            if r.session is not None:
                out.setdefault(r.session, []).append(r)
        for turns in out.values():
            turns.sort(key=lambda r: (r.turn if r.turn is not None else 0))
        return out

    def percentiles(self, what: str = "prompt_tokens", qs: Sequence[float] = (50, 90, 99)) -> dict[str, int]:
        """``{"p50": tokens, ...}`` of ``what`` (``prompt_tokens``, ``output_tokens`` or
        ``total``), nearest-rank (numpy ``inverted_cdf``: a length some request really had)."""
        xs = np.asarray([r.prompt_tokens + r.output_tokens if what == "total" else getattr(r, what)
                         for r in self.requests], dtype=float)
        if not len(xs):
            return {f"p{q:g}": 0 for q in qs}
        return {f"p{q:g}": int(np.percentile(xs, q, method="inverted_cdf")) for q in qs}

    def _arrivals(self) -> np.ndarray:
        return np.sort(np.asarray([r.arrival_s for r in self.requests if r.arrival_s is not None], dtype=float))

    def arrival_rate(self) -> float | None:
        """Mean arrival rate (requests/s) over the first-to-last arrival span; None with fewer than
        two arrivals or a zero span."""
        t = self._arrivals()
        return len(t) / (t[-1] - t[0]) if len(t) >= 2 and t[-1] > t[0] else None

    def rate_windows(self, window_s: float = 1.0, top: int = 3) -> list[RateWindow]:
        """The busiest arrival windows, busiest first: up to ``top`` non-overlapping windows of
        ``window_s`` seconds, each starting at an arrival, by requests in it (ties: the earlier).
        ``[]`` without arrival times. The latency gate names a burst with ``rate_windows()[0]``."""
        t = self._arrivals()
        if len(t) < 2 or window_s <= 0:
            return []
        mean = self.arrival_rate() or len(t) / window_s
        idx = np.arange(len(t))
        counts = np.searchsorted(t, t + window_s, side="left") - idx
        chosen: list[RateWindow] = []
        for i in np.lexsort((idx, -counts)):
            s = t[i] - t[0]
            if any(s < c.end_s and c.start_s < s + window_s for c in chosen):
                continue
            chosen.append(RateWindow(round(float(s), 6), round(float(s + window_s), 6), int(counts[i]), float(mean)))
            if len(chosen) >= top:
                break
        return chosen

    def describe(self) -> str:
        """One line: file, short hash, requests, sessions, prompt/output p50/p99 (tokens)."""
        p, o = self.percentiles("prompt_tokens", (50, 99)), self.percentiles("output_tokens", (50, 99))
        ses = self.sessions()
        s = f", {len(ses)} sessions" if ses else ""
        return (f"{self.path} (sha256 {self.sha256[:12]}, {len(self.requests):,} requests{s}): prompt p50/p99 "
                f"{p['p50']:,}/{p['p99']:,} tokens, output p50/p99 {o['p50']:,}/{o['p99']:,}")

    def summary(self) -> str:
        """Several lines (``kvgate traffic show``): path, format, SHA-256, requests and sessions,
        prompt/output p50/p90/p99 (tokens), arrival rate (mean, busiest 1-s window), shared
        prefixes, notes."""
        ses = self.sessions()
        lines = [self.path, f"  format    {self.format}", f"  sha256    {self.sha256}"]
        reqs = f"  requests  {len(self.requests):,}"
        if self.represents is not None:
            reqs += f" rows standing for {self.represents:,.0f} requests"
        if ses:
            turns = [len(v) for v in ses.values()]
            single = sum(1 for r in self.requests if r.session is None)
            span = f"{min(turns)}" if min(turns) == max(turns) else f"{min(turns)}-{max(turns)}"
            reqs += (f" ({_n(len(ses), 'session')} of {span} turn{'' if span == '1' else 's'}, {_n(sum(turns), 'request')}; "
                     f"{single:,} without a session)")
        lines.append(reqs)
        for what, label in (("prompt_tokens", "prompt"), ("output_tokens", "output"), ("total", "total")):
            q = self.percentiles(what)
            lines.append(f"  {label:<8}  p50/p90/p99 {q['p50']:,}/{q['p90']:,}/{q['p99']:,} tokens")
        rate = self.arrival_rate()
        if rate is None:
            lines.append("  arrivals  not recorded (open-loop replay needs them; closed loop draws from the sample)")
        else:
            t = self._arrivals()
            busiest = self.rate_windows(1.0, top=1)
            lines.append(f"  arrivals  mean {rate:.2f} requests/s over {t[-1] - t[0]:,.1f} s"
                         + (f"; busiest 1-s window: {busiest[0].describe()}" if busiest else ""))
        prefixes = Counter((r.prefix_id, r.prefix_tokens) for r in self.requests if r.prefix_id)
        for (pid, tokens), n in sorted(prefixes.items(), key=lambda kv: (-kv[1], str(kv[0][0]))):
            lines.append(f"  prefix    {pid}: {tokens:,} tokens, shared by {_n(n, 'request')}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def provenance(self) -> dict[str, Any]:
        """What a verdict's evidence records about the sample (path, sha256, format, counts, percentiles)."""
        return {"path": self.path, "sha256": self.sha256, "format": self.format, "requests": len(self.requests),
                "sessions": len(self.sessions()), "prompt_tokens": self.percentiles("prompt_tokens"),
                "output_tokens": self.percentiles("output_tokens"), "notes": list(self.notes)}


def _n(count: int, word: str) -> str:
    """``1 session``, ``3 sessions``."""
    return f"{count:,} {word}{'' if count == 1 else 's'}"


# --------------------------------------------------------------------------------------------
# reading records


def _int(obj: dict[str, Any], where: str, *names: str, required: bool = True, shown: str = "") -> int | None:
    """The first of ``names`` (dotted paths) present in ``obj``: a non-negative integer, else a
    :class:`TrafficError` naming ``where`` and the field (``shown`` + name)."""
    for name in names:
        cur: Any = obj
        for part in name.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if cur is not None:
            if isinstance(cur, bool) or not isinstance(cur, int) or cur < 0:
                raise TrafficError(f"{where}: field {shown + name!r} must be a non-negative integer, got {cur!r}")
            return cur
    if required:
        raise TrafficError(f"{where}: missing field {shown + names[0]!r} (or "
                           f"{', '.join(repr(shown + n) for n in names[1:])})")
    return None


def _lines(label: str, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, object)`` of each non-blank line of JSON lines ``text``."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrafficError(f"{label}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise TrafficError(f"{label}:{n}: expected a JSON object per line, got {type(obj).__name__}")
        yield n, obj


def _array(label: str, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, object)`` of each element of the JSON array ``text`` (the line it starts on)."""
    dec = json.JSONDecoder()
    ws = re.compile(r"\s*")
    i = ws.match(text, text.index("[") + 1).end()
    while i < len(text) and text[i] != "]":
        line = text.count("\n", 0, i) + 1
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise TrafficError(f"{label}:{exc.lineno}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise TrafficError(f"{label}:{line}: expected a JSON object per array element, got {type(obj).__name__}")
        yield line, obj
        i = ws.match(text, i).end()
        if i < len(text) and text[i] == ",":
            i = ws.match(text, i + 1).end()
        elif i >= len(text) or text[i] != "]":
            raise TrafficError(f"{label}:{text.count(chr(10), 0, i) + 1}: expected ',' or ']' after an array element")
    if i >= len(text):
        raise TrafficError(f"{label}: the JSON array is not closed (no ']')")


def _arrival(obj: dict[str, Any], where: str, shown: str = "") -> float | None:
    """``arrival_s`` (seconds) or ``timestamp`` (seconds, or ISO 8601 text) of a record."""
    for name in ("arrival_s", "timestamp"):
        v = obj.get(name)
        if v is None:
            continue
        if isinstance(v, str) and name == "timestamp":
            try:
                return datetime.fromisoformat(v).timestamp()
            except ValueError:
                pass
        elif not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v):
            return float(v)
        kind = "seconds or ISO 8601 text" if name == "timestamp" else "a number of seconds"
        raise TrafficError(f"{where}: field {shown + name!r} must be {kind}, got {v!r}")
    return None


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` without a tokenizer: UTF-8 bytes / :data:`BYTES_PER_TOKEN`, rounded up."""
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)


def _content(value: Any, where: str, name: str) -> str:
    """A message's content as text: a string, null, or a list of ``{"type": "text", "text": ...}`` parts."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list):
        parts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict):
                raise TrafficError(f"{where}: field '{name}[{j}]' must be a content part object, got {part!r:.60}")
            if part.get("type", "text") == "text":
                if not isinstance(part.get("text"), str):
                    raise TrafficError(f"{where}: field '{name}[{j}].text' must be text")
                parts.append(part["text"])
        return "\n".join(parts)
    raise TrafficError(f"{where}: field {name!r} must be text or a list of content parts, got {value!r:.60}")


def _messages(value: Any, where: str, name: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise TrafficError(f"{where}: field {name!r} must be a non-empty list of messages, got {value!r:.60}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise TrafficError(f"{where}: field '{name}[{i}].role' missing: a message is {{\"role\": ..., "
                               f"\"content\": ...}}, got {m!r:.60}")
        out.append({**m, "content": _content(m.get("content"), where, f"{name}[{i}].content")})
    return out


class _Tokens:
    """Counts text with ``count`` or the estimate, and remembers how many requests were counted so."""

    def __init__(self, count: Callable[[str], int] | None):
        self.count, self.counted = count, 0
        self.seen: dict[str, int] = {}  # a system prompt or a turn repeats: one /tokenize call each text

    def __call__(self, text: str) -> int:
        if text not in self.seen:
            self.seen[text] = int(self.count(text)) if self.count else estimate_tokens(text)
        return self.seen[text]

    def messages(self, msgs: Sequence[dict[str, Any]]) -> int:
        """Tokens of a request's messages: the sum over their contents (chat-template tokens not included)."""
        self.counted += 1
        return sum(self(m["content"]) for m in msgs)

    def note(self, what: str) -> list[str]:
        if not self.counted:
            return []
        if self.count:
            return [f"{what} of {_n(self.counted, 'request')} counted from the message text with the given tokenizer "
                    "(chat-template tokens not included)"]
        return [f"{what} of {_n(self.counted, 'request')} estimated as UTF-8 bytes / {BYTES_PER_TOKEN} (no token counts in "
                "the file and no tokenizer given; the replaying gates plan and check max_model_len with these "
                "estimates, and count the prompts they build with the server's /tokenize)"]


def _shared_system_prefix(rows: list[TraceRequest], tokens: _Tokens) -> list[TraceRequest]:
    """Give every request whose system prompt another request shares ``prefix_id`` ``sys-<sha8>``
    and the prompt's tokens (at most its prompt_tokens)."""
    def system(r: TraceRequest) -> str | None:
        m = r.messages[0] if r.messages else None
        return m["content"] if m and m.get("role") == "system" and m["content"] else None

    seen = Counter(s for s in map(system, rows) if s is not None)
    sizes = {s: tokens(s) for s, n in seen.items() if n >= 2}
    return [replace(r, prefix_id="sys-" + hashlib.sha256(s.encode()).hexdigest()[:8],
                    prefix_tokens=min(sizes[s], r.prompt_tokens))
            if (s := system(r)) in sizes and r.prefix_id is None else r for r in rows]


# --------------------------------------------------------------------------------------------
# the formats


def _jsonl(label: str, text: str) -> tuple[list[TraceRequest], list[str]]:
    out = []
    for n, obj in _lines(label, text):
        where = f"{label}:{n}"
        p = _int(obj, where, "prompt_tokens", "input_tokens", "usage.prompt_tokens")
        o = _int(obj, where, "output_tokens", "completion_tokens", "usage.completion_tokens")
        # a bare NaN/Infinity (Python's json reads them) is no arrival time: an error, not "not recorded"
        arrival = _arrival({"arrival_s": obj.get("arrival_s")}, where)
        turn = _int(obj, where, "turn", required=False)
        pt = _int(obj, where, "prefix_tokens", required=False) or 0
        if pt > p:
            raise TrafficError(f"{where}: field 'prefix_tokens' {pt} exceeds prompt_tokens {p}")
        ses, pid = obj.get("session"), obj.get("prefix_id")
        out.append(TraceRequest(p, o, None if arrival is None else float(arrival),
                                None if ses is None else str(ses), turn, None if pid is None else str(pid), pt,
                                line=n))
    return out, []


def _openai_log(label: str, text: str, count: Callable[[str], int] | None) -> tuple[list[TraceRequest], list[str]]:
    tokens, capped = _Tokens(count), 0
    turns: Counter[str] = Counter()
    out = []
    for n, obj in _lines(label, text):
        where = f"{label}:{n}"
        wrapped = "request" in obj
        req, pre = (obj["request"], "request.") if wrapped else (obj, "")
        if not isinstance(req, dict):
            raise TrafficError(f"{where}: field 'request' must be the request object as sent, got {req!r:.60}")
        msgs = None
        p = _int(obj, where, "response.usage.prompt_tokens", "usage.prompt_tokens", required=False)
        if req.get("messages") is not None:
            msgs = _messages(req["messages"], where, pre + "messages")
            if p is None:
                p = tokens.messages(msgs)
        elif req.get("prompt") is not None:
            prompt = req["prompt"]
            if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                p = len(prompt) if p is None else p  # token ids: exact
            elif not isinstance(prompt, str):
                raise TrafficError(f"{where}: field {pre + 'prompt'!r} must be text or a list of token ids (one "
                                   f"request), got {prompt!r:.60}")
            elif p is None:
                p = tokens.messages([{"content": prompt}])
        else:
            raise TrafficError(f"{where}: missing field {pre + 'messages'!r} (or {pre + 'prompt'!r}): not an OpenAI "
                               "request")
        o = _int(obj, where, "response.usage.completion_tokens", "usage.completion_tokens", required=False)
        if o is None:
            o = _int(req, where, "max_completion_tokens", "max_tokens", required=False, shown=pre)
            if o is None:
                raise TrafficError(f"{where}: missing field {pre + 'max_tokens'!r} (or {pre + 'max_completion_tokens'!r},"
                                   " 'response.usage.completion_tokens'): the output length is not recorded")
            capped += 1
        ses = next((v for v in (obj.get(k) if k in obj else req.get(k)
                                for k in ("session", "conversation_id", "user")) if v is not None), None)
        ses = None if ses is None else str(ses)
        turn = None
        if ses is not None:
            turn = _int(obj, where, "turn", required=False)
            turn = turns[ses] if turn is None else turn
            turns[ses] += 1
        out.append(TraceRequest(p, o, _arrival(obj, where), ses, turn,
                                messages=None if msgs is None else tuple(msgs), line=n))
    notes = tokens.note("prompt tokens")
    if capped:
        notes.append(f"output tokens of {_n(capped, 'request')} are max_tokens as sent (no response usage): an upper bound")
    return _shared_system_prefix(out, tokens), notes


def _sharegpt(label: str, text: str, count: Callable[[str], int] | None) -> tuple[list[TraceRequest], list[str]]:
    tokens, unanswered = _Tokens(count), 0
    records = _array(label, text) if text.lstrip().startswith("[") else _lines(label, text)
    out = []
    for k, (n, obj) in enumerate(records):
        where = f"{label}:{n}"
        conv = obj.get("conversations")
        if not isinstance(conv, list):
            raise TrafficError(f"{where}: missing field 'conversations' (a list of {{\"from\", \"value\"}} turns), "
                               f"got {conv!r:.60}")
        sid = str(obj["id"]) if obj.get("id") is not None else f"conversation-{k}"
        msgs = []
        for i, turn in enumerate(conv):
            who = turn.get("from") if isinstance(turn, dict) else None
            if who not in SHAREGPT_ROLES:
                raise TrafficError(f"{where}: field 'conversations[{i}].from' must be one of "
                                   f"{', '.join(sorted(SHAREGPT_ROLES))}, got {who!r}")
            if not isinstance(turn.get("value"), str):
                raise TrafficError(f"{where}: field 'conversations[{i}].value' must be text, got {turn.get('value')!r:.60}")
            msgs.append({"role": SHAREGPT_ROLES[who], "content": turn["value"]})
        sizes = [tokens(m["content"]) for m in msgs]
        asked = 0
        for i, m in enumerate(msgs):
            if m["role"] != "user":
                continue
            if i + 1 >= len(msgs) or msgs[i + 1]["role"] != "assistant":
                unanswered += 1
                continue
            tokens.counted += 1
            out.append(TraceRequest(sum(sizes[: i + 1]), sizes[i + 1], None, sid, asked,
                                    messages=tuple(msgs[: i + 1]), line=n))
            asked += 1
    notes = tokens.note("prompt and output tokens")
    if unanswered:
        notes.append(f"{_n(unanswered, 'human turn')} without a following gpt reply left out (no output length)")
    return _shared_system_prefix(out, tokens), notes


def histogram(text: str, name: str) -> list[tuple[float, float]]:
    """``[(le, cumulative count)]`` of the histogram ``name`` in Prometheus text, summed over
    label sets (engines, models), ``+Inf`` last."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[float, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != name:
            continue
        for s in fam.samples:
            if s.name == f"{name}_bucket":
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
    return sorted(buckets.items())


def histogram_quantiles(buckets: list[tuple[float, float]], levels: np.ndarray) -> np.ndarray:
    """Prometheus ``histogram_quantile`` at ``levels`` (0-1), rounded up to whole tokens: linear
    within a bucket, the largest finite bound in ``+Inf``."""
    total = buckets[-1][1]
    out = []
    for q in levels:
        rank = q * total
        lo_b, lo_c = 0.0, 0.0
        value = None
        for le, c in buckets:
            if c >= rank and c > lo_c:
                if math.isinf(le):
                    value = lo_b
                else:
                    value = lo_b + (le - lo_b) * (rank - lo_c) / (c - lo_c)
                break
            lo_b, lo_c = (le if not math.isinf(le) else lo_b), c
        out.append(lo_b if value is None else value)
    return np.ceil(np.array(out))


@dataclass(frozen=True)
class MetricsLengths:
    """vLLM's length histograms read as ``rows`` quantile levels: ``prompt`` and ``output`` (tokens,
    level by level), ``requests`` (the histograms' count) and ``bounds`` (the finite bucket bounds)."""

    prompt: np.ndarray
    output: np.ndarray
    requests: float
    bounds: tuple[float, ...]


def metrics_lengths(text: str, source: str, rows: int = METRICS_ROWS) -> MetricsLengths:
    """The ``vllm:request_prompt_tokens`` and ``vllm:request_generation_tokens`` histograms of
    ``/metrics`` text at ``rows`` evenly spaced quantile levels. Raises :class:`TrafficError`
    (naming ``source``) when the text is not Prometheus text, they are missing, or they count nothing."""
    try:
        p, o = histogram(text, METRIC_PROMPT), histogram(text, METRIC_OUTPUT)
    except ValueError as exc:
        raise TrafficError(f"{source}: not Prometheus text ({exc})") from None
    if not p or not o:
        missing = [n for n, h in ((METRIC_PROMPT, p), (METRIC_OUTPUT, o)) if not h]
        raise TrafficError(f"{source}: no {' or '.join(missing)} histogram (is it vLLM's /metrics? "
                           "--disable-log-stats removes them)")
    count = p[-1][1]
    if count <= 0:
        raise TrafficError(f"{source}: the histograms count no finished request yet; send traffic first")
    levels = (np.arange(rows) + 0.5) / rows
    return MetricsLengths(histogram_quantiles(p, levels), histogram_quantiles(o, levels), count,
                          tuple(le for le, _ in p if not math.isinf(le)))


def _metrics(label: str, text: str) -> tuple[list[TraceRequest], list[str], float]:
    m = metrics_lengths(text, label)
    rows = [TraceRequest(int(p), int(o)) for p, o in zip(m.prompt, m.output)]
    return rows, [f"from /metrics histograms ({m.requests:,.0f} requests): {len(rows)} quantile levels, prompt and "
                  "output paired by quantile (long prompts with long outputs: their sum's percentiles are an upper "
                  "bound); no arrival times, no sessions"], m.requests


# --------------------------------------------------------------------------------------------
# detecting and loading

_JSONL_KEYS = ("prompt_tokens", "input_tokens", "output_tokens")
_OPENAI_KEYS = ("messages", "prompt", "request")
_METRICS_LINE = re.compile(r"^vllm:[A-Za-z0-9_:]+_bucket\{", re.M)


def detect_format(text: str) -> tuple[str | None, str]:
    """``(format, why)``: the format ``text`` is in, told from its content (``[`` first: sharegpt;
    Prometheus text: metrics; else the first JSON line's fields: ``conversations`` sharegpt,
    ``prompt_tokens``/``input_tokens``/``output_tokens`` jsonl, ``messages``/``prompt``/``request``
    openai-log, ``usage`` jsonl), or ``(None, why not)``."""
    head = text.lstrip()
    if head.startswith("["):
        return "sharegpt", "a JSON array"
    if head.startswith(("# HELP", "# TYPE")) or _METRICS_LINE.search(text):
        return "metrics", "Prometheus text"
    n, first = next(((n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()), (0, ""))
    try:
        obj = json.loads(first)
    except json.JSONDecodeError as exc:
        return None, f"line {n} is neither JSON nor Prometheus text ({exc.msg})"
    if not isinstance(obj, dict):
        return None, f"line {n} is a JSON {type(obj).__name__}, not an object"
    if "conversations" in obj:
        return "sharegpt", "JSON lines with 'conversations'"
    for fmt, keys in (("jsonl", _JSONL_KEYS), ("openai-log", _OPENAI_KEYS), ("jsonl", ("usage",))):
        if any(k in obj for k in keys):
            return fmt, f"JSON lines with {next(k for k in keys if k in obj)!r}"
    return None, (f"line {n} has none of the fields conversations, {', '.join(_JSONL_KEYS)}, "
                  f"{', '.join(_OPENAI_KEYS)}, usage")


def load_sample(path: str | Path, format: str = "auto", shown: str | None = None,
                count: Callable[[str], int] | None = None) -> TrafficSample:
    """Read the traffic sample at ``path`` (``format``: one of :data:`FORMATS` or ``auto``; see
    the module docstring). ``shown``: how the path is written in messages and provenance (default
    ``path``). ``count``: text -> tokens for sources that carry text without token counts (the
    replaying gate passes the server's ``/tokenize``; default: the UTF-8 bytes / 4 estimate, with a
    note). Raises :class:`TrafficError` when it cannot be read, is empty, or a record is malformed."""
    path = Path(path)
    label = shown or str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TrafficError(f"traffic sample {label}: cannot read it ({exc.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TrafficError(f"traffic sample {label}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    if format not in ("auto", *FORMATS):
        raise TrafficError(f"traffic sample {label}: format {format!r} is not one of auto, {', '.join(FORMATS)}")
    if not text.strip():
        raise TrafficError(f"traffic sample {label}: no requests in it (the file is empty)")
    if format == "auto":
        format, why = detect_format(text)
        if format is None:
            raise TrafficError(f"traffic sample {label}: cannot tell its format (tried {', '.join(FORMATS)}): {why}; "
                               "name it (traffic.format in a profile, --format on the command line)")
    represents = None
    if format == "jsonl":
        requests, notes = _jsonl(label, text)
    elif format == "openai-log":
        requests, notes = _openai_log(label, text, count)
    elif format == "sharegpt":
        requests, notes = _sharegpt(label, text, count)
    else:
        requests, notes, represents = _metrics(label, text)
    if not requests:
        raise TrafficError(f"traffic sample {label}: no requests in it ({format})")
    notes = list(notes) + _order_note(requests)
    return TrafficSample(tuple(requests), label, hashlib.sha256(data).hexdigest(), format, tuple(notes), represents)


def _order_note(requests: list[TraceRequest]) -> list[str]:
    """A note when the arrival times are not in file order (replay and the rate windows use them
    in time order): ``["arrivals out of file order: 3 requests arrive before the request above
    them (first: line 7); replayed in time order"]``, else ``[]``."""
    late = [(a, b) for a, b in zip(requests, requests[1:])
            if a.arrival_s is not None and b.arrival_s is not None and b.arrival_s < a.arrival_s]
    if not late:
        return []
    first = late[0][1]
    where = f" (first: line {first.line})" if first.line else ""
    return [f"arrivals out of file order: {_n(len(late), 'request')} arriving before the request above{where}; "
            "replayed in time order"]


def sample_path(profile: Any, traffic: Any) -> Path:
    """The file a workload's ``traffic.path`` names: absolute as given, else relative to the
    profile's file (``profile.source``), else to the working directory."""
    p = Path(traffic.path).expanduser()
    if p.is_absolute() or not getattr(profile, "source", None):
        return p
    return Path(profile.source).parent / p


def sample_for(profile: Any, workload: str, count: Callable[[str], int] | None = None) -> TrafficSample | None:
    """The traffic sample of ``profile.workloads[workload]`` (None when it has no ``traffic:``);
    ``count``: as :func:`load_sample` (the server's ``/tokenize`` counter, for text-only sources).
    Raises :class:`TrafficError` naming the profile field and the file."""
    wl = profile.workloads[workload]
    if wl.traffic is None:
        return None
    path = sample_path(profile, wl.traffic)
    try:
        return load_sample(path, wl.traffic.format, shown=wl.traffic.path, count=count)
    except TrafficError as exc:
        raise TrafficError(f"{profile.source or profile.name}: field 'workloads.{workload}.traffic': {exc}") from None


def overlong(sample: TrafficSample, max_model_len: int, max_tokens_cap: int | None = None) -> dict[str, Any] | None:
    """Requests the deployment cannot serve as recorded: prompt + output over ``max_model_len``
    (tokens), or output over the ``max_tokens`` cap. ``None`` when every request fits, else
    ``{"requests", "share", "prompt_p99", "limit", "first_line"}`` (``limit`` = max_model_len minus
    the p99 output: the longest prompt the p99 request may have)."""
    bad = [r for r in sample.requests if r.prompt_tokens + r.output_tokens > max_model_len
           or (max_tokens_cap is not None and r.output_tokens > max_tokens_cap)]
    p99 = sample.percentiles("prompt_tokens", (99,))["p99"]
    o99 = sample.percentiles("output_tokens", (99,))["p99"]
    limit = max_model_len - (min(o99, max_tokens_cap) if max_tokens_cap else o99)
    if not bad and p99 <= limit:
        return None
    return {"requests": len(bad), "share": len(bad) / len(sample.requests), "prompt_p99": p99, "limit": limit,
            "first_line": bad[0].line if bad else None}


def overlong_message(found: dict[str, Any] | None, sample: TrafficSample, max_model_len: int,
                     max_tokens_cap: int | None = None, where: str = "the profile") -> str:
    """The callout of :func:`overlong`'s result ``found`` in one line, limits named: e.g.
    ``traffic sample t.jsonl: 3 requests (1.0%) do not fit the profile: prompt + output over
    engine.max_model_len 2,048 or output over limits.max_tokens_cap 512 (first at line 17); prompt
    p99 1,990 tokens > 1,952 (max_model_len - p99 output)``."""
    if found is None:
        cap_ok = f" and output <= limits.max_tokens_cap {max_tokens_cap:,}" if max_tokens_cap else ""
        return (f"traffic sample {sample.path}: every request fits {where} (prompt + output <= engine.max_model_len "
                f"{max_model_len:,}{cap_ok})")
    cap = f" or output over limits.max_tokens_cap {max_tokens_cap:,}" if max_tokens_cap else ""
    first = f" (first at line {found['first_line']})" if found["first_line"] else ""
    p99 = (f"; prompt p99 {found['prompt_p99']:,} tokens > {found['limit']:,} (max_model_len - p99 output)"
           if found["prompt_p99"] > found["limit"] else "")
    return (f"traffic sample {sample.path}: {_n(found['requests'], 'request')} ({found['share']:.1%}) "
            f"{'does' if found['requests'] == 1 else 'do'} not fit {where}: "
            f"prompt + output over engine.max_model_len {max_model_len:,}{cap}{first}{p99}")
