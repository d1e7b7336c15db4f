"""KServe pre-canary targets: find the *new* version of a KServe deployment, before it takes
traffic, from ``--isvc NAME --namespace NS`` (read with the ``kubernetes`` client), and gate it.

Three shapes (:func:`discover`, pure: Kubernetes objects in, :class:`KServeTarget` out):

- **Serverless InferenceService** (Knative; ``spec.predictor.canaryTrafficPercent``): the new
  revision is the ``status.components.predictor.traffic[]`` entry with ``latestRevision: true``.
  With tag routing (``serving.kserve.io/enable-tag-routing: "true"``) it has its own ``latest-``
  URL; through an ingress (``--ingress URL``) kvgate connects to the ingress and sends the
  ``Host`` header of that URL. Without tag routing, the revision's own in-cluster Service
  (``http://REVISION.NS.svc.cluster.local``, Knative makes one per revision) is the target.
- **RawDeployment InferenceService with named canaries** (``spec.canary[]``, each
  ``{name, trafficPercent}`` served by its own ``{isvc}-{name}-predictor`` Service): the canary
  named by ``--canary``, else the one at ``trafficPercent: 0`` (gated directly, before any
  traffic).
- **LLMInferenceService routing groups** (``spec.router.route.group`` / ``weight``; members are
  symmetric): the member at weight 0 in NAME's group, through its own endpoint
  (``status.addresses[0].url``, else ``status.url``). ``ci/`` patches its weight only after
  kvgate passed.

The **baseline** (:func:`discover_baseline`, pure) is the version serving today, which a compare
gate sends the same requests to: for a serverless InferenceService the traffic entry that is not
``latestRevision`` and takes traffic (the previous revision; tagged ``prev`` with a ``prev-`` URL
under tag routing, reached like the ``latest-`` one, else its own revision Service); for a
RawDeployment the main predictor (``{isvc}-predictor``, at 100% less the canaries' share); for an
LLMInferenceService group the member at weight > 0 (the largest when several). When none serves,
:class:`KServeError` asks for ``--baseline URL``.

Route prefix: ``/openai/v1`` for KServe's Hugging Face runtime (``modelFormat.name:
huggingface``), ``/v1`` for an LLMInferenceService (vLLM's own routes), else the profile's
``endpoint.route_prefix``. TLS is verified (``--ca-bundle`` adds a CA; there is no switch to turn
verification off). Recorded objects for each shape: ``tests/data/kserve/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

GROUP = "serving.kserve.io"
ISVC = ("v1beta1", "inferenceservices")
LLMISVC = ("v1alpha1", "llminferenceservices")
TAG_ROUTING = "serving.kserve.io/enable-tag-routing"
DEPLOYMENT_MODE = "serving.kserve.io/deploymentMode"
HF_PREFIX = "/openai/v1"


class KServeError(Exception):
    """The object cannot be gated as asked (no canary pending, ambiguous, not found). One line."""


@dataclass(frozen=True)
class KServeTarget:
    """Where the new version (or, from :func:`discover_baseline`, the baseline) answers: ``url``
    (server root, no route prefix), the ``route_prefix``, the ``host_header`` to send (ingress +
    tag URL) or None, the ``shape`` (serverless, raw-canary, llmisvc-group; baselines:
    serverless-prev, raw-main, llmisvc-serving), what is gated (``revision``: a revision, canary or member name),
    its current traffic share (``percent``, 0-100) and ``notes`` for the report."""

    url: str
    route_prefix: str
    host_header: str | None
    shape: str
    revision: str
    percent: float
    notes: list[str] = field(default_factory=list)

    @property
    def endpoint_url(self) -> str:
        return self.url.rstrip("/") + self.route_prefix


class CustomObjects(Protocol):
    """The two calls of ``kubernetes.client.CustomObjectsApi`` kvgate uses (injectable in tests)."""

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                     name: str) -> dict[str, Any]: ...

    def list_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                      plural: str) -> dict[str, Any]: ...


def _prefix(obj: dict[str, Any], default: str) -> str:
    if obj.get("kind") == "LLMInferenceService":
        return "/v1"
    fmt = (((obj.get("spec") or {}).get("predictor") or {}).get("model") or {}).get("modelFormat") or {}
    return HF_PREFIX if str(fmt.get("name", "")).lower() == "huggingface" else default


def _root(url: str) -> str:
    p = urlsplit(url)
    if p.scheme not in ("http", "https") or not p.netloc:
        raise KServeError(f"not an http(s) URL in the object's status: {url!r}")
    return f"{p.scheme}://{p.netloc}"


def discover(obj: dict[str, Any], *, canary: str | None = None, ingress: str | None = None,
             siblings: list[dict[str, Any]] | None = None, default_prefix: str = "/v1") -> KServeTarget:
    """The new version of ``obj`` (an InferenceService or LLMInferenceService as the API returns
    it) to gate. ``canary``: a named RawDeployment canary; ``ingress``: connect here and send the
    tag URL's host; ``siblings``: the LLMInferenceServices of the namespace (for routing groups).
    Raises :class:`KServeError`."""
    shape, name, ns, prefix = _shape(obj, default_prefix)
    if shape == "llmisvc":
        return _llmisvc(obj, siblings or [obj], ns, prefix)
    if shape == "raw":
        return _raw(obj, name, ns, prefix, canary)
    tagged = ((obj.get("metadata") or {}).get("annotations") or {}).get(TAG_ROUTING, "").lower() == "true"
    return _serverless(obj, name, ns, prefix, ingress, tagged)


def _shape(obj: dict[str, Any], default_prefix: str) -> tuple[str, str, str, str]:
    """``(shape, name, namespace, route prefix)`` of a KServe object: shape ``llmisvc`` (an
    LLMInferenceService), ``raw`` (a RawDeployment/Standard InferenceService) or ``serverless``."""
    meta = obj.get("metadata") or {}
    name, ns = meta.get("name", "?"), meta.get("namespace", "default")
    prefix = _prefix(obj, default_prefix)
    if obj.get("kind", "InferenceService") == "LLMInferenceService":
        return "llmisvc", name, ns, prefix
    raw = (meta.get("annotations") or {}).get(DEPLOYMENT_MODE, "").lower() in ("rawdeployment", "standard")
    return ("raw" if raw else "serverless"), name, ns, prefix


def _revision_target(entry: dict[str, Any], revision: str, ns: str, prefix: str, ingress: str | None, shape: str,
                     percent: float, notes: list[str], untagged_why: str) -> KServeTarget:
    """A serverless revision's target from its traffic ``entry``: through ``ingress`` with the tag
    URL's host, else the tag URL itself, else (``untagged_why``) the revision's own in-cluster Service."""
    tag_url = entry.get("url")
    if tag_url:
        host = urlsplit(tag_url).netloc
        if ingress:
            notes.append(f"through the ingress {ingress} with Host {host}")
            return KServeTarget(_root(ingress), prefix, host, shape, revision, percent, notes)
        notes.append(f"tag URL {tag_url}")
        return KServeTarget(_root(tag_url), prefix, None, shape, revision, percent, notes)
    url = f"http://{revision}.{ns}.svc.cluster.local"
    notes.append(f"{untagged_why}: the revision's own Service {url} (in-cluster)")
    return KServeTarget(url, prefix, None, shape, revision, percent, notes)


def _serverless(obj: dict[str, Any], name: str, ns: str, prefix: str, ingress: str | None,
                tagged: bool) -> KServeTarget:
    pred = ((obj.get("status") or {}).get("components") or {}).get("predictor") or {}
    traffic = pred.get("traffic") or []
    latest = next((t for t in traffic if t.get("latestRevision")), None)
    if latest is None:
        raise KServeError(f"InferenceService {ns}/{name}: no latestRevision in status.components.predictor.traffic "
                          "(is the new revision Ready?)")
    revision = latest.get("revisionName") or pred.get("latestCreatedRevision") or "?"
    percent = float(latest.get("percent") or 0)
    if len(traffic) < 2 and percent >= 100:
        raise KServeError(f"InferenceService {ns}/{name}: revision {revision} already takes 100% of the traffic; "
                          "nothing to gate before rollout (set spec.predictor.canaryTrafficPercent)")
    notes = [f"serverless: revision {revision} at {percent:g}% (canaryTrafficPercent "
             f"{((obj.get('spec') or {}).get('predictor') or {}).get('canaryTrafficPercent', 'unset')})"]
    why = "tag routing off" if not tagged else "no tag URL in the traffic entry"
    return _revision_target(latest, revision, ns, prefix, ingress, "serverless", percent, notes, why)


def _raw(obj: dict[str, Any], name: str, ns: str, prefix: str, canary: str | None) -> KServeTarget:
    canaries = (obj.get("spec") or {}).get("canary") or []
    if not canaries:
        raise KServeError(f"InferenceService {ns}/{name} (RawDeployment) has no spec.canary[]: nothing to gate "
                          "before rollout")
    names = [c.get("name") for c in canaries]
    if canary is not None:
        chosen = next((c for c in canaries if c.get("name") == canary), None)
        if chosen is None:
            raise KServeError(f"InferenceService {ns}/{name}: no canary {canary!r}; canaries: {', '.join(names)}")
    else:
        idle = [c for c in canaries if not c.get("trafficPercent")]
        if len(idle) != 1:
            raise KServeError(f"InferenceService {ns}/{name}: {len(idle)} canaries at trafficPercent 0 "
                              f"({', '.join(c['name'] for c in idle) or 'none'}); name one with --canary "
                              f"(canaries: {', '.join(names)})")
        chosen = idle[0]
    percent = float(chosen.get("trafficPercent") or 0)
    url = f"http://{name}-{chosen['name']}-predictor.{ns}.svc.cluster.local"
    notes = [f"RawDeployment canary {chosen['name']} at {percent:g}%: its own Service {url}"]
    if percent > 0:
        notes.append(f"canary {chosen['name']} already takes {percent:g}% of the traffic")
    return KServeTarget(url, prefix, None, "raw-canary", chosen["name"], percent, notes)


def _route(o: dict[str, Any]) -> dict[str, Any]:
    return (((o.get("spec") or {}).get("router") or {}).get("route") or {})


def _llmisvc(obj: dict[str, Any], siblings: list[dict[str, Any]], ns: str, prefix: str) -> KServeTarget:
    name = obj["metadata"]["name"]
    group = _route(obj).get("group")
    members = [s for s in siblings if group is not None and _route(s).get("group") == group] if group else [obj]
    idle = [m for m in members if not _route(m).get("weight")]
    if _route(obj).get("weight"):
        if len(idle) != 1:
            raise KServeError(f"LLMInferenceService {ns}/{name} takes traffic (weight {_route(obj)['weight']}) and "
                              f"group {group!r} has {len(idle)} members at weight 0; name the one to gate with --isvc")
        chosen = idle[0]
    else:
        chosen = obj
    url = _llm_url(chosen, ns)
    cname = chosen["metadata"]["name"]
    notes = [f"LLMInferenceService group {group!r}: member {cname} at weight 0 of "
             f"{len(members)} member(s), through its own endpoint {url}"]
    return KServeTarget(_root(url), prefix, None, "llmisvc-group", cname, 0.0, notes)


def _llm_url(member: dict[str, Any], ns: str) -> str:
    """An LLMInferenceService's own endpoint: ``status.addresses[0].url``, else ``status.url``."""
    status = member.get("status") or {}
    addresses = [a.get("url") for a in status.get("addresses") or [] if a.get("url")]
    url = addresses[0] if addresses else status.get("url")
    if not url:
        raise KServeError(f"LLMInferenceService {ns}/{member['metadata']['name']}: no status.addresses[].url or "
                          "status.url (is it Ready?)")
    return url


# ---------------------------------------------------------------------------- the baseline
def discover_baseline(obj: dict[str, Any], *, ingress: str | None = None,
                      siblings: list[dict[str, Any]] | None = None, default_prefix: str = "/v1") -> KServeTarget:
    """The baseline of ``obj``: the version serving today, which a compare gate sends the same
    requests to (the counterpart of :func:`discover`, which finds the new one). Per shape:

    - serverless InferenceService: the ``status.components.predictor.traffic[]`` entry that is not
      ``latestRevision`` and takes traffic (the largest such), through its tag (``prev-``) URL --
      via ``ingress`` with that URL's host as ``host_header`` when given -- else its revision
      Service ``http://REVISION.NS.svc.cluster.local`` (shape ``serverless-prev``);
    - RawDeployment InferenceService: the main predictor ``http://{isvc}-predictor.NS.svc.cluster.local``
      at 100% less the canaries' ``trafficPercent`` (shape ``raw-main``);
    - LLMInferenceService routing group (``siblings``: the namespace's LLMInferenceServices): the
      member at weight > 0, the heaviest when several, at its share of the group's weight, through
      its own endpoint (shape ``llmisvc-serving``).

    Route prefix as in :func:`discover`. Raises :class:`KServeError` (one line) when no previous
    version serves traffic: then pass ``--baseline URL``."""
    shape, name, ns, prefix = _shape(obj, default_prefix)
    if shape == "llmisvc":
        return _llmisvc_baseline(obj, siblings or [obj], ns, prefix)
    if shape == "raw":
        return _raw_baseline(obj, name, ns, prefix)
    return _serverless_baseline(obj, name, ns, prefix, ingress)


def _serverless_baseline(obj: dict[str, Any], name: str, ns: str, prefix: str, ingress: str | None) -> KServeTarget:
    pred = ((obj.get("status") or {}).get("components") or {}).get("predictor") or {}
    traffic = pred.get("traffic") or []
    latest = next((t for t in traffic if t.get("latestRevision")), None)
    latest_rev = (latest or {}).get("revisionName") or pred.get("latestCreatedRevision")
    serving = [t for t in traffic if not t.get("latestRevision") and float(t.get("percent") or 0) > 0
               and t.get("revisionName") and t.get("revisionName") != latest_rev]
    if not serving:
        held = f" (revision {latest_rev} takes {float((latest or {}).get('percent') or 0):g}%)" if latest_rev else ""
        raise KServeError(f"InferenceService {ns}/{name}: no previous revision serving traffic{held}; "
                          "pass --baseline URL")
    prev = max(serving, key=lambda t: float(t.get("percent") or 0))
    revision, percent = prev["revisionName"], float(prev.get("percent") or 0)
    notes = [f"serverless baseline: previous revision {revision} at {percent:g}% (not latestRevision; "
             f"new revision {latest_rev or '?'})"]
    if len(serving) > 1:
        notes.append("also serving: " + ", ".join(f"{t['revisionName']} {float(t.get('percent') or 0):g}%"
                                                  for t in serving if t is not prev))
    return _revision_target(prev, revision, ns, prefix, ingress, "serverless-prev", percent, notes,
                            "no tag URL in the traffic entry")


def _raw_baseline(obj: dict[str, Any], name: str, ns: str, prefix: str) -> KServeTarget:
    canaries = (obj.get("spec") or {}).get("canary") or []
    share = sum(float(c.get("trafficPercent") or 0) for c in canaries)
    percent = max(0.0, 100.0 - share)
    revision = f"{name}-predictor"
    url = f"http://{revision}.{ns}.svc.cluster.local"
    notes = [f"RawDeployment baseline: the main predictor {revision} at {percent:g}% (100 less the "
             f"{len(canaries)} canaries' {share:g}%): its own Service {url}"]
    if percent <= 0:
        notes.append(f"the main predictor takes no traffic (the canaries take {share:g}%)")
    return KServeTarget(url, prefix, None, "raw-main", revision, percent, notes)


def _llmisvc_baseline(obj: dict[str, Any], siblings: list[dict[str, Any]], ns: str, prefix: str) -> KServeTarget:
    name = obj["metadata"]["name"]
    group = _route(obj).get("group")
    members = [s for s in siblings if _route(s).get("group") == group] if group else [obj]
    serving = [m for m in members if float(_route(m).get("weight") or 0) > 0]
    if not serving:
        raise KServeError(f"LLMInferenceService {ns}/{name}: no member of group {group!r} serves traffic "
                          "(all at weight 0); pass --baseline URL")
    chosen = max(serving, key=lambda m: float(_route(m)["weight"]))
    cname, weight = chosen["metadata"]["name"], float(_route(chosen)["weight"])
    total = sum(float(_route(m)["weight"]) for m in serving)
    percent = 100.0 * weight / total
    url = _llm_url(chosen, ns)
    notes = [f"LLMInferenceService group {group!r} baseline: member {cname} at weight {weight:g} "
             f"({percent:g}% of the group), through its own endpoint {url}"]
    if len(serving) > 1:
        notes.append("the largest weight of " + ", ".join(
            f"{m['metadata']['name']} {float(_route(m)['weight']):g}" for m in serving))
    return KServeTarget(_root(url), prefix, None, "llmisvc-serving", cname, percent, notes)


#: Kubernetes' ``timeoutSeconds`` when a probe sets none (core/v1 Probe: "Defaults to 1 second").
K8S_PROBE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ProbeTimeout:
    """The probe timeout the kubelet enforces on the gated pods: ``seconds`` and ``where`` it was
    read (``spec.predictor.model.readinessProbe.timeoutSeconds``)."""

    seconds: float
    where: str


def probe_timeout(obj: dict[str, Any]) -> ProbeTimeout | None:
    """The smallest liveness/readiness probe timeout (seconds) of ``obj``'s serving containers: an
    InferenceService's ``spec.predictor.model`` (a container inline) and ``spec.predictor.containers[]``,
    an LLMInferenceService's ``spec.template.containers[]``. A probe without ``timeoutSeconds`` gets
    Kubernetes' default, 1 s. None when no container declares such a probe (then the profile's
    ``limits.probe_timeout_s`` decides). Pure."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "LLMInferenceService":
        containers = [(f"spec.template.containers[{c.get('name', i)}]", c)
                      for i, c in enumerate((spec.get("template") or {}).get("containers") or [])]
    else:
        pred = spec.get("predictor") or {}
        containers = [("spec.predictor.model", pred.get("model") or {})]
        containers += [(f"spec.predictor.containers[{c.get('name', i)}]", c)
                       for i, c in enumerate(pred.get("containers") or [])]
    found = []
    for path, c in containers:
        for kind in ("livenessProbe", "readinessProbe"):
            probe = c.get(kind) if isinstance(c, dict) else None
            if not isinstance(probe, dict):
                continue
            raw = probe.get("timeoutSeconds")
            if raw is None:
                found.append(ProbeTimeout(K8S_PROBE_TIMEOUT_S, f"{path}.{kind} (timeoutSeconds unset: Kubernetes' "
                                                                f"default {K8S_PROBE_TIMEOUT_S:g} s)"))
            else:
                found.append(ProbeTimeout(float(raw), f"{path}.{kind}.timeoutSeconds {float(raw):g} s"))
    return min(found, key=lambda p: p.seconds) if found else None


#: Kubernetes' Probe defaults (core/v1): periodSeconds, timeoutSeconds, successThreshold, failureThreshold, initialDelaySeconds.
K8S_PROBE_DEFAULTS = {"periodSeconds": 10.0, "timeoutSeconds": 1.0, "successThreshold": 1.0, "failureThreshold": 3.0,
                      "initialDelaySeconds": 0.0}


@dataclass(frozen=True)
class ReadinessProbe:
    """The serving container's ``readinessProbe`` as the kubelet runs it: ``where`` (its path in the
    object), ``action`` (``httpGet /health :8080``, ``tcpSocket :8080``, ``exec [...]``, ``grpc :8080``)
    and ``timing`` (seconds / counts, each field as written or Kubernetes' default; ``defaulted``
    names those not written)."""

    where: str
    action: str
    path: str | None
    timing: dict[str, float]
    defaulted: tuple[str, ...]

    def words(self) -> str:
        t = self.timing
        return (f"the InferenceService's readinessProbe {self.action} every {t['periodSeconds']:g} s (timeout "
                f"{t['timeoutSeconds']:g} s, ready after {t['successThreshold']:g} success, initialDelaySeconds "
                f"{t['initialDelaySeconds']:g}; {self.where}"
                + (f"; {', '.join(self.defaulted)} Kubernetes' default" if self.defaulted else "") + ")")

    def evidence(self) -> dict[str, Any]:
        return {"where": self.where, "action": self.action, "path": self.path, "timing": dict(self.timing),
                "defaulted": list(self.defaulted)}


def readiness_probe(obj: dict[str, Any]) -> ReadinessProbe | None:
    """The serving container's readiness probe (the container :func:`serving_spec` reads), or None
    when it declares none. Pure."""
    path, c, _ = _serving_container(obj)
    probe = c.get("readinessProbe") if isinstance(c, dict) else None
    if not isinstance(probe, dict):
        return None
    if isinstance(probe.get("httpGet"), dict):
        h = probe["httpGet"]
        route = str(h.get("path") or "/")
        action, route_path = f"httpGet {route}" + (f" :{h['port']}" if h.get("port") is not None else ""), route
    elif isinstance(probe.get("tcpSocket"), dict):
        action, route_path = f"tcpSocket :{probe['tcpSocket'].get('port')}", None
    elif isinstance(probe.get("grpc"), dict):
        action, route_path = f"grpc :{probe['grpc'].get('port')}", None
    elif isinstance(probe.get("exec"), dict):
        action, route_path = f"exec {list(probe['exec'].get('command') or [])}", None
    else:
        action, route_path = "no handler", None
    timing = {k: float(probe[k]) if probe.get(k) is not None else v for k, v in K8S_PROBE_DEFAULTS.items()}
    defaulted = tuple(k for k in K8S_PROBE_DEFAULTS if probe.get(k) is None)
    return ReadinessProbe(f"{path}.readinessProbe", action, route_path, timing, defaulted)


def custom_objects_api() -> CustomObjects:
    """``CustomObjectsApi`` from the in-cluster config (a Job's service account) or ``~/.kube/config``."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CustomObjectsApi()


def read(name: str, namespace: str, api: CustomObjects) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The InferenceService (or, failing that, LLMInferenceService) ``namespace/name`` and, for an
    LLMInferenceService, its namespace's LLMInferenceServices. Raises :class:`KServeError` (not
    found, no permission: one line)."""
    errors = []
    for (version, plural), kind in ((ISVC, "InferenceService"), (LLMISVC, "LLMInferenceService")):
        try:
            obj = api.get_namespaced_custom_object(GROUP, version, namespace, plural, name)
        except Exception as exc:
            status = getattr(exc, "status", None)
            errors.append(f"{kind}: {status or type(exc).__name__}")
            if status not in (404, None):
                raise KServeError(f"reading {kind} {namespace}/{name}: HTTP {status} "
                                  f"({getattr(exc, 'reason', '')}); check the service account's RBAC") from None
            continue
        obj.setdefault("kind", kind)
        siblings: list[dict[str, Any]] = []
        if kind == "LLMInferenceService":
            siblings = api.list_namespaced_custom_object(GROUP, version, namespace, plural).get("items", [])
            for s in siblings:
                s.setdefault("kind", kind)
        return obj, siblings
    raise KServeError(f"no InferenceService or LLMInferenceService {namespace}/{name} ({'; '.join(errors)})")


# ---------------------------------------------------------------------------- the serving spec
#: Kubernetes' ``terminationGracePeriodSeconds`` when a pod sets none (core/v1 PodSpec: "Defaults to 30 seconds").
K8S_GRACE_S = 30.0
#: Knative Serving's revision ``timeoutSeconds`` when ``spec.predictor.timeout`` is unset
#: (config-defaults ``revision-timeout-seconds: 300``; KServe's ksvc_reconciler.go leaves it to Knative).
KNATIVE_REVISION_TIMEOUT_S = 300.0
#: KServe's HTTPRoute request timeout for a RawDeployment predictor when ``spec.predictor.timeout``
#: is unset (pkg/controller/v1beta1/inferenceservice/reconcilers/ingress/httproute_reconciler.go:
#: ``DefaultTimeout = toGatewayAPIDuration(60)``; none when the ingress config disables it).
RAW_ROUTE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServingSpec:
    """What the gated KServe object runs, read field by field (:func:`serving_spec`, pure).

    ``kind``/``shape`` (``serverless``, ``raw``, ``llmisvc``); ``container``: the serving
    container's path in the object (``spec.predictor.model``); ``argv``: its ``command`` + ``args``
    as written (None when it sets neither); ``tensor``: an LLMInferenceService's
    ``spec.parallelism.tensor`` (rendered as ``--tensor-parallel-size``); ``resources``: the
    container's ``resources`` (``requests``/``limits`` as Kubernetes quantities); ``probes``:
    ``{"livenessProbe": timeoutSeconds or None (unset), ...}`` for the probes it declares;
    ``grace_s``/``grace_where``: ``terminationGracePeriodSeconds`` (s) and where it was read or
    which default applies; ``prestop_s``/``prestop_where``: the preStop hook's sleep (s; 0 when
    none); ``timeout_s``/``timeout_where``: the request timeout KServe sets on the route (s;
    None = no timeout or none readable, the words say which)."""

    kind: str
    shape: str
    name: str
    container: str
    argv: tuple[str, ...] | None
    tensor: int | None
    resources: dict[str, Any]
    probes: dict[str, float | None]
    grace_s: float
    grace_where: str
    prestop_s: float
    prestop_where: str
    timeout_s: float | None
    timeout_where: str


def _serving_container(obj: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``(path, container, pod spec)`` of the object's serving container."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "LLMInferenceService":
        pod = spec.get("template") or {}
        cs = pod.get("containers") or []
        c = next((c for c in cs if c.get("name") == "main"), cs[0] if cs else {})
        return f"spec.template.containers[{c.get('name', 0)}]", c, pod
    pred = spec.get("predictor") or {}
    if pred.get("model"):
        return "spec.predictor.model", pred["model"], pred
    cs = pred.get("containers") or []
    c = next((c for c in cs if c.get("name") == "kserve-container"), cs[0] if cs else {})
    return f"spec.predictor.containers[{c.get('name', 0)}]", c, pred


def _prestop_sleep(container: dict[str, Any], path: str) -> tuple[float, str]:
    """The preStop hook's sleep in seconds: ``lifecycle.preStop.sleep.seconds`` (Kubernetes 1.29+)
    or an exec ``sleep N`` (``[/bin/sleep, "15"]``, ``[sh, -c, "sleep 15 && ..."]``); 0 without one."""
    hook = ((container.get("lifecycle") or {}).get("preStop")) or {}
    if not hook:
        return 0.0, f"{path} has no preStop hook"
    if isinstance(hook.get("sleep"), dict) and hook["sleep"].get("seconds") is not None:
        s = float(hook["sleep"]["seconds"])
        return s, f"{path}.lifecycle.preStop.sleep.seconds {s:g}"
    words = " ".join(str(w) for w in ((hook.get("exec") or {}).get("command") or [])).split()
    for i, w in enumerate(words[:-1]):
        if w.rsplit("/", 1)[-1] == "sleep":
            try:
                s = float(words[i + 1].rstrip(";&"))
            except ValueError:
                break
            return s, f"{path}.lifecycle.preStop.exec sleep {s:g}"
    return 0.0, f"{path}.lifecycle.preStop is not a sleep (counted as 0 s)"


def _route_timeout(obj: dict[str, Any], shape: str) -> tuple[float | None, str]:
    spec = obj.get("spec") or {}
    if shape == "llmisvc":
        route = ((spec.get("router") or {}).get("route") or {})
        http = route.get("http") or {}
        rules = ((http.get("spec") or {}).get("rules")) or []
        found = [r.get("timeouts", {}).get("request") for r in rules if (r.get("timeouts") or {}).get("request")]
        if found:
            secs = [parse_duration_s(t) for t in found]
            worst = min(secs)
            return (None if worst == 0 else worst), (f"spec.router.route.http.spec.rules[].timeouts.request "
                                                     f"{found[secs.index(worst)]}" + (" (0s: none)" if worst == 0 else ""))
        if http.get("refs"):
            return None, "spec.router.route.http.refs: the HTTPRoute is the user's own (not read)"
        return None, ("no route timeout: KServe's managed HTTPRoute sets timeouts.request 0s "
                      "(config/llmisvcconfig/config-llm-router-route.yaml)")
    pred = spec.get("predictor") or {}
    if pred.get("timeout") is not None:
        return float(pred["timeout"]), f"spec.predictor.timeout {float(pred['timeout']):g} s"
    if shape == "raw":
        return RAW_ROUTE_TIMEOUT_S, (f"spec.predictor.timeout unset: KServe's HTTPRoute default "
                                     f"{RAW_ROUTE_TIMEOUT_S:g} s (RawDeployment through the Gateway API)")
    return KNATIVE_REVISION_TIMEOUT_S, (f"spec.predictor.timeout unset: Knative's revision timeoutSeconds default "
                                        f"{KNATIVE_REVISION_TIMEOUT_S:g} s")


def parse_duration_s(text: str) -> float:
    """Seconds of a Gateway API duration (``300s``, ``5m``, ``1h30m``, ``500ms``, ``0s``).
    Raises ``ValueError`` naming the value."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(text))
    if not parts or "".join(n + u for n, u in parts) != str(text).strip():
        raise ValueError(f"{text!r} is not a duration (e.g. 300s, 5m)")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def serving_spec(obj: dict[str, Any]) -> ServingSpec:
    """:class:`ServingSpec` of ``obj`` (an InferenceService or LLMInferenceService as the API
    returns it). Unset fields get the defaults Kubernetes / Knative / KServe apply, named in the
    ``*_where`` words. Pure."""
    kind = obj.get("kind", "InferenceService")
    meta = obj.get("metadata") or {}
    mode = str((meta.get("annotations") or {}).get(DEPLOYMENT_MODE, "")).lower()
    shape = "llmisvc" if kind == "LLMInferenceService" else (
        "raw" if mode in ("rawdeployment", "standard") else "serverless")
    path, c, pod = _serving_container(obj)
    argv = None
    if c.get("command") is not None or c.get("args") is not None:
        argv = tuple(str(a) for a in (c.get("command") or []) + (c.get("args") or []))
    tensor = (((obj.get("spec") or {}).get("parallelism") or {}).get("tensor")) if shape == "llmisvc" else None
    probes = {k: (None if (c.get(k) or {}).get("timeoutSeconds") is None else float(c[k]["timeoutSeconds"]))
              for k in ("livenessProbe", "readinessProbe") if isinstance(c.get(k), dict)}
    pod_path = "spec.template" if shape == "llmisvc" else "spec.predictor"
    if pod.get("terminationGracePeriodSeconds") is not None:
        grace = float(pod["terminationGracePeriodSeconds"])
        grace_where = f"{pod_path}.terminationGracePeriodSeconds {grace:g}"
    else:
        grace, grace_where = K8S_GRACE_S, (f"{pod_path}.terminationGracePeriodSeconds unset: Kubernetes' default "
                                           f"{K8S_GRACE_S:g} s")
    prestop, prestop_where = _prestop_sleep(c, path)
    timeout, timeout_where = _route_timeout(obj, shape)
    return ServingSpec(kind, shape, f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}", path, argv,
                       int(tensor) if tensor else None, dict(c.get("resources") or {}), probes, grace, grace_where,
                       prestop, prestop_where, timeout, timeout_where)


_QUANTITY = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50,
             "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "m": 1e-3, "": 1}


def parse_quantity(value: Any) -> float:
    """A Kubernetes resource quantity as a number (``32Gi`` -> 34359738368.0 bytes, ``500m`` ->
    0.5, ``"1"`` -> 1.0, ``1e9``). Raises ``ValueError`` naming the value."""
    m = re.fullmatch(r"\s*([0-9.]+(?:[eE][-+]?\d+)?)\s*(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P|m|)\s*", str(value))
    if not m:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 32Gi, 500Mi, 1)")
    return float(m.group(1)) * _QUANTITY[m.group(2)]
