"""requests/no-duplicate-work (suites/test_requests.py, kvgate.http.duplicates): a request kvgate sends
once must reach the engine once. Through the retrying gateway fake (tests/fakes/fake_router.py,
``retrying``) in front of the fake vLLM: slow requests past its per-try timeout, and 5xx answers, are
run twice on the engine and FAIL naming sent vs counted and the extra prompt tokens; the healthy router
(which never retries) PASSes with the counts. The verdict's INVALID/SKIP branches are proven on
observations built here (no server, no sleep)."""

from __future__ import annotations

import socket

import pytest

from kvgate.gates.requests import duplicate_work_verdict
from kvgate.http.duplicates import (SLOW_CAP_S, Counts, DuplicateWork, Edge, Sent, _edge, metrics_at, shown_url,
                                    slow_target)
from kvgate.verdict import Status
from tests.fakes.fake_router import FakeRouter
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, assert_passes_measured
from .test_gates_vs_fake import run_suites
from .test_requests_vs_fake import _profile_with

pytest_plugins = ["pytester"]
SUITE = ["suites/test_requests.py"]
CASE = "fake-vllm/requests/no-duplicate-work"
#: [s] the try timeout the profile declares; the retrying router's own is ROUTER_TRY_S (the slow requests,
#: sized 1.25 x PROFILE_TRY_S from a pace probe, outrun it by 2.5x: a busy CI host's pace noise cannot hide it)
PROFILE_TRY_S, ROUTER_TRY_S = 0.3, 0.15


def run(pytester, tmp_path, url, *extra, **limits):
    profile = _profile_with(tmp_path, **limits)
    _, summary, gates = run_suites(pytester, url, "-k", "no-duplicate-work", *extra, suites=SUITE, profile=profile)
    return summary, gates[CASE]


def gateway(fake, fault=None, try_timeout_s=None):
    return FakeRouter(fake.base_url, fake.base_url, threshold=1 << 20, fault=fault, try_timeout_s=try_timeout_s)


# ------------------------------------------------------------------------------ through the gateway fake

def test_healthy_gateway_passes_with_the_counts(pytester, tmp_path):
    with FakeVLLM(FakeConfig(max_tokens_cap=64, itl_s=0.01)) as fake, gateway(fake) as router:
        summary, g = run(pytester, tmp_path, router.url, gateway_try_timeout_s=PROFILE_TRY_S)
    assert g["status"] == "PASS", g["message"]
    assert router.retried == 0
    j = g["evidence"]["judged"]
    assert j["sent_requests"] == j["counted_requests"] == 7  # 4 plain + the pace probe + 2 slow
    assert j["sent_prompt_tokens"] == j["counted_prompt_tokens"] > 0 and j["extra_prompt_tokens"] == 0
    assert "the engine counted 7 requests and " in g["message"] and "2 slow requests of " in g["message"]
    assert_passes_measured(summary)


def test_gateway_retrying_past_its_try_timeout_fails_naming_the_extra_work(pytester, tmp_path):
    """The slow requests outrun the router's per-try timeout twice (2 tries each, then 504): the engine
    counts 4 runs for 2 slow requests -- exactly the sent requests plus the router's own resends (on a
    busy host a plain request may outrun it too: the relation holds whatever was resent). Counted on
    --direct-endpoint (the pod's own /metrics)."""
    with FakeVLLM(FakeConfig(max_tokens_cap=64, itl_s=0.01)) as fake, \
            gateway(fake, "retrying", ROUTER_TRY_S) as router:
        summary, g = run(pytester, tmp_path, router.url, "--direct-endpoint", fake.url,
                         gateway_try_timeout_s=PROFILE_TRY_S)
    assert g["status"] == "FAIL" and summary["overall"] == "FAIL", g["message"]
    msg, j, extra = g["message"], g["evidence"]["judged"], router.retried
    assert extra >= 2 and (j["sent_requests"], j["counted_requests"], j["extra_requests"]) == (7, 7 + extra, extra)
    assert msg.startswith(f"--direct-endpoint's /metrics: the engine counted {7 + extra} requests and "), msg
    assert f"for the 7 requests ({j['sent_prompt_tokens']} prompt tokens) kvgate sent once each -> FAIL ({extra} " \
           f"extra requests and {j['extra_prompt_tokens']} extra prompt tokens of duplicate work" in msg, msg
    per_slow = next(s["prompt_tokens"] for s in g["evidence"]["sent"] if s["label"] == "slow 1")
    assert j["extra_prompt_tokens"] >= 2 * per_slow > 0
    assert (g["measured"]["value"], g["limit"]["value"]) == (7 + extra, 7)
    assert "2 slow requests sized past the gateway's per-try timeout 0.3 s got 504 after" in g["cause"], g["cause"]


def test_gateway_retrying_5xx_fails_and_healthy_gateway_passes_the_same_5xx(pytester, tmp_path):
    """The engine answers every generation 500 half way (error_mid_stream): the retrying router sends each
    again (8 runs of 4 requests, 2x the prompt tokens /tokenize counts; read at --engine-metrics URL); the
    healthy one does not (4 of 4, read at the endpoint's own /metrics)."""
    with FakeVLLM(FakeConfig(max_tokens_cap=64, faults={"error_mid_stream"})) as fake:
        with gateway(fake, "retrying") as router:
            metrics = f"{fake.base_url}/metrics"
            _, bad = run(pytester, tmp_path, router.url, f"--engine-metrics={metrics}")
        with gateway(fake) as healthy:
            _, good = run(pytester, tmp_path, healthy.url)
    assert bad["status"] == "FAIL", bad["message"]
    j = bad["evidence"]["judged"]
    assert (j["sent_requests"], j["counted_requests"]) == (4, 8) and j["unknown_prompts"] == 0
    assert j["counted_prompt_tokens"] == 2 * j["sent_prompt_tokens"] == 2 * j["extra_prompt_tokens"]
    assert bad["message"].startswith(f"--engine-metrics {metrics}: the engine counted 8 requests and "
                                     f"{2 * j['sent_prompt_tokens']} prompt tokens for the 4 requests"), bad["message"]
    assert "4 extra requests and " in bad["message"], bad["message"]
    assert "4 of 4 requests answered 5xx or not at all (500): a gateway that retries 5xx" in bad["cause"], bad["cause"]
    assert "no slow requests: the profile declares no gateway per-try timeout" in str(bad["evidence"]["slow_how"])
    assert good["status"] == "PASS" and "the engine counted 4 requests" in good["message"], good["message"]


# ------------------------------------------------------------------------------ the verdict, built here

def edge(*counts, settled=True):
    reads = tuple((0.5 * i, c) for i, c in enumerate(counts))
    quiet = len(counts) >= 2 and counts[-1].counters == counts[-2].counters
    return Edge(reads, quiet, settled, 0.0)


def sent(n=4, pt=10, status=200):
    return tuple(Sent(f"plain {i + 1}", status, pt, "usage", 8, 8, 0.1) for i in range(n))


C0, C1 = Counts(100, 1000, 800, 0, 0), Counts(104, 1040, 832, 0, 0)


def test_verdict_pass_names_the_counts():
    v = duplicate_work_verdict(DuplicateWork("the endpoint's /metrics", edge(C0, C0), edge(C1, C1), sent()))
    assert v.status is Status.PASS and (v.measured, v.limit) == (4, 4), v.message
    assert "the engine counted 4 requests and 40 prompt tokens for the 4 requests (40 prompt tokens)" in v.message


def test_verdict_extra_prompt_tokens_alone_fail():
    """A retry whose first try was aborted may leave the request count equal but prefill counted twice."""
    v = duplicate_work_verdict(DuplicateWork("s", edge(C0, C0), edge(Counts(104, 1050, 832), Counts(104, 1050, 832)),
                                             sent()))
    assert v.status is Status.FAIL and (v.measured, v.limit, v.unit) == (50, 40, "prompt tokens"), v.message
    assert "no extra request and 10 extra prompt tokens" in v.message


def test_verdict_abandoned_tries_vllm_does_not_count_still_fail_on_prompt_tokens():
    """vLLM's semantics: 2 slow requests' 4 tries all abandoned (aborted: no request_success), each prefilled."""
    sent7 = (*sent(5, 10), *(Sent(f"slow {i}", 504, 10, "tokenize", 0, 40, 0.3) for i in (1, 2)))
    after = Counts(105, 1090, 850)
    v = duplicate_work_verdict(DuplicateWork("s", edge(C0, C0), edge(after, after), sent7), try_timeout_s=0.3)
    assert v.status is Status.FAIL and (v.measured, v.limit, v.unit) == (90, 70, "prompt tokens"), v.message
    assert "no extra request (2 fewer: vLLM counts no aborted try" in v.message and "20 extra prompt tokens" in v.message
    assert v.cause.startswith("2 slow requests sized past the gateway's per-try timeout 0.3 s got 504 after 0.30 s")


def test_verdict_other_traffic_before_the_window_is_invalid():
    moving = edge(C0, Counts(101, 1010, 810), Counts(102, 1020, 820), Counts(103, 1030, 830))
    v = duplicate_work_verdict(DuplicateWork("s", moving, edge(C1, C1), sent()))
    assert v.status is Status.INVALID and "moved with kvgate sending nothing before the window (+3 requests, +30 " \
        "prompt tokens, +30 generation tokens in 1.5 s over 4 reads)" in v.message, v.message


def test_verdict_counts_still_moving_after_or_unsettled_before_are_invalid():
    after = edge(C1, Counts(106, 1060, 850), Counts(108, 1080, 870), Counts(110, 1100, 890))
    v = duplicate_work_verdict(DuplicateWork("s", edge(C0, C0), after, sent()))
    assert v.status is Status.INVALID and "still moving after the last answer" in v.message, v.message
    busy = edge(Counts(100, 1000, 800, 2, 1), Counts(100, 1000, 800, 2, 1), settled=False)
    v = duplicate_work_verdict(DuplicateWork("s", busy, edge(C1, C1), sent()))
    assert v.status is Status.INVALID and "still ran 2 and queued 1 requests not kvgate's" in v.message, v.message


def test_verdict_fewer_counted_than_answered_is_invalid_and_nothing_reaching_the_engine_skips():
    v = duplicate_work_verdict(DuplicateWork("s", edge(C0, C0), edge(Counts(102, 1020, 816), Counts(102, 1020, 816)),
                                             sent()))
    assert v.status is Status.INVALID and "fewer than the 4 requests" in v.message and "one replica" in v.message
    v = duplicate_work_verdict(DuplicateWork("s", edge(C0, C0), edge(C0, C0), sent(status=500)))
    assert v.status is Status.SKIP and "none of the 4 requests" in v.message and "answered 500" in v.message, v.message


def test_verdict_unreadable_counters_skip_naming_direct_endpoint():
    v = duplicate_work_verdict(DuplicateWork("the endpoint's /metrics", error="the endpoint's /metrics answers no "
                                             "Prometheus /metrics"))
    assert v.status is Status.SKIP and "--direct-endpoint=URL" in v.message


def test_engine_metrics_url_read_without_credentials_shown():
    with socket.socket() as sock:  # a port nothing listens on (bound, then closed)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert metrics_at(f"http://127.0.0.1:{port}/metrics", timeout_s=2)() is None
    assert shown_url("http://user:secret@metrics.example:9091/metrics?token=abc") == "http://metrics.example:9091/metrics"


def test_slow_target_past_the_try_timeout_bounded():
    assert slow_target(None, 60)[0] is None
    assert slow_target(10, None)[0] == 12.5
    assert slow_target(10, 12)[0] == pytest.approx(10.8) and "0.9 x the route timeout 12 s" in slow_target(10, 12)[1]
    assert slow_target(1000, None) == (SLOW_CAP_S, "kvgate's cap 120 s (below 1.25 x the gateway's per-try timeout "
                                                   "1000 s)")


def test_edge_is_bounded_and_waits_on_injected_time():
    """Settles on running + waiting, then reads until two agree; counters that never agree stop at 4 reads."""
    t = [0.0]
    texts = iter([f"vllm:num_requests_running 1\nvllm:request_success_total {i}\nvllm:prompt_tokens_total {i}\n"
                  if i < 2 else f"vllm:num_requests_running 0\nvllm:request_success_total {i}\n"
                  f"vllm:prompt_tokens_total {i}\n" for i in range(100)])

    def sleep(s):
        t[0] += s
    e = _edge(lambda: next(texts), 10.0, lambda: t[0], sleep)
    assert e.settled is True and not e.quiet and len(e.reads) == 4 and e.waited_s == pytest.approx(0.4)


@pytest.mark.parametrize("value", ["garbage", "ftp://user:secret@host/metrics", "", "http://host:70000/metrics"])
def test_an_engine_metrics_value_that_is_no_url_is_refused_in_one_line(pytester, tmp_path, value):
    """A typo in --engine-metrics stops the run before anything is sent (exit 4, one line, no
    credential echoed) -- before, the run went on and the case SKIPped 'answers no /metrics'."""
    result = pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p",
                                          "no:cacheprovider", f"--profile={_profile_with(tmp_path)}",
                                          "--endpoint=http://127.0.0.1:9/v1", f"--engine-metrics={value}",
                                          f"--kvgate-reports={tmp_path / 'r'}", str(REPO / "suites" / "test_requests.py"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "--engine-metrics:" in err and "secret" not in err + result.stdout.str(), err
