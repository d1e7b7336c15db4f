"""``kvgate worker``, ``kvgate merge DIR`` and ``kvgate render-job``: the scale-out commands
(docs/scale-out.md).

- ``kvgate worker [--coordinator URL] [--worker K/N] [--endpoint URL] [--api-key-env VAR] [--ship DIR]``
  runs one worker (:func:`kvgate.scale.worker.run_worker`) until its coordinator says done; the
  URL and the index default to ``KVGATE_COORDINATOR`` and an Indexed Job's ``JOB_COMPLETION_INDEX`` /
  ``JOB_COMPLETIONS``. Exit 0 done, 1 the coordinator went away, 2 refused or bad arguments.
- ``kvgate merge DIR --profile P`` reads a run directory (the coordinator's ``reports/scale``, or a
  shared volume), merges the parts, replays the latency gate's looks over them and prints the
  verdict with the per-worker counts; writes ``DIR/merged.json`` (the verdict's summary form).
  Exit codes as a gate run's (README "Verdicts and exit codes"): 0 PASS, 1 FAIL, 6 INVALID,
  9 INCONCLUSIVE, 4 a directory or profile that cannot be read.
- ``kvgate render-job --profile P --workers N --coordinator URL [--template FILE]`` prints the
  worker Indexed Job with the profile's values (:func:`kvgate.scale.k8s.render_worker_job`): a
  dry run of what ``--workers k8s:N --workers-job FILE`` creates.

:func:`add_command` adds them to ``kvgate``'s sub-parsers; each sets ``args.run``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TextIO

from kvgate.profile.models import DEFAULT_PROFILE_DIR, ProfileError, load_profile

#: ``kvgate merge`` exit codes, as a gate run's.
MERGE_CODES = {"PASS": 0, "SKIP": 0, "FAIL": 1, "INVALID": 6, "INCONCLUSIVE": 9}
USAGE = 4


def add_command(sub: argparse._SubParsersAction) -> None:
    """Add ``worker``, ``merge`` and ``render-job`` to the ``kvgate`` sub-parsers ``sub``."""
    w = sub.add_parser("worker", help="run one scale-out worker for a coordinator (a gate run with --workers)",
                       description="One worker of a split load run: joins the coordinator, sends its share of each "
                                   "batch from the shared start instant, ships its records back.")
    w.add_argument("--coordinator", default=None, metavar="URL",
                   help="the coordinator's URL (default: $KVGATE_COORDINATOR)")
    w.add_argument("--worker", default=None, metavar="K/N",
                   help="this worker's index of N (default: $JOB_COMPLETION_INDEX of $JOB_COMPLETIONS)")
    w.add_argument("--endpoint", default=None, metavar="URL",
                   help="the endpoint to load (default: the one the coordinator announces)")
    w.add_argument("--api-key-env", default=None, metavar="VAR", help="environment variable holding the endpoint's key")
    w.add_argument("--ship", default=None, metavar="DIR",
                   help="write the parts to this directory (a volume the coordinator reads) instead of POSTing them")
    w.add_argument("--heartbeat-s", type=float, default=1.0, metavar="S", help="seconds between heartbeats (default 1)")
    w.add_argument("--max-silence-s", type=float, default=120.0, metavar="S",
                   help="give up after this long without the coordinator (default 120)")
    w.set_defaults(run=run_worker_command)
    m = sub.add_parser("merge", help="merge a scale-out run directory and judge the latency gate over it",
                       description="Merge the workers' records of a run directory (run.json + worker-*/batch-*.jsonl.gz) "
                                   "and judge the latency-SLO gate on the union, as one process would.")
    m.add_argument("dir", metavar="DIR", help="the run directory (the coordinator's reports/scale)")
    m.add_argument("--profile", required=True, metavar="NAME|PATH", help="the profile the run gated")
    m.add_argument("--profile-dir", default=str(DEFAULT_PROFILE_DIR), metavar="DIR")
    m.set_defaults(run=run_merge)
    r = sub.add_parser("render-job", help="print the worker Indexed Job for a profile (a dry run of --workers k8s:N)",
                       description="Render the worker Indexed Job with a profile's values (completions, deadline, "
                                   "the downward-API index, the coordinator's URL) and print it as YAML.")
    r.add_argument("--profile", required=True, metavar="NAME|PATH")
    r.add_argument("--profile-dir", default=str(DEFAULT_PROFILE_DIR), metavar="DIR")
    r.add_argument("--workers", required=True, type=int, metavar="N")
    r.add_argument("--coordinator", required=True, metavar="URL", help="the URL the workers reach the coordinator at")
    r.add_argument("--template", default=None, metavar="FILE",
                   help="a YAML file with the worker Job (default: kvgate's own, as in ci/scale-out-indexed-job.yaml)")
    r.add_argument("--namespace", default=None, metavar="NS")
    r.set_defaults(run=run_render)


def run_worker_command(args: argparse.Namespace, err: TextIO | None = None) -> int:
    """``kvgate worker``: the worker's exit code (2 for bad arguments)."""
    from kvgate.scale.k8s import COORDINATOR_ENV
    from kvgate.scale.split import WorkersError, coordinator_url, parse_worker, worker_from_env
    from kvgate.scale.worker import USAGE as W_USAGE, WorkerOptions, run_worker

    err = err or sys.stderr
    url = args.coordinator or os.environ.get(COORDINATOR_ENV)
    try:
        w = parse_worker(args.worker) if args.worker else worker_from_env()
        if url:
            coordinator_url("--coordinator" if args.coordinator else f"${COORDINATOR_ENV}", url)
    except WorkersError as exc:
        print(f"kvgate worker: {exc}", file=err)
        return W_USAGE
    if not url or w is None:
        print("kvgate worker: needs --coordinator URL (or $KVGATE_COORDINATOR) and --worker K/N (or an Indexed Job's "
              "$JOB_COMPLETION_INDEX with $JOB_COMPLETIONS)", file=err)
        return W_USAGE
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            print(f"kvgate worker: API key variable {args.api_key_env} is not set (named by --api-key-env)", file=err)
            return W_USAGE
    opts = WorkerOptions(url, w, endpoint=args.endpoint, api_key=key, ship_dir=Path(args.ship) if args.ship else None,
                         heartbeat_s=args.heartbeat_s, max_silence_s=args.max_silence_s)
    return run_worker(opts, log=lambda line: print(line, file=err, flush=True))


def run_merge(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``kvgate merge DIR``: the verdict's exit code (see the module docstring)."""
    from kvgate.gates.scale import merged_latency_verdict, worker_row
    from kvgate.scale.merge import RunDirError, load_run
    from kvgate.verdict import printable

    out, err = out or sys.stdout, err or sys.stderr
    try:
        profile = load_profile(args.profile, Path(args.profile_dir))
        run = load_run(Path(args.dir))
    except (ProfileError, RunDirError) as exc:
        print(f"kvgate merge: {exc}", file=err)
        return USAGE
    if not run.batches:
        print(f"kvgate merge: {args.dir}: the run published no batch (nothing to merge)", file=err)
        return USAGE
    v = merged_latency_verdict(run, profile)
    print(f"{v.status.value:<12} {profile.name}/{v.gate}  {v.message}", file=out)
    print("worker  host                 sent/assigned  ok  errors  streams  start ms  clock +- ms  p99 lag ms", file=out)
    for k in range(run.n):
        row = worker_row(run, k)
        print(f"{k:>6}  {printable(str(row['host']))[:20]:<20} {row['sent']:>5}/{row['assigned']:<8} {row['ok']:>3} {row['errors']:>7} "
              f"{row['streams']:>8}  {_f(row['start_offset_ms']):>8}  {_f(row['clock_residual_ms']):>11}  "
              f"{_f(row['p99_lag_ms']):>10}" + (f"  lost: {printable(row['lost'])}" if row["lost"] else ""), file=out)
    (Path(args.dir) / "merged.json").write_text(json.dumps({"profile": profile.name, "verdict": v.to_summary()},
                                                           indent=1, default=str))
    return MERGE_CODES.get(v.status.value, 1)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def run_render(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``kvgate render-job``: 0 with the YAML printed, 2 when it cannot be rendered."""
    import yaml

    from kvgate.scale.k8s import WORKER_JOB, load_job, render_worker_job
    from kvgate.scale.split import WorkersError, coordinator_url

    out, err = out or sys.stdout, err or sys.stderr
    try:
        coordinator_url("--coordinator", args.coordinator)
        profile = load_profile(args.profile, Path(args.profile_dir))
        template = load_job(Path(args.template), "--template") if args.template else WORKER_JOB
        job = render_worker_job(template, n=args.workers, coordinator_url=args.coordinator, profile=profile,
                                namespace=args.namespace)
    except (ProfileError, WorkersError) as exc:
        print(f"kvgate render-job: {exc}", file=err)
        return 2
    out.write(yaml.safe_dump(job, sort_keys=False))
    return 0
