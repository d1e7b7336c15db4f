"""What the Allure results say (kvgate.report.allure_meta): readable titles, grouping, severity, the
verdict as description and parameters, no teardown noise, categories that separate FAIL from
INVALID, executor and environment -- on hand-made results and on a real run against the fake."""

from __future__ import annotations

import json
import re

from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from kvgate.report import allure_meta
from kvgate.verdict import Status, Verdict

from .conftest import REPO, read_summary

pytest_plugins = ["pytester"]
FAKE_PROFILE = REPO / "tests" / "data" / "fake-vllm.yaml"


def category_of(status: str, message: str) -> str | None:
    """The first category whose statuses and message regex match (Allure's own rule)."""
    for c in allure_meta.CATEGORIES:
        if status in c["matchedStatuses"] and re.match(c.get("messageRegex", r"[\s\S]*"), message):
            return c["name"]
    return None


def test_categories_separate_defects_from_untrusted_measurements_skips_and_harness_errors():
    assert category_of("failed", "Failed: TTFT 742 ms; SLO 500 ms -> FAIL") == "Deployment defects (FAIL)"
    assert category_of("failed", "Failed: INVALID: the decode rate could not be estimated") \
        == "Untrusted measurements (INVALID)"
    assert category_of("failed", "INCOMPLETE: soak cut short") == "Cut short (INCOMPLETE)"
    assert category_of("skipped", "Skipped: memory not declared -> SKIP") == "Not checked (SKIP)"
    assert category_of("skipped", "XFailed: record mode, not enforced: FAIL: x").startswith("Recorded, not enforced")
    assert category_of("broken", "ConnectError: refused").startswith("Harness errors")
    assert category_of("passed", "") is None


def test_verdict_description_says_what_it_means_measured_limit_and_checks():
    v = Verdict("fit", Status.FAIL, "KV pool holds 4 sequences; profile declares 8 -> FAIL (need 16,384 tokens)",
                measured=4, limit=8, unit="sequences",
                parts=(Verdict("fit.budget", Status.SKIP, "memory not declared -> SKIP"),
                       Verdict("fit.long", Status.FAIL, "4 at once -> FAIL", 4, 8, unit="sequences")))
    text = allure_meta.verdict_description(v)
    assert text.startswith("**FAIL** — a defect in the deployment")
    assert "need 16,384 tokens" in text and "- measured: 4 sequences" in text and "- limit: 8 sequences" in text
    assert "- FAIL `fit.long`: 4 at once -> FAIL" in text and "Not checked: fit.budget (memory not declared)" in text
    assert text.endswith("What to change: give the KV pool more memory (gpu_memory_utilization, kv_cache_dtype fp8, "
                         "more GPUs / TP) or declare less (max_model_len, the workloads' concurrency, max_num_seqs).")
    assert "What to change" not in allure_meta.verdict_description(Verdict("fit", Status.PASS, "ok -> PASS"))
    invalid = allure_meta.verdict_description(Verdict("d", Status.INVALID, "bunched -> INVALID"))
    assert "untrusted measurement" in invalid and "- measured: - (no trustworthy measurement" in invalid


def test_quantities_read_as_numbers_with_units():
    assert allure_meta.fmt_quantity({"value": 32768, "unit": "tokens"}) == "32,768 tokens"
    assert allure_meta.fmt_quantity({"value": 741.53, "unit": "ms"}) == "741.53 ms"
    assert allure_meta.fmt_quantity({"value": "length", "unit": None}) == "length"
    assert allure_meta.fmt_quantity({"value": None, "reason": "not measured"}, why=False) == "-"


def test_split_id_and_severity_per_gate():
    assert allure_meta.split_id("tiny-cpu/max-context/over-length/chat") == ("tiny-cpu", "max-context", "over-length/chat")
    assert allure_meta.split_id("tiny-cpu/fit") == ("tiny-cpu", "fit", "")
    assert allure_meta.SEVERITY["deployment"] == "blocker" and allure_meta.SEVERITY["latency"] == "normal"


def test_tidy_drops_host_thread_and_finalizer_noise_but_keeps_failing_teardowns(tmp_path):
    (tmp_path / "a-result.json").write_text(json.dumps({"name": "x", "labels": [
        {"name": "host", "value": "vm"}, {"name": "thread", "value": "1-MainThread"}, {"name": "epic", "value": "p"}],
        "parameters": [{"name": "case", "value": "'ttft/chat'"}, {"name": "n", "value": "3"}]}))
    (tmp_path / "b-container.json").write_text(json.dumps({"children": ["a"], "befores": [
        {"name": "kvgate_gate", "status": "passed"}], "afters": [{"name": "kvgate_gate::<lambda>", "start": 1}]}))
    (tmp_path / "c-container.json").write_text(json.dumps({"children": ["a"], "afters": [
        {"name": "server::stop", "status": "broken", "statusDetails": {"message": "did not stop"}},
        {"name": "case::<lambda>"}]}))
    # the soak's rounds run in its module fixture: its 80 s set-up row stays (the test's own call reads "4ms")
    (tmp_path / "d-container.json").write_text(json.dumps({"children": ["a"], "befores": [
        {"name": "kvgate_soak", "status": "passed", "start": 1_000, "stop": 81_000}]}))
    assert allure_meta.tidy_results(tmp_path) == 3
    assert json.loads((tmp_path / "d-container.json").read_text())["befores"][0]["name"] == "kvgate_soak"
    r = json.loads((tmp_path / "a-result.json").read_text())
    assert [lb["name"] for lb in r["labels"]] == ["epic"]
    assert [p["value"] for p in r["parameters"]] == ["ttft/chat", "3"]
    assert not (tmp_path / "b-container.json").exists()
    assert [a["name"] for a in json.loads((tmp_path / "c-container.json").read_text())["afters"]] == ["server::stop"]
    assert allure_meta.tidy_results(tmp_path) == 0  # idempotent


def test_tidy_keeps_the_history_id_of_an_async_gate_across_runs(tmp_path):
    # pytest-asyncio 1.x parametrizes each async test with _asyncio_loop_factory, a function repr whose
    # address changes every run: allure-pytest hashed it into historyId, so soak/memory was NEW each run
    def result(run: int, address: str) -> str:
        d = tmp_path / f"run{run}"
        d.mkdir()
        (d / "a-result.json").write_text(json.dumps({
            "name": "x", "fullName": "suites.test_soak#test_memory", "historyId": f"allure-{address}",
            "parameters": [{"name": "_asyncio_loop_factory", "value": f"<function new_event_loop at {address}>"},
                           {"name": "profile", "value": "'tiny-cpu'"},
                           {"name": "measured", "value": "12 MB", "excluded": True}]}))
        allure_meta.tidy_results(d)
        return json.loads((d / "a-result.json").read_text())

    first, second = result(1, "0x7f06d6a1"), result(2, "0x7f3300b2")
    assert first["historyId"] == second["historyId"]
    assert [p["name"] for p in first["parameters"]] == ["profile", "measured"]
    assert first["historyId"] != allure_meta.history_id("suites.test_soak#test_other", first["parameters"])


def test_executor_from_ci_environment_variables():
    gh = allure_meta.executor_info({"GITHUB_ACTIONS": "true", "GITHUB_SERVER_URL": "https://github.com",
                                    "GITHUB_REPOSITORY": "acme/llm", "GITHUB_RUN_ID": "42", "GITHUB_WORKFLOW": "kvgate",
                                    "GITHUB_RUN_NUMBER": "7"})
    assert gh == {"name": "GitHub Actions", "type": "github", "buildName": "kvgate #7",
                  "buildUrl": "https://github.com/acme/llm/actions/runs/42", "buildOrder": 7}
    gl = allure_meta.executor_info({"GITLAB_CI": "true", "CI_JOB_URL": "https://gitlab/j/1", "CI_PIPELINE_IID": "x"})
    assert gl["buildUrl"] == "https://gitlab/j/1" and gl["buildOrder"] is None
    assert allure_meta.executor_info({"JENKINS_URL": "j", "BUILD_URL": "https://j/b/3", "BUILD_NUMBER": "3"})["type"] == "jenkins"
    assert allure_meta.executor_info({}) is None


class FakeNvml:
    class Mem:
        total = 141 * 2**30

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetCount(self): return 2
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetName(self, h): return b"NVIDIA H200"
    def nvmlDeviceGetMemoryInfo(self, h): return self.Mem()


def test_gpu_description_counts_devices_and_says_why_when_none():
    assert allure_meta.gpu_description(FakeNvml()) == "2 x NVIDIA H200 (141 GiB)"

    class NoDriver(FakeNvml):
        def nvmlInit(self): raise RuntimeError("driver not loaded")

    assert allure_meta.gpu_description(NoDriver()) == "none visible (RuntimeError)"


def test_environment_props_name_profile_server_args_machine_and_mode(tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text("x: 1\n")
    summary = {"run_id": "r1", "overall": "PASS", "profile": "p", "profile_source": str(prof),
               "endpoint": "http://h/v1", "server_version": "0.32.0",
               "launch": {"mode": "embedded", "command": ["py", "-m", "vllm", "--model", "/m", "--max-model-len", "2048"]}}
    props = allure_meta.environment_props(summary, "certify", gpu="none", machine="x86_64, 2 CPUs")
    assert props["vllm_args"] == "--model /m --max-model-len 2048" and props["gate_mode"] == "certify"
    assert props["profile_sha256"] == allure_meta.profile_sha256(str(prof)) and len(props["profile_sha256"]) == 16
    assert props["server_launch"] == "embedded" and props["kvgate_version"]


def test_fake_run_results_read_as_verdicts(pytester):
    """A real kvgate run against the fake (one PASS, one FAIL, one INVALID): what Allure gets."""
    reports = pytester.path / "reports"
    with FakeVLLM(FakeConfig(max_tokens_cap=64, ttft_s=0.7)) as fake:
        url = fake.url
        pytester.runpytest_inprocess(
            "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
            f"--profile={FAKE_PROFILE}", f"--endpoint={fake.url}", f"--kvgate-reports={reports}",
            str(REPO / "suites" / "test_deployment.py"), str(REPO / "suites" / "test_streaming.py"),
            str(REPO / "suites" / "test_disconnect.py"), "-k", "served-model or ttft/chat or mid-request")
    assert read_summary(reports)["overall"] == "FAIL"
    results = reports / "allure-results"
    by_title = {r["name"]: r for r in (json.loads(p.read_text()) for p in results.glob("*-result.json"))}
    assert set(by_title) == {"fake-vllm/deployment/served-model", "fake-vllm/streaming/ttft/chat",
                             "fake-vllm/disconnect/mid-request"}
    fail = by_title["fake-vllm/streaming/ttft/chat"]
    labels = {lb["name"]: lb["value"] for lb in fail["labels"]}
    assert labels["epic"] == "fake-vllm" and labels["feature"] == "streaming" and labels["story"] == "ttft/chat"
    assert labels["severity"] == "normal" and labels["kvgate_verdict"] == "FAIL"
    assert "host" not in labels and "thread" not in labels
    params = {p["name"]: p["value"] for p in fail["parameters"]}
    assert params["profile"] == "fake-vllm" and params["limit"] == "500 ms" and params["measured"].endswith(" ms")
    assert fail["description"].startswith("**FAIL**") and "SLO 500 ms" in fail["description"]
    assert fail["links"][0]["url"].endswith("fake-vllm.yaml")
    invalid = by_title["fake-vllm/disconnect/mid-request"]
    assert category_of(invalid["status"], invalid["statusDetails"]["message"]) == "Untrusted measurements (INVALID)"
    assert category_of(fail["status"], fail["statusDetails"]["message"]) == "Deployment defects (FAIL)"
    for p in results.glob("*-container.json"):  # only fixtures that say something are left: a failure, or where time went
        c = json.loads(p.read_text())
        assert all(f.get("status") not in (None, "passed") or f["stop"] - f["start"] >= allure_meta.SLOW_FIXTURE_MS
                   for f in c.get("befores", []) + c.get("afters", [])), c
    assert json.loads((results / "categories.json").read_text()) == allure_meta.CATEGORIES
    env = dict(ln.split("=", 1) for ln in (results / "environment.properties").read_text().splitlines())
    assert env["profile"] == "fake-vllm" and env["server_version"] == "0.32.0+fake" and env["overall"] == "FAIL"
    assert env["endpoint"] == url and env["gate_mode"] == "enforce" and "cpu" in env and "gpu" in env


def test_an_async_test_keeps_its_history_id_across_two_real_runs(pytester):
    # what pytest-asyncio and allure-pytest really write for an async test (the soak gates are async)
    # once a plugin names the event loop factories (pytest-asyncio 1.x's pytest_asyncio_loop_factories
    # hook): every async test is parametrized with _asyncio_loop_factory, a function's repr whose
    # address changes between processes -- so the two runs are two processes
    pytester.makeconftest("""
        import asyncio

        def pytest_asyncio_loop_factories(config, item):
            return {"asyncio": asyncio.new_event_loop}
    """)
    pytester.makepyfile(test_soaklike="""
        import pytest

        @pytest.mark.asyncio
        @pytest.mark.parametrize("case", ["memory"])
        async def test_memory(case):
            pass
    """)
    pytester.makeini("[pytest]\nasyncio_mode = strict\n")
    ids, params = [], []
    for run in ("a", "b"):
        out = pytester.path / run
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:kvgate", f"--alluredir={out}")
        assert result.ret == 0, result.stdout.str()[-1500:]
        allure_meta.tidy_results(out)
        (data,) = [json.loads(p.read_text()) for p in out.glob("*-result.json")]
        ids.append(data["historyId"])
        params.append([p["name"] for p in data.get("parameters") or []])
    assert ids[0] == ids[1] and params[0] == ["case"], (ids, params)
