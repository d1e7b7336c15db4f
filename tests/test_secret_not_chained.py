"""A refusal that quotes the request's key never reaches the console or the reports through the
exception it was raised from (newcomer, 2026-12-05: a server whose 400s repeat the ``Authorization``
header; ``/tokenize``'s refusal became the gate's FAIL inside ``except PreparationRefused``, and
pytest printed that exception too -- "During handling of the above exception..." -- unredacted, into
the console, junit.xml and the Allure results)."""

from __future__ import annotations

import http.server
import json
import threading

from .conftest import REPO

KEY = "sk-SECRETKEY-chained-7781"


class _EchoingAuth(http.server.BaseHTTPRequestHandler):
    """``/v1/models`` lists one model; every other request gets a 400 repeating its Authorization."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.rstrip("/") == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": "kvgate-tiny-llama", "object": "model",
                                                                "owned_by": "vllm", "max_model_len": 2048}]})
        self._send(400, {"error": {"message": f"bad request, you sent auth={self.headers.get('Authorization')}",
                                   "type": "BadRequestError", "code": 400}})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(400, {"error": {"message": f"bad request, you sent auth={self.headers.get('Authorization')}",
                                   "type": "BadRequestError", "code": 400}})


def test_a_refused_preparation_quoting_the_key_fails_without_echoing_it(pytester, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoingAuth)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("KVGATE_TEST_KEY", KEY)
    reports = pytester.path / "reports"
    try:
        result = pytester.runpytest_inprocess(
            "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
            "--profile=tiny-cpu", f"--endpoint=http://127.0.0.1:{server.server_address[1]}/v1",
            "--api-key-env=KVGATE_TEST_KEY", f"--kvgate-reports={reports}", "-m", "requests", str(REPO / "suites"))
    finally:
        server.shutdown()
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 1 and "/tokenize" in out and "Bearer ***" in out, out[-3000:]  # refused, named, masked
    assert KEY not in out and "During handling of the above exception" not in out
    leaked = [p.name for p in reports.rglob("*") if p.is_file() and KEY in p.read_text(errors="replace")]
    assert leaked == [], leaked
