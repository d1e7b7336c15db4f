"""Pure verdicts of the answers gate: the answers are right, not only well-formed.

Every other gate proves *how* a server answers; a deployment that streams nonsense with perfect
framing passes them all. The silent 200s this gate exists for (public reports): an fp8 KV cache
coherent on one turn and garbage from the second (vllm#38652); speculative decoding whose acceptance
collapses (vllm#36872); ``!!!!!!!!`` after ``wake_up`` (vllm#29341); a second BOS on one input path
only (swiss-ai/model-launch PR#173); the prompt's own text in the first streamed delta of a token-id
prompt (vllm#48853); Hangul turned into U+FFFD by a frontend (dynamo#12630); temperature-0 outputs
that change with the batch (vllm#51187).

Cases (ids ``PROFILE/answers/CASE``): ``temperature-zero``, ``system-message``, ``golden``,
``accuracy``, ``degeneration``, ``multibyte``, ``input-paths``, ``multi-turn``, ``determinism``,
``isolation`` (a golden's answer beside other clients' sampling parameters), ``long-context``.
Observations in (:mod:`kvgate.answers`, :mod:`kvgate.http.rendering`), a
:class:`~kvgate.verdict.Verdict` out; no I/O. Each FAIL quotes the prompt and what came back.

Causes: a wrong answer has candidates the answers alone cannot tell apart, so two cases measure the
ones that can be measured, and their findings (:class:`Suspects`, passed in by the suite) become
the ``cause`` of the other cases' FAILs: *temperature-zero* (the same request twice, alone: two
texts mean the sampling parameters did not reach the engine -- or, when the two answers also differ
in ``prompt_tokens``, ``system_fingerprint`` or the server's identity, more than one deployment
behind the endpoint) and the rendering (:func:`rendering_cause`: ``/tokenize`` of a system + user
conversation that renders like the same contents as two user turns -- a template that drops roles
--, a system turn the template or a gateway drops). Without such a finding a FAIL has no cause.

The golden rule (docs/answers.md): a golden whose expectation is missed has *flipped*; a
flip FAILs when the golden's reference margin (by how much the right answer won on the reference
deployment, nats) is at least ``answers.confident_margin`` or unknown; flips of *fragile* goldens
(margin below it: a kernel, dtype or batch change may flip them honestly) are named with their
margins and FAIL only beyond ``answers.max_fragile_flips``. The accuracy case judges the whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kvgate.answers.checks import char_diff, clip, expectation_match, margin, multibyte_findings
from kvgate.answers.isolation import Flight, IsolationObservation, changed, culprits, parted
from kvgate.answers.needle import PATHS, NeedleObservation
from kvgate.answers.observe import Asked
from kvgate.answers.task import difference_interval, interval
from kvgate.answers.tokendiff import Difference, compare_answers
from kvgate.gates.common import FAIL, PASS, SKIP
from kvgate.http.rendering import Rendering, first_difference
from kvgate.profile.models import AnswersSpec, GoldenSpec, LongContextSpec, Profile
from kvgate.stats.proportion import FAIL as FAIL_, PASS as PASS_, UNDECIDED as UNDECIDED_, judge_at_least, \
    judge_not_worse
from kvgate.verdict import Status, Verdict

if TYPE_CHECKING:
    from kvgate.answers.lmeval.runner import Outcome
    from kvgate.answers.seen import Seen

GATE = "answers"
#: In run order: the two that measure causes first, degeneration last, over every answer the others
#: collected.
CASES = ("temperature-zero", "system-message", "golden", "accuracy", "multibyte", "input-paths", "multi-turn",
         "determinism", "isolation", "long-context", "degeneration")


def not_declared(case: str, profile: Profile) -> Verdict | None:
    """The SKIP of a case the profile does not ask for (no ``answers:`` section, no goldens, no
    accuracy task), else None."""
    a = profile.answers
    if a is None:
        return Verdict(f"{GATE}/{case}", SKIP, "the profile has no answers section (answers.goldens, "
                       "answers.accuracy) -> SKIP")
    if case in ("golden", "determinism", "temperature-zero", "isolation") and not a.goldens:
        return Verdict(f"{GATE}/{case}", SKIP, "the profile declares no golden prompts (answers.goldens) -> SKIP")
    if case == "system-message" and system_golden(a) is None:
        return Verdict(f"{GATE}/{case}", SKIP, "the profile declares no golden with a system turn (answers.goldens "
                       "with a system message) -> SKIP")
    if case == "input-paths" and not any(g.messages is not None for g in a.goldens):
        return Verdict(f"{GATE}/{case}", SKIP, "the profile declares no chat golden to ask three ways (answers.goldens "
                       "with messages) -> SKIP")
    if case == "multi-turn" and not a.memory:
        return Verdict(f"{GATE}/{case}", SKIP, "the profile declares no multi-turn conversations (answers.memory) -> SKIP")
    if case == "long-context" and a.long_context is None:
        return Verdict(f"{GATE}/{case}", SKIP, "the profile declares no pass-key retrieval (answers.long_context) -> SKIP")
    if case == "accuracy" and a.accuracy is None:
        return Verdict(f"{GATE}/{case}", SKIP, "the profile declares no accuracy task (answers.accuracy) -> SKIP")
    return None


def system_golden(answers: AnswersSpec) -> GoldenSpec | None:
    """The first chat golden whose conversation has a system turn (the system-message case's), or None."""
    return next((g for g in answers.goldens if g.messages and any(m["role"] == "system" for m in g.messages)), None)


@dataclass(frozen=True)
class Suspects:
    """Causes measured by other cases, for the FAILs they explain (:func:`sampling_cause`,
    :func:`rendering_cause`): ``sampling`` -- temperature 0 not honoured, or more than one
    deployment answering; ``rendering`` -- the prompt the model got is not the conversation sent (a
    template dropping roles or the system turn, a gateway dropping the system turn); ``serving`` --
    who served the gate's answers (:func:`kvgate.answers.causes.serving_cause`: an answer cache in
    front, more than one deployment). None: nothing measured points there."""

    sampling: str | None = None
    rendering: str | None = None
    serving: str | None = None

    def cause(self, *, sampling: bool = True, rendering: bool = True) -> str | None:
        """The findings that can explain a FAIL (``sampling``: texts that differ or flip, and who
        served them; ``rendering``: answers to another prompt), joined; None when there is none."""
        found = [c for c, on in ((self.sampling, sampling), (self.rendering, rendering), (self.serving, True))
                 if on and c]
        return "; ".join(dict.fromkeys(found)) or None


def _cause(suspects: Suspects | None, **kinds: bool) -> str | None:
    return suspects.cause(**kinds) if suspects is not None else None


def _prompt_of(g: GoldenSpec) -> str:
    if g.messages is not None:  # a system message is no turn
        turns = sum(1 for m in g.messages if m.get("role") != "system")
        return clip(g.messages[-1].get("content", ""), 60) + (f" (turn {turns})" if turns > 1 else "")
    return clip(g.prompt or "", 60)


@dataclass
class GoldenObservation:
    """One golden's answers: ``plain`` (non-streamed, with logprobs) and ``streamed``."""

    spec: GoldenSpec
    plain: Asked
    streamed: Asked


def golden_verdict(answers: AnswersSpec, obs: list[GoldenObservation], near_tie: float = 0.1,
                   suspects: Suspects | None = None) -> Verdict:
    """The golden case (rule in the module docstring). Also FAIL: a golden not answered (HTTP
    error, broken stream), or its streamed text parting from the non-streamed one beyond a near
    tie (``near_tie`` nats, by either side's logprobs). ``suspects``: the cause of flips (sampling,
    rendering) and of partings (sampling)."""
    gate = f"{GATE}/golden"
    rows: dict[str, Any] = {}
    right, confident_flips, fragile_flips, errors, parted = [], [], [], [], []
    for o in obs:
        g = o.spec
        row: dict[str, Any] = {"prompt": _prompt_of(g), "route": g.route, "reference_margin": g.margin}
        rows[g.name] = row
        if not o.plain.ok:
            errors.append(f"{g.name}: {o.plain.error}")
            row["error"] = o.plain.error
            continue
        met, end, what = expectation_match(g.expect, o.plain.text)
        row.update(answer=o.plain.text[:300], expected=what, met=met,
                   margin=margin(o.plain.tokens, o.plain.top, end) if met else None)
        if o.streamed.ok:
            row["streamed"] = o.streamed.text[:300]
            if o.streamed.text != o.plain.text:
                d = compare_answers(o.plain.answer(), o.streamed.answer(), near_tie)
                row["stream_vs_plain"] = d.to_dict()
                if d.kind != "near-tie":
                    parted.append(f"{g.name}: streamed {char_diff(o.plain.text, o.streamed.text)}")
        else:
            errors.append(f"{g.name} (streamed): {o.streamed.error}")
        if met:
            right.append(g.name)
            continue
        fragile = g.margin is not None and g.margin < answers.confident_margin
        desc = (f"{g.name} ({_prompt_of(g)!r} -> {clip(o.plain.text, 70)!r}, expected {what}; reference margin "
                f"{'unknown' if g.margin is None else f'{g.margin:.2f} nats'})")
        (fragile_flips if fragile else confident_flips).append(desc)
    n = len(obs)
    ev = {"goldens": rows, "confident_margin": answers.confident_margin,
          "max_fragile_flips": answers.max_fragile_flips,
          "rule": "a flip FAILs when the golden's reference margin >= confident_margin (or unknown); fragile flips "
                  "FAIL beyond max_fragile_flips"}
    head = f"{len(right)} of {n} goldens right"
    if confident_flips or fragile_flips:
        head += (f"; {len(confident_flips)} confident flip{'s' if len(confident_flips) != 1 else ''}, "
                 f"{len(fragile_flips)} fragile (reference margin < {answers.confident_margin:g} nats)")
    if errors:
        return Verdict(gate, Status.FAIL, f"{head}; {len(errors)} not answered (limit 0): {'; '.join(errors[:3])} -> FAIL",
                       measured=len(errors), limit=0, unit="goldens", evidence=ev)
    if parted:
        return Verdict(gate, Status.FAIL, f"{head}; {len(parted)} streamed answers part from the non-streamed ones "
                       f"beyond a near tie ({near_tie:g} nats): {'; '.join(parted[:3])} -> FAIL",
                       measured=len(parted), limit=0, unit="goldens", evidence=ev,
                       cause=_cause(suspects, rendering=False))
    if confident_flips:
        return Verdict(gate, Status.FAIL, f"{head}: {'; '.join(confident_flips[:4])}"
                       f"{'; ...' if len(confident_flips) > 4 else ''} -> FAIL (a confident golden must not flip)",
                       measured=len(confident_flips), limit=0, unit="goldens", evidence=ev, cause=_cause(suspects))
    if len(fragile_flips) > answers.max_fragile_flips:
        return Verdict(gate, Status.FAIL, f"{head}: {'; '.join(fragile_flips[:4])} -> FAIL ({len(fragile_flips)} "
                       f"fragile flips, answers.max_fragile_flips {answers.max_fragile_flips})",
                       measured=len(fragile_flips), limit=answers.max_fragile_flips, unit="goldens", evidence=ev,
                       cause=_cause(suspects))
    if n == 0:
        return Verdict(gate, Status.INVALID, "no golden was asked -> INVALID", evidence=ev)
    tail = f"; fragile flips within {answers.max_fragile_flips}: {'; '.join(fragile_flips)}" if fragile_flips else ""
    shown = "; ".join(f"{rows[name]['prompt']!r} -> {clip(rows[name]['answer'], 50)!r}" for name in right[:3])
    return Verdict(gate, Status.PASS, f"{head}, streamed == non-streamed (e.g. {shown}){tail} -> PASS",
                   measured=len(right), limit=n, unit="goldens", evidence=ev)


def accuracy_verdict(answers: AnswersSpec, rows: list[dict[str, Any]], source: str,
                     suspects: Suspects | None = None, fail_confidence: float | None = None) -> Verdict:
    """The accuracy case: ``rows`` from :func:`kvgate.answers.task.scored`; items are the unit
    (``n`` items, ``k`` right; an item not answered counts as wrong). Decided on bounds, never on
    the point (:mod:`kvgate.stats.proportion`, each bound one-sided at ``accuracy.confidence``;
    the message also shows the two-sided interval at that level):

    - ``min_accuracy`` (a floor): PASS when the Clopper-Pearson lower bound is at or above it,
      FAIL when the upper bound is below it, else INCONCLUSIVE (the items cannot tell);
    - else the recorded run (``recorded_correct``/``recorded_items``, scored separately): a
      non-inferiority test on the difference, Newcombe's hybrid score interval: PASS when its
      lower bound is at or above ``-tolerance x recorded accuracy``, FAIL when its upper bound is
      below it, else INCONCLUSIVE. ``limit`` (reported) = recorded x (1 - tolerance).

    INVALID when more than half were not answered (the task measured the transport, not the
    model). ``suspects``: the cause of a FAIL or INCONCLUSIVE (sampling, rendering).
    ``fail_confidence``: the level of the bound that can FAIL (the Clopper-Pearson upper bound, the
    difference's upper bound) -- the family's share of the run's false-alarm budget,
    ``profile.verdicts.fail_confidence(accuracy.confidence)``
    (:meth:`~kvgate.profile.models.VerdictsSpec.fail_confidence`); None: ``accuracy.confidence``.
    The PASS side stays at ``accuracy.confidence``; the texts name each side's level and the
    evidence records ``fail_confidence`` when it differs."""
    gate = f"{GATE}/accuracy"
    a = answers.accuracy
    assert a is not None
    n = len(rows)
    k = sum(1 for r in rows if r["correct"])
    unanswered = sum(1 for r in rows if not r["answered"])
    lo, hi = interval(k, n, a.confidence)
    acc = k / n if n else 0.0
    conf = f"{a.confidence:.0%}"
    ev: dict[str, Any] = {"task": source, "items": n, "correct": k, "unanswered": unanswered, "unit": "item",
                          "interval": [round(lo, 4), round(hi, 4)], "confidence": a.confidence,
                          "wrong": [r for r in rows if not r["correct"]][:40]}
    head = f"{k} of {n} items right on {source}: accuracy {acc:.1%} ({conf} CI {lo:.1%}..{hi:.1%})"
    if n == 0 or unanswered * 2 > n:
        return Verdict(gate, Status.INVALID, f"{head}; {unanswered} not answered -> INVALID", evidence=ev)
    fc = None if fail_confidence is None or fail_confidence == a.confidence else fail_confidence
    if fc is not None:
        ev["fail_confidence"] = fc
    ni = None
    recorded = None
    if a.recorded_correct is not None and a.recorded_items:
        k0, n0 = a.recorded_correct, a.recorded_items
        d, dlo, dhi = difference_interval(k, n, k0, n0, a.confidence)
        recorded = k0 / n0
        ni = judge_not_worse(k, n, k0, n0, a.tolerance * recorded, a.confidence, fc)
        ev["recorded"] = {"correct": k0, "items": n0, "difference": round(d, 4),
                          "difference_interval": [round(dlo, 4), round(dhi, 4)], "non_inferiority": ni.to_dict()}
        head += f"; vs recorded {k0}/{n0} ({recorded:.1%}): {d * 100:+.1f} points ({conf} CI {dlo * 100:+.1f}..{dhi * 100:+.1f})"
    one = f"{conf} one-sided"
    # the FAIL side's level (the budget share) named where it differs: a FAIL's bound, and an undecided pair
    one_fail = one if fc is None else f"{fc * 100:.4g}% one-sided"
    if a.min_accuracy is not None:
        if recorded is not None:  # min_accuracy decides: the comparison above is shown, not judged
            head += " (context, not judged: answers.accuracy.min_accuracy decides)"
            ev["recorded"]["judged"] = False
        limit, why = a.min_accuracy, "answers.accuracy.min_accuracy"
        rj = judge_at_least(k, n, limit, a.confidence, fc)
        ev["decision"] = rj.to_dict()
        decision = rj.decision
        bounds = (f"{one} bounds {rj.lower:.1%}..{rj.upper:.1%}" if fc is None else
                  f"bounds {rj.lower:.1%} ({one} lower)..{rj.upper:.1%} ({one_fail} upper)")
        said = {PASS_: f"{one} lower bound {rj.lower:.1%} >= {limit:.1%} ({why})",
                FAIL_: f"{one_fail} upper bound {rj.upper:.1%} < {limit:.1%} ({why})",
                UNDECIDED_: f"{bounds} straddle {limit:.1%} ({why})"}[decision]
    elif recorded is not None and ni is not None:
        limit, why = recorded * (1 - a.tolerance), f"recorded x (1 - {a.tolerance:g})"
        margin = -ni.margin * 100
        ev["decision"] = ni.to_dict()
        decision = ni.decision
        bounds = (f"the difference's {one} bounds {ni.low * 100:+.1f}..{ni.high * 100:+.1f}" if fc is None else
                  f"the difference's bounds {ni.low * 100:+.1f} ({one} lower)..{ni.high * 100:+.1f} ({one_fail} upper)")
        said = {PASS_: f"non-inferior: the difference's {one} lower bound {ni.low * 100:+.1f} >= {margin:+.1f} points "
                       f"(limit {limit:.1%}, {why})",
                FAIL_: f"worse than the recorded run by more than the tolerance: the difference's {one_fail} upper "
                       f"bound {ni.high * 100:+.1f} < {margin:+.1f} points (limit {limit:.1%}, {why})",
                UNDECIDED_: f"{bounds} straddle {margin:+.1f} points (limit {limit:.1%}, {why})"}[decision]
    else:
        return Verdict(gate, Status.SKIP, f"{head}; no limit declared (answers.accuracy.min_accuracy or "
                       "recorded_correct/recorded_items) -> SKIP", measured=round(acc, 4), unit="fraction", evidence=ev)
    ev["limit"] = round(limit, 4)
    wrong = [r for r in rows if not r["correct"]][:2]
    eg = "; e.g. " + "; ".join(f"{r['id']}: {clip(r['answer'], 50)!r}" for r in wrong) if wrong else ""
    if decision == PASS_:
        return Verdict(gate, Status.PASS, f"{head}; {said} -> PASS", measured=round(acc, 4),
                       limit=round(limit, 4), unit="fraction", evidence=ev)
    if decision == FAIL_:
        return Verdict(gate, Status.FAIL, f"{head}; {said} -> FAIL{eg}",
                       measured=round(acc, 4), limit=round(limit, 4), unit="fraction", evidence=ev,
                       cause=_cause(suspects))
    return Verdict(gate, Status.INCONCLUSIVE, f"{head}; {said}: {n} items cannot tell -> INCONCLUSIVE{eg}",
                   measured=round(acc, 4), limit=round(limit, 4),
                   unit="fraction", evidence=ev, cause=_cause(suspects) or f"the evidence cannot tell: {n} items are "
                   "too few to separate this accuracy from the limit")


def lm_eval_verdict(answers: AnswersSpec, outcome: "Outcome", suspects: Suspects | None = None,
                    fail_confidence: float | None = None) -> Verdict:
    """The accuracy case through lm-eval (``answers.accuracy.lm_eval``): lm-eval's per-sample
    scores (:class:`kvgate.answers.lmeval.runner.Outcome`) judged as :func:`accuracy_verdict`
    judges kvgate's own (a sample scoring 1 is an item right), the evidence naming lm-eval's
    version, model, metric and seconds. SKIP when the task needs a download (kvgate runs lm-eval
    offline), saying what it reached for; INVALID when lm-eval gave no scores (a failed request --
    lm-eval stops at the first --, a task that cannot be built), or scores that are not 0 or 1 (no
    binomial interval: name a right/wrong metric). ``fail_confidence``: as :func:`accuracy_verdict`'s."""
    gate = f"{GATE}/accuracy"
    via = f"lm-eval {outcome.version or '(version unknown)'}, {outcome.model}"
    ev: dict[str, Any] = {"lm_eval": {"task": outcome.task, "version": outcome.version, "model": outcome.model,
                                      "metric": outcome.metric, "seconds": outcome.seconds,
                                      "num_concurrent": outcome.concurrency}}
    if outcome.download is not None:
        return Verdict(gate, Status.SKIP, f"{outcome.task} through {via} needs a download: {clip(outcome.download, 300)}; "
                       "kvgate runs lm-eval offline (HF_DATASETS_OFFLINE, HF_HUB_OFFLINE) -> SKIP "
                       "(put the data in the local Hugging Face cache, or name a task YAML over a local file)", evidence=ev)
    if outcome.error is not None or not outcome.samples:
        why = clip(outcome.error or "no sample scored", 300)
        return Verdict(gate, Status.INVALID, f"{outcome.task} through {via}: no score ({why}) -> INVALID", evidence=ev)
    odd = [s for s in outcome.samples if not isinstance(s.get("score"), (bool, int, float)) or float(s["score"]) not in (0.0, 1.0)]
    if odd:
        shown = ", ".join(f"{s.get('id')}: {s.get('score')!r}" for s in odd[:3])
        return Verdict(gate, Status.INVALID, f"{outcome.task} through {via}: metric {outcome.metric} scores "
                       f"{len(odd)} of {len(outcome.samples)} samples other than 0 or 1 ({shown}): no right/wrong count, "
                       "no binomial interval -> INVALID (answers.accuracy.lm_eval.metric: a right/wrong metric, e.g. "
                       "exact_match or acc)", evidence=ev)
    rows = [{"id": str(s.get("id")), "correct": float(s["score"]) == 1.0, "answer": str(s.get("answer") or "")[:160],
             "expected": str(s.get("expected") or "")[:160], "answered": True} for s in outcome.samples]
    verdict = accuracy_verdict(answers, rows, f"{outcome.task} ({via}, {outcome.metric})", suspects=suspects,
                               fail_confidence=fail_confidence)
    return replace(verdict, evidence={**verdict.evidence, **ev})


def degeneration_verdict(answers: AnswersSpec, seen: "Seen | list[tuple[str, str, str | None]]",
                         suspects: Suspects | None = None) -> Verdict:
    """The degeneration case over every answer the run saw (:class:`kvgate.answers.seen.Seen`; a
    list of ``(source, text, finish_reason)`` is scanned strictly): U+FFFD, repetition loops, empty
    content where text is due, token soup (:func:`kvgate.answers.checks.degeneration`) in answers
    that ended on their own; U+FFFD and control characters only in the load gates' and the soak's
    ``ignore_eos`` outputs. FAIL naming the first few, quoted; ``suspects``: its cause (sampling,
    rendering)."""
    from kvgate.answers.seen import Seen

    if not isinstance(seen, Seen):
        items = seen
        seen = Seen(max_repeat_fraction=answers.max_repeat_fraction)
        for source, text, finish in items:
            seen.add(source, text, finish)
    gate = f"{GATE}/degeneration"
    ev = {"answers_checked": seen.checked, "strict": seen.strict, "lenient": seen.lenient, "by_source": seen.by_source,
          "degenerate": seen.findings, "degenerate_total": seen.found, "max_repeat_fraction": seen.max_repeat_fraction}
    where = ", ".join(f"{k} {n}" for k, n in seen.by_source.items())
    if seen.strict == 0:
        return Verdict(gate, Status.INVALID, f"no answer that ended on its own was collected to check ({where or 'none'}) "
                       "-> INVALID", evidence=ev)
    if seen.found:
        bad = [f"{f['source']}: {f['findings'][0]} in {clip(f['text'], 60)!r}" for f in seen.findings[:3]]
        return Verdict(gate, Status.FAIL, f"{seen.found} of {seen.checked} answers degenerate: {'; '.join(bad)} -> FAIL "
                       "(limit 0)",
                       measured=seen.found, limit=0, unit="answers", evidence=ev, cause=_cause(suspects))
    lenient = (f"; {seen.lenient} load and soak outputs (ignore_eos) for U+FFFD and control characters"
               if seen.lenient else "")
    return Verdict(gate, Status.PASS, f"{seen.checked} answers checked ({where}): {seen.strict} answers: no U+FFFD, no "
                   f"repetition loop over {seen.max_repeat_fraction:.0%}, none empty, no token soup{lenient} -> PASS",
                   measured=0, limit=0, unit="answers", evidence=ev)


@dataclass
class MultibyteObservation:
    """One multibyte prompt (``name``: its script), asked plainly and streamed at ``temperature``
    (with ``seed`` when above 0)."""

    name: str
    prompt: str
    temperature: float
    plain: Asked
    streamed: Asked


def multibyte_verdict(obs: list[MultibyteObservation], suspects: Suspects | None = None) -> Verdict:
    """The multibyte case: no U+FFFD or lone surrogate in any answer, and the streamed text equal
    to the non-streamed one character for character (same temperature, same seed): a dropped,
    doubled or mangled multibyte character shows as a difference. The prompts' scripts must have
    reached the model intact (the answer is not checked for the script: a small model may answer in
    English). The cause, when measured: U+FFFD in streamed answers only, every non-streamed answer
    intact (:func:`stream_corrupts`); else ``suspects``: the cause of streamed and non-streamed texts
    that differ (sampling)."""
    gate = f"{GATE}/multibyte"
    bad: list[str] = []
    differ = False
    rows: dict[str, Any] = {}
    for o in obs:
        key = f"{o.name}@t={o.temperature:g}"
        rows[key] = {"prompt": o.prompt, "plain": o.plain.text[:300], "streamed": o.streamed.text[:300],
                     "plain_error": o.plain.error, "streamed_error": o.streamed.error}
        for a, how in ((o.plain, "non-streamed"), (o.streamed, "streamed")):
            if not a.ok:
                bad.append(f"{key} {how}: {a.error}")
            for f in multibyte_findings(a.text):
                bad.append(f"{key} {how}: {f}")
        if o.plain.ok and o.streamed.ok and (diff := char_diff(o.plain.text, o.streamed.text)):
            bad.append(f"{key}: streamed differs from non-streamed {diff}")
            differ = True
    ev = {"prompts": rows}
    if not obs:
        return Verdict(gate, Status.INVALID, "no multibyte prompt was asked -> INVALID", evidence=ev)
    if bad:
        return Verdict(gate, Status.FAIL, f"{len(bad)} multibyte findings (limit 0) in {len(obs)} prompt pairs: "
                       f"{'; '.join(bad[:3])} -> FAIL", measured=len(bad), limit=0, unit="findings", evidence=ev,
                       cause=stream_corrupts(obs) or (_cause(suspects, rendering=False) if differ else None))
    names = sorted({o.name for o in obs})
    temps = sorted({o.temperature for o in obs})
    return Verdict(gate, Status.PASS, f"{len(obs)} prompt pairs ({', '.join(names)}; temperature "
                   f"{', '.join(f'{t:g}' for t in temps)}): no U+FFFD, streamed == non-streamed character for "
                   "character -> PASS", measured=0, limit=0, unit="findings", evidence=ev)


def stream_corrupts(obs: list[MultibyteObservation]) -> str | None:
    """The cause "the stream corrupts multibyte text" when some streamed answer has a U+FFFD its
    non-streamed twin has not, and no non-streamed answer has one (the frontend's streaming path
    splits characters; the engine's text is intact); else None (U+FFFD on both paths is not the
    stream's)."""
    if any(o.plain.ok and REPLACEMENT in o.plain.text for o in obs):
        return None
    hit = [o for o in obs if o.plain.ok and o.streamed.ok and REPLACEMENT in o.streamed.text]
    if not hit:
        return None
    o = hit[0]
    return (f"the stream corrupts multibyte text (U+FFFD only in the streamed answer; the non-streamed one intact): "
            f"{len(hit)} of {len(obs)} streamed answers, e.g. {o.name}@t={o.temperature:g} streamed "
            f"{clip(o.streamed.text, 40)!r} vs non-streamed {clip(o.plain.text, 40)!r}")


#: The replacement character a decoder puts where bytes did not make a character.
REPLACEMENT = "\ufffd"


@dataclass
class PathsObservation:
    """One conversation asked three ways: ``chat`` (messages), ``text`` (the ``/tokenize``-rendered
    prompt on completions), ``ids`` (the rendered token ids on completions), each plain and
    streamed; ``rendered_ids`` the ids ``/tokenize`` rendered; ``prompt_text`` the rendered text.

    What a count that is off is compared with (each ``/tokenize``, None when not measured):
    ``without_system`` (the conversation without its system turn; None when it has none),
    ``text_special`` and ``text_plain`` (the rendered text tokenized with and without the
    tokenizer's special tokens: their difference is what the tokenizer adds, its BOS), ``twice``
    (the rendered text rendered once more as one user turn: the template applied twice), and
    ``echoed`` (a completions path -> the prompt's token ids as the server echoed them back,
    ``echo`` with logprobs; asked only when that path's count is off)."""

    name: str
    rendered_ids: list[int]
    prompt_text: str
    answers: dict[str, Asked]
    without_system: Rendering | None = None
    text_special: Rendering | None = None
    text_plain: Rendering | None = None
    twice: Rendering | None = None
    echoed: dict[str, list[int]] = field(default_factory=dict)

    def special_prefix(self) -> tuple[int, ...] | None:
        """The ids the tokenizer puts in front of a text (``text_special`` less ``text_plain``), or
        None when not measured or the two do not differ by a prefix."""
        sp, pl = self.text_special, self.text_plain
        if sp is None or pl is None or not sp.ok or not pl.ok or len(sp.ids) < len(pl.ids):
            return None
        k = len(sp.ids) - len(pl.ids)
        return sp.ids[:k] if sp.ids[k:] == pl.ids else None

    def _prefix_words(self) -> str:
        """``id 1 ('<s>')`` for each id of :meth:`special_prefix`; ``""`` when there is none."""
        p = self.special_prefix()
        sp = self.text_special
        if not p or sp is None:
            return ""
        return ", ".join(f"id {i} ({sp.token(k)})" if sp.strs is not None else f"id {i}" for k, i in enumerate(p))


def system_dropped_cause(served: int) -> str:
    """The cause of a server counting the conversation without its system turn."""
    return (f"the system message never reached the server (a gateway dropping it?); the server rendered {served} "
            "tokens = the rendering without it")


def _count_finding(o: PathsObservation, key: str, c: int, serving: str | None = None) -> tuple[str, str | None]:
    """``(what the count c of path ``key`` matches, the cause it names)``, from the measured
    renderings (:class:`PathsObservation`): the server's echo of its prompt when there is one, else
    every rendering whose count equals ``c`` -- one names its candidate, several say they cannot be
    told apart, none says the evidence cannot tell. ``serving``: who served the answers
    (:class:`Suspects`): a count equal to the rendering without the system turn names it, not a
    dropped system turn (a cache's or another deployment's count looks alike)."""
    n = len(o.rendered_ids)
    echo = o.echoed.get(key)
    route = key.split("/")[0]  # the cause is the route's, streamed or not
    if echo is not None:
        k = len(echo) - n
        if k > 0 and list(echo[k:]) == list(o.rendered_ids):
            extra = tuple(echo[:k])
            if extra == o.special_prefix():
                what = (f"a second BOS: the server's prompt, as it echoed it, is {o._prefix_words()} then the {n} "
                        "rendered tokens")
                return what, (f"a second BOS on the {route} path: the server puts the tokenizer's BOS "
                              f"({o._prefix_words()}) in front of a prompt that already begins with the template's")
            return (f"the server's prompt, as it echoed it, has {k} more tokens in front of the {n} rendered (ids "
                    f"{', '.join(map(str, extra[:8]))})"), f"the server adds {k} tokens in front of a {route} prompt"
        i = first_difference(echo, o.rendered_ids)
        at = lambda seq: f"id {seq[i]}" if i is not None and i < len(seq) else "the end"  # noqa: E731
        return (f"the server's prompt, as it echoed it ({len(echo)} tokens), parts from the rendered one at token {i}: "
                f"{at(echo)} vs {at(o.rendered_ids)}"), None
    found: list[tuple[str, str]] = []
    ws = o.without_system
    if ws is not None and ws.ok and ws.count == c != n:
        found.append(("the rendering without the system turn", serving or system_dropped_cause(c)))
    ts = o.text_special
    if ts is not None and ts.ok and ts.count == c != n:
        front = f" ({o._prefix_words()} in front)" if o._prefix_words() else ""
        found.append((f"the rendered text with the tokenizer's special tokens added once more{front}", ""))
    tw = o.twice
    if tw is not None and tw.ok and tw.count == c != n:
        found.append(("the rendered text rendered again as a user turn (the template applied twice)", ""))
    if len(found) == 1:
        what, cause = found[0]
        return f"= {what}", cause or f"the {route} path's count matches one measured rendering: {what}"
    if found:
        names = " and ".join(w for w, _ in found)
        return f"= {names}: the counts cannot tell them apart", f"the {route} path's count matches {names}: the " \
            "evidence cannot tell them apart"
    seen = [f"{w} {r.count}" for w, r in (("without the system turn", ws), ("with special tokens", ts),
                                          ("templated twice", tw)) if r is not None and r.ok]
    return (f"matches none of the measured renderings ({', '.join(seen) or 'none measured'})",
            f"the evidence cannot tell: the {route} path's count matches none of the measured renderings")


def input_paths_verdict(obs: list[PathsObservation], suspects: Suspects | None = None) -> Verdict:
    """The input-paths case: every path's ``usage.prompt_tokens`` equals the rendered count (a count
    that is off is compared with the renderings :class:`PathsObservation` measured, which name what
    it matches: :func:`_count_finding`), every path's temperature-0 answer is the same, and no
    streamed first delta carries the prompt's own text. ``suspects``: the cause of answers that
    differ (sampling)."""
    gate = f"{GATE}/input-paths"
    bad: list[str] = []
    causes: list[str] = []
    rows: dict[str, Any] = {}
    differ = False
    for o in obs:
        n = len(o.rendered_ids)
        row: dict[str, Any] = {"rendered_tokens": n, "paths": {k: a.to_dict() for k, a in o.answers.items()}}
        measured = {w: r.count for w, r in (("without_system", o.without_system), ("text_special", o.text_special),
                                            ("text_plain", o.text_plain), ("twice", o.twice)) if r is not None}
        if measured:
            row["renderings"] = measured
        if o.echoed:
            row["echoed"] = {k: list(v[:64]) for k, v in o.echoed.items()}
        rows[o.name] = row
        ref = o.answers.get("chat")
        for key, a in o.answers.items():
            if not a.ok:
                bad.append(f"{o.name} {key}: {a.error}")
                continue
            if a.prompt_tokens is not None and a.prompt_tokens != n:
                what, cause = _count_finding(o, key, a.prompt_tokens, suspects.serving if suspects else None)
                bad.append(f"{o.name} {key}: prompt_tokens {a.prompt_tokens} vs {n} rendered "
                           f"({a.prompt_tokens - n:+d}: {what})")
                if cause:
                    causes.append(cause)
            tail = o.prompt_text[-40:].strip()
            if a.first_delta and tail and len(tail) >= 8 and tail in a.first_delta:
                bad.append(f"{o.name} {key}: the first streamed delta carries the prompt's text "
                           f"({clip(a.first_delta, 60)!r})")
            if ref is not None and ref.ok and a is not ref and (diff := char_diff(ref.text, a.text)):
                bad.append(f"{o.name} {key} answers otherwise than chat {diff}")
                differ = True
    ev = {"conversations": rows}
    if not obs:
        return Verdict(gate, Status.INVALID, "no conversation was asked -> INVALID", evidence=ev)
    if bad:
        if differ and (s := _cause(suspects, rendering=False)):
            causes.append(s)
        return Verdict(gate, Status.FAIL, f"{len(bad)} disagreements between input paths (limit 0): {'; '.join(bad[:3])} -> FAIL",
                       measured=len(bad), limit=0, unit="findings", evidence=ev,
                       cause="; ".join(dict.fromkeys(causes)) or None)
    paths = sorted({k for o in obs for k in o.answers})
    return Verdict(gate, Status.PASS, f"{len(obs)} conversations, {len(paths)} paths each ({', '.join(paths)}): "
                   f"the same prompt_tokens as rendered ({', '.join(str(len(o.rendered_ids)) for o in obs)}), the "
                   "same temperature-0 answer, no prompt text in a first delta -> PASS", measured=0, limit=0,
                   unit="findings", evidence=ev)


@dataclass
class MemoryObservation:
    """A conversation whose last question depends on an earlier turn: the golden spec and its answer;
    ``whole`` and ``last_turn``: ``/tokenize`` of the conversation and of it without its earlier
    turns (its system turns and last user turn only), measured for a FAIL's cause (None: not)."""

    spec: GoldenSpec
    answer: Asked
    whole: Rendering | None = None
    last_turn: Rendering | None = None


def history_trimmed(o: MemoryObservation) -> str | None:
    """The cause of a forgotten turn when the server counted the conversation without its earlier
    turns: ``usage.prompt_tokens`` equal to ``/tokenize`` of its last user turn alone (system turns
    kept) and not to the whole conversation's; else None (not measured, or the counts tell nothing:
    equal to the whole -- the model got it all and forgot --, to neither, or both renderings alike)."""
    w, t, c = o.whole, o.last_turn, o.answer.prompt_tokens
    if w is None or t is None or not w.ok or not t.ok or c is None or w.count == t.count:
        return None
    if c == t.count:
        return (f"the earlier turns never reached the server (a gateway keeping only the last user turn?): the server "
                f"counted {c} prompt tokens for {o.spec.name} = the rendering of its last user turn alone ({w.count} "
                "with its earlier turns, by /tokenize)")
    return None


def memory_verdict(obs: list[MemoryObservation], suspects: Suspects | None = None) -> Verdict:
    """The multi-turn case: each answer meets its expectation (the fact given in an earlier turn).
    The cause of a forgotten turn: the history trimmed before the server when the counts show it
    (:func:`history_trimmed`), else ``suspects`` (sampling, rendering, serving)."""
    gate = f"{GATE}/multi-turn"
    bad, rows = [], {}
    forgot = False
    trimmed: list[str] = []
    for o in obs:
        if not o.answer.ok:
            bad.append(f"{o.spec.name}: {o.answer.error}")
            continue
        met, _, what = expectation_match(o.spec.expect, o.answer.text)
        rows[o.spec.name] = {"turns": len(o.spec.messages or []), "answer": o.answer.text[:300], "expected": what, "met": met}
        if o.whole is not None and o.last_turn is not None:
            rows[o.spec.name].update(prompt_tokens=o.answer.prompt_tokens, rendered_whole=o.whole.count,
                                     rendered_last_turn=o.last_turn.count)
        if not met and (t := history_trimmed(o)):
            trimmed.append(t)
        if not met:
            first = (o.spec.messages or [{}])[0].get("content", "")
            bad.append(f"{o.spec.name}: turn 1 said {clip(first, 50)!r}; asked {_prompt_of(o.spec)!r} -> "
                       f"{clip(o.answer.text, 60)!r}, expected {what}")
            forgot = True
    ev = {"conversations": rows}
    if not obs:
        return Verdict(gate, Status.INVALID, "no multi-turn conversation was asked -> INVALID", evidence=ev)
    if bad:
        return Verdict(gate, Status.FAIL, f"{len(bad)} of {len(obs)} answers forget an earlier turn (limit 0): {'; '.join(bad[:2])} "
                       "-> FAIL", measured=len(bad), limit=0, unit="conversations", evidence=ev,
                       cause=(trimmed[0] if trimmed else _cause(suspects)) if forgot else None)
    eg = "; ".join(f"{n}: {clip(r['answer'], 40)!r}" for n, r in list(rows.items())[:2])
    return Verdict(gate, Status.PASS, f"{len(obs)} conversation{'s' if len(obs) != 1 else ''} answered from an "
                   f"earlier turn ({eg}) -> PASS",
                   measured=0, limit=0, unit="conversations", evidence=ev)


def determinism_verdict(spec: AnswersSpec, runs: dict[str, list[Asked]], suspects: Suspects | None = None) -> Verdict:
    """The determinism case: ``runs`` maps a golden to its answers (the first alone, the rest each
    inside a concurrent batch). Answers that part from every distinct answer so far beyond a near tie
    (by either side's logprobs, ``determinism.near_tie_logprob``) are distinct outputs; FAIL when a prompt has more than
    ``determinism.max_distinct``. Near-tie partings are counted and named, not failed.
    ``suspects``: the cause of outputs that change (sampling: temperature 0 not honoured even alone)."""
    gate = f"{GATE}/determinism"
    d = spec.determinism
    rows: dict[str, Any] = {}
    over, ties, errors = [], [], []
    for name, answers in runs.items():
        ok = [a for a in answers if a.ok]
        errors += [f"{name}: {a.error}" for a in answers if not a.ok]
        if not ok:
            continue
        distinct: list[Asked] = [ok[0]]
        tie_here = 0
        for a in ok[1:]:
            if any(a.text == b.text for b in distinct):
                continue
            # a near tie of any distinct answer so far is that answer, not a new one
            if any(compare_answers(b.answer(), a.answer(), d.near_tie_logprob).kind == "near-tie" for b in distinct):
                tie_here += 1
                continue
            distinct.append(a)
        rows[name] = {"answers": len(ok), "distinct": len(distinct), "near_ties": tie_here,
                      "texts": sorted({a.text[:160] for a in ok})}
        if tie_here:
            ties.append(f"{name} ({tie_here})")
        if len(distinct) > d.max_distinct:
            first, other = clip(distinct[0].text, 40), clip(distinct[1].text, 40)
            shown = (f"{first!r} alone vs {other!r} in a batch of {d.batch}" if first != other else  # clipped alike:
                     f"alone vs in a batch of {d.batch} {char_diff(distinct[0].text, distinct[1].text)}")  # where they part
            over.append(f"{name}: {len(distinct)} distinct outputs in {len(ok)} ({shown})")
    ev = {"prompts": rows, "repeats": d.repeats, "batch": d.batch, "max_distinct": d.max_distinct}
    if errors:
        return Verdict(gate, Status.FAIL, f"{len(errors)} answers missing (limit 0): {'; '.join(errors[:2])} -> FAIL",
                       measured=len(errors), limit=0, unit="answers", evidence=ev)
    if not rows:
        return Verdict(gate, Status.INVALID, "no answer to compare -> INVALID", evidence=ev)
    worst = max(r["distinct"] for r in rows.values())
    if over:
        return Verdict(gate, Status.FAIL, f"temperature-0 outputs change under concurrency: {'; '.join(over[:2])}; "
                       f"answers.determinism.max_distinct {d.max_distinct} -> FAIL", measured=worst,
                       limit=d.max_distinct, unit="outputs", evidence=ev, cause=_cause(suspects, rendering=False))
    tail = f"; near ties (<= {d.near_tie_logprob:g} nats) parted {', '.join(ties)}" if ties else ""
    n = sum(r["answers"] for r in rows.values())
    return Verdict(gate, Status.PASS, f"{len(rows)} prompts x {n // max(1, len(rows))} answers (alone, then in "
                   f"{d.repeats} concurrent batch{'es' if d.repeats != 1 else ''} of {d.batch}): at most {worst} distinct output per prompt{tail} "
                   f"-> PASS", measured=worst, limit=d.max_distinct, unit="outputs", evidence=ev)


def _near(f: Flight, rnd: list[Flight]) -> str:
    """``beside a, b`` (the polluters in flight with victim ``f``) or ``after a, b`` (ended before the
    after wave's ``f`` started): :func:`kvgate.answers.isolation.culprits`."""
    names = culprits(f, rnd)
    if f.wave == "beside":
        return f"beside {', '.join(names)}" if names else "beside no polluter in flight"
    return f"after {', '.join(names)} (ended before it started)" if names else "after no polluter"


def _token_diff(d: Difference) -> str:
    """Where a victim parted: ``token 3: ' Paris' alone vs ' zebra'`` (+ the gap, nats, when either
    side's logprobs rank the other's token)."""
    unit = "char" if d.how == "text" else "token"
    gap = "" if d.gap is None else f", {d.gap:.2f} nats apart"
    return f"{unit} {d.position}: {d.base_token!r} alone vs {d.new_token!r}{gap}"


def isolation_verdict(answers: AnswersSpec, obs: IsolationObservation | None, suspects: Suspects | None = None) -> Verdict:
    """The isolation case (:mod:`kvgate.answers.isolation`): each victim's answers in the rounds
    beside polluters must equal its alone-answer; a parting within ``isolation.near_tie_logprob``
    nats (by either side's logprobs, as the compare gate tells them apart) is a near tie, named, not
    failed. FAIL: a polluter answered 5xx or not at all (a refusal must be 4xx), naming it; a victim
    not answered; a victim changed, naming the polluters in flight beside it (their start/end times
    overlapping the victim's; for the after wave, those that ended before it started) and the first
    differing token, and which polluters changed the victims
    again alone beside them (the confirming rounds) -- the cause. INCONCLUSIVE: the victims changed
    beside plain temperature-0 requests too (the control round): the batch alone changes them, so
    the polluters' sampling state cannot be told from it. INVALID: no polluter was served in flight
    beside a victim (all refused 4xx: nothing was measured). ``suspects``: the cause of changes
    (sampling: temperature 0 not honoured even alone)."""
    gate = f"{GATE}/isolation"
    if obs is None or not obs.victims:
        return Verdict(gate, Status.INVALID, "no golden to answer beside polluters -> INVALID")
    near = answers.isolation.near_tie_logprob
    flights = [f for rnd in obs.rounds for f in rnd]
    pols = [f for f in flights if f.role == "polluter"]
    names = list(dict.fromkeys(p.name for p in pols))
    refused = {p.name: p.asked.status for p in pols if 400 <= p.asked.status < 500}
    ev: dict[str, Any] = {"victims": obs.victims, "batch": obs.batch, "near_tie_logprob": near,
                          "allowed_token_ids": obs.allowed, "allowed_from": obs.allowed_from,
                          "alone": {n: a.to_dict() for n, a in obs.alone.items()},
                          "rounds": [[f.to_dict() for f in rnd] for rnd in obs.rounds], "refused_4xx": refused}
    if obs.control is not None:
        ev["control"] = [f.to_dict() for f in obs.control]
    if obs.confirm:
        ev["confirm"] = {n: [f.to_dict() for f in rnd] for n, rnd in obs.confirm.items()}
    broken = [p for p in pols if not p.asked.ok and not 400 <= p.asked.status < 500]
    if broken:
        shown = "; ".join(f"{p.name}: {f'HTTP {p.asked.status}' if p.asked.status else 'no answer'} after "
                          f"{p.t1 - p.t0:.1f} s ({clip(p.asked.error or '', 160)})" for p in broken)
        return Verdict(gate, Status.FAIL, f"{len(broken)} polluter{'s' if len(broken) != 1 else ''} of {len(pols)} "
                       f"answered with a 5xx or not at all (limit 0): {shown} -> FAIL (a request the server does "
                       "not take must be refused 4xx)", measured=len(broken), limit=0, unit="polluters", evidence=ev)
    missing = [f"{n} alone: {a.error}" for n, a in obs.alone.items() if not a.ok]
    for k, rnd in enumerate(obs.rounds, 1):
        missing += [f"{f.name} in round {k} {_near(f, rnd)}: {f.asked.error}"
                    for f in rnd if f.role == "victim" and not f.asked.ok]
    if missing:
        return Verdict(gate, Status.FAIL, f"{len(missing)} victim answers missing (limit 0): {'; '.join(missing[:3])} "
                       "-> FAIL", measured=len(missing), limit=0, unit="answers", evidence=ev)
    beside = [p for rnd in obs.rounds for p in rnd if p.role == "polluter" and p.asked.ok
              and any(p.overlaps(f) for f in rnd if f.role == "victim" and f.wave == "beside")]
    ref = f"; refused 4xx: {', '.join(f'{n} ({s})' for n, s in refused.items())}" if refused else ""
    if not beside:
        return Verdict(gate, Status.INVALID, f"no polluter was served in flight beside a victim ({len(pols)} sent"
                       f"{ref}): nothing was measured -> INVALID", evidence=ev)
    rows: list[dict[str, Any]] = []
    ties: list[dict[str, Any]] = []
    diffs: list[Difference] = []  # rows' differences, in order
    for k, rnd in enumerate(obs.rounds, 1):
        for f in rnd:
            if f.role != "victim":
                continue
            d = parted(obs.alone[f.name], f.asked, near)
            if d is None:
                continue
            row = {"victim": f.name, "round": k, "wave": f.wave, "polluters": culprits(f, rnd), "near": _near(f, rnd),
                   "difference": d.to_dict(),
                   "text": clip(f.asked.text, 80), "alone": clip(obs.alone[f.name].text, 80)}
            if d.kind == "near-tie":
                ties.append(row)
            else:
                rows.append(row)
                diffs.append(d)
    ev.update(changed=rows, near_ties=ties)
    answered = sum(1 for f in flights if f.role == "victim")
    after = sum(1 for f in flights if f.role == "victim" and f.wave == "after")
    served = sorted({p.name for p in beside}, key=names.index)
    if not rows:
        parted_at = ", ".join(f"{r['victim']} (round {r['round']})" for r in ties)
        tail = f"; near ties (<= {near:g} nats) parted {parted_at}" if ties else ""
        again = f" and {after} times right after the last (in the batch rows it left)" if after else ""
        return Verdict(gate, Status.PASS, f"{len(obs.victims)} goldens answered alone, then {answered - after} times "
                       f"in {len(obs.rounds)} round{'s' if len(obs.rounds) != 1 else ''} of {obs.batch} beside "
                       f"{len(served)} polluters in flight ({', '.join(served)}){ref}{again}: every answer equal to "
                       f"its alone-answer{tail} -> PASS", measured=0, limit=0, unit="changed answers", evidence=ev)
    shown = "; ".join(f"{r['victim']} (round {r['round']}{', after wave' if r['wave'] == 'after' else ''}) at "
                      f"{_token_diff(d)} {r['near']}" for r, d in zip(rows[:3], diffs))
    head = (f"{len(rows)} of {answered} victim answers changed beside polluters beyond a near tie ({near:g} nats): "
            f"{shown}{'; ...' if len(rows) > 3 else ''}")
    control = changed(obs, obs.control or [], near)
    if control:
        ctl = ", ".join(dict.fromkeys(f.name for f, _ in control))
        return Verdict(gate, Status.INCONCLUSIVE, f"{head}; beside plain temperature-0 requests (the control round) "
                       f"{ctl} changed too -> INCONCLUSIVE (the batch alone changes them: the polluters' sampling "
                       "state cannot be told from it; answers/determinism judges the batch)", measured=len(rows),
                       limit=0, unit="changed answers", evidence=ev,
                       cause=_cause(suspects, rendering=False) or "the evidence cannot tell: the victims changed "
                       "beside plain temperature-0 requests too (no sampling parameter in flight)")
    again = [n for n, rnd in obs.confirm.items() if changed(obs, rnd, near)]
    cleared = [n for n in obs.confirm if n not in again]
    conf = (f"; beside copies of {', '.join(again)} alone they changed again" if again else "") + \
        (f"; beside {', '.join(cleared)} alone they did not" if cleared else "")
    cause = _cause(suspects, rendering=False) or (
        f"the per-request sampling state of {', '.join(again)} reaches other requests: beside "
        f"{'it' if len(again) == 1 else 'each'} alone the victims changed again, beside plain requests they did not"
        if again else None)
    return Verdict(gate, Status.FAIL, f"{head}{conf} -> FAIL (a temperature-0 answer must not change with other "
                   "requests' sampling parameters)", measured=len(rows), limit=0, unit="changed answers", evidence=ev,
                   cause=cause)


# ------------------------------------------------------------------------------------------------
# the cases that measure causes


@dataclass
class SamplingObservation:
    """The temperature-zero case's two answers: golden ``name`` (the golden whose answer was the
    longest, so the request has the most tokens to part at) asked twice at temperature 0 with its
    ``max_tokens``, non-streamed, alone (nothing else in flight): ``first`` and ``second``."""

    name: str
    max_tokens: int
    first: Asked
    second: Asked


def _deployments(a: Asked, b: Asked) -> list[str]:
    """What in two answers to one request names two deployments: a ``prompt_tokens``, a
    ``system_fingerprint``, a ``model`` or an identity header (:data:`kvgate.answers.observe.IDENTITY_HEADERS`)
    that differs."""
    out = []
    if a.prompt_tokens is not None and b.prompt_tokens is not None and a.prompt_tokens != b.prompt_tokens:
        out.append(f"prompt_tokens {a.prompt_tokens} vs {b.prompt_tokens}")
    if a.system_fingerprint != b.system_fingerprint:
        out.append(f"system_fingerprint {a.system_fingerprint!r} vs {b.system_fingerprint!r}")
    if a.model and b.model and a.model != b.model:
        out.append(f"model {a.model!r} vs {b.model!r}")
    for h in sorted(set(a.identity) | set(b.identity)):
        if a.identity.get(h) != b.identity.get(h):
            out.append(f"header {h} {a.identity.get(h)!r} vs {b.identity.get(h)!r}")
    return out


def temperature_zero_verdict(obs: SamplingObservation | None, near_tie: float = 0.1) -> Verdict:
    """The temperature-zero case: the same temperature-0 request answered twice alone must give the
    same text. Two texts FAIL, the cause naming the sampling ("temperature 0 is not honoured":
    a gateway dropping ``temperature``/``seed``, so the server's default sampling applied) -- unless
    the two answers also differ in ``prompt_tokens``, ``system_fingerprint``, ``model`` or an
    identity header, which names more than one deployment behind the endpoint instead (a canary
    split). The first differing token and, with logprobs, both sides' gap there (``near_tie``
    nats: a parting within it is still named, not excused: two lone identical requests have no
    batch or cache state to differ by) are in the message. FAIL: an answer missing; INVALID: no
    golden was answered to ask again, or both answers are empty."""
    gate = f"{GATE}/temperature-zero"
    if obs is None:
        return Verdict(gate, Status.INVALID, "no golden was answered to ask again (answers/golden names why) -> INVALID")
    a, b = obs.first, obs.second
    ev: dict[str, Any] = {"golden": obs.name, "max_tokens": obs.max_tokens, "first": a.to_dict(), "second": b.to_dict()}
    missing = [f"{which}: {x.error}" for which, x in (("first", a), ("second", b)) if not x.ok]
    if missing:
        return Verdict(gate, Status.FAIL, f"{obs.name} asked twice alone at temperature 0: {len(missing)} answer"
                       f"{'s' if len(missing) > 1 else ''} missing (limit 0): {'; '.join(missing)} -> FAIL",
                       measured=len(missing), limit=0, unit="answers", evidence=ev)
    n = len(a.tokens) or len(a.text)
    unit = "tokens" if a.tokens else "characters"
    if not a.text and not b.text and not a.tokens and not b.tokens:
        return Verdict(gate, Status.INVALID, f"{obs.name} asked twice alone at temperature 0: both answers empty, "
                       "nothing to compare -> INVALID", evidence=ev)
    same = a.text == b.text and (not a.tokens or not b.tokens or a.tokens == b.tokens)
    if same:
        return Verdict(gate, Status.PASS, f"{obs.name} asked twice alone at temperature 0 (max_tokens {obs.max_tokens}): "
                       f"the same {n} {unit} both times ({clip(a.text, 60)!r}) -> PASS", measured=1, limit=1,
                       unit="outputs", evidence=ev)
    if a.tokens and b.tokens:
        d = compare_answers(a.answer(), b.answer(), near_tie)
        i = d.position if d.position is not None else 0
        gap = "" if d.gap is None else f", {d.gap:.2f} nats apart by the {'first' if d.by == 'baseline' else 'second'}'s logprobs"
        where = f"token {i}: {d.base_token!r} vs {d.new_token!r}{gap}"
        ev["parting"] = d.to_dict()
    else:
        i = next((k for k, (x, y) in enumerate(zip(a.text, b.text)) if x != y), min(len(a.text), len(b.text)))
        where = f"char {i} (no logprobs)"
    dep = _deployments(a, b)
    ev["differing"] = dep
    head = (f"{obs.name} asked twice alone at temperature 0 (max_tokens {obs.max_tokens}): different text, first "
            f"difference at {where} ({clip(a.text, 50)!r} vs {clip(b.text, 50)!r})")
    unit_word = "token" if a.tokens and b.tokens else "char"
    if dep:
        return Verdict(gate, Status.FAIL, f"{head}; the answers also differ in {', '.join(dep)} -> FAIL", measured=2,
                       limit=1, unit="outputs", evidence=ev,
                       cause=f"more than one deployment answers behind the endpoint (a canary split?): two answers to "
                             f"the same request differ in {', '.join(dep)}")
    return Verdict(gate, Status.FAIL, f"{head} -> FAIL", measured=2, limit=1, unit="outputs", evidence=ev,
                   cause=f"temperature 0 is not honoured: the same request answered twice alone gave different text "
                         f"(first difference at {unit_word} {i})")


def sampling_cause(verdict: Verdict) -> str | None:
    """The temperature-zero case's finding for the other cases' FAILs: its cause when it FAILed
    on two texts, else None."""
    return verdict.cause if verdict.gate == f"{GATE}/temperature-zero" and verdict.status is Status.FAIL else None


@dataclass
class RenderingObservation:
    """How the server renders a conversation with a system turn, by ``/tokenize`` (messages):
    ``with_system`` as sent, ``without_system`` (the system turn left out: a template's default
    system prompt, if it has one, in its place) and ``as_user`` (the same contents, the system
    turn sent as a user turn: a template that renders roles renders it otherwise). ``name``: the
    golden it is (None: kvgate's probe conversation, the profile has no system golden); ``served``:
    the server's ``usage.prompt_tokens`` for it on the chat route (None: not asked or not reported);
    ``serving``: who served that answer, as the gate's answers show it
    (:func:`kvgate.answers.causes.serving_cause`: its response also answered another request, or the
    answers name more than one deployment; None: nothing shows either)."""

    name: str | None
    with_system: Rendering
    without_system: Rendering
    as_user: Rendering
    served: int | None = None
    serving: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"golden": self.name, "served_prompt_tokens": self.served, "with_system": self.with_system.to_dict(),
                "without_system": self.without_system.to_dict(), "system_as_user": self.as_user.to_dict(),
                "serving": self.serving}


def _quoted(r: Rendering, n: int = 32) -> str:
    """The first ``n`` tokens of a rendering as text, quoted (``'<s> You are ...'``), or its count."""
    text = r.text(n)
    if text is None:
        return f"{r.count} token ids"
    return repr(clip(text + (" ..." if r.count and r.count > n else ""), 120))


def rendering_cause(obs: RenderingObservation | None) -> str | None:
    """What the rendering shows that makes the model answer another prompt, or None: the template
    renders a system turn like a user turn (it drops roles); it renders the conversation alike with
    and without its system turn (it drops the system message); the server counted the rendering
    without the system turn (it never arrived) -- unless the answers show who else served that count
    (``obs.serving``: a cache's or another deployment's count looks alike; :class:`Suspects` carries
    that one)."""
    if obs is None or not obs.with_system.ok:
        return None
    w, wo, u = obs.with_system, obs.without_system, obs.as_user
    if u.ok and u.ids == w.ids:
        return (f"the chat template drops roles: /tokenize renders a system turn and a user turn alike ({w.count} tokens "
                f"either way: {_quoted(w)}): the model cannot tell who said what")
    if wo.ok and wo.ids == w.ids:
        return (f"the chat template drops the system message: /tokenize renders the conversation with and without its "
                f"system turn to the same {w.count} tokens")
    if obs.served is not None and wo.ok and obs.served == wo.count != w.count and obs.serving is None:
        return system_dropped_cause(obs.served)
    return None


def system_message_verdict(obs: RenderingObservation) -> Verdict:
    """The system-message case: the server's ``usage.prompt_tokens`` for a golden with a system
    turn against ``/tokenize`` of the messages sent with it and without it. Equal to the rendering
    with it: PASS; equal to the rendering without it (a template's default system prompt included,
    as the server would render it): FAIL, the system message never reached the server; a template
    rendering both alike: FAIL, it drops the system message. Both renderings of one length (a count
    cannot tell them apart) or the count equal to neither: INCONCLUSIVE. A count other than the
    rendering with the system turn while ``obs.serving`` shows who else served it (a cache in
    front, more than one deployment): FAIL, that the cause. SKIP without ``/tokenize``; INVALID
    when the server reported no ``prompt_tokens``."""
    gate = f"{GATE}/system-message"
    ev = obs.to_dict()
    w, wo = obs.with_system, obs.without_system
    for r in (w, wo):
        if not r.ok:
            return Verdict(gate, SKIP, f"the server renders no conversation for kvgate to count ({r.error}): the "
                           "system message's arrival cannot be measured without /tokenize -> SKIP", evidence=ev)
    name, s = obs.name, obs.served
    if s is None:
        return Verdict(gate, Status.INVALID, f"{name}: the server reported no usage.prompt_tokens on the chat route: "
                       "nothing to compare with the renderings -> INVALID", evidence=ev)
    counts = f"{w.count} with the system turn, {wo.count} without"
    if w.ids == wo.ids:
        return Verdict(gate, Status.FAIL, f"{name}: /tokenize renders the conversation with and without its system "
                       f"turn to the same {w.count} tokens; the server counted {s} -> FAIL (the system message must "
                       "reach the model)", measured=s, limit=w.count, unit="tokens", evidence=ev,
                       cause=rendering_cause(obs))
    if s == w.count and w.count != wo.count:
        return Verdict(gate, Status.PASS, f"{name}: the server counted {s} prompt tokens = the rendering with the "
                       f"system turn ({counts}) -> PASS", measured=s, limit=w.count, unit="tokens", evidence=ev)
    if obs.serving is not None and s != w.count:
        alike = " (= the rendering without it, as a dropped system turn would count)" if s == wo.count else ""
        return Verdict(gate, Status.FAIL, f"{name}: the answer counted {s} prompt tokens{alike}, not the rendering "
                       f"with the system turn ({counts}); the answers show who served it: {obs.serving} -> FAIL (an "
                       "answer must be to its own conversation, system message included)", measured=s,
                       limit=w.count, unit="tokens", evidence=ev, cause=obs.serving)
    if s == wo.count and w.count != wo.count:
        return Verdict(gate, Status.FAIL, f"{name}: the server counted {s} prompt tokens = the rendering without the "
                       f"system turn ({counts}) -> FAIL (the system message must reach the model)", measured=s,
                       limit=w.count, unit="tokens", evidence=ev, cause=system_dropped_cause(s))
    if w.count == wo.count:
        return Verdict(gate, Status.INCONCLUSIVE, f"{name}: the server counted {s} prompt tokens; the conversation "
                       f"renders to {w.count} tokens with and without its system turn -> INCONCLUSIVE (a count cannot "
                       "tell them apart)", measured=s, limit=w.count, unit="tokens", evidence=ev,
                       cause=f"the evidence cannot tell: both renderings are {w.count} tokens long")
    return Verdict(gate, Status.INCONCLUSIVE, f"{name}: the server counted {s} prompt tokens, neither rendering ({counts}) "
                   "-> INCONCLUSIVE", measured=s, limit=w.count, unit="tokens", evidence=ev,
                   cause="the evidence cannot tell: the server's count matches neither rendering, so whether the "
                         "system turn arrived is unknown (answers/input-paths compares the input paths)")


# ------------------------------------------------------------------------------------------------
# long context: the prompt is read, not only accepted


def _lengths(obs: list[NeedleObservation]) -> str:
    """``512 and 921 tokens``."""
    ns = sorted({o.prompt.tokens for o in obs})
    return (", ".join(map(str, ns[:-1])) + " and " if len(ns) > 1 else "") + f"{ns[-1]} tokens"


def long_context_verdict(spec: LongContextSpec, obs: list[NeedleObservation], max_model_len: int) -> Verdict:
    """The long-context case: each pass-key prompt (:mod:`kvgate.answers.needle`) asked
    non-streamed and streamed. FAIL: an answer missing; on a path, a depth whose key no length
    retrieved (the region of the prompt there does not reach the model; single misses of a healthy
    model are scattered, a dropped region misses at every length); fewer than ``min_retrieved`` of
    all answers holding their key. Otherwise PASS, naming every cell not retrieved. The cause, when
    measured: the server's ``usage.prompt_tokens`` below the prompt's verified length (the prompt
    was shortened before the model). INVALID: no prompt was asked."""
    gate = f"{GATE}/long-context"
    rows = [o.record() for o in obs]
    ev: dict[str, Any] = {"cells": rows, "max_model_len": max_model_len, "depths": spec.depths,
                          "lengths": spec.lengths, "route": spec.route, "min_retrieved": spec.min_retrieved,
                          "rule": "FAIL when a depth is retrieved at no length on a path, or fewer than min_retrieved "
                                  "of all answers hold their key"}
    if not obs:
        return Verdict(gate, Status.INVALID, "no pass-key prompt was asked -> INVALID", evidence=ev)
    errors = [f"{o.prompt.cell} ({path}): {a.error}" for o in obs for path, a in o.answers().items() if not a.ok]
    if errors:
        return Verdict(gate, Status.FAIL, f"{len(errors)} pass-key answers missing (limit 0): {'; '.join(errors[:2])} "
                       "-> FAIL", measured=len(errors), limit=0, unit="answers", evidence=ev)
    depths = sorted({o.prompt.depth for o in obs})
    total = len(obs) * len(PATHS)
    got = sum(o.got(path) for o in obs for path in PATHS)
    frac = got / total
    shortened = [f"the server counted {a.prompt_tokens} prompt tokens of the {o.prompt.tokens}-token prompt sent "
                 f"({o.prompt.cell}, {path})" for o in obs for path, a in o.answers().items()
                 if a.prompt_tokens is not None and a.prompt_tokens < o.prompt.tokens]
    cause = f"the prompt was shortened before the model: {shortened[0]}" if shortened else None
    ev["shortened"] = shortened

    def said(o: NeedleObservation, path: str) -> str:
        return f"{o.prompt.tokens} tokens, key at token {o.prompt.key_at}: {clip(o.answers()[path].text, 30)!r}"

    lost: list[str] = []
    for d in depths:
        at = [o for o in obs if o.prompt.depth == d]
        gone = [path for path in PATHS if not any(o.got(path) for o in at)]
        if gone:
            way = "streamed or not" if len(gone) == len(PATHS) else gone[0]
            lost.append(f"depth {d:.0%} at no length, {way} ({'; '.join(said(o, gone[0]) for o in at)})")
    misses = [f"{o.prompt.cell} ({', '.join(p for p in PATHS if not o.got(p))}: "
              f"{clip(o.answers()[next(p for p in PATHS if not o.got(p))].text, 30)!r})"
              for o in obs if not all(o.got(p) for p in PATHS)]
    ev["not_retrieved"] = misses
    ev["lost_depths"] = lost
    head = (f"pass key retrieved in {got} of {total} answers ({len(obs)} prompts of {_lengths(obs)}, "
            f"{' and '.join(f'{f:.0%}' for f in spec.lengths)} of max_model_len {max_model_len}, at depths "
            f"{'/'.join(f'{d:.0%}'.rstrip('%') for d in depths)}%, {spec.route}, streamed and not)")
    if lost:
        return Verdict(gate, Status.FAIL, f"{head}; not retrieved: {'; '.join(lost)}; answers.long_context: every "
                       "depth retrieved at one length at least -> FAIL (a depth no length retrieves is a region of the "
                       "prompt the model does not read)", measured=round(frac, 4), limit=spec.min_retrieved,
                       unit="fraction", evidence=ev, cause=cause)
    if frac < spec.min_retrieved:
        return Verdict(gate, Status.FAIL, f"{head}: {frac:.0%} < answers.long_context.min_retrieved "
                       f"{spec.min_retrieved:.0%}; not retrieved: {'; '.join(misses[:4])} -> FAIL",
                       measured=round(frac, 4), limit=spec.min_retrieved, unit="fraction", evidence=ev, cause=cause)
    tail = f"; not retrieved: {'; '.join(misses[:4])}" if misses else ""
    return Verdict(gate, Status.PASS, f"{head}: every depth retrieved, {frac:.0%} >= min_retrieved "
                   f"{spec.min_retrieved:.0%}{tail} -> PASS", measured=round(frac, 4), limit=spec.min_retrieved,
                   unit="fraction", evidence=ev)
