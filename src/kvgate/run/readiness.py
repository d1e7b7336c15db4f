"""Where a run's ready -> serving observation comes from, for the health/ready-to-serving case
(``suites/test_health_load.py``; measured by :mod:`kvgate.http.readiness`, decided by
:func:`kvgate.gates.health.ready_to_serving_verdict`).

- A server kvgate starts: its launcher timed it at start-up (:meth:`kvgate.launch.base.Launcher._watch_serving`,
  or the docker launcher's own loop): ``launcher.readiness``.
- ``--endpoint`` / ``--isvc``: :func:`first_look`, called once the run's items are collected and
  before the first gate (:func:`kvgate.run.lifecycle.pytest_collection_modifyitems`), when the case is
  among them -- the run's first look after the preflight's one ``GET /v1/models``. A run that does
  not select the case sends nothing for it.
- ``--isvc``: the InferenceService's readiness probe (path, timing) is read from the spec
  (:func:`kvgate.launch.kserve.readiness_probe`) and named beside the measurement.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.http.client import KvClient
from kvgate.http.readiness import Readiness, watch_bound_s, watch_client
from kvgate.profile.models import Profile
from kvgate.run.session import ISVC_OBJECT, RUN, SERVER_KEY, Run

#: ``Run.extra`` key of the ``--endpoint`` first look's :class:`Readiness`.
READINESS_KEY = "readiness_first_look"
#: The case this module feeds (gate marker name, case).
CASE = ("health", "ready-to-serving")


def limit(profile: Profile) -> tuple[float, str]:
    """``(seconds, where from)``: ``limits.ready_to_serving_max_s`` (set, or its default)."""
    lim = profile.limits
    where = "limits.ready_to_serving_max_s" + ("" if "ready_to_serving_max_s" in lim.model_fields_set else " default")
    return lim.ready_to_serving_max_s, where


def selects_case(items: list[pytest.Item]) -> bool:
    """Whether the collected ``items`` hold the health/ready-to-serving case."""
    for item in items:
        m = item.get_closest_marker("gate")
        if m is not None and m.args and m.args[0] == CASE[0] and CASE[1] in (m.kwargs.get("cases") or ()):
            return True
    return False


def first_look(st: Run) -> Readiness | None:
    """Time ready -> serving on a given endpoint (``--endpoint``/``--isvc``; not a launched one) from
    now, bounded by :func:`kvgate.http.readiness.watch_bound_s`; stored in ``st.extra`` and
    returned. None (nothing sent) when the run has no given endpoint or already looked."""
    if st.endpoint is None or st.endpoint.managed or READINESS_KEY in st.extra:
        return st.extra.get(READINESS_KEY)
    bound = watch_bound_s(st.profile.limits.ready_to_serving_max_s)
    with st.record.phase("first look (health/ready-to-serving)"):
        with KvClient(st.endpoint, timeout_s=bound) as client:
            st.extra[READINESS_KEY] = watch_client(client, st.profile.model.served_name,
                                                   where="kvgate's first look (--endpoint)", launched=False,
                                                   bound_s=bound)
    return st.extra[READINESS_KEY]


def observed(config: pytest.Config) -> tuple[Readiness | None, str]:
    """``(readiness, why none)``: the launcher's start-up timing, else the ``--endpoint`` first look's,
    else None and the reason in words."""
    st: Run = config.stash[RUN]
    server = st.extra.get(SERVER_KEY)
    if server is not None:
        got = getattr(server, "readiness", None)
        return got, "" if got is not None else f"the {getattr(server, 'mode', '?')} launcher does not time it"
    if READINESS_KEY in st.extra:
        return st.extra[READINESS_KEY], ""
    return None, "no readiness look was taken in this run (a given endpoint is looked at once collection ends)"


def isvc_probe(config: pytest.Config) -> Any:
    """``--isvc``: the gated object's readiness probe (:class:`kvgate.launch.kserve.ReadinessProbe`), or None."""
    obj = config.stash.get(ISVC_OBJECT, None)
    if obj is None:
        return None
    from kvgate.launch.kserve import readiness_probe

    return readiness_probe(obj)


__all__ = ["CASE", "READINESS_KEY", "first_look", "isvc_probe", "limit", "observed", "selects_case"]
