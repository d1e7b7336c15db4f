"""Gate: streaming. TTFT within SLO; the longest silence below the gateway's idle timeout; exactly
one finish chunk then [DONE]; deltas concatenate to the non-streamed text (greedy, seeded); the
official openai SDK parses the stream; the content arrives as it is generated, not in one burst
after a proxy held it."""

import pytest

from kvgate.gates.streaming import (buffering_verdict, sdk_verdict, stream_framing_verdict, stream_idle_verdict,
                                    stream_text_verdict, stream_ttft_verdict)
from kvgate.http.probes import send
from kvgate.http.sdk import sdk_stream

APIS = ["completions", "chat"]
CHECKS = ["ttft", "idle-gap", "framing", "deltas", "openai-sdk", "buffering"]
PROMPT = "stream the kv cache blocks of the long sequence"


@pytest.fixture(scope="module")
def observed(kvgate_client, kvgate_endpoint, kvgate_profile):
    """Per API: one streamed request, the same request non-streamed, and the SDK's parse of it."""
    model = kvgate_profile.model.served_name
    n = min(64, kvgate_profile.limits.max_tokens_cap or 64)
    out = {}
    for api in APIS:
        body = {"model": model, "max_tokens": n, "temperature": 0, "seed": 0, "ignore_eos": True}
        body.update({"messages": [{"role": "user", "content": PROMPT}]} if api == "chat" else {"prompt": PROMPT})
        if api == "chat" and kvgate_profile.limits.chat_template_kwargs:  # the SDK request too, not only send()'s
            body["chat_template_kwargs"] = kvgate_profile.limits.chat_template_kwargs
        streamed = send(kvgate_client, api, {**body, "stream_options": {"include_usage": True}}, stream=True)
        plain = send(kvgate_client, api, body)
        out[api] = (streamed, plain, sdk_stream(kvgate_endpoint, api, body))
    return out


@pytest.mark.streaming
@pytest.mark.gate("streaming", cases=[f"{c}/{a}" for c in CHECKS for a in APIS])
def test_stream_conforms(case, observed, kvgate_profile, kvgate_gate):
    check, api = case.split("/")
    streamed, plain, sdk = observed[api]
    verdict = {
        "ttft": lambda: stream_ttft_verdict(streamed, kvgate_profile.slo.ttft_p95_ms),
        "idle-gap": lambda: stream_idle_verdict(streamed, kvgate_profile.limits.stream_idle_timeout_s),
        "framing": lambda: stream_framing_verdict(streamed),
        "deltas": lambda: stream_text_verdict(streamed, plain),
        "openai-sdk": lambda: sdk_verdict(api, sdk, plain),
        "buffering": lambda: buffering_verdict(streamed, plain),
    }[check]()
    assert kvgate_gate(verdict).passed
