"""A fast fake OpenAI-compatible SSE server that times itself (benchmarks only, not a test fake).

Raw asyncio HTTP/1.1 (``asyncio.Protocol``, keep-alive, chunked SSE). For every streamed request
it records its own **true TTFT**: ``t_first - t_body``, where ``t_body`` is when the last byte of
the request body arrived (the instant the server's poll that found it returned — a busy server
would otherwise see a body late and under-state its TTFT) and ``t_first`` is right after
the response head *and* the first SSE event were handed to the kernel in one write (so "first
byte" and "first token" are the same instant). Records are keyed by the ``x-request-id`` header.

Routes: ``POST /v1/completions`` and ``/v1/chat/completions`` (``max_tokens`` events, then a usage
event and ``data: [DONE]``); ``GET /v1/models``; ``GET /_stats`` (records as JSON);
``POST /_reset``. ``/tokenize`` is 404 (``vllm bench serve`` then skips prompt re-alignment).

    python benchmarks/fake_sse_server.py --cpu 0 --ttft-ms 20 --itl-ms 2

prints ``PORT <n>`` on stdout once listening on 127.0.0.1. ``--ttft-ms``: injected delay before
the first event (ms); ``--itl-ms``: delay between events (ms; 0 = yield to the loop only, as fast
as one core allows). Runs until killed or until ``--max-lifetime-s`` passes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import selectors
import sys
import time

perf = time.perf_counter


class PollTime(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The platform selector, remembering when its last poll returned (``t``, perf_counter)."""

    t = 0.0

    def select(self, timeout: float | None = None) -> list:  # type: ignore[type-arg]
        ready = super().select(timeout)
        PollTime.t = perf()
        return ready


class State:
    def __init__(self, ttft_s: float, itl_s: float, model: str) -> None:
        self.ttft_s, self.itl_s, self.model = ttft_s, itl_s, model
        self.records: dict[str, dict[str, float]] = {}
        self.anon = 0


def chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


def events(chat: bool, model: str, n: int, prompt_tokens: int = 16) -> tuple[bytes, bytes, bytes]:
    """(token event, last token event, tail = usage + [DONE] + terminating chunk), pre-framed."""
    def ev(fr: str | None) -> bytes:
        if chat:
            obj = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": model,
                   "choices": [{"index": 0, "delta": {"content": " tok"}, "logprobs": None, "finish_reason": fr}]}
        else:
            obj = {"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": model,
                   "choices": [{"index": 0, "text": " tok", "logprobs": None, "finish_reason": fr,
                                "stop_reason": None}]}
        return chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

    usage = {"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": model, "choices": [],
             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                       "total_tokens": prompt_tokens + n}}
    tail = chunk(b"data: " + json.dumps(usage, separators=(",", ":")).encode() + b"\n\n") \
        + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    return ev(None), ev("length"), tail


SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n")


def json_response(status: int, obj: object) -> bytes:
    body = json.dumps(obj).encode()
    reason = {200: b"OK", 404: b"Not Found", 400: b"Bad Request"}.get(status, b"X")
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (status, reason, len(body))) + body


class Conn(asyncio.Protocol):
    def __init__(self, st: State) -> None:
        self.st = st
        self.buf = bytearray()
        self.busy = False
        self.closed = False
        self.tr: asyncio.Transport | None = None
        self.can_write: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.can_write is not None and not self.can_write.done():
            self.can_write.set_result(None)

    def pause_writing(self) -> None:
        self.can_write = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.can_write is not None and not self.can_write.done():
            self.can_write.set_result(None)
        self.can_write = None

    def data_received(self, data: bytes) -> None:
        t = PollTime.t or perf()
        self.buf += data
        if not self.busy:
            self.parse(t)

    def parse(self, t: float) -> None:
        buf = self.buf
        i = buf.find(b"\r\n\r\n")
        if i < 0:
            return
        lines = bytes(buf[:i]).split(b"\r\n")
        try:
            method, path, _ = lines[0].split(b" ", 2)
        except ValueError:
            assert self.tr is not None
            self.tr.close()
            return
        hdrs = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(b":")
            hdrs[k.strip().lower()] = v.strip()
        n = int(hdrs.get(b"content-length", b"0"))
        if len(buf) < i + 4 + n:
            return  # body incomplete: t_body will be the arrival of its last byte
        body = bytes(buf[i + 4:i + 4 + n])
        del buf[:i + 4 + n]
        self.busy = True
        asyncio.ensure_future(self.respond(method, path.split(b"?")[0], hdrs, body, t))

    async def respond(self, method: bytes, path: bytes, hdrs: dict[bytes, bytes], body: bytes, t_body: float) -> None:
        st, tr = self.st, self.tr
        assert tr is not None
        try:
            if method == b"POST" and path in (b"/v1/completions", b"/v1/chat/completions"):
                await self.stream(path == b"/v1/chat/completions", hdrs, body, t_body)
            elif path == b"/v1/models":
                tr.write(json_response(200, {"object": "list", "data": [
                    {"id": st.model, "object": "model", "owned_by": "bench", "root": st.model,
                     "max_model_len": 1 << 20}]}))
            elif path == b"/_stats":
                tr.write(json_response(200, {"records": st.records}))
            elif path == b"/_reset":
                st.records.clear()
                tr.write(json_response(200, {"ok": True}))
            else:
                tr.write(json_response(404, {"error": {"message": "not found", "code": 404}}))
        finally:
            self.busy = False
        if self.buf and not self.closed:
            self.parse(perf())

    async def stream(self, chat: bool, hdrs: dict[bytes, bytes], body: bytes, t_body: float) -> None:
        st, tr = self.st, self.tr
        assert tr is not None
        req = json.loads(body or b"{}")
        n = max(1, int(req.get("max_tokens") or 16))
        rid = hdrs.get(b"x-request-id", b"").decode() or f"anon-{st.anon}"
        st.anon += 1
        tok, last, tail = events(chat, st.model, n)
        if st.ttft_s > 0:
            await asyncio.sleep(st.ttft_s)
        if self.closed:
            return
        tr.write(SSE_HEAD + (last if n == 1 else tok))
        t_first = perf()
        rec = {"ttft_s": t_first - t_body, "chunks": 1}
        st.records[rid] = rec
        loop_sleep = asyncio.sleep
        itl = st.itl_s
        for i in range(1, n):
            await loop_sleep(itl)
            if self.can_write is not None:
                await self.can_write
            if self.closed:
                return
            tr.write(last if i == n - 1 else tok)
            rec["chunks"] += 1
        tr.write(tail)
        rec["chunks"] += 2  # usage + [DONE]


async def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU core")
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--model", default="bench-model")
    ap.add_argument("--max-lifetime-s", type=float, default=3600.0)
    a = ap.parse_args(argv)
    if a.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {a.cpu})
    st = State(a.ttft_ms / 1e3, a.itl_ms / 1e3, a.model)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Conn(st), "127.0.0.1", a.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    try:
        await asyncio.sleep(a.max_lifetime_s)
    finally:
        server.close()


if __name__ == "__main__":
    try:
        loop = asyncio.SelectorEventLoop(PollTime())
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main())
    except KeyboardInterrupt:
        sys.exit(0)
