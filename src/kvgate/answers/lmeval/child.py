"""``python -m kvgate.answers.lmeval.child REQUEST.json``: one lm-eval evaluation, offline, its
per-sample scores written as JSON. Started by :func:`kvgate.answers.lmeval.runner.run_task` (and
:func:`~kvgate.answers.lmeval.runner.known_tasks`); the only kvgate module that imports lm-eval.

REQUEST.json (written by the runner; no secret in it)::

    {"out": PATH, "mode": "evaluate" | "names", "allow_hosts": [HOST, ...],
     "task": NAME, "include_path": DIR | null, "include_defaults": bool,
     "model": "local-chat-completions" | "local-completions", "model_args": {...}, "tokenizer": PATH | null,
     "limit": N | null, "num_fewshot": N | null, "metric": NAME | null, "gen_kwargs": {...} | null}

The request headers (``Authorization``, ``Host``) come in the environment variable
:data:`HEADERS_ENV` (JSON), never on the command line; the runner sets the Hugging Face offline
variables. Offline is also enforced here: every name lookup and connection other than to
``allow_hosts`` (the endpoint) is refused and recorded, so a task that needs a download says
what it would have fetched. OUT, always written (exit 0) unless the process is killed::

    {"version": "0.4.13", "task": NAME, "metric": "acc,none", "metrics": [...],
     "samples": [{"task", "doc_id", "id", "score", "answer", "generated", "expected"}, ...],
     "download": LINE | null, "unknown": LINE | null, "error": LINE | null, "seconds": S}

``mode: names`` writes ``{"names": [every task, group and tag lm-eval knows]}``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

#: JSON ``{header: value}`` of the endpoint's request headers (the run's key among them).
HEADERS_ENV = "KVGATE_LM_EVAL_HEADERS"
#: Keys of lm-eval's per-task results that are not metrics.
_NOT_METRICS = {"alias", "name", "sample_len", " ", "samples"}


def guard(allow_hosts: list[str]) -> list[str]:
    """Refuse every name lookup and TCP connection except to ``allow_hosts`` (names or
    addresses; their addresses are resolved now): what lm-eval, ``datasets`` or a task's own code
    tries to reach instead raises ``OSError`` and is appended, as ``host:port``, to the list
    returned."""
    refused: list[str] = []
    names = {h.lower() for h in allow_hosts}
    allowed = set(names)
    real_getaddrinfo, real_connect, real_connect_ex = socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex
    for h in names:
        try:
            allowed.update(str(r[4][0]) for r in real_getaddrinfo(h, None))
        except OSError:
            pass

    def _refuse(host: Any, port: Any) -> OSError:
        refused.append(f"{host}:{port}")
        return OSError(f"kvgate runs lm-eval offline: {host}:{port} is not the endpoint")

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        h = host.decode() if isinstance(host, bytes) else host
        if h is not None and str(h).lower() not in allowed:
            raise _refuse(h, port)
        found = real_getaddrinfo(host, port, *args, **kwargs)
        allowed.update(str(r[4][0]) for r in found)
        return found

    def _check(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and str(address[0]).lower() not in allowed:
            raise _refuse(address[0], address[1])

    def connect(self: socket.socket, address: Any) -> None:
        _check(self, address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        _check(self, address)
        return real_connect_ex(self, address)

    socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]
    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    return refused


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:400]


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return out


#: What each phase of an evaluation loads, as a download message names it.
PHASES = {"task": "the task's data", "model": "a tokenizer (lm-eval's huggingface tokenizer backend: the endpoint "
          "serves no /tokenize, and a loglikelihood task needs one)", "evaluate": "the evaluation"}


def _hub_error(chain: list[BaseException]) -> BaseException | None:
    """The exception of ``chain`` that says best what the Hub would have served: one naming the
    repository (``Couldn't reach 'openai/gsm8k' on the Hub``) before the offline switch's own."""
    for test in (lambda e: "on the Hub" in str(e) or "Couldn't reach" in str(e),
                 lambda e: "OfflineModeIsEnabled" in str(e) or type(e).__name__ == "OfflineModeIsEnabled",
                 lambda e: type(e).__name__ == "LocalEntryNotFoundError" or "is not cached" in str(e)):
        found = next((e for e in chain if test(e)), None)
        if found is not None:
            return found
    return None


def classify(exc: BaseException, refused: list[str], phase: str = "evaluate") -> dict[str, str]:
    """Why an evaluation gave no scores, as one of ``download`` (it needed data or code from the
    network: what -- :data:`PHASES` -- from the refused destinations or the Hub's offline error),
    ``unknown`` (lm-eval does not know the task) or ``error`` (anything else: a failed request,
    a task that cannot be built), each one line. ``phase``: what was loading (``task``,
    ``model``, ``evaluate``)."""
    chain = _chain(exc)
    hub = _hub_error(chain)
    what = PHASES.get(phase, phase)
    if refused:
        where = ", ".join(dict.fromkeys(refused))
        return {"download": f"{what}: it reached for {where} ({_one_line(hub or exc)})"}
    if hub is not None:
        return {"download": f"{what} ({_one_line(hub)})"}
    unknown = next((e for e in chain if isinstance(e, KeyError) and "not a registered task" in str(e)), None)
    if unknown is not None:
        return {"unknown": _one_line(unknown)}
    status = next((e for e in chain if type(e).__name__ == "ClientResponseError"), None)
    if status is not None:
        return {"error": f"a request failed: HTTP {getattr(status, 'status', '?')} {getattr(status, 'message', '')} "
                         f"(lm-eval stops at the first failed request)"}
    timeout = next((e for e in chain if isinstance(e, TimeoutError) or "Timeout" in type(e).__name__), None)
    if timeout is not None:
        return {"error": f"a request got no answer in time ({_one_line(timeout)}; lm-eval stops at the first failed "
                         "request)"}
    doing = {"task": "loading the task", "model": "making lm-eval's model"}.get(phase, "evaluating")
    return {"error": f"{_one_line(exc)} (while {doing})"}


def _default_metric(results: dict[str, Any]) -> str | None:
    for task_results in results.values():
        for key in task_results:
            if key not in _NOT_METRICS and "_stderr" not in key:
                return key
    return None


def samples_of(res: dict[str, Any], metric: str | None) -> dict[str, Any]:
    """The per-sample scores of ``res`` (lm-eval's ``simple_evaluate`` result with ``log_samples``)
    for ``metric`` (``NAME`` or ``NAME,FILTER``; None: the first metric lm-eval reports):
    ``{"metric", "metrics", "samples"}`` -- or ``{"error"}`` naming the metrics there are."""
    results = res.get("results") or {}
    metrics = sorted({k for r in results.values() for k in r if k not in _NOT_METRICS and "_stderr" not in k})
    chosen = metric or _default_metric(results)
    if chosen is None:
        return {"error": "lm-eval reported no metric for the task", "metrics": metrics}
    name, _, want = chosen.partition(",")
    if not want:
        want = next((k.partition(",")[2] for k in metrics if k.partition(",")[0] == name), "none")
    if f"{name},{want}" not in metrics:
        return {"error": f"the task reports {', '.join(metrics) or 'no metric'}; answers.accuracy.lm_eval.metric "
                         f"{chosen!r} is none of them", "metrics": metrics}
    by_task = res.get("samples") or {}
    out = []
    for task, samples in by_task.items():
        for s in samples:
            if s.get("filter", "none") != want or name not in s:
                continue
            doc = s.get("doc") if isinstance(s.get("doc"), dict) else {}
            ident = str(doc.get("id") or f"doc-{s.get('doc_id')}")
            got = s.get("filtered_resps")
            got = got[0] if isinstance(got, list) and got else got
            out.append({"task": task, "doc_id": s.get("doc_id"), "id": ident if len(by_task) == 1 else f"{task}/{ident}",
                        "score": s[name], "answer": got if isinstance(got, str) else repr(got),
                        "generated": isinstance(got, str), "expected": str(s.get("target"))})
    return {"metric": f"{name},{want}", "metrics": metrics, "samples": out}


class _Phase:
    """What the evaluation is doing now (``task``, ``model``, ``evaluate``), for :func:`classify`."""

    def __init__(self) -> None:
        self.now = "task"


def _evaluate(req: dict[str, Any], headers: dict[str, str], phase: _Phase) -> dict[str, Any]:
    """Load the task (its data: a download shows here), then the model (a tokenizer only when a
    task scores loglikelihoods: the endpoint's /tokenize, or the profile's ``model.tokenizer``),
    then evaluate with per-sample logging."""
    import logging

    import lm_eval
    from lm_eval import simple_evaluate
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm_eval").setLevel(logging.WARNING)  # its INFO lines echo model arguments
    tm = TaskManager(include_path=req.get("include_path"), include_defaults=req.get("include_defaults", True),
                     verbosity="ERROR")
    if req.get("mode") == "names":
        return {"version": lm_eval.__version__, "names": sorted(tm.all_tasks)}
    phase.now = "task"
    tasks = tm.load([req["task"]])["tasks"]
    phase.now = "model"
    bearer = headers.get("Authorization", "").removeprefix("Bearer ") or None
    model_args = {**req["model_args"], "header": headers or None, "auth_token": bearer}
    if all(t.get_config("output_type") == "generate_until" for t in tasks.values()):
        model_args["tokenizer_backend"] = None  # text prompts, text answers: no tokenizer to load
    elif req.get("tokenizer"):
        model_args.update(tokenizer_backend="huggingface", tokenizer=req["tokenizer"])
    if os.environ.get("SSL_CERT_FILE"):  # --ca-bundle
        model_args["ca_cert_path"] = os.environ["SSL_CERT_FILE"]
    lm = get_model(req["model"]).create_from_arg_obj(model_args)
    phase.now = "evaluate"
    res = simple_evaluate(model=lm, tasks=list(tasks.values()), task_manager=tm, num_fewshot=req.get("num_fewshot"),
                          limit=req.get("limit"), log_samples=True, bootstrap_iters=0,
                          apply_chat_template=req["model"] == "local-chat-completions", gen_kwargs=req.get("gen_kwargs"))
    if res is None:
        return {"version": lm_eval.__version__, "error": "lm-eval returned no results"}
    return {"version": lm_eval.__version__, "task": req["task"], **samples_of(res, req.get("metric"))}


def main(argv: list[str] | None = None) -> int:
    """Run the request in ``argv[0]``; write its OUT file; exit 0 (2: no request file)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        req = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    except (IndexError, OSError, ValueError) as exc:
        print(f"usage: python -m kvgate.answers.lmeval.child REQUEST.json ({exc})", file=sys.stderr)
        return 2
    headers = json.loads(os.environ.pop(HEADERS_ENV, "") or "{}")
    refused = guard(list(req.get("allow_hosts") or []))
    t0 = time.monotonic()
    phase = _Phase()
    try:
        result = _evaluate(req, headers, phase)
    except Exception as exc:  # every failure becomes one line in OUT, never a traceback in a verdict
        result = classify(exc, refused, phase.now)
    else:
        if refused and not result.get("samples"):
            result.setdefault("download", f"it reached for {', '.join(dict.fromkeys(refused))}")
    result["seconds"] = round(time.monotonic() - t0, 3)
    Path(req["out"]).write_text(json.dumps(result, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
