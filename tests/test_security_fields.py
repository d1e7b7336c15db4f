"""Request fields that configure server internals (issue 49): the probes' bodies, the served config's
trust_remote_code read from a command line, and :func:`kvgate.gates.security.fields_part` on
constructed observations, both ways (no I/O)."""

import base64
import json
import zlib

from kvgate.gates.security import fields_part, hostile_verdict
from kvgate.http.client import Reply
from kvgate.profile.models import SecuritySpec
from kvgate.security.fields import (FIELD_PROBES, NO_SUCH_REVISION, PNG_DATA_URL, RemoteCode, remote_code,
                                    trust_remote_code_in)
from kvgate.security.probe import FieldRun, FieldSent, HostileRun
from kvgate.verdict import Status

OK = Reply(200, json.dumps({"choices": [{"index": 0, "text": "OK"}], "usage": {"completion_tokens": 2}}), 0.01)
REFUSED = Reply(400, json.dumps({"error": {"message": "mm_processor_kwargs is not allowed"}}), 0.005)
HEALTH = Reply(200, "", 0.001)
SPEC = SecuritySpec(auth="required", memory_jump_mb=64)


def run(answer=lambda p, which: OK, canary=OK, health=HEALTH, rss=(1e9, 1e9), via="through the endpoint"):
    sent = [FieldSent(p, which, answer(p, which), canary, health, canary.status == 200)
            for p in FIELD_PROBES for which in ("harmless", "out-of-range")]
    return FieldRun(via, sent, *rss)


def test_the_bodies_carry_each_value_where_the_field_lives():
    by = {p.name: p for p in FIELD_PROBES}
    kvt = by["kv_transfer_params-tp_size"]
    assert kvt.body("m", kvt.hostile[1])["kv_transfer_params"]["tp_size"] == 2**31 - 1
    assert kvt.body("m", kvt.harmless[1])["kv_transfer_params"]["tp_size"] == 1
    tok = by["code_revision-tokenize"]
    body = tok.body("m", tok.hostile[1])
    assert body["mm_processor_kwargs"] == {"code_revision": NO_SUCH_REVISION} and "max_tokens" not in body
    sizes = by["mm_processor_kwargs-sizes"]
    assert isinstance(sizes.body("m", {}, image=True)["messages"][0]["content"], list)  # an image model gets the image
    assert sizes.body("m", {}, image=False)["messages"][0]["content"] == "Say OK."
    raw = base64.b64decode(PNG_DATA_URL.split(",", 1)[1])
    assert raw.startswith(b"\x89PNG\r\n\x1a\n") and zlib.decompress(raw[41:41 + 12]) == b"\x00\xff\xff\xff"


def test_trust_remote_code_is_read_from_a_command_line_the_last_flag_winning():
    assert trust_remote_code_in(["--model", "m", "--trust-remote-code"]) is True
    assert trust_remote_code_in(["--trust-remote-code", "--no-trust-remote-code"]) is False
    assert trust_remote_code_in(["--trust-remote-code=false"]) is False
    assert trust_remote_code_in(["--model", "m"]) is None
    got = remote_code([("argv", lambda: None), ("/server_info model_config", lambda: True)])
    assert got == RemoteCode(True, "/server_info model_config")
    assert remote_code([("argv", lambda: None)]).source == "not shown by argv"


def test_refused_or_bounded_fields_with_the_engine_alive_pass_naming_each_field():
    answers = lambda p, which: REFUSED if p.field == "mm_processor_kwargs" else OK  # noqa: E731
    tokenize_ok = Reply(200, json.dumps({"count": 3, "tokens": [1, 2, 3]}), 0.002)
    r = run(lambda p, w: tokenize_ok if p.route == "tokenize" else answers(p, w))
    bad, words, ev, cause = fields_part(SPEC, [r], RemoteCode(False, "the embedded vLLM's command line"), None, 2.0)
    assert bad == [] and cause is None
    assert words == ("10 request-field values through the endpoint (harmless/out-of-range: mm_processor_kwargs 400/400, "
                     "media_io_kwargs 200/200, kv_transfer_params.tp_size 200/200, mm_processor_kwargs.code_revision "
                     "200/200, mm_processor_kwargs.code_revision on /tokenize 200/200), the canary and /health after "
                     "each, resident memory +0.0 MB; trust_remote_code off (the embedded vLLM's command line)"), words
    assert len([x for x in ev["requests"] if "probe" in x]) == 10


def test_a_5xx_a_dead_canary_a_sick_health_and_memory_each_fail_naming_the_field():
    dead = Reply(500, json.dumps({"error": {"message": "EngineCore died"}}), 0.01)
    r = run(lambda p, w: dead if p.name == "media_io_kwargs-frames" and w == "out-of-range" else OK,
            rss=(1e9, 1e9 + 300e6))
    bad, _, _, cause = fields_part(SPEC, [r], None, None, 2.0)
    assert bad[0].startswith("media_io_kwargs video num_frames 10^9, fps 10^6 (CVE-2026-105760; through the endpoint): "
                             "500 (JSON error: \"EngineCore died\")"), bad
    assert bad[-1] == ("resident memory rose +300.0 MB over the request fields (through the endpoint; "
                       "security.memory_jump_mb 64)"), bad
    assert cause == "a request's media_io_kwargs reaches the server's internals unchecked (CVE-2026-105760)"
    sick = run(health=Reply(503, "", 0.001))
    bad, _, _, _ = fields_part(SPEC, [sick], None, None, 2.0)
    assert len(bad) == 10 and bad[0] == ("after mm_processor_kwargs max_pixels 1,003,520 (GHSA-gx7p-2j49-hfq4; through "
                                         "the endpoint) /health answered 503 (an empty body)"), bad
    no_route = run(health=Reply(404, "Not Found", 0.001))  # a server without /health: the canary judges
    assert fields_part(SPEC, [no_route], None, None, 2.0)[0] == []


def test_remote_code_with_an_open_tokenize_fails_and_behind_the_key_passes_named():
    on = RemoteCode(True, "the profile's engine.extra_args")
    open_tok = Reply(200, json.dumps({"count": 3, "tokens": [1, 2, 3]}), 0.002)
    bad, _, _, cause = fields_part(SPEC, [], on, open_tok, 2.0)
    assert bad == ["trust_remote_code is on (the profile's engine.extra_args) and POST /tokenize answered a caller "
                   "without the key 200 (JSON: {\"count\": 3, \"tokens\": [1, 2, 3]}): a caller without the key can "
                   "send mm_processor_kwargs.code_revision to a server that runs the model's own code "
                   "(CVE-2026-114053)"], bad
    assert cause.startswith("trust_remote_code with a /tokenize open")
    bad, words, _, _ = fields_part(SPEC, [], on, Reply(401, '{"error": "Unauthorized"}', 0.001), 2.0)
    assert bad == [] and words.startswith("trust_remote_code on (the profile's engine.extra_args), POST /tokenize "
                                          "answered a caller without the key 401"), words
    assert fields_part(SPEC, [], RemoteCode(False, "argv"), open_tok, 2.0)[0] == []  # no remote code: nothing to load


def test_the_hostile_case_fails_on_a_field_finding_alone_and_passes_with_its_words():
    first = OK
    healthy = hostile_verdict(SPEC, HostileRun(), first, 2.0, fields=[run()], remote=RemoteCode(None, "not shown by x"))
    assert healthy.status == Status.PASS and "10 request-field values through the endpoint" in healthy.message \
        and healthy.message.endswith("; trust_remote_code not shown by x -> PASS"), healthy.message
    hung = Reply(0, "timed out", 2.0)
    bad = hostile_verdict(SPEC, HostileRun(), first, 2.0, fields=[run(lambda p, w: hung if w == "out-of-range" and
                                                                       p.name == "kv_transfer_params-tp_size" else OK)])
    assert bad.status == Status.FAIL and bad.message.startswith(
        "1 finding on request fields that configure server internals: kv_transfer_params.tp_size tp_size 2^31-1 with a "
        "remote prefill (CVE-2026-94626; through the endpoint): no answer within 2 s -> FAIL"), bad.message
    assert (bad.measured, bad.limit) == (1, 0)
