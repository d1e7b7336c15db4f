"""tests/conftest.py's pytest-xdist scheduler (``UnitsThenE2E``), driven as pytest-xdist's controller
drives it, by two stand-in workers that run a test per step each: the e2e modules that hold on a busy
machine (``E2E_BESIDE_UNITS``) go first, whole, to one worker while the other runs the unit tests;
that worker joins the unit tests after; the timing-sensitive e2e tests go last, whole, to one worker
once the other is out of work. No test is run: the scheduler only sees node ids."""

from __future__ import annotations

import pytest

from tests import conftest

BESIDE = [f"tests/e2e/{conftest.E2E_BESIDE_UNITS[0]}::test_a", f"tests/e2e/{conftest.E2E_BESIDE_UNITS[0]}::test_b",
          f"tests/e2e/{conftest.E2E_BESIDE_UNITS[1]}::test_c"]
QUIET = ["tests/e2e/test_embedded.py::test_main", "tests/e2e/test_served.py::test_x", "tests/e2e/test_served.py::test_y"]
UNITS = [f"tests/test_u{i}.py::test_{i}" for i in range(12)]


class Worker:
    """A worker as the scheduler sees it: the indices it was sent, in order; like pytest-xdist's, it
    holds back its last test until it gets more work or is shut down."""

    def __init__(self, name: str) -> None:
        self.gateway = type("Gateway", (), {"id": name})()
        self.name, self.queue, self.shutting_down = name, [], False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.queue.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True

    def can_run(self) -> bool:
        return len(self.queue) > 1 or (self.queue and self.shutting_down)


def drive(pytester: pytest.Pytester, collection: list[str], *options: str) -> list[tuple[str, str]]:
    """Every test of ``collection`` run by two workers taking turns a test at a time: ``[(worker,
    node id)]`` in the order they ran. Fails on a stall (work left that no worker may run)."""
    config = pytester.parseconfig("--tx", "2*popen", "--dist", "load", "-p", "xdist", *options)
    sched = conftest.pytest_xdist_make_scheduler(config, None)
    assert type(sched).__name__ == "UnitsThenE2E"
    workers = [Worker("gw0"), Worker("gw1")]
    for w in workers:
        sched.add_node(w)
        sched.add_node_collection(w, collection)
    sched.schedule()
    ran: list[tuple[str, str]] = []
    while sched.has_pending:
        runnable = [w for w in workers if w.can_run()]
        assert runnable, f"stalled: {[(w.name, w.queue, w.shutting_down) for w in workers]}, queue {list(sched.workqueue)}"
        for w in runnable:  # one step: each worker that can runs its next test
            if w.can_run():
                index = w.queue.pop(0)
                ran.append((w.name, collection[index]))
                sched.mark_test_complete(w, index)
    return ran


@pytest.mark.parametrize("collection, options", [
    (sorted(BESIDE + QUIET + UNITS), ()),  # by name; pytest-xdist queues the biggest work units first
    (UNITS + QUIET + BESIDE, ("--no-loadscope-reorder",)),  # in the order given, the lanes last
], ids=["by-name", "units-first-no-reorder"])
def test_beside_lane_first_on_one_worker_units_on_the_other_timing_sensitive_e2e_last_alone(pytester, collection,
                                                                                            options):
    ran = drive(pytester, collection, *options)
    assert sorted(t for _, t in ran) == sorted(collection), "every test runs exactly once"
    order = [t for _, t in ran]
    beside_worker = {w for w, t in ran if t in BESIDE}
    assert len(beside_worker) == 1 and [t for w, t in ran if t in BESIDE] == BESIDE  # one worker, in order
    (bw,) = beside_worker
    # that worker runs its lane first; meanwhile the other runs unit tests; it joins them after
    assert [t for w, t in ran if w == bw][:len(BESIDE)] == BESIDE
    last_beside = max(order.index(t) for t in BESIDE)
    assert any(w != bw and t in UNITS for w, t in ran[:last_beside]), "the unit tests wait for the e2e lane"
    assert any(w == bw and t in UNITS for w, t in ran), "the lane's worker never joined the unit tests"
    # the timing-sensitive e2e tests: one worker, in collection order, after every other test
    assert len({w for w, t in ran if t in QUIET}) == 1 and [t for t in order if t in QUIET] == sorted(QUIET)
    assert min(order.index(t) for t in QUIET) > max(order.index(t) for t in BESIDE + UNITS) - 1
    # (- 1: the other worker's held-back last test may run as the e2e lane starts, as pytest-xdist does)


def test_without_the_beside_lane_the_order_is_as_before(pytester):
    ran = drive(pytester, sorted(QUIET + UNITS))
    order = [t for _, t in ran]
    assert len({w for w, t in ran if t in QUIET}) == 1
    assert min(order.index(t) for t in QUIET) > max(order.index(t) for t in UNITS) - 1


def test_lanes_of_node_ids():
    assert [conftest._lane(t) for t in (BESIDE[0], UNITS[0], QUIET[0])] == [0, 1, 2]
    assert conftest._lane("tests/e2e/test_embedded.py::test_main") == 2  # not listed: timing-sensitive


def test_every_module_beside_the_unit_tests_exists():
    e2e = conftest.REPO / conftest.E2E_DIR
    assert [n for n in conftest.E2E_BESIDE_UNITS if not (e2e / n).is_file()] == []
