"""The scale-out manifests in ci/ against Kubernetes' own OpenAPI models (the ``kubernetes``
client's models, strict: an unknown field, a wrong type or a missing required field is refused),
the worker Job rendered with a profile's values (a dry run of what ``--workers k8s:N
--workers-job FILE`` creates), the downward-API index reaching the worker, and the coordinator's
use of the Kubernetes API (fake ``BatchV1Api`` / ``CoreV1Api``). The kvgate commands in the
manifests are run (``--collect-only``) by tests/test_ci_templates.py."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import yaml
from kubernetes.client import models as k8s

from kvgate.cli.main import build_parser, main
from kvgate.profile.models import load_profile
from kvgate.scale.k8s import (CONTAINER, COORDINATOR_ENV, WORKER_JOB, K8sWorkers, job_deadline_s, load_job,
                              render_worker_job, worker_container)
from kvgate.scale.split import INDEX_ANNOTATION, WorkerId, WorkersError, worker_from_env

from .conftest import REPO

CI = REPO / "ci"
#: kind -> the client's model of it (strict pydantic: extra fields forbidden, strict types).
MODELS = {"ServiceAccount": k8s.V1ServiceAccount, "Role": k8s.V1Role, "RoleBinding": k8s.V1RoleBinding,
          "Service": k8s.V1Service, "ConfigMap": k8s.V1ConfigMap, "Job": k8s.V1Job}
#: jobset.x-k8s.io/v1alpha2 fields (the CRD is not in the client; what it embeds is Kubernetes' own).
JOBSET_SPEC = {"replicatedJobs", "network", "successPolicy", "failurePolicy", "startupPolicy", "suspend",
               "coordinator", "managedBy", "ttlSecondsAfterFinished"}
REPLICATED_JOB = {"name", "groupName", "template", "replicas", "dependsOn"}


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((CI / name).read_text()) if d is not None]


def validate(doc: dict) -> None:
    """Validate one manifest document; raises (pydantic's ValidationError, AssertionError) naming the field."""
    kind = doc["kind"]
    if kind == "JobSet":
        assert doc["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
        assert set(doc) <= {"apiVersion", "kind", "metadata", "spec"}
        k8s.V1ObjectMeta.model_validate(doc["metadata"])
        assert set(doc["spec"]) <= JOBSET_SPEC, set(doc["spec"]) - JOBSET_SPEC
        for rj in doc["spec"]["replicatedJobs"]:
            assert set(rj) <= REPLICATED_JOB, set(rj) - REPLICATED_JOB
            assert isinstance(rj["replicas"], int) and re.fullmatch(r"[a-z0-9-]+", rj["name"])
            k8s.V1JobTemplateSpec.model_validate(rj["template"])
        return
    MODELS[kind].model_validate(doc)


def test_the_validator_refuses_what_kubernetes_would():
    job = docs("scale-out-indexed-job.yaml")[-1]
    validate(job)
    bad = yaml.safe_load(yaml.safe_dump(job))
    bad["spec"]["template"]["spec"]["containers"][0]["argz"] = []
    with pytest.raises(Exception, match="argz"):
        validate(bad)
    bad = yaml.safe_load(yaml.safe_dump(job))
    bad["spec"]["completions"] = "4"
    with pytest.raises(Exception, match="completions"):
        validate(bad)


@pytest.mark.parametrize("name", ["scale-out-indexed-job.yaml", "scale-out-jobset.yaml"])
def test_manifests_validate_against_the_kubernetes_openapi_models(name):
    found = docs(name)
    for d in found:
        validate(d)
    if name == "scale-out-indexed-job.yaml":
        (cm,) = [d for d in found if d["kind"] == "ConfigMap"]
        validate(yaml.safe_load(cm["data"]["worker-job.yaml"]))  # the template inside, a Job too


def test_rbac_is_least_privilege():
    by_kind = {d["kind"]: d for d in docs("scale-out-indexed-job.yaml")}
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in by_kind["Role"]["rules"]}
    assert rules == {(("batch",), ("jobs",)): {"create", "get", "delete"}, (("",), ("pods",)): {"get", "list"}}
    coordinator = by_kind["Job"]["spec"]["template"]["spec"]
    assert coordinator["serviceAccountName"] == by_kind["ServiceAccount"]["metadata"]["name"] \
        == by_kind["RoleBinding"]["subjects"][0]["name"]
    worker = yaml.safe_load(by_kind["ConfigMap"]["data"]["worker-job.yaml"])
    assert worker["spec"]["template"]["spec"]["automountServiceAccountToken"] is False  # workers: no API access
    (sa, jobset) = docs("scale-out-jobset.yaml")
    assert sa["automountServiceAccountToken"] is False and all(d["kind"] != "Role" for d in docs("scale-out-jobset.yaml"))
    pods = [rj["template"]["spec"]["template"]["spec"] for rj in jobset["spec"]["replicatedJobs"]]
    assert all(p["automountServiceAccountToken"] is False for p in pods)


def _index_env(container: dict, index: int) -> dict[str, str]:
    """The environment Kubernetes gives ``container`` in the Indexed Job's pod ``index``: plain
    values, and fieldRefs resolved against the pod's metadata (its index annotation)."""
    meta = {"annotations": {INDEX_ANNOTATION: str(index)}}
    env = {}
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "fieldRef" in e.get("valueFrom", {}):
            m = re.fullmatch(r"metadata\.annotations\['(.+)'\]", e["valueFrom"]["fieldRef"]["fieldPath"])
            assert m, e
            env[e["name"]] = meta["annotations"][m.group(1)]
    return env


def test_render_with_a_profiles_values_and_the_index_reaches_the_worker(tmp_path):
    profile = load_profile("kserve-vllm-4k")  # slo.concurrency 16
    (cm,) = [d for d in docs("scale-out-indexed-job.yaml") if d["kind"] == "ConfigMap"]
    (tmp_path / "worker-job.yaml").write_text(cm["data"]["worker-job.yaml"])
    template = load_job(tmp_path / "worker-job.yaml")
    job = render_worker_job(template, n=4, coordinator_url="http://kvgate-coordinator.models.svc.cluster.local:8470",
                            profile=profile, run_id="abc123", namespace="models", name="kvgate-workers-abc123")
    validate(job)
    assert template["spec"]["completions"] == 1  # the template itself is not changed
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == ("Indexed", 4, 4, 0)
    assert spec["activeDeadlineSeconds"] == job_deadline_s(profile) == 600 + 120 + 300 + 120
    assert job["metadata"]["labels"]["kvgate.io/profile"] == "kserve-vllm-4k" and job["metadata"]["namespace"] == "models"
    c = worker_container(job)
    for index in range(4):  # what each pod's process sees
        env = _index_env(c, index)
        assert worker_from_env(env) == WorkerId(index, 4)
        assert env[COORDINATOR_ENV] == "http://kvgate-coordinator.models.svc.cluster.local:8470"
    # the worker's command line is kvgate's own
    assert c["command"][:3] == ["python3", "-m", "kvgate"]
    args = build_parser().parse_args(c["command"][3:] + c["args"])
    assert args.command == "worker" and args.api_key_env == "LLM_API_KEY"
    with pytest.raises(WorkersError, match="17 workers for slo.concurrency 16"):
        render_worker_job(template, n=17, coordinator_url="http://x", profile=profile)


def test_jobset_workers_find_their_index_and_the_coordinator():
    _, jobset = docs("scale-out-jobset.yaml")
    jobs = {rj["name"]: rj["template"]["spec"] for rj in jobset["spec"]["replicatedJobs"]}
    w = jobs["workers"]
    assert (w["completionMode"], w["completions"], w["parallelism"]) == ("Indexed", 4, 4)
    (c,) = w["template"]["spec"]["containers"]
    assert worker_from_env(_index_env(c, 3)) == WorkerId(3, 4)
    args = build_parser().parse_args(c["command"][3:] + c["args"])
    coord_args = jobs["coordinator"]["template"]["spec"]["containers"][0]["args"]
    assert args.coordinator == coord_args[coord_args.index("--workers-advertise") + 1]
    assert coord_args[coord_args.index("--workers") + 1] == f"k8s:{w['completions']}"
    # <jobset>-<replicated job>-<job index>-<pod index>.<subdomain = the JobSet's name>
    assert args.coordinator.startswith(f"http://{jobset['metadata']['name']}-coordinator-0-0.{jobset['metadata']['name']}:")


def test_render_job_command_prints_a_valid_job(capsys):
    assert main(["render-job", "--profile", "kserve-vllm-4k", "--workers", "8", "--coordinator", "http://c:8470",
                 "--namespace", "models"]) == 0
    job = yaml.safe_load(capsys.readouterr().out)
    validate(job)
    assert job["spec"]["completions"] == 8 and worker_container(job)["name"] == CONTAINER
    assert main(["render-job", "--profile", "tiny-cpu", "--workers", "8", "--coordinator", "http://c"]) == 2
    assert "8 workers for slo.concurrency 4" in capsys.readouterr().err
    assert WORKER_JOB["spec"]["completions"] == 1


@pytest.mark.parametrize("argv, words", [
    # a Job of 0 pods (completions 0) or one whose workers cannot parse their coordinator's URL used to print, exit 0
    (["--workers", "0", "--coordinator", "http://c:8470"], "--workers 0: expected N >= 1 worker pods"),
    (["--workers", "-1", "--coordinator", "http://c:8470"], "--workers -1: expected N >= 1 worker pods"),
    (["--workers", "2", "--coordinator", "kvgate-coordinator"], "--coordinator 'kvgate-coordinator': expected http://"),
    (["--workers", "2", "--coordinator="], "--coordinator '': expected http://HOST[:PORT]"),
    (["--workers", "2", "--coordinator", "http://c:port"], "--coordinator 'http://c:port': expected http://"),
])
def test_render_job_refuses_no_workers_and_a_coordinator_that_is_not_a_url(capsys, argv, words):
    assert main(["render-job", "--profile", "tiny-cpu", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"kvgate render-job: {words}{captured.err.split(words, 1)[1]}"
    assert len(captured.err.splitlines()) == 1 and "Traceback" not in captured.err


@pytest.mark.parametrize("text", ["kind: Job\n", "kind: Job\nspec: {template: {spec: {containers: []}}}\n",
                                  "kind: Job\nspec: {template: {spec: {containers: [oops]}}}\n"])
def test_render_job_template_without_containers_is_one_line_naming_the_option(tmp_path, capsys, text):
    (tmp_path / "job.yaml").write_text(text)
    assert main(["render-job", "--profile", "tiny-cpu", "--workers", "2", "--coordinator", "http://c:8470",
                 "--template", str(tmp_path / "job.yaml")]) == 2
    err = capsys.readouterr().err
    assert err == (f"kvgate render-job: --template {tmp_path / 'job.yaml'}: the worker Job has no "
                   "spec.template.spec.containers (a list of containers)\n")


def test_worker_refuses_a_coordinator_that_is_not_a_url_in_one_line(capsys, monkeypatch):
    # used to be a urllib ValueError traceback from the first GET /clock
    assert main(["worker", "--coordinator", "notaurl", "--worker", "0/2"]) == 2
    assert capsys.readouterr().err.startswith("kvgate worker: --coordinator 'notaurl': expected http://HOST[:PORT]")
    monkeypatch.setenv(COORDINATOR_ENV, "c:8470")
    assert main(["worker", "--worker", "0/2"]) == 2
    assert capsys.readouterr().err.startswith(f"kvgate worker: ${COORDINATOR_ENV} 'c:8470': expected http://")


class FakeBatch:
    def __init__(self) -> None:
        self.created: list = []
        self.deleted: list = []

    def create_namespaced_job(self, namespace, body):
        self.created.append((namespace, body))

    def delete_namespaced_job(self, name, namespace, propagation_policy=None):
        self.deleted.append((name, namespace, propagation_policy))


class FakeCore:
    def __init__(self, pods) -> None:
        self.pods = pods
        self.selectors: list = []

    def list_namespaced_pod(self, namespace, label_selector=None):
        self.selectors.append(label_selector)
        return SimpleNamespace(items=self.pods)


def _pod(index: int, name: str, *, phase: str = "Running", terminated: tuple | None = None):
    state = SimpleNamespace(terminated=SimpleNamespace(reason=terminated[0], exit_code=terminated[1]) if terminated else None)
    return SimpleNamespace(metadata=SimpleNamespace(name=name, annotations={INDEX_ANNOTATION: str(index)}),
                           spec=SimpleNamespace(node_name="gpu-node-7"),
                           status=SimpleNamespace(phase=phase, reason=None, container_statuses=[SimpleNamespace(state=state)]))


def test_the_coordinator_creates_watches_and_deletes_its_worker_job():
    job = render_worker_job(WORKER_JOB, n=2, coordinator_url="http://c", profile=load_profile("tiny-cpu"),
                            name="kvgate-workers-r1", namespace="models")
    batch, core = FakeBatch(), FakeCore([_pod(0, "kvgate-workers-r1-0-a"),
                                         _pod(1, "kvgate-workers-r1-1-b", phase="Failed", terminated=("OOMKilled", 137))])
    now = {"t": 0.0}
    w = K8sWorkers(job, "models", batch_api=batch, core_api=core, clock=lambda: now["t"]).start()
    assert batch.created == [("models", job)]
    assert w.liveness(0) is None
    assert w.liveness(1) == "its pod kvgate-workers-r1-1-b (node gpu-node-7) OOMKilled (exit 137)"
    assert core.selectors == ["job-name=kvgate-workers-r1"]  # one list for both: at most every 2 s
    now["t"] = 2.5
    w.liveness(0)
    assert len(core.selectors) == 2
    w.stop()
    assert batch.deleted == [("kvgate-workers-r1", "models", "Background")]

    class Forbidden(FakeCore):
        def list_namespaced_pod(self, namespace, label_selector=None):
            raise RuntimeError("403 pods is forbidden")

    quiet = K8sWorkers(job, "models", create=False, batch_api=batch, core_api=Forbidden([]))
    assert quiet.liveness(1) is None  # no RBAC for pods: the heartbeats decide
