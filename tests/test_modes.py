"""Gate modes (enforce, record, certify) and exit codes: kvgate.run.modes unit tests, and the plugin
through pytester -- synthetic gates of chosen statuses (``-m fit``: no server), the real fit gate,
and the streaming suite against the fault-injecting fake in record mode."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml

from kvgate.report.outcome import EXIT_CODES, decide
from kvgate.run.modes import ModeError, overlay, parse_mode, recorded_values
from kvgate.profile.models import load_profile
from kvgate.verdict import Status, Verdict
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, read_summary

pytest_plugins = ["pytester"]
FAKE_PROFILE = REPO / "tests" / "data" / "fake-vllm.yaml"
#: A gate test whose verdict per case is chosen by the test: ``-m fit`` selects it, so no server.
SYNTHETIC = '''
import pytest
from kvgate.verdict import Status, Verdict

CASES = {cases!r}

@pytest.mark.fit
@pytest.mark.gate("synthetic", cases=list(CASES))
def test_synthetic(kvgate_gate, case):
    status, parts = CASES[case]
    sub = tuple(Verdict("synthetic." + p, Status(s), p + " checked -> " + s if s != "SKIP" else p + " not declared")
                for p, s in parts)
    v = Verdict("synthetic/" + case, Status(status), "synthetic " + case + " -> " + status,
                measured=3, limit=5, unit="ms", parts=sub)
    assert kvgate_gate(v).passed
'''


def run_synthetic(pytester, cases, *args):
    pytester.makepyfile(test_synth=SYNTHETIC.format(cases=cases))
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
        "-p", "fixtures.endpoint", f"--kvgate-reports={reports}", "--profile", str(FAKE_PROFILE), "-m", "fit",
        str(pytester.path / "test_synth.py"), *args)
    return result, read_summary(reports)


# ---------------------------------------------------------------------------- kvgate.run.modes
def test_parse_mode_lists_valid_values():
    assert parse_mode(None) == "enforce" and parse_mode("Certify") == "certify"
    with pytest.raises(ModeError, match="valid values: enforce, record, certify"):
        parse_mode("strict")


@pytest.mark.parametrize("mode, final, statuses, want", [
    ("enforce", "PASS", ["PASS", "SKIP"], ("PASS", 0)),
    ("enforce", "FAIL", ["FAIL", "INVALID"], ("FAIL", 1)),
    ("enforce", "INVALID", ["PASS", "INVALID"], ("INVALID", 6)),
    ("record", "FAIL", ["FAIL", "INVALID"], ("RECORDED", 0)),
    ("record", "FAIL", ["PASS", "ERROR"], ("FAIL", 1)),  # a harness error measured nothing
    ("certify", "PASS", ["PASS", "PASS"], ("CERTIFIED", 0)),
    ("certify", "PASS", ["PASS", "SKIP"], ("NOT-CERTIFIED", 7)),
    ("certify", "INVALID", ["PASS", "INVALID"], ("NOT-CERTIFIED", 7)),
    ("certify", "FAIL", ["FAIL", "SKIP"], ("FAIL", 1)),
    ("record", "INCOMPLETE", ["PASS"], ("INCOMPLETE", 2)),
    ("certify", "ERROR", [], ("ERROR", 4)),
    ("enforce", "INCONCLUSIVE", ["PASS", "INCONCLUSIVE"], ("INCONCLUSIVE", 9)),
    ("certify", "INCONCLUSIVE", ["PASS", "INCONCLUSIVE"], ("NOT-CERTIFIED", 7)),  # listed as INVALID
    ("record", "INCONCLUSIVE", ["INCONCLUSIVE"], ("RECORDED", 0)),
])
def test_decide(mode, final, statuses, want):
    gates = [{"id": f"p/g{i}", "status": s, "message": f"g{i} -> {s}", "skipped_checks": []}
             for i, s in enumerate(statuses)]
    out = decide(mode, final, gates)
    assert (out.outcome, out.exit_code) == want
    assert EXIT_CODES[out.outcome] == out.exit_code
    if want[0] == "NOT-CERTIFIED":
        assert [m["status"] for m in out.not_certified] == [{"INCONCLUSIVE": "INVALID"}.get(s, s) for s in statuses
                                                            if s != "PASS"]


def test_certify_counts_a_skipped_sub_check():
    gates = [{"id": "p/fit/kv-pool", "status": "PASS", "message": "ok",
              "skipped_checks": [{"check": "fit.budget", "reason": "memory not declared"}]}]
    out = decide("certify", "PASS", gates)
    assert out.exit_code == 7
    assert out.not_certified == [{"id": "p/fit/kv-pool", "check": "fit.budget", "status": "SKIP",
                                  "reason": "memory not declared"}]


def test_overlay_maps_measured_values_to_profile_fields(tmp_path):
    lat = Verdict("latency/slo", Status.FAIL, "x", parts=(
        Verdict("latency/slo.TTFT p95", Status.FAIL, "t", measured=812.34, limit=500, unit="ms"),
        Verdict("latency/slo.ITL p95", Status.SKIP, "no SLO", measured=41.0, unit="ms"),
        Verdict("latency/slo.error rate", Status.PASS, "e", measured=0.0, limit=0.0, unit="ratio"),
    ))
    verdicts = [
        ("p/latency/slo", lat),
        ("p/streaming/ttft/chat", Verdict("streaming/ttft/chat", Status.PASS, "t", measured=900.0, unit="ms")),
        ("p/streaming/ttft/completions", Verdict("streaming/ttft/completions", Status.PASS, "t", measured=20.0,
                                                 unit="ms")),
        ("p/streaming/idle-gap/chat", Verdict("streaming/idle-gap/chat", Status.FAIL, "g", measured=0.3012,
                                              limit=0.2, unit="s")),
        ("p/soak/memory", Verdict("soak/memory", Status.PASS, "m", measured=-3.5, limit=40, unit="MB/h")),
        ("p/streaming/deltas/chat", Verdict("streaming/deltas/chat", Status.PASS, "d", measured=120, unit="chars")),
    ]
    fields, unmapped = recorded_values(verdicts)
    assert fields["slo.ttft_p95_ms"][0] == 900.0  # the largest of the checks judged against it
    assert fields["slo.itl_p95_ms"][0] == 41.0
    assert unmapped == ["p/streaming/deltas/chat: streaming/deltas/chat = 120 chars"]
    text = overlay(str(REPO / "tests" / "data" / "fake-vllm.yaml"), verdicts, run_id="r1", endpoint="http://x/v1",
                   server_version="0.32", now=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    data = yaml.safe_load(text)
    # proposed limits: 25% headroom over what was measured, rounded up to two significant digits
    assert data["slo"] == {"ttft_p95_ms": 1200, "itl_p95_ms": 52, "error_rate_max": 0.0}
    assert "  ttft_p95_ms: 1200  # measured 900 + 25% headroom; from p/" in text
    # a gateway's idle timeout and the soak ceilings are choices a measurement cannot make: comments only
    assert "limits" not in data and "soak" not in data
    assert "#   limits.stream_idle_timeout_s: measured 0.3012 (p/streaming/idle-gap/chat: streaming/idle-gap/chat)" \
           " -- not proposed: your gateway's idle timeout" in text
    assert "#   soak.memory_slope_max_mb_per_h: measured -3.5" in text and "run r1" in text
    # the overlay is a loadable profile: the run's profile with the proposed limits
    path = tmp_path / "calibrated.yaml"
    path.write_text(text)
    prof = load_profile(str(path), REPO / "profiles")
    assert prof.slo.ttft_p95_ms == 1200 and prof.model.served_name == "fake-model"


def test_record_mode_proposes_limits_never_echoes_samples():
    # record mode once wrote limits.stream_idle_timeout_s: 0.0082 (the longest gap seen: every normal
    # stream would be cut) and soak.memory_slope_max_mb_per_h: 0.316 (noise as a leak ceiling)
    verdicts = [
        ("t/streaming/idle-gap/chat", Verdict("streaming/idle-gap/chat", Status.PASS, "g", measured=0.0082, limit=30,
                                              unit="s")),
        ("t/soak/memory", Verdict("soak/memory", Status.PASS, "m", measured=0.316, limit=40, unit="MB/h")),
        ("t/soak/latency", Verdict("soak/latency", Status.PASS, "l", measured=1.2, limit=50, unit="ms/h")),
        ("t/concurrency", Verdict("concurrency/long-sequences.preemptions", Status.PASS, "p", measured=3, limit=5,
                                  unit="preemptions")),
        ("t/latency/slo", Verdict("latency/slo.error rate", Status.PASS, "e", measured=0.0123, limit=0.05, unit="ratio")),
    ]
    data = yaml.safe_load(overlay("tiny-cpu", verdicts, run_id="r", endpoint=None, server_version=None))
    assert "stream_idle_timeout_s" not in (data.get("limits") or {}) and "soak" not in data
    assert data["limits"] == {"preemptions_allowed": 4} and data["slo"] == {"error_rate_max": 0.016}


def test_record_mode_proposes_the_accuracy_it_measured_as_the_reference(tmp_path):
    from kvgate.gates.answers import accuracy_verdict
    from kvgate.profile.models import AccuracySpec, AnswersSpec

    spec = AnswersSpec(accuracy=AccuracySpec(file="t.jsonl"))  # no limit yet: the case SKIPs, with what it scored
    rows = [{"id": str(i), "correct": i < 47, "answered": True, "answer": "", "expected": "x"} for i in range(65)]
    v = accuracy_verdict(spec, rows, "smollm2-short-answers.jsonl")
    assert v.status is Status.SKIP
    text = overlay(str(REPO / "tests" / "data" / "fake-answers.yaml"), [("p/answers/accuracy", v)], run_id="r",
                   endpoint=None, server_version=None)
    assert ("    recorded_correct: 47  # measured 47 of 65 right on smollm2-short-answers.jsonl (72.3%, 95% CI "
            "59.8%..82.7%); from p/answers/accuracy\n    recorded_items: 65\n") in text
    assert "no recordable value" not in text
    path = tmp_path / "calibrated.yaml"
    path.write_text(text)
    acc = load_profile(str(path), REPO / "profiles").answers.accuracy
    assert (acc.recorded_correct, acc.recorded_items, acc.tolerance) == (47, 65, 0.08)  # the task and tolerance kept
    assert acc.file.endswith("answers/fake-short-answers.jsonl")
    # an accuracy that measured the transport (most items unanswered), or none scored: nothing proposed
    unanswered = [{**r, "answered": False, "correct": False} for r in rows]
    assert "recorded_correct" not in overlay("tiny-cpu", [("p/answers/accuracy", accuracy_verdict(
        spec, unanswered, "t"))], run_id="r", endpoint=None, server_version=None)


def test_a_percentile_judged_with_confidence_records_its_upper_bound():
    # a limit at the point estimate would leave the same server INCONCLUSIVE on the next run
    from kvgate.stats.confidence import judge

    j = judge([float(x) for x in range(1, 101)], 0.95, 1000.0)  # p95 95.05, upper bound X(99) = 99
    few = judge([10.0] * 20, 0.95, 1000.0)  # 20 samples: no upper bound
    lat = Verdict("latency/slo", Status.PASS, "x", parts=(
        Verdict("latency/slo.TTFT p95", Status.PASS, "t", measured=j.bound.point, limit=1000, unit="ms",
                evidence=j.to_dict()),
        Verdict("latency/slo.e2e p95", Status.INCONCLUSIVE, "e", measured=few.bound.point, limit=1000, unit="ms",
                evidence=few.to_dict())))
    fields, _ = recorded_values([("p/latency/slo", lat)])
    assert fields["slo.ttft_p95_ms"][0] == 99.0 and "(95% upper bound, n=100)" in fields["slo.ttft_p95_ms"][1][0]
    assert fields["slo.e2e_p95_ms"][0] == 10.0 and "point estimate: n=20 has no upper bound" in fields[
        "slo.e2e_p95_ms"][1][0]


# ---------------------------------------------------------------------------- through pytest
def test_bad_gate_mode_is_a_usage_error_listing_values(pytester):
    result, summary = run_synthetic(pytester, {"a": ("PASS", [])}, "--gate-mode", "strict")
    assert result.ret == pytest.ExitCode.USAGE_ERROR == 4
    err = result.stderr.str()
    assert "--gate-mode 'strict'" in err and "enforce, record, certify" in err and "Traceback" not in err
    assert summary["overall"] == "ERROR" and summary["exit_code"] == 4


def test_enforce_invalid_only_has_its_own_exit_code(pytester):
    result, summary = run_synthetic(pytester, {"ok": ("PASS", []), "untrusted": ("INVALID", [])})
    assert result.ret == EXIT_CODES["INVALID"] == 6
    assert summary["gate_mode"] == "enforce" and summary["overall"] == summary["outcome"] == "INVALID"
    assert summary["exit_code"] == 6 and "INVALID only" in summary["exit_meaning"]
    assert "enforce mode: INVALID (exit 6" in result.stdout.str()


def test_enforce_fail_wins_over_invalid(pytester):
    result, summary = run_synthetic(pytester, {"bad": ("FAIL", []), "untrusted": ("INVALID", [])})
    assert result.ret == 1 and summary["exit_code"] == 1 and summary["outcome"] == "FAIL"


def test_enforce_pass_with_skips_is_0_certify_is_7_and_names_them(pytester):
    cases = {"ok": ("PASS", [("a", "PASS"), ("memory", "SKIP")]), "absent": ("SKIP", [])}
    result, summary = run_synthetic(pytester, cases)
    assert result.ret == 0 and summary["outcome"] == "PASS" and summary["exit_code"] == 0
    result, summary = run_synthetic(pytester, cases, "--gate-mode=certify")
    assert result.ret == 7 and summary["outcome"] == "NOT-CERTIFIED" and summary["exit_code"] == 7
    assert summary["gate_mode"] == "certify"
    assert {(m["id"], m["check"], m["status"]) for m in summary["not_certified"]} == {
        ("fake-vllm/synthetic/ok", "synthetic.memory", "SKIP"),
        ("fake-vllm/synthetic/absent", "fake-vllm/synthetic/absent", "SKIP")}
    out = result.stdout.str()
    assert "certify mode: NOT-CERTIFIED (exit 7" in out and "not certified: fake-vllm/synthetic/ok: synthetic.memory" in out


def test_certify_passes_only_when_everything_was_checked(pytester):
    result, summary = run_synthetic(pytester, {"ok": ("PASS", [("a", "PASS")])}, "--gate-mode", "certify")
    assert result.ret == 0 and summary["outcome"] == "CERTIFIED" and summary["not_certified"] == []


def test_record_never_fails_and_keeps_the_verdicts(pytester):
    result, summary = run_synthetic(pytester, {"bad": ("FAIL", []), "untrusted": ("INVALID", [])},
                                    "--gate-mode", "record")
    assert result.ret == 0
    result.assert_outcomes(xfailed=2)
    assert summary["outcome"] == "RECORDED" and summary["exit_code"] == 0
    assert summary["overall"] == "FAIL"  # the verdicts themselves are not hidden
    assert {g["status"] for g in summary["gates"]} == {"FAIL", "INVALID"}
    assert (pytester.path / "reports" / "profile-overlay.yaml").is_file()


def test_real_fit_gate_exit_codes(pytester):
    """The shipped profiles: tiny-cpu's fit passes with one check not made (no memory declared),
    so certify says NOT-CERTIFIED and why; llama70b-tp4-defaults fails the arithmetic."""
    reports = pytester.path / "reports"
    common = ["-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
              f"--kvgate-reports={reports}", "-m", "fit", str(REPO / "suites" / "test_fit.py")]
    result = pytester.runpytest_inprocess(*common, "--profile", "tiny-cpu", "--gate-mode=certify")
    summary = read_summary(reports)
    assert result.ret == 7 and summary["not_certified"][0]["check"] == "fit.budget"
    result = pytester.runpytest_inprocess(*common, "--profile", "llama70b-tp4-defaults")
    assert result.ret == 1 and read_summary(reports)["exit_code"] == 1


def test_record_mode_against_faulty_fake_writes_a_loadable_overlay(pytester):
    """The streaming suite against a fake that stalls mid-stream: enforce fails the idle-gap gate;
    record passes the run and writes the measured gap and TTFT into an overlay that loads as a
    profile."""
    reports = pytester.path / "reports"
    with FakeVLLM(FakeConfig(max_tokens_cap=64, faults={"stall_mid_stream"})) as fake:
        args = ["-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
                f"--kvgate-reports={reports}", "--profile", str(FAKE_PROFILE), "--endpoint", fake.url,
                str(REPO / "suites" / "test_streaming.py")]
        enforced = pytester.runpytest_inprocess(*args)
        assert enforced.ret == 1 and not (reports / "profile-overlay.yaml").exists()
        recorded = pytester.runpytest_inprocess(*args, "--gate-mode=record")
    assert recorded.ret == 0, recorded.stdout.str()[-2000:]
    summary = read_summary(reports)
    gap = next(g for g in summary["gates"] if g["id"] == "fake-vllm/streaming/idle-gap/chat")
    assert gap["status"] == "FAIL" and summary["outcome"] == "RECORDED"
    path = reports / "profile-overlay.yaml"
    assert f"record mode: measured values written as a profile overlay: {path}" in recorded.stdout.str()
    data = yaml.safe_load(path.read_text())
    assert data["extends"] == str(FAKE_PROFILE)
    assert "stream_idle_timeout_s" not in (data.get("limits") or {})  # the gateway's setting, not a sample
    assert "#   limits.stream_idle_timeout_s: measured 0." in path.read_text()  # the fake stalls 0.3 s
    assert data["slo"]["ttft_p95_ms"] > 0
    prof = load_profile(str(path), REPO / "profiles")
    assert prof.slo.ttft_p95_ms == data["slo"]["ttft_p95_ms"]
