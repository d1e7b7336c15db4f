"""Pure verdicts of the compare gate: the new revision against the one it replaces -- the same
requests to both -- must render the same prompts to the same tokens, must not drift in its
temperature-0 outputs beyond near ties, must not be slower beyond the profile's allowance, and must
not lose a serve feature the baseline had. A rendering that changed is its own regression, judged
before the answers, and the cause of the answers that drifted with it.

The failures only a comparison sees are silent 200s (public reports): fp8 KV cache coherent on
one turn and garbage on multi-turn prompts (vllm#38652; ``fp8_e5m2``, #41343); ``'!!!!'`` after
sleep/wake (vllm#29341) or fp8 scales reset on wake (PR#45617); KV offload answering other tokens
on a warm-cache hit at temperature 0 (LMCache#2206); an adapter serving base-model output
(vllm#55193); a chat template or tokenizer changed with the image. Near ties are not drift: a
cold vs warm prefix cache flips them (vllm#40896), so outputs are compared by logprobs
(:func:`kvgate.answers.tokendiff.compare_answers`). Inputs are observations; no I/O here.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from scipy import stats as _st

from kvgate.answers.needle import PATHS
from kvgate.compare.contract import CONTRACT_GATES, diff, normal
from kvgate.answers.tokendiff import Answer, Difference, compare_answers
from kvgate.compare.golden import GoldenPrompt
from kvgate.compare.latency import METRICS, Pairs, summary
from kvgate.gates.common import FAIL, PASS, SKIP
from kvgate.http.rendering import Rendering, parting
from kvgate.profile.models import Profile
from kvgate.stats.confidence import FAIL as J_FAIL, PASS as J_PASS, UNDECIDED, min_samples_to_pass
from kvgate.stats.twosample import QuantileRatio, judge_quantile_ratio
from kvgate.verdict import Status, Verdict

GATE = "compare"
CASES = ("rendering", "outputs", "latency", "features", "contract", "long-context")
CLIP = 80


def no_baseline_verdict(case: str, why: str) -> Verdict:
    """The SKIP of a compare case with nothing to compare against (``why``)."""
    return Verdict(f"{GATE}/{case}", SKIP, f"{why} -> SKIP")


def _clip(text: str) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= CLIP else text[:CLIP - 3] + "..."


def _where(name: str, d: Difference, base: Answer, new: Answer) -> str:
    if d.how == "text":
        return (f"{name} parts at character {d.position} (no logprobs: compared as text): baseline "
                f"{_clip(base.text)!r} vs new {_clip(new.text)!r}")
    gap = "neither side ranks the other's token in its top logprobs" if d.gap is None else \
        f"{d.gap:.2f} nats apart by the {d.by}'s logprobs"
    return (f"{name} parts at token {d.position}: baseline {d.base_token!r} vs new {d.new_token!r} ({gap}); "
            f"baseline {_clip(base.text)!r} vs new {_clip(new.text)!r}")


def rendering_changes(prompts: list[GoldenPrompt], base: dict[str, Answer], new: dict[str, Answer],
                      base_r: dict[str, Rendering], new_r: dict[str, Rendering]) -> tuple[dict[str, str], list[str], list[str]]:
    """``(changed, same, not_recorded)``: each prompt whose rendering differs between the two sides
    (prompt -> how, in words: the ``/tokenize`` renderings' lengths and first differing token, else
    the servers' ``usage.prompt_tokens``), the prompts that render alike, and those the baseline
    holds no rendering of (neither a ``/tokenize`` rendering nor a prompt count: not recorded)."""
    changed: dict[str, str] = {}
    same, unrecorded = [], []
    for p in prompts:
        br, nr = base_r.get(p.name), new_r.get(p.name)
        bc = base[p.name].prompt_tokens if p.name in base else None
        nc = new[p.name].prompt_tokens if p.name in new else None
        what = "messages render" if p.route == "chat" else "text tokenizes"
        if br is not None and br.ok and nr is not None and nr.ok:
            at = parting(nr, br)
            if at is not None:
                i, here, there = at
                lengths = f"to {nr.count} tokens here and {br.count} on the baseline" if nr.count != br.count else                     f"to {nr.count} tokens on both"
                changed[p.name] = f"the same {what} {lengths}; first difference at token {i}: {here} vs {there}"
                continue
            if bc is not None and nc is not None and bc != nc:
                changed[p.name] = (f"/tokenize renders it alike ({nr.count} tokens) but the server counts {nc} prompt "
                                   f"tokens here and {bc} on the baseline")
                continue
            same.append(p.name)
        elif bc is not None and nc is not None:
            if bc != nc:
                changed[p.name] = f"the same {what} to {nc} tokens here and {bc} on the baseline (usage.prompt_tokens)"
            else:
                same.append(p.name)
        else:
            unrecorded.append(p.name)
    return changed, same, unrecorded


def rendering_verdict(prompts: list[GoldenPrompt], base: dict[str, Answer], new: dict[str, Answer],
                      base_r: dict[str, Rendering], new_r: dict[str, Rendering], label: str,
                      suspect: str | None = None) -> Verdict:
    """The rendering case: every golden prompt renders to the same tokens here as on the baseline
    (:func:`rendering_changes`). FAIL naming the first differing token of each changed prompt, the
    cause telling a chat template (conversations changed, text prompts alike) from a tokenizer (text
    changed) where the prompts measured can; ``suspect``: what the answers gate measured of this
    server's rendering (its template drops roles), added to the cause. SKIP when the baseline holds
    no rendering to compare with (a golden file recorded before kvgate recorded them)."""
    gate = f"{GATE}/rendering"
    changed, same, unrecorded = rendering_changes(prompts, base, new, base_r, new_r)
    ev: dict[str, Any] = {"baseline": label, "changed": changed, "same": same, "not_recorded": unrecorded,
                          "new": {n: r.to_dict() for n, r in new_r.items()}}
    m = len(changed) + len(same)
    note = f"; {len(unrecorded)} not recorded on the baseline ({', '.join(unrecorded[:3])})" if unrecorded else ""
    if m == 0:
        return Verdict(gate, SKIP, f"the {label} holds no rendering of its {len(prompts)} golden prompts to compare with "
                       "(a golden file recorded before kvgate recorded them: not recorded) -> SKIP", evidence=ev)
    if changed:
        routes = {p.route for p in prompts if p.name in changed}
        text_same = any(p.route == "completions" for p in prompts if p.name in same)
        first = next(iter(changed))
        if routes == {"chat"} and text_same:
            why = "the chat template changed: text prompts tokenize alike on both, conversations render otherwise"
        elif "completions" in routes:
            why = "the tokenizer changed: the same text tokenizes otherwise"
        else:
            why = "the chat template or the tokenizer changed"
        cause = f"{why} ({first}: {changed[first]})" + (f"; {suspect}" if suspect else "")
        shown = "; ".join(f"{n}: {d}" for n, d in list(changed.items())[:2])
        return Verdict(gate, FAIL, f"{len(changed)} of {m} golden prompts render otherwise here than on the {label} "
                       f"(limit 0): {shown}{note} -> FAIL", measured=len(changed), limit=0, unit="prompts",
                       evidence=ev, cause=cause)
    return Verdict(gate, PASS, f"{m} golden prompts render alike here and on the {label} (the same /tokenize tokens "
                   f"or prompt_tokens){note} -> PASS", measured=0, limit=0, unit="prompts", evidence=ev)


def outputs_verdict(profile: Profile, prompts: list[GoldenPrompt], base: dict[str, Answer], new: dict[str, Answer],
                    label: str, logprobs: bool = True, changed: dict[str, str] | None = None,
                    suspects: str | None = None) -> Verdict:
    """The outputs case: each golden prompt's new answer against the baseline's
    (:func:`~kvgate.answers.tokendiff.compare_answers` at ``compare.near_tie_logprob``). A prompt the
    baseline did not answer is left out (noted); one the new revision did not answer counts as
    drift. FAIL when drifted prompts / compared prompts > ``compare.max_drift_fraction``; INVALID
    when no prompt could be compared. ``label``: what the baseline is (for the message).
    The cause of a FAIL: drifted prompts whose rendering changed (``changed``: prompt -> how, from
    :func:`rendering_changes`) were answers to other prompts; ``suspects``: what this run measured
    elsewhere (the answers gate: temperature 0 not honoured, a template dropping roles)."""
    c = profile.compare
    gate = f"{GATE}/outputs"
    diffs: dict[str, Difference] = {}
    left_out: list[str] = []
    for p in prompts:
        b, n = base.get(p.name), new.get(p.name)
        if b is None or not b.ok:
            left_out.append(f"{p.name} ({'not recorded' if b is None else b.error})")
            continue
        if n is None or not n.ok:
            diffs[p.name] = Difference("drift", None, None, None, None, None, "none")
            continue
        diffs[p.name] = compare_answers(b, n, c.near_tie_logprob)
    ev: dict[str, Any] = {
        "baseline": label, "near_tie_logprob": c.near_tie_logprob, "logprobs": logprobs, "left_out": left_out,
        "prompts": {name: {**d.to_dict(), "baseline_text": base[name].text[:400],
                           "new_text": (new[name].text if name in new else "")[:400],
                           "new_error": new[name].error if name in new else "not sent"} for name, d in diffs.items()}}
    m = len(diffs)
    stopped = next((b.error for b in base.values() if b.error and b.error.startswith("not sent: ")), None)
    if m == 0:
        return Verdict(gate, Status.INVALID, f"no golden prompt could be compared: the {label} answered none of "
                       f"{len(prompts)} ({'; '.join(left_out[:3])}) -> INVALID", measured=0, limit=len(prompts),
                       unit="prompts", evidence=ev)
    kinds = {k: [n for n, d in diffs.items() if d.kind == k] for k in ("identical", "near-tie", "drift")}
    drift = kinds["drift"]
    allowed = math.floor(c.max_drift_fraction * m + 1e-9)
    head = (f"{m} golden prompts vs the {label}: {len(kinds['identical'])} identical, {len(kinds['near-tie'])} "
            f"parted at a near tie (<= {c.near_tie_logprob:g} nats), {len(drift)} drifted")
    if not logprobs:
        head += " (an endpoint refused logprobs: compared as text, every difference counted as drift)"
    if left_out:
        head += f"; {len(left_out)} left out, the baseline had no answer: {', '.join(left_out[:3])}"
    if drift:
        first = drift[0]
        d = diffs[first]
        if d.how == "none":
            where = f"{first}: the new revision did not answer ({new[first].error if first in new else 'not sent'})"
        else:
            where = _where(first, d, base[first], new[first])
        status = FAIL if len(drift) > allowed else PASS
        allow = f"{c.max_drift_fraction:.0%} of {m} = {allowed} allowed (compare.max_drift_fraction)"
        msg = (f"{head} ({', '.join(drift[:6])}{', ...' if len(drift) > 6 else ''}) -> {status.value} "
               f"({len(drift)} drifted, {allow}); first: {where}")
        cause = None
        if status == FAIL:
            rendered = [n for n in drift if n in (changed or {})]
            found = [f"{len(rendered)} of the {len(drift)} drifted prompts render otherwise than on the baseline "
                     f"(compare/rendering; {rendered[0]}: {changed[rendered[0]]}): those answers are to other prompts"
                     ] if rendered and changed else []
            cause = "; ".join(found + ([suspects] if suspects else [])) or None
        return Verdict(gate, Status(status), msg, measured=len(drift), limit=allowed, unit="prompts", evidence=ev,
                       cause=cause)
    if stopped:  # the baseline hung part way: what was compared agrees, the rest is unknown
        return Verdict(gate, Status.INVALID, f"{head}; {stopped.removeprefix('not sent: ')}: only {m} of "
                       f"{len(prompts)} golden prompts compared -> INVALID", measured=0, limit=allowed,
                       unit="prompts", evidence=ev)
    ties = kinds["near-tie"]
    if ties:
        d = diffs[ties[0]]
        head += f"; e.g. {ties[0]} at token {d.position}, {d.gap:.3f} nats apart"
    return Verdict(gate, Status.PASS, f"{head} -> PASS", measured=0, limit=allowed, unit="prompts", evidence=ev)


def latency_judgements(profile: Profile, pairs: Pairs, confidence: float,
                       pass_confidence: float | None = None) -> dict[str, QuantileRatio | None]:
    """Per metric: the new revision's ``compare.quantile`` against ``(1 + compare.max_regression)``
    x the baseline's, both samples' order-statistic bounds counting
    (:func:`kvgate.stats.twosample.judge_quantile_ratio` at ``confidence``: each side's bound at
    ``1 - (1 - confidence) / 2``; FAIL when new's lower bound > (1 + r) x base's upper, PASS when
    new's upper <= (1 + r) x base's lower); None when either side has no sample. Values in ms.
    ``pass_confidence`` (the plan's :attr:`~kvgate.stats.confidence.LookPlan.pass_level`; None:
    ``confidence``): the PASS side's level when the FAIL side's, ``confidence``, is the run's
    false-alarm budget share (:meth:`~kvgate.profile.models.VerdictsSpec.fail_confidence`)."""
    c = profile.compare
    up = confidence if pass_confidence is None else pass_confidence
    fc = None if up == confidence else confidence
    out: dict[str, QuantileRatio | None] = {}
    for m in METRICS:
        new, base = pairs.values("new", m), pairs.values("base", m)
        out[m] = judge_quantile_ratio(base, new, c.quantile, 1 + c.max_regression, up,
                                      fail_confidence=fc) if new and base else None
    return out


def latency_decisions(profile: Profile, pairs: Pairs, confidence: float,
                      pass_confidence: float | None = None) -> dict[str, str]:
    """metric -> PASS/FAIL/UNDECIDED, for :func:`kvgate.stats.confidence.sample_until_decided`
    (``confidence`` the plan's per-look FAIL level, ``pass_confidence`` its PASS level:
    :func:`latency_judgements`)."""
    return {m: (j.decision if j else J_FAIL)
            for m, j in latency_judgements(profile, pairs, confidence, pass_confidence).items()}


def failure_test(pairs: Pairs, confidence: float) -> dict[str, Any]:
    """Does the new revision fail more requests than the baseline, on the same interleaved pairs?
    Paired, so McNemar's exact test on the discordant pairs: ``b`` pairs the new revision failed and
    the baseline answered, ``c`` the reverse; under no difference each discordant pair is a fair
    coin, so ``p = P(Bin(b + c, 1/2) >= b)`` (one-sided). ``decision``: FAIL when ``p <= 1 -
    confidence`` (5 new-only failures against none at 95%), UNDECIDED when ``b > c`` but not shown
    (no PASS on a difference the pairs cannot tell), else PASS. Whether any single failure is
    allowed at all is latency/slo's ``slo.error_rate_max``, not this comparison's."""
    n = min(len(pairs.new), len(pairs.base))
    b = sum(1 for i in range(n) if pairs.new[i].error is not None and pairs.base[i].error is None)
    c = sum(1 for i in range(n) if pairs.base[i].error is not None and pairs.new[i].error is None)
    p = float(_st.binom.sf(b - 1, b + c, 0.5)) if b else 1.0
    d = J_FAIL if b and p <= 1 - confidence else UNDECIDED if b > c else J_PASS
    return {"new_only": b, "base_only": c, "p_value": p, "confidence": confidence, "decision": d,
            "method": "McNemar exact, one-sided, on the discordant pairs"}


def _latency_clause(what: str, j: QuantileRatio, allowance: float, word: str) -> str:
    """``TTFT p95 21.3 ms vs baseline 19.3 ms (+10.4%); 97.5% bounds: new upper 21.0 ms (n=160) <= 1.1 x
    baseline lower 19.5 ms (n=160) = 21.5 ms -> PASS``: FAIL cites new's lower against the baseline's
    upper, INCONCLUSIVE both ranges."""
    nb, bb = j.new, j.base
    r = 1 + allowance
    rel = f"{(j.point - 1) * 100:+.1f}%" if j.point is not None else "n/a"
    pt = "n/a" if nb.point is None else f"{nb.point:,.1f} ms"
    ref = "n/a" if bb.point is None else f"{bb.point:,.1f} ms"
    if j.fail_confidence is None:
        levels = f"{j.side * 100:.4g}% bounds"
    else:  # the FAIL side at the run's false-alarm budget share: each clause names the level it rests on
        levels = {"PASS": f"{j.side * 100:.4g}% bounds", "FAIL": f"{j.fail_side * 100:.4g}% bounds"}.get(
            word, f"bounds at {j.fail_side * 100:.4g}% (new lower, baseline upper) and {j.side * 100:.4g}% (new upper, "
                  "baseline lower)")
    head = f"{what} {nb.label} {pt} vs baseline {ref} ({rel}; allowed +{allowance:.0%}); {levels}"

    def ms(x: float | None) -> str:
        return "none" if x is None else f"{x:,.1f} ms"
    if word == "PASS":
        return (f"{head}: new upper {ms(nb.upper)} (n={nb.n}) <= {r:g} x baseline lower {ms(bb.lower)} "
                f"(n={bb.n}) = {ms(r * bb.lower)} -> PASS")
    if word == "FAIL":
        return (f"{head}: new lower {ms(nb.lower)} (n={nb.n}) > {r:g} x baseline upper {ms(bb.upper)} "
                f"(n={bb.n}) = {ms(r * bb.upper)} -> FAIL")
    no_fail = ""
    if bb.upper is None:  # a FAIL needs the baseline's upper bound: too few pairs for one at its level
        lvl = j.fail_side if j.fail_confidence is not None else j.side
        no_fail = (f"; no FAIL possible at n={bb.n}: the baseline's {lvl * 100:.4g}% upper bound on a "
                   f"p{bb.q * 100:g} needs at least {min_samples_to_pass(bb.q, lvl):,} pairs (raise "
                   "compare.latency_requests_max)")
    return (f"{head}: new {ms(nb.lower)}..{ms(nb.upper)} (n={nb.n}), {r:g} x baseline "
            f"{ms(None if bb.lower is None else r * bb.lower)}..{ms(None if bb.upper is None else r * bb.upper)} "
            f"(n={bb.n}) overlap{no_fail} -> INCONCLUSIVE")


def latency_verdict(profile: Profile, pairs: Pairs, sampling: dict[str, Any], label: str) -> Verdict:
    """The latency case: FAIL when any metric's new percentile is shown above ``(1 + max_regression)``
    x the baseline's -- two estimates, so both samples' bounds count
    (:func:`latency_judgements`) -- or the new revision is shown to fail more of the same pairs
    (:func:`failure_test`); PASS when every metric's ratio is shown within and no failure
    difference is open; else INCONCLUSIVE. Judged at the per-look level of ``sampling``
    (:meth:`kvgate.stats.confidence.Sampling.to_dict`; Bonferroni over the planned looks): the FAIL
    side (the ratio's FAIL, McNemar) at ``per_look_confidence``, the PASS side at
    ``per_look_pass_confidence`` when the plan has one (the FAIL side then at the run's
    false-alarm budget share, ``fail_confidence``); no sampling: the FAIL side at
    ``profile.verdicts.fail_confidence(slo.confidence)``, the PASS side at ``slo.confidence``.
    ``measured``/``limit`` (ms): the new revision's TTFT percentile and (1 + max_regression) x the
    baseline's (point estimates; the verdict rests on the bounds in the message)."""
    c = profile.compare
    gate = f"{GATE}/latency"
    if sampling.get("per_look_confidence"):
        conf = sampling["per_look_confidence"]
        up = sampling.get("per_look_pass_confidence") or conf
    else:
        conf, up = profile.verdicts.fail_confidence(profile.slo.confidence), profile.slo.confidence
    ft = failure_test(pairs, conf)
    ev = {"baseline": label, "pairs": len(pairs.order), "summary": summary(pairs), "sampling": sampling,
          "max_regression": c.max_regression, "quantile": c.quantile, "failures": ft,
          "rule": "two samples (kvgate.stats.twosample.judge_quantile_ratio): FAIL when the new revision's lower "
                  "bound > (1 + max_regression) x the baseline's upper bound, PASS when its upper bound <= (1 + "
                  "max_regression) x the baseline's lower bound, each bound at 1 - (1 - per-look confidence) / 2; "
                  "failures: McNemar exact on the interleaved pairs"}
    if up != conf:  # the FAIL side at the run's false-alarm budget share (verdicts.false_alarm_budget)
        ev["levels"] = {"fail_per_look": conf, "pass_per_look": up}
    new_err, base_err = pairs.errors("new"), pairs.errors("base")
    n = len(pairs.order)
    fails = (f"the new revision failed {len(new_err)} of {n} latency requests, the {label} {len(base_err)} "
             f"({ft['new_only']} pairs only the new revision failed, {ft['base_only']} only the baseline; McNemar "
             f"exact p = {ft['p_value']:.3g}")
    if ft["decision"] == J_FAIL:
        return Verdict(gate, Status.FAIL, f"{fails} <= {1 - conf:.3g}; first: {new_err[0][:120]}) -> FAIL",
                       measured=len(new_err), limit=len(base_err), unit="requests", evidence=ev)
    js = latency_judgements(profile, pairs, conf, up)
    parts, worst = [], PASS
    for m, j in js.items():
        if j is None:
            return Verdict(gate, Status.INVALID, f"no {METRICS[m]} sample from {'the new revision' if not pairs.values('new', m) else 'the ' + label} "
                           f"({n} pairs) -> INVALID", evidence=ev)
        word = {J_PASS: "PASS", J_FAIL: "FAIL"}.get(j.decision, "INCONCLUSIVE")
        parts.append(_latency_clause(METRICS[m].split(" (")[0], j, c.max_regression, word))
        if word == "FAIL":
            worst = FAIL
        elif word == "INCONCLUSIVE" and worst == PASS:
            worst = "INCONCLUSIVE"
    if ft["decision"] == UNDECIDED:
        parts.append(f"{fails} > {1 - conf:.3g}: more failures than the baseline, too few to tell"
                     f"{'; first: ' + new_err[0][:120] if new_err else ''}) -> INCONCLUSIVE")
        if worst == PASS:
            worst = "INCONCLUSIVE"
    status = Status(worst)
    stop = sampling.get("why_stopped")
    msg = f"{n} interleaved pairs vs the {label}: " + "; ".join(parts) + (f" (stopped: {stop})" if stop else "")
    ttft = js["ttft"]
    return Verdict(gate, status, msg, measured=round(ttft.new.point, 1) if ttft and ttft.new.point else None,
                   limit=round((1 + c.max_regression) * ttft.base.point, 1) if ttft and ttft.base.point else None,
                   unit="ms", evidence=ev)


def features_verdict(base: dict[str, str], new: dict[str, str], label: str) -> Verdict:
    """The features case: every features case that PASSed on the baseline must PASS on the new
    revision (case -> status of :func:`kvgate.compare.baseline.features_statuses`). SKIP when the
    baseline passed none (the profile turns on no serve feature, or the recording holds none)."""
    gate = f"{GATE}/features"
    had = sorted(c for c, s in base.items() if s == "PASS")
    ev = {"baseline": label, "baseline_statuses": base, "new_statuses": new}
    if not had:
        why = "the profile turns on no serve feature" if base and all(s == "SKIP" for s in base.values()) else \
            "the baseline passed no features case" if base else "the baseline recorded no features cases"
        return Verdict(gate, SKIP, f"nothing to lose: {why} ({label}) -> SKIP", evidence=ev)
    return _kept(gate, "features cases", had, new, label, ev)


def _kept(gate: str, kind: str, had: list[str], new: dict[str, str], label: str, ev: dict[str, Any],
          tail: str = "") -> Verdict:
    """FAIL naming each of ``had`` (cases that PASSed on the baseline) that does not PASS in ``new``
    (its status there, or ``not run``), else PASS; what the new revision gained is named too."""
    lost = [c for c in had if new.get(c) != "PASS"]
    gained = sorted(c for c, s in new.items() if s == "PASS" and ev["baseline_statuses"].get(c) != "PASS")
    tail += f"; gained {', '.join(gained[:6])}" if gained else ""
    if lost:
        shown = ", ".join(f"{c} ({new.get(c, 'not run')})" for c in lost[:6])
        return Verdict(gate, FAIL, f"{len(lost)} of {len(had)} {kind} that PASSed on the {label} do not on "
                       f"the new revision: {shown}{tail} -> FAIL", measured=len(lost), limit=0, unit="cases", evidence=ev)
    return Verdict(gate, PASS, f"all {len(had)} {kind} that PASSed on the {label} PASS on the new revision"
                   f"{tail} -> PASS", measured=0, limit=0, unit="cases", evidence=ev)


def contract_verdict(base: Mapping[str, Any], new: Mapping[str, Any], label: str) -> Verdict:
    """The contract case: every case of the contract's gates (:data:`kvgate.compare.contract.CONTRACT_GATES`:
    the limits, streaming, requests, api, features, answers and security) that PASSed on the recorded
    serving revision and ran in this run must PASS here, and every hostile request and every route
    that held there must hold here (:func:`kvgate.compare.contract.diff`) -- a parameter now refused, a
    route gone (its case SKIPs), a hostile request now answered 200 after 38 s is a regression, named
    with what each side said. ``base``/``new``: ``gate/case`` -> record (or a bare status, a file from
    before). Cases the recording holds that this run did not run (``-m``/``-k`` left them out) are
    listed, not judged. SKIP when the recording holds none, or this run ran none of them."""
    gate = f"{GATE}/contract"
    lost, gained, unrun, held, unprobed = diff(base, new)
    ev: dict[str, Any] = {"baseline": label, "baseline_statuses": {c: r["status"] for c, r in normal(base).items()},
                          "new_statuses": {c: r["status"] for c, r in normal(new).items()},
                          "lost": [x.to_dict() for x in lost], "not_run_here": unrun, "gained": gained,
                          "not_probed_here": unprobed}
    if not base:
        return Verdict(gate, SKIP, f"the {label} recorded no contract cases (record the serving revision with "
                       f"--gate-mode record and the {', '.join(CONTRACT_GATES)} gates selected) -> SKIP", evidence=ev)
    if not new:
        return Verdict(gate, SKIP, f"this run ran no contract case (-m leaves the {', '.join(CONTRACT_GATES)} gates "
                       f"out): nothing to diff against the {len(base)} recorded -> SKIP", evidence=ev)
    tail = f"; {len(unrun)} recorded PASS not run here" if unrun else ""
    tail += (f"; {len(unprobed)} held there, not probed here ({', '.join(unprobed[:2])}"
             f"{', ...' if len(unprobed) > 2 else ''})") if unprobed else ""
    tail += f"; gained {', '.join(gained[:6])}{', ...' if len(gained) > 6 else ''}" if gained else ""
    if not sum(held.values()):
        return Verdict(gate, SKIP, f"no case that PASSed on the {label} ran here{tail} -> SKIP", evidence=ev)
    what = ", ".join(f"{n} {kind[:-1] if n == 1 else kind}" for kind, n in held.items())
    ev["held"] = held
    if lost:
        shown = "; ".join(x.words() for x in lost[:6]) + ("; ..." if len(lost) > 6 else "")
        return Verdict(gate, FAIL, f"{len(lost)} of what held on the {label} ({what}) do not hold on the new "
                       f"revision: {shown}{tail} -> FAIL (a client relying on them breaks)", measured=len(lost),
                       limit=0, unit="regressions", evidence=ev)
    return Verdict(gate, PASS, f"all that held on the {label} ({what}) holds on the new revision{tail} -> PASS",
                   measured=0, limit=0, unit="regressions", evidence=ev)


def _cell_key(c: dict[str, Any]) -> tuple[Any, Any, Any]:
    return (c.get("tokens"), c.get("depth"), c.get("key"))


def long_context_verdict(base: list[dict[str, Any]], new: list[dict[str, Any]], label: str) -> Verdict:
    """The long-context case: the pass-key prompts (:mod:`kvgate.answers.needle`; the same seed
    asks the same prompts) on the baseline and here, matched by length, depth and key. FAIL when a
    depth retrieved on the baseline (at some length, on a path) is retrieved at no length here: the
    new revision stopped reading that region of the prompt (an fp8 KV cache, a compressor, a
    window). A single prompt that lost its key where the depth still holds elsewhere is named as a
    change, not failed (a key's digits can sit at a near tie on a small model). SKIP when the
    baseline recorded none, or no prompt is in common (another max_model_len or seed)."""
    gate = f"{GATE}/long-context"
    b, n = {_cell_key(c): c for c in base}, {_cell_key(c): c for c in new}
    common = [k for k in b if k in n]
    ev: dict[str, Any] = {"baseline": label, "baseline_cells": base, "new_cells": new, "in_common": len(common)}
    if not base:
        return Verdict(gate, SKIP, f"the {label} recorded no pass-key retrieval (answers.long_context unset there, or "
                       "a recording from before kvgate recorded it) -> SKIP", evidence=ev)
    if not common:
        return Verdict(gate, SKIP, f"no pass-key prompt in common with the {label} (other lengths, depths or keys: "
                       "engine.max_model_len or answers.long_context changed) -> SKIP", evidence=ev)

    def got(c: dict[str, Any], path: str) -> bool:
        return bool((c.get("retrieved") or {}).get(path))

    def said(c: dict[str, Any], path: str) -> str:
        return _clip(str((c.get("answers") or {}).get(path, "")))

    lost = [(k, p) for k in common for p in PATHS if got(b[k], p) and not got(n[k], p)]
    gained = [(k, p) for k in common for p in PATHS if got(n[k], p) and not got(b[k], p)]
    lost_depths = []
    for d in sorted({k[1] for k in common}):
        at = [k for k in common if k[1] == d]
        for p in PATHS:
            if any(got(b[k], p) for k in at) and not any(got(n[k], p) for k in at):
                shown = "; ".join(f"{b[k].get('cell')}: baseline {said(b[k], p)!r}, now {said(n[k], p)!r}" for k in at)
                lost_depths.append(f"depth {d:.0%} {p} ({shown})")
    ev.update(lost=[f"{b[k].get('cell')} {p}" for k, p in lost], gained=[f"{n[k].get('cell')} {p}" for k, p in gained],
              lost_depths=lost_depths)
    kept = sum(got(b[k], p) for k in common for p in PATHS)
    head = (f"{len(common)} pass-key prompts in common with the {label}: {kept} answers retrieved their key there, "
            f"{kept - len(lost)} of them here")
    tail = (f"; changed: {', '.join(ev['lost'][:4])} lost" if lost else "") + \
           (f"; {', '.join(ev['gained'][:4])} gained" if gained else "")
    if lost_depths:
        return Verdict(gate, FAIL, f"{head}; retrieved on the baseline, at no length here: {'; '.join(lost_depths[:3])}"
                       f" -> FAIL (a depth the baseline read is not read now)", measured=len(lost_depths), limit=0,
                       unit="depths", evidence=ev)
    return Verdict(gate, PASS, f"{head}; every depth the baseline retrieved is retrieved here{tail} -> PASS",
                   measured=0, limit=0, unit="depths", evidence=ev)
