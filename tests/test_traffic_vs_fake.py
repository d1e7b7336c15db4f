"""The load gates replaying a traffic sample against the fake vLLM (tests/fakes/fake_vllm.py),
through the real suite (pytester, ``--endpoint``; verdicts read back from reports/summary.json):
a trace with a burst the server cannot absorb FAILs latency/slo naming the burst, the same trace
without it PASSes, and all three load gates replay a sample (sessions and both workloads) on a
healthy fake."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, read_summary

pytest_plugins = ["pytester"]
BASE = REPO / "tests" / "data" / "fake-vllm.yaml"
LOAD = str(REPO / "suites" / "test_load.py")


def write_profile(path, chat_rows, batch_rows=None, **chat_traffic):
    """A profile over fake-vllm.yaml whose chat workload (and, with ``batch_rows``, the long batch
    one) replays the rows given (JSONL samples next to it). The stream idle timeout is 5 s: requests
    queued by a burst wait for their first token (the streaming gate judges idle gaps)."""
    (path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat_rows))
    workloads = {"chat": {"prompt_tokens": 24, "prompt_tokens_p99": 40, "output_tokens": 8, "concurrency": 2,
                          "traffic": {"path": "chat.jsonl", **chat_traffic}}}
    if batch_rows:
        (path / "batch.jsonl").write_text("".join(json.dumps(r) + "\n" for r in batch_rows))
        workloads["batch"] = {"prompt_tokens": 200, "output_tokens": 8, "concurrency": 2, "long": True,
                              "traffic": {"path": "batch.jsonl", "replay": "closed"}}
    prof = path / "fake-vllm-replay.yaml"
    prof.write_text(yaml.safe_dump({"extends": str(BASE), "slo": {"requests": 64}, "limits": {"stream_idle_timeout_s": 5},
                                    "workloads": workloads}))
    return prof


def run_load(pytester, url, profile, *extra, full=False):
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p",
                                          "no:cacheprovider", f"--profile={profile}", "--endpoint", url,
                                          f"--kvgate-reports={reports}", LOAD, *extra)
    summary = read_summary(reports)
    gates = {g["id"]: g for g in summary["gates"]}
    return (result, summary, gates) if full else gates


def trace(burst: bool) -> list[dict]:
    """20 chat requests at 10 req/s over 1.9 s; ``burst``: 30 more at 1.0-1.15 s (200 req/s)."""
    rows = [{"prompt_tokens": 16 + i, "output_tokens": 8, "arrival_s": 50 + i * 0.1} for i in range(20)]
    if burst:
        rows += [{"prompt_tokens": 24, "output_tokens": 8, "arrival_s": 51.0 + j * 0.005} for j in range(30)]
    return rows


@pytest.mark.parametrize("burst", [True, False], ids=["burst", "steady"])
def test_a_burst_the_server_cannot_absorb_fails_latency_naming_it(pytester, tmp_path, burst):
    # 2 at once, 8 tokens 10 ms apart: ~28 req/s served; 30 requests in 0.15 s queue for up to ~1 s
    # (TTFT SLO 500 ms), the steady 10 req/s waits at most one generation (~70 ms)
    cfg = FakeConfig(max_tokens_cap=64, itl_s=0.01, max_num_seqs=2)
    with FakeVLLM(cfg) as fake:
        gates = run_load(pytester, fake.url, write_profile(tmp_path, trace(burst)), "-k", "latency_slo")
    g = gates["fake-vllm-replay/latency/slo"]
    ev = g["evidence"]["traffic"]
    assert ev["plan"]["path"] == "chat.jsonl" and ev["plan"]["mode"] == "open" and ev["plan"]["drawn"] == len(trace(burst))
    if not burst:  # 20 requests held the SLO, but a p95 PASS needs 86 at these looks: the sample ran out
        assert g["status"] == "INCONCLUSIVE", g["message"]
        assert g["message"].startswith("replayed 20 of 20 requests of chat.jsonl (sha256 ")
        assert "stopped: the traffic sample had only 20 requests; the traffic sample ran out" in g["message"]
        assert g["evidence"]["sampling"]["why_stopped"] == "source" and g["evidence"]["sampling"]["n"] == 20
        assert "burst" not in g["message"] and not ev["busiest_window"]["burst"]
        return
    assert g["status"] == "FAIL", g["message"]
    assert "TTFT p95" in g["message"] and "lower bound" in g["message"] and "> 500 ms -> FAIL; " in g["message"], g["message"]
    share = ev["burst_share"]["TTFT"]
    assert share["concentrated"] and share["over_in"] >= 0.5 * share["over"] > 0, share
    assert f"{share['over_in']} of the {share['over']} over-SLO requests arrived in the burst at 1.0-1.1 s (" \
        in g["message"], g["message"]
    assert "req/s vs 26.3 req/s mean)" in g["message"], g["message"]  # 50 requests over 1.9 s


def test_every_load_gate_replays_a_sample_on_a_healthy_fake(pytester, tmp_path):
    # 8 two-turn sessions sharing a 32-token system prompt (the second turn's prompt holds the
    # first turn and its reply), closed loop; the long workload replays 3 recorded lengths
    chat = []
    for s in range(44):  # 88 requests: a p95 PASS needs 72 (looks 64/72/96, a PASS at 97.5%: 2 of them can)
        chat += [{"session": f"s{s}", "turn": 0, "prompt_tokens": 40, "output_tokens": 8, "prefix_id": "sys",
                  "prefix_tokens": 32, "arrival_s": s * 0.1},
                 {"session": f"s{s}", "turn": 1, "prompt_tokens": 60, "output_tokens": 8, "prefix_id": "sys",
                  "prefix_tokens": 32, "arrival_s": s * 0.1 + 0.5}]
    batch = [{"prompt_tokens": p, "output_tokens": 8} for p in (180, 200, 220)]
    profile = write_profile(tmp_path, chat, batch, replay="closed")
    with FakeVLLM(FakeConfig(max_tokens_cap=64, prefill_s_per_token=0.0005, itl_s=0.002,
                             prompt_tokens_details=True)) as fake:
        gates = run_load(pytester, fake.url, profile)
    assert {i: g["status"] for i, g in gates.items()} == {
        "fake-vllm-replay/concurrency/long-sequences": "PASS", "fake-vllm-replay/latency/slo": "PASS",
        "fake-vllm-replay/latency/interference": "PASS"}, [g["message"] for g in gates.values()]
    slo, long_, inter = (gates[f"fake-vllm-replay/{k}"] for k in ("latency/slo", "concurrency/long-sequences",
                                                            "latency/interference"))
    # looks at 64/72/96 (a FAIL at 98.33% each, a PASS at 97.5% over the two that can): 72 is the
    # first that can PASS; sessions are sent whole, so the look that decides holds 72 or more of the 88
    sent = int(re.search(r"replayed (\d+) of 88 requests of chat\.jsonl", slo["message"]).group(1))
    assert 72 <= sent <= 88, slo["message"]
    assert "upper bound" in slo["message"] and slo["evidence"]["sampling"]["history"][0]["n"] == 64
    assert "closed loop at concurrency 2): prompt p50/p99 40/60 tokens (declared 24/40)" in slo["message"]
    assert long_["message"].startswith("3 long sequences at concurrency 2, replayed 3 of 3 requests of batch.jsonl")
    assert "3/3 completed 200 with their recorded output tokens" in long_["message"]
    assert "replayed 16 of 88 requests of chat.jsonl" in inter["message"], inter["message"]
    assert "prompt lengths sent in the waves; sent with at most 8 output tokens" in inter["message"]
    assert inter["evidence"]["mixed_plan"]["long_traffic"]["path"] == "batch.jsonl"
    assert slo["evidence"]["traffic"]["plan"]["sessions"] == 44
    # the report carries the replay: planned vs sent per request, and the cache effect per turn
    allure = pytester.path / "reports" / "allure-results"
    attached = {a["name"]: allure / a["source"] for f in allure.glob("*-result.json")
                for a in json.loads(f.read_text()).get("attachments", [])}
    turns = next(p for n, p in attached.items() if n.endswith("turns.csv") and n.startswith("latency"))
    assert turns.read_text().splitlines()[0].startswith("turn,requests,sent,ok,cached_tokens_mean")
    assert len(turns.read_text().splitlines()) == 3  # header, turn 0, turn 1
    assert any(n.endswith("replay.csv") for n in attached)


def test_an_undecided_latency_slo_makes_the_run_inconclusive_and_certify_not_certified(pytester, tmp_path):
    """A 20-request replay within the SLO (too few for a p95 PASS): pytest exits 9, summary.json
    says INCONCLUSIVE, the console says it; --gate-mode certify lists the gate as INVALID, exit 7."""
    profile = write_profile(tmp_path, trace(burst=False))
    with FakeVLLM(FakeConfig(max_tokens_cap=64, itl_s=0.01, max_num_seqs=2)) as fake:
        result, summary, gates = run_load(pytester, fake.url, profile, "-k", "latency_slo", full=True)
        assert result.ret == 9 and summary["overall"] == "INCONCLUSIVE", summary["overall"]
        assert summary["outcome"] == "INCONCLUSIVE"
        assert gates["fake-vllm-replay/latency/slo"]["status"] == "INCONCLUSIVE"
        out = result.stdout.str()
        assert "INCONCLUSIVE fake-vllm-replay/latency/slo" in " ".join(out.split()) and "exit 9" in out, out[-2000:]
        cert, csum, _ = run_load(pytester, fake.url, profile, "-k", "latency_slo", "--gate-mode", "certify", full=True)
    assert cert.ret == 7, cert.stdout.str()[-2000:]
    assert csum["outcome"] == "NOT-CERTIFIED"
    assert "not certified: fake-vllm-replay/latency/slo: fake-vllm-replay/latency/slo INVALID (replayed 20 of 20" \
        in cert.stdout.str(), cert.stdout.str()[-2000:]
