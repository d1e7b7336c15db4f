"""deployment/spec (``--isvc``): the KServe object against the profile, field by field, on the
recorded objects in tests/data/kserve/ rendered from profiles/kserve-vllm-4k.yaml (serverless
InferenceService, RawDeployment, LLMInferenceService) -- PASS on each -- and on objects that drift
from it one field at a time (and all at once: spec-serverless-drifted.yaml); then through the
plugin with a fake CustomObjects API, so the verdict lands in summary.json."""

from __future__ import annotations

import pytest
import yaml

from kvgate.launch.vllm_args import load_snapshot
from kvgate.gates.deployment import HOST_PROCESS_BYTES, NO_ISVC, loading_peak, longest_stream_s, \
    parse_vllm_argv, spec_verdict
from kvgate.http.health_sampler import ProbeSample
from kvgate.kv.arithmetic import GiB
from kvgate.launch import kserve
from kvgate.launch.kserve import parse_duration_s, parse_quantity, serving_spec
from kvgate.profile.models import load_profile
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, read_summary
from .test_kserve import FakeApi

pytest_plugins = ["pytester"]
DATA = REPO / "tests" / "data" / "kserve"
ARGS = load_snapshot("0.32.0")


def load(name: str) -> dict:
    return yaml.safe_load((DATA / name).read_text())


@pytest.fixture(scope="module")
def profile():
    return load_profile("kserve-vllm-4k")


def verdict(obj, profile, health=None):
    return spec_verdict(obj, profile, health, "test", args=ARGS)


def part(v, name):
    return next(p for p in v.parts if p.gate == f"deployment/spec.{name}")


def health(*latencies_s):
    return [ProbeSample("/health", i * 0.25, s, 200, "test") for i, s in enumerate(latencies_s)]


def model(obj):
    return obj["spec"]["predictor"]["model"]


# ---------------------------------------------------------------------------- PASS on each shape
@pytest.mark.parametrize("name,shape", [("spec-serverless.yaml", "serverless"), ("spec-raw.yaml", "raw"),
                                        ("spec-llmisvc.yaml", "llmisvc")])
def test_each_recorded_shape_rendered_from_the_profile_passes(name, shape, profile):
    v = verdict(load(name), profile, health(0.004, 0.006, 0.005))
    assert v.status.value == "PASS", v.message
    assert [p.status.value for p in v.parts] == ["PASS"] * 6, [p.message for p in v.parts]
    assert f"({shape}, " in v.message and "args, gpu, memory, probes, timeout, grace checked" in v.message
    rows = {r["flag"]: r for r in part(v, "args").evidence["rows"]}
    assert rows["--max-num-seqs"]["actual"] == "32" and rows["--shutdown-timeout"]["expected"] == "30"


def test_without_isvc_it_skips_saying_why(profile):
    v = spec_verdict(None, profile)
    assert v.status.value == "SKIP" and v.message == NO_ISVC and "--isvc NAME --namespace NS" in v.message


# ---------------------------------------------------------------------------- FAIL, field by field
def test_too_small_memory_limit_fails_before_any_gpu_oom(profile):
    obj = load("spec-serverless.yaml")
    model(obj)["resources"]["limits"]["memory"] = "16Gi"
    v = verdict(obj, profile)
    assert v.status.value == "FAIL" and [p.gate for p in v.parts if p.status.value == "FAIL"] == ["deployment/spec.memory"]
    m = part(v, "memory")
    # 8.03e9 params x 2 B = 14.96 GiB, + API server, EngineCore, 1 worker x 1 GiB = 17.96 GiB
    assert m.message.startswith("memory limit 16.0 GiB (16Gi) < estimated loading peak 18.0 GiB (weights 15.0 GiB "
                                "(8.03B params x 2 B (bfloat16)) + 3 vLLM processes x 1.0 GiB"), m.message
    assert "OOMKilled while loading, before any GPU OOM" in m.message
    assert m.measured == 16 * GiB and m.limit == pytest.approx(8.03e9 * 2 + 3 * HOST_PROCESS_BYTES, abs=1) and m.unit == "bytes"
    assert "disagrees with profile kserve-vllm-4k in memory" in v.message


def test_short_grace_period_fails_naming_prestop_and_drain(profile):
    obj = load("spec-serverless.yaml")
    del obj["spec"]["predictor"]["terminationGracePeriodSeconds"]  # Kubernetes' 30 s
    g = part(verdict(obj, profile), "grace")
    assert g.status.value == "FAIL", g.message
    assert g.message.startswith("terminationGracePeriodSeconds 30 s (spec.predictor.terminationGracePeriodSeconds "
                                "unset: Kubernetes' default 30 s) < preStop sleep 15 s"), g.message
    assert "+ rollout.drain_timeout_s 30 s = 45 s" in g.message and (g.measured, g.limit) == (30.0, 45.0)
    obj["spec"]["predictor"]["terminationGracePeriodSeconds"] = 45
    assert part(verdict(obj, profile), "grace").status.value == "PASS"


def test_grace_without_rollout_section_skips(profile):
    bare = profile.model_copy(update={"rollout": None})
    g = part(verdict(load("spec-serverless.yaml"), bare), "grace")
    assert g.status.value == "SKIP" and "no rollout: section" in g.message


def test_probe_timeouts_below_the_measured_health_latency_fail(profile):
    obj = load("spec-serverless.yaml")
    for probe in ("readinessProbe", "livenessProbe"):
        model(obj)[probe]["timeoutSeconds"] = 2
    lenient = profile.model_copy(update={"limits": profile.limits.model_copy(update={"probe_timeout_s": 1.0})})
    assert part(verdict(obj, lenient, health(0.01, 0.02)), "probes").status.value == "PASS"
    p = part(verdict(obj, lenient, health(0.01, 2.4, 0.02)), "probes")
    assert p.status.value == "FAIL", p.message
    assert ("readinessProbe.timeoutSeconds 2 s <= measured /health latency 2.40 s (slowest of 3 /health probes, test)"
            in p.message) and "livenessProbe.timeoutSeconds 2 s <= measured" in p.message
    assert (p.measured, p.limit) == (2.0, 2.4)


def test_probe_timeout_below_the_profile_and_unset_default(profile):
    obj = load("spec-serverless.yaml")
    del model(obj)["readinessProbe"]["timeoutSeconds"]  # Kubernetes' 1 s
    p = part(verdict(obj, profile), "probes")
    assert p.status.value == "FAIL"
    assert "readinessProbe.timeoutSeconds 1 s (unset: Kubernetes' default) < profile limits.probe_timeout_s 5 s" \
        in p.message and "livenessProbe" not in p.message
    del model(obj)["readinessProbe"], model(obj)["livenessProbe"]
    assert part(verdict(obj, profile), "probes").status.value == "SKIP"


def test_args_that_differ_from_the_profile_fail_flag_by_flag(profile):
    obj = load("spec-serverless.yaml")
    args = model(obj)["args"]
    args[args.index("--max-num-seqs=32")] = "--max-num-seqs=64"
    args.remove("--gpu-memory-utilization=0.90")
    args.remove("--shutdown-timeout=30")
    args.append("--enforce-eager")  # engine.enforce_eager is false
    a = part(verdict(obj, profile), "args")
    assert a.status.value == "FAIL"
    assert "--max-num-seqs expected 32 (engine.max_num_seqs), actual 64" in a.message
    assert "--gpu-memory-utilization expected 0.9 (engine.gpu_memory_utilization), absent from the spec " \
           "(vLLM's default: 0.92)" in a.message
    assert "--shutdown-timeout expected 30 (rollout.drain_timeout_s), absent from the spec (vLLM's default: 0)" \
        in a.message
    assert "--enforce-eager expected vLLM's default off (engine.enforce_eager), actual on" in a.message
    assert (a.measured, a.limit) == ("64", "32")
    assert a.evidence["kserve_runtime_args"] == ["--model_name", "--backend"]


def test_absent_flag_with_the_same_default_passes_and_device_defaults_do_not(profile):
    obj = load("spec-serverless.yaml")
    model(obj)["args"].remove("--max-num-seqs=32")
    a = part(verdict(obj, profile), "args")
    assert "--max-num-seqs expected 32 (engine.max_num_seqs), absent from the spec (vLLM's default: by device)" \
        in a.message
    # kv_cache_dtype auto and tensor_parallel_size 1 render nothing: nothing to find in the spec
    assert {r["flag"] for r in part(verdict(load("spec-serverless.yaml"), profile), "args").evidence["rows"]} == {
        "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization", "--dtype",
        "--shutdown-timeout"}


def test_gpu_requests_must_equal_limits_and_the_count(profile):
    obj = load("spec-serverless.yaml")
    model(obj)["resources"]["limits"]["nvidia.com/gpu"] = "2"
    g = part(verdict(obj, profile), "gpu")
    assert g.status.value == "FAIL" and "nvidia.com/gpu limits 2, requests 1; profile hardware.count 1" in g.message
    del model(obj)["resources"]["requests"]["nvidia.com/gpu"]
    model(obj)["resources"]["limits"]["nvidia.com/gpu"] = 1  # a request defaults to the limit
    assert part(verdict(obj, profile), "gpu").status.value == "PASS"
    del model(obj)["resources"]["limits"]["nvidia.com/gpu"]
    g = part(verdict(obj, profile), "gpu")
    assert g.status.value == "FAIL" and "limits 0 (unset)" in g.message


def test_a_quantity_kubernetes_would_refuse_fails_naming_it(profile):
    obj = load("spec-serverless.yaml")
    model(obj)["resources"]["limits"]["memory"] = "lots"
    m = part(verdict(obj, profile), "memory")
    assert m.status.value == "FAIL" and "limits.memory: 'lots' is not a Kubernetes quantity" in m.message


def test_revision_timeout_shorter_than_the_longest_stream_fails(profile):
    longest, words = longest_stream_s(profile)
    assert longest == pytest.approx(512 * 0.060 + 1.5)  # cap x slo.itl_p95_ms + slo.ttft_p95_ms = 32.2 s
    obj = load("spec-serverless.yaml")
    obj["spec"]["predictor"]["timeout"] = 30
    t = part(verdict(obj, profile), "timeout")
    assert t.status.value == "FAIL" and t.message.startswith("route timeout 30 s (spec.predictor.timeout 30 s) < the SLO "
                                                             "budget of the longest stream the profile allows, 512 tokens"), t.message
    # a budget, said so: n x a gap p95 is no bound on a sum of n gaps (the measured stream is requests/route-timeout's)
    assert "x the ITL limit 60 ms (slo.itl_p95_ms)" in t.message and "= 32.2 s, an SLO budget, not a measurement" in t.message
    assert "a p95 of gaps bounds no sum of gaps" in words and t.evidence["longest_stream_kind"].startswith("SLO budget")
    del obj["spec"]["predictor"]["timeout"]
    t = part(verdict(obj, profile), "timeout")
    assert t.status.value == "PASS" and "Knative's revision timeoutSeconds default 300 s" in t.message
    declared = profile.model_copy(update={"limits": profile.limits.model_copy(update={"route_timeout_s": 600.0})})
    t = part(verdict(obj, declared), "timeout")
    assert t.status.value == "FAIL" and "< profile limits.route_timeout_s 600 s" in t.message


def test_route_timeouts_of_raw_and_llmisvc(profile):
    raw = load("spec-raw.yaml")
    del raw["spec"]["predictor"]["timeout"]
    assert serving_spec(raw).timeout_s == 60.0 and "HTTPRoute default 60 s" in serving_spec(raw).timeout_where
    llm = load("spec-llmisvc.yaml")
    llm["spec"]["router"]["route"]["http"]["spec"]["rules"][0]["timeouts"]["request"] = "20s"
    t = part(verdict(llm, profile), "timeout")
    assert t.status.value == "FAIL" and "route timeout 20 s (spec.router.route.http.spec.rules[].timeouts.request 20s)" \
        in t.message
    llm["spec"]["router"]["route"]["http"]["spec"]["rules"][0]["timeouts"]["request"] = "0s"
    assert part(verdict(llm, profile), "timeout").status.value == "PASS"  # 0s: no timeout
    llm["spec"]["router"]["route"]["http"] = {"refs": [{"name": "my-route"}]}
    assert part(verdict(llm, profile), "timeout").status.value == "SKIP"


def test_the_recorded_drifted_object_fails_every_drifted_field(profile):
    v = verdict(load("spec-serverless-drifted.yaml"), profile, health(0.01, 1.3))
    failed = [p.gate.rsplit(".", 1)[1] for p in v.parts if p.status.value == "FAIL"]
    assert failed == ["args", "memory", "probes", "grace"], [p.message for p in v.parts]
    assert v.message.startswith("InferenceService models/llama (serverless, spec.predictor.model) disagrees with "
                                "profile kserve-vllm-4k in args, memory, probes, grace: ")
    for words in ("--max-num-seqs expected 32 (engine.max_num_seqs), actual 64", "memory limit 16.0 GiB (16Gi) <",
                  "readinessProbe.timeoutSeconds 1 s < profile limits.probe_timeout_s 5 s",
                  "<= measured /health latency 1.30 s", "terminationGracePeriodSeconds 30 s"):
        assert words in v.message, (words, v.message)
    summary = v.to_summary()
    assert [c["status"] for c in summary["checks"]] == ["FAIL", "PASS", "FAIL", "FAIL", "PASS", "FAIL"]


# ---------------------------------------------------------------------------- reading
def test_parser_reads_vllm_and_kserve_spellings():
    p = parse_vllm_argv(["--max_model_len", "4096", "--dtype=bfloat16", "--no-enable-prefix-caching", "-tp", "2",
                         "--lora-modules", "a=/x", "b=/y", "--model_id", "meta/x", "--enforce-eager"], ARGS)
    assert p.values["max_model_len"] == ("--max_model_len", "4096")
    assert p.values["enable_prefix_caching"][1] is False and p.values["enforce_eager"][1] is True
    assert p.values["tensor_parallel_size"] == ("-tp", "2") and p.values["lora_modules"][1] == ["a=/x", "b=/y"]
    assert p.unknown == ("--model_id",)
    script = parse_vllm_argv(["/bin/bash", "-c", "vllm serve /mnt/models --port 8000 --max-num-seqs 16 "
                              "--override-generation-config '{\"max_new_tokens\": 512}'"], ARGS)
    assert script.values["max_num_seqs"][1] == "16" and script.values["port"][1] == "8000"
    assert script.values["override_generation_config"][1] == '{"max_new_tokens": 512}'


def test_serving_spec_defaults_and_units():
    obj = load("spec-serverless.yaml")
    s = serving_spec(obj)
    assert (s.shape, s.grace_s, s.prestop_s, s.timeout_s) == ("serverless", 60.0, 15.0, 600.0)
    assert s.probes == {"livenessProbe": 5.0, "readinessProbe": 5.0}
    model(obj)["lifecycle"]["preStop"] = {"exec": {"command": ["sh", "-c", "sleep 20 && kill -USR1 1"]}}
    assert serving_spec(obj).prestop_s == 20.0
    model(obj)["lifecycle"]["preStop"] = {"httpGet": {"path": "/drain", "port": 8080}}
    assert serving_spec(obj).prestop_s == 0.0 and "not a sleep" in serving_spec(obj).prestop_where
    assert serving_spec(load("spec-llmisvc.yaml")).tensor == 1
    assert parse_quantity("32Gi") == 32 * GiB and parse_quantity("500m") == 0.5 and parse_quantity(2) == 2.0
    assert parse_quantity("64G") == 64e9
    assert parse_duration_s("1h30m") == 5400 and parse_duration_s("500ms") == 0.5 and parse_duration_s("10m") == 600
    with pytest.raises(ValueError, match="'lots' is not a Kubernetes quantity"):
        parse_quantity("lots")
    with pytest.raises(ValueError, match="'soon' is not a duration"):
        parse_duration_s("soon")


def test_loading_peak_scales_with_tensor_parallel_workers(profile):
    one, _, terms = loading_peak(profile)
    four, words, _ = loading_peak(profile, tensor=4)
    assert four - one == 3 * HOST_PROCESS_BYTES and terms["processes"] == 3 and "4 workers" in words


# ---------------------------------------------------------------------------- through the plugin
def run_spec(pytester, monkeypatch, fake, objects: list[dict] | None):
    reports = pytester.path / "reports"
    target = ["--isvc", "llama", "--namespace", "models", "--ingress", fake.base_url]
    if objects is None:
        target = [f"--endpoint={fake.base_url}/openai/v1"]
    else:
        api = FakeApi(objects)
        monkeypatch.setattr(kserve, "custom_objects_api", lambda: api)
    result = pytester.runpytest_inprocess(
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
        f"--kvgate-reports={reports}", "--profile=kserve-vllm-4k", *target,
        str(REPO / "suites" / "test_deployment.py") + "::test_inference_service_matches_profile")
    summary = read_summary(reports)
    return result, {g["id"]: g for g in summary["gates"]}["kserve-vllm-4k/deployment/spec"]


def test_isvc_spec_verdict_in_summary_json(pytester, monkeypatch):
    with FakeVLLM(FakeConfig(served_name="llama-3-1-8b-instruct", max_model_len=4096)) as fake:
        result, gate = run_spec(pytester, monkeypatch, fake, [load("spec-serverless.yaml")])
        assert gate["status"] == "PASS" and result.ret == 0, gate["message"]
        assert [c["gate"] for c in gate["checks"]] == [f"deployment/spec.{c}" for c in
                                                       ("args", "gpu", "memory", "probes", "timeout", "grace")]
        probes = gate["evidence"]["deployment/spec.probes"]["evidence"]
        assert probes["health_samples"] == 5 and probes["health_max_s"] < 5.0  # measured on the fake in this run

        result, gate = run_spec(pytester, monkeypatch, fake, [load("spec-serverless-drifted.yaml")])
        assert gate["status"] == "FAIL" and result.ret == 1
        assert "disagrees with profile kserve-vllm-4k in args, memory, probes, grace" in gate["message"]

        result, gate = run_spec(pytester, monkeypatch, fake, None)  # --endpoint: no --isvc
        assert gate["status"] == "SKIP" and gate["message"] == NO_ISVC and result.ret == 0


@pytest.mark.parametrize("field,value", [("args", "--max-num-seqs 8"), ("resources", "big"),
                                         ("livenessProbe", {"timeoutSeconds": "abc"})])
def test_a_malformed_object_is_a_fail_naming_the_error_not_a_traceback(profile, field, value):
    """Shapes the API server's schema would refuse (found by a newcomer): one FAIL line, no exception."""
    obj = load("spec-serverless.yaml")
    model(obj)[field] = value
    v = verdict(obj, profile)
    assert v.status.value == "FAIL" and "cannot be read as a deployment" in v.message, v.message
