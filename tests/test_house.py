"""The house rules of ``src/kvgate``: no import cycle, at most five modules at the top of the
package, every other module in a folder whose docstring names its concern."""

from __future__ import annotations

import ast
from pathlib import Path

from .conftest import REPO

PKG = REPO / "src" / "kvgate"


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """kvgate module -> the kvgate modules it imports (module-level and function-level alike)."""
    mods = {module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}: relative import (the house imports absolutely)"
                targets = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):
                    deps.add(t)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50
    assert cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_at_most_five_modules_at_the_top():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 5, top


def test_every_folder_says_its_concern():
    for init in PKG.rglob("__init__.py"):
        if init.parent == PKG:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 12, f"{init}: the package docstring must say what lives there"


#: kvgate's packages from the bottom of the house up (a package may import its own layer and the
#: ones below it; a top-level module counts as the package of its name). From the package
#: docstrings: profile imports only verdict; report and http are below launch (report.redact);
#: traffic (samples, replay plans) below load; answers (its token diff) below compare, compare
#: (the compare gate's measurements) below gates, gates below authoring (lint/advise run the fit
#: gate); report below run; cli and plugin on top.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("kvgate", "verdict"),
    ("stats",),
    ("profile",),
    ("kv", "host", "report"),
    ("http",),
    ("security",),
    ("launch",),
    ("answers", "traffic"),
    ("load",),
    ("pools", "soak", "scale"),
    ("compare",),
    ("gates",),
    ("authoring",),
    ("run",),
    ("cli", "plugin", "__main__"),
)

#: Upward imports still there (``importer -> imported``); this list may only shrink. Each is a
#: lazy (function-level) import of a higher layer's data or verdict: profile's validators read the
#: hostile-request names, the accuracy task and the traffic samples; the soak plot draws the soak
#: gate's analysis; the golden set and the live baseline ask the features gate for its battery
#: (request bodies, cases, observe/decide); a replay sends through load's sessions loop while
#: load's scenarios plan replays.
UPWARD_ALLOWED = {
    "kvgate.compare.baseline -> kvgate.gates.features",
    "kvgate.compare.golden -> kvgate.gates.features",
    "kvgate.profile.models -> kvgate.answers.task",
    "kvgate.profile.models -> kvgate.answers.lmeval.task",
    "kvgate.profile.models -> kvgate.security.hostile",
    "kvgate.profile.models -> kvgate.traffic.sample",
    "kvgate.soak.plot -> kvgate.gates.soak",
    "kvgate.traffic.replay -> kvgate.load",
    "kvgate.traffic.replay -> kvgate.load.sessions",
}


def layer_of(module: str) -> int:
    """``kvgate.gates.fit`` -> the index of ``gates`` in :data:`LAYERS`; a package missing from
    it fails (a new package must take its place in the order)."""
    pkg = module.split(".")[1] if "." in module else module
    for i, names in enumerate(LAYERS):
        if pkg in names:
            return i
    raise AssertionError(f"{module}: package {pkg!r} has no place in LAYERS")


def upward_imports(pkg: Path = PKG) -> list[str]:
    """Every import (module-level and function-level) of a higher layer's module in the package at
    ``pkg``, as ``importer:line -> imported``, one per imported kvgate module."""
    mods = {".".join(r.parts[:-1] if r.name == "__init__" else r.parts): p
            for p in pkg.rglob("*.py") for r in [p.relative_to(pkg.parent).with_suffix("")]}
    out: list[str] = []
    for name, path in sorted(mods.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            found: set[str] = set()
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t:
                    found.add(t)
            found = {t for t in found if not any(o != t and o.startswith(t + ".") for o in found)}
            out += [f"{name}:{node.lineno} -> {t}" for t in sorted(found) if layer_of(t) > layer_of(name)]
    return out


def test_imports_run_downhill():
    up = upward_imports()
    unexpected = [u for u in up if u.replace(u[u.index(":"):u.index(" ->")], "") not in UPWARD_ALLOWED]
    assert unexpected == [], "imports from a lower layer up into a higher one (LAYERS): " + "; ".join(unexpected)
    stale = UPWARD_ALLOWED - {u.replace(u[u.index(":"):u.index(" ->")], "") for u in up}
    assert not stale, f"no longer imported upward, drop from UPWARD_ALLOWED: {sorted(stale)}"


def test_downhill_check_sees_a_function_level_import_up(tmp_path):
    pkg = tmp_path / "kvgate"
    for d in ("report", "run", "gates"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "run" / "modes.py").write_text("from kvgate.report.record import X\n")  # downhill
    (pkg / "gates" / "fit.py").write_text("import kvgate.report.record\n")  # downhill
    (pkg / "report" / "record.py").write_text("X = 1\n\n\ndef f():\n    from kvgate.run.modes import decide\n")
    assert upward_imports(pkg) == ["kvgate.report.record:5 -> kvgate.run.modes"]
    (pkg / "report" / "record.py").write_text("X = 1\n")
    assert upward_imports(pkg) == []
