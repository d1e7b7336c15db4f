"""The whole suite against the fake vLLM behind a "gateway" that answers 413 (nginx's HTML page) to
every POST body over 4 KB, /tokenize included (fault ``body_limit_413``), serving a 2,048-token
context whose max-context prompts are ~10 KB bodies: no ERROR verdict and no traceback; the
max-context and requests gates FAIL naming "413 for a N-byte body"; the body-size ladder names the
cliff. A run of ``pytest --profile ... --endpoint <fake> suites`` in-process (pytester: the same
command line; tests/test_watch_vs_fake.py's hung engine is the subprocess proof), ~10 s."""

from __future__ import annotations

import re

from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO
from .test_watch_vs_fake import run_all

pytest_plugins = ["pytester"]

PROFILE = REPO / "tests" / "data" / "fake-vllm-body-limit.yaml"


def test_gateway_413_above_4kb_is_fail_verdicts_never_errors(pytester, tmp_path):
    cfg = FakeConfig(max_tokens_cap=64, max_model_len=2048, num_gpu_blocks=512, faults={"body_limit_413"},
                     max_body_bytes=4096)
    with FakeVLLM(cfg) as fake:
        proc, summary, wall = run_all(fake.url, PROFILE, tmp_path, pytester)
    out = proc.stdout + proc.stderr
    assert summary["counts"]["ERROR"] == 0 and "Traceback" not in out and "harness error" not in out, out[-3000:]
    assert summary["overall"] == "FAIL" and proc.returncode == 1
    # pytest's own outcome agrees with summary.json: failed, never an error
    tail = out.strip().splitlines()[-1]
    assert " error" not in tail and f"{summary['counts']['FAIL']} failed" in tail, tail
    gates = {g["id"].removeprefix("fake-vllm-body-limit/"): g for g in summary["gates"]}
    refused = re.compile(r'^/tokenize answered 413 for a (\d[\d,]*)-byte body \(HTML: "413 Request Entity Too Large"\) '
                         r"while building the 2,0\d\d-token (completions|chat) prompt -> FAIL \(")
    for case in ("completions", "chat", "over-length/completions", "over-length/chat-stream"):
        g = gates[f"max-context/{case}"]
        m = refused.match(g["message"])
        assert g["status"] == "FAIL" and m and int(m.group(1).replace(",", "")) > 4096, g["message"]
    assert "the endpoint refuses a body the profile allows" in gates["max-context/completions"]["message"]
    # the requests cases that need the long prompt FAIL with it; the others still ran and were judged
    for api in ("completions", "chat"):
        g = gates[f"requests/max-tokens/null/{api}"]
        assert g["status"] == "FAIL" and refused.match(g["message"]), g["message"]
    assert gates["requests/empty-prompt/string"]["status"] == "PASS"
    assert gates["requests/malformed/stop-1000"]["status"] == "FAIL"  # a ~15 KB body: the gateway's 413 page
    ladder = gates["requests/body-size"]
    assert ladder["status"] == "FAIL" and ladder["message"].startswith(
        'bodies up to 4,096 bytes answered 200; 413 (HTML: "413 Request Entity Too Large") from '), ladder["message"]
    assert "gateway body-size cliff between 4,096 and " in ladder["message"]
    assert wall < 60, wall
