"""Servers that are not vLLM (issue 22 part 4), against the fake posing as each
(tests/fakes/fake_vllm.py SERVERS): kvgate finds the tokenize endpoint the server has
(kvgate.http.tokenizers), a capability it lacks SKIPs exactly the checks that need it naming the
server, the real defects FAIL, and pytest, summary.json and JUnit count the same -- a whole run
ends with verdicts only (runs of ``pytest --profile ... --endpoint <fake>``: llama-cpp-python's in a
subprocess, as a user runs it; the others in-process)."""

from __future__ import annotations

import collections
import json
import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from kvgate.http.client import Endpoint, KvClient
from kvgate.http.probes import build_prompt, send
from kvgate.http.prompts import PromptUnavailable
from kvgate.http.tokenizers import detect
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO
from .test_watch_vs_fake import run_all as watch_run_all

PROFILE = REPO / "tests" / "data" / "fake-llamacpp.yaml"
MODEL = "fake-model"
pytest_plugins = ["pytester"]


def client_for(fake: FakeVLLM) -> KvClient:
    return KvClient(Endpoint(fake.base_url), timeout_s=5)


@pytest.mark.parametrize("shape,route,chat", [("vllm", "vllm", True), ("llama.cpp", "llama.cpp", True),
                                              ("llama-cpp-python", "llama-cpp-python", False),
                                              ("static-files", None, False)])
def test_detects_the_tokenize_endpoint_each_server_has(shape, route, chat):
    with FakeVLLM(FakeConfig(server=shape)) as fake, client_for(fake) as c:
        found = detect(c, MODEL)
        assert (found.route, found.chat) == (route, chat), found
        assert detect(c, MODEL) is found  # asked once per client


@pytest.mark.parametrize("shape", ["llama.cpp", "llama-cpp-python"])
def test_exact_prompts_through_the_servers_own_tokenizer(shape):
    """The count the server's endpoint gives is the server's usage.prompt_tokens: completions on
    both, chat on llama.cpp (/apply-template then /tokenize with add_special)."""
    apis = ["completions", "chat"] if shape == "llama.cpp" else ["completions"]
    with FakeVLLM(FakeConfig(server=shape)) as fake, client_for(fake) as c:
        for api in apis:
            p = build_prompt(c, MODEL, api, 40)
            assert p.token_ids is None and p.tokens == 40
            ex = send(c, api, p.body(MODEL, max_tokens=1))
            assert ex.reply.status == 200 and ex.reply.json["usage"]["prompt_tokens"] == 40, (api, ex.reply.text)


def test_no_tokenize_message_names_the_server_not_kserve():
    with FakeVLLM(FakeConfig(server="llama.cpp", faults={"no_tokenize"})) as fake, client_for(fake) as c:
        with pytest.raises(PromptUnavailable) as exc:
            build_prompt(c, MODEL, "chat", 40)
        assert build_prompt(c, MODEL, "completions", 40).token_ids is not None  # exact by construction
    assert str(exc.value) == (
        "the server (llama.cpp, Server: llama.cpp; /v1/models owned_by llamacpp) has no tokenize endpoint "
        "(/tokenize 404, /extras/tokenize 404) and the profile sets no model.tokenizer: an exact-length chat "
        "prompt cannot be built")
    with FakeVLLM(FakeConfig(server="llama-cpp-python")) as fake, client_for(fake) as c:
        with pytest.raises(PromptUnavailable, match=r"the server \(llama-cpp-python, Server: uvicorn; /v1/models "
                           r"owned_by me\) counts text tokens at /extras/tokenize but cannot render its chat template"):
            build_prompt(c, MODEL, "chat", 40)


# ---- whole runs ---------------------------------------------------------------------------------

def run_all(url: str, reports, pytester=None) -> tuple[Any, dict, float]:
    """:func:`tests.test_watch_vs_fake.run_all` over this profile, soak left out: a subprocess without
    ``pytester`` (llama-cpp-python's run: the CLI's own proof), else in-process."""
    return watch_run_all(url, PROFILE, reports, pytester, "-m", "not soak")


def assert_counts_agree(proc, summary, reports) -> None:
    """pytest's summary line, summary.json and junit.xml count the same (issue 22: "29 failed, 30
    errors" vs FAIL 19 / ERROR 40); every JUnit testcase carries its kvgate_verdict."""
    last = proc.stdout.strip().splitlines()[-1]
    said = {w: int(n) for n, w in re.findall(r"(\d+) (passed|failed|skipped|errors?|invalid)", last)}
    counts = summary["counts"]
    assert said.get("passed", 0) == counts.get("PASS", 0), last
    assert said.get("failed", 0) == counts.get("FAIL", 0) + counts.get("NOT_SENT", 0), last  # both failed in pytest
    assert said.get("skipped", 0) == counts.get("SKIP", 0) and said.get("invalid", 0) == counts.get("INVALID", 0), last
    assert said.get("errors", said.get("error", 0)) == counts.get("ERROR", 0), last
    suite = ET.parse(reports / "junit.xml").getroot().find("testsuite")
    verdicts = collections.Counter()
    for case in suite.iter("testcase"):
        v = [p.get("value") for p in case.iter("property") if p.get("name") == "kvgate_verdict"]
        assert v, ET.tostring(case)[:300]
        verdicts[v[-1]] += 1
    assert dict(verdicts) == {k: n for k, n in counts.items() if n}, (verdicts, counts)
    assert int(suite.get("errors")) == counts.get("ERROR", 0)


def test_llama_cpp_python_run_ends_with_verdicts_only(tmp_path):
    cfg = FakeConfig(server="llama-cpp-python", max_tokens_cap=64, itl_s=0.002)
    with FakeVLLM(cfg) as fake:
        proc, summary, wall = run_all(fake.url, tmp_path)
    assert wall < 40, wall
    gates = {g["id"].split("/", 1)[1]: g for g in summary["gates"]}
    assert summary["counts"].get("ERROR", 0) == 0 and "Traceback" not in proc.stdout + proc.stderr, \
        [g["message"] for g in gates.values() if g["status"] == "ERROR"]
    for api in ("completions", "chat"):  # the real defects FAIL
        over, usage = gates[f"max-tokens/over-cap/{api}"], gates[f"max-tokens/stream-usage/{api}"]
        assert over["status"] == "FAIL" and "cap not enforced" in over["message"], over["message"]
        assert usage["status"] == "FAIL" and "no usage chunk" in usage["message"], usage["message"]
    # capabilities it lacks SKIP exactly what needs them, naming the capability
    for gid in ("max-context/chat", "requests/max-tokens/null/chat"):
        assert gates[gid]["status"] == "SKIP" and "llama-cpp-python" in gates[gid]["message"] \
            and "/extras/tokenize" in gates[gid]["message"], gates[gid]["message"]
    for gid in ("deployment/cache-config", "disconnect/mid-stream"):
        assert gates[gid]["status"] == "SKIP" and "metrics" in gates[gid]["message"], gates[gid]["message"]
    # what needs no exact-length chat prompt ran: requests cases and completions max-context PASS
    for gid in ("requests/empty-prompt/chat", "max-context/completions", "requests/max-tokens/null/completions"):
        assert gates[gid]["status"] == "PASS", gates[gid]["message"]
    # its interrupt_requests default: a stream another request overlaps ends [DONE] without a finish
    # chunk -- a real gap, named as the real server's run names it (docs/servers.md)
    for api in ("completions", "chat"):
        cut = gates[f"requests/chunk-schema/{api}"]
        assert cut["status"] == "FAIL" and "finish chunks per choice index {}" in cut["message"], cut["message"]
    whole = gates["requests/integrity"]
    assert whole["status"] == "FAIL" and "events with no finish chunk" in whole["message"], whole["message"]
    # a body that is not JSON: the real 0.3.36 answers uvicorn's bare 500 (its error handler raises again)
    bad = gates["requests/malformed/not-json"]
    assert bad["status"] == "FAIL" and "answered 500 (Internal Server Error)" in bad["message"], bad["message"]
    assert_counts_agree(proc, summary, tmp_path)


def test_static_file_server_run_is_verdicts_without_tracebacks(pytester, tmp_path):
    """A static file server listing the model (GET v1/models) and answering every POST 501: the
    gates that send FAIL with what came back; no ERROR, no traceback; the counts agree (in-process:
    the subprocess run is llama-cpp-python's)."""
    with FakeVLLM(FakeConfig(server="static-files")) as fake:
        proc, summary, wall = run_all(fake.url, tmp_path, pytester)
    assert wall < 40, wall
    assert summary["counts"].get("ERROR", 0) == 0 and "Traceback" not in proc.stdout + proc.stderr
    gates = {g["id"].split("/", 1)[1]: g for g in summary["gates"]}
    assert gates["max-context/completions"]["status"] == "FAIL" and "501" in gates["max-context/completions"]["message"]
    chat = gates["max-context/chat"]
    assert chat["status"] == "SKIP" and "static file server" in chat["message"] and "/tokenize 501" in chat["message"]
    assert_counts_agree(proc, summary, tmp_path)


def test_harness_error_in_a_call_is_counted_as_an_error_everywhere(pytester):
    """A gate that raises in its call (no verdict) is pytest's ``error`` (not ``failed``),
    summary.json's ERROR and JUnit's ``<error>`` with kvgate_verdict ERROR; a fixture's skip is
    summary.json's SKIP -- one count everywhere."""
    pytester.makepyfile(test_mixed="""
        import pytest
        from kvgate.run.session import current
        from kvgate.verdict import Status, Verdict

        @pytest.fixture
        def skipping():
            pytest.skip("no such capability here")

        @pytest.mark.gate("latency", cases=["boom"])
        def test_call(case):
            raise RuntimeError("harness broke")

        @pytest.mark.gate("latency", cases=["skipped"])
        def test_skip(case, skipping):
            pass

        @pytest.mark.gate("latency", cases=["ok"])
        def test_ok(case, request):
            current(request.config).recorder(request.node)(Verdict("latency/ok", Status.PASS, "fine"))
    """)
    reports = pytester.path / "reports"
    with FakeVLLM(FakeConfig()) as fake:
        result = pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO),
                                              "-p", "no:cacheprovider", f"--kvgate-reports={reports}",
                                              f"--profile={REPO / 'tests' / 'data' / 'fake-vllm.yaml'}",
                                              f"--endpoint={fake.url}", str(pytester.path / "test_mixed.py"))
    last = result.stdout.lines[-1]
    assert "1 error" in last and "failed" not in last and "1 skipped" in last and "1 passed" in last, last
    summary = json.loads((reports / "summary.json").read_text())
    assert summary["counts"] == {"PASS": 1, "SKIP": 1, "ERROR": 1} or \
        {k: v for k, v in summary["counts"].items() if v} == {"PASS": 1, "SKIP": 1, "ERROR": 1}, summary["counts"]
    suite = ET.parse(reports / "junit.xml").getroot().find("testsuite")
    assert (suite.get("errors"), suite.get("failures")) == ("1", "0")
    boom = next(c for c in suite.iter("testcase") if "boom" in c.get("name"))
    assert boom.find("error") is not None and boom.find("failure") is None
    assert {p.get("name"): p.get("value") for p in boom.iter("property")}["kvgate_verdict"] == "ERROR"


def test_transformers_serve_run_makes_no_kvgate_mistake(pytester, tmp_path):
    """HF transformers serve's strictness (issue 41; the fake posing as it): every request carrying a
    vLLM extension refused 422, token-id prompts 400, no max_model_len. The extensions are probed once,
    ignore_eos goes in its portable form (the cases judged on what came back: they PASS), a case with
    no portable form SKIPs naming the refused parameter and quoting the 422, the over-length case is
    not a PASS on a refusal of the prompt's form; the real gaps still FAIL; the server is named
    (in-process: the subprocess run is llama-cpp-python's)."""
    cfg = FakeConfig(server="transformers-serve", max_tokens_cap=64, itl_s=0.002)
    with FakeVLLM(cfg) as fake:
        url = fake.url
        proc, summary, wall = run_all(url, tmp_path, pytester)
    assert wall < 40, wall
    gates = {g["id"].split("/", 1)[1]: g for g in summary["gates"]}
    assert summary["counts"].get("ERROR", 0) == 0 and "Traceback" not in proc.stdout + proc.stderr
    assert summary["extensions"]["refused"].keys() == {"ignore_eos", "min_tokens", "token-id prompt"}, \
        summary["extensions"]
    mistaken = [(i, g["message"]) for i, g in gates.items() if g["status"] in ("FAIL", "ERROR")
                and re.search(r"ignore_eos|min_tokens|prompt must be a string", g["message"])
                and "without OpenAI's error body" not in g["message"]]  # that is the server's (below)
    assert not mistaken, mistaken
    for api in ("completions", "chat"):  # sent without ignore_eos, measured on what came back
        for case in ("max-tokens/cap-hit", "max-tokens/stream-usage", "max-tokens/over-cap", "streaming/ttft",
                     "streaming/framing", "streaming/deltas", "streaming/openai-sdk", "streaming/buffering"):
            assert gates[f"{case}/{api}"]["status"] == "PASS", (case, api, gates[f"{case}/{api}"]["message"])
        mt = gates[f"requests/min-tokens/{api}"]
        assert mt["status"] == "SKIP" and mt["message"].startswith(
            "the server refuses min_tokens (422: {\"detail\":\"Unexpected fields in the request: {'min_tokens'}\"})"), \
            mt["message"]
    for case in ("over-length/completions", "over-length/completions-stream"):  # the false PASS of issue 41
        over = gates[f"max-context/{case}"]
        assert over["status"] == "SKIP" and "the server refuses the prompt's form, not its length" in over["message"], \
            over["message"]
    for gid in ("concurrency/long-sequences", "latency/slo"):  # the load client sends the portable form too
        assert gates[gid]["status"] == "PASS", gates[gid]["message"]
    bad = gates["requests/empty-prompt/list"]  # a real gap: FastAPI's {"detail"} is not OpenAI's error body
    assert bad["status"] == "FAIL" and "without OpenAI's error body" in bad["message"], bad["message"]
    assert summary["server"]["name"] == "HF transformers serve" and summary["server_version"] is None
    assert "@ " + url + " (HF transformers serve (version not reported))" in proc.stdout
    assert_counts_agree(proc, summary, tmp_path)


def test_the_canary_after_a_crashed_handler_goes_on_a_connection_of_its_own():
    """llama-cpp-python 0.3.36 (measured 2026-12-05): a body that is not JSON -> uvicorn's bare 500, then
    the connection closed without ``Connection: close``; the next request on that pooled connection read
    ``Connection reset by peer`` in 6 ms while a new connection was served 200 -- the canary FAILed on a
    kvgate artefact. The fake's route raises out of the app as the real one does."""
    from kvgate.http.probes import canary, send_raw

    import socket
    from urllib.parse import urlsplit

    with FakeVLLM(FakeConfig(server="llama-cpp-python")) as fake, client_for(fake) as c:
        model = c.models().json["data"][0]["id"]
        bad = send_raw(c, "completions", "{not json")
        assert bad.reply.status == 500 and bad.reply.text == "Internal Server Error", bad.reply
        # the control, on a socket of its own (a pooled request after it reset 10 of 10 times on a quiet host,
        # but whether httpx reuses the connection before the close arrives is a race): the server answers the
        # bare 500 on a keep-alive connection, then closes it without saying so
        u = urlsplit(fake.base_url)
        with socket.create_connection((u.hostname, u.port), timeout=10) as sock:
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                         "Content-Length: 9\r\nConnection: keep-alive\r\n\r\n{not json".encode())
            got = b""
            try:
                while chunk := sock.recv(65536):
                    got += chunk
                closed = True  # EOF: the server closed the connection it kept alive
            except ConnectionResetError:
                closed = True
            except socket.timeout:
                closed = False
        assert got.startswith(b"HTTP/1.1 500") and b"connection: close" not in got.lower(), got[:300]
        assert closed, "the fake no longer drops the connection after its bare 500"
        for _ in range(3):  # the canary asks the server, not the dropped connection
            send_raw(c, "completions", "{not json")
            ex = canary(c, model, 5.0)
            assert ex.reply.status == 200 and ex.reply.json["choices"], ex.reply.text
