"""The soak split (kvgate.scale.soak, issue 42): each round's arrivals thinned over the workers by
index, the workers' records merged per round, the soak judged on the merged rounds as one process.

Determinism, by construction (what a flaky comparison would hinge on, and why these do not):

- who sends what: by round and index only (no float arithmetic, no clock); compared exactly;
- which round a record is in: the round whose batch sent it (never its completion time);
  compared exactly, by (round, index), from the records and from the prompts the server received
  (each prompt's unique prefix names its round and index);
- that the merge is judged as one process judges: on virtual time with synthetic records whose
  times are dyadic fractions (sums exact in binary floating point), so rows and verdict messages
  compare byte for byte;
- the live comparison's verdicts: decided far from their limits (flat memory; a TTFT-slope ceiling
  of 1 s/s against the few ms of scatter the fake shows), so a loaded host's timing noise cannot
  move them across a limit -- what is compared is that the split decides what one process decides.

No test sleeps for a fault's length; ports are bound to 0.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import re
import signal
import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path

import pytest
import yaml

from kvgate.gates.scale import scaled_verdict
from kvgate.gates.soak import analyze, latency_verdict, memory_verdict
from kvgate.http.client import Endpoint
from kvgate.load import RequestRecord, closed_loop, open_loop
from kvgate.load.schedule import LoadResult
from kvgate.profile.models import load_profile
from kvgate.scale.batch import Batch, assignment
from kvgate.scale.clock import ClockOffset
from kvgate.scale.coordinator import Coordinator
from kvgate.scale.merge import ScaleRun, load_run, merge_parts
from kvgate.scale.ship import Part, dumps, loads
from kvgate.scale.soak import SoakSplit
from kvgate.scale.split import WorkerId
from kvgate.scale.worker import Worker, WorkerOptions
from kvgate.soak.runner import MixItem, Samplers, SoakPlan, SoakRunner, build_samplers, plan_for, soak_spec
from kvgate.stats import percentile
from kvgate.verdict import Status
from tests.fakes.fake_scale import faulty_worker
from tests.fakes.fake_vllm import FakeConfig
from tests.fakes.soak_fakes import SoakFakeVLLM, flat, run_virtual

from .conftest import REPO, assert_passes_measured

pytest_plugins = ["pytester"]
SOAK_PROFILE = REPO / "tests" / "data" / "fake-soak.yaml"
SUITE = str(REPO / "suites" / "test_soak.py")
EP = Endpoint("http://fake.invalid")


def _plan(rounds: int = 6, round_s: float = 2.0, rate: float = 23.0) -> SoakPlan:
    return SoakPlan(rounds=rounds, round_s=round_s, warmup_rounds=1, rate_rps=rate, seed=7, burst=True,
                    mix=(MixItem("chat", 3.0, 16, 8, "hello", concurrency=3),
                         MixItem("batch", 1.0, 100, 8, "long text", long=True, concurrency=2)))


# ----------------------------------------------------------------------------- the split (pure)


@pytest.mark.parametrize("n_workers", [1, 2, 3, 4, 7])
def test_each_rounds_arrivals_are_thinned_by_index_and_their_union_is_the_one_process_round(n_workers):
    plan = _plan()
    for k in range(plan.rounds):
        offsets, specs = plan.requests(k, EP, "m")
        again = plan.requests(k, EP, "m")  # seeded by round: the same round whoever asks, whenever
        assert (again[0], [s.body for s in again[1]]) == (offsets, [s.body for s in specs])
        batch = Batch(k, "open", specs, len(specs), 0.0, 10.0, offsets_s=offsets)
        shares = [assignment(batch, WorkerId(w, n_workers)) for w in range(n_workers)]
        sent = sorted((i, o, s.body["prompt"]) for a in shares for i, o, s in zip(a.indices, a.offsets_s, a.specs))
        # every request of the round once, at its own offset (the same float, never recomputed)
        assert sent == [(i, offsets[i], specs[i].body["prompt"]) for i in range(len(specs))]
        assert all(i % n_workers == w for w, a in enumerate(shares) for i in a.indices)
        if k == 0:  # the warm-up burst (5 requests at offset 0, indices 0..4) is thinned like any arrival
            assert offsets[:5] == [0.0] * 5
            assert sorted(w for w, a in enumerate(shares) for i in a.indices if i < 5) == sorted(i % n_workers
                                                                                                 for i in range(5))


# ----------------------------------------------------------------------------- the merge is judged as one process


def _records(k: int, n: int, tags: list[str]) -> list[RequestRecord]:
    """Round ``k``'s records: dyadic times (exact in binary floating point), TTFT by (round, index)."""
    out = []
    for i in range(n):
        t, ttft = i / 64, (1 + (7 * k + 3 * i) % 11) / 128
        r = RequestRecord(index=i, scheduled_s=t, sent_s=t + 1 / 1024, status=200, content_type="text/event-stream",
                          finalized=True, tokens=4, tag=tags[i])
        r.content_s = [t + 1 / 1024 + ttft + j / 256 for j in range(4)]
        r.chunk_s, r.first_token_s, r.end_s, r.done = list(r.content_s), r.content_s[0], r.content_s[-1], True
        out.append(r)
    return out


def _loop_lags(k: int, n: int) -> list[float]:
    return [((k + j) % 5) / 1024 for j in range(n)]


class _Mem:
    name, source, covers, quantity = "server-memory", "synthetic", "a test series", "bytes"

    def __init__(self, clock):
        self.clock, self.reads, self.errors, self.last_error = clock, 0, 0, None

    async def sample(self):
        self.reads += 1
        return {"memory": 5e8 + 4096 * (self.reads % 2)}  # flat, as a live process: a page up and down

    async def aclose(self):
        return None


def _virtual_soak(send_for, tmp_path, name):
    plan = _plan(rounds=8, round_s=60.0, rate=0.4)

    async def go(clock):
        runner = SoakRunner(plan, send_for(clock), Samplers(_Mem(clock), None, None, None), clock=clock,
                            requests=lambda k: plan.requests(k, EP, "m"), out_dir=tmp_path / name)
        return await runner.run()

    return run_virtual(go)


def test_the_merged_rounds_are_judged_exactly_as_one_process_judges_its_own(tmp_path):
    """The same round records, once as one process's result and once split over 3 workers by
    index, each part shipped (gzip JSONL and back) with its loop started 2^-7 s late and merged:
    the runner's rows are identical field for field and the verdicts word for word; held to the
    workers' checks, the split's verdicts add only the per-worker counts."""
    n = 3
    outcomes = {}

    def one(clock):
        async def send(k, offsets, specs, deadline_s):
            await asyncio.sleep(1.0)
            return LoadResult("open", _records(k, len(specs), [s.tag for s in specs]), len(specs), 1.0, deadline_s,
                              loop_lag_s=_loop_lags(k, 12))
        return send

    def split(clock):
        async def send(k, offsets, specs, deadline_s):
            await asyncio.sleep(1.0)
            batch = Batch(k, "open", specs, len(specs), 1000.0 + k, deadline_s, offsets_s=offsets,
                          meta={"phase": "soak", "round": k, "overlap": True, "warmup": k < 1})
            recs, lags = _records(k, len(specs), [s.tag for s in specs]), _loop_lags(k, 12)
            parts = {}
            for w in range(n):
                a = assignment(batch, WorkerId(w, n))
                late = w / 128  # this worker's loop began that late: its own times are that much earlier
                mine = [recs[i].shift(-late) for i in a.indices]
                res = LoadResult("open", mine, len(a.indices), 1.0, deadline_s, loop_lag_s=lags[w::n])
                part = Part(WorkerId(w, n), k, batch.start_wall, batch.start_wall + late, ClockOffset(0.0, 1e-4, 8),
                            ClockOffset(0.0, 1e-4, 8), len(a.indices), 0, res, {"own_share": 0.1}, "node", 100 + w)
                parts[w] = loads(dumps(part))  # shipped as the workers ship it
            outcomes[k] = merge_parts(batch.to_json(with_specs=False), parts, {})
            return outcomes[k].merged
        return send

    solo, merged = _virtual_soak(one, tmp_path, "one"), _virtual_soak(split, tmp_path, "split")
    assert solo.complete and merged.complete and len(solo.rows) == len(merged.rows) == 8
    assert merged.rows == solo.rows  # every field of every round: requests, TTFT p50/p95, ITL, e2e, lag, memory
    assert (tmp_path / "split" / "soak-requests.csv").read_text() == (tmp_path / "one" / "soak-requests.csv").read_text()
    spec = soak_spec(load_profile(str(SOAK_PROFILE)))
    profile = load_profile(str(SOAK_PROFILE))
    a, b = analyze(solo, spec), analyze(merged, spec)
    for judge in (memory_verdict, lambda x: latency_verdict(x, profile)):
        v1, v2 = judge(a), judge(b)
        assert (v2.status, v2.message, v2.measured) == (v1.status, v1.message, v1.measured)
        run = ScaleRun(n, "local", {w: {"host": "node", "pid": 100 + w} for w in range(n)}, {},
                       [outcomes[k] for k in sorted(outcomes)])
        held = scaled_verdict(v2, run, profile, lagged_rounds_max=spec.lagged_rounds_max)
        sent = [sum(len(o.parts[w].result.records) for o in outcomes.values()) for w in range(n)]
        tail = f" (3 local workers: {'/'.join(map(str, sent))} requests, merged)"
        assert held.status is v1.status and held.message in (v1.message + tail, v1.message.replace(" -> ", tail + " -> "))


def test_a_worker_lagging_in_more_rounds_than_the_soak_allows_is_invalid_naming_it():
    """The soak's own lag rule per worker (soak.lagged_rounds_max of the measured rounds), not one
    batch's: a lagging warm-up round or one round in ten is what one process is allowed too."""
    profile = load_profile(str(SOAK_PROFILE))  # schedule_lag_max_s 0.5

    def run(lagging: set[int]):
        outs = []
        for k in range(11):
            meta = {"id": k, "mode": "open", "n": 4, "start_wall": 1000.0 + k, "deadline_s": 10.0,
                    "meta": {"phase": "soak", "round": k, "warmup": k == 0}}
            parts = {}
            for w in range(2):
                recs = _records(k, 2, ["chat", "chat"])
                if w == 1 and k in lagging:
                    for r in recs:
                        r.sent_s += 0.75
                res = LoadResult("open", recs, 2, 1.0, 10.0, loop_lag_s=[0.001])
                parts[w] = Part(WorkerId(w, 2), k, 1000.0 + k, 1000.0 + k, ClockOffset(0.0, 1e-4, 8),
                                ClockOffset(0.0, 1e-4, 8), 2, 0, res, {"own_share": 0.2, "others_share": 0.7}, "n", w)
            outs.append(merge_parts(meta, parts, {}))
        from kvgate.verdict import Verdict

        ok = Verdict("soak/latency", Status.PASS, "TTFT p95 flat -> PASS")
        return scaled_verdict(ok, ScaleRun(2, "local", {0: {}, 1: {}}, {}, outs), profile, lagged_rounds_max=0.1)

    assert run({0}).status is Status.PASS and run({4}).status is Status.PASS  # warm-up; 1 of 10 = 10%
    v = run({3, 7})
    assert v.status is Status.INVALID and v.measured == 0.2 and v.limit == 0.1
    assert v.message.startswith("worker 1 of 2's client fell behind its schedule in 2 of 10 measured rounds (allowed "
                                "10%, soak.lagged_rounds_max; rounds 3, 7; worst batch 3 (soak round 3): p99 schedule "
                                "lag 751.0 ms"), v.message
    assert v.cause.startswith("worker 1 of 2's host: other processes took 70% of its CPUs")


# ----------------------------------------------------------------------------- live: the fake, one process vs workers


def _profile(tmp_path: Path) -> Path:
    """fake-soak with 3 SLO streams (so 3 workers are allowed), every verdict decided far from its
    limit whatever a loaded host does to timing (this test compares what is sent and what is
    decided; timing faults have their own tests): a TTFT-slope ceiling of 1 s/s; streams cut only
    after 5 s of silence (fake-soak's 0.2 s cut one-process streams on a loaded 2-core host: 1 of 5
    runs FAILed soak/latency on errors, measured); 2 s of schedule lag and start offset allowed."""
    p = tmp_path / "fake-soak-split.yaml"
    p.write_text(yaml.safe_dump({"extends": str(SOAK_PROFILE), "description": "fake-soak for the soak split",
                                 "slo": {"concurrency": 3},
                                 "limits": {"stream_idle_timeout_s": 5, "schedule_lag_max_s": 2.0},
                                 "soak": {"ttft_p95_slope_max_ms_per_h": 3_600_000}}, sort_keys=False))
    return p


def _soak(pytester, url: str, profile: Path, reports: Path, *extra: str):
    pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
                                 f"--profile={profile}", "--endpoint", url, f"--kvgate-reports={reports}", SUITE, *extra)
    summary = json.loads((reports / "summary.json").read_text())
    return summary, {g["id"].split("/", 1)[1]: g for g in summary["gates"]}


_PREFIX = re.compile(r"^soak (\d{3})-(\d{6})-(\d{5}): ")


def _received(fake) -> Counter:
    """(round, index) of every soak request the server received, from its prompt's unique prefix
    (:func:`kvgate.soak.runner.prefix`); the warm-up burst's are numbered from 90,000."""
    got = Counter()
    for r in fake.state.requests:
        m = _PREFIX.match(r.prompt or "")
        if m:
            got[(int(m.group(2)), int(m.group(3)))] += 1
    return got


def _recorded(reports: Path) -> list[tuple[int, int]]:
    """(round, index) of every record of soak-requests.csv: the round is the batch's, the index its position."""
    return [(int(r["round"]), int(r["index"])) for r in csv.DictReader((reports / "soak-requests.csv").open())]


def test_local_workers_send_the_same_rounds_and_reach_the_same_soak_verdicts(pytester, tmp_path):
    profile = _profile(tmp_path)
    with SoakFakeVLLM(FakeConfig(max_tokens_cap=64), memory=flat()) as fake:
        _, one = _soak(pytester, fake.url, profile, tmp_path / "one")
        got_one = _received(fake)
        fake.state.requests.clear()
        summary, split = _soak(pytester, fake.url, profile, tmp_path / "split", "--workers", "local:3")
        got_split = _received(fake)
    # the same request set, each once, and the same per-round assignment
    assert got_split == got_one and set(got_one.values()) == {1} and len(got_one) >= 50
    rec_one, rec_split = _recorded(tmp_path / "one"), _recorded(tmp_path / "split")
    assert sorted(rec_split) == sorted(rec_one) and len(set(rec_one)) == len(rec_one)
    rows = [list(csv.DictReader((tmp_path / d / "soak-rounds.csv").open())) for d in ("one", "split")]
    assert [r["requests"] for r in rows[1]] == [r["requests"] for r in rows[0]] and len(rows[0]) == 10
    # the same verdicts: the split's decided as one process decided, with the per-worker counts
    assert {g: v["status"] for g, v in split.items()} == {g: v["status"] for g, v in one.items()} == {
        "soak/memory": "PASS", "soak/latency": "PASS", "soak/gpu-memory": "SKIP"}, \
        [(g, v["status"], v["message"][:1500]) for run in (one, split) for g, v in run.items() if v["status"] != "PASS"]
    assert all(re.search(r"\(3 local workers: \d+/\d+/\d+ requests, merged\)", split[g]["message"])
               for g in ("soak/memory", "soak/latency"))
    assert_passes_measured(summary)
    # each worker sent exactly its thinned share of every round; each round's TTFT p95 is the union's
    run = load_run(tmp_path / "split" / "scale")
    assert [b.meta["meta"]["round"] for b in run.batches] == list(range(10)) and all(b.complete for b in run.batches)
    for b, row in zip(run.batches, rows[1]):
        for w, part in b.parts.items():
            assert sorted(r.index for r in part.result.records) == list(range(w, b.meta["n"], 3))
        ttft = [(r.first_token_s - r.sent_s) * 1e3 for r in b.merged.records if r.ok and r.first_token_s is not None]
        assert float(row["ttft_p95_ms"]) == pytest.approx(percentile(ttft, 95), abs=0.006)
        assert int(row["requests"]) == len(b.merged.records) == b.meta["n"]


def test_a_worker_killed_mid_soak_makes_the_soak_invalid_naming_it(pytester, tmp_path):
    """A real ``kvgate worker`` process SIGKILLed once round 3 is published: the soak stops, its
    verdicts are INVALID naming the worker and its pid, never a PASS on what the others sent."""
    profile = _profile(tmp_path)
    reports = tmp_path / "r"
    killed: dict[str, int] = {}

    def killer() -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end and not (reports / "scale" / "batches" / "batch-003.json").exists():
            time.sleep(0.01)
        try:
            pid = int(json.loads((reports / "scale" / "run.json").read_text())["joined"]["1"]["pid"])
        except (OSError, KeyError, ValueError):
            return
        killed["pid"] = pid
        os.kill(pid, signal.SIGKILL)

    with SoakFakeVLLM(FakeConfig(max_tokens_cap=64), memory=flat()) as fake:
        t = threading.Thread(target=killer, daemon=True)
        t.start()
        _, gates = _soak(pytester, fake.url, profile, reports, "--workers", "local:3")
        t.join(5)
    assert killed, "round 3 was never published"
    for g in ("soak/memory", "soak/latency"):
        v = gates[g]
        assert v["status"] == "INVALID", v["message"]
        assert re.search(rf"worker 1 of 3 lost: its process \(pid {killed['pid']}\) killed by SIGKILL during batch \d+ "
                         r"\(soak round \d+\)", v["message"]), v["message"]
        assert "requests are missing from the merge -> INVALID" in v["message"]
        assert "the merge was not judged: it would have been INCOMPLETE" in v["message"], v["message"]
    assert gates["soak/gpu-memory"]["status"] == "SKIP"
    assert len(list(csv.DictReader((reports / "soak-rounds.csv").open()))) < 10  # the soak stopped at the loss


# ----------------------------------------------------------------------------- in process: a worker past the barrier


#: Workers as threads share one heap with the test: their loops never collect or freeze it.
IN_PROCESS = {"closed": partial(closed_loop, freeze_gc=False), "opened": partial(open_loop, freeze_gc=False),
              "freeze_heap": False}


def test_a_worker_late_for_a_round_makes_the_soak_invalid_naming_its_offset(tmp_path):
    profile = load_profile(str(SOAK_PROFILE))  # bound: limits.schedule_lag_max_s 0.5 s
    spec = soak_spec(profile, "1.25s")  # 5 rounds of 0.25 s
    plan = plan_for(profile, spec)
    with SoakFakeVLLM(FakeConfig(max_tokens_cap=64), memory=flat()) as fake:
        ep = Endpoint(base_url=fake.base_url)
        coord = Coordinator(2, tmp_path / "scale", ep, lead_s=0.3, grace_s=2.0, poll_s=0.01, long_poll_s=0.5,
                            heartbeat_timeout_s=3.0).start()
        opts = [WorkerOptions(coord.url, WorkerId(k, 2), heartbeat_s=0.1, exchanges=3, max_silence_s=5) for k in (0, 1)]
        workers = [Worker(opts[0], **IN_PROCESS), faulty_worker(opts[1], "start_late", late_s=1.8, **IN_PROCESS)]
        threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
        for t in threads:
            t.start()
        try:
            split = SoakSplit(coord, request_timeout_s=plan.request_timeout_s, warmup_rounds=plan.warmup_rounds)
            assert split.ready() == {}
            runner = SoakRunner(plan, split, build_samplers(profile, spec, ep), lead_s=split.lead_s,
                                requests=lambda k: plan.requests(k, ep, profile.model.served_name))
            result = asyncio.run(runner.run())
        finally:
            coord.stop()
            for t in threads:
                t.join(10)
    assert result.complete and len(result.rows) == 5
    v = scaled_verdict(latency_verdict(analyze(result, spec), profile), coord.report("soak"), profile,
                       lagged_rounds_max=spec.lagged_rounds_max)
    assert v.status is Status.INVALID, v.message
    m = re.search(r"worker 1 of 2 started batch 0 \(soak round 0\) ([\d,]+\.\d) ms after the shared start instant "
                  r"\(bound 500\.0 ms, limits\.schedule_lag_max_s\): the barrier was missed", v.message)
    assert m and float(m.group(1).replace(",", "")) >= 1800, v.message
    assert "worker 0 of 2" not in v.message.split(" (2 local workers")[0]  # the one on time is not named


def test_a_soak_drawing_whole_sessions_is_refused_before_anything_starts(pytester, tmp_path):
    """tiny-cpu-replay's soak draws sessions of its traffic sample (the default mix): its later turns
    are built from the replies where they are sent, which a worker's batch cannot carry -> usage error."""
    p = tmp_path / "replay-soak.yaml"  # the latency gate on a fixed workload, so only the soak's refusal is left
    p.write_text(yaml.safe_dump({"extends": str(REPO / "profiles" / "tiny-cpu-replay.yaml"),
                                 "slo": {"workload": "chat-short"}}))
    result = pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p",
                                          "no:cacheprovider", f"--profile={p}", "-m", "soak", "--collect-only",
                                          f"--kvgate-reports={tmp_path / 'r'}", "--workers=local:2", SUITE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert ("--workers local:2: the soak of profile replay-soak draws whole sessions from workloads.chat-replay.traffic"
            in result.stderr.str()), result.stderr.str()
