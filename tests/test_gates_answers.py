"""The answers gate's pure parts (kvgate.answers.checks, .task, .observe's folding, and the verdicts
of kvgate.gates.answers): expectations, margins, repetition and token soup, the golden rule
(confident flips, fragile flips), accuracy with its interval, determinism's near ties. No I/O, no
sleeping; the whole file runs in well under a second."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from kvgate.answers.checks import (char_diff, clip, degeneration, expectation_match, margin, multibyte_findings,
                                   repetition, soup)
from kvgate.answers.observe import Asked, ask, body_for
from kvgate.answers.task import TaskError, difference_interval, interval, load_task, scored
from kvgate.gates.answers import (GoldenObservation, MemoryObservation, MultibyteObservation, PathsObservation,
                                  RenderingObservation, SamplingObservation, Suspects, accuracy_verdict,
                                  degeneration_verdict, determinism_verdict, golden_verdict, input_paths_verdict,
                                  memory_verdict, multibyte_verdict, not_declared, rendering_cause, sampling_cause,
                                  system_message_verdict, temperature_zero_verdict)
from kvgate.http.rendering import Rendering, first_difference, parting
from kvgate.profile.models import AccuracySpec, AnswersSpec, DeterminismSpec, GoldenExpect, GoldenSpec, Profile
from kvgate.profile.models import load_profile
from kvgate.verdict import Status

from .conftest import MINIMAL


def golden(name="capital-france", regex=r"\bParis\b", margin=2.0, content="What is the capital of France?"):
    return GoldenSpec(name=name, messages=[{"role": "user", "content": content}], expect=GoldenExpect(regex=regex),
                      margin=margin)


def asked(text, tokens=None, top=None, route="chat", stream=False, **kw):
    """An answer; ``tokens`` default to the words of ``text`` (each with its leading space), each
    chosen at 0.0 with one alternative at -3.0 (a 3-nat margin) unless ``top`` says otherwise."""
    if tokens is None:
        words = text.split(" ")
        tokens = [words[0]] + [" " + w for w in words[1:]]
    if top is None:
        top = [{t: 0.0, "<alt>": -3.0} for t in tokens]
    return Asked(route, stream, text=text, tokens=tokens, top=top, finish_reason="stop", status=200, done=stream, **kw)


def failed(status=502, route="chat", stream=False):
    return Asked(route, stream, status=status, error=f"HTTP {status}: Bad Gateway")


# ---------------------------------------------------------------------------- expectations


def test_expectation_regex_is_searched_case_insensitive_and_ends_where_it_matched():
    assert expectation_match(GoldenExpect(regex=r"\bparis\b"), "It is Paris.") == (True, 11, r"/\bparis\b/i")
    assert expectation_match(GoldenExpect(regex=r"\bParis\b"), "Parisian food")[:2] == (False, None)


def test_expectation_choices_are_whole_words_and_the_earliest_decides():
    e = GoldenExpect(choices=["mice", "mouses"])
    assert expectation_match(e, "Mice, or mouses.") == (True, 4, "one of 'mice', 'mouses'")
    assert expectation_match(e, "The micely plural")[0] is False  # not a whole word
    assert expectation_match(e, "mouses then mice")[1] == 6


def test_expectation_exact_is_the_stripped_answer():
    e = GoldenExpect(exact="42")
    assert expectation_match(e, "  42\n")[:2] == (True, 5)
    assert expectation_match(e, "42.") == (False, None, "exactly '42'")


def test_expectation_json_schema_needs_json_valid_against_it():
    e = GoldenExpect(json_schema={"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}})
    assert expectation_match(e, '{"city": "Oslo"}')[:2] == (True, 16)
    assert expectation_match(e, '{"town": "Oslo"}')[0] is False  # valid JSON, against the schema not
    assert expectation_match(e, '{"city": "Oslo"')[0] is False  # not JSON
    assert expectation_match(e, "{}")[2] == "JSON valid against the golden's schema"


def test_expectation_takes_exactly_one_kind():
    with pytest.raises(ValueError, match="exactly one of"):
        GoldenExpect(regex="a", exact="a")
    with pytest.raises(ValueError, match="not a regular expression"):
        GoldenExpect(regex="(")


# ---------------------------------------------------------------------------- margin


def test_margin_is_the_smallest_top1_top2_gap_up_to_where_the_answer_was_decided():
    toks = ["Paris", " is", " big"]
    top = [{"Paris": 0.0, "Lyon": -2.0}, {" is": -0.1, " was": -0.4}, {" big": -0.2, " small": -0.3}]
    assert margin(toks, top, 5) == 2.0  # "Paris" decided it: only its position counts
    assert margin(toks, top, 8) == 0.3  # up to " is"
    assert margin(toks, top, None) == 0.1  # the whole answer
    assert margin(toks, top, 0) == 2.0  # at least the first position
    assert margin(toks, [{"Paris": 0.0}, {}, {" big": 0.0}], None) is None  # never two alternatives


# ---------------------------------------------------------------------------- degeneration


def test_repetition_of_an_ngram_and_of_characters():
    assert repetition("a b a b a b") == (1.0, "a b")
    assert repetition("!!!!!!!!") == (1.0, "!")  # vllm#29341: one "word", a loop of one character
    assert repetition("一年有十二个月。" * 4) == (1.0, "一年有十二个月。")  # a CJK sentence over and over
    assert repetition("The capital of France is Paris, a city on the Seine.") == (0.0, "")
    frac, gram = repetition("Paris is big. Paris is big. Paris is big. And then it ends here with other words")
    assert gram == "Paris is big." and 0.4 < frac < 0.6


def test_degeneration_findings_quote_the_piece_and_name_the_limit():
    assert degeneration("Paris is the capital of France.", "stop") == []
    loop = degeneration("!!!!!!!!", "length")
    assert loop == ["a repetition loop: '!' repeated over 100% of the answer (answers.max_repeat_fraction 50%)"]
    assert degeneration("ab ab ab ab ab ab", "length", max_repeat_fraction=1.0) == []  # at most the limit passes
    fffd = degeneration("Seoul is \ufffd\ufffd the capital", "stop")
    assert fffd == ["2 U+FFFD replacement characters (first at char 9: 'Seoul is \ufffd\ufffd the capital')"]
    assert degeneration("", "length") == ["empty content (finish_reason 'length') where text is due"]
    assert degeneration("", "stop", text_due=False) == []


def test_soup_on_mixed_scripts_and_control_characters():
    assert soup("Paрis is thе capitаl оf Frаnce tоday") == "6 of 7 words mix scripts (e.g. 'Paрis')"
    assert soup("Paris\x07 is the capital").startswith("1 control, surrogate, private-use or unassigned characters "
                                                      "(first U+0007)")
    assert soup("Paris\ue000").startswith("1 control")  # private use


@pytest.mark.parametrize("text", [
    "สวัสดี ครับ วันนี้ อากาศ ดี มาก หนึ่งสัปดาห์มีเจ็ดวัน",  # Thai: vowel marks are marks, not soup
    "🌊 🐟 ⛵ because the sea is full of life and joy 🙂",  # emoji are symbols
    "中文 回答 一年 有 十二 个 月",  # CJK
    "東京は大きい、京都は古い、大阪はにぎやか、奈良は静か、札幌は寒い、那覇は暖かい。",  # kanji with kana in every word
    "カタカナ テスト ひらがな 漢字 混合 日本語です ＡＢＣのテスト",  # katakana, fullwidth Latin beside kana
    "하늘은 파란색 입니다 오늘 날씨 좋아요 韓國語 한자",  # Hangul (and hanja)
    "Das Café in Zürich öffnet um 8 Uhr, naïve façade",  # Latin with diacritics
    "line one\nline two\ttabbed and more words here",  # newlines and tabs are text
])
def test_soup_not_on_text_of_any_script(text):
    assert soup(text) is None
    assert degeneration(text, "stop") == []


def test_multibyte_findings_and_char_diff_quote_the_place():
    assert multibyte_findings("하늘은 파란색") == []
    assert multibyte_findings("하늘\ufffd") == ["1 U+FFFD in '하늘\ufffd'"]
    assert multibyte_findings("a\ud800b") == ["lone surrogates in the text"]
    assert char_diff("abc", "abc") is None
    assert char_diff("Paris is big", "Paris is large") == "at char 9: 'Paris is big' vs 'Paris is large'"
    assert char_diff("x" * 30 + "abc", "x" * 30 + "abd") == "at char 32: 'xxxxxxxxabc' vs 'xxxxxxxxabd'"  # 10 before
    assert clip("a\nb" * 50, 10) == "a\nba\nba..." and repr(clip("a\nb", 10)) == "'a\\nb'"  # !r keeps it one line


# ---------------------------------------------------------------------------- the golden rule


def gobs(spec, text, streamed=None):
    plain = asked(text)
    return GoldenObservation(spec, plain, asked(streamed if streamed is not None else text, stream=True))


def test_golden_all_right_passes_and_measures_the_margin():
    spec = AnswersSpec(goldens=[golden()])
    v = golden_verdict(spec, [gobs(golden(), "Paris is the capital of France.")])
    assert v.status is Status.PASS
    assert v.message == ("1 of 1 goldens right, streamed == non-streamed (e.g. 'What is the capital of France?' -> "
                         "'Paris is the capital of France.') -> PASS")
    assert v.evidence["goldens"]["capital-france"]["margin"] == 3.0
    assert (v.measured, v.limit) == (1, 1)


def test_golden_confident_flip_fails_naming_the_answer_and_the_reference_margin():
    g = golden(margin=2.5)
    v = golden_verdict(AnswersSpec(goldens=[g]), [gobs(g, "Lyon is the capital of France.")])
    assert v.status is Status.FAIL
    assert v.message == ("0 of 1 goldens right; 1 confident flip, 0 fragile (reference margin < 0.5 nats): "
                         "capital-france ('What is the capital of France?' -> 'Lyon is the capital of France.', "
                         "expected /\\bParis\\b/i; reference margin 2.50 nats) -> FAIL (a confident golden must not flip)")
    assert (v.measured, v.limit) == (1, 0)


def test_golden_names_the_turn_a_conversation_asks_in_not_counting_a_system_message():
    sys_g = GoldenSpec(name="s", messages=[{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Capital of France?"}],
                       expect=GoldenExpect(regex="Paris"))
    turn_g = GoldenSpec(name="t", messages=[{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
                                            {"role": "user", "content": "Capital of France?"}],
                        expect=GoldenExpect(regex="Paris"))
    v = golden_verdict(AnswersSpec(goldens=[sys_g, turn_g]), [gobs(sys_g, "Lyon."), gobs(turn_g, "Lyon.")])
    assert "s ('Capital of France?' -> 'Lyon.'" in v.message and "t ('Capital of France? (turn 3)' -> 'Lyon.'" in v.message


def test_golden_without_reference_margin_counts_as_confident():
    g = golden(margin=None)
    v = golden_verdict(AnswersSpec(goldens=[g]), [gobs(g, "Lyon.")])
    assert v.status is Status.FAIL and "reference margin unknown" in v.message and "1 confident flip" in v.message


def test_golden_fragile_flips_within_the_allowance_pass_and_are_named():
    gs = [golden("a", margin=0.2), golden("b", margin=0.1), golden("c", margin=3.0)]
    spec = AnswersSpec(goldens=gs, max_fragile_flips=2)
    v = golden_verdict(spec, [gobs(gs[0], "Lyon."), gobs(gs[1], "Nice."), gobs(gs[2], "Paris.")])
    assert v.status is Status.PASS
    assert v.message.startswith("1 of 3 goldens right; 0 confident flips, 2 fragile (reference margin < 0.5 nats), "
                                "streamed == non-streamed (e.g. 'What is the capital of France?' -> 'Paris.'); fragile flips within 2: a (")
    assert "reference margin 0.20 nats" in v.message and "reference margin 0.10 nats" in v.message


def test_golden_fragile_flips_beyond_the_allowance_fail():
    gs = [golden(n, margin=0.2) for n in "abc"]
    v = golden_verdict(AnswersSpec(goldens=gs, max_fragile_flips=2), [gobs(g, "Lyon.") for g in gs])
    assert v.status is Status.FAIL
    assert v.message.endswith("-> FAIL (3 fragile flips, answers.max_fragile_flips 2)")
    assert "a ('What is the capital of France?' -> 'Lyon.'" in v.message
    assert (v.measured, v.limit) == (3, 2)


def test_golden_confident_margin_is_the_profiles():
    g = golden(margin=0.7)
    spec = AnswersSpec(goldens=[g], confident_margin=1.0, max_fragile_flips=0)
    v = golden_verdict(spec, [gobs(g, "Lyon.")])
    assert v.status is Status.FAIL and "0 confident flips, 1 fragile (reference margin < 1 nats)" in v.message
    assert v.message.endswith("(1 fragile flips, answers.max_fragile_flips 0)")


def test_golden_stream_parting_at_a_near_tie_passes_beyond_fails():
    g = golden()
    spec = AnswersSpec(goldens=[g])
    toks = ["Paris", " is", " big"]
    plain = asked("Paris is big", toks, [{"Paris": 0.0}, {" is": 0.0}, {" big": -0.5, " large": -0.55}])
    tie = asked("Paris is large", ["Paris", " is", " large"], [{"Paris": 0.0}, {" is": 0.0}, {" large": -0.5, " big": -0.55}],
                stream=True)
    v = golden_verdict(spec, [GoldenObservation(g, plain, tie)])
    assert v.status is Status.PASS, v.message
    assert v.evidence["goldens"]["capital-france"]["stream_vs_plain"]["kind"] == "near-tie"
    far = asked("Paris is large", ["Paris", " is", " large"], [{"Paris": 0.0}, {" is": 0.0}, {" large": -0.1, " big": -2.0}],
                stream=True)
    plain_far = asked("Paris is big", toks, [{"Paris": 0.0}, {" is": 0.0}, {" big": -0.1, "x": -3.0}])
    v = golden_verdict(spec, [GoldenObservation(g, plain_far, far)])
    assert v.status is Status.FAIL
    assert v.message == ("1 of 1 goldens right; 1 streamed answers part from the non-streamed ones beyond a near tie "
                         "(0.1 nats): capital-france: streamed at char 9: 'Paris is big' vs 'Paris is large' -> FAIL")


def test_golden_not_answered_fails():
    g = golden()
    v = golden_verdict(AnswersSpec(goldens=[g]), [GoldenObservation(g, failed(), asked("Paris.", stream=True))])
    assert v.status is Status.FAIL
    assert v.message == "0 of 1 goldens right; 1 not answered (limit 0): capital-france: HTTP 502: Bad Gateway -> FAIL"
    broken = Asked("chat", True, text="Par", error="the stream ended without [DONE] after 1 content chunks")
    v = golden_verdict(AnswersSpec(goldens=[g]), [GoldenObservation(g, asked("Paris."), broken)])
    assert v.status is Status.FAIL and "capital-france (streamed): the stream ended without [DONE]" in v.message


def test_golden_with_nothing_asked_is_invalid():
    assert golden_verdict(AnswersSpec(), []).status is Status.INVALID


# ---------------------------------------------------------------------------- accuracy


def rows(k, n, text_right="Paris", text_wrong="Lyon"):
    return [{"id": f"item-{i}", "correct": i < k, "answer": text_right if i < k else text_wrong,
             "expected": r"\bParis\b", "answered": True} for i in range(n)]


def acc_spec(**kw):
    return AnswersSpec(accuracy=AccuracySpec(file="task.jsonl", **kw))


def test_accuracy_against_the_recorded_run_is_a_non_inferiority_test_both_ways():
    # F9: 395/500 vs recorded 400/500 at tolerance 0.1: Newcombe's one-sided lower bound -5.2 >= -8.0 points
    ok = accuracy_verdict(acc_spec(recorded_correct=400, recorded_items=500, tolerance=0.1), rows(395, 500), "t")
    assert ok.status is Status.PASS, ok.message
    assert ok.message.endswith("non-inferior: the difference's 95% one-sided lower bound -5.2 >= -8.0 points "
                               "(limit 72.0%, recorded x (1 - 0.1)) -> PASS")
    assert (ok.measured, ok.limit) == (0.79, 0.72) and ok.evidence["decision"]["decision"] == "PASS"
    bad = accuracy_verdict(acc_spec(recorded_correct=47, recorded_items=65), rows(20, 65), "task.jsonl")
    assert bad.status is Status.FAIL, bad.message
    assert ("worse than the recorded run by more than the tolerance: the difference's 95% one-sided upper bound "
            "-27.5 < -5.8 points (limit 66.5%, recorded x (1 - 0.08)) -> FAIL; e.g. item-20: 'Lyon'") in bad.message


def test_accuracy_above_the_limit_on_the_point_but_not_on_the_bound_is_inconclusive():
    # F9: the old rule PASSed 50/65 on its point (76.9% >= 66.5%); 65 items against 65 cannot resolve 5.8 points
    v = accuracy_verdict(acc_spec(recorded_correct=47, recorded_items=65), rows(50, 65), "task.jsonl")
    assert v.status is Status.INCONCLUSIVE, v.message
    assert v.message.startswith("50 of 65 items right on task.jsonl: accuracy 76.9% (95% CI 64.8%..86.5%); vs "
                                "recorded 47/65 (72.3%): +4.6 points")
    assert ("the difference's 95% one-sided bounds -7.9..+17.0 straddle -5.8 points (limit 66.5%, recorded x "
            "(1 - 0.08)): 65 items cannot tell -> INCONCLUSIVE") in v.message
    assert (v.measured, v.limit) == (round(50 / 65, 4), round(47 / 65 * 0.92, 4))


def test_accuracy_fails_only_when_the_upper_bound_is_below_the_limit():
    v = accuracy_verdict(acc_spec(min_accuracy=0.6), rows(20, 65), "task.jsonl")
    assert v.status is Status.FAIL
    assert "accuracy 30.8% (95% CI 19.9%..43.4%); 95% one-sided upper bound 41.5% < 60.0% " \
           "(answers.accuracy.min_accuracy) -> FAIL; e.g. item-20: 'Lyon'; item-21: 'Lyon'" in v.message
    assert (v.measured, v.limit) == (0.3077, 0.6)


def test_accuracy_below_the_limit_with_an_upper_bound_above_is_inconclusive():
    v = accuracy_verdict(acc_spec(recorded_correct=10, recorded_items=10), rows(8, 10), "task.jsonl")
    assert v.status is Status.INCONCLUSIVE
    assert "bounds -45.9..+5.0 straddle -8.0 points (limit 92.0%, recorded x (1 - 0.08)): 10 items cannot tell" \
        in v.message


def test_accuracy_min_accuracy_wins_over_the_recorded_run_and_passes_on_its_lower_bound():
    v = accuracy_verdict(acc_spec(min_accuracy=0.5, recorded_correct=10, recorded_items=10), rows(6, 10), "t")
    assert v.status is Status.INCONCLUSIVE, v.message  # 60% on the point, but its lower bound 30.4% is below 50%
    assert "95% one-sided bounds 30.4%..85.0% straddle 50.0% (answers.accuracy.min_accuracy)" in v.message
    v = accuracy_verdict(acc_spec(min_accuracy=0.5), rows(9, 10), "t")
    assert v.status is Status.PASS and v.message.endswith(
        "95% one-sided lower bound 60.6% >= 50.0% (answers.accuracy.min_accuracy) -> PASS"), v.message


def test_accuracy_the_embedded_default_passes_its_profile_at_the_accuracy_it_measured():
    # smollm2-cpu measured 47 of 65 (float32; 49 in bfloat16 and with an fp8 KV cache): its floor must PASS it
    prof = load_profile("smollm2-cpu")
    a = prof.answers.accuracy
    v = accuracy_verdict(prof.answers, rows(47, 65), "task.jsonl")
    assert v.status is Status.PASS, v.message
    assert "95% one-sided lower bound 61.8% >= 55.0% (answers.accuracy.min_accuracy) -> PASS" in v.message
    assert (a.recorded_correct, a.recorded_items) == (47, 65) and "vs recorded 47/65" in v.message
    assert accuracy_verdict(prof.answers, rows(43, 65), "t").status is Status.PASS  # 43 is the fewest that PASS
    assert accuracy_verdict(prof.answers, rows(42, 65), "t").status is Status.INCONCLUSIVE
    assert accuracy_verdict(prof.answers, rows(26, 65), "t").status is Status.FAIL


BUDGET_FC = 1 - 0.01 / 9  # verdicts.false_alarm_budget 0.01 over the 9 families: the FAIL side at 99.89%


def test_accuracy_fail_side_at_the_false_alarm_budget_share():
    # 28 of 65 against a 55% floor: the 95% upper bound 54.0% FAILs; at the budget's 99.89% it is 62.5%: undecided
    floor, at = acc_spec(min_accuracy=0.55), rows(28, 65)
    assert accuracy_verdict(floor, at, "t").status is Status.FAIL
    v = accuracy_verdict(floor, at, "t", fail_confidence=BUDGET_FC)
    assert v.status is Status.INCONCLUSIVE, v.message
    assert "bounds 32.6% (95% one-sided lower)..62.5% (99.89% one-sided upper) straddle 55.0%" in v.message
    assert v.evidence["fail_confidence"] == BUDGET_FC and v.evidence["decision"]["fail_confidence"] == BUDGET_FC
    clear = accuracy_verdict(floor, rows(15, 65), "t", fail_confidence=BUDGET_FC)  # 23%: well under half the floor
    assert clear.status is Status.FAIL and "99.89% one-sided upper bound 42.0% < 55.0%" in clear.message
    ok = accuracy_verdict(floor, rows(47, 65), "t")  # the PASS side keeps accuracy.confidence: the same verdict
    assert accuracy_verdict(floor, rows(47, 65), "t", fail_confidence=BUDGET_FC).message == ok.message
    # the non-inferiority test against the recorded run: its upper bound at the budget's level
    rec = acc_spec(recorded_correct=47, recorded_items=65)
    assert accuracy_verdict(rec, rows(30, 65), "t").status is Status.FAIL  # upper bound -12.0 < -5.8 points
    v = accuracy_verdict(rec, rows(30, 65), "t", fail_confidence=BUDGET_FC)
    assert v.status is Status.INCONCLUSIVE and "-38.9 (95% one-sided lower)..+0.1 (99.89% one-sided upper)" in v.message
    bad = accuracy_verdict(rec, rows(15, 65), "t", fail_confidence=BUDGET_FC)
    assert bad.status is Status.FAIL and "99.89% one-sided upper bound -22.6 < -5.8 points" in bad.message
    assert accuracy_verdict(rec, rows(60, 65), "t", fail_confidence=BUDGET_FC).message == \
        accuracy_verdict(rec, rows(60, 65), "t").message
    # no budget (fail_confidence None or the own level): byte-for-byte the old verdict
    assert accuracy_verdict(floor, at, "t", fail_confidence=0.95) == accuracy_verdict(floor, at, "t")


def test_accuracy_without_a_limit_skips_and_mostly_unanswered_is_invalid():
    assert accuracy_verdict(acc_spec(), rows(5, 10), "t").status is Status.SKIP
    half = [{**r, "answered": i > 5, "correct": False} for i, r in enumerate(rows(0, 10))]
    v = accuracy_verdict(acc_spec(min_accuracy=0.5), half, "t")
    assert v.status is Status.INVALID and "6 not answered -> INVALID" in v.message


def test_interval_is_clopper_pearson():
    lo, hi = interval(0, 10)
    assert lo == 0.0 and math.isclose(hi, 1 - 0.025 ** (1 / 10))
    lo, hi = interval(10, 10)
    assert math.isclose(lo, 0.025 ** (1 / 10)) and hi == 1.0
    assert interval(0, 0) == (0.0, 1.0)
    lo, hi = interval(50, 100, 0.99)
    assert lo < 0.5 < hi and interval(50, 100)[0] > lo  # wider at 99%


def test_difference_interval_matches_newcombe_and_is_sane():
    d, lo, hi = difference_interval(56, 70, 48, 80)  # Newcombe (1998) method 10's worked example
    assert math.isclose(d, 0.2) and round(lo, 4) == 0.0524 and round(hi, 4) == 0.3339
    d, lo, hi = difference_interval(40, 50, 40, 50)
    assert d == 0 and lo < 0 < hi and math.isclose(-lo, hi)
    d2, lo2, hi2 = difference_interval(48, 80, 56, 70)  # swapped: mirrored
    assert math.isclose(d2, -0.2) and math.isclose(lo2, -0.3339, abs_tol=1e-4) and math.isclose(hi2, -0.0524, abs_tol=1e-4)
    _, lo, hi = difference_interval(10, 10, 0, 10)  # at the edges: finite, inside [-1, 1]
    assert -1 <= lo <= hi <= 1 and hi == pytest.approx(1.0)
    _, lo_n, hi_n = difference_interval(400, 500, 400, 500)
    assert hi_n - lo_n < (hi - lo) and hi_n - lo_n < 0.11  # more items, narrower


def test_load_task_and_scored(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"id": "a", "question": "Capital of France?", "answer": "\\\\bParis\\\\b"}\n\n'
                 '{"prompt": "One, two,", "answer": "three"}\n'
                 '{"id": "m", "messages": [{"role": "user", "content": "Hi"}], "answer": "hello"}\n')
    items = load_task(p)
    assert [(i.id, i.route) for i in items] == [("a", "chat"), ("item-3", "completions"), ("m", "chat")]
    s = scored(items, ["It is PARIS.", None, "Hello!"])
    assert [r["correct"] for r in s] == [True, False, True] and s[1]["answered"] is False
    p.write_text('{"question": "q", "answer": "("}\n')
    with pytest.raises(TaskError, match=r"t.jsonl:1: answer '\(' is not a regex"):
        load_task(p)
    with pytest.raises(TaskError, match="cannot read it"):
        load_task(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------------------- determinism


def det_spec(**kw):
    return AnswersSpec(determinism=DeterminismSpec(**kw))


def test_determinism_identical_answers_pass():
    a = asked("Paris is big")
    v = determinism_verdict(det_spec(), {"g": [a, asked("Paris is big"), asked("Paris is big")]})
    assert v.status is Status.PASS
    assert v.message == ("1 prompts x 3 answers (alone, then in 2 concurrent batches of 8): at most 1 distinct output "
                         "per prompt -> PASS")


def test_determinism_near_tie_parting_is_named_not_failed():
    alone = asked("Paris is big", ["Paris", " is", " big"], [{"Paris": 0.0}, {" is": 0.0}, {" big": -0.5, " large": -0.55}])
    batch = asked("Paris is large", ["Paris", " is", " large"], [{"Paris": 0.0}, {" is": 0.0}, {" large": -0.5, " big": -0.55}])
    v = determinism_verdict(det_spec(), {"g": [alone, batch, alone]})
    assert v.status is Status.PASS
    assert v.message.endswith("at most 1 distinct output per prompt; near ties (<= 0.1 nats) parted g (1) -> PASS")
    assert v.evidence["prompts"]["g"]["near_ties"] == 1


def test_determinism_near_ties_are_tested_against_every_distinct_answer():
    # F15: with max_distinct 2, a near-tie variant of the *second* distinct answer is that answer, not a third
    alone = asked("Paris", ["Paris"], [{"Paris": 0.0, "Rome": -9.0}])
    other = asked("Rome is big", ["Rome", " is", " big"], [{"Rome": 0.0}, {" is": 0.0}, {" big": -0.5, " large": -0.55}])
    tie = asked("Rome is large", ["Rome", " is", " large"], [{"Rome": 0.0}, {" is": 0.0}, {" large": -0.5, " big": -0.55}])
    v = determinism_verdict(det_spec(max_distinct=2), {"g": [alone, other, tie]})
    assert v.status is Status.PASS, v.message
    assert v.evidence["prompts"]["g"]["distinct"] == 2 and v.evidence["prompts"]["g"]["near_ties"] == 1
    third = asked("Berlin", ["Berlin"], [{"Berlin": 0.0, "Paris": -9.0}])
    v = determinism_verdict(det_spec(max_distinct=2), {"g": [alone, other, tie, third]})
    assert v.status is Status.FAIL and "g: 3 distinct outputs in 4" in v.message, v.message


def test_determinism_distinct_outputs_fail_naming_both_and_the_limit():
    alone = asked("Paris is the capital of France.")
    batch = asked("Paris indeed is the capital of France.")
    v = determinism_verdict(det_spec(), {"g": [alone, batch, alone]})
    assert v.status is Status.FAIL
    assert v.message == ("temperature-0 outputs change under concurrency: g: 2 distinct outputs in 3 ('Paris is the "
                         "capital of France.' alone vs 'Paris indeed is the capital of France.' in a batch of 8); "
                         "answers.determinism.max_distinct 1 -> FAIL")
    assert (v.measured, v.limit) == (2, 1)
    assert determinism_verdict(det_spec(max_distinct=2), {"g": [alone, batch, alone]}).status is Status.PASS


def test_determinism_outputs_alike_in_their_first_40_characters_are_shown_where_they_part():
    # both clipped to 'Paris is the capital of France. (take...' read as the same text; the message shows the parting
    alone, batch = asked("Paris is the capital of France. (take 36)"), asked("Paris is the capital of France. (take 37)")
    v = determinism_verdict(det_spec(), {"g": [alone, batch]})
    assert v.status is Status.FAIL
    assert v.message == ("temperature-0 outputs change under concurrency: g: 2 distinct outputs in 2 (alone vs in a "
                         "batch of 8 at char 39: 'e. (take 36)' vs 'e. (take 37)'); answers.determinism.max_distinct "
                         "1 -> FAIL")


def test_determinism_without_logprobs_any_difference_is_distinct_and_missing_answers_fail():
    v = determinism_verdict(det_spec(), {"g": [asked("a", [], []), asked("b", [], [])]})
    assert v.status is Status.FAIL
    v = determinism_verdict(det_spec(), {"g": [asked("a"), failed()]})
    assert v.status is Status.FAIL and v.message == "1 answers missing (limit 0): g: HTTP 502: Bad Gateway -> FAIL"


# ---------------------------------------------------------------------------- the other cases


def test_degeneration_verdict():
    spec = AnswersSpec()
    v = degeneration_verdict(spec, [("golden/a", "Paris is big.", "stop"), ("golden/b", "!!!!!!!!", "length")])
    assert v.status is Status.FAIL and (v.measured, v.limit) == (1, 0)
    assert v.message.startswith("1 of 2 answers degenerate")
    assert v.message.endswith(": golden/b: a repetition loop: '!' repeated over 100% of the answer "
                              "(answers.max_repeat_fraction 50%) in '!!!!!!!!' -> FAIL (limit 0)")
    assert degeneration_verdict(spec, [("golden/a", "Paris is big.", "stop")]).status is Status.PASS
    assert degeneration_verdict(spec, []).status is Status.INVALID


def mb(name, plain, streamed, temperature=0.0):
    return MultibyteObservation(name, "prompt", temperature, asked(plain), asked(streamed, stream=True))


def test_multibyte_verdict():
    assert multibyte_verdict([mb("cjk", "十二个月", "十二个月")]).status is Status.PASS
    v = multibyte_verdict([mb("hangul", "하늘\ufffd", "하늘\ufffd")])
    assert v.status is Status.FAIL
    assert v.message.startswith("2 multibyte findings (limit 0) in 1 prompt pairs: hangul@t=0 non-streamed: 1 U+FFFD "
                                "in '하늘\ufffd'")
    v = multibyte_verdict([mb("cjk", "十二个月", "十二月", 0.8)])
    assert v.status is Status.FAIL
    assert "cjk@t=0.8: streamed differs from non-streamed at char 2: '十二个月' vs '十二月'" in v.message
    assert multibyte_verdict([]).status is Status.INVALID


def paths(prompt_tokens=None, first_delta=None, ids_text="Paris."):
    text = "<s> <|user|> What is the capital of France? <|assistant|>"
    answers = {"chat": asked("Paris.", prompt_tokens=9), "text": asked("Paris.", route="completions", prompt_tokens=9),
               "ids": asked(ids_text, route="completions", prompt_tokens=prompt_tokens or 9),
               "ids/stream": asked(ids_text, route="completions", stream=True, first_delta=first_delta or "Paris.")}
    return PathsObservation("capital-france", list(range(9)), text, answers)


def test_input_paths_verdict():
    v = input_paths_verdict([paths()])
    assert v.status is Status.PASS
    assert v.message == ("1 conversations, 4 paths each (chat, ids, ids/stream, text): the same prompt_tokens as rendered "
                         "(9), the same temperature-0 answer, no prompt text in a first delta -> PASS")
    v = input_paths_verdict([paths(prompt_tokens=10, ids_text="Lyon.")])
    assert v.status is Status.FAIL
    # nothing measured to compare the count with: no guess at why
    assert v.message.startswith("3 disagreements between input paths (limit 0): capital-france ids: prompt_tokens 10 vs "
                                "9 rendered (+1: matches none of the measured renderings (none measured)); "
                                "capital-france ids answers otherwise than chat at char 0: 'Paris.' vs 'Lyon.'")
    assert v.cause == "the evidence cannot tell: the ids path's count matches none of the measured renderings"
    echo = "<s> <|user|> What is the capital of France? <|assistant|>Paris."
    v = input_paths_verdict([paths(first_delta=echo)])
    assert v.status is Status.FAIL
    assert "capital-france ids/stream: the first streamed delta carries the prompt's text ('<s> <|user|>" in v.message


def rendered(*words, strs=True):
    """A /tokenize rendering of ``words`` (each word one token, ids by position in the fake's style)."""
    ids = tuple(1 if w == "<s>" else 100 + sum(map(ord, w)) for w in words)
    return Rendering(ids, tuple(words) if strs else None)


CONV = ("<s>", "<|user|>", "What", "is", "the", "capital", "of", "France?", "<|assistant|>")


def measured_paths(prompt_tokens, key="ids", echoed=None, system=False, **kw):
    """:func:`paths` with the count of ``key`` off and the renderings the suite measures."""
    o = paths()
    o.answers[key].prompt_tokens = prompt_tokens
    o.rendered_ids = list(rendered(*CONV).ids)
    o.text_plain = rendered(*CONV)
    o.text_special = rendered("<s>", *CONV)
    o.twice = rendered("<s>", "<|user|>", *CONV, "<|assistant|>")
    o.without_system = rendered(*CONV[:1], *CONV[1:-1]) if system else None
    o.echoed = echoed or {}
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def test_input_paths_names_a_second_bos_only_when_the_servers_echo_shows_it():
    bos_then = [1] + list(rendered(*CONV).ids)
    v = input_paths_verdict([measured_paths(10, echoed={"ids": bos_then})])
    assert ("capital-france ids: prompt_tokens 10 vs 9 rendered (+1: a second BOS: the server's prompt, as it echoed "
            "it, is id 1 ('<s>') then the 9 rendered tokens)") in v.message
    assert v.cause == ("a second BOS on the ids path: the server puts the tokenizer's BOS (id 1 ('<s>')) in front of a "
                       "prompt that already begins with the template's")
    # the count alone matches the text with special tokens added: one candidate, named as what was measured
    v = input_paths_verdict([measured_paths(10)])
    assert ("(+1: = the rendered text with the tokenizer's special tokens added once more (id 1 ('<s>') in front))"
            in v.message)
    assert v.cause.startswith("the ids path's count matches one measured rendering: the rendered text with the")
    # an echo whose extra token is not the BOS: named by its id, no BOS claimed
    v = input_paths_verdict([measured_paths(10, echoed={"ids": [7] + list(rendered(*CONV).ids)})])
    assert "has 1 more tokens in front of the 9 rendered (ids 7)" in v.message and "BOS" not in v.message
    assert v.cause == "the server adds 1 tokens in front of a ids prompt"
    v = input_paths_verdict([measured_paths(9, echoed={"ids": [5] * 9})])  # same count, other tokens: no cause
    assert v.status is Status.PASS  # the count agrees; the echo is asked only when it does not


def test_input_paths_counts_that_several_renderings_match_cannot_be_told_apart():
    o = measured_paths(11, twice=rendered(*"abcdefghijk"), text_special=rendered(*"lmnopqrstuv"))
    v = input_paths_verdict([o])
    assert ("capital-france ids: prompt_tokens 11 vs 9 rendered (+2: = the rendered text with the tokenizer's special "
            "tokens added once more and the rendered text rendered again as a user turn (the template applied twice): "
            "the counts cannot tell them apart)") in v.message
    assert v.cause.endswith("the evidence cannot tell them apart")


def test_input_paths_chat_count_of_the_rendering_without_the_system_turn_names_the_system_message():
    o = measured_paths(8, key="chat", system=True)
    v = input_paths_verdict([o])
    assert "capital-france chat: prompt_tokens 8 vs 9 rendered (-1: = the rendering without the system turn)" in v.message
    assert v.cause == ("the system message never reached the server (a gateway dropping it?); the server rendered 8 "
                       "tokens = the rendering without it")


def test_input_paths_answers_that_differ_carry_the_sampling_cause_counts_their_own():
    s = Suspects(sampling="temperature 0 is not honoured: ...", rendering="the chat template drops roles: ...")
    v = input_paths_verdict([paths(ids_text="Lyon.")], suspects=s)
    assert v.status is Status.FAIL and v.cause == "temperature 0 is not honoured: ..."
    v = input_paths_verdict([paths(first_delta="<s> <|user|> What is the capital of France? <|assistant|>")],
                            suspects=s)
    assert v.status is Status.FAIL and v.cause is None  # an echoed prompt is not the sampling's doing


# ---------------------------------------------------------------------------- the cases that measure causes


def twice(a, b):
    return SamplingObservation("capital-france", 24, a, b)


def test_temperature_zero_the_same_text_twice_passes():
    v = temperature_zero_verdict(twice(asked("Paris is the capital."), asked("Paris is the capital.")))
    assert v.status is Status.PASS and v.cause is None
    assert v.message == ("capital-france asked twice alone at temperature 0 (max_tokens 24): the same 4 tokens both "
                         "times ('Paris is the capital.') -> PASS")


def test_temperature_zero_two_texts_fail_naming_the_sampling_and_the_first_differing_token():
    v = temperature_zero_verdict(twice(asked("Paris is the capital."), asked("Paris is a city.")))
    assert v.status is Status.FAIL and (v.measured, v.limit, v.unit) == (2, 1, "outputs")
    assert v.message == ("capital-france asked twice alone at temperature 0 (max_tokens 24): different text, first "
                         "difference at token 2: ' the' vs ' a' ('Paris is the capital.' vs 'Paris is a city.') -> FAIL")
    assert v.cause == ("temperature 0 is not honoured: the same request answered twice alone gave different text "
                       "(first difference at token 2)")
    assert sampling_cause(v) == v.cause
    # without logprobs: by character
    v = temperature_zero_verdict(twice(asked("ab", tokens=[], top=[]), asked("ac", tokens=[], top=[])))
    assert "first difference at char 1 (no logprobs)" in v.message and v.cause.endswith("(first difference at char 1)")


@pytest.mark.parametrize("field, a, b, named", [
    ("system_fingerprint", "fp_1", "fp_2", "system_fingerprint 'fp_1' vs 'fp_2'"),
    ("prompt_tokens", 37, 33, "prompt_tokens 37 vs 33"),
    ("model", "m-v1", "m-v2", "model 'm-v1' vs 'm-v2'"),
    ("identity", {"x-kserve-revision": "r1"}, {"x-kserve-revision": "r2"}, "header x-kserve-revision 'r1' vs 'r2'"),
])
def test_temperature_zero_answers_that_differ_in_who_answered_name_more_than_one_deployment(field, a, b, named):
    v = temperature_zero_verdict(twice(asked("Paris is the capital.", **{field: a}), asked("Paris is a city.", **{field: b})))
    assert v.status is Status.FAIL and f"; the answers also differ in {named} -> FAIL" in v.message
    assert v.cause == ("more than one deployment answers behind the endpoint (a canary split?): two answers to the "
                       f"same request differ in {named}")


def test_temperature_zero_without_a_measurement_is_invalid_a_missing_answer_fails():
    assert temperature_zero_verdict(None).status is Status.INVALID
    v = temperature_zero_verdict(twice(asked("", tokens=[], top=[]), asked("", tokens=[], top=[])))
    assert v.status is Status.INVALID and "both answers empty" in v.message
    v = temperature_zero_verdict(twice(asked("Paris."), failed()))
    assert v.status is Status.FAIL and "1 answer missing (limit 0): second: HTTP 502: Bad Gateway" in v.message
    assert v.cause is None and sampling_cause(v) is None


def sysobs(served, with_system, without, as_user=None, name="system/capital-japan"):
    return RenderingObservation(name, with_system, without, as_user or rendered("<s>", "<|user|>", "S", "U"),
                                served=served)


W = rendered("<s>", "<|system|>", "Be", "brief.", "<|user|>", "Capital?", "<|assistant|>")
WO = rendered("<s>", "<|user|>", "Capital?", "<|assistant|>")


def test_system_message_the_rendering_with_it_passes_without_it_fails():
    v = system_message_verdict(sysobs(7, W, WO))
    assert v.status is Status.PASS and v.message == ("system/capital-japan: the server counted 7 prompt tokens = the "
                                                     "rendering with the system turn (7 with the system turn, 4 "
                                                     "without) -> PASS")
    v = system_message_verdict(sysobs(4, W, WO))
    assert v.status is Status.FAIL and (v.measured, v.limit) == (4, 7)
    assert v.message.startswith("system/capital-japan: the server counted 4 prompt tokens = the rendering without the "
                                "system turn (7 with the system turn, 4 without) -> FAIL")
    assert v.cause == ("the system message never reached the server (a gateway dropping it?); the server rendered 4 "
                       "tokens = the rendering without it")
    assert rendering_cause(sysobs(4, W, WO)) == v.cause and rendering_cause(sysobs(7, W, WO)) is None


def test_system_message_a_template_rendering_it_away_fails_counts_that_cannot_tell_are_inconclusive():
    v = system_message_verdict(sysobs(4, WO, WO))
    assert v.status is Status.FAIL and "renders the conversation with and without its system turn to the same 4"         in v.message
    assert v.cause == ("the chat template drops the system message: /tokenize renders the conversation with and "
                       "without its system turn to the same 4 tokens")
    same_len = rendered("<s>", "<|user|>", "Other", "<|assistant|>", "x", "y", "z")
    v = system_message_verdict(sysobs(7, W, same_len))
    assert v.status is Status.INCONCLUSIVE and v.cause == "the evidence cannot tell: both renderings are 7 tokens long"
    v = system_message_verdict(sysobs(9, W, WO))
    assert v.status is Status.INCONCLUSIVE and "the server counted 9 prompt tokens, neither rendering" in v.message
    assert v.cause.startswith("the evidence cannot tell: the server's count matches neither rendering")


def test_system_message_without_tokenize_skips_without_a_count_is_invalid():
    v = system_message_verdict(sysobs(7, Rendering(error="/tokenize answered 404: Not Found"), WO))
    assert v.status is Status.SKIP and "(/tokenize answered 404: Not Found)" in v.message
    assert system_message_verdict(sysobs(None, W, WO)).status is Status.INVALID


def test_rendering_cause_names_a_template_that_renders_roles_alike():
    flat = rendered("<s>", "Be", "brief.", "Capital?")
    cause = rendering_cause(RenderingObservation(None, flat, rendered("<s>", "Capital?"), flat))
    assert cause == ("the chat template drops roles: /tokenize renders a system turn and a user turn alike (4 tokens "
                     "either way: '<s> Be brief. Capital?'): the model cannot tell who said what")
    healthy = RenderingObservation(None, W, WO, rendered("<s>", "<|user|>", "Be", "brief.", "<|user|>", "Capital?",
                                                         "<|assistant|>"))
    assert rendering_cause(healthy) is None
    assert rendering_cause(RenderingObservation(None, Rendering(error="x"), WO, WO)) is None


def test_first_difference_and_parting_of_two_renderings():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1 and first_difference([1, 2], [1, 2, 3]) == 2
    assert parting(W, WO) == (1, "'<|system|>'", "'<|user|>'")
    assert parting(rendered("a", "b", strs=False), rendered("a", strs=False)) == (1, f"id {100 + ord('b')}", "the end")
    # shown as the text the token strings spell: byte-level BPE and SentencePiece marks, else words
    assert Rendering((1, 2, 3, 4), ("You", "\u0120are", "\u010a", "What")).text() == "You are\nWhat"
    assert Rendering((1, 2), ("\u2581Be", "\u2581brief")).text() == " Be brief"
    assert W.text(3) == "<s> <|system|> Be" and Rendering((1,)).text() is None


def test_suspects_are_the_cause_of_the_fails_they_explain_and_only_those():
    s = Suspects(sampling="temperature 0 is not honoured: X", rendering="the chat template drops roles: Y")
    both = "temperature 0 is not honoured: X; the chat template drops roles: Y"
    g = golden(margin=2.5)
    assert golden_verdict(AnswersSpec(goldens=[g]), [gobs(g, "Lyon.")], suspects=s).cause == both
    unanswered = golden_verdict(AnswersSpec(goldens=[g]), [GoldenObservation(g, failed(), asked("P", stream=True))],
                                suspects=s)
    assert unanswered.status is Status.FAIL and unanswered.cause is None  # a 502 is no sampling's doing
    assert golden_verdict(AnswersSpec(goldens=[g]), [gobs(g, "Paris.")], suspects=s).cause is None  # PASS: none
    assert determinism_verdict(det_spec(), {"g": [asked("Paris."), asked("Paris indeed.")]}, suspects=s).cause == \
        "temperature 0 is not honoured: X"
    assert memory_verdict([MemoryObservation(golden(), asked("Lyon."))], suspects=s).cause == both
    assert memory_verdict([MemoryObservation(golden(), failed())], suspects=s).cause is None
    assert multibyte_verdict([mb("cjk", "十二个月", "十二月", 0.8)], suspects=s).cause == "temperature 0 is not honoured: X"
    assert multibyte_verdict([mb("cjk", "a\ufffd", "a\ufffd")], suspects=s).cause is None
    assert degeneration_verdict(AnswersSpec(), [("s", "!!!!!!!!", "length")], suspects=s).cause == both
    assert accuracy_verdict(acc_spec(min_accuracy=0.9), rows(0, 20), "t", suspects=s).cause == both
    assert accuracy_verdict(acc_spec(min_accuracy=0.9), rows(0, 20), "t").cause is None
    low = accuracy_verdict(acc_spec(min_accuracy=0.9), rows(8, 10), "t")
    assert low.status is Status.INCONCLUSIVE and low.cause.startswith("the evidence cannot tell: 10 items are too few")


def test_memory_verdict():
    g = GoldenSpec(name="name-alice", messages=[{"role": "user", "content": "My name is Alice."},
                                                {"role": "assistant", "content": "Hello Alice."},
                                                {"role": "user", "content": "What is my name?"}],
                   expect=GoldenExpect(regex=r"\bAlice\b"))
    assert memory_verdict([MemoryObservation(g, asked("It is Alice."))]).status is Status.PASS
    v = memory_verdict([MemoryObservation(g, asked("I do not know."))])
    assert v.status is Status.FAIL
    assert v.message == ("1 of 1 answers forget an earlier turn (limit 0): name-alice: turn 1 said 'My name is Alice.'; "
                         "asked 'What is my name? (turn 3)' -> 'I do not know.', expected /\\bAlice\\b/i -> FAIL")


def fail_verdicts():
    """One FAIL of every kind the gate gives, with the fragments naming its measured value and its limit."""
    g = golden(margin=2.5)
    fr = [golden(n, margin=0.2) for n in "abc"]
    alone, batch = asked("Paris."), asked("Paris indeed.")
    return [
        (golden_verdict(AnswersSpec(goldens=[g]), [gobs(g, "Lyon.")]), ["1 confident flip", "-> 'Lyon.'",
                                                                        "reference margin < 0.5 nats"]),
        (golden_verdict(AnswersSpec(goldens=fr), [gobs(x, "Lyon.") for x in fr]),
         ["3 fragile flips", "answers.max_fragile_flips 2"]),
        (golden_verdict(AnswersSpec(goldens=[g]), [GoldenObservation(g, failed(), asked("P", stream=True))]),
         ["1 not answered (limit 0)"]),
        (accuracy_verdict(acc_spec(min_accuracy=0.9), rows(0, 20), "t"), ["accuracy 0.0%", "95% one-sided upper bound 13.9% < 90.0%"]),
        (degeneration_verdict(AnswersSpec(), [("s", "!!!!!!!!", "length")]),
         ["1 of 1 answers degenerate", "over 100%", "answers.max_repeat_fraction 50%"]),
        (multibyte_verdict([mb("cjk", "a\ufffd", "a\ufffd")]), ["2 multibyte findings (limit 0)"]),
        (input_paths_verdict([paths(prompt_tokens=10)]), ["1 disagreements between input paths (limit 0)",
                                                          "prompt_tokens 10 vs 9 rendered"]),
        (memory_verdict([MemoryObservation(golden(), asked("Lyon."))]), ["1 of 1 answers forget an earlier turn (limit 0)",
                                                                          "'Lyon.', expected /\\bParis\\b/i"]),
        (determinism_verdict(det_spec(), {"g": [alone, batch]}), ["2 distinct outputs in 2",
                                                                  "answers.determinism.max_distinct 1"]),
        (temperature_zero_verdict(twice(alone, batch)), ["different text, first difference at token 0"]),
        (system_message_verdict(sysobs(4, W, WO)), ["the server counted 4 prompt tokens", "7 with the system turn"]),
    ]


@pytest.mark.parametrize("i", range(11))
def test_every_fail_names_its_measured_value_and_limit(i):
    v, fragments = fail_verdicts()[i]
    assert v.status is Status.FAIL and "-> FAIL" in v.message, v.message
    assert v.measured is not None and v.limit is not None, v
    for f in fragments:
        assert f in v.message, (f, v.message)
    assert v.to_summary()["limit"]["value"] is not None


def test_cases_the_profile_does_not_declare_skip(write_profile):
    bare = Profile.model_validate({"name": "p", **__import__("yaml").safe_load(MINIMAL)})
    assert not_declared("golden", bare).status is Status.SKIP
    assert "no answers section" in not_declared("multibyte", bare).message
    with_goldens = bare.model_copy(update={"answers": AnswersSpec(goldens=[golden()])})
    assert not_declared("golden", with_goldens) is None and not_declared("multibyte", with_goldens) is None
    assert "answers.memory" in not_declared("multi-turn", with_goldens).message
    assert "answers.accuracy" in not_declared("accuracy", with_goldens).message
    assert "answers.goldens" in not_declared("determinism", bare.model_copy(update={"answers": AnswersSpec()})).message
    assert "answers.goldens" in not_declared("temperature-zero", bare.model_copy(update={"answers": AnswersSpec()})).message
    assert not_declared("temperature-zero", with_goldens) is None
    assert "no golden with a system turn" in not_declared("system-message", with_goldens).message
    sys_golden = GoldenSpec(name="s", messages=[{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": "Capital of France?"}],
                            expect=GoldenExpect(regex="Paris"))
    assert not_declared("system-message", bare.model_copy(update={"answers": AnswersSpec(goldens=[sys_golden])})) is None


# ---------------------------------------------------------------------------- asking


class StubClient:
    """Records the bodies :func:`ask` posts; answers one chat completion."""

    def __init__(self, chat_template_kwargs=None):
        self.chat_template_kwargs = chat_template_kwargs
        self.bodies = []

    def api(self, path):
        return "/v1" + path

    def post(self, path, body, timeout_s=None):
        self.bodies.append(body)
        doc = {"choices": [{"message": {"content": "Paris."}, "finish_reason": "stop",
                            "logprobs": {"content": [{"token": "Paris.", "logprob": 0.0,
                                                      "top_logprobs": [{"token": "Paris.", "logprob": 0.0},
                                                                       {"token": "Lyon.", "logprob": -3.0}]}]}}],
               "usage": {"prompt_tokens": 9}}
        return SimpleNamespace(status=200, json=doc, text="", error_message="")


def test_ask_folds_the_answer_and_sends_the_profiles_chat_template_kwargs():
    client = StubClient({"enable_thinking": False})
    body = body_for("chat", "m", messages=[{"role": "user", "content": "q"}], max_tokens=8)
    a = ask(client, "chat", body)
    assert (a.ok, a.text, a.tokens, a.top, a.prompt_tokens) == (True, "Paris.", ["Paris."],
                                                                [{"Paris.": 0.0, "Lyon.": -3.0}], 9)
    assert client.bodies[-1]["chat_template_kwargs"] == {"enable_thinking": False}
    assert client.bodies[-1]["logprobs"] is True and client.bodies[-1]["top_logprobs"] == 5
    ask(client, "chat", {**body, "chat_template_kwargs": {"x": 1}})  # a body's own win
    assert client.bodies[-1]["chat_template_kwargs"] == {"x": 1}
    ask(client, "completions", body_for("completions", "m", prompt=[1, 2], logprobs=None))
    assert "chat_template_kwargs" not in client.bodies[-1] and "logprobs" not in client.bodies[-1]
    ask(StubClient(), "chat", body)
    assert body.get("chat_template_kwargs") is None  # the caller's body is not changed


# ------------------------------------------------------------------ long context (pass-key retrieval)
from kvgate.answers.needle import NeedleObservation, NeedlePrompt, build, compose, keys, retrieved, targets  # noqa: E402
from kvgate.gates.answers import long_context_verdict  # noqa: E402
from kvgate.profile.models import LongContextSpec  # noqa: E402


def test_needle_prompts_are_exact_with_the_key_at_its_depth_and_keys_distinct_from_the_seed():
    spec = LongContextSpec()
    assert targets(spec, 1024) == [(0.5, 512), (0.9, 921)]
    assert targets(spec, 100) == [(0.5, 50), (0.9, 90)]  # at most max_model_len - max_tokens - 1
    ks = keys(spec, 6)
    assert len(set(ks)) == 6 and all(len(k) == 5 and k[0] != "0" for k in ks)
    assert keys(spec, 6) == ks and keys(LongContextSpec(seed=1), 6) != ks  # the seed decides the prompts

    def count(text):  # a word tokenizer with a BOS, as the fake's /tokenize counts
        return len(text.split()) + 1

    p, words = build(count, spec, 0.5, 300, 0.5, "12345", "completions")
    assert p.tokens == 300 == count(p.text) and p.cell == "300 tokens at depth 50%" and words > 200
    assert p.text.startswith(spec.intro) and p.text.endswith("\nWhat is the pass key? The pass key is")
    filler_words = p.text.count(" ") - count(spec.intro + " " + spec.needle + " " + spec.question) + 3
    assert abs(p.key_at - (count(spec.intro) + filler_words // 2)) <= 2  # the needle half way through the filler
    text, before = compose(spec, "a b c d", 0.0, "777")
    assert before == spec.intro and text == f"{spec.intro} The pass key is 777. Remember it. 777 is the pass key. a b c d" \
        f"\n{spec.question}"
    assert retrieved("12345", " 12345.") and retrieved("12345", "The key is 12345") and not retrieved("12345", "123456")
    assert not retrieved("12345", " 1234 5")


def _needle(tokens, depth, plain, streamed=None, served=None, key="12345"):
    p = NeedlePrompt("...", tokens, "completions", 0.5, depth, key, key_at=int(tokens * depth))

    def asked(text, stream):
        if text is None:
            return Asked("completions", stream, error="HTTP 500: boom", status=500)
        return Asked("completions", stream, text=text, status=200, prompt_tokens=served or tokens)

    return NeedleObservation(p, asked(plain, False), asked(plain if streamed is None else streamed, True))


def _grid(miss=(), served=None, streamed_miss=()):
    out = []
    for n in (512, 921):
        for d in (0.1, 0.5, 0.9):
            plain = " unknown." if (n, d) in miss else " 12345."
            streamed = " unknown." if (n, d) in miss or (n, d) in streamed_miss else " 12345."
            out.append(_needle(n, d, plain, streamed, served))
    return out


def test_long_context_passes_with_a_scattered_miss_named_and_fails_a_depth_lost_at_every_length():
    spec = LongContextSpec()
    v = long_context_verdict(spec, _grid(), 1024)
    assert v.status is Status.PASS and v.measured == 1.0 and v.limit == 0.5 and v.cause is None
    assert v.message == ("pass key retrieved in 12 of 12 answers (6 prompts of 512 and 921 tokens, 50% and 90% of "
                         "max_model_len 1024, at depths 10/50/90%, completions, streamed and not): every depth "
                         "retrieved, 100% >= min_retrieved 50% -> PASS")
    # one cell missed (what SmolLM2 does about once in 12): named, not failed -- its depth holds at the other length
    v = long_context_verdict(spec, _grid(miss={(921, 0.1)}), 1024)
    assert v.status is Status.PASS and "10 of 12" in v.message
    assert v.message.endswith("not retrieved: 921 tokens at depth 10% (non-streamed, streamed: ' unknown.') -> PASS")
    # the same depth missed at both lengths: a region the model does not read
    v = long_context_verdict(spec, _grid(miss={(512, 0.1), (921, 0.1)}), 1024)
    assert v.status is Status.FAIL and v.cause is None, v.message
    assert ("not retrieved: depth 10% at no length, streamed or not (512 tokens, key at token 51: ' unknown.'; 921 "
            "tokens, key at token 92: ' unknown.')") in v.message
    # only the streamed path loses it: named as the streamed path's
    v = long_context_verdict(spec, _grid(streamed_miss={(512, 0.5), (921, 0.5)}), 1024)
    assert v.status is Status.FAIL and "depth 50% at no length, streamed (512 tokens" in v.message
    # the server counted fewer prompt tokens than were sent: the measured cause
    v = long_context_verdict(spec, _grid(miss={(512, 0.1), (921, 0.1)}, served=300), 1024)
    assert v.cause == ("the prompt was shortened before the model: the server counted 300 prompt tokens of the "
                       "512-token prompt sent (512 tokens at depth 10%, non-streamed)")


def test_long_context_fails_below_min_retrieved_a_missing_answer_and_is_invalid_without_prompts():
    spec = LongContextSpec(min_retrieved=0.75)
    # every depth read at one length, but only 6 of 12 answers: below 75%
    v = long_context_verdict(spec, _grid(miss={(921, 0.1), (921, 0.5), (921, 0.9)}), 1024)
    assert v.status is Status.FAIL and v.measured == 0.5 and v.limit == 0.75
    assert "6 of 12 answers" in v.message and "50% < answers.long_context.min_retrieved 75%" in v.message
    obs = _grid()
    obs[2] = _needle(512, 0.9, None)
    v = long_context_verdict(spec, obs, 1024)
    assert v.status is Status.FAIL and v.message.startswith("2 pass-key answers missing (limit 0): 512 tokens at "
                                                            "depth 90% (non-streamed): HTTP 500: boom")
    assert long_context_verdict(spec, [], 1024).status is Status.INVALID


def test_accuracy_recorded_difference_is_context_only_when_min_accuracy_decides():
    # min_accuracy decides: the "vs recorded" interval is shown and says it is not judged
    v = accuracy_verdict(acc_spec(min_accuracy=0.5, recorded_correct=10, recorded_items=10), rows(9, 10), "t")
    assert v.status is Status.PASS, v.message
    assert "vs recorded 10/10" in v.message and "(context, not judged: answers.accuracy.min_accuracy decides)" in v.message
    assert v.evidence["recorded"]["judged"] is False
    # the recorded run decides: its comparison is the verdict, not context
    v = accuracy_verdict(acc_spec(recorded_correct=400, recorded_items=500, tolerance=0.1), rows(395, 500), "t")
    assert "vs recorded 400/500" in v.message and "not judged" not in v.message
    assert "judged" not in v.evidence["recorded"]
