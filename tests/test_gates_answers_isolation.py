"""The answers/isolation case's pure parts (kvgate.answers.isolation's polluters, partings and
rounds with an injected ``ask`` and clock; kvgate.gates.answers.isolation_verdict): identical
answers PASS naming the polluters in flight; a near tie is named, not failed; a change FAILs naming
the polluters in flight, the first differing token and what the confirming rounds showed; a 5xx or
a hang of a polluter FAILs naming it, a 4xx is a refusal; all refused is INVALID; a change beside
plain requests too (the control round) is INCONCLUSIVE. No I/O, no sleeping."""

from __future__ import annotations

import itertools
import threading
from types import SimpleNamespace

from kvgate.answers.isolation import (FALLBACK_IDS, Flight, IsolationObservation, batch_size, changed, observe,
                                      parted, polluters)
from kvgate.answers.observe import Asked
from kvgate.gates.answers import Suspects, isolation_verdict, not_declared
from kvgate.profile.models import AnswersSpec, GoldenExpect, GoldenSpec, IsolationSpec, Profile

from .test_gates_answers import asked

POLLUTERS = ["allowed_token_ids", "logit_bias", "bad_words", "min_tokens"]


def spec(**kw):
    return AnswersSpec(isolation=IsolationSpec(**kw))


def fl(name, a, t0=0.0, t1=1.0, role="victim"):
    return Flight(name, role, a, t0, t1)


def pol(name, t0=0.0, t1=1.0, status=200, error=None):
    a = Asked("chat", False, text="zebra", status=status, error=error, finish_reason="length")
    return Flight(name, "polluter", a, t0, t1)


def observation(victim_answers, *, pols=None, control=None, confirm=None, alone=None):
    """One round: the polluters (all in flight 0..1 s unless given) beside the victims' answers."""
    alone = alone or {"capital-france": asked("Paris is the capital."), "capital-japan": asked("Tokyo is the capital.")}
    pols = [pol(n) for n in POLLUTERS] if pols is None else pols
    rnd = pols + [fl(n, a) for n, a in victim_answers.items()]
    return IsolationObservation(list(alone), alone, [rnd], 6, [42], "/tokenize of ' zebra'", control=control,
                                confirm=confirm or {})


def test_identical_answers_pass_naming_the_polluters_in_flight_and_the_refused():
    pols = [pol("allowed_token_ids"), pol("logit_bias", status=400, error="HTTP 400: logit_bias is not supported"),
            pol("bad_words", t0=2.0, t1=3.0)]  # answered after the victims: not beside them
    o = observation({"capital-france": asked("Paris is the capital."), "capital-japan": asked("Tokyo is the capital.")},
                    pols=pols)
    v = isolation_verdict(spec(), o)
    assert v.status.value == "PASS", v.message
    assert v.message == ("2 goldens answered alone, then 2 times in 1 round of 6 beside 1 polluters in flight "
                         "(allowed_token_ids); refused 4xx: logit_bias (400): every answer equal to its alone-answer "
                         "-> PASS")
    assert (v.measured, v.limit, v.unit) == (0, 0, "changed answers")
    assert v.evidence["refused_4xx"] == {"logit_bias": 400} and v.evidence["allowed_token_ids"] == [42]


def test_a_near_tie_parting_is_named_not_failed():
    alone = asked("Paris is big", ["Paris", " is", " big"], [{"Paris": 0.0}, {" is": 0.0}, {" big": -0.5, " large": -0.55}])
    beside = asked("Paris is large", ["Paris", " is", " large"],
                   [{"Paris": 0.0}, {" is": 0.0}, {" large": -0.5, " big": -0.55}])
    o = observation({"capital-france": beside}, alone={"capital-france": alone})
    v = isolation_verdict(spec(), o)
    assert v.status.value == "PASS"
    assert v.message.endswith("every answer equal to its alone-answer; near ties (<= 0.1 nats) parted capital-france "
                              "(round 1) -> PASS")
    assert v.evidence["near_ties"][0]["difference"]["kind"] == "near-tie"
    assert isolation_verdict(spec(near_tie_logprob=0.01), o).status.value == "FAIL"  # the tolerance decides


def test_a_changed_victim_fails_naming_the_polluters_in_flight_the_token_and_the_confirmed_one():
    zebra = asked("zebra zebra zebra")
    o = observation({"capital-france": zebra, "capital-japan": asked("Tokyo is the capital.")},
                    control=[fl("capital-france", asked("Paris is the capital."))],
                    confirm={"allowed_token_ids": [fl("capital-france", zebra)],
                             "bad_words": [fl("capital-france", asked("Paris is the capital."))]})
    v = isolation_verdict(spec(), o)
    assert v.status.value == "FAIL"
    assert v.message == ("1 of 2 victim answers changed beside polluters beyond a near tie (0.1 nats): capital-france "
                         "(round 1) at token 0: 'Paris' alone vs 'zebra' beside allowed_token_ids, logit_bias, "
                         "bad_words, min_tokens; beside copies of allowed_token_ids alone they changed again; beside "
                         "bad_words alone they did not -> FAIL (a temperature-0 answer must not change with other "
                         "requests' sampling parameters)")
    assert v.cause == ("the per-request sampling state of allowed_token_ids reaches other requests: beside it alone "
                       "the victims changed again, beside plain requests they did not")
    assert (v.measured, v.limit) == (1, 0)
    row = v.evidence["changed"][0]
    assert row["polluters"] == POLLUTERS and row["wave"] == "beside" and row["difference"]["position"] == 0
    # the sampling finding, when measured, is the cause instead (temperature 0 not honoured even alone)
    s = Suspects(sampling="temperature 0 is not honoured")
    assert isolation_verdict(spec(), o, suspects=s).cause == "temperature 0 is not honoured"


def test_only_polluters_whose_times_overlap_the_victims_are_named():
    zebra = asked("zebra zebra zebra")
    pols = [pol("allowed_token_ids", 0.0, 0.5), pol("seed", 0.6, 0.9)]  # the victim runs 0.0..0.55
    o = observation({}, pols=pols)
    o.rounds[0].append(fl("capital-france", zebra, 0.0, 0.55))
    v = isolation_verdict(spec(), o)
    assert "at token 0: 'Paris' alone vs 'zebra' beside allowed_token_ids -> FAIL" in v.message
    assert v.evidence["changed"][0]["polluters"] == ["allowed_token_ids"]
    assert v.cause is None  # no confirming round: nothing measured names a polluter


def test_a_polluter_answered_5xx_or_not_at_all_fails_naming_it():
    pols = [pol("allowed_token_ids"), pol("bad_words", status=500, error="HTTP 500: EngineCore encountered an issue"),
            pol("min_tokens", t1=10.0, status=0, error="ReadTimeout: timed out")]
    v = isolation_verdict(spec(), observation({"capital-france": asked("Paris is the capital.")}, pols=pols))
    assert v.status.value == "FAIL"
    assert v.message == ("2 polluters of 3 answered with a 5xx or not at all (limit 0): bad_words: HTTP 500 after 1.0 s "
                         "(HTTP 500: EngineCore encountered an issue); min_tokens: no answer after 10.0 s (ReadTimeout: "
                         "timed out) -> FAIL (a request the server does not take must be refused 4xx)")
    assert (v.measured, v.limit, v.unit) == (2, 0, "polluters")


def test_every_polluter_refused_is_invalid_not_pass():
    pols = [pol(n, status=400, error="HTTP 400: unsupported") for n in POLLUTERS]
    v = isolation_verdict(spec(), observation({"capital-france": asked("Paris is the capital.")}, pols=pols))
    assert v.status.value == "INVALID"
    assert v.message.startswith("no polluter was served in flight beside a victim (4 sent; refused 4xx: "
                                "allowed_token_ids (400), logit_bias (400)")


def test_a_victim_not_answered_fails_naming_what_was_in_flight():
    v = isolation_verdict(spec(), observation({"capital-france": Asked("chat", False, status=500, error="HTTP 500: boom")}))
    assert v.status.value == "FAIL"
    assert v.message == ("1 victim answers missing (limit 0): capital-france in round 1 beside allowed_token_ids, "
                         "logit_bias, bad_words, min_tokens: HTTP 500: boom -> FAIL")


def test_a_change_beside_plain_requests_too_is_inconclusive():
    zebra = asked("Paris indeed is the capital.")
    o = observation({"capital-france": zebra}, control=[fl("capital-france", zebra)])
    v = isolation_verdict(spec(), o)
    assert v.status.value == "INCONCLUSIVE"
    assert "beside plain temperature-0 requests (the control round) capital-france changed too -> INCONCLUSIVE" in v.message
    assert v.cause == ("the evidence cannot tell: the victims changed beside plain temperature-0 requests too (no "
                       "sampling parameter in flight)")


def test_parted_and_changed():
    a = asked("Paris is the capital.")
    assert parted(a, asked("Paris is the capital."), 0.1) is None
    d = parted(a, asked("Paris was the capital."), 0.1)
    assert (d.kind, d.position, d.base_token, d.new_token) == ("drift", 1, " is", " was")
    # no logprobs: told apart by text
    assert parted(Asked("chat", False, text="x", status=200), Asked("chat", False, text="y", status=200), 0.1).how == "text"
    o = observation({"capital-france": asked("Paris was the capital."), "capital-japan": asked("Tokyo is the capital.")})
    assert [f.name for f, _ in changed(o, o.rounds[0], 0.1)] == ["capital-france"]


# ---------------------------------------------------------------------------- the polluters and the rounds


def profile(isolation=None, **engine):
    return Profile(name="p", model={"served_name": "m", "architecture": {"layers": 2, "attention_heads": 4, "kv_heads": 2,
                                                                        "head_dim": 64}},
                   engine={"max_model_len": 256, **engine},
                   answers={"goldens": [golden("capital-france", "What is the capital of France?"),
                                        golden("capital-japan", "What is the capital of Japan?")],
                            "isolation": {"prompts": 2, **(isolation or {})}})


def golden(name, content):
    return GoldenSpec(name=name, messages=[{"role": "user", "content": content}], expect=GoldenExpect(regex="."))


def test_polluters_follow_the_profile_features():
    base = [p.name for p in polluters(profile(), [7, 8], ["Paris"])]
    assert base == ["allowed_token_ids", "logit_bias", "bad_words", "min_tokens", "json_schema", "n", "seed", "penalties"]
    by = {p.name: p.body for p in polluters(profile(), [7, 8], ["Paris"])}
    assert by["allowed_token_ids"]["allowed_token_ids"] == [7, 8] and by["logit_bias"]["logit_bias"] == {"7": 100, "8": 100}
    assert by["bad_words"]["bad_words"] == ["Paris"] and by["min_tokens"]["min_tokens"] == by["min_tokens"]["max_tokens"] == 8
    assert by["n"]["n"] == 2 and by["n"]["temperature"] > 0  # n > 1 at temperature 0 is refused by vLLM
    p = profile(reasoning_parser="deepseek_r1", enable_lora=True, lora_modules={"a1": "embedded", "a2": "embedded"})
    extra = {x.name: x.body for x in polluters(p, [7], ["Paris"])}
    assert extra["thinking_token_budget"]["thinking_token_budget"] == 2
    assert extra["lora/a1"]["model"] == "a1" and "lora/a2" in extra


def test_batch_is_the_engines_concurrency_unless_declared():
    assert batch_size(profile()) == 8 and batch_size(profile(max_num_seqs=4)) == 4
    assert batch_size(profile(max_num_seqs=256)) == 16
    assert batch_size(profile({"batch": 3}, max_num_seqs=8)) == 3


def test_no_goldens_skips():
    p = profile()
    assert not_declared("isolation", p) is None
    p = Profile(**{**p.model_dump(exclude={"answers"}), "answers": {"goldens": []}})
    assert not_declared("isolation", p).message == ("the profile declares no golden prompts (answers.goldens) -> SKIP")


class Server:
    """An injected ``ask`` for a profile of 2 victims in rounds of 6: the 2 victims are asked alone
    first, then every round's 6 requests meet at a barrier (so each sees its whole round, whatever
    the threads' order); a victim answers its golden's answer, or, ``contaminated``, ``zebra ...``
    when a polluter of its round carries ``allowed_token_ids``."""

    def __init__(self, contaminated=False):
        self.contaminated, self.sent, self.lock = contaminated, [], threading.Lock()
        self.current, self.round = [], []
        self.met = threading.Barrier(6, action=self._close_round)

    def _close_round(self):
        self.round, self.current = self.current, []

    def ask(self, client, route, body, timeout_s=None):
        with self.lock:
            self.sent.append(body)
            alone = len(self.sent) <= 2
            if not alone:
                self.current.append(body)
        if not alone:
            self.met.wait(5)
        if body["messages"][0]["content"].startswith("Name one animal"):
            return Asked("chat", False, text="zebra", status=200, finish_reason="length")
        word = "Paris" if "France" in body["messages"][0]["content"] else "Tokyo"
        if not alone and self.contaminated and any("allowed_token_ids" in b for b in self.round):
            word = "zebra"
        return asked(f"{word} is the capital.")


def ticks():
    count = itertools.count()
    return lambda: float(next(count))


def client_without_tokenize():
    reply = SimpleNamespace(status=404, json=None, text="Not Found", error_message="Not Found")
    return SimpleNamespace(post=lambda *a, **k: reply, chat_template_kwargs=None)


def test_observe_sends_control_and_confirming_rounds_only_after_a_change():
    p = profile(max_num_seqs=6)  # 2 victims + 4 polluters a round: 2 rounds
    s = Server()
    # a clock that ticks at each reading: a round's requests all start (at the barrier) before any ends
    o = observe(client_without_tokenize(), p, p.answers.goldens, clock=ticks(), ask_fn=s.ask)
    # the round of the first polluters (allowlist, bias, bad words, min_tokens) runs last, then its after wave
    assert [[f.name for f in r if f.role == "polluter"] for r in o.rounds] == [
        ["json_schema", "n", "seed", "penalties"], POLLUTERS]
    assert [len(r) for r in o.rounds] == [6, 12] and o.control is None and o.confirm == {}
    assert [f.name for f in o.rounds[1] if f.wave == "after"] == ["capital-france", "capital-japan"] * 3
    assert o.allowed == list(FALLBACK_IDS) and o.allowed_from.startswith("fixed ids (/tokenize answered 404")
    assert len(s.sent) == 2 + 6 + 6 + 6
    bad = Server(contaminated=True)
    o = observe(client_without_tokenize(), p, p.answers.goldens, clock=ticks(), ask_fn=bad.ask)
    assert o.control is not None and len(o.control) == 12  # with its after wave
    assert list(o.confirm) == POLLUTERS  # the polluters in flight beside the changed victims (round 2)
    v = isolation_verdict(p.answers, o)
    assert v.status.value == "FAIL" and "beside copies of allowed_token_ids alone they changed again" in v.message


def test_an_after_wave_victim_is_owed_to_the_polluters_that_ended_before_it():
    """A victim sent once the round ended took the batch rows the polluters left: a change there names
    those that ended before it started (a stale per-row state), not those in flight."""
    o = observation({"capital-france": asked("Paris is the capital.")},
                    pols=[pol("allowed_token_ids", 0.0, 1.0), pol("seed", 0.0, 3.0)])
    o.rounds[0].append(Flight("capital-france", "victim", asked("zebra zebra zebra"), 2.0, 2.5, "after"))
    v = isolation_verdict(spec(), o)
    assert v.status.value == "FAIL"
    assert ("capital-france (round 1, after wave) at token 0: 'Paris' alone vs 'zebra' after allowed_token_ids "
            "(ended before it started) -> FAIL") in v.message
    assert v.evidence["changed"][0]["polluters"] == ["allowed_token_ids"] and v.evidence["changed"][0]["wave"] == "after"
    ok = observation({"capital-france": asked("Paris is the capital.")})
    ok.rounds[0].append(Flight("capital-france", "victim", asked("Paris is the capital."), 2.0, 2.5, "after"))
    v = isolation_verdict(spec(), ok)
    assert v.status.value == "PASS" and v.message.endswith(
        "min_tokens) and 1 times right after the last (in the batch rows it left): every answer equal to its "
        "alone-answer -> PASS")
