"""Gate: max_tokens caps. completion_tokens <= max_tokens with finish_reason "length" at the cap;
streamed usage == non-streamed usage == tokens received; the profile's cap enforced."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from kvgate.gates.common import refused_verdict
from kvgate.gates.max_tokens import cap_hit_verdict, over_cap_verdict, stream_usage_verdict
from kvgate.http.probes import send
from kvgate.verdict import Status, Verdict

PROMPT = "the kv cache pool holds each block of the sequence"
APIS = ["completions", "chat"]


def body(api, model, **params):
    if api == "chat":
        return {"model": model, "messages": [{"role": "user", "content": PROMPT}], **params}
    return {"model": model, "prompt": PROMPT, **params}


def probe_tokens(profile):
    return min(24, profile.limits.max_tokens_cap or 24)


@pytest.mark.max_tokens
@pytest.mark.gate("max-tokens", cases=[f"cap-hit/{a}" for a in APIS])
def test_finish_length_at_cap(case, kvgate_client, kvgate_profile, kvgate_gate):
    api, n, model = case.split("/")[1], probe_tokens(kvgate_profile), kvgate_profile.model.served_name
    exchange = send(kvgate_client, api, body(api, model, max_tokens=n, temperature=0, ignore_eos=True))
    assert kvgate_gate(refused_verdict(cap_hit_verdict(exchange, n), exchange)).passed


@pytest.mark.max_tokens
@pytest.mark.gate("max-tokens", cases=[f"stream-usage/{a}" for a in APIS])
def test_streamed_usage_matches(case, kvgate_client, kvgate_profile, kvgate_gate):
    api, n, model = case.split("/")[1], probe_tokens(kvgate_profile), kvgate_profile.model.served_name
    # completions logprobs 0: the sampled token's logprob only -- enough to count tokens, and allowed under any
    # --max-logprobs (a deployment that sets 0 to refuse prompt logprobs, as tiny-cpu-features does, passes)
    params = dict(max_tokens=n, temperature=0, seed=0, ignore_eos=True, logprobs=0 if api == "completions" else True)
    plain = send(kvgate_client, api, body(api, model, **params))
    streamed = send(kvgate_client, api, body(api, model, **params, stream_options={"include_usage": True}), stream=True)
    assert kvgate_gate(refused_verdict(stream_usage_verdict(plain, streamed, n), plain, streamed)).passed


@pytest.fixture(scope="module")
def over_cap(kvgate_client, kvgate_profile):
    """Per API: a request for ``cap + 16`` tokens, both APIs sent at once (each runs until the cap,
    a full-length decode; concurrently they take the time of one). None when no cap is stated."""
    cap, model = kvgate_profile.limits.max_tokens_cap, kvgate_profile.model.served_name
    if cap is None:
        return None
    with ThreadPoolExecutor(max_workers=len(APIS)) as pool:
        futures = {api: pool.submit(send, kvgate_client, api,
                                    body(api, model, max_tokens=cap + 16, temperature=0, ignore_eos=True))
                   for api in APIS}
        return {api: f.result() for api, f in futures.items()}


@pytest.mark.max_tokens
@pytest.mark.gate("max-tokens", cases=[f"over-cap/{a}" for a in APIS])
def test_profile_cap_enforced(case, over_cap, kvgate_profile, kvgate_gate):
    api, limits = case.split("/")[1], kvgate_profile.limits
    if over_cap is None:
        kvgate_gate(Verdict(f"max-tokens/{case}", Status.SKIP, "profile states no max_tokens cap (limits.max_tokens_cap)"))
    assert kvgate_gate(refused_verdict(over_cap_verdict(over_cap[api], limits.max_tokens_cap, limits.over_cap),
                                       over_cap[api])).passed
