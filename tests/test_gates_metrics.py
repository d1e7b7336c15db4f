"""The metrics gate: pure verdicts on hand-built load steps (scrapes rendered by prometheus_client),
then the suite against the fake: healthy PASSes all four checks, each fault FAILs its own check
(duplicate pid series, a renamed consumed metric, a lying TTFT histogram, /metrics 500 under load),
no /metrics SKIPs."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from kvgate.gates.metrics import (CLIENT_PATH_S, bucket_bounds, consumed, contract_verdict, duplicate_series,
                                  histograms_verdict, metrics_verdict, running_truth_verdict, under_load_verdict)
from kvgate.http.metrics import MetricsScrape
from kvgate.load import LoadResult, RequestRecord
from kvgate.load.scenarios import MetricsStep
from kvgate.profile.models import ConsumedMetric, ProfileError, load_profile
from kvgate.verdict import Status
from kvgate.http.extensions import PROBE_PROMPT
from tests.fakes.fake_vllm import E2E_BUCKETS, TTFT_BUCKETS, FakeConfig, FakeVLLM

from .conftest import REPO, assert_passes_measured
from .test_gates_vs_fake import run_suites

pytest_plugins = ["pytester"]
CT = "text/plain; version=0.0.4; charset=utf-8"
KV = ConsumedMetric(name="vllm:kv_cache_usage_perc", labels=("model_name",))
WAIT = ConsumedMetric(name="vllm:num_requests_waiting")
TTFTS = [0.031, 0.045, 0.052]  # client-measured, s
E2ES = [0.9, 1.1, 1.2]


def expo(running=0.0, waiting=0.0, kv=0.0, ttft=(), e2e=(), kv_name="vllm:kv_cache_usage_perc", kv_help="KV-cache "
         "usage. 1 means 100 percent usage.", pids=1, labels=("model_name", "engine")) -> str:
    """A /metrics body like vLLM 0.32's (the gauges and the two histograms), ``pids`` copies of
    each gauge with a ``pid`` label when > 1 (the first real, the rest 0)."""
    r = CollectorRegistry()
    lv = {"model_name": "m", "engine": "0"}
    glabels = [*labels, "pid"] if pids > 1 else list(labels)
    for name, value, doc in (("vllm:num_requests_running", running, "Running."),
                             ("vllm:num_requests_waiting", waiting, "Waiting."), (kv_name, kv, kv_help)):
        g = Gauge(name, doc, glabels, registry=r)
        for p in range(pids):
            extra = {"pid": str(1000 + p)} if pids > 1 else {}
            g.labels(**{k: lv[k] for k in labels}, **extra).set(value if p == 0 else 0.0)
    for name, obs, buckets in (("vllm:time_to_first_token_seconds", ttft, TTFT_BUCKETS),
                               ("vllm:e2e_request_latency_seconds", e2e, E2E_BUCKETS)):
        h = Histogram(name, "h", ["model_name", "engine"], buckets=buckets, registry=r).labels("m", "0")
        for v in obs:
            h.observe(v)
    return generate_latest(r).decode()


def scrape(t, text, status=200, ctype=CT, took=0.02):
    return MetricsScrape(t, t + took, status, ctype, text if status == 200 else None)


def step(during=None, after=None, before=None, n=3, seqs=8, ttfts=TTFTS, e2es=E2ES, statuses=None):
    """Three streams sent at 0 s, first tokens at ``ttfts``, ends at ``e2es`` (last token 10 ms
    before); scrapes at 0.1 s steps during them."""
    recs = [RequestRecord(index=i, scheduled_s=0.0, sent_s=0.0, status=200, first_token_s=ttfts[i], end_s=e2es[i],
                          content_s=[ttfts[i], e2es[i] - 0.01]) for i in range(n)]
    before = before if before is not None else scrape(0.0, expo())
    if during is None:
        during = [scrape(0.1 * k, expo(running=3, kv=0.05)) for k in range(1, 8)]
    if statuses:
        during = [MetricsScrape(s.sent_s, s.done_s, st, s.content_type, s.text if st == 200 else None)
                  for s, st in zip(during, statuses)]
    after = after if after is not None else scrape(1.3, expo(ttft=ttfts, e2e=e2es))
    return MetricsStep(before, during, after, LoadResult("open", recs, n, 1.2, 60.0), n, seqs, 16, 64, 0.1)


# ---- contract ------------------------------------------------------------------------------------
def test_contract_passes_names_the_series_and_notes_an_unqueued_waiting_gauge():
    v = contract_verdict(step(), [KV, WAIT], "0.32.0")
    assert v.status is Status.PASS, v.message
    assert v.message.startswith("all 2 consumed series (vllm:kv_cache_usage_perc{model_name}, "
                                "vllm:num_requests_waiting) present (server 0.32.0), numeric, labelled and, but for "
                                "1 queue gauge(s) with nothing queued, moving")
    assert "vllm:num_requests_waiting stayed 0: the step queued nothing" in v.message
    assert v.measured == 2 and v.limit == 2 and v.unit == "series"
    assert_passes_measured(v)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


def test_renamed_metric_fails_naming_the_missing_name_and_the_near_match():
    renamed = step(before=scrape(0.0, expo(kv_name="vllm:gpu_cache_usage_perc")))
    v = contract_verdict(renamed, [KV])
    assert v.status is Status.FAIL
    assert ("vllm:kv_cache_usage_perc is absent from /metrics; near match present: vllm:gpu_cache_usage_perc "
            "(renamed? the consumer still reads vllm:kv_cache_usage_perc)") in v.message
    old = contract_verdict(step(), [ConsumedMetric(name="vllm:gpu_cache_usage_perc")])  # a picker on the old name
    assert old.status is Status.FAIL and "near match present: vllm:kv_cache_usage_perc" in old.message
    assert v.measured == 0 and v.limit == 1


def test_missing_label_flat_series_and_nan_fail():
    label = contract_verdict(step(), [ConsumedMetric(name="vllm:kv_cache_usage_perc", labels=("model_name", "pod"))])
    assert label.status is Status.FAIL
    assert "vllm:kv_cache_usage_perc lacks label pod the consumer filters on (its labels: engine, model_name)" \
        in label.message
    flat = contract_verdict(step(during=[scrape(0.1 * k, expo(running=3)) for k in range(1, 8)]), [KV])
    assert flat.status is Status.FAIL and "vllm:kv_cache_usage_perc did not move under the load step: 0 in all 9 " \
        "scrapes" in flat.message
    nan = contract_verdict(step(before=scrape(0.0, expo(kv=float("nan")))), [KV])
    assert nan.status is Status.FAIL and "reads NaN" in nan.message


def test_deprecated_help_is_a_note_in_a_pass():
    dep = expo(kv_help="KV-cache usage. DEPRECATED: use vllm:kv_cache_usage_perc")
    v = contract_verdict(step(before=scrape(0.0, dep)), [KV])
    assert v.status is Status.PASS and "note: vllm:kv_cache_usage_perc's HELP says deprecated" in v.message
    assert v.evidence["deprecated"] == ["vllm:kv_cache_usage_perc"]


def test_histogram_family_is_consumed_by_its_count():
    v = contract_verdict(step(), [ConsumedMetric(name="vllm:e2e_request_latency_seconds")])
    assert v.status is Status.PASS, v.message


def test_consumed_always_holds_the_autoscale_metric(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text(f"extends: {REPO / 'tests/data/fake-vllm.yaml'}\nmetrics:\n  consumed:\n"
                 "    - vllm:kv_cache_usage_perc\n    - {name: vllm:num_requests_running, labels: [model_name]}\n")
    prof = load_profile(str(p))
    assert [(c.name, c.labels) for c in consumed(prof)] == [
        ("vllm:kv_cache_usage_perc", ()), ("vllm:num_requests_running", ("model_name",)),
        ("vllm:num_requests_waiting", ())]
    p.write_text(f"extends: {REPO / 'tests/data/fake-vllm.yaml'}\nmetrics:\n  consumed: [{{labels: [x]}}]\n")
    with pytest.raises(ProfileError, match="metrics.consumed"):
        load_profile(str(p))


# ---- running truth -------------------------------------------------------------------------------
def test_running_truth_passes_with_the_window_and_fails_on_a_wrong_sum():
    v = running_truth_verdict(step())
    assert v.status is Status.PASS, v.message
    assert ("vllm:num_requests_running summed to 3 and vllm:num_requests_waiting to 0 in all 7 scrapes while they "
            "ran (0.05-0.79 s), no per-process duplicates -> PASS") in v.message
    low = running_truth_verdict(step(during=[scrape(0.1 * k, expo(running=2, kv=0.05)) for k in range(1, 8)]))
    assert low.status is Status.FAIL and low.measured == 2 and low.limit == 3
    assert "7 of 7 scrapes while all ran read running 2, waiting 0 at 0.10 s" in low.message
    assert "(the streams make running 3, waiting 0, summed over all series)" in low.message


def test_queued_streams_must_show_as_waiting():
    two = [scrape(0.1 * k, expo(running=2, waiting=1, kv=0.05)) for k in range(1, 8)]
    assert running_truth_verdict(step(during=two, seqs=2)).status is Status.PASS
    v = running_truth_verdict(step(during=[scrape(0.1 * k, expo(running=2, kv=0.05)) for k in range(1, 8)], seqs=2))
    assert v.status is Status.FAIL and "(the streams make running 2, waiting 1" in v.message


def test_per_pid_duplicates_fail_naming_what_an_average_sees():
    dup = [scrape(0.1 * k, expo(running=3, kv=0.5, pids=8)) for k in range(1, 8)]
    v = running_truth_verdict(step(during=dup, before=scrape(0.0, expo(pids=8)),
                                   after=scrape(1.3, expo(ttft=TTFTS, e2e=E2ES, pids=8))))
    assert v.status is Status.FAIL
    assert ("vllm:num_requests_running comes as 8 series differing only by label 'pid': 7 read 0.0 in every scrape, "
            "one peaked at 3 -- an averaging consumer (avg() in a KEDA/Prometheus query, an endpoint picker averaging "
            "a pod's series) sees 3/8 = 0.375") in v.message
    assert "vllm:kv_cache_usage_perc comes as 8 series" in v.message and "0.5/8 = 0.0625" in v.message
    assert duplicate_series(dup, "vllm:num_requests_waiting") is None  # every copy 0: nothing to dilute


def test_no_scrape_in_the_window_is_invalid_and_failed_scrapes_fail():
    v = running_truth_verdict(step(during=[scrape(0.9, expo())]))
    assert v.status is Status.INVALID and "raise metrics.max_tokens" in v.message
    v = running_truth_verdict(step(statuses=[500] * 7))
    assert v.status is Status.FAIL and "no /metrics scrape answered while all 3 streams ran (7 scrapes answered " \
        "500; see metrics/under-load)" in v.message


def test_a_stream_that_failed_fails_every_check_quoting_it():
    st = step()
    st.result.records[1].status, st.result.records[1].error = 0, "refused: the engine stalls streams"
    prof = load_profile(str(REPO / "tests" / "data" / "fake-vllm.yaml"))
    for case in ("contract", "running-truth", "histograms", "under-load"):
        v = metrics_verdict(case, st, prof)
        assert v.status is Status.FAIL and "1 of 3 streams did not complete (refused: the engine stalls streams)" \
            in v.message and v.measured == 2, v.message


def test_a_busy_server_before_the_step_is_invalid_for_the_counts():
    busy = step(before=scrape(0.0, expo(running=1)))
    for verdict in (running_truth_verdict(busy), histograms_verdict(busy)):
        assert verdict.status is Status.INVALID
        assert "the server was not idle before the step (vllm:num_requests_running 1)" in verdict.message


# ---- histograms ----------------------------------------------------------------------------------
def test_bucket_bounds_allow_one_bucket_either_side_plus_the_client_path():
    cum = [(0.001, 0), (0.005, 0), (0.01, 0), (0.02, 0), (0.04, 2), (0.06, 3)]
    assert bucket_bounds(cum, 1) == (0.02, 0.04, 0.01, 0.06 + CLIENT_PATH_S)
    assert bucket_bounds(cum, 3)[3] == float("inf")  # the top bucket: the one above is +Inf
    assert bucket_bounds([(0.001, 3), (0.005, 3)], 1) == (0.0, 0.001, 0.0, 0.005 + CLIENT_PATH_S)
    assert bucket_bounds(cum, 4) is None


def test_histograms_pass_when_the_client_lands_in_the_servers_buckets():
    v = histograms_verdict(step())
    assert v.status is Status.PASS, v.message
    assert "TTFT: count +3, client p50 45 ms in (0.04, 0.06] s, p90 52 ms in (0.04, 0.06] s" in v.message
    assert "e2e latency: count +3, client p50 1,100 ms in (1, 1.5] s" in v.message
    assert v.measured == 3 and v.limit == 3
    assert_passes_measured(v)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


def test_a_ttft_histogram_in_its_lowest_bucket_fails_against_the_clients_20_to_100_ms():
    fast = dict(before=scrape(0.0, expo(), took=0.002),
                during=[scrape(0.1 * k, expo(running=3, kv=0.05), took=0.002) for k in range(1, 8)])
    lies = step(ttfts=[0.02, 0.05, 0.1], after=scrape(1.3, expo(ttft=[0.0005] * 3, e2e=E2ES), took=0.002), **fast)
    v = histograms_verdict(lies)
    assert v.status is Status.FAIL
    assert ("vllm:time_to_first_token_seconds puts the p50 request in (0, 0.001] s, but the client measured TTFT p50 "
            "50 ms (allowed 0 ms to 19 ms: one bucket either side, + 10 ms client path + 2 x 2 ms round trip (the "
            "fastest /metrics scrape))") in v.message


def test_misplaced_percentiles_of_streams_that_arrived_bunched_are_invalid_naming_the_buffering():
    """Behind a buffering proxy the client's TTFT is the proxy's flush (a newcomer measured a FAIL
    blaming the histogram): 32 chunks per stream in 2 reads -> INVALID naming it; the counts are still judged."""
    fast = dict(before=scrape(0.0, expo(), took=0.002),
                during=[scrape(0.1 * k, expo(running=3, kv=0.05), took=0.002) for k in range(1, 8)])
    held = step(ttfts=[0.6, 0.6, 0.6], after=scrape(1.3, expo(ttft=[0.05] * 3, e2e=E2ES), took=0.002), **fast)
    for r in held.result.records:  # two flushes of 16 chunks, each chunk 0.1 ms apart
        r.content_s = [0.6 + i * 0.0001 for i in range(16)] + [1.0 + i * 0.0001 for i in range(16)]
    v = histograms_verdict(held)
    assert v.status is Status.INVALID, v.message
    assert "the streams' 96 content chunks arrived in 6 reads (16 per read): a proxy that buffers the stream" in v.message
    assert v.message.endswith("-> INVALID") and v.evidence["bunched"] == {"chunks": 96, "reads": 6}
    spread = step(ttfts=[0.6, 0.6, 0.6], after=scrape(1.3, expo(ttft=[0.05] * 3, e2e=E2ES), took=0.002), **fast)
    for r in spread.result.records:  # one chunk per read: the client's times are the engine's
        r.content_s = [0.6 + i * 0.01 for i in range(32)]
    assert histograms_verdict(spread).status is Status.FAIL


def test_the_network_round_trip_is_allowed_above_the_servers_buckets():
    # a healthy server behind a gateway / WAN with a 40 ms round trip: the client's TTFT carries a
    # connect and a request round trip the server's histogram does not (measured on the fake behind
    # a 40 ms proxy: client p50 100 ms for a server bucket (0.04, 0.06] s) -- not a lying histogram
    slow = dict(before=scrape(0.0, expo(), took=0.0),  # the scrape before the step is not timed
                during=[scrape(0.1 * k, expo(running=3, kv=0.05), took=0.045 + 0.01 * k) for k in range(1, 8)])
    ttfts = [t + 0.045 for t in TTFTS]
    v = histograms_verdict(step(ttfts=ttfts, after=scrape(1.3, expo(ttft=TTFTS, e2e=E2ES), took=0.041), **slow))
    assert v.status is Status.PASS, v.message
    assert v.evidence["path_allowance_s"] == {"client_path_s": CLIENT_PATH_S, "round_trip_s": 0.041,
                                              "round_trips": 2, "total_s": 0.092}
    # the same client times against a loopback path (2 ms scrapes) are outside the buckets
    fast = dict(before=scrape(0.0, expo(), took=0.002),
                during=[scrape(0.1 * k, expo(running=3, kv=0.05), took=0.002) for k in range(1, 8)])
    v = histograms_verdict(step(ttfts=ttfts, after=scrape(1.3, expo(ttft=TTFTS, e2e=E2ES), took=0.002), **fast))
    assert v.status is Status.FAIL and "+ 2 x 2 ms round trip" in v.message, v.message


def test_a_count_that_is_not_the_requests_sent_fails():
    v = histograms_verdict(step(after=scrape(1.3, expo(ttft=TTFTS[:2], e2e=E2ES))))
    assert v.status is Status.FAIL and "vllm:time_to_first_token_seconds's count rose by 2 for the 3 requests sent" \
        in v.message and v.measured == 2
    fast = histograms_verdict(step(e2es=[5.0, 6.0, 7.0], after=scrape(8, expo(ttft=TTFTS, e2e=E2ES))))
    assert fast.status is Status.FAIL and "e2e latency p50 6,000 ms (allowed 800 ms to 2,050 ms" in fast.message  # client slower than the buckets


# ---- under load ----------------------------------------------------------------------------------
def test_under_load_passes_and_a_500_fails():
    v = under_load_verdict(step())
    assert v.status is Status.PASS and v.message.startswith("GET /metrics answered 200 text/plain to all 7 scrapes")
    bad = under_load_verdict(step(statuses=[200, 500, 500, 200, 200, 200, 200]))
    assert bad.status is Status.FAIL and bad.measured == 5 and bad.limit == 7
    assert "2 of 7 scrapes failed, the first at 0.20 s answered 500, while inference worked (3 of 3 streams " \
        "completed 200)" in bad.message
    html = [scrape(0.1 * k, "<html>", ctype="text/html") for k in range(1, 8)]
    assert "answered 200 text/html" in under_load_verdict(step(during=html)).message
    assert under_load_verdict(step(during=[scrape(0.1, expo())])).status is Status.INVALID
    assert_passes_measured(v)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


def test_no_metrics_skips_every_check_and_a_500_before_fails_them():
    none = MetricsStep(scrape(0.0, None, status=404), [], scrape(0.0, None, status=404), None, 3, 8, 16, 64, 0.1)
    prof = load_profile(str(REPO / "tests" / "data" / "fake-vllm.yaml"))
    for case in ("contract", "running-truth", "histograms", "under-load"):
        v = metrics_verdict(case, none, prof)
        assert v.status is Status.SKIP and v.gate == f"metrics/{case}"
        assert "the endpoint serves no /metrics (GET /metrics answered 404)" in v.message
    # llama.cpp's llama-server without --metrics answers 501 not_supported_error: no /metrics, as a 404
    for absent in (405, 501):
        gone = MetricsStep(scrape(0.0, None, status=absent), [], scrape(0.0, None, status=absent), None, 3, 8, 16, 64,
                           0.1)
        v = metrics_verdict("contract", gone, prof)
        assert v.status is Status.SKIP and f"(GET /metrics answered {absent})" in v.message, v.message
    broken = step(before=scrape(0.0, None, status=500))
    assert "GET /metrics answered 500 before any load -> FAIL" in metrics_verdict("contract", broken, prof).message


# ---- the suite against the fake ------------------------------------------------------------------
SUITE = ["suites/test_metrics.py"]
PROFILE_YAML = """extends: {base}
engine: {{max_num_seqs: 2}}       # the fake runs 2 at once (FakeConfig.max_num_seqs): the 3rd stream waits
metrics:
  consumed:
    - {{name: vllm:kv_cache_usage_perc, labels: [model_name]}}
  held_requests: 3
  max_tokens: 64                  # at itl 12 ms: ~0.77 s per stream, ~6 scrapes while 2 run and 1 waits
"""


@pytest.fixture
def profile(tmp_path):
    p = tmp_path / "fake-metrics.yaml"
    p.write_text(PROFILE_YAML.format(base=REPO / "tests" / "data" / "fake-vllm.yaml"))
    return p


@pytest.mark.parametrize("fault, failing, fragment", [
    (None, None, None),
    ("duplicate_pid_series", "running-truth", "comes as 8 series differing only by label 'pid'"),
    ("renamed_kv_usage", "contract", "vllm:kv_cache_usage_perc is absent from /metrics (server 0.32.0+fake); near "
                                     "match present: vllm:gpu_cache_usage_perc"),
    ("ttft_histogram_lies", "histograms", "vllm:time_to_first_token_seconds puts the p50 request in (0, 0.001] s"),
    ("metrics_500_under_load", "under-load", "scrapes failed, the first at"),
], ids=["healthy", "duplicate_pid_series", "renamed_kv_usage", "ttft_histogram_lies", "metrics_500_under_load"])
def test_suite_against_the_fake(pytester, profile, fault, failing, fragment):
    cfg = FakeConfig(max_tokens_cap=64, itl_s=0.012, ttft_s=0.03, max_num_seqs=2, faults={fault} if fault else set())
    with FakeVLLM(cfg) as fake:
        _, _, gates = run_suites(pytester, fake.url, suites=SUITE, profile=profile)
    ids = [f"fake-metrics/metrics/{c}" for c in ("contract", "running-truth", "histograms", "under-load")]
    assert set(ids) <= set(gates)
    for gid in ids:
        g = gates[gid]
        if failing and gid.endswith(failing):
            assert g["status"] == "FAIL" and fragment in g["message"], g["message"]
        elif not failing:
            assert g["status"] == "PASS", g["message"]
    if fault is None:
        assert "vllm:num_requests_running summed to 2 and vllm:num_requests_waiting to 1" in \
            gates[ids[1]]["message"]


def test_suite_skips_without_metrics(pytester, profile):
    with FakeVLLM(FakeConfig(max_tokens_cap=64, faults={"no_metrics"})) as fake:
        _, _, gates = run_suites(pytester, fake.url, suites=SUITE, profile=profile)
    assert [g["status"] for g in gates.values()] == ["SKIP"] * 4


def test_suite_skips_on_llama_cpp_without_metrics_flag(pytester, profile):
    # llama.cpp's llama-server without --metrics answers GET /metrics 501 not_supported_error: no
    # /metrics, as the deployment and disconnect gates already read it -- SKIP, not "FAIL (every
    # consumer of it reads nothing)"
    with FakeVLLM(FakeConfig(server="llama.cpp", max_tokens_cap=64)) as fake:
        _, _, gates = run_suites(pytester, fake.url, suites=SUITE, profile=profile)
    assert [g["status"] for g in gates.values()] == ["SKIP"] * 4, [g["message"] for g in gates.values()]
    assert all("(GET /metrics answered 501)" in g["message"] for g in gates.values())


def test_suite_behind_a_buffering_proxy_says_so_instead_of_blaming_the_histograms(pytester, profile):
    # the fake holds every stream's bytes until the response ends: the client's TTFT is the whole
    # generation, the server's histogram the real ~30 ms -- INVALID naming the buffering, not a FAIL
    cfg = FakeConfig(max_tokens_cap=64, itl_s=0.012, ttft_s=0.03, max_num_seqs=2, faults={"buffer_stream"},
                     buffer_bytes=0)
    with FakeVLLM(cfg) as fake:
        _, _, gates = run_suites(pytester, fake.url, suites=SUITE, profile=profile)
    g = gates["fake-metrics/metrics/histograms"]
    assert g["status"] == "INVALID" and "a proxy that buffers the stream" in g["message"], g["message"]
    assert gates["fake-metrics/metrics/under-load"]["status"] == "PASS"


def test_held_streams_are_sized_from_the_measured_decode_rate():
    from kvgate.load.scenarios import held_tokens

    assert held_tokens(64, 512, 277.0, 0.1) == 222     # the embedded server's 277 tokens/s: 0.8 s (8 scrapes)
    assert held_tokens(64, 512, 2000.0, 0.1) == 512    # a GPU's 2,000/s: capped
    assert held_tokens(64, 512, 40.0, 0.1) == 64       # slow: metrics.max_tokens stands
    assert held_tokens(64, 512, 160.0, 0.25) == 320    # 8 scrapes of 0.25 s need 2 s
    assert held_tokens(64, 512, 160.0, 0.05) == 80     # 0.5 s at least
    assert held_tokens(64, 512, None, 0.1) == 64 and held_tokens(64, 48, None, 0.1) == 48


def test_running_truth_passes_on_a_fast_healthy_server(pytester, tmp_path):
    # 1.5 ms a token: 64 tokens end in ~0.1 s, the window the issue-33 run read INVALID on a healthy server
    # (no scrape in 0.10 s); the streams are now sized from the probe's rate to decode for 0.8 s (8 scrapes)
    prof = tmp_path / "fake-metrics.yaml"
    prof.write_text(PROFILE_YAML.format(base=REPO / "tests" / "data" / "fake-vllm.yaml").replace(
        "engine: {max_num_seqs: 2}", "engine: {max_num_seqs: 2, max_model_len: 2048}") +
        "limits: {max_tokens_cap: 1024}\n")
    cfg = FakeConfig(max_tokens_cap=1024, max_model_len=2048, itl_s=0.0015, ttft_s=0.005, max_num_seqs=2)
    with FakeVLLM(cfg) as fake:
        _, _, gates = run_suites(pytester, fake.url, "-k", "running", suites=SUITE, profile=prof)
        held = sorted({r.max_tokens for r in fake.state.requests if r.max_tokens != 32 and r.prompt != PROBE_PROMPT})
    g = gates["fake-metrics/metrics/running-truth"]
    assert g["status"] == "PASS", g["message"]
    assert "vllm:num_requests_running summed to 2 and vllm:num_requests_waiting to 1 in all" in g["message"]
    assert len(held) == 1 and 200 <= held[0] <= 600, held  # ~0.8 s at the measured rate (client-timed, loaded host)
    ev = g["evidence"]
    assert ev["held_tokens"] == held[0] and ev["decode_tps"] > 300 and len(ev["scrapes"]) >= 3
    assert ev["sized"].startswith("sized for 0.8 s at the ")
    assert_passes_measured({"gates": list(gates.values())})  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)
