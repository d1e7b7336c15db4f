"""KvClient over httpx.MockTransport with an injected clock: no network, no sleeping."""

from __future__ import annotations

import httpx
import pytest

from kvgate.http.client import Endpoint, EndpointUnreachable, KvClient, Reply, iter_sse_data
from kvgate.http.stream import summarize


class Clock:
    def __init__(self, step: float = 0.01) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


SSE = (
    b'data: {"choices":[{"index":0,"text":"a","logprobs":{"tokens":["a"]},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"text":"b","logprobs":{"tokens":["b"]},"finish_reason":"length"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
    b"data: [DONE]\n\n"
)


def handler(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/completions":
        return httpx.Response(200, content=SSE, headers={"content-type": "text/event-stream"})
    if request.url.path == "/version":
        return httpx.Response(200, json={"version": "0.32.0"})
    if request.url.path == "/garbage":
        return httpx.Response(200, content=b"<html>oops")
    return httpx.Response(404, json={"error": {"message": "nope", "code": 404}})


def client(**kw) -> KvClient:
    return KvClient(Endpoint("http://fake", api_key="sk-secret-1"), transport=httpx.MockTransport(handler), **kw)


def test_stream_events_are_timestamped_with_the_injected_clock():
    r = client(clock=Clock(0.01)).stream("/v1/completions", {"stream": True})
    assert r.status == 200 and r.done
    ts = [t for t, _ in r.events]
    assert ts == sorted(ts) and len(ts) == 4
    s = summarize(r)
    assert s.text == "ab" and s.tokens_received == 2 and s.finish_reasons == ["length"]
    assert s.usage["completion_tokens"] == 2


def test_stream_bytes_keeps_the_body_as_sent_comments_and_all_timestamped():
    pieces = [b": ping\n\n", b"id: 1\n", SSE]

    def chunked(request):
        return httpx.Response(200, content=iter(pieces), headers={"content-type": "text/event-stream"})

    c = KvClient(Endpoint("http://fake"), transport=httpx.MockTransport(chunked), clock=Clock(0.01))
    r = c.stream_bytes("/v1/completions", {"stream": True})
    assert r.status == 200 and r.content_type == "text/event-stream" and r.transport_error is None
    assert r.body == b"".join(pieces) and [b for _, b in r.pieces] == pieces
    assert [t for t, _ in r.pieces] == sorted(t for t, _ in r.pieces) and r.elapsed_s > r.pieces[-1][0]
    refused = client().stream_bytes("/nope", {})
    assert refused.status == 404 and refused.pieces == [] and "nope" in refused.text


def test_stream_bytes_stops_reading_a_stream_past_its_total_time():
    def forever(request):
        return httpx.Response(200, content=iter([b": ping\n\n"] * 1000), headers={"content-type": "text/event-stream"})

    c = KvClient(Endpoint("http://fake"), transport=httpx.MockTransport(forever), clock=Clock(1.0))
    r = c.stream_bytes("/v1/completions", {}, timeout_s=5)
    assert len(r.pieces) < 10 and r.transport_error == "stream still open after 5 s: stopped reading"


def test_early_hangup_via_on_event():
    r = client().stream("/v1/completions", {}, on_event=lambda t, d: True)
    assert len(r.events) == 1 and not r.done


def test_garbage_body_is_data_not_an_exception():
    r = client().get("/garbage")
    assert r.status == 200 and r.json is None and "oops" in r.error_message


def test_error_message_from_openai_error_body():
    assert client().get("/nowhere").error_message == "nope"


def test_version():
    assert client().version() == "0.32.0"


def test_api_key_sent_but_not_in_repr():
    seen = {}

    def h(request):
        seen["auth"] = request.headers.get("authorization")
        return httpx.Response(200, json={})

    ep = Endpoint("http://fake", api_key="sk-secret-1")
    KvClient(ep, transport=httpx.MockTransport(h)).get("/x")
    assert seen["auth"] == "Bearer sk-secret-1"
    assert "sk-secret-1" not in repr(ep)


def test_unreachable_is_one_line():
    def refuse(request):
        raise httpx.ConnectError("[Errno 111] Connection refused")

    c = KvClient(Endpoint("http://127.0.0.1:9"), transport=httpx.MockTransport(refuse))
    with pytest.raises(EndpointUnreachable) as exc:
        c.models()
    msg = str(exc.value)
    assert "\n" not in msg and "unreachable" in msg and "127.0.0.1:9" in msg


def test_unreachable_real_socket_refused():
    with pytest.raises(EndpointUnreachable, match="unreachable"):
        KvClient(Endpoint("http://127.0.0.1:9"), timeout_s=2).models()


def test_sse_multiline_and_comments():
    lines = [": keepalive", "data: a", "data: b", "", "event: x", "data: c", ""]
    assert list(iter_sse_data(iter(lines))) == ["a\nb", "c"]


def test_hang_up_request_closes_before_answer_and_reports_early_answer():
    from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

    with FakeVLLM(FakeConfig(itl_s=0.01, max_model_len=512)) as fake:
        c = KvClient(Endpoint(fake.base_url))
        body = {"model": "fake-model", "prompt": "a b", "max_tokens": 400, "ignore_eos": True}
        r = c.hang_up_request("/v1/completions", body, after_s=0.2)
        assert r.status == 0 and r.text == "hung up"
        quick = c.hang_up_request("/v1/completions", {**body, "max_tokens": 2}, after_s=5)
        assert quick.status == 200


def test_hang_up_request_to_a_server_that_resets_is_unreachable_not_a_traceback():
    # seen once in tests/test_watch_vs_fake.py's server-gone run: ConnectionResetError from recv()
    import socket
    import struct
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def reset_on_accept():
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close -> RST
        conn.close()

    t = threading.Thread(target=reset_on_accept, daemon=True)
    t.start()
    try:
        c = KvClient(Endpoint(f"http://127.0.0.1:{srv.getsockname()[1]}"), timeout_s=2)
        with pytest.raises(EndpointUnreachable, match=r"unreachable \((ConnectionResetError|BrokenPipeError)"):
            c.hang_up_request("/v1/completions", {"prompt": "a"}, after_s=2)
    finally:
        t.join(timeout=5)
        srv.close()


def test_clip_never_cuts_mid_word():
    from kvgate.http.client import clip

    text = ("This model's maximum context length is 2048 tokens. However, you requested 2049 tokens "
            "(2041 in the messages, 8 in the completion). Please reduce the length: at least 2049 input tokens")
    assert clip(text, None) == text and clip(text, 1000) == text
    cut = clip(text, 60)
    assert cut.endswith("…") and len(cut) <= 60 and text.startswith(cut[:-1])
    assert not text[len(cut) - 1].isalnum(), cut  # the cut falls at a word's end, not inside it
    assert clip("one\n  two\tthree", None) == "one two three"
    assert clip("x" * 50, 10) == "x" * 9 + "…"  # one over-long word: cut at the limit


def test_non_json_error_body_is_cut_at_a_word():
    long_html = "<html>" + " word" * 100 + "</html>"
    r = Reply(502, long_html, 0.1)
    assert r.error_message.endswith("…") and r.error_message[:-1].endswith("word") and len(r.error_message) <= 200


def test_pooled_connections_expire_before_vllms_keep_alive_closes_them():
    """An idle pooled connection is dropped after 2 s, before vLLM's uvicorn closes it (5 s): with
    httpx's default (also 5 s) a request ~5 s after the last one could meet a connection being
    closed (``Connection reset by peer``)."""
    from kvgate.http.client import KEEPALIVE_EXPIRY_S

    with KvClient(Endpoint("http://127.0.0.1:9")) as c:
        assert c._http._transport._pool._keepalive_expiry == KEEPALIVE_EXPIRY_S < 5
