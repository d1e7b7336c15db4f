"""kvgate lint: every rule FAILs a profile with the fault and PASSes the same profile without it;
the shipped profiles lint clean (or explain their findings); the gate run lints first."""

from __future__ import annotations

import copy

import pytest
import yaml

from kvgate.authoring.lint import ERROR, WARNING, lint_file, lint_for_run, lint_profile
from kvgate.profile.models import DEFAULT_PROFILE_DIR, Profile, available_profiles
from kvgate.launch.vllm_args import CHANGES, load_snapshot, version_tuple

from .conftest import REPO

GPU = {
    "name": "gpu",
    "model": {"served_name": "m", "architecture": {
        "layers": 80, "attention_heads": 64, "kv_heads": 8, "head_dim": 128, "hidden_size": 8192,
        "intermediate_size": 28672, "vocab_size": 128256, "params_billion": 70.6, "max_position_embeddings": 131072}},
    "hardware": {"gpu": "NVIDIA RTX 6000 Ada Generation", "count": 4, "memory_gib": 47.99},
    "engine": {"tensor_parallel_size": 4, "max_model_len": 16384, "max_num_seqs": 32, "max_num_batched_tokens": 8192,
               "gpu_memory_utilization": 0.88, "kv_cache_dtype": "fp8", "vllm_version": "0.32.0"},
}
CPU = {
    "name": "cpu",
    "model": {"served_name": "m", "dtype": "float32",
              "architecture": {"layers": 2, "attention_heads": 4, "kv_heads": 2, "head_dim": 64, "hidden_size": 256,
                               "intermediate_size": 512, "vocab_size": 512}},
    "engine": {"max_model_len": 2048, "max_num_seqs": 8, "dtype": "float32", "kv_cache_memory_bytes": 64 << 20},
}


def profile(base: dict, **engine) -> Profile:
    data = copy.deepcopy(base)
    for key, value in engine.items():
        section, _, field = key.partition("__")
        if field:
            data.setdefault(section, {})[field] = value
        else:
            data["engine"][key] = value
    return Profile.model_validate(data)


def rules(findings, counted=True):
    return {f.rule for f in findings if f.counts or not counted}


def test_the_bases_are_clean():
    assert lint_profile(profile(GPU)) == []
    assert lint_profile(profile(CPU)) == []


# ---------------------------------------------------------------------------- engine arguments


def test_unknown_flag_fails_with_did_you_mean_and_a_known_one_passes():
    bad = lint_profile(profile(GPU, extra_args=["--max-num-seq", "8"]))
    f = next(f for f in bad if f.rule == "engine-arg-unknown")
    assert f.severity == ERROR and f.field == "engine.extra_args"
    assert "--max-num-seq is not a vllm serve argument in vLLM 0.32.0 (its own parser)" in f.message
    assert "did you mean --max-num-seqs" in f.message
    assert lint_profile(profile(GPU, extra_args=["--disable-log-stats", "--served-model-name=x"])) == []


def test_engine_field_whose_flag_the_version_lacks_fails():
    from dataclasses import replace as dc_replace

    real = load_snapshot("0.32.0")
    older = dc_replace(real, by_flag={k: v for k, v in real.by_flag.items() if k != "--kv-cache-memory-bytes"})
    bad = lint_profile(profile(CPU), args=older)
    f = next(f for f in bad if f.rule == "engine-arg-unknown")
    assert f.field == "engine.kv_cache_memory_bytes" and "--kv-cache-memory-bytes" in f.message
    assert lint_profile(profile(CPU), args=real) == []


def test_removed_flag_fails_from_its_version_with_the_source_and_passes_before():
    bad = lint_profile(profile(GPU, extra_args=["--swap-space", "4"]))
    f = next(f for f in bad if f.rule == "engine-arg-removed")
    assert f.severity == ERROR and "removed in vLLM 0.18.0" in f.message and "PR #36216" in f.message
    assert "engine-arg-unknown" not in rules(bad)  # the documented change says it better
    old = lint_profile(profile(GPU, extra_args=["--swap-space", "4"], vllm_version="0.17.1"))
    assert not {"engine-arg-removed", "engine-arg-unknown"} & rules(old)


def test_renamed_flag_fails_after_warns_before_and_its_replacement_passes():
    after = lint_profile(profile(GPU, extra_args=["--disable-log-requests"]))
    f = next(f for f in after if f.rule == "engine-arg-renamed")
    assert f.severity == ERROR and "use --enable-log-requests" in f.message and "#29402" in f.message
    before = lint_profile(profile(GPU, extra_args=["--disable-log-requests"], vllm_version="0.11.0"))
    assert [f.severity for f in before if f.rule == "engine-arg-renamed"] == [WARNING]
    assert lint_profile(profile(GPU, extra_args=["--enable-log-requests"])) == []


def test_value_outside_the_parsers_choices_fails():
    bad = lint_profile(profile(GPU, kv_cache_dtype="fp9"))
    f = next(f for f in bad if f.rule == "engine-arg-value")
    assert f.field == "engine.kv_cache_dtype" and "--kv-cache-dtype fp9" in f.message and "fp8_e4m3" in f.message
    assert lint_profile(profile(GPU, kv_cache_dtype="fp8_e5m2")) == []


def test_default_that_changed_across_versions_warns_when_left_unset():
    bad = lint_profile(profile(GPU, max_num_seqs=None, gpu_memory_utilization=None))
    got = {f.field: f for f in bad if f.rule == "engine-default-changed"}
    assert set(got) == {"engine.max_num_seqs", "engine.gpu_memory_utilization"}
    assert got["engine.gpu_memory_utilization"].severity == WARNING
    assert "0.9 up to 0.11, 0.92 from 0.20" in got["engine.gpu_memory_utilization"].message
    assert lint_profile(profile(CPU, max_num_seqs=None)) == []  # the CPU's defaults did not change


def test_extra_args_repeating_an_engine_field_fails():
    bad = lint_profile(profile(GPU, extra_args=["--max-model-len", "8192"]))
    f = next(f for f in bad if f.rule == "extra-args-duplicate")
    assert "--max-model-len repeats engine.max_model_len (16384)" in f.message
    assert lint_profile(profile(GPU, extra_args=["--max-logprobs", "5"])) == []


# ---------------------------------------------------------------------------- combinations


def test_batched_below_len_without_chunked_prefill_fails():
    bad = lint_profile(profile(GPU, max_num_batched_tokens=4096, extra_args=["--no-enable-chunked-prefill"]))
    f = next(f for f in bad if f.rule == "batched-below-len")
    assert "max_num_batched_tokens 4,096 < max_model_len 16,384" in f.message
    assert lint_profile(profile(GPU, max_num_batched_tokens=4096)) == []  # chunked prefill (the default) copes
    assert "batched-below-len" in rules(lint_profile(profile(GPU, max_num_batched_tokens=16)))  # < max_num_seqs 32


def test_tp_not_dividing_heads_fails():
    bad = lint_profile(profile(GPU, tensor_parallel_size=3, hardware__count=4))
    msgs = [f.message for f in bad if f.rule == "tp-heads"]
    assert any("TP 3 does not divide the 64 attention heads" in m for m in msgs)
    assert any("TP 3 neither divides the 8 KV heads" in m for m in msgs)
    fine = profile(GPU, tensor_parallel_size=16, hardware__count=16)  # 16 = 2 x 8 KV heads: replicated, fine
    assert "tp-heads" not in rules(lint_profile(fine))


def test_tp_above_gpu_count_fails():
    assert "tp-gpu-count" in rules(lint_profile(profile(GPU, hardware__count=2)))
    assert "tp-gpu-count" not in rules(lint_profile(profile(GPU, hardware__count=8)))


def test_kv_pool_below_one_sequence_fails():
    # 4 MiB at 2,048 B/token = 16 blocks of 128 = one 2,048-token sequence, but one block is vLLM's null block
    bad = lint_profile(profile(CPU, kv_cache_memory_bytes=4 << 20))
    f = next(f for f in bad if f.rule == "kv-pool-below-sequence")
    assert f.severity == ERROR and "15 usable blocks of 128" in f.message and "2,048-token" in f.message
    assert lint_profile(profile(CPU, kv_cache_memory_bytes=4 << 20, max_model_len=1024)) == []


def test_enforce_eager_on_gpu_warns_unless_explained_and_not_on_cpu(write_profile):
    data = copy.deepcopy(GPU)
    data.pop("name")
    data["engine"]["enforce_eager"] = True
    path = write_profile("eager", yaml.safe_dump(data))
    _, found = lint_file(str(path))
    assert [(f.rule, f.severity, f.counts) for f in found] == [("enforce-eager-gpu", WARNING, True)]
    path.write_text("# kvgate-lint: allow enforce-eager-gpu -- CUDA graphs crash on driver 550 (ticket 42)\n"
                    + path.read_text())
    _, found = lint_file(str(path))
    assert [(f.rule, f.explained) for f in found] == [("enforce-eager-gpu", "CUDA graphs crash on driver 550 (ticket 42)")]
    assert lint_profile(profile(CPU, enforce_eager=True)) == []


def test_engine_dtype_other_than_the_model_dtype_warns():
    # the issue 38 overlay: smollm2-cpu's float32 model served with --dtype bfloat16
    (f,) = lint_profile(profile(CPU, dtype="bfloat16"))
    assert (f.rule, f.severity, f.field) == ("dtype-mismatch", WARNING, "engine.dtype")
    assert f.message.startswith("engine.dtype bfloat16 differs from model.dtype float32: vLLM casts the weights to "
                                "bfloat16 as it loads them; with kv_cache_dtype auto its KV elements are 2 B, not 4 B;")
    # two 16-bit dtypes: the KV element is 2 B either way -- no KV clause (it read "2 B, not 2")
    (half,) = lint_profile(profile(CPU, dtype="float16", model__dtype="bfloat16"))
    assert half.rule == "dtype-mismatch" and "KV elements" not in half.message, half.message
    # the same dtype spelled otherwise, auto, unset, or quantised weights under a 16-bit --dtype: nothing to say
    for same in (profile(CPU, dtype="float"), profile(CPU, dtype="auto"), profile(CPU, dtype=None),
                 profile(CPU, dtype="float16", model__dtype="q4_k_m")):
        assert "dtype-mismatch" not in rules(lint_profile(same))
    fp8 = lint_profile(profile(CPU, dtype="bfloat16", kv_cache_dtype="fp8"))
    assert [f.rule for f in fp8] == ["dtype-mismatch"] and "KV elements" not in fp8[0].message


def test_max_model_len_over_positions_fails_unless_allowed_by_env():
    bad = lint_profile(profile(GPU, max_model_len=262144))
    assert "len-over-positions" in rules(bad)
    ok = lint_profile(profile(GPU, max_model_len=262144, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}))
    assert "len-over-positions" not in rules(ok)


def test_serve_feature_mistakes_fail_and_the_working_combinations_pass():
    bad = lint_profile(profile(GPU, enable_auto_tool_choice=True))
    (f,) = [f for f in bad if f.rule == "serve-feature"]
    assert (f.severity, f.field) == (ERROR, "engine.enable_auto_tool_choice")
    assert f.message.startswith("enable_auto_tool_choice: true without tool_call_parser: vLLM refuses to start")
    assert "validate_parsed_serve_args" in f.message
    assert lint_profile(profile(GPU, enable_auto_tool_choice=True, tool_call_parser="hermes")) == []

    bad = lint_profile(profile(GPU, lora_modules={"sql": "/adapters/sql"}))
    (f,) = [f for f in bad if f.rule == "serve-feature"]
    assert (f.severity, f.field) == (ERROR, "engine.lora_modules")
    assert f.message.startswith("lora_modules (sql) with enable_lora false: vLLM fails at start-up")
    assert lint_profile(profile(GPU, enable_lora=True, lora_modules={"sql": "/adapters/sql"})) == []

    bad = lint_profile(profile(GPU, enable_lora=True, lora_modules={"sql": "/adapters/sql", "mine": "embedded"}))
    (f,) = [f for f in bad if f.rule == "serve-feature"]
    assert (f.severity, f.field) == (ERROR, "engine.lora_modules.mine")
    assert f.message.startswith("lora_modules.mine: embedded on model 'm', which kvgate does not build")
    embedded = profile(CPU, enable_lora=True, lora_modules={"mine": "embedded"}, model__embedded=True)
    assert lint_profile(embedded) == []


def test_serve_feature_fields_are_checked_against_the_parser():
    from dataclasses import replace as dc_replace

    fields = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes", "tool_strict_level": "parameter",
              "reasoning_parser": "qwen3", "structured_outputs_config": {"backend": "xgrammar"}, "enable_lora": True,
              "max_loras": 2, "max_lora_rank": 16, "lora_modules": {"sql": "/adapters/sql"},
              "enable_prompt_tokens_details": True}
    real = load_snapshot("0.32.0")
    assert lint_profile(profile(GPU, **fields), args=real) == []
    for name in fields:
        from kvgate.launch.vllm_args import FIELD_FLAGS

        flag = FIELD_FLAGS[name]
        assert flag in real.by_flag, flag
        older = dc_replace(real, by_flag={k: v for k, v in real.by_flag.items() if k != flag})
        found = [f for f in lint_profile(profile(GPU, **fields), args=older) if f.rule == "engine-arg-unknown"]
        assert [f.field for f in found] == [f"engine.{name}"] and flag in found[0].message
    bad = lint_profile(profile(GPU, enable_lora=True, max_lora_rank=12))
    f = next(f for f in bad if f.rule == "engine-arg-value")
    assert f.field == "engine.max_lora_rank" and "--max-lora-rank 12 is not accepted" in f.message
    dup = lint_profile(profile(GPU, tool_call_parser="hermes", extra_args=["--tool-call-parser", "mistral"]))
    assert "--tool-call-parser repeats engine.tool_call_parser ('hermes')" in \
        next(f for f in dup if f.rule == "extra-args-duplicate").message


def test_allow_without_reason_or_without_a_finding_is_reported():
    found = lint_profile(profile(GPU), texts=["# kvgate-lint: allow tp-heads\n# kvgate-lint: allow tp-gpu-count -- x\n"])
    assert rules(found) == {"lint-allow-reason", "lint-allow-unused"}


# ---------------------------------------------------------------------------- shipped, versions, wiring


@pytest.mark.parametrize("name", available_profiles())
def test_shipped_profiles_lint_clean_or_explain(name):
    _, found = lint_file(name)
    assert [f.line() for f in found if f.counts] == []
    for f in found:
        assert f.explained and len(f.explained) > 10


def test_changes_table_entries_name_their_source_and_agree_with_the_parser():
    args = load_snapshot("0.32.0")
    for ch in CHANGES:
        assert ch.source and ch.kind in ("removed", "renamed", "default")
        if ch.kind in ("removed", "renamed") and version_tuple(ch.version) <= version_tuple(args.version):
            assert ch.flag not in args.by_flag, f"{ch.flag}: the table says {ch.kind} by {ch.version}"
        if ch.replacement:
            assert ch.replacement in args.by_flag
        if ch.kind == "default":
            assert ch.flag in args.by_flag


def test_snapshot_is_for_the_installed_vllm():
    from kvgate.launch.vllm_args import available_snapshots, installed_version

    inst = installed_version()
    if inst is None:
        pytest.skip("no vLLM installed: the checked-in snapshot is used as is")
    assert inst in available_snapshots(), f"regenerate: .venv/bin/python -m kvgate.launch.vllm_args --write (vLLM {inst})"


def test_certify_turns_findings_into_a_refusal_and_enforce_does_not(tmp_path):
    p = profile(GPU, hardware__count=2)
    findings, refusal = lint_for_run(p, DEFAULT_PROFILE_DIR, "enforce")
    assert refusal is None and "tp-gpu-count" in rules(findings)
    findings, refusal = lint_for_run(p, DEFAULT_PROFILE_DIR, "certify")
    assert "--gate-mode certify treats every unexplained lint finding as an error" in refusal
    assert "tp-gpu-count" in refusal
    assert lint_for_run(profile(GPU), DEFAULT_PROFILE_DIR, "certify") == ([], None)


def test_cli_exit_codes(write_profile, capsys):
    from kvgate.cli.main import main

    assert main(["lint", "llama70b-tp4", "tiny-cpu"]) == 0
    bad = copy.deepcopy(GPU)
    bad["hardware"]["count"] = 2
    path = write_profile("bad", yaml.safe_dump(bad))
    assert main(["lint", str(path)]) == 1
    out = capsys.readouterr().out
    assert "1 error" in out and "tp-gpu-count" in out
    assert main(["lint", str(path.with_name("nosuch.yaml"))]) == 2
    ok_warn = copy.deepcopy(GPU)
    ok_warn["engine"].pop("max_num_seqs")
    path = write_profile("warn", yaml.safe_dump(ok_warn))
    assert main(["lint", str(path)]) == 0
    assert main(["lint", "--strict", str(path)]) == 1


pytest_plugins = ["pytester"]


def test_gate_run_prints_lint_warnings_and_certify_refuses(pytester):
    data = copy.deepcopy(GPU)
    data["engine"].pop("max_num_seqs")
    path = pytester.path / "warn.yaml"
    path.write_text(yaml.safe_dump(data))
    common = ("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
              f"--kvgate-reports={pytester.path / 'r'}", f"--profile={path}", "-m", "fit", str(REPO / "suites"))
    result = pytester.runpytest_inprocess(*common)
    out = result.stdout.str()
    assert "kvgate lint: 0 errors, 1 warning" in out and "engine-default-changed (engine.max_num_seqs)" in out
    result = pytester.runpytest_inprocess(*common, "--gate-mode", "certify")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--gate-mode certify treats every unexplained lint finding" in result.stderr.str()


# ---------------------------------------------------------------------------- the declared version


def test_parse_version_reads_vllm_versions_and_names_the_form_otherwise():
    from kvgate.launch.vllm_args import VERSION_FORM, parse_version

    for text, want in (("0.32.0", (0, 32, 0)), ("v0.11", (0, 11, 0)), ("0.10.1.1", (0, 10, 1)),
                       ("0.32.0+cpu", (0, 32, 0)), ("0.12.0rc1", (0, 12, 0)), ("0.8.5.post1", (0, 8, 5))):
        assert parse_version(text) == want
    for bad in ("banana", "32", "", "0.32.x", "latest"):
        with pytest.raises(ValueError, match=f"{bad!r} is not a vLLM version; expected X.Y or X.Y.Z"):
            parse_version(bad)
    assert "e.g. 0.32.0" in VERSION_FORM


def test_cli_unparseable_vllm_version_is_a_usage_error_naming_value_and_form(capsys):
    from kvgate.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["lint", "tiny-cpu", "--vllm-version=banana"])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("kvgate lint: error: argument --vllm-version: 'banana' is not a vLLM version; "
                           "expected X.Y or X.Y.Z (e.g. 0.32.0")


def test_cli_version_without_a_snapshot_says_which_snapshot_is_used(capsys):
    from kvgate.launch.vllm_args import available_snapshots
    from kvgate.cli.main import main

    newest = available_snapshots()[-1]
    assert main(["lint", "tiny-cpu", "--vllm-version=99.0.0"]) == 0
    out = capsys.readouterr().out
    assert (f"note: kvgate has no vllm serve argument snapshot for vLLM 99.0.0 (it has {', '.join(available_snapshots())}); "
            f"checked against the {newest} snapshot (the newest older one") in out
    assert main(["lint", "tiny-cpu", "--vllm-version=0.0.1"]) == 0
    assert "(the oldest kvgate has, newer than it" in capsys.readouterr().out
    assert main(["lint", "tiny-cpu", f"--vllm-version=v{newest}"]) == 0
    assert "note:" not in capsys.readouterr().out  # its own snapshot: nothing to say


def test_profile_version_that_is_not_a_version_is_an_error_finding():
    found = lint_profile(profile(GPU, vllm_version="banana"))
    f = next(f for f in found if f.rule == "vllm-version")
    assert f.severity == ERROR and f.field == "engine.vllm_version"
    assert "'banana' is not a vLLM version; expected X.Y or X.Y.Z" in f.message and "snapshot instead" in f.message
    assert "vllm-version" not in rules(lint_profile(profile(GPU, vllm_version="0.32")))


def test_image_tag_with_a_suffix_declares_its_version():
    from kvgate.launch.vllm_args import declared_version

    p = profile(GPU, vllm_version=None, launch__image="vllm/vllm-openai:v0.11.0-cu128")
    assert declared_version(p) == ("0.11.0", "launch.image tag")


def test_cli_profile_that_is_not_text_is_one_line_exit_2(tmp_path, capsys):
    from kvgate.cli.main import main

    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00")
    assert main(["lint", str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"kvgate lint: {path}: not UTF-8 text (byte 0: invalid start byte); " \
                                              "a profile is a YAML file"


def test_cli_schema_write_to_an_unwritable_place_is_one_line_exit_2(tmp_path, capsys):
    from kvgate.cli.main import main

    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["schema", "profile", "--write", f"--schema-path={blocker / 's.json'}",
                 f"--reference-path={tmp_path / 'r.md'}"]) == 2
    assert capsys.readouterr().err.startswith("kvgate schema: cannot write ")
