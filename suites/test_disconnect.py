"""Gate: a client that hangs up frees its slot. After a disconnect mid-stream, before the first
token and mid-request (non-streamed), vllm:num_requests_running returns to its baseline well
before the request would have finished on its own, and a canary generation still succeeds."""

import pytest

from kvgate.gates.disconnect import disconnect_verdict
from kvgate.http.probes import DISCONNECT_CASES, decode_rate, disconnect


@pytest.fixture(scope="module")
def rate(kvgate_client, kvgate_profile):
    """The decode rate (or why it cannot be estimated) that tells a release from completion."""
    return decode_rate(kvgate_client, kvgate_profile.model.served_name)


@pytest.mark.disconnect
@pytest.mark.gate("disconnect", cases=list(DISCONNECT_CASES))
def test_hang_up_frees_slot(case, rate, kvgate_client, kvgate_profile, kvgate_gate):
    limits = kvgate_profile.limits
    longest = min(kvgate_profile.engine.max_model_len - 64, limits.max_tokens_cap or 10**9)
    obs = disconnect(kvgate_client, kvgate_profile.model.served_name, case, max_tokens=longest,
                     rate=rate, deadline_s=limits.disconnect_release_s)
    assert kvgate_gate(disconnect_verdict(obs, limits.disconnect_release_s)).passed
