"""``--workers k8s:N``: the workers as pods of a Kubernetes Indexed Job (or a JobSet's workers).

:func:`render_worker_job` fills a worker Job (a template: ``ci/scale-out-indexed-job.yaml``'s
worker Job, or :data:`WORKER_JOB`) with a run's values: ``completionMode: Indexed``,
``completions = parallelism = N``, ``backoffLimit: 0`` (a failed pod is a lost worker, never a
second one with the same index), ``activeDeadlineSeconds`` from the profile (the join budget +
``slo.max_duration_s`` + shipping), the run's labels, and in the worker container
``JOB_COMPLETIONS = N``, ``KVGATE_COORDINATOR`` and ``JOB_COMPLETION_INDEX`` from the downward API
(``metadata.annotations['batch.kubernetes.io/job-completion-index']``). ``kvgate render-job``
prints it (a dry run); with ``--workers-job FILE`` the coordinator creates it
(:class:`K8sWorkers`, ``BatchV1Api.create_namespaced_job``) and deletes it at the end.

:meth:`K8sWorkers.liveness` names a lost worker by its pod: the pods of the Job (label
``job-name``), each by its index annotation; a pod that ``Failed`` or whose container terminated
(``OOMKilled``, exit 137) is the reason. What the coordinator needs in RBAC: ``batch/jobs``
create/get/delete (only with ``--workers-job``) and ``pods`` get/list -- nothing else; the worker
pods need no API access (``automountServiceAccountToken: false``). Without access to pods the
coordinator still finds lost workers by their heartbeats.

The ``kubernetes`` client is injected (``batch_api``, ``core_api``); tests pass fakes.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from kvgate.scale.split import ENV_COUNT, ENV_INDEX, INDEX_ANNOTATION, WorkersError

#: The worker container's name in the templates.
CONTAINER = "kvgate-worker"
#: The variable the worker reads the coordinator's URL from (``kvgate worker`` without --coordinator).
COORDINATOR_ENV = "KVGATE_COORDINATOR"
#: Labels put on the rendered Job and its pods.
RUN_LABEL = "kvgate.io/run"
PROFILE_LABEL = "kvgate.io/profile"
#: Seconds added to a worker Job's deadline for joining and shipping.
JOIN_BUDGET_S = 600
SHIP_BUDGET_S = 120

#: A worker Indexed Job (what ``kvgate render-job`` renders without ``--template``).
WORKER_JOB: dict[str, Any] = {
    "apiVersion": "batch/v1", "kind": "Job",
    "metadata": {"name": "kvgate-workers", "labels": {"app.kubernetes.io/name": "kvgate-worker"}},
    "spec": {
        "completionMode": "Indexed", "completions": 1, "parallelism": 1, "backoffLimit": 0,
        "ttlSecondsAfterFinished": 3600,
        "template": {
            "metadata": {"labels": {"app.kubernetes.io/name": "kvgate-worker"}},
            "spec": {
                "restartPolicy": "Never", "automountServiceAccountToken": False,
                "containers": [{
                    "name": CONTAINER, "image": "registry.example/kvgate:latest",
                    "command": ["python3", "-m", "kvgate", "worker"],
                    "args": ["--api-key-env", "LLM_API_KEY"],
                    "env": [{"name": "LLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "llm-api-key", "key": "key"}}}],
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}},
                }],
            },
        },
    },
}


def _env(container: dict[str, Any], name: str, value: str | None = None, field_path: str | None = None) -> None:
    env = [e for e in container.get("env") or [] if e.get("name") != name]
    env.append({"name": name, "value": value} if field_path is None else
               {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}})
    container["env"] = env


def worker_container(job: dict[str, Any]) -> dict[str, Any]:
    """The worker container of a Job (named :data:`CONTAINER`, else the first). Raises
    :class:`WorkersError` when the Job has none."""
    try:
        containers = job["spec"]["template"]["spec"]["containers"]
    except (KeyError, TypeError):
        containers = None
    if not isinstance(containers, list) or not containers or not all(isinstance(c, dict) for c in containers):
        raise WorkersError("the worker Job has no spec.template.spec.containers (a list of containers)")
    return next((c for c in containers if c.get("name") == CONTAINER), containers[0])


def job_deadline_s(profile: Any) -> int:
    """``activeDeadlineSeconds`` of a worker Job for ``profile``: the join budget, the latency
    gate's sampling bound (``slo.max_duration_s``) plus its first look's deadline (300 s), shipping."""
    return int(JOIN_BUDGET_S + math.ceil(profile.slo.max_duration_s) + 300 + SHIP_BUDGET_S)


def render_worker_job(template: dict[str, Any], *, n: int, coordinator_url: str, profile: Any, run_id: str = "",
                      namespace: str | None = None, name: str | None = None) -> dict[str, Any]:
    """The worker Job for ``n`` workers of ``profile``'s run (see the module docstring); the
    template is not changed. Raises :class:`WorkersError` when ``n`` is more than the profile's
    ``slo.concurrency`` or below 1, or the template is not a Job."""
    if n < 1:
        raise WorkersError(f"--workers {n}: expected N >= 1 worker pods")
    if template.get("kind") != "Job":
        raise WorkersError(f"the worker template is a {template.get('kind')!r}, not a Job")
    if n > profile.slo.concurrency:
        raise WorkersError(f"{n} workers for slo.concurrency {profile.slo.concurrency} of profile {profile.name}: "
                           "each worker holds at least one stream")
    job = copy.deepcopy(template)
    meta = job.setdefault("metadata", {})
    if name:
        meta["name"] = name
    if namespace:
        meta["namespace"] = namespace
    labels = {RUN_LABEL: run_id or "render", PROFILE_LABEL: profile.name}
    meta.setdefault("labels", {}).update(labels)
    spec = job["spec"]
    spec.update(completionMode="Indexed", completions=n, parallelism=n, backoffLimit=0,
                activeDeadlineSeconds=job_deadline_s(profile))
    spec["template"].setdefault("metadata", {}).setdefault("labels", {}).update(labels)
    c = worker_container(job)
    _env(c, ENV_INDEX, field_path=f"metadata.annotations['{INDEX_ANNOTATION}']")
    _env(c, ENV_COUNT, str(n))
    _env(c, COORDINATOR_ENV, coordinator_url)
    return job


def load_job(path: Path, option: str = "--workers-job") -> dict[str, Any]:
    """The first ``kind: Job`` document of a YAML file whose worker container is
    :data:`CONTAINER` (else the first Job). Raises :class:`WorkersError` naming the file and
    ``option``, the one that gave it (``kvgate render-job`` reads it from ``--template``)."""
    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if isinstance(d, dict)]
    except (OSError, yaml.YAMLError) as exc:
        raise WorkersError(f"{option} {path}: cannot read it ({exc})") from None
    jobs = [d for d in docs if d.get("kind") == "Job"]
    if not jobs:
        raise WorkersError(f"{option} {path}: no kind: Job in it")
    for j in jobs:
        try:
            if any(c.get("name") == CONTAINER for c in j["spec"]["template"]["spec"]["containers"]):
                return j
        except (KeyError, TypeError, AttributeError):
            continue
    try:
        worker_container(jobs[0])
    except WorkersError as exc:
        raise WorkersError(f"{option} {path}: {exc}") from None
    return jobs[0]


def _terminated(pod: Any) -> str | None:
    status = getattr(pod, "status", None)
    for cs in getattr(status, "container_statuses", None) or ():
        term = getattr(getattr(cs, "state", None), "terminated", None)
        if term is not None and (term.exit_code or 0) != 0:
            return f"{term.reason or 'terminated'} (exit {term.exit_code})"
    if getattr(status, "phase", None) == "Failed":
        return f"Failed ({getattr(status, 'reason', None) or 'no reason given'})"
    return None


class K8sWorkers:
    """The worker pods of one run: ``job`` (the rendered Job; created by :meth:`start` when
    ``create``, else only watched), ``namespace``; ``batch_api`` / ``core_api``: the kubernetes
    client's ``BatchV1Api`` / ``CoreV1Api`` (default: in-cluster config, else ``~/.kube/config``);
    ``refresh_s``: the pods are listed at most this often (``clock``: seconds)."""

    def __init__(self, job: dict[str, Any], namespace: str, *, create: bool = True, batch_api: Any = None,
                 core_api: Any = None, log: Callable[[str], None] = lambda line: None, refresh_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job, self.namespace, self.create = job, namespace, create
        self.batch_api, self.core_api, self.log = batch_api, core_api, log
        self.name = job["metadata"]["name"]
        self.refresh_s, self.clock = refresh_s, clock
        self._pods_readable = True
        self._pods: tuple[float, list[Any]] | None = None

    def _apis(self) -> None:
        if self.batch_api is not None and self.core_api is not None:
            return
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self.batch_api = self.batch_api or client.BatchV1Api()
        self.core_api = self.core_api or client.CoreV1Api()

    def start(self) -> "K8sWorkers":
        if self.create:
            self._apis()
            self.batch_api.create_namespaced_job(self.namespace, self.job)
            self.log(f"created Job {self.namespace}/{self.name} ({self.job['spec']['completions']} indexed pods)")
        return self

    def liveness(self, k: int) -> str | None:
        """None while worker ``k``'s pod runs (or cannot be read); else its pod's end. The pods are
        listed at most every ``refresh_s`` seconds."""
        if not self._pods_readable:
            return None
        now = self.clock()
        if self._pods is None or now - self._pods[0] >= self.refresh_s:  # the coordinator asks often: list every refresh_s
            try:
                self._apis()
                items = self.core_api.list_namespaced_pod(self.namespace, label_selector=f"job-name={self.name}").items
            except Exception:  # noqa: BLE001 - no RBAC for pods: heartbeats decide
                self._pods_readable = False
                return None
            self._pods = (now, list(items))
        for pod in self._pods[1]:
            ann = getattr(pod.metadata, "annotations", None) or {}
            if str(ann.get(INDEX_ANNOTATION)) == str(k):
                why = _terminated(pod)
                if why:
                    return f"its pod {pod.metadata.name} (node {getattr(pod.spec, 'node_name', None)}) {why}"
        return None

    def stop(self) -> None:
        """Delete the Job (and its pods) when this run created it."""
        if not self.create:
            return
        try:
            self._apis()
            self.batch_api.delete_namespaced_job(self.name, self.namespace, propagation_policy="Background")
        except Exception as exc:  # noqa: BLE001 - the Job's ttlSecondsAfterFinished cleans up anyway
            self.log(f"could not delete Job {self.namespace}/{self.name}: {exc}")
