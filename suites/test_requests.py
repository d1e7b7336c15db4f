"""Gate: edge requests. The request shapes real clients send -- empty prompts, max_tokens
null/absent/0/-1/huge/a string on completions and chat, malformed bodies -- get a documented
outcome (a 4xx with OpenAI's error body, or a valid completion within the cap), never a 5xx, and
the engine still generates after each (canary); min_tokens holds with a stop string; non-ASCII
streams lose no bytes; every stream chunk validates strictly against the openai SDK's own types;
the gateway's total route timeout outlasts the longest stream the profile allows; request bodies
from a few KB up to a max-context request (2x, and multibyte) get a 200 or a documented 4xx, never
a gateway's 413 or a 5xx for a body the profile allows; under overlap (the profile's concurrency)
every body arrives whole -- its Content-Length, its JSON, its stream's finish chunk and [DONE], its
prompt as /tokenize counts it, the long temperature-0 answer as it is alone (and on the
direct-to-pod endpoint, --direct-endpoint); a request sent once reaches the engine once -- the engine's
own counters (--direct-endpoint's /metrics when given) move by what was sent, not by a gateway's retries."""

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvgate.gates.common import refused_verdict
from kvgate.gates.requests import (CONTEXT_ROOM, EDGE_CASES, MIN_TOKENS, MIN_TOKENS_MAX, NON_ASCII_PROMPT, body_ladder,
                                   body_size_verdict, chunk_schema_verdict, duplicate_work_verdict, edge_body,
                                   edge_verdict, first_rung, integrity_verdict, ladder_body, min_tokens_verdict,
                                   non_ascii_verdict, route_timeout_verdict, tokens_per_byte)
from kvgate.http.client import KvClient
from kvgate.http.duplicates import metrics_at, observe_duplicate_work, shown_url
from kvgate.http.integrity import observe_overlap
from kvgate.launch.target import TargetError, endpoint_from_url
from kvgate.http.probes import build_prompt, canary, send, send_raw
from kvgate.http.prompts import PromptError
from kvgate.run.quiet import settle
from kvgate.run.session import current

APIS = ["completions", "chat"]
CASES = {c.name: c for c in EDGE_CASES}
PROMPT = "write about the kv cache pool"
N_CHOICES = 2
#: [tokens] the integrity case's output per request, at most (the profile's cap when lower)
INTEGRITY_TOKENS = 64
#: [nats] a long answer parting from its alone answer within this is a near tie (the compare gate's default)
NEAR_TIE = 0.1


def body(api, model, prompt=PROMPT, **params):
    if api == "chat":
        return {"model": model, "messages": [{"role": "user", "content": prompt}], **params}
    return {"model": model, "prompt": prompt, **params}


def longest_max_tokens(profile):
    """The longest generation the profile allows: its cap, else the context left after a short prompt."""
    return profile.limits.max_tokens_cap or profile.engine.max_model_len - 64


def prepared(observation):
    """This case's observation; a prompt that could not be prepared for it (the endpoint refused
    its /tokenize counts, or it has none) is raised here, in this case alone: kvgate's plugin makes
    it the case's FAIL (PreparationRefused) or SKIP (PromptUnavailable)."""
    if isinstance(observation, PromptError):
        raise observation
    return observation


def in_flight(profile, jobs, floor):
    """Jobs in flight at once: the deployment's concurrency, ``engine.max_num_seqs`` (8 on smollm2-cpu:
    its decode-bound probes batch in one engine step), at least ``floor``, at most ``jobs``."""
    return max(1, min(jobs, max(floor, profile.engine.max_num_seqs or 0)))


@pytest.fixture(scope="module")
def observed(kvgate_client, kvgate_profile):
    """Every probe of this gate, :func:`in_flight` at a time, then the longest allowed stream alone (its
    timing is route-timeout's evidence; nothing of this gate or another runs beside it): each edge
    request with a canary after it (max_tokens cases bounded by the cap with a prompt leaving
    CONTEXT_ROOM tokens of context), min_tokens, non-ASCII streamed and not, chunk streams (n=1; n=2
    sampled, with usage)."""
    client, model, limits = kvgate_client, kvgate_profile.model.served_name, kvgate_profile.limits
    long_prompt = {}
    for api in APIS:
        try:
            long_prompt[api] = build_prompt(client, model, api, kvgate_profile.engine.max_model_len - CONTEXT_ROOM).text
        except PromptError as exc:  # the cases that need it get it (prepared); the others still run
            long_prompt[api] = exc

    def edge(case):
        prompt = long_prompt[case.api] if case.long_prompt else PROMPT
        if isinstance(prompt, PromptError):
            return prompt
        ex = (send_raw(client, case.api, case.raw.replace("{model}", model)) if case.raw is not None
              else send(client, case.api, edge_body(case, model, prompt)))
        return ex, canary(client, model, limits.canary_deadline_s)

    def non_ascii(api):
        params = dict(max_tokens=32, temperature=0, seed=0, ignore_eos=True)
        return (send(client, api, body(api, model, NON_ASCII_PROMPT, **params), stream=True),
                send(client, api, body(api, model, NON_ASCII_PROMPT, **params)))

    def chunks(api):
        params = dict(max_tokens=8, ignore_eos=True)
        return (send(client, api, body(api, model, temperature=0, **params), stream=True),
                send(client, api, body(api, model, n=N_CHOICES, temperature=1, seed=0,  # vLLM: n > 1 needs sampling
                                       stream_options={"include_usage": True}, **params), stream=True))

    def body_size():  # one rung at a time, smallest first; the first measures tokens per byte
        limit = kvgate_profile.engine.max_model_len
        first = first_rung(model, limit)
        sent = [send_raw(client, "completions", ladder_body(model, first.body_bytes).decode())]
        per_byte, how = tokens_per_byte(sent[0], model, first.body_bytes)
        rungs = body_ladder(model, limit, per_byte)
        sent += [send_raw(client, "completions", ladder_body(model, r.body_bytes, r.text).decode()) for r in rungs[1:]]
        return rungs, sent, how

    jobs = {"body-size": body_size}
    for api in APIS:
        jobs[f"min-tokens/{api}"] = lambda api=api: send(client, api, body(
            api, model, min_tokens=MIN_TOKENS, max_tokens=MIN_TOKENS_MAX, stop=["\n"], ignore_eos=False, temperature=0))
        jobs[f"non-ascii-stream/{api}"] = lambda api=api: non_ascii(api)
        jobs[f"chunk-schema/{api}"] = lambda api=api: chunks(api)
    jobs.update({name: (lambda c=c: edge(c)) for name, c in CASES.items()})
    with ThreadPoolExecutor(max_workers=in_flight(kvgate_profile, len(jobs), 6)) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        out = {name: f.result() for name, f in futures.items()}
    # alone, after every other probe has its answer and once the server runs nothing else (settle: waited,
    # bounded, and stated): route-timeout reads this stream's TTFT and gaps, which requests beside it
    # would stretch (issue 48: ITL p95 2,298 ms measured beside this gate's other probes)
    out["route-timeout/beside"] = settle(client.metrics_text)
    out["route-timeout"] = send(client, "completions", body(
        "completions", model, max_tokens=longest_max_tokens(kvgate_profile), temperature=0, ignore_eos=True),
        stream=True)
    return out


@pytest.mark.requests
@pytest.mark.gate("requests", cases=list(CASES))
def test_edge_request_gets_documented_outcome(case, observed, kvgate_profile, kvgate_gate):
    exchange, after = prepared(observed[case])
    limits = kvgate_profile.limits
    assert kvgate_gate(refused_verdict(edge_verdict(CASES[case], exchange, after, limits.max_tokens_cap,
                                                    kvgate_profile.engine.max_model_len, limits.canary_deadline_s),
                                       exchange)).passed


@pytest.mark.requests
@pytest.mark.gate("requests", cases=[f"min-tokens/{a}" for a in APIS])
def test_min_tokens_holds_with_stop(case, observed, kvgate_profile, kvgate_gate):
    verdict = min_tokens_verdict(observed[case], MIN_TOKENS, MIN_TOKENS_MAX, kvgate_profile.limits.max_tokens_cap)
    assert kvgate_gate(refused_verdict(verdict, observed[case])).passed


@pytest.mark.requests
@pytest.mark.gate("requests", cases=[f"non-ascii-stream/{a}" for a in APIS])
def test_non_ascii_stream_loses_no_bytes(case, observed, kvgate_gate):
    streamed, plain = observed[case]
    assert kvgate_gate(refused_verdict(non_ascii_verdict(streamed, plain), streamed, plain)).passed


@pytest.mark.requests
@pytest.mark.gate("requests", cases=[f"chunk-schema/{a}" for a in APIS])
def test_stream_chunks_valid_openai_schema(case, observed, kvgate_gate):
    single, multi = observed[case]
    assert kvgate_gate(refused_verdict(chunk_schema_verdict(case.split("/")[1], single, multi, N_CHOICES), single, multi)).passed


@pytest.mark.requests
@pytest.mark.gate("requests", cases=["route-timeout"])
def test_route_timeout_outlasts_longest_stream(case, observed, kvgate_profile, kvgate_gate):
    quiet = observed["route-timeout/beside"]  # the stream ran after this gate's other probes, on a settled server
    beside = 0 if quiet.idle else int(quiet.left) if quiet.left is not None else None
    verdict = route_timeout_verdict(observed[case], longest_max_tokens(kvgate_profile),
                                    kvgate_profile.limits.route_timeout_s, beside=beside)
    verdict = dataclasses.replace(verdict, evidence={**(verdict.evidence or {}), "beside": quiet.to_dict()})
    assert kvgate_gate(refused_verdict(verdict, observed[case])).passed


@pytest.mark.requests
@pytest.mark.gate("requests", cases=["body-size"])
def test_body_sizes_up_to_max_context_get_documented_answers(case, observed, kvgate_profile, kvgate_gate):
    rungs, exchanges, how = observed[case]
    assert kvgate_gate(body_size_verdict(rungs, exchanges, kvgate_profile.engine.max_model_len, how)).passed


def _direct(url: str, profile, kvgate_client) -> KvClient:
    """A client of ``--direct-endpoint`` (the pod behind the gateway): the gateway's key, its URL
    split as ``--endpoint``'s is; a URL that is not one fails the case in one line."""
    try:
        direct = dataclasses.replace(endpoint_from_url(url, profile), api_key=kvgate_client.endpoint.api_key,
                                     host_header=None)
    except TargetError as exc:
        pytest.fail(str(exc).replace("--endpoint ", "--direct-endpoint ", 1), pytrace=False)
    return KvClient(direct, timeout_s=profile.limits.request_timeout_s)


@pytest.mark.requests
@pytest.mark.gate("requests", cases=["integrity"])
def test_bodies_arrive_whole_under_overlap(case, request, kvgate_client, kvgate_profile, kvgate_gate):
    profile, url = kvgate_profile, request.config.getoption("kvgate_direct_endpoint", None)
    max_tokens = min(profile.limits.max_tokens_cap or INTEGRITY_TOKENS, INTEGRITY_TOKENS)
    kw = dict(concurrency=profile.slo.concurrency, max_tokens=max_tokens, timeout_s=profile.limits.request_timeout_s)
    if url is None:
        obs = observe_overlap(kvgate_client, profile.model.served_name, **kw)
    else:
        with _direct(url, profile, kvgate_client) as pod:
            obs = observe_overlap(kvgate_client, profile.model.served_name, direct=pod, **kw)
    assert kvgate_gate(integrity_verdict(obs, NEAR_TIE)).passed


@pytest.mark.requests
@pytest.mark.gate("requests", cases=["no-duplicate-work"])
def test_request_sent_once_reaches_engine_once(case, request, kvgate_client, kvgate_profile, kvgate_gate):
    """What the engine counted against what kvgate sent (kvgate.http.duplicates): a gateway that retries a
    5xx or a request past its per-try timeout runs the work twice. The engine's counters are read from
    --engine-metrics URL when given, else --direct-endpoint's /metrics (the pod behind the gateway), else
    the endpoint's own.

    On the main job's embedded server there is no gateway: the case still runs (4 requests of 8 tokens,
    ~2 s expected) and PASSes when the counts are equal -- its message names the server kvgate started with
    no gateway between, so what it proves there is that the path kvgate gates (its own client included)
    resends nothing and the engine's counters account one request once, not a gateway's retry policy; a
    SKIP would say less than was measured, and certify would count it as not checked."""
    profile, url = kvgate_profile, request.config.getoption("kvgate_direct_endpoint", None)
    metrics_url = request.config.getoption("kvgate_engine_metrics", None)
    limits = profile.limits
    kw = dict(model=profile.model.served_name, max_model_len=profile.engine.max_model_len,
              max_tokens_cap=limits.max_tokens_cap, try_timeout_s=limits.gateway_try_timeout_s,
              route_timeout_s=limits.route_timeout_s, timeout_s=limits.request_timeout_s)
    if metrics_url is not None:
        obs = observe_duplicate_work(kvgate_client, metrics_at(metrics_url),
                                     source=f"--engine-metrics {shown_url(metrics_url)}", **kw)
    elif url is None:
        mode = current(request.config).launch_mode
        source = (f"the {mode} server kvgate started, no gateway between (its /metrics)"
                  if mode in ("embedded", "docker") else "the endpoint's /metrics")
        obs = observe_duplicate_work(kvgate_client, kvgate_client, source=source, **kw)
    else:
        with _direct(url, profile, kvgate_client) as pod:
            obs = observe_duplicate_work(kvgate_client, pod, source="--direct-endpoint's /metrics", **kw)
    assert kvgate_gate(duplicate_work_verdict(obs, limits.gateway_try_timeout_s)).passed
