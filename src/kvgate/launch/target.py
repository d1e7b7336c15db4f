"""Target mode: an existing endpoint given by URL (``--endpoint``).

The URL may include the OpenAI route prefix (``http://h:8000/v1``, KServe's
``https://x/openai/v1``) or not (``http://h:8000``, then the profile's ``endpoint.route_prefix``
applies). The API key comes from an environment variable — ``--api-key-env`` or the profile's
``endpoint.api_key_env`` — and is never printed or written.
"""

from __future__ import annotations

import re

import os
from urllib.parse import urlsplit, urlunsplit

from kvgate.http.client import Endpoint, KvClient
from kvgate.profile.models import Profile
from kvgate.report.redact import redact_url

KNOWN_PREFIXES = ("/openai/v1", "/v1")


class TargetError(Exception):
    """The endpoint URL or its API-key variable is unusable. One-line message."""


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def api_key_env_problem(name: str | None) -> str | None:
    """Why ``--api-key-env NAME`` cannot be right, or None: it takes a variable's *name*; a value that
    is not one (``sk-...``, ``$LLM_KEY`` expanded by the shell) is likely the key itself, so it is
    never repeated."""
    if name is None or _ENV_NAME.fullmatch(name):
        return None
    return ("--api-key-env takes the name of an environment variable holding the key (e.g. LLM_KEY), not the key: "
            "the value given is not a variable name (not shown)")


def endpoint_from_url(url: str, profile: Profile, api_key_env: str | None = None,
                      environ: dict[str, str] | None = None) -> Endpoint:
    """Split ``url`` into server root + route prefix and attach the API key from the environment.
    Raises :class:`TargetError` (one line) for a URL that does not parse (``http://[::1``), is not
    http(s), carries credentials or a query string/fragment (kvgate sends neither), or whose API-key
    variable is not set. Whitespace around ``url`` (a pasted line) is dropped; inside it, refused."""
    environ = os.environ if environ is None else environ
    url = url.strip()
    if any(c.isspace() for c in url):
        raise TargetError(f"--endpoint {redact_url(url)!r} has whitespace inside it; give the URL alone")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in 0-65535
    except ValueError as exc:  # "http://[::1" (unclosed IPv6 bracket), "http://h:99999"
        raise TargetError(f"--endpoint {redact_url(url)!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.netloc or not parts.hostname:
        raise TargetError(f"--endpoint {redact_url(url)!r} is not an http(s) URL")
    if "@" in parts.netloc:
        raise TargetError("--endpoint must not carry credentials (user:password@); put the API key in an "
                          "environment variable and name it with --api-key-env VAR")
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):  # never echoed: a query may hold a key
        raise TargetError(f"--endpoint {urlunsplit((parts.scheme, parts.netloc, parts.path, '', ''))!r} carries a "
                          f"query string or fragment (not shown) that kvgate would not send; give the server's root "
                          f"or its /v1 URL without '?' or '#'")
    path = parts.path.rstrip("/")
    prefix = profile.endpoint.route_prefix
    for known in KNOWN_PREFIXES:
        if path.endswith(known):
            prefix, path = known, path[: -len(known)]
            break
    base = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    var = api_key_env or profile.endpoint.api_key_env
    key = None
    if var:
        key = environ.get(var)
        if not key:
            raise TargetError(f"API key variable {var} is not set (named by "
                              f"{'--api-key-env' if api_key_env else 'the profile endpoint.api_key_env'})")
    return Endpoint(base_url=base, route_prefix=prefix, api_key=key, host_header=profile.endpoint.host_header)


def check_reachable(endpoint: Endpoint) -> None:
    """One request to the models route; raises :class:`~kvgate.http.client.EndpointUnreachable` (one line) if nothing answers."""
    with KvClient(endpoint, timeout_s=10.0) as c:
        c.models()
