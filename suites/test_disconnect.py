"""Gate: a client that hangs up frees its slot. After a disconnect mid-stream, before the first
token and mid-request (non-streamed), vllm:num_requests_running returns to its baseline well
before the request would have finished on its own, and a canary generation still succeeds. After a
cancellation storm (cancellations before the first byte, mid-prefill, after the first token,
mid-decode) vllm:kv_cache_usage_perc returns to its baseline within a bound sized from the server's
own step, and a max-context prompt is admitted and completes."""

import pytest

from kvgate.gates.common import refused_verdict
from kvgate.gates.disconnect import disconnect_verdict, storm_verdict
from kvgate.gates.streaming import buffer_probe_tokens, event_bytes, undecided
from kvgate.http.probes import DISCONNECT_CASES, decode_rate, disconnect
from kvgate.load.storm import run_storm

PROBE_TOKENS = 32


@pytest.fixture(scope="module")
def rate(kvgate_client, kvgate_profile):
    """The decode rate (or why it cannot be estimated) that tells a release from completion. When
    the 32-token probe's events came bunched -- a client starved of CPU, or a proxy that buffers the
    stream; in front of a fast server a 16 KB buffer holds the whole probe -- a second probe sized
    like the streaming gate's buffering probe tells which: its buffer flushes name the proxy."""
    model = kvgate_profile.model.served_name
    first = decode_rate(kvgate_client, model, PROBE_TOKENS)
    r = first.reply
    if first.tps is not None or r is None or not first.bunched or not undecided(r):
        return first
    most = min(kvgate_profile.engine.max_model_len - 64, kvgate_profile.limits.max_tokens_cap or 10**9)
    longer = buffer_probe_tokens(PROBE_TOKENS, r.elapsed_s, most, event_bytes(r))
    return decode_rate(kvgate_client, model, longer) if longer else first


@pytest.mark.disconnect
@pytest.mark.gate("disconnect", cases=list(DISCONNECT_CASES))
def test_hang_up_frees_slot(case, rate, kvgate_client, kvgate_profile, kvgate_gate):
    limits = kvgate_profile.limits
    longest = min(kvgate_profile.engine.max_model_len - 64, limits.max_tokens_cap or 10**9)
    obs = disconnect(kvgate_client, kvgate_profile.model.served_name, case, max_tokens=longest,
                     rate=rate, deadline_s=limits.disconnect_release_s)
    assert kvgate_gate(disconnect_verdict(obs, limits.disconnect_release_s)).passed


@pytest.mark.disconnect
@pytest.mark.gate("disconnect", cases=["cancellation-storm"])
def test_cancellation_storm_frees_kv(case, kvgate_client, kvgate_endpoint, kvgate_profile, kvgate_gate):
    limits = kvgate_profile.limits
    obs = run_storm(kvgate_client, kvgate_endpoint, kvgate_profile.model.served_name,
                    max_model_len=kvgate_profile.engine.max_model_len, k=limits.storm_cancellations,
                    steps=limits.storm_release_steps, floor_s=limits.storm_release_floor_s,
                    canary_deadline_s=limits.canary_deadline_s, decode_tokens=min(32, limits.max_tokens_cap or 32))
    # a server that refuses the canary's form (a token-id prompt: transformers serve) SKIPs naming it
    assert kvgate_gate(refused_verdict(storm_verdict(obs), obs.canary)).passed
