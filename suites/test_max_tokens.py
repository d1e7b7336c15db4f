"""Gate: max_tokens caps. completion_tokens <= max_tokens with finish_reason "length" at the cap;
streamed usage == non-streamed usage == tokens received; the profile's cap enforced; under speculative
decoding, tokens delivered == usage.completion_tokens <= max_tokens == the engine's generation counter."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvgate.gates.common import refused_verdict
from kvgate.gates.max_tokens import cap_hit_verdict, over_cap_verdict, speculative_usage_verdict, stream_usage_verdict
from kvgate.http.probes import send
from kvgate.http.usage import observe_spec_usage
from kvgate.verdict import Status, Verdict

PROMPT = "the kv cache pool holds each block of the sequence"
APIS = ["completions", "chat"]


def body(api, model, **params):
    if api == "chat":
        return {"model": model, "messages": [{"role": "user", "content": PROMPT}], **params}
    return {"model": model, "prompt": PROMPT, **params}


def probe_tokens(profile):
    return min(24, profile.limits.max_tokens_cap or 24)


@pytest.fixture(scope="module")
def observed(kvgate_client, kvgate_profile):
    """Every probe of this gate at once (six jobs, each decode-bound: one after the other they took
    10.5 s on smollm2-cpu, 2026-12-04): per API, a cap-hit request of :func:`probe_tokens` tokens; the
    stream-usage pair (non-streamed, then the same streamed: usage and token counts are compared,
    not text); and, when the profile states a cap, a request for ``cap + 16`` tokens (each runs until
    the cap, a full-length decode). Keys ``cap-hit/API``, ``stream-usage/API`` (a pair),
    ``over-cap/API`` (None when no cap is stated)."""
    cap, n, model = kvgate_profile.limits.max_tokens_cap, probe_tokens(kvgate_profile), kvgate_profile.model.served_name

    def usage_pair(api):
        # completions logprobs 0: the sampled token's logprob only -- enough to count tokens, and allowed under any
        # --max-logprobs (a deployment that sets 0 to refuse prompt logprobs, as tiny-cpu-features does, passes)
        params = dict(max_tokens=n, temperature=0, seed=0, ignore_eos=True, logprobs=0 if api == "completions" else True)
        plain = send(kvgate_client, api, body(api, model, **params))
        return plain, send(kvgate_client, api, body(api, model, **params, stream_options={"include_usage": True}),
                           stream=True)

    jobs = {}
    for api in APIS:
        jobs[f"cap-hit/{api}"] = lambda api=api: send(kvgate_client, api, body(api, model, max_tokens=n, temperature=0,
                                                                               ignore_eos=True))
        jobs[f"stream-usage/{api}"] = lambda api=api: usage_pair(api)
        jobs[f"over-cap/{api}"] = lambda api=api: None if cap is None else send(
            kvgate_client, api, body(api, model, max_tokens=cap + 16, temperature=0, ignore_eos=True))
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.max_tokens
@pytest.mark.gate("max-tokens", cases=[f"cap-hit/{a}" for a in APIS])
def test_finish_length_at_cap(case, observed, kvgate_profile, kvgate_gate):
    exchange = observed[case]
    assert kvgate_gate(refused_verdict(cap_hit_verdict(exchange, probe_tokens(kvgate_profile)), exchange)).passed


@pytest.mark.max_tokens
@pytest.mark.gate("max-tokens", cases=[f"stream-usage/{a}" for a in APIS])
def test_streamed_usage_matches(case, observed, kvgate_profile, kvgate_gate):
    plain, streamed = observed[case]
    assert kvgate_gate(refused_verdict(stream_usage_verdict(plain, streamed, probe_tokens(kvgate_profile)),
                                       plain, streamed)).passed


@pytest.mark.max_tokens
@pytest.mark.gate("max-tokens", cases=[f"over-cap/{a}" for a in APIS])
def test_profile_cap_enforced(case, observed, kvgate_profile, kvgate_gate):
    limits = kvgate_profile.limits
    if observed[case] is None:
        kvgate_gate(Verdict(f"max-tokens/{case}", Status.SKIP, "profile states no max_tokens cap (limits.max_tokens_cap)"))
    assert kvgate_gate(refused_verdict(over_cap_verdict(observed[case], limits.max_tokens_cap, limits.over_cap),
                                       observed[case])).passed


def spec_probe_tokens(profile):
    """22 tokens (no multiple of a 2-, 3- or 4-token verify step, where an overshoot shows), within the cap."""
    return min(22, profile.limits.max_tokens_cap or 22)


@pytest.fixture(scope="module")
def speculative(kvgate_client, kvgate_profile):
    """Four probes between two idle /metrics scrapes (:func:`kvgate.http.usage.observe_spec_usage`);
    None, and nothing sent, when the profile declares no ``engine.speculative_config``."""
    if kvgate_profile.engine.speculative_config is None:
        return None
    return observe_spec_usage(kvgate_client, kvgate_profile.model.served_name, max_tokens=spec_probe_tokens(kvgate_profile),
                              clock=time.monotonic, sleep=time.sleep)


@pytest.mark.max_tokens
@pytest.mark.gate("max-tokens", cases=["speculative-usage"])
def test_speculative_usage_is_what_was_delivered(case, speculative, kvgate_profile, kvgate_gate):
    verdict = speculative_usage_verdict(speculative, kvgate_profile.engine.speculative_config)
    sent = [d.exchange for d in speculative.deliveries] if speculative is not None else []
    assert kvgate_gate(refused_verdict(verdict, sent)).passed
