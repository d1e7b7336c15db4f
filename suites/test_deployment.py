"""Gate: the live deployment matches its profile (model, max_model_len, cache config, version), the
configuration it says it serves matches too (dtype, KV element size, chat template, ... from every
source there is), and, with --isvc, so does the KServe object that runs it (container args, GPUs,
memory limit, probe timeouts, route timeout, grace period)."""

import pytest

from kvgate.gates.deployment import NO_ISVC, SPEC, cache_config_verdict, max_model_len_verdict, memory_peak_verdict, \
    served_config_verdict, served_model_verdict, spec_verdict
from kvgate.http.health_sampler import HealthSampler
from kvgate.http.probes import observe_deployment, observe_served
from kvgate.launch.served import launched_config
from kvgate.run.health_watch import health_log, probe_limit
from kvgate.run.memory import observe_memory
from kvgate.run.session import ISVC_OBJECT
from kvgate.verdict import Status, Verdict

CHECKS = {
    "served-model": served_model_verdict,    # /v1/models lists the profile's served name
    "max-model-len": max_model_len_verdict,  # /v1/models and /tokenize advertise the profile's length
    "cache-config": cache_config_verdict,    # vllm:cache_config_info matches the stated cache settings
}
#: /health probes deployment/spec sends itself, one at a time (each waits at most 1.5 x the probe timeout).
SPEC_HEALTH_PROBES = 5


@pytest.fixture(scope="module")
def observation(kvgate_client, kvgate_profile):
    return observe_deployment(kvgate_client, kvgate_profile.model.served_name)


@pytest.mark.deployment
@pytest.mark.gate("deployment", cases=list(CHECKS))
def test_deployment_matches_profile(case, observation, kvgate_profile, kvgate_gate):
    assert kvgate_gate(CHECKS[case](observation, kvgate_profile)).passed


@pytest.mark.deployment
@pytest.mark.gate("deployment", cases=["served-config"])
def test_served_config_matches_profile(case, pytestconfig, observation, kvgate_client, kvgate_endpoint, kvgate_profile,
                                       kvgate_gate):
    """dtype, KV cache dtype and element size, max_model_len, quantization, block size, chat template, generation-config
    overrides: what the server says it runs -- its command line if kvgate launched it, the --isvc object's args,
    /server_info, /v1/models, /tokenize, vllm:cache_config_info -- against the profile."""
    served = observe_served(kvgate_client, kvgate_profile.model.served_name)  # /server_info, the probe's rendering
    launched = launched_config(kvgate_endpoint.server_argv, kvgate_endpoint.launched_by)  # None for --endpoint
    isvc = pytestconfig.stash.get(ISVC_OBJECT, None)
    assert kvgate_gate(served_config_verdict(observation, served, kvgate_profile, launched=launched, isvc=isvc)).passed


def no_isvc(config, profile, case):
    """The SKIP verdict without --isvc (the gate's ``not_applicable``)."""
    return Verdict(SPEC, Status.SKIP, NO_ISVC) if config.stash.get(ISVC_OBJECT, None) is None else None


@pytest.mark.deployment
@pytest.mark.gate("deployment", cases=["spec"], not_applicable=no_isvc)
def test_inference_service_matches_profile(case, pytestconfig, kvgate_client, kvgate_endpoint, kvgate_profile,
                                           kvgate_gate):
    obj = pytestconfig.stash.get(ISVC_OBJECT, None)
    samples, where = [], "no --isvc"
    if obj is not None:  # the /health latency the probes must outlast: under load if sampled already, and now
        samples = [s for s in health_log(pytestconfig).samples if s.route == "/health"]
        where = f"{len(samples)} under load and {SPEC_HEALTH_PROBES} idle in this run"
        sampler = HealthSampler(kvgate_endpoint, probe_limit(pytestconfig)[0], SPEC, client=kvgate_client)
        samples += [sampler.probe("/health") for _ in range(SPEC_HEALTH_PROBES)]
    assert kvgate_gate(spec_verdict(obj, kvgate_profile, samples, where)).passed


@pytest.mark.deployment
@pytest.mark.gate("deployment", cases=["memory-peak"])
def test_memory_limit_holds_the_measured_peak(case, pytestconfig, kvgate_client, kvgate_endpoint, kvgate_profile,
                                              kvgate_gate):
    """The container's memory limit (--isvc: the predictor's resources.limits.memory; else the profile's
    limits.container_memory_limit_gib) against the server's memory peak measured in this run -- its process tree
    while it loaded the model, and one reading now -- with limits.memory_peak_margin."""
    peaks, unseen = observe_memory(kvgate_endpoint, kvgate_client)
    obj = pytestconfig.stash.get(ISVC_OBJECT, None)
    assert kvgate_gate(memory_peak_verdict(peaks, obj, kvgate_profile, unseen)).passed
