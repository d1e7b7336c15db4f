"""The security gate against the fake vLLM: a deployment with its door shut PASSes every case; each
fault FAILs exactly its case, naming the route, the request or the answer (suites/test_security.py)."""

import pytest

from .conftest import assert_passes_measured
from .fakes.fake_vllm import FakeConfig, FakeVLLM
from .test_gates_vs_fake import REPO, run_suites

SECURE = REPO / "tests" / "data" / "fake-vllm-secure.yaml"
SUITE = ["suites/test_security.py"]
KEY = "sk-kvgate-test-9d1e4b7c2a"
KEY2 = "sk-kvgate-test-second-5e8a1f"


def shut(**kw):
    """The fake with its door shut (tests/data/fake-vllm-secure.yaml describes it)."""
    return FakeConfig(**{"max_tokens_cap": 64, "api_key": KEY, "other_keys": (KEY2,), "auth_guard": "all",
                         "admission_limit": 2, "itl_s": 0.01, **kw})


def run(pytester, monkeypatch, fake, *extra):
    monkeypatch.setenv("KVGATE_TEST_KEY", KEY)
    monkeypatch.setenv("KVGATE_TEST_KEY2", KEY2)
    return run_suites(pytester, fake.url, "--api-key-env", "KVGATE_TEST_KEY", *extra, suites=SUITE, profile=SECURE)


def test_a_shut_door_passes_every_case(pytester, monkeypatch):
    with FakeVLLM(shut()) as fake:
        result, summary, gates = run(pytester, monkeypatch, fake)
    assert {g: v["status"] for g, v in gates.items()} == {f"fake-vllm-secure/security/{c}": "PASS" for c in (
        "auth-surface", "secrets", "media-urls", "hostile-parameters", "input-paths", "cache", "flood")}, \
        [g["message"] for g in gates.values()]
    auth = gates["fake-vllm-secure/security/auth-surface"]["message"]
    assert "-> PASS (closed by: the fake's guard on every route (FakeConfig.auth_guard all))" in auth, auth
    assert "/health (the kubelet's liveness and readiness probes)" in auth
    hostile = gates["fake-vllm-secure/security/hostile-parameters"]["message"]
    assert "the canary generated after each; resident memory" in hostile, hostile
    paths = gates["fake-vllm-secure/security/input-paths"]["message"]
    assert "14 input paths in time: 4 refused 4xx" in paths and "request templates (untrusted: never rendered): 1 refused, 5 ignored" \
        in paths, paths
    cache = gates["fake-vllm-secure/security/cache"]["message"]
    assert "5 changed fields (response_format, stop, seed, tools, max_tokens) each answered afresh; the second caller's " \
        "answer to the same request was its own; 3 sampled answers to one request each drawn afresh; every identical " \
        "repeat a fresh body through the engine; 5 identical repeats against 5 same-prompt controls" in cache \
        and "no repeat served from a cache -> PASS" in cache, cache
    beside = gates["fake-vllm-secure/security/cache"]["evidence"]["beside"]
    assert beside["idle"] is True and beside["running"] == 0, beside  # the timing look began on an idle server
    flood = gates["fake-vllm-secure/security/flood"]
    assert "5 requests at once (max_in_flight 2): 3 refused 429 within" in flood["message"], flood["message"]
    written = [f for f in (pytester.path / "reports").rglob("*") if f.is_file()]
    assert written and not [f for f in written if KEY in f.read_text(errors="replace")]  # the key is never written
    assert_passes_measured(summary)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


def test_vllm_prefix_guard_fails_naming_invocations_and_the_tokenizer(pytester, monkeypatch):
    # vLLM 0.32's --api-key: only /v1, /v2, /inference, /cohere are guarded
    with FakeVLLM(shut(auth_guard="prefix")) as fake:
        _, summary, gates = run(pytester, monkeypatch, fake, "-k", "auth-surface")
    g = gates["fake-vllm-secure/security/auth-surface"]
    assert g["status"] == "FAIL", g["message"]
    assert "routes answered a caller without the key: POST /invocations (no key: 200 (JSON: " in g["message"], g["message"]
    for route in ("POST /tokenize (no key: 200", "POST /detokenize", "GET /metrics", "GET /openapi.json"):
        assert route in g["message"] or route in str(g["evidence"]), route
    assert "-> FAIL (every route but the 3 declared open must answer 401/403, or 404/405 where absent" in g["message"]
    assert g["measured"] == {"value": 10, "unit": "routes"}  # as vLLM 0.32 measured: also /load, /scale_elastic_ep, ...


FAULTS = {  # fault -> (the one case it FAILs, fragment of its message)
    "open_inference_route": ("auth-surface", "1 of "),
    "open_admin_route": ("auth-surface", "POST /reset_prefix_cache (no key: 200"),
    "echo_key": ("secrets", "with the wrong key kvgate sent in its body"),
    "fetch_media_urls": ("media-urls", "kvgate's loopback listener was fetched"),
    "hostile_seed_kills": ("hostile-parameters", "seed 2^64 (above 2^63-1): no answer"),
    "request_template_rendered": ("input-paths", "a request chat_template on chat: 200 with the request's template "
                                  "rendered (prompt counted 165 tokens, 5 for the same request without it"),
    "path_500": ("input-paths", "pure prompt_embeds (no prompt): 500 (JSON error: \"EngineCore encountered an issue"),
    "responses_template_kills": ("input-paths", "chat_template_kwargs.chat_template on responses: 500"),
    "cache_ignores_caller": ("cache", "the second caller got the first caller's body (id chatcmpl-"),
    "cache_ignores_fields": ("cache", "the same messages with another response_format, stop, seed, tools, max_tokens "
                             "got the base request's body (id chatcmpl-"),
    "cache_fresh_ids": ("cache", "the sampled request (temperature 1, unseeded) got the first answer's text "),
    "kv_transfer_tp_kills": ("hostile-parameters", "on request fields that configure server internals: "
                             "kv_transfer_params.tp_size tp_size 2^31-1 with a remote prefill (CVE-2026-94626; through "
                             "the endpoint): no answer within 2 s; after kv_transfer_params.tp_size tp_size 2^31-1"),
    "code_revision_honoured": ("hostile-parameters", "mm_processor_kwargs.code_revision code_revision "
                               "'kvgate-probe-no-such-revision-0' (CVE-2026-114053; through the endpoint): 500 (JSON "
                               "error: \"Revision Not Found: "),
    "auth_misses_lora_tensors": ("auth-surface", "1 of 89 routes answered a caller without the key: POST "
                                 "/load_lora_adapter_from_tensors (no key: 400 (JSON error: \"lora_name is required\")"),
    "slow_refusal": ("flood", "refusals came after"),
    "refuse_500": ("flood", "answered otherwise: 500"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_fails_its_case(pytester, monkeypatch, fault):
    case, fragment = FAULTS[fault]
    cfg = shut(faults={fault}, dead_mode="hang", slow_refusal_s=1.0)
    with FakeVLLM(cfg) as fake:
        _, summary, gates = run(pytester, monkeypatch, fake, "-k", case)
    g = gates[f"fake-vllm-secure/security/{case}"]
    assert g["status"] == "FAIL" and fragment in g["message"], g["message"]
    assert summary["overall"] == "FAIL"


def test_an_auth_check_on_the_raw_path_fails_naming_the_walk_out_of_an_open_route(pytester, monkeypatch):
    # the check exempts /health/anything as sent, the router serves /health/../v1/models as /v1/models:
    # every plain route is still refused, only the spellings get through
    with FakeVLLM(shut(faults={"auth_raw_path"})) as fake:
        _, summary, gates = run(pytester, monkeypatch, fake, "-k", "auth-surface")
    g = gates["fake-vllm-secure/security/auth-surface"]
    assert g["status"] == "FAIL", g["message"]
    assert "routes answered a caller without the key" not in g["message"]  # the plain door holds
    assert "spellings of 4 protected routes were served without the key: /health/../" in g["message"], g["message"]
    assert "/health/%2e%2e/v1/chat/completions (no key: 200 (JSON: {\"id\": \"chatcmpl-" in str(g["evidence"]) or \
        "/health/%2e%2e/" in g["message"]
    served = {k["spelling"] for k in g["evidence"]["spelled"]["knocks"] if k["class"] == "served"}
    assert {"/health/../v1/models", "/health/%2e%2e/v1/models", "/ping/../tokenize", "/version/%2e%2e/load"} <= served
    assert not {s for s in served if not s.startswith(("/health/", "/ping/", "/version/"))}, served  # only walk-outs
    assert g["cause"].startswith("the auth check exempts a path that starts with an open route while the router "
                                 "resolves its dot segments: `/health/../"), g["cause"]
    assert g["measured"] == {"value": len(served), "unit": "routes"}


def test_a_raw_path_check_behind_a_prefix_guard_lets_a_doubled_slash_through(pytester, monkeypatch):
    # vLLM's prefix test on the path as sent, a router that merges slashes: //v1/models is not "/v1..."
    with FakeVLLM(shut(faults={"auth_raw_path"}, auth_guard="prefix")) as fake:
        _, summary, gates = run(pytester, monkeypatch, fake, "-k", "auth-surface")
    g = gates["fake-vllm-secure/security/auth-surface"]
    assert g["status"] == "FAIL"
    served = {k["spelling"] for k in g["evidence"]["spelled"]["knocks"] if k["class"] == "served"}
    assert {"//v1/models", "/./v1/models", "/%2Fv1/models", "//v1/chat/completions"} <= served, served
    assert "/v1/../v1/models" not in served  # starts with /v1 as sent: guarded
    assert "the auth check reads the path as sent while the router serves it normalised" in g["cause"], g["cause"]


def test_an_auth_check_reading_the_host_built_url_fails_naming_the_host_header(pytester, monkeypatch):
    with FakeVLLM(shut(faults={"auth_url_path"})) as fake:
        _, summary, gates = run(pytester, monkeypatch, fake, "-k", "auth-surface")
        host = fake.base_url.split("://", 1)[1]
    g = gates["fake-vllm-secure/security/auth-surface"]
    assert g["status"] == "FAIL" and "routes answered a caller without the key" not in g["message"], g["message"]
    assert f"Host: {host}/health? -> /v1/chat/completions (no key and wrong key: 200 (JSON: " in g["message"], g["message"]
    served = {k["spelling"] for k in g["evidence"]["spelled"]["knocks"] if k["class"] == "served"}
    # h/health?, h/ping?, h/version? read as open routes; h/# and h/?x= read as "/", which is not open
    assert served == {f"Host: {host}{o}? -> {p}" for o in ("/health", "/ping", "/version")
                      for p in ("/v1/chat/completions", "/v1/models", "/tokenize", "/load")}, served
    assert g["cause"].startswith("the auth check reads the path of the URL rebuilt from the Host header "
                                 f"(request.url.path) while the router reads the request path: `Host: {host}/health? ->")


def trusted_profile(tmp_path):
    """fake-vllm-secure with request templates trusted and a 500 ms TTFT SLO for the side canary."""
    path = tmp_path / "fake-vllm-trusted.yaml"
    path.write_text(f"extends: {SECURE}\nsecurity:\n  request_chat_template: trusted\nslo:\n  ttft_p95_ms: 500\n")
    return path


def test_a_trusted_template_renders_while_the_side_canary_keeps_its_ttft(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("KVGATE_TEST_KEY", KEY)
    with FakeVLLM(shut(trust_request_chat_template=True)) as fake:
        _, _, gates = run_suites(pytester, fake.url, "--api-key-env", "KVGATE_TEST_KEY", "-k", "input-paths",
                                 suites=SUITE, profile=trusted_profile(tmp_path))
    g = gates["fake-vllm-trusted/security/input-paths"]
    assert g["status"] == "PASS" and "request templates (trusted): 0 refused, 5 ignored (prompt counted as without them), " \
        "1 rendered with a canary on another connection within 500 ms" in g["message"], g["message"]


def test_a_template_that_blocks_the_engine_fails_naming_the_side_canarys_wait(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("KVGATE_TEST_KEY", KEY)
    cfg = shut(trust_request_chat_template=True, faults={"template_blocks_engine"}, template_block_s=1.5)
    with FakeVLLM(cfg) as fake:
        _, _, gates = run_suites(pytester, fake.url, "--api-key-env", "KVGATE_TEST_KEY", "-k", "input-paths",
                                 suites=SUITE, profile=trusted_profile(tmp_path))
    g = gates["fake-vllm-trusted/security/input-paths"]
    assert g["status"] == "FAIL", g["message"]
    assert "while a request chat_template on chat was answered, a canary on another connection waited " in g["message"] \
        and "ms for its first token (limit 500 ms)" in g["message"], g["message"]
def test_the_contract_names_a_route_a_new_revision_opens(pytester, monkeypatch):
    """The serving revision recorded (--gate-mode record: the auth-surface case with each route's
    answers lands in golden.json's contract); the same door against its recording PASSes
    compare/contract; a revision that opens an admin route FAILs it, naming the route and what
    each side answered (compare/contract is gated after the security gate)."""
    import json

    only = ["-k", "auth-surface or contract"]
    suites = SUITE + ["suites/test_compare.py"]
    monkeypatch.setenv("KVGATE_TEST_KEY", KEY)
    key = ["--api-key-env", "KVGATE_TEST_KEY"]
    rec = pytester.path / "reports"
    with FakeVLLM(shut()) as fake:
        _, summary, _ = run_suites(pytester, fake.url, *key, "--gate-mode=record", *only, suites=suites, profile=SECURE)
        assert summary["outcome"] == "RECORDED", summary["outcome"]
        contract = json.loads((rec / "golden.json").read_text())["contract"]
        surface = contract["security/auth-surface"]
        assert surface["status"] == "PASS" and surface["parts"]["POST /reset_prefix_cache"]["ok"] is True, surface
        recording = pytester.path / "serving"
        rec.rename(recording)
        _, _, gates = run_suites(pytester, fake.url, *key, f"--baseline-reports={recording}", *only, suites=suites,
                                 profile=SECURE)
    g = gates["fake-vllm-secure/compare/contract"]
    assert g["status"] == "PASS" and g["message"].startswith("all that held on the recorded baseline "), g["message"]
    assert " (1 case, 89 routes) holds on the new revision" in g["message"], g["message"]
    with FakeVLLM(shut(faults={"open_admin_route"})) as fake:
        _, _, gates = run_suites(pytester, fake.url, *key, f"--baseline-reports={recording}", *only, suites=suites,
                                 profile=SECURE)
    g = gates["fake-vllm-secure/compare/contract"]
    assert g["status"] == "FAIL", g["message"]
    assert "security/auth-surface (baseline PASS: " in g["message"] and "; here FAIL: " in g["message"], g["message"]
    assert ("security/auth-surface/POST /reset_prefix_cache (baseline no key: 401 (refused); wrong key: 401 (refused); "
            "here no key: 200 (reached)") in g["message"], g["message"]


def test_input_paths_on_a_server_without_health_is_judged_by_the_canary(pytester, monkeypatch):
    """The fake posing as llama-cpp-python (no /health route: 404, as the real 0.3.36 server answers):
    input-paths is judged by the canary after each path, the /health 404s are not findings (they were,
    16 of them, on the real server before)."""
    with FakeVLLM(shut(server="llama-cpp-python")) as fake:
        _, _, gates = run(pytester, monkeypatch, fake, "-k", "input-paths")
    g = gates["fake-vllm-secure/security/input-paths"]
    assert g["status"] == "PASS" and "/health not judged: every GET /health answered 404 (the server has no such " \
        "route) -> PASS" in g["message"], g["message"]


def test_a_prefix_cache_that_makes_repeats_faster_passes_and_a_replay_under_fresh_ids_fails_on_its_usage(
        pytester, monkeypatch):
    """Issue 48: vLLM's prefix cache (prefill 5 ms a token, whole 16-token blocks cached) makes every
    later request of the timed prompt faster than the first; the same-prompt controls get the same
    hits, so the healthy fake PASSes. Behind a cache that replays the first body under fresh ids, the
    repeats carry the first's usage (cached_tokens 0) while the controls found the prefix blocks."""
    cfg = dict(prefill_s_per_token=0.005, prompt_tokens_details=True)
    with FakeVLLM(shut(**cfg)) as fake:
        _, _, gates = run(pytester, monkeypatch, fake, "-k", "cache")
    g = gates["fake-vllm-secure/security/cache"]
    assert g["status"] == "PASS", g["message"]
    timed = g["evidence"]["timed"]
    assert timed[0]["cached_tokens"] == 0 and all(t["cached_tokens"] > 0 for t in timed[1:]), timed
    with FakeVLLM(shut(faults={"cache_fresh_ids"}, **cfg)) as fake:
        _, _, gates = run(pytester, monkeypatch, fake, "-k", "cache")
    g = gates["fake-vllm-secure/security/cache"]
    assert g["status"] == "FAIL", g["message"]
    assert "5 identical repeats carried the first answer's usage (cached_tokens 0) while every same-prompt control " \
        "found " in g["message"], g["message"]


def test_request_fields_that_configure_internals_name_the_field_and_the_cve(pytester, monkeypatch):
    """Issue 49: a server whose decode worker dies on kv_transfer_params.tp_size 2^31-1 FAILs
    hostile-parameters naming the field, the value, the CVE and the dead canary, its cause the field;
    the harmless value (tp_size 1) before it was answered 200 with the engine alive."""
    with FakeVLLM(shut(faults={"kv_transfer_tp_kills"}, dead_mode="500")) as fake:
        _, _, gates = run(pytester, monkeypatch, fake, "-k", "hostile")
    g = gates["fake-vllm-secure/security/hostile-parameters"]
    assert g["status"] == "FAIL" and g["message"].startswith("2 findings on request fields that configure server "
                                                             "internals: "), g["message"]
    assert "the 2-token canary got 500" in g["message"] and "hostile requests not answered" not in g["message"]
    assert g["cause"] == "a request's kv_transfer_params.tp_size reaches the server's internals unchecked (CVE-2026-94626)"
    rows = {(r["probe"], r["value"]): r for r in g["evidence"]["request_fields"]["requests"] if "probe" in r}
    assert rows[("kv_transfer_params-tp_size", "harmless")]["status"] == 200
    assert rows[("kv_transfer_params-tp_size", "harmless")]["canary"] == 200
    assert rows[("code_revision-tokenize", "out-of-range")]["sent"] is False  # not after the engine went down


def test_trust_remote_code_with_an_open_tokenize_is_its_own_finding(pytester, monkeypatch):
    """trust_remote_code in the served config (/server_info's model_config) with /tokenize answering
    without the key FAILs naming both (CVE-2026-114053's preconditions), even where the server
    ignores code_revision; behind a door that closes /tokenize the same config PASSes, named; the
    server that honours code_revision as well FAILs with both findings."""
    cfg = dict(trust_remote_code=True, server_info=True)
    with FakeVLLM(shut(auth_guard="prefix", **cfg)) as fake:
        _, _, gates = run(pytester, monkeypatch, fake, "-k", "hostile")
    g = gates["fake-vllm-secure/security/hostile-parameters"]
    assert g["status"] == "FAIL", g["message"]
    assert g["message"].startswith("1 finding on request fields that configure server internals: trust_remote_code is "
                                   "on (/server_info model_config) and POST /tokenize answered a caller without the key "
                                   "200 (JSON: "), g["message"]
    assert g["cause"].startswith("trust_remote_code with a /tokenize open to callers without the key"), g["cause"]
    with FakeVLLM(shut(**cfg)) as fake:
        _, _, gates = run(pytester, monkeypatch, fake, "-k", "hostile")
    g = gates["fake-vllm-secure/security/hostile-parameters"]
    assert g["status"] == "PASS" and "; trust_remote_code on (/server_info model_config), POST /tokenize answered a " \
        "caller without the key 401 " in g["message"], g["message"]
    with FakeVLLM(shut(auth_guard="prefix", faults={"code_revision_honoured"}, **cfg)) as fake:
        _, _, gates = run(pytester, monkeypatch, fake, "-k", "hostile")
    g = gates["fake-vllm-secure/security/hostile-parameters"]
    assert g["status"] == "FAIL" and g["message"].startswith("3 findings on request fields"), g["message"]
    for part in ("mm_processor_kwargs.code_revision code_revision 'kvgate-probe-no-such-revision-0' (CVE-2026-114053; "
                 "through the endpoint): 500", "(CVE-2026-114053; through the endpoint, /tokenize): 500",
                 "trust_remote_code is on (/server_info model_config) and POST /tokenize answered"):
        assert part in g["message"], (part, g["message"])


def test_every_lora_admin_route_is_knocked_on(pytester, monkeypatch):
    """sglang#26789: the door's route list has every LoRA admin spelling; the healthy fake refuses
    each 401 to both callers."""
    with FakeVLLM(shut()) as fake:
        _, _, gates = run(pytester, monkeypatch, fake, "-k", "auth-surface")
    g = gates["fake-vllm-secure/security/auth-surface"]
    assert g["status"] == "PASS", g["message"]
    knocked = {(k["route"], k["who"]): k["status"] for k in g["evidence"]["knocks"]}
    for route in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/load_lora_adapter_from_tensors",
                  "/load_lora_adapter", "/unload_lora_adapter", "/load_lora_adapter_from_tensors"):
        assert knocked[(f"POST {route}", "no key")] == 401 and knocked[(f"POST {route}", "wrong key")] == 401, route
