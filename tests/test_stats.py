"""Latency statistics and the regression slope, against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

from kvgate.load import RequestRecord
from kvgate.stats import (
    _t_from_table,
    distribution,
    linear_fit,
    max_gap_s,
    percentile,
    request_metrics,
    summarize,
    t_quantile,
)


def rec(index: int = 0, *, sent: float = 1.0, content: list[float] | None = None, end: float | None = None,
        tokens: int | None = None, status: int = 200, error: str | None = None, hung_up: bool = False,
        chunks: list[float] | None = None) -> RequestRecord:
    content = [1.1, 1.15, 1.25, 1.30] if content is None else content
    r = RequestRecord(index=index, scheduled_s=sent, sent_s=sent, status=status, error=error, hung_up=hung_up,
                      content_type="text/event-stream", finalized=True)
    r.content_s = list(content)
    r.chunk_s = list(chunks if chunks is not None else content + ([end] if end is not None else []))
    r.first_token_s = content[0] if content else None
    r.end_s = end if end is not None else (content[-1] + 0.05 if content else sent)
    r.tokens = len(content) if tokens is None else tokens
    return r


def test_percentile_and_distribution_by_hand():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)  # 3 + 0.97 * (4 - 3)
    assert math.isnan(percentile([], 50))
    d = distribution([0.001, 0.002, 0.003, 0.004], scale=1e3)
    assert d == pytest.approx({"n": 4, "p50": 2.5, "p95": 3.85, "p99": 3.97, "mean": 2.5, "max": 4.0})
    assert distribution([]) == {"n": 0, "p50": None, "p95": None, "p99": None, "mean": None, "max": None}
    assert set(distribution([1.0], qs=(99.9,))) == {"n", "p99.9", "mean", "max"}


def test_request_metrics_by_hand():
    # sent at 1.00 s; tokens at 1.10, 1.15, 1.25, 1.30; response complete at 1.35
    m = request_metrics(rec(end=1.35))
    assert m.ttft_s == pytest.approx(0.10)
    assert m.itl_s == pytest.approx([0.05, 0.10, 0.05])
    assert m.e2e_s == pytest.approx(0.35)
    assert m.tpot_s == pytest.approx((0.35 - 0.10) / 3)  # 83.3 ms
    assert m.tokens == 4 and m.ok
    one = request_metrics(rec(content=[1.2], end=1.2))
    assert one.tpot_s is None and one.itl_s == [] and one.ttft_s == pytest.approx(0.2)
    # tokens from usage may exceed the content events (several tokens per event): TPOT uses tokens
    assert request_metrics(rec(end=1.35, tokens=6)).tpot_s == pytest.approx(0.25 / 5)


def test_summarize_pools_successful_requests_and_counts_errors_in_ms():
    recs = [
        rec(0, sent=0.0, content=[0.1, 0.2, 0.3], end=0.3),  # ttft 100, itl 100 100, e2e 300, tpot 100
        rec(1, sent=1.0, content=[1.3, 1.4], end=1.5),       # ttft 300, itl 100, e2e 500, tpot 200
        rec(2, status=500, error="HTTP 500: engine dead", content=[]),
        rec(3, hung_up=True),
    ]
    s = summarize(recs)
    assert (s["requests"], s["ok"], s["errors"], s["hung_up"]) == (4, 2, 1, 1)
    assert s["error_rate"] == pytest.approx(1 / 3)  # hang-ups are deliberate, not errors
    assert s["tokens"] == 5
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0) and s["ttft_ms"]["max"] == pytest.approx(300.0)
    assert s["itl_ms"]["n"] == 3 and s["itl_ms"]["p50"] == pytest.approx(100.0)
    assert s["e2e_ms"]["mean"] == pytest.approx(400.0)
    assert s["tpot_ms"]["p99"] == pytest.approx(100 + 0.99 * 100)
    assert s["max_gap_ms"]["max"] == pytest.approx(300.0)  # the wait for request 1's first event
    assert s["error_samples"] == ["HTTP 500: engine dead"]
    empty = summarize([])
    assert empty["error_rate"] == 0.0 and empty["ttft_ms"]["p50"] is None


def test_max_gap_counts_the_wait_before_the_first_event():
    assert max_gap_s(rec(sent=0.0, content=[0.5, 0.6], chunks=[0.5, 0.6, 2.0])) == pytest.approx(1.4)
    assert max_gap_s(rec(sent=0.0, content=[0.9, 1.0], chunks=[0.9, 1.0])) == pytest.approx(0.9)
    r = rec()
    r.sent_s = None
    assert max_gap_s(r) is None


def test_linear_fit_by_hand():
    # x 0..4, y 1 3 2 5 4: slope 8/10, intercept 1.4, SSE 3.6, se sqrt(3.6/3/10), t(0.975, 3) = 3.182
    f = linear_fit([0, 1, 2, 3, 4], [1, 3, 2, 5, 4])
    assert f.slope == pytest.approx(0.8) and f.intercept == pytest.approx(1.4)
    assert f.stderr == pytest.approx(math.sqrt(0.12)) and f.r2 == pytest.approx(0.64)
    half = t_quantile(0.95, 3) * math.sqrt(0.12)
    assert half == pytest.approx(3.182 * 0.34641, rel=1e-3)
    assert (f.ci_low, f.ci_high) == pytest.approx((0.8 - half, 0.8 + half))
    assert not f.excludes_zero and f.n == 5 and f.to_dict()["confidence"] == 0.95
    exact = linear_fit([0, 1, 2, 3], [1, 3, 5, 7])
    assert exact.slope == pytest.approx(2.0) and exact.ci_low == pytest.approx(2.0) and exact.excludes_zero
    two = linear_fit([0, 1], [0, 1])
    assert two.slope == pytest.approx(1.0) and math.isnan(two.ci_low) and not two.excludes_zero
    with pytest.raises(ValueError):
        linear_fit([1, 1, 1], [1, 2, 3])
    with pytest.raises(ValueError):
        linear_fit([1], [1])


def test_t_table_matches_published_quantiles():
    assert _t_from_table(0.95, 1) == 12.706 and _t_from_table(0.95, 30) == 2.042
    assert _t_from_table(0.95, 35) == pytest.approx(2.0301, abs=2e-3)    # scipy: 2.0301
    assert _t_from_table(0.95, 1000) == pytest.approx(1.9623, abs=2e-3)  # scipy: 1.9623
    assert _t_from_table(0.99, 10) == 3.169 and _t_from_table(0.90, 10) == 1.812
    assert t_quantile(0.95, 10) == pytest.approx(2.228, abs=1e-3)  # scipy or the table
    with pytest.raises(ValueError):
        t_quantile(0.95, 0)


def test_summarize_leaves_a_deadline_censored_record_out_of_the_errors_and_pools_itl():
    ok = rec(0, content=[1.1, 1.12, 1.14, 2.14])  # gaps 20, 20, 1000 ms
    ok2 = rec(1, content=[1.1, 1.12, 1.14, 1.16])
    cut = rec(2, error="timeout: no complete response within 0.2 s", status=200)
    cut.censored = True
    bad = rec(3, status=500, error="HTTP 500")
    s = summarize([ok, ok2, cut, bad])
    assert s["censored"] == 1 and s["errors"] == 1 and s["error_rate"] == pytest.approx(1 / 3)
    assert s["itl_ms"]["n"] == 6  # pooled over requests, as vllm bench serve
    assert s["itl_ms"]["p95"] == pytest.approx(percentile([20, 20, 1000, 20, 20, 20], 95), rel=1e-9)
    assert s["tpot_ms"]["n"] == 2
