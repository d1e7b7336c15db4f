"""The CI templates in ci/ and the Dockerfile: every YAML parses and has the shape its system
expects (GitHub Actions, GitLab, Kubernetes Job + RBAC, Argo AnalysisTemplate with a Job provider,
Flagger pre-rollout webhook), and every kvgate command they (and the README) document is accepted
by kvgate as written -- run with ``--collect-only``: options, profile, selection valid; nothing is
contacted. The Dockerfile itself is built and run in tests/e2e/test_docker_launch.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from .conftest import REPO

pytest_plugins = ["pytester"]
CI = REPO / "ci"
#: Values for the variables the templates use.
ENV = {"PROFILE": "llama70b-tp4", "MEMBER": "llama-v2", "NS": "models"}


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((CI / name).read_text()) if d is not None]


def test_every_template_parses():
    files = sorted(p for p in CI.iterdir() if p.suffix in (".yml", ".yaml"))
    assert len(files) >= 6
    for p in files:
        assert docs(p.name), p


def test_github_workflow_starts_the_container_launcher():
    (wf,) = docs("github-gpu-runner.yml")
    runs = [s.get("run", "") for s in wf["jobs"]["gate"]["steps"]]
    assert any('pytest --profile "$PROFILE" --gate-mode certify' in r for r in runs)
    assert not any("docker run" in r for r in runs)  # kvgate's docker launcher starts the server
    assert "HF_TOKEN" in wf["jobs"]["gate"]["env"]


def test_gitlab_jobs():
    (gl,) = docs("gitlab-ci.yml")
    assert gl["kvgate-fit"]["stage"] == "fit" and gl["kvgate-gate"]["tags"] == ["gpu"]
    assert gl[".kvgate"]["artifacts"]["reports"]["junit"] == "reports/junit.xml"


def test_kubernetes_job_can_read_inferenceservices():
    by_kind = {d["kind"]: d for d in docs("kserve-precanary-job.yaml")}
    rule = by_kind["Role"]["rules"][0]
    assert {"inferenceservices", "llminferenceservices"} <= set(rule["resources"]) and "get" in rule["verbs"]
    spec = by_kind["Job"]["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == by_kind["ServiceAccount"]["metadata"]["name"]
    assert "--isvc" in spec["containers"][0]["args"]


def test_argo_analysis_template_has_a_job_provider():
    (at,) = docs("argo-analysis-template.yaml")
    assert at["kind"] == "AnalysisTemplate"
    job = at["spec"]["metrics"][0]["provider"]["job"]
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["template"]["spec"]["containers"][0]["args"]


def test_flagger_pre_rollout_webhook():
    canary, cron = docs("flagger-canary.yaml")
    hook = canary["spec"]["analysis"]["webhooks"][0]
    assert hook["type"] == "pre-rollout" and "cronjob/kvgate-precanary" in hook["metadata"]["cmd"]
    assert cron["kind"] == "CronJob" and cron["spec"]["suspend"] is True


def _commands() -> list[tuple[str, list[str]]]:
    """(where, pytest arguments) of every kvgate command in ci/, the README and docs/ (a command
    documented twice is run once: where it is first found)."""
    found: list[tuple[str, list[str]]] = []
    texts = {p.name: p.read_text() for p in CI.iterdir() if p.suffix in (".yml", ".yaml", ".sh")}
    texts["README.md"] = (REPO / "README.md").read_text()
    texts.update({f"docs/{p.name}": p.read_text() for p in sorted((REPO / "docs").glob("*.md"))})
    seen: set[tuple[str, ...]] = set()
    for name, text in texts.items():
        for line in text.splitlines():
            # a command line (not prose, not a continued line, not a placeholder profile path)
            m = re.match(r"^\s*(?:-\s+|run:\s+|\./bootstrap && )?\.venv/bin/pytest (--profile.*?)(?:\s+#.*)?$", line)
            if m and not m.group(1).endswith("\\") and "/path/to/" not in line and "my-" not in line \
                    and "my.yaml" not in line:
                args = shlex.split(re.sub(r'"?\$(\w+)"?', lambda v: ENV.get(v.group(1), "x"), m.group(1)))
                if tuple(args) not in seen:
                    seen.add(tuple(args))
                    found.append((name, args))
        for d in (yaml.safe_load_all(text) if name.endswith((".yml", ".yaml")) else ()):
            for c in _containers(d):
                if c.get("args") and c["args"][0] == "--profile":
                    found.append((name, [re.sub(r"\{\{args\.[\w-]+\}\}", "canary", a) for a in c["args"]]))
    return found


def _containers(node) -> list[dict]:
    if isinstance(node, dict):
        out = [node] if "image" in node and "args" in node else []
        return out + [c for v in node.values() for c in _containers(v)]
    if isinstance(node, list):
        return [c for v in node for c in _containers(v)]
    return []


COMMANDS = _commands()


def test_commands_found_in_each_template():
    where = {w for w, _ in COMMANDS}
    assert {"github-gpu-runner.yml", "gitlab-ci.yml", "kserve-precanary-job.yaml", "argo-analysis-template.yaml",
            "flagger-canary.yaml", "llmisvc-promote.sh", "README.md"} <= where, where


@pytest.mark.parametrize("where, args", COMMANDS, ids=[f"{w}:{' '.join(a)[:60]}" for w, a in COMMANDS])
def test_documented_command_is_accepted(pytester, monkeypatch, where, args):
    monkeypatch.setenv("LLM_KEY", "k")
    monkeypatch.setenv("LLM_API_KEY", "k")
    monkeypatch.delenv("KVGATE_ENDPOINT", raising=False)
    # commands that contact nothing here run for real: llama70b-tp4's docker launcher cannot run
    # (made so on any machine), so fit has its verdict and live gates SKIP: the run gated nothing
    # live, so it is NO-SERVER (exit 8) in every mode, never a pass (-m fit asked for nothing live: 0)
    # files a documented command reads that exist only where it runs: the coordinator pod's mounted
    # worker Job (the template itself holds it), a recording an earlier documented step made (a shipped one)
    mounted = {"/etc/kvgate/worker-job.yaml": str(CI / "scale-out-indexed-job.yaml")}
    recording = REPO / "tests" / "data" / "recordings" / "smollm2-cpu-f32"
    args = [f"--workers-job={mounted.get(a.split('=', 1)[1], a.split('=', 1)[1])}" if a.startswith("--workers-job=")
            else f"--baseline-reports={recording}" if a.startswith("--baseline-reports=") and
            not (REPO / a.split("=", 1)[1]).exists() else a for a in args]
    real = args[1] == "llama70b-tp4" and not {"--isvc", "--endpoint"} & set(args)
    if real:
        from kvgate.launch.docker import DockerLauncher

        monkeypatch.setattr(DockerLauncher, "unavailable", classmethod(lambda cls, p: "no GPU (test)"))
    result = pytester.runpytest_inprocess("-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO),
                                          "-p", "no:cacheprovider", f"--kvgate-reports={pytester.path / 'r'}",
                                          *args, *([] if real else ["--collect-only", "-q"]), str(REPO / "suites"))
    fit_only = "-m" in args and args[args.index("-m") + 1] == "fit"
    want = 8 if real and not fit_only else 0
    assert result.ret == want, (where, args, result.stderr.str()[-1500:])
    if real:
        from .conftest import read_summary

        summary = read_summary(pytester.path / "r")
        assert summary["exit_code"] == want
        if not fit_only:  # the SKIP count docs/launchers.md states for this run is this run's
            said = re.search(r"`pytest --profile llama70b-tp4` -> 1 PASS\s+\(fit\), every other selected gate SKIP "
                             r"\((\d+) on", (REPO / "docs" / "launchers.md").read_text())
            assert said and summary["counts"] == {**summary["counts"], "PASS": 1, "SKIP": int(said.group(1))}, \
                (said and said.group(1), summary["counts"])


#: kvgate's options that take a path: pytest reads a path after a space as a test path (README).
PATH_OPTIONS = ("--profile", "--kvgate-reports", "--workers-job", "--ca-bundle", "--baseline-reports", "--profile-dir")


def test_every_path_option_in_a_container_is_given_with_equals():
    """A container's args that give a path-valued option as two items (``"--workers-job", "/etc/..."``)
    make pytest collect the path as tests (the coordinator pod then ends "found no kvgate
    configuration"): a path is given as ``--option=/path``. A profile *name* after ``--profile`` is fine."""
    bad = []
    for f in sorted(p for p in CI.iterdir() if p.suffix in (".yml", ".yaml")):
        for doc in docs(f.name):
            for c in re.findall(r"'args': (\[.*?\])", str(doc)):
                args = yaml.safe_load(c)
                for opt, value in zip(args, args[1:]):
                    if opt in PATH_OPTIONS and isinstance(value, str) and ("/" in value or value.endswith(".yaml")):
                        bad.append(f"{f.name}: {opt} {value}")
    assert bad == []
