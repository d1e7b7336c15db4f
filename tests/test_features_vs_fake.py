"""The features gate (suites/test_features.py) against the fault-injecting fake vLLM: every case
PASSES on the healthy fake serving every feature; each features fault FAILS exactly its cases,
naming what went wrong, and leaves every other case PASS; a profile that turns no feature on is
five SKIPs naming the unset flag, and the run is SKIP, not PASS. Suites run through pytester with
``--endpoint``; verdicts are read back from summary.json. One suite run per test."""

from __future__ import annotations

import pytest

from .conftest import REPO, assert_passes_measured
from .test_gates_vs_fake import fake, run_suites  # noqa: F401  (fake: the healthy fake fixture, shared)

pytest_plugins = ["pytester"]
PROFILE = REPO / "tests" / "data" / "fake-features.yaml"
PLAIN = REPO / "tests" / "data" / "fake-vllm.yaml"  # no features flag at all
SUITE = ["suites/test_features.py"]

#: The prefix-caching case's timing. The ladder's long prompt is the 1,024-token prefix + 4 tokens:
#: cold, the fake prefills all 1,028 at 60 us each (~62 ms of sleep, a floor); warm, only the 4
#: uncached (~0.2 ms) plus the HTTP round trip (~2 ms measured on this 2-core machine: ~30x).
#: ``ttft_speedup_min`` is 1.5, so a warm answer may take up to ~40 ms (20x the measured round
#: trip) on a loaded machine before the healthy case could FAIL falsely.
PREFILL_S_PER_TOKEN = 0.060 / 1024
COLD_PREFILL_S = 1028 * PREFILL_S_PER_TOKEN

TOOLS = ["tools/auto", "tools/required", "tools/named/get_weather", "tools/named/get_time"]
TOOL_LOOP = [*TOOLS, "tool-ids"]  # the tools cases and the agent loop (which cannot go on without a call)
JSON_SCHEMA = ["structured/enum-const", "structured/nested", "structured/array", "structured/recursive"]
CASES = [*TOOL_LOOP, *JSON_SCHEMA, "structured/json-object", "structured/regex", "structured/choice",
         "reasoning/thinking-on", "reasoning/thinking-off", "lora/a1", "lora/a2", "lora/over-max-loras",
         "prefix-caching"]


@pytest.fixture
def features_fake(fake):  # noqa: F811  (the shared fixture, configured further)
    """The shared healthy fake configured as tests/data/fake-features.yaml declares it: room for the
    1,024-token prefix (max_model_len 2048, 512 blocks of 16), the qwen3 reasoning parser, adapters
    a1 and a2, cached_tokens reported, and a prefill cost per uncached token."""
    c = fake.config
    c.max_model_len, c.num_gpu_blocks = 2048, 512
    c.reasoning_parser, c.lora_adapters, c.prompt_tokens_details = "qwen3", ("a1", "a2"), True
    c.prefill_s_per_token = PREFILL_S_PER_TOKEN
    return fake


def run(pytester, url, profile=PROFILE):
    """The features suite once; gates keyed by case (``tools/auto``), without ``PROFILE/features/``."""
    result, summary, gates = run_suites(pytester, url, suites=SUITE, profile=profile)
    prefix = f"{profile.stem}/features/"
    assert all(k.startswith(prefix) for k in gates), list(gates)
    return result, summary, {k.removeprefix(prefix): g for k, g in gates.items()}


def test_healthy_fake_passes_every_features_case(pytester, features_fake):
    result, summary, gates = run(pytester, features_fake.url)
    assert list(gates) == CASES
    assert {c: g["status"] for c, g in gates.items()} == dict.fromkeys(CASES, "PASS"), \
        [g["message"] for g in gates.values() if g["status"] != "PASS"]
    assert summary["overall"] == "PASS" and result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=18)
    msg = {c: g["message"] for c, g in gates.items()}
    assert msg["tools/auto"].startswith('tool_choice auto: get_weather({"city":"Oslo","unit":"c"}), finish '
                                        "tool_calls, valid against the schema, streamed alike")
    assert "get_time({}), finish stop" in msg["tools/named/get_time"]
    assert msg["tool-ids"].startswith("tool loop calling get_weather, 3 turns each way: 6 ids, each unique in its loop "
                                      "(e.g. 'chatcmpl-tool-")
    assert msg["tool-ids"].endswith("one scheme streamed and not ('chatcmpl-tool-<id>'), the echoed ids accepted (turns "
                                    "2-3 200) -> PASS")
    loop = gates["tool-ids"]["evidence"]
    assert len(set(loop["ids"]["non-streamed"] + loop["ids"]["streamed"])) == 6
    assert msg["structured/nested"].startswith("json_schema nested: '{\"name\":\"kv\",\"address\":{\"zip\":1234,"
                                               "\"city\":\"Oslo\"}}' valid, finish stop, 14 tokens, 0% whitespace")
    assert "canary after it 200 -> PASS" in msg["structured/regex"]
    assert "thinking on: reasoning 'The user asks a short question" in msg["reasoning/thinking-on"]
    assert "LoRA a1 (parent fake-model): 200 as 'a1'" in msg["lora/a1"] and "differs from the base" in msg["lora/a1"]
    assert "4 requests at once over 2 adapters (max_loras 1): all 200 as their adapter" in msg["lora/over-max-loras"]
    prefix = gates["prefix-caching"]
    assert "cached_tokens 1,024 of 1,024 whole-block tokens, prefix_cache_hits +1,024 per warm request" in prefix["message"]
    assert "smallest shared prefix that hit: 24 tokens (1.5 blocks of 16); 8 did not -> PASS" in prefix["message"]
    cold = [t for t in prefix["evidence"]["tries"] if t["prefix_tokens"] == 1024 and t["cold"]]
    assert cold[0]["ttft_s"] >= COLD_PREFILL_S  # the cold prefill is slept, whatever the machine's load
    assert prefix["limit"] == {"value": 1.5, "unit": "ratio"} and prefix["measured"]["value"] >= 1.5
    # the ladder began once the server ran nothing else (the LoRA burst before it included): settled and stated
    beside = prefix["evidence"]["beside"]
    assert beside["idle"] is True and beside["left"] is None and beside["waited_s"] <= 10, beside
    assert_passes_measured(summary)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


# fault -> (the cases that must FAIL, a fragment of each of their messages)
FAULT_CASES = {
    "tools_stream_as_text": (TOOL_LOOP, "left as text in content"),
    "tools_empty_calls": (TOOL_LOOP, "finish_reason tool_calls with an empty tool_calls list"),
    # one id per call, '<function>:0', on every turn: the agent loop's second turn repeats its first's
    "tool_ids_repeat": (["tool-ids"], "non-streamed: id 'get_weather:0' on turn 1 and again on turn 2 (every id "
                                      "must be unique) -> FAIL"),
    # get_time too: its arguments `false` are not the `{}` a parameterless function takes (a client's
    # fn(**json.loads(arguments)) raises), and the gate checks "an object" before "parameterless"
    "tools_args_not_object": (TOOLS, "arguments are the JSON bool false, not an object"),
    "structured_whitespace_loop": (JSON_SCHEMA, "the whitespace loop"),
    "structured_cut": (JSON_SCHEMA, "cut mid-object"),
    "reasoning_markers_in_content": (["reasoning/thinking-on"], "think markup"),
    # every adapter answering as the base model also makes the burst's adapters answer alike
    "lora_as_base": (["lora/a1", "lora/a2", "lora/over-max-loras"], ("byte-identical to the base model's",
                                                                     "answered identically")),
    "prefix_cache_never_hits": (["prefix-caching"], "never hitting"),
    "prefix_counter_frozen": (["prefix-caching"], "counter stayed flat"),
}


@pytest.mark.parametrize("fault", list(FAULT_CASES))
def test_features_fault_fails_exactly_its_cases(pytester, features_fake, fault):
    features_fake.config.faults.add(fault)
    result, summary, gates = run(pytester, features_fake.url)
    must_fail, fragment = FAULT_CASES[fault]
    assert list(gates) == CASES
    assert {c for c, g in gates.items() if g["status"] == "FAIL"} == set(must_fail), \
        {c: g["message"] for c, g in gates.items() if g["status"] != "PASS"}
    assert all(g["status"] == "PASS" for c, g in gates.items() if c not in must_fail)
    frags = fragment if isinstance(fragment, tuple) else (fragment,)
    for case in must_fail:
        msg = gates[case]["message"]
        assert any(f in msg for f in frags) and "-> FAIL" in msg, msg
    assert summary["overall"] == "FAIL" and result.ret == pytest.ExitCode.TESTS_FAILED
    if fault == "tools_args_not_object":
        assert "named/get_time: non-streamed: get_time arguments are the JSON bool false" in \
            gates["tools/named/get_time"]["message"]
    if fault == "prefix_cache_never_hits":  # no hit, so no TTFT drop either: the fake prefills it all again
        assert gates["prefix-caching"]["measured"]["value"] < 1.5


def test_profile_without_features_flags_is_five_skips_not_a_pass(pytester, fake):  # noqa: F811
    result, summary, gates = run(pytester, fake.url, profile=PLAIN)
    flags = {"tools": "engine.tool_call_parser is not set", "structured": "engine.structured_outputs_config is not set",
             "reasoning": "engine.reasoning_parser is not set", "lora": "engine.enable_lora is not set",
             "prefix-caching": "engine.enable_prefix_caching is not set"}
    assert list(gates) == list(flags)
    for case, flag in flags.items():
        assert gates[case]["status"] == "SKIP" and gates[case]["message"].startswith(f"{case}: {flag}")
        assert gates[case]["message"].endswith("-> SKIP")
    result.assert_outcomes(skipped=5)
    # kvgate's rule (report.record.RunRecord.overall): all SKIP is SKIP, never PASS; exit 0 in enforce mode
    assert summary["overall"] == "SKIP" and result.ret == pytest.ExitCode.OK
    assert fake.state.requests == []  # nothing was generated for a feature that is not deployed
