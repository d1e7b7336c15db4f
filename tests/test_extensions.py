"""vLLM request extensions on a strict server (issue 41): probed once per run, sent in their portable
form where one exists, and a case whose measurement the refusal took away SKIPs naming the refused
parameter and quoting the 4xx -- never a FAIL of the gate that needed it. Against the fake posing as
HF ``transformers serve`` (422 on unknown fields, token-id prompts 400) and the healthy vLLM fake."""

from __future__ import annotations

import dataclasses

import pytest

from kvgate.gates.common import refused_verdict
from kvgate.gates.max_context import over_length_verdict
from kvgate.gates.max_tokens import cap_hit_verdict
from kvgate.gates.requests import min_tokens_verdict, route_timeout_verdict
from kvgate.http.client import Endpoint, KvClient, StreamReply
from kvgate.http.extensions import TOKEN_IDS, Extensions, used
from kvgate.http.probes import Exchange, send
from kvgate.http.prompts import token_id_prompt
from kvgate.http.tokenizers import identify
from kvgate.verdict import Status
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

MODEL = "fake-model"
STRICT_422 = "{\"detail\":\"Unexpected fields in the request: {'ignore_eos'}\"}"


class CountingClient(KvClient):
    """A KvClient that counts the generation requests it sends (the probes among them)."""

    sent = 0

    def post(self, path, body, **kw):
        self.sent += "completions" in path
        return super().post(path, body, **kw)


def client_for(fake: FakeVLLM, ext: Extensions | None) -> CountingClient:
    return CountingClient(Endpoint(fake.base_url, extensions=ext), timeout_s=5)


def body(**params):
    return {"model": MODEL, "prompt": "the kv cache", "temperature": 0, **params}


def test_strict_server_refusals_probed_once_and_quoted():
    ext = Extensions(MODEL)
    with FakeVLLM(FakeConfig(server="transformers-serve")) as fake, client_for(fake, ext) as c:
        first = ext.refusal(c, "ignore_eos")
        probes = c.sent
        assert ext.refusal(c, "ignore_eos") is first and c.sent == probes == 2  # with it 422, without it 200; once
        assert (first.status, first.reason) == (422, STRICT_422)
        assert ext.refusal(c, "min_tokens").describe() == (
            "the server refuses min_tokens (422: {\"detail\":\"Unexpected fields in the request: {'min_tokens'}\"})")
        assert ext.refusal(c, TOKEN_IDS).reason == '{"detail":"prompt must be a string."}'
    assert ext.summary()["refused"]["ignore_eos"] == {"param": "ignore_eos", "status": 422, "reason": STRICT_422}


def test_vllm_takes_every_extension_in_one_request_each():
    ext = Extensions(MODEL)
    with FakeVLLM(FakeConfig()) as fake, client_for(fake, ext) as c:
        for param in ("ignore_eos", "min_tokens", TOKEN_IDS):
            assert ext.refusal(c, param) is None
        assert c.sent == 3
    assert ext.summary() == {"probes": {"ignore_eos": "taken", "min_tokens": "taken", TOKEN_IDS: "taken"},
                             "refused": {}}


def test_only_the_well_formed_value_is_an_extension_use():
    """A hostile value (a security case's) is sent as it is, never adapted."""
    assert used(body(ignore_eos=True, min_tokens=4)) == ["ignore_eos", "min_tokens"]
    assert used(body(ignore_eos="yes", min_tokens=True)) == []
    assert used({"prompt": [1, 2], "stream_options": {"continuous_usage_stats": True}}) == [
        "stream_options.continuous_usage_stats", TOKEN_IDS]


def test_cap_hit_portable_pass_when_the_length_came_back():
    """ignore_eos refused: sent without it; 24 tokens before the fake's EOS at 48 -> measured PASS."""
    with FakeVLLM(FakeConfig(server="transformers-serve")) as fake, client_for(fake, Extensions(MODEL)) as c:
        ex = send(c, "completions", body(max_tokens=24, ignore_eos=True))
    assert "ignore_eos" not in ex.body and ex.dropped == ("ignore_eos",) and ex.reply.status == 200
    v = refused_verdict(cap_hit_verdict(ex, 24), ex)
    assert v.status is Status.PASS and v.evidence["refused_extensions"]["ignore_eos"]["status"] == 422


def test_cap_hit_skips_naming_the_refusal_when_eos_came_first():
    """Without ignore_eos the model ends at EOS after 8 tokens: the cap was never reached, so the
    case SKIPs naming ignore_eos and quoting the 422 -- where the unadapted verdict FAILs."""
    with FakeVLLM(FakeConfig(server="transformers-serve", eos_after=8)) as fake, \
            client_for(fake, Extensions(MODEL)) as c:
        ex = send(c, "completions", body(max_tokens=24, ignore_eos=True))
    assert cap_hit_verdict(ex, 24).status is Status.FAIL
    v = refused_verdict(cap_hit_verdict(ex, 24), ex)
    assert v.status is Status.SKIP, v.message
    assert v.message.startswith(f"the server refuses ignore_eos (422: {STRICT_422}); sent without it, the completions "
                                "generation ended 'stop' before its max_tokens 24"), v.message


def test_cap_ignored_still_fails_without_ignore_eos():
    """What came back decides: 24 + 8 tokens for max_tokens 24 FAILs, ignore_eos or not."""
    cfg = FakeConfig(server="transformers-serve", faults={"ignore_max_tokens"}, ignore_max_tokens_extra=8)
    with FakeVLLM(cfg) as fake, client_for(fake, Extensions(MODEL)) as c:
        ex = send(c, "completions", body(max_tokens=24, ignore_eos=True))
    v = refused_verdict(cap_hit_verdict(ex, 24), ex)
    assert v.status is Status.FAIL and "cap ignored" in v.message, v.message


def test_min_tokens_refused_skips_quoting_the_422_healthy_passes():
    for server, want in (("transformers-serve", Status.SKIP), ("vllm", Status.PASS)):
        with FakeVLLM(FakeConfig(server=server)) as fake, client_for(fake, Extensions(MODEL)) as c:
            ex = send(c, "chat", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "min_tokens": 8,
                                  "max_tokens": 16, "stop": ["\n"], "temperature": 0})
        v = refused_verdict(min_tokens_verdict(ex, 8, 16, None), ex)
        assert v.status is want, (server, v.message)
        if want is Status.SKIP:
            assert "the server refuses min_tokens (422:" in v.message and "'min_tokens'" in v.message
            assert "answered 422 -> SKIP" in v.message


def test_outside_a_run_nothing_is_probed_or_adapted():
    with FakeVLLM(FakeConfig(server="transformers-serve")) as fake, client_for(fake, None) as c:
        ex = send(c, "completions", body(max_tokens=4, ignore_eos=True))
    assert ex.reply.status == 422 and ex.refused == {} and c.sent == 1


# ---- over-length: the length refused, not the form --------------------------------------------------

def over_length(server: str) -> tuple[Exchange, Exchange]:
    """A 257-token and a 255-token token-id prompt on a max_model_len 256 fake."""
    with FakeVLLM(FakeConfig(server=server)) as fake, client_for(fake, Extensions(MODEL)) as c:
        long, short = token_id_prompt(257), token_id_prompt(255)
        return (send(c, "completions", long.body(MODEL, max_tokens=8), prompt_tokens=257),
                send(c, "completions", short.body(MODEL, max_tokens=1), prompt_tokens=255))


def test_over_length_refusal_of_the_form_is_not_a_pass():
    ex, control = over_length("transformers-serve")
    assert ex.reply.status == 400
    v = over_length_verdict(ex, 256, 5.0, control)
    assert v.status is Status.SKIP, v.message
    assert "but the same token-id prompt under the limit (255 tokens) was refused too (400: " \
           "{\"detail\":\"prompt must be a string.\"}): the server refuses the prompt's form, not its length" in v.message
    assert over_length_verdict(ex, 256, 5.0, None).status is Status.INVALID  # no control: not shown to be the length


def test_over_length_passes_once_the_form_is_served():
    ex, control = over_length("vllm")
    assert control.reply.status == 200
    v = over_length_verdict(ex, 256, 5.0, control)
    assert v.status is Status.PASS and v.evidence["control"] == {"prompt_tokens": 255, "status": 200}, v.message


# ---- route-timeout: too few tokens is not the server's FAIL -------------------------------------------

def test_route_timeout_with_one_token_is_invalid_not_fail():
    one = StreamReply(200, [(0.1, '{"choices":[{"index":0,"text":"a","finish_reason":"stop"}]}'), (0.2, "[DONE]")],
                      elapsed_s=0.2)
    v = route_timeout_verdict(Exchange("completions", True, {"max_tokens": 64}, one), 64, 60.0)
    assert v.status is Status.INVALID, v.message
    assert "the stream carried 1 token event (max_tokens 64; at least 2 needed to time ITL)" in v.message


# ---- what the server says it is -------------------------------------------------------------------

@pytest.mark.parametrize("server,name", [("transformers-serve", "HF transformers serve"), ("vllm", "vLLM"),
                                         ("llama-cpp-python", "llama-cpp-python")])
def test_server_named_from_what_it_says(server, name):
    with FakeVLLM(FakeConfig(server=server)) as fake, client_for(fake, None) as c:
        who = identify(c, MODEL)
    assert who.name == name and who.summary()["name"] == name
    assert (who.version is not None) == (server == "vllm")


def test_content_chunks_count_tokens_not_role_or_finish_chunks():
    """Without logprobs, tokens received are counted by the chunks carrying text: transformers serve's
    chat stream opens with a role-only chunk and ends with a finish-only chunk of empty text (measured
    2026-12-04: 24 tokens arrived in 26 chunks; kvgate had said "tokens received 26 ... must agree")."""
    from kvgate.http.stream import summarize

    chunk = '{"choices":[{"index":0,"delta":%s%s}],"object":"chat.completion.chunk"}'
    events = [chunk % ('{"role":"assistant"}', ""), chunk % ('{"content":"The"}', ""),
              chunk % ('{"content":" capital"}', ""), chunk % ('{"content":""}', ',"finish_reason":"length"'), "[DONE]"]
    s = summarize(StreamReply(200, [(0.1 * i, e) for i, e in enumerate(events)]))
    assert s.content_chunks == 2 and s.text == "The capital" and s.finish_reasons == ["length"]
