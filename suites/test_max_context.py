"""Gate: max context. A prompt of exactly max_model_len - max_tokens tokens completes; one of
max_model_len + 1 tokens is rejected 4xx quickly, streaming and not -- a rejection of the length, the
same prompt form under the limit having been served; the server stays healthy."""

import pytest

from kvgate.gates.common import refused_verdict
from kvgate.gates.health import canary_verdict
from kvgate.gates.max_context import fits_verdict, over_length_verdict
from kvgate.http.probes import build_prompt, canary, send, send_watched
from kvgate.verdict import Status, combine

OVER_LENGTH = ["completions", "completions-stream", "chat", "chat-stream"]


@pytest.fixture(scope="module")
def under_limit():
    """Per API: a request of the prompt form the over-length cases use, under the limit -- the
    max-context case's when it was answered, else one of max_model_len - 1 tokens the first over-length
    case sends (streamed, hung up at the status line: admitted or refused)."""
    return {}


@pytest.mark.max_context
@pytest.mark.gate("max-context", cases=["completions", "chat"])
def test_longest_prompt_completes(case, kvgate_client, kvgate_profile, kvgate_gate, under_limit):
    model, limit = kvgate_profile.model.served_name, kvgate_profile.engine.max_model_len
    max_tokens = kvgate_profile.limits.context_probe_max_tokens
    deadline = kvgate_profile.limits.request_timeout_s
    prompt = build_prompt(kvgate_client, model, case, limit - max_tokens)
    exchange, queue = send_watched(kvgate_client, case, prompt.body(model, max_tokens=max_tokens, temperature=0,
                                                                    ignore_eos=True),
                                   deadline_s=deadline, prompt_tokens=prompt.tokens)
    under_limit[case] = exchange
    assert kvgate_gate(refused_verdict(fits_verdict(exchange, limit, max_tokens, queue, deadline), exchange)).passed


@pytest.mark.max_context
@pytest.mark.gate("max-context", cases=[f"over-length/{c}" for c in OVER_LENGTH])
def test_over_length_rejected_and_server_healthy(case, kvgate_client, kvgate_profile, kvgate_gate, under_limit):
    api, _, mode = case.removeprefix("over-length/").partition("-")
    model, limit = kvgate_profile.model.served_name, kvgate_profile.engine.max_model_len
    limits = kvgate_profile.limits
    prompt = build_prompt(kvgate_client, model, api, limit + 1)
    known = under_limit.get(api)
    if known is None or not 200 <= known.reply.status < 500:
        # a 4xx counts as the length refused once the same form under the limit was admitted: sent
        # first (an over-length request that kills the engine must not take the control with it),
        # streamed and hung up at its status line (admitted or refused; no prefill waited for)
        short = build_prompt(kvgate_client, model, api, limit - 1)
        under_limit[api] = send(kvgate_client, api, short.body(model, max_tokens=1, temperature=0), stream=True,
                                prompt_tokens=short.tokens, admitted_only=True)
    exchange = send(kvgate_client, api, prompt.body(model, max_tokens=limits.context_probe_max_tokens, temperature=0),
                    stream=mode == "stream", prompt_tokens=prompt.tokens)
    rejected = over_length_verdict(exchange, limit, limits.reject_deadline_s, under_limit.get(api))
    if rejected.status is Status.SKIP:  # not measurable with this prompt form: no canary makes it a PASS
        kvgate_gate(rejected)
    after = canary(kvgate_client, model, limits.canary_deadline_s)
    assert kvgate_gate(combine(f"max-context/{case}", [
        rejected,
        canary_verdict(after, limits.canary_deadline_s, after=f"a {prompt.tokens:,}-token over-length request"),
    ])).passed
