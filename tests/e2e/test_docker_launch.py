"""The docker launcher for real: a Docker engine on this machine (started as
``dockerd --bridge=none --iptables=false`` when none runs), a locally built image (Debian bookworm
from debootstrap + ``docker import``, the fake vLLM behind a ``vllm.entrypoints.openai.api_server``
shim: :mod:`tests.fakes.vllm_image`). kvgate starts the container from the profile's ``launch:``
section, waits for /health and one generation, runs gates against it and removes it -- also when
the run is interrupted (SIGTERM). The GPU device request is asserted on the arguments the
container was created with. SKIPs with the reason where no Docker can be had. The gates run
against the fake (as the unit half's pytester runs do) and the SIGTERM case waits for a gate's
outcome, not a fixed time: the module runs beside the unit tests (tests/conftest.py
E2E_BESIDE_UNITS)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakes import vllm_image

from ..conftest import REPO, read_summary

pytestmark = pytest.mark.e2e
FAKE_PROFILE = REPO / "tests" / "data" / "fake-vllm.yaml"


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> str:
    log = tmp_path_factory.mktemp("dockerd") / "dockerd.log"
    try:
        started = vllm_image.ensure_docker(log)
        tag = vllm_image.image()
    except vllm_image.Unavailable as exc:
        pytest.skip(f"no Docker here: {exc}")
    yield tag
    if started is not None:
        started.terminate()
        started.wait(timeout=30)


def containers(tag: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"ancestor={tag}"], capture_output=True, text=True)
    return out.stdout.split()


def docker_profile(tmp_path: Path, tag: str, launch_extra: str = "", extra_args: str = "[]") -> Path:
    path = tmp_path / "fake-docker.yaml"
    path.write_text(f"""extends: {FAKE_PROFILE}
description: the fake vLLM in a local container, started by kvgate's docker launcher
engine:
  override_generation_config: {{max_new_tokens: 64}}
  extra_args: {extra_args}
launch:
  mode: docker
  image: {tag}
  model: /models/fake-model
  startup_budget_s: 60
{launch_extra}""")
    return path


GATE_OUTCOME = re.compile(r"^suites/test_\w+\.py::\S+ (PASSED|FAILED|SKIPPED|ERROR)", re.M)


def kvgate(tmp_path: Path, profile: Path, *args: str, out: Path | None = None) -> subprocess.Popen:
    """``pytest --profile PROFILE suites/test_ARG.py ...`` (an ``ARG`` starting with ``-`` is passed as
    an option); output piped, or unbuffered into ``out``."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--profile={profile}",
           f"--kvgate-reports={tmp_path / 'reports'}",
           *[a if a.startswith("-") else str(REPO / "suites" / f"test_{a}.py") for a in args]]
    env = {**os.environ, "HF_TOKEN": "hf_NeverPrintedSecret42", "PYTHONUNBUFFERED": "1"}
    env.pop("KVGATE_ENDPOINT", None)
    if out is None:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(out, "w") as sink:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)


def test_launcher_starts_gates_and_removes_the_container(image, tmp_path):
    t0 = time.monotonic()
    proc = kvgate(tmp_path, docker_profile(tmp_path, image), "deployment", "max_tokens", "streaming")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    summary = read_summary(tmp_path / "reports")
    assert summary["overall"] == "PASS" and summary["counts"]["PASS"] >= 15
    launch = summary["launch"]
    assert launch["mode"] == "docker" and launch["image"] == image and launch["network"] == "host"
    assert launch["env_passed"] == ["HF_TOKEN"] and launch["gpus"] is None
    assert launch["command"][:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert summary["endpoint"] == f"http://127.0.0.1:{launch['port']}/v1"
    assert containers(image) == []  # removed at the end of the run
    log = (tmp_path / "reports" / "vllm-server.log").read_text()
    assert "fake vLLM in a container" in log
    reports = "".join(p.read_text(errors="replace") for p in (tmp_path / "reports").rglob("*") if p.is_file())
    assert "hf_NeverPrintedSecret42" not in reports + out
    print(f"docker launch run: {time.monotonic() - t0:.1f} s, startup {launch['startup_s']} s")


def test_sigterm_mid_run_removes_the_container(image, tmp_path):
    # the server stalls 30 s mid-generation: the signal lands in a gate
    stalling = docker_profile(tmp_path, image, extra_args='["--fake-fault", "stall_mid_stream", "--fake-set", "stall_s=30"]')
    console = tmp_path / "console.txt"
    proc = kvgate(tmp_path, stalling, "streaming", "max_tokens", "-v", out=console)
    deadline = time.monotonic() + 90
    # the launch ends in the first test's setup: once a test has its outcome, the run is in the gates
    # (a fixed sleep after the container appeared raced the launch on a loaded CI runner: "launch")
    while not GATE_OUTCOME.search(console.read_text(errors="replace")) and proc.poll() is None:
        assert time.monotonic() < deadline, "no gate had an outcome within 90 s:\n" + console.read_text()[-3000:]
        time.sleep(0.2)
    assert containers(image), "the container never appeared"
    time.sleep(1.0)  # the next gate's call: the stalled stream
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    out = console.read_text(errors="replace")
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]
    summary = read_summary(tmp_path / "reports")
    assert summary["overall"] == "INCOMPLETE" and summary["interrupted_in"] and summary["exit_code"] == 2
    assert containers(image) == [], "the container outlived the interrupted run"
    assert summary["interrupted_in"].startswith("gate fake-docker/"), summary["interrupted_in"]  # mid-gate
    assert time.monotonic() - t0 < 20


def test_gpu_device_request_reaches_docker(image, tmp_path, monkeypatch):
    """The device request is on the create call docker receives; here (no NVIDIA runtime) docker
    refuses to start it, the launcher says so in one line and removes the container."""
    import docker.models.containers as dmc

    from kvgate.launch.docker import DockerLauncher
    from kvgate.launch.local import LaunchError
    from kvgate.profile.models import load_profile

    seen: list[dict] = []
    real_create = dmc.ContainerCollection.create

    def spy(self, image, command=None, **kwargs):
        seen.append(kwargs)
        return real_create(self, image, command, **kwargs)

    monkeypatch.setattr(dmc.ContainerCollection, "create", spy)
    prof = load_profile(str(docker_profile(tmp_path, image, "  gpus: all\n")))
    dock = DockerLauncher(prof, tmp_path / "vllm-server.log", startup_budget_s=20)
    try:
        dock.launch()
        dock.wait_ready()  # a machine with the NVIDIA runtime gets this far
    except LaunchError as exc:
        assert "did not start" in str(exc) or "docker launcher" in str(exc)
        assert "\n" not in str(exc).split("last lines:")[0]
    finally:
        dock.stop()
    (kwargs,) = seen
    assert [dict(r) for r in kwargs["device_requests"]] == [
        {"Driver": "", "Count": -1, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {}}]
    assert kwargs["network_mode"] == "host" and kwargs["ipc_mode"] == "host"
    assert containers(image) == []
    print("create kwargs:", json.dumps({k: v for k, v in kwargs.items() if k != "device_requests"}, default=str))


def test_dockerfile_builds_on_a_local_base_and_runs_the_fit_gate(image, tmp_path):
    """The repository's Dockerfile, its base image a build argument: built here on a local base
    (bookworm + this venv's dependencies, no network), then run as the CI templates run it."""
    t0 = time.monotonic()
    try:
        base = vllm_image.python_base_image()
    except vllm_image.Unavailable as exc:
        pytest.skip(f"no local base image: {exc}")
    tag = "local/kvgate:e2e"
    build = subprocess.run(["docker", "build", "-q", "--network", "host", "--build-arg", f"BASE={base}",
                            "--build-arg", "PIP_ARGS=--no-deps --no-build-isolation", "-t", tag, str(REPO)],
                           capture_output=True, text=True, timeout=600, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    assert build.returncode == 0, build.stderr[-2000:]
    built_s = time.monotonic() - t0
    reports = tmp_path / "reports"
    reports.mkdir()
    run = subprocess.run(["docker", "run", "--rm", "--network", "host", "-v", f"{reports}:/kvgate/reports", tag,
                          "--profile", "llama70b-tp4", "-m", "fit"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-1000:]
    summary = read_summary(reports)
    assert summary["overall"] == "PASS" and summary["gates"][0]["id"] == "llama70b-tp4/fit/kv-pool"
    print(f"Dockerfile: base + build {built_s:.1f} s, fit run {time.monotonic() - t0 - built_s:.1f} s")
