"""Launcher pieces that need no vLLM: command rendering, target URL parsing, startup failure."""

from __future__ import annotations


import pytest

from kvgate.launch.local import EmbeddedServer, LaunchError, free_port, render_command
from kvgate.launch.target import TargetError, endpoint_from_url
from kvgate.launch.tinymodel import TinySpec
from kvgate.profile.models import load_profile


def test_render_command_from_profile_engine():
    p = load_profile("tiny-cpu")
    cmd = render_command(p, "/m", 1234, python="py")
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for part in ("--max-model-len 2048", "--max-num-seqs 8", "--dtype float32", "--port 1234",
                 "--host 127.0.0.1", "--kv-cache-memory-bytes 67108864", "--enforce-eager",
                 "--served-model-name kvgate-tiny-llama"):
        assert part in joined
    assert cmd[cmd.index("--override-generation-config") + 1] == '{"max_new_tokens": 512}'


def test_free_port_is_loopback_and_nonzero():
    assert 0 < free_port() < 65536


def test_tiny_spec_digest_is_stable_and_sensitive():
    assert TinySpec().digest() == TinySpec().digest()
    assert TinySpec().digest() != TinySpec(layers=3).digest()
    arch = load_profile("tiny-cpu").model.architecture
    assert TinySpec.from_architecture(arch).head_dim == 64


def test_startup_failure_shows_log_tail(tmp_path):
    p = load_profile("tiny-cpu")
    # a "python" that cannot run the module: exits at once with a message in the log
    fake_python = tmp_path / "py"
    fake_python.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named vllm' >&2\nexit 3\n")
    fake_python.chmod(0o755)
    server = EmbeddedServer(p, tmp_path, tmp_path / "log.txt", python=str(fake_python), sleep=lambda s: None)
    with pytest.raises(LaunchError) as exc:
        server.start()
    assert "exited with code 3" in str(exc.value) and "No module named vllm" in str(exc.value)


@pytest.mark.parametrize("url,base,prefix", [
    ("http://h:8000/v1", "http://h:8000", "/v1"),
    ("http://h:8000", "http://h:8000", "/v1"),
    ("https://x.example/openai/v1/", "https://x.example", "/openai/v1"),
])
def test_endpoint_url_split(url, base, prefix):
    ep = endpoint_from_url(url, load_profile("tiny-cpu"), environ={})
    assert (ep.base_url, ep.route_prefix) == (base, prefix)


def test_api_key_from_named_env_var():
    ep = endpoint_from_url("http://h/v1", load_profile("tiny-cpu"), "MY_KEY", environ={"MY_KEY": "sk-abcdef"})
    assert ep.api_key == "sk-abcdef" and "sk-abcdef" not in repr(ep)
    with pytest.raises(TargetError, match="MY_KEY is not set"):
        endpoint_from_url("http://h/v1", load_profile("tiny-cpu"), "MY_KEY", environ={})


def test_not_a_url():
    with pytest.raises(TargetError, match="not an http"):
        endpoint_from_url("localhost:8000", load_profile("tiny-cpu"), environ={})


def test_wait_ready_is_one_method_on_the_launcher_base():
    from kvgate.launch.base import Launcher
    from kvgate.launch.docker import DockerLauncher

    assert EmbeddedServer.wait_ready is Launcher.wait_ready is DockerLauncher.wait_ready
    assert (EmbeddedServer.ready_stop_grace_s, DockerLauncher.ready_stop_grace_s) == (1.0, None)


def test_wait_ready_template_returns_known_url_launches_once_and_stops_on_any_exception():
    from kvgate.launch.base import Launcher

    class Fake(Launcher):
        mode = "fake"
        ready_stop_grace_s = 2.5

        def __init__(self, fail=None):
            self.base_url, self.fail, self.calls = None, fail, []
            self.up = False

        def launch(self):
            self.calls.append("launch")
            self.up = True

        def _launched(self):
            return self.up

        def _wait(self):
            self.calls.append("wait")
            if self.fail is not None:
                raise self.fail
            self.base_url = "http://127.0.0.1:1"
            return self.base_url

        def stop(self, grace_s=None):
            self.calls.append(("stop", grace_s))

    ok = Fake()
    assert ok.wait_ready() == "http://127.0.0.1:1" and ok.wait_ready() == "http://127.0.0.1:1"
    assert ok.calls == ["launch", "wait"]  # the second call returns the known URL
    for exc in (LaunchError("no"), KeyboardInterrupt()):
        bad = Fake(exc)
        bad.up = True  # launched already: not launched again
        with pytest.raises(type(exc)):
            bad.wait_ready()
        assert bad.calls == ["wait", ("stop", 2.5)]
