"""The security gate's pure verdicts (kvgate.gates.security), its route list (kvgate.security.routes),
its middleware (kvgate.security.middleware) and the embedded server's key (kvgate.launch.local)."""

import asyncio

import pytest

from kvgate.gates.security import (auth_surface_verdict, classify, flood_verdict, hostile_verdict, media_verdict,
                                   secrets_verdict)
from kvgate.http.client import Reply
from kvgate.launch.base import LaunchError
from kvgate.launch.local import EmbeddedServer, embedded_key
from kvgate.profile.models import AdmissionSpec, SecuritySpec, load_profile
from kvgate.security.hostile import PROBES, Context
from kvgate.security.middleware import RequireKey, open_routes
from kvgate.security.probe import WRONG_KEY, Echo, HostileRun, Knock, Sent, Spelled, SpelledKnock, Surface
from kvgate.security.routes import Route, from_openapi, kind_of, plan, spellings
from kvgate.verdict import Status

SPEC = SecuritySpec(auth="required", open_routes={"/health": "probes", "/metrics": "prometheus"}, closed_by="a gateway")
OK = Reply(200, '{"choices": [{"text": "OK"}]}', 0.01)


def knocks(**status_by_path):
    out = []
    for path, status in status_by_path.items():
        route = Route("POST", "/" + path.replace("__", "/"), kind_of(path))
        for who in ("no key", "wrong key"):
            out.append(Knock(route, who, Reply(status, '{"error": "Unauthorized"}' if status == 401 else "{}", 0.01)))
    return out


def test_classify_reads_refused_absent_open_and_reached():
    assert [classify(k, SPEC) for k in knocks(invocations=401, nothing=404, tokenize=200, health=200)[::2]] == \
        ["refused", "absent", "reached", "open"]
    assert classify(Knock(Route("GET", "/docs", "docs"), "no key", Reply(0, "ReadTimeout", 10)), SPEC) == "unanswered"


def test_auth_surface_fails_naming_the_route_its_status_and_the_declared_cure():
    v = auth_surface_verdict(SPEC, Surface(knocks(v1__completions=401, invocations=200, scale_elastic_ep=400),
                                           openapi="openapi.json lists 3 paths"))
    assert v.status is Status.FAIL and v.measured == 2 and v.limit == 0
    assert v.message.startswith("2 of 3 routes answered a caller without the key: POST /invocations (no key: 200 (")
    assert "POST /scale_elastic_ep (no key: 400" in v.message and "the profile says it is closed by: a gateway" in v.message


MODELS = Route("GET", "/v1/models", "inference")
MODELS_ANSWER = Reply(200, '{"object": "list", "data": [{"id": "m"}]}', 0.01)


def spelled(answer=lambda sp: Reply(401, '{"error": "Unauthorized"}', 0.002), unprobed=0):
    """The models list under every spelling, each answered ``answer(spelling)`` (to both callers)."""
    sps = spellings(MODELS, ["/health"], host="h:1")
    out = Spelled(references={MODELS.label: MODELS_ANSWER}, left_out={"tokenizer": "POST /tokenize answered 404 with the key"})
    for sp in sps[:len(sps) - unprobed]:
        out.knocks += [SpelledKnock(sp, who, answer(sp)) for who in ("no key", "wrong key")]
    out.unprobed = sps[len(sps) - unprobed:]
    return out


def test_auth_surface_passes_naming_the_cure_the_open_routes_and_the_spellings_held():
    v = auth_surface_verdict(SPEC, Surface(knocks(invocations=401, tokenize=403, nothing=404, health=200),
                                           openapi="openapi.json lists 4 paths", spelled=spelled()))
    assert v.status is Status.PASS and "-> PASS (closed by: a gateway)" in v.message
    assert "4 routes (openapi.json lists 4 paths + kvgate's known routes)" in v.message and "/health (probes)" in v.message
    assert "; 17 spellings of 1 protected routes (GET /v1/models; left out: tokenizer) served none (answered 34 x 401)" \
        in v.message, v.message
    assert v.cause is None


def test_a_spelling_served_without_the_key_fails_naming_it_and_its_class_as_the_cause():
    def answer(sp):  # the router normalises //v1/models, the check read it as sent
        return MODELS_ANSWER if sp.name == "//v1/models" else Reply(401, "{}", 0.002)

    v = auth_surface_verdict(SPEC, Surface(knocks(invocations=401), spelled=spelled(answer)))
    assert v.status is Status.FAIL and v.measured == 1 and v.limit == 0, v.message
    assert v.message.startswith('1 spellings of 1 protected routes were served without the key: //v1/models (no key and '
                                'wrong key: 200 (JSON: {"object": "list", "data": [{"id": "m"}]}))'), v.message
    assert v.cause == ("the auth check reads the path as sent while the router serves it normalised (slashes merged, dot "
                       "segments resolved, %2F decoded): `//v1/models` served 200 without a key")


def test_a_2xx_that_is_another_routes_answer_holds_and_a_silent_spelling_fails():
    def answer(sp):
        if sp.target == "/health":  # /health with X-Original-URL: /v1/models answers as /health
            return Reply(200, "", 0.001)
        if sp.kind == "absolute-form":
            return Reply(0, "timeout: no answer within 10 s", 10.0)
        return Reply(400, "Invalid HTTP request received.", 0.001)

    v = auth_surface_verdict(SPEC, Surface(knocks(invocations=401), spelled=spelled(answer)))
    assert v.status is Status.FAIL and v.cause is None, v.message  # no answer is named, but points at no class
    assert "http://h:1/v1/models (no key and wrong key: no answer in 10 s)" in v.message
    held = spelled(lambda sp: Reply(200, "", 0.001) if sp.target == "/health" else Reply(0, "dropped: RemoteDisconnected", 0.001))  # a gateway drops what it cannot parse
    v = auth_surface_verdict(SPEC, Surface(knocks(invocations=401), spelled=held))
    assert v.status is Status.PASS and "(answered 30 dropped, 4 x 200 (another route's answer))" in v.message, v.message


def test_spellings_unsent_or_without_a_reference_are_invalid():
    v = auth_surface_verdict(SPEC, Surface(knocks(invocations=401), spelled=spelled(unprobed=3)))
    assert v.status is Status.INVALID and v.message.startswith("3 spellings not sent within security.surface_budget_s")
    nothing = Spelled(left_out={"inference": "POST /v1/chat/completions answered 500 with the key"})
    v = auth_surface_verdict(SPEC, Surface(knocks(invocations=401), spelled=nothing))
    assert v.status is Status.INVALID and "no protected route answered 2xx with the key (inference: POST " in v.message
    assert auth_surface_verdict(SPEC, Surface(knocks(invocations=401))).status is Status.INVALID  # never tried
    tls = spelled(lambda sp: Reply(0, "endpoint https://gw is unreachable (TLS: CERTIFICATE_VERIFY_FAILED)", 0.01))
    v = auth_surface_verdict(SPEC, Surface(knocks(invocations=401), spelled=tls))
    assert v.status is Status.INVALID and "none of 34 spelled requests got an HTTP answer (endpoint https://gw is " \
        "unreachable (TLS: CERTIFICATE_VERIFY_FAILED)): no spelling was judged" in v.message, v.message


def test_auth_surface_that_judged_nothing_is_invalid_and_no_key_declared_skips():
    dead = Surface([Knock(Route("POST", "/invocations", "inference"), "no key", Reply(0, "ConnectError", 1))])
    assert auth_surface_verdict(SecuritySpec(auth="required"), dead).status is Status.FAIL  # unanswered: named
    none = Surface([], openapi="openapi.json not served")
    assert auth_surface_verdict(SPEC, none).status is Status.INVALID
    cut = Surface(knocks(invocations=401), unprobed=[Route("GET", "/docs", "docs")])
    assert auth_surface_verdict(SPEC, cut).status is Status.INVALID
    assert auth_surface_verdict(SecuritySpec(), None).status is Status.SKIP


def sent(name, reply, canary=OK, choices=None):
    probe = next(p for p in PROBES if p.name == name)
    return Sent(probe, reply, canary, choices, canary.status == 200 if canary else False)


def test_hostile_passes_on_4xx_and_bounded_200s_and_fails_on_5xx_late_and_a_dead_canary():
    spec = SecuritySpec(memory_jump_mb=100)
    good = HostileRun([sent("n", Reply(400, '{"error": {"message": "n must be at most 16384"}}', 0.003)),
                       sent("top_k", OK, choices=1)], rss_before=500e6, rss_after=510e6)
    v = hostile_verdict(spec, good, OK, 10)
    assert v.status is Status.PASS and "1 refused 4xx (slowest 3 ms), 1 bounded 200s (top_k)" in v.message
    assert "resident memory +10.0 MB (limit 100 MB)" in v.message
    bad = HostileRun([sent("seed-huge", Reply(500, '{"error": {"message": "EngineCore died"}}', 0.01)),
                      sent("temperature", Reply(0, "ReadTimeout", 10.0), canary=Reply(0, "ReadTimeout", 30)),
                      Sent(PROBES[0], None, None)], rss_before=500e6, rss_after=None)
    v = hostile_verdict(spec, bad, OK, 10)
    assert v.status is Status.FAIL and v.measured == 3, v.message
    assert "seed 2^64 (above 2^63-1): 500 (JSON error: \"EngineCore died\")" in v.message
    assert "temperature 10^9 with top_p -1: no answer within 10 s" in v.message and "the engine is down" in v.message
    assert "1 not sent after it (n)" in v.message
    leak = HostileRun([sent("n", Reply(400, "{}", 0.01))], rss_before=500e6, rss_after=900e6)
    assert "resident memory rose +400.0 MB" in hostile_verdict(spec, leak, OK, 10).message
    assert hostile_verdict(spec, good, Reply(500, "dead", 0.1), 10).status is Status.INVALID
    allowed = HostileRun([sent("top_k", Reply(200, "not json", 0.01))])
    assert hostile_verdict(SecuritySpec(hostile_allow={"top_k": "clamped"}), allowed, OK, 10).status is Status.PASS


def test_every_hostile_body_is_json_and_asks_for_few_tokens():
    ctx = Context("m", vocab_size=49152)
    for p in PROBES:
        body = p.body(ctx)
        assert body.startswith("{") and '"max_tokens"' in body, p.name
    assert str(49152 + 1000) in next(p for p in PROBES if p.name == "stop_token_ids").body(ctx)
    assert "\\ud800" in next(p for p in PROBES if p.name == "lone-surrogate").body(ctx)
    with pytest.raises(ValueError, match="hostile_allow names nope"):
        SecuritySpec(hostile_allow={"nope": "x"})


def test_secrets_fail_naming_where_the_key_came_back_never_quoting_it():
    key = "sk-the-real-key-123456"
    echoes = [Echo("POST /v1/completions (a malformed body, with the key)",
                   Reply(400, f'{{"error": "bad body; Authorization: Bearer {key}"}}', 0.01)),
              Echo("GET /v1/models (with a wrong key)", Reply(401, "{}", 0.01, {"x-echo": WRONG_KEY}))]
    v = secrets_verdict(echoes, [], key)
    assert v.status is Status.FAIL and v.measured == 2 and key not in v.message and key not in str(v.evidence)
    assert "answered 400 with the API key in its body" in v.message and "the wrong key kvgate sent in a header" in v.message
    assert secrets_verdict([Echo("x", Reply(400, "{}", 0.01))], [], key).status is Status.PASS
    assert secrets_verdict([Echo("x", Reply(0, "ConnectError", 1))], [], key).status is Status.INVALID


def test_media_fails_on_a_hit_or_a_read_file_and_passes_otherwise():
    urls = {"loopback": "http://127.0.0.1:1/kvgate.png", "file": "file:///etc/hostname"}
    refused = {f: Reply(400, '{"error": {"message": "no"}}', 0.01) for f in urls}
    assert media_verdict("image", refused, urls, []).status is Status.PASS
    v = media_verdict("image", refused, urls, ["/kvgate.png"])
    assert v.status is Status.FAIL and "listener was fetched 1 times (/kvgate.png)" in v.message
    read = {**refused, "file": Reply(200, "{}", 0.01)}
    assert "file:///etc/hostname answered 200 (the file was read)" in media_verdict("image", read, urls, []).message


def test_flood_needs_fast_declared_refusals_with_bodies():
    adm = AdmissionSpec(max_in_flight=2, status=503, refuse_within_ms=200, retry_after=True, extra=2)
    err = '{"error": {"message": "busy"}}'
    fine = [OK, OK, Reply(503, err, 0.005, {"Retry-After": "1"}), Reply(503, err, 0.006, {"retry-after": "1"})]
    v = flood_verdict(adm, fine)
    assert v.status is Status.PASS and "2 refused 503 within 6 ms (limit 200 ms)" in v.message and v.measured == 6.0
    late = [OK, OK, Reply(503, err, 3.0, {"Retry-After": "1"}), Reply(500, err, 0.01)]
    v = flood_verdict(adm, late)
    assert v.status is Status.FAIL and "1 refusals came after 3,000 ms (limit 200 ms)" in v.message
    assert "1 answered otherwise: 500" in v.message
    assert "none of 4 was refused 503" in flood_verdict(adm, [OK] * 4).message
    assert "without the promised Retry-After" in flood_verdict(adm, [OK, OK, Reply(503, err, 0.01)]).message
    assert flood_verdict(None, []).status is Status.SKIP


def test_routes_from_openapi_and_the_plan_order():
    spec = {"paths": {"/v1/responses/{response_id}": {"get": {}}, "/tokenize": {"post": {}}, "/x/new": {"put": {}}}}
    routes = from_openapi(spec)
    assert [(r.method, r.path, r.kind) for r in routes] == [
        ("GET", "/v1/responses/kvgate-probe", "inference"), ("POST", "/tokenize", "tokenizer"), ("PUT", "/x/new", "inference")]
    order = plan(routes, "/openai/v1")
    assert order[0].path == "/v1/completions" and ("PUT", "/x/new") in {(r.method, r.path) for r in order}
    assert "/openai/v1/chat/completions" in {r.path for r in order}
    first = min(i for i, r in enumerate(order) if r.undo)  # state-changing routes last
    assert all(r.undo or r.kind in ("sleep", "cache", "profiler") for r in order[first:]), order[first:]
    assert len({(r.method, r.bare_path) for r in order}) == len(order)
    assert from_openapi("<html>") == []


def _call(mw, path, headers=(), method="POST"):
    sent = []

    async def app(scope, receive, send):
        sent.append("app")

    async def send(message):
        sent.append(message)

    async def go():
        await RequireKey(app, key="k-123", open_paths=open_routes(None))(
            {"type": "http", "path": path, "method": method, "headers": list(headers)}, None, send) if mw is None \
            else await mw({"type": "http", "path": path, "method": method, "headers": list(headers)}, None, send)

    asyncio.run(go())
    return sent


def test_middleware_requires_the_key_on_every_route_but_the_open_ones():
    assert _call(None, "/invocations")[0]["status"] == 401
    assert _call(None, "/invocations", [(b"authorization", b"Bearer wrong")])[0]["status"] == 401
    assert _call(None, "/invocations", [(b"authorization", b"Bearer k-123")]) == ["app"]
    assert _call(None, "/health") == ["app"] and _call(None, "/metrics")[0]["status"] == 401
    assert _call(None, "/v1/models", method="OPTIONS") == ["app"]  # a CORS preflight runs no handler
    assert (b"www-authenticate", b"Bearer") in _call(None, "/tokenize")[0]["headers"]
    assert open_routes("/health, /metrics") == {"/health", "/metrics"}


def test_middleware_refuses_to_start_without_a_key(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY is unset; refusing to serve without a key"):
        RequireKey(lambda *a: None)
    monkeypatch.setenv("VLLM_API_KEY", "k-env")
    monkeypatch.setenv("KVGATE_OPEN_ROUTES", "/health,/metrics")
    mw = RequireKey(lambda *a: None)
    assert mw.open == {"/health", "/metrics"}


def test_embedded_key_is_generated_when_required_and_never_inherited(tmp_path, monkeypatch):
    secure, plain = load_profile("smollm2-cpu"), load_profile("tiny-cpu")
    assert embedded_key(secure, token=lambda: "kvgate-gen") == "kvgate-gen"
    assert embedded_key(plain) is None
    assert embedded_key(plain, "MY_KEY", environ={"MY_KEY": "sk-mine"}) == "sk-mine"
    with pytest.raises(LaunchError, match="--api-key-env MY_KEY: the variable is unset or empty"):
        embedded_key(plain, "MY_KEY", environ={})
    monkeypatch.setenv("VLLM_API_KEY", "sk-exported-for-another-vllm")
    env = EmbeddedServer(plain, tmp_path, tmp_path / "log").environment()
    assert "VLLM_API_KEY" not in env  # kvgate's own server is not locked by a key it would never send
    env = EmbeddedServer(secure, tmp_path, tmp_path / "log", api_key="kvgate-run").environment()
    assert env["VLLM_API_KEY"] == "kvgate-run" and env["KVGATE_OPEN_ROUTES"] == "/health,/ping,/version,/metrics"
