"""Resource samplers for the soak: one interface, several sources, each naming what it covers.

Every sampler has ``name``, ``source`` (where the numbers come from), ``covers`` (what they
include and what they miss — this goes into the report verbatim), ``reads`` (how many samples
it took), ``errors``/``last_error``, ``async sample() -> dict[str, float | None]`` and
``async aclose()``. Values are **bytes** (memory) or plain numbers (gauges); ``None`` means
"not measurable in this sample". ``sample()`` never raises on a failed read: the failure is
counted and the reading is ``None``.

Sources:

- :class:`ProcessTreeSampler` — a locally launched server: psutil over the whole process tree
  (vLLM's API server, engine core and workers are separate processes). ``memory`` = PSS + swap
  summed over the tree (PSS splits shared pages between processes, so the sum counts each page
  once; swap because a leak whose pages are swapped out looks flat in RSS alone); ``rss``,
  ``pss``, ``uss``, ``swap`` and ``processes`` beside it. Where ``memory_full_info`` is denied,
  RSS is used and ``quantity`` says so.
- :class:`ServerMetricsSampler` — ``GET /metrics`` over **one** connection (httpx, a connection
  limit of 1): vLLM's ``running``, ``waiting``, ``kv_usage``, ``preemptions`` and
  ``process_resident_memory_bytes``.
- :class:`MetricsMemorySampler` — memory from the last scrape of a :class:`ServerMetricsSampler`
  (no extra request): ``process_resident_memory_bytes``, which covers the **API-server process
  only** (vLLM's engine core and workers, where the KV cache and the model live, are not in it).
- :class:`PrometheusSampler` — a PromQL query against a Prometheus HTTP API (``/api/v1/query``),
  e.g. a KServe pod's ``container_memory_working_set_bytes``; the vector's values are summed.
- :class:`NvmlSampler` — local GPUs via pynvml (``nvidia-ml-py``): used/total per device and the
  peak seen; ``available`` False with a ``reason`` when NVML cannot be loaded or initialised.
- :class:`SelfSampler` — kvgate's own RSS, so the harness can show it is not the leak.

:class:`SamplingLoop` drives a list of samplers at a fixed period on the injected ``clock`` /
``sleep`` (bounded: at most ``max_ticks`` ticks and never past ``until``), so unit tests need no
real time.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol, Sequence

import httpx

from kvgate.http.metrics import MetricsError, parse

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[Any]]
Reading = dict[str, "float | None"]


class Sampler(Protocol):
    """What every sampler provides (see the module docstring)."""

    name: str
    source: str
    covers: str
    reads: int
    errors: int
    last_error: str | None

    async def sample(self) -> Reading: ...

    async def aclose(self) -> None: ...


@dataclass
class _Counts:
    reads: int = 0
    errors: int = 0
    last_error: str | None = None

    def failed(self, why: str) -> None:
        self.errors += 1
        self.last_error = why


def describe(sampler: Any) -> dict[str, Any]:
    """A sampler's self-description for the report: name, source, covers, reads, errors."""
    out = {"name": sampler.name, "source": sampler.source, "covers": sampler.covers, "reads": sampler.reads,
           "errors": sampler.errors, "last_error": sampler.last_error}
    for extra in ("quantity", "available", "reason"):
        if hasattr(sampler, extra):
            out[extra] = getattr(sampler, extra)
    return out


# ----------------------------------------------------------------------------- local process tree


class ProcessTreeSampler(_Counts):
    """Memory of one or more local process trees (each root and all its descendants), bytes.

    ``roots``: pids (e.g. the embedded vLLM's API-server pid; it is its own session leader, so
    the engine core and workers are its descendants). Children are enumerated on every sample,
    so restarted workers are followed. ``psutil_mod``: injectable for tests.

    Reading: ``memory`` (PSS + swap, or RSS where smaps is denied — see ``quantity``), ``rss``,
    ``pss``, ``uss``, ``swap`` (bytes, summed over the tree), ``processes`` (count), ``cpu_s``
    (seconds of user + system CPU the tree's live processes have used: that the tree worked while its
    memory read one value, :func:`kvgate.gates.soak.frozen_memory`). ``memory`` is None when no
    process of the tree is alive.
    """

    name = "server-memory"

    def __init__(self, roots: Sequence[int], *, label: str = "server", psutil_mod: Any = None) -> None:
        super().__init__()
        import psutil

        self.psutil = psutil_mod or psutil
        self.roots = [int(p) for p in roots]
        self.quantity = "PSS + swap"
        self.source = f"psutil, process tree of pid {', '.join(map(str, self.roots))} ({label})"
        self.covers = (f"the {label} process and all its descendants (for vLLM: API server, engine core, workers); "
                       "PSS + swap summed over the tree, so shared pages count once and swapped-out pages still count")
        self._procs: dict[int, Any] = {}

    def _tree(self) -> list[Any]:
        from kvgate.host.contention import process_tree

        return process_tree(self.psutil, self.roots, self._procs)

    def read(self) -> Reading:
        """One synchronous sample (psutil reads ``/proc``); :meth:`sample` runs it in a thread."""
        ps = self.psutil
        self.reads += 1
        totals = {"rss": 0.0, "pss": 0.0, "uss": 0.0, "swap": 0.0}
        cpu: float | None = 0.0
        full = True
        n = 0
        try:
            procs = self._tree()
        except ps.AccessDenied as exc:
            self.failed(f"access denied to the process tree: {exc}")
            return {"memory": None, "processes": 0}
        for p in procs:
            try:
                try:
                    m = p.memory_full_info()
                    totals["rss"] += m.rss
                    totals["pss"] += getattr(m, "pss", m.uss)
                    totals["uss"] += m.uss
                    totals["swap"] += getattr(m, "swap", 0.0)
                except ps.AccessDenied:
                    full = False
                    totals["rss"] += p.memory_info().rss
                try:
                    t = p.cpu_times()
                    cpu = None if cpu is None else cpu + t.user + t.system
                except ps.AccessDenied:
                    cpu = None
                n += 1
            except (ps.NoSuchProcess, ps.ZombieProcess):
                continue
        if n == 0:
            self.failed(f"no process of the tree rooted at {self.roots} is alive")
            return {"memory": None, "processes": 0}
        if not full:
            self.quantity = "RSS (smaps denied: PSS/swap not readable; swapped-out pages are not seen)"
            return {"memory": totals["rss"], "rss": totals["rss"], "pss": None, "uss": None, "swap": None,
                    "processes": float(n), "cpu_s": cpu}
        return {"memory": totals["pss"] + totals["swap"], **totals, "processes": float(n), "cpu_s": cpu}

    async def sample(self) -> Reading:
        return await asyncio.to_thread(self.read)

    async def aclose(self) -> None:
        self._procs.clear()


class SelfSampler(_Counts):
    """kvgate's own resident memory (``rss``, bytes): the harness must not be the leak."""

    name = "kvgate-memory"

    def __init__(self, psutil_mod: Any = None) -> None:
        super().__init__()
        import psutil

        self._proc = (psutil_mod or psutil).Process(os.getpid())
        self.source = f"psutil, this process (pid {os.getpid()})"
        self.covers = "kvgate's own load client and samplers (RSS)"

    async def sample(self) -> Reading:
        self.reads += 1
        return {"rss": float(self._proc.memory_info().rss)}

    async def aclose(self) -> None:
        return None


# ----------------------------------------------------------------------------- /metrics


TRACKED = {"running": "running", "waiting": "waiting", "kv_usage": "kv_usage", "preemptions": "preemptions",
           "process_resident_memory_bytes": "process_resident_memory_bytes"}


class ServerMetricsSampler(_Counts):
    """``GET {base_url}/metrics`` over one httpx connection (``max_connections=1``).

    Reading: ``running``, ``waiting``, ``kv_usage`` (0-1), ``preemptions`` (cumulative counter),
    ``process_resident_memory_bytes`` — each summed over label sets, None when absent. A failed
    scrape (connection error, non-200, not Prometheus text) gives all None and is counted.
    ``transport``: an httpx transport for tests (e.g. ``httpx.MockTransport``).
    """

    name = "server-metrics"

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None, timeout_s: float = 5.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__()
        self.url = base_url.rstrip("/") + "/metrics"
        self.source = f"GET {self.url}"
        self.covers = "vLLM's scheduler gauges and counters (running, waiting, KV usage, preemptions)"
        self.last: Reading = {}
        self.available: bool | None = None
        self._client = httpx.AsyncClient(
            headers=headers, timeout=timeout_s, transport=transport,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))

    async def sample(self) -> Reading:
        self.reads += 1
        empty: Reading = {k: None for k in TRACKED}
        try:
            r = await self._client.get(self.url)
        except httpx.HTTPError as exc:
            self.failed(f"scrape failed: {type(exc).__name__}: {exc}")
            self.last = empty
            return empty
        if r.status_code != 200:
            self.failed(f"GET /metrics answered {r.status_code}")
            self.available = False if self.available is None else self.available
            self.last = empty
            return empty
        try:
            scrape = parse(r.text)
        except MetricsError as exc:
            self.failed(str(exc))
            self.last = empty
            return empty
        self.available = True
        self.last = {k: scrape.total(logical) for k, logical in TRACKED.items()}
        return self.last

    async def aclose(self) -> None:
        await self._client.aclose()


class MetricsMemorySampler(_Counts):
    """Server memory from ``process_resident_memory_bytes`` in the last scrape of ``metrics``
    (sample it after the :class:`ServerMetricsSampler` in the same tick; no request of its own).

    Covers the vLLM **API-server process only**: the engine core and the workers (model
    weights, KV cache, most host-side allocations) are separate processes this gauge never sees.
    """

    name = "server-memory"
    quantity = "RSS of the API-server process"

    def __init__(self, metrics: ServerMetricsSampler) -> None:
        super().__init__()
        self.metrics = metrics
        self.source = f"process_resident_memory_bytes in {metrics.source}"
        self.covers = ("the API-server process only (vLLM's engine core and workers, which hold the model and the "
                       "KV cache, are separate processes not in this gauge)")

    async def sample(self) -> Reading:
        self.reads += 1
        v = self.metrics.last.get("process_resident_memory_bytes")
        if v is None:
            self.failed(self.metrics.last_error if not self.metrics.last or self.metrics.available is False
                        else "/metrics has no process_resident_memory_bytes")
        return {"memory": v, "rss": v}

    async def aclose(self) -> None:
        return None


# ----------------------------------------------------------------------------- Prometheus


class PrometheusSampler(_Counts):
    """An instant PromQL query (``GET {url}/api/v1/query?query=...``); the result vector's
    values are summed (bytes). ``covers``: the profile's own words for what the query measures.
    One httpx connection; ``transport`` injectable for tests; ``token``: bearer token."""

    name = "server-memory"

    def __init__(self, url: str, query: str, covers: str, *, token: str | None = None, timeout_s: float = 5.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__()
        self.url = url.rstrip("/") + "/api/v1/query"
        self.query = query
        self.quantity = "Prometheus query (bytes)"
        self.source = f"Prometheus {url.rstrip('/')}: {query}"
        self.covers = covers
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._client = httpx.AsyncClient(
            headers=headers, timeout=timeout_s, transport=transport,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))

    async def sample(self) -> Reading:
        self.reads += 1
        try:
            r = await self._client.get(self.url, params={"query": self.query})
            body = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            self.failed(f"Prometheus query failed: {type(exc).__name__}: {exc}")
            return {"memory": None}
        if r.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            err = body.get("error") if isinstance(body, dict) else None
            self.failed(f"Prometheus answered {r.status_code}: {err or str(body)[:120]}")
            return {"memory": None}
        data = body.get("data") or {}
        result = data.get("result")
        try:
            if data.get("resultType") == "scalar":
                values = [float(result[1])]
            else:
                values = [float(item["value"][1]) for item in result or []]
        except (TypeError, ValueError, KeyError, IndexError):
            self.failed(f"Prometheus result is not a vector of numbers: {str(result)[:120]}")
            return {"memory": None}
        values = [v for v in values if math.isfinite(v)]
        if not values:
            self.failed(f"the query returned no series: {self.query}")
            return {"memory": None}
        return {"memory": sum(values)}

    async def aclose(self) -> None:
        await self._client.aclose()


# ----------------------------------------------------------------------------- GPUs


@dataclass
class GpuDevice:
    """One GPU: index, name, total and peak used memory in bytes (peak over the samples taken)."""

    index: int
    name: str
    total: float
    peak_used: float = 0.0
    last_used: float | None = None


class NvmlSampler(_Counts):
    """Local GPU memory via NVML (pynvml from ``nvidia-ml-py``; ``nvml`` injectable for tests).

    Reading: ``gpu{i}_used`` and ``gpu{i}_total`` bytes per device, ``gpu_used_max_frac`` (the
    highest used/total over devices). ``devices`` keep the peak used per device. When pynvml is
    missing or ``nvmlInit`` fails (no driver, no GPU) ``available`` is False and ``reason`` says
    why; ``sample()`` then returns ``{}``.
    """

    name = "gpu-memory"

    def __init__(self, nvml: Any = None) -> None:
        super().__init__()
        self.source = "NVML (pynvml) on this machine"
        self.covers = "memory used on each local GPU by every process (vLLM and anything else on the card)"
        self.available = False
        self.reason: str | None = None
        self.devices: list[GpuDevice] = []
        self._handles: list[Any] = []
        self.nvml = nvml
        if nvml is None:
            try:
                self.nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                self.reason = f"pynvml is not installed ({exc}); install nvidia-ml-py"
                return
        try:
            self.nvml.nvmlInit()
            count = int(self.nvml.nvmlDeviceGetCount())
            for i in range(count):
                h = self.nvml.nvmlDeviceGetHandleByIndex(i)
                name = self.nvml.nvmlDeviceGetName(h)
                name = name.decode() if isinstance(name, bytes) else str(name)
                total = float(self.nvml.nvmlDeviceGetMemoryInfo(h).total)
                self._handles.append(h)
                self.devices.append(GpuDevice(i, name, total))
        except Exception as exc:  # pynvml raises NVMLError subclasses; any failure means "not available"
            self.reason = f"NVML is not available here: {type(exc).__name__}: {exc}"
            self._handles, self.devices = [], []
            return
        if not self.devices:
            self.reason = "NVML reports no GPU on this machine"
            return
        self.available = True
        self.source = f"NVML (pynvml) on this machine: {', '.join(f'GPU{d.index} {d.name}' for d in self.devices)}"

    async def sample(self) -> Reading:
        if not self.available:
            return {}
        self.reads += 1
        out: Reading = {}
        worst = 0.0
        for d, h in zip(self.devices, self._handles):
            try:
                used = float(self.nvml.nvmlDeviceGetMemoryInfo(h).used)
            except Exception as exc:
                self.failed(f"GPU{d.index}: {type(exc).__name__}: {exc}")
                out[f"gpu{d.index}_used"] = None
                continue
            d.last_used = used
            d.peak_used = max(d.peak_used, used)
            out[f"gpu{d.index}_used"] = used
            out[f"gpu{d.index}_total"] = d.total
            worst = max(worst, used / d.total if d.total else 0.0)
        out["gpu_used_max_frac"] = worst
        return out

    async def aclose(self) -> None:
        if self.available:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # shutting down is best effort
                pass
            self.available = False


# ----------------------------------------------------------------------------- the loop


@dataclass
class SamplingLoop:
    """Sample every sampler once per tick, ticks ``period_s`` apart on ``clock``.

    Bounded: stops at ``until`` (a ``clock()`` value), after ``max_ticks`` ticks, or when
    :meth:`stop` is called. Samplers run in list order within a tick (a
    :class:`MetricsMemorySampler` must come after its :class:`ServerMetricsSampler`).
    ``on_tick(t, {sampler name: reading})`` receives every tick; ``ticks`` counts them. Ticks
    keep a fixed schedule (``start + k * period_s``): a slow sample delays one tick, not all the
    following ones.
    """

    samplers: list[Any]
    period_s: float
    on_tick: Callable[[float, dict[str, Reading]], None]
    clock: Clock = time.monotonic
    sleep: Sleep = asyncio.sleep
    max_ticks: int = 1_000_000
    ticks: int = 0
    _stop: asyncio.Event | None = field(default=None, repr=False)

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def tick(self) -> dict[str, Reading]:
        readings: dict[str, Reading] = {}
        for s in self.samplers:
            readings[s.name] = await s.sample()
        self.ticks += 1
        self.on_tick(self.clock(), readings)
        return readings

    async def run(self, until: float) -> int:
        """Tick until ``until``; returns the number of ticks taken."""
        if self.period_s <= 0:
            raise ValueError("period_s must be > 0")
        self._stop = asyncio.Event()
        start = self.clock()
        for k in range(self.max_ticks):
            if self._stop.is_set() or self.clock() >= until:
                break
            await self.tick()
            due = start + (k + 1) * self.period_s
            if due >= until:
                break
            delay = due - self.clock()
            if delay > 0:
                waits = {asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(self.sleep(delay))}
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
        return self.ticks


__all__ = [
    "GpuDevice", "MetricsMemorySampler", "NvmlSampler", "ProcessTreeSampler", "PrometheusSampler", "Reading",
    "Sampler", "SamplingLoop", "SelfSampler", "ServerMetricsSampler", "describe",
]
