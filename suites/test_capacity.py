"""Gate: capacity (``-m capacity``; not in the default run: it costs a search). Closed-loop steps
of rising concurrency find the knee -- the most concurrent requests that still meet the TTFT/ITL/e2e
p95 SLO with confidence -- and the declared peak (``slo.peak_concurrency``) times
``capacity.margin`` must not be above it. The steps go to capacity-steps.csv and capacity.png."""

import pytest

from kvgate.gates.capacity import (capacity_verdict, judge_step, knee_of, min_samples, need_of, not_applicable,
                                   step_decisions, steps_csv)
from kvgate.load.capacity import ladder, requests_for, run_step, search
from kvgate.report.capacity_plot import capacity_png
from kvgate.report.outputs import CAPACITY_CSV, CAPACITY_PNG
from kvgate.run.session import current


@pytest.mark.capacity
@pytest.mark.gate("capacity", cases=["knee"], not_applicable=lambda config, profile, case: not_applicable(profile))
def test_declared_peak_is_below_the_knee(case, pytestconfig, kvgate_client, kvgate_endpoint, kvgate_profile,
                                         kvgate_gate):
    profile = kvgate_profile
    if (skip := not_applicable(profile)) is not None:
        assert kvgate_gate(skip).passed
        return
    spec, need = profile.capacity, need_of(profile)
    least = min_samples(profile)

    def measure(concurrency, seconds_left):
        n = requests_for(profile, concurrency, least)
        return run_step(kvgate_client, kvgate_endpoint, profile, concurrency, n, seconds_left, salt=f"c{concurrency}",
                        decide=lambda recs, level, up: step_decisions(recs, profile, level, up,  # looks per step (F1)
                                                                      concurrency=concurrency))

    steps = ladder(spec.start_concurrency, max(spec.max_concurrency, spec.start_concurrency), need)
    found = search(measure, lambda obs: judge_step(obs, profile).decision, steps, bisect_steps=spec.bisect_steps,
                   max_duration_s=spec.max_duration_s)
    judged = [judge_step(s.observation, profile, s.phase) for s in found.steps]
    attachments = {}
    if judged:  # an interrupted search keeps the steps it finished
        knee, _ = knee_of(judged)
        attachments = {CAPACITY_PNG: capacity_png(judged, knee, need, f"{profile.name} capacity"),
                       CAPACITY_CSV: steps_csv(judged)}
        reports = current(pytestconfig).reports_dir
        (reports / CAPACITY_PNG).write_bytes(attachments[CAPACITY_PNG])
        (reports / CAPACITY_CSV).write_text(attachments[CAPACITY_CSV], encoding="utf-8")
    verdict = capacity_verdict(judged, profile, found.to_dict())
    try:
        assert kvgate_gate(verdict, attachments=attachments).passed
    finally:
        if found.why_stopped == "interrupted":  # recorded INCOMPLETE: the Ctrl-C goes on
            raise KeyboardInterrupt
