"""Replay accuracy: how far the replayed schedule's send times are from the trace's arrival times.

Not a test. For each rate (default 10, 100 and 500 requests/s) a synthetic trace of ``--seconds``
of Poisson arrivals (seeded) is replayed open loop with :func:`kvgate.traffic.replay.run_replay`
against benchmarks/fake_sse_server.py (no injected delays; 16 events per request), the server
pinned to CPU 0 and this client to CPU 1 as in bench_client.py. A third of the arrivals open a
3-turn session whose later turns are recorded ``--think-s`` after the previous one, so the replay
also sends dependent turns (each after the previous reply; the fake has no ``/tokenize``, so
prompts are token ids).

Per request: **error** = ``sent_s`` - its planned offset (ms; connection set-up included) and
**lag** = the schedule lag the gates judge (``sent_s - scheduled_s - connect_s``; for a dependent
turn ``scheduled_s`` is the later of its offset and the moment its prompt was ready, see
:mod:`kvgate.load.sessions`). p50/p99/max over first turns and single requests (the trace's own
arrivals) and, separately, over dependent turns. Loopback only; every run bounded by a deadline.

    .venv/bin/python benchmarks/replay_accuracy.py                  # ~15 s quiet, up to ~2 min busy
    .venv/bin/python benchmarks/replay_accuracy.py --rates 10,100,500,1000 --seconds 5

Prints a table and writes benchmarks/results/replay_accuracy-latest.json (and a timestamped copy). On a shared
machine each rate runs up to ``--repeat`` times and the least disturbed run is reported (column
``other``: the share of all cores other processes used meanwhile, as in bench_client.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from bench_client import CLIENT_CPU, MODEL, SERVER_CPU, Contention, FakeServer, pct  # noqa: E402

from kvgate.http.client import Endpoint, KvClient  # noqa: E402
from kvgate.profile.models import TrafficSpec  # noqa: E402
from kvgate.traffic.replay import plan_replay, run_replay  # noqa: E402
from kvgate.traffic.sample import TraceRequest, TrafficSample  # noqa: E402

PROFILE = SimpleNamespace(model=SimpleNamespace(served_name=MODEL),
                          limits=SimpleNamespace(request_timeout_s=30.0, stream_idle_timeout_s=None))


def trace(rate: float, seconds: float, think_s: float, seed: int) -> TrafficSample:
    """Poisson arrivals at ``rate``/s for ``seconds``; every third one opens a 3-turn session."""
    rng = np.random.default_rng(seed)
    n = max(1, int(rate * seconds))
    t = np.cumsum(rng.exponential(1.0 / rate, size=n))
    rows: list[TraceRequest] = []
    for i, a in enumerate(t):
        if i % 3 == 0:
            rows += [TraceRequest(32 + 48 * k, 16, arrival_s=float(a + k * think_s), session=f"s{i}", turn=k)
                     for k in range(3)]
        else:
            rows.append(TraceRequest(32, 16, arrival_s=float(a)))
    return TrafficSample(tuple(rows), f"synthetic-{rate:g}rps", "-" * 64, "jsonl")


def stats(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "p50": pct(xs, 50), "p99": pct(xs, 99), "max": max(xs, default=None)}


def run_rate(srv: FakeServer, rate: float, a: argparse.Namespace) -> dict[str, Any]:
    sample = trace(rate, a.seconds, a.think_s, a.seed)
    plan = plan_replay(sample, TrafficSpec(path=sample.path, replay="open", max_duration_s=a.seconds + 3 * a.think_s),
                       concurrency=1)
    ep = Endpoint(srv.url)
    with KvClient(ep) as client:
        res = run_replay(client, ep, PROFILE, plan, tag="bench", deadline_s=a.seconds + 3 * a.think_s + 10.0)
    first_err, first_lag, dep_err, dep_lag = [], [], [], []
    for r in res.result.records:
        it = plan.items[r.index]
        if r.sent_s is None or it.offset_s is None:
            continue
        err, lag = (r.sent_s - it.offset_s) * 1e3, (r.lag_s or 0.0) * 1e3
        (dep_err if it.turn else first_err).append(err)
        (dep_lag if it.turn else first_lag).append(lag)
    ok = sum(r.ok for r in res.result.records)
    return {
        "rate_rps": rate, "planned": len(plan.items), "sent": len(res.result.records), "ok": ok,
        "sessions": plan.sessions, "wall_s": res.result.wall_s, "cpu_s": res.result.cpu_s,
        "error_ms": stats(first_err), "lag_ms": stats(first_lag),
        "dependent_error_ms": stats(dep_err), "dependent_lag_ms": stats(dep_lag),
        "p99_loop_lag_ms": res.result.p99_loop_lag_s * 1e3,
        "client_kept_up_10ms": res.result.client_kept_up(0.010), "connections": res.result.connections_opened,
        "build_p99_ms": res.cache.get("build_p99_ms"), "not_sent": res.cache.get("not_sent"),
    }


def fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| rate req/s | requests | ok | error p50 ms | p99 ms | max ms | lag p99 ms | dependent turns | "
            "dep. error p50 ms | p99 ms | dep. lag p99 ms | loop lag p99 ms | other |")
    out = [head, "|" + "---:|" * (head.count("|") - 1)]
    for r in rows:
        e, l, de, dl = r["error_ms"], r["lag_ms"], r["dependent_error_ms"], r["dependent_lag_ms"]
        other = r.get("contention", {}).get("foreign_frac")
        out.append(f"| {r['rate_rps']:g} | {r['planned']} | {r['ok']} | {fmt(e['p50'])} | {fmt(e['p99'])} | "
                   f"{fmt(e['max'])} | {fmt(l['p99'])} | {de['n']} | {fmt(de['p50'])} | {fmt(de['p99'])} | "
                   f"{fmt(dl['p99'])} | {fmt(r['p99_loop_lag_ms'])} | "
                   f"{'-' if other is None else f'{other:.0%}'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="10,100,500", help="comma-separated arrival rates, requests/s")
    ap.add_argument("--seconds", type=float, default=4.0, help="trace length per rate, s")
    ap.add_argument("--think-s", type=float, default=0.2, help="recorded gap between a session's turns, s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wait-quiet-s", type=float, default=10.0,
                    help="before each rate, wait up to this long for other processes to fall below 2 %% of the cores")
    ap.add_argument("--repeat", type=int, default=3,
                    help="at most this many runs per rate; the least disturbed one is reported (all are in the JSON)")
    ap.add_argument("--quiet-frac", type=float, default=0.02,
                    help="stop repeating once other processes used less than this share of the cores")
    ap.add_argument("--out", default=str(HERE / "results"))
    a = ap.parse_args(argv)
    rates = [float(x) for x in a.rates.split(",") if x]
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    pinned = ncpu >= 2
    srv = FakeServer(0.0, 0.0, SERVER_CPU if pinned else None, 600)
    if pinned:
        os.sched_setaffinity(0, {CLIENT_CPU})
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": sys.version.split()[0],
                               "platform": platform.platform(), "cpus": ncpu, "pinned": pinned,
                               "config": vars(a), "runs": []}
    try:
        cont = Contention([srv])
        for rate in rates:
            tries = []
            for _ in range(max(1, a.repeat)):
                cont.wait_quiet(a.quiet_frac, a.wait_quiet_s)
                cont.start()
                row = run_rate(srv, rate, a)
                row["contention"] = cont.stop()
                tries.append(row)
                if row["contention"]["foreign_frac"] < a.quiet_frac:
                    break
            row = min(tries, key=lambda r: r["contention"]["foreign_frac"])
            row["tries"] = [{"foreign_frac": r["contention"]["foreign_frac"], "error_ms": r["error_ms"]} for r in tries]
            results["runs"].append(row)
            print(f"{rate:g} req/s: error p50 {fmt(row['error_ms']['p50'])} ms, p99 {fmt(row['error_ms']['p99'])} ms",
                  file=sys.stderr)
    finally:
        srv.close()
    print(table(results["runs"]))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1)
    (out / f"replay_accuracy-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(text)
    (out / "replay_accuracy-latest.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
