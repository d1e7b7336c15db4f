"""The run-wide degeneration scan (kvgate.answers.seen.Seen): strict for answers that ended on
their own, lenient (U+FFFD, control characters) for ignore_eos load and soak outputs; the
degeneration verdict over it; the soak runner hands each round's records to it."""

from types import SimpleNamespace

from kvgate.answers.seen import KEEP, Seen
from kvgate.gates.answers import degeneration_verdict
from kvgate.profile.models import AnswersSpec


def test_strict_answers_are_scanned_for_loops_and_lenient_ones_are_not():
    seen = Seen()
    seen.add("golden/a", "The capital of France is Paris.", "stop")
    seen.add("latency", "the the the the the the the the", "length", strict=False)  # ignore_eos: a loop is fine
    assert seen.found == 0 and seen.strict == 1 and seen.lenient == 1
    seen.add("golden/b", "the the the the the the the the", "length")
    assert seen.found == 1 and "repetition loop" in seen.findings[0]["findings"][0]


def test_lenient_scan_still_catches_replacement_and_control_characters():
    seen = Seen()
    seen.add_records("soak", [SimpleNamespace(status=200, text="caf\ufffd au lait", finish_reason="length"),
                              SimpleNamespace(status=200, text="ok\x07", finish_reason="length"),
                              SimpleNamespace(status=500, text="\ufffd", finish_reason=None)])
    assert seen.lenient == 2 and seen.found == 2 and seen.by_source == {"soak": 2}
    assert "U+FFFD" in seen.findings[0]["findings"][0] and "U+0007" in seen.findings[1]["findings"][0]


def test_findings_are_bounded_but_counted():
    seen = Seen()
    for i in range(KEEP + 10):
        seen.add("latency", "\ufffd", "length", strict=False)
    assert seen.found == KEEP + 10 and len(seen.findings) == KEEP


def test_degeneration_verdict_counts_every_source_and_fails_on_a_load_output():
    spec = AnswersSpec()
    seen = Seen()
    seen.add("golden/a", "The capital of Japan is Tokyo.", "stop")
    seen.add_records("latency", [SimpleNamespace(status=200, text="fine text", finish_reason="length")] * 3)
    v = degeneration_verdict(spec, seen)
    assert v.status.value == "PASS" and "4 answers checked (golden 1, latency 3)" in v.message, v.message
    seen.add_records("soak", [SimpleNamespace(status=200, text="Hang\ufffdul", finish_reason="length")])
    v = degeneration_verdict(spec, seen)
    assert v.status.value == "FAIL" and v.measured == 1 and v.limit == 0 and "soak: 1 U+FFFD" in v.message, v.message


def test_no_strict_answer_is_invalid_not_pass():
    seen = Seen()
    seen.add_records("latency", [SimpleNamespace(status=200, text="x", finish_reason="length")])
    assert degeneration_verdict(AnswersSpec(), seen).status.value == "INVALID"
