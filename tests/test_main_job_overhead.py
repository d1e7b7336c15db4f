"""The arithmetic of benchmarks/main_job_overhead.py (the benchmark itself starts a real vLLM and is
not a test): busy time from sampled gauges, per-phase counter deltas, kvgate's idle share."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "main_job_overhead.py"
_spec = importlib.util.spec_from_file_location("main_job_overhead", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 640.0
vllm:generation_tokens_total{engine="0",model_name="m"} 80.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 9.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 1.5
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 4.0
process_resident_memory_bytes 1.2e+09
"""


def test_read_metrics_sums_the_named_series_and_skips_the_rest():
    got = bench.read_metrics(METRICS)
    assert got == {"vllm:num_requests_running": 2.0, "vllm:num_requests_waiting": 1.0,
                   "vllm:prompt_tokens_total": 640.0, "vllm:generation_tokens_total": 80.0,
                   "vllm:request_prefill_time_seconds_sum": 1.5}
    two = METRICS + 'vllm:prompt_tokens_total{engine="1",model_name="m"} 60.0\n'
    assert bench.read_metrics(two)["vllm:prompt_tokens_total"] == 700.0  # summed over engines


def test_busy_seconds_holds_each_sample_until_the_next_and_clips_to_the_window():
    samples = [(10.0, False, 0.0), (10.5, True, 0.0), (11.0, True, 0.0), (12.0, False, 0.0), (13.0, True, 0.0)]
    assert bench.busy_seconds(samples, 10.0, 14.0) == pytest.approx(1.5 + 1.0)  # 10.5-12.0 and 13.0-14.0
    assert bench.busy_seconds(samples, 11.5, 12.5) == pytest.approx(0.5)  # clipped at both ends
    assert bench.busy_seconds(samples, 5.0, 10.0) == 0.0  # before the first sample: nothing known
    assert bench.busy_seconds([], 0.0, 1.0) == 0.0


def test_a_busy_spell_starts_its_first_step_earlier_than_the_gauges_show_it():
    # the gauges read 0 at 1.0 and 2.0 while the first (prefill) step ran; at 3.0 they show it and
    # the TTFT histogram counted 2 requests, 2.4 s together: the spell began ~1.2 s before 3.0
    m = {"vllm:num_requests_running": 0.0, "vllm:time_to_first_token_seconds_sum": 0.5,
         "vllm:time_to_first_token_seconds_count": 1.0}
    samples = [{"t": 1.0, "metrics": dict(m)}, {"t": 2.0, "metrics": dict(m)},
               {"t": 3.0, "metrics": {**m, "vllm:num_requests_running": 2.0, "vllm:time_to_first_token_seconds_sum": 2.9,
                                      "vllm:time_to_first_token_seconds_count": 3.0}},
               {"t": 4.0, "metrics": {**m, "vllm:time_to_first_token_seconds_sum": 2.9,
                                      "vllm:time_to_first_token_seconds_count": 3.0}}]
    series = bench.busy_series(samples)
    assert [(t, b) for t, b, _ in series] == [(1.0, False), (2.0, False), (3.0, True), (4.0, False)]
    assert series[2][2] == pytest.approx(1.2)
    assert bench.busy_seconds(series, 0.0, 5.0) == pytest.approx(2.2)  # 1.8-4.0, not 3.0-4.0
    # never back into the spell before it
    early = [(0.0, True, 0.0), (1.0, False, 0.0), (1.5, True, 5.0), (2.0, False, 0.0)]
    assert bench.busy_seconds(early, 0.0, 3.0) == pytest.approx(1.0 + 1.0)


def _s(t, running, waiting=0, prompt=0, gen=0, prefill=0.0, decode=0.0, done=0):
    return {"t": t, "metrics": {"vllm:num_requests_running": running, "vllm:num_requests_waiting": waiting,
                                "vllm:prompt_tokens_total": prompt, "vllm:generation_tokens_total": gen,
                                "vllm:request_prefill_time_seconds_sum": prefill,
                                "vllm:request_decode_time_seconds_sum": decode,
                                "vllm:e2e_request_latency_seconds_count": done}}


def test_phase_rows_split_each_gate_into_engine_busy_and_kvgate_idle():
    # gate a: 4 s wall, the engine busy 1 s of it (one request: 64 prompt + 8 generated tokens)
    # gate b: 2 s wall, two requests at once all along (request-seconds above busy seconds)
    samples = [_s(0.0, 0), _s(1.0, 1), _s(2.0, 0, prompt=64, gen=8, prefill=0.2, decode=0.8, done=1),
               _s(4.0, 2, prompt=64, gen=8, prefill=0.2, decode=0.8, done=1),
               _s(6.0, 0, prompt=192, gen=24, prefill=0.6, decode=4.4, done=3)]
    phases = [{"name": "launch", "seconds": 30.0}, {"name": "gate p/a", "seconds": 4.0},
              {"name": "gate p/b", "seconds": 2.0}, {"name": "gate p/c", "seconds": 0.01}]
    rows = bench.phase_rows(phases, {"gate p/a": (0.0, 4.0), "gate p/b": (4.0, 6.0)}, samples)
    launch, a, b, c = rows
    assert launch == {"phase": "launch", "wall_s": 30.0} and c == {"phase": "gate p/c", "wall_s": 0.01}
    assert (a["busy_s"], a["idle_s"], a["requests"], a["prompt_tokens"], a["generation_tokens"]) == (1.0, 3.0, 1, 64, 8)
    assert a["request_s"] == pytest.approx(1.0)
    assert (b["busy_s"], b["idle_s"], b["requests"], b["request_s"]) == (2.0, 0.0, 2, 4.0)
    t = bench.totals(rows)
    assert (t["wall_s"], t["no_server_s"], t["measured_gates_s"], t["busy_s"], t["idle_s"]) == (36.01, 30.0, 6.0, 3.0, 3.0)
    assert t["idle_share"] == 0.5 and t["prompt_tokens"] == 192 and t["generation_tokens"] == 24
    lines = bench.table(rows)
    assert lines[-1].startswith("total 36.0 s: 30.0 s before/without the server") and "idle 3.0 s (50%" in lines[-1]
    assert any(line.startswith("(1 phases under 1 s)") for line in lines)


def test_busy_never_exceeds_the_phase_wall_kvgate_recorded():
    # kvgate's phase seconds exclude a nested launch; the window may be longer than the wall
    samples = [_s(0.0, 1), _s(10.0, 1)]
    row, = bench.phase_rows([{"name": "gate p/a", "seconds": 3.0}], {"gate p/a": (0.0, 10.0)}, samples)
    assert row["busy_s"] == 3.0 and row["idle_s"] == 0.0


def test_a_saved_recording_keeps_the_names_once_and_reads_back_the_same_samples():
    rec = {"windows": {}, "names": ["vllm:num_requests_running", "vllm:prompt_tokens_total"],
           "rows": [[1.0, 0.0, 10.0], [1.25, 2.0, None]]}
    assert bench.samples_of(rec) == [{"t": 1.0, "metrics": {"vllm:num_requests_running": 0.0,
                                                            "vllm:prompt_tokens_total": 10.0}},
                                     {"t": 1.25, "metrics": {"vllm:num_requests_running": 2.0}}]
