"""What a release owner reads in the Allure report: per-result titles, descriptions, parameters
and grouping, and the run's metadata files in ``allure-results/``.

- :func:`decorate` (at a gate's setup) titles the result by its readable id
  (``tiny-cpu/latency/interference``), groups it as epic *profile* / feature *gate* / story *case*
  (also parentSuite/suite, so Allure 2 groups the same way), gives it a severity
  (:data:`SEVERITY`), the profile as a parameter and a link to the profile file.
- :func:`describe` (when the verdict is recorded) writes the verdict in plain words as the
  description (:func:`verdict_description`, its cause included) and ``measured``/``limit`` (and
  ``cause``) as parameters (excluded from Allure's history id, so a changed value stays the same
  test in the trend).
- :func:`tidy_results` (at the end of the run) drops allure-pytest's ``host``/``thread`` labels,
  the fixture-finalizer rows (``kvgate_gate::<lambda>``) that carry no status of their own and
  pytest-private parameters (pytest-asyncio's ``_asyncio_loop_factory=<function ... at 0x7f..>``,
  an address that changes every run) with the history id allure-pytest hashed them into.
- :func:`write_metadata` writes ``categories.json`` (:data:`CATEGORIES`: FAIL = deployment defect,
  INVALID = untrusted measurement, INCOMPLETE, SKIP = not checked, harness errors),
  ``executor.json`` (:func:`executor_info`, from the CI's environment variables) and
  ``environment.properties`` (:func:`environment_props`).

Allure's file formats: https://allurereport.org/docs/how-it-works/ (results, categories,
executor, environment). Everything written here passes through a :class:`~kvgate.report.redact.Redactor`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Mapping

from kvgate.report.redact import Redactor
from kvgate.verdict import Status, Verdict

try:  # allure-pytest is a dependency; keep the library importable without it
    import allure
except ImportError:  # pragma: no cover
    allure = None

#: Allure severity per gate: what a failure of it means for a rollout. ``blocker``: the server is
#: not the deployment the profile describes; ``critical``: requests fail or capacity is missing
#: under the profile's own load; ``normal``: an SLO or protocol detail. Unknown gates: ``normal``.
SEVERITY = {
    "fit": "critical", "deployment": "blocker", "max-context": "critical", "max-tokens": "normal",
    "streaming": "normal", "disconnect": "critical", "concurrency": "critical", "latency": "normal",
    "soak": "critical", "capacity": "critical",
}

#: Allure categories (``categories.json``; Allure 2 format, which Allure 3 reads too). A FAIL's
#: message is the verdict; kvgate prefixes an INVALID's with ``INVALID: `` an INCOMPLETE's
#: with ``INCOMPLETE: `` and an INCONCLUSIVE's with ``INCONCLUSIVE: `` (see :func:`kvgate.plugin.make_recorder`); harness errors are *broken*.
CATEGORIES = [
    {"name": "Deployment defects (FAIL)", "matchedStatuses": ["failed"],
     "messageRegex": r"^(?!(Failed: )?(INVALID|INCOMPLETE|INCONCLUSIVE): )[\s\S]*"},
    {"name": "Untrusted measurements (INVALID)", "matchedStatuses": ["failed"],
     "messageRegex": r"^(Failed: )?INVALID: [\s\S]*"},
    {"name": "Undecided percentiles (INCONCLUSIVE)", "matchedStatuses": ["failed"],
     "messageRegex": r"^(Failed: )?INCONCLUSIVE: [\s\S]*"},
    {"name": "Cut short (INCOMPLETE)", "matchedStatuses": ["failed"],
     "messageRegex": r"^(Failed: )?INCOMPLETE: [\s\S]*"},
    {"name": "Recorded, not enforced (--gate-mode record)", "matchedStatuses": ["skipped"],
     "messageRegex": r"^(XFailed: |XFAIL )?record mode[\s\S]*"},
    {"name": "Not checked (SKIP)", "matchedStatuses": ["skipped"]},
    {"name": "Harness errors (kvgate or the run broke, not a verdict)", "matchedStatuses": ["broken"]},
]

#: What each status means for whoever signs off (first line of a result's description).
MEANING = {
    "PASS": "the deployment holds what the profile declares here",
    "FAIL": "a defect in the deployment (or a profile that declares more than it serves): fix one "
            "of them before rollout",
    "INVALID": "an untrusted measurement: kvgate could not measure this reliably, so it is no verdict "
               "on the deployment; rerun it (see the evidence for why)",
    "SKIP": "not checked",
    "INCOMPLETE": "cut short before it could decide; never a pass",
    "INCONCLUSIVE": "the statistical verdict stayed undecided (its interval straddles its limit at the most the run "
                    "could measure): neither a pass nor a defect; measure more (the message names the field, e.g. "
                    "slo.max_requests, slo.max_duration_s, soak.max_duration) or on a quieter host",
}

#: What to change when a gate FAILs (the description's last line); the message carries the numbers.
ADVICE = {
    "fit": "give the KV pool more memory (gpu_memory_utilization, kv_cache_dtype fp8, more GPUs / TP) or declare "
           "less (max_model_len, the workloads' concurrency, max_num_seqs)",
    "fit.live": "kvgate's arithmetic and vLLM's pool disagree: check the profile's model architecture and engine "
                "numbers against what the server reports (vllm:cache_config_info)",
    "deployment": "deploy what the profile says (served model name, max_model_len, cache config) or correct the profile",
    "max-context": "check max_model_len on the server and any body-size or timeout limit of the gateway in front of it",
    "max-tokens": "set the server's cap (vLLM --override-generation-config max_new_tokens, or the gateway) as the "
                  "profile declares, or correct the profile",
    "streaming": "check the gateway's buffering and idle timeout, and the server's TTFT at this load",
    "disconnect": "the server (or a proxy in front) keeps generating for clients that left: make the proxy pass the "
                  "hang-up through",
    "concurrency": "fewer concurrent long sequences per replica, or more KV (see the fit gate)",
    "latency": "lower the concurrency per replica, limit max_num_batched_tokens (chunked prefill), or split short "
               "and long requests into separate pools",
    "soak": "read the classification in the message (memory growth, preemption/placement, bounded cache) and the "
            "soak plot",
    "capacity": "the limiting cause says what to change: queueing -> more replicas or max_num_seqs (if the KV pool "
                "holds more); preemptions or a full KV pool -> more KV (see the fit gate); prefill interference -> "
                "limit max_num_batched_tokens or split short and long requests; or declare a lower slo.peak_concurrency",
}

#: Labels allure-pytest adds that say nothing about the deployment.
NOISE_LABELS = ("host", "thread")


def split_id(test_id: str) -> tuple[str, str, str]:
    """``"tiny-cpu/max-context/over-length/chat"`` -> ``("tiny-cpu", "max-context",
    "over-length/chat")``; an id without a case gives ``case == ""``."""
    parts = test_id.split("/", 2)
    while len(parts) < 3:
        parts.append("")
    return parts[0], parts[1], parts[2]


def profile_sha256(source: str | None) -> str | None:
    """First 16 hex digits of the profile file's SHA-256 (None when there is no readable file)."""
    if not source:
        return None
    try:
        return hashlib.sha256(Path(source).read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def decorate(test_id: str, profile_name: str, profile_source: str | None) -> None:
    """Title, grouping, severity, profile parameter and profile link of the current Allure result
    (no-op without allure). Call once the result's name is set (after setup), before it closes."""
    if allure is None:
        return
    profile, gate, case = split_id(test_id)
    allure.dynamic.title(test_id)
    allure.dynamic.epic(profile)
    allure.dynamic.parent_suite(profile)
    if gate:
        allure.dynamic.feature(gate)
        allure.dynamic.suite(gate)
        allure.dynamic.severity(SEVERITY.get(gate, "normal"))
    if case:
        allure.dynamic.story(case)
    allure.dynamic.parameter("profile", profile_name)
    if profile_source:
        allure.dynamic.link(Path(profile_source).resolve().as_uri(), name=f"profile {Path(profile_source).name}")


def fmt_quantity(q: Mapping[str, Any], why: bool = True) -> str:
    """``{"value": 4096, "unit": "tokens"}`` -> ``"4,096 tokens"``; no value -> ``"- (reason)"``
    (``"-"`` with ``why=False``)."""
    v = q.get("value")
    if v is None:
        return f"- ({q.get('reason') or 'no value'})" if why else "-"
    if isinstance(v, bool):
        text = str(v).lower()
    elif isinstance(v, int):
        text = f"{v:,}"
    elif isinstance(v, float):
        text = f"{v:,.6g}" if abs(v) < 1e6 else f"{v:,.0f}"
    else:
        text = str(v)
    return f"{text} {q['unit']}" if q.get("unit") else text


def verdict_description(verdict: Verdict) -> str:
    """The verdict in plain words (Markdown): what the status means, the message (the arithmetic),
    the cause (``**Cause:** ...``, when the verdict states one), measured and limit with units, each
    sub-check with its status, what was not checked."""
    d = verdict.to_summary()
    lines = [f"**{verdict.status.value}** — {MEANING.get(verdict.status.value, '')}.", "", verdict.message, ""]
    if verdict.cause:
        lines += [f"**Cause:** {verdict.cause}", ""]
    lines += [f"- measured: {fmt_quantity(d['measured'])}", f"- limit: {fmt_quantity(d['limit'])}"]
    if d["checks"]:
        lines += ["", "Checks:"]
        lines += [f"- {c['status']} `{c['gate']}`: {c['message']}" + (f" (cause: {c['cause']})" if c.get("cause") else "")
                  for c in d["checks"]]
    if d["skipped_checks"]:
        lines += ["", "Not checked: " + "; ".join(f"{s['check']} ({s['reason']})" for s in d["skipped_checks"])]
    advice = ADVICE.get(verdict.gate) or ADVICE.get(verdict.gate.split("/")[0].split(".")[0])
    if verdict.status is Status.FAIL and advice:
        lines += ["", f"What to change: {advice}."]
    return "\n".join(lines)


def describe(verdict: Verdict, redactor: Redactor) -> None:
    """Description, ``measured``/``limit`` parameters (and ``cause`` when the verdict states one),
    and a ``kvgate_verdict`` label on the current Allure result (no-op without allure). The
    parameters are excluded from the history id: a changed value or cause stays the same test."""
    if allure is None:
        return
    d = verdict.to_summary()
    allure.dynamic.description(redactor.text(verdict_description(verdict)))
    allure.dynamic.parameter("measured", redactor.text(fmt_quantity(d["measured"], why=False)), excluded=True)
    allure.dynamic.parameter("limit", redactor.text(fmt_quantity(d["limit"], why=False)), excluded=True)
    if verdict.cause:
        allure.dynamic.parameter("cause", redactor.text(verdict.cause), excluded=True)
    allure.dynamic.label("kvgate_verdict", verdict.status.value)


def describe_error(message: str, redactor: Redactor) -> None:
    """Description of a result that ended without a verdict (the harness or the run broke)."""
    if allure is not None:
        allure.dynamic.description(redactor.text(
            f"**ERROR** — no verdict: kvgate or the run broke before this gate could decide (not a verdict "
            f"on the deployment).\n\n{message}"))


def tidy_results(directory: Path) -> int:
    """Rewrite ``directory``'s results: drop :data:`NOISE_LABELS` from every ``*-result.json`` and
    unquote its parameter values (allure-pytest writes ``'tiny-cpu'`` with Python's quotes); from
    every ``*-container.json`` drop the fixture rows that have no status, or passed with no steps
    and no attachments in under :data:`SLOW_FIXTURE_MS` -- allure-pytest's ``fixture::<lambda>``
    teardown noise; a slow one is where a gate's time went, kept -- and the container
    itself once it holds none. A failing fixture is kept. A result's pytest-private parameters
    (names starting with ``_``: pytest-asyncio 1.x parametrizes every async test with
    ``_asyncio_loop_factory``, whose value is a function's repr with its address) are dropped and
    its ``historyId`` recomputed as allure-pytest does (``allure_commons.utils.md5`` of the full
    name and the values of the remaining non-excluded parameters, by name): otherwise the id
    changes every run and Allure shows the soak gates as new each time, with no trend. Returns the
    number of files changed or removed; unreadable files are left as they are."""
    changed = 0
    for path in sorted(directory.glob("*-result.json")) + sorted(directory.glob("*-container.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        before = json.dumps(data, sort_keys=True)
        if "labels" in data:
            data["labels"] = [lb for lb in data["labels"] if lb.get("name") not in NOISE_LABELS]
        private = [p for p in data.get("parameters") or [] if str(p.get("name", "")).startswith("_")]
        if private:
            data["parameters"] = [p for p in data["parameters"] if p not in private]
        for p in data.get("parameters") or []:
            v = p.get("value")
            if isinstance(v, str) and len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
                p["value"] = v[1:-1]
        if private and data.get("fullName"):
            data["historyId"] = history_id(data["fullName"], data["parameters"])
        if "afters" in data:
            data["afters"] = [a for a in data["afters"] if not _noise(a)]
            if not data["afters"]:
                del data["afters"]
        if "befores" in data:
            data["befores"] = [b for b in data["befores"] if not _noise(b)]
            if not data["befores"]:
                del data["befores"]
        if path.name.endswith("-container.json") and "befores" not in data and "afters" not in data:
            path.unlink()
            changed += 1
        elif json.dumps(data, sort_keys=True) != before:
            path.write_text(json.dumps(data), encoding="utf-8")
            changed += 1
    return changed


def history_id(full_name: str, parameters: list[Mapping[str, Any]]) -> str:
    """Allure's history id of a result: md5 (``allure_commons.utils.md5``) of ``full_name`` and the
    values of ``parameters`` not marked ``excluded``, sorted by name -- allure-pytest's own
    ``get_history_id`` over the written values."""
    from allure_commons.utils import md5

    kept = sorted((p for p in parameters if not p.get("excluded")), key=lambda p: str(p.get("name")))
    return md5(full_name, *(str(p.get("value")) for p in kept))


#: A passed fixture row that took this long (ms) is kept: it is where the gate's time went (the
#: soak's rounds run in its module fixture, so soak/memory's own call reads "4ms" in Allure).
SLOW_FIXTURE_MS = 1000


def _noise(fixture: Mapping[str, Any]) -> bool:
    status = fixture.get("status")
    empty = not fixture.get("steps") and not fixture.get("attachments")
    took = (fixture.get("stop") or 0) - (fixture.get("start") or 0)
    return status is None or (status == "passed" and empty and took < SLOW_FIXTURE_MS)


def executor_info(env: Mapping[str, str]) -> dict[str, Any] | None:
    """``executor.json`` from the CI's environment variables (GitHub Actions, GitLab CI, Jenkins,
    Buildkite), or None outside CI. Keys per Allure: ``name``, ``type``, ``buildName``, ``buildUrl``,
    ``buildOrder``, ``reportUrl``."""
    if env.get("GITHUB_ACTIONS") == "true":
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        url = f"{server}/{env.get('GITHUB_REPOSITORY', '')}/actions/runs/{env.get('GITHUB_RUN_ID', '')}"
        return {"name": "GitHub Actions", "type": "github",
                "buildName": f"{env.get('GITHUB_WORKFLOW', 'workflow')} #{env.get('GITHUB_RUN_NUMBER', '?')}",
                "buildUrl": url, "buildOrder": _int(env.get("GITHUB_RUN_NUMBER"))}
    if env.get("GITLAB_CI") == "true":
        return {"name": "GitLab CI", "type": "gitlab",
                "buildName": f"{env.get('CI_PROJECT_PATH', 'pipeline')} #{env.get('CI_PIPELINE_IID', '?')}",
                "buildUrl": env.get("CI_JOB_URL") or env.get("CI_PIPELINE_URL"),
                "buildOrder": _int(env.get("CI_PIPELINE_IID"))}
    if env.get("JENKINS_URL") and env.get("BUILD_URL"):
        return {"name": "Jenkins", "type": "jenkins",
                "buildName": f"{env.get('JOB_NAME', 'job')} #{env.get('BUILD_NUMBER', '?')}",
                "buildUrl": env.get("BUILD_URL"), "buildOrder": _int(env.get("BUILD_NUMBER"))}
    if env.get("BUILDKITE") == "true":
        return {"name": "Buildkite", "type": "buildkite",
                "buildName": f"{env.get('BUILDKITE_PIPELINE_SLUG', 'pipeline')} #{env.get('BUILDKITE_BUILD_NUMBER', '?')}",
                "buildUrl": env.get("BUILDKITE_BUILD_URL"), "buildOrder": _int(env.get("BUILDKITE_BUILD_NUMBER"))}
    return None


def _int(s: str | None) -> int | None:
    try:
        return int(s) if s else None
    except ValueError:
        return None


def machine_description() -> str:
    """``"x86_64, 2 CPUs (Intel Xeon ...)"`` -- this machine's CPU, read from /proc/cpuinfo where
    present; GPUs are named by :func:`gpu_description`."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.machine()}, {os.cpu_count()} CPUs" + (f" ({model})" if model else "")


def gpu_description(nvml: Any = None) -> str:
    """Local GPUs via NVML (``nvidia-ml-py``; ``nvml`` injectable): ``"1 x NVIDIA H200 (141 GiB)"``,
    or ``"none visible (reason)"``. Never raises."""
    try:
        if nvml is None:
            import pynvml as nvml  # type: ignore[no-redef]
        nvml.nvmlInit()
        try:
            names: dict[str, int] = {}
            for i in range(nvml.nvmlDeviceGetCount()):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                name = nvml.nvmlDeviceGetName(h)
                name = name.decode() if isinstance(name, bytes) else str(name)
                gib = nvml.nvmlDeviceGetMemoryInfo(h).total / 2**30
                key = f"{name} ({gib:.0f} GiB)"
                names[key] = names.get(key, 0) + 1
        finally:
            nvml.nvmlShutdown()
        return ", ".join(f"{n} x {k}" for k, n in names.items()) or "none visible (NVML lists no device)"
    except Exception as exc:  # no driver, no library, no device: the report says so
        return f"none visible ({type(exc).__name__})"


def kvgate_version() -> str:
    """The installed kvgate's version (``"unknown"`` when it is not installed as a package)."""
    try:
        return importlib.metadata.version("kvgate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.lru_cache(maxsize=1)
def kvgate_commit() -> str | None:
    """The git commit of the checkout kvgate runs from (``git describe --always --dirty
    --abbrev=12``: ``"80b9269c3a1f"``, ``"...-dirty"`` with uncommitted changes), or None when
    kvgate is not run from a git checkout (an installed wheel) or git cannot say within 5 s."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment_props(summary: Mapping[str, Any], gate_mode: str | None = None,
                      gpu: str | None = None, machine: str | None = None) -> dict[str, Any]:
    """``environment.properties`` (Allure's Environment block) from a run's summary: run id,
    overall, profile with its file and SHA-256, endpoint as displayed, server version, the vLLM
    arguments seen (the embedded launch's command line), GPU/CPU of the machine kvgate ran on,
    kvgate version and gate mode. ``None`` values are left out by the writer."""
    launch = summary.get("launch") or {}
    cmd = launch.get("command") or []
    args = " ".join(cmd[cmd.index("--model"):]) if "--model" in cmd else " ".join(cmd[3:]) if cmd else None
    return {
        "kvgate_run_id": summary.get("run_id"),
        "overall": summary.get("overall"),
        "profile": summary.get("profile"),
        "profile_file": summary.get("profile_source"),
        "profile_sha256": profile_sha256(summary.get("profile_source")),
        "endpoint": summary.get("endpoint"),
        "server_version": summary.get("server_version"),
        "server_launch": launch.get("mode") or ("external (--endpoint)" if summary.get("endpoint") else None),
        "vllm_args": args,
        "gpu": gpu if gpu is not None else gpu_description(),
        "cpu": machine if machine is not None else machine_description(),
        "kvgate_version": kvgate_version(),
        "kvgate_commit": kvgate_commit(),
        "gate_mode": gate_mode,
    }


def write_metadata(directory: Path, props: Mapping[str, Any], redactor: Redactor,
                   env: Mapping[str, str] | None = None) -> None:
    """Write ``categories.json``, ``executor.json`` (in CI only) and ``environment.properties``
    (``props``, redacted) into an Allure results directory. Raises ``OSError``."""
    from kvgate.report.outputs import write_allure_environment

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "categories.json").write_text(json.dumps(CATEGORIES, indent=2), encoding="utf-8")
    executor = executor_info(os.environ if env is None else env)
    if executor is not None:
        (directory / "executor.json").write_text(json.dumps(redactor.data(executor), indent=2), encoding="utf-8")
    write_allure_environment(directory, {k: (None if v is None else redactor.text(str(v))) for k, v in props.items()})
