"""The drain gate (``-m drain``): the rollout: profile section, the pure verdicts, and the whole gate
run in-process against the fake vLLM as a *launched* server (``tests/data/fake-embedded-drain.yaml``,
:class:`tests.fakes.fake_embedded.FakeEmbeddedServer` in place of ``kvgate.run.lifecycle._build``,
its ``terminate()`` calling the fake's ``sigterm()``): PASS on a healthy drain, FAIL naming the
aborted requests (``abort_on_sigterm``), the new requests' 500s (``drain_500``) and a server that
never exits (``no_exit_after_drain``); SKIP against ``--endpoint`` and without ``rollout:``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import kvgate.run.lifecycle
from kvgate.gates.drain import exit_verdict, in_flight_verdict, new_requests_verdict
from kvgate.http.drain import DrainObservation, InFlight, NewRequest
from kvgate.launch.local import render_command
from kvgate.profile.models import ProfileError, load_profile
from kvgate.verdict import Status
from tests.fakes.fake_embedded import FakeEmbeddedServer
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import MINIMAL, REPO, assert_passes_measured, read_summary

pytest_plugins = ["pytester"]
PROFILE = REPO / "tests" / "data" / "fake-embedded-drain.yaml"
NAME = "fake-embedded-drain"
SUITE = str(REPO / "suites" / "test_drain.py")


# ------------------------------------------------------------------------------------ profile
def test_rollout_renders_shutdown_timeout_and_defaults_the_grace_period(write_profile):
    p = load_profile(str(write_profile("p", MINIMAL + "rollout: {drain_timeout_s: 20}\n")))
    cmd = render_command(p, "/m", 1)
    assert cmd[cmd.index("--shutdown-timeout") + 1] == "20"
    assert p.rollout.grace_s == 30 and p.rollout.new_requests == "5xx"
    assert "--shutdown-timeout" not in render_command(load_profile(str(write_profile("q", MINIMAL))), "/m", 1)


@pytest.mark.parametrize("rollout, words", [
    ("{drain_timeout_s: 20, grace_period_s: 20}", "grace_period_s 20 must exceed drain_timeout_s 20"),
    ("{drain_timeout_s: 2.5}", "drain_timeout_s"),  # vLLM's --shutdown-timeout is an int
    ("{drain_timeout_s: -1}", "drain_timeout_s"),
    ("{drain_timeout_s: 5, streams: 0, requests: 0}", "nothing is in flight"),
    ("{drain_timeout_s: 5, new_requests: maybe}", "new_requests"),
    ("{drain_timeout_s: 5, max_tokens: 256}", "rollout.max_tokens 256 leaves no room"),
    ("{drain_timout_s: 5}", "did you mean 'drain_timeout_s'"),
])
def test_nonsense_rollout_is_refused_naming_the_field(write_profile, rollout, words):
    with pytest.raises(ProfileError) as err:
        load_profile(str(write_profile("p", MINIMAL + f"rollout: {rollout}\n")))
    assert "rollout" in str(err.value) and words in str(err.value), str(err.value)


# ------------------------------------------------------------------------------ pure verdicts
def obs(**kw) -> DrainObservation:
    base = dict(signal="SIGTERM to x", exit_s=3.2, grace_s=30.0, drain_timeout_s=20,
                in_flight=[InFlight("request-1", False, 200, "length", False, 64, 2.0, None, True),
                           InFlight("stream-1", True, 200, "length", True, 64, 2.5, -0.6, True)],
                new_requests=[NewRequest("new-1", 0.0, "HTTP 500", 500, "EngineCore is shutting down")])
    base.update(kw)
    return DrainObservation(**base)


def test_in_flight_pass_and_fail_name_the_requests():
    ok = in_flight_verdict(obs())
    assert ok.status is Status.PASS and ok.measured == 2 and ok.limit == 2
    assert "all ended complete (finish_reason length, [DONE]), the last 2.5 s after the signal" in ok.message
    cut = InFlight("stream-2", True, 200, None, False, None, 0.1, -0.5, False,
                   "connection broke after 3 events (RemoteProtocolError), no [DONE]")
    bad = in_flight_verdict(obs(in_flight=obs().in_flight + [cut]))
    assert bad.status is Status.FAIL and bad.measured == 2 and bad.limit == 3
    assert bad.message.startswith("1 of 2 in-flight streams aborted at SIGTERM (stream-2: connection broke")
    assert bad.message.endswith("no [DONE]) -> FAIL")
    zero = in_flight_verdict(obs(drain_timeout_s=0, in_flight=[cut]))
    assert "(vLLM --shutdown-timeout 0, its default, aborts in-flight requests)" in zero.message
    late = in_flight_verdict(obs(drain_timeout_s=2))
    assert late.status is Status.FAIL and "stream-1 completed 2.5 s after the signal, past rollout.drain_timeout_s 2 s" \
        in late.message


def test_exit_and_new_requests_verdicts():
    assert exit_verdict(obs()).status is Status.PASS and exit_verdict(obs()).measured == 3.2
    slow = exit_verdict(obs(exit_s=None, killed=True))
    assert slow.status is Status.FAIL and "still running 30 s (rollout.grace_period_s)" in slow.message
    assert new_requests_verdict(obs(), "5xx").status is Status.PASS
    refused = new_requests_verdict(obs(), "refused")
    assert refused.status is Status.FAIL and "new-1 (sent 0.0 s after the signal) got HTTP 500" in refused.message
    assert new_requests_verdict(obs(), "any").status is Status.PASS
    hung = obs(new_requests=[NewRequest("new-1", 0.0, "timeout")])
    assert new_requests_verdict(hung, "5xx").status is Status.FAIL
    assert new_requests_verdict(obs(new_requests=[]), "5xx").status is Status.SKIP
    invalid = in_flight_verdict(obs(not_ready="request-1 ended before the signal"))
    assert invalid.status is Status.INVALID and "ended before the signal" in invalid.message


# ------------------------------------------------------------- the gate against the fake, launched
@pytest.fixture
def run_drain(pytester, monkeypatch):
    """``run_drain(*faults, profile=PROFILE, args=()) -> (ret, summary, gates, servers, out)``: the drain
    suite in-process with no ``--endpoint``: kvgate "launches" a fake embedded server whose
    terminate() is the fake vLLM's sigterm()."""

    def run(*faults: str, profile: Path = PROFILE, args: tuple[str, ...] = ()):
        fake = FakeVLLM(FakeConfig(itl_s=0.01, eos_after=None, faults=set(faults)))
        fake.start()
        servers: list[FakeEmbeddedServer] = []

        def build(st):
            servers.append(FakeEmbeddedServer(fake.base_url, st.reports_dir / "vllm-server.log", record=st.record,
                                              fake=fake))
            return servers[-1]

        monkeypatch.setattr(kvgate.run.lifecycle, "_build", build)
        reports = pytester.path / "reports"
        extra = tuple(a.replace("{url}", fake.url) for a in args)
        try:
            result = pytester.runpytest_inprocess(
                "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
                f"--profile={profile}", f"--kvgate-reports={reports}", SUITE, *extra)
        finally:
            fake.stop()
        summary = read_summary(reports)
        gates = {g["id"].split("/", 1)[1]: g for g in summary["gates"]}
        return result.ret, summary, gates, servers, result.stdout.str()

    return run


def test_healthy_drain_passes_with_outcomes_and_exit_time_in_the_evidence(run_drain):
    ret, summary, gates, servers, out = run_drain()
    assert ret == 0, out[-3000:]
    assert [g for g in gates] == ["drain/in-flight", "drain/exit", "drain/new-requests"]
    assert all(g["status"] == "PASS" for g in gates.values()), gates
    flight = gates["drain/in-flight"]
    assert "2 streams and 1 non-streamed request in flight: all ended complete" in flight["message"]
    outcomes = flight["evidence"]["in_flight"]
    assert [(f["name"], f["finish_reason"], f["complete"]) for f in outcomes] == [
        ("request-1", "length", True), ("stream-1", "length", True), ("stream-2", "length", True)]
    assert all(f["first_token_s"] < 0 < f["ended_s"] for f in outcomes if f["stream"])  # in flight at the signal
    assert gates["drain/exit"]["measured"]["unit"] == "s" and gates["drain/exit"]["measured"]["value"] < 2
    assert "HTTP 503 x2" in gates["drain/new-requests"]["message"]
    # the teardown after the drain: no second stop of a live server, noted
    teardown = next(p for p in summary["phases"] if p["name"] == "teardown")
    assert "already stopped by the drain gate" in teardown["note"] and teardown["status"] == "done"
    assert servers[0].fake.state.t_exit is not None
    assert_passes_measured(summary)  # a PASS rests on evidence or a measured value (tests/test_passes_measured.py)


def test_abort_on_sigterm_fails_naming_the_aborted_requests(run_drain):
    ret, _, gates, _, out = run_drain("abort_on_sigterm")
    assert ret == 1
    msg = gates["drain/in-flight"]["message"]
    assert gates["drain/in-flight"]["status"] == "FAIL", msg
    assert "2 of 2 in-flight streams aborted at SIGTERM (stream-1: connection broke" in msg and "no [DONE]" in msg
    assert "1 of 1 in-flight non-streamed requests aborted at SIGTERM (request-1: HTTP 500" in msg
    assert gates["drain/exit"]["status"] == "PASS"  # it did exit: at once


def test_new_requests_answered_500_fail_a_router_that_expects_refusals(run_drain):
    _, _, gates, _, _ = run_drain("drain_500")
    g = gates["drain/new-requests"]
    assert g["status"] == "FAIL" and "rollout.new_requests refused expects" in g["message"]
    assert "new-1 (sent 0.0 s after the signal) got HTTP 500" in g["message"]
    assert gates["drain/in-flight"]["status"] == "PASS"


def test_a_server_that_never_exits_fails_the_exit_check_and_is_killed(run_drain):
    _, _, gates, servers, _ = run_drain("no_exit_after_drain")
    g = gates["drain/exit"]
    assert g["status"] == "FAIL" and "still running 2 s (rollout.grace_period_s)" in g["message"]
    assert g["evidence"]["killed"] is True and servers[0].killed


def test_endpoint_and_no_rollout_skip_with_the_reason(run_drain):
    _, _, gates, _, _ = run_drain(args=("--endpoint={url}",))
    assert {g["status"] for g in gates.values()} == {"SKIP"}
    assert "not launched by kvgate (--endpoint)" in gates["drain/in-flight"]["message"]
    _, _, gates, servers, _ = run_drain(profile=REPO / "tests" / "data" / "fake-embedded.yaml")
    assert "no rollout: section" in gates["drain/exit"]["message"] and servers[0].fake.state.t_sigterm is None
