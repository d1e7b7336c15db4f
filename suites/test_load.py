"""Gates under load: concurrent long sequences fit and finish; latency percentiles hold the SLO
at the profile's concurrency; short requests keep their TTFT while long prefills run. A workload
with ``traffic:`` is replayed from its sample (checked to fit before anything is sent)."""

import pytest

from kvgate.gates.load import concurrent_long_verdict, interference_verdict, latency_verdict, workloads_missing
from kvgate.gates.scale import scaled_verdict, worker_rows
from kvgate.report.plots import interference_png
from kvgate.report.record import latency_png, records_csv
from kvgate.load.scenarios import run_concurrent_long, run_interference, run_latency


def evidence(obs):
    if not obs.result.records:  # a traffic sample that does not fit: nothing was sent
        return {}
    out = {f"{obs.name} requests.csv": records_csv(obs.result.rows()),
           f"{obs.name} latency.png": latency_png(obs.result.records, obs.name)}
    replay = obs.traffic.replay if obs.traffic is not None else None
    if replay is not None:  # the replayed sample: planned vs sent per request, the cache effect per turn
        out[f"{obs.name} replay.csv"] = replay.rows_csv()
        if replay.turns:
            out[f"{obs.name} turns.csv"] = replay.turns_csv()
    return out


def no_workload(config, profile, case):
    """The SKIP verdict when the profile declares no workload of the kind the gate loads with (the
    gate's ``not_applicable``)."""
    return workloads_missing(profile, case)


@pytest.mark.load
@pytest.mark.gate("concurrency", cases=["long-sequences"], not_applicable=no_workload)
def test_concurrent_long_sequences(case, kvgate_client, kvgate_endpoint, kvgate_profile, kvgate_gate, kvgate_seen):
    if (missing := no_workload(None, kvgate_profile, case)) is not None:  # nothing to load it with
        assert kvgate_gate(missing).passed
        return
    obs = run_concurrent_long(kvgate_client, kvgate_endpoint, kvgate_profile)
    kvgate_seen.add_records("concurrency", obs.result.records)
    assert kvgate_gate(concurrent_long_verdict(obs, kvgate_profile), attachments=evidence(obs)).passed


@pytest.mark.load
@pytest.mark.gate("latency", cases=["slo"], not_applicable=no_workload)
def test_latency_slo(case, kvgate_client, kvgate_endpoint, kvgate_profile, kvgate_gate, kvgate_seen, kvgate_workers):
    if (missing := no_workload(None, kvgate_profile, case)) is not None:  # nothing to load it with
        assert kvgate_gate(missing).passed
        return
    split = kvgate_workers  # --workers: each look sent by N workers, their records merged; None: this process
    obs = run_latency(kvgate_client, kvgate_endpoint, kvgate_profile, loop=split.closed_loop if split else None)
    kvgate_seen.add_records("latency", obs.result.records)
    verdict = latency_verdict(obs, kvgate_profile)
    if split is None:
        assert kvgate_gate(verdict, attachments=evidence(obs)).passed
        return
    run = split.report("latency")  # every worker's part held to one process's rules, per-worker counts
    assert kvgate_gate(scaled_verdict(verdict, run, kvgate_profile),
                       attachments={**evidence(obs), "workers.csv": records_csv(worker_rows(run))}).passed


@pytest.mark.load
@pytest.mark.gate("latency", cases=["interference"], not_applicable=no_workload)
def test_short_requests_under_long_prefills(case, kvgate_client, kvgate_endpoint, kvgate_profile, kvgate_gate,
                                           kvgate_seen):
    if (missing := no_workload(None, kvgate_profile, case)) is not None:  # nothing to load it with
        assert kvgate_gate(missing).passed
        return
    alone, mixed = run_interference(kvgate_client, kvgate_endpoint, kvgate_profile)
    kvgate_seen.add_records("interference", [*alone.result.records, *mixed.result.records])
    verdict = interference_verdict(alone, mixed, kvgate_profile)
    if not mixed.result.records:  # a traffic sample that does not fit: nothing was sent
        assert kvgate_gate(verdict).passed
        return
    picture = interference_png(alone.result.records, mixed.result.records, kvgate_profile.slo.short_ttft_p95_ms,
                               f"{kvgate_profile.name}: short-request TTFT alone vs with long prefills")
    assert kvgate_gate(verdict, attachments={"interference.png": picture, **evidence(alone), **evidence(mixed)}).passed
