"""The load gates on the embedded vLLM with busy-looping processes pinned to the server's CPU
(issue 24's "a contended host is not a slow deployment"): no latency FAIL, the contended windows
INVALID with the share named (or PASS where the SLO still decides); ``--busy 0`` is the quiet run.

A manual measurement, not a test: it starts ``--busy`` processes, each spinning on the first CPU
the embedded server is pinned to (:func:`kvgate.launch.local.server_cpus`) and stopping by itself
after ``--deadline-s`` (killed in a ``finally`` anyway), runs ``pytest --profile tiny-cpu -m load``
against the embedded server (bounded by the same deadline), and prints each latency verdict with
the host-contention share from its evidence. Writes ``benchmarks/results/contended_host-<busy>.json``.

    .venv/bin/python benchmarks/contended_host.py              # two busy loops, ~3 min
    .venv/bin/python benchmarks/contended_host.py --busy 0     # the quiet run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvgate.launch.local import server_cpus

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def spin(cpu: int, seconds: float) -> subprocess.Popen:
    """A process busy-looping on ``cpu`` for ``seconds`` (it ends by itself)."""
    code = f"import time\nt = time.monotonic()\nwhile time.monotonic() - t < {seconds}: pass\n"
    return subprocess.Popen([sys.executable, "-c", code], preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))


def latency_rows(summary: dict) -> list[dict]:
    """The load gates' verdicts with the host contention of each window from their evidence."""
    rows = []
    for g in summary.get("gates", []):
        ev = g.get("evidence") or {}
        host = ev.get("host_contention") or {}
        windows = {"": host} if "share" in host or "measured" in host else host
        rows.append({"gate": g.get("id") or g.get("gate"), "status": g.get("status"), "message": g.get("message"),
                     "host_contention": {k: {"share": w.get("share"), "per_cpu": w.get("per_cpu"),
                                             "text": w.get("text")} for k, w in windows.items()}})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", type=int, default=2, help="busy-looping processes pinned to the server's CPU (0: quiet)")
    ap.add_argument("--deadline-s", type=float, default=240.0, help="the loops' lifetime and the pytest run's bound")
    ap.add_argument("--marker", default="load", help="pytest -m expression (default: load)")
    ap.add_argument("-k", dest="keyword", default="test_load",
                    help="pytest -k expression (default test_load: the long-sequence, latency-SLO and interference gates)")
    ap.add_argument("--start-after-s", type=float, default=50.0,
                    help="start the loops this long after pytest (the embedded vLLM's start-up, ~40 s here, is not what is measured)")
    ap.add_argument("--profile", default="tiny-cpu")
    args = ap.parse_args()
    cpus = sorted(server_cpus() or os.sched_getaffinity(0))
    cpu = cpus[0]
    reports = Path(tempfile.mkdtemp(prefix="kvgate-contended-"))
    loops: list[subprocess.Popen] = []
    t0 = time.monotonic()
    try:
        cmd = [sys.executable, "-m", "pytest", f"--profile={args.profile}", "-m", args.marker, "-k", args.keyword,
               "-p", "no:cacheprovider", f"--kvgate-reports={reports}", "-q"]
        run = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            run.wait(timeout=args.start_after_s)
        except subprocess.TimeoutExpired:
            loops = [spin(cpu, args.deadline_s) for _ in range(args.busy)]
        try:
            run.wait(timeout=args.deadline_s)
        finally:
            run.kill()
            run.wait(timeout=30)
    finally:
        for p in loops:
            p.kill()
            p.wait(timeout=10)
    wall = time.monotonic() - t0
    summary = json.loads((reports / "summary.json").read_text())
    rows = latency_rows(summary)
    print(f"{args.busy} busy loop(s) pinned to CPU {cpu} (server CPUs {cpus}); pytest -m {args.marker!r} exit "
          f"{run.returncode} in {wall:.0f} s; reports {reports}")
    for r in rows:
        print(f"  {r['gate']}: {r['status']}: {(r['message'] or '')[:220]}")
        for k, w in r["host_contention"].items():
            print(f"      {k or 'window'}: {w['text']}")
    out = HERE / "results" / f"contended_host-{args.busy}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"busy": args.busy, "cpu": cpu, "server_cpus": cpus, "exit": run.returncode,
                               "wall_s": round(wall, 1), "verdicts": rows}, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
