"""Redaction of secrets from anything kvgate writes (reports, logs, console).

Two mechanisms: URLs lose their userinfo and secret-looking query parameters
(:func:`redact_url`); free text and nested data lose registered secret values and
``Authorization``/``api-key`` header values (:class:`Redactor`).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
_SECRET_KEYS = re.compile(r"(key|token|secret|password|auth|signature)", re.I)
_HEADER_RE = re.compile(r"(?i)(authorization|x-api-key|api-key)(\"?\s*[:=]\s*\"?)(bearer\s+)?[^\s\",}']+")


def redact_url(url: str) -> str:
    """``https://user:pw@h/p?api_key=x&a=1`` -> ``https://***@h/p?api_key=***&a=1``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = [(k, MASK if _SECRET_KEYS.search(k) else v) for k, v in parse_qsl(query, keep_blank_values=True)]
        query = urlencode(pairs, safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


class Redactor:
    """Masks registered secret values and auth header values in strings and nested data.

    >>> r = Redactor(["sk-123"]); r.text("key=sk-123")
    'key=***'
    """

    def __init__(self, secrets: list[str | None] | None = None) -> None:
        self.secrets = sorted({s for s in (secrets or []) if s and len(s) >= 4}, key=len, reverse=True)

    def add(self, secret: str | None) -> None:
        if secret and len(secret) >= 4 and secret not in self.secrets:
            self.secrets = sorted([*self.secrets, secret], key=len, reverse=True)

    def text(self, s: str) -> str:
        for secret in self.secrets:
            s = s.replace(secret, MASK)
        return _HEADER_RE.sub(lambda m: m.group(1) + m.group(2) + (m.group(3) or "") + MASK, s)

    def data(self, obj: Any) -> Any:
        """Deep copy of ``obj`` (dict/list/tuple/str) with secrets masked; dict keys that name
        secrets (``authorization``, ``api_key``...) get their values masked entirely."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {k: (MASK if isinstance(k, str) and k.lower() in {"authorization", "api_key", "x-api-key"}
                        and v else self.data(v)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.data(v) for v in obj]
        return obj
