"""Gate: priority. With ``engine.scheduling_policy: priority``, high-priority short requests sent
while low-priority long ones fill the server get their first token measurably sooner than the same
requests without priority, within the short SLO (its p95 judged with confidence: more rounds with
priority until its bounds decide), and the engine survives the preemptions."""

import pytest

from kvgate.gates.priority import not_asked, priority_verdict
from kvgate.report.record import latency_png, records_csv
from kvgate.load.scenarios import run_priority


@pytest.mark.load
@pytest.mark.priority
@pytest.mark.gate("priority", cases=["short-over-long"], not_applicable=lambda config, profile, case: not_asked(profile))
def test_high_priority_shorts_overtake_low_priority_longs(case, kvgate_client, kvgate_endpoint, kvgate_profile,
                                                          kvgate_gate):
    skip = not_asked(kvgate_profile)
    if skip is not None:
        assert kvgate_gate(skip).passed
        return
    without, with_ = run_priority(kvgate_client, kvgate_endpoint, kvgate_profile)
    files = {}
    for obs in (without, with_):
        files[f"{obs.name} requests.csv"] = records_csv(obs.result.rows())
        files[f"{obs.name} latency.png"] = latency_png(obs.result.records, obs.name)
    assert kvgate_gate(priority_verdict(without, with_, kvgate_profile), attachments=files).passed
