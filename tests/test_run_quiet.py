"""kvgate.run.quiet.settle: waits (bounded) until the server runs nothing, and says what it saw --
injected clock, sleep and /metrics bodies; nothing sleeps."""

from __future__ import annotations

from kvgate.run.quiet import settle


def metrics(values):
    it = iter(values)

    def fetch():
        v = next(it, values[-1])
        return None if v is None else f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine=\"0\"}} {v}\n"
    return fetch


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_an_idle_server_is_stated_at_once():
    c = Clock()
    q = settle(metrics([0, 0]), clock=c, sleep=c.sleep)
    assert q.idle and q.running == 0 and q.waited_s == 0
    assert q.words() == "the server ran nothing else when it began (vllm:num_requests_running 0)"


def test_earlier_work_is_waited_out_and_named():
    c = Clock()
    q = settle(metrics([2, 2, 2, 1, 0]), clock=c, sleep=c.sleep, interval_s=0.5)  # the first: the gauge's presence
    assert q.idle and q.running == 2 and q.waited_s == 1.5
    assert q.words() == "it began once the 2 requests the server was running had ended (1.5 s)"


def test_work_that_does_not_end_is_stated_as_the_overlap_within_the_bound():
    c = Clock()
    q = settle(metrics([3]), clock=c, sleep=c.sleep, deadline_s=2.0, interval_s=0.5)
    assert q.idle is False and q.left == 3 and 2.0 <= q.waited_s <= 2.5
    assert q.words() == "measured beside 3 requests the server was still running after 2.0 s (not this probe's)"


def test_no_metrics_is_not_measured_and_says_so():
    c = Clock()
    q = settle(metrics([None]), clock=c, sleep=c.sleep, deadline_s=1.0, interval_s=0.5)
    assert q.idle is None and q.running is None and q.waited_s == 0 and c.t == 0  # not waited on
    assert "not measured" in q.words()
