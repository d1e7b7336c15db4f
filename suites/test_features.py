"""Gate: serve features. What the engine flags turn on must actually work, streamed and not:
tool calls parse to the offered functions with schema-valid arguments and no markup left; every
structured-output grammar of the battery ends valid, short and on time, and the engine still
generates after it; a reasoning parser splits reasoning from content with thinking on and off;
every LoRA adapter answers as itself with output of its own, more of them than slots included;
a repeated prefix hits the prefix cache (cached_tokens, the hits counter, TTFT). A feature the
profile does not turn on is one SKIP saying which flag is unset."""

import pytest

from kvgate.gates.features import (cases, grammar, halted_verdict, lora_listed_verdict, lora_verdict, listed_adapters,
                                   over_max_loras_verdict, prefix_verdict, reasoning_body, reasoning_verdict,
                                   skip_verdict, structured_body, structured_verdict, tool_body, tools_verdict)
from kvgate.http.client import EndpointUnreachable
from kvgate.http.features import Halt, both_ways, observe_lora, observe_prefix, stalled, with_canary


def of(feature):
    """The cases of one feature, from the profile (``cases`` in the gate marker takes a callable)."""
    return lambda profile: [c for c in cases(profile) if c.split("/", 1)[0] == feature]


@pytest.fixture(scope="module")
def observed(kvgate_client, kvgate_profile):
    """Every request of the cases that run, one at a time (a temperature-0 answer is compared
    streamed and not, and batch composition changes a near-tie argmax: measured on the tiny model,
    concurrent pairs differed), tools and reasoning both ways, each grammar with a canary after
    it, the LoRA adapters (their burst is concurrent by design), then the prefix ladder (it
    compares TTFT). Once a request (a canary included) goes unanswered within its deadline, or the
    endpoint goes away, the rest are not sent: their cases FAIL naming where the engine stopped."""
    client, profile = kvgate_client, kvgate_profile
    run = [c for c in cases(profile) if skip_verdict(c, profile) is None]
    t = profile.features.deadline_s
    jobs = {}
    for c in run:
        if c.startswith("tools/"):
            jobs[c] = lambda c=c: both_ways(client, tool_body(profile, c), t)
        elif c.startswith("structured/"):
            jobs[c] = lambda c=c: with_canary(client, structured_body(profile, grammar(c.split("/", 1)[1])), profile)
        elif c.startswith("reasoning/"):
            jobs[c] = lambda c=c: both_ways(client, reasoning_body(profile, c), t)
    if any(c.startswith("lora/") for c in run):
        jobs["lora"] = lambda: observe_lora(client, profile, listed_adapters(client.models().json))
    if "prefix-caching" in run:
        jobs["prefix-caching"] = lambda: observe_prefix(client, profile)
    out, halt = {}, None
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
def test_tool_calls_parse_to_valid_arguments(case, feature_on, observed, kvgate_profile, kvgate_gate):
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
    assert kvgate_gate(verdict).passed
