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
#: A secret this long or longer is masked wherever it occurs; a shorter one (vLLM servers without
#: auth are often given placeholder keys: ``EMPTY``, ``test``, ``vllm``) only as a whole token, and
#: never where it is one of kvgate's own words (:data:`OWN_WORDS`): masking ``PASS`` inside
#: ``-> PASS`` or ``tiny`` inside ``tiny-cpu`` would corrupt the verdict without hiding anything.
WHOLE_TOKEN_BELOW = 8
OWN_WORDS = frozenset({"PASS", "FAIL", "SKIP", "INVALID", "INCOMPLETE", "INCONCLUSIVE", "ERROR", "RUNNING", "RECORDED", "CERTIFIED",
                       "NOT-CERTIFIED", "NO-GATES", "NO-SERVER", "NO-VERDICT", "enforce", "record", "certify"})
_SECRET_KEYS = re.compile(r"(key|token|secret|password|auth|signature)", re.I)
_HEADER_RE = re.compile(r"(?i)(authorization|x-api-key|api-key)(\"?\s*[:=]\s*\"?)(bearer\s+)?[^\s\",}']+")


def redact_url(url: str) -> str:
    """``https://user:pw@h/p?api_key=x&a=1`` -> ``https://***@h/p?api_key=***&a=1``. A URL that does not
    parse (``http://u:pw@[::1``) has its user part masked all the same (everything between ``//`` and
    the last ``@`` before the path) and its query dropped."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port out of range, as the callers' checks do
    except ValueError:
        head, sep, _ = url.partition("?")
        return re.sub(r"//[^/]*@", "//" + MASK + "@", head) + (sep and sep + MASK)
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
        self.secrets: list[str] = []
        for secret in secrets or []:
            self.add(secret)

    def add(self, secret: str | None) -> None:
        """Register a secret value (an API key: characters). Values under 4 characters are not
        secrets worth the name and are only masked in auth headers (see :data:`WHOLE_TOKEN_BELOW`)."""
        if secret and len(secret) >= 4 and secret not in self.secrets:
            self.secrets = sorted([*self.secrets, secret], key=len, reverse=True)

    def text(self, s: str) -> str:
        """``s`` with every registered secret and auth-header value replaced by ``***``."""
        for secret in self.secrets:
            if len(secret) >= WHOLE_TOKEN_BELOW:
                s = s.replace(secret, MASK)
            else:
                pattern = r"(?<![\w\-.])" + re.escape(secret) + r"(?![\w\-.])"
                s = re.sub(pattern, lambda m: m.group(0) if m.group(0) in OWN_WORDS else MASK, s)
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
