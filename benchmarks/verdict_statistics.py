"""Operating characteristics of kvgate's statistical verdicts, measured (issue 48).

Not a test: a Monte-Carlo benchmark. For every statistical case (latency/slo TTFT, ITL, e2e;
latency/interference; capacity; soak memory, latency, GPU; compare/latency; answers/accuracy;
pools/isolation; priority) and every dependence design (independent samples, lock-step waves
with ICC 0.9 and 1.0, AR(1) rounds with phi 0.5 and 0.8; see ``benchmarks/verdict_sim``), it runs
simulated servers of known truth through the case's *own* decision code -- the functions kvgate's
verdicts call, never a reimplementation -- and counts PASS, FAIL and INCONCLUSIVE:

- at the limit (truth exactly on it): the wrong-PASS rate and the wrong-FAIL rate, each held to
  the case's stated rate (``1 - confidence`` unless the case says otherwise);
- at 1.5x and 2x the limit (3x too for the soak): the power (a FAIL is right);
- healthy (truth inside the limit with room): the false-alarm rate the budget adds up.

A cell keeps its stated rate when ``rate <= stated + 3`` Monte-Carlo standard errors (at the
stated rate). It writes ``docs/verdict-statistics.md`` (``--doc``) and
``benchmarks/results/verdict_statistics-latest.json`` (``--results``), merging cell by cell
(``--replace``: only this run's cells; see ``--help`` for what each flag writes), and exits 1 when
any checked cell breaks its stated rate (0 when all keep it). Every cell is seeded (``--seed``): the same tree gives the
same table.

    flock /tmp/kvgate-heavy.lock .venv/bin/python benchmarks/verdict_statistics.py            # all, 2,000 runs a cell
    .venv/bin/python benchmarks/verdict_statistics.py --runs 300 --cases "latency/slo TTFT,capacity" --results /tmp/vs.json --no-doc
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import multiprocessing as mp
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for p in (REPO / "src", REPO / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from verdict_sim import Cell, mc_se, memoise_ranks, run_cell, within  # noqa: E402
from verdict_sim.cases import CASES, FACTOR, Case, design_label  # noqa: E402

DOC = REPO / "docs" / "verdict-statistics.md"
RESULTS = REPO / "benchmarks" / "results" / "verdict_statistics-latest.json"
def _main_job_budget() -> tuple[float, int]:
    """(the main job's false-alarm budget, the number of families it is split over): smollm2-cpu's
    ``verdicts.false_alarm_budget`` (0.01 when the profile sets none: the doc then measures the
    job against 1%) and ``VerdictsSpec.FAMILIES``."""
    from kvgate.profile.models import VerdictsSpec, load_profile
    b = load_profile("smollm2-cpu").verdicts.false_alarm_budget
    return (0.01 if b is None else b), len(VerdictsSpec.FAMILIES)


#: The family-wise false-alarm budget the doc measures the main job against, and its families.
BUDGET, FAMILIES = _main_job_budget()

_ADAPTERS: dict[str, Any] = {}


def cell_seed(seed: int, case: str, design: str, truth: str) -> int:
    """A cell's own seed: the same cell gets the same runs whatever else is run."""
    return (seed * 1_000_003 + zlib.crc32(f"{case}|{design}|{truth}".encode())) % 2**63


def _one_cell(job: tuple[str, str, str, int, int]) -> dict[str, Any]:
    name, design_key, truth, runs, seed = job
    memoise_ranks()
    case = CASES[name]
    design = next(d for d in case.designs if d.key == design_key)
    if name not in _ADAPTERS:
        _ADAPTERS[name] = case.make()
    try:
        cell = run_cell(name, design, truth, runs, cell_seed(seed, name, design_key, truth), _ADAPTERS[name])
        return cell.to_dict()
    except Exception as exc:  # a case whose code changed under the adapter: recorded, not hidden
        return {"case": name, "design": design_key, "truth": truth, "runs": 0, "counts": {},
                "error": f"{type(exc).__name__}: {exc}"[:300], "seconds": 0.0}


def jobs_for(cases: list[Case], runs: int, seed: int) -> list[tuple[str, str, str, int, int]]:
    return [(c.name, d.key, t, min(runs, c.max_runs or runs), seed) for c in cases for d in c.designs for t in c.truths]


def run_all(cases: list[Case], runs: int, seed: int, workers: int, truths: set[str] | None = None,
            designs: set[str] | None = None) -> list[dict[str, Any]]:
    """Every (case, design, truth) cell (``truths``, ``designs`` -- design keys: only those),
    ``workers`` processes (1: in this process)."""
    jobs = [j for j in jobs_for(cases, runs, seed)
            if (truths is None or j[2] in truths) and (designs is None or j[1] in designs)]
    # the costliest cells first, so the pool's last minutes are not one long cell
    slow = ("soak/memory", "soak/latency", "latency/slo ITL")
    jobs.sort(key=lambda j: (j[0] not in slow, j[2] not in ("limit", "1.5x")))
    if workers <= 1:
        out = []
        for j in jobs:
            out.append(_one_cell(j))
            _progress(out[-1])
        return out
    ctx = mp.get_context("fork")
    out = []
    with ctx.Pool(workers) as pool:
        for r in pool.imap_unordered(_one_cell, jobs):
            out.append(r)
            _progress(r)
    return out


def _progress(r: dict[str, Any]) -> None:
    print(f"  {r['case']:22s} {r['design']:8s} {r['truth']:8s} {r['runs']:5d} runs {r['seconds']:7.1f} s "
          f"{r.get('error') or r['counts']}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- the table

def _cell(results: list[dict[str, Any]], case: str, design: str, truth: str) -> Cell | None:
    r = next((x for x in results if (x["case"], x["design"], x["truth"]) == (case, design, truth)), None)
    if r is None or not r["runs"]:
        return None
    return Cell(r["case"], r["design"], r["truth"], r["runs"], r["counts"], r["seconds"])


def checks(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case and design: the rates at the limit against the stated rate, power, the healthy
    false alarm; ``ok`` = both rates at the limit (and the healthy FAIL rate) within stated + 3 SE."""
    rows = []
    for name, case in CASES.items():
        for d in case.designs:
            lim = _cell(results, name, d.key, "limit")
            if lim is None:
                mine = [x for x in results if (x["case"], x["design"]) == (name, d.key)]
                if mine:
                    err = next((x.get("error") for x in mine if x.get("error")), None)
                    rows.append({"case": name, "design": d.key, "label": design_label(d), "error": err or "no runs",
                                 "ok": False, "stated": case.fail_stated})
                continue
            stated_pass = case.stated if d.floor is None else round(1 - d.floor, 6)
            row: dict[str, Any] = {"case": name, "design": d.key, "label": design_label(d), "runs": lim.runs,
                                   "stated": case.fail_stated, "stated_pass": stated_pass,
                                   "wrong_pass": lim.rate("PASS"), "wrong_fail": lim.rate("FAIL"),
                                   "inconclusive": lim.rate("INCONCLUSIVE")}
            other = 1 - row["wrong_pass"] - row["wrong_fail"] - row["inconclusive"]
            row["other_at_limit"] = other if other > 1e-12 else 0.0
            for t in case.truths:
                if t in ("healthy", "limit"):
                    continue
                c = _cell(results, name, d.key, t)
                row[f"power_{t}"] = None if c is None else c.rate("FAIL")
                row[f"pass_{t}"] = None if c is None else c.rate("PASS")
            h = _cell(results, name, d.key, "healthy")
            row["healthy_fail"] = None if h is None else h.rate("FAIL")
            row["healthy_pass"] = None if h is None else h.rate("PASS")
            row["ok_pass"] = within(row["wrong_pass"], stated_pass, lim.runs)
            if not case.fail_at_limit_is_wrong:  # "at the limit" is past it: a FAIL there is right
                row["power_limit"], row["wrong_fail"] = row["wrong_fail"], 0.0
            row["ok_fail"] = within(row["wrong_fail"], case.fail_stated, lim.runs)
            row["ok_healthy"] = h is None or within(row["healthy_fail"], case.fail_stated, h.runs)
            row["ok"] = row["ok_pass"] and row["ok_fail"] and row["ok_healthy"]
            rows.append(row)
    return rows


def budget(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The main job's false-alarm budget from the main-job cases' worst design: at the limit
    (a healthy deployment sitting on every limit: the worst case) and at the healthy point; the
    family as a sum (union bound) and as ``1 - prod(1 - r)`` (independent cases)."""
    per: dict[str, dict[str, float]] = {}
    for r in rows:
        case = CASES[r["case"]]
        if "error" in r or not case.main_job or (case.main_job_designs and r["design"] not in case.main_job_designs):
            continue
        p = per.setdefault(r["case"], {"at_limit": 0.0, "healthy": 0.0})
        p["at_limit"] = max(p["at_limit"], r["wrong_fail"])
        p["healthy"] = max(p["healthy"], r["healthy_fail"] or 0.0)
    out: dict[str, Any] = {"budget": BUDGET, "cases": per}
    for key in ("at_limit", "healthy"):
        rates = [v[key] for v in per.values()]
        out[f"sum_{key}"] = sum(rates)
        out[f"union_{key}"] = 1 - math.prod(1 - x for x in rates)
    out["verdicts"] = len(per)
    out["families"] = FAMILIES
    out["per_case_level"] = BUDGET / FAMILIES
    return out


def _pct(x: float | None) -> str:
    """A rate in percent: one decimal, two below 1% (a budget share of 0.11% reads as itself)."""
    if x is None:
        return "n/a"
    return f"{x * 100:.2f}%" if 0 < x < 0.01 else f"{x * 100:.1f}%"


def _flag(ok: bool) -> str:
    return "ok" if ok else "**BREAKS**"


def commit() -> str:
    try:
        sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return sha + (" (with uncommitted changes under src/)" if dirty else "")
    except Exception:
        return "unknown"


def render(rows: list[dict[str, Any]], b: dict[str, Any], meta: dict[str, Any]) -> str:
    """docs/verdict-statistics.md."""
    bad = [r for r in rows if not r["ok"]]
    L = [
        "# Verdict statistics: operating characteristics, measured",
        "",
        "How often each statistical verdict of kvgate is wrong, measured by simulation: simulated servers of "
        "known truth, run through each case's **own** decision code (the functions kvgate's verdicts call; "
        "nothing re-implemented), under independent samples and under the dependence real runs have. "
        "Produced by `benchmarks/verdict_statistics.py` (the simulated designs and the per-case adapters: "
        "`benchmarks/verdict_sim/`); CI runs a smaller version, `tests/test_verdict_statistics.py`.",
        "",
        f"- **Run**: {meta['date']}, kvgate commit `{meta['commit']}`, **{meta['runs']:,} simulated runs per cell** "
        + (f"(fewer where a row's `runs` says so: {', '.join(sorted({r['case'] for r in rows if r.get('runs') and r['runs'] < meta['runs']}))}, "
           "whose decision code costs a tenth of a second or more a run), "
           if any(r.get('runs') and r['runs'] < meta['runs'] for r in rows) else "")
        + f"seed {meta['seed']}, {meta['cells']} cells, "
        + (f"{meta['cpu_s']:,.0f} s of simulation summed over the cells ({meta['workers']} worker processes on two "
           "shared cores; run in parts, merged cell by cell)." if meta.get("cpu_s") else
           f"{meta['wall_s']:.0f} s wall on {meta['workers']} process(es)."),
        f"- **Outcome**: {len(rows) - len(bad)} of {len(rows)} (case, design) rows keep their stated rates"
        + (f"; **{len(bad)} {'breaks it' if len(bad) == 1 else 'break them'}** (marked below)." if bad else "."),
        *[f"- **Note**: {n}" for n in meta.get("notes", ())],
        "",
        "## What is measured",
        "",
        "- **Truth at the limit**: the case's true quantity (a p95, a slope, a ratio, an accuracy, a gain) exactly on "
        "its limit. A PASS there and a FAIL there are both counted as wrong: a rule whose errors are bounded at "
        "`1 - confidence` gives each at most that rate at the boundary, and less away from it.",
        "- **Power at 1.5x and 2x**: the truth that far on the wrong side of the limit (2x: twice the p95, twice the "
        "slope ceiling, twice the allowed ratio, twice the allowed accuracy drop, half the gain); the FAIL rate. "
        "Not a claim the code makes: reported, not checked.",
        "- **Healthy**: the truth inside the limit with room (per case below); its FAIL rate is the false alarm "
        "the budget adds up.",
        "- **`pass_confidence_floor`**: the latency/slo and interference cases run with the profile's "
        "`slo.pass_confidence_floor` unset -- the strict claim, no PASS below `slo.confidence` -- and once more under "
        "lock-step waves at ICC 1.0 with the floor smollm2-cpu ships (0.6: a PASS of too few effective samples may "
        "state 60%). On those rows the PASS side is held to what the verdict then states, `1 - floor` (40%); the FAIL "
        "side stays at `1 - slo.confidence`.",
        "- **Stated**: the rate the case claims for a wrong PASS and for a wrong FAIL at its limit (per case below). "
        "A cell keeps it when `measured <= stated + 3` Monte-Carlo standard errors, "
        f"`3 sqrt(stated (1 - stated) / runs)` = {3 * mc_se(0.05, meta['runs']) * 100:.2f} points at 5% "
        f"and {meta['runs']:,} runs.",
        "",
        "**Designs.** *independent*: every request (round) its own draw. *lock-step waves, ICC rho*: requests that "
        "leave together (a closed loop's batch at `slo.concurrency`, an interference wave of 4 shorts, a pools wave, "
        "a priority round's shorts in fours) share a wave effect, intraclass correlation rho (1.0: identical within "
        "a wave, as measured on the embedded server: ICC 0.998). *AR(1) phi*: rounds (the soak) or interleaved pairs "
        "(compare: a drift of the machine shared by both sides) autocorrelated at lag 1. Every design keeps the "
        "marginal distribution (lognormal latencies, sigma 0.5 of log-latency), so the truth is the same under all "
        "of them: only the dependence changes.",
        "",
        "## The table",
        "",
        "Rates over the runs of each cell. `wrong PASS` and `wrong FAIL` at the limit are checked against "
        "`stated`; the rest of the runs at the limit are INCONCLUSIVE (the honest answer there).",
        "",
        "| case | design | runs | wrong PASS @limit | wrong FAIL @limit | INCONCL. @limit | stated (+3 SE) | power 1.5x "
        "| power 2x | power 3x | FAIL healthy | PASS healthy | keeps stated |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "error" in r:
            L.append(f"| {r['case']} | {r['label']} | 0 | error: {r['error']} | | | {_pct(r['stated'])} | | | | | | "
                     "**BREAKS** (not run) |")
            continue
        sp = r.get("stated_pass", r["stated"])
        tol = r["stated"] + 3 * mc_se(r["stated"], r["runs"])
        stated = (f"{_pct(r['stated'])} ({_pct(tol)})" if sp == r["stated"] else
                  f"PASS {_pct(sp)} ({_pct(sp + 3 * mc_se(sp, r['runs']))}), FAIL {_pct(r['stated'])} ({_pct(tol)})")
        L.append(f"| {r['case']} | {r['label']} | {r['runs']:,} | {_pct(r['wrong_pass'])} | {_pct(r['wrong_fail'])} | "
                 f"{_pct(r['inconclusive'])} | {stated} | {_pct(r.get('power_1.5x'))} | "
                 f"{_pct(r.get('power_2x'))} | {_pct(r.get('power_3x')) if 'power_3x' in r else '-'} | "
                 f"{_pct(r['healthy_fail'])} | {_pct(r['healthy_pass'])} | "
                 f"{'ok' if r['ok'] else '**BREAKS** (' + ', '.join(w for w, k in (('PASS', 'ok_pass'), ('FAIL', 'ok_fail'), ('healthy FAIL', 'ok_healthy')) if not r[k]) + ')'} |")
    if bad:
        L += ["", "## Where a case breaks its stated rate", ""]
        for r in bad:
            if "error" in r:
                L.append(f"- **{r['case']}**, {r['label']}: not run ({r['error']}).")
                continue
            parts = []
            if not r["ok_pass"]:
                parts.append(f"wrong PASS {_pct(r['wrong_pass'])} at the limit, stated {_pct(r.get('stated_pass', r['stated']))}")
            if not r["ok_fail"]:
                parts.append(f"wrong FAIL {_pct(r['wrong_fail'])} at the limit, stated {_pct(r['stated'])}")
            if not r["ok_healthy"]:
                parts.append(f"FAIL {_pct(r['healthy_fail'])} of healthy runs, stated {_pct(r['stated'])}")
            L.append(f"- **{r['case']}**, {r['label']} ({r['runs']:,} runs): " + "; ".join(parts) + ".")
    L += ["", "## Per case: what runs, what is stated, what is healthy", "",
          "| case | decided by | stated | healthy truth | in the main job |", "|---|---|---|---|---|"]
    for name, c in CASES.items():
        stated = (f"{_pct(c.stated)}: {c.claim}" if c.stated_fail is None else
                  f"PASS {_pct(c.stated)}: {c.claim}; FAIL {_pct(c.stated_fail)}: the false-alarm budget's share "
                  f"(smollm2-cpu's verdicts.false_alarm_budget {_pct(BUDGET)} / {FAMILIES} families)")
        L.append(f"| {name} | {c.decided_by} | {stated} | {c.healthy} | "
                 f"{'yes' if c.main_job else 'no'} |")
    L += ["", "Each adapter's docstring in `benchmarks/verdict_sim/cases.py` names the kvgate functions that decide "
          "(the scenario's plan, its sampling driver and `decide`, the gate's verdict function) and the truth it sets.",
          "", "## The false-alarm budget of the main job", ""]
    per = b["cases"]
    L += ["The statistical verdicts of the main job (`pytest --profile smollm2-cpu`): "
          + ", ".join(per) + ". Per case, its worst design's FAIL rate (answers/accuracy: the profile's floor, as the "
          "main job judges it):", "",
          "| case | FAIL rate, truth at the limit | FAIL rate, healthy |", "|---|---:|---:|"]
    for name, v in per.items():
        L.append(f"| {name} | {_pct(v['at_limit'])} | {_pct(v['healthy'])} |")
    share = b["per_case_level"]
    L += ["", f"- **The budget** (smollm2-cpu's `verdicts.false_alarm_budget`): {_pct(b['budget'])} of main jobs on a "
          f"deployment sitting exactly on every limit may see any statistical FAIL. It is split over kvgate's "
          f"{b['families']} statistical verdict families (`VerdictsSpec.FAMILIES`, the same split whatever `-m` "
          f"selects): each family's FAIL side at {(1 - share) * 100:.2f}% ({_pct(share)} a family), the PASS side at "
          "the family's own level (a wrong PASS is not a false alarm).",
          f"- **Worst case, measured** (every truth exactly on its limit): any FAIL in the main job at most "
          f"{_pct(b['sum_at_limit'])} (the sum over its {b['verdicts']} cases above; {_pct(b['union_at_limit'])} if "
          "they err independently) -- "
          + ("within the budget." if b["sum_at_limit"] <= b["budget"] + 3 * mc_se(b["budget"], 2000) else
             "**above the budget**."),
          f"- **At the healthy point** (every truth at half its limit, no leak, no drop): {_pct(b['sum_healthy'])} "
          f"(sum), {_pct(b['union_healthy'])} (independent).",
          "- **The price**: power near the limit (the lower bound a FAIL needs moves down a few ranks); the power "
          "columns above are measured at this level (where a note says a row's power cells ran before the budget, "
          "they read high). No PASS needs more samples.",
          "",
          "## Re-running it", "",
          "```bash",
          "flock /tmp/kvgate-heavy.lock .venv/bin/python benchmarks/verdict_statistics.py          # every case, 2,000 runs a cell",
          ".venv/bin/python benchmarks/verdict_statistics.py --runs 300 --cases \"latency/slo TTFT,capacity\" --results /tmp/vs.json --no-doc",
          ".venv/bin/pytest tests/test_verdict_statistics.py -q -p no:cacheprovider                # CI's smaller version",
          "```", "",
          "It writes `benchmarks/results/verdict_statistics-latest.json` (every cell's counts; `--results PATH` writes another file) and, once that file holds cells of every case, this page (not with `--no-doc`, which still writes the results file). A run merges cell by cell: each (case, design, truth) cell it runs replaces that cell in the results file, every other cell is kept with the commit and runs it ran with -- so a `--cases` run never loses the other cases' 2,000-run cells, but its own cells do replace theirs (try a quick run into `--results /tmp/...`). `--replace` writes only this run's cells. `--render` runs nothing and rewrites only this page from the results file."
          " It exits 1 when a checked cell breaks its stated rate. `--workers N` (default 2) runs cells in parallel; every cell "
          "is seeded on its own (`--seed`), so the table does not depend on the order or the workers.", ""]
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=2000, help="simulated runs per cell (default 2000)")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all): " + ", ".join(CASES))
    ap.add_argument("--seed", type=int, default=48)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-doc", action="store_true",
                    help="do not write docs/verdict-statistics.md; the results file (--results) is still written "
                         "(merged as below)")
    ap.add_argument("--truths", default="", help="comma-separated truth points to run (default: each case's all)")
    ap.add_argument("--designs", default="", help="comma-separated design keys to run (iid, waves0.9, ar10.8, "
                    "ar10.8+rhomaxnull, ...; default: each case's all)")
    ap.add_argument("--results", type=Path, default=RESULTS, metavar="PATH",
                    help="the results file read and written (default benchmarks/results/verdict_statistics-latest.json)")
    ap.add_argument("--render", action="store_true",
                    help="run nothing: rewrite only docs/verdict-statistics.md, from the results file")
    ap.add_argument("--replace", action="store_true",
                    help="write the results file with only this run's cells, dropping every cell it holds (without "
                         "it a run merges: each cell it runs -- case, design, truth -- replaces that cell in the "
                         "results file, every other cell is kept with the commit and runs it ran with)")
    ap.add_argument("--merge", action="store_true",
                    help="the default now (kept for old command lines): merge this run's cells into the results file")
    ap.epilog = ("Writes: the results file always (merged, or replaced with --replace); docs/verdict-statistics.md "
                 "unless --no-doc, and only when the results file then holds cells of every case. --render writes "
                 "only the doc.")
    args = ap.parse_args(argv)
    if args.replace and args.merge:
        ap.error("--merge and --replace contradict each other (a run merges unless --replace)")
    results_path: Path = args.results
    names = [n.strip() for n in args.cases.split(",") if n.strip()] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {list(CASES)}")
    cases = [CASES[n] for n in names]
    if args.render:
        saved = json.loads(results_path.read_text())
        rows = checks(saved["cells"])
        meta = {**saved["meta"], "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "cells": len(saved["cells"]), "cpu_s": sum(c.get("seconds", 0.0) for c in saved["cells"]),
                "commit": ", ".join(sorted({c.get("commit", "?") for c in saved["cells"]}))}
        DOC.write_text(render(rows, budget(rows), meta))
        print(f"wrote {DOC.relative_to(REPO)} from {results_path}")
        return 0 if all(r["ok"] for r in rows) else 1
    memoise_ranks()
    sha = commit()
    t0 = time.perf_counter()
    truths = {t.strip() for t in args.truths.split(",") if t.strip()} or None
    designs = {d.strip() for d in args.designs.split(",") if d.strip()} or None
    results = run_all(cases, args.runs, args.seed, args.workers, truths, designs)
    wall = time.perf_counter() - t0
    for r in results:
        r["commit"] = sha
    kept: list[dict[str, Any]] = []
    if not args.replace and results_path.exists():
        # Cell-level merge: a cell this run ran replaces the saved one; every other known cell is kept.
        old = json.loads(results_path.read_text())
        fresh = {(c["case"], c["design"], c["truth"]) for c in results}
        kept = [c for c in old.get("cells", []) if c["case"] in CASES
                and (c["case"], c["design"], c["truth"]) not in fresh]
        wall += float(old.get("meta", {}).get("wall_s", 0.0)) if kept else 0.0
    cells = kept + results
    covered = sorted({c["case"] for c in cells}, key=list(CASES).index)
    rows = checks(cells)
    b = budget(rows)
    commits = sorted({c.get("commit", sha) for c in cells})
    meta = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": ", ".join(commits), "runs": max([args.runs] + [int(c.get("runs") or 0) for c in kept]), "seed": args.seed, "cells": len(cells), "wall_s": wall,
            "workers": args.workers, "cases": covered}
    for r in rows:
        if r["case"] not in names:
            continue
        line = (f"{r['case']:22s} {r['label']:28s} " + (f"ERROR {r['error']}" if "error" in r else
                f"wrongPASS {_pct(r['wrong_pass']):>6s} wrongFAIL {_pct(r['wrong_fail']):>6s} "
                f"p1.5x {_pct(r.get('power_1.5x')):>6s} p2x {_pct(r.get('power_2x')):>6s} "
                f"healthyFAIL {_pct(r['healthy_fail']):>6s} {_flag(r['ok'])}"))
        print(line)
    print(f"budget: sum at limit {_pct(b['sum_at_limit'])}, healthy {_pct(b['sum_healthy'])}; wall {wall:.0f} s")
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps({"meta": meta, "cells": cells, "rows": rows, "budget": b}, indent=1))
    how = (f"replaced (--replace): {len(results)} cells" if args.replace else
           f"merged: {len(results)} cells run, {len(kept)} kept")
    if args.no_doc:
        print(f"wrote {results_path} ({how}); not the doc (--no-doc)")
    elif set(covered) == set(CASES):
        DOC.write_text(render(rows, b, meta))
        print(f"wrote {DOC.relative_to(REPO)} and {results_path} ({how})")
    else:
        print(f"wrote {results_path} ({how}); not the doc (only once every case has cells)")
    return 0 if all(r["ok"] for r in rows if r["case"] in names) else 1


if __name__ == "__main__":
    sys.exit(main())
