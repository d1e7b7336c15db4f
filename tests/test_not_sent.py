"""After a hang verdict the gates not sent carry one cause and are counted apart from the measured
FAILs (issue 41): console table, summary.json ``counts.NOT_SENT``, signoff.md; and the server is
named from what it says it is, not "(vLLM version unknown)"."""

from __future__ import annotations

from kvgate.report.record import RunRecord
from kvgate.report.redact import Redactor
from kvgate.report.signoff import signoff_markdown
from kvgate.verdict import Status, Verdict

from .conftest import validate_summary

REASON = ("engine hung since x/requests/empty-prompt/string (POST /v1/completions got no answer in 10.0 s; a 4-token "
          "canary then got no token within 3 s (ReadTimeout) while /health answered 200; running 1, waiting 0)")


def hung_run(server: dict | None = None, version: str | None = None) -> RunRecord:
    rec = RunRecord("x", None, Redactor(), endpoint="http://127.0.0.1:8000/v1", server_version=version,
                    run_id="20261204T000000Z-abcdef", endpoint_contacted=True, server=server)
    rec.add("s.py::a[x/max-tokens/over-cap]", "x/max-tokens/over-cap",
            Verdict("max-tokens/over-cap", Status.FAIL, "48 tokens for a 32 cap -> FAIL (cap not enforced)", 48, 32))
    rec.add("s.py::b[x/requests/empty-prompt/string]", "x/requests/empty-prompt/string",
            Verdict("requests", Status.FAIL, f"{REASON} -> FAIL (the later live gates are not sent); answered 500",
                    cause=REASON))
    for i in range(3):
        rec.add(f"s.py::c[{i}]", f"x/streaming/{i}", Verdict("streaming", Status.FAIL, f"not sent: {REASON} -> FAIL",
                                                            cause=REASON))
    rec.add("s.py::d", "x/fit/kv-pool", Verdict("fit", Status.PASS, "fits -> PASS", 4, 2))
    rec.engine = {"condition": "hung", "reason": REASON, "gate": "x/requests/empty-prompt/string", "evidence": {}}
    return rec


def test_not_sent_counted_apart_from_measured_fails_everywhere():
    rec = hung_run()
    summary = validate_summary(rec.summary())
    assert summary["counts"] == {"PASS": 1, "FAIL": 2, "NOT_SENT": 3, "INVALID": 0, "INCONCLUSIVE": 0, "SKIP": 0,
                                 "ERROR": 0}
    assert summary["overall"] == "FAIL"  # not sent is still a FAIL of the run: the deployment did not serve
    table = rec.table()
    assert "NOT SENT: 3 gate(s) FAIL without a measurement, one cause (above); measured FAILs: 2" in table
    assert table.index(f"ENGINE HUNG: {REASON}") < table.index(
        "NOT SENT: 3 gate(s) FAIL without a measurement, one cause (above); measured FAILs: 2")
    md = signoff_markdown(summary)
    assert "(1 PASS, 2 FAIL, 3 NOT SENT, 0 INVALID, 0 SKIP, 0 ERROR)" in md
    assert f"**Not sent: 3 gate(s)** FAIL without a measurement, one cause: {REASON}. Counted apart from the 2 " \
           "measured FAIL(s)." in md


def test_a_run_without_a_hang_counts_no_not_sent():
    rec = RunRecord("x", None, Redactor(), run_id="20261204T000000Z-abcdef")
    rec.add("s.py::a", "x/a", Verdict("a", Status.FAIL, "measured -> FAIL", 2, 1))
    assert rec.counts()["NOT_SENT"] == 0 and rec.counts()["FAIL"] == 1
    assert not any(line.startswith("NOT SENT") for line in rec.table())
    assert "NOT SENT" not in signoff_markdown(validate_summary(rec.summary()))


def test_server_named_from_what_it_says():
    transformers = {"name": "HF transformers serve", "version": None, "server_header": "uvicorn", "owned_by": "local"}
    anonymous = {"name": None, "version": None, "server_header": "uvicorn", "owned_by": "local"}
    vllm = {"name": "vLLM", "version": "0.32.0", "server_header": "uvicorn", "owned_by": "vllm"}
    for server, version, words in ((transformers, None, "HF transformers serve (version not reported)"),
                                   (anonymous, None, "server not named: Server: uvicorn; /v1/models owned_by local; "
                                                     "no /version"),
                                   (vllm, "0.32.0", "vLLM 0.32.0"), (None, "0.32.0", "vLLM 0.32.0"),
                                   (None, None, "server unknown")):
        rec = hung_run(server, version)
        assert rec.table()[0] == f"kvgate x @ http://127.0.0.1:8000/v1 ({words})"
        assert f"| server | {words} |" in signoff_markdown(validate_summary(rec.summary()))
        assert "version unknown" not in rec.table()[0]


def test_an_interrupt_in_the_preflight_is_incomplete_exit_2_not_a_usage_error():
    # newcomer 2026-12-05: SIGTERM during the preflight exited 2 while summary.json said ERROR, exit 4
    rec = RunRecord("x", None, Redactor(), run_id="20261205T000000Z-abcdef")
    rec.run_error, rec.complete = "interrupted during the preflight (Ctrl-C or SIGTERM); nothing was gated", False
    rec.interrupted_in = "preflight"
    s = rec.summary()
    assert (s["overall"], s["outcome"], s["exit_code"]) == ("INCOMPLETE", "INCOMPLETE", 2), s
    rec.interrupted_in = None  # a usage error proper stays ERROR, exit 4
    s = rec.summary()
    assert (s["overall"], s["outcome"], s["exit_code"]) == ("ERROR", "ERROR", 4), s
