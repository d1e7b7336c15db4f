"""Preflight: before any gate, the endpoint must answer /v1/models in OpenAI's shape and serve the
profile's model; anything else is one line and a usage error (ERROR summary), never a list of
deployment FAILs. Unit tests over httpx.MockTransport, then whole runs against real loopback
servers: a static file server, a JSON server of the wrong shape, one that refuses the key."""

from __future__ import annotations

import http.server
import json
import threading
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from kvgate.http.client import Endpoint, KvClient
from kvgate.http.preflight import PreflightError, preflight
from kvgate.profile.models import load_profile

from .conftest import REPO, read_summary

pytest_plugins = ["pytester"]
FAKE_PROFILE = REPO / "tests" / "data" / "fake-vllm.yaml"
PROFILE = load_profile(str(FAKE_PROFILE))
MODEL = PROFILE.model.served_name
EP = Endpoint(base_url="http://kvgate.test", api_key="sk-secret-preflight-1")


def check(handler, api_key_env=None, profile=PROFILE):
    client = KvClient(EP, timeout_s=5, transport=httpx.MockTransport(handler))
    with client:
        preflight(EP, profile, api_key_env, client=client)


def reply(status, body=None, text=None, ctype="application/json"):
    def handler(request):
        content = text if text is not None else json.dumps(body)
        return httpx.Response(status, content=content.encode(), headers={"content-type": ctype})
    return handler


def test_openai_model_list_with_the_model_passes():
    check(reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 256}]}))


@pytest.mark.parametrize("status", [401, 403])
def test_refused_key_names_the_variable_never_the_key(status):
    with pytest.raises(PreflightError) as e:
        check(reply(status, {"error": "Unauthorized"}), api_key_env="MY_LLM_KEY")
    msg = str(e.value)
    assert e.value.kind == "auth" and f"answered {status} on /v1/models" in msg
    assert "$MY_LLM_KEY (--api-key-env) was refused" in msg and "sk-secret" not in msg and "\n" not in msg


@pytest.mark.parametrize("environ, says", [
    ({}, "no API key was sent; put it in an environment variable and name it with --api-key-env VAR"),
    ({"VLLM_API_KEY": "sk-vllm-1", "OPENAI_API_KEY": ""}, "no API key was sent: VLLM_API_KEY is set here, but kvgate "
     "sends only the key of a variable it is told of -- name it with --api-key-env VLLM_API_KEY; nothing was gated"),
])
def test_a_missing_key_names_the_well_known_variables_set_never_their_values(environ, says):
    ep = Endpoint(base_url="http://kvgate.test")  # no key sent
    client = KvClient(ep, timeout_s=5, transport=httpx.MockTransport(reply(401, {"error": "Unauthorized"})))
    with client, pytest.raises(PreflightError) as e:
        preflight(ep, PROFILE, None, client=client, environ=environ)
    assert says in str(e.value) and "sk-vllm-1" not in str(e.value), str(e.value)


def test_html_page_is_not_openai():
    with pytest.raises(PreflightError) as e:
        check(reply(200, text="<html><body>\n<h1>Directory listing</h1>\n</body></html>", ctype="text/html"))
    msg = str(e.value)
    assert e.value.kind == "not-openai" and "answered 200 with text/html" in msg and "not JSON" in msg
    assert "<html" not in msg and "\n" not in msg


def test_a_binary_body_is_sized_in_the_bytes_received():
    # 512 bytes that are not UTF-8 were reported as "970 bytes" (each bad byte re-encoded as U+FFFD)
    body = bytes(range(128, 256)) * 4

    def handler(request):
        return httpx.Response(200, content=body, headers={"content-type": "application/octet-stream"})

    with pytest.raises(PreflightError) as e:
        check(handler)
    assert "application/octet-stream, 512 bytes" in str(e.value), str(e.value)


def test_json_of_the_wrong_shape_is_not_openai():
    with pytest.raises(PreflightError) as e:
        check(reply(200, {"models": [MODEL]}))
    assert e.value.kind == "not-openai" and "a JSON object with keys ['models']" in str(e.value)
    assert "OpenAI's model list" in str(e.value)


def test_other_status_is_not_openai():
    with pytest.raises(PreflightError) as e:
        check(reply(404, {"detail": "Not Found"}))
    assert e.value.kind == "not-openai" and "answered 404 (application/json" in str(e.value)


def test_a_server_error_is_the_servers_failure_not_a_wrong_url():
    with pytest.raises(PreflightError) as e:
        check(reply(500, {"error": {"message": "Internal Server Error"}}))
    assert e.value.kind == "server-error" and "\n" not in str(e.value)
    assert str(e.value).startswith("endpoint http://kvgate.test/v1 answered 500 (application/json")
    assert str(e.value).endswith("on /v1/models: the server failed the model list (see its log); nothing was gated")
    assert "OpenAI-compatible" not in str(e.value)


def test_model_not_served_names_the_models_it_serves():
    with pytest.raises(PreflightError) as e:
        check(reply(200, {"data": [{"id": "llama-3-8b"}, {"id": "qwen"}]}))
    msg = str(e.value)
    assert e.value.kind == "model" and "serves 'llama-3-8b', 'qwen', not the profile's model" in msg and MODEL in msg


def test_nothing_listening_is_unreachable():
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)
    with pytest.raises(PreflightError) as e:
        check(refuse)
    assert e.value.kind == "unreachable" and "is unreachable" in str(e.value)


def test_unfinished_answer_is_not_openai():
    def slow(request):
        raise httpx.ReadTimeout("timed out", request=request)
    with pytest.raises(PreflightError) as e:
        check(slow)
    assert e.value.kind == "not-openai" and "did not finish answering /v1/models" in str(e.value)


# ---------------------------------------------------------------- whole runs against loopback servers
@contextmanager
def serving(handler_cls):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        t.join(timeout=5)


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


def static_files(root: Path):
    class Static(Quiet):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)
    return Static


class WrongShape(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"models": ["fake-model"], "ok": True}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *a):
        pass


class RefusesKey(WrongShape):
    def do_GET(self):
        body = b'{"error": "Unauthorized"}'
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


def run_against(pytester, url, *extra):
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
        "--profile", str(FAKE_PROFILE), "--endpoint", url, f"--kvgate-reports={reports}", str(REPO / "suites"), *extra)
    return result, reports


def one_line(result) -> str:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    lines = [ln for ln in result.stderr.str().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    out = result.stdout.str()
    assert "Traceback" not in out + lines[0] and "passed" not in out and "failed" not in out
    return lines[0]


def assert_error_reports(reports: Path, fragment: str) -> None:
    summary = read_summary(reports)
    assert summary["overall"] == "ERROR" and fragment in summary["error"] and summary["gates"] == []
    xml = (reports / "junit.xml").read_text()
    assert 'errors="1"' in xml and fragment in xml and f'value="{summary["run_id"]}"' in xml
    results = [json.loads(p.read_text()) for p in (reports / "allure-results").glob("*-result.json")]
    assert [r["status"] for r in results] == ["broken"]
    assert {"name": "kvgate_run_id", "value": summary["run_id"]} in results[0]["labels"]


def test_static_file_server_ends_in_one_preflight_line(pytester, tmp_path):
    (tmp_path / "index.html").write_text("<html><body>static site</body></html>")
    with serving(static_files(tmp_path)) as url:
        result, reports = run_against(pytester, url + "/v1")
    line = one_line(result)
    assert "answered 404 (text/html" in line and "not an OpenAI-compatible API at this URL" in line
    assert_error_reports(reports, "not an OpenAI-compatible API")


def test_json_server_of_the_wrong_shape_ends_in_one_preflight_line(pytester):
    with serving(WrongShape) as url:
        result, reports = run_against(pytester, url)
    line = one_line(result)
    assert "a JSON object with keys ['models', 'ok'], not OpenAI's model list" in line
    assert_error_reports(reports, "not OpenAI's model list")


def test_server_refusing_the_key_ends_in_one_preflight_line(pytester, monkeypatch):
    monkeypatch.setenv("KVGATE_PREFLIGHT_KEY", "sk-do-not-print-777")
    with serving(RefusesKey) as url:
        result, reports = run_against(pytester, url, "--api-key-env", "KVGATE_PREFLIGHT_KEY")
    line = one_line(result)
    assert "answered 401" in line and "--api-key-env" in line and "sk-do-not-print-777" not in line
    assert_error_reports(reports, "was refused")
    for p in reports.rglob("*"):
        if p.is_file():
            assert "sk-do-not-print-777" not in p.read_text(errors="replace"), p


def test_fit_only_does_not_preflight(pytester):
    with serving(RefusesKey) as url:
        result, reports = run_against(pytester, url, "-m", "fit")
    assert result.ret != pytest.ExitCode.USAGE_ERROR  # the fit verdict itself (INVALID here: no weights) stands
    summary = read_summary(reports)
    assert summary["endpoint_contacted"] is False and [g["id"] for g in summary["gates"]] == ["fake-vllm/fit/kv-pool"]
