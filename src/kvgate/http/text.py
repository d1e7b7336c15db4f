"""Text for one-line verdicts: :func:`clip`, the one rule for shortening a server's text (error
messages, bodies) wherever kvgate quotes it (:mod:`kvgate.http.client`, :mod:`kvgate.http.sse`,
the gates), and :func:`describe_answer`, what an answer was in a few words (a gateway's HTML page
by its title)."""

from __future__ import annotations

import html
import json
import re


def clip(text: str, limit: int | None) -> str:
    """``text`` whole if it has at most ``limit`` characters (``None``: no limit), else cut at the
    last word boundary before ``limit`` with an ellipsis (``"...at least 2049 input…"``), never
    mid-word (a single word longer than ``limit`` is cut at ``limit``). Whitespace runs, newlines
    included, become one space so the text fits on one line. The result has at most ``limit``
    characters, the ellipsis included."""
    text = " ".join(text.split())
    if limit is None or len(text) <= limit:
        return text
    cut = text[: max(1, limit - 1)]
    if not text[len(cut)].isspace():
        head = cut.rsplit(" ", 1)[0] if " " in cut else cut
        cut = head
    return cut.rstrip(" ,;:.") + "…"


def describe_answer(status: int, text: str, headers: dict[str, str] | None = None) -> str:
    """What an answer was, in a few words, for a verdict: ``HTML: "413 Request Entity Too Large"``
    (the page's ``<title>``, else its first ``<h1>``), ``JSON error: "..."`` (OpenAI's
    ``error.message`` or a ``detail``), ``JSON: {...}``, ``text/plain: "..."``, ``an empty body``;
    each quote clipped (:func:`clip`, 80 characters). Status 0 (no answer): the client's text."""
    if status == 0:
        return clip(text, 120)
    ctype = ((headers or {}).get("content-type") or "").split(";")[0].strip().lower()
    body = text.strip()
    if not body:
        return "an empty body"
    if "html" in ctype or body[:1] == "<":
        m = re.search(r"<title[^>]*>(.*?)</title>", body, re.I | re.S) or re.search(r"<h1[^>]*>(.*?)</h1>", body, re.I | re.S)
        inner = html.unescape(re.sub(r"<[^>]+>", " ", m.group(1))) if m else body
        return f'HTML: "{clip(inner, 80)}"'
    try:
        obj = json.loads(body)
    except ValueError:
        return f'{ctype or "non-JSON"}: "{clip(body, 80)}"'
    if isinstance(obj, dict):
        err = obj.get("error")
        msg = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else obj.get("detail")
        if isinstance(msg, str):
            return f'JSON error: "{clip(msg, 80)}"'
    return f"JSON: {clip(json.dumps(obj), 80)}"


__all__ = ["clip", "describe_answer"]
