"""Each look of the latency sampling judges its requests in send order, as the verdict does.

Found chasing tests/test_scale.py::test_local_workers_send_the_one_process_design_and_judge_it_alike (it
failed 4 of 6 runs under a loaded host, 2026-12-06): latency_judgements sorts records by
``r.index`` to measure the send-order autocorrelation (the effective n), but during sampling
``decide`` gets the batches' records as sent, each batch indexed from 0 (schedule.closed_loop), so
a look after the first sees 0..7, 0..63 and sorts them interleaved; only merge_results re-indexes,
after the last look. The looks' dependence is then not the verdict's: the sampling stopped on a
PASS at 72 requests that the verdict, on the re-indexed records, judged INCONCLUSIVE (effective n
68.3 < 72). sample_batches now numbers each batch's records in send order as it arrives.
"""

from __future__ import annotations

import pytest

from kvgate.load.sampling import sample_latency
from kvgate.load.scenarios import latency_judgements, latency_plan
from tests.test_load_sampling import Synthetic, slo_profile


def test_each_look_sees_its_records_indexed_in_send_order():
    prof = slo_profile(1_000.0, requests=8, cap=96)
    plan = latency_plan(prof)
    seen: list[list[int]] = []
    at_look: list[dict] = []

    def decide(records, level):  # never decides, so every planned look is taken
        seen.append([r.index for r in records])
        at_look.append({k: v.dependence.n_eff for k, v in
                        latency_judgements(records, prof.slo, level, plan.pass_level, 4, at_end=False).items()})
        return {"TTFT": "UNDECIDED", "errors": "PASS"}

    syn = Synthetic(7)
    got = sample_latency(None, ["spec"], 4, plan, decide, clock=syn.clock, loop=syn.loop)
    assert len(seen) >= 2, seen  # more than one look: the later ones hold more than one batch
    final = latency_judgements(got.result.records, prof.slo, plan.per_look, plan.pass_level, 4, at_end=False)
    assert sorted(seen[-1]) == list(range(len(seen[-1]))), seen[-1][:12]  # HEAD: 0..7 then 0..k-1 again
    assert at_look[-1]["TTFT"] == pytest.approx(final["TTFT"].dependence.n_eff)  # the look's n_eff is the verdict's
