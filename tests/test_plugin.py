"""The pytest plugin itself, through pytester: options, usage errors, ids, reports, redaction."""

from __future__ import annotations

import pytest

from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, read_summary

pytest_plugins = ["pytester"]
FAKE_PROFILE = REPO / "tests" / "data" / "fake-vllm.yaml"


def run(pytester, *args):
    """pytest in-process from the checkout's config; reports go to ``pytester.path/reports``
    unless the test names its own (kvgate's tests never write into the checkout's reports/)."""
    reports = [] if any(str(a).startswith("--kvgate-reports") for a in args) else \
        [f"--kvgate-reports={pytester.path / 'reports'}"]
    return pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO),
                                        "-p", "no:cacheprovider", *reports, *args)


def test_unknown_profile_is_one_usage_error_listing_profiles(pytester):
    result = run(pytester, "--profile", "nosuch", str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "unknown profile 'nosuch'" in err and "tiny-cpu" in err
    assert "Traceback" not in err
    summary = read_summary(pytester.path / "reports")
    assert summary["overall"] == "ERROR" and "unknown profile 'nosuch'" in summary["error"]


def test_malformed_profile_names_file_field_and_type(pytester):
    bad = pytester.path / "bad.yaml"
    bad.write_text(FAKE_PROFILE.read_text().replace("max_model_len: 256", "max_model_len: [1, 2]"))
    result = run(pytester, "--profile", str(bad), str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert str(bad) in err and "engine.max_model_len" in err and "valid integer" in err


def test_an_unset_api_key_env_for_the_embedded_server_is_one_usage_error(pytester, monkeypatch):
    monkeypatch.delenv("KVGATE_NO_SUCH_KEY", raising=False)
    result = run(pytester, "--profile", "tiny-cpu", "--api-key-env", "KVGATE_NO_SUCH_KEY", str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [ln for ln in result.stderr.str().splitlines() if ln.strip()]
    assert len(lines) == 1 and "API key variable KVGATE_NO_SUCH_KEY is not set (named by --api-key-env" in lines[0], lines


def test_the_key_itself_given_to_api_key_env_is_refused_and_never_repeated(pytester):
    result = run(pytester, "--profile", "tiny-cpu", "--api-key-env=sk-newcomer-SECRET-123", str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = result.stdout.str() + result.stderr.str()
    assert "--api-key-env takes the name of an environment variable holding the key" in out
    written = [f.read_text(errors="replace") for f in (pytester.path / "reports").rglob("*") if f.is_file()]
    assert written and "SECRET-123" not in out + "".join(written)


def test_unreachable_endpoint_says_so_in_one_line(pytester):
    result = run(pytester, "--profile", "tiny-cpu", "--endpoint", "http://127.0.0.1:9", str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [ln for ln in result.stderr.str().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "endpoint http://127.0.0.1:9 is unreachable" in lines[0] and "nothing was gated" in lines[0]
    summary = read_summary(pytester.path / "reports")
    assert summary["overall"] == "ERROR" and summary["endpoint_contacted"] is False


def test_suites_without_profile_is_a_usage_error(pytester):
    result = run(pytester, str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--profile NAME" in result.stderr.str() and "tiny-cpu" in result.stderr.str()


def test_non_embedded_profile_needs_endpoint_except_for_fit(pytester):
    result = run(pytester, "--profile", str(FAKE_PROFILE), str(REPO / "suites" / "test_deployment.py"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "give --endpoint URL" in result.stderr.str()


def test_readable_ids_collect_only(pytester):
    result = run(pytester, "--profile", "tiny-cpu", "--collect-only", "-q", str(REPO / "suites"))
    out = result.stdout.str()
    assert "[tiny-cpu/max-context/over-length/chat-stream]" in out
    assert "[tiny-cpu/deployment/cache-config]" in out


def test_deploy_profile_alias_and_profiling_clash(pytester, monkeypatch):
    import kvgate.plugin

    monkeypatch.setattr(kvgate.plugin, "_profiling_installed", lambda: True)
    ok = run(pytester, "--deploy-profile", "tiny-cpu", "--collect-only", "-q", str(REPO / "suites"))
    assert "[tiny-cpu/deployment/served-model]" in ok.stdout.str()
    # with pytest-profiling owning --profile, kvgate does not register it
    clash = run(pytester, "--profile", "tiny-cpu", str(REPO / "suites"))
    assert clash.ret == pytest.ExitCode.USAGE_ERROR


def test_reports_written_and_secrets_redacted(pytester, monkeypatch):
    secret = "sk-kvgate-test-9f8e7d6c"
    monkeypatch.setenv("KVGATE_TEST_KEY", secret)
    reports = pytester.path / "out"
    with FakeVLLM(FakeConfig(max_tokens_cap=64, api_key=secret)) as fake:
        url = fake.url
        result = run(pytester, "--profile", str(FAKE_PROFILE), "--endpoint", fake.url, "--api-key-env", "KVGATE_TEST_KEY",
                     "--kvgate-reports", str(reports), str(REPO / "suites" / "test_deployment.py"),
                     str(REPO / "suites" / "test_max_tokens.py"))
        assert fake.state.requests, "the fake saw no traffic"
    result.assert_outcomes(passed=10, skipped=3)  # deployment/spec: no --isvc; max-tokens/speculative-usage: no speculation;
    # deployment/memory-peak: no limit to compare
    summary = read_summary(reports)
    assert summary["overall"] == "PASS" and summary["complete"] is True
    assert summary["endpoint"] == url and summary["endpoint_contacted"] is True
    assert {g["id"] for g in summary["gates"] if g["status"] != "PASS"} == {"fake-vllm/deployment/spec",
                                                                           "fake-vllm/deployment/memory-peak",
                                                                           "fake-vllm/max-tokens/speculative-usage"}
    assert all({"measured", "limit", "evidence", "message"} <= set(g) for g in summary["gates"])
    assert (reports / "junit.xml").is_file()
    allure = list((reports / "allure-results").glob("*"))
    assert any(p.name.endswith("-result.json") for p in allure) and any("attachment" in p.name for p in allure)
    from kvgate.cli.main import main as kvgate_main  # signoff.md too (the rendered HTML: tests/e2e/test_report_browser.py)

    assert kvgate_main(["report", f"--reports={reports}", "--signoff-only"]) == 0
    assert (reports / "signoff.md").is_file()
    written = [p for p in reports.rglob("*") if p.is_file()]
    for p in written:
        text = p.read_text(errors="replace")
        assert secret not in text, p
    assert secret not in result.stdout.str()


def test_wrong_api_key_is_one_preflight_line_not_29_fails(pytester, monkeypatch):
    monkeypatch.setenv("KVGATE_TEST_KEY", "sk-wrong-key-123")
    with FakeVLLM(FakeConfig(api_key="sk-right-key-456")) as fake:
        result = run(pytester, "--profile", str(FAKE_PROFILE), "--endpoint", fake.url, "--api-key-env",
                     "KVGATE_TEST_KEY", "--kvgate-reports", str(pytester.path / "r"), str(REPO / "suites"))
        assert len(fake.state.requests) <= 1  # the preflight, nothing else
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [ln for ln in result.stderr.str().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "answered 401 on /v1/models" in lines[0] and "$KVGATE_TEST_KEY (--api-key-env) was refused" in lines[0]
    summary = read_summary(pytester.path / "r")
    assert summary["overall"] == "ERROR" and summary["gates"] == []
    for p in (pytester.path / "r").rglob("*"):
        if p.is_file():
            assert "sk-wrong-key-123" not in p.read_text(errors="replace"), p
    assert "sk-wrong-key-123" not in result.stdout.str() + result.stderr.str()


def test_missing_api_key_names_the_option(pytester, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with FakeVLLM(FakeConfig(api_key="sk-right-key-456")) as fake:
        result = run(pytester, "--profile", str(FAKE_PROFILE), "--endpoint", fake.url, str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "no API key was sent" in result.stderr.str() and "--api-key-env VAR" in result.stderr.str()


def test_missing_api_key_names_the_key_variables_it_saw_never_their_values(pytester, monkeypatch):
    """OPENAI_API_KEY and VLLM_API_KEY set, no --api-key-env: kvgate sends neither, and its refusal
    says both are set and how to send one -- their names, never their values."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-value-789")
    monkeypatch.setenv("VLLM_API_KEY", "sk-vllm-value-012")
    with FakeVLLM(FakeConfig(api_key="sk-right-key-456")) as fake:
        result = run(pytester, "--profile", str(FAKE_PROFILE), "--endpoint", fake.url, "--kvgate-reports",
                     str(pytester.path / "r"), str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "answered 401 on /v1/models: no API key was sent: OPENAI_API_KEY and VLLM_API_KEY are set here, but " \
           "kvgate sends only the key of a variable it is told of -- name it with --api-key-env OPENAI_API_KEY (or " \
           "the other); nothing was gated" in err, err
    written = "".join(p.read_text(errors="replace") for p in (pytester.path / "r").rglob("*") if p.is_file())
    assert "no API key was sent: OPENAI_API_KEY and VLLM_API_KEY are set here" in written
    for value in ("sk-openai-value-789", "sk-vllm-value-012"):
        assert value not in err + result.stdout.str() + written


def test_stopped_run_is_marked_incomplete(pytester):
    with FakeVLLM(FakeConfig(faults={"wrong_max_model_len"})) as fake:
        reports = pytester.path / "r"
        run(pytester, "--profile", str(FAKE_PROFILE), "--endpoint", fake.url, "--kvgate-reports", str(reports),
            "-x", str(REPO / "suites" / "test_deployment.py"))
    summary = read_summary(reports)
    assert summary["complete"] is False and summary["overall"] == "INCOMPLETE"
    assert summary["counts"]["FAIL"] == 1  # what was measured is still there
    xml = (reports / "junit.xml").read_text()
    assert f'name="kvgate_run_id" value="{summary["run_id"]}"' in xml
    assert 'name="kvgate_overall" value="INCOMPLETE"' in xml and "run incomplete" in xml


def test_credentials_in_endpoint_url_are_refused_without_echo(pytester):
    result = run(pytester, "--profile", "tiny-cpu", "--endpoint", "http://user:pw-secret-123@127.0.0.1:9/v1",
                 str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--api-key-env" in result.stderr.str() and "pw-secret-123" not in result.stderr.str()


def test_usage_error_replaces_a_stale_summary(pytester):
    reports = pytester.path / "r"
    reports.mkdir()
    (reports / "summary.json").write_text('{"overall": "PASS"}')
    result = run(pytester, "--profile", "nosuch", "--kvgate-reports", str(reports), str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    summary = read_summary(reports)
    assert summary["overall"] == "ERROR" and "unknown profile 'nosuch'" in summary["error"]


def test_without_kvgate_config_says_how_to_run(pytester):
    # no -c: pytester's tmp dir has no pyproject, as when a bare --profile PATH moves the rootdir
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--profile", "tiny-cpu", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--profile=PATH" in result.stderr.str()


def test_unwritable_reports_dir_is_a_usage_error(pytester):
    result = run(pytester, "--profile", "tiny-cpu", "-m", "fit", "--kvgate-reports", "/proc/kvgate-nope",
                 str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "cannot create it" in result.stderr.str() and "INTERNALERROR" not in result.stdout.str()


def test_junit_carries_verdict_properties(pytester):
    reports = pytester.path / "r"
    result = run(pytester, "--profile", "llama70b-tp4", "-m", "fit", "--kvgate-reports", str(reports),
                 str(REPO / "suites"))
    result.assert_outcomes(passed=1)
    xml = (reports / "junit.xml").read_text()
    assert 'name="kvgate_verdict" value="PASS"' in xml and 'name="kvgate_message"' in xml
    assert 'name="kvgate_measured" value="{&quot;value&quot;: 10, &quot;unit&quot;: &quot;sequences&quot;}"' in xml
    assert f'name="kvgate_run_id" value="{read_summary(reports)["run_id"]}"' in xml


def test_fit_only_needs_neither_server_nor_reachable_endpoint(pytester):
    result = run(pytester, "--profile", "llama70b-tp4-defaults", "-m", "fit", "--endpoint", "http://127.0.0.1:9",
                 "--kvgate-reports", str(pytester.path / "r"), str(REPO / "suites"))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*FAIL*llama70b-tp4-defaults/fit/kv-pool*"])
    out = result.stdout.str()
    assert "endpoint http://127.0.0.1:9/v1 not contacted (-m fit needs no server)" in out  # header
    assert "kvgate llama70b-tp4-defaults: endpoint http://127.0.0.1:9/v1 not contacted" in out  # verdict table
    assert "(vLLM ?)" not in out and "launched on first use" not in out
    assert read_summary(pytester.path / "r")["endpoint_contacted"] is False


def test_fit_only_without_endpoint_says_no_server(pytester):
    result = run(pytester, "--profile", "tiny-cpu", "-m", "fit", str(REPO / "suites"))
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "no server (-m fit needs none)" in out and "kvgate tiny-cpu: no server started" in out
    assert "@ -" not in out and "embedded vLLM" not in out
