"""kvgate advise: the seed arithmetic reproduced from traffic, two pools for a bimodal sample, traffic
from /metrics histograms, every number explained, and the written profile passing the fit gate."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvgate.authoring import advise as adv
from kvgate.cli.main import main
from kvgate.gates.fit import fit_verdict, plan
from kvgate.profile.models import load_profile

from .conftest import REPO

pytest_plugins = ["pytester"]

LLAMA70B = ["--from-profile", "llama70b-tp4-defaults"]  # the model and the 4 x 48 GB cards, nothing else


def jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps({"prompt_tokens": int(p), "output_tokens": int(o)}) + "\n" for p, o in rows))
    return str(path)


def seed_traffic(n=2000, seed=7):
    """90% chat (lognormal prompts around 900 tokens, p99 ~3k) and 10% long documents (9k-16k
    prompts, 300-1000 output): prompt + output p99 ~15.7k tokens."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        if rng.random() < 0.9:
            rows.append((min(4000, rng.lognormal(np.log(900), 0.6)), rng.integers(100, 600)))
        else:
            rows.append((rng.integers(9000, 16000), rng.integers(300, 1000)))
    return rows


def bimodal_traffic(n=3000, seed=3):
    """92% chat ~300 tokens (prompt 150-450, output 50-300) and 8% batch ~12k (prompt 11.0-11.8k, output 100-400)."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(150, 450), rng.integers(50, 300)) if rng.random() < 0.92 else
            (rng.integers(11000, 11800), rng.integers(100, 400)) for _ in range(n)]


def run_fit(pytester, profile_arg):
    return pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p",
                                        "no:cacheprovider", f"--kvgate-reports={pytester.path / 'r'}",
                                        profile_arg, "-m", "fit", str(REPO / "suites"))


# ---------------------------------------------------------------------------- the seed


def test_seed_llama70b_tp4_from_traffic_passes_fit_and_defaults_fail(pytester, capsys):
    rows = seed_traffic()
    totals = np.array([p + o for p, o in rows])
    assert 15360 < np.percentile(totals, 99) <= 16384  # "a traffic sample whose p99 is ~16k tokens"
    out = pytester.path / "llama70b-advised.yaml"
    code = main(["advise", "--traffic", jsonl(pytester.path / "t.jsonl", rows), *LLAMA70B, "--concurrency", "32",
                 "--ttft-p95-ms", "3000", "-o", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    prof = load_profile(str(out))
    e = prof.engine
    assert (e.max_model_len, e.kv_cache_dtype, e.gpu_memory_utilization) == (16384, "fp8", 0.88)
    assert e.tensor_parallel_size == 4 and prof.slo.ttft_p95_ms == 3000
    # max_num_seqs in the range the arithmetic allows: at least the SLO's 32, at most what the pool
    # holds at the mix's mean length, and what the fit gate accepts at the short p99
    p = plan(prof)
    usable_tokens = p.pool.usable_blocks * p.pool.block_size
    assert 32 <= e.max_num_seqs <= usable_tokens / totals.mean()
    assert e.max_num_seqs * p.pool.blocks_per(p.workloads.short_tokens) <= p.pool.usable_blocks
    assert p.pool.sequences_at_once >= prof.workloads["observed-long"].concurrency
    # every engine number is explained in the printed table and in the file
    text = out.read_text()
    for field in ("max_model_len", "kv_cache_dtype", "gpu_memory_utilization", "max_num_seqs",
                  "max_num_batched_tokens"):
        assert f"engine.{field}" in printed and f"#   engine.{field}" in text
    assert "auto: max_num_seqs" in text and "does not hold it" in text  # why fp8: bf16 cannot hold 32
    assert "exceed it" in text and "%" in text  # the share each choice rejects
    assert text.splitlines()[0].startswith("# yaml-language-server: $schema=")
    # ... and it passes -m fit, where the same model at vLLM's defaults fails
    assert run_fit(pytester, f"--profile={out}").ret == 0
    assert run_fit(pytester, "--profile=llama70b-tp4-defaults").ret == 1


def test_bf16_is_kept_when_it_holds_the_concurrency(tmp_path):
    traffic = adv.traffic_from_jsonl(jsonl(tmp_path / "t.jsonl", seed_traffic()))
    target = adv.target_from_args(_args(["--concurrency", "8", *LLAMA70B]))
    pool = adv.advise_pool("x", traffic, target, adv.Options(concurrency=8))
    assert pool.data["engine"]["kv_cache_dtype"] == "auto" and pool.holds_slo
    assert "fp8: max_num_seqs" in next(c.why for c in pool.choices if c.field == "engine.kv_cache_dtype")


# ---------------------------------------------------------------------------- two pools


def test_bimodal_sample_gets_two_pools_with_the_threshold_between_the_modes(tmp_path, capsys):
    out = tmp_path / "mixed.yaml"
    code = main(["advise", "--traffic", jsonl(tmp_path / "t.jsonl", bimodal_traffic()), *LLAMA70B,
                 "--concurrency", "128", "-o", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    short, long_ = load_profile(str(tmp_path / "mixed-short.yaml")), load_profile(str(tmp_path / "mixed-long.yaml"))
    threshold = short.limits.max_prompt_tokens
    assert 450 < threshold < 11000  # between chat (prompts <= 450) and batch (>= 11,000)
    assert short.engine.max_model_len < long_.engine.max_model_len
    assert long_.engine.max_model_len >= 12000 and short.engine.max_model_len <= 1024
    assert short.engine.max_num_seqs > long_.engine.max_num_seqs
    assert f"prompts <= {threshold:,} tokens to mixed-short" in printed
    assert "one pool cannot hold concurrency 128" in printed
    for prof in (short, long_):
        assert fit_verdict(prof).status.value == "PASS"
    assert not out.exists()


def test_one_pool_when_it_holds_the_bimodal_mix_unless_asked(tmp_path):
    traffic = adv.traffic_from_jsonl(jsonl(tmp_path / "t.jsonl", bimodal_traffic()))
    target = adv.target_from_args(_args(["--concurrency", "16", *LLAMA70B]))
    one = adv.advise(traffic, target, adv.Options(concurrency=16))
    assert len(one.pools) == 1 and any("bimodal" in n for n in one.pools[0].notes)
    two = adv.advise(traffic, target, adv.Options(concurrency=16, pools="2"))
    assert len(two.pools) == 2 and "split on request" in two.split_reason


def test_otsu_threshold_separates_modes():
    values = np.array([300.0] * 90 + [12000.0] * 10)
    thr, share, lo, hi = adv.otsu_threshold(values, np.ones(100))
    assert 300 < thr < 12000 and share == pytest.approx(0.9) and (lo, hi) == (300, 12000)


# ---------------------------------------------------------------------------- /metrics histograms


def vllm_metrics(prompts, outputs, max_model_len=2048) -> str:
    """Prometheus text with vLLM's two token histograms (1-2-5 buckets up to max_model_len), as
    vLLM 0.32's v1/metrics/loggers.py builds them."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    buckets = [b for b in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
               if b <= max_model_len]
    reg = CollectorRegistry()
    hp = Histogram("vllm:request_prompt_tokens", "prompt", ["model_name", "engine"], buckets=buckets, registry=reg)
    ho = Histogram("vllm:request_generation_tokens", "gen", ["model_name", "engine"], buckets=buckets, registry=reg)
    hp.labels("m", "0"), ho.labels("m", "0")  # present before any request, as in vLLM
    for p in prompts:
        hp.labels("m", "0").observe(p)
    for o in outputs:
        ho.labels("m", "0").observe(o)
    return generate_latest(reg).decode()


def test_traffic_from_metrics_interpolates_buckets_and_pairs_quantiles():
    text = vllm_metrics([40] * 80 + [1500] * 20, [16] * 80 + [32] * 20)
    t = adv.traffic_from_metrics(text, "http://x/metrics")
    assert t.requests == pytest.approx(100) and not t.joint
    assert 1000 < adv.quantile(t.prompt, t.weight, 99) <= 2000  # inside the (1000, 2000] bucket
    assert 20 < adv.quantile(t.prompt, t.weight, 50) <= 50
    assert adv.quantile(t.total, t.weight, 99) <= 2000 + 50
    assert "histogram buckets 1, 2, 5" in t.source


def test_metrics_without_histograms_or_requests_is_one_clear_error():
    with pytest.raises(adv.AdviseError, match="no vllm:request_prompt_tokens or vllm:request_generation_tokens"):
        adv.traffic_from_metrics("# nothing here\n", "http://x/metrics")
    with pytest.raises(adv.AdviseError, match="count no finished request yet"):
        adv.traffic_from_metrics(vllm_metrics([], []), "http://x/metrics")


def test_fetch_metrics_normalises_the_url_and_reports_failures():
    seen = []
    assert adv.fetch_metrics("http://h:1/v1", lambda u: seen.append(u) or "x") == ("x", "http://h:1/metrics")
    assert adv.fetch_metrics("http://h:1/metrics", lambda u: "y")[1] == "http://h:1/metrics"

    def refuse(url):
        raise ConnectionError("refused")

    with pytest.raises(adv.AdviseError, match=r"cannot read http://h:1/metrics: ConnectionError: refused"):
        adv.fetch_metrics("http://h:1", refuse)


def tiny_hf_config(tmp_path):
    """A tiny Llama's HF config.json (2 layers, 4 heads, 2 KV heads of 64, float32)."""
    config = tmp_path / "tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
                                  "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512,
                                  "max_position_embeddings": 4096, "torch_dtype": "float32"}))
    return config


def test_cli_from_metrics_on_cpu_with_hf_config(tmp_path, capsys):
    config = tiny_hf_config(tmp_path)
    text = vllm_metrics([40] * 80 + [1500] * 20, [16] * 80 + [32] * 20)
    args = _args(["--metrics", "http://127.0.0.1:1/v1", "--hf-config", str(config), "--served-name", "tiny",
                  "--dtype", "float32", "--kv-cache-memory-bytes", str(64 << 20), "--concurrency", "4",
                  "-o", str(tmp_path / "tiny.yaml")])
    assert adv.run(args, get=lambda url: text) == 0
    prof = load_profile(str(tmp_path / "tiny.yaml"))
    assert prof.engine.max_model_len == 2048 and prof.engine.kv_cache_memory_bytes == 64 << 20
    assert prof.model.architecture.layers == 2 and prof.model.served_name == "tiny"
    assert fit_verdict(prof).status.value == "PASS"
    assert "paired quantile by quantile" in capsys.readouterr().out


# ---------------------------------------------------------------------------- bad input


def _args(argv):
    from kvgate.cli.main import build_parser

    return build_parser().parse_args(["advise", *argv] if "--traffic" in argv or "--metrics" in argv
                                     else ["advise", "--traffic", "unused.jsonl", *argv])


def test_bad_jsonl_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"prompt_tokens": 10, "output_tokens": 5}\n{"prompt_tokens": "ten"}\n')
    with pytest.raises(adv.AdviseError, match=r"t.jsonl:2: field 'prompt_tokens' must be a non-negative integer"):
        adv.traffic_from_jsonl(bad)
    assert main(["advise", "--traffic", str(bad), *LLAMA70B, "--concurrency", "4", "-o", str(tmp_path / "o.yaml")]) == 2
    assert "t.jsonl:2" in capsys.readouterr().err


def test_usage_and_openai_usage_records_are_read(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"usage": {"prompt_tokens": 7, "completion_tokens": 3}}\n{"input_tokens": 5, "completion_tokens": 1}\n')
    t = adv.traffic_from_jsonl(path)
    assert list(t.total) == [10, 6]


def test_missing_hardware_or_model_names_the_option(tmp_path):
    with pytest.raises(adv.AdviseError, match="--kv-cache-memory-bytes"):
        adv.target_from_args(_args(["--concurrency", "1", "--arch", "layers=2,attention_heads=4,kv_heads=2,head_dim=64"]))
    with pytest.raises(adv.AdviseError, match="--memory-gib"):
        adv.target_from_args(_args(["--concurrency", "1", "--arch", "layers=2,attention_heads=4,kv_heads=2,head_dim=64",
                                    "--gpu", "NVIDIA L40S"]))
    with pytest.raises(adv.AdviseError, match="give the model"):
        adv.target_from_args(_args(["--concurrency", "1", "--gpu", "cpu"]))


def test_nothing_fits_is_exit_1_with_the_reason(tmp_path, capsys):
    code = main(["advise", "--traffic", jsonl(tmp_path / "t.jsonl", seed_traffic(200)), *LLAMA70B,
                 "--memory-gib", "40", "--concurrency", "4", "-o", str(tmp_path / "o.yaml")])
    assert code == 1
    err = capsys.readouterr().err
    assert "cannot hold one" in err or "does not pass the fit gate" in err or "cannot be done" in err
    assert not (tmp_path / "o.yaml").exists()


def test_a_profile_vllm_would_refuse_to_start_is_not_written(tmp_path, capsys):
    """TP 3 divides neither Llama-70B's 64 attention heads nor its 8 KV heads: vLLM refuses to start,
    so advise refuses to write it (found by a newcomer: it used to say "fit gate: PASS")."""
    out = tmp_path / "tp3.yaml"
    code = main(["advise", "--traffic", jsonl(tmp_path / "t.jsonl", seed_traffic(200)), *LLAMA70B,
                 "--concurrency", "32", "--tp", "3", "--gpus", "3", "--gpu", "H100", "--memory-gib", "80", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "would not start on vLLM" in err and "tensor_parallel_size" in err, err
    assert not out.exists()


# ---------------------------------------------------------------------------- the schema modeline


def test_written_profile_points_at_the_schema_by_a_relative_path(tmp_path):
    from kvgate.profile.schema import PROFILE_SCHEMA, modeline_for

    out = tmp_path / "deep" / "advised.yaml"
    assert main(["advise", "--traffic", jsonl(tmp_path / "t.jsonl", seed_traffic(300)), *LLAMA70B,
                 "--concurrency", "4", "-o", str(out)]) == 0
    first = out.read_text().splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    ref = first.split("$schema=", 1)[1]
    assert "file:" not in ref and not ref.startswith("/"), first
    assert (out.parent / ref).resolve() == PROFILE_SCHEMA.resolve()
    # where the shipped profiles live, the same line as theirs
    shipped = (REPO / "profiles" / "llama70b-tp4.yaml").read_text().splitlines()[0]
    assert modeline_for(REPO / "profiles" / "new.yaml") == shipped


# ---------------------------------------------------------------------------- self-consistency


def long_tail_traffic(n=400, seed=20):
    """90% chat (lognormal prompts ~300, long-tailed outputs ~120 up to 2,000) and 10% documents
    (prompts 2,900-3,060, mostly 5-40 output tokens, a tenth 200-330): the short requests' p99
    output is above the whole sample's (the cap), and the documents' median prompt plus their p99
    output is above the p99 of prompt + output (max_model_len) -- the shape whose profile used
    to reject its own workloads."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        if rng.random() < 0.9:
            rows.append((int(rng.lognormal(np.log(300), 0.5)), int(min(2000, rng.lognormal(np.log(120), 0.8))) + 1))
        else:
            rows.append((int(rng.integers(2900, 3060)),
                         int(rng.choice([rng.integers(5, 40), rng.integers(200, 330)], p=[0.9, 0.1]))))
    return rows


def test_written_workloads_are_requests_the_profile_admits(tmp_path, capsys):
    rows = long_tail_traffic()
    out = tmp_path / "tail.yaml"
    assert main(["advise", "--traffic", jsonl(tmp_path / "t.jsonl", rows), *LLAMA70B, "--concurrency", "8",
                 "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    prof = load_profile(str(out))
    L, cap = prof.engine.max_model_len, prof.limits.max_tokens_cap
    assert L == 3072 and set(prof.workloads) == {"observed-short", "observed-long"}  # the shape reproduced
    for name, w in prof.workloads.items():
        prompt = max(w.prompt_tokens, w.prompt_tokens_p99 or 0)
        assert prompt + w.output_tokens <= L, f"{name}: {prompt} + {w.output_tokens} > max_model_len {L}"
        assert w.output_tokens <= cap, f"{name}: output_tokens {w.output_tokens} > max_tokens_cap {cap}"
    assert adv.contradictions(yaml_data(out)) == []
    # the observed numbers were above the limits: the explanation says what was written instead and why
    long_prompts = sorted(p for p, o in rows if p >= 2900)
    assert prof.workloads["observed-long"].prompt_tokens == long_prompts[len(long_prompts) // 2]
    text = out.read_text()
    assert "#   workloads.observed-short.output_tokens" in text and f"above limits.max_tokens_cap {cap:,}" in text
    assert "#   workloads.observed-long.output_tokens" in text and f"exceed max_model_len {L:,}" in text
    assert "workloads.observed-long.output_tokens" in printed
    assert fit_verdict(prof).status.value == "PASS"
    assert plan(prof).workloads.short_tokens == prof.workloads["observed-short"].prompt_tokens_p99 + \
        prof.workloads["observed-short"].output_tokens


def test_contradictions_names_each_workload_its_limits_reject():
    data = {"engine": {"max_model_len": 3072}, "limits": {"max_tokens_cap": 512},
            "workloads": {"long": {"prompt_tokens": 3044, "output_tokens": 325},
                          "short": {"prompt_tokens": 200, "prompt_tokens_p99": 900, "output_tokens": 542}}}
    assert adv.contradictions(data) == [
        "workload long: prompt 3,044 + output 325 tokens > max_model_len 3,072 (vLLM rejects it)",
        "workload short: output_tokens 542 > limits.max_tokens_cap 512"]


def yaml_data(path):
    import yaml

    return yaml.safe_load(path.read_text())


# ---------------------------------------------------------------------------- bad options and paths: one line, exit 2


@pytest.mark.parametrize("option,value,expected", [
    ("--confidence", "1.5", "a probability 0 < P < 1 (e.g. 0.99)"),
    ("--confidence", "0", "a probability 0 < P < 1 (e.g. 0.99)"),
    ("--percentile", "150", "a percentile 0 < P <= 100 (e.g. 99)"),
    ("--gpus", "0", "an integer > 0 (e.g. 4)"),
    ("--round-to", "-1", "an integer > 0 (e.g. 4)"),
    ("--concurrency", "x", "an integer > 0 (e.g. 4)"),
])
def test_out_of_range_options_are_usage_errors_naming_value_and_range(option, value, expected, capsys):
    argv = ["advise", "--traffic", "t.jsonl", *LLAMA70B, "--concurrency", "4", option, value]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"kvgate advise: error: argument {option}: {value!r} is not allowed; expected {expected}"


def test_unreadable_traffic_or_unwritable_output_is_one_line_exit_2(tmp_path, capsys):
    binary = tmp_path / "t.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    assert main(["advise", "--traffic", str(binary), *LLAMA70B, "--concurrency", "4", "-o", str(tmp_path / "o.yaml")]) == 2
    assert "not UTF-8 text (byte 0" in capsys.readouterr().err
    good = jsonl(tmp_path / "g.jsonl", seed_traffic(200))
    (tmp_path / "taken").mkdir()
    assert main(["advise", "--traffic", good, *LLAMA70B, "--concurrency", "4", "-o", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"kvgate advise: cannot write the profile to {tmp_path / 'taken'}: Is a directory"


def test_why_column_says_what_it_rounded_to_and_the_long_threshold_stays_within_max_model_len(tmp_path, capsys):
    # the why column said "rounded up to 1,024" for 2,048 and put the long threshold (4 x median
    # 620 = 2,480) above its own max_model_len
    config = tiny_hf_config(tmp_path)
    traffic = jsonl(tmp_path / "t.jsonl", [(600, 20)] * 50 + [(1400, 100)] * 50)
    args = _args(["--traffic", traffic, "--hf-config", str(config), "--served-name", "tiny", "--dtype", "float32",
                  "--kv-cache-memory-bytes", str(64 << 20), "--concurrency", "4", "-o", str(tmp_path / "tiny.yaml")])
    assert adv.run(args) == 0
    out = capsys.readouterr().out
    prof = load_profile(str(tmp_path / "tiny.yaml"))
    assert prof.engine.max_model_len == 2048, out
    assert "1,500 tokens, rounded up to a multiple of 1,024 (itself a multiple of the 128-token KV block" in out, out
    assert ") = 2,048" in out and "rounded up to a multiple of 64 = 128" in out, out
    import re

    cut = int(re.search(r"requests above ([\d,]+) tokens", out).group(1).replace(",", ""))
    assert cut <= prof.engine.max_model_len, out
