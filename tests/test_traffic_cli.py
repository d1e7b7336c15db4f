"""``kvgate traffic show`` (summary, the overlong callout against a profile, exit codes) and
``kvgate traffic synth`` (seeded, the shipped sample's command); ``kvgate advise --traffic`` reading
the other formats through the same loader."""

from __future__ import annotations

import json

import pytest

from kvgate.authoring import advise as adv
from kvgate.cli.main import main
from kvgate.traffic.sample import load_sample

from .conftest import REPO

DATA = REPO / "tests" / "data" / "traffic"
SHIPPED = REPO / "profiles" / "traffic" / "tiny-chat.jsonl"


def test_show_prints_provenance_percentiles_arrivals_and_prefixes(capsys):
    assert main(["traffic", "show", str(SHIPPED)]) == 0
    out = capsys.readouterr().out
    s = load_sample(SHIPPED)
    q = s.percentiles()
    assert out.splitlines()[0] == str(SHIPPED)
    assert f"sha256    {s.sha256}" in out
    assert f"requests  {len(s.requests):,} (50 sessions of 2-5 turns" in out
    assert f"prompt    p50/p90/p99 {q['p50']:,}/{q['p90']:,}/{q['p99']:,} tokens" in out
    assert f"arrivals  mean {s.arrival_rate():.2f} requests/s" in out and "busiest 1-s window: " in out
    assert "prefix    sys-support: 256 tokens, shared by" in out


def test_show_with_a_profile_fits_or_calls_out_the_overlong_requests(tmp_path, capsys):
    assert main(["traffic", "show", str(SHIPPED), "--profile", "tiny-cpu"]) == 0
    assert "every request fits profile tiny-cpu (prompt + output <= engine.max_model_len 2,048" in capsys.readouterr().out
    long = tmp_path / "long.jsonl"
    long.write_text("".join(json.dumps({"prompt_tokens": p, "output_tokens": 64}) + "\n" for p in [100] * 9 + [2000]))
    assert main(["traffic", "show", str(long), "--profile", "tiny-cpu"]) == 1
    out = capsys.readouterr().out
    assert (f"traffic sample {long}: 1 request (10.0%) does not fit profile tiny-cpu: prompt + output over "
            "engine.max_model_len 2,048 or output over limits.max_tokens_cap 512 (first at line 10); prompt p99 2,000 "
            "tokens > 1,984") in out


def test_show_bad_input_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_tokens": 1, "output_tokens": 1}\n{"prompt_tokens": -1, "output_tokens": 1}\n')
    assert main(["traffic", "show", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == f"kvgate traffic show: {bad}:2: field 'prompt_tokens' must be a non-negative integer, got -1\n"
    assert main(["traffic", "show", str(SHIPPED), "--profile", "no-such-profile"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_synth_defaults_write_the_shipped_sample_and_a_seed_changes_it(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    assert main(["traffic", "synth", "--out", str(out)]) == 0
    assert out.read_bytes() == SHIPPED.read_bytes()
    assert f"kvgate traffic synth: wrote {out} (sha256 " in capsys.readouterr().out
    assert main(["traffic", "synth", "--out", str(out), "--seed", "3", "--sessions", "5", "--singles", "10",
                 "--long-singles", "1", "--duration", "20"]) == 0
    s = load_sample(out)
    assert len(s.sessions()) == 5 and sum(1 for r in s.requests if r.session is None) == 10


def test_synth_contradicting_options_or_unwritable_path_exit_2(tmp_path, capsys):
    assert main(["traffic", "synth", "--out", str(tmp_path / "t.jsonl"), "--max-total", "1000"]) == 2
    assert "exceeds max_total 1000" in capsys.readouterr().err
    (tmp_path / "dir").mkdir()
    assert main(["traffic", "synth", "--out", str(tmp_path / "dir")]) == 2
    assert capsys.readouterr().err == f"kvgate traffic synth: cannot write {tmp_path / 'dir'}: Is a directory\n"


def test_advise_reads_sharegpt_openai_log_and_saved_metrics_through_the_loader():
    for name, fmt in (("sharegpt.json", "sharegpt"), ("openai-log.jsonl", "openai-log"), ("metrics.txt", "metrics")):
        t = adv.traffic_from_file(DATA / name)
        s = load_sample(DATA / name)
        assert list(t.prompt) == [r.prompt_tokens for r in s.requests], fmt
        assert t.joint == (fmt != "metrics")
    assert adv.traffic_from_file(DATA / "metrics.txt").requests == 100  # rows weighted by the histograms' count
    assert "estimated as UTF-8 bytes / 4" in adv.traffic_from_file(DATA / "sharegpt.json").source


def test_synth_out_of_range_numbers_are_usage_errors(tmp_path, capsys):
    for bad in ("0", "inf", "nan"):
        assert main(["traffic", "synth", "--out", str(tmp_path / "t.jsonl"), "--duration", bad]) == 2
        assert "must be a finite number of seconds > 0" in capsys.readouterr().err
    for opt in ("--long-singles", "--seed"):
        with pytest.raises(SystemExit) as exc:
            main(["traffic", "synth", "--out", str(tmp_path / "t.jsonl"), opt, "-1"])
        assert exc.value.code == 2
        assert f"argument {opt}: '-1' is not allowed; expected an integer >= 0" in capsys.readouterr().err
    # more long documents than single-turn requests: the message names that check only
    assert main(["traffic", "synth", "--out", str(tmp_path / "t.jsonl"), "--long-singles", "500"]) == 2
    err = capsys.readouterr().err
    assert "long_singles 500 must be from 0 to singles 125" in err and "turns" not in err
