"""How short can a soak be and still find a 1 MB/min leak? How often does a healthy soak cry wolf?

Not a test. Starts the embedded vLLM (tiny-cpu) once, plus a *leaker*: a separate process that
retains 1 MB per minute of real, touched memory (``--leak-mb-per-min``). Then one long run of the
real soak runner (:class:`kvgate.soak.runner.SoakRunner`, the tiny-cpu soak plan: rounds of 8 s at
2 req/s) samples every second, side by side:

- ``healthy``: the server's process tree (what the soak gate measures: PSS + swap);
- ``leaky``: the server's process tree **plus** the leaker (the same server noise, with a known
  leak on top).

Both raw series (1 s), the round rows and the run's settings go to
``benchmarks/results/soak_leak-<time>.json``. Then, offline (``--analyze FILE`` re-runs only
this part):

- **false alarms**: the run after ``--settle`` seconds is cut into back-to-back soaks of the
  tiny-cpu plan's length (warm-up rounds included, not fitted); each is judged by
  :func:`kvgate.gates.soak.analyze` with the profile's ceilings, memory and latency halves;
- **detection**: for windows of the leaky series starting at every round after ``--settle``,
  the shortest length (rounds) at which the memory half FAILs and keeps failing to the end of
  the run, judged against ``--ceiling`` MB/h (default: the profile's).

Loopback only; bounded (the soak has its duration and hard deadline; the leaker is killed at the
end). ``flock /tmp/kvgate-vllm.lock .venv/bin/python benchmarks/soak_leak.py --minutes 14``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from kvgate.http.client import Endpoint, KvClient  # noqa: E402
from kvgate.launch.local import EmbeddedServer  # noqa: E402
from kvgate.launch.tinymodel import TinySpec, ensure_model  # noqa: E402
from kvgate.load import new_event_loop  # noqa: E402
from kvgate.profile.models import load_profile  # noqa: E402
from kvgate.soak.sampling import ProcessTreeSampler, SamplingLoop  # noqa: E402
from kvgate.soak.runner import (  # noqa: E402
    SoakResult,
    SoakRunner,
    build_samplers,
    mix_of,
    open_loop_sender,
    plan_for,
    soak_spec,
    with_prompts,
)
from kvgate.stats import growth  # noqa: E402

LEAKER = """
import os, sys, time
rate = float(sys.argv[1]) * 1e6 / 60.0   # bytes per second
step = 0.5
keep, t0, n = [], time.monotonic(), 0
print("ready", flush=True)
for i in range(10**7):
    due = t0 + i * step
    time.sleep(max(0.0, due - time.monotonic()))
    want = int(rate * (i * step))
    if want > n:
        keep.append(os.urandom(want - n))  # random bytes: every page touched, nothing shared
        n = want
"""


def run(args: argparse.Namespace) -> Path:
    profile = load_profile("tiny-cpu")
    spec = soak_spec(profile, f"{args.minutes}m")
    out_dir = REPO / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    model_dir = ensure_model(TinySpec.from_architecture(profile.model.architecture))
    server = EmbeddedServer(profile, model_dir, out_dir / f"soak_leak-{stamp}-vllm.log")
    leaker = None
    try:
        t_start = time.monotonic()
        url = server.start()
        startup_s = time.monotonic() - t_start
        leaker = subprocess.Popen([sys.executable, "-c", LEAKER, str(args.leak_mb_per_min)], stdout=subprocess.PIPE,
                                  start_new_session=True)
        assert leaker.stdout is not None and leaker.stdout.readline().strip() == b"ready"
        ep = Endpoint(url)
        model = profile.model.served_name
        with KvClient(ep) as c:
            mix = with_prompts(c, model, mix_of(profile, spec), spec.seed)
        plan = plan_for(profile, spec, mix)
        samplers = build_samplers(profile, spec, ep, [server.pid])
        raw: dict[str, list[tuple[float, float | None]]] = {"healthy": [], "leaky": []}
        leaky = ProcessTreeSampler([server.pid, leaker.pid], label="server + leaker")
        leaky.name = "leaky"

        def record(t: float, readings: dict) -> None:
            raw["leaky"].append((t, readings["leaky"].get("memory")))

        def progress(line: str) -> None:
            print(line, flush=True)

        runner = SoakRunner(plan, open_loop_sender(ep, plan.request_timeout_s), samplers,
                            requests=lambda k: plan.requests(k, ep, model), progress=progress)
        orig_tick = runner._on_tick

        def on_tick(t: float, readings: dict) -> None:  # keep the healthy raw series too
            raw["healthy"].append((t, (readings.get("server-memory") or {}).get("memory")))
            orig_tick(t, readings)

        runner._on_tick = on_tick  # type: ignore[method-assign]

        async def both() -> SoakResult:
            side = SamplingLoop([leaky], plan.sample_period_s, record, max_ticks=int(plan.duration_s / plan.sample_period_s) + 5)
            task = asyncio.ensure_future(side.run(time.monotonic() + plan.duration_s))
            try:
                return await runner.run()
            finally:
                side.stop()
                await asyncio.gather(task, return_exceptions=True)

        loop = new_event_loop()
        try:
            result = loop.run_until_complete(both())
        finally:
            loop.close()
        t0 = runner._t0
        data = {
            "settings": {"minutes": args.minutes, "leak_mb_per_min": args.leak_mb_per_min, "startup_s": startup_s,
                         "plan": {k: v for k, v in dataclasses.asdict(plan).items() if k != "mix"},
                         "spec": spec.model_dump(), "machine_cpus": os.cpu_count(),
                         "server_cpus": sorted(server.server_cpus) if server.server_cpus else "all"},
            "t0": t0,
            "rows": result.rows,
            "raw": {k: [(round(t - t0, 3), v) for t, v in series] for k, series in raw.items()},
            "samplers": result.samplers,
        }
        path = out_dir / f"soak_leak-{stamp}.json"
        path.write_text(json.dumps(data))
        return path
    finally:
        if leaker is not None:
            os.killpg(leaker.pid, signal.SIGKILL)
            leaker.wait(5)
        server.stop()


def _envelope(rows: list[dict], raw: list[tuple[float, float | None]]) -> list[float | None]:
    """Each round's low envelope (MB) of a raw series (t in seconds since the soak started)."""
    out = []
    for r in rows:
        vals = [v for t, v in raw if r["t_start_s"] <= t < r["t_end_s"] and v is not None]
        out.append(min(vals) / 1e6 if vals else None)
    return out


def _judge(rows: list[dict], mem: list[float | None], start: int, n: int, warm: int, round_s: float, spec) -> dict:
    """The soak gate's memory and TTFT decisions for rounds ``start .. start+n`` as one soak
    (its first ``warm`` rounds not fitted), exactly as :func:`kvgate.gates.soak.analyze` judges: each fit at
    ``spec.look_confidence``; memory FAIL when growth :attr:`~kvgate.stats.Growth.exceeds`, PASS only when its
    absence is shown (:attr:`~kvgate.stats.Growth.below`: ``bounded`` needs a plateau whose last part's upper
    bound is under the ceiling), else INCONCLUSIVE (a ``rose`` never PASSes)."""
    idx = [i for i in range(start + warm, start + n) if mem[i] is not None]
    xs = [(rows[i]["t_start_s"] + round_s / 2) / 3600 for i in idx]
    g = growth(xs, [mem[i] for i in idx], spec.memory_slope_max_mb_per_h, spec.look_confidence, spec.last_part)
    tdx = [i for i in range(start + warm, start + n) if rows[i]["ttft_p95_ms"] is not None and rows[i]["client_kept_up"]]
    t = growth([(rows[i]["t_start_s"] + round_s / 2) / 3600 for i in tdx], [rows[i]["ttft_p95_ms"] for i in tdx],
               spec.ttft_p95_slope_max_ms_per_h, spec.look_confidence, spec.last_part) if len(tdx) >= 4 else None
    c = spec.ttft_p95_slope_max_ms_per_h
    ttft_fail = bool(t and (t.full.above(c) or (t.last is not None and t.last.above(c))))
    outcome = "FAIL" if g.exceeds else ("PASS" if g.below else "INCONCLUSIVE")
    return {"start_s": rows[start]["t_start_s"], "memory_fail": g.exceeds, "memory_kind": g.kind,
            "memory_outcome": outcome, "memory_inconclusive": outcome == "INCONCLUSIVE",
            "memory_slope": round(g.full.slope, 2), "memory_ci": [round(g.full.ci_low, 2), round(g.full.ci_high, 2)],
            "ttft_fail": ttft_fail, "lagged": sum(1 for i in range(start + warm, start + n) if not rows[i]["client_kept_up"])}


def _kinds(res: list[dict]) -> dict[str, int]:
    """How many windows' memory series were each :attr:`kvgate.stats.Growth.kind` (growth, step,
    bounded, rose, flat)."""
    return {k: sum(1 for x in res if x["memory_kind"] == k) for k in sorted({x["memory_kind"] for x in res})}


def evaluate(path: Path, settle_s: float, ceiling: float | None) -> dict:
    """False alarms and detection, judged with the tiny-cpu soak's rules (``ceiling`` overrides the
    memory ceiling): back-to-back healthy soaks, sliding windows of several lengths."""
    data = json.loads(path.read_text())
    spec = soak_spec(load_profile("tiny-cpu"))
    if ceiling is not None:
        spec = spec.model_copy(update={"memory_slope_max_mb_per_h": ceiling})
    round_s = data["settings"]["plan"]["round_s"]
    rows = data["rows"]
    healthy = _envelope(rows, data["raw"]["healthy"])
    leaky = _envelope(rows, data["raw"]["leaky"])
    first = next(i for i, r in enumerate(rows) if r["t_start_s"] >= settle_s)
    warm = spec.warmup_rounds
    out: dict = {"file": str(path), "settle_s": settle_s, "round_s": round_s, "rounds": len(rows),
                 "ceiling_mb_per_h": spec.memory_slope_max_mb_per_h,
                 "ttft_ceiling_ms_per_h": spec.ttft_p95_slope_max_ms_per_h, "warmup_rounds": warm,
                 "startup_s": data["settings"]["startup_s"]}
    # back-to-back healthy soaks (no overlap), at the profile's length and a shorter one
    for n in sorted({spec.rounds, 8}):
        soaks = [_judge(rows, healthy, s, n, warm, round_s, spec) for s in range(first, len(rows) - n + 1, n)]
        leaks = [_judge(rows, leaky, s, n, warm, round_s, spec) for s in range(first, len(rows) - n + 1, n)]
        out[f"back_to_back_{n * round_s:g}s"] = {
            "soaks": len(soaks), "memory_false_alarms": sum(x["memory_fail"] for x in soaks),
            "latency_false_alarms": sum(x["ttft_fail"] for x in soaks),
            "memory_inconclusive": sum(x["memory_inconclusive"] for x in soaks),
            "healthy_kinds": _kinds(soaks),
            "leak_found": sum(x["memory_fail"] for x in leaks),
            "leak_inconclusive": sum(x["memory_inconclusive"] for x in leaks), "healthy": soaks}
    # sliding windows: how often a soak of each length finds the leak / cries wolf
    curve = []
    for n in (8, 10, 12, 15, 20, 30, 45, 60, 80):
        starts = range(first, len(rows) - n + 1)
        if not starts:
            continue
        h = [_judge(rows, healthy, s, n, warm, round_s, spec) for s in starts]
        lk = [_judge(rows, leaky, s, n, warm, round_s, spec) for s in starts]
        curve.append({"soak_s": n * round_s, "windows": len(h),
                      "leak_found": round(sum(x["memory_fail"] for x in lk) / len(lk), 3),
                      "memory_false_alarms": round(sum(x["memory_fail"] for x in h) / len(h), 3),
                      "memory_inconclusive": round(sum(x["memory_inconclusive"] for x in h) / len(h), 3),
                      "leak_inconclusive": round(sum(x["memory_inconclusive"] for x in lk) / len(lk), 3),
                      "latency_false_alarms": round(sum(x["ttft_fail"] for x in h) / len(h), 3)})
    out["sliding_windows"] = curve
    shortest = next((c["soak_s"] for c in curve if c["leak_found"] >= 0.95), None)
    out["shortest_soak_finding_the_leak_in_95pct_of_windows_s"] = shortest
    secs = []
    for s in range(first, len(rows) - 4):
        for n in range(warm + 4, len(rows) - s + 1):
            if _judge(rows, leaky, s, n, warm, round_s, spec)["memory_fail"]:
                secs.append(n * round_s)
                break
    out["first_detection_s"] = ({"windows": len(range(first, len(rows) - 4)), "found": len(secs), "min": min(secs),
                                 "median": statistics.median(secs), "max": max(secs)} if secs else None)
    h_all = growth([(r["t_start_s"] + round_s / 2) / 3600 for r, m in zip(rows[first:], healthy[first:]) if m is not None],
                   [m for m in healthy[first:] if m is not None], spec.memory_slope_max_mb_per_h)
    out["healthy_whole_run"] = {"mb_first": healthy[first], "mb_max": max(m for m in healthy if m is not None),
                                "mb_last": healthy[-1], "slope_mb_per_h": round(h_all.full.slope, 2),
                                "ci": [round(h_all.full.ci_low, 2), round(h_all.full.ci_high, 2)]}
    return out


#: Patterns injected on the recorded healthy series by :func:`injected` (MB added at each round's
#: midpoint, t in seconds since the window's first measured round; ``longs``: long requests per round).
LEAKS_MB_PER_MIN = (0.5, 1.0, 2.0, 8.0)
LONG_LEAK_MB = 2.0     # issue 33's proxy: 2 MB retained per long request
LONGS_PER_ROUND = 8.0  # tiny-cpu's default mix: half of 2 req/s x 8 s rounds are 1,900-token prompts
STEP_MB = 60.0         # the embedded server's one-off step (+40..+68 MB)


def injected(path: Path, settle_s: float, seed: int = 0) -> dict:
    """Detection and false alarms of the tiny-cpu memory rule on the recorded *healthy* series with
    known patterns added, every back-to-back and sliding window of the profile's soak length (80 s):
    linear leaks of :data:`LEAKS_MB_PER_MIN`; a leak of :data:`LONG_LEAK_MB` per long request
    (Poisson :data:`LONGS_PER_ROUND` a round, seeded); a one-off +:data:`STEP_MB` MB step in a random
    measured round with at least 2 rounds after it (must PASS); and the healthy series as it is."""
    import numpy as np

    data = json.loads(path.read_text())
    spec = soak_spec(load_profile("tiny-cpu"))
    round_s = data["settings"]["plan"]["round_s"]
    rows = data["rows"]
    healthy = _envelope(rows, data["raw"]["healthy"])
    first = next(i for i, r in enumerate(rows) if r["t_start_s"] >= settle_s)
    n, warm = spec.rounds, spec.warmup_rounds
    rng = np.random.default_rng(seed)
    starts = list(range(first, len(rows) - n + 1))

    def judged(extra) -> list[dict]:
        out = []
        for s0 in starts:
            add = extra(s0)
            mem = [None if healthy[i] is None else healthy[i] + add[i - s0] for i in range(len(healthy)) if s0 <= i < s0 + n]
            padded = [None] * s0 + mem + [None] * (len(rows) - s0 - n)
            out.append(_judge(rows, padded, s0, n, warm, round_s, spec))
        return out

    def share(res: list[dict], key: str = "memory_fail") -> dict:
        k = sum(bool(x[key]) for x in res)
        u = sum(bool(x["memory_inconclusive"]) for x in res)
        return {"windows": len(res), "fail": k, "share": round(k / len(res), 3), "inconclusive": u,
                "kinds": _kinds(res)}

    out: dict = {"file": str(path), "soak_s": n * round_s, "measured_rounds": n - warm, "windows": len(starts),
                 "ceiling_mb_per_h": spec.memory_slope_max_mb_per_h, "healthy": share(judged(lambda s0: [0.0] * n))}
    for rate in LEAKS_MB_PER_MIN:
        out[f"leak_{rate:g}_mb_per_min"] = share(judged(lambda s0, r=rate: [r * k * round_s / 60 for k in range(n)]))

    def long_leak(s0: int) -> list[float]:
        per = rng.poisson(LONGS_PER_ROUND, n) * LONG_LEAK_MB
        return np.cumsum(per).tolist()

    out[f"leak_{LONG_LEAK_MB:g}_mb_per_long_request"] = share(judged(long_leak))
    steps = []

    def step(s0: int) -> list[float]:
        at = int(rng.integers(warm + 1, n - 2))  # a measured round, 2 or more rounds after it
        steps.append(at)
        return [STEP_MB if k >= at else 0.0 for k in range(n)]

    res = judged(step)
    out[f"step_{STEP_MB:g}_mb"] = share(res)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=14.0, help="length of the whole run (default 14)")
    ap.add_argument("--leak-mb-per-min", type=float, default=1.0)
    ap.add_argument("--settle", type=float, default=64.0, help="seconds at the start not used (server warm-up)")
    ap.add_argument("--ceiling", type=float, default=None, help="MB/h for the detection windows (default: profile's)")
    ap.add_argument("--analyze", type=Path, default=None, help="only analyse an earlier results file")
    ap.add_argument("--inject", action="store_true", help="with --analyze: detection of known leaks and of a "
                    "one-off step injected on the recorded healthy series (issue 33)")
    args = ap.parse_args()
    if args.inject and args.analyze:
        res = injected(args.analyze, args.settle)
        print(json.dumps(res, indent=2))
        args.analyze.with_name(args.analyze.stem + "-injected.json").write_text(json.dumps(res, indent=2))
        return 0
    path = args.analyze or run(args)
    res = evaluate(path, args.settle, args.ceiling)
    print(json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "healthy"} if isinstance(v, dict) else v)
                      for k, v in res.items()}, indent=2))
    path.with_name(path.stem + "-analysis.json").write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
