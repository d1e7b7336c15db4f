"""Who answered: what a set of the answers gate's own non-streamed answers shows about what stands
between kvgate and the model -- a cache in front (one response served for two different requests)
or more than one deployment behind the endpoint (answers that name different servers). These are
the look-alikes of a dropped system turn (each gives a ``usage.prompt_tokens`` that is not the
conversation's rendering), so the rules that name a dropped system turn ask these first
(:func:`serving_cause`).

Pure: ``answers`` maps a request's name to its :class:`~kvgate.answers.observe.Asked` (different
names are different requests: different conversations or prompts), a sentence or None out. A
finding is stated only when the answers measured it: an id shared by two names, a
``system_fingerprint`` / ``model`` / identity header that differs between two answers.
"""

from __future__ import annotations

from typing import Mapping

from kvgate.answers.checks import clip
from kvgate.answers.observe import Asked


def shared_responses(answers: Mapping[str, Asked]) -> dict[tuple[str, int | None], list[str]]:
    """``(response id, created) -> the names answered with it``, for the ids that answered more than
    one request (answers without an id, or not ok, are left out). A server makes one id per request;
    the same id and ``created`` on two different requests is one stored response served twice."""
    by: dict[tuple[str, int | None], list[str]] = {}
    for name, a in answers.items():
        if a.ok and not a.stream and a.response_id:
            by.setdefault((a.response_id, a.created), []).append(name)
    return {k: v for k, v in by.items() if len(v) > 1}


def cache_finding(answers: Mapping[str, Asked], about: str | None = None,
                  rendered: Mapping[str, int] | None = None) -> str | None:
    """The cause "an answer cache in front" when two different requests got the same response (id
    and created), else None; ``about``: only a response that answered that request counts.
    ``rendered`` (name -> ``/tokenize`` count of that request's own rendering, when measured): a
    served ``prompt_tokens`` that is not it is named as another prompt's usage -- and, with ``about``,
    a replay under a fresh id is found by it: ``about``'s count not its rendering's but another
    request's, with that request's text and tokens (:func:`_replayed`)."""
    for (rid, created), names in shared_responses(answers).items():
        if about is not None and about not in names:
            continue
        first = names[0] if about is None or names[0] != about else names[1]
        other = about if about is not None else names[1]
        a = answers[other]
        usage = ""
        n = (rendered or {}).get(other)
        if a.prompt_tokens is not None and n is not None and a.prompt_tokens != n:
            usage = (f"; its usage ({a.prompt_tokens} prompt tokens) is another prompt's: {other} renders to {n} "
                     "tokens by /tokenize")
        when = f", created {created}" if created is not None else ""
        return (f"an answer cache in front serves one request's response for another: response id {rid!r}{when} "
                f"answered both {first} and {other} ({len(names)} requests in all){usage}")
    return _replayed(answers, about, rendered) if about is not None else None


def _replayed(answers: Mapping[str, Asked], about: str, rendered: Mapping[str, int] | None) -> str | None:
    """A cache that writes a fresh id into each replay: ``about``'s ``prompt_tokens`` is not its own
    rendering's (``rendered[about]``, measured) but equals another request's, whose answer has the
    same text and tokens. None unless all of that was measured."""
    a, n = answers.get(about), (rendered or {}).get(about)
    if a is None or not a.ok or not a.text or a.prompt_tokens is None or n is None or a.prompt_tokens == n:
        return None
    for name, b in answers.items():
        if name != about and b.ok and b.prompt_tokens == a.prompt_tokens and b.text == a.text and b.tokens == a.tokens:
            return (f"an answer cache in front serves one request's response for another: {about}'s answer is "
                    f"{name}'s, text and usage alike ({clip(a.text, 40)!r}, {a.prompt_tokens} prompt tokens), under "
                    f"another id; its usage is another prompt's: {about} renders to {n} tokens by /tokenize")
    return None


def _signature(a: Asked) -> tuple[tuple[str, str | None], ...]:
    sig = [("system_fingerprint", a.system_fingerprint), ("model", a.model)]
    sig += sorted((f"header {h}", v) for h, v in a.identity.items())
    return tuple(sig)


def fleet_finding(answers: Mapping[str, Asked]) -> str | None:
    """The cause "more than one deployment answers behind the endpoint" when the answers carry more
    than one identity (``system_fingerprint``, ``model``, an identity header), else None. Each
    identity is named with the requests that carried it (the first three)."""
    groups: dict[tuple[tuple[str, str | None], ...], list[str]] = {}
    for name, a in answers.items():
        if a.ok and not a.stream:
            groups.setdefault(_signature(a), []).append(name)
    if len(groups) < 2:
        return None
    sigs = list(groups)
    differ = [k for k, (v0, v1) in ((k, (dict(sigs[0]).get(k), dict(sigs[1]).get(k)))
                                    for k in dict.fromkeys([f for s in sigs for f, _ in s])) if v0 != v1]
    parts = []
    for sig in sigs[:3]:
        d = dict(sig)
        names = groups[sig]
        who = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts.append(f"{', '.join(f'{k} {d.get(k)!r}' for k in differ)} on {who}")
    return (f"more than one deployment answers behind the endpoint (a canary split?): the answers carry "
            f"{len(groups)} identities: {'; '.join(parts)}")


def serving_cause(answers: Mapping[str, Asked], about: str | None = None,
                  rendered: Mapping[str, int] | None = None) -> str | None:
    """What the answers show about who served them: :func:`cache_finding` (for ``about`` when given),
    else :func:`fleet_finding`, else None."""
    return cache_finding(answers, about, rendered) or fleet_finding(answers)
