"""Soak fakes: the fake vLLM with time-shaped faults, a fake NVML, and virtual time.

:class:`SoakFakeVLLM` is :class:`~tests.fakes.fake_vllm.FakeVLLM` plus three knobs a soak looks at:

- ``memory(n)``: ``process_resident_memory_bytes`` at the ``n``-th ``/metrics`` scrape (keyed on
  scrapes, which a soak takes at a fixed period, so every shape is exact and repeatable);
  ``memory=None`` with ``no_rss=True`` drops the gauge (memory unmeasurable); the fault
  ``frozen_rss`` (:data:`~tests.fakes.fake_vllm.FAULTS`) holds it at the first scrape's value;
- ``ttft_extra(t)``: seconds added before a request's first token, ``t`` = seconds since the
  first soak request (a drift, a step; the 1-token extension probe a run sends first,
  :data:`kvgate.http.extensions.PROBE_PROMPT`, does not start the clock: on a busy host it can come
  any time before the soak, which would move a step out of the soak's middle);
- ``preempt(t)``: True -> this request counts one ``vllm:num_preemptions``.

:data:`SHAPES` holds the patterns the soak gate must tell apart. :class:`FakeNVML` imitates the
pynvml calls :class:`kvgate.soak.sampling.NvmlSampler` makes. :func:`virtual_loop` is an event loop
whose clock jumps to the next timer instead of sleeping, so runner tests take no real time.
"""

from __future__ import annotations

import asyncio
import re
import selectors
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from kvgate.http.extensions import PROBE_PROMPT

from .fake_vllm import FakeVLLM

MB = 1_000_000


class SoakFakeVLLM(FakeVLLM):
    """A fake vLLM whose memory, TTFT and preemptions follow the given shapes (see module doc)."""

    def __init__(self, *args: Any, memory: Callable[[int], float] | None = None, no_rss: bool = False,
                 ttft_extra: Callable[[float], float] | None = None, preempt: Callable[[float], bool] | None = None,
                 **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.memory = memory
        self.no_rss = no_rss
        self.ttft_extra = ttft_extra
        self.preempt = preempt
        self.scrapes = 0
        self.t_first: float | None = None

    async def _metrics_endpoint(self, request: Any) -> Any:
        response = await super()._metrics_endpoint(request)
        if self.memory is None and not self.no_rss:
            return response
        n = self.scrapes
        self.scrapes += 1
        if "frozen_rss" in self.config.faults:
            n = 0  # the gauge of the first scrape, forever
        body = response.body.decode()
        if self.no_rss:
            body = re.sub(r"(?m)^(# (HELP|TYPE) )?process_resident_memory_bytes.*\n", "", body)
        else:
            body = re.sub(r"(?m)^process_resident_memory_bytes .*$",
                          f"process_resident_memory_bytes {float(self.memory(n))!r}", body)
        response.body = body.encode()
        response.headers["content-length"] = str(len(response.body))
        return response

    async def _engine(self, plan: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        now = time.monotonic()
        if self.t_first is None and plan.record.prompt != PROBE_PROMPT:
            self.t_first = now
        t = now - self.t_first if self.t_first is not None else 0.0
        if self.preempt is not None and self.preempt(t):
            self.state.preemptions += 1
            self.metrics.touch(plan.model)
            self.metrics.preemptions.labels(plan.model, "0").inc()
        extra = self.ttft_extra(t) if self.ttft_extra is not None else 0.0
        if extra > 0:
            await asyncio.sleep(extra)
        async for tok in super()._engine(plan):
            yield tok


# shapes: memory by scrape index n (one scrape per sampling tick), TTFT/preemptions by seconds t

def linear_leak(mb_per_scrape: float, base_mb: float = 500.0) -> Callable[[int], float]:
    return lambda n: (base_mb + mb_per_scrape * n) * MB


def sawtooth(period_scrapes: int, amplitude_mb: float, floor_mb: float = 500.0) -> Callable[[int], float]:
    """Allocator-like sawtooth: rises for ``period_scrapes`` scrapes, falls back to the floor."""
    return lambda n: (floor_mb + amplitude_mb * (n % period_scrapes) / period_scrapes) * MB


def fill_then_plateau(mb_per_scrape: float, until_scrape: int, base_mb: float = 500.0) -> Callable[[int], float]:
    return lambda n: (base_mb + mb_per_scrape * min(n, until_scrape)) * MB


def one_step(at_scrape: int, step_mb: float, base_mb: float = 500.0) -> Callable[[int], float]:
    """Flat, one step of ``step_mb`` at scrape ``at_scrape``, flat after (an allocator sizing itself once)."""
    return lambda n: (base_mb + (step_mb if n >= at_scrape else 0.0)) * MB


def flat(base_mb: float = 500.0) -> Callable[[int], float]:
    """Flat retained memory, as a live process's: one page (4 KB) up on every odd scrape, back on the next."""
    return lambda n: base_mb * MB + 4096 * (n % 2)


# ----------------------------------------------------------------------------- fake NVML


class NVMLError(Exception):
    """Like pynvml.NVMLError."""


@dataclass
class _MemInfo:
    total: int
    used: int
    free: int


@dataclass
class FakeNVML:
    """The pynvml calls NvmlSampler makes. ``used`` per device is a list consumed one value per
    ``nvmlDeviceGetMemoryInfo`` call (the last value repeats); ``init_error``: nvmlInit raises."""

    totals: list[int] = field(default_factory=lambda: [80 * 2**30])
    used: list[list[int]] = field(default_factory=lambda: [[40 * 2**30]])
    names: list[str] = field(default_factory=lambda: ["NVIDIA H100 80GB HBM3"])
    init_error: str | None = None
    calls: list[str] = field(default_factory=list)
    NVMLError: type = NVMLError

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.totals)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.names[h].encode()  # old pynvml returns bytes; the sampler decodes

    def nvmlDeviceGetMemoryInfo(self, h: int) -> _MemInfo:
        seq = self.used[h]
        used = seq.pop(0) if len(seq) > 1 else seq[0]
        return _MemInfo(self.totals[h], used, self.totals[h] - used)


# ----------------------------------------------------------------------------- virtual time


class VirtualClock:
    """Seconds of virtual time; the loop advances it to the next timer when nothing is ready."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _VirtualSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if not ready and timeout is not None and timeout > 0:
            self.clock.t += timeout  # jump to the next timer instead of waiting for it
        return ready


def virtual_loop() -> tuple[asyncio.AbstractEventLoop, VirtualClock]:
    """An event loop on virtual time: ``asyncio.sleep(3600)`` returns at once, ``clock()`` says 3600."""
    clock = VirtualClock()
    loop = asyncio.SelectorEventLoop(_VirtualSelector(clock))
    loop.time = clock  # type: ignore[method-assign]
    return loop, clock


def run_virtual(coro_fn: Callable[[VirtualClock], Any]) -> Any:
    """Run ``coro_fn(clock)`` to completion on a fresh :func:`virtual_loop`."""
    loop, clock = virtual_loop()
    try:
        return loop.run_until_complete(coro_fn(clock))
    finally:
        loop.close()
