"""lm-eval run for the accuracy case, from the run's side: which task and model
(:func:`plan`), whether lm-eval knows a named task (:func:`check_task`, a usage error before
anything runs), and the evaluation itself in a child process (:func:`run_task`) read back as an
:class:`Outcome`. Nothing here imports lm-eval (:mod:`kvgate.answers.lmeval.child` does, in the
child), so a run that does not use it pays nothing.

The child runs offline: the Hugging Face offline variables (:data:`OFFLINE_ENV`) and a socket
guard that lets it reach the endpoint's host only. The run's key travels in the child's
environment (:data:`kvgate.answers.lmeval.child.HEADERS_ENV`), never on a command line or in a
file, and is masked in any text read back from the child.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlsplit

import yaml

from kvgate.answers.lmeval.child import HEADERS_ENV
from kvgate.answers.lmeval.task import SCORER_MODULE, SCORER_SOURCE, is_yaml_path, route_of, task_name, task_yaml
from kvgate.answers.task import TaskError, load_task

if TYPE_CHECKING:
    from kvgate.profile.models import AccuracySpec

#: The lm-eval release kvgate is built and tested against (pyproject's ``lm-eval`` extra).
LM_EVAL_VERSION = "0.4.13"
#: [s] the child's start -- lm-eval's import (about 3 s) and, for a named task, its task index
#: (7-14 s on 2 loaded cores) -- bounded generously: a bound, not an estimate.
STARTUP_S = 300.0
#: Requests per document a named task may send (a 4-way multiple choice: 4 loglikelihoods).
NAMED_REQUESTS_PER_DOC = 4
#: [documents] assumed for a named task without ``limit`` when bounding its time.
UNLIMITED_DOCS = 2000
#: The child's environment: no download from the Hugging Face Hub, no telemetry.
OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_EVALUATE_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1",
               "TOKENIZERS_PARALLELISM": "false"}
HOW_TO_LIST = ("`lm-eval ls tasks` lists the names lm-eval knows; a path ending .yaml runs a task YAML of "
               "your own")
CHAT, COMPLETIONS = "local-chat-completions", "local-completions"

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class LmEvalUsage(Exception):
    """The profile's lm-eval task cannot run: lm-eval is not installed, or does not know the task.
    One line (a usage error, exit 4)."""


def installed_version() -> str | None:
    """lm-eval's installed version (package metadata; lm-eval is not imported), or None."""
    try:
        return importlib.metadata.version("lm-eval")
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Plan:
    """What one evaluation runs: lm-eval's ``task`` name, as verdicts name it (``shown``), by which
    ``model`` (:data:`CHAT` or :data:`COMPLETIONS`), with which task directory (``include_path``,
    and lm-eval's own tasks indexed or not), from which directory (``cwd``: a task YAML's relative
    ``data_files`` resolve there; None: the run's temporary directory), the files to write first
    (``files``: the generated YAML and its scorer, into the temporary directory, which becomes
    ``include_path``), and how many documents it asks at most (``docs``; None: unknown). ``task``
    is lm-eval's task name, or a task YAML's path (lm-eval loads it from there)."""

    task: str
    shown: str
    model: str
    include_path: str | None
    include_defaults: bool
    docs: int | None
    requests_per_doc: int = 1
    files: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None  # None: a fresh temporary directory (the generated files go there)


def _yaml_task_name(path: Path) -> str:
    """The ``task:`` (or ``group:``) of a task YAML, read without lm-eval (``!function`` tags
    ignored). Raises :class:`LmEvalUsage`."""

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    try:
        cfg = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except (OSError, yaml.YAMLError) as exc:
        why = " ".join(str(exc).split())
        raise LmEvalUsage(f"answers.accuracy.lm_eval.task {str(path)!r}: cannot read it as YAML ({why})") from None
    name = (cfg.get("task") or cfg.get("group")) if isinstance(cfg, dict) else None
    if not isinstance(name, str):
        raise LmEvalUsage(f"answers.accuracy.lm_eval.task {str(path)!r}: the YAML names no task (a 'task:' key)")
    return name


def plan(acc: "AccuracySpec", *, chat_template_kwargs: dict[str, Any] | None = None) -> Plan:
    """The evaluation ``acc`` (``answers.accuracy`` with ``lm_eval``; its paths absolute, as
    :func:`kvgate.profile.models.load_profile` leaves them) asks for. Raises
    :class:`~kvgate.answers.task.TaskError` (kvgate's file cannot be an lm-eval task) or
    :class:`LmEvalUsage` (a task YAML without a task name)."""
    lm = acc.lm_eval
    assert lm is not None
    if lm.task is None:
        assert acc.file is not None
        data = Path(acc.file)
        items = load_task(data)
        route = route_of(items, lm.route, data.name)
        docs = len(items) if lm.limit is None else min(lm.limit, len(items))
        return Plan(task_name(data), data.name, CHAT if route == "chat" else COMPLETIONS, include_path=None,
                    include_defaults=False, docs=docs,
                    files={"task.yaml": task_yaml(data, route, acc.max_tokens, chat_template_kwargs),
                           f"{SCORER_MODULE}.py": SCORER_SOURCE})
    model = CHAT if lm.route == "chat" else COMPLETIONS
    if is_yaml_path(lm.task):  # lm-eval loads a task from its YAML's path; relative data files resolve beside it
        path = Path(lm.task)
        _yaml_task_name(path)
        return Plan(str(path), path.name, model, include_path=None, include_defaults=False,
                    docs=lm.limit, requests_per_doc=NAMED_REQUESTS_PER_DOC, cwd=str(path.parent))
    return Plan(lm.task, lm.task, model, include_path=None, include_defaults=True, docs=lm.limit,
                requests_per_doc=NAMED_REQUESTS_PER_DOC)


# ------------------------------------------------------------------------------ the child process
def _child_env(extra: dict[str, str]) -> dict[str, str]:
    """The run's environment, offline, with this kvgate first on ``PYTHONPATH`` (the child imports
    the same kvgate the run did)."""
    import kvgate

    src = str(Path(kvgate.__file__).resolve().parents[1])
    env = {**os.environ, **OFFLINE_ENV, **extra}
    env["PYTHONPATH"] = os.pathsep.join([src] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _masked(text: str, secrets: list[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


def _last_line(stderr: str) -> str:
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "nothing on stderr"


def _spawn(req: dict[str, Any], work: Path, *, timeout_s: float, env: dict[str, str], run: Runner,
           secrets: list[str], cwd: Path | None = None) -> tuple[dict[str, Any], float]:
    """Run the child on ``req`` (written to ``work``, a temporary directory, with its OUT) from
    ``cwd`` (default ``work``); its OUT as a dict (``{"error"}`` when it wrote none or ran past
    ``timeout_s``) and its wall seconds."""
    req_path, out = work / "kvgate-request.json", work / "kvgate-result.json"
    req_path.write_text(json.dumps({**req, "out": str(out)}), encoding="utf-8")
    t0 = time.monotonic()
    try:
        done = run([sys.executable, "-m", "kvgate.answers.lmeval.child", str(req_path)], cwd=str(cwd or work), env=env,
                   capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"lm-eval did not finish in {timeout_s:.0f} s (stopped)"}, time.monotonic() - t0
    seconds = time.monotonic() - t0
    try:
        got = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        got = {"error": f"lm-eval's process ended (exit {done.returncode}) without a result: "
                        f"{_last_line(done.stderr)}"}
    if not isinstance(got, dict):
        got = {"error": "lm-eval's result is not an object"}
    return json.loads(_masked(json.dumps(got), secrets)), seconds


def known_tasks(*, cache_dir: Path | None = None, run: Runner = subprocess.run) -> frozenset[str]:
    """Every task, group and tag name the installed lm-eval knows (its task index, built by the
    child: 7-14 s), cached per lm-eval version in ``cache_dir`` (``$KVGATE_CACHE_DIR`` or
    ``~/.cache/kvgate``) so later runs read a file. Raises :class:`LmEvalUsage` when the index
    cannot be built."""
    version = installed_version() or "none"
    if cache_dir is None:
        cache_dir = Path(os.environ.get("KVGATE_CACHE_DIR") or Path.home() / ".cache" / "kvgate")
    cached = cache_dir / f"lm-eval-{version}-tasks.json"
    try:
        names = json.loads(cached.read_text(encoding="utf-8"))
        if isinstance(names, list):
            return frozenset(map(str, names))
    except (OSError, ValueError):
        pass
    with tempfile.TemporaryDirectory(prefix="kvgate-lm-eval-") as tmp:
        got, _ = _spawn({"mode": "names", "allow_hosts": []}, Path(tmp), timeout_s=STARTUP_S, env=_child_env({}),
                        run=run, secrets=[])
    if not isinstance(got.get("names"), list):
        raise LmEvalUsage(f"cannot list lm-eval's tasks: {got.get('error') or got.get('download') or 'no list'}")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        part = cached.with_suffix(f".{os.getpid()}.part")
        part.write_text(json.dumps(got["names"]), encoding="utf-8")
        part.replace(cached)
    except OSError:
        pass  # unwritable cache: the next run lists again
    return frozenset(map(str, got["names"]))


def check_task(acc: "AccuracySpec", *, names: Callable[[], frozenset[str]] = known_tasks) -> None:
    """Refuse, before anything runs, an ``answers.accuracy.lm_eval`` that cannot run: lm-eval not
    installed; a task name lm-eval does not know (``names``: :func:`known_tasks`; a task YAML or
    kvgate's own file needs no lookup). Raises :class:`LmEvalUsage` (one line)."""
    lm = acc.lm_eval
    if lm is None:
        return
    version = installed_version()
    if version is None:
        raise LmEvalUsage(f"answers.accuracy.lm_eval needs lm-eval, which is not installed (pip install "
                          f"'kvgate[lm-eval]': lm-eval {LM_EVAL_VERSION})")
    if lm.task is None or is_yaml_path(lm.task):
        return
    known = names()
    if lm.task not in known:
        close = difflib.get_close_matches(lm.task, sorted(known), n=3)
        hint = f"; close: {', '.join(close)}" if close else ""
        raise LmEvalUsage(f"answers.accuracy.lm_eval.task {lm.task!r}: lm-eval {version} knows no task of that "
                          f"name{hint} ({HOW_TO_LIST})")


@dataclass(frozen=True)
class Outcome:
    """One lm-eval evaluation, read back: ``samples`` (``{"id", "score", "answer", "expected"}``
    per document, lm-eval's per-sample value of ``metric``), or why there are none -- ``download``
    (the task needs data from the network; what it reached for) or ``error`` (one line) -- and the
    child's wall ``seconds`` (its start included)."""

    task: str
    model: str
    version: str | None
    metric: str | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    download: str | None = None
    error: str | None = None
    seconds: float = 0.0
    concurrency: int = 1


def run_task(acc: "AccuracySpec", *, base_url: str, route_prefix: str, headers: dict[str, str], model: str,
             concurrency: int, request_timeout_s: float, chat_template_kwargs: dict[str, Any] | None = None,
             tokenizer: str | None = None, run: Runner = subprocess.run) -> Outcome:
    """Evaluate ``acc``'s lm-eval task against the endpoint (``base_url`` + ``route_prefix``,
    serving ``model``) with ``headers`` (the run's key), ``concurrency`` requests in flight
    (lm-eval's ``num_concurrent``), each bounded by ``request_timeout_s`` and sent once
    (``max_retries`` 1: no hidden retry). A task that scores loglikelihoods tokenizes with the
    endpoint's ``/tokenize`` (lm-eval's ``remote`` backend) or ``tokenizer`` (the profile's
    ``model.tokenizer``, a local Hugging Face tokenizer). The whole child is bounded by :data:`STARTUP_S` plus
    ``request_timeout_s`` per round of ``concurrency`` requests. A task kvgate's file cannot make,
    or a task YAML without a name, is an ``error`` outcome."""
    lm = acc.lm_eval
    assert lm is not None
    try:
        p = plan(acc, chat_template_kwargs=chat_template_kwargs)
    except (TaskError, LmEvalUsage) as exc:
        return Outcome(lm.task or str(acc.file), "none", installed_version(), error=str(exc))
    chat = p.model == CHAT
    url = base_url.rstrip("/") + route_prefix.rstrip("/") + ("/chat/completions" if chat else "/completions")
    model_args = {"base_url": url, "model": model, "num_concurrent": concurrency, "max_retries": 1,
                  "timeout": max(1, math.ceil(request_timeout_s)), "tokenized_requests": False,
                  "tokenizer_backend": None if chat or lm.task is None else "auto"}
    gen = {"chat_template_kwargs": dict(chat_template_kwargs)} if chat and chat_template_kwargs and lm.task else None
    host = urlsplit(base_url).hostname or ""
    req = {"mode": "evaluate", "task": p.task, "include_path": None, "include_defaults": p.include_defaults,
           "model": p.model, "model_args": model_args, "limit": lm.limit, "num_fewshot": lm.num_fewshot,
           "metric": lm.metric, "gen_kwargs": gen, "tokenizer": tokenizer, "allow_hosts": [host] if host else []}
    rounds = math.ceil((p.docs or UNLIMITED_DOCS) * p.requests_per_doc / max(1, concurrency))
    timeout_s = STARTUP_S + rounds * request_timeout_s
    proxy_free = ",".join(x for x in (os.environ.get("NO_PROXY") or os.environ.get("no_proxy"), host) if x)
    extra = {HEADERS_ENV: json.dumps(headers), "NO_PROXY": proxy_free, "no_proxy": proxy_free}
    secrets = [v.split(" ", 1)[-1] for k, v in headers.items() if k.lower() == "authorization"]
    with tempfile.TemporaryDirectory(prefix="kvgate-lm-eval-") as tmp:
        work = Path(tmp)
        for name, text in p.files.items():
            (work / name).write_text(text, encoding="utf-8")
        if p.files:  # kvgate's own task: its datasets cache is the run's, not the user's
            extra["HF_DATASETS_CACHE"] = str(work / "datasets")
        req["include_path"] = str(work) if p.files else p.include_path
        got, seconds = _spawn(req, work, timeout_s=timeout_s, env=_child_env(extra), run=run, secrets=secrets,
                              cwd=Path(p.cwd) if p.cwd else None)
    error = got.get("error")
    if got.get("unknown"):
        error = f"lm-eval does not know task {p.task!r} ({got['unknown']}; {HOW_TO_LIST})"
    return Outcome(p.shown, p.model, got.get("version") or installed_version(), metric=got.get("metric"),
                   samples=list(got.get("samples") or []), download=got.get("download"), error=error,
                   seconds=round(seconds, 2), concurrency=concurrency)
