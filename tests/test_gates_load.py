"""Load-gate decisions on synthetic observations: INVALID when the client starved, preemptions
judged against the allowance, missing /metrics noted rather than crashing."""

from __future__ import annotations

from kvgate.load import LoadResult, RequestRecord
from kvgate.gates.load import concurrent_long_verdict, latency_verdict, workloads_missing
from kvgate.http.metrics import MetricsTrace
from kvgate.profile.models import load_profile
from kvgate.load.scenarios import LoadObservation
from kvgate.verdict import Status


def rec(i, tokens=8, status=200):
    r = RequestRecord(index=i, scheduled_s=0.0, sent_s=0.0, first_byte_s=0.01, end_s=0.2, status=status,
                      content_type="text/event-stream")
    r.finalized = True
    r.first_token_s, r.content_s, r.chunk_s, r.tokens = 0.05, [0.05 + k * 0.01 for k in range(tokens)], [], tokens
    return r


def obs(records, loop_lag=(), trace=None):
    result = LoadResult("closed", records, len(records), 0.2, 60.0, loop_lag_s=list(loop_lag))
    trace = trace or MetricsTrace(samples=[(0.0, {"running": 0, "waiting": 0, "kv_usage": 0.0, "preemptions": 5.0}),
                                           (1.0, {"running": 2, "waiting": 0, "kv_usage": 0.4, "preemptions": 5.0})])
    return LoadObservation("concurrent-long (batch)", result, trace, 200, 8, 2)


PROFILE = load_profile("tests/data/fake-vllm.yaml")


def test_healthy_run_passes_and_names_numbers():
    v = concurrent_long_verdict(obs([rec(0), rec(1)]), PROFILE)
    assert v.status is Status.PASS and "preemptions 0 (allowed 0)" in v.message and "peak KV usage 40%" in v.message


def test_starved_client_is_invalid_not_pass_or_fail():
    v = concurrent_long_verdict(obs([rec(0), rec(1, status=500)], loop_lag=[0.5] * 10), PROFILE)
    assert v.status is Status.INVALID and "client fell behind" in v.message and "not judged" in v.message
    v2 = latency_verdict(obs([rec(0), rec(1)], loop_lag=[0.5] * 10), PROFILE)
    assert v2.status is Status.INVALID


def test_preemptions_over_allowance_fail():
    trace = MetricsTrace(samples=[(0.0, {"running": 0, "waiting": 0, "kv_usage": 0.0, "preemptions": 0.0}),
                                  (1.0, {"running": 1, "waiting": 1, "kv_usage": 1.0, "preemptions": 3.0})])
    v = concurrent_long_verdict(obs([rec(0), rec(1)], trace=trace), PROFILE)
    assert v.status is Status.FAIL and "3 preemptions (allowed 0)" in v.message


def test_no_metrics_is_noted_not_a_crash():
    trace = MetricsTrace(samples=[(0.0, {k: None for k in ("running", "waiting", "kv_usage", "preemptions")})],
                         available=False)
    v = concurrent_long_verdict(obs([rec(0), rec(1)], trace=trace), PROFILE)
    assert v.status is Status.PASS and "n/a (no /metrics)" in v.message


def test_wrong_token_count_fails():
    v = concurrent_long_verdict(obs([rec(0), rec(1, tokens=5)]), PROFILE)
    assert v.status is Status.FAIL and "[5] tokens instead of 8" in v.message


def tagged(i, tag, sent, first, end):
    r = rec(i)
    r.tag, r.scheduled_s, r.sent_s, r.first_token_s, r.end_s = tag, sent, sent, first, end
    r.content_s = [first + k * 0.01 for k in range(8)]
    return r


def mixed_run(short_first_token):
    """Two waves: 2 longs sent at the wave start (ending 1.0 s later), 4 shorts just after."""
    rs = []
    for w in range(2):
        t = w * 2.0
        rs += [tagged(len(rs), "long", t, t + 0.4, t + 1.0) for _ in range(2)]
        rs += [tagged(len(rs), "short", t + 0.01 * (j + 1), short_first_token(t), t + 1.5) for j in range(4)]
    return rs


def test_head_of_line_counts_shorts_that_waited_for_a_long_to_complete():
    from kvgate.gates.load import head_of_line
    ok = head_of_line(mixed_run(lambda t: t + 0.5))  # first token while the longs still decode
    assert ok["judged"] == 8 and ok["blocked"] == 0 and ok["lead_ms"][0] == 500.0
    bad = head_of_line(mixed_run(lambda t: t + 1.1))  # only after the longs completed
    assert bad["blocked"] == 8 and bad["share"] == 1.0 and bad["lead_ms"][0] == -100.0
    alone = head_of_line([tagged(0, "short", 0.0, 0.1, 0.2)])  # no long in flight: not judged
    decoding = head_of_line([tagged(0, "long", 0.0, 0.1, 0.5), tagged(1, "short", 0.2, 0.6, 0.7)])
    assert decoding["judged"] == 0  # the long was already decoding: its completion blocks nobody
    assert alone == {"judged": 0, "blocked": 0, "share": None, "lead_ms": []}


def test_interference_fails_head_of_line_blocking_even_within_the_slo():
    from kvgate.gates.load import interference_verdict
    loose = PROFILE.model_copy(update={"slo": PROFILE.slo.model_copy(update={"short_ttft_p95_ms": 5000})})
    alone = LoadObservation("short alone", LoadResult("closed", [tagged(i, "short", 0.0, 0.05, 0.1) for i in range(4)],
                                                      4, 0.4, 60.0), MetricsTrace(samples=[]), 16, 8, 1)

    def mixed(fn):
        return LoadObservation("mixed", LoadResult("open", mixed_run(fn), 12, 3.0, 60.0), MetricsTrace(samples=[]),
                               16, 8, 6, extra={"long_per_wave": 2, "long_prompt_tokens": 200, "waves": 2})

    v = interference_verdict(alone, mixed(lambda t: t + 1.1), loose)
    assert v.status is Status.FAIL, v.message
    assert "head-of-line blocking: 8 of 8 short requests got their first token only after a long request queued ahead" in v.message
    assert "(median 100 ms after it; allowed: under 75%)" in v.message
    assert v.evidence["head_of_line"]["blocked"] == 8
    good = interference_verdict(alone, mixed(lambda t: t + 0.5), loose)
    # 8 shorts within the SLO: no head-of-line blocking, and too few for a p95 PASS (59 at 95%)
    assert good.status is Status.INCONCLUSIVE, good.message
    assert "no head-of-line blocking (0 of 8 short requests" in good.message
    assert "short-request TTFT while long prefills run p95 490 ms, 95% bounds 480 ms..none (fewer than 59 samples: " \
        "no PASS possible) (n=8; 0 over) straddle 5,000 ms -> INCONCLUSIVE" in good.message, good.message


def test_interference_with_no_short_sample_is_invalid_and_the_slo_clause_needs_a_shown_fail():
    # F13: shorts answered 200 but never got a first token: was FAIL "SLO broken, the short workload suffers"
    from kvgate.gates.load import interference_verdict
    loose = PROFILE.model_copy(update={"slo": PROFILE.slo.model_copy(update={"short_ttft_p95_ms": 5000})})
    alone = LoadObservation("short alone", LoadResult("closed", [tagged(i, "short", 0.0, 0.05, 0.1) for i in range(4)],
                                                      4, 0.4, 60.0), MetricsTrace(samples=[]), 16, 8, 1)
    rs = mixed_run(lambda t: t + 0.5)
    for r in rs:
        if r.tag == "short":
            r.first_token_s, r.content_s = None, []
    mixed = LoadObservation("mixed", LoadResult("open", rs, 12, 3.0, 60.0), MetricsTrace(samples=[]), 16, 8, 6,
                            extra={"long_per_wave": 2, "long_prompt_tokens": 200, "waves": 2})
    v = interference_verdict(alone, mixed, loose)
    assert v.status is Status.INVALID, v.message
    assert "no short request got a first token (8 sent, 0 failed): the short workload was not measured -> INVALID" \
        in v.message and "broken" not in v.message
    # head-of-line blocking FAILs within the SLO without claiming the SLO broken (the p95 is not shown above it)
    hol = LoadObservation("mixed", LoadResult("open", mixed_run(lambda t: t + 1.1), 12, 3.0, 60.0),
                          MetricsTrace(samples=[]), 16, 8, 6,
                          extra={"long_per_wave": 2, "long_prompt_tokens": 200, "waves": 2})
    tight = PROFILE.model_copy(update={"slo": PROFILE.slo.model_copy(update={"short_ttft_p95_ms": 1085})})
    f = interference_verdict(alone, hol, tight)  # p95 1,090 ms > 1,085 on the point; lower bound 1,080: not shown
    assert f.status is Status.FAIL and "head-of-line blocking" in f.message, f.message
    assert "broken" not in f.message, f.message


def test_a_profile_without_a_long_or_short_workload_skips_the_gates_that_load_with_it():
    """A profile that declares only short workloads: the long-sequence and interference gates SKIP
    naming what is missing (they used to end in a harness ERROR, ScenarioError); the SLO gate runs."""
    shorts = {n: w for n, w in PROFILE.workloads.items() if not w.long}
    only_short = PROFILE.model_copy(update={"workloads": shorts})
    assert workloads_missing(PROFILE, "long-sequences") is None and workloads_missing(only_short, "slo") is None
    for case, gate in (("long-sequences", "concurrency/long-sequences"), ("interference", "latency/interference")):
        v = workloads_missing(only_short, case)
        assert v is not None and v.gate == gate and v.status is Status.SKIP
        assert "declares no long workload (workloads.*.long: true)" in v.message and v.message.endswith("-> SKIP")
    only_long = PROFILE.model_copy(update={"workloads": {n: w for n, w in PROFILE.workloads.items() if w.long},
                                           "slo": PROFILE.slo.model_copy(update={"workload": None})})
    v = workloads_missing(only_long, "slo")
    assert v is not None and "declares no short workload" in v.message


# ------------------------------------------------------------------ traffic replays
def sample_file(tmp_path, rows, name="trace.jsonl"):
    import json
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def replay_profile(tmp_path, rows, **traffic):
    """fake-vllm's profile with its chat workload replaying ``rows`` (a JSONL sample in tmp_path)."""
    import yaml
    path = sample_file(tmp_path, rows)
    data = {"extends": str(PROFILE.source), "slo": {"requests": 64},
            "workloads": {"chat": {"prompt_tokens": 16, "prompt_tokens_p99": 40, "output_tokens": 8, "concurrency": 2,
                                   "traffic": {"path": path.name, **traffic}}}}
    prof = tmp_path / "replay.yaml"
    prof.write_text(yaml.safe_dump(data))
    return load_profile(str(prof))


def burst_rows(burst=True):
    """20 requests at 5 req/s over 3.8 s, plus (``burst``) 30 more at 2.0-2.29 s (two of the 20 are
    due in it too)."""
    rows = [{"prompt_tokens": 20 + i, "output_tokens": 8, "arrival_s": 100 + i * 0.2} for i in range(20)]
    if burst:
        rows += [{"prompt_tokens": 30, "output_tokens": 8, "arrival_s": 102.0 + j * 0.01} for j in range(30)]
    return rows


def replayed_obs(profile, ttft_of=lambda off: 0.05, turns=None):
    """A latency observation of ``profile``'s chat replay: each planned request sent on time,
    first token ``ttft_of(offset)`` s later."""
    from kvgate.load.scenarios import Traffic
    from kvgate.traffic.replay import ReplayResult, plan_replay
    from kvgate.traffic.sample import sample_for
    sample = sample_for(profile, "chat")
    plan = plan_replay(sample, profile.workloads["chat"].traffic, profile.slo.concurrency, profile.slo.requests)
    recs = []
    for i, it in enumerate(plan.items):
        off = it.offset_s or 0.0  # closed loop: no schedule
        r = tagged(i, "slo", off, off + ttft_of(off), off + ttft_of(off) + 0.1)
        recs.append(r)
    result = LoadResult("open", recs, len(recs), max(r.end_s for r in recs), 60.0)
    t = Traffic("chat", sample, plan, profile.engine.max_model_len, profile.limits.max_tokens_cap)
    t.replay = ReplayResult(plan, result, turns or [])
    return LoadObservation("latency (chat, replayed)", result, MetricsTrace(samples=[]), 20, 8, 2, traffic=t)


def test_busiest_window_finds_the_burst_and_not_a_steady_schedule():
    from kvgate.gates.load import busiest_window
    steady = busiest_window([i * 0.5 for i in range(60)])
    assert steady is not None and not steady["burst"] and steady["window_s"] == 5.0
    ts = [i * 0.5 for i in range(60)] + [12.0 + j * 0.028 for j in range(40)]  # 40 requests in 1.1 s at 12 s
    w = busiest_window(ts)
    assert w["burst"] and w["mean_rps"] == len(ts) / 29.5 and w["outside_rps"] < 2.1
    # trimmed to the bunch: the steady arrivals 0.5 s apart around it are left out, those within it stay
    assert (w["start_s"], round(w["end_s"], 3), w["requests"]) == (12.0, 13.092, 43)
    assert busiest_window([1.0]) is None and busiest_window([2.0, 2.0]) is None
    at_once = busiest_window([0.0] * 10 + [20.0])
    assert at_once["requests"] == 10 and at_once["rate_rps"] is None and at_once["burst"]


def test_latency_fail_names_the_burst_the_over_slo_requests_arrived_in(tmp_path):
    from kvgate.gates.load import latency_verdict
    prof = replay_profile(tmp_path, burst_rows())
    # the requests due in the burst (2.0-2.29 s) wait in a queue: first token 0.6-1.5 s late
    obs = replayed_obs(prof, ttft_of=lambda off: 0.6 + (off - 2.0) * 3 if 2.0 <= off < 2.3 else 0.05)
    v = latency_verdict(obs, prof)
    assert v.status is Status.FAIL, v.message
    assert v.message.startswith("replayed 50 of 50 requests of trace.jsonl (sha256 ")
    assert "open loop at 1x): prompt p50/p99 30/39 tokens (declared 16/40), output p50/p99 8/8 tokens (declared 8)" \
        in v.message
    assert "TTFT p95 1,397 ms, 95% lower bound 1,320 ms (n=50; 32 over) > 500 ms -> FAIL; 32 of the 32 over-SLO " \
        "requests arrived in the burst at 2.0-2.3 s (32 requests in 0.29 s, 110 req/s vs 13.2 req/s mean)" in v.message, v.message
    ev = v.evidence["traffic"]
    assert ev["plan"]["drawn"] == 50 and ev["plan"]["sha256"] == obs.traffic.sample.sha256
    assert ev["busiest_window"]["burst"] and ev["burst_share"]["TTFT"]["over_in"] == 32


def test_latency_fail_outside_the_burst_does_not_blame_it(tmp_path):
    from kvgate.gates.load import latency_verdict
    prof = replay_profile(tmp_path, burst_rows())
    v = latency_verdict(replayed_obs(prof, ttft_of=lambda off: 0.9), prof)  # slow everywhere
    assert v.status is Status.FAIL and "TTFT p95 900 ms, 95% lower bound 900 ms (n=50; 50 over) > 500 ms" in v.message
    assert "burst" not in v.message, v.message


def test_latency_on_the_replay_without_the_burst_names_the_sample_and_its_20_requests_cannot_pass(tmp_path):
    from kvgate.gates.load import latency_verdict
    prof = replay_profile(tmp_path, burst_rows(burst=False))
    v = latency_verdict(replayed_obs(prof), prof)
    assert v.status is Status.INCONCLUSIVE, v.message
    assert "TTFT p95 50 ms, 95% bounds 50 ms..none (fewer than 59 samples" in v.message
    assert "replayed 20 of 20 requests of trace.jsonl" in v.message and "burst" not in v.message
    assert v.evidence["traffic"]["busiest_window"]["burst"] is False


def test_a_replay_of_part_of_the_sample_names_the_replayed_requests_percentiles_too(tmp_path):
    """max_requests 10 of 20: the message gives the sample's percentiles, then the ten replayed
    (prompts 20..29), which are what the SLO was judged on."""
    from kvgate.gates.load import latency_verdict
    prof = replay_profile(tmp_path, burst_rows(burst=False), max_requests=10)
    v = latency_verdict(replayed_obs(prof), prof)
    assert v.message.startswith("replayed 10 of 20 requests of trace.jsonl (sha256 "), v.message
    assert ("prompt p50/p99 29/39 tokens (declared 16/40), output p50/p99 8/8 tokens (declared 8); the 10 replayed: "
            "prompt p50/p99 24/29, output p50/p99 8/8 tokens: TTFT p95") in v.message, v.message
    whole = latency_verdict(replayed_obs(replay_profile(tmp_path, burst_rows(burst=False))), prof)
    assert "replayed:" not in whole.message


def test_a_sample_without_token_counts_says_its_lengths_are_estimated(tmp_path):
    import json
    import yaml
    from kvgate.gates.load import latency_verdict
    convs = [{"id": f"c{i}", "conversations": [{"from": "human", "value": "word " * (4 + i)},
                                                {"from": "gpt", "value": "ok " * 3}]} for i in range(4)]
    (tmp_path / "sg.json").write_text(json.dumps(convs))
    data = {"extends": str(PROFILE.source), "workloads": {"chat": {
        "prompt_tokens": 16, "output_tokens": 8, "concurrency": 2, "traffic": {"path": "sg.json", "replay": "closed"}}}}
    (tmp_path / "sg.yaml").write_text(yaml.safe_dump(data))
    prof = load_profile(str(tmp_path / "sg.yaml"))
    v = latency_verdict(replayed_obs(prof), prof)
    assert ("(sha256 " in v.message and "closed loop at concurrency 2; lengths estimated at UTF-8 bytes / 4, the file "
            "has no token counts): prompt p50/p99") in v.message, v.message
    assert "estimated" not in latency_verdict(replayed_obs(replay_profile(tmp_path, burst_rows(False))), prof).message


def test_a_metrics_sample_is_replayed_as_quantile_rows_not_requests(tmp_path):
    import yaml
    from kvgate.gates.load import latency_verdict
    from .conftest import REPO
    (tmp_path / "m.txt").write_text((REPO / "tests" / "data" / "traffic" / "metrics.txt").read_text())
    data = {"extends": str(PROFILE.source), "workloads": {"chat": {
        "prompt_tokens": 16, "output_tokens": 8, "concurrency": 2, "traffic": {"path": "m.txt", "replay": "closed"}}}}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    prof = load_profile(str(tmp_path / "m.yaml"))
    v = latency_verdict(replayed_obs(prof), prof)
    assert v.message.startswith("replayed 8 of 200 quantile rows (standing for 100 requests) of m.txt"), v.message


def test_a_replay_the_client_could_not_keep_up_with_is_invalid_naming_the_sample_and_the_speedup(tmp_path):
    """An open loop sped up 1000x: every request sent 0.2 s late -> INVALID, naming what was
    replayed and the speed-up to lower (not only 'run kvgate on other CPUs')."""
    from kvgate.gates.load import latency_verdict
    prof = replay_profile(tmp_path, burst_rows(burst=False), speedup=1000)
    obs = replayed_obs(prof)
    for r in obs.result.records:
        r.sent_s = r.scheduled_s + 0.2
    v = latency_verdict(obs, prof)
    assert v.status is Status.INVALID, v.message
    assert "; replayed 20 of 20 requests of trace.jsonl (sha256 " in v.message and "open loop at 1000x" in v.message
    assert "lower workloads.chat.traffic.speedup (1000x) or run kvgate on CPUs" in v.message, v.message
    assert v.evidence["traffic"]["plan"]["speedup"] == 1000


def test_later_turns_cache_effect_in_message_and_evidence(tmp_path):
    from kvgate.gates.load import later_turns, latency_verdict
    prof = replay_profile(tmp_path, burst_rows(burst=False))
    turns = [{"turn": 0, "requests": 8, "cached_tokens_mean": 0.0, "ttft_p50_ms": 48.0},
             {"turn": 1, "requests": 8, "cached_tokens_mean": 272.0, "ttft_p50_ms": 30.0},
             {"turn": 2, "requests": 4, "cached_tokens_mean": 410.0, "ttft_p50_ms": 32.0}]
    v = latency_verdict(replayed_obs(prof, turns=turns), prof)
    assert v.status is Status.INCONCLUSIVE  # 20 requests: no p95 PASS possible
    assert "; later turns (12 requests): cached_tokens mean 318, TTFT p50 30 ms (first turns: cached_tokens mean 0, " \
        "TTFT p50 48 ms) -> INCONCLUSIVE" in v.message, v.message
    assert v.evidence["traffic"]["turns"] == turns and v.evidence["traffic"]["later_turns"]["later"]["requests"] == 12
    one = [{"turn": 0, "requests": 2, "ttft_p50_ms": 4.0}, {"turn": 1, "requests": 1, "ttft_p50_ms": 3.0}]
    assert "; later turns (1 request): " in latency_verdict(replayed_obs(prof, turns=one), prof).message
    assert later_turns([{"turn": 0, "requests": 3}]) is None and later_turns([]) is None
    assert later_turns([{"turn": 1, "requests": 2, "cached_tokens_mean": None}])["later"]["cached_tokens_mean"] is None


def test_later_turns_ttft_p50_is_over_the_requests_when_the_replay_measured_it():
    """Turn 1 of six requests at ~64 ms and turns 2-4 of one or two each: the median of the turns'
    p50s (63.8, the lower median of 53.2/63.8/71.6/72.6) is not the p50 of the ten later requests
    (62.6); the replay's cache summary has that one."""
    from kvgate.gates.load import later_turns
    turns = [{"turn": 0, "requests": 22, "cached_tokens_mean": 116.4, "ttft_p50_ms": 51.4},
             {"turn": 1, "requests": 6, "cached_tokens_mean": 490.7, "ttft_p50_ms": 63.8},
             {"turn": 2, "requests": 2, "cached_tokens_mean": 640.0, "ttft_p50_ms": 72.6},
             {"turn": 3, "requests": 1, "cached_tokens_mean": 768.0, "ttft_p50_ms": 53.2},
             {"turn": 4, "requests": 1, "cached_tokens_mean": 896.0, "ttft_p50_ms": 71.6}]
    est = later_turns(turns)
    assert est["later"]["ttft_p50_ms"] == 63.8 and est["later"]["cached_tokens_mean"] == 588.8
    got = later_turns(turns, {"ttft_p50_ms_first": 51.4, "ttft_p50_ms_later": 62.6})
    assert got["later"] == {"requests": 10, "cached_tokens_mean": 588.8, "ttft_p50_ms": 62.6}
    assert got["first"]["ttft_p50_ms"] == 51.4


def test_a_sample_that_does_not_fit_fails_before_anything_is_sent(tmp_path):
    """A sample with requests over max_model_len (256 on the fake's profile): every load gate FAILs
    naming the p99, the limit and the file, and the scenario sends nothing -- no /tokenize, no
    completion, no /metrics scrape (the client and the endpoint refuse any use)."""
    from kvgate.gates.load import concurrent_long_verdict, interference_verdict, latency_verdict
    from kvgate.load.scenarios import run_interference, run_latency

    rows = [{"prompt_tokens": 100, "output_tokens": 8}] * 90 + [{"prompt_tokens": 300, "output_tokens": 8}] * 10
    prof = replay_profile(tmp_path, rows, replay="closed")

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"sent something: {name}")

    obs = run_latency(Untouchable(), Untouchable(), prof)
    assert obs.result.records == [] and obs.traffic.replay is None
    v = latency_verdict(obs, prof)
    assert v.status is Status.FAIL and v.measured == 300 and v.limit == 248, v.message
    assert v.message.startswith("traffic sample trace.jsonl (sha256 ") and "workloads.chat.traffic): prompt p99 300 " \
        "tokens > 248 (max_model_len 256 - 8 p99 output tokens); 10 of 100 requests (10%) do not fit as recorded " \
        "(prompt + output over max_model_len 256 or output over the max_tokens cap 64), the first on line 91 -> FAIL; " \
        "nothing was sent" in v.message, v.message
    alone, mixed = run_interference(Untouchable(), Untouchable(), prof)
    assert interference_verdict(alone, mixed, prof).status is Status.FAIL
    assert concurrent_long_verdict(obs, prof).message == v.message.replace("latency/slo", "concurrency/long-sequences")


def test_concurrent_long_replay_compares_each_request_with_its_recorded_output(tmp_path):
    from kvgate.load.scenarios import Traffic
    from kvgate.traffic.replay import ReplayResult, plan_replay
    from kvgate.traffic.sample import sample_for
    prof = replay_profile(tmp_path, [{"prompt_tokens": 200, "output_tokens": 8}, {"prompt_tokens": 180,
                                                                                  "output_tokens": 5}], replay="closed")
    sample = sample_for(prof, "chat")
    plan = plan_replay(sample, prof.workloads["chat"].traffic, 2, 4)

    def run(tokens):
        result = LoadResult("closed", [rec(i, tokens=k) for i, k in enumerate(tokens)], len(tokens), 0.2, 60.0)
        t = Traffic("chat", sample, plan, 256, 64, replay=ReplayResult(plan, result))
        return concurrent_long_verdict(LoadObservation("concurrent-long (chat, replayed)", result, obs([]).trace,
                                                       190, 8, 2, traffic=t), prof)

    want = sorted(max(1, it.trace.output_tokens) for it in plan.items)
    good = run(want[::-1])
    assert good.status is Status.PASS, good.message
    assert good.message.startswith("2 long sequences at concurrency 2, replayed 2 of 2 requests of trace.jsonl")
    assert "2/2 completed 200 with their recorded output tokens" in good.message
    assert good.evidence["traffic"]["plan"]["mode"] == "closed"
    bad = run([*want[:-1], 7])
    assert bad.status is Status.FAIL and "1 completed with [7] tokens instead of their recorded output" in bad.message


def test_an_error_allowance_is_judged_on_clopper_pearson_bounds_both_ways():
    # F10: slo.error_rate_max 0.05 -- 1 failed of 40 (2.5%) is not shown within 5% (upper bound 11.3%) nor above it:
    # no PASS on the point; 12 of 40 (30%, lower bound 18.3%) FAILs; the zero allowance stays a count
    from kvgate.load.sampling import judge_errors, with_failures
    prof = PROFILE.model_copy(update={"slo": PROFILE.slo.model_copy(update={"error_rate_max": 0.05})})
    one = [rec(i) for i in range(39)] + [rec(39, status=500)]
    v = latency_verdict(obs(one), prof)
    assert v.status is not Status.PASS, v.message
    part = next(p for p in v.parts if p.gate.endswith("error rate"))
    assert part.status is Status.INCONCLUSIVE and part.message == \
        "error rate 1/40 requests = 2.5%, 95% bounds 0.1%..11.3% straddle 5.0% -> INCONCLUSIVE", part.message
    many = [rec(i) for i in range(28)] + [rec(28 + i, status=500) for i in range(12)]
    f = latency_verdict(obs(many), prof)
    assert f.status is Status.FAIL and "error rate 12/40 requests = 30.0%, 95% lower bound 18.31% > 5.0% -> FAIL" \
        in f.message, f.message
    assert judge_errors(one, PROFILE.slo, 0.95).decision == "FAIL"  # error_rate_max 0: one error FAILs
    # failed requests count as exceedances in the TTFT/e2e samples when an allowance lets them through
    assert with_failures([50.0, 60.0], one, prof.slo) == [50.0, 60.0, float("inf")]
    assert with_failures([50.0, 60.0], one, PROFILE.slo) == [50.0, 60.0]


# ----------------------------------------------------------------- F11: the FAIL side over the metrics

def _sim_three(rng, n: int, ttft_p95: float, gap_p95: float, c: int = 4) -> list:
    """``n`` successful requests, independent: TTFT lognormal (sigma 0.5) with p95 ``ttft_p95``,
    7 independent gaps lognormal with p95 ``gap_p95`` (ms); e2e = TTFT + the gaps."""
    import math

    import numpy as np
    z95, sig = 1.6448536269514722, 0.5
    t = np.exp(math.log(ttft_p95) - sig * z95 + sig * rng.standard_normal(n))
    g = np.exp(math.log(gap_p95) - sig * z95 + sig * rng.standard_normal((n, 7)))
    out = []
    for i in range(n):
        sent = (i // c) * 20.0
        times = [sent + t[i] / 1e3]
        for x in g[i]:
            times.append(times[-1] + float(x) / 1e3)
        r = RequestRecord(index=i, scheduled_s=sent, sent_s=sent, first_byte_s=times[0], end_s=times[-1] + 1e-4,
                          status=200, content_type="text/event-stream")
        r.finalized = True
        r.first_token_s, r.content_s, r.chunk_s, r.tokens, r.done = times[0], times, list(times), len(times), True
        out.append(r)
    return out


def _three_at(monkeypatch, e2e_factor: float = 1.0, ttft_factor: float = 1.0, gap_factor: float = 1.0,
              budget: float | None = None):
    """smollm2-cpu with TTFT 3,000 / ITL 1,500 / e2e at its simulated true p95 (all three SLO'd;
    ``verdicts.false_alarm_budget`` ``budget``, none by default: the metrics' correction alone),
    the gate's own plan and verdict at every planned look (a FAIL or PASS stops, as the loop). ITL's
    gaps are independent here, so its bound is the order statistic over the gaps (exact for them;
    the cluster bootstrap's coverage is tests/test_itl.py's) -- 0.25 s a run less."""
    import numpy as np

    import kvgate.load.sampling as sampling
    from kvgate.load.scenarios import latency_plan
    from kvgate.stats.confidence import Sampling, judge
    monkeypatch.setattr(sampling, "judge_pooled", lambda clusters, q, limit, conf, pconf, rng=0, scale=1.0, waves=None:
                        judge([g * scale for c_ in clusters for g in c_], q, limit, conf, pconf))
    base = load_profile("smollm2-cpu")
    big = np.random.default_rng(1)
    e2e_true = float(np.percentile([(r.content_s[-1] - r.sent_s) * 1e3 for r in _sim_three(big, 20000, 3000.0, 1500.0)], 95))
    prof = base.model_copy(update={"slo": base.slo.model_copy(update={
        "ttft_p95_ms": 3000.0, "itl_p95_ms": 1500.0, "e2e_p95_ms": e2e_true / e2e_factor}),
        "verdicts": base.verdicts.model_copy(update={"false_alarm_budget": budget})})
    plan = latency_plan(prof)

    def run(rng) -> Status:
        recs = _sim_three(rng, plan.looks[-1], 3000.0 * ttft_factor, 1500.0 * gap_factor)
        status, history = Status.INCONCLUSIVE, []
        for k, n in enumerate(plan.looks):
            history.append({"n": n, "decisions": {}, "t_s": 0.0})
            s = Sampling(plan, history=list(history), n=n, why_stopped="cap" if k == len(plan.looks) - 1 else "decided")
            res = LoadResult("closed", recs[:n], n, recs[n - 1].end_s, 600.0, concurrency=4)
            trace = MetricsTrace(samples=[(0.0, {"running": 1, "waiting": 0, "kv_usage": 0.1, "preemptions": 0.0}),
                                          (1.0, {"running": 1, "waiting": 0, "kv_usage": 0.1, "preemptions": 0.0})])
            v = latency_verdict(LoadObservation("latency (sim)", res, trace, 64, 8, 4, sampling=s), prof)
            status = v.status
            if status != Status.INCONCLUSIVE:
                break
        return status, v
    return run, prof


def test_three_metrics_at_their_limits_keep_the_gates_wrong_fail_rate(monkeypatch):
    """F11: TTFT, ITL and e2e each exactly at its limit; the gate FAILs when any one FAILs, so each
    metric's FAIL side is at 1 - 0.0125/3 per look (98.75% -> 99.58%); the gate's
    own plan and verdict (200 seeded runs): wrong FAIL within 5% (+ 3 Monte-Carlo SE): 5/200 = 2.5%;
    the same runs uncorrected (each at 98.75%) 16/200 = 8.0%. The evidence states m and the levels."""
    import numpy as np
    run, prof = _three_at(monkeypatch)
    rng = np.random.default_rng(4811)
    got = [run(rng) for _ in range(200)]
    fails = sum(1 for s, _ in got if s == Status.FAIL)
    print(f"wrong FAIL {fails}/200")
    assert fails / 200 <= 0.05 + 3 * (0.05 * 0.95 / 200) ** 0.5, fails
    v = got[0][1]
    m = v.evidence["multiplicity"]
    assert m["metrics"] == 3 and abs(m["fail_level"] - (1 - 0.0125 / 3)) < 1e-12 and m["pass_level"] == 0.9833333333333333


def test_three_metrics_at_their_limits_under_the_main_jobs_budget_fail_within_its_share(monkeypatch):
    """smollm2-cpu's false-alarm budget (0.01 over 9 families): the same three metrics at their
    limits FAIL wrongly within the family's share, 0.11% (+ 3 Monte-Carlo SE: at most 1 of 200;
    measured 0 of 200), each metric's FAIL side at 1 - 0.0111/(4 x 3) a look; the PASS side as
    without the budget."""
    import numpy as np
    run, prof = _three_at(monkeypatch, budget=0.01)
    rng = np.random.default_rng(4811)
    got = [run(rng) for _ in range(200)]
    fails = sum(1 for s, _ in got if s == Status.FAIL)
    assert fails <= 1, fails
    m = got[0][1].evidence["multiplicity"]
    assert abs(m["fail_level"] - (1 - 0.01 / 9 / 4 / 3)) < 1e-12 and m["pass_level"] == 0.9833333333333333


def test_three_metrics_one_clearly_over_fails_and_all_clearly_under_pass(monkeypatch):
    """The other way: the correction keeps the power -- TTFT at 2x its limit FAILs naming TTFT in
    (nearly) every run; all three at half their limits PASS."""
    import numpy as np
    run, _ = _three_at(monkeypatch, ttft_factor=2.0)
    rng = np.random.default_rng(4812)
    got = [run(rng) for _ in range(20)]
    assert sum(1 for s, _ in got if s == Status.FAIL) >= 19
    assert all("TTFT" in v.message for s, v in got if s == Status.FAIL)
    run_ok, _ = _three_at(monkeypatch, e2e_factor=0.5, ttft_factor=0.5, gap_factor=0.5)
    assert all(run_ok(rng)[0] == Status.PASS for _ in range(10))


def test_failed_requests_are_exceedances_in_the_dependence_path_too():
    """F10 in latency_judgements (the closed loop's TTFT/e2e at the effective n, what the sampling's
    decide and the verdict use): with slo.error_rate_max > 0, 12 failed of 100 are +inf exceedances
    -- the p95 is beyond any limit, TTFT and e2e FAIL (measured on the 88 that finished they PASSed);
    1 failed of 100 still PASSes; an allowance of 0 leaves the sample as measured (the errors FAIL
    by themselves)."""
    import numpy as np

    from kvgate.load.scenarios import latency_judgements
    recs = _sim_three(np.random.default_rng(5), 100, 1000.0, 100.0)
    for r in recs[88:]:
        r.status, r.error = 500, "HTTP 500"
    slo = PROFILE.slo.model_copy(update={"ttft_p95_ms": 3000.0, "e2e_p95_ms": 10000.0, "itl_p95_ms": None,
                                         "error_rate_max": 0.2})
    bad = latency_judgements(recs, slo, 0.95, None, 4)
    assert {k: j.decision for k, j in bad.items()} == {"TTFT": "FAIL", "e2e": "FAIL"}
    assert bad["TTFT"].dependence.n == 100 and bad["TTFT"].judgement.bound.lower == float("inf")
    none = slo.model_copy(update={"error_rate_max": 0.0})
    assert {k: j.decision for k, j in latency_judgements(recs, none, 0.95, None, 4).items()} == \
        {"TTFT": "PASS", "e2e": "PASS"}
    few = _sim_three(np.random.default_rng(5), 100, 1000.0, 100.0)
    few[50].status, few[50].error = 500, "HTTP 500"
    ok = latency_judgements(few, slo, 0.95, None, 4)
    assert {k: j.decision for k, j in ok.items()} == {"TTFT": "PASS", "e2e": "PASS"}
    assert ok["TTFT"].dependence.n == 100


def test_interference_counts_a_deadline_cut_short_as_censored_not_an_error():
    """The waves' sampling decide (load.scenarios.wave_errors): a short cut by kvgate's own wave
    deadline is censored -- errors PASS (it read FAIL, stopping the sampling on a FAIL); a server
    error FAILs."""
    from kvgate.load.scenarios import wave_errors
    cut = rec(3)
    cut.censored, cut.error = True, "deadline: waves' time bound reached"
    assert not cut.ok and wave_errors([rec(0), rec(1), rec(2), cut]) == "PASS"
    assert wave_errors([rec(0), rec(1), rec(2), rec(3, status=500)]) == "FAIL"
