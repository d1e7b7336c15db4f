"""Gate: streaming. TTFT within SLO; the longest silence below the gateway's idle timeout; exactly
one finish chunk then [DONE]; deltas concatenate to the non-streamed text (greedy, seeded); the
official openai SDK parses the stream; the content arrives as it is generated, not in one burst
after a proxy held it."""

import pytest

from kvgate.gates.streaming import (buffer_probe_tokens, buffering_verdict, event_bytes, sdk_verdict,
                                    stream_framing_verdict, stream_idle_verdict, stream_text_verdict,
                                    stream_ttft_verdict, undecided)
from kvgate.http.probes import send
from kvgate.http.sdk import sdk_stream

APIS = ["completions", "chat"]
CHECKS = ["ttft", "idle-gap", "framing", "deltas", "openai-sdk", "buffering"]
PROMPT = "stream the kv cache blocks of the long sequence"


@pytest.fixture(scope="module")
def observed(kvgate_client, kvgate_endpoint, kvgate_profile):
    """Per API: one streamed request, the same request non-streamed, the SDK's parse of it, and the
    buffering probe: the stream itself, or -- when it came bunched but not judged buffered
    (``undecided``) and the non-streamed request took less than BUFFER_PROBE_S -- one more stream
    asking for as many tokens as that rate makes in BUFFER_PROBE_S, and at least BUFFER_PROBE_BYTES
    of events (a fast server's 64-token answer fits one 16 KB proxy buffer in 0.4 s; the probe's
    fills four). A stream read as generated needs no probe: it rules a buffer out."""
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
        most = min(kvgate_profile.limits.max_tokens_cap or 4096, kvgate_profile.engine.max_model_len - 64)
        took = plain.reply.elapsed_s if plain.reply.status == 200 else None
        longer = buffer_probe_tokens(n, took, most, event_bytes(streamed.reply)) if undecided(streamed.reply) else None
        probe = (send(kvgate_client, api, {**body, "max_tokens": longer, "stream_options": {"include_usage": True}},
                      stream=True), None) if longer else (streamed, plain)
        out[api] = (streamed, plain, sdk_stream(kvgate_endpoint, api, body), probe)
    return out


@pytest.mark.streaming
@pytest.mark.gate("streaming", cases=[f"{c}/{a}" for c in CHECKS for a in APIS])
def test_stream_conforms(case, observed, kvgate_profile, kvgate_gate):
    check, api = case.split("/")
    streamed, plain, sdk, probe = observed[api]
    verdict = {
        "ttft": lambda: stream_ttft_verdict(streamed, kvgate_profile.slo.ttft_p95_ms),
        "idle-gap": lambda: stream_idle_verdict(streamed, kvgate_profile.limits.stream_idle_timeout_s),
        "framing": lambda: stream_framing_verdict(streamed),
        "deltas": lambda: stream_text_verdict(streamed, plain),
        "openai-sdk": lambda: sdk_verdict(api, sdk, plain),
        "buffering": lambda: buffering_verdict(*probe),
    }[check]()
    assert kvgate_gate(verdict).passed
