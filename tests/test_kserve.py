"""KServe pre-canary targets (kvgate.launch.kserve) on recorded objects of each shape --
serverless with tag routing on and off, RawDeployment named canaries, LLMInferenceService routing
groups at weight 0 -- and the /openai/v1 + no-/tokenize path end to end against a fake that mimics
KServe's Hugging Face runtime (routes under /openai/v1, /tokenize 404): exact prompts still exact
(token ids on /completions, the profile's local tokenizer for chat), what cannot be checked SKIPs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from kvgate.launch import kserve
from kvgate.launch.kserve import KServeError, discover, discover_baseline
from kvgate.http.prompts import PromptUnavailable, local_counter, token_id_prompt
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, read_summary

pytest_plugins = ["pytester"]
DATA = REPO / "tests" / "data" / "kserve"
FAKE_PROFILE = REPO / "tests" / "data" / "fake-vllm.yaml"


def load(name: str) -> dict:
    return yaml.safe_load((DATA / name).read_text())


# ---------------------------------------------------------------------------- discovery per shape
def test_serverless_tag_routing_gates_the_latest_url():
    t = discover(load("serverless-tagged.yaml"))
    assert (t.shape, t.revision, t.percent) == ("serverless", "llama-predictor-00002", 0.0)
    assert t.url == "https://latest-llama-predictor.models.example.com" and t.host_header is None
    assert t.route_prefix == "/openai/v1"  # KServe's Hugging Face runtime
    assert t.endpoint_url == "https://latest-llama-predictor.models.example.com/openai/v1"


def test_serverless_through_the_ingress_sends_the_tag_host():
    t = discover(load("serverless-tagged.yaml"), ingress="http://127.0.0.1:8080")
    assert t.url == "http://127.0.0.1:8080" and t.host_header == "latest-llama-predictor.models.example.com"
    assert any("with Host latest-llama-predictor" in n for n in t.notes)


def test_serverless_without_tag_routing_uses_the_revision_service():
    t = discover(load("serverless-untagged.yaml"))
    assert t.revision == "llama-predictor-00003" and t.percent == 10.0
    assert t.url == "http://llama-predictor-00003.models.svc.cluster.local" and t.route_prefix == "/openai/v1"
    assert any("tag routing off" in n for n in t.notes) and any("canaryTrafficPercent 10" in n for n in t.notes)


def test_serverless_fully_rolled_out_has_nothing_to_gate():
    obj = load("serverless-untagged.yaml")
    obj["status"]["components"]["predictor"]["traffic"] = [
        {"revisionName": "llama-predictor-00003", "percent": 100, "latestRevision": True}]
    with pytest.raises(KServeError, match="already takes 100% of the traffic; nothing to gate"):
        discover(obj)


def test_raw_deployment_gates_the_canary_at_zero():
    t = discover(load("raw-canaries.yaml"))
    assert (t.shape, t.revision, t.percent) == ("raw-canary", "v3", 0.0)
    assert t.url == "http://llama-v3-predictor.models.svc.cluster.local" and t.route_prefix == "/v1"
    named = discover(load("raw-canaries.yaml"), canary="v2")
    assert named.url == "http://llama-v2-predictor.models.svc.cluster.local"
    assert any("already takes 20%" in n for n in named.notes)
    with pytest.raises(KServeError, match="no canary 'v9'; canaries: v2, v3"):
        discover(load("raw-canaries.yaml"), canary="v9")
    two_idle = load("raw-canaries.yaml")
    two_idle["spec"]["canary"][0]["trafficPercent"] = 0
    with pytest.raises(KServeError, match="2 canaries at trafficPercent 0 .*name one with --canary"):
        discover(two_idle)


def test_llmisvc_group_member_at_weight_zero():
    items = load("llmisvc-group.yaml")["items"]
    by_name = {o["metadata"]["name"]: o for o in items}
    for named in ("llama-v2", "llama-v1"):  # members are symmetric: naming either finds the one at 0
        t = discover(by_name[named], siblings=items)
        assert (t.shape, t.revision, t.route_prefix) == ("llmisvc-group", "llama-v2", "/v1")
        assert t.url == "http://llama-v2-kserve-workload-svc.models.svc.cluster.local:8000"
    crowded = copy.deepcopy(items)
    crowded[0]["spec"]["router"]["route"]["weight"] = 0
    crowded[1]["spec"]["router"]["route"]["weight"] = 50
    crowded.append({**copy.deepcopy(items[1]), "metadata": {"name": "llama-v3", "namespace": "models"}})
    crowded[-1]["spec"]["router"]["route"]["weight"] = 0
    with pytest.raises(KServeError, match="group 'llama' has 2 members at weight 0"):
        discover(crowded[1], siblings=crowded)


# ---------------------------------------------------------------------------- the baseline per shape
def test_baseline_serverless_tagged_is_the_prev_revision():
    t = discover_baseline(load("serverless-tagged.yaml"))
    assert (t.shape, t.revision, t.percent) == ("serverless-prev", "llama-predictor-00001", 100.0)
    assert t.url == "https://prev-llama-predictor.models.example.com" and t.host_header is None
    assert t.endpoint_url == "https://prev-llama-predictor.models.example.com/openai/v1"
    assert any("previous revision llama-predictor-00001" in n for n in t.notes)
    via = discover_baseline(load("serverless-tagged.yaml"), ingress="http://127.0.0.1:8080")
    assert via.url == "http://127.0.0.1:8080" and via.host_header == "prev-llama-predictor.models.example.com"
    assert via.host_header != discover(load("serverless-tagged.yaml"), ingress="http://127.0.0.1:8080").host_header


def test_baseline_serverless_untagged_uses_the_revision_service():
    t = discover_baseline(load("serverless-untagged.yaml"), ingress="http://127.0.0.1:8080")
    assert (t.shape, t.revision, t.percent) == ("serverless-prev", "llama-predictor-00002", 90.0)
    assert t.url == "http://llama-predictor-00002.models.svc.cluster.local" and t.host_header is None
    assert t.route_prefix == "/openai/v1"


def test_baseline_serverless_fully_rolled_out_has_none():
    obj = load("serverless-untagged.yaml")
    obj["status"]["components"]["predictor"]["traffic"] = [
        {"revisionName": "llama-predictor-00003", "percent": 100, "latestRevision": True}]
    with pytest.raises(KServeError, match="no previous revision serving traffic .*pass --baseline URL"):
        discover_baseline(obj)
    drained = load("serverless-tagged.yaml")  # previous revision still listed, but at 0%
    drained["status"]["components"]["predictor"]["traffic"][0]["percent"] = 0
    with pytest.raises(KServeError, match="no previous revision serving traffic"):
        discover_baseline(drained)


def test_baseline_raw_deployment_is_the_main_predictor():
    t = discover_baseline(load("raw-canaries.yaml"))
    assert (t.shape, t.revision, t.percent) == ("raw-main", "llama-predictor", 80.0)  # 100 - v2's 20 - v3's 0
    assert t.url == "http://llama-predictor.models.svc.cluster.local" and t.route_prefix == "/v1"
    assert t.url != discover(load("raw-canaries.yaml")).url


def test_baseline_llmisvc_group_is_the_serving_member():
    items = load("llmisvc-group.yaml")["items"]
    for named in items[:2]:  # from either member of the group
        t = discover_baseline(named, siblings=items)
        assert (t.shape, t.revision, t.percent, t.route_prefix) == ("llmisvc-serving", "llama-v1", 100.0, "/v1")
        assert t.url == "http://llama-v1-kserve-workload-svc.models.svc.cluster.local:8000"
    split = copy.deepcopy(items)
    split[0]["spec"]["router"]["route"]["weight"] = 25
    split.append({**copy.deepcopy(items[0]), "metadata": {"name": "llama-v0", "namespace": "models"},
                  "status": {"url": "https://llama-v0.models.example.com"}})
    split[-1]["spec"]["router"]["route"]["weight"] = 75
    t = discover_baseline(split[1], siblings=split)
    assert (t.revision, t.percent, t.url) == ("llama-v0", 75.0, "https://llama-v0.models.example.com")
    assert any("llama-v1 25" in n for n in t.notes)


def test_baseline_llmisvc_group_with_no_serving_member():
    items = load("llmisvc-group.yaml")["items"]
    idle = copy.deepcopy(items)
    idle[0]["spec"]["router"]["route"]["weight"] = 0
    with pytest.raises(KServeError, match="no member of group 'llama' serves traffic .*pass --baseline URL"):
        discover_baseline(idle[1], siblings=idle)
    with pytest.raises(KServeError, match="group 'other'"):
        discover_baseline(items[2], siblings=items)


class FakeApi:
    """CustomObjectsApi over the recorded objects; ``deny`` answers 403."""

    def __init__(self, objects: list[dict], deny: bool = False):
        self.objects, self.deny, self.calls = objects, deny, []

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        from kubernetes.client.exceptions import ApiException

        self.calls.append((group, version, plural, name))
        if self.deny:
            raise ApiException(status=403, reason="Forbidden")
        kind = {"inferenceservices": "InferenceService", "llminferenceservices": "LLMInferenceService"}[plural]
        for o in self.objects:
            if o.get("kind") == kind and o["metadata"]["name"] == name and o["metadata"]["namespace"] == namespace:
                return copy.deepcopy(o)
        raise ApiException(status=404, reason="Not Found")

    def list_namespaced_custom_object(self, group, version, namespace, plural):
        return {"items": [copy.deepcopy(o) for o in self.objects if o.get("kind") == "LLMInferenceService"]}


def test_read_finds_either_kind_and_names_rbac_trouble():
    items = load("llmisvc-group.yaml")["items"]
    obj, siblings = kserve.read("llama-v1", "models", FakeApi(items))
    assert obj["kind"] == "LLMInferenceService" and len(siblings) == 3
    obj, siblings = kserve.read("llama", "models", FakeApi([load("raw-canaries.yaml")]))
    assert obj["kind"] == "InferenceService" and siblings == []
    with pytest.raises(KServeError, match="no InferenceService or LLMInferenceService models/nope"):
        kserve.read("nope", "models", FakeApi(items))
    with pytest.raises(KServeError, match="HTTP 403 .*RBAC"):
        kserve.read("llama", "models", FakeApi(items, deny=True))


# ---------------------------------------------------------------------------- prompts without /tokenize
def test_token_id_prompt_is_exact_and_distinct_per_prefix():
    a, b = token_id_prompt(300, seed="req 1: "), token_id_prompt(300, seed="req 2: ")
    assert a.tokens == len(a.token_ids) == 300 and a.body("m", max_tokens=1)["prompt"] == list(a.token_ids)
    assert a.token_ids[:8] != b.token_ids[:8]


def test_local_counter_counts_like_the_fake(tmp_path):
    pytest.importorskip("transformers")
    from tests.fakes import fake_tokenizer

    path = fake_tokenizer.build(tmp_path / "tok")
    count = local_counter(str(path), "chat")
    assert count("the kv cache") == 1 + 1 + 3 + 1  # <s> <|user|> 3 words <|assistant|>, as the fake renders
    with pytest.raises(PromptUnavailable, match="model.tokenizer '/nonexistent' cannot be loaded"):
        local_counter("/nonexistent", "chat")


# ---------------------------------------------------------------------------- end to end (pytester)
def kserve_profile(tmp_path: Path, tokenizer: Path | None) -> Path:
    path = tmp_path / "kserve-fake.yaml"
    model = f"\n  tokenizer: {tokenizer}" if tokenizer else ""
    path.write_text(f"extends: {FAKE_PROFILE}\nmodel:\n  served_name: fake-model{model}\n")
    return path


def run_isvc(pytester, monkeypatch, fake, profile: Path):
    api = FakeApi([load("serverless-tagged.yaml")])
    monkeypatch.setattr(kserve, "custom_objects_api", lambda: api)
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
        f"--kvgate-reports={reports}", f"--profile={profile}", "--isvc", "llama", "--namespace", "models",
        "--ingress", fake.base_url, str(REPO / "suites" / "test_max_context.py"))
    return result, read_summary(reports)


def test_isvc_through_ingress_without_tokenize(pytester, monkeypatch, tmp_path):
    """KServe's HF runtime: /openai/v1, no /tokenize. Completions max-context prompts are exact
    token-id prompts and PASS; chat ones SKIP naming why (no model.tokenizer)."""
    with FakeVLLM(FakeConfig(max_tokens_cap=64, faults={"no_tokenize"})) as fake:
        result, summary = run_isvc(pytester, monkeypatch, fake, kserve_profile(tmp_path, None))
        assert summary["endpoint"] == f"{fake.base_url}/openai/v1"
    gates = {g["id"]: g for g in summary["gates"]}
    assert "KServe serverless models/llama: gating llama-predictor-00002" in result.stdout.str()
    assert gates["kserve-fake/max-context/completions"]["status"] == "PASS", gates["kserve-fake/max-context/completions"]
    assert gates["kserve-fake/max-context/over-length/completions"]["status"] == "PASS"
    for api in ("chat", "over-length/chat", "over-length/chat-stream"):
        g = gates[f"kserve-fake/max-context/{api}"]
        assert g["status"] == "SKIP" and "has no tokenize endpoint (/tokenize 404, /extras/tokenize 404)" in g["message"] \
            and "model.tokenizer" in g["message"], g
    assert result.ret == 0 and summary["outcome"] == "PASS"


def test_isvc_chat_exact_with_the_profiles_tokenizer(pytester, monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    from tests.fakes import fake_tokenizer

    tok = fake_tokenizer.build(tmp_path / "tok")
    with FakeVLLM(FakeConfig(max_tokens_cap=64, faults={"no_tokenize"})) as fake:
        result, summary = run_isvc(pytester, monkeypatch, fake, kserve_profile(tmp_path, tok))
    gates = {g["id"]: g for g in summary["gates"]}
    assert {g["status"] for g in gates.values()} == {"PASS"}, {i: g["message"] for i, g in gates.items()}
    assert result.ret == 0
    chat = gates["kserve-fake/max-context/chat"]
    assert chat["message"].startswith("248-token chat prompt"), chat["message"]  # exact, counted locally
