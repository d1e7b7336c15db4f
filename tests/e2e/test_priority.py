"""The priority gate on the real embedded vLLM: started with --scheduling-policy priority it
PASSES with a measured gain and its short SLO's upper bound within (one more with-priority round:
the second look, 86 short requests); the same profile served FCFS FAILS ("priority ignored",
decided at the first look). Two vLLM starts (~40 s each on 2 cores) plus two runs of the gate."""

from __future__ import annotations

import pytest

from ..conftest import REPO
from .test_embedded import main_job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
GID = "tiny-cpu-priority/priority/short-over-long"


def test_priority_server_passes_with_a_measured_gain(tmp_path):
    proc, summary = main_job(tmp_path, "--profile", "tiny-cpu-priority", "-m", "priority")
    g = {x["id"]: x for x in summary["gates"]}[GID]
    assert proc.returncode == 0 and g["status"] == "PASS", g["message"]
    gain = g["evidence"]["gain"]
    assert gain >= 1.5 and "(Hodges-Lehmann on log TTFT, 95% one-sided bounds" in g["message"]
    assert g["evidence"]["confidence"]["gain"]["lower"] >= 3, g["message"]  # min_gain 3; 9-10x measured on the points
    assert "short-request SLO: short TTFT with priority p95" in g["message"] and "upper bound" in g["message"]
    runs, sampling = g["evidence"]["runs"], g["evidence"]["confidence"]["sampling"]
    print(f"\npriority e2e: short TTFT p95 without {runs['without']['short']['ttft_ms']['p95']:.0f} ms, with "
          f"{runs['with']['short']['ttft_ms']['p95']:.0f} ms ({gain:.1f}x); preemptions "
          f"{runs['without']['preemptions']} / {runs['with']['preemptions']}; {g['evidence']['plan']['rounds']} "
          f"with-priority rounds, {sampling['n']} short requests, {sampling['wall_s']:.0f} s of looks")


def test_same_profile_served_fcfs_fails_as_priority_ignored(tmp_path):
    fcfs = tmp_path / "tiny-cpu-priority-served-fcfs.yaml"
    fcfs.write_text(f"name: tiny-cpu-priority\nextends: {REPO / 'profiles' / 'tiny-cpu-priority.yaml'}\n"
                    "engine:\n  scheduling_policy: fcfs\n")
    proc, summary = main_job(tmp_path, f"--profile={fcfs}", "-m", "priority")
    g = {x["id"]: x for x in summary["gates"]}[GID]
    assert proc.returncode != 0 and g["status"] == "FAIL", g["message"]
    assert "priority ignored: short TTFT p95" in g["message"]
    print(f"\npriority e2e, FCFS: gain {g['evidence']['gain']:.2f}x (need >= {g['evidence']['min_gain']:g}x)")
