"""kvgate's own overhead in a main-job run: the server's busy time against the wall time, per phase.

Not a test. Runs ``pytest --profile PROFILE`` (the main job; embedded by default) with this file
loaded as a pytest plugin (``-p main_job_overhead``), which

- samples the server's ``/metrics`` every ``--interval`` seconds from a thread of its own (with the
  run's endpoint and key, once the ``kvgate_endpoint`` fixture has the server): the gauges
  ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` and vLLM's own counters
  (``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, the request histograms' sums
  ``vllm:request_prefill_time_seconds_sum`` / ``_decode_time_seconds_sum``, their ``_count``);
- notes each gate test's start and end (monotonic seconds) under kvgate's own phase name
  (``gate PROFILE/GATE/CASE``);

and writes them to a JSON file. Then it reads the run's ``summary.json`` phases (the wall time of
each phase as kvgate's console prints it, nested launch excluded) and computes per phase:

- ``busy_s``: seconds the engine had work (a sample with a request running or waiting counts until
  the next sample; vLLM publishes those gauges with each engine step's output, so a busy spell is
  seen only once its first step ended: it is moved back by the mean time to first token of the
  requests first answered then -- their time in the server until that step ended:
  :func:`busy_series`, :func:`busy_seconds`);
- ``idle_s`` = wall - busy: the server had nothing to do while kvgate built prompts, tokenized,
  waited, slept, judged, plotted or sent one request after another -- kvgate's share;
- ``request_s``: the sum of the requests' prefill + decode seconds (vLLM's histograms; above
  ``busy_s`` where requests ran at once), and the tokens prefilled and generated.

``prepare model`` (the real model's first conversion), ``collect`` (overlaps the start-up) and
``launch`` (the part of vLLM's start-up the run waited for) are reported as they are: no server
yet. The sampler's own scrapes cost the server a little (one ``/metrics`` render every interval,
~5 ms of its API process at 0.25 s: ~2% of a core).

Usage (a real vLLM start: run it under the heavy lock on a shared machine)::

    python benchmarks/main_job_overhead.py                            # smollm2-cpu, ~6 min
    python benchmarks/main_job_overhead.py --profile tiny-cpu -- -m "not soak"
    python benchmarks/main_job_overhead.py --analyze benchmarks/results/main_job_overhead-latest.json

Writes ``benchmarks/results/main_job_overhead-<time>.json`` and ``-latest.json``: the recording,
the phases and the table. The arithmetic (:func:`busy_seconds`, :func:`phase_rows`,
:func:`totals`) is unit-tested in ``tests/test_main_job_overhead.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
OUT_ENV = "KVGATE_OVERHEAD_OUT"
INTERVAL_ENV = "KVGATE_OVERHEAD_INTERVAL_S"

#: The gauges that say the engine has work.
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
#: vLLM's counters (and histogram sums/counts) read per phase, summed over their label sets.
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_prefill_time_seconds_sum",
            "vllm:request_decode_time_seconds_sum", "vllm:request_prefill_time_seconds_count",
            "vllm:e2e_request_latency_seconds_count", "vllm:time_to_first_token_seconds_sum",
            "vllm:time_to_first_token_seconds_count")
#: Phases that are not gates: no server yet (or none needed).
NO_SERVER = ("prepare model", "collect", "launch", "teardown")


# ----------------------------------------------------------------------------- arithmetic (unit-tested)


def read_metrics(text: str, names: Sequence[str] = GAUGES + COUNTERS) -> dict[str, float]:
    """``names`` -> the sum of their samples over every label set, from one Prometheus text body
    (a line-based read: ``name{labels} value`` or ``name value``; comments and other names
    skipped). A name with no sample is absent from the result."""
    wanted = set(names)
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return out


def busy_series(samples: Sequence[dict[str, Any]]) -> list[tuple[float, bool, float]]:
    """``(t, busy, lead_s)`` per sample (``{"t", "metrics"}``): busy when a request runs or waits;
    ``lead_s`` on a sample that starts a busy spell (the one before it idle): the mean time to first
    token of the requests whose first token came since that sample (the TTFT histogram's sum and
    count deltas, seconds; 0 when none). vLLM sets the gauges and observes TTFT from the same
    engine step's output, so the spell began about ``lead_s`` before the gauges showed it."""
    out: list[tuple[float, bool, float]] = []
    for i, s in enumerate(samples):
        m = s["metrics"]
        busy = sum(m.get(g, 0.0) for g in GAUGES) > 0
        lead = 0.0
        if busy and i and not out[-1][1]:
            p = samples[i - 1]["metrics"]
            n = m.get("vllm:time_to_first_token_seconds_count", 0.0) - p.get("vllm:time_to_first_token_seconds_count", 0.0)
            total = m.get("vllm:time_to_first_token_seconds_sum", 0.0) - p.get("vllm:time_to_first_token_seconds_sum", 0.0)
            lead = total / n if n > 0 and total > 0 else 0.0
        out.append((s["t"], busy, lead))
    return out


def busy_seconds(series: Sequence[tuple[float, bool, float]], t0: float, t1: float) -> float:
    """Seconds of ``[t0, t1]`` during which the engine had work. ``series``: ``(t, busy, lead_s)``
    in time order (:func:`busy_series`; seconds): a busy spell runs from its first busy sample
    (moved back by its ``lead_s``, never before the end of the spell before it) to the next idle
    sample (the last until ``t1``); before the first sample nothing is known and nothing counted."""
    total, i, last_end = 0.0, 0, None
    while i < len(series):
        t, busy, lead = series[i]
        if not busy:
            i += 1
            continue
        j = i
        while j + 1 < len(series) and series[j + 1][1]:
            j += 1
        start = t - lead if i else t
        if last_end is not None:
            start = max(start, last_end)
        end = series[j + 1][0] if j + 1 < len(series) else t1
        lo, hi = max(start, t0), min(end, t1)
        if hi > lo:
            total += hi - lo
        last_end, i = end, j + 1
    return total


def _at(samples: Sequence[tuple[float, dict[str, float]]], t: float, after: bool) -> dict[str, float] | None:
    """The counters of the last sample at or before ``t`` (``after`` False) or the first at or after it."""
    if after:
        return next((c for ts, c in samples if ts >= t), samples[-1][1] if samples else None)
    before = [c for ts, c in samples if ts <= t]
    return before[-1] if before else (samples[0][1] if samples else None)


def phase_rows(phases: Sequence[dict[str, Any]], windows: dict[str, tuple[float, float]],
               samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per phase of ``summary.json`` (``{"name", "seconds"}``, in order): ``wall_s`` (kvgate's
    phase seconds); for a gate phase with a recorded window (``windows``: phase name -> ``(t0, t1)``
    on the samples' clock) also ``busy_s`` (:func:`busy_seconds`, at most the wall), ``idle_s`` =
    wall - busy, ``request_s`` (prefill + decode seconds summed over the requests that finished),
    ``requests``, ``prompt_tokens``, ``generation_tokens`` (counter deltas between the samples
    around the window). ``samples``: ``{"t", "metrics"}`` (:func:`read_metrics`), in time order."""
    series = busy_series(samples)
    counter_series = [(s["t"], s["metrics"]) for s in samples]
    rows = []
    for p in phases:
        wall = float(p.get("seconds") or 0.0)
        row: dict[str, Any] = {"phase": p["name"], "wall_s": round(wall, 3)}
        win = windows.get(p["name"])
        if win is not None and samples and win[1] > samples[0]["t"]:
            t0, t1 = win
            busy = min(wall, busy_seconds(series, t0, t1))
            a, b = _at(counter_series, t0, after=False) or {}, _at(counter_series, t1, after=True) or {}

            def d(name: str) -> float:
                return max(0.0, b.get(name, 0.0) - a.get(name, 0.0))

            row.update(busy_s=round(busy, 3), idle_s=round(max(0.0, wall - busy), 3),
                       request_s=round(d("vllm:request_prefill_time_seconds_sum")
                                       + d("vllm:request_decode_time_seconds_sum"), 3),
                       requests=int(d("vllm:e2e_request_latency_seconds_count")),
                       prompt_tokens=int(d("vllm:prompt_tokens_total")),
                       generation_tokens=int(d("vllm:generation_tokens_total")))
        rows.append(row)
    return rows


def totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run in four numbers (seconds): ``wall_s`` (every phase), ``no_server_s`` (prepare model,
    collect, launch, teardown), ``gates_s`` (the gate phases), ``busy_s`` / ``idle_s`` of the gate
    phases that were measured, and ``idle_share`` = idle / measured gate wall (kvgate's share)."""
    wall = sum(r["wall_s"] for r in rows)
    pre = sum(r["wall_s"] for r in rows if r["phase"] in NO_SERVER)
    measured = [r for r in rows if "busy_s" in r]
    mwall = sum(r["wall_s"] for r in measured)
    busy = sum(r["busy_s"] for r in measured)
    idle = sum(r["idle_s"] for r in measured)
    return {"wall_s": round(wall, 2), "no_server_s": round(pre, 2), "gates_s": round(wall - pre, 2),
            "measured_gates_s": round(mwall, 2), "busy_s": round(busy, 2), "idle_s": round(idle, 2),
            "idle_share": round(idle / mwall, 3) if mwall else None,
            "request_s": round(sum(r["request_s"] for r in measured), 2),
            "prompt_tokens": sum(r["prompt_tokens"] for r in measured),
            "generation_tokens": sum(r["generation_tokens"] for r in measured)}


def table(rows: Sequence[dict[str, Any]], min_wall_s: float = 1.0) -> list[str]:
    """Console lines: the phases of at least ``min_wall_s`` (the rest folded into one line), then the totals."""
    out = [f"{'phase':<58} {'wall s':>7} {'busy s':>7} {'idle s':>7} {'req s':>7} {'prompt':>7} {'gen':>6}"]
    small = [r for r in rows if r["wall_s"] < min_wall_s]
    for r in rows:
        if r["wall_s"] < min_wall_s:
            continue
        if "busy_s" in r:
            out.append(f"{r['phase'][:58]:<58} {r['wall_s']:>7.2f} {r['busy_s']:>7.2f} {r['idle_s']:>7.2f} "
                       f"{r['request_s']:>7.2f} {r['prompt_tokens']:>7,} {r['generation_tokens']:>6,}")
        else:
            out.append(f"{r['phase'][:58]:<58} {r['wall_s']:>7.2f} {'-':>7} {'-':>7}")
    if small:
        sb = sum(r.get("busy_s", 0.0) for r in small)
        out.append(f"{f'({len(small)} phases under {min_wall_s:g} s)':<58} {sum(r['wall_s'] for r in small):>7.2f} "
                   f"{sb:>7.2f} {sum(r.get('idle_s', 0.0) for r in small):>7.2f}")
    t = totals(rows)
    share = "n/a" if t["idle_share"] is None else f"{t['idle_share']:.0%}"
    out.append(f"total {t['wall_s']:.1f} s: {t['no_server_s']:.1f} s before/without the server (model, collection, "
               f"start-up, teardown), {t['gates_s']:.1f} s of gates; of the {t['measured_gates_s']:.1f} s measured, "
               f"the engine busy {t['busy_s']:.1f} s, idle {t['idle_s']:.1f} s ({share}: kvgate's waits, prompt "
               f"building, serial steps, verdicts); {t['prompt_tokens']:,} prompt and {t['generation_tokens']:,} "
               f"generated tokens, {t['request_s']:.1f} request-seconds")
    return out


# ----------------------------------------------------------------------------- the plugin (inside the run)


class Recorder:
    """The pytest side: a ``/metrics`` sampler thread once the run has its endpoint, and each gate
    test's window; :meth:`dump` writes both to ``path``."""

    def __init__(self, config: Any, path: Path, interval_s: float) -> None:
        self.config, self.path, self.interval_s = config, path, interval_s
        self.windows: dict[str, tuple[float, float]] = {}
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def _endpoint(self) -> Any:
        from kvgate.run.session import RUN

        run = self.config.stash.get(RUN, None)
        return getattr(run, "endpoint", None)

    def _sample(self, endpoint: Any) -> None:
        from kvgate.http.client import KvClient

        client = KvClient(endpoint, timeout_s=5.0)
        try:
            while not self.stop.is_set():
                t = time.monotonic()
                try:
                    r = client.get("/metrics", timeout_s=5.0)
                    if r.status == 200:
                        self.samples.append({"t": t, "metrics": read_metrics(r.text)})
                except Exception:  # the server went away (drain): stop sampling  # noqa: BLE001
                    return
                self.stop.wait(max(0.0, self.interval_s - (time.monotonic() - t)))
        finally:
            client.close()

    def start_if_ready(self) -> None:
        if self.thread is None and (ep := self._endpoint()) is not None:
            self.thread = threading.Thread(target=self._sample, args=(ep,), name="overhead-sampler", daemon=True)
            self.thread.start()

    def dump(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=10)
        names = list(GAUGES + COUNTERS)  # one row per sample: t, then each name's value (None: absent)
        rows = [[round(x["t"], 4), *(x["metrics"].get(n) for n in names)] for x in self.samples]
        self.path.write_text(json.dumps({"interval_s": self.interval_s, "windows": self.windows, "names": names,
                                         "rows": rows}, separators=(",", ":")))


_RECORDER: Recorder | None = None


def pytest_configure(config: Any) -> None:
    global _RECORDER
    out = os.environ.get(OUT_ENV)
    if out:
        _RECORDER = Recorder(config, Path(out), float(os.environ.get(INTERVAL_ENV, "0.25")))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    rec = _RECORDER
    if rec is None or item.get_closest_marker("gate") is None:
        return (yield)
    from kvgate.run.session import test_id

    t0 = time.monotonic()
    try:
        return (yield)
    finally:
        rec.windows[f"gate {test_id(item)}"] = (t0, time.monotonic())


def pytest_runtest_call(item: Any) -> None:
    if _RECORDER is not None:
        _RECORDER.start_if_ready()  # the endpoint exists from the first live test's setup on


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    if _RECORDER is not None:
        _RECORDER.dump()


# ----------------------------------------------------------------------------- the command


def samples_of(recording: dict[str, Any]) -> list[dict[str, Any]]:
    """The recording's samples as ``{"t", "metrics"}`` (the file keeps ``names`` once and a row
    ``[t, value, ...]`` per sample; an absent value is left out)."""
    if "samples" in recording:
        return recording["samples"]
    names = recording["names"]
    return [{"t": r[0], "metrics": {n: v for n, v in zip(names, r[1:]) if v is not None}} for r in recording["rows"]]


def analyze(recording: dict[str, Any], phases: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows and totals of one run (``recording``: the plugin's file; ``phases``: summary.json's)."""
    windows = {k: tuple(v) for k, v in recording["windows"].items()}
    rows = phase_rows(phases, windows, samples_of(recording))
    return {"rows": rows, "totals": totals(rows)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="smollm2-cpu")
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between /metrics samples")
    ap.add_argument("--analyze", type=Path, help="print the table of a saved result instead of running")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = ap.parse_args(argv)
    if args.analyze:
        saved = json.loads(args.analyze.read_text())
        result = analyze(saved["recording"], saved["phases"])
        print("\n".join(table(result["rows"])))
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvgate-overhead-") as tmp:
        rec_path, reports = Path(tmp) / "recording.json", Path(tmp) / "reports"
        env = {**os.environ, OUT_ENV: str(rec_path), INTERVAL_ENV: str(args.interval),
               "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        cmd = [sys.executable, "-m", "pytest", "--profile", args.profile, "-p", "main_job_overhead",
               f"--kvgate-reports={reports}", "-p", "no:cacheprovider", *args.pytest_args]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=3600)
        wall = time.monotonic() - t0
        summary = json.loads((reports / "summary.json").read_text())
        recording = json.loads(rec_path.read_text())
    result = analyze(recording, summary["phases"])
    lines = table(result["rows"])
    print("\n".join(lines))
    stamp = time.strftime("%Y%m%dT%H%M%S")
    load = os.getloadavg()
    saved = {"profile": args.profile, "command": cmd, "exit_code": proc.returncode, "process_wall_s": round(wall, 1),
             "loadavg_1_5_15": [round(x, 2) for x in load], "overall": summary.get("overall"),
             "gates": [{"id": g.get("id"), "status": g.get("status"), "message": g.get("message")}
                       for g in summary.get("gates", [])],
             "phases": summary["phases"], "recording": recording, **result, "table": lines}
    for name in (f"main_job_overhead-{stamp}.json", "main_job_overhead-latest.json"):
        (RESULTS / name).write_text(json.dumps(saved, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
