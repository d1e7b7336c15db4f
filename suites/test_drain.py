"""Gate: a rolling update loses no request. With long streams and non-streamed requests in flight,
the server kvgate launched gets SIGTERM (docker: ``docker stop -t grace``): every in-flight request
ends complete within rollout.drain_timeout_s, the server exits within rollout.grace_period_s, and
new requests during the drain get what the router expects (rollout.new_requests). Runs last: the
server is gone after it."""

import pytest

from kvgate.gates.drain import CASES, drain_verdict, not_asked
from kvgate.http.drain import drain
from kvgate.run.lifecycle import launched_server, server_terminated


@pytest.fixture(scope="module")
def drained(pytestconfig, kvgate_client, kvgate_profile):
    """``(launched, observation)``: one drain for the three checks; no observation when the gate
    does not apply (no rollout: section, or a server kvgate did not launch)."""
    server = launched_server(pytestconfig)
    if not_asked(kvgate_profile, server is not None) is not None:
        return server is not None, None

    def terminate():
        words = server.terminate()
        server_terminated(pytestconfig, words)
        return words

    return True, drain(kvgate_client, kvgate_profile, terminate, server.wait_exit, server.kill)


@pytest.mark.drain
@pytest.mark.gate("drain", cases=list(CASES),
                  not_applicable=lambda config, profile, case: not_asked(profile, launched_server(config) is not None, case))
def test_sigterm_drains_in_flight_requests(case, drained, kvgate_profile, kvgate_gate):
    launched, observation = drained
    verdict = not_asked(kvgate_profile, launched, case) or drain_verdict(case, observation, kvgate_profile)
    assert kvgate_gate(verdict).passed
