"""Gate: the live deployment matches its profile (model, max_model_len, cache config, version)."""

import pytest

from kvgate.gates.deployment import cache_config_verdict, max_model_len_verdict, served_model_verdict
from kvgate.http.probes import observe_deployment

CHECKS = {
    "served-model": served_model_verdict,    # /v1/models lists the profile's served name
    "max-model-len": max_model_len_verdict,  # /v1/models and /tokenize advertise the profile's length
    "cache-config": cache_config_verdict,    # vllm:cache_config_info matches the stated cache settings
}


@pytest.fixture(scope="module")
def observation(kvgate_client, kvgate_profile):
    return observe_deployment(kvgate_client, kvgate_profile.model.served_name)


@pytest.mark.deployment
@pytest.mark.gate("deployment", cases=list(CHECKS))
def test_deployment_matches_profile(case, observation, kvgate_profile, kvgate_gate):
    assert kvgate_gate(CHECKS[case](observation, kvgate_profile)).passed
