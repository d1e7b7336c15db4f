"""The soak runner on virtual time: rounds, per-round rows and CSVs, progress, bounded sampling,
interruption and the hard deadline -- no real sleeping, synthetic load and samplers."""

from __future__ import annotations

import csv
import dataclasses
import re
import gc
import os
import signal
import weakref
from typing import Any

import pytest

from kvgate.http.client import Endpoint
from kvgate.gates.soak import analyze, latency_verdict, memory_verdict
from kvgate.load import LoadResult, RequestRecord
from kvgate.profile.models import SoakSpec, load_profile
from kvgate.soak.runner import (MixItem, Samplers, SessionTurn, SoakError, SoakPlan, SoakRunner, StopOnSignals, mix_of, plan_for,
                                soak_spec, token_prompt, with_prompts)
from kvgate.verdict import Status
from tests.fakes.soak_fakes import run_virtual

from .conftest import REPO

MB = 1e6


def plan(rounds: int = 12, round_s: float = 60.0, warmup: int = 2, rate: float = 2.0, period: float = 5.0) -> SoakPlan:
    return SoakPlan(rounds=rounds, round_s=round_s, warmup_rounds=warmup, rate_rps=rate,
                    mix=(MixItem("chat", 1.0, 16, 8, "hello world"),), sample_period_s=period,
                    request_timeout_s=30.0, lag_bound_s=0.05)


def spec(**kw: Any) -> SoakSpec:
    base = dict(duration="12m", round="60s", warmup="120s", rate_rps=2, memory_slope_max_mb_per_h=20,
                ttft_p95_slope_max_ms_per_h=300)
    return SoakSpec(**{**base, **kw})


class Mem:
    """Synthetic server memory: ``f(t)`` bytes at virtual time t."""

    name, source, covers, quantity = "server-memory", "synthetic", "a test series", "bytes"

    def __init__(self, clock, f) -> None:
        self.clock, self.f = clock, f
        self.reads = self.errors = 0
        self.last_error = None

    async def sample(self):
        self.reads += 1
        v = self.f(self.clock())
        if v is None:
            self.errors += 1
            self.last_error = "gone"
        return {"memory": v}

    async def aclose(self):
        return None


class Metrics(Mem):
    name, source, covers = "server-metrics", "synthetic /metrics", "gauges"

    async def sample(self):
        self.reads += 1
        return {"running": 1.0, "waiting": 0.0, "kv_usage": 0.25, "preemptions": self.f(self.clock())}


def sender(clock, ttft_s, n_per_round: int = 10, hold_s: float = 1.0, lag_s: float = 0.0):
    """A SendRound that 'sends' n requests at once with TTFT ``ttft_s(t)``, finishing after hold_s."""
    sent = []

    async def send(k, offsets, specs, deadline_s):
        import asyncio

        t0 = clock()
        recs = []
        for i in range(n_per_round):
            ttft = ttft_s(t0) * (1 + 0.02 * (i % 5))
            r = RequestRecord(index=i, scheduled_s=0.0, sent_s=lag_s, status=200, content_type="text/event-stream",
                              finalized=True, tokens=8)
            r.content_s = [lag_s + ttft + 0.01 * j for j in range(8)]
            r.chunk_s = list(r.content_s)
            r.first_token_s = r.content_s[0]
            r.end_s = r.content_s[-1]
            recs.append(r)
        await asyncio.sleep(hold_s)
        res = LoadResult("open", recs, len(recs), hold_s, deadline_s)
        sent.append(weakref.ref(res))
        return res

    send.sent = sent  # type: ignore[attr-defined]
    return send


def no_requests(k):
    return [], []


def test_runner_writes_one_row_per_round_and_fits_a_linear_leak(tmp_path):
    lines: list[str] = []

    async def go(clock):
        p = plan()
        s = Samplers(Mem(clock, lambda t: 500 * MB + t / 3600 * 100 * MB), Metrics(clock, lambda t: 0.0), None, None)
        runner = SoakRunner(p, sender(clock, lambda t: 0.05), s, requests=no_requests, out_dir=tmp_path,
                            progress=lines.append, clock=clock)
        return await runner.run(), clock()

    result, t_end = run_virtual(go)
    assert result.complete and result.stopped is None and len(result.rows) == 12
    assert [r["round"] for r in result.rows] == list(range(12))
    assert [r["warmup"] for r in result.rows] == [True, True] + [False] * 10
    assert t_end == pytest.approx(12 * 60 + 1.0, abs=1.0)  # 12 rounds + the last round's tail
    # bounded sampling: one tick per period, never past the end
    assert result.ticks <= 12 * 60 / 5 + 2 and result.samplers["server-memory"]["reads"] == result.ticks
    # each row: the round's low envelope (its first sample), TTFT p95 50 ms x up to 1.08
    r5 = result.rows[5]
    assert r5["mem_min_mb"] == pytest.approx(500 + 5 * 60 / 3600 * 100, abs=0.01)
    assert r5["mem_max_mb"] > r5["mem_min_mb"]
    assert 50 <= r5["ttft_p95_ms"] <= 54.1 and r5["requests"] == 10 and r5["errors"] == 0
    assert r5["kv_usage_max"] == 0.25 and r5["preemptions"] == 0
    # the CSV on disk holds every round, flushed as they completed
    rows = list(csv.DictReader((tmp_path / "soak-rounds.csv").open()))
    assert len(rows) == 12 and rows[-1]["round"] == "11"
    assert (tmp_path / "soak-requests.csv").read_text().count("\n") == 1 + 12 * 10
    # one progress line per round, with the slope so far and an ETA
    assert len(lines) == 12 and lines[0].startswith("soak round 1/12 (warm-up): TTFT p95 5")
    assert "slope so far +100.0 MB/h" in lines[-1] and "ETA 0m00s" in lines[-1]
    a = analyze(result, spec())
    assert a.memory is not None and a.memory.full.slope == pytest.approx(100.0, rel=1e-4)
    v = memory_verdict(a)
    assert v.status is Status.FAIL and "memory growth" in v.message and "ceiling 20 MB/h" in v.message


def test_per_request_records_are_not_kept(tmp_path):
    async def go(clock):
        send = sender(clock, lambda t: 0.05, n_per_round=50)
        s = Samplers(Mem(clock, lambda t: 1e9), None, None, None)
        runner = SoakRunner(plan(rounds=200, round_s=10, warmup=0, period=5), send, s, requests=no_requests,
                            out_dir=tmp_path, clock=clock)
        result = await runner.run()
        return result, send, runner

    result, send, runner = run_virtual(go)
    gc.collect()
    assert len(result.rows) == 200
    assert all(ref() is None for ref in send.sent)   # every round's LoadResult was dropped
    assert runner._acc == {}                          # and every round's sample reductions
    assert (tmp_path / "soak-requests.csv").read_text().count("\n") == 1 + 200 * 50  # they went to disk


def test_interrupt_keeps_completed_rounds_and_marks_incomplete(tmp_path):
    async def go(clock):
        import asyncio

        s = Samplers(Mem(clock, lambda t: 5e8), None, None, None)
        runner = SoakRunner(plan(), sender(clock, lambda t: 0.05), s, requests=no_requests, out_dir=tmp_path,
                            clock=clock)
        asyncio.get_running_loop().call_at(5 * 60 + 30, runner.request_stop, "SIGINT")
        return await runner.run()

    result = run_virtual(go)
    assert not result.complete and result.stopped == "SIGINT"
    assert [r["round"] for r in result.rows] == [0, 1, 2, 3, 4]  # round 5 was cut mid-way: not a round
    assert len(list(csv.DictReader((tmp_path / "soak-rounds.csv").open()))) == 5
    v = memory_verdict(analyze(result, spec()))
    assert v.status is Status.INCOMPLETE
    assert "soak stopped (SIGINT) after 5 of 12 rounds" in v.message and "never a PASS" in v.message


def test_a_real_sigint_stops_the_soak_cleanly(tmp_path):
    async def go(clock):
        import asyncio

        s = Samplers(Mem(clock, lambda t: 5e8), None, None, None)
        runner = SoakRunner(plan(), sender(clock, lambda t: 0.05), s, requests=no_requests, out_dir=tmp_path,
                            clock=clock)
        asyncio.get_running_loop().call_at(3 * 60 + 30, os.kill, os.getpid(), signal.SIGINT)
        with StopOnSignals(runner) as sig:
            result = await runner.run()
        return result, sig.signal_name

    before = signal.getsignal(signal.SIGINT)
    result, name = run_virtual(go)
    assert name == "SIGINT" and result.stopped == "SIGINT" and len(result.rows) == 3
    assert signal.getsignal(signal.SIGINT) is before  # the previous handler is back


def test_rounds_that_never_finish_hit_the_hard_deadline(tmp_path):
    async def go(clock):
        import asyncio

        async def hang(k, offsets, specs, deadline_s):
            await asyncio.sleep(10**6)

        s = Samplers(Mem(clock, lambda t: 5e8), None, None, None)
        runner = SoakRunner(plan(rounds=6), hang, s, requests=no_requests, out_dir=tmp_path, clock=clock)
        return await runner.run(), clock()

    result, t_end = run_virtual(go)
    assert not result.complete and result.stopped.startswith("deadline") and result.rows == []
    assert t_end == pytest.approx(6 * 60 + 30 + 30, abs=1)  # duration + request timeout + 30 s


def test_ttft_drift_with_flat_memory_and_climbing_preemptions_is_preemption_placement(tmp_path):
    async def go(clock):
        # flat memory as a live process's: one page up every other second (a gauge that never moves is INVALID)
        s = Samplers(Mem(clock, lambda t: 5e8 + 4096 * (int(t) % 2)), Metrics(clock, lambda t: float(int(t / 30))), None,
                     None)
        runner = SoakRunner(plan(), sender(clock, lambda t: 0.05 + t / 3600 * 2.0), s, requests=no_requests,
                            clock=clock)
        return await runner.run()

    a = analyze(run_virtual(go), spec())
    assert a.classification == "preemption/placement" and a.preemptions == pytest.approx(20, abs=1)
    v = latency_verdict(a, load_profile(str(REPO / "tests" / "data" / "fake-vllm.yaml")))
    assert v.status is Status.FAIL and "preemptions climbing" in v.message and "ceiling 300 ms/h" in v.message
    assert memory_verdict(a).status is Status.PASS


def test_lagging_client_makes_the_soak_invalid(tmp_path):
    async def go(clock):
        s = Samplers(Mem(clock, lambda t: 5e8), None, None, None)
        runner = SoakRunner(plan(), sender(clock, lambda t: 0.05, lag_s=0.2), s, requests=no_requests, clock=clock)
        return await runner.run()

    a = analyze(run_virtual(go), spec())
    v = memory_verdict(a)
    assert v.status is Status.INVALID and "client fell behind its schedule in 10 of 10 measured rounds" in v.message


def test_plan_requests_are_seeded_poisson_within_the_round_with_unique_prefixes():
    p = plan(round_s=10.0, rate=5.0)
    ep = Endpoint("http://127.0.0.1:1")
    a = p.requests(3, ep, "m")
    b = p.requests(3, ep, "m")
    assert a[0] == b[0] and len(a[0]) == len(a[1])          # same seed, same round: same schedule
    assert p.requests(4, ep, "m")[0] != a[0]                 # another round: another draw
    assert all(0 <= o < 10.0 for o in a[0]) and 25 <= len(a[0]) <= 80
    prompts = [s.body["prompt"] for s in a[1]]
    assert len(set(prompts)) == len(prompts) and prompts[0].startswith("soak 000-000003-00000: ")
    assert a[1][0].path == "/v1/completions" and a[1][0].body["max_tokens"] == 8


def test_plan_from_profile_and_duration_override():
    prof = load_profile("tiny-cpu")
    s = soak_spec(prof)
    p = plan_for(prof, s)
    assert p.rounds == s.rounds and p.round_s == s.round_s and 60 <= p.duration_s <= 90
    # the default mix: both shapes, weighted by their declared concurrency (4 : 4), the long one clamped
    assert [(m.name, m.weight, m.prompt_tokens, m.output_tokens, m.long) for m in p.mix] == [
        ("chat-short", 4.0, 128, 32, False), ("batch-long", 4.0, 1900, 64, True)]
    assert p.mix_source.startswith("default") and p.shares() == {"chat-short": 0.5, "batch-long": 0.5}
    longer = soak_spec(prof, "10m")
    assert longer.duration_s == 600 and longer.round_s == s.round_s
    from kvgate.soak.runner import SoakError

    with pytest.raises(SoakError, match="needs? at least 4|leaves"):
        soak_spec(prof, "5s")


def test_kvgate_keeps_a_small_fixed_amount_per_round(tmp_path):
    """A day of 10 s rounds is 8,640 rounds: what the runner keeps per round must stay small
    (the round row), whatever the number of requests and samples in it."""
    import tracemalloc

    async def go(clock, rounds):
        send = sender(clock, lambda t: 0.05, n_per_round=40)
        s = Samplers(Mem(clock, lambda t: 1e9), Metrics(clock, lambda t: 0.0), None, None)
        runner = SoakRunner(plan(rounds=rounds, round_s=10, warmup=0, period=1), send, s, requests=no_requests,
                            out_dir=tmp_path, clock=clock)
        return await runner.run()

    run_virtual(lambda c: go(c, 20))  # warm caches and imports
    tracemalloc.start()
    try:
        small = run_virtual(lambda c: go(c, 50))
        base = tracemalloc.get_traced_memory()[0]
        del small
        big = run_virtual(lambda c: go(c, 250))  # 200 rounds more than `small`: 8,000 requests (550 took ~60 s)
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(big.rows) == 250
    per_round = grown / 200
    assert per_round < 4000, f"{per_round:.0f} bytes kept per round"  # ~35 MB for a day of 10 s rounds at most


# ----------------------------------------------------------------------------- the mix


def mixed_profile(write_profile, tmp_path, soak_mix="", rows=None, **trace):
    """A profile with a chat (concurrency 3), a long batch (1) and, with ``rows``, a traffic workload (2)."""
    wl = ("  chat: {prompt_tokens: 100, output_tokens: 20, concurrency: 3}\n"
          "  batch: {prompt_tokens: 4000, output_tokens: 48, concurrency: 1, long: true}\n")
    if rows is not None:
        (tmp_path / "s.jsonl").write_text("".join(f'{{"prompt_tokens": {p}, "output_tokens": {o}}}\n' for p, o in rows))
        wl += "  trace: {prompt_tokens: 100, output_tokens: 20, concurrency: 2, traffic: {path: s.jsonl, replay: closed}}\n"
    return load_profile(write_profile(
        "mixed", "model:\n  served_name: m\n  architecture: {layers: 2, attention_heads: 4, kv_heads: 2, head_dim: 64}\n"
                 "engine: {max_model_len: 2048}\nlimits: {max_tokens_cap: 64}\nslo: {workload: chat}\n"
                 f"workloads:\n{wl}soak: {{duration: 60s, round: 10s, rate_rps: 5, memory_slope_max_mb_per_h: 20, "
                 f"ttft_p95_slope_max_ms_per_h: 300{soak_mix}}}\n"))


def test_default_mix_is_every_workload_by_declared_concurrency_and_an_explicit_mix_wins(write_profile, tmp_path):
    prof = mixed_profile(write_profile, tmp_path)
    mix = mix_of(prof, prof.soak)
    assert [(m.name, m.weight, m.prompt_tokens, m.long) for m in mix] == [
        ("chat", 3.0, 100, False), ("batch", 1.0, 2048 - 48 - 8, True)]   # the long prompt clamped to fit
    p = plan_for(prof, prof.soak)
    assert p.describe_mix() == "chat 75% (100+20 tokens) + batch 25% (1,992+48 tokens, long)"
    explicit = mixed_profile(write_profile, tmp_path, ", mix: {chat: 1}")
    assert [m.name for m in mix_of(explicit, explicit.soak)] == ["chat"]
    assert plan_for(explicit, explicit.soak).mix_source == "soak.mix"


def test_a_traffic_workload_draws_its_samples_rows_reproducibly_as_exact_token_id_prompts(write_profile, tmp_path,
                                                                                        monkeypatch):
    rows = [(10, 5), (300, 20), (1200, 40), (2500, 30), (50, 900)]  # 2500: too long; output 900: over the cap
    prof = mixed_profile(write_profile, tmp_path, ", mix: {trace: 1, chat: 1}", rows=rows)
    mix = mix_of(prof, prof.soak)
    trace = mix[0]
    assert trace.draws == ((10, 5), (300, 20), (1200, 40), (2048 - 30 - 8, 30), (50, 64))
    assert trace.sample["path"] == "s.jsonl" and trace.sample["clamped"] == 2 and len(trace.sample["sha256"]) == 64
    assert trace.prompt_tokens == 300  # the p50, for display
    # the verdict's mix says the sample was cut to fit, not just the range sent
    assert trace.describe(0.5).endswith("; 2 of 5 rows do not fit as recorded, sent cut to prompt + output <= "
                                        "max_model_len 2,048 and output <= max_tokens_cap 64)")
    # with_prompts sizes the fixed workload only: the traffic one needs no /tokenize
    import kvgate.http.probes as probes
    from kvgate.http.prompts import ExactPrompt

    asked = []

    def build(client, model, api, tokens, prefix=""):
        asked.append(tokens)
        return ExactPrompt(prefix + "hello " * 3, tokens, api)

    monkeypatch.setattr(probes, "build_prompt", build)
    sized = with_prompts(object(), "m", mix)
    assert sized[0] is trace and sized[1].text == "hello " * 3 and asked == [100]
    p = plan_for(prof, prof.soak, sized)
    ep = Endpoint("http://127.0.0.1:1")
    offsets, specs = p.requests(2, ep, "m")
    drawn = [(len(s.body["prompt"]), s.body["max_tokens"]) for s in specs if s.tag == "trace"]
    assert drawn and set(drawn) <= set(trace.draws) and len(set(drawn)) >= 3  # varied, each a sample row
    assert [s.body for s in p.requests(2, ep, "m")[1]] == [s.body for s in specs]  # seeded: the same again
    assert [s.body for s in p.requests(3, ep, "m")[1]] != [s.body for s in specs]
    heads = [tuple(s.body["prompt"][:8]) for s in specs if s.tag == "trace" and len(s.body["prompt"]) >= 8]
    assert len(set(heads)) == len(heads)  # no two requests share a first KV block
    # the chat requests drew the same arrivals and picks as a mix without the sample would (own rng stream)
    assert all(isinstance(s.body["prompt"], str) for s in specs if s.tag == "chat")


def test_token_prompt_is_exact_and_unique_per_request():
    assert [len(token_prompt(0, 5, 7, n)) for n in (1, 3, 8, 9, 2040)] == [1, 3, 8, 9, 2040]
    seen = {tuple(token_prompt(s, k, i, 16)) for s in (0, 1) for k in (0, 1, 4095) for i in (0, 1, 63, 64, 9999)}
    assert len(seen) == 2 * 3 * 5
    assert all(100 <= t < 164 for t in token_prompt(3, 2, 1, 300))


def test_an_unreadable_sample_is_a_soak_error_naming_the_field(write_profile, tmp_path):
    prof = mixed_profile(write_profile, tmp_path, rows=[(10, 5)])
    (tmp_path / "s.jsonl").write_text('{"prompt_tokens": -1, "output_tokens": 5}\n')
    with pytest.raises(SoakError, match=r"field 'workloads.trace.traffic'.*s.jsonl:1.*'prompt_tokens'"):
        mix_of(prof, prof.soak)


def test_the_runner_tallies_what_each_workload_sent(tmp_path):
    async def go(clock):
        mix = (MixItem("chat", 3.0, 16, 8, "hi"), MixItem("trace", 1.0, 50, 8, draws=((20, 4), (90, 8))))
        p = SoakPlan(rounds=6, round_s=10, warmup_rounds=1, rate_rps=4, mix=mix, sample_period_s=5,
                     request_timeout_s=30, lag_bound_s=0.05)
        ep = Endpoint("http://127.0.0.1:1")

        async def send(k, offsets, specs, deadline_s):
            recs = [RequestRecord(index=i, scheduled_s=0.0, sent_s=0.0, status=200 if i % 7 else 500,
                                  tag=s.tag, finalized=True) for i, s in enumerate(specs)]
            return LoadResult("open", recs, len(recs), 1.0, deadline_s)

        s = Samplers(Mem(clock, lambda t: 5e8), None, None, None)
        runner = SoakRunner(p, send, s, requests=lambda k: p.requests(k, ep, "m"), clock=clock)
        return await runner.run(), [p.requests(k, ep, "m")[1] for k in range(6)]

    result, sent = run_virtual(go)
    w = result.workloads
    allspecs = [s for specs in sent for s in specs]
    assert w["chat"]["requests"] + w["trace"]["requests"] == len(allspecs) == sum(r["requests"] for r in result.rows)
    assert w["chat"]["share"] == 0.75 and w["chat"]["prompt_min"] == w["chat"]["prompt_max"] == 16
    assert w["trace"]["prompt_min"] == 20 and w["trace"]["prompt_max"] == 90
    assert w["chat"]["errors"] + w["trace"]["errors"] == sum(r["errors"] for r in result.rows) > 0


def test_the_first_warmup_round_opens_with_a_burst_at_the_declared_concurrencies(write_profile, tmp_path):
    prof = mixed_profile(write_profile, tmp_path, ", warmup: 10s, mix: {trace: 1, chat: 1}",
                         rows=[(10, 5), (1200, 40), (300, 20)])
    p = plan_for(prof, prof.soak)
    assert p.burst and p.burst_requests == 2 + 3  # trace concurrency 2, chat 3
    ep = Endpoint("http://127.0.0.1:1")
    offsets, specs = p.requests(0, ep, "m")
    head = [(s.tag, len(s.body["prompt"]) if s.tag == "trace" else s.body["max_tokens"]) for s in specs[:5]]
    assert offsets[:5] == [0.0] * 5 and head == [("trace", 1200), ("trace", 1200), ("chat", 20), ("chat", 20),
                                                 ("chat", 20)]  # the longest row of the sample
    assert specs[2].body["prompt"].startswith("soak 000-000000-90002: ")
    assert offsets == sorted(offsets) and len({str(s.body["prompt"]) for s in specs}) == len(specs)
    import dataclasses

    plain = dataclasses.replace(p, burst=False)
    assert [x.body for x in plain.requests(0, ep, "m")[1]] == [x.body for x in specs[5:]]  # the round itself unchanged
    assert [x.body for x in plain.requests(1, ep, "m")[1]] == [x.body for x in p.requests(1, ep, "m")[1]]  # round 0 only
    nowarm = mixed_profile(write_profile, tmp_path, ", mix: {chat: 1}")
    assert plan_for(nowarm, nowarm.soak).burst_requests == 0  # no warm-up rounds: nothing unmeasured to burst in


def test_a_sample_with_sessions_draws_whole_units_at_their_recorded_gaps(write_profile, tmp_path):
    prof = mixed_profile(write_profile, tmp_path, ", mix: {trace: 1}", rows=[(10, 5)])
    (tmp_path / "s.jsonl").write_text(
        '{"prompt_tokens": 40, "output_tokens": 5, "arrival_s": 1.0, "session": "a", "turn": 0, "prefix_id": "p", "prefix_tokens": 16}\n'
        '{"prompt_tokens": 30, "output_tokens": 900, "arrival_s": 1.5}\n'
        '{"prompt_tokens": 2500, "output_tokens": 5, "arrival_s": 3.0, "session": "a", "turn": 1, "prefix_id": "p", "prefix_tokens": 16}\n')
    trace = mix_of(prof, prof.soak)[0]
    (t0, g0), (t1, g1) = trace.units[0]
    assert (g0, g1) == (0.0, 2.0) and (t0.prompt_tokens, t1.prompt_tokens) == (40, 2048 - 5 - 8)  # clamped as draws
    assert trace.units[1][0][0].output_tokens == 64 and len(trace.units) == 2
    p = plan_for(prof, prof.soak)
    offsets, specs = p.requests(3, Endpoint("http://127.0.0.1:1"), "m")
    assert all(isinstance(s, SessionTurn) for s in specs) and offsets
    for s, o in zip(specs, offsets):
        if s.turns == 2 and s.turn == 1:  # the later turn at its session's arrival + the recorded gap
            first = next(i for i, x in enumerate(specs) if x.session == s.session and x.turn == 0)
            assert o == pytest.approx(offsets[first] + 2.0)
    assert len({s.session for s in specs}) == sum(1 for s in specs if s.turn == 0)  # one key per drawn unit
    again = p.requests(3, Endpoint("http://127.0.0.1:1"), "m")
    assert again[0] == offsets and again[1] == specs  # seeded per round


# ----------------------------------------------------------------------------- sample until decided


def extending(max_rounds: int = 30) -> tuple[SoakPlan, SoakSpec]:
    """12 planned rounds of 60 s (2 warm-up), at most ``max_rounds``: the plan and its spec (ceilings
    20 MB/h, 300 ms/h; ``looks = max_rounds - 12 + 1``)."""
    p = plan()
    return (SoakPlan(**{**p.__dict__, "max_rounds": max_rounds}),
            spec(max_duration=f"{max_rounds}m"))


def flat_memory(clock):
    """Flat retained memory (each round's floor 500 MB) with a within-round sawtooth (not frozen)."""
    return Mem(clock, lambda t: 500 * MB + (t % 60) * 0.01 * MB)


def ttft_of(base_s: float, drift_ms_per_h: float, scatter_s: float):
    """TTFT at virtual time t: ``base_s`` + the drift + ``scatter_s`` alternating in sign round by round."""
    return lambda t: base_s + drift_ms_per_h / 1e3 * t / 3600 + (scatter_s if int(t // 60) % 2 else -scatter_s)


def soak_until_decided(tmp_path, ttft, max_rounds=30, hold_s=1.0, lines=None):
    from kvgate.gates.soak import undecided

    p, sp = extending(max_rounds)
    looks: list[int] = []

    def judge(partial):
        looks.append(len(partial.rows))
        return undecided(partial, sp, load_profile(str(REPO / "tests" / "data" / "fake-vllm.yaml")))

    async def go(clock):
        s = Samplers(flat_memory(clock), Metrics(clock, lambda t: 0.0), None, None)
        runner = SoakRunner(p, sender(clock, ttft, hold_s=hold_s), s, requests=no_requests, out_dir=tmp_path,
                            clock=clock, judge=judge, progress=(lines.append if lines is not None else None))
        return await runner.run(), clock()

    result, t_end = run_virtual(go)
    return result, t_end, sp, looks


@pytest.mark.parametrize("hold_s", [1.0, 90.0])  # rows land before the next round starts / 30 s into it
def test_a_straddling_soak_extends_until_its_interval_clears_the_ceiling_then_passes(tmp_path, hold_s):
    lines: list[str] = []
    result, t_end, sp, looks = soak_until_decided(tmp_path, ttft_of(0.05, 0.0, 0.02), hold_s=hold_s, lines=lines)
    assert sp.looks == 19 and sp.look_confidence == pytest.approx(1 - 0.05 / 19)
    ext = result.extension
    # at the planned 12 rounds the interval straddled the 300 ms/h ceiling: INCONCLUSIVE there
    planned = dataclasses.replace(result, rows=result.rows[:12], extension=None)
    assert latency_verdict(analyze(planned, sp), load_profile(str(REPO / "tests" / "data" / "fake-vllm.yaml"))).status \
        is Status.INCONCLUSIVE
    n = len(result.rows)
    assert result.complete and 12 < n < 30 and ext.decided and ext.rounds == n, ext
    assert ext.looks[0] == (12, ("latency",)) and ext.looks[-1] == (n, ()) and ext.extended_for == ("latency",)
    assert looks == list(range(12, n + 1))  # a look after every round once the planned rounds were in
    assert [r["round"] for r in result.rows] == list(range(n))  # the deciding look's rounds, no more
    assert len(list(csv.DictReader((tmp_path / "soak-rounds.csv").open()))) == n
    assert t_end < n * 60 + 91  # it stopped there: no round past the deciding look ran to its end
    v = latency_verdict(analyze(result, sp), load_profile(str(REPO / "tests" / "data" / "fake-vllm.yaml")))
    assert v.status is Status.PASS and v.cause is None, v.message
    assert (f"decided after {n - 2} measured rounds ({n * 60:,} s of at most 1,800 s; 10 planned, extended {n - 12} "
            f"rounds while soak/latency's interval straddled its ceiling; each look judged at 99.74%: 95% split over "
            f"19 looks)") in v.message, v.message
    assert "99.74% CI" in v.message  # the interval shown is the per-look one
    m = memory_verdict(analyze(result, sp))
    assert m.status is Status.PASS and "decided after" in m.message
    assert f"soak round {n}/30 (past the 12 planned: sampling until decided)" in lines[-1]


def test_a_soak_still_straddling_at_max_duration_stays_inconclusive_naming_the_rounds_that_would_decide(tmp_path):
    result, _, sp, looks = soak_until_decided(tmp_path, ttft_of(0.3, 0.0, 0.2), max_rounds=20)
    ext = result.extension
    assert result.complete and len(result.rows) == 20 and not ext.decided and ext.rounds == 20
    assert looks == list(range(12, 21)) and ext.looks[-1] == (20, ("latency",))
    v = latency_verdict(analyze(result, sp), load_profile(str(REPO / "tests" / "data" / "fake-vllm.yaml")))
    assert v.status is Status.INCONCLUSIVE, v.message
    assert ("undecided at soak.max_duration after 18 measured rounds (1,200 s of at most 1,200 s; 10 planned, "
            "extended 8 rounds while soak/latency's interval straddled its ceiling; each look judged at 99.44%: 95% "
            "split over 9 looks)") in v.message, v.message
    assert v.cause.startswith("the soak is too short to decide even extended to soak.max_duration (1,200 s, 18 measured "
                              "rounds): the 99.44% interval is "), v.cause
    need = re.search(r"~(\d+) measured rounds \(([\d,]+) s; soak.max_duration=(\d+)s with the 2 warm-up rounds\)", v.cause)
    assert need and int(need[1]) > 18 and int(need[3]) == (int(need[1]) + 2) * 60, v.cause


def test_a_drift_fails_within_the_extension(tmp_path):
    # 800 ms/h of drift in +-20 ms of scatter: at 10 measured rounds the interval straddles 300 ms/h
    result, _, sp, _ = soak_until_decided(tmp_path, ttft_of(0.05, 800.0, 0.02))
    ext = result.extension
    assert ext.looks[0] == (12, ("latency",)) and ext.decided and 12 < len(result.rows) < 30, ext
    v = latency_verdict(analyze(result, sp), load_profile(str(REPO / "tests" / "data" / "fake-vllm.yaml")))
    assert v.status is Status.FAIL and v.limit == 300 and v.measured == pytest.approx(800 * 1.08, rel=0.1), v.message
    assert "preemption/placement: TTFT p95 rising while retained memory flat" in v.message
    assert f"decided after {len(result.rows) - 2} measured rounds" in v.message


def test_without_a_judge_or_max_duration_only_the_planned_rounds_run(tmp_path):
    p, _ = extending(30)

    async def go(clock):
        s = Samplers(flat_memory(clock), Metrics(clock, lambda t: 0.0), None, None)
        return await SoakRunner(p, sender(clock, ttft_of(0.3, 0.0, 0.2)), s, requests=no_requests,
                                clock=clock).run()

    result = run_virtual(go)
    assert result.complete and len(result.rows) == 12 and result.extension is None
    assert spec().looks == 1 and spec().look_confidence == 0.95


def test_max_duration_below_duration_is_refused_and_soak_duration_lifts_it():
    with pytest.raises(ValueError, match=r"max_duration 600 s is shorter than duration 720 s: .* must be >= duration"):
        spec(max_duration="10m")
    s = spec(max_duration="30m")
    assert (s.rounds, s.max_rounds, s.looks) == (12, 30, 19)
    assert s.with_duration("20m").max_duration_s == 1800  # still above the new duration: kept
    lifted = s.with_duration("40m")
    assert lifted.max_duration_s == 2400 and lifted.looks == 1  # lifted to the new duration: no extension
    assert spec().with_duration("20m").max_duration is None  # not set: follows duration
