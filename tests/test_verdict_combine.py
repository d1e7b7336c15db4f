"""verdict.combine() fails closed (review F12): the worst part decides in the order FAIL > INVALID >
INCOMPLETE > INCONCLUSIVE > SKIP > PASS, an empty fold is INVALID, an unknown status raises; and what
every current caller folds (PASS, FAIL, SKIP, INVALID parts) still gets what it got."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from kvgate.verdict import Status, Verdict, combine

ORDER = [Status.FAIL, Status.INVALID, Status.INCOMPLETE, Status.INCONCLUSIVE, Status.SKIP, Status.PASS]


def part(name, status, **kw):
    return Verdict(f"g.{name}", status, f"{name} -> {status.value}", measured=1, limit=2, unit="ms", **kw)


@pytest.mark.parametrize("worse,better", list(itertools.combinations(ORDER[:-1], 2)))
def test_the_worse_part_decides_whatever_the_order(worse, better):
    for parts in ([part("a", worse), part("b", better)], [part("b", better), part("a", worse)]):
        v = combine("g", parts + [part("c", Status.PASS)])
        assert v.status is worse and v.message == f"a -> {worse.value}" and len(v.parts) == 3


@pytest.mark.parametrize("status", [Status.INCONCLUSIVE, Status.INCOMPLETE])
def test_an_undecided_or_cut_short_part_is_never_folded_into_a_pass(status):
    # before F12 both folded into PASS: combine('x', [PASS, INCONCLUSIVE]) read PASS
    v = combine("x", [part("ok", Status.PASS), part("open", status, cause="interval straddles the limit")])
    assert v.status is status and v.cause == "interval straddles the limit"
    assert combine("x", [part("s", Status.SKIP), part("cut", Status.INCOMPLETE)]).status is Status.INCOMPLETE


def test_nothing_folded_is_invalid_not_a_pass():
    v = combine("x", [])
    assert v.status is Status.INVALID and "nothing measured" in v.message and v.cause and not v.parts


def test_an_unknown_status_raises():
    odd = dataclasses.replace(part("a", Status.PASS))
    object.__setattr__(odd, "status", "PASSED")  # a plain string, not a Status
    with pytest.raises(ValueError, match="not a kvgate Status"):
        combine("x", [part("b", Status.PASS), odd])


def test_what_current_callers_fold_is_unchanged():
    # every caller (requests, fit, streaming, deployment, api) folds PASS/FAIL/SKIP/INVALID parts
    p, s = part("p", Status.PASS), part("s", Status.SKIP)
    assert combine("x", [p, s]).status is Status.PASS and combine("x", [p, s]).skipped_parts == [s]
    assert combine("x", [s, s]).status is Status.SKIP
    assert combine("x", [p, part("i", Status.INVALID), s]).status is Status.INVALID
    assert combine("x", [part("i", Status.INVALID), part("f", Status.FAIL)]).status is Status.FAIL
    lead = combine("x", [p, part("q", Status.PASS, )], headline="g.q")
    assert lead.status is Status.PASS and lead.message == "p -> PASS; q -> PASS" and lead.measured == 1
