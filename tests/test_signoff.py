"""reports/signoff.md (kvgate.report.signoff) for a passing, a failing and an interrupted run, and
``kvgate report`` around it (kvgate.cli.report, kvgate.report.render) with the Allure CLI injected."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json

import pytest
import subprocess
from pathlib import Path

from kvgate.cli import report as cli_report

from kvgate.report import render
from kvgate.report.redact import Redactor
from kvgate.report.record import RunRecord
from kvgate.report.signoff import fit_table_from_results, signoff_markdown, write_signoff
from kvgate.verdict import Status, Verdict

from .conftest import validate_summary

FIT_TABLE = "per GPU          GiB\nweights         0.01\nKV pool         0.06\n"


def record(tmp_path: Path, *verdicts: tuple[str, Verdict]) -> RunRecord:
    prof = tmp_path / "tiny.yaml"
    prof.write_text("model: {served_name: m}\n")
    rec = RunRecord("tiny", str(prof), Redactor(["sk-signoff-secret-123456"]), endpoint="http://127.0.0.1:8000/v1",
                    server_version="0.32.0", run_id="20261130T000000Z-abcdef", endpoint_contacted=True)
    for test_id, v in verdicts:
        rec.add(f"suites/x.py::t[{test_id}]", test_id, v)
    return rec


def kv_pass() -> Verdict:
    return Verdict("fit", Status.PASS, "KV pool holds 15 full-length sequences; profile declares 4 -> PASS",
                   measured=15, limit=4, unit="sequences",
                   parts=(Verdict("fit.budget", Status.SKIP, "memory not declared -> SKIP"),
                          Verdict("fit.long", Status.PASS, "15 at once -> PASS", 15, 4, unit="sequences")))


def ttft_fail() -> Verdict:
    return Verdict("streaming/ttft", Status.FAIL, "TTFT 742 ms; SLO 500 ms -> FAIL", measured=742.0, limit=500,
                   unit="ms")


def test_passing_run_says_pass_with_identity_fit_table_and_what_was_not_checked(tmp_path):
    summary = validate_summary(record(tmp_path, ("tiny/fit/kv-pool", kv_pass())).summary())
    md = signoff_markdown(summary, FIT_TABLE)
    assert md.startswith("## kvgate sign-off: tiny @ http://127.0.0.1:8000/v1 — PASS")
    assert "| overall | **PASS** (1 PASS, 0 FAIL, 0 INVALID, 0 SKIP, 0 ERROR) |" in md
    assert "| server | vLLM 0.32.0 |" in md and "`tiny.yaml`, sha256 " in md and "20261130T000000Z-abcdef" in md
    assert "| PASS | `tiny/fit/kv-pool` | 15 sequences | 4 sequences | measured >= limit | KV pool holds 15" in md
    assert "```\nper GPU          GiB\nweights         0.01\nKV pool         0.06\n```" in md
    assert "- `tiny/fit/kv-pool`: fit.budget — memory not declared" in md
    assert len(md.splitlines()) < 40  # short enough for a PR comment


def test_failing_run_says_do_not_roll_out_and_names_measured_and_limit(tmp_path):
    summary = validate_summary(record(tmp_path, ("tiny/fit/kv-pool", kv_pass()),
                                      ("tiny/streaming/ttft/chat", ttft_fail())).summary())
    md = signoff_markdown(summary, None)
    assert "— FAIL" in md.splitlines()[0] and "do not roll out" in md
    assert "| FAIL | `tiny/streaming/ttft/chat` | 742 ms | 500 ms | measured <= limit | TTFT 742 ms; SLO 500 ms -> FAIL | - |" \
        in md  # no cause stated: the cause column says so
    assert "The fit gate did not run in this run." in md


def test_interrupted_run_lists_the_gates_that_did_not_run(tmp_path):
    rec = record(tmp_path, ("tiny/fit/kv-pool", kv_pass()))
    rec.complete, rec.interrupted_in = False, "gate tiny/streaming/ttft/chat"
    rec.not_run = ["tiny/streaming/ttft/chat", "tiny/latency/slo"]
    summary = validate_summary(rec.summary())
    md = signoff_markdown(summary, FIT_TABLE)
    assert "— INCOMPLETE" in md.splitlines()[0] and "no sign-off" in md
    assert "**Interrupted during gate tiny/streaming/ttft/chat.** Gates that did not run: " \
           "`tiny/streaming/ttft/chat`, `tiny/latency/slo`" in md
    assert "- `tiny/latency/slo`: not run (the run ended before it)" in md


def test_run_that_could_not_start_says_error(tmp_path):
    rec = record(tmp_path)
    rec.run_error = "endpoint http://127.0.0.1:9/v1 is unreachable; nothing was gated"
    md = signoff_markdown(validate_summary(rec.summary()), None)
    assert "— ERROR" in md.splitlines()[0] and "**Error:** endpoint http://127.0.0.1:9/v1 is unreachable" in md
    assert "No gate recorded a verdict." in md


def test_a_fail_reads_in_full_a_pass_is_cut_and_pipes_escaped(tmp_path):
    # a release owner must learn why from signoff.md: the FAIL row was cut at ~140 characters
    long = Verdict("x", Status.FAIL, "a | b " + "word " * 80 + "6 drifted -> FAIL", measured=1, limit=0, unit="tokens")
    ok = Verdict("y", Status.PASS, "c " + "word " * 80 + "-> PASS", measured=1, limit=2, unit="tokens")
    md = signoff_markdown(record(tmp_path, ("tiny/x/y", long), ("tiny/y/z", ok)).summary())
    row = next(ln for ln in md.splitlines() if "`tiny/x/y`" in ln)
    assert "a \\| b word" in row and row.endswith("6 drifted -> FAIL | - |")
    assert "| measured <= limit |" in row  # 1 token against 0 allowed failed: it passes at or below
    passed = next(ln for ln in md.splitlines() if "`tiny/y/z`" in ln)
    assert passed.endswith(" … |") and len(passed) < 260 and "| measured <= limit |" in passed


def test_not_checked_reasons_are_whole_not_their_first_clause(tmp_path):
    whole = Verdict("metrics", Status.SKIP, "no /metrics on this server; it answered 404 at /metrics -> SKIP")
    part = Verdict("fit", Status.PASS, "fits -> PASS", parts=(
        Verdict("fit.budget", Status.SKIP, "memory not declared; hardware.memory_gib is unset -> SKIP"),))
    md = signoff_markdown(validate_summary(record(tmp_path, ("tiny/metrics", whole), ("tiny/fit", part)).summary()))
    assert "- `tiny/metrics`: metrics — no /metrics on this server; it answered 404 at /metrics" in md
    assert "- `tiny/fit`: fit.budget — memory not declared; hardware.memory_gib is unset" in md


def window(share: float, wall_s: float = 4.0):
    """A measured window as the contention sampler returns it: ``share`` of CPU 0 to other processes."""
    from kvgate.host.contention import HostContention

    return HostContention(True, None, wall_s, (0,), {0: wall_s}, {0: wall_s * (0.9 - share)}, {0: wall_s * 0.1},
                          {0: wall_s * share}, wall_s * (0.9 - share), 0.4, 0.0, 5, 3.2, "test")


def observed(name: str, host):
    """What :func:`kvgate.gates.load.host_evidence` reads of a load observation: its name and trace.host."""
    from types import SimpleNamespace

    return SimpleNamespace(name=name, trace=SimpleNamespace(host=host))


def latency_verdicts(*windows):
    """Latency verdicts whose evidence the load gates' own writer made (one entry per window), the
    second folded from two parts as latency/slo is (each part repeats its window)."""
    from kvgate.gates.load import host_evidence
    from kvgate.verdict import combine

    alone, mixed, slo = (observed(n, w) for n, w in zip(("alone", "mixed", "slo"), windows))
    inter = Verdict("latency/interference", Status.PASS, "short TTFT p95 90 ms -> PASS", measured=90.0, limit=3000,
                    unit="ms", evidence={"host_contention": host_evidence(alone, mixed)})
    part = Verdict("latency/slo.ttft", Status.PASS, "TTFT p95 40 ms -> PASS", measured=40.0, limit=500, unit="ms",
                   evidence={"host_contention": host_evidence(slo)})
    return inter, combine("latency/slo", [part, dataclasses.replace(part, gate="latency/slo.e2e")])


def test_signoff_names_kvgate_the_server_command_the_contention_and_what_certify_means(tmp_path):
    inter, slo = latency_verdicts(window(0.031), window(0.12), window(0.05))
    rec = record(tmp_path, ("tiny/latency/interference", inter), ("tiny/latency/slo", slo))
    rec.launch = {"mode": "embedded", "command": ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]}
    summary = validate_summary(rec.summary())
    assert summary["kvgate"]["version"] and "commit" in summary["kvgate"]
    md = signoff_markdown(summary)
    assert "| kvgate | " in md and ("commit `" in md or "commit unknown" in md)
    assert "| server command | `python -m vllm.entrypoints.openai.api_server --model /m` |" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| host contention |"))
    # the worst window's own figures, which window, of how many (the folded slo verdict's window once)
    assert row == ("| host contention | 12% of the server's CPUs (CPU 0) went to other processes over 4.0 s (CPU 0: "
                   "12%); server tree 3.1 CPU-s, kvgate 0.4 CPU-s on them; run queue up to 5 -- the worst of 3 "
                   "measured windows: `tiny/latency/interference` (mixed) |"), row
    assert "not that a deployment you serve does" in md and "can never read CERTIFIED" in md
    served = record(tmp_path, ("tiny/deployment/spec", Verdict("deployment/spec", Status.PASS, "ok -> PASS", evidence={
        "checks": [{"spec_argv": ["vllm", "serve", "m", "--max-num-seqs", "32"]}]})))
    md = signoff_markdown(served.summary())
    assert "| server command | `vllm serve m --max-num-seqs 32` |" in md and "not that a deployment" not in md


def test_secret_never_reaches_signoff(tmp_path):
    leaky = Verdict("x", Status.FAIL, "server echoed Bearer sk-signoff-secret-123456 -> FAIL")
    md = signoff_markdown(record(tmp_path, ("tiny/x/y", leaky)).summary(),
                          redactor=Redactor(["sk-signoff-secret-123456"]))
    assert "sk-signoff-secret-123456" not in md


def write_run(tmp_path: Path, *verdicts: tuple[str, Verdict]) -> Path:
    reports = tmp_path / "reports"
    results = reports / "allure-results"
    results.mkdir(parents=True)
    record(tmp_path, *verdicts).write_summary(reports / "summary.json")
    (results / "a-attachment.txt").write_text(FIT_TABLE)
    (results / "r-result.json").write_text(json.dumps(
        {"name": "tiny/fit/kv-pool", "status": "passed",
         "attachments": [{"name": "fit-table.txt", "source": "a-attachment.txt", "type": "text/plain"}]}))
    return reports


def test_write_signoff_takes_the_fit_table_the_run_printed(tmp_path):
    reports = write_run(tmp_path, ("tiny/fit/kv-pool", kv_pass()))
    assert fit_table_from_results(reports / "allure-results") == FIT_TABLE
    assert fit_table_from_results(tmp_path / "nowhere") is None
    text = write_signoff(reports).read_text()
    assert "KV pool         0.06" in text


def args(reports: Path, **kw) -> argparse.Namespace:
    return argparse.Namespace(reports=str(reports), output=kw.get("output"), single_file=False,
                              signoff_only=kw.get("signoff_only", False))


def test_report_without_summary_is_a_usage_error(tmp_path):
    err = io.StringIO()
    assert cli_report.run_report(args(tmp_path), out=io.StringIO(), err=err) == cli_report.USAGE
    assert "no summary.json in" in err.getvalue()


@pytest.mark.parametrize("kind", ["reports-is-a-file", "gates-a-string", "gates-of-strings", "counts-a-string"])
def test_report_on_something_that_is_not_a_run_is_one_line_not_a_traceback(tmp_path, kind):
    if kind == "reports-is-a-file":
        target = tmp_path / "profile.yaml"
        target.write_text("model: {}\n")
    else:
        target = tmp_path
        gates = "oops" if kind == "gates-a-string" else [] if kind == "counts-a-string" else ["oops"]
        (tmp_path / "summary.json").write_text(json.dumps({"overall": "PASS", "gates": gates, "counts": "x",
                                                           "skipped_checks": "x"}))
    err = io.StringIO()
    assert cli_report.run_report(args(target, signoff_only=True), out=io.StringIO(), err=err) == cli_report.USAGE
    assert len(err.getvalue().strip().splitlines()) == 1 and "Traceback" not in err.getvalue()


def test_report_takes_the_runs_own_kvgate_reports_spelling_too(tmp_path, capsys):
    # a newcomer who ran `pytest --kvgate-reports=DIR` writes the same option here: it was refused
    from kvgate.cli.main import main as kvgate_main

    reports = write_run(tmp_path, ("tiny/fit/kv-pool", kv_pass()))
    assert kvgate_main(["report", f"--kvgate-reports={reports}", "--signoff-only"]) == cli_report.OK
    assert capsys.readouterr().out == f"kvgate report: {reports / 'signoff.md'} (overall PASS)\n"


def test_report_without_allure_cli_writes_signoff_and_says_how_to_get_it(tmp_path):
    reports = write_run(tmp_path, ("tiny/fit/kv-pool", kv_pass()))
    err = io.StringIO()
    code = cli_report.run_report(args(reports), out=io.StringIO(), err=err, find=lambda: None)
    assert code == cli_report.FAILED and (reports / "signoff.md").is_file()
    assert "Allure 3 CLI was not found" in err.getvalue() and "./bootstrap" in err.getvalue()
    assert cli_report.run_report(args(reports, signoff_only=True), out=io.StringIO(), err=io.StringIO(),
                                 find=lambda: None) == cli_report.OK


def test_html_hint_names_the_installed_allure_quoted_not_npx(tmp_path):
    # `npx allure open reports/allure-report` ignored the Allure ./bootstrap installed: npx tries to
    # download it, which fails offline (a GPU runner); the printed path was unquoted
    reports = write_run(tmp_path / "my reports", ("tiny/fit/kv-pool", kv_pass()))
    allure = str(tmp_path / "v env" / "allure" / "node_modules" / ".bin" / "allure")
    out = io.StringIO()
    cli_report.run_report(args(reports), out=out, err=io.StringIO(), find=lambda: [allure],
                          render_fn=lambda *a, **k: None)
    want = f"'{allure}' open '{reports / 'allure-report'}'"
    assert f"serve it over HTTP: {want}" in out.getvalue() and "npx" not in out.getvalue()
    assert f"(serve it over HTTP: `{want}`)" in (reports / "signoff.md").read_text()
    served = subprocess.run(["bash", "-c", f"printf '%s\\n' {want}"], capture_output=True, text=True).stdout
    assert served.splitlines() == [allure, "open", str(reports / "allure-report")]  # the shell reads it as written


class FakeAllure:
    """Stands in for ``allure generate``: records the config it was given, writes index.html and
    appends one history line (as Allure does to its historyPath)."""

    def __init__(self, returncode: int = 0) -> None:
        self.configs: list[dict] = []
        self.returncode = returncode

    def __call__(self, cmd, **kw):
        config = json.loads(Path(cmd[cmd.index("--config") + 1]).read_text())
        self.configs.append(config)
        out = Path(cmd[cmd.index("--output") + 1])
        if self.returncode == 0:
            out.mkdir(parents=True)
            (out / "index.html").write_text(f"<title>{config['name']}</title>")
            with open(config["historyPath"], "a") as f:
                f.write(json.dumps({"run": len(self.configs)}) + "\n")
        return subprocess.CompletedProcess(cmd, self.returncode, "", "boom: bad results\n")


def test_render_names_the_report_after_the_run_and_carries_history(tmp_path):
    reports = write_run(tmp_path, ("tiny/streaming/ttft/chat", ttft_fail()))
    summary = json.loads((reports / "summary.json").read_text())
    name = render.report_name(summary)
    assert name == "kvgate tiny @ http://127.0.0.1:8000/v1 — FAIL"
    fake = FakeAllure()
    out = reports / "allure-report"
    (out).mkdir()
    (out / "stale.js").write_text("old")
    for _ in range(2):
        render.render(reports / "allure-results", out, name, ["allure"], run=fake)
    assert not (out / "stale.js").exists(), "the previous report is replaced as a whole"
    assert [json.loads(ln) for ln in (out / "history.jsonl").read_text().splitlines()] == [{"run": 1}, {"run": 2}]
    cfg = fake.configs[-1]
    assert cfg["name"] == name and cfg["plugins"]["awesome"]["options"]["groupBy"] == ["epic", "feature", "story"]


def test_render_failure_is_one_line_and_keeps_the_previous_report(tmp_path):
    reports = write_run(tmp_path, ("tiny/fit/kv-pool", kv_pass()))
    out = reports / "allure-report"
    out.mkdir()
    (out / "index.html").write_text("previous")
    try:
        render.render(reports / "allure-results", out, "n", ["allure"], run=FakeAllure(returncode=1))
    except render.RenderError as exc:
        assert "allure generate failed (exit 1): boom: bad results" == str(exc)
    else:
        raise AssertionError("a failing CLI must raise RenderError")
    assert (out / "index.html").read_text() == "previous"
    empty = tmp_path / "empty"
    empty.mkdir()
    try:
        render.render(empty, out, "n", ["allure"], run=FakeAllure())
    except render.RenderError as exc:
        assert "no Allure results in" in str(exc)
    else:
        raise AssertionError("no results must raise RenderError")


def test_find_allure_prefers_env_then_bootstrap_install_then_path(tmp_path):
    local = tmp_path / "allure" / "node_modules" / ".bin" / "allure"
    assert render.find_allure({"KVGATE_ALLURE": "/x/allure"}, str(tmp_path)) == ["/x/allure"]
    assert render.find_allure({}, str(tmp_path), which=lambda n: None) is None
    local.parent.mkdir(parents=True)
    local.write_text("#!/bin/sh\n")
    assert render.find_allure({}, str(tmp_path), which=lambda n: "/usr/bin/" + n) == [str(local)]
    assert render.find_allure({}, str(tmp_path), which=lambda n: None) is None  # no node to run it
    assert render.find_allure({}, str(tmp_path / "none"), which=lambda n: "/usr/bin/" + n) == ["/usr/bin/allure"]


@pytest.mark.parametrize("launch, contacted, words", [
    ({"mode": "embedded", "startup_s": 9.0, "command": ["vllm"]}, True, "embedded vLLM, started by kvgate"),
    ({"mode": "embedded", "error": "embedded vLLM exited with code 1 during startup", "command": []}, False,
     "embedded vLLM: kvgate's launch failed, nothing gated"),
    ({"mode": "docker", "image": "vllm/vllm-openai", "command": ["docker"]}, True, "vLLM in docker, started by kvgate"),
    ({}, True, "gated with --endpoint"),
    ({}, False, "not contacted"),
])
def test_the_endpoint_row_says_started_by_kvgate_only_for_a_launch_that_succeeded(tmp_path, launch, contacted, words):
    rec = record(tmp_path, ("tiny/fit/kv-pool", kv_pass()))
    rec.launch, rec.endpoint_contacted = launch, contacted
    md = signoff_markdown(validate_summary(rec.summary()), FIT_TABLE)
    assert f"| endpoint | http://127.0.0.1:8000/v1 ({words}) |" in md, md
    assert ("The server was launched by kvgate" in md) is (words.endswith("started by kvgate")), md


def test_contention_row_is_there_in_every_run_saying_why_not_measured(tmp_path):
    from kvgate.host.contention import for_endpoint

    remote = for_endpoint(type("Endpoint", (), {"server_pids": (), "managed": False})()).stop()  # --endpoint
    inter, slo = latency_verdicts(remote, remote, remote)
    md = signoff_markdown(validate_summary(record(tmp_path, ("tiny/latency/interference", inter),
                                                  ("tiny/latency/slo", slo)).summary()))
    assert ("| host contention | not measured (the server was not launched by kvgate (--endpoint): its processes and "
            "CPUs are not visible to kvgate; 3 windows) |") in md
    # one window measured, one not (a sampler that lost psutil access): the measured one, the other counted
    inter, slo = latency_verdicts(window(0.02), for_endpoint(type("E", (), {"server_pids": (), "managed": True})()).stop(),
                                  window(0.01))
    md = signoff_markdown(record(tmp_path, ("tiny/latency/interference", inter), ("tiny/latency/slo", slo)).summary())
    assert "-- the worst of 2 measured windows: `tiny/latency/interference` (alone); 1 not measured |" in md
    # no load gate ran: said, for --endpoint and for a run with no server
    fit_only = record(tmp_path, ("tiny/fit/kv-pool", kv_pass()))
    assert ("| host contention | not measured (no load gate ran; and with --endpoint the server is not on this host: "
            "kvgate cannot see its processes) |") in signoff_markdown(fit_only.summary())
    fit_only.endpoint = None
    assert ("| host contention | not measured (no load gate ran: the latency windows and the capacity steps measure "
            "it) |") in signoff_markdown(fit_only.summary())


def test_contention_row_reads_the_capacity_steps_windows(tmp_path):
    from kvgate.gates.capacity import StepResult

    steps = [StepResult(c, 59, 59, 0, 2.0, "PASS", {}, 29.5, 100.0, 29.5, 59, host_contention=window(share).to_dict())
             for c, share in ((4, 0.02), (8, 0.07))]
    knee = Verdict("capacity/knee", Status.PASS, "knee 8 -> PASS", measured=8, limit=8, unit="requests",
                   evidence={"steps": [s.to_dict() for s in steps]})
    md = signoff_markdown(validate_summary(record(tmp_path, ("tiny/capacity/knee", knee)).summary()))
    assert "7% of the server's CPUs (CPU 0) went to other processes" in md
    assert "the worst of 2 measured windows: `tiny/capacity/knee` (concurrency 8) |" in md


def floor_pass() -> Verdict:
    """An interference PASS taken at slo.pass_confidence_floor: the judgement's evidence as
    kvgate.stats.dependence.DependentJudgement.to_dict writes it."""
    return Verdict("latency/interference", Status.PASS,
                   "short-request TTFT p95 3,122 ms, 60% upper bound 3,687 ms (n=19) <= 6,000 ms -> PASS; "
                   + "word " * 40 + "-> PASS", measured=3122.0, limit=6000.0, unit="ms",
                   evidence={"confidence": {"decision": "PASS", "upper_confidence": 0.6, "confidence": 0.975,
                                            "pass_confidence_achieved": 0.6226, "pass_confidence_floor_used": 0.6,
                                            "pass_confidence_stated": 0.95}})


def test_a_pass_at_the_floor_says_its_confidence_first_everywhere_a_plain_pass_does_not(tmp_path):
    v = floor_pass()
    assert v.message.startswith("PASS at 62% confidence (below the 95% slo.confidence asks: too few independent "
                                "samples; slo.pass_confidence_floor 0.6) -- short-request TTFT p95"), v.message
    assert v.evidence["pass_confidence"] == {"achieved": 0.6226, "floor": 0.6, "stated": 0.95}
    # a PASS at slo.confidence (no floor used) is a plain one: no field, no prefix
    plain = Verdict("latency/interference", Status.PASS, "p95 1 ms -> PASS",
                    evidence={"confidence": {"decision": "PASS", "pass_confidence_floor_used": None}})
    assert "pass_confidence" not in plain.evidence and plain.message == "p95 1 ms -> PASS"
    rec = record(tmp_path, ("tiny/latency/interference", v), ("tiny/fit/kv-pool", kv_pass()))
    summary = validate_summary(rec.summary())  # the schema allows the field
    gate = next(g for g in summary["gates"] if g["id"] == "tiny/latency/interference")
    assert gate["evidence"]["pass_confidence"]["achieved"] == 0.6226
    md = signoff_markdown(summary, None)
    section = md.split("### Passed at a lower confidence than slo.confidence", 1)[1].split("<details>", 1)[0]
    assert f"- `tiny/latency/interference`: {v.message}" in section  # whole
    assert "tiny/fit/kv-pool" not in section
    # the console line is shortened, but keeps the confidence at its end
    line = next(ln for ln in rec.table() if "tiny/latency/interference" in ln)
    assert line.endswith(" (PASS at 62%)") and "…" in line, line
    assert not next(ln for ln in rec.table() if "tiny/fit/kv-pool" in ln).endswith("%)")
    note = next(ln for ln in rec.table() if "shortened to" in ln)
    assert "signoff.md each that did not pass or passed below slo.confidence" in note
    # no such PASS: no section
    assert "lower confidence" not in signoff_markdown(validate_summary(record(tmp_path, ("tiny/fit/kv-pool",
                                                                                       kv_pass())).summary()), None)


def test_a_statistical_pass_says_it_was_decided_on_its_bound_a_plain_pair_says_which_way(tmp_path):
    v = Verdict("answers/accuracy", Status.PASS, "47 of 65 right; 95% one-sided lower bound 61.8% >= 55.0% -> PASS",
                measured=0.7231, limit=0.55, unit="fraction", evidence={"confidence": 0.95, "decision": {}})
    md = signoff_markdown(validate_summary(record(tmp_path, ("tiny/answers/accuracy", v),
                                                  ("tiny/fit/kv-pool", kv_pass())).summary()), None)
    row = next(ln for ln in md.splitlines() if "`tiny/answers/accuracy`" in ln)
    assert "| decided on its bound (see the message) |" in row and "measured >= limit" not in row
    assert "| measured >= limit |" in next(ln for ln in md.splitlines() if "`tiny/fit/kv-pool`" in ln)


def test_inconclusive_means_any_statistical_verdict_stayed_undecided_not_only_a_percentile(tmp_path):
    v = Verdict("soak/memory", Status.INCONCLUSIVE, "slope 99.76% CI -3,849.9..+3,834.4 MB/h straddles 60 MB/h "
                "-> INCONCLUSIVE", measured=-7.7, limit=60, unit="MB/h")
    summary = validate_summary(record(tmp_path, ("tiny/soak/memory", v)).summary())
    md = signoff_markdown(summary, None)
    assert "statistical verdict stayed undecided (its interval straddles its limit" in md.splitlines()[2]
    assert "percentile" not in md.splitlines()[2]
    if summary.get("exit_meaning"):
        assert "a statistical verdict stayed undecided: its interval straddles its limit" in summary["exit_meaning"]
