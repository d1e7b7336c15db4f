"""The security gate's measurements: knock on every route without a key and with a wrong one, send
the hostile requests with a canary after each, scan answers for the key, offer media URLs that point
at a loopback listener kvgate owns, and flood the door. Pure I/O through :class:`~kvgate.http.client.KvClient`
(transport injectable); every loop is bounded in count and time. The verdicts are
:mod:`kvgate.gates.security`'s.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import http.server
import socketserver
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kvgate.http.client import EndpointUnreachable, KvClient, Reply
from kvgate.http.metrics import scrape_value
from kvgate.http.raw import origin, raw_request
from kvgate.security.fields import FieldProbe
from kvgate.security.hostile import Context, Hostile
from kvgate.security.paths import ROUTES as PATH_ROUTES, PathProbe, plain
from kvgate.security.routes import SLOTS, Route, Spelling, from_openapi, plan, probe_body, slot_candidates, spellings

#: The wrong key kvgate sends (not a secret: it is kvgate's own, and its echo is what is looked for).
WRONG_KEY = "sk-kvgate-wrong-key-0f3a9c"
#: The statuses of a refusal: a route refused so to no key and to the wrong key is protected, and
#: its spellings are tried (:func:`knock_spellings`).
REFUSED = frozenset({401, 403})
#: Characters of an answer kept for a verdict (the rest is not needed to name what came back).
KEEP = 2000


def _keep(r: Reply) -> Reply:
    return dataclasses.replace(r, text=r.text[:KEEP])


@dataclass(frozen=True)
class Knock:
    """One route called by ``who`` ("no key" / "wrong key"): the answer (body cut to :data:`KEEP`)."""

    route: Route
    who: str
    reply: Reply


@dataclass(frozen=True)
class SpelledKnock:
    """One spelling of a representative route sent raw (:func:`kvgate.http.raw.raw_request`) by
    ``who``: the answer (body cut to :data:`KEEP`)."""

    spelling: Spelling
    who: str
    reply: Reply


@dataclass
class Spelled:
    """The spellings' observation. ``references``: route label -> its answer *with* the key (what
    the route's real answer looks like; only routes that answered 2xx are spelled); ``left_out``:
    slot -> why no route filled it; ``knocks`` in order; ``unprobed``: spellings the time budget left."""

    references: dict[str, Reply] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    knocks: list[SpelledKnock] = field(default_factory=list)
    unprobed: list[Spelling] = field(default_factory=list)


@dataclass
class Surface:
    """The auth-surface observation: ``knocks`` in order; ``unprobed`` routes the time budget left;
    ``openapi``: how the route list was had (``"22 paths (with the key)"`` / ``"not served: 404"``);
    ``undone``: undo routes called with the key after a state-changing route was reached without;
    ``spelled``: the representative routes under every spelling (None: not tried)."""

    knocks: list[Knock] = field(default_factory=list)
    unprobed: list[Route] = field(default_factory=list)
    openapi: str = ""
    undone: list[str] = field(default_factory=list)
    spelled: Spelled | None = None


def openapi_routes(client: KvClient, timeout_s: float) -> tuple[list[Route], str]:
    """``GET /openapi.json`` with the key: its routes and a note on how they were had."""
    r = client.get("/openapi.json", timeout_s=timeout_s)
    if r.status != 200 or not isinstance(r.json, dict):
        return [], f"openapi.json not served (answered {r.status or 'nothing'})"
    routes = from_openapi(r.json)
    return routes, f"openapi.json lists {len({x.bare_path for x in routes})} paths"


def knock(keyed: KvClient, nokey: KvClient, wrong: KvClient, model: str, *, deadline_s: float, budget_s: float,
          clock: Callable[[], float] = time.monotonic, open_paths: Any = (), root_path: str | None = None,
          raw: Callable[..., Reply] = raw_request) -> Surface:
    """Call every route of :func:`kvgate.security.routes.plan` with no key, then with
    :data:`WRONG_KEY`, each within ``deadline_s``; stop when ``budget_s`` seconds are spent (the rest
    is ``unprobed``). A state-changing route that answered 2xx has its undo called with the key.
    Then, within what is left of ``budget_s``, the representative routes under every spelling
    (:func:`knock_spellings`; ``open_paths``: the declared open routes, ``root_path``: the
    deployment's, ``raw``: the raw sender)."""
    routes, note = openapi_routes(keyed, deadline_s)
    out = Surface(openapi=note)
    t0 = clock()
    body = probe_body(model)
    planned = plan(routes, keyed.endpoint.route_prefix)
    for i, route in enumerate(planned):
        if clock() - t0 > budget_s:
            out.unprobed = planned[i:]
            break
        for who, client in (("no key", nokey), ("wrong key", wrong)):
            r = _call(client, route, body, deadline_s)
            out.knocks.append(Knock(route, who, _keep(r)))
            if route.undo and 200 <= r.status < 300:
                u = keyed.request(route.method, route.undo, content=b"{}", timeout_s=deadline_s)
                out.undone.append(f"{route.undo} ({u.status})")
    served = {r.bare_path for r in routes}
    answers: dict[str, set[int]] = {}
    for k in out.knocks:
        answers.setdefault(k.route.label, set()).add(k.reply.status)
    protected = [r for r in planned if answers.get(r.label) and answers[r.label] <= REFUSED]
    out.spelled = knock_spellings(keyed, nokey, wrong, model, protected, served=served, open_paths=open_paths,
                                  root_path=root_path, deadline_s=deadline_s, budget_s=budget_s - (clock() - t0),
                                  clock=clock, raw=raw)
    return out


def _call(client: KvClient, route: Route, body: bytes, deadline_s: float) -> Reply:
    """``route`` called through ``client`` (``body`` unless it is a GET), within ``deadline_s``; an
    unreachable endpoint is a status-0 :class:`Reply` naming why, never an exception."""
    try:
        return client.request(route.method, route.path, content=body if route.method != "GET" else None,
                              timeout_s=deadline_s)
    except EndpointUnreachable as exc:
        return Reply(0, str(exc), deadline_s)


def knock_spellings(keyed: KvClient, nokey: KvClient, wrong: KvClient, model: str, planned: list[Route], *,
                    served: Any = (), open_paths: Any = (), root_path: str | None = None, deadline_s: float,
                    budget_s: float, clock: Callable[[], float] = time.monotonic,
                    raw: Callable[..., Reply] = raw_request) -> Spelled:
    """The representative routes of ``planned`` -- the protected ones: :func:`knock` passes the routes
    refused to both callers -- (:func:`kvgate.security.routes.slot_candidates`: per slot the first
    candidate that answers 2xx *with* the key, at most :data:`~kvgate.security.routes.SLOT_TRIES`
    tried) each sent under every :func:`~kvgate.security.routes.spellings` with no key and with
    :data:`WRONG_KEY`, raw (``raw(endpoint, method, target, headers=, body=, timeout_s=)``: httpx
    would rewrite the spellings), each within ``deadline_s``; the spellings left when ``budget_s``
    seconds are spent are ``unprobed``. Requests: at most ``4 x 3`` keyed references plus
    ``2 x spellings`` per route (26 spellings a route with four open routes)."""
    out = Spelled()
    t0 = clock()
    body = probe_body(model)
    scheme, _, _, base, host = origin(keyed.endpoint)
    prefix = keyed.endpoint.route_prefix
    candidates = slot_candidates(planned, prefix, served, open_paths)
    reps: list[Route] = []
    for slot in SLOTS:
        tried = []
        for route in candidates.get(slot, []):
            r = _call(keyed, route, body, deadline_s)
            if 200 <= r.status < 300:
                out.references[route.label] = _keep(r)
                reps.append(route)
                break
            tried.append(f"{route.label} answered {r.status} with the key")
        else:
            out.left_out[slot] = "; ".join(tried) if tried else "no such route in the route plan"
    todo = [s for route in reps for s in spellings(route, open_paths, base=base, host=host, scheme=scheme,
                                                   root_path=root_path)]
    for i, sp in enumerate(todo):
        if clock() - t0 > budget_s:
            out.unprobed = todo[i:]
            break
        for who, client in (("no key", nokey), ("wrong key", wrong)):
            try:
                r = raw(client.endpoint, sp.route.method, sp.target, headers=dict(sp.headers),
                        body=body if sp.route.method != "GET" else None, timeout_s=deadline_s)
            except EndpointUnreachable as exc:
                r = Reply(0, str(exc), deadline_s)
            out.knocks.append(SpelledKnock(sp, who, _keep(r)))
    return out


@dataclass(frozen=True)
class Sent:
    """One hostile request and what followed: its answer (body cut to :data:`KEEP`) and ``choices``,
    the number of choices its whole JSON body carried (None: not a JSON completion); the canary after
    it and whether it generated (``canary`` None: not sent, an earlier canary failed)."""

    probe: Hostile
    reply: Reply | None
    canary: Reply | None
    choices: int | None = None
    canary_ok: bool = False


@dataclass
class HostileRun:
    """``sent`` in order (a probe after a failed canary is not sent: ``reply`` None); resident
    memory (bytes, ``/metrics`` ``process_resident_memory_bytes``) before and after (None: not served)."""

    sent: list[Sent] = field(default_factory=list)
    rss_before: float | None = None
    rss_after: float | None = None


def canary(client: KvClient, model: str, timeout_s: float) -> Reply:
    """A 2-token completion on a connection of its own: the engine still generates (not: the
    hostile request's pooled connection survived it)."""
    try:
        return client.post(client.api("/completions"), {"model": model, "prompt": "Say OK.", "max_tokens": 2,
                                                          "temperature": 0}, timeout_s=timeout_s, own_connection=True)
    except EndpointUnreachable as exc:
        return Reply(0, str(exc), timeout_s)


def canary_ok(r: Reply | None) -> bool:
    body = r.json if r is not None else None
    return r is not None and r.status == 200 and isinstance(body, dict) and bool(body.get("choices"))


def rss(client: KvClient) -> float | None:
    try:
        return scrape_value(client.metrics_text(), "process_resident_memory_bytes")
    except EndpointUnreachable:
        return None


def send_hostile(client: KvClient, ctx: Context, probes: tuple[Hostile, ...], *, deadline_s: float,
                 canary_deadline_s: float) -> HostileRun:
    """Each probe once (its own deadline), a canary after it; after a failed canary nothing more is
    sent (the engine is down: the later probes would only wait)."""
    out = HostileRun(rss_before=rss(client))
    alive = True
    for p in probes:
        if not alive:
            out.sent.append(Sent(p, None, None))
            continue
        path = client.api("/chat/completions" if p.route == "chat" else "/completions")
        try:
            r = client.request("POST", path, content=p.body(ctx).encode("utf-8", "surrogatepass"), timeout_s=deadline_s)
        except EndpointUnreachable as exc:
            r = Reply(0, str(exc), deadline_s)
        c = canary(client, ctx.model, canary_deadline_s)
        alive = canary_ok(c)
        body = r.json
        choices = body.get("choices") if isinstance(body, dict) else None
        out.sent.append(Sent(p, _keep(r), _keep(c), len(choices) if isinstance(choices, list) else None, alive))
    out.rss_after = rss(client) if alive else None
    return out


@dataclass(frozen=True)
class FieldSent:
    """One request field with one of its values (``which``: "harmless" / "out-of-range") and what
    followed (:func:`send_fields`): the answer (body cut to :data:`KEEP`), the canary after it and
    whether it generated, ``/health`` after it; ``reply`` None: not sent (an earlier canary failed)."""

    probe: FieldProbe
    which: str
    reply: Reply | None
    canary: Reply | None = None
    health: Reply | None = None
    canary_ok: bool = False


@dataclass
class FieldRun:
    """The request fields sent to one address: ``via`` in words ("the endpoint", "--direct-endpoint");
    ``sent`` in order; resident memory (bytes, ``process_resident_memory_bytes``) before and after
    (None: not served, or the engine went down)."""

    via: str
    sent: list[FieldSent] = field(default_factory=list)
    rss_before: float | None = None
    rss_after: float | None = None


def send_fields(client: KvClient, model: str, probes: "tuple[FieldProbe, ...]", *, via: str, deadline_s: float,
                canary_deadline_s: float, image: bool = False, alive: bool = True) -> FieldRun:
    """Each field probe twice -- its harmless value, then its out-of-range one -- each within
    ``deadline_s``, the 2-token canary and ``GET /health`` after each; after a failed canary (or
    with ``alive`` False: the engine was already down) nothing more is sent. ``image``: the model
    takes images, so a probe marked ``image`` carries an inline one. Requests: 3 per value sent,
    plus two ``/metrics`` scrapes."""
    out = FieldRun(via, rss_before=rss(client) if alive else None)
    for p in probes:
        for which, (_, value) in (("harmless", p.harmless), ("out-of-range", p.hostile)):
            if not alive:
                out.sent.append(FieldSent(p, which, None))
                continue
            path = "/tokenize" if p.route == "tokenize" else client.api(PATH_ROUTES[p.route])
            r = _post(client, path, p.body(model, value, image), deadline_s)
            c = canary(client, model, canary_deadline_s)
            alive = canary_ok(c)
            try:
                h = client.get("/health", timeout_s=deadline_s)
            except EndpointUnreachable as exc:
                h = Reply(0, str(exc), deadline_s)
            out.sent.append(FieldSent(p, which, _keep(r), _keep(c), _keep(h), alive))
    out.rss_after = rss(client) if alive else None
    return out


def tokenize_without_key(nokey: KvClient, model: str, timeout_s: float) -> Reply:
    """``POST /tokenize`` ("Say OK.") by a caller without the key: what it answers."""
    return _keep(_post(nokey, "/tokenize", {"model": model, "prompt": "Say OK."}, timeout_s))


@dataclass(frozen=True)
class PathSent:
    """One input path and what followed (:func:`send_paths`): its answer (body cut to :data:`KEEP`),
    the canary after it and whether it generated, ``/health`` after it; ``side_ttft_s``: the first
    token time of a canary streamed on another connection while a trusted template was rendered
    (None: not asked); ``side``: that canary's answer."""

    probe: PathProbe
    reply: Reply | None
    canary: Reply | None = None
    health: Reply | None = None
    canary_ok: bool = False
    side_ttft_s: float | None = None
    side: str | None = None


@dataclass
class PathRun:
    """``plain``: route -> the plain request's answer (what a template must not change); ``sent`` in
    order (after a failed canary nothing more is sent: ``reply`` None)."""

    plain: dict[str, Reply] = field(default_factory=dict)
    sent: list[PathSent] = field(default_factory=list)


def counted_prompt(r: Reply | None) -> int | None:
    """[tokens] the prompt as the server counted it: ``usage.prompt_tokens`` (chat, completions) or
    ``usage.input_tokens`` (Responses, Messages); None when not reported."""
    body = r.json if r is not None else None
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None
    n = usage.get("prompt_tokens", usage.get("input_tokens"))
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def _post(client: KvClient, path: str, body: dict[str, Any], timeout_s: float) -> Reply:
    try:
        return client.post(path, body, timeout_s=timeout_s)
    except EndpointUnreachable as exc:
        return Reply(0, str(exc), timeout_s)


def _side_canary(client: KvClient, model: str, timeout_s: float) -> tuple[float | None, str]:
    """A 2-token streamed completion on its own connection: (seconds to its first event, what came)."""
    try:
        with KvClient(client.endpoint, timeout_s=timeout_s) as side:
            s = side.stream(side.api("/completions"), {"model": model, "prompt": "Say OK.", "max_tokens": 2,
                                                       "temperature": 0, "stream": True}, timeout_s=timeout_s)
    except EndpointUnreachable as exc:
        return None, str(exc)
    if s.status != 200 or not s.events:
        return None, f"{s.status or 'no answer'}: {(s.transport_error or s.text)[:120]}"
    return s.events[0][0], f"{len(s.events)} events"


def send_paths(client: KvClient, model: str, probes: tuple[PathProbe, ...], *, deadline_s: float,
               canary_deadline_s: float, trusted: bool = False, settle_s: float = 0.05,
               sleep: Callable[[float], None] = time.sleep) -> PathRun:
    """The plain request on each route the probes use, then each probe once (``deadline_s``), a
    canary and ``GET /health`` after it; after a failed canary nothing more is sent. ``trusted``:
    while a template probe runs, a canary streams on another connection (its first-token time is
    ``side_ttft_s``; it starts ``settle_s`` after the probe, through ``sleep``)."""
    out = PathRun()
    for route in dict.fromkeys(p.route for p in probes):
        out.plain[route] = _keep(_post(client, client.api(PATH_ROUTES[route]), plain(route, model), deadline_s))
    alive = True
    for p in probes:
        if not alive:
            out.sent.append(PathSent(p, None))
            continue
        path = client.api(PATH_ROUTES[p.route])
        side: tuple[float | None, str] | None = None
        if trusted and p.template:
            with cf.ThreadPoolExecutor(max_workers=1) as pool:
                fut = pool.submit(_post, client, path, p.body(model), deadline_s)
                sleep(settle_s)
                side = _side_canary(client, model, canary_deadline_s)
                r = fut.result()
        else:
            r = _post(client, path, p.body(model), deadline_s)
        c = canary(client, model, canary_deadline_s)
        alive = canary_ok(c)
        try:
            h = client.get("/health", timeout_s=deadline_s)
        except EndpointUnreachable as exc:
            h = Reply(0, str(exc), deadline_s)
        out.sent.append(PathSent(p, _keep(r), _keep(c), _keep(h), alive, side[0] if side else None,
                                 side[1] if side else None))
    return out


@dataclass(frozen=True)
class Echo:
    """An answer looked at for the key: ``what`` was sent, the reply (whole: the scan needs it)."""

    what: str
    reply: Reply


def echo_probes(keyed: KvClient, wrong: KvClient, model: str, timeout_s: float) -> list[Echo]:
    """Error answers, with the key and with the wrong one: an unknown model, a malformed body, a
    max_tokens past any context, and the models list."""
    out = []
    for who, c in (("with the key", keyed), ("with a wrong key", wrong)):
        tries = [("POST", c.api("/chat/completions"), b'{"model": "kvgate-no-such-model", "messages": []}', "an unknown model"),
                 ("POST", c.api("/completions"), b'{"model": ', "a malformed body"),
                 ("POST", c.api("/completions"), ('{"model": "%s", "prompt": "x", "max_tokens": 999999999}' % model).encode(),
                  "max_tokens 999,999,999"),
                 ("GET", c.api("/models"), None, "the models list")]
        for method, path, body, what in tries:
            try:
                r = c.request(method, path, content=body, timeout_s=timeout_s)
            except EndpointUnreachable as exc:
                r = Reply(0, str(exc), timeout_s)
            out.append(Echo(f"{method} {path} ({what}, {who})", r))
    return out


class _Listener(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


class MediaTrap:
    """A loopback HTTP listener kvgate owns (port 0): every request to it is recorded in ``hits``
    (path); ``/redirect`` answers 302 to ``/target``. Use as a context manager."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                hits.append(self.path)
                if self.path.startswith("/redirect"):
                    self.send_response(302)
                    self.send_header("Location", "/target.png")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.end_headers()
                self.wfile.write(b"\x89PNG\r\n\x1a\n")

            def log_message(self, *args: Any) -> None:
                return

        self.server = _Listener(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "MediaTrap":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def urls(self) -> dict[str, str]:
        """URL forms that all reach the listener: by name, dotted, decimal and hex IPv4, IPv4-mapped
        IPv6, through a redirect; and a ``file://`` URL."""
        p = self.port
        return {"localhost": f"http://localhost:{p}/kvgate.png", "loopback": f"http://127.0.0.1:{p}/kvgate.png",
                "decimal-ip": f"http://2130706433:{p}/kvgate.png", "hex-ip": f"http://0x7f000001:{p}/kvgate.png",
                "ipv4-mapped-ipv6": f"http://[::ffff:127.0.0.1]:{p}/kvgate.png",
                "redirect": f"http://127.0.0.1:{p}/redirect", "file": "file:///etc/hostname"}


_PART = {"image": ("image_url", "image_url"), "audio": ("audio_url", "audio_url"), "video": ("video_url", "video_url")}


def offer_media(client: KvClient, model: str, kind: str, urls: dict[str, str], timeout_s: float) -> dict[str, Reply]:
    """One chat request per URL form with a ``{kind}_url`` content part: what came back."""
    part_type, key = _PART[kind]
    out = {}
    for form, url in urls.items():
        body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Describe it."}, {"type": part_type, key: {"url": url}}]}]}
        try:
            out[form] = _keep(client.post(client.api("/chat/completions"), body, timeout_s=timeout_s))
        except EndpointUnreachable as exc:
            out[form] = Reply(0, str(exc), timeout_s)
    return out


def flood(client: KvClient, model: str, n: int, max_tokens: int, timeout_s: float) -> list[Reply]:
    """``n`` completions sent at once (threads); each answer with its own elapsed time."""
    body = {"model": model, "prompt": "Count slowly from one to one hundred.", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}

    def one() -> Reply:
        try:
            return _keep(client.post(client.api("/completions"), body, timeout_s=timeout_s))
        except EndpointUnreachable as exc:
            return Reply(0, str(exc), timeout_s)

    with cf.ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(lambda _: one(), range(n)))


__all__ = ["Echo", "FieldRun", "FieldSent", "HostileRun", "Knock", "MediaTrap", "PathRun", "PathSent", "Sent", "SpelledKnock", "Spelled", "Surface", "WRONG_KEY",
           "canary", "canary_ok", "counted_prompt", "echo_probes", "flood", "knock", "knock_spellings", "offer_media", "rss",
           "send_fields", "send_hostile", "send_paths", "tokenize_without_key"]
