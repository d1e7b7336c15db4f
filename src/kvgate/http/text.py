"""Text for one-line verdicts: :func:`clip`, the one rule for shortening a server's text (error
messages, bodies) wherever kvgate quotes it (:mod:`kvgate.http.client`, :mod:`kvgate.http.sse`,
the gates)."""

from __future__ import annotations


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


__all__ = ["clip"]
