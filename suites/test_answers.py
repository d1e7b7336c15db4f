"""Gate: answers (``-m answers``). The answers are right, not only well-formed: temperature 0 is
honoured (one request twice, alone, the same text); a system message reaches the model (the
server's prompt count is the rendering with it); the profile's golden prompts meet their
expectations at temperature 0, streamed and not; an accuracy task scores at or above its floor with
a binomial interval; no answer the gate collected is degenerate; multibyte text survives streaming;
chat, rendered text and token ids agree; a later turn remembers an earlier one; temperature-0
outputs do not change under concurrency, nor beside other clients' sampling parameters; a pass key hidden at several depths of long prompts is
retrieved (the prompt is read, not only accepted). A FAIL's cause is what the first two measured (the
sampling, the rendering), asked for only when a case does not PASS."""

from pathlib import Path

import pytest

from kvgate.answers import isolation
from kvgate.answers.causes import serving_cause
from kvgate.answers.lmeval.runner import run_task
from kvgate.answers.needle import observe as observe_needles
from kvgate.answers.observe import MULTIBYTE_PROMPTS, SAMPLED_SCRIPTS, ask, ask_many, body_for, echoed_prompt, render
from kvgate.answers.task import TaskError, load_task, scored
from kvgate.compare.golden import MULTI_TURN, SYSTEM
from kvgate.gates.answers import (CASES, GoldenObservation, MemoryObservation, MultibyteObservation, PathsObservation,
                                  RenderingObservation, SamplingObservation, Suspects, accuracy_verdict,
                                  degeneration_verdict, determinism_verdict, golden_verdict, input_paths_verdict,
                                  isolation_verdict, lm_eval_verdict, long_context_verdict, memory_verdict, multibyte_verdict,
                                  not_declared, rendering_cause, sampling_cause, system_golden, system_message_verdict,
                                  temperature_zero_verdict)
from kvgate.http.prompts import PromptUnavailable
from kvgate.http.rendering import concurrently, tokenize
from kvgate.verdict import Status, Verdict


def _not_applicable(config, profile, case):
    return not_declared(case, profile)


answers_gate = pytest.mark.gate("answers", cases=list(CASES), not_applicable=_not_applicable)


class Collected:
    """The gate's own answers into the run's :class:`~kvgate.answers.seen.Seen` (scanned strictly:
    they end on their own), which the degeneration case judges with the load gates' and the soak's."""

    def __init__(self, seen):
        self.seen = seen

    def add(self, source, asked):
        if asked.ok:
            self.seen.add(source, asked.text, asked.finish_reason)

    def add_text(self, source, text):
        """An answer lm-eval asked for (its text only: no finish reason comes back)."""
        self.seen.add(source, text, None)


@pytest.fixture(scope="module")
def collected(kvgate_seen):
    return Collected(kvgate_seen)


def _golden_body(g, model, stream_logprobs=5):
    return body_for(g.route, model, messages=g.messages, prompt=g.prompt, max_tokens=g.max_tokens,
                    logprobs=stream_logprobs)


def in_flight(profile) -> int:
    """How many of the answers cases' requests are in flight at once: the deployment's concurrency,
    ``engine.max_num_seqs`` (what vLLM schedules in one batch; 8 on smollm2-cpu), else
    ``slo.concurrency``. The non-streamed answers are all asked before the streamed ones, so a pair
    compared character for character meets the same kind of batch; a server whose answers change
    with the batch shows it in the determinism case, the cause the others' differences then carry.
    The cases that must be alone (temperature-zero, determinism's reference) do not use it."""
    return max(1, profile.engine.max_num_seqs or profile.slo.concurrency)


@pytest.fixture(scope="module")
def golden_obs(kvgate_client, kvgate_profile, collected):
    """Each golden asked non-streamed, then streamed (:func:`in_flight` at once each time)."""
    a, model, t = kvgate_profile.answers, kvgate_profile.model.served_name, kvgate_profile.limits.request_timeout_s
    n = in_flight(kvgate_profile)
    plain = ask_many([lambda g=g: ask(kvgate_client, g.route, _golden_body(g, model), timeout_s=t)
                      for g in a.goldens], n)
    streamed = ask_many([lambda g=g: ask(kvgate_client, g.route, _golden_body(g, model), stream=True, timeout_s=t)
                         for g in a.goldens], n)
    for g, p, s in zip(a.goldens, plain, streamed):
        collected.add(f"golden/{g.name}", p)
        collected.add(f"golden/{g.name}/stream", s)
    return [GoldenObservation(g, p, s) for g, p, s in zip(a.goldens, plain, streamed)]


@pytest.fixture(scope="module")
def sampling_obs(kvgate_client, kvgate_profile, golden_obs):
    """The golden whose non-streamed answer was the longest (most tokens to part at), asked twice
    more at temperature 0 with its max_tokens, one after the other, nothing else in flight (its
    prefix is already cached by golden_obs, so both find the same cache). None: no golden answered."""
    answered = [o for o in golden_obs if o.plain.ok]
    if not answered:
        return None
    o = max(answered, key=lambda o: (len(o.plain.tokens), len(o.plain.text)))
    model, t = kvgate_profile.model.served_name, kvgate_profile.limits.request_timeout_s
    first, second = (ask(kvgate_client, o.spec.route, _golden_body(o.spec, model), timeout_s=t) for _ in range(2))
    return SamplingObservation(o.spec.name, o.spec.max_tokens, first, second)


@pytest.fixture(scope="module")
def rendering_obs(kvgate_client, kvgate_profile, golden_obs):
    """The first golden with a system turn (else kvgate's probe conversation) rendered by /tokenize
    with its system turn, without it, and with it sent as a user turn (at once, up to
    slo.concurrency in flight), with the server's prompt_tokens for it from golden_obs."""
    g = system_golden(kvgate_profile.answers)
    if g is not None:
        messages, name = list(g.messages), g.name
        served = next((o.plain.prompt_tokens for o in golden_obs if o.spec.name == g.name), None)
    else:
        probe = [{"role": "system", "content": SYSTEM}] + [{"role": r, "content": c} for r, c in MULTI_TURN[:1]]
        messages, name, served = probe, None, None
    model = kvgate_profile.model.served_name
    shapes = (messages, [m for m in messages if m["role"] != "system"],
              [{**m, "role": "user"} if m["role"] == "system" else m for m in messages])
    got = concurrently([lambda m=m: tokenize(kvgate_client, model, messages=m) for m in shapes],
                       kvgate_profile.slo.concurrency)
    serving = None
    if name is not None and served is not None and got[0].ok and served != got[0].count:  # whose count is it?
        serving = serving_cause(_plain_answers(golden_obs), about=name, rendered={name: got[0].count})
    return RenderingObservation(name, *got, served=served, serving=serving)


def _plain_answers(golden_obs):
    """Each golden's non-streamed answer by name (different goldens, different requests): what
    :func:`~kvgate.answers.causes.serving_cause` reads who served from."""
    return {o.spec.name: o.plain for o in golden_obs}


@pytest.fixture(scope="module")
def alone_obs(kvgate_client, kvgate_profile):
    """The first goldens (as many as the determinism and isolation cases track) asked one after the
    other, nothing else in flight, each as a golden is asked (the isolation case's victim request):
    the answers both compare with (golden name -> answer)."""
    a, model, t = kvgate_profile.answers, kvgate_profile.model.served_name, kvgate_profile.limits.request_timeout_s
    return {g.name: ask(kvgate_client, g.route, isolation.victim_body(g, model), timeout_s=t)
            for g in a.goldens[:max(a.determinism.prompts, a.isolation.prompts)]}


def _suspects(request) -> Suspects:
    """The measured causes: the temperature-zero and system-message cases' findings when they ran
    (kept for the run in kvgate_answer_causes), else measured now."""
    causes = request.getfixturevalue("kvgate_answer_causes")
    if "sampling" not in causes:
        causes["sampling"] = sampling_cause(temperature_zero_verdict(request.getfixturevalue("sampling_obs")))
    if "rendering" not in causes:
        causes["rendering"] = rendering_cause(request.getfixturevalue("rendering_obs"))
    if "serving" not in causes:
        causes["serving"] = serving_cause(_plain_answers(request.getfixturevalue("golden_obs")))
    return Suspects(causes["sampling"], causes["rendering"], causes["serving"])


def _judged(request, decide) -> Verdict:
    """``decide(None)``; when that does not PASS or SKIP, ``decide(suspects)``: the causes are
    measured only for a verdict that needs one."""
    verdict = decide(None)
    if verdict.status in (Status.FAIL, Status.INVALID, Status.INCONCLUSIVE):
        verdict = decide(_suspects(request))
    return verdict


def _run(case, kvgate_profile, kvgate_gate):
    skip = not_declared(case, kvgate_profile)
    if skip is not None:
        assert kvgate_gate(skip).passed
        return False
    return True


@pytest.mark.answers
@answers_gate
def test_answers(case, request, kvgate_client, kvgate_profile, kvgate_gate, collected):
    if not _run(case, kvgate_profile, kvgate_gate):
        return
    check = {"temperature-zero": check_temperature_zero, "system-message": check_system_message,
             "golden": check_golden, "accuracy": check_accuracy, "degeneration": check_degeneration,
             "multibyte": check_multibyte, "input-paths": check_input_paths, "multi-turn": check_memory,
             "determinism": check_determinism, "isolation": check_isolation,
             "long-context": check_long_context}[case]
    assert kvgate_gate(check(request, kvgate_client, kvgate_profile, collected)).passed


def check_temperature_zero(request, client, profile, collected) -> Verdict:
    obs = request.getfixturevalue("sampling_obs")
    if obs is not None:
        collected.add(f"temperature-zero/{obs.name}/1", obs.first)
        collected.add(f"temperature-zero/{obs.name}/2", obs.second)
    verdict = temperature_zero_verdict(obs)
    request.getfixturevalue("kvgate_answer_causes")["sampling"] = sampling_cause(verdict)
    return verdict


def check_system_message(request, client, profile, collected) -> Verdict:
    obs = request.getfixturevalue("rendering_obs")
    request.getfixturevalue("kvgate_answer_causes")["rendering"] = rendering_cause(obs)
    return system_message_verdict(obs)


def check_golden(request, client, profile, collected) -> Verdict:
    golden = request.getfixturevalue("golden_obs")
    return _judged(request, lambda s: golden_verdict(profile.answers, golden, suspects=s))


def check_accuracy(request, client, profile, collected) -> Verdict:
    acc = profile.answers.accuracy
    if acc.lm_eval is not None:
        return check_accuracy_lm_eval(request, client, profile, collected)
    base = Path(profile.source).parent if profile.source else Path.cwd()
    path = (base / acc.file) if not Path(acc.file).is_absolute() else Path(acc.file)
    try:
        items = load_task(path)
    except TaskError as exc:
        return Verdict("answers/accuracy", Status.FAIL, f"{exc} -> FAIL", measured="no task", limit="a task",
                       cause="the profile's accuracy task (answers.accuracy.file) cannot be used: no item was asked")
    model, t = profile.model.served_name, profile.limits.request_timeout_s
    asked = ask_many([lambda it=it: ask(client, it.route, body_for(it.route, model, messages=it.messages, prompt=it.prompt,
                                                                       max_tokens=acc.max_tokens, logprobs=None), timeout_s=t)
                      for it in items], acc.concurrency)
    for it, a in zip(items, asked):
        collected.add(f"accuracy/{it.id}", a)
    rows = scored(items, [a.text if a.ok else None for a in asked])
    fc = profile.verdicts.fail_confidence(acc.confidence)  # the FAIL side at the run's false-alarm budget share
    return _judged(request, lambda s: accuracy_verdict(profile.answers, rows, path.name, suspects=s, fail_confidence=fc))


def check_accuracy_lm_eval(request, client, profile, collected) -> Verdict:
    """The task through lm-eval, offline, in a child process, against this endpoint with the run's
    key, ``answers.accuracy.concurrency`` requests in flight."""
    acc, ep = profile.answers.accuracy, client.endpoint
    outcome = run_task(acc, base_url=ep.base_url, route_prefix=ep.route_prefix, headers=ep.headers(),
                       model=profile.model.served_name, concurrency=acc.concurrency,
                       request_timeout_s=profile.limits.request_timeout_s,
                       chat_template_kwargs=profile.limits.chat_template_kwargs, tokenizer=ep.tokenizer)
    for s in outcome.samples:
        if s.get("generated"):  # a generated text (not a multiple choice's loglikelihoods)
            collected.add_text(f"accuracy/{s.get('id')}", s["answer"])
    fc = profile.verdicts.fail_confidence(acc.confidence)  # the FAIL side at the run's false-alarm budget share
    return _judged(request, lambda s: lm_eval_verdict(profile.answers, outcome, suspects=s, fail_confidence=fc))


def check_multibyte(request, client, profile, collected) -> Verdict:
    model, t, n = profile.model.served_name, profile.limits.request_timeout_s, profile.answers.multibyte_max_tokens
    asks = [(name, prompt, temp, body_for("chat", model, messages=[{"role": "user", "content": prompt}], max_tokens=n,
                                          logprobs=None, temperature=temp, seed=seed))
            for name, prompt in MULTIBYTE_PROMPTS.items()
            for temp, seed in (((0.0, None), (0.8, 1234)) if name in SAMPLED_SCRIPTS else ((0.0, None),))]
    plains = ask_many([lambda b=b: ask(client, "chat", b, timeout_s=t) for *_, b in asks], in_flight(profile))
    streams = ask_many([lambda b=b: ask(client, "chat", b, stream=True, timeout_s=t) for *_, b in asks], in_flight(profile))
    obs = []
    for (name, prompt, temp, _), plain, streamed in zip(asks, plains, streams):
        collected.add(f"multibyte/{name}", plain)
        obs.append(MultibyteObservation(name, prompt, temp, plain, streamed))
    return _judged(request, lambda s: multibyte_verdict(obs, suspects=s))


def check_input_paths(request, client, profile, collected) -> Verdict:
    model, t = profile.model.served_name, profile.limits.request_timeout_s
    chats = [g for g in profile.answers.goldens if g.messages is not None]
    picks = ([chats[0]] + [g for g in chats[1:] if g.messages[0].get("role") == "system"][:1]) if chats else []
    obs = []
    for g in picks:
        ids, text, err = render(client, model, g.messages)
        if err:
            return Verdict("answers/input-paths", Status.SKIP, f"the rendered prompt cannot be had ({err}) -> SKIP")
        paths = {"chat": ("chat", body_for("chat", model, messages=g.messages, max_tokens=g.max_tokens, logprobs=None)),
                 # the rendered text carries the template's special tokens (its BOS): none added again
                 "text": ("completions", body_for("completions", model, prompt=text, max_tokens=g.max_tokens,
                                                  logprobs=None, extra={"add_special_tokens": False})),
                 "ids": ("completions", body_for("completions", model, prompt=ids, max_tokens=g.max_tokens,
                                                 logprobs=None))}
        answers = {}
        for stream in (False, True):  # the three paths at once, non-streamed then streamed
            sfx = "/stream" if stream else ""
            got = ask_many([lambda r=r, b=b: ask(client, r, b, stream=stream, timeout_s=t) for r, b in paths.values()],
                           in_flight(profile))
            answers.update({k + sfx: a for k, a in zip(paths, got)})
        for k, a in answers.items():
            collected.add(f"input-paths/{g.name}/{k}", a)
        obs.append(_paths_observation(client, profile, g, ids, text, answers))
    return _judged(request, lambda s: input_paths_verdict(obs, suspects=s))


def _paths_observation(client, profile, g, ids, text, answers) -> PathsObservation:
    """What a count that is off is compared with: the rendered text tokenized with and without
    special tokens, rendered again as a user turn, the conversation without its system turn (at
    once, up to slo.concurrency in flight); and, for a completions path whose count is off, the
    prompt as the server echoes it (one short request per route kind)."""
    model = profile.model.served_name
    jobs = [lambda: tokenize(client, model, prompt=text, add_special_tokens=True),
            lambda: tokenize(client, model, prompt=text, add_special_tokens=False),
            lambda: tokenize(client, model, messages=[{"role": "user", "content": text}])]
    if any(m["role"] == "system" for m in g.messages):
        jobs.append(lambda: tokenize(client, model, messages=[m for m in g.messages if m["role"] != "system"]))
    special, plain, twice, *without = concurrently(jobs, profile.slo.concurrency)
    echoed = {}
    for kind, prompt, extra in (("text", text, False), ("ids", ids, None)):
        off = [k for k in (kind, kind + "/stream") if k in answers and answers[k].prompt_tokens not in (None, len(ids))]
        if off:
            got = echoed_prompt(client, model, prompt, add_special_tokens=extra,
                                timeout_s=profile.limits.request_timeout_s)
            echoed.update({k: got for k in off if got is not None})
    return PathsObservation(g.name, ids, text, answers, without_system=without[0] if without else None,
                            text_special=special, text_plain=plain, twice=twice, echoed=echoed)


def check_memory(request, client, profile, collected) -> Verdict:
    model, t = profile.model.served_name, profile.limits.request_timeout_s
    obs = []
    asked = ask_many([lambda g=g: ask(client, g.route, _golden_body(g, model), timeout_s=t) for g in profile.answers.memory],
                     in_flight(profile))
    for g, a in zip(profile.answers.memory, asked):
        collected.add(f"multi-turn/{g.name}", a)
        obs.append(MemoryObservation(g, a))

    def decide(s):
        if s is not None:  # a FAIL's cause: the conversation rendered with and without its earlier turns
            measured = concurrently([lambda m=m: tokenize(client, model, messages=m) for o in obs
                                     for m in (o.spec.messages, _last_turn_only(o.spec.messages))],
                                    profile.slo.concurrency)
            for k, o in enumerate(obs):
                o.whole, o.last_turn = measured[2 * k], measured[2 * k + 1]
        return memory_verdict(obs, suspects=s)
    return _judged(request, decide)


def _last_turn_only(messages):
    """The conversation without its earlier turns: its system turns and its last user turn."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    return [m for i, m in enumerate(messages) if i == last or m["role"] == "system"]


def check_determinism(request, client, profile, collected) -> Verdict:
    spec, model, t = profile.answers, profile.model.served_name, profile.limits.request_timeout_s
    golden = request.getfixturevalue("golden_obs")
    d = spec.determinism
    tracked = golden[:d.prompts]
    alone = request.getfixturevalue("alone_obs")
    runs = {o.spec.name: [alone[o.spec.name]] for o in tracked}
    fillers = [o.spec for o in golden]
    for r in range(d.repeats):
        batch = [o.spec for o in tracked]
        i = r
        while len(batch) < d.batch:
            batch.append(fillers[i % len(fillers)])
            i += 1
        out = ask_many([lambda g=g: ask(client, g.route, _golden_body(g, model), timeout_s=t) for g in batch], d.batch)
        for g, a in zip(batch[:len(tracked)], out[:len(tracked)]):
            runs[g.name].append(a)
            collected.add(f"determinism/{g.name}/{r + 1}", a)
    return _judged(request, lambda s: determinism_verdict(spec, runs, suspects=s))


def check_isolation(request, client, profile, collected) -> Verdict:
    # the victims are goldens (degeneration has their answers from golden_obs): not collected again
    victims = profile.answers.goldens[:profile.answers.isolation.prompts]
    obs = isolation.observe(client, profile, victims, alone=request.getfixturevalue("alone_obs"))
    return _judged(request, lambda s: isolation_verdict(profile.answers, obs, suspects=s))


def check_degeneration(request, client, profile, collected) -> Verdict:
    if not collected.seen.strict:  # run alone (-k degeneration): the goldens give it answers to check
        request.getfixturevalue("golden_obs")
    return _judged(request, lambda s: degeneration_verdict(profile.answers, collected.seen, suspects=s))


def check_long_context(request, client, profile, collected) -> Verdict:
    try:
        obs = observe_needles(client, profile)
    except PromptUnavailable as exc:
        return Verdict("answers/long-context", Status.SKIP, f"no pass-key prompt of an exact length can be built "
                       f"here ({exc}) -> SKIP")
    request.getfixturevalue("kvgate_long_context")["cells"] = [o.record() for o in obs]  # for the compare gate
    return long_context_verdict(profile.answers.long_context, obs, profile.engine.max_model_len)
