"""Gate: serve features. What the engine flags turn on must actually work, streamed and not:
tool calls parse to the offered functions with schema-valid arguments and no markup left; an agent
loop calling the same tool three times gets a new id every turn, one id scheme streamed and not,
and its echoed ids accepted; every
structured-output grammar of the battery ends valid, short and on time, and the engine still
generates after it; a reasoning parser splits reasoning from content with thinking on and off;
every LoRA adapter answers as itself with output of its own, more of them than slots included;
a repeated prefix hits the prefix cache (cached_tokens, the hits counter, TTFT). A feature the
profile does not turn on is one SKIP saying which flag is unset."""

import dataclasses

import pytest

from kvgate.gates.features import (cases, feature_of, grammar, halted_verdict, lora_listed_verdict, lora_verdict, observe,
                                   over_max_loras_verdict, prefix_verdict, reasoning_verdict, skip_verdict,
                                   structured_verdict, tool_ids_verdict, tools_verdict)
from kvgate.http.features import Halt
from kvgate.run.quiet import Quiet, settle


def of(feature):
    """The cases of one feature, from the profile (``cases`` in the gate marker takes a callable)."""
    return lambda profile: [c for c in cases(profile) if feature_of(c) == feature]


@pytest.fixture(scope="module")
def observed(kvgate_client, kvgate_profile):
    """Every request of the cases that run, one at a time, each grammar with a canary after it;
    once the engine stops answering the rest are not sent (:func:`kvgate.gates.features.observe`).
    The prefix ladder (cold vs warm TTFT) starts once the server runs nothing else (run/quiet.settle:
    waited, bounded, stated in its verdict's evidence), as requests/route-timeout's stream does."""
    return observe(kvgate_client, kvgate_profile, settle=lambda: settle(kvgate_client.metrics_text))


def verdict_of(case, obs, decide):
    """``decide(obs)``, or the FAIL of a case left unsent because the engine stopped answering."""
    return halted_verdict(case, obs) if isinstance(obs, Halt) else decide(obs)


def feature_not_on(config, profile, case):
    """The SKIP verdict of a case whose feature the engine flags do not turn on."""
    return skip_verdict(case, profile)


@pytest.fixture
def feature_on(case, kvgate_profile, kvgate_gate):
    """Records the SKIP verdict (and skips the test) when the case's feature is not turned on."""
    verdict = skip_verdict(case, kvgate_profile)
    if verdict is not None:
        kvgate_gate(verdict)


@pytest.mark.features
@pytest.mark.gate("features", cases=of("tools"), not_applicable=feature_not_on)
def test_tool_calls_parse_to_valid_arguments_and_ids_stay_unique(case, feature_on, observed, kvgate_profile,
                                                                kvgate_gate):
    if case == "tool-ids":  # the agent loop: a new id every turn, one scheme streamed and not, echoes accepted
        verdict = verdict_of(case, observed[case], lambda loops: tool_ids_verdict(kvgate_profile, *loops))
    else:
        verdict = verdict_of(case, observed[case], lambda pair: tools_verdict(case, kvgate_profile, *pair))
    assert kvgate_gate(verdict).passed


@pytest.mark.features
@pytest.mark.gate("features", cases=of("structured"), not_applicable=feature_not_on)
def test_structured_output_ends_valid_and_engine_survives(case, feature_on, observed, kvgate_profile, kvgate_gate):
    g = grammar(case.split("/", 1)[1])
    verdict = verdict_of(case, observed[case], lambda pair: structured_verdict(g, kvgate_profile, *pair))
    assert kvgate_gate(verdict).passed


@pytest.mark.features
@pytest.mark.gate("features", cases=of("reasoning"), not_applicable=feature_not_on)
def test_reasoning_parser_splits_reasoning_from_content(case, feature_on, observed, kvgate_profile, kvgate_gate):
    verdict = verdict_of(case, observed[case], lambda pair: reasoning_verdict(case, kvgate_profile, *pair))
    assert kvgate_gate(verdict).passed


@pytest.mark.features
@pytest.mark.gate("features", cases=of("lora"), not_applicable=feature_not_on)
def test_lora_adapters_answer_as_themselves(case, feature_on, observed, kvgate_profile, kvgate_gate):
    name = case.split("/", 1)[1]

    def decide(lora):
        if name == "over-max-loras":
            return over_max_loras_verdict(kvgate_profile, lora.burst)
        if name == "listed":
            return lora_listed_verdict(kvgate_profile, lora.listed, lora.base, lora.adapters)
        return lora_verdict(name, kvgate_profile, lora.listed, lora.base, lora.adapters[name], lora.adapters)

    assert kvgate_gate(verdict_of(case, observed["lora"], decide)).passed


@pytest.mark.features
@pytest.mark.gate("features", cases=of("prefix-caching"), not_applicable=feature_not_on)
def test_repeated_prefix_hits_the_prefix_cache(case, feature_on, observed, kvgate_profile, kvgate_gate):
    details = kvgate_profile.engine.enable_prompt_tokens_details
    verdict = verdict_of(case, observed[case], lambda ladder: prefix_verdict(kvgate_profile, ladder, details))
    quiet = observed.get("prefix-caching/beside")  # what the server ran when the ladder began (issue 48)
    if isinstance(quiet, Quiet):
        verdict = dataclasses.replace(verdict, evidence={**(verdict.evidence or {}), "beside": quiet.to_dict()})
    assert kvgate_gate(verdict).passed
