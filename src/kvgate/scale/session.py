"""One split run: the coordinator and the workers it started (``--workers local:N`` / ``k8s:N``).

:func:`start` binds the coordinator, starts the workers (:class:`~kvgate.scale.local.LocalWorkers`,
or for ``k8s`` :class:`~kvgate.scale.k8s.K8sWorkers`: the rendered Indexed Job created from
``--workers-job FILE``, or pods a JobSet already started, only watched) and returns a
:class:`ScaleOut`, whose :meth:`~ScaleOut.closed_loop` / :meth:`~ScaleOut.open_loop` replace
:func:`kvgate.load.closed_loop` / :func:`~kvgate.load.open_loop` in a gate, and
:meth:`~ScaleOut.report` is what :mod:`kvgate.gates.scale` judges. :meth:`ScaleOut.close` tells the
workers there is no more work and stops (or deletes) them.

Defaults per kind (:data:`DEFAULTS`): where the coordinator listens, how long after publishing a
batch it starts (``lead_s``: a worker long-polls, so it has the batch within milliseconds on
loopback; pods get more), how long workers may take to join (pods: scheduling and image pulls),
the heartbeat period and the silence after which a worker is lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kvgate.http.client import Endpoint
from kvgate.load.schedule import LoadResult
from kvgate.scale.coordinator import Coordinator
from kvgate.scale.merge import ScaleRun
from kvgate.scale.split import WorkersError, WorkersSpec, listen_address

#: kind -> lead_s, join_timeout_s, heartbeat_s, heartbeat_timeout_s (where it listens:
#: :func:`kvgate.scale.split.listen_address`).
DEFAULTS: dict[str, dict[str, Any]] = {
    "local": {"lead_s": 0.5, "join_timeout_s": 60.0, "heartbeat_s": 0.5, "heartbeat_timeout_s": 10.0},
    "k8s": {"lead_s": 2.0, "join_timeout_s": 600.0, "heartbeat_s": 1.0, "heartbeat_timeout_s": 20.0},
}


@dataclass
class ScaleOptions:
    """``spec`` (``--workers``), ``run_dir`` (run.json and the parts), ``advertise`` (the URL
    workers reach the coordinator at; k8s: it listens at that URL's port on every interface; None:
    its own address), ``job_file`` (k8s: the worker Job template to create), ``namespace``,
    ``join_timeout_s`` (None: the kind's default), ``ship_dir`` (local: workers write their parts to
    the run directory themselves, the shared-volume path), ``heartbeat_s`` (local workers; None: the kind's default)."""

    spec: WorkersSpec
    run_dir: Path
    advertise: str | None = None
    job_file: Path | None = None
    namespace: str = "default"
    join_timeout_s: float | None = None
    ship_dir: bool = False
    heartbeat_s: float | None = None


class ScaleOut:
    """A started split run (see the module docstring)."""

    def __init__(self, coordinator: Coordinator, workers: Any, spec: WorkersSpec) -> None:
        self.coordinator, self.workers, self.spec = coordinator, workers, spec

    def closed_loop(self, endpoint: Endpoint | None, requests: Any, **kw: Any) -> LoadResult:
        return self.coordinator.closed_loop(endpoint, requests, **kw)

    def open_loop(self, endpoint: Endpoint | None, requests: Any, **kw: Any) -> LoadResult:
        return self.coordinator.open_loop(endpoint, requests, **kw)

    def report(self, phase: str | None = None) -> ScaleRun:
        """What the coordinator saw; ``phase``: only that phase's batches (``"latency"``, ``"soak"``)."""
        return self.coordinator.report(phase)

    @property
    def run_dir(self) -> Path:
        return self.coordinator.run_dir

    def close(self) -> None:
        """Tell the workers there is no more work, give them a moment to hear it (they exit 0 by
        themselves), then stop (local) or delete (an Indexed Job kvgate created) what is left."""
        self.coordinator.finish()
        self.coordinator.drain(5.0)
        try:
            if self.workers is not None:
                self.workers.stop()
        finally:
            self.coordinator.stop()

    def __enter__(self) -> "ScaleOut":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start(opts: ScaleOptions, endpoint: Endpoint, profile: Any, *, batch_api: Any = None, core_api: Any = None,
          log: Callable[[str], None] = lambda line: None, **coordinator_kw: Any) -> ScaleOut:
    """Bind the coordinator and start ``opts.spec.n`` workers of ``opts.spec.kind`` loading
    ``endpoint`` (see the module docstring). ``coordinator_kw`` override :class:`Coordinator`'s
    timing (tests). Raises :class:`WorkersError` (bad listen address, unreadable Job file)."""
    kind, n = opts.spec.kind, opts.spec.n
    d = DEFAULTS[kind]
    host, port = listen_address(kind, opts.advertise)
    kw = {"lead_s": d["lead_s"], "join_timeout_s": opts.join_timeout_s or d["join_timeout_s"],
          "heartbeat_timeout_s": d["heartbeat_timeout_s"], **coordinator_kw}
    coord = Coordinator(n, opts.run_dir, endpoint, host=host, port=port, advertise=opts.advertise, kind=kind, **kw)
    workers: Any = None
    if kind == "local":
        from kvgate.scale.local import LocalWorkers

        coord.start()
        workers = LocalWorkers(n, coord.url, opts.run_dir, api_key=endpoint.api_key, heartbeat_s=opts.heartbeat_s or d["heartbeat_s"],
                               ship_dir=opts.ship_dir)
        coord.liveness = workers.liveness
        workers.start()
        coord.note(f"{n} local worker processes (python -m kvgate worker), pids "
                   f"{', '.join(str(workers.pid(k)) for k in range(n))}, coordinator {coord.url}")
    else:
        from kvgate.scale.k8s import K8sWorkers, load_job, render_worker_job

        coord.start()
        if opts.job_file is not None:
            url = opts.advertise or coord.url
            job = render_worker_job(load_job(opts.job_file), n=n, coordinator_url=url, profile=profile,
                                    run_id=coord.run_id, namespace=opts.namespace,
                                    name=f"kvgate-workers-{coord.run_id[:8]}")
            workers = K8sWorkers(job, opts.namespace, batch_api=batch_api, core_api=core_api, log=log)
            try:
                workers.start()
            except Exception as exc:  # noqa: BLE001 - the API's refusal, in one line
                coord.stop()
                raise WorkersError(f"--workers-job {opts.job_file}: creating Job {opts.namespace}/"
                                   f"{job['metadata']['name']} failed: {type(exc).__name__}: {exc}") from None
            coord.liveness = workers.liveness
            coord.note(f"{n} pods of Indexed Job {opts.namespace}/{job['metadata']['name']}, coordinator {url}")
        else:
            coord.note(f"{n} workers started outside kvgate (a JobSet's or an applied Indexed Job's pods), "
                       f"coordinator {opts.advertise or coord.url}")
    return ScaleOut(coord, workers, opts.spec)
