"""CI's smaller version of ``benchmarks/verdict_statistics.py`` (issue 48): each statistical case's
own decision code, fed simulated servers whose truth sits exactly at the limit under the case's
hardest dependence design, must keep its stated wrong-PASS and wrong-FAIL rates within 3
Monte-Carlo standard errors -- 300 seeded runs a cell, so a cell that breaks its rate fails
here every time and a cell that keeps it never flakes. The checker itself is proven both ways: a
rule that judges lock-step waves as independent requests (what latency/interference did before
issue 48) is caught breaking its rate, and an honest one is not."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from .conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from verdict_sim import IID, WAVES_10, Design, lognormal_ms, memoise_ranks, run_cell, within  # noqa: E402
from verdict_sim.cases import CASES, FACTOR, Case  # noqa: E402

_spec = importlib.util.spec_from_file_location("verdict_statistics", REPO / "benchmarks" / "verdict_statistics.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

RUNS = 300
SEED = 4848

#: (case, design key): the cells CI holds to their stated rates -- each case under its hardest
#: design (lock-step waves at ICC 1.0, AR(1) 0.8, a recorded limit that is itself a draw) where a
#: run costs milliseconds (latency/slo e2e goes the same way as TTFT). The soak's and ITL's cells
#: cost ~0.05-0.5 s a run and stay in the full benchmark (docs/verdict-statistics.md).
GUARDED = [
    ("latency/slo TTFT", "waves1"),
    ("latency/interference", "waves1"),
    ("capacity", "waves1"),
    ("compare/latency", "ar10.8"),
    ("answers/accuracy", "recorded"),
    ("pools/isolation", "waves1"),
    ("priority", "waves1"),
]


@pytest.fixture(scope="module", autouse=True)
def _ranks():
    memoise_ranks()


#: Guarded cells the committed decision code does not yet keep (docs/verdict-statistics.md says by
#: how much): strict xfail, so the day the code keeps its rate this test fails until the entry goes.
BREAKS: dict[tuple[str, str], str] = {
}
#: capacity's ICC 1.0 row read wrong PASS ~50% / wrong FAIL ~12% while a step's closed loop was judged as
#: independent requests; judged at the send-order effective n now (as latency/slo).
#: priority's ICC 1.0 row read wrong PASS 20.7% / wrong FAIL 21.8% while its gain's Mann-Whitney bounds took one
#: round's lock-step shorts as independent; judged over pairs of rounds now (the pair the unit): 5.2% / 4.8%.
#: pools/isolation's ICC 1.0 row read wrong PASS 9.7% (2,000 runs) while its adapter judged the strict design
#: at the short pool's shipped 60% floor: every wrong PASS was a floor PASS. Strict now (floor row separate,
#: stated 40%): 0.0% of 1,000 strict, 9.3% of 1,000 at the floor.
#: While the fixes land, an entry that starts keeping its rate passes quietly (not strict).
STRICT = False


def _params():
    for c, d in GUARDED:
        why = BREAKS.get((c, d))
        marks = [pytest.mark.xfail(strict=STRICT, reason=why)] if why else []
        yield pytest.param(c, d, marks=marks, id=f"{c}-{d}")


@pytest.mark.parametrize("case, design", list(_params()))
def test_case_keeps_its_stated_rates_at_the_limit(case, design):
    c = CASES[case]
    d = next(x for x in c.designs if x.key == design)
    cell = run_cell(case, d, "limit", RUNS, bench.cell_seed(SEED, case, design, "limit"), c.make())
    assert sum(cell.counts.values()) == RUNS
    wrong_pass, wrong_fail = cell.rate("PASS"), cell.rate("FAIL")
    limit = c.stated + 3 * (c.stated * (1 - c.stated) / RUNS) ** 0.5
    assert within(wrong_pass, c.stated, RUNS), (
        f"{case} under {d.label}: wrong PASS {wrong_pass:.1%} at the limit > stated {c.stated:.0%} + 3 MC SE "
        f"({limit:.1%}); outcomes {cell.counts}")
    assert within(wrong_fail, c.stated, RUNS), (
        f"{case} under {d.label}: wrong FAIL {wrong_fail:.1%} at the limit > stated {c.stated:.0%} + 3 MC SE "
        f"({limit:.1%}); outcomes {cell.counts}")


def test_a_p95_twice_the_limit_fails_the_latency_slo_and_never_passes():
    c = CASES["latency/slo TTFT"]
    one = c.make()
    iid = run_cell(c.name, IID, "2x", 100, bench.cell_seed(SEED, c.name, "iid", "2x"), one)
    assert iid.rate("FAIL") >= 0.95 and iid.rate("PASS") == 0, iid.counts
    waves = run_cell(c.name, WAVES_10, "2x", 100, bench.cell_seed(SEED, c.name, "waves1", "2x"), one)
    assert waves.rate("FAIL") >= 0.5 and waves.rate("PASS") == 0, waves.counts  # 15 waves of 4 decide less


# ------------------------------------------------------------------- the checker, both ways

def _old_interference_rule():
    """Interference as it was judged before issue 48: the 60 shorts of 15 lock-step waves counted as
    60 independent requests (kvgate's order-statistic ``judge`` at the split levels of 16/60)."""
    from kvgate.stats.confidence import judge, split_levels
    plan = split_levels([16, 60], 0.95, 0.95)

    def one(rng, design, truth):
        x = lognormal_ms(design.latent(rng, 60, wave=4), FACTOR[truth] * 1000.0)
        for n in plan.looks:
            d = judge(list(x[:n]), 0.95, 1000.0, plan.per_look, plan.pass_level).decision
            if d != "UNDECIDED":
                return d
        return "INCONCLUSIVE"
    return one


def test_checker_catches_a_rule_that_counts_waves_as_independent_requests():
    case = Case("old interference", (WAVES_10,), _old_interference_rule, False, "1 - confidence", "-")
    cell = run_cell(case.name, WAVES_10, "limit", RUNS, SEED, case.make())
    assert not within(cell.rate("PASS"), 0.05, RUNS), cell.counts  # ~46% wrong PASS (review F2)
    rows = _rows_for(case, cell)
    assert rows["ok"] is False and rows["ok_pass"] is False


def test_checker_passes_the_same_rule_on_independent_requests():
    case = Case("old interference", (IID,), _old_interference_rule, False, "1 - confidence", "-")
    cell = run_cell(case.name, IID, "limit", RUNS, SEED, case.make())
    assert within(cell.rate("PASS"), 0.05, RUNS) and within(cell.rate("FAIL"), 0.05, RUNS), cell.counts


def _rows_for(case: Case, cell) -> dict:
    bench.CASES[case.name] = case
    try:
        rows = bench.checks([cell.to_dict()])
    finally:
        del bench.CASES[case.name]
    return next(r for r in rows if r["case"] == case.name)


def test_designs_keep_the_marginal_and_set_the_dependence():
    rng = np.random.default_rng(1)
    z = Design("waves", 1.0).latent(rng, 4000, wave=4).reshape(-1, 4)
    assert np.allclose(z, z[:, :1])  # ICC 1.0: a wave moves as one
    assert abs(z.std() - 1) < 0.05
    a = Design("ar1", 0.8).latent(rng, 20000)
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1] - 0.8) < 0.02 and abs(a.std() - 1) < 0.05
    x = lognormal_ms(rng.standard_normal(200000), 500.0)
    assert abs(np.percentile(x, 95) / 500.0 - 1) < 0.01  # the truth is the marginal p95


def test_the_doc_names_a_broken_cell_and_the_budget():
    results = [
        {"case": "latency/slo TTFT", "design": "iid", "truth": t, "runs": 100, "counts": counts, "seconds": 1.0}
        for t, counts in (("limit", {"PASS": 3, "FAIL": 20, "INCONCLUSIVE": 77}), ("healthy", {"PASS": 100}),
                          ("1.5x", {"FAIL": 90, "INCONCLUSIVE": 10}), ("2x", {"FAIL": 100}))]
    rows = [r for r in bench.checks(results) if r["case"] == "latency/slo TTFT"]
    assert rows[0]["ok"] is False and rows[0]["ok_fail"] is False and rows[0]["ok_pass"] is True
    b = bench.budget(rows)
    assert b["cases"]["latency/slo TTFT"] == {"at_limit": 0.2, "healthy": 0.0}
    page = bench.render(rows, b, {"date": "2026-12-06", "commit": "abc", "runs": 100, "seed": 1, "cells": 4,
                                  "wall_s": 1.0, "workers": 1})
    # the FAIL side held to smollm2-cpu's false-alarm budget share (1% / 9 families), the PASS side to 5%
    assert ("| latency/slo TTFT | independent | 100 | 3.0% | 20.0% | 77.0% | PASS 5.0% (11.5%), FAIL 0.11% (1.1%) | "
            "90.0% | 100.0% |") in page
    assert "**BREAKS** (FAIL)" in page and "**1 breaks it**" in page
    assert "any FAIL in the main job at most 20.0%" in page and "**above the budget**" in page
    assert "split over kvgate's 9 statistical verdict families" in page


def test_unknown_case_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--cases", "latency/nope", "--no-doc"])
    assert e.value.code == 2 and "unknown case" in capsys.readouterr().err


def _cells(path):
    import json

    return {(c["case"], c["design"], c["truth"]): c["runs"] for c in json.loads(path.read_text())["cells"]}


def test_a_partial_run_merges_into_the_results_and_keeps_the_other_cases_cells(tmp_path, monkeypatch):
    """The fault: a ``--cases`` run rewrote the results with only its own cells (the 2,000-run
    cells of every other case lost, the next ``--render`` wrong). Now it merges cell by cell; the
    doc is never written (``--no-doc``, and a partial results file never renders it)."""
    doc = tmp_path / "doc.md"
    monkeypatch.setattr(bench, "DOC", doc)
    res = tmp_path / "results.json"
    common = ["--truths", "limit", "--workers", "1", "--results", str(res), "--no-doc"]
    bench.main(["--runs", "20", "--cases", "answers/accuracy,compare/latency", "--replace", *common])
    first = _cells(res)
    assert first and set(first.values()) == {20}
    assert {k[0] for k in first} == {"answers/accuracy", "compare/latency"}
    bench.main(["--runs", "30", "--cases", "answers/accuracy", *common])
    merged = _cells(res)
    assert set(merged) == set(first)                                  # nothing lost
    assert {k: v for k, v in merged.items() if k[0] == "compare/latency"} == \
        {k: v for k, v in first.items() if k[0] == "compare/latency"}  # the other case's cells kept as they were
    assert {v for k, v in merged.items() if k[0] == "answers/accuracy"} == {30}  # the newer cells replace the older
    assert not doc.exists()


def test_replace_writes_only_this_runs_cells(tmp_path, monkeypatch):
    """The other way: with ``--replace`` the results file holds this run's cells alone."""
    monkeypatch.setattr(bench, "DOC", tmp_path / "doc.md")
    res = tmp_path / "results.json"
    common = ["--runs", "20", "--truths", "limit", "--workers", "1", "--results", str(res), "--no-doc"]
    bench.main(["--cases", "answers/accuracy,compare/latency", *common])
    bench.main(["--cases", "answers/accuracy", "--replace", *common])
    assert {k[0] for k in _cells(res)} == {"answers/accuracy"}


def test_merge_and_replace_together_are_a_usage_error_and_help_says_what_each_writes(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--merge", "--replace", "--no-doc"])
    assert e.value.code == 2 and "contradict" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(--results) is still written" in out and "--render writes only the doc" in out
    assert "replaces that cell in the results file" in out
