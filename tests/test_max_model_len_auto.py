"""``engine.max_model_len: auto`` (issue 49; vllm PR#29431, KAITO PR#2156 got 20,272 of 40,960 tokens):
the profile says auto with the smallest context it needs (``engine.min_model_len``); the launchers render
``--max-model-len auto``; deployment/max-model-len reads the served length back and FAILs it below the need;
the fit gate's arithmetic uses the served length (fit/live-pool) or, with no server, the need. Both ways
on the fake vLLM through the plugin; the profile's validation refuses auto where it makes no sense."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import ValidationError

from kvgate.gates.deployment import max_model_len_verdict, served_max_model_len
from kvgate.gates.fit import at_served_len, fit_verdict
from kvgate.http.client import Endpoint, KvClient
from kvgate.http.probes import observe_deployment
from kvgate.launch.local import render_command
from kvgate.profile import schema as ps
from kvgate.profile.models import EngineSpec, load_profile
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .test_gates_vs_fake import PROFILE, run_suites

pytest_plugins = ["pytester"]
#: The fake's KV pool: 64 blocks of 16 tokens at 2,048 B a token (float32) = 2 MiB, 1,024 tokens.
POOL = 64 * 16 * 2048


@pytest.fixture
def auto_profile(tmp_path):
    """The fake's profile with ``max_model_len: auto``, needing 200 tokens (the fake serves 256)."""
    path = tmp_path / "fake-auto.yaml"
    path.write_text(f"extends: {PROFILE}\nmodel: {{dtype: float32, weights_gib: 0.001}}\nengine:\n  max_model_len: auto\n"
                    f"  min_model_len: 200\n  kv_cache_memory_bytes: {POOL}\n  max_num_seqs: 16\n")
    return path


def fake_config(**kw) -> FakeConfig:
    """The fake at float32 with the pool stated (tests/test_fit_vs_fake.py): 64 blocks of 16 tokens."""
    return FakeConfig(max_tokens_cap=64, kv_cache_memory_bytes=POOL, dtype="float32", **kw)


# ---------------------------------------------------------------------------- the profile
def test_auto_is_accepted_with_the_need_and_rendered_as_vllms_auto(auto_profile):
    p = load_profile(str(auto_profile))
    assert (p.engine.max_model_len, p.engine.min_model_len, p.engine.max_model_len_auto) == (200, 200, True)
    cmd = render_command(p, "MODEL", 8000)
    assert cmd[cmd.index("--max-model-len") + 1] == "auto"
    fixed = load_profile(str(PROFILE))
    assert render_command(fixed, "MODEL", 8000)[render_command(fixed, "MODEL", 8000).index("--max-model-len") + 1] \
        == "256"
    assert EngineSpec(**p.engine.model_dump()).max_model_len_auto  # a dumped profile (record mode) reads back the same


@pytest.mark.parametrize("engine,why", [
    ({"max_model_len": "auto"}, "max_model_len: auto needs engine.min_model_len"),
    ({"max_model_len": 4096, "min_model_len": 2048}, "engine.min_model_len is the need of max_model_len: auto"),
    ({"max_model_len": "auto", "min_model_len": 2048, "runtime": "llama.cpp"}, "the llama.cpp runtime needs a number"),
    ({"max_model_len": "automatic"}, "max_model_len"),
])
def test_auto_is_refused_where_it_makes_no_sense(engine, why):
    with pytest.raises(ValidationError, match=why):
        EngineSpec(**engine)


def test_the_schema_takes_auto_and_numbers_only():
    schema = json.loads(ps.PROFILE_SCHEMA.read_text())
    engine = schema["$defs"]["EngineSpec"]["properties"]["max_model_len"]
    jsonschema.validate(4096, engine)
    jsonschema.validate("auto", engine)
    for bad in ("automatic", 0):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, engine)


# ---------------------------------------------------------------------------- the read-back, both ways
def observe(fake, profile):
    with KvClient(Endpoint(base_url=fake.base_url)) as client:
        return observe_deployment(client, profile.model.served_name)


def test_served_below_the_need_fails_naming_served_and_needed(auto_profile):
    p = load_profile(str(auto_profile))
    with FakeVLLM(FakeConfig(faults={"wrong_max_model_len"}, advertised_max_model_len=128)) as fake:
        obs = observe(fake, p)
    v = max_model_len_verdict(obs, p)
    assert v.status.value == "FAIL" and (v.measured, v.limit) == (128, 200), v.message
    assert v.message.startswith("max_model_len: auto served 128 tokens (/v1/models) < 200 tokens needed "
                                "(engine.min_model_len) -> FAIL"), v.message
    assert served_max_model_len(obs, p) == (128, "/v1/models")


def test_served_at_or_above_the_need_passes_and_a_fixed_profile_still_wants_equality(auto_profile):
    p = load_profile(str(auto_profile))
    with FakeVLLM(FakeConfig()) as fake:
        obs = observe(fake, p)
    v = max_model_len_verdict(obs, p)
    assert v.status.value == "PASS" and v.message == ("max_model_len: auto served 256 tokens per /v1/models and "
                                                      "/tokenize >= 200 needed (engine.min_model_len) -> PASS")
    fixed = p.model_copy(update={"engine": p.engine.model_copy(update={"max_model_len_auto": False})})
    assert max_model_len_verdict(obs, fixed).status.value == "FAIL"  # 256 served, 200 declared


# ---------------------------------------------------------------------------- the fit gate
def test_fit_uses_the_served_length_under_auto_and_the_need_without_one(tmp_path):
    """The fake's pool holds 1,024 tokens (64 blocks of 16): the batch workload's 2 sequences of a needed 256 fit, of a
    served 2,048 not one."""
    path = tmp_path / "fit-auto.yaml"
    path.write_text(f"extends: {PROFILE}\nmodel: {{dtype: float32, weights_gib: 0.001}}\nengine:\n"
                    f"  max_model_len: auto\n  min_model_len: 256\n  kv_cache_memory_bytes: {POOL}\n  max_num_seqs: 16\n")
    p = load_profile(str(path))
    need = fit_verdict(p)
    assert need.evidence["plan"]["max_model_len"] == 256 and "judged at the 256 tokens needed (engine.min_model_len)" \
        in need.message
    served = fit_verdict(p, 2048, "/v1/models")
    assert served.evidence["plan"]["max_model_len"] == 2048 and "vLLM serves 2,048 tokens (/v1/models; 256 needed)" \
        in served.message
    assert need.status.value == "PASS" and served.status.value == "FAIL", (need.message, served.message)
    assert at_served_len(load_profile(str(PROFILE)), 2048)[1] == ""  # a fixed length: unchanged


def test_through_the_plugin_live_pool_reads_the_served_length_and_max_model_len_judges_it(pytester, auto_profile):
    suites = ["suites/test_fit.py", "suites/test_deployment.py"]
    with FakeVLLM(fake_config()) as fake:
        _, _, gates = run_suites(pytester, fake.url, "-k", "predicted_pool or matches_profile", suites=suites,
                                 profile=auto_profile)
    live, mml = gates["fake-auto/fit/live-pool"], gates["fake-auto/deployment/max-model-len"]
    assert mml["status"] == "PASS" and "auto served 256 tokens" in mml["message"], mml["message"]
    assert live["status"] == "PASS" and "vLLM serves 256 tokens (/v1/models; 200 needed)" in live["message"], live
    assert "difference +0 tokens" in live["message"] and live["evidence"]["max_model_len_auto"]["served"] == 256
    with FakeVLLM(fake_config(faults={"wrong_max_model_len"}, advertised_max_model_len=128)) as fake:
        result, _, gates = run_suites(pytester, fake.url, "-k", "matches_profile", suites=suites, profile=auto_profile)
    mml = gates["fake-auto/deployment/max-model-len"]
    assert mml["status"] == "FAIL" and "served 128 tokens (/v1/models) < 200 tokens needed" in mml["message"]
    assert result.ret == 1


def test_the_live_gates_work_at_the_served_length_not_the_need(pytester, auto_profile):
    """max_model_len: auto needing 200 against a healthy fake serving 256: the run adopts the served
    length after the preflight (Run.adopt_served_len), so the max-context gate's over-length probes
    send 257 tokens -- not 201, which the server rightly answers 200 (a newcomer's run FAILed four
    healthy over-length cases that way, 2026-12-06)."""
    with FakeVLLM(fake_config()) as fake:
        _, summary, gates = run_suites(pytester, fake.url, "-k", "over_length or fits", profile=auto_profile,
                                       suites=["suites/test_max_context.py"])
    over = {k: g for k, g in gates.items() if "/over-length/" in k}
    assert over and all(g["status"] == "PASS" for g in over.values()), [g["message"] for g in over.values()]
    assert any("257" in g["message"] or "256" in g["message"] for g in over.values()), \
        [g["message"] for g in over.values()]
