"""Gate: the API surface clients use. The Responses API (/v1/responses) answers a
max_output_tokens request incomplete with its reason, streams a well-formed event grammar whose
terminal output holds what the deltas carried, and the openai SDK parses it; a stored response is
retrieved and continued with previous_response_id (where the server stores them); the Messages API
(/v1/messages) maps max_tokens and stop sequences to stop_reason truthfully, streams
message_start ... message_stop agreeing with the non-streamed reply, the anthropic SDK parses it,
and count_tokens counts what the reply reports; the logprobs matrix has the shapes the spec gives;
n > 1 answers n finished choices with usage summed; a stop string spanning two tokens ends streamed
and non-streamed answers alike; max_completion_tokens bounds chat as max_tokens does;
continuous_usage_stats puts a running usage on every chunk. A route the server does not serve
SKIPs with its answer."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from kvgate.gates.api import (LOGPROBS_MATRIX, choice_text, continuous_usage_verdict, count_tokens_verdict,
                              logprobs_verdict, max_completion_tokens_verdict, message_text, messages_reply_verdict,
                              messages_stream_verdict, n_choices_verdict, responses_reply_verdict,
                              responses_store_verdict, responses_stream_verdict, spanning_stop, stop_verdict,
                              token_texts)
from kvgate.gates.common import json_body, refused_verdict
from kvgate.http.probes import Exchange, send
from kvgate.http.sdk import sdk_messages_stream, sdk_responses_stream

PROMPT = "write about the kv cache pool"
#: Tokens of every reply the gate asks for (short: the gate reads shapes, not speed).
TOKENS = 8
#: ``n`` of the n-choices case.
N = 2
APIS = ["chat", "completions"]


def body(api, model, **params):
    if api == "chat":
        return {"model": model, "messages": [{"role": "user", "content": PROMPT}], **params}
    return {"model": model, "prompt": PROMPT, **params}


def post(client, route, api, payload, stream=False):
    """One request to a route ``send`` does not know (/responses, /messages, ...), as an Exchange."""
    path = client.api(route)
    if stream:
        payload = {**payload, "stream": True}
        return Exchange(api, True, payload, client.stream(path, payload))
    return Exchange(api, False, payload, client.post(path, payload))


def first_piece(text):
    """A stop sequence for the Messages case: 3 printable characters of ``text`` after its first
    quarter, first seen there (None when none is)."""
    for i in range(max(1, len(text) // 4), len(text) - 3):
        s = text[i:i + 3]
        if s.strip() == s and s.isprintable() and "\ufffd" not in s and text.find(s) == i:
            return s
    return None


@pytest.fixture(scope="module")
def observed(kvgate_client, kvgate_endpoint, kvgate_profile):
    """Every probe of this gate, the deployment's concurrency of jobs at a time (``engine.max_num_seqs``,
    at least 4; 4 took 6.2 s of smollm2-cpu's main job where max_num_seqs is 8, 2026-12-04); the requests of one case in order (a stop
    case sends its greedy answer first and chooses the stop string from it)."""
    client, model = kvgate_client, kvgate_profile.model.served_name
    timeout_s = kvgate_profile.limits.request_timeout_s  # the SDKs' own calls are bounded like kvgate's
    greedy = {"temperature": 0, "ignore_eos": True}

    def responses():
        req = {"model": model, "input": PROMPT, "max_output_tokens": TOKENS, **greedy}
        return (post(client, "/responses", "responses", req), post(client, "/responses", "responses", req, True),
                sdk_responses_stream(kvgate_endpoint, req, timeout_s))

    def responses_store():
        req = {"model": model, "input": PROMPT, "max_output_tokens": TOKENS, "store": True, **greedy}
        first = post(client, "/responses", "responses", req)
        rid = (json_body(first.reply) or {}).get("id") if first.reply.status == 200 else None
        if not isinstance(rid, str) or not rid.isprintable() or "/" in rid:
            return first, None, None
        got = Exchange("responses", False, {"id": rid}, client.get(client.api(f"/responses/{rid}")))
        follow = post(client, "/responses", "responses", {**req, "input": "go on", "previous_response_id": rid,
                                                          "store": False})
        return first, got, follow

    def messages():
        req = {"model": model, "max_tokens": TOKENS, "messages": [{"role": "user", "content": PROMPT}], **greedy}
        plain = post(client, "/messages", "messages", req)
        text = message_text(json_body(plain.reply)) if plain.reply.status == 200 else ""
        piece = first_piece(text)
        stop = post(client, "/messages", "messages", {**req, "stop_sequences": [piece]}) if piece else None
        count = post(client, "/messages/count_tokens", "messages", {"model": model, "messages": req["messages"]})
        return (plain, stop, piece, post(client, "/messages", "messages", req, True),
                sdk_messages_stream(kvgate_endpoint, req, timeout_s), count)

    def logprobs(api):
        out = {}
        for label, fields, _ in LOGPROBS_MATRIX[api]:
            out[label] = send(client, api, body(api, model, max_tokens=TOKENS, **greedy, **fields))
        label, fields, _ = LOGPROBS_MATRIX[api][-1]
        out[f"{label}/stream"] = send(client, api, body(api, model, max_tokens=TOKENS, **greedy, **fields), stream=True)
        return out

    def stop(api):
        lp = {"logprobs": True} if api == "chat" else {"logprobs": 0}
        base = send(client, api, body(api, model, max_tokens=2 * TOKENS, **greedy, **lp))
        b = json_body(base.reply) if base.reply.status == 200 else None
        texts, text = token_texts(api, b), choice_text(api, b)
        s = spanning_stop(texts, text) if texts is not None and text is not None else None
        if s is None:
            return base, None, None, None
        req = body(api, model, max_tokens=2 * TOKENS, stop=[s], **greedy)
        return base, s, send(client, api, req), send(client, api, req, stream=True)

    jobs = {"responses": responses, "responses/store": responses_store, "messages": messages,
            "max-completion-tokens/chat": lambda: send(client, "chat", {
                "model": model, "messages": [{"role": "user", "content": PROMPT}], "max_completion_tokens": TOKENS,
                **greedy})}
    for api in APIS:
        jobs[f"logprobs/{api}"] = lambda api=api: logprobs(api)
        jobs[f"n/{api}"] = lambda api=api: send(client, api, body(api, model, n=N, max_tokens=TOKENS, temperature=1,
                                                                   seed=0, ignore_eos=True))
        jobs[f"stop/{api}"] = lambda api=api: stop(api)
        jobs[f"continuous-usage/{api}"] = lambda api=api: send(client, api, body(
            api, model, max_tokens=TOKENS, **greedy,
            stream_options={"include_usage": True, "continuous_usage_stats": True}), stream=True)
    workers = max(1, min(len(jobs), max(4, kvgate_profile.engine.max_num_seqs or 0)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def gaps(profile):
    return dict(profile.api.accepted_gaps)


@pytest.mark.api
@pytest.mark.gate("api", cases=["responses/reply", "responses/stream"])
def test_responses_api(case, observed, kvgate_profile, kvgate_gate):
    plain, streamed, sdk = observed["responses"]
    verdict = (responses_reply_verdict(plain, TOKENS, gaps(kvgate_profile)) if case == "responses/reply"
               else responses_stream_verdict(streamed, sdk, gaps(kvgate_profile)))
    assert kvgate_gate(verdict).passed


@pytest.mark.api
@pytest.mark.gate("api", cases=["responses/store"])
def test_responses_store_and_previous_response_id(case, observed, kvgate_gate):
    assert kvgate_gate(responses_store_verdict(*observed[case])).passed


@pytest.mark.api
@pytest.mark.gate("api", cases=["messages/reply", "messages/stream", "messages/count-tokens"])
def test_messages_api(case, observed, kvgate_profile, kvgate_gate):
    plain, stop, piece, streamed, sdk, count = observed["messages"]
    if case == "messages/reply":
        verdict = messages_reply_verdict(plain, stop, piece, TOKENS, gaps(kvgate_profile))
    elif case == "messages/stream":
        verdict = messages_stream_verdict(streamed, plain, sdk, gaps(kvgate_profile))
    else:
        verdict = count_tokens_verdict(count, plain)
    assert kvgate_gate(verdict).passed


@pytest.mark.api
@pytest.mark.gate("api", cases=[f"logprobs/{a}" for a in APIS])
def test_logprobs_matrix(case, observed, kvgate_gate):
    assert kvgate_gate(refused_verdict(logprobs_verdict(case.split("/")[1], observed[case]), observed[case])).passed


@pytest.mark.api
@pytest.mark.gate("api", cases=[f"n/{a}" for a in APIS])
def test_n_choices(case, observed, kvgate_gate):
    assert kvgate_gate(refused_verdict(n_choices_verdict(case.split("/")[1], observed[case], N, TOKENS), observed[case])).passed


@pytest.mark.api
@pytest.mark.gate("api", cases=[f"stop/{a}" for a in APIS])
def test_stop_string_spanning_tokens(case, observed, kvgate_gate):
    assert kvgate_gate(refused_verdict(stop_verdict(case.split("/")[1], *observed[case]), observed[case])).passed


@pytest.mark.api
@pytest.mark.gate("api", cases=["max-completion-tokens/chat"])
def test_max_completion_tokens(case, observed, kvgate_gate):
    assert kvgate_gate(refused_verdict(max_completion_tokens_verdict(observed[case], TOKENS), observed[case])).passed


@pytest.mark.api
@pytest.mark.gate("api", cases=[f"continuous-usage/{a}" for a in APIS])
def test_continuous_usage_stats(case, observed, kvgate_gate):
    assert kvgate_gate(refused_verdict(continuous_usage_verdict(case.split("/")[1], observed[case], TOKENS),
                                       observed[case])).passed
