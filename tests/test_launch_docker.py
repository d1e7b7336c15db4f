"""The docker launcher without a Docker engine: the container's create arguments (GPU device
request, host network and IPC, read-only mounts, the rendered vLLM command), secrets passed but
never shown, readiness (/health *and* one generation) against the fake vLLM behind a fake
container, start-up failures with the log tail, clean-up; and the launcher choice
(--endpoint/KVGATE_ENDPOINT/--launch/profile) with its one-line reasons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvgate.launch import docker as dl
from kvgate.launch.base import Choice, LaunchError, choose
from kvgate.profile.models import load_profile
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO

SECRET = "hf_SuperSecretValue123"


def profile_with(write_profile, launch: str, gpu: str = "NVIDIA H100", count: int = 2):
    text = (REPO / "tests" / "data" / "fake-vllm.yaml").read_text()
    text += f"hardware: {{gpu: {gpu}, count: {count}, memory_gib: 80}}\nlaunch:\n{launch}"
    return load_profile(str(write_profile("p", text)))


class FakeContainer:
    """Stands in for testcontainers' DockerContainer: records what it was given; ``start`` runs the
    fake vLLM on the ``--port`` of the rendered command (as the image's vLLM would)."""

    def __init__(self, image: str, *, serve: FakeConfig | None = None, start_error: str | None = None,
                 exits: bool = False):
        self.image, self.env, self.kwargs = image, {}, {}
        self.serve, self.start_error, self.exits = serve, start_error, exits
        self.fake: FakeVLLM | None = None
        self.removed = False
        self._container: Any = None

    def with_env(self, k, v):
        self.env[k] = v
        return self

    def with_volume_mapping(self, host, container, mode):
        self.kwargs.setdefault("volumes", {})[host] = {"bind": container, "mode": mode}
        return self

    def with_kwargs(self, **kw):
        self.kwargs.update(kw)
        return self

    def start(self):
        self._container = Wrapped(self)
        if self.start_error:
            raise RuntimeError(self.start_error)
        cmd = self.kwargs["entrypoint"]
        port = int(cmd[cmd.index("--port") + 1])
        if self.serve is not None:
            self.fake = FakeVLLM(self.serve)
            self.fake.start(port=port)
        return self

    def stop(self, force=True, delete_volume=True):
        self.removed = True
        if self.fake is not None:
            self.fake.stop()


class Wrapped:
    def __init__(self, owner: FakeContainer):
        self.owner, self.id = owner, "0123456789abcdef"
        self.status, self.attrs = "running", {"State": {"ExitCode": 0}}

    def reload(self):
        if self.owner.exits:
            self.status, self.attrs = "exited", {"State": {"ExitCode": 3}}

    def stop(self, timeout=10):
        """``docker stop -t timeout``: the fake vLLM drains (sigterm) and exits, or -- ``owner.killed_at_grace``
        -- the container is SIGKILLed at the timeout (exit code 137)."""
        self.stopped_with = timeout
        if self.owner.fake is not None:
            self.owner.fake.sigterm()
            self.owner.fake.wait_exit(5)
        self.status = "exited"
        self.attrs = {"State": {"ExitCode": 137 if getattr(self.owner, "killed_at_grace", False) else 0}}

    def logs(self, tail=None):
        lines = [f"INFO line {i}" for i in range(100)] + [f"token={SECRET}", "ERROR: CUDA out of memory"]
        return "\n".join(lines[-tail:] if tail else lines).encode()


# ---------------------------------------------------------------------------- create arguments
@pytest.mark.parametrize("gpus, want", [
    ("all", [{"Driver": "", "Count": -1, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {}}]),
    ("4", [{"Driver": "", "Count": 4, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {}}]),
    ("['0', '2']", [{"Driver": "", "Count": 0, "DeviceIDs": ["0", "2"], "Capabilities": [["gpu"]], "Options": {}}]),
    (None, [{"Driver": "", "Count": 2, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {}}]),  # hardware.count
])
def test_gpu_device_request(write_profile, gpus, want):
    launch = "  mode: docker\n" + (f"  gpus: {gpus}\n" if gpus else "")
    reqs = dl.device_requests(profile_with(write_profile, launch))
    assert [dict(r) for r in reqs] == want


def test_cpu_profile_requests_no_gpu(write_profile):
    assert dl.device_requests(profile_with(write_profile, "  mode: docker\n", gpu="cpu", count=1)) == []


def test_container_kwargs(write_profile, tmp_path):
    model_dir = tmp_path / "models"
    prof = profile_with(write_profile, f"""  mode: docker
  image: local/vllm:test
  model: /models/fake
  gpus: all
  mounts:
    - {{source: {model_dir}, target: /models}}
    - {{source: ~/.cache/huggingface, target: /root/.cache/huggingface, read_only: false}}
""")
    kw = dl.container_kwargs(prof, 41234, {})
    assert kw["network_mode"] == "host" and kw["ipc_mode"] == "host"
    assert kw["labels"] == {"kvgate.launcher": "docker"}
    assert kw["volumes"][str(model_dir)] == {"bind": "/models", "mode": "ro"}
    assert kw["volumes"][str(Path("~/.cache/huggingface").expanduser())]["mode"] == "rw"
    cmd = kw["entrypoint"]
    assert cmd[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == "/models/fake" and cmd[cmd.index("--port") + 1] == "41234"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--served-model-name") + 1] == "fake-model"
    assert cmd[cmd.index("--max-model-len") + 1] == "256"
    assert "--dtype" not in cmd  # the CPU default (float32) is the embedded launcher's, not a GPU server's


def test_lora_modules_in_the_container_are_paths_and_an_embedded_adapter_is_refused(write_profile, tmp_path):
    prof = profile_with(write_profile, "  mode: docker\n  image: local/vllm:test\n")
    engine = prof.engine.model_copy(update={"enable_lora": True, "lora_modules": {"sql": "/adapters/sql"}})
    cmd = dl.container_command(prof.model_copy(update={"engine": engine}), 41234)
    assert cmd[cmd.index("--lora-modules") + 1:] == ["sql=/adapters/sql"] and "--enable-lora" in cmd
    engine = engine.model_copy(update={"lora_modules": {"sql": "/adapters/sql", "mine": "embedded"}})
    embedded = prof.model_copy(update={"engine": engine})
    with pytest.raises(LaunchError) as exc:
        dl.container_command(embedded, 41234)
    assert str(exc.value) == ("docker launcher: engine.lora_modules.mine is 'embedded', but the container cannot "
                              "see the adapters kvgate builds in its cache; give a path inside the container "
                              "(mounted with launch.mounts) or an HF id")
    made = []
    with pytest.raises(LaunchError, match="engine.lora_modules.mine"):
        dl.DockerLauncher(embedded, tmp_path / "vllm-server.log", environ={},
                          container_factory=lambda image: made.append(image)).launch()
    assert made == []  # refused before any container was made


# ---------------------------------------------------------------------------- readiness and clean-up
def launcher(prof, tmp_path, container: FakeContainer, **kw) -> dl.DockerLauncher:
    return dl.DockerLauncher(prof, tmp_path / "vllm-server.log", environ={"HF_TOKEN": SECRET},
                             container_factory=lambda image: container, poll_s=0.01, **kw)


def test_ready_means_health_and_one_generation_then_removed(write_profile, tmp_path):
    prof = profile_with(write_profile, "  mode: docker\n  image: local/x\n")
    box = FakeContainer("local/x", serve=FakeConfig(max_tokens_cap=64))
    dock = launcher(prof, tmp_path, box)
    dock.launch()
    assert box.env == {"HF_TOKEN": SECRET} and box.kwargs["device_requests"]
    url = dock.wait_ready()
    assert url == f"http://127.0.0.1:{box.fake.port}"
    assert box.fake.config.served_name == "fake-model"
    assert len(box.fake.state.requests) == 1  # the one readiness generation
    info = dock.describe()
    assert info["env_passed"] == ["HF_TOKEN"] and SECRET not in repr(info) and info["container"] == "0123456789ab"
    assert dock.secrets == [SECRET]
    dock.stop()
    assert box.removed and SECRET not in (tmp_path / "vllm-server.log").read_text()
    dock.stop()  # idempotent


def test_health_without_generation_is_not_ready(write_profile, tmp_path):
    """A server whose /health is 200 but whose generations fail never counts as ready."""
    prof = profile_with(write_profile, "  mode: docker\n  image: local/x\n  startup_budget_s: 0.5\n")
    box = FakeContainer("local/x", serve=FakeConfig(max_tokens_cap=64, faults={"dead_after_over_length"}))
    dock = launcher(prof, tmp_path, box)
    dock.launch()
    import httpx

    httpx.post(f"http://127.0.0.1:{box.fake.port}/v1/completions",  # kill its generations (the fault)
               json={"model": "fake-model", "prompt": "x " * 400, "max_tokens": 1})
    with pytest.raises(LaunchError, match="answered /health but no generation after 0.5 s"):
        dock.wait_ready()
    assert box.removed


def test_container_exit_reports_the_log_tail_without_secrets(write_profile, tmp_path):
    prof = profile_with(write_profile, "  mode: docker\n  image: local/x\n")
    box = FakeContainer("local/x", exits=True)
    dock = launcher(prof, tmp_path, box)
    dock.launch()
    with pytest.raises(LaunchError) as err:
        dock.wait_ready()
    msg = str(err.value)
    assert "exited with code 3 during start-up" in msg and "CUDA out of memory" in msg
    assert SECRET not in msg and "token=***" in msg and "INFO line 59" not in msg  # a tail, not the whole log
    assert box.removed and "CUDA out of memory" in (tmp_path / "vllm-server.log").read_text()


@pytest.mark.parametrize("killed", [False, True])
def test_drain_gate_signal_is_docker_stop_with_the_grace_period(write_profile, tmp_path, killed):
    prof = profile_with(write_profile, "  mode: docker\n  image: local/x\n"
                        + "rollout: {drain_timeout_s: 20, grace_period_s: 45.5}\n")
    box = FakeContainer("local/x", serve=FakeConfig(max_tokens_cap=64))
    box.killed_at_grace = killed
    dock = launcher(prof, tmp_path, box)
    dock.wait_ready()
    assert "--shutdown-timeout" in dock.command and dock.command[dock.command.index("--shutdown-timeout") + 1] == "20"
    assert dock.terminate() == "docker stop -t 46 0123456789ab"
    assert dock.wait_exit(5) is (not killed) and box._container.stopped_with == 46
    dock.stop()  # the teardown after the drain: log saved, container removed, no error
    assert box.removed


def test_start_failure_removes_the_container_and_says_why(write_profile, tmp_path):
    prof = profile_with(write_profile, "  mode: docker\n  image: local/x\n")
    box = FakeContainer("local/x", start_error=f"could not select device driver \"\" with capabilities: [[gpu]] {SECRET}")
    with pytest.raises(LaunchError, match=r"container from local/x did not start: could not select device driver") as err:
        launcher(prof, tmp_path, box).launch()
    assert SECRET not in str(err.value) and box.removed


def test_interrupt_while_waiting_removes_the_container(write_profile, tmp_path):
    prof = profile_with(write_profile, "  mode: docker\n  image: local/x\n")
    box = FakeContainer("local/x")  # nothing listens: the launcher keeps polling

    def interrupt(_s):
        raise KeyboardInterrupt

    dock = launcher(prof, tmp_path, box, sleep=interrupt)
    dock.launch()
    with pytest.raises(KeyboardInterrupt):
        dock.wait_ready()
    assert box.removed


# ---------------------------------------------------------------------------- where it cannot run
def test_unavailable_reasons(write_profile):
    prof = profile_with(write_profile, "  mode: docker\n  gpus: 4\n")

    def no_socket():
        raise ConnectionError("Error while fetching server API version: ('Connection aborted.', FileNotFoundError)")

    assert dl.docker_unavailable(no_socket).startswith("no Docker engine reachable (DOCKER_HOST or /var/run/docker.sock)")
    assert dl.docker_unavailable(lambda: True) is None

    def no_nvml():
        raise OSError("NVML Shared Library Not Found")

    assert dl.gpus_unavailable(prof, no_nvml) == ("no NVIDIA GPU here (NVML: NVML Shared Library Not Found); the profile "
                                                  "needs 4 (2 x NVIDIA H100)")
    assert dl.gpus_unavailable(prof, lambda: 1) == "the profile needs 4 GPU(s) (NVIDIA H100), NVML sees 1"
    assert dl.gpus_unavailable(prof, lambda: 8) is None


def test_choose(write_profile, monkeypatch):
    prof = profile_with(write_profile, "  mode: docker\n")
    monkeypatch.setattr(dl.DockerLauncher, "unavailable", classmethod(lambda cls, p: "no Docker engine reachable"))
    assert choose(prof, endpoint="http://x/v1", launch=None, environ={}) == Choice("endpoint", "--endpoint")
    assert choose(prof, endpoint=None, launch=None, environ={"KVGATE_ENDPOINT": "http://x"}).source == "KVGATE_ENDPOINT"
    got = choose(prof, endpoint=None, launch=None, environ={})
    assert got == Choice("docker", "the profile's launch.mode", "docker launcher cannot run here: no Docker engine reachable")
    assert choose(prof, endpoint=None, launch="docker", environ={}, check=False) == Choice("docker", "--launch")
    emb = choose(prof, endpoint=None, launch="embedded", environ={})
    assert emb.unavailable.startswith("embedded launcher cannot run here: the embedded vLLM serves only kvgate's tiny model")
    tiny = load_profile("tiny-cpu")
    assert choose(tiny, endpoint=None, launch=None, environ={}) == Choice("embedded", "the profile's model.embedded")


# ---------------------------------------------------------------------------- through pytest
pytest_plugins = ["pytester"]


def run(pytester, *args):
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO),
                                          "-p", "no:cacheprovider", f"--kvgate-reports={reports}", *args)
    from .conftest import read_summary

    return result, read_summary(reports)


def test_llama70b_without_docker_fit_runs_live_gates_skip_one_reason(pytester, monkeypatch):
    """``pytest --profile llama70b-tp4`` where its docker launcher cannot run: the fit arithmetic
    has its verdict, every live gate is a SKIP naming the one reason, nothing is launched -- and
    the run, which gated nothing live, is NO-SERVER (exit 8), not PASS, in enforce and certify
    (which still lists what was not checked); ``-m fit`` alone is a pass (exit 0)."""
    why = "no Docker engine reachable (DOCKER_HOST or /var/run/docker.sock): connection refused"
    monkeypatch.setattr(dl.DockerLauncher, "unavailable", classmethod(lambda cls, p: why))
    monkeypatch.delenv("KVGATE_ENDPOINT", raising=False)
    suites = [str(REPO / "suites" / f"test_{n}.py") for n in ("fit", "deployment", "max_context", "streaming")]
    result, summary = run(pytester, "--profile", "llama70b-tp4", *suites)
    assert result.ret == 8, result.stdout.str()[-2000:]
    assert summary["overall"] == summary["outcome"] == "NO-SERVER" and summary["exit_code"] == 8
    assert "no server" in summary["exit_meaning"] and "OVERALL: NO-SERVER" in result.stdout.str()
    gates = {g["id"]: g for g in summary["gates"]}
    assert gates["llama70b-tp4/fit/kv-pool"]["status"] == "PASS"
    live = [g for i, g in gates.items() if i != "llama70b-tp4/fit/kv-pool"]
    assert len(live) >= 15 and {g["status"] for g in live} == {"SKIP"}
    assert {g["message"] for g in live} == {f"docker launcher cannot run here: {why} -> SKIP"}
    assert summary["endpoint_contacted"] is False and summary["launch"] == {}
    assert f"no server: docker launcher cannot run here: {why} -- live gates SKIP" in result.stdout.str()
    from kvgate.report.signoff import signoff_markdown

    signoff = signoff_markdown(summary)
    assert "NO-SERVER" in signoff and "not a pass" in signoff and "every gate passed" not in signoff
    result, summary = run(pytester, "--profile", "llama70b-tp4", "--gate-mode=certify", *suites)
    assert result.ret == 8 and summary["outcome"] == "NO-SERVER" and len(summary["not_certified"]) >= len(live)
    result, summary = run(pytester, "--profile", "llama70b-tp4", "-m", "fit", *suites)
    assert result.ret == 0 and summary["overall"] == "PASS", result.stdout.str()[-2000:]


def test_kvgate_endpoint_env_overrides_the_launcher(pytester, monkeypatch):
    monkeypatch.setattr(dl.DockerLauncher, "unavailable", classmethod(lambda cls, p: pytest.fail("not asked")))
    with FakeVLLM(FakeConfig(max_tokens_cap=64)) as fake:
        url = fake.url
        monkeypatch.setenv("KVGATE_ENDPOINT", url)
        result, summary = run(pytester, "--profile", str(REPO / "tests" / "data" / "fake-vllm.yaml"),
                              "--launch", "docker", str(REPO / "suites" / "test_deployment.py"))
    assert result.ret == 0 and summary["endpoint"] == url and summary["overall"] == "PASS"


@pytest.mark.parametrize("given", [("--endpoint", "http://127.0.0.1:9/v1"), ("--isvc", "llm")])
def test_launch_beside_an_endpoint_on_the_command_line_is_a_usage_error(pytester, monkeypatch, given):
    monkeypatch.setattr(dl.DockerLauncher, "unavailable", classmethod(lambda cls, p: pytest.fail("not asked")))
    result, summary = run(pytester, "--profile", "llama70b-tp4", "--launch", "docker", *given,
                          str(REPO / "suites" / "test_deployment.py"))
    assert result.ret == 4 and summary["overall"] == "ERROR"
    assert (f"--launch=docker and {given[0]}: kvgate gates the server it is given and launches nothing; drop one of "
            "them") in result.stderr.str()


def test_launch_none_without_endpoint_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.delenv("KVGATE_ENDPOINT", raising=False)
    result, summary = run(pytester, "--profile", "llama70b-tp4", "--launch", "none",
                          str(REPO / "suites" / "test_deployment.py"))
    assert result.ret == 4 and "launches nothing (launch: none); give --endpoint URL (or KVGATE_ENDPOINT)" in \
        result.stderr.str()
