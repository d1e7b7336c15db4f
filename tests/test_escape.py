"""Nothing an endpoint sends reaches kvgate's outputs raw: every control character (C0, DEL, C1), bidi
override and isolate, line separator and lone surrogate is escaped by one function,
:func:`kvgate.verdict.printable`, which every :class:`~kvgate.verdict.Verdict` applies to its message,
values and evidence -- so the console, JUnit, Allure, signoff.md and summary.json agree."""

import json

from kvgate.report.signoff import write_signoff
from kvgate.verdict import Status, Verdict, printable, printable_data

from .fakes.fake_vllm import CONTROL_TEXT, FakeConfig, FakeVLLM
from .test_gates_vs_fake import run_suites

#: Every character that must not come through raw (a newline may: files are made of lines).
UNSAFE = {c for c in CONTROL_TEXT if not c.isprintable()} | {"\ud800", "\udfff"}
#: How the start of CONTROL_TEXT reads once escaped (a quote may be clipped before its ESC sequence).
SEEN = "\\x00\\x01\\x02"


def raw(text: str, keep: str = "\n") -> set[str]:
    return {c for c in text if c in UNSAFE and c not in keep}


def test_printable_escapes_every_unsafe_character_visibly_and_once():
    text = CONTROL_TEXT + "\ud800"
    out = printable(text)
    assert not raw(out, keep="")
    assert "\\x1b[2K\\x0dOVERALL: PASS\\x07" in out and "\\u202e" in out and "\\ud800" in out and "\\x00" in out
    assert printable(out) == out  # idempotent: a verdict folded from parts is not escaped twice
    assert printable("Grüße, 你好 — ok\\n") == "Grüße, 你好 — ok\\n"  # text and backslashes untouched
    assert printable("a\nb\tc", lines=True) == "a\nb\tc" and printable("a\nb") == "a\\x0ab"


def test_verdict_escapes_message_values_and_evidence():
    v = Verdict("requests/x", Status.FAIL, f"/tokenize answered 200 ({CONTROL_TEXT}) -> FAIL", measured=CONTROL_TEXT,
                evidence={"body": CONTROL_TEXT, "nested": [{"k" + CONTROL_TEXT: (CONTROL_TEXT, 1.5)}]})
    assert not raw(v.message, keep="") and not raw(v.measured, keep="")
    assert not raw(json.dumps(v.to_summary(), ensure_ascii=False), keep="")
    assert printable_data({"a": ["x\n\x1b"]}) == {"a": ["x\n\\x1b"]}


def test_a_hostile_endpoints_bytes_reach_no_writer_raw(pytester):
    # the fake's /version and every 4xx error message carry CONTROL_TEXT (an ESC sequence that would
    # rewrite a CI log line to 'OVERALL: PASS' among them); both are quoted by verdicts
    with FakeVLLM(FakeConfig(max_tokens_cap=64, faults={"control_chars"})) as fake:
        result, summary, gates = run_suites(pytester, fake.url, "-k", "served-model or unknown-model",
                                            suites=["suites/test_deployment.py", "suites/test_requests.py"])
    quoted = [g for g in gates.values() if SEEN in g["message"]]
    assert len(quoted) >= 2, [g["message"] for g in gates.values()]  # the endpoint's text is there, escaped
    reports = pytester.path / "reports"
    write_signoff(reports)
    console = "\n".join(result.outlines + result.errlines)
    assert SEEN in console and not raw(console)
    files = [reports / "summary.json", reports / "junit.xml", reports / "signoff.md",
             *(reports / "allure-results").iterdir()]
    assert len(files) > 4
    for f in files:
        text = f.read_bytes().decode("utf-8", "surrogateescape")
        assert not raw(text), (f.name, sorted(raw(text)))
    assert SEEN in (reports / "signoff.md").read_text() and SEEN in (reports / "junit.xml").read_text()
