"""What ``deployment/memory-peak`` measures of the server's memory in this run
(:func:`observe_memory`): the launcher's model-load peak of the server's process tree
(:attr:`kvgate.http.client.Endpoint.load_peak`), one reading of that tree now when kvgate launched
it as a local process (``Endpoint.server_pids``), else the API server's own RSS from ``/metrics``
(``process_resident_memory_bytes``: a lower bound of the pod's memory; the engine core and workers
are other processes). One reading each, no sleeps: a few milliseconds of ``/proc`` and at most one
``GET /metrics`` (10 s timeout).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from kvgate.host.peak import MemoryPeak, PeakWatch

#: The phase words of the case's own reading.
NOW = "when deployment/memory-peak ran (idle, after the gates before it)"


def tree_reader(pid: int, label: str) -> tuple[Callable[[], Any], str, Callable[[], str]] | None:
    """:data:`kvgate.launch.local.TreeReader` through the soak's
    :class:`kvgate.soak.sampling.ProcessTreeSampler` (PSS + swap over the tree, RSS where smaps is
    denied): ``(read, source, quantity)``, or None when psutil cannot be imported. The run sets it on
    the launcher it builds (:func:`kvgate.run.lifecycle._build`)."""
    try:
        from kvgate.soak.sampling import ProcessTreeSampler

        sampler = ProcessTreeSampler([pid], label=label)
    except ImportError:
        return None
    return sampler.read, sampler.source, lambda: sampler.quantity


def observe_memory(endpoint: Any, client: Any, *, psutil_mod: Any = None,
                   clock: Callable[[], float] = time.monotonic) -> tuple[list[MemoryPeak], str]:
    """``(peaks, unseen)``: the run's memory readings of the server (see module doc) and, when no
    whole process tree was readable, why (words for the verdict). ``endpoint``: the run's
    :class:`~kvgate.http.client.Endpoint`; ``client``: a :class:`~kvgate.http.client.KvClient` on it
    (its ``metrics_text()``); ``psutil_mod``: injectable for tests. Never raises on a failed read."""
    from kvgate.http.client import EndpointUnreachable
    from kvgate.http.metrics import scrape_value

    peaks: list[MemoryPeak] = [endpoint.load_peak] if getattr(endpoint, "load_peak", None) is not None else []
    pids = tuple(getattr(endpoint, "server_pids", ()) or ())
    unseen = ""
    if pids:
        try:
            from kvgate.soak.sampling import ProcessTreeSampler

            sampler = ProcessTreeSampler(pids, label="server", psutil_mod=psutil_mod)
            watch = PeakWatch(sampler.read, phase=NOW, source=sampler.source, quantity=lambda: sampler.quantity,
                              clock=clock)
            watch.sample()
            now = watch.peak()
            if now is not None:
                return peaks + [now], ""
            unseen = f"the server's process tree was not readable ({watch.last_error})"
        except ImportError as exc:
            unseen = f"psutil is not importable: {exc}"
    else:
        unseen = ("the server's processes are not on this machine (kvgate did not launch it as a local process: "
                  "--endpoint, --isvc, a container)")
    try:
        rss = scrape_value(client.metrics_text(), "process_resident_memory_bytes")
    except EndpointUnreachable:
        rss = None
    if rss is not None:
        peaks.append(MemoryPeak(int(rss), "RSS of the API server process", None, NOW, 0.0, 1, 0,
                                "GET /metrics process_resident_memory_bytes", lower_bound=True))
    elif not peaks:
        unseen += "; /metrics has no process_resident_memory_bytes"
    return peaks, unseen if not any(not p.lower_bound for p in peaks) else ""
