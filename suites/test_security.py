"""Gate: security (``-m security``). The door holds: every route but the declared open ones refuses a
caller without the key or with a wrong one, however the route is spelled; no answer echoes a secret; media URLs are not fetched;
hostile parameters get a clean 4xx or a bounded 200 in time and the engine lives through them, and
so do the input paths (a request's chat template, prompt_embeds, empty structured outputs, legacy
fields); no response cache crosses callers or ignores a field, none the profile does not declare; a
flood past the declared admission limit is refused fast."""

import dataclasses
import os
from urllib.parse import urlsplit

import pytest

from kvgate.gates.security import (CASES, auth_surface_verdict, cache_verdict, flood_verdict, hostile_verdict,
                                   input_paths_verdict, media_skip, media_verdict, secrets_verdict)
from kvgate.http.client import KvClient
from kvgate.launch.target import TargetError, endpoint_from_url
from kvgate.launch.kserve import serving_spec
from kvgate.launch.served import SOURCES
from kvgate.run.session import ISVC_OBJECT
from kvgate.security.fields import FIELD_PROBES, remote_code, trust_remote_code_in
from kvgate.run.quiet import settle
from kvgate.security.cache import probe_cache
from kvgate.security.hostile import PROBES, Context
from kvgate.security.paths import PATH_PROBES
from kvgate.security.probe import (WRONG_KEY, MediaTrap, canary, echo_probes, flood, knock, offer_media,
                                   send_fields, send_hostile, send_paths, tokenize_without_key)
from kvgate.security.routes import root_path_of

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _not_applicable(config, profile, case):
    sec = profile.security
    if case == "auth-surface" and sec.auth != "required":
        return auth_surface_verdict(sec, None)
    if case == "media-urls" and not sec.media_inputs:
        return media_skip(sec, local=True)
    if case == "flood" and sec.admission is None:
        return flood_verdict(None, [])
    return None


security_gate = pytest.mark.gate("security", cases=list(CASES), not_applicable=_not_applicable)


def _client(kvgate_client, key):
    ep = kvgate_client.endpoint
    return KvClient(dataclasses.replace(ep, api_key=key), timeout_s=30.0)


@pytest.fixture(scope="module")
def surface(kvgate_client, kvgate_profile):
    """Every route knocked on without a key and with a wrong one (also scanned by the secrets case),
    then a few protected routes under every spelling (``//v1/models``, ``/health/../v1/models``, a
    ``Host: h/health?``, ...), sent raw, within the same budget."""
    sec = kvgate_profile.security
    with _client(kvgate_client, None) as nokey, _client(kvgate_client, WRONG_KEY) as wrong:
        return knock(kvgate_client, nokey, wrong, kvgate_profile.model.served_name, deadline_s=sec.deadline_s,
                     budget_s=sec.surface_budget_s, open_paths=list(sec.open_routes),
                     root_path=root_path_of(kvgate_profile.engine.extra_args))


@pytest.mark.security
@security_gate
def test_security(case, request, kvgate_client, kvgate_profile, kvgate_gate):
    skip = _not_applicable(None, kvgate_profile, case)
    if skip is not None:
        assert kvgate_gate(skip).passed
        return
    check = {"auth-surface": check_auth_surface, "secrets": check_secrets, "media-urls": check_media,
             "hostile-parameters": check_hostile, "input-paths": check_input_paths, "cache": check_cache,
             "flood": check_flood}[case]
    assert kvgate_gate(check(request, kvgate_client, kvgate_profile)).passed


def check_auth_surface(request, client, profile):
    return auth_surface_verdict(profile.security, request.getfixturevalue("surface"))


def check_secrets(request, client, profile):
    sec = profile.security
    knocks = request.getfixturevalue("surface").knocks if sec.auth == "required" else []
    with _client(client, WRONG_KEY) as wrong:
        echoes = echo_probes(client, wrong, profile.model.served_name, sec.deadline_s)
    return secrets_verdict(echoes, knocks, client.endpoint.api_key)


def check_media(request, client, profile):
    sec = profile.security
    skip = media_skip(sec, urlsplit(client.endpoint.base_url).hostname in LOOPBACK)
    if skip is not None:
        return skip
    kind = sec.media_inputs[0]
    with MediaTrap() as trap:
        urls = trap.urls()
        answers = offer_media(client, profile.model.served_name, kind, urls, sec.deadline_s)
        hits = list(trap.hits)
    return media_verdict(kind, answers, urls, hits)


def check_hostile(request, client, profile):
    sec, model = profile.security, profile.model.served_name
    arch = profile.model.architecture
    ctx = Context(model, arch.vocab_size if arch else None)
    first = canary(client, model, profile.limits.canary_deadline_s)
    run = send_hostile(client, ctx, PROBES, deadline_s=sec.deadline_s, canary_deadline_s=profile.limits.canary_deadline_s)
    alive = all(s.canary_ok for s in run.sent)  # not after the engine went down
    kw = dict(deadline_s=sec.deadline_s, canary_deadline_s=profile.limits.canary_deadline_s,
              image="image" in sec.media_inputs)
    fields = [send_fields(client, model, FIELD_PROBES, via="through the endpoint", alive=alive, **kw)]
    url = request.config.getoption("kvgate_direct_endpoint", None)
    if url is not None:  # the engine's own answer to each field, past the gateway (same key)
        try:
            direct = dataclasses.replace(endpoint_from_url(url, profile), api_key=client.endpoint.api_key,
                                         host_header=None)
        except TargetError as exc:
            pytest.fail(str(exc).replace("--endpoint ", "--direct-endpoint ", 1), pytrace=False)
        with KvClient(direct, timeout_s=30.0) as pod:
            fields.append(send_fields(pod, model, FIELD_PROBES, via="direct (--direct-endpoint)",
                                      alive=all(s.canary_ok for s in fields[0].sent),
                                      **kw))
    with _client(client, None) as nokey:
        open_tokenize = tokenize_without_key(nokey, model, sec.deadline_s)
    return hostile_verdict(sec, run, first, sec.deadline_s, fields=fields,
                           remote=_remote_code(request, client, profile), tokenize_nokey=open_tokenize)


def _remote_code(request, client, profile):
    """Whether the served config runs remote code, from the first source that says: the launched
    server's command line, the --isvc object's container args, the profile's engine.extra_args,
    vLLM's dev-mode /server_info (model_config.trust_remote_code)."""
    endpoint = request.getfixturevalue("kvgate_endpoint")
    isvc = request.config.stash.get(ISVC_OBJECT, None)

    def isvc_args():
        try:
            return trust_remote_code_in(serving_spec(isvc).argv or ()) if isvc is not None else None
        except (ValueError, TypeError, AttributeError, KeyError):
            return None

    def server_info():
        r = client.get("/server_info?config_format=json", timeout_s=profile.security.deadline_s)
        cfg = (r.json or {}).get("vllm_config") if r.status == 200 and isinstance(r.json, dict) else None
        value = (cfg.get("model_config") or {}).get("trust_remote_code") if isinstance(cfg, dict) else None
        return value if isinstance(value, bool) else None

    sources = [("the profile's engine.extra_args", lambda: trust_remote_code_in(profile.engine.extra_args)),
               ("/server_info model_config", server_info)]
    if isvc is not None:
        sources.insert(0, ("the --isvc object's container args", isvc_args))
    if endpoint.server_argv:  # a server kvgate launched: its whole command line (vLLM's default is off)
        launcher = SOURCES.get(endpoint.launched_by or "", "the launched server's command line")
        sources.insert(0, (launcher, lambda: bool(trust_remote_code_in(endpoint.server_argv))))
    return remote_code(sources)


def check_input_paths(request, client, profile):
    sec, model, limits = profile.security, profile.model.served_name, profile.limits
    first = canary(client, model, limits.canary_deadline_s)
    run = send_paths(client, model, PATH_PROBES, deadline_s=sec.deadline_s, canary_deadline_s=limits.canary_deadline_s,
                     trusted=sec.request_chat_template == "trusted")
    ttft_limit_ms = profile.slo.ttft_p95_ms or limits.canary_deadline_s * 1e3
    return input_paths_verdict(sec, run, first, sec.deadline_s, ttft_limit_ms)


def check_cache(request, client, profile):
    spec = profile.security.cache
    key = os.environ.get(spec.second_key_env) if spec.second_key_env else None
    note = ("the profile names no second key (security.cache.second_key_env)" if not spec.second_key_env
            else f"${spec.second_key_env} is not set" if not key else "")
    timeout_s = profile.security.deadline_s
    quiet = lambda: settle(client.metrics_text).to_dict()  # noqa: E731  what runs beside the timing look, stated
    if key is None:
        return cache_verdict(spec, probe_cache(client, profile.model.served_name, timeout_s=timeout_s,
                                               second_key_note=note, before_timing=quiet))
    with _client(client, key) as second:
        return cache_verdict(spec, probe_cache(client, profile.model.served_name, timeout_s=timeout_s, second=second,
                                               before_timing=quiet))


def check_flood(request, client, profile):
    adm = profile.security.admission
    cap = profile.limits.max_tokens_cap or 32
    replies = flood(client, profile.model.served_name, adm.max_in_flight + adm.extra, cap, profile.limits.request_timeout_s)
    return flood_verdict(adm, replies)
