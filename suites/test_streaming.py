"""Gate: streaming. TTFT within SLO; the longest silence below the gateway's idle timeout; exactly
one finish chunk then [DONE]; deltas concatenate to the non-streamed text (greedy, seeded); the
official openai SDK parses the stream; the content arrives as it is generated, not in one burst
after a proxy held it; a long-prefill stream's keepalives keep to the SSE grammar, three parsers read
it alike, and its data events come often enough for an idle timer that counts events."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from kvgate.gates.streaming import (buffer_probe_tokens, buffering_verdict, event_bytes, keepalive_verdict,
                                    sdk_verdict, stream_framing_verdict, stream_idle_verdict, stream_text_verdict,
                                    stream_ttft_verdict, undecided)
from kvgate.gates.common import refused_verdict
from kvgate.http.probes import build_prompt, portable_body, send, send_bytes
from kvgate.http.prompts import PromptUnavailable
from kvgate.http.sdk import sdk_stream
from kvgate.http.stream import read_keepalive

APIS = ["completions", "chat"]
CHECKS = ["ttft", "idle-gap", "framing", "deltas", "openai-sdk", "buffering"]
PROMPT = "stream the kv cache blocks of the long sequence"
#: The keepalive case's prompt starts so (no cached prefix), and asks this many tokens: the prefill is
#: what it reads; a few events after it are enough for the parsers to agree on.
KEEPALIVE_PREFIX = "keepalive probe: "
KEEPALIVE_TOKENS = 4


@pytest.fixture(scope="module")
def observed(kvgate_client, kvgate_endpoint, kvgate_profile):
    """Per API: one streamed request, the same request non-streamed, the SDK's parse of it, and the
    buffering probe: the stream itself, or -- when it came bunched but not judged buffered
    (``undecided``) and the non-streamed request took less than BUFFER_PROBE_S -- one more stream
    asking for as many tokens as that rate makes in BUFFER_PROBE_S, and at least BUFFER_PROBE_BYTES
    of events (a fast server's 64-token answer fits one 16 KB proxy buffer in 0.4 s; the probe's
    fills four). A stream read as generated needs no probe: it rules a buffer out.

    The two APIs' sequences run side by side (two requests in flight, within any declared
    concurrency), so each streamed request meets a batch like its non-streamed twin's: a decode-bound
    sequence of single streams took 11 s on smollm2-cpu, one after the other (2026-12-04)."""
    model = kvgate_profile.model.served_name
    n = min(64, kvgate_profile.limits.max_tokens_cap or 64)

    def one(api):
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
        return streamed, plain, sdk_stream(kvgate_endpoint, api, portable_body(kvgate_client, body)), probe

    with ThreadPoolExecutor(max_workers=len(APIS)) as pool:
        futures = {api: pool.submit(one, api) for api in APIS}
        return {api: f.result() for api, f in futures.items()}


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
    assert kvgate_gate(refused_verdict(verdict, streamed, plain, probe)).passed


@pytest.mark.streaming
@pytest.mark.gate("streaming", cases=["keepalive"])
def test_long_prefill_stream_keepalives(case, kvgate_client, kvgate_profile, kvgate_gate):
    """One chat stream of a max-context-length prompt (max_model_len - limits.context_probe_max_tokens
    tokens, the max-context gate's length: the longest prefill, where servers and gateways send
    keepalives) with its own first words (KEEPALIVE_PREFIX: the max-context gate's prompt is in the
    prefix cache, and a cached prefill is no wait), KEEPALIVE_TOKENS tokens, read byte for byte."""
    model, limits = kvgate_profile.model.served_name, kvgate_profile.limits
    try:
        prompt = build_prompt(kvgate_client, model, "chat", kvgate_profile.engine.max_model_len - limits.context_probe_max_tokens,
                              prefix=KEEPALIVE_PREFIX)
    except PromptUnavailable as exc:
        assert kvgate_gate(keepalive_verdict(None, limits.stream_idle_timeout_s, skip=str(exc))).passed
        return
    body = prompt.body(model, max_tokens=min(KEEPALIVE_TOKENS, limits.context_probe_max_tokens), temperature=0,
                       ignore_eos=True, stream_options={"include_usage": True})
    raw = send_bytes(kvgate_client, "chat", body, timeout_s=limits.request_timeout_s)
    read = read_keepalive("chat", raw, prompt.tokens)
    assert kvgate_gate(keepalive_verdict(read, limits.stream_idle_timeout_s)).passed
