"""The priority gate on the real embedded vLLM: started with --scheduling-policy priority it
PASSES with a gain shown over 4 pairs of rounds (its lower bound at or above min_gain 3) and its
short SLO's upper bound within (172 short requests with priority); the same profile served FCFS
FAILS ("priority ignored": the gain's upper bound below 3, over 2 pairs). Two vLLM starts (~20 s
each on 2 cores) plus two runs of the gate (8 and 4 rounds); the FCFS server's run is shared with
test_drain.py (tests/e2e/conftest.py ``fcfs_abort_run``: its drain gate runs last)."""

from __future__ import annotations

import pytest

from .test_embedded import main_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
GID = "tiny-cpu-priority/priority/short-over-long"


def test_priority_server_passes_with_a_measured_gain(tmp_path):
    proc, summary = main_job(tmp_path, "--profile", "tiny-cpu-priority", "-m", "priority")
    g = {x["id"]: x for x in summary["gates"]}[GID]
    assert proc.returncode == 0 and g["status"] == "PASS", g["message"]
    gain, gj = g["evidence"]["gain"], g["evidence"]["confidence"]["gain"]
    assert "4 pairs of rounds: short TTFT p95 " in g["message"] and "95% one-sided bounds" in g["message"]
    assert gj["n"] == 4 and gj["lower"] >= 3, g["message"]  # min_gain 3; 6-10x measured
    assert "short-request SLO: short TTFT with priority p95" in g["message"] and "(n=172)" in g["message"]
    runs = g["evidence"]["runs"]
    print(f"\npriority e2e: short TTFT p95 without {runs['without']['short']['ttft_ms']['p95']:.0f} ms, with "
          f"{runs['with']['short']['ttft_ms']['p95']:.0f} ms; gain {gain:.1f}x, bounds {gj['lower']:.2f}x..{gj['upper']:.2f}x "
          f"over pairs {', '.join(f'{r:.1f}x' for r in gj['ratios'])}; preemptions {runs['without']['preemptions']} / "
          f"{runs['with']['preemptions']}; {g['evidence']['plan']['wall_s']:.0f} s of rounds")


def test_same_profile_served_fcfs_fails_as_priority_ignored(fcfs_abort_run):
    # the FCFS server's run (tests/e2e/conftest.py fcfs_abort_run: 2 pairs; its drain gate, last, is test_drain.py's)
    proc, summary = fcfs_abort_run
    g = {x["id"]: x for x in summary["gates"]}[GID]
    assert proc.returncode == 1 and g["status"] == "FAIL", g["message"]
    # nothing FAILed but this gate and the drain gate, whose abort on SIGTERM the shared run is there to show
    failed = [x["id"] for x in summary["gates"] if x["status"] == "FAIL" and x["id"] != GID]
    assert all(i.startswith("tiny-cpu-priority/drain/") for i in failed), failed
    assert "priority ignored: short TTFT p95" in g["message"]
    gj = g["evidence"]["confidence"]["gain"]
    assert gj["n"] == 2 and gj["upper"] < 3, g["message"]
    print(f"\npriority e2e, FCFS: gain {gj['point']:.2f}x, bounds {gj['lower']:.2f}x..{gj['upper']:.2f}x over pairs "
          f"{', '.join(f'{r:.2f}x' for r in gj['ratios'])} (need >= {g['evidence']['min_gain']:g}x); "
          f"{g['evidence']['plan']['wall_s']:.0f} s of rounds")
