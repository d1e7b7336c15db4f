"""The framer and the classifier of an OpenAI-style SSE stream (``/completions`` and
``/chat/completions``): the single place that cuts a body into events and decides what an event *is*.

**Framing** (every reader uses it): an event ends at a blank line; its ``data`` is the values of
its ``data:`` lines (one space after the colon dropped, as the SSE spec says) joined with
``\n``; an event without a ``data:`` line (a comment such as ``: ping``, ``event:`` alone) is
skipped (:func:`event_data`). :func:`iter_data` frames decoded lines as they arrive (single
probes, :meth:`kvgate.http.client.KvClient.stream`); :func:`split_sse` frames timed body pieces
after a load run (:meth:`kvgate.load.RequestRecord.finalize`), each event timed by the piece
that completed it.

**Classifying**: input one event's ``data`` text, as the framing left it. Output: an :class:`SseEvent`
whose :attr:`~SseEvent.kind` is one of

- ``"done"``: the ``[DONE]`` sentinel (surrounding white space ignored);
- ``"malformed"``: not JSON, or JSON that is not an object;
- ``"error"``: an object with an ``"error"`` key (vLLM reports a failure inside a 200 stream so);
- ``"chunk"``: any other object. A chunk's facets are not exclusive (vLLM's last text chunk can
  carry the finish reason, and with ``continuous_usage_stats`` every chunk carries usage), so they
  are properties: :attr:`~SseEvent.is_role` (chat's opening role announcement and nothing else),
  :attr:`~SseEvent.is_content` (a decode step: some choice carries a text field),
  :attr:`~SseEvent.is_finish` (some choice has a non-null ``finish_reason``),
  :attr:`~SseEvent.is_usage` (a ``usage`` object, e.g. the ``stream_options.include_usage``
  chunk, whose ``choices`` is empty).

**Decode steps** (what the load client counts as tokens when no usage came, and times as
``content_s``): an event whose choice carries a text field, *even an empty one* — a byte-level
tokenizer emits tokens that do not complete a character yet, and vLLM then streams ``"text": ""``
(completions) or ``"content": ""`` (chat). Chat's opening ``{"role": "assistant", "content": ""}``
is not a token. Reasoning text and tool calls are steps too.

**Tokens from logprobs**: with ``logprobs`` requested, each choice lists one entry per generated
token (completions: ``logprobs.tokens``; chat: ``logprobs.content``); :attr:`Choice.logprob_tokens`
is that count, the ground truth the max-tokens gate compares usage with.

**Grammar** (:func:`grammar`, the streaming gate's keepalive case): the raw body cut into frames
(the lines between blank lines) and checked against the SSE grammar as SDKs read it -- comments
only as lines starting with ``:``, no ``data:`` whose value starts with ``:`` (``data: :
PROCESSING``), no event whose data is empty, no frame with ``id:``/``event:``/``retry:`` and no
``data:`` (openai-python and httpx-sse dispatch it as an empty event); with the largest gap between
*data events* beside the largest gap between bytes (comment keepalives move the second, not the
first). :func:`second_parser` frames the same bytes with ``httpx-sse``, to check kvgate's framer
and the SDK against.

Tolerant by design: no input raises; garbage becomes ``"malformed"`` (or, for a choice that is not
an object, an entry of :attr:`SseEvent.bad_choices`), so a gate can report it as a conformance
failure. The folds over these events live with their users: :func:`kvgate.http.stream.summarize`
(single probes) and :meth:`kvgate.load.RequestRecord.finalize` (load runs).
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

from kvgate.http.text import clip

DONE = "done"
MALFORMED = "malformed"
ERROR = "error"
CHUNK = "chunk"

#: characters of a server's error text kept (one line in a verdict or a record)
ERROR_TEXT_CAP = 200
_BOUNDARY = re.compile(rb"\r?\n\r?\n")


# ----------------------------------------------------------------------------- framing


def event_data(lines: Iterable[str]) -> str | None:
    """The ``data`` of one SSE event from its lines (line ends removed, a trailing ``\r``
    ignored): its ``data:`` lines' values joined with ``\n``, one space after the colon dropped;
    ``None`` when it has no ``data:`` line."""
    data = [ln[6:] if ln.startswith("data: ") else ln[5:] for ln in (x.rstrip("\r") for x in lines)
            if ln.startswith("data:")]
    return "\n".join(data) if data else None


def iter_data(lines: Iterable[str]) -> Iterator[str]:
    """Yield each event's ``data`` (:func:`event_data`) from decoded lines as they arrive, a blank
    line ending an event; a last event without its blank line counts."""
    buf: list[str] = []
    for line in lines:
        if line.rstrip("\r"):
            buf.append(line)
            continue
        data = event_data(buf)
        buf = []
        if data is not None:
            yield data
    data = event_data(buf)
    if data is not None:
        yield data


def split_sse(piece_s: Sequence[float], pieces: Sequence[bytes],
              tail: bool = True) -> tuple[list[float], list[str]]:
    """Split body pieces (bytes, HTTP framing removed) into SSE events; return (arrival time of
    each event, its ``data``), times in the units of ``piece_s`` (seconds).

    An event's time is the arrival of the piece that completed it (its blank line). ``data`` as
    :func:`event_data` reads it (UTF-8, bad bytes replaced); events without data are skipped; a
    trailing event without its blank line counts (at the last piece's time) when ``tail`` is true
    -- pass False for a body that was cut off.
    """
    if not pieces:
        return [], []
    body = b"".join(pieces)
    ends: list[int] = []
    acc = 0
    for p in pieces:
        acc += len(p)
        ends.append(acc)
    times: list[float] = []
    datas: list[str] = []
    last = len(pieces) - 1

    def take(block: bytes, t: float) -> None:
        if block.startswith(b"data: ") and b"\n" not in block and not block.endswith(b"\r"):  # the usual event
            times.append(t)
            datas.append(block[6:].decode("utf-8", "replace"))
            return
        data = event_data(block.decode("utf-8", "replace").split("\n"))
        if data is not None:
            times.append(t)
            datas.append(data)

    if b"\r" not in body:  # fast path: split on blank lines, walk the pieces alongside
        blocks = body.split(b"\n\n")
        rest = blocks.pop()
        pos, i = 0, 0
        for block in blocks:
            pos += len(block) + 2
            while ends[i] < pos:  # the piece holding the boundary's last byte (offset pos - 1)
                i += 1
            if block:
                take(block, piece_s[i])
    else:
        start = 0
        for m in _BOUNDARY.finditer(body):
            i = bisect.bisect_right(ends, m.end() - 1)
            take(body[start:m.start()], piece_s[min(i, last)])
            start = m.end()
        rest = body[start:]
    if tail and rest.strip():
        take(rest, piece_s[last])
    return times, datas


# ----------------------------------------------------------------------------- classifying


def is_done(data: str) -> bool:
    """Whether an event's ``data`` is the ``[DONE]`` sentinel (surrounding white space ignored)."""
    return data == "[DONE]" or data.strip() == "[DONE]"


@dataclass(slots=True)
class Choice:
    """One entry of a chunk's ``choices``.

    ``text``: the answer text it carries — ``delta.content`` (chat) or ``text`` (completions);
    None when absent or not a string, ``""`` when present and empty. ``reasoning``: a chat
    delta's ``reasoning_content`` (or ``reasoning``) when it carries no answer text, else None.
    ``role``: a chat delta's role, if any. ``tool_calls``: the delta carries tool calls.
    ``finish_reason``: as a string, None when null/absent. ``logprob_tokens``: tokens listed by
    the per-chunk logprobs, None when the server sent none. ``step``: this choice is a decode step
    (see the module docstring).
    """

    index: Any
    text: str | None
    reasoning: str | None
    role: str | None
    tool_calls: bool
    finish_reason: str | None
    logprob_tokens: int | None
    step: bool

    @property
    def piece(self) -> str:
        """The generated text to concatenate: the answer text, else the reasoning text."""
        return self.text or self.reasoning or ""


@dataclass(slots=True)
class SseEvent:
    """What one SSE event is. ``data``: its raw text; ``obj``: the decoded object (None unless
    ``kind`` is ``"error"`` or ``"chunk"``); ``choices``: the choices that are objects, in order;
    ``bad_choices``: the ones that are not; ``usage``: the ``usage`` object, if any; ``error``:
    the value of ``"error"`` for an error event."""

    kind: str
    data: str
    obj: dict[str, Any] | None = None
    choices: tuple[Choice, ...] = ()
    bad_choices: tuple[Any, ...] = ()
    usage: dict[str, Any] | None = None
    error: Any = None

    @property
    def is_content(self) -> bool:
        """Some choice is a decode step (carries a text field, reasoning or tool calls)."""
        return any(c.step for c in self.choices)

    @property
    def is_role(self) -> bool:
        """Chat's role announcement and nothing more: a choice names a role, none is a step."""
        return any(c.role for c in self.choices) and not self.is_content

    @property
    def is_finish(self) -> bool:
        return any(c.finish_reason for c in self.choices)

    @property
    def is_usage(self) -> bool:
        return self.usage is not None

    @property
    def finish_reason(self) -> str | None:
        """The last non-null finish reason among the choices."""
        out = None
        for c in self.choices:
            if c.finish_reason:
                out = c.finish_reason
        return out

    @property
    def error_text(self) -> str:
        """The error's message, one line of at most :data:`ERROR_TEXT_CAP` characters."""
        return error_text(self.obj)


def error_message(obj: Any) -> str | None:
    """``error.message`` (or a string ``error``) of an OpenAI-style error object, whole; None when
    ``obj`` is not one. The one place that reads an error body's shape (SSE error events, load
    records and :attr:`kvgate.http.client.Reply.error_message` all use it)."""
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
    return None


def error_text(obj: Any) -> str:
    """:func:`error_message` of ``obj``, else the object's text; one line of at most
    :data:`ERROR_TEXT_CAP` characters, cut at a word boundary (:func:`kvgate.http.text.clip`)."""
    msg = error_message(obj)
    return clip(msg if msg is not None else str(obj), ERROR_TEXT_CAP)


def _logprob_tokens(choice: dict[str, Any]) -> int | None:
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if isinstance(lp.get("tokens"), list):  # completions
        return len(lp["tokens"])
    if isinstance(lp.get("content"), list):  # chat
        return len(lp["content"])
    return None


def _choice(ch: dict[str, Any]) -> Choice:
    fr = ch.get("finish_reason")
    finish = str(fr) if fr else None
    delta = ch.get("delta")
    if isinstance(delta, dict):  # chat
        content = delta.get("content")
        role = delta.get("role")
        tools = bool(delta.get("tool_calls"))
        r = None if content else (delta.get("reasoning_content") or delta.get("reasoning"))
        reasoning = r if isinstance(r, str) and r else None
        # a step: any generated text, tool calls, or a content field (even "") that is not the
        # opening role announcement
        step = tools or bool(content) or bool(r) or (isinstance(content, str) and not role)
        return Choice(ch.get("index"), content if isinstance(content, str) else None, reasoning,
                      role if isinstance(role, str) and role else None, tools, finish,
                      _logprob_tokens(ch), step)
    text = ch.get("text")  # completions
    is_str = isinstance(text, str)
    return Choice(ch.get("index"), text if is_str else None, None, None, False, finish, _logprob_tokens(ch),
                  is_str)


def classify(data: str) -> SseEvent:
    """Decide what the SSE event with this ``data`` text is (see the module docstring)."""
    if is_done(data):
        return SseEvent(DONE, data)
    try:
        obj = json.loads(data)
    except ValueError:
        return SseEvent(MALFORMED, data)
    if not isinstance(obj, dict):
        return SseEvent(MALFORMED, data)
    if "error" in obj:
        return SseEvent(ERROR, data, obj, error=obj["error"])
    usage = obj.get("usage")
    raw = obj.get("choices") or ()
    if not isinstance(raw, (list, tuple)):
        raw = (raw,)
    choices = tuple(_choice(ch) for ch in raw if isinstance(ch, dict))
    bad = tuple(ch for ch in raw if not isinstance(ch, dict)) if len(choices) != len(raw) else ()
    return SseEvent(CHUNK, data, obj, choices, bad, usage if isinstance(usage, dict) else None)


# ----------------------------------------------------------------------------- grammar

_FIELDS = ("data", "event", "id", "retry")
#: Characters of a frame kept to name it in a verdict.
FRAME_CAP = 160


@dataclass(frozen=True)
class Frame:
    """One frame of a raw SSE body: the lines up to a blank line. ``raw``: its text as sent (line
    ends kept, at most :data:`FRAME_CAP` characters); ``t``: arrival (seconds) of the piece holding
    its blank line; ``data``: its ``data:`` values joined with ``\n`` (None: no ``data:`` line);
    ``fields``: the field names of its other lines (``id``, ``event``, ``retry``, or a line that is
    neither a field nor a comment, as written); ``comments``: its comment lines (``:``...)."""

    raw: str
    t: float
    data: str | None
    fields: tuple[str, ...] = ()
    comments: int = 0

    @property
    def shown(self) -> str:
        """``raw`` with its line ends written out: ``id: 7\n: ping\n\n``."""
        return self.raw.replace("\r", "\\r").replace("\n", "\\n")


@dataclass(frozen=True)
class GrammarProblem:
    """A frame that breaks the SSE grammar as clients read it: ``kind`` (``data-colon``,
    ``empty-event``, ``no-data-dispatch``, ``not-a-field``), ``what`` in words, the ``frame``."""

    kind: str
    what: str
    frame: Frame


@dataclass
class Grammar:
    """A raw SSE body read frame by frame (:func:`grammar`). ``frames`` in order; ``problems``;
    ``tail``: bytes after the last blank line (an unfinished frame)."""

    frames: list[Frame]
    problems: list[GrammarProblem]
    tail: str = ""

    @property
    def data_times(self) -> list[float]:
        """Arrival of each data event (a frame with data), seconds."""
        return [f.t for f in self.frames if f.data is not None]

    @property
    def keepalives(self) -> int:
        """Frames that are comments and nothing else (``: ping``)."""
        return sum(1 for f in self.frames if f.data is None and not f.fields and f.comments)


def largest_gap(times: Sequence[float]) -> tuple[float, int]:
    """The longest wait in ``times`` (seconds since the request was sent, ascending), counting the
    wait for the first: ``(gap, i)`` -- the gap ended at ``times[i]``, ``i == 0`` the wait before the
    first. ``(0.0, -1)`` for no times."""
    best, at, last = 0.0, -1, 0.0
    for i, t in enumerate(times):
        if t - last > best or at < 0:
            best, at = t - last, i
        last = t
    return best, at


def grammar(pieces: Sequence[tuple[float, bytes]]) -> Grammar:
    """Cut raw body pieces (``(t, bytes)``, HTTP framing removed) into frames at blank lines
    (``\n``, ``\r\n`` or ``\r`` line ends) and name every frame that breaks the grammar SDKs
    read (see the module docstring). Pure; never raises."""
    body = b"".join(b for _, b in pieces)
    ends, acc = [], 0
    for _, b in pieces:
        acc += len(b)
        ends.append(acc)
    text = body.decode("utf-8", "replace")
    frames: list[Frame] = []
    problems: list[GrammarProblem] = []
    lines: list[str] = []
    start = pos = 0
    raw_bytes_at = 0  # byte offset of pos (for the arrival time of a frame's end)
    n = len(text)
    while pos < n:
        j = pos
        while j < n and text[j] not in "\r\n":
            j += 1
        if j >= n:
            break  # an unfinished line: the tail
        end = j + 2 if text.startswith("\r\n", j) else j + 1
        line = text[pos:j]
        raw_bytes_at += len(text[pos:end].encode("utf-8", "replace"))
        pos = end
        if line:
            lines.append(line)
            continue
        if not lines:  # a blank line with nothing before it dispatches nothing
            start = pos
            continue
        i = min(bisect.bisect_left(ends, raw_bytes_at), len(pieces) - 1)
        frame = _frame(text[start:pos], pieces[i][0] if pieces else 0.0, lines)
        frames.append(frame)
        problems += _problems(frame, lines)
        lines, start = [], pos
    return Grammar(frames, problems, text[start:])


def _frame(raw: str, t: float, lines: list[str]) -> Frame:
    data, fields, comments = [], [], 0
    for ln in lines:
        if ln.startswith(":"):
            comments += 1
            continue
        name, _, value = ln.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
        else:
            fields.append(name)
    return Frame(raw[:FRAME_CAP], t, "\n".join(data) if data else None, tuple(fields), comments)


def _problems(frame: Frame, lines: list[str]) -> list[GrammarProblem]:
    out = []
    for ln in lines:
        name, _, value = ln.partition(":")
        if name == "data" and (value[1:] if value.startswith(" ") else value).startswith(":"):
            out.append(GrammarProblem("data-colon", "a data: line whose value starts with ':' (a comment sent as "
                                      "data: an SDK parses it as the event's JSON and throws)", frame))
            break
    odd = [f for f in frame.fields if f not in _FIELDS]
    if odd:
        out.append(GrammarProblem("not-a-field", f"a line that is neither a comment (':' first) nor an SSE field "
                                  f"({clip(odd[0], 40)!r}): comments must start with ':'", frame))
    if frame.data is not None and not frame.data.strip():
        out.append(GrammarProblem("empty-event", "an event with empty data (an SDK reads '' as JSON and throws)", frame))
    known = [f for f in frame.fields if f in _FIELDS]
    if frame.data is None and known:
        out.append(GrammarProblem("no-data-dispatch", f"a frame with {', '.join(f + ':' for f in known)} and no data: "
                                  "(openai-python and httpx-sse dispatch it as an empty event: JSONDecodeError)", frame))
    return out


def second_parser(body: bytes) -> list[str]:
    """The ``data`` of every event ``httpx-sse`` (an independent SSE parser, the one httpx users
    read streams with) dispatches from ``body``, in order, ``[DONE]`` included."""
    import httpx
    from httpx_sse import EventSource

    resp = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)
    return [sse.data for sse in EventSource(resp).iter_sse()]


__all__ = ["CHUNK", "DONE", "ERROR", "ERROR_TEXT_CAP", "FRAME_CAP", "MALFORMED", "Choice", "Frame", "Grammar",
           "GrammarProblem", "SseEvent", "classify", "error_text", "event_data", "grammar", "is_done", "iter_data",
           "largest_gap", "second_parser", "split_sse"]
