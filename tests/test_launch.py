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


def test_whitespace_around_the_url_is_dropped_inside_it_refused():
    ep = endpoint_from_url(" http://h:8000/v1 \n", load_profile("tiny-cpu"), environ={})
    assert (ep.base_url, ep.route_prefix) == ("http://h:8000", "/v1")
    with pytest.raises(TargetError, match=r"^--endpoint 'http://h:8000/v1 /x' has whitespace inside it; give the URL alone$"):
        endpoint_from_url("http://h:8000/v1 /x", load_profile("tiny-cpu"), environ={})


def test_not_a_url():
    with pytest.raises(TargetError, match="not an http"):
        endpoint_from_url("localhost:8000", load_profile("tiny-cpu"), environ={})


@pytest.mark.parametrize("url", ["http://h:8000/v1?api-key=sk-secret123", "http://h:8000/v1#section9", "http://h/?"])
def test_a_query_string_or_fragment_is_refused_never_dropped_or_echoed(url):
    with pytest.raises(TargetError, match="query string or fragment") as e:
        endpoint_from_url(url, load_profile("tiny-cpu"), environ={})
    assert "sk-secret123" not in str(e.value) and "section9" not in str(e.value) and "\n" not in str(e.value)


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


# ---------------------------------------------------------------------------- serve-feature flags
FEATURES = "tiny-cpu-features"
MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>")


def _with_engine(name: str, **engine):
    p = load_profile(name)
    return p.model_copy(update={"engine": p.engine.model_copy(update=engine)})


def _after(cmd: list[str], flag: str) -> str:
    assert cmd.count(flag) == 1, f"{flag} appears {cmd.count(flag)} times in {cmd}"
    return cmd[cmd.index(flag) + 1]


def test_render_command_renders_every_serve_feature_flag_of_the_features_profile(tmp_path):
    dirs = {"kvgate-lora-a": tmp_path / "a", "kvgate-lora-b": tmp_path / "b"}
    cmd = render_command(load_profile(FEATURES), "/m", 1234, python="py", lora_dirs=dirs)
    assert _after(cmd, "--tool-call-parser") == "hermes"
    assert _after(cmd, "--tool-strict-level") == "parameter"
    assert _after(cmd, "--reasoning-parser") == "qwen3"
    assert _after(cmd, "--structured-outputs-config") == \
        '{"backend":"xgrammar","disable_any_whitespace":true,"enable_in_reasoning":true}'
    assert _after(cmd, "--max-loras") == "1" and _after(cmd, "--max-lora-rank") == "8"
    for switch in ("--enable-auto-tool-choice", "--enable-lora", "--enable-prompt-tokens-details",
                   "--enable-prefix-caching"):
        assert cmd.count(switch) == 1, switch
    i = cmd.index("--lora-modules")  # one flag, then every NAME=PATH (vLLM's nargs='+')
    assert cmd.count("--lora-modules") == 1
    assert cmd[i + 1:i + 3] == [f"kvgate-lora-a={tmp_path / 'a'}", f"kvgate-lora-b={tmp_path / 'b'}"]
    assert i + 3 == len(cmd) or cmd[i + 3].startswith("--")


@pytest.mark.parametrize("engine, want", [
    ({"enable_auto_tool_choice": True, "tool_call_parser": "hermes"},
     ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]),
    ({"tool_call_parser": "llama3_json"}, ["--tool-call-parser", "llama3_json"]),
    ({"tool_strict_level": "function"}, ["--tool-strict-level", "function"]),
    ({"reasoning_parser": "deepseek_r1"}, ["--reasoning-parser", "deepseek_r1"]),
    ({"structured_outputs_config": {"backend": "guidance"}}, ["--structured-outputs-config", '{"backend":"guidance"}']),
    ({"enable_lora": True}, ["--enable-lora"]),
    ({"max_loras": 2}, ["--max-loras", "2"]),
    ({"max_lora_rank": 16}, ["--max-lora-rank", "16"]),
    ({"enable_lora": True, "lora_modules": {"sql": "/adapters/sql", "chat": "org/chat-lora"}},
     ["--enable-lora", "--lora-modules", "sql=/adapters/sql", "chat=org/chat-lora"]),
    ({"enable_prompt_tokens_details": True}, ["--enable-prompt-tokens-details"]),
])
def test_render_command_renders_each_serve_feature_only_when_set(engine, want):
    plain = {"enable_prompt_tokens_details": False}  # tiny-cpu sets it: the base renders none of them
    base = render_command(_with_engine("tiny-cpu", **plain), "/m", 1234, python="py")
    cmd = render_command(_with_engine("tiny-cpu", **{**plain, **engine}), "/m", 1234, python="py")
    assert cmd == base + want  # after the other engine flags; extra_args (none here) would follow


def test_embedded_adapter_without_a_built_dir_is_a_launch_error_naming_the_field(tmp_path):
    p = load_profile(FEATURES)
    with pytest.raises(LaunchError, match=r"^engine\.lora_modules\.kvgate-lora-a is 'embedded' but no built"):
        render_command(p, "/m", 1234, python="py")
    with pytest.raises(LaunchError, match=r"^engine\.lora_modules\.kvgate-lora-b is 'embedded'"):
        render_command(p, "/m", 1234, python="py", lora_dirs={"kvgate-lora-a": tmp_path})
    server = EmbeddedServer(p, tmp_path, tmp_path / "log.txt", python="py", sleep=lambda s: None)
    with pytest.raises(LaunchError, match=r"engine\.lora_modules\.kvgate-lora-a"):
        server.launch()
    assert server.proc is None  # nothing was started


def test_embedded_server_renders_its_lora_dirs(tmp_path):
    fake_python = tmp_path / "py"
    fake_python.write_text("#!/bin/sh\nexit 3\n")
    fake_python.chmod(0o755)
    dirs = {"kvgate-lora-a": tmp_path / "a", "kvgate-lora-b": tmp_path / "b"}
    server = EmbeddedServer(load_profile(FEATURES), tmp_path, tmp_path / "log.txt", python=str(fake_python),
                            sleep=lambda s: None, lora_dirs=dirs)
    try:
        server.launch()
    finally:
        server.stop()
    i = server.command.index("--lora-modules")
    assert server.command[i + 1:i + 3] == [f"kvgate-lora-a={tmp_path / 'a'}", f"kvgate-lora-b={tmp_path / 'b'}"]


TINY_CPU_COMMAND = [
    "py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--served-model-name", "kvgate-tiny-llama",
    "--host", "127.0.0.1", "--port", "1234", "--max-model-len", "2048", "--max-num-seqs", "8",
    "--max-num-batched-tokens", "4096", "--dtype", "float32", "--kv-cache-memory-bytes", "67108864",
    "--enforce-eager", "--override-generation-config", '{"max_new_tokens": 512}', "--shutdown-timeout", "10",  # rollout.drain_timeout_s
    "--enable-prompt-tokens-details",  # cached_tokens reported: tiny-cpu-replay's per-turn cache effect
]
# --enable-prompt-tokens-details is tiny-cpu's own (and so every profile extending it): reporting only
FEATURE_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "--tool-strict-level", "--reasoning-parser",
                 "--structured-outputs-config", "--enable-lora", "--max-loras", "--max-lora-rank", "--lora-modules")


def test_existing_profiles_render_unchanged():
    from kvgate.profile.models import available_profiles

    assert render_command(load_profile("tiny-cpu"), "/m", 1234, python="py") == TINY_CPU_COMMAND
    for name in available_profiles():
        if name == FEATURES:
            continue
        cmd = render_command(load_profile(name), "/m", 1234, python="py")
        assert not set(FEATURE_FLAGS) & set(cmd), name


def test_markers_for_the_features_profile_and_none_without_parsers():
    from kvgate.launch.tinymodel import markers_for

    assert markers_for(load_profile(FEATURES).engine) == MARKERS
    assert markers_for(load_profile("tiny-cpu").engine) is None
    engine = load_profile("tiny-cpu").engine
    assert markers_for(engine.model_copy(update={"tool_call_parser": "hermes"})) == ("<tool_call>", "</tool_call>")
    assert markers_for(engine.model_copy(update={"reasoning_parser": "deepseek_r1"})) == ("<think>", "</think>")
    assert markers_for(engine.model_copy(update={"tool_call_parser": "llama3_json"})) is None  # no table entry


def test_markers_for_is_ordered_and_deduplicated(monkeypatch):
    from kvgate.launch import tinymodel

    monkeypatch.setitem(tinymodel.PARSER_MARKERS, "both", ("<think>", "<tool_call>"))
    engine = load_profile("tiny-cpu").engine.model_copy(update={"reasoning_parser": "qwen3", "tool_call_parser": "both"})
    assert tinymodel.markers_for(engine) == ("<think>", "</think>", "<tool_call>")


def test_tiny_cpu_model_digest_is_unchanged_and_the_features_model_is_its_own():
    from kvgate.launch.tinymodel import markers_for

    arch = load_profile("tiny-cpu").model.architecture
    assert TinySpec().digest() == "ade7e5cc3fd9"  # the cached default tiny Llama
    assert TinySpec.from_architecture(arch, markers=None).digest() == "ade7e5cc3fd9"
    assert TinySpec.from_architecture(arch, markers=markers_for(load_profile("tiny-cpu").engine)).digest() == "ade7e5cc3fd9"
    features = load_profile(FEATURES)
    spec = TinySpec.from_architecture(features.model.architecture, markers=markers_for(features.engine))
    assert spec.markers == MARKERS and spec.digest() != "ade7e5cc3fd9"


def test_ensure_adapters_builds_only_the_embedded_ones_at_the_profiles_rank(tmp_path):
    from kvgate.launch.lora import ensure_adapters

    calls = []

    def build(base, name, rank):
        calls.append((base, name, rank))
        return tmp_path / name

    engine = load_profile(FEATURES).engine.model_copy(
        update={"max_lora_rank": 16, "lora_modules": {"a": "embedded", "mine": "/adapters/mine"}})
    assert ensure_adapters(engine, tmp_path / "model", build=build) == {"a": tmp_path / "a"}
    assert calls == [(tmp_path / "model", "a", 16)]
    calls.clear()
    engine = engine.model_copy(update={"max_lora_rank": None})
    ensure_adapters(engine, tmp_path / "model", build=build)
    assert calls == [(tmp_path / "model", "a", 8)]  # no max_lora_rank: rank 8
    assert ensure_adapters(load_profile("tiny-cpu").engine, tmp_path, build=lambda *a, **k: pytest.fail("built")) == {}


def test_embedded_environment_runs_the_worker_in_engine_core_at_tp1_unless_told_otherwise(tmp_path, monkeypatch):
    """TP=1: VLLM_ENABLE_V1_MULTIPROCESSING=0 (the CPU worker inside EngineCore, ~10 s less start-up);
    the profile's engine.env and the caller's environment win; TP>1 keeps vLLM's multiprocess executor."""
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    tiny = load_profile("tiny-cpu")
    assert EmbeddedServer(tiny, tmp_path, tmp_path / "log").environment()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    eng = tiny.engine.model_copy(update={"env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}})
    told = tiny.model_copy(update={"engine": eng})
    assert EmbeddedServer(told, tmp_path, tmp_path / "log").environment()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    tp2 = tiny.model_copy(update={"engine": tiny.engine.model_copy(update={"tensor_parallel_size": 2})})
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in EmbeddedServer(tp2, tmp_path, tmp_path / "log").environment()
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    assert EmbeddedServer(tiny, tmp_path, tmp_path / "log").environment()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_embedded_environment_disables_torch_compile_with_enforce_eager(tmp_path, monkeypatch):
    """enforce_eager: TORCH_COMPILE_DISABLE=1, so vLLM's sampler does not compile its logprobs-rank
    kernel on the first logprobs request (16.9 s of inductor on 2 cores, measured); a profile
    without enforce_eager keeps vLLM's compile; engine.env and the caller's environment win."""
    monkeypatch.delenv("TORCH_COMPILE_DISABLE", raising=False)
    real = load_profile("smollm2-cpu")
    assert real.engine.enforce_eager
    assert EmbeddedServer(real, tmp_path, tmp_path / "log").environment()["TORCH_COMPILE_DISABLE"] == "1"
    compiled = real.model_copy(update={"engine": real.engine.model_copy(update={"enforce_eager": False})})
    assert "TORCH_COMPILE_DISABLE" not in EmbeddedServer(compiled, tmp_path, tmp_path / "log").environment()
    told = real.model_copy(update={"engine": real.engine.model_copy(update={"env": {"TORCH_COMPILE_DISABLE": "0"}})})
    assert EmbeddedServer(told, tmp_path, tmp_path / "log").environment()["TORCH_COMPILE_DISABLE"] == "0"
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "0")
    assert EmbeddedServer(real, tmp_path, tmp_path / "log").environment()["TORCH_COMPILE_DISABLE"] == "0"
