"""End to end, real model: a FAIL names its cause. SmolLM2-135M-Instruct served by ``kvgate serve``
two ways it must not be (``tests/data/smollm2-cpu-bf16-roles.yaml``): in bfloat16 where the profile
says float32, and with a chat template that drops the roles. It is gated as ``smollm2-cpu`` through
``--endpoint`` -- kvgate sees no command line, only what the server says -- against the float32
recording in ``tests/data/recordings/smollm2-cpu-f32`` (``--baseline-reports``; recorded on the
embedded default with ``--gate-mode record -m compare``, as CI keeps a release's reports).

The two faults are independent and each is named by the evidence that shows it, not by the other:
the KV pool's element size (vLLM's own bytes per block: 2 B, not 4) names the dtype in
``fit/live-pool`` and ``deployment/served-config``; the recorded renderings (the same messages, other
tokens) and ``/tokenize`` (a system and a user turn rendered alike) name the template in
``compare/rendering`` and in the answers FAILs. One server for both faults: one real-vLLM start in CI
(~25 s), the gating ~60 s. Bytes, tokens and texts, nothing timed: the module runs beside the unit
tests (tests/conftest.py E2E_BESIDE_UNITS); its 300 s wait for the server's URL covers a start
slowed by them. Marked e2e.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from ..conftest import REPO
from .test_embedded import main_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

OVERLAY = REPO / "tests" / "data" / "smollm2-cpu-bf16-roles.yaml"
RECORDING = REPO / "tests" / "data" / "recordings" / "smollm2-cpu-f32"
KEY_VAR = "KVGATE_E2E_CAUSES_KEY"


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    """``(proc, summary)`` of ``pytest --profile smollm2-cpu --endpoint=URL --baseline-reports=...``
    against ``kvgate serve`` of the overlay; the server stopped (SIGINT) after."""
    from kvgate.launch.realmodel import ensure_real_model

    ensure_real_model()
    log = tmp_path_factory.mktemp("causes-srv") / "vllm.log"
    srv = subprocess.Popen([sys.executable, "-m", "kvgate", "serve", f"--profile={OVERLAY}", f"--log={log}"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"})
    try:
        url = key_file = None
        lines: list[str] = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and srv.poll() is None:  # bounded: it prints or ends
            line = srv.stdout.readline()
            lines.append(line)
            if m := re.search(r" at (http://127\.0\.0\.1:\d+/v1) ", line):
                url = m.group(1)
            if m := re.search(r"written to (\S+\.key)", line):
                key_file = m.group(1)
            if line.startswith("Ctrl-C"):
                break
        assert url and key_file, "".join(lines) + (srv.stderr.read() if srv.poll() is not None else "")
        key = open(key_file).read().strip()
        yield main_job(tmp_path_factory.mktemp("causes"), "--profile", "smollm2-cpu", f"--endpoint={url}",
                       f"--api-key-env={KEY_VAR}", f"--baseline-reports={RECORDING}",
                       "-m", "fit or deployment or answers or compare",
                       "-k", "live-pool or served-config or golden or system-message or rendering or outputs",
                       env={KEY_VAR: key})
    finally:
        if srv.poll() is None:
            srv.send_signal(signal.SIGINT)
            try:
                srv.communicate(timeout=60)
            except subprocess.TimeoutExpired:  # pragma: no cover
                srv.kill()


def _gate(summary, case):
    gates = {g["id"]: g for g in summary["gates"]}
    assert f"smollm2-cpu/{case}" in gates, sorted(gates)
    return gates[f"smollm2-cpu/{case}"]


def test_the_dtype_is_named_from_the_kv_pool_alone(faulty_run):
    proc, summary = faulty_run
    assert proc.returncode == 1 and summary["overall"] == "FAIL", proc.stdout[-4000:]
    live = _gate(summary, "fit/live-pool")
    assert live["status"] == "FAIL", live["message"]
    assert "2 B per KV element" in live["message"] and "128 blocks" in live["message"], live["message"]
    assert "2-byte KV elements" in live["cause"] and "float32" in live["cause"], live.get("cause")
    assert "bfloat16" in live["cause"], live["cause"]
    served = _gate(summary, "deployment/served-config")
    assert served["status"] == "FAIL" and "2 bytes" in served["message"], served["message"]
    assert served.get("cause"), served


def test_the_chat_template_is_named_from_the_renderings(faulty_run):
    _, summary = faulty_run
    rendering = _gate(summary, "compare/rendering")
    assert rendering["status"] == "FAIL", rendering["message"]
    # the recorded float32 server rendered the ChatML roles; this one does not
    assert "on the baseline" in rendering["message"] and "first difference at token" in rendering["message"], \
        rendering["message"]
    assert "chat template" in rendering.get("cause", ""), rendering
    outputs = _gate(summary, "compare/outputs")
    assert outputs["status"] == "FAIL" and "rendering" in outputs.get("cause", ""), outputs
    assert "chat template drops roles" in outputs["cause"], outputs["cause"]
    golden = _gate(summary, "answers/golden")
    assert golden["status"] == "FAIL", golden["message"]
    assert "chat template drops roles" in golden.get("cause", ""), golden
    # the dtype is not what the answers are blamed on: the evidence for the template is its own
    assert "bfloat16" not in golden.get("cause", ""), golden["cause"]
