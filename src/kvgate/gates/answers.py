"""Pure verdicts of the answers gate: the answers are right, not only well-formed.

Every other gate proves *how* a server answers; a deployment that streams nonsense with perfect
framing passes them all. The silent 200s this gate exists for (public reports): an fp8 KV cache
coherent on one turn and garbage from the second (vllm#38652); speculative decoding whose acceptance
collapses (vllm#36872); ``!!!!!!!!`` after ``wake_up`` (vllm#29341); a second BOS on one input path
only (swiss-ai/model-launch PR#173); the prompt's own text in the first streamed delta of a token-id
prompt (vllm#48853); Hangul turned into U+FFFD by a frontend (dynamo#12630); temperature-0 outputs
that change with the batch (vllm#51187).

Cases (ids ``PROFILE/answers/CASE``): ``golden``, ``accuracy``, ``degeneration``, ``multibyte``,
``input-paths``, ``multi-turn``, ``determinism``. Observations in (:mod:`kvgate.answers`), a
:class:`~kvgate.verdict.Verdict` out; no I/O. Each FAIL quotes the prompt and what came back.

The golden rule (docs/answers.md): a golden whose expectation is missed has *flipped*; a
flip FAILs when the golden's reference margin (by how much the right answer won on the reference
deployment, nats) is at least ``answers.confident_margin`` or unknown; flips of *fragile* goldens
(margin below it: a kernel, dtype or batch change may flip them honestly) are named with their
margins and FAIL only beyond ``answers.max_fragile_flips``. The accuracy case judges the whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvgate.answers.checks import char_diff, clip, expectation_match, margin, multibyte_findings
from kvgate.answers.observe import Asked
from kvgate.answers.task import difference_interval, interval
from kvgate.compare.golden import compare_answers
from kvgate.gates.common import FAIL, PASS, SKIP
from kvgate.profile.models import AnswersSpec, GoldenSpec, Profile
from kvgate.verdict import Status, Verdict

if TYPE_CHECKING:
    from kvgate.answers.seen import Seen

GATE = "answers"
#: In run order: degeneration last, over every answer the others collected.
CASES = ("golden", "accuracy", "multibyte", "input-paths", "multi-turn", "determinism", "degeneration")


def not_declared(case: str, profile: Profile) -> Verdict | None:
    """The SKIP of a case the profile does not ask for (no ``answers:`` section, no goldens, no
    accuracy task), else None."""
    a = profile.answers
    if a is None:
        return Verdict(f"{GATE}/{case}", SKIP, "the profile has no answers section (answers.goldens, "
                       "answers.accuracy) -> SKIP")
    if case in ("golden", "determinism") and not a.goldens:
        return Verdict(f"{GATE}/{case}", SKIP, "the profile declares no golden prompts (answers.goldens) -> SKIP")
    if case == "input-paths" and not any(g.messages is not None for g in a.goldens):
        return Verdict(f"{GATE}/{case}", SKIP, "the profile declares no chat golden to ask three ways (answers.goldens "
                       "with messages) -> SKIP")
    if case == "multi-turn" and not a.memory:
        return Verdict(f"{GATE}/{case}", SKIP, "the profile declares no multi-turn conversations (answers.memory) -> SKIP")
    if case == "accuracy" and a.accuracy is None:
        return Verdict(f"{GATE}/{case}", SKIP, "the profile declares no accuracy task (answers.accuracy) -> SKIP")
    return None


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


def golden_verdict(answers: AnswersSpec, obs: list[GoldenObservation], near_tie: float = 0.1) -> Verdict:
    """The golden case (rule in the module docstring). Also FAIL: a golden not answered (HTTP
    error, broken stream), or its streamed text parting from the non-streamed one beyond a near
    tie (``near_tie`` nats, by either side's logprobs)."""
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
                       measured=len(parted), limit=0, unit="goldens", evidence=ev)
    if confident_flips:
        return Verdict(gate, Status.FAIL, f"{head}: {'; '.join(confident_flips[:4])}"
                       f"{'; ...' if len(confident_flips) > 4 else ''} -> FAIL (a confident golden must not flip)",
                       measured=len(confident_flips), limit=0, unit="goldens", evidence=ev)
    if len(fragile_flips) > answers.max_fragile_flips:
        return Verdict(gate, Status.FAIL, f"{head}: {'; '.join(fragile_flips[:4])} -> FAIL ({len(fragile_flips)} "
                       f"fragile flips, answers.max_fragile_flips {answers.max_fragile_flips})",
                       measured=len(fragile_flips), limit=answers.max_fragile_flips, unit="goldens", evidence=ev)
    if n == 0:
        return Verdict(gate, Status.INVALID, "no golden was asked -> INVALID", evidence=ev)
    tail = f"; fragile flips within {answers.max_fragile_flips}: {'; '.join(fragile_flips)}" if fragile_flips else ""
    shown = "; ".join(f"{rows[name]['prompt']!r} -> {clip(rows[name]['answer'], 50)!r}" for name in right[:3])
    return Verdict(gate, Status.PASS, f"{head}, streamed == non-streamed (e.g. {shown}){tail} -> PASS",
                   measured=len(right), limit=n, unit="goldens", evidence=ev)


def accuracy_verdict(answers: AnswersSpec, rows: list[dict[str, Any]], source: str) -> Verdict:
    """The accuracy case: ``rows`` from :func:`kvgate.answers.task.scored`. The limit is
    ``min_accuracy``, else the recorded accuracy x (1 - ``tolerance``). PASS when the accuracy is at
    or above it; FAIL when the interval's upper bound is below it (confidently worse); else
    INCONCLUSIVE (the items cannot tell). An item not answered counts as wrong; INVALID when more
    than half were not answered (the task measured the transport, not the model)."""
    gate = f"{GATE}/accuracy"
    a = answers.accuracy
    assert a is not None
    n = len(rows)
    k = sum(1 for r in rows if r["correct"])
    unanswered = sum(1 for r in rows if not r["answered"])
    lo, hi = interval(k, n, a.confidence)
    acc = k / n if n else 0.0
    conf = f"{a.confidence:.0%}"
    ev: dict[str, Any] = {"task": source, "items": n, "correct": k, "unanswered": unanswered,
                          "interval": [round(lo, 4), round(hi, 4)], "confidence": a.confidence,
                          "wrong": [r for r in rows if not r["correct"]][:40]}
    head = f"{k} of {n} items right on {source}: accuracy {acc:.1%} ({conf} CI {lo:.1%}..{hi:.1%})"
    if n == 0 or unanswered * 2 > n:
        return Verdict(gate, Status.INVALID, f"{head}; {unanswered} not answered -> INVALID", evidence=ev)
    recorded = None
    if a.recorded_correct is not None and a.recorded_items:
        k0, n0 = a.recorded_correct, a.recorded_items
        d, dlo, dhi = difference_interval(k, n, k0, n0, a.confidence)
        recorded = k0 / n0
        ev["recorded"] = {"correct": k0, "items": n0, "difference": round(d, 4), "difference_interval": [round(dlo, 4), round(dhi, 4)]}
        head += f"; vs recorded {k0}/{n0} ({recorded:.1%}): {d * 100:+.1f} points ({conf} CI {dlo * 100:+.1f}..{dhi * 100:+.1f})"
    if a.min_accuracy is not None:
        limit, why = a.min_accuracy, "answers.accuracy.min_accuracy"
    elif recorded is not None:
        limit, why = recorded * (1 - a.tolerance), f"recorded x (1 - {a.tolerance:g})"
    else:
        return Verdict(gate, Status.SKIP, f"{head}; no limit declared (answers.accuracy.min_accuracy or "
                       "recorded_correct/recorded_items) -> SKIP", measured=round(acc, 4), unit="fraction", evidence=ev)
    ev["limit"] = round(limit, 4)
    wrong = [r for r in rows if not r["correct"]][:2]
    eg = "; e.g. " + "; ".join(f"{r['id']}: {clip(r['answer'], 50)!r}" for r in wrong) if wrong else ""
    if acc >= limit:
        return Verdict(gate, Status.PASS, f"{head}; accuracy {acc:.1%} >= {limit:.1%} ({why}) -> PASS", measured=round(acc, 4),
                       limit=round(limit, 4), unit="fraction", evidence=ev)
    if hi < limit:
        return Verdict(gate, Status.FAIL, f"{head}; upper bound {hi:.1%} < {limit:.1%} ({why}) -> FAIL{eg}",
                       measured=round(acc, 4), limit=round(limit, 4), unit="fraction", evidence=ev)
    return Verdict(gate, Status.INCONCLUSIVE, f"{head}; below {limit:.1%} ({why}) but its upper bound {hi:.1%} is not: "
                   f"{n} items cannot tell -> INCONCLUSIVE{eg}", measured=round(acc, 4), limit=round(limit, 4),
                   unit="fraction", evidence=ev)


def degeneration_verdict(answers: AnswersSpec, seen: "Seen | list[tuple[str, str, str | None]]") -> Verdict:
    """The degeneration case over every answer the run saw (:class:`kvgate.answers.seen.Seen`; a
    list of ``(source, text, finish_reason)`` is scanned strictly): U+FFFD, repetition loops, empty
    content where text is due, token soup (:func:`kvgate.answers.checks.degeneration`) in answers
    that ended on their own; U+FFFD and control characters only in the load gates' and the soak's
    ``ignore_eos`` outputs. FAIL naming the first few, quoted."""
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
                       measured=seen.found, limit=0, unit="answers", evidence=ev)
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


def multibyte_verdict(obs: list[MultibyteObservation]) -> Verdict:
    """The multibyte case: no U+FFFD or lone surrogate in any answer, and the streamed text equal
    to the non-streamed one character for character (same temperature, same seed): a dropped,
    doubled or mangled multibyte character shows as a difference. The prompts' scripts must have
    reached the model intact (the answer is not checked for the script: a small model may answer in
    English)."""
    gate = f"{GATE}/multibyte"
    bad: list[str] = []
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
    ev = {"prompts": rows}
    if not obs:
        return Verdict(gate, Status.INVALID, "no multibyte prompt was asked -> INVALID", evidence=ev)
    if bad:
        return Verdict(gate, Status.FAIL, f"{len(bad)} multibyte findings (limit 0) in {len(obs)} prompt pairs: "
                       f"{'; '.join(bad[:3])} -> FAIL", measured=len(bad), limit=0, unit="findings", evidence=ev)
    names = sorted({o.name for o in obs})
    temps = sorted({o.temperature for o in obs})
    return Verdict(gate, Status.PASS, f"{len(obs)} prompt pairs ({', '.join(names)}; temperature "
                   f"{', '.join(f'{t:g}' for t in temps)}): no U+FFFD, streamed == non-streamed character for "
                   "character -> PASS", measured=0, limit=0, unit="findings", evidence=ev)


@dataclass
class PathsObservation:
    """One conversation asked three ways: ``chat`` (messages), ``text`` (the ``/tokenize``-rendered
    prompt on completions), ``ids`` (the rendered token ids on completions), each plain and
    streamed; ``rendered_ids`` the ids ``/tokenize`` rendered; ``prompt_text`` the rendered text."""

    name: str
    rendered_ids: list[int]
    prompt_text: str
    answers: dict[str, Asked]


def input_paths_verdict(obs: list[PathsObservation]) -> Verdict:
    """The input-paths case: every path's ``usage.prompt_tokens`` equals the rendered count (one
    more on one path: a second BOS or the template applied twice), every path's temperature-0
    answer is the same, and no streamed first delta carries the prompt's own text."""
    gate = f"{GATE}/input-paths"
    bad: list[str] = []
    rows: dict[str, Any] = {}
    for o in obs:
        n = len(o.rendered_ids)
        row: dict[str, Any] = {"rendered_tokens": n, "paths": {k: a.to_dict() for k, a in o.answers.items()}}
        rows[o.name] = row
        ref = o.answers.get("chat")
        for key, a in o.answers.items():
            if not a.ok:
                bad.append(f"{o.name} {key}: {a.error}")
                continue
            if a.prompt_tokens is not None and a.prompt_tokens != n:
                extra = a.prompt_tokens - n
                what = "a second BOS or the template applied twice" if extra > 0 else "tokens dropped"
                bad.append(f"{o.name} {key}: prompt_tokens {a.prompt_tokens} vs {n} rendered ({extra:+d}: {what})")
            tail = o.prompt_text[-40:].strip()
            if a.first_delta and tail and len(tail) >= 8 and tail in a.first_delta:
                bad.append(f"{o.name} {key}: the first streamed delta carries the prompt's text "
                           f"({clip(a.first_delta, 60)!r})")
            if ref is not None and ref.ok and a is not ref and (diff := char_diff(ref.text, a.text)):
                bad.append(f"{o.name} {key} answers otherwise than chat {diff}")
    ev = {"conversations": rows}
    if not obs:
        return Verdict(gate, Status.INVALID, "no conversation was asked -> INVALID", evidence=ev)
    if bad:
        return Verdict(gate, Status.FAIL, f"{len(bad)} disagreements between input paths (limit 0): {'; '.join(bad[:3])} -> FAIL",
                       measured=len(bad), limit=0, unit="findings", evidence=ev)
    paths = sorted({k for o in obs for k in o.answers})
    return Verdict(gate, Status.PASS, f"{len(obs)} conversations, {len(paths)} paths each ({', '.join(paths)}): "
                   f"the same prompt_tokens as rendered ({', '.join(str(len(o.rendered_ids)) for o in obs)}), the "
                   "same temperature-0 answer, no prompt text in a first delta -> PASS", measured=0, limit=0,
                   unit="findings", evidence=ev)


@dataclass
class MemoryObservation:
    """A conversation whose last question depends on an earlier turn: the golden spec and its answer."""

    spec: GoldenSpec
    answer: Asked


def memory_verdict(obs: list[MemoryObservation]) -> Verdict:
    """The multi-turn case: each answer meets its expectation (the fact given in an earlier turn)."""
    gate = f"{GATE}/multi-turn"
    bad, rows = [], {}
    for o in obs:
        if not o.answer.ok:
            bad.append(f"{o.spec.name}: {o.answer.error}")
            continue
        met, _, what = expectation_match(o.spec.expect, o.answer.text)
        rows[o.spec.name] = {"turns": len(o.spec.messages or []), "answer": o.answer.text[:300], "expected": what, "met": met}
        if not met:
            first = (o.spec.messages or [{}])[0].get("content", "")
            bad.append(f"{o.spec.name}: turn 1 said {clip(first, 50)!r}; asked {_prompt_of(o.spec)!r} -> "
                       f"{clip(o.answer.text, 60)!r}, expected {what}")
    ev = {"conversations": rows}
    if not obs:
        return Verdict(gate, Status.INVALID, "no multi-turn conversation was asked -> INVALID", evidence=ev)
    if bad:
        return Verdict(gate, Status.FAIL, f"{len(bad)} of {len(obs)} answers forget an earlier turn (limit 0): {'; '.join(bad[:2])} "
                       "-> FAIL", measured=len(bad), limit=0, unit="conversations", evidence=ev)
    eg = "; ".join(f"{n}: {clip(r['answer'], 40)!r}" for n, r in list(rows.items())[:2])
    return Verdict(gate, Status.PASS, f"{len(obs)} conversation{'s' if len(obs) != 1 else ''} answered from an "
                   f"earlier turn ({eg}) -> PASS",
                   measured=0, limit=0, unit="conversations", evidence=ev)


def determinism_verdict(spec: AnswersSpec, runs: dict[str, list[Asked]]) -> Verdict:
    """The determinism case: ``runs`` maps a golden to its answers (the first alone, the rest each
    inside a concurrent batch). Answers that part from the first beyond a near tie (by either side's
    logprobs, ``determinism.near_tie_logprob``) are distinct outputs; FAIL when a prompt has more than
    ``determinism.max_distinct``. Near-tie partings are counted and named, not failed."""
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
            diff = compare_answers(distinct[0].answer(), a.answer(), d.near_tie_logprob)
            if diff.kind == "near-tie":
                tie_here += 1
                continue
            distinct.append(a)
        rows[name] = {"answers": len(ok), "distinct": len(distinct), "near_ties": tie_here,
                      "texts": sorted({a.text[:160] for a in ok})}
        if tie_here:
            ties.append(f"{name} ({tie_here})")
        if len(distinct) > d.max_distinct:
            over.append(f"{name}: {len(distinct)} distinct outputs in {len(ok)} ({clip(distinct[0].text, 40)!r} alone vs "
                        f"{clip(distinct[1].text, 40)!r} in a batch of {d.batch})")
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
                       limit=d.max_distinct, unit="outputs", evidence=ev)
    tail = f"; near ties (<= {d.near_tie_logprob:g} nats) parted {', '.join(ties)}" if ties else ""
    n = sum(r["answers"] for r in rows.values())
    return Verdict(gate, Status.PASS, f"{len(rows)} prompts x {n // max(1, len(rows))} answers (alone, then in "
                   f"{d.repeats} concurrent batch{'es' if d.repeats != 1 else ''} of {d.batch}): at most {worst} distinct output per prompt{tail} "
                   f"-> PASS", measured=worst, limit=d.max_distinct, unit="outputs", evidence=ev)
