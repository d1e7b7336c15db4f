"""A PASS is measured: every gate module's PASS verdicts -- each case, each folded part -- rest on
evidence or a measured value, never on nothing (issue 38: soak/memory read "healthy" from a gauge
that never moved).

The walk costs no run of its own: each gate module's healthy run (a suite against the healthy fake)
or healthy inputs (its pure verdict function) already exist, and each calls
:func:`tests.conftest.assert_passes_measured` on what it produced, which fails listing every PASS
whose evidence is ``{}`` and whose measured value is None. :data:`WALKED` says where each module of
``src/kvgate/gates/`` is walked; this file fails loudly when a module (or a suite) has no walk, when
a walk named here no longer calls the check, and proves the check both ways."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest

import kvgate.gates
from kvgate.verdict import Status, Verdict, combine

from .conftest import REPO, assert_passes_measured, unmeasured_passes

#: gate module -> the tests whose healthy runs (or healthy inputs) produce its PASS verdicts and walk
#: them with assert_passes_measured. A new module of src/kvgate/gates/ fails
#: test_every_gate_module_has_its_passes_walked until its walk is named here.
WALKED = {
    "answers": ["tests/test_answers_vs_fake.py::test_healthy_answering_fake_passes_every_answers_case"],
    "api": ["tests/test_api_vs_fake.py::test_healthy_fake_passes_every_api_case"],
    "autoscale": ["tests/test_gates_autoscale.py::test_queue_that_rises_and_drains_passes_with_its_timing"],
    "capacity": ["tests/test_gates_capacity.py::test_fake_peak_below_the_knee_passes_above_it_fails_naming_knee_and_cause"],
    "compare": ["tests/test_compare.py::test_same_fake_on_both_sides_passes_and_writes_its_golden_answers"],
    "deployment": ["tests/test_gates_vs_fake.py::test_healthy_fake_passes_every_gate"],
    "disconnect": ["tests/test_gates_vs_fake.py::test_disconnect_frees_slot_on_healthy_fake"],
    "drain": ["tests/test_drain.py::test_healthy_drain_passes_with_outcomes_and_exit_time_in_the_evidence"],
    "features": ["tests/test_features_vs_fake.py::test_healthy_fake_passes_every_features_case"],
    "fit": ["tests/test_gates_fit.py::test_tiny_cpu_passes_with_exact_pool",
            "tests/test_gates_fit.py::test_live_exact_match_passes"],
    # the canary: a part of the max-context, concurrency and other verdicts of the healthy runs
    "health": ["tests/test_gates_vs_fake.py::test_healthy_fake_passes_every_gate",
               "tests/test_gates_vs_fake.py::test_load_gates_pass_on_healthy_fake",
               "tests/test_readiness.py::test_a_launched_server_that_serves_at_once_passes_with_the_measured_gap"],
    "health_load": ["tests/test_gates_health_load.py::test_healthy_fake_passes_on_its_own_load_with_the_isvcs_probe_timeout"],
    "load": ["tests/test_gates_vs_fake.py::test_load_gates_pass_on_healthy_fake"],
    "max_context": ["tests/test_gates_vs_fake.py::test_healthy_fake_passes_every_gate"],
    "max_tokens": ["tests/test_gates_vs_fake.py::test_healthy_fake_passes_every_gate",
                   "tests/test_spec_usage_vs_fake.py::test_the_suite_case_runs_under_a_declared_speculative_config"],
    "metrics": ["tests/test_gates_metrics.py::test_contract_passes_names_the_series_and_notes_an_unqueued_waiting_gauge",
                "tests/test_gates_metrics.py::test_running_truth_passes_on_a_fast_healthy_server",
                "tests/test_gates_metrics.py::test_histograms_pass_when_the_client_lands_in_the_servers_buckets",
                "tests/test_gates_metrics.py::test_under_load_passes_and_a_500_fails"],
    "pools": ["tests/test_gates_pools.py::test_pools_suite_through_a_healthy_router_passes_and_runs_only_the_pools_gates"],
    "priority": ["tests/test_gates_priority.py::test_gain_over_pairs_of_rounds_passes_with_both_sides_and_the_slo_upper_bound_in_the_message"],
    "scale": ["tests/test_scale.py::test_local_workers_send_the_one_process_design_and_judge_it_alike"],
    "requests": ["tests/test_requests_vs_fake.py::test_healthy_fake_passes_every_edge_request"],
    "security": ["tests/test_security_vs_fake.py::test_a_shut_door_passes_every_case"],
    "soak": ["tests/test_soak_vs_fake.py::test_healthy_fake_passes_the_soak_with_every_round_written"],
    "streaming": ["tests/test_gates_vs_fake.py::test_healthy_fake_passes_every_gate"],
}
#: Gate modules that build no PASS verdict (checked: no ``Verdict(..., PASS, ...)`` in their source).
NO_PASS = {"common": "what several gates share; its one verdict (preparation_verdict) is a FAIL"}


def gate_modules() -> set[str]:
    return {m.name for m in pkgutil.iter_modules(kvgate.gates.__path__)}


def _function(path: Path, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    tree = ast.parse(path.read_text())
    return next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name), None)


def _calls(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(node))


def _builds_pass(path: Path) -> list[int]:
    """Lines of ``path`` that construct ``Verdict(gate, PASS, ...)`` (``PASS`` or ``Status.PASS``)."""
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Verdict" and len(n.args) > 1:
            s = n.args[1]
            if (isinstance(s, ast.Name) and s.id == "PASS") or (isinstance(s, ast.Attribute) and s.attr == "PASS"):
                out.append(n.lineno)
    return out


def test_every_gate_module_has_its_passes_walked():
    modules = gate_modules() - {"__init__"}
    missing = sorted(modules - set(WALKED) - set(NO_PASS))
    assert not missing, (f"gate module(s) {', '.join(f'src/kvgate/gates/{m}.py' for m in missing)}: no healthy run or "
                         "healthy inputs walk their PASS verdicts; name the test that produces them in WALKED "
                         "(tests/test_passes_measured.py) and call assert_passes_measured on its verdicts there")
    stale = sorted((set(WALKED) | set(NO_PASS)) - modules)
    assert not stale, f"WALKED/NO_PASS name modules that are gone: {stale}"
    broken = []
    for module, tests in WALKED.items():
        for ref in tests:
            file, name = ref.split("::")
            fn = _function(REPO / file, name) if (REPO / file).is_file() else None
            if fn is None:
                broken.append(f"{module}: {ref} does not exist")
            elif not _calls(fn, "assert_passes_measured"):
                broken.append(f"{module}: {ref} no longer calls assert_passes_measured on its verdicts")
    assert not broken, "\n".join(broken)
    for module, why in NO_PASS.items():
        assert not _builds_pass(REPO / "src" / "kvgate" / "gates" / f"{module}.py"), \
            f"gates/{module}.py builds a PASS verdict now ({why} no longer holds): walk it (WALKED)"


def test_every_suite_decides_in_a_gate_module():
    # suites/test_<gate>.py asserts gates/<gate>.py: a suite is walked through its module
    suites = {p.stem.removeprefix("test_") for p in (REPO / "suites").glob("test_*.py")}
    assert suites and not suites - gate_modules(), sorted(suites - gate_modules())


def test_the_check_fails_listing_a_pass_that_rests_on_nothing_and_passes_a_measured_one():
    empty = Verdict("soak/memory", Status.PASS, "healthy -> PASS")
    measured = Verdict("soak/memory", Status.PASS, "slope +0.0 MB/h -> PASS", measured=0.0, unit="MB/h")
    shown = Verdict("x", Status.PASS, "seen -> PASS", evidence={"reads": 8})
    assert unmeasured_passes([measured, shown, Verdict("y", Status.FAIL, "bad -> FAIL")]) == []
    assert unmeasured_passes(empty) == ["soak/memory: healthy -> PASS"]
    folded = combine("z", [measured, Verdict("z.part", Status.PASS, "nothing -> PASS")])
    assert unmeasured_passes(folded) == ["z > z.part: nothing -> PASS"]
    with pytest.raises(AssertionError, match=r"1 PASS verdict\(s\) with no evidence and no measured value:\n"
                                             r"\s*soak/memory: healthy -> PASS"):
        assert_passes_measured([empty, measured])
    # the report form: a gate, and a check read from the part folded into its evidence
    from kvgate.report.record import RunRecord
    from kvgate.report.redact import Redactor

    rec = RunRecord("p", None, Redactor())
    rec.add("a", "p/soak/memory", empty)
    rec.add("b", "p/z", folded)
    rec.add("c", "p/ok", measured)
    assert unmeasured_passes(rec.summary()) == ["p/soak/memory: healthy -> PASS", "p/z > z.part: nothing -> PASS"]
