"""The README is a door and docs/ the rooms: the README stays short, and every command, link and file
the README and docs/ name exists as written -- ``kvgate`` commands parse with kvgate's own parser,
``pytest`` commands name options kvgate or pytest has and profiles that exist (whole commands are run
with ``--collect-only`` in tests/test_ci_templates.py), links resolve to files and headings, and
the repository paths they quote are there. No server, no subprocess: a few hundred milliseconds."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from kvgate.cli.main import build_parser

from .conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: Words that mark a command as a template to fill in, not one to run as written.
PLACEHOLDERS = ("/path/to/", "my-", "my.yaml", "ROUTER", "SHORT", "LONG", "DIR", "FILE", "NAME", "URL", "PROFILE...",
                "...", "requests.jsonl")
TOP = ("src/", "tests/", "profiles/", "ci/", "benchmarks/", "docs/", "fixtures/", "suites/")


def _rel(page: Path) -> str:
    return str(page.relative_to(REPO))


def _commands(page: Path, program: str) -> list[str]:
    """Every ``program`` command in ``page``: code lines (a ``\\`` continuation joined) and inline code
    spans, the trailing ``# comment`` dropped."""
    text = page.read_text()
    joined = re.sub(r"\\\n\s*", " ", text)
    found = []
    for m in re.finditer(rf"(?:^|`)\s*(?:\./bootstrap && )?({re.escape(program)} [^`\n]*)", joined, re.M):
        cmd = re.split(r"\s+#", m.group(1))[0].strip()
        found.append(cmd)
    return found


def test_the_readme_is_a_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move the detail into docs/"
    assert max(len(ln) for ln in lines) < 400, "a README line (a table cell) longer than 400 characters"
    text = "\n".join(lines)
    # the two commands, exactly
    assert "./bootstrap && .venv/bin/pytest --profile smollm2-cpu\n" in text
    assert "./bootstrap && .venv/bin/pytest tests -n 2\n" in text


def _template(command: str) -> bool:
    return any(p in command for p in PLACEHOLDERS if p != "requests.jsonl")  # a sample's name parses alike


KVGATE = [(_rel(p), c) for p in PAGES for c in _commands(p, ".venv/bin/kvgate") if not _template(c)]


@pytest.mark.parametrize("where, command", KVGATE, ids=[f"{w}:{c[17:60]}" for w, c in KVGATE])
def test_documented_kvgate_command_parses(where, command):
    args = shlex.split(command)[1:]
    try:
        build_parser().parse_args(args)
    except SystemExit as exc:
        pytest.fail(f"{where}: `{command}` is refused by kvgate's parser (exit {exc.code})")
    for a in args:  # the repository files it names exist
        if a.startswith(TOP):
            assert (REPO / a).exists(), f"{where}: `{command}` names {a}, which does not exist"


def test_documented_commands_are_found():
    assert len(KVGATE) >= 8 and {w for w, _ in KVGATE} >= {"README.md", "docs/reports.md", "docs/profiles.md"}


def _pytest_options(config: pytest.Config) -> set[str]:
    """Every long option this pytest knows (its own and its plugins', kvgate's included), read from
    its parser -- what ``pytest --help`` lists, without a second pytest process."""
    parser = config._parser
    return {n for group in (parser._anonymous, *parser._groups) for o in group.options for n in o.names()
            if n.startswith("--")}


def test_documented_pytest_commands_name_options_and_profiles_that_exist(pytestconfig):
    options = _pytest_options(pytestconfig)
    assert {"--profile", "--kvgate-reports", "--gate-mode", "--junitxml", "--alluredir", "--numprocesses"} <= options
    profiles = {p.stem for p in (REPO / "profiles").glob("*.yaml")}
    bad = []
    for page in PAGES:
        for command in _commands(page, ".venv/bin/pytest"):
            args = shlex.split(command)[1:]
            for a in args:
                opt = a.split("=", 1)[0]
                if opt.startswith("--") and opt not in options:
                    bad.append(f"{_rel(page)}: `{command}`: no option {opt}")
            for i, a in enumerate(args):
                name = a.split("=", 1)[1] if a.startswith(("--profile=", "--deploy-profile=")) else \
                    args[i + 1] if a in ("--profile", "--deploy-profile") and i + 1 < len(args) else None
                if name is None or any(p in name for p in PLACEHOLDERS):
                    continue
                if ("/" in name or name.endswith(".yaml")) and not (REPO / name).exists():
                    bad.append(f"{_rel(page)}: `{command}`: no profile file {name}")
                elif "/" not in name and not name.endswith(".yaml") and name not in profiles:
                    bad.append(f"{_rel(page)}: `{command}`: no profile {name} in profiles/")
    assert not bad, "\n".join(bad)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but ``-``/``_`` dropped, spaces to ``-``."""
    out = set()
    fence = False
    for ln in page.read_text().splitlines():
        fence ^= ln.startswith("```")
        if not fence and ln.startswith("#"):
            title = ln.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def test_links_and_quoted_paths_resolve():
    bad = []
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{_rel(page)}: link {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{_rel(page)}: link {target}: no heading #{anchor} in {dest.name}")
        for span in re.findall(r"`([^`\s]+)`", text):
            span = span.rstrip(".,:;)")
            if span.startswith(TOP) and not any(c in span for c in "*{}<>$") and not _template(span) \
                    and not (REPO / span).exists():
                bad.append(f"{_rel(page)}: `{span}` does not exist")
    assert not bad, "\n".join(bad)


def test_every_kvgate_serve_option_is_documented_in_launchers_md():
    """docs/launchers.md's ``kvgate serve`` section names each of its options (``--api-key-env``
    was missing), and the per-serve key file (``serve-PROFILE-PID.key``) it writes."""
    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    options = [o for a in sub.choices["serve"]._actions for o in a.option_strings if o.startswith("--") and o != "--help"]
    text = (REPO / "docs" / "launchers.md").read_text()
    section = text.split("## The embedded server alone", 1)[1].split("\n## ", 1)[0]
    assert "--api-key-env" in options
    assert [o for o in options if f"`{o}" not in section] == [], section
    assert "serve-PROFILE-PID.key" in section


NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def test_compare_md_counts_the_cases_the_compare_suite_has():
    """docs/compare.md's "its N cases" (SKIP without a baseline) and the cases it names in bold
    are those of suites/test_compare.py (it said three after the contract case made four)."""
    suite = (REPO / "suites" / "test_compare.py").read_text()
    cases = [c for group in re.findall(r'@pytest\.mark\.gate\("compare", cases=\[([^\]]*)\]\)', suite)
             for c in re.findall(r'"([^"]+)"', group)]
    text = (REPO / "docs" / "compare.md").read_text()
    counts = re.findall(r"its (\w+) cases", text)
    assert cases == ["rendering", "outputs", "latency", "features", "contract", "long-context"] and len(counts) == 2, (cases, counts)
    assert {NUMBER_WORDS.get(w) for w in counts} == {len(cases)}, counts
    proves = text.split("## What it proves", 1)[1].split("\n## ", 1)[0]
    assert [c for c in cases if f"**{c}**" not in proves] == [], proves
