"""Preflight: before any gate runs, prove the endpoint is an OpenAI-compatible server that serves
the profile's model. One ``GET {route_prefix}/models``; anything else ends the run as a usage
error in one line, so a wrong URL, a static file server, a dead port or a refused API key is never
reported as a list of deployment FAILs.

Called by the plugin for ``--endpoint`` (at configure time) and by the endpoint fixture for the
embedded server (once it is healthy)::

    preflight(endpoint, profile, api_key_env)   # -> None, or raises PreflightError
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, ValidationError

from kvgate.http.client import Endpoint, EndpointUnreachable, KvClient, Reply
from kvgate.profile.models import Profile

#: Seconds the one preflight request may take (connect and answer).
PREFLIGHT_TIMEOUT_S = 10.0
#: Variables that commonly hold an OpenAI-compatible key (the openai SDK's, vLLM's own): kvgate
#: never sends them unasked, but a refusal for a missing key names the ones set (names only).
WELL_KNOWN_KEY_VARS = ("OPENAI_API_KEY", "VLLM_API_KEY")


class PreflightError(Exception):
    """The endpoint cannot be gated. ``str()`` is one line: the URL, what it answered, what to do.

    ``kind`` says which check failed: ``unreachable``, ``auth``, ``not-openai``, ``model`` or
    ``version`` (a ``--vllm-version`` server that says another release).
    It never contains the API key.
    """

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class _ModelCard(BaseModel):
    """One entry of OpenAI's model list: ``{"id": "...", "object": "model", ...}``."""

    model_config = ConfigDict(extra="allow")
    id: str


class _ModelList(BaseModel):
    """OpenAI's ``GET /v1/models`` answer: ``{"object": "list", "data": [{"id": ...}, ...]}``."""

    model_config = ConfigDict(extra="allow")
    data: list[_ModelCard]


def _who_holds_the_key(endpoint: Endpoint, profile: Profile, api_key_env: str | None,
                       environ: Mapping[str, str]) -> str:
    """Where the key came from, by variable name only (never the value); with none sent, the
    variables of :data:`WELL_KNOWN_KEY_VARS` set (non-empty) in ``environ``, which kvgate does not
    send unless named."""
    if api_key_env:
        return f"the key in ${api_key_env} (--api-key-env) was refused; check it"
    if profile.endpoint.api_key_env:
        return (f"the key in ${profile.endpoint.api_key_env} (the profile's endpoint.api_key_env) was refused; "
                "check it, or name another variable with --api-key-env VAR")
    if endpoint.api_key:
        return "the API key was refused; check it (--api-key-env VAR names the variable holding it)"
    seen = [v for v in WELL_KNOWN_KEY_VARS if environ.get(v)]
    if seen:
        names = " and ".join(seen)
        return (f"no API key was sent: {names} {'is' if len(seen) == 1 else 'are'} set here, but kvgate sends only "
                f"the key of a variable it is told of -- name it with --api-key-env {seen[0]}"
                + (" (or the other)" if len(seen) > 1 else ""))
    return "no API key was sent; put it in an environment variable and name it with --api-key-env VAR"


def _describe_body(reply: Reply) -> str:
    """What came back, in a few words: content type and size, never the body itself (HTML, ...)."""
    ctype = (reply.headers.get("content-type") or "no content-type").split(";")[0].strip()
    size = reply.body_bytes if reply.body_bytes is not None else len(reply.text.encode("utf-8", "replace"))
    return f"{ctype}, {size:,} bytes"


def _shape(body: Any) -> str:
    if isinstance(body, dict):
        keys = sorted(body)[:6]
        return f"a JSON object with keys {keys}" if keys else "an empty JSON object"
    return f"a JSON {type(body).__name__}"


def preflight(endpoint: Endpoint, profile: Profile, api_key_env: str | None = None, *,
              client: KvClient | None = None, environ: Mapping[str, str] | None = None) -> None:
    """Check that ``endpoint`` answers ``GET {route_prefix}/models`` with OpenAI's model list
    (``{"data": [{"id": ...}]}``) that names ``profile.model.served_name``.

    One request, no retries, at most :data:`PREFLIGHT_TIMEOUT_S` seconds (``client`` may be given
    for tests; it is not closed). ``api_key_env`` is the ``--api-key-env`` value, used only to
    name the variable in the message; ``environ`` (default ``os.environ``) is read only for the
    names of :data:`WELL_KNOWN_KEY_VARS` set in it, for the message of a missing key.

    Raises :class:`PreflightError` (one line, the key never in it):

    - ``unreachable``: nothing answered (connection refused, DNS, TLS, connect timeout);
    - ``auth``: 401/403 -- the key was refused or missing; names ``--api-key-env`` (and, with no key
      sent, ``OPENAI_API_KEY`` / ``VLLM_API_KEY`` where set: their names, never their values);
    - ``server-error``: a 5xx -- something answers there and failed (its log says why);
    - ``not-openai``: any other status, a body that is not JSON, or JSON not in OpenAI's shape;
    - ``model``: the list does not contain the profile's model; names the models it serves.
    """
    own = client is None
    c = client or KvClient(endpoint, timeout_s=PREFLIGHT_TIMEOUT_S)
    path = c.api("/models")
    where = f"endpoint {endpoint.display}"
    try:
        try:
            reply = c.models()
        except EndpointUnreachable as exc:
            raise PreflightError(f"{exc}; nothing was gated", "unreachable") from None
    finally:
        if own:
            c.close()
    if reply.status in (401, 403):
        who = _who_holds_the_key(endpoint, profile, api_key_env, os.environ if environ is None else environ)
        raise PreflightError(f"{where} answered {reply.status} on {path}: {who}; nothing was gated", "auth")
    hint = ("not an OpenAI-compatible API at this URL (check the URL and its route prefix, e.g. /v1 or "
            "/openai/v1); nothing was gated")
    if reply.status == 0:
        raise PreflightError(f"{where} did not finish answering {path} within {PREFLIGHT_TIMEOUT_S:g} s "
                             f"({reply.text.splitlines()[0] if reply.text else 'no answer'}); nothing was gated",
                             "not-openai")
    if reply.status >= 500:  # something answers at this URL and failed: the server's error, not a wrong URL
        raise PreflightError(f"{where} answered {reply.status} ({_describe_body(reply)}) on {path}: the server failed "
                             "the model list (see its log); nothing was gated", "server-error")
    if reply.status != 200:
        raise PreflightError(f"{where} answered {reply.status} ({_describe_body(reply)}) on {path}: {hint}", "not-openai")
    body = reply.json
    if body is None:
        raise PreflightError(f"{where} answered 200 with {_describe_body(reply)} on {path}, not JSON: {hint}",
                             "not-openai")
    try:
        models = _ModelList.model_validate(body)
    except ValidationError:
        raise PreflightError(f"{where} answered {path} with {_shape(body)}, not OpenAI's model list "
                             f"({{\"data\": [{{\"id\": ...}}]}}): {hint}", "not-openai") from None
    ids = [m.id for m in models.data]
    want = profile.model.served_name
    if want not in ids:
        served = ", ".join(repr(i) for i in ids[:10]) + (f" (+{len(ids) - 10} more)" if len(ids) > 10 else "")
        raise PreflightError(f"{where} serves {served or 'no models'}, not the profile's model {want!r} "
                             f"(model.served_name of profile {profile.name}); nothing was gated", "model")
