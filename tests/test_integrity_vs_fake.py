"""The requests gate's integrity case (suites/test_requests.py) against the fake vLLM: every body
delivered whole under overlap PASSes; a gateway that truncates under overlap (a non-streamed body
cut short of its Content-Length with 200, a stream ending before its finish chunk and [DONE]) FAILs
naming the bytes received against those declared; a direct-to-pod endpoint (--direct-endpoint)
whose long answer differs from the gateway's FAILs naming it."""

from __future__ import annotations

import pytest

from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, assert_passes_measured
from .test_gates_vs_fake import run_suites

pytest_plugins = ["pytester"]
PROFILE = REPO / "tests" / "data" / "fake-vllm.yaml"
SUITE = ["suites/test_requests.py"]
CASE = "fake-vllm/requests/integrity"


def run(pytester, url, *extra):
    return run_suites(pytester, url, "-k", "integrity", *extra, suites=SUITE, profile=PROFILE)


def overlapping(**kw):
    """A fake whose requests take long enough (10 ms a token) to be in flight together."""
    return FakeVLLM(FakeConfig(max_tokens_cap=64, itl_s=0.01, **kw))


def test_whole_bodies_under_overlap_pass(pytester):
    with overlapping() as fake:
        _, summary, gates = run(pytester, fake.url)
    g = gates[CASE]
    assert g["status"] == "PASS", g["message"]
    assert "2 requests at once: every body whole (1 matched their Content-Length, 1 parsed as JSON, 1 streams ended " \
           "with a finish chunk and [DONE]); usage.prompt_tokens = /tokenize's count on 2" in g["message"], g["message"]
    assert "the same 2 times in overlap; no direct-to-pod endpoint given (--direct-endpoint) -> PASS" in g["message"]
    assert_passes_measured(summary)


def test_truncating_gateway_fails_naming_the_bytes_cut(pytester):
    with overlapping(faults={"truncate_under_overlap"}) as fake:
        _, summary, gates = run(pytester, fake.url)
    g = gates[CASE]
    assert g["status"] == "FAIL" and summary["overall"] == "FAIL", g["message"]
    msg = g["message"]
    assert "2 of 2 bodies delivered with 2 requests in flight are not whole" in msg, msg
    assert "the long request in overlap (not streamed): Content-Length " in msg and " short); the same request " \
           "alone: " in msg, msg
    assert "the long request in overlap (streamed): a stream of " in msg and "with no finish chunk and no [DONE]" in msg
    cut = next(b for b in g["evidence"]["bodies"] if b["request"].endswith("(not streamed)") and "overlap" in b["request"])
    assert cut["content_length"] > cut["bytes"] == cut["content_length"] * 2 // 5  # the fake sends its first 40%


def test_direct_endpoint_same_answer_passes(pytester):
    with overlapping() as gateway, overlapping() as pod:
        _, _, gates = run(pytester, gateway.url, "--direct-endpoint", pod.url)
    g = gates[CASE]
    assert g["status"] == "PASS" and "the direct endpoint's answer the same -> PASS" in g["message"], g["message"]


def test_direct_endpoint_answering_otherwise_fails_naming_it(pytester):
    with overlapping() as gateway, overlapping(faults={"changed_model"}) as pod:
        _, _, gates = run(pytester, gateway.url, "--direct-endpoint", pod.url)
    g = gates[CASE]
    assert g["status"] == "FAIL", g["message"]
    assert "the long request on the direct endpoint: " in g["message"] and "where the same request alone gave" in \
        g["message"], g["message"]
