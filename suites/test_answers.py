"""Gate: answers (``-m answers``). The answers are right, not only well-formed: the profile's golden
prompts meet their expectations at temperature 0, streamed and not; an accuracy task scores at or
above its floor with a binomial interval; no answer the gate collected is degenerate; multibyte
text survives streaming; chat, rendered text and token ids agree; a later turn remembers an
earlier one; temperature-0 outputs do not change under concurrency."""

from pathlib import Path

import pytest

from kvgate.answers.observe import MULTIBYTE_PROMPTS, SAMPLED_SCRIPTS, ask, ask_many, body_for, render
from kvgate.answers.task import TaskError, load_task, scored
from kvgate.gates.answers import (CASES, GoldenObservation, MemoryObservation, MultibyteObservation, PathsObservation,
                                  accuracy_verdict, degeneration_verdict, determinism_verdict, golden_verdict,
                                  input_paths_verdict, memory_verdict, multibyte_verdict, not_declared)
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


@pytest.fixture(scope="module")
def collected(kvgate_seen):
    return Collected(kvgate_seen)


def _golden_body(g, model, stream_logprobs=5):
    return body_for(g.route, model, messages=g.messages, prompt=g.prompt, max_tokens=g.max_tokens,
                    logprobs=stream_logprobs)


@pytest.fixture(scope="module")
def golden_obs(kvgate_client, kvgate_profile, collected):
    """Each golden asked non-streamed, then streamed (4 in flight at once each time)."""
    a, model, t = kvgate_profile.answers, kvgate_profile.model.served_name, kvgate_profile.limits.request_timeout_s
    plain = ask_many([lambda g=g: ask(kvgate_client, g.route, _golden_body(g, model), timeout_s=t)
                      for g in a.goldens], 4)
    streamed = ask_many([lambda g=g: ask(kvgate_client, g.route, _golden_body(g, model), stream=True, timeout_s=t)
                         for g in a.goldens], 4)
    for g, p, s in zip(a.goldens, plain, streamed):
        collected.add(f"golden/{g.name}", p)
        collected.add(f"golden/{g.name}/stream", s)
    return [GoldenObservation(g, p, s) for g, p, s in zip(a.goldens, plain, streamed)]


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
    check = {"golden": check_golden, "accuracy": check_accuracy, "degeneration": check_degeneration,
             "multibyte": check_multibyte, "input-paths": check_input_paths, "multi-turn": check_memory,
             "determinism": check_determinism}[case]
    assert kvgate_gate(check(request, kvgate_client, kvgate_profile, collected)).passed


def check_golden(request, client, profile, collected) -> Verdict:
    return golden_verdict(profile.answers, request.getfixturevalue("golden_obs"))


def check_accuracy(request, client, profile, collected) -> Verdict:
    acc = profile.answers.accuracy
    base = Path(profile.source).parent if profile.source else Path.cwd()
    path = (base / acc.file) if not Path(acc.file).is_absolute() else Path(acc.file)
    try:
        items = load_task(path)
    except TaskError as exc:
        return Verdict("answers/accuracy", Status.FAIL, f"{exc} -> FAIL", measured="no task", limit="a task")
    model, t = profile.model.served_name, profile.limits.request_timeout_s
    asked = ask_many([lambda it=it: ask(client, it.route, body_for(it.route, model, messages=it.messages, prompt=it.prompt,
                                                                       max_tokens=acc.max_tokens, logprobs=None), timeout_s=t)
                      for it in items], acc.concurrency)
    for it, a in zip(items, asked):
        collected.add(f"accuracy/{it.id}", a)
    return accuracy_verdict(profile.answers, scored(items, [a.text if a.ok else None for a in asked]), path.name)


def check_multibyte(request, client, profile, collected) -> Verdict:
    model, t, n = profile.model.served_name, profile.limits.request_timeout_s, profile.answers.multibyte_max_tokens
    obs = []
    for name, prompt in MULTIBYTE_PROMPTS.items():
        for temp, seed in ((0.0, None), (0.8, 1234)) if name in SAMPLED_SCRIPTS else ((0.0, None),):
            msgs = [{"role": "user", "content": prompt}]
            body = body_for("chat", model, messages=msgs, max_tokens=n, logprobs=None, temperature=temp, seed=seed)
            plain = ask(client, "chat", body, timeout_s=t)
            streamed = ask(client, "chat", body, stream=True, timeout_s=t)
            collected.add(f"multibyte/{name}", plain)
            obs.append(MultibyteObservation(name, prompt, temp, plain, streamed))
    return multibyte_verdict(obs)


def check_input_paths(request, client, profile, collected) -> Verdict:
    model, t = profile.model.served_name, profile.limits.request_timeout_s
    chats = [g for g in profile.answers.goldens if g.messages is not None]
    picks = ([chats[0]] + [g for g in chats[1:] if g.messages[0].get("role") == "system"][:1]) if chats else []
    obs = []
    for g in picks:
        ids, text, err = render(client, model, g.messages)
        if err:
            return Verdict("answers/input-paths", Status.SKIP, f"the rendered prompt cannot be had ({err}) -> SKIP")
        answers = {}
        for stream in (False, True):
            sfx = "/stream" if stream else ""
            answers["chat" + sfx] = ask(client, "chat", body_for("chat", model, messages=g.messages, max_tokens=g.max_tokens,
                                                                 logprobs=None), stream=stream, timeout_s=t)
            # the rendered text carries the template's special tokens (its BOS): none added again
            answers["text" + sfx] = ask(client, "completions", body_for("completions", model, prompt=text,
                                                                        max_tokens=g.max_tokens, logprobs=None,
                                                                        extra={"add_special_tokens": False}),
                                        stream=stream, timeout_s=t)
            answers["ids" + sfx] = ask(client, "completions", body_for("completions", model, prompt=ids,
                                                                       max_tokens=g.max_tokens, logprobs=None),
                                       stream=stream, timeout_s=t)
        for k, a in answers.items():
            collected.add(f"input-paths/{g.name}/{k}", a)
        obs.append(PathsObservation(g.name, ids, text, answers))
    return input_paths_verdict(obs)


def check_memory(request, client, profile, collected) -> Verdict:
    model, t = profile.model.served_name, profile.limits.request_timeout_s
    obs = []
    for g in profile.answers.memory:
        a = ask(client, g.route, _golden_body(g, model), timeout_s=t)
        collected.add(f"multi-turn/{g.name}", a)
        obs.append(MemoryObservation(g, a))
    return memory_verdict(obs)


def check_determinism(request, client, profile, collected) -> Verdict:
    spec, model, t = profile.answers, profile.model.served_name, profile.limits.request_timeout_s
    golden = request.getfixturevalue("golden_obs")
    d = spec.determinism
    tracked = golden[:d.prompts]
    runs = {o.spec.name: [ask(client, o.spec.route, _golden_body(o.spec, model), timeout_s=t)]  # alone
            for o in tracked}
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
    return determinism_verdict(spec, runs)


def check_degeneration(request, client, profile, collected) -> Verdict:
    if not collected.seen.strict:  # run alone (-k degeneration): the goldens give it answers to check
        request.getfixturevalue("golden_obs")
    return degeneration_verdict(profile.answers, collected.seen)
