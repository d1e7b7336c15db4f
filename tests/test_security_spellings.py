"""The auth surface under every spelling: the spellings themselves (kvgate.security.routes), the raw
HTTP/1.1 sender that sends them as written (kvgate.http.raw), and kvgate's own middleware
(kvgate.security.middleware.RequireKey) holding against each of them -- driven as an ASGI app with
the scope uvicorn 0.55 builds, and under a real uvicorn through the probe itself."""

import asyncio
import dataclasses
import re
import socket
import threading
import time
from urllib.parse import unquote, urlsplit

import pytest
import uvicorn
from fastapi import FastAPI
from starlette.responses import PlainTextResponse

from kvgate.gates.security import classify_spelled, same_answer
from kvgate.http.client import Endpoint, EndpointUnreachable, KvClient, Reply
from kvgate.http.raw import DROPPED, TIMED_OUT, raw_request
from kvgate.security.middleware import RequireKey, route_path
from kvgate.security.probe import WRONG_KEY, knock_spellings
from kvgate.security.routes import KNOWN, SPELLING_CAUSES, Route, plan, root_path_of, slot_candidates, spellings

KEY = "sk-kvgate-spelling-test"
OPEN = ("/health", "/metrics")
MODELS = Route("GET", "/v1/models", "inference")


# ------------------------------------------------------------------------------ the spellings

def test_every_spelling_class_is_written_for_a_route():
    got = spellings(MODELS, OPEN, host="h:8000", root_path="/v")
    names = [s.name for s in got]
    for want in ("//v1/models", "/./v1/models", "/v1/../v1/models", "/%2Fv1/models", "/health/../v1/models",
                 "/health/%2e%2e/v1/models", "/metrics/../v1/models", "/metrics/%2e%2e/v1/models", "/V1/models",
                 "/v1/models/", "http://h:8000/v1/models", "Host: h:8000/health? -> /v1/models",
                 "Host: h:8000/metrics? -> /v1/models", "Host: h:8000/# -> /v1/models", "Host: h:8000/?x= -> /v1/models",
                 "/v1/models with X-Original-URL: /health", "/health with X-Original-URL: /v1/models",
                 "/v1/models with X-Rewrite-URL: /health", "/health with X-Rewrite-URL: /v1/models",
                 "/v1/models with X-Forwarded-Prefix: /health", "/v/v1/models", "/v//v1/models"):
        assert want in names, want
    assert len(names) == len(set(names)) == 22  # 26 with the four open routes of smollm2-cpu
    assert {s.kind for s in got} == set(SPELLING_CAUSES)
    host = next(s for s in got if s.name == "Host: h:8000/health? -> /v1/models")
    assert host.target == "/v1/models" and host.headers == (("Host", "h:8000/health?"),)
    rewrite = next(s for s in got if s.name == "/health with X-Original-URL: /v1/models")
    assert rewrite.target == "/health" and rewrite.headers == (("X-Original-URL", "/v1/models"),)


def test_spellings_sit_under_the_base_path_and_health_is_always_walked_out_of():
    got = spellings(MODELS, (), base="/gw/", host="gw.example", scheme="https")
    names = [s.name for s in got]
    assert "/gw//v1/models" in names and "/gw/health/../v1/models" in names and "https://gw.example/gw/v1/models" in names
    assert not [s for s in got if s.kind == "root-path"]  # none declared
    assert all(s.target.startswith(("/gw/", "https://gw.example/gw/")) for s in got)


def test_root_path_is_read_from_the_vllm_command_line():
    assert root_path_of(["--middleware", "x", "--root-path", "/v"]) == "/v"
    assert root_path_of(["--root-path=/api"]) == "/api"
    assert root_path_of(["--api-key", "x"]) is None


def test_representatives_are_one_inference_post_the_models_list_a_tokenizer_and_a_read_only_admin_route():
    slots = slot_candidates(plan([], "/v1"), "/v1", open_paths=["/metrics"])
    assert [r.label for r in slots["inference"]] == ["POST /v1/chat/completions", "POST /v1/completions",
                                                     "POST /v1/responses"]
    assert [r.label for r in slots["models"]] == ["GET /v1/models"]
    assert [r.label for r in slots["tokenizer"]] == ["POST /tokenize", "POST /detokenize", "POST /extras/tokenize"]
    assert [r.label for r in slots["admin"]] == ["GET /load", "GET /kv_event_sources", "GET /is_sleeping"]
    assert all(r.method == "GET" for r in slots["admin"])  # a GET changes nothing
    # what openapi.json lists wins; open routes, queries and undo routes are never representatives
    served = {"/v1/completions", "/v1/models", "/detokenize", "/is_paused", "/sleep"}
    slots = slot_candidates(list(KNOWN), "/v1", served, open_paths=["/v1/models"])
    assert {k: [r.path for r in v] for k, v in slots.items()} == {
        "inference": ["/v1/completions"], "models": [], "tokenizer": ["/detokenize"], "admin": ["/is_paused"]}


# ------------------------------------------------------------------------------ the raw sender

class _Peer:
    """A socketpair standing in for a server: ``answer`` is written after the request is read."""

    def __init__(self, answer: bytes | None, close: bool = True):
        self.ours, self.theirs = socket.socketpair()
        self.answer, self.close, self.got = answer, close, b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while b"\r\n\r\n" not in self.got:
            self.got += self.theirs.recv(65536)
        head, _, rest = self.got.partition(b"\r\n\r\n")
        n = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
        while len(rest) < n:
            rest += self.theirs.recv(65536)
            self.got += rest
        if self.answer is not None:
            self.theirs.sendall(self.answer)
        if self.close:
            self.theirs.close()

    def connect(self, host, port, timeout_s):
        return self.ours


def test_raw_request_sends_the_target_and_host_as_written_and_reads_a_chunked_answer():
    peer = _Peer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
                 b"5\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\n\r\n")
    ep = Endpoint("http://127.0.0.1:8000", api_key="sk-x")
    r = raw_request(ep, "POST", "/health/%2e%2e//v1/models", headers={"Host": "h/health?", "X-Original-URL": "/v1"},
                    body=b"{}", timeout_s=5, connect=peer.connect)
    peer.thread.join(2)
    assert peer.got == (b"POST /health/%2e%2e//v1/models HTTP/1.1\r\nHost: h/health?\r\nAuthorization: Bearer sk-x\r\n"
                        b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n"
                        b"X-Original-URL: /v1\r\n\r\n{}")
    assert (r.status, r.text, r.headers["content-type"], r.body_bytes) == (200, '{"a": 1}', "application/json", 8)


def test_raw_request_without_an_answer_says_dropped_or_timed_out():
    ep = Endpoint("http://127.0.0.1:8000")
    dropped = raw_request(ep, "GET", "//v1/models", timeout_s=5, connect=_Peer(None).connect)
    assert dropped.status == 0 and dropped.text.startswith(DROPPED), dropped.text
    silent = _Peer(None, close=False)
    t = iter([0.0, 0.05])
    late = raw_request(ep, "GET", "/v1/models", timeout_s=0.05, connect=silent.connect, clock=lambda: next(t))
    assert late.status == 0 and late.text == f"{TIMED_OUT} 0.05 s" and late.elapsed_s == 0.05


def test_raw_request_to_https_that_fails_tls_is_unreachable_not_a_dropped_answer():
    class NotTls(_Peer):
        def _serve(self):  # answers the ClientHello with plain HTTP
            self.theirs.recv(65536)
            self.theirs.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            self.theirs.close()

    with pytest.raises(EndpointUnreachable, match=r"is unreachable \(TLS: "):
        raw_request(Endpoint("https://gw.example"), "GET", "/v1/models", timeout_s=5, connect=NotTls(None).connect)


# ------------------------------------------------------------------------------ the verdict's reading

def test_same_answer_is_the_routes_shape_not_any_2xx():
    models = Reply(200, '{"object": "list", "data": []}', 0.01)
    assert same_answer(models, Reply(200, '{"object": "list", "data": [{"id": "m"}]}', 0.01))
    assert not same_answer(models, Reply(200, "", 0.01))  # /health's answer
    assert not same_answer(models, Reply(200, '{"status": "ok"}', 0.01))
    assert not same_answer(models, Reply(401, '{"object": "list", "data": []}', 0.01))
    metrics = Reply(200, "# HELP vllm:num_requests_running Number of requests\n# TYPE gauge\nvllm:x 0\n", 0.01)
    assert same_answer(metrics, Reply(200, "# HELP vllm:num_requests_running Number of requests\nvllm:x 1\n", 0.01))
    assert not same_answer(metrics, Reply(200, "<html>", 0.01))


# ------------------------------------------------------------------------------ RequireKey holds

def _app():
    """vLLM's shape: FastAPI routes, /metrics a mount that matches every path starting /metrics."""
    app = FastAPI()

    @app.get("/health")
    def health():
        return PlainTextResponse("")

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "m", "object": "model"}]}

    @app.post("/v1/chat/completions")
    def chat():
        return {"object": "chat.completion", "choices": [{"message": {"content": "OK"}}]}

    @app.post("/tokenize")
    def tokenize():
        return {"count": 2, "tokens": [1, 2]}

    @app.get("/load")
    def load():
        return {"server_load": 0}

    async def metrics(scope, receive, send):
        await PlainTextResponse("# HELP vllm:num_requests_running\n")(scope, receive, send)

    app.mount("/metrics", metrics)
    app.routes[-1].path_regex = re.compile("^/metrics(?P<path>.*)$")  # as vllm/entrypoints/serve/instrumentator/metrics.py
    return app


def _scope(method, target, headers, root_path):
    """The HTTP scope uvicorn 0.55 (httptools) builds for this request line: an absolute-form target
    routes by its path, the fragment is dropped, the path is percent-decoded, the root path put before
    it (uvicorn/protocols/http/httptools_impl.py)."""
    if target.startswith(("http://", "https://")):
        u = urlsplit(target)
        raw, query = u.path, u.query
    else:
        raw, _, query = target.split("#", 1)[0].partition("?")
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": root_path + unquote(raw), "raw_path": (root_path + raw).encode(), "query_string": query.encode(),
            "root_path": root_path, "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]}


def _call(app, method, target, headers, root_path=""):
    out = {"status": 0, "body": b""}

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = dict(message.get("headers", []))
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")

    asyncio.run(app(_scope(method, target, headers, root_path), receive, send))
    return Reply(out["status"], out["body"].decode(), 0.0)


ROUTES = [Route("POST", "/v1/chat/completions", "inference"), MODELS, Route("POST", "/tokenize", "tokenizer"),
          Route("GET", "/load", "info")]


@pytest.mark.parametrize("root_path", ["", "/v"])
def test_require_key_holds_against_every_spelling_driven_as_asgi(root_path):
    guarded = RequireKey(_app(), key=KEY, open_paths=OPEN)
    tried = 0
    for route in ROUTES:
        real = _call(guarded, route.method, route.path, [("Host", "h"), ("Authorization", f"Bearer {KEY}")], root_path)
        assert real.status == 200, (route, real)  # the route exists and answers with the key
        for sp in spellings(route, OPEN, host="h", root_path="/v"):
            for auth in ([], [("Authorization", f"Bearer {WRONG_KEY}")]):
                host = [] if any(k == "Host" for k, _ in sp.headers) else [("Host", "h")]
                headers = [*host, *auth, *sp.headers]
                got = _call(guarded, route.method, sp.target, headers, root_path)
                tried += 1
                assert not same_answer(real, got), (sp.name, auth, got)
    assert tried == 4 * 22 * 2
    # and the open routes stay open, under the root path too
    assert _call(guarded, "GET", "/health", [("Host", "h")], root_path).status == 200
    assert _call(guarded, "GET", "/metrics", [("Host", "h")], root_path).status == 200


class _HostUrlGuard(RequireKey):
    """A guard with the CVE-2026-48746 hole: it reads the path of the URL rebuilt from the Host header."""

    def allowed(self, scope):
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        return super().allowed({**scope, "path": urlsplit(f"http://{host}{scope['path']}").path or "/"})


def test_the_asgi_driver_finds_a_guard_that_reads_the_host_built_url():
    guarded = _HostUrlGuard(_app(), key=KEY, open_paths=OPEN)
    real = _call(guarded, "GET", "/v1/models", [("Host", "h"), ("Authorization", f"Bearer {KEY}")])
    served = {sp.name for sp in spellings(MODELS, OPEN, host="h")
              if same_answer(real, _call(guarded, "GET", sp.target, [*sp.headers] if sp.kind == "host"
                                         else [("Host", "h"), *sp.headers]))}
    assert served == {"Host: h/health? -> /v1/models", "Host: h/metrics? -> /v1/models"}


def test_the_checked_path_is_the_routed_path_root_path_stripped_at_a_segment_boundary():
    assert route_path({"path": "/v/health", "root_path": "/v"}) == "/health"
    assert route_path({"path": "/v1/models", "root_path": "/v"}) == "/v1/models"  # not 1/models
    assert route_path({"path": "/v", "root_path": "/v"}) == ""
    assert route_path({"path": "//health", "root_path": ""}) == "//health"


def test_require_key_refuses_what_vllms_prefix_guard_lets_through():
    guarded = RequireKey(_app(), key=KEY, open_paths=OPEN)
    assert _call(guarded, "POST", "/tokenize", [("Host", "h")]).status == 401
    # vllm PR#52794: with root path /v the prefix test reads /v1/models as 1/models; the router serves it
    assert _call(guarded, "GET", "/v1/models", [("Host", "h")], root_path="/v").status == 401


@pytest.fixture
def require_key_server():
    """vLLM's shape behind RequireKey under a real uvicorn (port 0): its base URL."""
    config = uvicorn.Config(RequireKey(_app(), key=KEY, open_paths=OPEN), host="127.0.0.1", port=0,
                            log_level="error", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(5)


def test_require_key_under_uvicorn_serves_no_spelling_to_the_probe(require_key_server):
    ep = Endpoint(require_key_server, api_key=KEY)
    with KvClient(ep) as keyed, KvClient(dataclasses.replace(ep, api_key=None)) as nokey, \
            KvClient(dataclasses.replace(ep, api_key=WRONG_KEY)) as wrong:
        spelled = knock_spellings(keyed, nokey, wrong, "m", ROUTES, open_paths=OPEN, root_path="/v", deadline_s=5,
                                  budget_s=60)
    assert list(spelled.references) == [r.label for r in ROUTES] and not spelled.unprobed
    assert len(spelled.knocks) == 4 * 22 * 2
    classes = {classify_spelled(k, spelled) for k in spelled.knocks}
    assert classes == {"held"}, [(k.spelling.name, k.reply.status) for k in spelled.knocks
                                 if classify_spelled(k, spelled) != "held"]
    statuses = {k.reply.status for k in spelled.knocks}
    assert statuses <= {400, 401, 404, 405, 200}, statuses  # 200: /health's own answer to a rewrite header
    assert all(k.reply.status != 200 or k.spelling.target == "/health" for k in spelled.knocks)
