"""The run's life cycle (:mod:`kvgate.run.lifecycle`) without vLLM: the real suites run against a fake
embedded server (:mod:`tests.fakes.fake_embedded`, backed by the fault-injecting fake vLLM) put in
place of ``kvgate.run.lifecycle._build``.

- early launch: the server is launched at session start, before collection ends, and waited for
  only in the ``kvgate_endpoint`` fixture; ``-m fit`` builds nothing; a selection without a live
  gate stops what was launched right after collection; a launch error is one line per live gate;
- phases: prepare model, collect, launch, one per gate, teardown -- adding up to the run's time;
- interrupts at start-up, mid-gate and in teardown -- in-process (the fake raises
  ``KeyboardInterrupt``) and as real SIGINT/SIGTERM to a pytest subprocess: exit code, summary and
  JUnit agree, the summary names the phase, and no Python traceback is printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

import kvgate.run.lifecycle
from kvgate.launch.local import EmbeddedServer, LaunchError
from kvgate.launch.tinymodel import TinyModelError, TinySpec
from kvgate.profile.models import load_profile
from tests.fakes.fake_embedded import ENV, FakeEmbeddedServer
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, read_summary

pytest_plugins = ["pytester"]
PROFILE = REPO / "tests" / "data" / "fake-embedded.yaml"
NAME = "fake-embedded"
TRACEBACK = "Traceback (most recent call last)"
DEPLOYMENT = [f"{NAME}/deployment/{c}" for c in ("served-model", "max-model-len", "cache-config")]
MAX_CONTEXT = [f"{NAME}/max-context/{c}" for c in ("completions", "chat", "over-length/completions",
                                                   "over-length/completions-stream", "over-length/chat",
                                                   "over-length/chat-stream")]
EXIT_FOR = {"PASS": 0, "INCOMPLETE": 2, "FAIL": 1, "INVALID": 6}  # kvgate.report.outcome.EXIT_CODES


@pytest.fixture
def fake():
    with FakeVLLM(FakeConfig(max_tokens_cap=64)) as f:
        yield f


def suite_paths(*names: str) -> list[str]:
    """The suites' files; "deployment" without its deployment/spec case (a SKIP without --isvc)."""
    only = {"deployment": "::test_deployment_matches_profile"}
    return [str(REPO / "suites" / f"test_{n}.py") + only.get(n, "") for n in names]


def assert_agree(ret: int, summary: dict, reports: Path) -> None:
    """Exit code, summary.json and junit.xml tell the same story."""
    assert ret == EXIT_FOR[summary["overall"]], (ret, summary["overall"])
    assert summary["complete"] is (summary["overall"] != "INCOMPLETE")
    props = {p.get("name"): p.get("value") for p in ET.parse(reports / "junit.xml").iter("property")}
    assert props["kvgate_overall"] == summary["overall"] and props["kvgate_run_id"] == summary["run_id"]


# ------------------------------------------------------------------------------- in-process runs
class Spy:
    """A plugin for the in-process run: marks the end of collection and each test's setup in the
    same event list the fake server writes to."""

    def __init__(self, events: list) -> None:
        self.events = events

    def pytest_collection_finish(self, session) -> None:
        self.events.append(("collection finished", ()))

    def pytest_runtest_setup(self, item) -> None:
        self.events.append((f"setup {item.callspec.id}", ()))


@dataclass
class Run:
    result: pytest.RunResult
    summary: dict
    reports: Path
    servers: list[FakeEmbeddedServer]
    events: list[tuple[str, tuple[str, ...]]]
    wall_s: float

    @property
    def out(self) -> str:
        return self.result.stdout.str() + self.result.stderr.str()

    def names(self) -> list[str]:
        return [e[0] for e in self.events]

    def phases(self) -> dict[str, dict]:
        return {p["name"]: p for p in self.summary["phases"]}


@pytest.fixture
def run_embedded(pytester, monkeypatch, fake):
    """``run_embedded(*args, suites=[...], build=exc, **fake server keywords) -> Run``: the real
    suites in-process with ``--profile=fake-embedded.yaml`` and no ``--endpoint``, so kvgate
    "launches" a :class:`FakeEmbeddedServer` serving ``fake``."""

    def run(*args: str, suites=("deployment",), build: BaseException | None = None, plugins=(), **server_kw) -> Run:
        events: list = []
        servers: list[FakeEmbeddedServer] = []

        def fake_build(st):
            events.append(("build", ()))
            if build is not None:
                raise build
            servers.append(FakeEmbeddedServer(fake.base_url, st.reports_dir / "vllm-server.log", record=st.record,
                                              events=events, **server_kw))
            return servers[-1]

        monkeypatch.setattr(kvgate.run.lifecycle, "_build", fake_build)
        reports = pytester.path / "reports"
        t0 = time.monotonic()
        result = pytester.runpytest_inprocess(
            "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
            f"--profile={PROFILE}", f"--kvgate-reports={reports}", *suite_paths(*suites), *args,
            plugins=[Spy(events), *plugins], no_reraise_ctrlc=True)
        summary = read_summary(reports) if (reports / "summary.json").exists() else {}  # none: --collect-only
        return Run(result, summary, reports, servers, events, time.monotonic() - t0)

    return run


def header(run: Run) -> str:
    """kvgate's line of the console header (``kvgate: profile ...``)."""
    return next(ln for ln in run.result.stdout.lines if ln.startswith("kvgate: profile "))


def test_header_never_says_started_by_kvgate_when_nothing_started(run_embedded, fake):
    """--collect-only starts no server, and --endpoint gates a given one: the header says so."""
    run = run_embedded("--collect-only", suites=("fit", "deployment"))
    assert "build" not in run.names()
    assert "; no server started (--collect-only starts none); " in header(run), header(run)
    run = run_embedded(f"--endpoint={fake.url}", suites=("deployment",))
    assert "build" not in run.names() and f"; endpoint {fake.url}" in header(run), header(run)
    assert "started by kvgate" not in run.out


def test_server_launched_before_collection_ends_and_waited_for_only_in_the_fixture(run_embedded):
    run = run_embedded(suites=("fit", "deployment"), ready_s=0.2)
    names = run.names()
    assert names.count("build") == names.count("launch") == names.count("wait_ready") == 1, names
    # launched at session start, while "prepare model" runs -- before collection has even begun
    assert run.events[names.index("launch")] == ("launch", ("prepare model",))
    assert names.index("launch") < names.index("collection finished")
    # fit/kv-pool needs no server and runs first; the wait is in the first live gate's fixture
    assert names.index(f"setup {NAME}/fit/kv-pool") < names.index(f"setup {NAME}/fit/live-pool") \
        < names.index("wait_ready")
    assert run.events[names.index("wait_ready")] == ("wait_ready", (f"gate {NAME}/fit/live-pool", "launch"))
    # stopped once, in the teardown after the last gate
    assert run.events[names.index("stop")] == ("stop", (f"gate {DEPLOYMENT[-1]}", "teardown"))
    assert not run.servers[0].running and not run.servers[0].killed
    launch = run.summary["launch"]
    assert launch["mode"] == "embedded" and launch["command"] == run.servers[0].command
    assert launch["startup_s"] >= 0.2 and run.summary["endpoint_contacted"] is True
    assert header(run).endswith(f"); endpoint: embedded vLLM, started by kvgate; reports {run.reports}/ "
                                f"(run {run.summary['run_id']})"), header(run)


def test_phases_cover_the_run_and_add_up_to_its_time(run_embedded):
    # the fake server is ready after 1 s: a margin that keeps the live-pool gate's own time (~0.05 s;
    # 0.35 s seen on a loaded machine) below the launch wait it must not count
    run = run_embedded(suites=("fit", "deployment"), ready_s=1.0)
    gates = [f"{NAME}/fit/kv-pool", f"{NAME}/fit/live-pool", *DEPLOYMENT]
    names = [p["name"] for p in run.summary["phases"]]
    assert names == ["prepare model", "collect", f"gate {gates[0]}", f"gate {gates[1]}", "launch",
                     *[f"gate {g}" for g in gates[2:]], "teardown"]
    assert {p["status"] for p in run.summary["phases"]} == {"done"}
    assert [g["id"] for g in run.summary["gates"]] == gates
    phases = run.phases()
    # the launch phase is the wait that was not overlapped; its own seconds exclude nothing else
    assert 1.0 <= phases["launch"]["seconds"] < 1.0 + 2.0
    assert phases["launch"]["startup_s"] >= phases["launch"]["seconds"]
    # nested phases are not counted twice: the live-pool gate's seconds exclude the launch in it
    assert phases[f"gate {gates[1]}"]["seconds"] < phases["launch"]["seconds"]
    total = sum(p["seconds"] for p in run.summary["phases"])
    duration = run.summary["duration_s"]
    assert duration <= run.wall_s
    assert duration - max(0.5, 0.3 * duration) <= total <= duration + 0.05, (total, duration, run.summary["phases"])
    assert run.summary["interrupted_in"] is None
    # and the console shows them under the verdict table
    out = run.result.stdout.str()
    assert out.index("OVERALL: ") < out.index("phases (seconds):")
    run.result.stdout.re_match_lines([r"phases \(seconds\):", r"  prepare model +\d+\.\d\d$", r"  collect +\d+\.\d\d$"],
                                     consecutive=True)
    run.result.stdout.re_match_lines([rf"  gate {gates[1]} +\d+\.\d\d$", r"  launch +[12]\.\d\d$"], consecutive=True)


def test_fit_only_never_builds_or_launches(run_embedded):
    run = run_embedded("-m", "fit", suites=("fit", "deployment", "max_context"))
    assert run.events == [("collection finished", ()), (f"setup {NAME}/fit/kv-pool", ())]
    assert [p["name"] for p in run.summary["phases"]] == ["collect", f"gate {NAME}/fit/kv-pool"]
    assert run.summary["launch"] == {} and run.summary["endpoint_contacted"] is False
    assert f"kvgate {NAME}: no server started" in run.result.stdout.str()


def test_selection_without_live_gate_stops_the_launched_server_after_collection(run_embedded):
    run = run_embedded("-k", "kv-pool", suites=("fit", "deployment"))
    names = run.names()
    assert names == ["build", "launch", "stop", "collection finished", f"setup {NAME}/fit/kv-pool"], names
    assert run.events[names.index("stop")][1] == ("collect",)  # right after collection, before any gate
    assert not run.servers[0].running and "wait_ready" not in names
    assert [g["id"] for g in run.summary["gates"]] == [f"{NAME}/fit/kv-pool"]
    assert run.summary["launch"] == {}


@pytest.mark.parametrize("where", ["build", "build-model", "wait_ready"])
def test_launch_error_is_one_line_per_live_gate(run_embedded, where):
    message = "embedded vLLM exited with code 1 during startup (fake); log in vllm-server.log"
    if where == "build":
        run = run_embedded(suites=("fit", "deployment"), build=LaunchError(message))
    elif where == "build-model":  # the tiny model's or a LoRA adapter's build (_build raises TinyModelError)
        run = run_embedded(suites=("fit", "deployment"), build=TinyModelError(message))
    else:
        run = run_embedded(suites=("fit", "deployment"), wait="error")
    assert run.result.ret == pytest.ExitCode.TESTS_FAILED
    gates = {g["id"]: g for g in run.summary["gates"]}
    assert gates[f"{NAME}/fit/kv-pool"]["status"] == "INVALID"  # the arithmetic still has its verdict
    live = [f"{NAME}/fit/live-pool", *DEPLOYMENT]
    for gid in live:
        assert gates[gid]["status"] == "ERROR" and message in gates[gid]["error"], gates[gid]
    out = run.out
    assert TRACEBACK not in out and "During handling of the above exception" not in out
    # pytest's ERRORS section: per live gate one block holding the message, one line
    section = out.split(" ERRORS ====")[1].split(" FAILURES ====")[0].split(" kvgate verdicts ====")[0]
    section = section.split("\n- generated xml file")[0].rstrip("= \n")
    blocks = section.split("_ ERROR at setup of ")[1:]
    assert len(blocks) == len(live)
    for block in blocks:
        assert [ln for ln in block.splitlines()[1:] if ln.strip()] == [message], block
    assert run.summary["launch"]["error"] == message and run.summary["endpoint_contacted"] is False
    assert f"kvgate {NAME}: the embedded vLLM did not start" in out
    if where != "wait_ready":  # failed at session start, before the header: it says so
        assert f"; no server: the embedded launch failed ({message}) -- every live gate reports it; " in header(run)
        assert "started by kvgate" not in out
    assert "1 invalid" in out.splitlines()[-1]  # pytest's summary line: INVALID is not counted as "failed"
    assert not any(s.running for s in run.servers)
    assert_agree(run.result.ret, run.summary, run.reports)


def _build_run(tmp_path, name):
    from types import SimpleNamespace

    from kvgate.report.redact import Redactor

    return SimpleNamespace(profile=load_profile(name), reports_dir=tmp_path, launch_mode="embedded", vllm_version=None,
                           startup_budget_s=None, config=SimpleNamespace(getoption=lambda name: None), redactor=Redactor())


def test_build_makes_the_features_model_with_markers_and_its_adapters(tmp_path, monkeypatch):
    import kvgate.launch.lora

    specs, adapters = [], []
    monkeypatch.setattr(kvgate.run.lifecycle, "ensure_model", lambda spec: specs.append(spec) or tmp_path / "m")
    monkeypatch.setattr(kvgate.launch.lora, "ensure_adapter",
                        lambda base, name, rank: adapters.append((base, name, rank)) or tmp_path / name)
    server = kvgate.run.lifecycle._build(_build_run(tmp_path, "tiny-cpu-features"))
    assert isinstance(server, EmbeddedServer) and server.model_dir == tmp_path / "m"
    assert specs[0].markers == ("<think>", "</think>", "<tool_call>", "</tool_call>")
    assert adapters == [(tmp_path / "m", "kvgate-lora-a", 8), (tmp_path / "m", "kvgate-lora-b", 8)]
    assert server.lora_dirs == {"kvgate-lora-a": tmp_path / "kvgate-lora-a", "kvgate-lora-b": tmp_path / "kvgate-lora-b"}

    specs.clear()
    monkeypatch.setattr(kvgate.launch.lora, "ensure_adapter", lambda *a, **kw: pytest.fail("an adapter for tiny-cpu"))
    server = kvgate.run.lifecycle._build(_build_run(tmp_path, "tiny-cpu"))
    assert [s.digest() for s in specs] == [TinySpec().digest()] and server.lora_dirs == {}


def test_build_passes_an_adapter_build_failure_on_as_a_tiny_model_error(tmp_path, monkeypatch):
    import kvgate.launch.lora

    def fail(base, name, rank):
        raise TinyModelError(f"building LoRA adapter {name!r} failed (exit 1)")

    monkeypatch.setattr(kvgate.run.lifecycle, "ensure_model", lambda spec: tmp_path)
    monkeypatch.setattr(kvgate.launch.lora, "ensure_adapter", fail)
    with pytest.raises(TinyModelError, match="building LoRA adapter 'kvgate-lora-a' failed"):
        kvgate.run.lifecycle._build(_build_run(tmp_path, "tiny-cpu-features"))


# ------------------------------------------------------------------------------- interrupts, in-process
def test_interrupt_during_startup_in_process(run_embedded):
    run = run_embedded(suites=("fit", "deployment"), wait="interrupt")
    assert run.result.ret == pytest.ExitCode.INTERRUPTED
    s = run.summary
    assert s["overall"] == "INCOMPLETE" and s["interrupted_in"] == "launch"
    assert s["not_run"] == [f"{NAME}/fit/live-pool", *DEPLOYMENT]
    phases = run.phases()
    assert phases["launch"]["status"] == phases[f"gate {NAME}/fit/live-pool"]["status"] == "interrupted"
    assert phases["teardown"]["status"] == "done"  # the server, never handed to the fixture, was stopped
    assert run.names()[-1] == "stop" and not run.servers[0].running
    assert TRACEBACK not in run.out
    assert_agree(run.result.ret, s, run.reports)


def test_interrupt_while_preparing_the_model_still_writes_the_reports(run_embedded):
    # a Ctrl-C in pytest_sessionstart would end the run without pytest_sessionfinish (summary left RUNNING)
    run = run_embedded(suites=("deployment",), build=KeyboardInterrupt())
    assert run.result.ret == pytest.ExitCode.INTERRUPTED
    assert run.summary["overall"] == "INCOMPLETE" and run.summary["interrupted_in"] == "prepare model"
    assert [(p["name"], p["status"]) for p in run.summary["phases"]] == [("prepare model", "interrupted")]
    assert TRACEBACK not in run.out
    assert_agree(run.result.ret, run.summary, run.reports)


def test_interrupt_in_teardown_keeps_the_verdicts(run_embedded):
    run = run_embedded(suites=("deployment",), stop="interrupt")
    assert run.result.ret == pytest.ExitCode.OK
    s = run.summary
    assert s["overall"] == "PASS" and s["complete"] is True and s["not_run"] == []
    assert s["interrupted_in"] == "teardown" and s["counts"]["PASS"] == len(DEPLOYMENT)
    teardown = run.phases()["teardown"]
    assert teardown["status"] == "interrupted" and "SIGKILL" in teardown["note"]
    assert run.names()[-2:] == ["stop", "kill"] and run.servers[0].killed
    assert TRACEBACK not in run.out and "KeyboardInterrupt" not in run.out
    assert_agree(run.result.ret, s, run.reports)


class SigintAfterLastGate:
    """Sends this process a real SIGINT once the last gate's teardown (the server's stop) is over."""

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        if DEPLOYMENT[-1] in nodeid:
            os.kill(os.getpid(), signal.SIGINT)


def test_sigint_after_the_server_is_gone_is_ignored(run_embedded):
    # the last gate's phase is still open, but the verdicts are in and the server is stopped: a
    # Ctrl-C now must not turn the finished run into an interrupted one
    run = run_embedded(suites=("deployment",), plugins=[SigintAfterLastGate()])
    assert run.result.ret == pytest.ExitCode.OK, run.out[-2000:]
    assert run.summary["overall"] == "PASS" and run.summary["interrupted_in"] is None
    assert "KeyboardInterrupt" not in run.out
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored after the run
    assert_agree(run.result.ret, run.summary, run.reports)


# ------------------------------------------------------------------------------- real signals, subprocess
class Subrun:
    """``python -m pytest`` of the suites in a subprocess with the fake embedded server (``-p
    tests.fakes.fake_embedded``) serving ``url``; its events land in ``events.jsonl``."""

    def __init__(self, tmp: Path, url: str, *suites: str, **server_kw) -> None:
        self.reports, self.events, self.log = tmp / "reports", tmp / "events.jsonl", tmp / "out.txt"
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               ENV: json.dumps({"url": url, "events_file": str(self.events), **server_kw})}
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.fakes.fake_embedded",
               f"--profile={PROFILE}", f"--kvgate-reports={self.reports}", *suite_paths(*suites)]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)

    def event_names(self) -> list[str]:
        names = []
        for line in self.events.read_text().splitlines() if self.events.exists() else []:
            try:
                names.append(json.loads(line)["event"])
            except ValueError:  # a line being written
                pass
        return names

    def wait_until(self, ready, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.proc.poll() is None, f"the run ended before {what}:\n{self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {what} within {timeout} s"
            time.sleep(0.01)

    def signal_and_wait(self, sig: int) -> float:
        """Send ``sig``; return the seconds until the run exited."""
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover
            self.proc.kill()
            raise
        return time.monotonic() - t0

    @property
    def out(self) -> str:
        return self.log.read_text()


#: [s] how soon a signalled run must have ended: far under what each test's run would take had it
#: waited (the server's start-up budget, a 30 s stalled stream, a 15 s shutdown grace), with room for
#: writing the reports and the interpreter's exit on a busy CI host (2.6 s seen 2026-12-05, the unit
#: half beside real-model servers; ~1 s on a quiet one).
PROMPT_S = 6.0


@pytest.fixture
def kill_leftover():
    runs: list[Subrun] = []
    yield runs.append
    for r in runs:
        if r.proc.poll() is None:  # pragma: no cover - a failed test
            r.proc.kill()
            r.proc.wait()


def test_sigint_while_waiting_for_startup(tmp_path, fake, kill_leftover):
    run = Subrun(tmp_path, fake.base_url, "fit", "deployment", wait="never")
    kill_leftover(run)
    run.wait_until(lambda: "wait_ready" in run.event_names(), "wait for the server")
    elapsed = run.signal_and_wait(signal.SIGINT)
    assert elapsed < PROMPT_S, f"the run took {elapsed:.1f} s to end after Ctrl-C at start-up"
    assert run.proc.returncode == pytest.ExitCode.INTERRUPTED, run.out[-3000:]
    s = read_summary(run.reports)
    assert s["overall"] == "INCOMPLETE" and s["interrupted_in"] == "launch", s
    assert s["not_run"] == [f"{NAME}/fit/live-pool", *DEPLOYMENT]
    assert run.event_names()[-1] == "stop"
    assert TRACEBACK not in run.out
    assert_agree(run.proc.returncode, s, run.reports)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_gate(tmp_path, kill_leftover, sig):
    release = threading.Event()

    async def stall(seconds: float) -> None:  # the stall fault's sleep, ended early once the run is over
        import asyncio

        end = time.monotonic() + seconds
        while time.monotonic() < end and not release.is_set():
            await asyncio.sleep(0.01)

    cfg = FakeConfig(max_tokens_cap=64, faults={"stall_mid_stream"}, stall_s=30)
    with FakeVLLM(cfg, sleep=stall) as fake:
        try:
            run = Subrun(tmp_path, fake.base_url, "deployment", "max_context")
            kill_leftover(run)
            run.wait_until(lambda: len(fake.state.requests) > 0, "generation request (max-context/completions)")
            elapsed = run.signal_and_wait(sig)
        finally:
            release.set()
    assert elapsed < PROMPT_S, f"the run took {elapsed:.1f} s to end after {sig.name} mid-gate"
    assert run.proc.returncode == pytest.ExitCode.INTERRUPTED, run.out[-3000:]
    s = read_summary(run.reports)
    assert s["overall"] == "INCOMPLETE" and s["interrupted_in"] == f"gate {MAX_CONTEXT[0]}", s["interrupted_in"]
    assert s["not_run"] == MAX_CONTEXT
    assert {g["id"]: g["status"] for g in s["gates"]} == dict.fromkeys(DEPLOYMENT, "PASS")
    assert run.event_names()[-1] == "stop"  # the server was torn down
    assert TRACEBACK not in run.out
    assert_agree(run.proc.returncode, s, run.reports)


def test_sigint_in_teardown_kills_the_server_and_keeps_the_verdicts(tmp_path, fake, kill_leftover):
    run = Subrun(tmp_path, fake.base_url, "deployment", stop="block")  # a server slow to shut down
    kill_leftover(run)
    run.wait_until(lambda: "stop" in run.event_names(), "server stop")
    elapsed = run.signal_and_wait(signal.SIGINT)
    assert elapsed < PROMPT_S, f"the run took {elapsed:.1f} s to end after Ctrl-C in teardown"
    assert run.proc.returncode == pytest.ExitCode.OK, run.out[-3000:]
    s = read_summary(run.reports)
    assert s["overall"] == "PASS" and s["complete"] is True and s["interrupted_in"] == "teardown"
    assert run.event_names()[-2:] == ["stop", "kill"]
    assert TRACEBACK not in run.out and "KeyboardInterrupt" not in run.out
    assert_agree(run.proc.returncode, s, run.reports)
