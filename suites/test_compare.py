"""Gate: compare (``-m compare``; runs by itself when a baseline is given or the run records). The
new revision against the one it replaces, the same requests to both: the golden prompts render to
the same tokens (``/tokenize`` and the servers' prompt counts), judged before the answers and the
cause of those that drift with them; its temperature-0 answers to the golden set part from the
baseline's only at near ties; its TTFT / ITL / e2e percentiles are
not slower beyond ``compare.max_regression`` (interleaved pairs, a live baseline only); every
features case that passed on the baseline passes on it; every depth at which the baseline retrieved
a pass key hidden in a long prompt is retrieved by it. Every run of this gate writes its own
golden answers to golden.json, so its reports can be a later run's baseline."""

import pytest

from kvgate.answers.needle import observe as observe_needles
from kvgate.compare.baseline import (LiveBaseline, RecordedBaseline, answer_both, features_statuses, render_prompts,
                                    sized_text)
from kvgate.compare.contract import CONTRACT_GATES, record_of
from kvgate.compare.golden import GOLDEN_FILE, golden_set, long_prompt_tokens, write_golden
from kvgate.compare.latency import Pairs, take_pairs, timed
from kvgate.gates.compare import (contract_verdict, features_verdict, latency_decisions, latency_verdict,
                                  long_context_verdict, no_baseline_verdict, outputs_verdict, rendering_changes, rendering_verdict)
from kvgate.gates.features import cases as feature_cases
from kvgate.http.prompts import PromptUnavailable
from kvgate.run.session import current
from kvgate.stats.confidence import plan_looks, sample_until_decided


class Golden:
    """This run's golden prompts, the new endpoint's answers and the baseline's (none when recording
    without one), each side's renderings of them, saved to golden.json (features statuses added
    when that case has run)."""

    def __init__(self, run, prompts, new, base, logprobs, new_r, base_r):
        self.run, self.prompts, self.new, self.base, self.logprobs = run, prompts, new, base, logprobs
        self.new_r, self.base_r = new_r, base_r
        self.features, self.contract, self.long_context = {}, {}, []

    def save(self):
        rec = self.run.record
        return write_golden(self.run.reports_dir / GOLDEN_FILE, run_id=rec.run_id, profile=self.run.profile.name,
                            endpoint=rec.endpoint, server_version=rec.server_version,
                            model=self.run.profile.model.served_name, prompts=self.prompts, answers=self.new,
                            features=self.features, logprobs=self.logprobs, redact=self.run.redactor.text,
                            contract=self.contract, renderings=self.new_r, long_context=self.long_context)


@pytest.fixture(scope="module")
def golden(request, pytestconfig, kvgate_profile, kvgate_baseline):
    """The golden prompts (a recorded baseline's own, else built for this profile, the long one
    against the server's tokenizer) answered by the new endpoint and a live baseline, one request
    at a time, alternating, then rendered by each side's /tokenize (up to slo.concurrency at once);
    None when there is no baseline and the run does not record (the new endpoint's client is asked
    for only then: ``-m compare`` alone starts no server)."""
    base, base_client, _ = kvgate_baseline
    st, profile = current(pytestconfig), kvgate_profile
    if GOLDEN_KEY in st.extra:  # the contract case runs last, in its own module turn: the same answers
        return st.extra[GOLDEN_KEY]
    if base is None and st.record.gate_mode != "record":
        return None  # nothing to compare with: nothing is sent
    kvgate_client = request.getfixturevalue("kvgate_client")
    model, t, c = profile.model.served_name, profile.limits.canary_deadline_s, profile.slo.concurrency
    if isinstance(base, RecordedBaseline):
        prompts, base_answers = base.golden.prompts, base.golden.answers
        new, _, logprobs = answer_both(kvgate_client, None, prompts, model, profile, t)
        base_r = base.golden.renderings
    else:
        prompts = golden_set(profile, sized_text(kvgate_client, model, long_prompt_tokens(profile)))
        new, base_answers, logprobs = answer_both(kvgate_client, base_client, prompts, model, profile, t)
        base_r = render_prompts(base_client, prompts, model, c) if base_client is not None else {}
    g = Golden(st, prompts, new, base_answers, logprobs, render_prompts(kvgate_client, prompts, model, c), base_r)
    g.save()
    st.extra[GOLDEN_KEY] = g
    return g


def _answers_causes(causes) -> str | None:
    """What the answers gate measured of this server's sampling and rendering, when it ran."""
    return "; ".join(c for c in (causes.get("sampling"), causes.get("rendering")) if c) or None


@pytest.mark.compare
@pytest.mark.gate("compare", cases=["rendering"])
def test_prompts_render_as_on_the_baseline(case, golden, kvgate_baseline, kvgate_answer_causes, kvgate_gate):
    base, _, why = kvgate_baseline
    if base is None:
        recorded = f"; this run's renderings of its {len(golden.prompts)} golden prompts are in {GOLDEN_FILE}" \
            if golden else ""
        assert kvgate_gate(no_baseline_verdict(case, why + recorded)).passed
        return
    verdict = rendering_verdict(golden.prompts, golden.base, golden.new, golden.base_r, golden.new_r, base.label,
                                kvgate_answer_causes.get("rendering"))
    assert kvgate_gate(verdict).passed


@pytest.mark.compare
@pytest.mark.gate("compare", cases=["outputs"])
def test_outputs_part_from_the_baseline_only_at_near_ties(case, golden, kvgate_baseline, kvgate_profile, kvgate_gate,
                                                          kvgate_answer_causes):
    base, _, why = kvgate_baseline
    if base is None:
        recorded = f"; this run's {len(golden.new)} golden answers are in {GOLDEN_FILE}" if golden else ""
        assert kvgate_gate(no_baseline_verdict(case, why + recorded)).passed
        return
    logprobs = golden.logprobs and (not isinstance(base, RecordedBaseline) or bool(base.golden.answers) and
                                    any(a.tokens for a in base.golden.answers.values()))
    changed, _, _ = rendering_changes(golden.prompts, golden.base, golden.new, golden.base_r, golden.new_r)
    verdict = outputs_verdict(kvgate_profile, golden.prompts, golden.base, golden.new, base.label, logprobs,
                              changed=changed, suspects=_answers_causes(kvgate_answer_causes))
    assert kvgate_gate(verdict).passed


@pytest.mark.compare
@pytest.mark.gate("compare", cases=["latency"])
def test_latency_not_slower_than_the_baseline(case, request, kvgate_baseline, kvgate_profile, kvgate_gate):
    base, base_client, why = kvgate_baseline
    if not isinstance(base, LiveBaseline):
        why = why if base is None else (f"the {base.label} holds no latency measured beside this run's: latency is "
                                        "compared with a live baseline only (--baseline URL), in interleaved pairs")
        assert kvgate_gate(no_baseline_verdict(case, why)).passed
        return
    kvgate_client = request.getfixturevalue("kvgate_client")
    profile, c = kvgate_profile, kvgate_profile.compare
    body = {"model": profile.model.served_name, "temperature": 0, "ignore_eos": True, "max_tokens": c.latency_output_tokens,
            "prompt": sized_text(kvgate_client, profile.model.served_name, c.latency_prompt_tokens)}
    t = profile.limits.canary_deadline_s
    pairs = Pairs()
    plan = plan_looks(c.latency_requests, c.latency_requests_max, c.quantile, profile.slo.confidence,
                      max_s=c.latency_max_s, fail_confidence=profile.verdicts.fail_confidence(profile.slo.confidence))
    sampling = sample_until_decided(
        plan, lambda k, left: take_pairs(pairs, lambda: timed(kvgate_client, body, t), lambda: timed(base_client, body, t),
                                         k, left),
        lambda conf: latency_decisions(profile, pairs, conf, plan.pass_level))
    verdict = latency_verdict(profile, pairs, sampling.to_dict(), base.label)
    assert kvgate_gate(verdict, attachments={"compare-latency.csv": pairs.rows_csv()}).passed


@pytest.mark.compare
@pytest.mark.gate("compare", cases=["features"])
def test_no_feature_lost(case, request, pytestconfig, golden, kvgate_baseline, kvgate_profile, kvgate_gate):
    base, base_client, why = kvgate_baseline
    profile = kvgate_profile
    if golden is None:
        assert kvgate_gate(no_baseline_verdict(case, why)).passed
        return
    st = current(pytestconfig)
    ran = {e.test_id.removeprefix(f"{profile.name}/features/"): e.status for e in st.record.entries.values()
           if e.test_id.startswith(f"{profile.name}/features/")}
    names = feature_cases(profile)
    # the features gate's own verdicts, if it ran
    new = ran if set(names) <= set(ran) else features_statuses(request.getfixturevalue("kvgate_client"), profile)
    golden.features = new
    golden.save()
    if base is None:
        passed = sum(1 for s in new.values() if s == "PASS")
        assert kvgate_gate(no_baseline_verdict(case, f"{why}; this run's {len(new)} features verdicts ({passed} PASS) "
                                               f"are in {GOLDEN_FILE}")).passed
        return
    base_statuses = base.golden.features if isinstance(base, RecordedBaseline) else features_statuses(base_client, profile)
    assert kvgate_gate(features_verdict(base_statuses, new, base.label)).passed


#: Where the golden prompts' answers are kept for the run (the contract case, gated last, reuses them).
GOLDEN_KEY = "compare_golden"


@pytest.mark.compare
@pytest.mark.gate("compare", cases=["contract"])
def test_no_contract_regression(case, pytestconfig, golden, kvgate_baseline, kvgate_profile, kvgate_gate):
    """Gated after every contract gate (the security gate included; the plugin orders it so)."""
    base, _, why = kvgate_baseline
    if golden is None:
        assert kvgate_gate(no_baseline_verdict(case, why)).passed
        return
    prefixes = tuple(f"{kvgate_profile.name}/{g}/" for g in CONTRACT_GATES)
    golden.contract = {(c := e.test_id.removeprefix(f"{kvgate_profile.name}/")): record_of(c, e.verdict, e.status)
                       for e in current(pytestconfig).record.entries.values() if e.test_id.startswith(prefixes)}
    golden.save()
    if base is None:
        assert kvgate_gate(no_baseline_verdict(case, f"{why}; this run's {len(golden.contract)} contract verdicts "
                                               f"({', '.join(CONTRACT_GATES)}) are in {GOLDEN_FILE}")).passed
        return
    if not isinstance(base, RecordedBaseline):
        assert kvgate_gate(no_baseline_verdict(case, f"the contract is diffed against a recording of the serving "
                                               f"revision (--baseline-reports DIR of a run with --gate-mode record): "
                                               f"the contract's cases are not re-run against the {base.label}")
                           ).passed
        return
    assert kvgate_gate(contract_verdict(base.golden.contract, golden.contract, base.label)).passed


@pytest.mark.compare
@pytest.mark.gate("compare", cases=["long-context"])
def test_every_depth_read_on_the_baseline_is_read(case, request, golden, kvgate_baseline, kvgate_profile,
                                                  kvgate_long_context, kvgate_gate):
    base, base_client, why = kvgate_baseline
    spec = kvgate_profile.answers.long_context if kvgate_profile.answers else None
    if golden is None or spec is None:
        why = why if golden is None else "the profile declares no pass-key retrieval (answers.long_context)"
        assert kvgate_gate(no_baseline_verdict(case, why)).passed
        return
    try:  # the answers gate's own measurement when it ran in this run, else measured now
        cells = kvgate_long_context.get("cells")
        if cells is None:
            cells = [o.record() for o in observe_needles(request.getfixturevalue("kvgate_client"), kvgate_profile)]
        golden.long_context = cells
        golden.save()
        if base is None:
            got = sum(v for c in cells for v in c["retrieved"].values())
            assert kvgate_gate(no_baseline_verdict(case, f"{why}; this run's {len(cells)} pass-key prompts ({got} answers "
                                                   f"retrieved their key) are in {GOLDEN_FILE}")).passed
            return
        base_cells = base.golden.long_context if isinstance(base, RecordedBaseline) else \
            [o.record() for o in observe_needles(base_client, kvgate_profile)]
    except PromptUnavailable as exc:
        assert kvgate_gate(no_baseline_verdict(case, f"no pass-key prompt of an exact length can be built ({exc})")).passed
        return
    assert kvgate_gate(long_context_verdict(base_cells, golden.long_context, base.label)).passed
