"""Pure checks on answer text: expectations, margins, degeneration, multibyte integrity.

No I/O. Text in, findings out; every finding quotes the offending piece (clipped) so a verdict can
name it.
"""

from __future__ import annotations

import json
import re
import unicodedata
from kvgate.profile.models import GoldenExpect

CLIP = 100
REPLACEMENT = "\ufffd"


def clip(text: str, n: int = CLIP) -> str:
    """``text`` cut to ``n`` characters with ``...`` (callers quote it with ``!r``, which shows a
    newline as ``\\n``: the verdict stays one line)."""
    return text if len(text) <= n else text[:n - 3] + "..."


def expectation_match(expect: GoldenExpect, text: str) -> tuple[bool, int | None, str]:
    """``(met, end, what)``: whether ``text`` meets ``expect``, the character offset where the
    deciding match ends (None when not met or not positional) and ``what`` was expected, in words."""
    if expect.regex is not None:
        m = re.search(expect.regex, text, re.IGNORECASE)
        return (m is not None, m.end() if m else None, f"/{expect.regex}/i")
    if expect.choices is not None:
        best = None
        for c in expect.choices:
            m = re.search(rf"(?<!\w){re.escape(c)}(?!\w)", text, re.IGNORECASE)
            if m and (best is None or m.end() < best):
                best = m.end()
        return (best is not None, best, "one of " + ", ".join(repr(c) for c in expect.choices))
    if expect.exact is not None:
        ok = text.strip() == expect.exact
        return (ok, len(text) if ok else None, f"exactly {expect.exact!r}")
    import jsonschema

    what = "JSON valid against the golden's schema"
    try:
        doc = json.loads(text)
    except ValueError:
        return (False, None, what)
    try:
        jsonschema.validate(doc, expect.json_schema or {})
    except jsonschema.ValidationError:
        return (False, None, what)
    return (True, len(text), what)


def margin(tokens_text: list[str], top: list[dict[str, float]], upto_chars: int | None) -> float | None:
    """[nats] The smallest top-1 minus top-2 logprob over the answer's positions whose text ends at
    or before ``upto_chars`` characters (at least the first position): by how much the chosen
    answer won where it was decided. ``tokens_text``: each position's decoded text; ``top``: each
    position's alternatives (token -> logprob). None when no position has two alternatives."""
    gaps: list[float] = []
    pos = 0
    for i, alts in enumerate(top):
        vals = sorted(alts.values(), reverse=True)
        if len(vals) >= 2:
            gaps.append(vals[0] - vals[1])
        pos += len(tokens_text[i]) if i < len(tokens_text) else 0
        if upto_chars is not None and pos >= upto_chars:
            break
    return round(min(gaps), 4) if gaps else None


def repetition(text: str, min_n: int = 2, max_n: int = 8) -> tuple[float, str]:
    """``(fraction, ngram)``: the largest share of ``text``'s words covered by back-to-back repeats
    of one n-gram (n in ``min_n..max_n`` words; a single word repeated counts with n=1 at 4 or
    more in a row), and that n-gram. ``"a b a b a b"`` -> (1.0, "a b")."""
    words = text.split()
    best, gram = 0.0, ""
    for n in range(1, max_n + 1 if len(words) >= 4 else 1):
        i = 0
        while i + 2 * n <= len(words):
            k = 1
            while i + (k + 1) * n <= len(words) and words[i + k * n:i + (k + 1) * n] == words[i:i + n]:
                k += 1
            if k >= (4 if n == 1 else 3 if n < min_n + 1 else 2):
                cover = k * n / len(words)
                if cover > best:
                    best, gram = cover, " ".join(words[i:i + n])
                i += k * n
            else:
                i += 1
    # character-level loops, spaces or none ("!!!!!!!!", "ababab", a CJK sentence over and over): a
    # unit of 1-4 characters 8 or more times in a row, or of 5-40 characters 4 or more times
    for pattern in _CHAR_LOOPS:
        for m in pattern.finditer(text):
            if len(m.group(0)) / len(text) > best:
                best, gram = len(m.group(0)) / len(text), m.group(1)
    return (round(best, 3), gram)


_CHAR_LOOPS = (re.compile(r"(.{1,4}?)\1{7,}", re.DOTALL), re.compile(r"(.{5,40}?)\1{3,}", re.DOTALL))


def soup(text: str) -> str | None:
    """Why ``text`` reads as token soup, or None: control, surrogate, private-use or unassigned
    characters; or most words mixing scripts (``"Paрisж"``). Letters, marks (Thai and Devanagari
    vowels), digits, punctuation, symbols (emoji) and spaces of any script are text."""
    if not text.strip():
        return None
    odd = _odd_characters(text)
    if odd:
        return odd
    words = re.findall(r"\w+", text)
    if len(words) >= 6:
        mixed = [w for w in words if len({_script(c) for c in w if c.isalpha()} - {None}) > 1]
        if len(mixed) / len(words) > 0.3:
            return f"{len(mixed)} of {len(words)} words mix scripts (e.g. {mixed[0]!r})"
    return None


#: Scripts written together within one word, one family (not soup): Japanese mixes kanji, hiragana,
#: katakana and fullwidth forms in a word; Korean may mix Hangul and hanja.
_CJK_FAMILY = frozenset({"CJK", "HIRAGANA", "KATAKANA", "KATAKANA-HIRAGANA", "HANGUL", "FULLWIDTH", "HALFWIDTH",
                         "IDEOGRAPHIC", "BOPOMOFO"})


def _script(c: str) -> str | None:
    try:
        name = unicodedata.name(c)
    except ValueError:
        return None
    script = name.split(" ")[0]
    return "CJK" if script in _CJK_FAMILY else script


def degeneration(text: str, finish_reason: str | None, *, max_repeat_fraction: float = 0.5,
                 text_due: bool = True) -> list[str]:
    """What is degenerate about one answer (empty list: nothing): U+FFFD, a repetition loop
    covering more than ``max_repeat_fraction`` of its words, empty content where text is due
    (``text_due`` and finish_reason ``length`` or ``stop`` with nothing), token soup. Each finding
    quotes the piece."""
    out = _replacement(text)
    frac, gram = repetition(text)
    if frac > max_repeat_fraction:
        out.append(f"a repetition loop: {gram!r} repeated over {frac:.0%} of the answer (answers.max_repeat_fraction "
                   f"{max_repeat_fraction:.0%})")
    if text_due and not text.strip():
        out.append(f"empty content (finish_reason {finish_reason!r}) where text is due")
    why = soup(text)
    if why:
        out.append(f"token soup: {why}")
    return out


def wire_findings(text: str) -> list[str]:
    """What no model emits on a healthy path, whatever it was asked: U+FFFD (bytes lost between
    tokens or in a frontend) and control, surrogate, private-use or unassigned characters."""
    odd = _odd_characters(text)
    return _replacement(text) + ([f"token soup: {odd}"] if odd else [])


def _replacement(text: str) -> list[str]:
    """The U+FFFD finding of ``text`` (quoting where the first one is), or none."""
    if REPLACEMENT not in text:
        return []
    i = text.index(REPLACEMENT)
    return [f"{text.count(REPLACEMENT)} U+FFFD replacement characters (first at char {i}: "
            f"{clip(text[max(0, i - 20):i + 20], 60)!r})"]


def _odd_characters(text: str) -> str | None:
    """``"N control, surrogate, private-use or unassigned characters (first U+XXXX)"``, or None."""
    odd = [c for c in text if unicodedata.category(c) in ("Cc", "Cs", "Co", "Cn") and c not in "\n\t\r"]
    if not odd:
        return None
    return f"{len(odd)} control, surrogate, private-use or unassigned characters (first U+{ord(odd[0]):04X})"


def char_diff(a: str, b: str) -> str | None:
    """Where two texts first differ, quoted, or None when equal: ``at char 12: 'abc' vs 'abd'``."""
    if a == b:
        return None
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"at char {i}: {clip(a[max(0, i - 10):i + 20], 40)!r} vs {clip(b[max(0, i - 10):i + 20], 40)!r}"


def multibyte_findings(text: str) -> list[str]:
    """Integrity findings of a multibyte answer: U+FFFD, lone surrogates. Empty: none."""
    out: list[str] = []
    if REPLACEMENT in text:
        out.append(f"{text.count(REPLACEMENT)} U+FFFD in {clip(text, 60)!r}")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        out.append("lone surrogates in the text")
    return out

