"""One run, one set of reports: every run -- PASS, FAIL, ERROR, interrupted -- replaces summary.json,
junit.xml and allure-results/ together, all carrying one run id; summary.json follows its JSON
Schema (measured/limit as {value, unit}, sub-checks with their own status, skipped checks listed);
plus the plugin's small promises: path options, markers registered once, the README's option list."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvgate.report import outputs
from kvgate.run.session import given_with_space
from kvgate.report.redact import Redactor
from kvgate.report.record import RunRecord
from kvgate.verdict import Status, Verdict, combine, quantity
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, read_summary, validate_summary

pytest_plugins = ["pytester"]
FAKE_PROFILE = REPO / "tests" / "data" / "fake-vllm.yaml"


def run(pytester, reports: Path, *args):
    return pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO),
                                        "-p", "no:cacheprovider", f"--kvgate-reports={reports}", *args)


def junit_run_id(reports: Path) -> str:
    m = re.search(r'name="kvgate_run_id" value="([^"]+)"', (reports / "junit.xml").read_text())
    assert m, (reports / "junit.xml").read_text()[:500]
    return m.group(1)


def allure_run_ids(reports: Path) -> set[str]:
    env = (reports / "allure-results" / "environment.properties").read_text()
    ids = {line.split("=", 1)[1] for line in env.splitlines() if line.startswith("kvgate_run_id=")}
    for p in (reports / "allure-results").glob("*-result.json"):
        labels = json.loads(p.read_text()).get("labels", [])
        ids |= {lab["value"] for lab in labels if lab["name"] == "kvgate_run_id"}
    return ids


def signoff_first_line(reports: Path) -> str:
    """``kvgate report --signoff-only`` on this run's reports; the first line of its signoff.md."""
    from kvgate.cli.main import main as kvgate_main

    assert not (reports / "signoff.md").exists(), "a run must remove the previous run's signoff.md"
    assert kvgate_main(["report", f"--reports={reports}", "--signoff-only"]) == 0
    return (reports / "signoff.md").read_text().splitlines()[0]


def one_run_id(reports: Path) -> tuple[dict, str]:
    """The summary, and the run id that summary, JUnit and Allure all carry (asserted equal)."""
    summary = read_summary(reports)
    rid = summary["run_id"]
    assert junit_run_id(reports) == rid
    assert allure_run_ids(reports) == {rid}, "allure-results holds another run's results"
    return summary, rid


class Interrupt:
    """A plugin that presses Ctrl-C when the test whose id contains ``at`` starts."""

    def __init__(self, at: str) -> None:
        self.at = at

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item):
        if self.at in item.nodeid:
            raise KeyboardInterrupt


def test_every_run_replaces_the_whole_report_set(pytester, tmp_path):
    reports = tmp_path / "reports"
    suites = str(REPO / "suites")
    seen = []
    # PASS
    result = run(pytester, reports, "--profile", "llama70b-tp4", "-m", "fit", suites)
    assert result.ret == pytest.ExitCode.OK
    summary, rid = one_run_id(reports)
    assert summary["overall"] == "PASS" and 'failures="0"' in (reports / "junit.xml").read_text()
    assert signoff_first_line(reports).endswith(" — PASS")
    seen.append(rid)
    # ERROR: the endpoint is dead; JUnit must not keep the green of the run before
    result = run(pytester, reports, "--profile", "tiny-cpu", "--endpoint", "http://127.0.0.1:9", suites)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    summary, rid = one_run_id(reports)
    xml = (reports / "junit.xml").read_text()
    assert summary["overall"] == "ERROR" and 'errors="1"' in xml and "is unreachable" in xml and "kv-pool" not in xml
    assert signoff_first_line(reports).endswith(" — ERROR")
    seen.append(rid)
    # FAIL
    result = run(pytester, reports, "--profile", "llama70b-tp4-defaults", "-m", "fit", suites)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    summary, rid = one_run_id(reports)
    assert summary["overall"] == "FAIL" and 'failures="1"' in (reports / "junit.xml").read_text()
    assert signoff_first_line(reports).endswith(" — FAIL")
    seen.append(rid)
    # interrupted mid-gate (Ctrl-C on the second deployment check)
    with FakeVLLM(FakeConfig(max_tokens_cap=64)) as fake:
        result = pytester.runpytest_inprocess(
            "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
            f"--kvgate-reports={reports}", "--profile", str(FAKE_PROFILE), "--endpoint", fake.url,
            str(REPO / "suites" / "test_deployment.py"), plugins=[Interrupt("max-model-len")],
            no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    summary, rid = one_run_id(reports)
    xml = (reports / "junit.xml").read_text()
    assert summary["overall"] == "INCOMPLETE" and summary["not_run"]
    assert 'name="kvgate_overall" value="INCOMPLETE"' in xml and "run incomplete" in xml  # never green
    assert any(json.loads(p.read_text())["status"] == "broken" for p in (reports / "allure-results").glob("*-result.json"))
    assert signoff_first_line(reports).endswith(" — INCOMPLETE")
    assert "Gates that did not run: `fake-vllm/deployment/" in (reports / "signoff.md").read_text()
    seen.append(rid)
    assert len(set(seen)) == 4
    assert not (reports / "vllm-server.log").exists() and not (reports / "summary.json.tmp").exists()


def test_a_run_that_gates_nothing_keeps_the_recording_one_that_gates_replaces_it(pytester, tmp_path):
    """golden.json (a recording a later --baseline-reports compares with) survives a run that gates
    nothing -- an unreachable endpoint, a -m that names no marker, a typo in an option -- and goes
    with the rest of the previous run's reports once a run gates its first case."""
    reports = tmp_path / "reports"
    reports.mkdir()
    golden = reports / outputs.GOLDEN
    golden.write_text('{"recorded": "an earlier release"}')
    suites = str(REPO / "suites")
    for args in (("--endpoint", "http://127.0.0.1:9"), ("-m", "no_such_gate"), ("--gate-mode", "recrod")):
        result = run(pytester, reports, "--profile", "tiny-cpu", *args, suites)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, (args, result.outlines[-5:])
        assert read_summary(reports)["overall"] == "ERROR", args  # the run's own reports: ERROR, not the last green
        assert golden.read_text() == '{"recorded": "an earlier release"}', args
    result = run(pytester, reports, "--profile", "llama70b-tp4", "-m", "fit", suites)
    assert result.ret == pytest.ExitCode.OK
    assert not golden.exists()  # this run gated (fit) and recorded nothing: no other run's golden beside its summary


def test_a_bad_profile_run_sets_the_previous_gated_run_aside_whole_and_a_gated_run_clears_it(pytester, tmp_path):
    """A typo in --profile (exit 4, nothing gated) used to replace an 8-minute run's summary,
    junit.xml and allure-results with an empty ERROR set. Now that run's set moves whole into
    previous-run/ (its bytes, its run id) and the reports dir holds this run's ERROR set alone; a
    second typo keeps the gated run there, not the first typo's ERROR set; the next run that gates
    clears previous-run/ with the rest."""
    reports = tmp_path / "reports"
    suites = str(REPO / "suites")
    assert run(pytester, reports, "--profile", "tiny-cpu", "-m", "fit", suites).ret == pytest.ExitCode.OK
    gated = {n: (reports / n).read_bytes() for n in (outputs.SUMMARY, outputs.JUNIT)}
    gated_id = read_summary(reports)["run_id"]
    assert read_summary(reports)["overall"] == "PASS" and allure_run_ids(reports) == {gated_id}
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel: [unclosed\n")
    for typo in (1, 2):
        result = run(pytester, reports, f"--profile={bad}", "-m", "fit", suites)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.outlines[-5:]
        assert read_summary(reports)["overall"] == "ERROR", typo  # this run's own reports: ERROR
        assert junit_run_id(reports) == read_summary(reports)["run_id"] != gated_id
        prev = reports / outputs.PREVIOUS
        assert {n: (prev / n).read_bytes() for n in gated} == gated, typo  # the gated run's set, untouched
        assert allure_run_ids(prev) == {gated_id}
        assert not (reports / (outputs.PREVIOUS + ".tmp")).exists()
    # a run that clears the ERROR set and then gates nothing (an unreachable endpoint) keeps it too
    result = run(pytester, reports, "--profile", "tiny-cpu", "--endpoint", "http://127.0.0.1:9", suites)
    assert result.ret == pytest.ExitCode.USAGE_ERROR and read_summary(reports)["overall"] == "ERROR"
    assert {n: (reports / outputs.PREVIOUS / n).read_bytes() for n in gated} == gated
    assert run(pytester, reports, "--profile", "tiny-cpu", "-m", "fit", suites).ret == pytest.ExitCode.OK
    assert not (reports / outputs.PREVIOUS).exists() and read_summary(reports)["overall"] == "PASS"


def test_an_error_set_is_not_set_aside(tmp_path):
    """The other way: a previous ERROR set (or no summary) is no run's verdict worth keeping: it is
    left for clear(), and an earlier previous-run/ stays as it was."""
    reports = tmp_path / "reports"
    (reports / outputs.PREVIOUS).mkdir(parents=True)
    (reports / outputs.PREVIOUS / outputs.SUMMARY).write_text('{"overall": "PASS"}')
    (reports / outputs.SUMMARY).write_text('{"overall": "ERROR"}')
    assert outputs.set_aside(reports) is None
    assert (reports / outputs.PREVIOUS / outputs.SUMMARY).read_text() == '{"overall": "PASS"}'
    (reports / outputs.SUMMARY).unlink()
    assert outputs.set_aside(reports) is None


def test_collect_only_touches_no_reports(pytester, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "summary.json").write_text('{"overall": "PASS"}')
    result = run(pytester, reports, "--profile", "tiny-cpu", "--collect-only", "-q", str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.OK
    assert sorted(p.name for p in reports.iterdir()) == ["summary.json"]
    assert (reports / "summary.json").read_text() == '{"overall": "PASS"}'


def test_fit_gate_passing_with_a_part_not_checked_says_so(pytester, tmp_path):
    reports = tmp_path / "reports"
    result = run(pytester, reports, "--profile", "tiny-cpu", "-m", "fit", str(REPO / "suites"))
    result.assert_outcomes(passed=1)
    line = next(ln for ln in result.stdout.lines if ln.startswith("PASS") and "tiny-cpu/fit/kv-pool" in ln)
    assert line.endswith("-> PASS (1 part not checked: memory not declared)"), line
    summary = read_summary(reports)
    (gate,) = summary["gates"]
    assert gate["measured"] == {"value": 15, "unit": "sequences"} and gate["limit"] == {"value": 4, "unit": "sequences"}
    assert {c["gate"]: c["status"] for c in gate["checks"]} == {
        "fit.budget": "SKIP", "fit.max_model_len": "PASS", "fit.long": "PASS", "fit.max_num_seqs": "PASS"}
    assert gate["skipped_checks"] == [{"check": "fit.budget", "reason": "memory not declared"}]
    assert summary["skipped_checks"] == [{"id": "tiny-cpu/fit/kv-pool", "check": "fit.budget",
                                          "reason": "memory not declared"}]


# ---------------------------------------------------------------------------- quantities and schema
@pytest.mark.parametrize("value, unit, want", [
    (2049, "tokens", {"value": 2049, "unit": "tokens"}),
    (0.123456789, "s", {"value": 0.123457, "unit": "s"}),
    ("length", None, {"value": "length", "unit": None}),
    ("12.5 ms", None, {"value": 12.5, "unit": "ms"}),        # legacy "number unit" strings
    ("1,024 bytes", None, {"value": 1024, "unit": "bytes"}),
    (True, None, {"value": True, "unit": None}),
])
def test_quantity_is_one_value_with_its_unit(value, unit, want):
    assert quantity(value, unit, "why") == want


@pytest.mark.parametrize("value", [None, {"a": 1}, [1, 2], float("nan"), float("inf")])
def test_quantity_without_a_single_value_says_why(value):
    q = quantity(value, "ms", "no SLO")
    assert q["value"] is None and q["unit"] is None and "no SLO" in q["reason"]


def test_combine_keeps_parts_and_the_headline():
    parts = [Verdict("fit.budget", Status.SKIP, "memory not declared; pool from profile"),
             Verdict("fit.max_model_len", Status.PASS, "fits -> PASS", measured=100, limit=50, unit="tokens"),
             Verdict("fit.long", Status.PASS, "4 at once -> PASS", measured=4, limit=2, unit="sequences")]
    v = combine("fit", parts, headline="fit.long")
    assert v.status is Status.PASS and (v.measured, v.unit) == (4, "sequences")
    assert v.not_checked_note() == "1 part not checked: memory not declared"
    s = v.to_summary()
    assert s["checks"][0]["measured"] == {"value": None, "unit": None, "reason": "not measured: memory not declared"}
    assert s["skipped_checks"] == [{"check": "fit.budget", "reason": "memory not declared"}]
    failing = combine("fit", [*parts, Verdict("fit.x", Status.FAIL, "too big -> FAIL", measured=9, limit=8,
                                              unit="bytes")])
    assert failing.status is Status.FAIL and (failing.measured, failing.limit, failing.unit) == (9, 8, "bytes")


def test_every_kind_of_summary_validates():
    rec = RunRecord("p", "/x.yaml", Redactor(), run_id=outputs.new_run_id())
    rec.add("n1", "p/a", Verdict("a", Status.PASS, "ok -> PASS", measured=1, limit=2, unit="s"))
    rec.add("n2", "p/b", Verdict("b", Status.FAIL, "bad -> FAIL", measured={"x": 1}, limit=[1, 2]))
    rec.add("n3", "p/c", Verdict("c", Status.SKIP, "profile sets no SLO"))
    rec.add("n4", "p/d", Verdict("d", Status.INVALID, "client fell behind -> INVALID", measured="12.0 ms",
                                 limit="5.0 ms"))
    rec.error("n5", "p/e", "setup: boom")
    for running in (True, False):
        validate_summary(rec.summary(running=running))
    s = rec.summary()
    b = next(g for g in s["gates"] if g["id"] == "p/b")
    assert b["measured"]["value"] is None and b["evidence"]["measured_values"] == {"x": 1}
    assert next(g for g in s["gates"] if g["id"] == "p/d")["measured"] == {"value": 12.0, "unit": "ms"}
    assert {c["check"] for c in s["skipped_checks"]} == {"c"}
    rec.run_error = "endpoint x is unreachable"
    assert validate_summary(rec.summary())["overall"] == "ERROR"


def test_run_ids_are_distinct_and_sortable():
    a, b = outputs.new_run_id(lambda: 1_700_000_000.0), outputs.new_run_id(lambda: 1_700_000_001.0)
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}", a) and a[:16] < b[:16]


# ---------------------------------------------------------------------------- options, markers, README
def test_option_given_with_a_space_is_detected(tmp_path):
    args = ["--profile", "tiny-cpu", "--kvgate-reports", str(tmp_path), "--profile-dir=x", "--alluredir", "nope"]
    assert given_with_space(args) == [("--kvgate-reports", str(tmp_path))]


def test_path_option_read_as_test_path_is_refused_naming_it(pytester, tmp_path):
    out = tmp_path / "some-dir"
    out.mkdir()
    # no -c/--rootdir: pytest picks its rootdir from the bare path, as it does for a user
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--profile", "tiny-cpu", "--kvgate-reports",
                                          str(out))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert f"--kvgate-reports {out} as a test path" in err and f"--kvgate-reports={out}" in err


def test_markers_are_listed_once(pytester):
    result = pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO),
                                          "-p", "no:cacheprovider", "--markers")
    lines = result.stdout.lines
    for marker in ("fit", "deployment", "max_context", "max_tokens", "streaming", "disconnect", "load", "soak",
                   "gate", "e2e"):
        n = sum(1 for ln in lines if ln.startswith(f"@pytest.mark.{marker}:") or ln.startswith(f"@pytest.mark.{marker}("))
        assert n == 1, (marker, n)


def kvgate_help_options() -> list[str]:
    """The options ``pytest --help`` lists under kvgate's group."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=60).stdout
    section = out.split("kvgate deployment conformance:", 1)[1].split("\n\n", 1)[0]
    return sorted(set(re.findall(r"(--[a-z][a-z-]+)", section)))


def test_readme_lists_every_kvgate_option():
    options = kvgate_help_options()
    assert "--kvgate-reports" in options and "--endpoint" in options
    readme = (REPO / "README.md").read_text()
    missing = [o for o in options if o not in readme]
    assert not missing, f"README does not mention {missing}"
    # every path option is written with '=' wherever the README gives it a value
    # (except where it shows the wrong form, saying so: "... (with a space)")
    lines = [ln for ln in readme.splitlines() if "with a space" not in ln]
    for opt in ("--kvgate-reports", "--profile-dir", "--log"):
        assert not [ln for ln in lines if re.search(rf"{opt} [A-Za-z/.~$]", ln)], f"README writes {opt} with a space"
    assert not [ln for ln in lines if re.search(r"--profile [./~]", ln)], "README gives a profile path after a space"


class PreflightFailsAfterLaunch:
    """What the endpoint fixture does when the embedded server came up but fails its preflight:
    ERROR reports (keeping this run's server log), then exit as a usage error."""

    def pytest_runtest_setup(self, item):
        from kvgate.run.session import current as state, write_error_reports

        st = state(item.config)
        (st.reports_dir / "vllm-server.log").write_text("this run's vLLM log\n")
        msg = "endpoint http://127.0.0.1:1/v1 serves 'other', not the profile's model; nothing was gated"
        write_error_reports(item.config, msg)
        pytest.exit(msg, returncode=pytest.ExitCode.USAGE_ERROR)


def test_error_after_launch_keeps_this_runs_server_log(pytester, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "vllm-server.log").write_text("the previous run's log\n")
    result = pytester.runpytest_inprocess(
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
        f"--kvgate-reports={reports}", "--profile", "tiny-cpu", "-m", "fit", str(REPO / "suites"),
        plugins=[PreflightFailsAfterLaunch()])
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    summary, rid = one_run_id(reports)
    assert summary["overall"] == "ERROR" and "not the profile's model" in summary["error"]
    xml = (reports / "junit.xml").read_text()
    assert 'errors="1"' in xml and "not the profile's model" in xml and "kv-pool" not in xml
    assert (reports / "vllm-server.log").read_text() == "this run's vLLM log\n"


def test_clear_removes_the_previous_runs_soak_files_too(tmp_path):
    """A soak plot or round CSV of an earlier run must not sit beside this run's verdict."""
    for name in (*outputs.SOAK_FILES, outputs.SUMMARY, outputs.JUNIT):
        (tmp_path / name).write_text("old run")
    (tmp_path / "mine.txt").write_text("not kvgate's")
    removed = {p.name for p in outputs.clear(tmp_path)}
    assert set(outputs.SOAK_FILES) <= removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


def test_headline_of_a_run_interrupted_before_any_server_names_the_phase():
    rec = RunRecord("tiny-cpu", None, Redactor())
    rec.interrupted_in = "launch"
    assert rec.headline() == "kvgate tiny-cpu: interrupted during launch before any server was contacted"


def test_refused_bare_profile_path_writes_the_error_into_the_projects_reports(pytester, tmp_path):
    """`pytest --profile /elsewhere/x.yaml` run in a project: pytest takes the path for a test path
    and roots the run elsewhere; kvgate refuses, and replaces the *project's* reports (cwd), never
    `<elsewhere>/reports`."""
    pytester.makefile(".toml", pyproject="[project]\nname = 'someproject'\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    prof = elsewhere / "x.yaml"
    prof.write_text("extends: tiny-cpu\n")
    (pytester.path / "reports").mkdir()
    (pytester.path / "reports" / "junit.xml").write_text("<testsuite name='old green run'/>")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--profile", str(prof))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert not (elsewhere / "reports").exists()
    assert read_summary(pytester.path / "reports")["overall"] == "ERROR"
    assert "old green run" not in (pytester.path / "reports" / "junit.xml").read_text()


def test_a_second_run_into_a_reports_dir_another_run_is_writing_is_refused_in_one_line(pytester, tmp_path):
    # two runs into one dir mixed silently: both exit 0, allure-results held two run ids, the second
    # left no summary of its own (CI runners sharing a workspace)
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "summary.json").write_text('{"overall": "RUNNING"}')
    other = outputs.hold(reports, "20261203T041000Z-aaaaaa")  # the first run, still writing
    try:
        result = run(pytester, reports, "--profile", "llama70b-tp4", "-m", "fit", str(REPO / "suites"))
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        err = [ln for ln in result.stderr.lines if "another kvgate run" in ln]
        assert len(err) == 1 and "run 20261203T041000Z-aaaaaa" in err[0] and "--kvgate-reports=DIR" in err[0]
        assert sorted(p.name for p in reports.iterdir()) == [outputs.LOCK, "summary.json"]
        assert (reports / "summary.json").read_text() == '{"overall": "RUNNING"}'  # the first run's, untouched
    finally:
        os.close(other)
    result = run(pytester, reports, "--profile", "llama70b-tp4", "-m", "fit", str(REPO / "suites"))
    assert result.ret == pytest.ExitCode.OK  # the first run ended: its lock went with it
    assert read_summary(reports)["overall"] == "PASS"
    again = outputs.hold(reports, "x")  # and this run released it when it ended
    os.close(again)


def test_the_phases_table_folds_the_gates_that_took_no_time():
    # the main job's phases table was 90 lines, 57 of them 0.00
    rec = RunRecord("tiny", None, Redactor())
    rec.phases = [{"name": "collect", "seconds": 0.01, "status": "done"},
                  {"name": "launch", "seconds": 21.5, "status": "done"},
                  *({"name": f"gate tiny/x/{i}", "seconds": 0.001, "status": "done"} for i in range(57)),
                  {"name": "gate tiny/soak/memory", "seconds": 80.2, "status": "done"},
                  {"name": "gate tiny/drain/in-flight", "seconds": 0.0, "status": "interrupted"}]
    lines = rec.phase_lines()
    assert len(lines) == 6, lines
    assert lines[1].split() == ["collect", "0.01"] and lines[3].split() == ["gate", "tiny/soak/memory", "80.20"]
    assert "(interrupted)" in lines[4]
    assert lines[5] == "  (57 more, each under 0.05 s: 0.06 s together; all in summary.json phases)"


def test_long_pass_lines_lose_their_middle_fail_lines_stay_whole():
    # the main job printed 48 verdict lines over 200 characters, up to 773
    rec = RunRecord("tiny", None, Redactor())
    words = " ".join(f"w{i}" for i in range(150))
    rec.add("a", "tiny/requests/body-size", Verdict("requests/body-size", Status.PASS, f"bodies {words} -> PASS (ok)"))
    rec.add("b", "tiny/streaming/ttft/chat", Verdict("streaming/ttft", Status.FAIL, f"TTFT {words} -> FAIL"))
    lines = rec.table()
    passed = next(ln for ln in lines if ln.startswith("PASS"))
    failed = next(ln for ln in lines if ln.startswith("FAIL"))
    assert len(passed) <= 200 and passed.endswith(" -> PASS (ok)") and " … " in passed and "bodies w0 w1" in passed
    assert failed.endswith(f"TTFT {words} -> FAIL")
    assert "(1 PASS/SKIP line shortened to 200 characters; every message whole in summary.json" in "\n".join(lines)


#: A ``-m fit`` gate (no server) whose verdicts state causes, one quoting an auth header an endpoint echoed.
CAUSED = '''
import pytest
from kvgate.verdict import Status, Verdict

CASES = {
    "dtype": ("FAIL", "2-byte KV elements: the server runs bfloat16/float16, the profile says float32 "
                      "(Authorization: Bearer sk-cause-secret-0123456789 echoed by the gateway)"),
    "soak": ("INCONCLUSIVE", "the soak is too short to decide: ~14 rounds would"),
    "bare": ("INVALID", None),
    "fine": ("PASS", None),
}

@pytest.mark.fit
@pytest.mark.gate("caused", cases=list(CASES))
def test_caused(kvgate_gate, case):
    status, cause = CASES[case]
    kvgate_gate(Verdict("caused/" + case, Status(status), case + " measured -> " + status, measured=3, limit=5,
                        unit="ms", cause=cause))
'''


def test_the_cause_reaches_every_output_redacted(pytester):
    from kvgate.report.signoff import write_signoff

    pytester.makepyfile(test_caused=CAUSED)
    reports = pytester.path / "reports"
    result = run(pytester, reports, "-p", "fixtures.endpoint", f"--profile={FAKE_PROFILE}", "-m", "fit",
                 str(pytester.path / "test_caused.py"))
    out = result.stdout.str()
    assert "sk-cause-secret" not in out
    lines = result.stdout.lines
    fail = next(i for i, ln in enumerate(lines) if re.match(r"FAIL +fake-vllm/caused/dtype ", ln))
    assert lines[fail + 1] == ("         cause: 2-byte KV elements: the server runs bfloat16/float16, the profile says "
                               "float32 (Authorization: Bearer *** echoed by the gateway)")
    inconclusive = next(i for i, ln in enumerate(lines) if re.match(r"INCONCLUSIVE +fake-vllm/caused/soak ", ln))
    assert lines[inconclusive + 1] == "         cause: the soak is too short to decide: ~14 rounds would"
    bare = next(i for i, ln in enumerate(lines) if re.match(r"INVALID +fake-vllm/caused/bare ", ln))
    assert "cause:" not in lines[bare + 1]  # no cause stated, no cause line
    # summary.json: the gate's cause, redacted
    gates = {g["id"]: g for g in read_summary(reports)["gates"]}
    assert gates["fake-vllm/caused/dtype"]["cause"].endswith("(Authorization: Bearer *** echoed by the gateway)")
    assert "cause" not in gates["fake-vllm/caused/bare"] and "cause" not in gates["fake-vllm/caused/fine"]
    # JUnit: a property, and the failure text's last line
    xml = (reports / "junit.xml").read_text()
    assert "sk-cause-secret" not in xml
    assert '<property name="kvgate_cause" value="the soak is too short to decide: ~14 rounds would"' in xml
    assert xml.count('name="kvgate_cause"') == 2
    assert "dtype measured -&gt; FAIL&#10;cause: 2-byte KV elements" in xml or \
        "dtype measured -> FAIL\ncause: 2-byte KV elements" in xml, xml[:3000]
    # Allure: the description and a parameter
    results = [json.loads(p.read_text()) for p in (reports / "allure-results").glob("*-result.json")]
    dtype = next(r for r in results if r["name"] == "fake-vllm/caused/dtype")
    assert "**Cause:** 2-byte KV elements" in dtype["description"] and "sk-cause-secret" not in json.dumps(results)
    assert {"name": "cause", "value": dtype["description"].split("**Cause:** ", 1)[1].split("\n")[0],
            "excluded": True} in [{k: p.get(k) for k in ("name", "value", "excluded")} for p in dtype["parameters"]]
    # signoff.md: a cause column for every row that did not pass
    md = write_signoff(reports).read_text()
    assert "sk-cause-secret" not in md
    assert "| status | gate | measured | limit | passes when | verdict | cause |" in md
    soak = next(ln for ln in md.splitlines() if "`fake-vllm/caused/soak`" in ln)
    assert soak.endswith("| soak measured -> INCONCLUSIVE | the soak is too short to decide: ~14 rounds would |")
    assert next(ln for ln in md.splitlines() if "`fake-vllm/caused/bare`" in ln).endswith(" | - |")
    # record mode: the xfail reason carries the cause too
    record = run(pytester, pytester.path / "rec", "-p", "fixtures.endpoint", f"--profile={FAKE_PROFILE}", "-m", "fit",
                 "--gate-mode=record", "-rx", str(pytester.path / "test_caused.py"))
    assert "the soak is too short to decide" in record.stdout.str() and "sk-cause-secret" not in record.stdout.str()
