"""Timing-accurate load against an OpenAI-compatible endpoint: closed loop and open loop.

Closed loop (``concurrency`` workers back to back) and open loop (Poisson or explicit arrivals,
whatever the server does), both bounded in request count and total time; every request becomes a
:class:`RequestRecord` whose times are seconds since the run started on a monotonic clock, taken
on arrival with no JSON or SSE parsing on the hot path and decoded after the run. A run whose
client fell behind its schedule is INVALID (:meth:`LoadResult.invalid_verdict`).

Modules (each docstring holds the details):

- :mod:`~kvgate.load.record`: :class:`RequestSpec` and its builders (what is sent),
  :class:`RequestRecord` (what happened, decoded by :mod:`kvgate.http.sse`), :func:`split_sse`.
- :mod:`~kvgate.load.schedule`: :func:`run_closed_loop` / :func:`run_open_loop` and their sync
  forms, :func:`poisson_offsets`, schedule lag, :class:`LoadResult`, :func:`make_transport`.
- :mod:`~kvgate.load.sessions`: :func:`run_sessions` / :func:`sessions_loop`, conversations whose
  later turns wait for the earlier replies (:class:`SessionPlan`), and what lag means for them.
- :mod:`~kvgate.load.transport`: the :class:`LoadTransport` interface.
- :mod:`~kvgate.load.raw_http`: :class:`RawHttpTransport`, the hand-written HTTP/1.1 client for
  ``http://``, and :func:`new_event_loop` (timestamps taken when the poll returns).
- :mod:`~kvgate.load.httpx_fallback`: :class:`HttpxTransport` for ``https://`` (coarser timing).
"""

from __future__ import annotations

from kvgate.load.httpx_fallback import HttpxTransport
from kvgate.load.raw_http import _TIMED, RawHttpTransport, new_event_loop
from kvgate.load.record import RequestRecord, RequestSpec, chat_request, completion_request, split_sse
from kvgate.load.schedule import (
    DEFAULT_LAG_BOUND_S,
    LoadResult,
    Sleep,
    closed_loop,
    frozen_heap,
    make_transport,
    open_loop,
    poisson_offsets,
    run_closed_loop,
    run_open_loop,
)
from kvgate.load.sessions import SessionPlan, SessionRun, TurnTiming, run_sessions, sessions_loop
from kvgate.load.transport import DEFAULT_MAX_RESPONSE_BYTES, Clock, LoadTransport

__all__ = [
    "DEFAULT_LAG_BOUND_S", "DEFAULT_MAX_RESPONSE_BYTES", "Clock", "HttpxTransport", "LoadResult", "LoadTransport",
    "RawHttpTransport", "RequestRecord", "RequestSpec", "Sleep", "chat_request", "closed_loop", "completion_request",
    "frozen_heap",
    "make_transport", "new_event_loop", "open_loop", "poisson_offsets", "run_closed_loop", "run_open_loop",
    "split_sse", "SessionPlan", "SessionRun", "TurnTiming", "run_sessions", "sessions_loop",
]
