"""The whole suite against a fake whose engine hangs behind a healthy /health, and one that stalls
every stream: the run ends within the bound (kvgate.http.watch), overall FAIL, with ONE reason
naming where -- in the console and summary.json alike. Runs of ``pytest --profile ... --endpoint
<fake>`` over ``suites/``: the hung engine's in a subprocess, as a user runs it; the others
in-process (pytester), the same command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
import xml.etree.ElementTree as ET
from typing import Any

from kvgate.profile.models import load_profile
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO

pytest_plugins = ["pytester"]

HUNG = REPO / "tests" / "data" / "fake-vllm-hung.yaml"
STALL = REPO / "tests" / "data" / "fake-vllm-stall.yaml"


def run_all(url: str, profile, reports, pytester=None, *extra: str) -> tuple[Any, dict, float]:
    """The whole suite against ``url`` (``extra``: more pytest arguments): ``(proc, summary.json,
    wall seconds)``. Without ``pytester``
    a subprocess, as a user runs it (the hung engine's run: the CLI's own proof); with it the same
    command line in-process (``pytester.runpytest_inprocess``: the same plugin, console and reports
    without the ~5 s of a fresh interpreter importing pytest, kvgate and the openai SDK). ``proc``
    has ``stdout``, ``stderr`` and ``returncode`` either way."""
    args = ["-p", "no:cacheprovider", f"--profile={profile}", f"--endpoint={url}", f"--kvgate-reports={reports}", "-q",
            *extra]
    t0 = time.monotonic()
    if pytester is None:
        env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        proc = subprocess.run([sys.executable, "-m", "pytest", *args, "suites"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
    else:
        result = pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), *args,
                                              str(REPO / "suites"))
        proc = types.SimpleNamespace(stdout=result.stdout.str(), stderr=result.stderr.str(), returncode=int(result.ret))
    wall = time.monotonic() - t0
    return proc, json.loads((reports / "summary.json").read_text()), wall


def test_hung_engine_ends_the_run_within_two_request_timeouts(tmp_path):
    limits = load_profile(str(HUNG)).limits
    cfg = FakeConfig(max_tokens_cap=64, faults={"hang_after_generations"}, hang_after=65)  # 60 + body-size ladder 5: hangs after features
    with FakeVLLM(cfg) as fake:
        proc, summary, wall = run_all(fake.url, HUNG, tmp_path)
    assert wall < 2 * limits.request_timeout_s + 60, wall
    assert summary["overall"] == "FAIL" and summary["exit_code"] == 1 and proc.returncode == 1
    engine = summary["engine"]
    assert engine["condition"] == "hung" and engine["evidence"]["health"] == "200"
    where = engine["gate"]
    gates = {g["id"]: g for g in summary["gates"]}
    assert gates[where]["status"] == "FAIL" and gates[where]["message"].startswith(engine["reason"])
    later = [g for g in summary["gates"][list(gates).index(where) + 1:] if not g["id"].split("/")[1] == "fit"]
    # a gate that does not apply to this run keeps its own SKIP (no pools section, no answers section,
    # no rollout against --endpoint); every other later live gate FAILs with the one reason
    skipped = {g["id"].split("/")[1] for g in later if g["status"] == "SKIP"}
    # the hang comes in the api or the disconnect gate (generation 65): features' not-applicable SKIPs may follow it
    assert {"pools", "answers", "security", "drain"} <= skipped <= {"features", "pools", "answers", "security", "drain"}, skipped
    assert all(g["status"] == "FAIL" and g["message"] == f"not sent: {engine['reason']} -> FAIL"
               for g in later if g["status"] != "SKIP") and len(later) > len(skipped), [g["message"] for g in later]
    # the one reason is the cause of the gate that met the hang and of every gate not sent after it
    assert gates[where]["cause"] == engine["reason"]
    assert all(g.get("cause") == engine["reason"] for g in later if g["status"] != "SKIP")
    assert proc.stdout.count(f"cause: {engine['reason']}") >= len(later) - len(skipped)  # under each console line
    # ONE reason in the console: the ENGINE HUNG line, naming the gate, once
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ENGINE HUNG: ")]
    assert lines == [f"ENGINE HUNG: {engine['reason']}"] and where in lines[0]
    # the gates not sent are counted apart from the measured FAILs: summary.json, console, signoff.md
    not_sent = [g for g in summary["gates"] if g["status"] == "FAIL" and g["message"].startswith("not sent: ")]
    counts = summary["counts"]
    assert counts["NOT_SENT"] == len(not_sent) >= sum(1 for g in later if g["status"] != "SKIP") > 0, counts
    assert counts["FAIL"] == sum(1 for g in summary["gates"] if g["status"] == "FAIL") - len(not_sent) >= 1
    assert f"NOT SENT: {len(not_sent)} gate(s) FAIL without a measurement, one cause (above); measured FAILs: " \
           f"{counts['FAIL']}" in proc.stdout
    assert "OVERALL: FAIL" in proc.stdout
    # pytest counts the later gates' setup-phase FAILs as "failed", as summary.json does: no "errors"
    last = proc.stdout.strip().splitlines()[-1]
    fails = sum(1 for g in summary["gates"] if g["status"] == "FAIL")
    assert f"{fails} failed" in last and "error" not in last, last
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    invalid = sum(1 for g in summary["gates"] if g["status"] == "INVALID")  # JUnit has no word for it: a failure
    assert (suite.get("failures"), suite.get("errors")) == (str(fails + invalid), "0")  # JUnit alike
    # the fit arithmetic (no server) still ran
    assert all(g["status"] != "FAIL" for g in summary["gates"] if g["id"].split("/")[1] == "fit")


def test_server_that_stalls_streams_costs_one_idle_timeout(pytester, tmp_path):
    # the 40 s pause / 30 s idle timeout scaled by 1/10 (README: the literal run took ...)
    limits = load_profile(str(STALL)).limits
    cfg = FakeConfig(max_tokens_cap=64, faults={"pause_streams"}, pause_s=4.0, pause_after_chunks=4)
    with FakeVLLM(cfg) as fake:
        proc, summary, wall = run_all(fake.url, STALL, tmp_path, pytester)
    assert wall < 300 / 10 + 20, wall  # 5 min scaled, plus start-up
    assert summary["overall"] == "FAIL" and proc.returncode == 1
    engine = summary["engine"]
    # the fake pauses before its 5th token chunk: 4 events on a completions stream, 5 on a chat one (its role
    # chunk first); which stream the watch catches first depends on which gate's streams run side by side
    chat = "/chat/completions" in engine["evidence"]["request"]
    assert engine["condition"] == "stalling-streams" and engine["evidence"]["events_before_pause"] == 4 + chat, \
        engine["evidence"]
    assert engine["evidence"]["idle_timeout_s"] == limits.stream_idle_timeout_s
    gates = {g["id"].split("/", 1)[1]: g for g in summary["gates"]}
    for api in ("completions", "chat"):  # the idle-gap gate FAILs with the stall
        g = gates[f"streaming/idle-gap/{api}"]
        assert g["status"] == "FAIL" and engine["reason"] in g["message"], g["message"]
    # the load gates' streams were refused: their health samples were taken on an idle server and
    # do not count (the gate's own load is refused too), so health/under-load cannot PASS "under load"
    health = gates["health/under-load"]
    assert health["status"] == "FAIL" and engine["reason"] in health["message"], health["message"]
    met = [g for g in summary["gates"] if g["status"] == "FAIL"]
    assert len(met) > 10 and all(engine["reason"] in g["message"] for g in met), \
        [g["message"] for g in met if engine["reason"] not in g["message"]]
    assert all(g.get("cause") == engine["reason"] for g in met if "not sent: " in g["message"]), \
        [(g["id"], g.get("cause")) for g in met]
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("STREAMS STALLED: ")] == \
        [f"STREAMS STALLED: {engine['reason']}"]


def test_server_gone_mid_run_is_one_reason_not_an_error_per_gate(pytester, tmp_path):
    """The server process dies mid-run (fault exit_after_generations: every later connection refused):
    the run classifies it GONE once, later live gates FAIL with that one reason, no harness ERROR."""
    cfg = FakeConfig(max_tokens_cap=64, faults={"exit_after_generations"}, exit_after=65)
    with FakeVLLM(cfg) as fake:
        proc, summary, wall = run_all(fake.url, HUNG, tmp_path, pytester)
    assert summary["overall"] == "FAIL" and proc.returncode == 1, proc.stdout[-3000:]
    engine = summary["engine"]
    assert engine["condition"] == "gone" and "server gone since" in engine["reason"], engine
    statuses = [g["status"] for g in summary["gates"]]
    assert "ERROR" not in statuses, [g["message"] for g in summary["gates"] if g["status"] == "ERROR"]
    later = [g for g in summary["gates"] if g["message"] == f"not sent: {engine['reason']} -> FAIL"]
    assert len(later) >= 5, [g["message"][:120] for g in summary["gates"]]
    assert all(g["cause"] == engine["reason"] for g in later)
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("SERVER GONE: ")] == [f"SERVER GONE: {engine['reason']}"]
    assert "Traceback" not in proc.stdout and wall < 120, wall
