"""health/ready-to-serving: ready (``/health`` 200, the model listed) while generations are refused is
timed (kvgate.http.readiness) and judged (kvgate.gates.health.ready_to_serving_verdict) -- both ways,
on scripted probes with an injected clock, on the fake vLLM sharing that clock (no sleeping), through
a launcher (the base's watch and the docker launcher's loop), and through the suite with
``--endpoint``."""

from __future__ import annotations

import pytest

from kvgate.gates.health import READY_GATE, ready_to_serving_verdict
from kvgate.http.client import Endpoint, KvClient
from kvgate.http.readiness import Attempt, Look, watch_bound_s, watch_client, watch_serving
from kvgate.launch.kserve import readiness_probe
from kvgate.report.signoff import signoff_markdown
from kvgate.verdict import Status
from tests.fakes.fake_vllm import FakeConfig, FakeVLLM

from .conftest import REPO, assert_passes_measured, read_summary

pytest_plugins = ["pytester"]
LIMIT = 5.0
WHERE = "limits.ready_to_serving_max_s default"


class Clock:
    """Monotonic seconds that move only when slept on (or when a request 'takes' time)."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def scripted(clock: Clock, *, not_ready_looks: int = 0, refuse_until: float = 0.0, status: int = 503,
             gen_s: float = 0.05):
    """look/generate over a clock: ``not_ready_looks`` looks see /health 503 first; generations are
    refused with ``status`` while the clock is before ``refuse_until``; each takes ``gen_s``."""
    looks = iter([Look(503, True)] * not_ready_looks)

    def look() -> Look:
        return next(looks, Look(200, True))

    def generate(timeout_s: float) -> Attempt:
        clock.t += gen_s
        if clock.t < refuse_until:
            return Attempt(False, status, f"/completions: {status} (warming up)", gen_s)
        return Attempt(True, 200, "served", gen_s)

    return look, generate


def watch(clock, look, generate, launched=True, bound_s=watch_bound_s(LIMIT)):
    return watch_serving(look, generate, where="the embedded launcher" if launched else "kvgate's first look",
                         launched=launched, bound_s=bound_s, clock=clock, sleep=clock.sleep)


def test_a_launched_server_that_serves_at_once_passes_with_the_measured_gap():
    clock = Clock()
    obs = watch(clock, *scripted(clock))
    assert obs.ready and obs.onset_seen and obs.refusals == 0 and obs.gap_s == pytest.approx(0.05)
    v = ready_to_serving_verdict(obs, LIMIT, WHERE)
    assert v.status is Status.PASS and v.gate == READY_GATE and v.measured == pytest.approx(0.05) and v.limit == LIMIT
    assert "ready -> serving 0.05 s" in v.message and "limit 5 s (limits.ready_to_serving_max_s default)" in v.message
    assert v.evidence["readiness"]["gap_s"] == 0.05 and "kvgate's readiness look" in v.message
    assert_passes_measured(v)


def test_ready_while_refused_past_the_limit_fails_naming_gap_limit_probe_and_cause():
    clock = Clock()
    obs = watch(clock, *scripted(clock, refuse_until=clock.t + 8.0))
    assert obs.refusals > 20 and obs.statuses == {"503": obs.refusals} and 8.0 <= obs.gap_s < 8.4
    probe = readiness_probe({"kind": "InferenceService", "spec": {"predictor": {"model": {"readinessProbe": {
        "httpGet": {"path": "/v1/models", "port": 8080}, "periodSeconds": 5}}}}})
    v = ready_to_serving_verdict(obs, LIMIT, WHERE, probe=probe)
    assert v.status is Status.FAIL and v.measured == round(obs.gap_s, 3) and v.limit == LIMIT and v.unit == "s"
    assert f"refused for {obs.gap_s:.2f} s after its onset of ready" in v.message
    assert "limit 5 s" in v.message and "503 x" in v.message and "first: /completions: 503 (warming up)" in v.message
    assert "readinessProbe httpGet /v1/models :8080 every 5 s (timeout 1 s" in v.message  # path and timing
    assert "spec.predictor.model.readinessProbe" in v.message and v.evidence["probe"]["timing"]["periodSeconds"] == 5
    assert "refused 503" in v.cause and "readiness probe should exercise a generation" in v.cause


def test_never_served_within_the_bound_fails_with_the_seconds_watched():
    clock = Clock()
    obs = watch(clock, *scripted(clock, refuse_until=float("inf"), status=0), bound_s=30.0)
    assert obs.gap_s is None and 30.0 <= obs.watched_s < 30.5 and obs.statuses == {"0": obs.refusals}
    v = ready_to_serving_verdict(obs, LIMIT, WHERE)
    assert v.status is Status.FAIL and v.measured == round(obs.watched_s, 3)
    assert "none served by the watch's bound (30 s" in v.message and "no answer x" in v.message
    assert "get no answer" in v.cause


def test_an_endpoint_already_serving_at_the_first_look_skips_not_observable():
    clock = Clock()
    obs = watch(clock, *scripted(clock), launched=False)
    assert obs.served_at_first_look and obs.refusals == 0
    v = ready_to_serving_verdict(obs, LIMIT, WHERE)
    assert v.status is Status.SKIP and "not observable" in v.message and "0 refusals" in v.message
    assert v.measured is None  # no PASS without a measured onset


def test_first_look_refused_counts_from_the_look_fail_past_the_limit_inconclusive_below():
    clock = Clock()
    over = watch(clock, *scripted(clock, refuse_until=clock.t + 7.0), launched=False)
    v = ready_to_serving_verdict(over, LIMIT, WHERE)
    assert not over.onset_seen and v.status is Status.FAIL and "the gap is at least this" in v.message
    clock = Clock()
    under = watch(clock, *scripted(clock, refuse_until=clock.t + 2.0), launched=False)
    v = ready_to_serving_verdict(under, LIMIT, WHERE)
    assert v.status is Status.INCONCLUSIVE and "straddles" in v.message and v.measured == round(under.gap_s, 3)


def test_an_endpoint_seen_not_ready_then_ready_has_its_onset_measured():
    clock = Clock()
    obs = watch(clock, *scripted(clock, not_ready_looks=3, refuse_until=clock.t + 1.5), launched=False)
    assert obs.onset_seen and 0.75 <= obs.gap_s < 2.0  # counted from the first ready look, not from the start
    assert ready_to_serving_verdict(obs, LIMIT, WHERE).status is Status.PASS


def test_never_ready_or_not_looked_skips_saying_why():
    clock = Clock()
    obs = watch(clock, lambda: Look(404, True), lambda t: pytest.fail("no generation before ready"),
                launched=False, bound_s=2.0)
    v = ready_to_serving_verdict(obs, LIMIT, WHERE)
    assert v.status is Status.SKIP and "never reported ready" in v.message and "/health 404" in v.message
    assert clock.t == 1000.0 and "no readiness endpoint" in v.message  # no /health to time: one look, no wait
    clock = Clock()  # a /health that answers, not yet 200: watched for the bound
    obs = watch(clock, lambda: Look(503, True), lambda t: pytest.fail("no generation before ready"),
                launched=False, bound_s=2.0)
    assert clock.t >= 1002.0 and ready_to_serving_verdict(obs, LIMIT, WHERE).status is Status.SKIP
    v = ready_to_serving_verdict(None, LIMIT, WHERE, missing="the pools launcher does not time it")
    assert v.status is Status.SKIP and "the pools launcher does not time it" in v.message


# ------------------------------------------------------------------ the fake vLLM, on the same clock
@pytest.fixture
def clocked_fake():
    clock = Clock()
    fake = FakeVLLM(FakeConfig())
    fake.clock = clock
    fake.start()
    try:
        yield fake, clock
    finally:
        fake.stop()


@pytest.mark.parametrize("refuse_s, status", [(8.0, Status.FAIL), (0.0, Status.PASS)])
def test_fake_refusing_generations_after_ready_fails_and_healthy_fake_passes(clocked_fake, refuse_s, status):
    fake, clock = clocked_fake
    fake.config.refuse_generations_s = refuse_s
    with KvClient(Endpoint(fake.base_url), clock=clock) as client:
        obs = watch_client(client, "fake-model", where="the embedded launcher", launched=True,
                           bound_s=watch_bound_s(LIMIT), clock=clock, sleep=clock.sleep)
    v = ready_to_serving_verdict(obs, LIMIT, WHERE)
    assert v.status is status, v.message
    if status is Status.FAIL:  # refused from the fake's start until 8 s on its clock: 32 polls of 0.25 s
        assert obs.gap_s == pytest.approx(8.0, abs=0.26) and obs.statuses == {"503": obs.refusals} == {"503": 32}
        assert "not ready to serve yet" in obs.first_refusal and "503" in v.cause
    else:
        assert obs.refusals == 0 and obs.gap_s == pytest.approx(0.0, abs=1e-9)
    assert not [r for r in fake.state.requests if r.status == 200][1:]  # at most one generation served


def test_the_launcher_base_times_ready_to_serving_on_every_server_it_starts(clocked_fake):
    from kvgate.launch.base import Launcher
    from kvgate.profile.models import load_profile

    fake, clock = clocked_fake
    fake.config.refuse_generations_s = 6.0

    class Started(Launcher):
        mode = "embedded"

        def __init__(self):
            self.profile, self.base_url, self.clock, self.sleep = load_profile(str(REPO / "tests/data/fake-vllm.yaml")), None, clock, clock.sleep

        def _launched(self):
            return True

        def _wait(self):
            return fake.base_url

        def stop(self, grace_s=None):
            pass

    server = Started()
    assert server.wait_ready() == fake.base_url
    obs = server.readiness
    assert obs.where == "the embedded launcher" and obs.onset_seen and obs.gap_s == pytest.approx(6.0, abs=0.26)
    assert ready_to_serving_verdict(obs, LIMIT, WHERE).status is Status.FAIL


# ------------------------------------------------------------------ the suite, --endpoint, the real fake
def test_suite_through_endpoint_fails_a_refusing_fake_and_skips_a_serving_one(pytester, tmp_path):
    profile = tmp_path / "ready.yaml"
    profile.write_text(f"extends: {REPO / 'tests/data/fake-vllm.yaml'}\nlimits: {{ready_to_serving_max_s: 0.2}}\n")
    for refuse_s, want in ((2.0, "FAIL"), (0.0, "SKIP")):
        with FakeVLLM(FakeConfig(refuse_generations_s=refuse_s)) as fake:
            reports = tmp_path / f"reports-{want}"
            pytester.runpytest_inprocess(
                "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "-p", "no:cacheprovider",
                f"--profile={profile}", "--endpoint", fake.url, "--kvgate-reports", str(reports),
                "-k", "ready_means_serving", str(REPO / "suites/test_health_load.py"))
        summary = read_summary(reports)
        g = {g["id"]: g for g in summary["gates"]}[f"{summary['profile']}/health/ready-to-serving"]
        assert g["status"] == want, g["message"]
        if want == "FAIL":  # the first look found it ready and refusing: the gap from there, at least
            assert "the gap is at least this" in g["message"] and "limit 0.2 s" in g["message"]
            assert g["measured"]["value"] > 0.2 and g["measured"]["unit"] == "s"
            assert g["evidence"]["readiness"]["refusal_statuses"].get("503")
        else:
            assert "already served" in g["message"]
        assert any(p["name"].startswith("first look") for p in summary["phases"])
        row = next(r for r in signoff_markdown(summary).splitlines() if r.startswith("| ready -> serving |"))
        assert (f"at least (ready before kvgate looked) (limit 0.2 s), " in row and ": FAIL |" in row) if want == "FAIL" \
            else row == "| ready -> serving | not measured (limit 0.2 s), timed by kvgate's first look (--endpoint): SKIP |"


def test_docker_launcher_times_it_in_its_own_loop_both_ways(write_profile, tmp_path):
    """The docker launcher's start-up loop (health, then a generation until one answers) records the
    gap itself; the base's watch then sends nothing more."""
    from tests.test_launch_docker import FakeContainer, profile_with

    from kvgate.launch import docker as dl

    prof = profile_with(write_profile, "  mode: docker\n  image: local/x\n")
    for refuse_s, status in ((7.0, Status.FAIL), (0.0, Status.PASS)):
        clock = Clock()
        box = FakeContainer("local/x", serve=FakeConfig(max_tokens_cap=64, refuse_generations_s=refuse_s))
        dock = dl.DockerLauncher(prof, tmp_path / "vllm-server.log", environ={}, container_factory=lambda image: box,
                                 poll_s=0.25, clock=clock, sleep=clock.sleep)
        dock.launch()
        box.fake.clock, box.fake.t_started = clock, clock()  # the fake's refusal window on the launcher's clock
        dock.wait_ready()
        obs = dock.readiness
        dock.stop()
        assert obs.where == "the docker launcher" and obs.onset_seen
        assert obs.gap_s == pytest.approx(refuse_s, abs=0.26) and obs.refusals == int(refuse_s / 0.25)
        assert len([r for r in box.fake.state.requests if r.status == 200]) == 1  # no second generation by the base
        assert ready_to_serving_verdict(obs, LIMIT, WHERE).status is status
