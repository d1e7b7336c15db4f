"""Pure verdicts of the features gate: the serve features a profile turns on -- tool calling,
structured output, reasoning parsers, LoRA adapters, prefix caching -- must actually work.

Their failures are silent: HTTP 200 with the wrong content, and they are what breaks on a vLLM
upgrade. The kinds each case catches (public reports, 2025-2026):

- tools: calls left as raw ``<tool_call>`` text in the streamed ``content`` with finish ``stop``
  (vllm#31871, #22975); a parameterless tool's ``{}`` arguments dropped while streaming (#28806);
  a forced ``tool_choice`` answered with prose, or ``finish_reason: tool_calls`` with an empty
  ``tool_calls`` list (#50477, #53255, #49712); arguments that are not an object matching the
  tool's parameters (vLLM 0.32 leaves a non-strict tool's arguments unconstrained: measured
  ``false`` on kvgate's tiny model; ``--tool-strict-level parameter`` pins them);
- structured: valid JSON followed by whitespace until ``max_tokens`` (#38696, #55313); JSON cut
  mid-object with finish ``stop`` (#42403); one grammar that takes the engine down for everyone
  while ``/health`` stays 200 (#21204) -- hence the canary after each grammar;
- reasoning: ``reasoning`` empty with ``</think>`` left in ``content``, or the whole answer
  trapped in the reasoning field (#22507, #48645, #34684);
- LoRA: an adapter listed and accepted whose output is the base model's (#55193, #34186); with
  ``--max-loras 1`` only the first adapter answering (#11077);
- prefix caching: enabled and never hitting (#51198, #53749), or hitting while the
  ``vllm:prefix_cache_hits`` counter stays 0 (vllm-ascend#16639).

Which cases run follows the engine flags (:func:`feature_skips`); the ``features:`` section gives
what the flags cannot say. Inputs are :class:`~kvgate.http.probes.Exchange` objects and the
observations of :mod:`kvgate.http.features`; no I/O here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from kvgate.gates.common import FAIL, PASS, SKIP, json_body, num, server_error
from kvgate.gates.health import canary_verdict
from kvgate.http.client import StreamReply, clip
from kvgate.http.features import Halt, PrefixObservation, PrefixTry, max_loras
from kvgate.http.probes import Exchange
from kvgate.profile.models import FeaturesSpec, Profile
from kvgate.verdict import Verdict

GATE = "features"
FEATURES = ("tools", "structured", "reasoning", "lora", "prefix-caching")

#: Tool-call markup of the common parsers (hermes/qwen, mistral, llama 3.x, functionary/llama 4,
#: kimi, deepseek): none of it may be left in ``content`` once the parser ran.
TOOL_MARKUP = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<function=",
               "<|tool_call_begin|>", "<｜tool▁call▁begin｜>", "<｜tool▁calls▁begin｜>")
#: Reasoning markup (DeepSeek-R1/Qwen3 think tags, Seed-OSS, Kimi): none of it may be left in
#: ``content`` once the reasoning parser ran.
THINK_MARKUP = ("<think>", "</think>", "<seed:think>", "</seed:think>", "◁think▷", "◁/think▷")
#: Characters of evidence text kept in a message.
CLIP = 160

#: kvgate's tools when the profile gives none: one with arguments, one without.
DEFAULT_FUNCTIONS: tuple[dict[str, Any], ...] = (
    {"name": "get_weather", "description": "The current weather in a city.",
     "parameters": {"type": "object",
                    "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris", "Lima"]},
                                   "unit": {"type": "string", "enum": ["c", "f"]}},
                    "required": ["city", "unit"], "additionalProperties": False}},
    {"name": "get_time", "description": "The time now, in UTC.", "parameters": {"type": "object", "properties": {}}},
)


# ------------------------------------------------------------------------------------------------
# which cases run


def feature_skips(profile: Profile) -> dict[str, str | None]:
    """Feature -> None when the profile turns it on, else the SKIP reason (what flag is unset)."""
    e = profile.engine
    pc = e.enable_prefix_caching
    return {
        "tools": None if e.tool_call_parser else "engine.tool_call_parser is not set (no tool calling deployed)",
        "structured": None if e.structured_outputs_config is not None else
        "engine.structured_outputs_config is not set (declare the backend the deployment uses to gate it)",
        "reasoning": None if e.reasoning_parser else "engine.reasoning_parser is not set (no reasoning parser deployed)",
        "lora": None if e.enable_lora else "engine.enable_lora is not set (no LoRA adapters deployed)",
        "prefix-caching": None if pc else ("engine.enable_prefix_caching is false" if pc is False else
                                           "engine.enable_prefix_caching is not set (vLLM's default is on; "
                                           "set it true to gate it)"),
    }


def functions(profile: Profile) -> list[dict[str, Any]]:
    """The OpenAI function definitions the tools cases offer (``features.tools.functions`` or
    :data:`DEFAULT_FUNCTIONS`)."""
    return [dict(f) for f in (profile.features.tools.functions or DEFAULT_FUNCTIONS)]


def _has_params(fn: dict[str, Any]) -> bool:
    return bool((fn.get("parameters") or {}).get("properties"))


def auto_expect(profile: Profile) -> str:
    """The function ``tool_choice: auto`` must call: ``features.tools.auto_expect``, else the
    first function with parameters (else the first)."""
    fns = functions(profile)
    return profile.features.tools.auto_expect or next((f["name"] for f in fns if _has_params(f)), fns[0]["name"])


def cases(profile: Profile) -> list[str]:
    """The gate's case names for ``profile``, in order: one ``FEATURE`` case per feature it does
    not turn on (a SKIP saying why), else that feature's cases -- ``tools/auto``,
    ``tools/required``, ``tools/named/<fn>``, ``tool-ids``; ``structured/<battery case>``;
    ``reasoning/thinking-on|off``; ``lora/<adapter>`` + ``lora/over-max-loras`` (``lora/listed``
    without declared adapters); ``prefix-caching``."""
    skips = feature_skips(profile)
    out: list[str] = []
    for feat in FEATURES:
        if skips[feat] is not None:
            out.append(feat)
        elif feat == "tools":
            out += ["tools/auto", "tools/required"] + [f"tools/named/{f['name']}" for f in functions(profile)]
            out.append("tool-ids")
        elif feat == "structured":
            out += [f"structured/{g.name}" for g in battery(profile.features)]
        elif feat == "reasoning":
            out += ["reasoning/thinking-on", "reasoning/thinking-off"]
        elif feat == "lora":
            names = list(profile.engine.lora_modules)
            out += ([f"lora/{n}" for n in names] if names else ["lora/listed"]) + ["lora/over-max-loras"]
        else:
            out.append("prefix-caching")
    return out


def feature_of(case: str) -> str:
    """The feature a case belongs to: ``tools/auto`` -> ``tools``; ``tool-ids`` -> ``tools``."""
    return "tools" if case == "tool-ids" else case.split("/", 1)[0]


def skip_verdict(case: str, profile: Profile) -> Verdict | None:
    """The SKIP verdict of a case whose feature (or the case's own precondition) the profile
    does not turn on; None when the case runs."""
    feat = feature_of(case)
    reason = feature_skips(profile).get(feat)
    if reason is not None:
        return Verdict(f"{GATE}/{case}", SKIP, f"{feat}: {reason} -> SKIP")
    f = profile.features
    if case == "tools/auto" and not profile.engine.enable_auto_tool_choice:
        return Verdict(f"{GATE}/{case}", SKIP, "tool_choice auto: engine.enable_auto_tool_choice is not set "
                       "(vLLM answers auto with 400 without it) -> SKIP")
    if case == "reasoning/thinking-on" and f.reasoning.thinking_on is None:
        return Verdict(f"{GATE}/{case}", SKIP, "features.reasoning.thinking_on is null: the model cannot think -> SKIP")
    if case == "reasoning/thinking-off" and f.reasoning.thinking_off is None:
        return Verdict(f"{GATE}/{case}", SKIP, "features.reasoning.thinking_off is null: the model cannot turn "
                       "thinking off -> SKIP")
    if case == "lora/over-max-loras":
        n, m = len(profile.engine.lora_modules), max_loras(profile)
        if n <= m:
            return Verdict(f"{GATE}/{case}", SKIP, f"{n} adapter(s) declared in engine.lora_modules, max_loras {m}: "
                           f"more adapters than slots need at least {m + 1} -> SKIP")
    return None


# ------------------------------------------------------------------------------------------------
# what a chat answer says (non-streamed or streamed, folded the same way)


@dataclass
class ChatFields:
    """A chat answer's first choice: ``content`` and ``reasoning`` ("" when absent;
    ``reasoning_field`` names which field carried it: ``reasoning`` (vLLM >= 0.11) or the
    deprecated ``reasoning_content``), ``calls`` as ``[(name, arguments text)]`` (streamed:
    reassembled by ``index``), ``finish`` the (last) finish_reason, ``tool_calls_field`` whether a
    ``tool_calls`` list was present at all, ``call_format`` the first way a call breaks OpenAI's
    shape (no ``id``, ``type`` not ``function``, ``arguments`` not a string: a client answers a
    call with ``tool_call_id`` and decodes ``arguments`` with ``json.loads``), ``completion_tokens``
    from usage, ``problem`` when the answer is not a chat completion (garbage, error, broken
    stream)."""

    content: str = ""
    reasoning: str = ""
    reasoning_field: str | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)
    finish: str | None = None
    tool_calls_field: bool = False
    call_format: str | None = None
    completion_tokens: int | None = None
    problem: str | None = None
    #: Each call's ``id`` (None: it carried none), in the order of ``calls``.
    ids: list[str | None] = field(default_factory=list)


def _tokens(usage: Any, default: int | None) -> int | None:
    """``usage.completion_tokens`` when it is an integer, else ``default``."""
    v = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def chat_fields(ex: Exchange) -> ChatFields:
    """Fold ``ex`` (a chat exchange with status 200) into :class:`ChatFields`; never raises: a
    field of the wrong JSON type (a delta or message that is not an object, content that is not
    a string, a tool call without a function object) is the ``problem``."""
    out = ChatFields()
    r = ex.reply

    def note(problem: str) -> None:
        out.problem = out.problem or problem

    def text(value: Any, where: str) -> str:
        if value is None or isinstance(value, str):
            return value or ""
        note(f"{where} is a JSON {type(value).__name__} ({clip(json.dumps(value), 60)}), not a string")
        return ""

    def obj(value: Any, where: str) -> dict[str, Any]:
        if value is None or isinstance(value, dict):
            return value or {}
        note(f"{where} is a JSON {type(value).__name__} ({clip(json.dumps(value), 60)}), not an object")
        return {}

    if isinstance(r, StreamReply):
        calls: dict[int, list[str]] = {}
        shape: dict[int, dict[str, Any]] = {}
        for _, chunk in r.chunks():
            if not isinstance(chunk, dict):
                note(f"undecodable stream event {str(chunk)[:120]!r}")
                continue
            if "error" in chunk:
                note(f"in-stream error {clip(json.dumps(chunk['error']), CLIP)!r}")
                continue
            out.completion_tokens = _tokens(chunk.get("usage"), out.completion_tokens)
            for ch in chunk.get("choices") or []:
                if not isinstance(ch, dict):
                    continue
                d = obj(ch.get("delta"), "a stream delta")
                out.content += text(d.get("content"), "a delta's content")
                for key in ("reasoning", "reasoning_content"):
                    if d.get(key):
                        out.reasoning += text(d[key], f"a delta's {key}")
                        out.reasoning_field = out.reasoning_field or key
                if isinstance(d.get("tool_calls"), list):
                    out.tool_calls_field = True
                    for i, tc in enumerate(d["tool_calls"]):
                        tc = obj(tc, "a streamed tool call")
                        index = tc.get("index", i)
                        if not isinstance(index, int):
                            note(f"a streamed tool call's index is {clip(json.dumps(index), 40)}, not an integer")
                            continue
                        slot = calls.setdefault(index, ["", ""])
                        seen = shape.setdefault(index, {})
                        for key in ("id", "type"):
                            if tc.get(key):
                                seen[key] = tc[key]
                        fn = obj(tc.get("function"), "a streamed tool call's function")
                        slot[0] += text(fn.get("name"), "a streamed tool call's name")
                        slot[1] += text(fn.get("arguments"), "a streamed tool call's arguments")
                out.finish = ch.get("finish_reason") or out.finish
        out.calls = [(n, a) for _, (n, a) in sorted(calls.items())]
        out.ids = [shape.get(i, {}).get("id") for i in sorted(calls)]
        for index, seen in sorted(shape.items()):
            if not seen.get("id"):
                out.call_format = out.call_format or f"streamed tool call {index} never carried an id"
            elif seen.get("type") != "function":
                out.call_format = out.call_format or (f"streamed tool call {index} has type "
                                                      f"{seen.get('type')!r}, not 'function'")
        if r.transport_error:
            note(f"stream broke: {r.transport_error}")
        elif not r.done:
            note("stream ended without data: [DONE]")
        return out
    body = json_body(r)
    choices = body.get("choices") if body else None
    if not body or not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        out.problem = f"not a chat completion: {clip(r.text, CLIP)!r}"
        return out
    msg = obj(choices[0].get("message"), "the message")
    out.content = text(msg.get("content"), "the message's content")
    for key in ("reasoning", "reasoning_content"):
        if msg.get(key):
            out.reasoning, out.reasoning_field = text(msg[key], f"the message's {key}"), key
            break
    tcs = msg.get("tool_calls")
    out.tool_calls_field = isinstance(tcs, list)
    for tc in tcs if isinstance(tcs, list) else []:
        tc = obj(tc, "a tool call")
        fn = obj(tc.get("function"), "a tool call's function")
        args = fn.get("arguments")
        if not isinstance(args, str):
            out.call_format = out.call_format or (f"a tool call's arguments is a JSON {type(args).__name__}, not the "
                                                  "JSON-encoded string OpenAI clients json.loads")
        elif not tc.get("id"):
            out.call_format = out.call_format or "a tool call without an id (a client answers it by tool_call_id)"
        elif tc.get("type") != "function":
            out.call_format = out.call_format or f"a tool call of type {tc.get('type')!r}, not 'function'"
        out.calls.append((text(fn.get("name"), "a tool call's name"),
                          args if isinstance(args, str) else json.dumps(args)))
        out.ids.append(tc.get("id") if isinstance(tc.get("id"), str) else None)
    out.finish = choices[0].get("finish_reason")
    out.completion_tokens = _tokens(body.get("usage"), None)
    return out


def _trapped(got: ChatFields) -> str:
    """``, the reply went to reasoning: '...'`` when content is empty and the reasoning field
    holds the answer (a reasoning parser that does not honour thinking off), else ""."""
    if got.content.strip() or not got.reasoning.strip():
        return ""
    return f"; the reply went to the {got.reasoning_field or 'reasoning'} field instead: {clip(repr(got.reasoning), CLIP)}"


def _markup(text: str, markers: tuple[str, ...]) -> str | None:
    return next((m for m in markers if m in text), None)


def _answered(ex: Exchange, what: str, deadline_s: float | None = None) -> str | None:
    """None for a 200 within ``deadline_s`` seconds (``features.deadline_s``; None: not timed),
    else the problem: no answer (a timeout), the status and the server's error, or the time."""
    r = ex.reply
    within = f" within features.deadline_s ({deadline_s:g} s)" if deadline_s is not None else ""
    late = getattr(r, "transport_error", None) or ""
    if r.status == 0 or "DeadlineTimeout" in late:
        return f"{what} got no full answer{within} ({server_error(r, 120) if r.status == 0 else late})"
    if r.status != 200:
        return f"{what} answered {r.status} ({server_error(r, 120)})"
    if deadline_s is not None and r.elapsed_s > deadline_s:
        return f"{what} took {r.elapsed_s:.1f} s; must answer within features.deadline_s ({deadline_s:g} s)"
    return None


def _unanswered(gate: str, ex: Exchange, what: str, deadline_s: float, ev: dict[str, Any]) -> Verdict | None:
    """The FAIL of an exchange that is not a 200 within ``deadline_s`` (:func:`_answered`), else None."""
    bad = _answered(ex, what, deadline_s)
    if bad is None:
        return None
    return Verdict(gate, FAIL, f"{bad} -> FAIL", measured=ex.reply.status, limit=200, unit="HTTP status", evidence=ev)


def _evidence(*named: tuple[str, Exchange]) -> dict[str, Any]:
    return {name: ex.evidence() for name, ex in named}


def _way(ex: Exchange) -> str:
    return "streamed" if ex.stream else "non-streamed"


# ------------------------------------------------------------------------------------------------
# tools


def tool_choice_of(case: str) -> Any:
    """The request's ``tool_choice`` for ``tools/auto``, ``tools/required``, ``tools/named/<fn>``."""
    kind = case.split("/")[1]
    if kind == "named":
        return {"type": "function", "function": {"name": case.split("/", 2)[2]}}
    return kind


def chat_kwargs(profile: Profile) -> dict[str, Any] | None:
    """``chat_template_kwargs`` of the tools and structured requests: ``features.chat_template_kwargs``,
    else ``limits.chat_template_kwargs``."""
    f = profile.features.chat_template_kwargs
    return f if f is not None else profile.limits.chat_template_kwargs


def _chat(profile: Profile, prompt: str, kwargs: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    f = profile.features
    body: dict[str, Any] = {"model": profile.model.served_name, "messages": [{"role": "user", "content": prompt}],
                            "max_tokens": f.max_tokens, **f.sampling, **extra}
    if kwargs is not None:
        body["chat_template_kwargs"] = kwargs
    return body


def tool_body(profile: Profile, case: str) -> dict[str, Any]:
    """The chat request of a tools case: every function offered, the case's ``tool_choice``, and
    for ``tools/auto`` the profile's ``auto_guide`` regex as ``structured_outputs``."""
    t = profile.features.tools
    extra: dict[str, Any] = {"tools": [{"type": "function", "function": f} for f in functions(profile)],
                             "tool_choice": tool_choice_of(case)}
    if case == "tools/auto" and t.auto_guide:
        extra["structured_outputs"] = {"regex": t.auto_guide}
    return _chat(profile, t.prompt, chat_kwargs(profile), **extra)


def _arguments_problem(name: str, args_text: str, fns: dict[str, dict[str, Any]]) -> tuple[Any, str | None]:
    """``(parsed arguments, problem)`` of one call against its function's parameters schema."""
    try:
        args = json.loads(args_text)
    except (ValueError, TypeError):
        return None, f"{name} arguments are not JSON: {clip(repr(args_text), CLIP)}"
    if not isinstance(args, dict):
        return args, (f"{name} arguments are the JSON {type(args).__name__} {clip(args_text, 60)}, not an object "
                      "(a non-strict tool's arguments are unconstrained in vLLM 0.32: engine.tool_strict_level "
                      "parameter, or strict: true, pins them to the schema)")
    schema = fns[name].get("parameters") or {"type": "object", "properties": {}}
    if not _has_params(fns[name]):
        return args, None if args == {} else f"parameterless {name} got arguments {clip(json.dumps(args), 80)}, not {{}}"
    try:
        jsonschema.validate(args, schema)
    except jsonschema.ValidationError as exc:  # the schema itself is checked when the profile loads
        return args, f"{name} arguments {clip(json.dumps(args), 80)} fail its parameters schema: {clip(exc.message, 100)}"
    return args, None


def _calls_problem(case: str, way: str, got: ChatFields, fns: dict[str, dict[str, Any]], expect: str | None
                   ) -> tuple[list[tuple[str, Any]], str | None]:
    """``(parsed calls, the first problem)`` of one way (streamed or not) of a tools case."""
    named = case.startswith("tools/named/")
    if got.problem:
        return [], f"{way}: {got.problem}"
    left = _markup(got.content, TOOL_MARKUP)
    if not got.calls:
        if got.finish == "tool_calls":
            return [], (f"{way}: finish_reason tool_calls with {'an empty' if got.tool_calls_field else 'no'} "
                        "tool_calls list")
        if left:
            return [], (f"{way}: the call was left as text in content ({clip(got.content, CLIP)!r}), finish "
                        f"{got.finish}, no tool_calls: the tool parser did not run")
        return [], f"{way}: no tool call (finish {got.finish}, content {clip(got.content, CLIP)!r}{_trapped(got)})"
    if left:
        return [], f"{way}: parser markup {left!r} left in content ({clip(got.content, CLIP)!r})"
    if got.call_format:
        return [], f"{way}: {got.call_format}"
    allowed = {"stop", "tool_calls"} if named else {"tool_calls"}
    if got.finish not in allowed:
        return [], (f"{way}: finish_reason {got.finish} with {len(got.calls)} call(s); must be "
                    f"{' or '.join(sorted(allowed))}")
    parsed: list[tuple[str, Any]] = []
    for name, args_text in got.calls:
        if name not in fns:
            return parsed, f"{way}: called {name!r}, which is not among the tools offered ({', '.join(fns)})"
        if expect is not None and name != expect:
            return parsed, f"{way}: called {name!r}; tool_choice {case.split('/', 1)[1]} must call {expect!r}"
        args, problem = _arguments_problem(name, args_text, fns)
        if problem:
            return parsed, f"{way}: {problem}"
        parsed.append((name, args))
    return parsed, None


def _show_calls(calls: list[tuple[str, Any]]) -> str:
    return ", ".join(f"{n}({clip(json.dumps(a, separators=(',', ':')), 80)})" for n, a in calls)


def tools_verdict(case: str, profile: Profile, plain: Exchange, streamed: Exchange) -> Verdict:
    """A tools case from the same request sent non-streamed and streamed.

    PASS when both answer 200 with at least one call, each to an offered function (the named one
    for ``tools/named/<fn>``; ``auto_expect`` for ``tools/auto``) whose arguments parse as a JSON
    object valid against the function's parameters (``{}`` for a parameterless one), no parser
    markup left in ``content``, ``finish_reason`` ``tool_calls`` (``stop`` also for a named
    choice, as OpenAI answers a forced function), and the streamed deltas reassemble to the same
    names and (parsed) arguments as the non-streamed answer."""
    gate = f"{GATE}/{case}"
    choice = case.split("/", 1)[1]
    ev = _evidence(("non-streamed", plain), ("streamed", streamed))
    fns = {f["name"]: f for f in functions(profile)}
    expect = case.split("/", 2)[2] if case.startswith("tools/named/") else (
        auto_expect(profile) if case == "tools/auto" else None)
    limit = "a call valid against the tool's schema, both ways alike"
    for ex in (plain, streamed):
        if unanswered := _unanswered(gate, ex, f"tool_choice {choice} ({_way(ex)})", profile.features.deadline_s, ev):
            return unanswered
    got = {ex.stream: chat_fields(ex) for ex in (plain, streamed)}
    parsed = {}
    for ex in (plain, streamed):
        calls, problem = _calls_problem(case, _way(ex), got[ex.stream], fns, expect)
        if problem:
            return Verdict(gate, FAIL, f"tool_choice {choice}: {problem} -> FAIL", measured=problem, limit=limit,
                           evidence=ev)
        parsed[ex.stream] = calls
    if parsed[True] != parsed[False]:
        problem = (f"streamed deltas reassemble to {_show_calls(parsed[True])}, the non-streamed answer is "
                   f"{_show_calls(parsed[False])}")
        return Verdict(gate, FAIL, f"tool_choice {choice}: {problem} -> FAIL", measured=problem, limit=limit,
                       evidence=ev)
    return Verdict(gate, PASS, f"tool_choice {choice}: {_show_calls(parsed[False])}, finish "
                   f"{got[False].finish}, valid against the schema, streamed alike -> PASS",
                   measured=len(parsed[False]), limit=">= 1 valid call", unit="calls", evidence=ev)


# ------------------------------------------------------------------------------------------------
# tool-call ids across an agent loop

#: Turns of the tool-ids loop (each calls the same tool, echoing the earlier calls' ids).
TOOL_TURNS = 3


def tool_ids_body(profile: Profile) -> dict[str, Any]:
    """The first request of the tool-ids loop: every function offered, ``tool_choice`` naming
    :func:`auto_expect`'s function (so every turn calls the same tool)."""
    return tool_body(profile, f"tools/named/{auto_expect(profile)}")


def follow_up(ex: Exchange, turn: int) -> list[dict[str, Any]] | None:
    """The messages an agent sends after turn ``turn``'s answer: the assistant turn with its calls
    (ids, names, arguments as the server gave them) and one ``tool`` result per call, echoing its
    id; None when the answer holds no call with an id (nothing to echo: the loop stops there)."""
    if ex.reply.status != 200:
        return None
    got = chat_fields(ex)
    if got.problem or not got.calls or any(i is None for i in got.ids):
        return None
    calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
             for i, (n, a) in zip(got.ids, got.calls)]
    return [{"role": "assistant", "content": got.content or None, "tool_calls": calls}] + \
        [{"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"turn": turn, "result": "ok"})} for c in calls]


def id_scheme(call_id: str) -> str:
    """The shape of a tool-call id, its random or counted parts generalised: alphanumeric runs of 12
    or more characters (or 8 or more with a digit) become ``<id>``, shorter runs of digits ``<n>``:
    ``chatcmpl-tool-9f86d0818...`` -> ``chatcmpl-tool-<id>``, ``list_dir:0`` -> ``list_dir:<n>``."""
    def one(m: re.Match[str]) -> str:
        run = m.group(0)
        if len(run) >= 12 or (len(run) >= 8 and any(ch.isdigit() for ch in run)):
            return "<id>"
        return "<n>" if run.isdigit() else run
    return re.sub(r"[A-Za-z0-9]+", one, call_id)


def tool_ids_verdict(profile: Profile, plain: list[Exchange], streamed: list[Exchange]) -> Verdict:
    """The tool-ids case: an agent loop of :data:`TOOL_TURNS` turns calling the same tool
    (:func:`tool_ids_body`), run non-streamed and streamed, each turn echoing the earlier ids.
    FAIL: a turn not answered 200 (from turn 2: the echoed ids refused), a turn without a call or
    a call without an id, an id that repeats within a loop (agent loops key results by id:
    vllm#50295 answered ``list_dir:0`` on turn 1 and turn 2), or the two ways giving ids of
    different schemes (:func:`id_scheme`). PASS names the ids and their scheme."""
    gate = f"{GATE}/tool-ids"
    fn = auto_expect(profile)
    fns = {f["name"]: f for f in functions(profile)}
    ev: dict[str, Any] = {f"{'streamed' if s else 'non-streamed'} turn {i + 1}": ex.evidence()
                          for s, loop in ((False, plain), (True, streamed)) for i, ex in enumerate(loop)}
    limit = f"{TOOL_TURNS} turns each way, every id unique, one id scheme, echoed ids accepted"
    ids: dict[str, list[str]] = {}
    for way, loop in (("non-streamed", plain), ("streamed", streamed)):
        seen: dict[str, int] = {}
        ids[way] = []
        for i, ex in enumerate(loop, 1):
            r = ex.reply
            echoed = f" echoing {', '.join(repr(x) for x in ids[way])}" if i > 1 else ""
            if r.status != 200:
                what = f"turn {i}{echoed} answered {r.status or 'nothing'}: {clip(getattr(r, 'text', '') or '', CLIP)!r}"
                problem = f"{way} {what}" + (" (the echoed ids were refused)" if i > 1 and 400 <= r.status < 500 else "")
                return Verdict(gate, FAIL, f"tool loop calling {fn}: {problem} -> FAIL", measured=problem, limit=limit,
                               evidence=ev)
            got = chat_fields(ex)
            if got.problem or not got.calls or any(x is None for x in got.ids):
                if got.problem or not got.calls:  # what a tools case names: markup left, an empty list, no call
                    _, problem = _calls_problem(f"tools/named/{fn}", f"{way} turn {i}{echoed}", got, fns, None)
                else:
                    problem = f"{way} turn {i}{echoed}: a tool call without an id (nothing to echo)"
                return Verdict(gate, FAIL, f"tool loop calling {fn}: {problem} -> FAIL", measured=problem, limit=limit,
                               evidence=ev)
            for x in got.ids:
                assert x is not None
                if x in seen:
                    problem = f"{way}: id {x!r} on turn {seen[x]} and again on turn {i} (every id must be unique)"
                    return Verdict(gate, FAIL, f"tool loop calling {fn}: {problem} -> FAIL", measured=problem,
                                   limit=limit, evidence={**ev, "ids": ids})
                seen[x] = i
                ids[way].append(x)
        if len(loop) < TOOL_TURNS:  # follow_up stopped the loop early: the reason is the last turn's
            problem = f"{way}: the loop stopped after turn {len(loop)} of {TOOL_TURNS}"
            return Verdict(gate, FAIL, f"tool loop calling {fn}: {problem} -> FAIL", measured=problem, limit=limit,
                           evidence=ev)
    ev["ids"] = ids
    schemes = {way: sorted({id_scheme(x) for x in xs}) for way, xs in ids.items()}
    ev["schemes"] = schemes
    if schemes["non-streamed"] != schemes["streamed"]:
        problem = (f"the non-streamed ids look like {', '.join(map(repr, schemes['non-streamed']))} "
                   f"({ids['non-streamed'][0]!r}), the streamed ones like {', '.join(map(repr, schemes['streamed']))} "
                   f"({ids['streamed'][0]!r})")
        return Verdict(gate, FAIL, f"tool loop calling {fn}: {problem} -> FAIL", measured=problem, limit=limit,
                       evidence=ev)
    n = sum(len(xs) for xs in ids.values())
    return Verdict(gate, PASS, f"tool loop calling {fn}, {TOOL_TURNS} turns each way: {n} ids, each unique in its loop "
                   f"(e.g. {ids['non-streamed'][0]!r}, {ids['non-streamed'][-1]!r}), one scheme streamed and not "
                   f"({', '.join(map(repr, schemes['streamed']))}), the echoed ids accepted (turns 2-{TOOL_TURNS} 200) -> PASS",
                   measured=n, limit=limit, unit="ids", evidence=ev)


# ------------------------------------------------------------------------------------------------
# structured output


@dataclass(frozen=True)
class Grammar:
    """One battery case: ``kind`` json_schema / json_object / regex / choice, ``spec`` the schema
    (dict), regex (str) or choices (list), ``example`` one valid answer (documentation, and what
    kvgate's fake server answers)."""

    name: str
    kind: str
    spec: Any
    example: str

    def request(self) -> dict[str, Any]:
        """The request fields that ask for this grammar: OpenAI's ``response_format`` for JSON,
        vLLM's ``structured_outputs`` for regex and choice."""
        if self.kind == "json_schema":
            return {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": self.name.replace("-", "_"), "schema": self.spec}}}
        if self.kind == "json_object":
            return {"response_format": {"type": "json_object"}}
        return {"structured_outputs": {self.kind: self.spec}}


_NODE = {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                          "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                   "maxItems": 2}},
         "required": ["v", "kids"], "additionalProperties": False}

#: kvgate's structured-output battery. Free strings carry a pattern so a random model cannot run one
#: to max_tokens inside a valid grammar (and because vLLM 0.32's xgrammar let unescaped control
#: characters into a maxLength-only string on kvgate's tiny model: invalid JSON, RFC 8259 section 7).
BATTERY: tuple[Grammar, ...] = (
    Grammar("enum-const", "json_schema",
            {"type": "object", "properties": {"city": {"enum": ["Oslo", "Paris"]}, "ok": {"const": True}},
             "required": ["city", "ok"], "additionalProperties": False}, '{"city":"Oslo","ok":true}'),
    Grammar("nested", "json_schema",
            {"type": "object", "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z]{1,12}$"},
                "address": {"type": "object", "properties": {"zip": {"type": "integer", "minimum": 0, "maximum": 99999},
                                                             "city": {"type": "string", "pattern": "^[A-Za-z]{1,12}$"}},
                            "required": ["zip", "city"], "additionalProperties": False}},
             "required": ["name", "address"], "additionalProperties": False},
            '{"name":"kv","address":{"zip":1234,"city":"Oslo"}}'),
    Grammar("array", "json_schema",
            {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["kv", "block", "token"]},
                                                       "minItems": 1, "maxItems": 3}},
             "required": ["tags"], "additionalProperties": False}, '{"tags":["kv","block"]}'),
    Grammar("recursive", "json_schema", {"$defs": {"node": _NODE}, "$ref": "#/$defs/node"},
            '{"v":1,"kids":[{"v":2,"kids":[]}]}'),
    Grammar("json-object", "json_object", None, '{}'),
    Grammar("regex", "regex", r"[0-9]{3}-[0-9]{4}", "493-6851"),
    Grammar("choice", "choice", ["kv", "block", "token"], "block"),
)


def battery(features: FeaturesSpec) -> list[Grammar]:
    """The battery cases ``features.structured.cases`` selects (all when null), in battery order
    (the profile model admits only the battery's names)."""
    wanted = features.structured.cases
    return [g for g in BATTERY if wanted is None or g.name in wanted]


def grammar(name: str) -> Grammar:
    """The battery case called ``name``."""
    return next(g for g in BATTERY if g.name == name)


def structured_body(profile: Profile, g: Grammar) -> dict[str, Any]:
    """The chat request of a battery case."""
    return _chat(profile, f"Answer in the requested format ({g.name}).", chat_kwargs(profile), **g.request())


def tokens_max(features: FeaturesSpec) -> int:
    """``features.structured.tokens_max``, else half of ``features.max_tokens`` (tokens)."""
    return features.structured.tokens_max or max(1, features.max_tokens // 2)


def _content_problem(g: Grammar, text: str) -> str | None:
    if g.kind in ("json_schema", "json_object"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.pos >= len(text.rstrip()):
                return f"is JSON cut mid-object ({exc.msg} at the end, char {exc.pos})"
            if exc.msg.startswith("Unterminated string"):  # the string runs to the end: cut inside it
                return f"is JSON cut mid-object (a string opened at char {exc.pos} never closes)"
            if exc.msg.startswith("Invalid control character"):
                return (f"is not valid JSON: an unescaped control character {text[exc.pos]!r} in a string at char "
                        f"{exc.pos} (RFC 8259 section 7), which the grammar let through")
            return f"is not valid JSON ({exc.msg} at char {exc.pos} of {len(text)})"
        if g.kind == "json_object":
            return None if isinstance(value, dict) else f"a JSON {type(value).__name__}, not an object"
        try:
            jsonschema.validate(value, g.spec)
        except jsonschema.ValidationError as exc:
            return f"fails the schema: {clip(exc.message, 100)}"
        return None
    if g.kind == "regex":
        return None if re.fullmatch(g.spec, text) else f"does not match the regex {g.spec}"
    return None if text in g.spec else f"is not one of the choices {g.spec}"


def structured_verdict(g: Grammar, profile: Profile, ex: Exchange, after: Exchange) -> Verdict:
    """A battery case: 200; ``finish_reason`` stop; the reply valid for its grammar (JSON that
    validates against the schema with jsonschema, a regex full match, one of the choices);
    completion tokens at most :func:`tokens_max`; whitespace at most
    ``structured.whitespace_share_max`` of the characters; answered within ``features.deadline_s``
    seconds; and the canary ``after`` it generates (one grammar must not take the engine down)."""
    gate = f"{GATE}/structured/{g.name}"
    f = profile.features
    ev = {"request": ex.evidence(), "grammar": {"kind": g.kind, "spec": g.spec}}
    if unanswered := _unanswered(gate, ex, f"{g.kind} {g.name}", f.deadline_s, ev):
        return unanswered
    got = chat_fields(ex)
    text = got.content
    shown = clip(repr(text), CLIP)
    space = sum(c.isspace() for c in text)
    share = space / len(text) if text else 0.0
    toks = got.completion_tokens
    cap_t, share_max = tokens_max(f), f.structured.whitespace_share_max
    problem = got.problem
    if problem is None and got.finish == "length" and share > share_max:
        problem = (f"the whitespace loop: {shown} is {share:.0%} whitespace ({num(space)} of {num(len(text))} chars) "
                   f"until max_tokens (finish length)")
    if problem is None and got.finish != "stop":
        problem = f"finish_reason {got.finish}, must be stop: {shown}"
    if problem is None and not text.strip():
        problem = f"content empty (finish {got.finish}){_trapped(got)}"
    if problem is None and toks is None:
        problem = f"no usage.completion_tokens in the answer: the token count ({num(cap_t)} at most) cannot be checked"
    content = _content_problem(g, text) if problem is None else None
    if problem is None and content:
        problem = f"reply {shown} {content}" + (", with finish stop" if "cut mid-object" in content else "")
    if problem is None and toks > cap_t:
        problem = f"took {num(toks)} completion tokens for {shown}; at most {num(cap_t)} (features.structured.tokens_max)"
    if problem is None and share > share_max:
        problem = f"{shown} is {share:.0%} whitespace; at most {share_max:.0%}"
    if problem:
        return Verdict(gate, FAIL, f"{g.kind} {g.name}: {problem} -> FAIL", measured=problem,
                       limit=f"valid {g.kind}, finish stop, <= {num(cap_t)} tokens", evidence=ev)
    health = canary_verdict(after, profile.limits.canary_deadline_s, f"the {g.name} grammar")
    if not health.passed:
        return Verdict(gate, FAIL, health.message, measured=health.measured, limit=health.limit, unit=health.unit,
                       evidence={**ev, "canary": health.evidence})
    return Verdict(gate, PASS, f"{g.kind} {g.name}: {shown} valid, finish stop, {num(toks)} tokens, "
                   f"{share:.0%} whitespace, {ex.reply.elapsed_s:.2f} s; canary after it 200 -> PASS",
                   measured=toks, limit=cap_t, unit="tokens", evidence=ev)


# ------------------------------------------------------------------------------------------------
# reasoning


def reasoning_body(profile: Profile, case: str) -> dict[str, Any]:
    """The chat request of ``reasoning/thinking-on`` or ``-off``: the case's
    ``chat_template_kwargs`` and guide regex (``structured_outputs``) if the profile gives one."""
    r = profile.features.reasoning
    on = case.endswith("-on")
    kwargs = r.thinking_on if on else r.thinking_off
    guide = r.guide_on if on else r.guide_off
    extra = {"structured_outputs": {"regex": guide}} if guide else {}
    return _chat(profile, r.prompt, kwargs or {}, **extra)


def reasoning_verdict(case: str, profile: Profile, plain: Exchange, streamed: Exchange) -> Verdict:
    """A reasoning case from the same request sent non-streamed and streamed. Thinking on:
    reasoning present (``reasoning`` or ``reasoning_content``), content present; thinking off:
    no reasoning, content present. Both: no think markup left in content (nor the end marker in
    the reasoning), and the streamed concatenations equal the non-streamed fields (up to
    leading/trailing whitespace)."""
    gate = f"{GATE}/{case}"
    on = case.endswith("-on")
    ev = _evidence(("non-streamed", plain), ("streamed", streamed))
    limit = ("reasoning and content, no think markup, streamed alike" if on
             else "content only, no reasoning, streamed alike")
    what = f"thinking {'on' if on else 'off'}"
    got = {}
    for ex in (plain, streamed):
        if unanswered := _unanswered(gate, ex, f"{what} ({_way(ex)})", profile.features.deadline_s, ev):
            return unanswered
        c = got[ex.stream] = chat_fields(ex)
        way = _way(ex)
        left = _markup(c.content, THINK_MARKUP)
        problem = c.problem
        if problem is None and left:
            problem = f"think markup {left!r} left in content ({clip(repr(c.content), CLIP)}), reasoning {clip(repr(c.reasoning), 60)}"
        if problem is None and on and not c.reasoning.strip():
            problem = f"no reasoning: the whole answer is in content ({clip(repr(c.content), CLIP)})"
        if problem is None and not c.content.strip():
            problem = (f"content empty: the whole answer is trapped in {c.reasoning_field or 'reasoning'} "
                       f"({clip(repr(c.reasoning), CLIP)}), finish {c.finish}")
        if problem is None and not on and c.reasoning.strip():
            problem = f"reasoning {clip(repr(c.reasoning), CLIP)} although thinking is off"
        if problem is None and _markup(c.reasoning, THINK_MARKUP[1::2]):
            problem = f"the end marker left in the reasoning ({clip(repr(c.reasoning), CLIP)})"
        if problem:
            return Verdict(gate, FAIL, f"{what}, {way}: {problem} -> FAIL", measured=problem, limit=limit, evidence=ev)
    a, b = got[False], got[True]
    if a.reasoning.strip() != b.reasoning.strip() or a.content.strip() != b.content.strip():
        problem = (f"streamed reasoning/content {clip(repr(b.reasoning), 60)} / {clip(repr(b.content), 60)} differ from "
                   f"the non-streamed {clip(repr(a.reasoning), 60)} / {clip(repr(a.content), 60)}")
        return Verdict(gate, FAIL, f"{what}: {problem} -> FAIL", measured=problem, limit=limit, evidence=ev)
    shown = f"reasoning {clip(repr(a.reasoning), 60)} ({a.reasoning_field}), " if on else "no reasoning, "
    return Verdict(gate, PASS, f"{what}: {shown}content {clip(repr(a.content), 60)}, no think markup, streamed "
                   "alike -> PASS", measured=len(a.reasoning), limit="> 0" if on else "0", unit="chars", evidence=ev)


# ------------------------------------------------------------------------------------------------
# LoRA


def listed_adapters(models_reply_json: Any) -> dict[str, str | None]:
    """``/v1/models`` entries that have a ``parent`` (vLLM lists a LoRA adapter with the base
    model as its parent): adapter id -> parent."""
    data = models_reply_json.get("data") if isinstance(models_reply_json, dict) else None
    return {m["id"]: m.get("parent") for m in data or [] if isinstance(m, dict) and m.get("parent") and "id" in m}


def _completion_text(ex: Exchange) -> tuple[str | None, str | None, str | None]:
    """``(text, echoed model, problem)`` of a non-streamed completion."""
    bad = _answered(ex, f"model {ex.body.get('model')!r}")
    if bad:
        return None, None, bad
    body = json_body(ex.reply)
    ch = (body or {}).get("choices")
    if not body or not isinstance(ch, list) or not ch or not isinstance(ch[0], dict):
        return None, None, f"not a completion: {clip(ex.reply.text, CLIP)!r}"
    text = ch[0].get("text")
    if text is not None and not isinstance(text, str):
        return None, None, f"the completion's text is a JSON {type(text).__name__} ({clip(json.dumps(text), 60)}), not a string"
    return text or "", body.get("model"), None


def output_key(ex: Exchange) -> tuple[str, Any] | None:
    """What two temperature-0 completions are compared by: the generated token ids when the
    server returns them (``return_token_ids``, vLLM >= 0.10: a random model's tokens may decode to
    nothing, and two different outputs to the same empty text), else the text; None for a
    non-answer."""
    body = json_body(ex.reply) if ex.reply.status == 200 else None
    ch = (body or {}).get("choices")
    if not isinstance(ch, list) or not ch or not isinstance(ch[0], dict):
        return None
    ids = ch[0].get("token_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
        return ("token ids", tuple(ids))
    return ("text", ch[0].get("text"))


def lora_verdict(name: str, profile: Profile, listed: dict[str, str | None], base: Exchange, adapter: Exchange,
                 others: dict[str, Exchange] | None = None) -> Verdict:
    """``lora/<name>``: the server lists the adapter with a parent, answers it 200 echoing its
    name as ``model``, and its temperature-0 output (token ids where returned, else text) differs
    from the base model's and from every other adapter's in ``others`` (or its text equals
    ``features.lora.golden[name]``)."""
    gate = f"{GATE}/lora/{name}"
    ev = {"listed": listed, "base": base.evidence(), "adapter": adapter.evidence()}
    limit = "listed, echoed, output unlike the base model's"
    if name not in listed:
        return Verdict(gate, FAIL, f"adapter {name!r} is not in /v1/models with a parent (listed adapters: "
                       f"{', '.join(listed) or 'none'}) -> FAIL", measured="not listed", limit=limit, evidence=ev)
    base_text, _, problem = _completion_text(base)
    text, echoed, problem2 = _completion_text(adapter)
    problem = problem2 or problem
    golden = profile.features.lora.golden.get(name)
    if problem is None and echoed != name:
        problem = f"answered as model {echoed!r}, not {name!r}"
    if problem is None and golden is not None and text != golden:
        problem = f"temperature-0 text {clip(repr(text), 80)} is not the golden {clip(repr(golden), 80)}"
    key, base_key = output_key(adapter), output_key(base)
    if problem is None and golden is None and key == base_key:
        problem = (f"temperature-0 output ({key[0]}; text {clip(repr(text), 80)}) is byte-identical to the base "
                   "model's: the adapter changes nothing (target modules that do not match?)")
    twin = next((o for o, ex in (others or {}).items() if o != name and output_key(ex) == key), None)
    if problem is None and golden is None and twin is not None:
        problem = (f"temperature-0 output ({key[0]}; text {clip(repr(text), 80)}) is identical to that of adapter {twin!r}: "
                   "requests reach the wrong adapter, or the adapters are the same")
    if problem:
        return Verdict(gate, FAIL, f"LoRA {name}: {problem} -> FAIL", measured=problem, limit=limit, evidence=ev)
    base_shown = (f"{len(base_key[1])} token ids, text {clip(repr(base_text), 40)}"  # ids may decode to ''
                  if base_key and base_key[0] == "token ids" else clip(repr(base_text), 40))
    how = ("equals the golden text" if golden is not None else
           f"differs from the base model's ({base_shown})"
           + (" and the other adapters'" if others and len(others) > 1 else "") + f" (by {key[0]})")
    return Verdict(gate, PASS, f"LoRA {name} (parent {listed[name]}): 200 as {name!r}, text {clip(repr(text), 60)} "
                   f"{how} -> PASS", measured="distinct output", limit=limit, evidence=ev)


def lora_listed_verdict(profile: Profile, listed: dict[str, str | None], base: Exchange,
                        adapters: dict[str, Exchange]) -> Verdict:
    """``lora/listed`` (no adapters declared): every adapter the server lists passes
    :func:`lora_verdict`; none listed is a FAIL (LoRA enabled, nothing served)."""
    gate = f"{GATE}/lora/listed"
    if not listed:
        return Verdict(gate, FAIL, "engine.enable_lora is set but /v1/models lists no adapter (no entry with a "
                       "parent) -> FAIL", measured=0, limit=">= 1", unit="adapters", evidence={"listed": listed})
    parts = [lora_verdict(n, profile, listed, base, adapters[n], adapters) for n in listed]
    bad = [p for p in parts if not p.passed]
    if bad:
        return Verdict(gate, FAIL, "; ".join(p.message for p in bad), measured=len(bad), limit=0,
                       unit="adapters failing", evidence={p.gate: p.evidence for p in parts})
    return Verdict(gate, PASS, f"{len(parts)} listed adapter(s) answer with their own output -> PASS",
                   measured=len(parts), limit=">= 1", unit="adapters", evidence={p.gate: p.evidence for p in parts})


def over_max_loras_verdict(profile: Profile, exchanges: list[Exchange]) -> Verdict:
    """``lora/over-max-loras``: requests to more adapters at once than ``max_loras`` slots all
    answer 200, each echoing its adapter, within ``features.deadline_s`` seconds."""
    gate = f"{GATE}/lora/over-max-loras"
    if not exchanges:
        return Verdict(gate, FAIL, "no request was sent over the adapters -> FAIL", measured=0, limit=">= 1",
                       unit="requests")
    names = sorted({str(ex.body.get("model")) for ex in exchanges})
    m = max_loras(profile)
    ev = {"requests": [ex.evidence() for ex in exchanges]}
    problems = []
    for ex in exchanges:
        _, echoed, problem = _completion_text(ex)
        want = ex.body.get("model")
        if problem is None and echoed != want:
            problem = f"request for {want!r} answered as {echoed!r}"
        if problem is None and ex.reply.elapsed_s > profile.features.deadline_s:
            problem = f"{want!r} took {ex.reply.elapsed_s:.1f} s (> {profile.features.deadline_s:g} s)"
        if problem:
            problems.append(problem)
    keys: dict[Any, str] = {}
    for ex in exchanges:
        key, want = output_key(ex), str(ex.body.get("model"))
        if key is not None and keys.setdefault(key, want) != want:
            problems.append(f"{keys[key]!r} and {want!r} answered identically ({key[0]}) in the burst: requests "
                            "served by the wrong adapter")
            break
    ok = len(exchanges) - len(problems)
    if problems:
        return Verdict(gate, FAIL, f"{len(exchanges)} requests at once over {len(names)} adapters (max_loras {m}): "
                       f"{ok} answered; {problems[0]} -> FAIL", measured=ok, limit=len(exchanges), unit="requests",
                       evidence=ev)
    slowest = max(ex.reply.elapsed_s for ex in exchanges)
    return Verdict(gate, PASS, f"{len(exchanges)} requests at once over {len(names)} adapters (max_loras {m}): all "
                   f"200 as their adapter, slowest {slowest:.2f} s -> PASS", measured=ok, limit=len(exchanges),
                   unit="requests", evidence=ev)


# ------------------------------------------------------------------------------------------------
# prefix caching


def prefix_verdict(profile: Profile, obs: PrefixObservation, declared_details: bool) -> Verdict:
    """``prefix-caching``: the long shared prefix, sent again, hits: ``cached_tokens`` (where the
    server reports it) reaches its whole blocks, the ``prefix_cache_hits`` counter rises (where
    /metrics has it) and agrees with ``cached_tokens``, and cold TTFT / warm TTFT reaches
    ``prefix_caching.ttft_speedup_min``. The smallest prefix that hit is reported."""
    gate = f"{GATE}/prefix-caching"
    ev = obs.evidence()
    bad = next((t for t in obs.tries if t.status != 200), None)
    if bad is not None:
        return Verdict(gate, FAIL, f"a {num(bad.prefix_tokens)}-token-prefix request answered {bad.status} "
                       f"({bad.error}) -> FAIL", measured=bad.status, limit=200, unit="HTTP status", evidence=ev)
    block = obs.block_size
    if not any(t.cold for t in obs.tries) or all(t.cold for t in obs.tries):
        return Verdict(gate, FAIL, f"the prefix ladder has {len(obs.tries)} tries, no cold and warm pair to compare "
                       "-> FAIL", measured=len(obs.tries), limit="a cold and a warm try", evidence=ev)
    lengths = sorted({t.prefix_tokens for t in obs.tries})
    long = lengths[-1]
    cold = next(t for t in obs.tries if t.prefix_tokens == long and t.cold)
    warm = [t for t in obs.tries if t.prefix_tokens == long and not t.cold]
    whole = long // block * block
    reported = any(t.cached_tokens is not None for t in obs.tries)
    counted = any(t.hits_delta is not None for t in obs.tries)
    best_cached = max((t.cached_tokens or 0 for t in warm), default=0)
    hits = sum(t.hits_delta or 0 for t in warm)
    speedup = cold.ttft_s / max(min(t.ttft_s for t in warm), 1e-6)
    need = profile.features.prefix_caching.ttft_speedup_min

    def hit(t: PrefixTry) -> bool:
        return bool(t.cached_tokens) if reported else bool(t.hits_delta)

    hitting = [n for n in lengths if any(hit(t) for t in obs.tries if t.prefix_tokens == n and not t.cold)]
    smallest = (f"smallest shared prefix that hit: {num(hitting[0])} tokens ({hitting[0] / block:g} blocks of "
                f"{num(block)})" if hitting else "no prefix hit")
    misses = [n for n in lengths if n not in hitting]
    if misses and hitting:
        smallest += f"; {', '.join(num(n) for n in misses)} did not"
    where = (f"cached_tokens {num(best_cached)} of {num(whole)} whole-block tokens" if reported
             else "cached_tokens not reported")
    counter = (f"prefix_cache_hits +{hits / max(len(warm), 1):,.0f} per warm request" if counted
               else "no prefix_cache_hits counter")
    seen = f"{num(long)}-token prefix sent again: {where}, {counter}, TTFT {cold.ttft_s * 1e3:.0f} -> " \
           f"{min(t.ttft_s for t in warm) * 1e3:.0f} ms ({speedup:.1f}x); {smallest}"
    problem = None
    if declared_details and not reported:
        problem = ("engine.enable_prompt_tokens_details is set but no answer carries "
                   "usage.prompt_tokens_details.cached_tokens")
    elif counted and reported and best_cached == 0 and hits > 0:  # before "never hitting": the counter says it did
        problem = "the prefix_cache_hits counter rose while cached_tokens stayed 0"
    elif reported and best_cached < whole:
        problem = (f"enabled but never hitting: cached_tokens {num(best_cached)}, the prefix's whole blocks are "
                   f"{num(whole)}" if best_cached == 0 else
                   f"cached_tokens {num(best_cached)} below the prefix's {num(whole)} whole-block tokens")
    elif counted and reported and best_cached > 0 and hits <= 0:
        problem = "cached_tokens says it hit while the prefix_cache_hits counter stayed flat (dashboards lie)"
    elif counted and reported and (short := next((t for t in warm if t.cached_tokens and t.hits_delta is not None
                                                  and t.hits_delta < t.cached_tokens - block), None)):
        problem = (f"the prefix_cache_hits counter rose {short.hits_delta:,.0f} for a request reporting cached_tokens "
                   f"{num(short.cached_tokens)} (vLLM counts hit tokens: the two must agree within a block)")
    elif over := next((t for t in obs.tries if t.cached_tokens and t.prompt_tokens
                       and t.cached_tokens > t.prompt_tokens), None):
        problem = f"cached_tokens {num(over.cached_tokens)} exceeds the prompt's {num(over.prompt_tokens)} tokens"
    elif reported and (pre := next((t for t in obs.tries if t.cold and t.cached_tokens), None)):
        problem = (f"a {num(pre.prefix_tokens)}-token prefix never sent before (a random one) already reports "
                   f"cached_tokens {num(pre.cached_tokens)}")
    elif counted and not reported and hits <= 0:
        problem = "enabled but never hitting: the prefix_cache_hits counter stayed flat"
    elif speedup < need:
        problem = f"TTFT dropped {speedup:.2f}x; at least {need:g}x (features.prefix_caching.ttft_speedup_min)"
    if problem:
        return Verdict(gate, FAIL, f"{seen} -> FAIL ({problem})", measured=round(speedup, 2), limit=need,
                       unit="ratio", evidence=ev)
    return Verdict(gate, PASS, f"{seen} -> PASS", measured=round(speedup, 2), limit=need, unit="ratio", evidence=ev)


def halted_verdict(case: str, halt: Halt) -> Verdict:
    """The FAIL of a case whose requests were not sent because the engine stopped answering
    after an earlier case (:class:`~kvgate.http.features.Halt`)."""
    if halt.after == case:
        return Verdict(f"{GATE}/{case}", FAIL, f"{case}: {halt.why}; the gate's later requests were not sent -> FAIL",
                       measured="no answer", limit="an answer within features.deadline_s",
                       evidence={"after": halt.after, "why": halt.why})
    return Verdict(f"{GATE}/{case}", FAIL, f"not sent: the engine stopped answering after features/{halt.after} "
                   f"({halt.why}); every later request would wait the same deadline -> FAIL", measured="not sent",
                   limit="an answer within features.deadline_s", evidence={"after": halt.after, "why": halt.why})


# ------------------------------------------------------------------------------------------------
# every case at once: what the features suite and the compare gate (features lost) both run


def observe(client: Any, profile: Profile, settle: Any = None) -> dict[str, Any]:
    """Send the requests of every case that runs (:func:`cases` less :func:`skip_verdict`), one at a
    time -- a temperature-0 answer is compared streamed and not, and batch composition changes a
    near-tie argmax (measured on the tiny model: concurrent pairs differed) -- tools and reasoning
    both ways, each grammar with a canary after it, the LoRA adapters (their burst is concurrent by
    design), then the prefix ladder (it compares TTFT). Returns case (``"lora"`` for all LoRA
    cases) -> observation. Once a request (a canary included) goes unanswered within its deadline,
    or the endpoint goes away, the rest are not sent: their observation is the
    :class:`~kvgate.http.features.Halt` naming where the engine stopped. ``client``: a
    :class:`~kvgate.http.client.KvClient`. ``settle``: called (no arguments) right before the prefix
    ladder, whose verdict reads cold/warm TTFT -- :func:`kvgate.run.quiet.settle` waits, bounded, until
    the server runs nothing else (the LoRA burst before it, a request of an earlier gate); its result
    goes to ``out["prefix-caching/beside"]``. The only function of this module that sends requests."""
    from kvgate.http.client import EndpointUnreachable
    from kvgate.http.features import both_ways, observe_lora, observe_prefix, stalled, tool_loop, with_canary

    run = [c for c in cases(profile) if skip_verdict(c, profile) is None]
    t = profile.features.deadline_s
    jobs: dict[str, Any] = {}
    for c in run:
        if c.startswith("tools/"):
            jobs[c] = lambda c=c: both_ways(client, tool_body(profile, c), t)
        elif c == "tool-ids":
            jobs[c] = lambda: tuple(tool_loop(client, tool_ids_body(profile), TOOL_TURNS, t, stream, follow_up)
                                    for stream in (False, True))
        elif c.startswith("structured/"):
            jobs[c] = lambda c=c: with_canary(client, structured_body(profile, grammar(c.split("/", 1)[1])), profile)
        elif c.startswith("reasoning/"):
            jobs[c] = lambda c=c: both_ways(client, reasoning_body(profile, c), t)
    if any(c.startswith("lora/") for c in run):
        jobs["lora"] = lambda: observe_lora(client, profile, listed_adapters(client.models().json))
    if "prefix-caching" in run:
        if settle is not None:
            jobs["prefix-caching/beside"] = settle
        jobs["prefix-caching"] = lambda: observe_prefix(client, profile)
    out: dict[str, Any] = {}
    halt = None
    for name, job in jobs.items():
        if halt is None:
            try:
                out[name] = job()
            except EndpointUnreachable as exc:  # the server went away mid-gate: a verdict, not a traceback
                out[name] = halt = Halt(name, f"the endpoint went away: {exc}")
                continue
            why = stalled(out[name])
            halt = Halt(name, why) if why else None
        else:
            out[name] = halt
    return out


def decide(case: str, profile: Profile, observed: dict[str, Any]) -> Verdict:
    """The verdict of ``case`` (a name of :func:`cases`) from :func:`observe`'s result: its SKIP
    when its feature is off, the FAIL of a case left unsent (:func:`halted_verdict`), else the
    case's own verdict."""
    if (skip := skip_verdict(case, profile)) is not None:
        return skip
    obs = observed["lora" if case.startswith("lora/") else case]
    if isinstance(obs, Halt):
        return halted_verdict(case, obs)
    feat, _, name = case.partition("/")
    if case == "tool-ids":
        return tool_ids_verdict(profile, *obs)
    if feat == "tools":
        return tools_verdict(case, profile, *obs)
    if feat == "structured":
        return structured_verdict(grammar(name), profile, *obs)
    if feat == "reasoning":
        return reasoning_verdict(case, profile, *obs)
    if feat == "lora":
        if name == "over-max-loras":
            return over_max_loras_verdict(profile, obs.burst)
        if name == "listed":
            return lora_listed_verdict(profile, obs.listed, obs.base, obs.adapters)
        return lora_verdict(name, profile, obs.listed, obs.base, obs.adapters[name], obs.adapters)
    return prefix_verdict(profile, obs, profile.engine.enable_prompt_tokens_details)
