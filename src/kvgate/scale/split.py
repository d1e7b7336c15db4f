"""Who a worker is and which part of the schedule it sends.

**Identity.** Worker ``k`` of ``N`` (0-based ``k``): ``--worker k/N``, or a Kubernetes Indexed
Job's ``JOB_COMPLETION_INDEX`` (the pod's index, from the downward-API annotation
``batch.kubernetes.io/job-completion-index``) with ``JOB_COMPLETIONS`` (the Job's completion
count, which the manifest sets from ``spec.completions``) -- :func:`worker_from_env`.

**Slices** (deterministic: the same batch, ``k`` and ``N`` always give the same slice; the union of
the ``N`` slices is exactly the one-process schedule, every request once -- tests/test_scale.py):

- closed loop (:func:`closed_slice`): request ``i`` of the batch goes to worker ``i mod N``
  (round-robin: the one process's shared iterator hands out indices in the same order), the
  concurrency ``c`` split as evenly as it goes (:func:`split_concurrency`: ``c // N``, the first
  ``c mod N`` workers one more), so no more than ``c`` requests are ever in flight in all;
- open loop (:func:`open_slice`): the arrivals thinned by index (arrival ``i`` to worker
  ``i mod N``), each keeping its offset from the shared start instant;
- a replayed trace (:func:`replay_slice`): its units (a session whole, or a single request) by
  index, unit ``u`` to worker ``u mod N``; a session never spans two workers (its later turns wait
  for the earlier replies).

**Shapes refused** (:func:`refused`): more workers than the SLO's concurrency (a worker with no
stream cannot hold its share of the load) and a replayed traffic sample on the latency gate (its
sampling takes the plan's next units look by look; split replays are not merged exactly yet).
A soak whose mix draws whole sessions is refused too (:func:`kvgate.scale.soak.refused`; a soak's
rounds are open-loop batches, thinned as above). A refusal is a usage error before anything is
sent, never a merge the verdict cannot keep exact.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

#: The downward-API index of an Indexed Job's pod, and the count the manifest passes beside it.
ENV_INDEX = "JOB_COMPLETION_INDEX"
ENV_COUNT = "JOB_COMPLETIONS"
#: The pod annotation the index comes from (the manifests' ``fieldRef``).
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
#: Where workers run: processes on this box, or pods of an Indexed Job / JobSet.
KINDS = ("local", "k8s")
#: The coordinator's port on Kubernetes when the advertised URL names none.
DEFAULT_PORT = 8470


class WorkersError(ValueError):
    """A worker identity or ``--workers`` value that cannot be used; the message names it and
    what is allowed."""


@dataclass(frozen=True, order=True)
class WorkerId:
    """Worker ``k`` (0-based) of ``n``."""

    k: int
    n: int

    def __post_init__(self) -> None:
        if self.n < 1 or not 0 <= self.k < self.n:
            raise WorkersError(f"worker {self.k}/{self.n}: the index must be 0..{self.n - 1} of n >= 1")

    @property
    def label(self) -> str:
        """``worker 2 of 4``."""
        return f"worker {self.k} of {self.n}"

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"


def parse_worker(text: str) -> WorkerId:
    """``"2/4"`` -> ``WorkerId(2, 4)``. Raises :class:`WorkersError` naming the value."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m:
        raise WorkersError(f"--worker {text!r}: expected K/N, worker K (0-based) of N, e.g. 0/4")
    return WorkerId(int(m.group(1)), int(m.group(2)))


def worker_from_env(env: Mapping[str, str] | None = None) -> WorkerId | None:
    """The worker of an Indexed Job's pod: ``JOB_COMPLETION_INDEX`` of ``JOB_COMPLETIONS``; None
    when the index is not set. Raises :class:`WorkersError` when the index is set but the count is
    not, or either is not a number."""
    env = os.environ if env is None else env
    index, count = env.get(ENV_INDEX), env.get(ENV_COUNT)
    if index is None or index == "":
        return None
    if not count:
        raise WorkersError(f"{ENV_INDEX}={index} is set but {ENV_COUNT} is not: the manifest passes the Job's "
                           "spec.completions as JOB_COMPLETIONS")
    try:
        return WorkerId(int(index), int(count))
    except ValueError:
        raise WorkersError(f"{ENV_INDEX}={index!r}, {ENV_COUNT}={count!r}: expected two integers") from None


@dataclass(frozen=True)
class WorkersSpec:
    """``--workers KIND:N``: ``kind`` (``local`` or ``k8s``) and ``n`` workers."""

    kind: str
    n: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.n}"


def parse_workers(text: str) -> WorkersSpec:
    """``"local:4"`` / ``"k8s:16"`` -> :class:`WorkersSpec`. Raises :class:`WorkersError`."""
    m = re.fullmatch(r"\s*(\w+)\s*:\s*(\d+)\s*", text or "")
    if not m or m.group(1) not in KINDS or int(m.group(2)) < 1:
        raise WorkersError(f"--workers {text!r}: expected local:N (N worker processes here) or k8s:N (N pods of an "
                           "Indexed Job or JobSet), N >= 1")
    return WorkersSpec(m.group(1), int(m.group(2)))


def split_concurrency(concurrency: int, n: int) -> list[int]:
    """``concurrency`` streams over ``n`` workers: ``concurrency // n`` each, the first
    ``concurrency % n`` one more (sums to ``concurrency``)."""
    base, extra = divmod(int(concurrency), int(n))
    return [base + (1 if k < extra else 0) for k in range(n)]


@dataclass(frozen=True)
class ClosedSlice:
    """Worker's part of a closed-loop batch: the batch's request ``indices`` it sends (ascending)
    and the ``concurrency`` (streams) it holds."""

    indices: tuple[int, ...]
    concurrency: int


def closed_slice(n_requests: int, concurrency: int, w: WorkerId) -> ClosedSlice:
    """Requests ``i`` with ``i mod N == k`` of ``n_requests``, at this worker's share of
    ``concurrency`` (:func:`split_concurrency`)."""
    return ClosedSlice(tuple(range(w.k, int(n_requests), w.n)), split_concurrency(concurrency, w.n)[w.k])


def open_slice(offsets_s: Sequence[float], w: WorkerId) -> list[tuple[int, float]]:
    """``(index, offset_s)`` of the arrivals ``i`` with ``i mod N == k``, offsets (seconds from the
    shared start instant) unchanged."""
    return [(i, float(offsets_s[i])) for i in range(w.k, len(offsets_s), w.n)]


def replay_slice(plan: Any, w: WorkerId) -> Any:
    """A :class:`~kvgate.traffic.replay.ReplayPlan` of this worker's units (unit ``u`` =
    ``plan.units()[u]`` to worker ``u mod N``), items in the plan's order, open-loop offsets kept
    (from the shared start), closed-loop concurrency split (:func:`split_concurrency`)."""
    import dataclasses

    mine = sorted(i for u, unit in enumerate(plan.units()) if u % w.n == w.k for i in unit)
    return dataclasses.replace(plan, items=tuple(plan.items[i] for i in mine),
                               concurrency=max(1, split_concurrency(plan.concurrency, w.n)[w.k]))


def refused(profile: Any, spec: WorkersSpec) -> str | None:
    """Why ``profile``'s latency gate cannot be split over ``spec``'s workers (one line naming the
    profile field), or None. See the module docstring."""
    slo = profile.slo
    if spec.n > slo.concurrency:
        return (f"--workers {spec}: {spec.n} workers for slo.concurrency {slo.concurrency} of profile {profile.name}: "
                f"each worker holds at least one stream (use at most {slo.concurrency} workers)")
    name = slo.workload or next((n for n, w in profile.workloads.items() if not w.long), None)
    wl = profile.workloads.get(name) if name else None
    if wl is not None and wl.traffic is not None:
        return (f"--workers {spec}: the latency gate replays workloads.{name}.traffic of profile {profile.name}; "
                "a replay's looks are not split across workers (run it in one process, without --workers)")
    return None


def listen_address(kind: str, advertise: str | None) -> tuple[str, int]:
    """Where the coordinator listens: ``local`` on 127.0.0.1, any free port; ``k8s`` on every
    interface at the port of ``advertise`` (the URL workers reach it at; default port 8470).
    Raises :class:`WorkersError` for an advertised URL that is not ``http://HOST[:PORT]``."""
    if kind == "local":
        return "127.0.0.1", 0
    if advertise is None:
        return "0.0.0.0", DEFAULT_PORT
    from urllib.parse import urlsplit

    u = urlsplit(advertise)
    try:
        port = u.port
    except ValueError:
        port = -1
    if u.scheme != "http" or not u.hostname or port == -1 or u.path not in ("", "/"):
        raise WorkersError(f"--workers-advertise {advertise!r}: expected http://HOST[:PORT], the address workers reach "
                           "the coordinator at (e.g. http://kvgate-coordinator.models.svc.cluster.local:8470)")
    return "0.0.0.0", port or DEFAULT_PORT


def coordinator_url(option: str, url: str) -> str:
    """``url`` when it is an ``http(s)://HOST[:PORT]`` a worker can reach the coordinator at;
    :class:`WorkersError` naming ``option`` otherwise (an empty value, a bare host name, another
    scheme, a port that is not a number) -- a worker would otherwise fail on its first request."""
    from urllib.parse import urlsplit

    u = urlsplit(url or "")
    try:
        port = u.port
    except ValueError:
        port = -1
    if u.scheme not in ("http", "https") or not u.hostname or port == -1:
        raise WorkersError(f"{option} {url!r}: expected http://HOST[:PORT], the address workers reach the coordinator "
                           "at (e.g. http://kvgate-coordinator.models.svc.cluster.local:8470)")
    return url


def parse_seconds(option: str, text: str) -> float:
    """A positive number of seconds; :class:`WorkersError` naming ``option`` otherwise."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise WorkersError(f"{option} {text!r}: expected seconds > 0")
    return value


def check_options(profile: Any, workers: str, advertise: str | None = None,
                  join_timeout: str | None = None) -> WorkersSpec:
    """The ``--workers*`` options of a gate run, checked before anything starts: the spec, the
    advertised URL, the join timeout and the shape (:func:`refused`). Raises :class:`WorkersError`."""
    spec = parse_workers(workers)
    listen_address(spec.kind, advertise)
    if join_timeout is not None:
        parse_seconds("--workers-join-timeout", join_timeout)
    if (why := refused(profile, spec)) is not None:
        raise WorkersError(why)
    return spec
