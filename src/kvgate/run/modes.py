"""Gate modes and exit codes: what a run's verdicts mean for the process that started it.

- ``enforce`` (default): a FAIL fails the run; an INVALID measurement fails it with its own exit
  code; SKIPs are allowed (the profile does not ask, the server cannot show it).
- ``record`` (calibration): every gate runs and none fails the run; the measured values are
  written as a *profile overlay* (``profile-overlay.yaml`` in the reports dir, ``extends:`` the
  run's profile) that a person reviews and commits (:func:`overlay`).
- ``certify`` (sign-off): only a run in which every selected gate and every sub-check was made
  and passed is ``CERTIFIED``; any SKIP, skipped sub-check, INVALID or INCONCLUSIVE (counted as
  INVALID: an undecided percentile certifies nothing) makes it ``NOT-CERTIFIED``
  and :func:`kvgate.report.outcome.decide` lists which (``summary.json`` ``not_certified``).

Exit codes and the outcome a run ends in: :mod:`kvgate.report.outcome` (:data:`~kvgate.report.outcome.EXIT_CODES`).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Iterable

import yaml

from kvgate.report.outputs import OVERLAY as OVERLAY_FILE

MODES = ("enforce", "record", "certify")
DEFAULT_MODE = "enforce"

class ModeError(ValueError):
    """``--gate-mode`` names no known mode. One line listing the valid values."""


def parse_mode(value: str | None) -> str:
    """``--gate-mode`` value -> one of :data:`MODES` (None -> ``enforce``). Raises :class:`ModeError`."""
    if value is None:
        return DEFAULT_MODE
    mode = value.strip().lower()
    if mode not in MODES:
        raise ModeError(f"--gate-mode {value!r}: not a gate mode; valid values: {', '.join(MODES)}")
    return mode


# ------------------------------------------------------------------------------------------
# record mode: the profile overlay

#: check name (a verdict's ``gate`` or a sub-check's) -> (profile field, unit the measured value
#: must have). The limit each check is judged against, so the overlay is what this server did.
#: Prefix matches end in ``/`` (``streaming/ttft/`` covers completions and chat).
RECORDABLE: tuple[tuple[str, str, str], ...] = (
    ("latency/slo.TTFT p95", "slo.ttft_p95_ms", "ms"),
    ("latency/slo.ITL p95", "slo.itl_p95_ms", "ms"),
    ("latency/slo.e2e p95", "slo.e2e_p95_ms", "ms"),
    ("latency/slo.error rate", "slo.error_rate_max", "ratio"),
    ("latency/interference", "slo.short_ttft_p95_ms", "ms"),
    ("streaming/ttft/", "slo.ttft_p95_ms", "ms"),
    ("streaming/idle-gap/", "limits.stream_idle_timeout_s", "s"),
    ("concurrency/long-sequences.preemptions", "limits.preemptions_allowed", "preemptions"),
    ("soak/memory", "soak.memory_slope_max_mb_per_h", "MB/h"),
    ("soak/latency", "soak.ttft_p95_slope_max_ms_per_h", "ms/h"),
    # the largest peak the measured knee carries at capacity.margin (floor(knee / margin)), so the
    # overlay passes on the server it was recorded on; the knee itself is in the comment's source
    ("capacity/knee.supported peak", "slo.peak_concurrency", "requests"),
)
#: Fields that must be >= 0 (a negative slope is written as 0, said in a comment).
_NON_NEGATIVE = ("soak.", "limits.preemptions_allowed", "slo.error_rate_max")
_INTEGER = ("limits.preemptions_allowed", "slo.peak_concurrency")
#: Headroom a proposed limit gets over what was measured (x 1.25, then rounded up to two significant
#: digits): a limit at the measured value fails the same server on the next run's noise. The latency
#: fields already record the percentile's upper confidence bound; the headroom is for run-to-run
#: drift the bound does not cover (another host, another hour). A starting point for the review,
#: not a measured constant.
#: ``slo.peak_concurrency`` gets none: floor(knee / capacity.margin) carries its margin already.
HEADROOM = 1.25
_NO_HEADROOM = ("slo.peak_concurrency",)
#: Fields a run measures but must not set: what was measured is a sample, the limit is a choice
#: the measurement cannot make. Written as comments beside the proposal, never as values
#: (record mode once set ``limits.stream_idle_timeout_s: 0.0082`` -- the longest gap seen, 8 ms,
#: which would cut every normal stream -- and ``soak.memory_slope_max_mb_per_h: 0.316``).
MEASURED_ONLY = {
    "limits.stream_idle_timeout_s": "your gateway's idle timeout (nginx proxy_read_timeout, Envoy stream_idle_timeout, "
                                    "KServe's route timeout), read from its config; the gate checks streams stay "
                                    "below it",
    "soak.memory_slope_max_mb_per_h": "a leak ceiling is a choice: the growth your pods' memory limit tolerates over "
                                      "their lifetime; a soak's slope near 0 is noise, not a ceiling",
    "soak.ttft_p95_slope_max_ms_per_h": "a drift ceiling is a choice: the TTFT growth per hour you accept; a soak's "
                                        "slope near 0 is noise, not a ceiling",
}


def propose(path: str, value: float) -> float | int:
    """The limit record mode proposes for ``path`` from the ``value`` measured: ``value`` x
    :data:`HEADROOM` rounded up to two significant digits (``812.3 ms`` -> ``1,100``; ``0.0123``
    -> ``0.016``), an integer field rounded up to a whole number; ``value`` itself for
    :data:`_NO_HEADROOM` fields; 0 stays 0 (a server that erred on nothing is held to nothing)."""
    import math

    v = value if path in _NO_HEADROOM else value * HEADROOM
    if v > 0 and path not in _NO_HEADROOM:
        step = 10 ** (math.floor(math.log10(v)) - 1)
        v = math.ceil(round(v / step, 9)) * step
        v = round(v, max(0, -math.floor(math.log10(step))))
    return int(math.ceil(v)) if path in _INTEGER else v


def _field_for(check: str) -> tuple[str, str] | None:
    for name, field_path, unit in RECORDABLE:
        if check == name or (name.endswith("/") and check.startswith(name)):
            return field_path, unit
    return None


def _walk(v: Any) -> Iterable[Any]:
    yield v
    for p in getattr(v, "parts", ()):
        yield from _walk(p)


def recorded_values(verdicts: Iterable[tuple[str, Any]]) -> tuple[dict[str, tuple[float, list[str]]], list[str]]:
    """From ``(test_id, Verdict)`` pairs: ``({field: (value, [checks it came from])}, [unmapped
    lines])``. A field judged by several checks gets the largest measured value (the limit every
    one of them would have passed). A percentile judged with confidence (:mod:`kvgate.stats.confidence`:
    its evidence carries the bound) records its upper bound -- a limit at the point estimate would
    leave the same server INCONCLUSIVE -- or, without one (too few samples), the point, saying so. Values with the wrong unit or none are not mapped; numeric
    measurements with no profile field are listed as ``"test_id: check = value unit"``."""
    fields: dict[str, tuple[float, list[str]]] = {}
    unmapped: list[str] = []
    for test_id, verdict in verdicts:
        for v in _walk(verdict):
            value, how = v.measured, ""
            ev = v.evidence if isinstance(v.evidence, dict) else {}
            if isinstance(ev.get("confidence"), dict) and "method" in ev["confidence"]:
                ev = ev["confidence"]  # latency/interference: the bound of the one percentile it judges
            if str(ev.get("method", "")).startswith("order statistics"):  # a percentile judged with confidence
                if ev.get("upper") is not None:  # the limit this server meets with confidence at this n
                    value, how = ev["upper"], f" ({ev['confidence'] * 100:.4g}% upper bound, n={ev['n']})"
                else:
                    how = f" (point estimate: n={ev['n']} has no upper bound; a limit this tight stays INCONCLUSIVE)"
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                continue
            target = _field_for(v.gate)
            if target is None or (v.unit or "") != target[1]:
                if v is verdict and not v.parts:
                    unmapped.append(f"{test_id}: {v.gate} = {value:g} {v.unit or ''}".rstrip())
                continue
            path, _ = target
            old = fields.get(path)
            if old is None or value > old[0]:
                fields[path] = (float(value), (old[1] if old else []) + [f"{test_id}: {v.gate}{how}"])
            else:
                old[1].append(f"{test_id}: {v.gate}{how}")
    return fields, unmapped


def recorded_accuracy(verdicts: Iterable[tuple[str, Any]]) -> tuple[int, int, str] | None:
    """``(right, items, how)`` of the run's ``answers/accuracy`` verdict -- the reference the next
    run's accuracy is held to (``answers.accuracy.recorded_correct`` / ``recorded_items``) -- with
    ``how`` naming the task, the accuracy, its interval and the test; None when the case did not
    score its task (not declared, unreadable) or scored it INVALID (most items unanswered: the
    transport was measured, not the model)."""
    for test_id, verdict in verdicts:
        for v in _walk(verdict):
            ev = v.evidence if isinstance(v.evidence, dict) else {}
            k, n = ev.get("correct"), ev.get("items")
            if v.gate != "answers/accuracy" or v.status.value == "INVALID" or not isinstance(k, int) or \
                    not isinstance(n, int) or n <= 0:
                continue
            lo, hi = (ev.get("interval") or [None, None])[:2]
            ci = f", {ev.get('confidence', 0.95):.0%} CI {lo:.1%}..{hi:.1%}" if lo is not None and hi is not None else ""
            return k, n, f"measured {k} of {n} right on {ev.get('task')} ({k / n:.1%}{ci}); from {test_id}"
    return None


def overlay(profile_ref: str, verdicts: Iterable[tuple[str, Any]], *, run_id: str, endpoint: str | None,
            server_version: str | None, now: _dt.datetime | None = None) -> str:
    """The record-mode profile overlay as YAML text: ``extends: profile_ref`` plus every
    recordable field (:data:`RECORDABLE`) set to a limit *proposed* from what this run measured
    (:func:`propose`: :data:`HEADROOM` over it), each with a comment naming the measured value and
    the checks it came from; fields a measurement cannot set (:data:`MEASURED_ONLY`: a gateway's
    idle timeout, soak ceilings) and measured values no profile field holds as comments; and the
    answers gate's accuracy as the reference a later run is held to (:func:`recorded_accuracy`:
    ``answers.accuracy.recorded_correct`` / ``recorded_items``, the count itself, no headroom:
    the tolerance is the profile's). Loading it with :func:`kvgate.profile.models.load_profile`
    gives the run's profile with those limits; a person reviews before committing."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    verdicts = list(verdicts)
    fields, unmapped = recorded_values(verdicts)
    accuracy = recorded_accuracy(verdicts)
    tree: dict[str, dict[str, Any]] = {}
    notes: dict[str, str] = {}
    measured_only: list[str] = []
    for path, (value, sources) in sorted(fields.items()):
        section, key = path.split(".", 1)
        if path in MEASURED_ONLY:
            measured_only.append(f"#   {path}: measured {value:.4g} ({', '.join(sources)}) -- not proposed: "
                                 f"{MEASURED_ONLY[path]}")
            continue
        note = ""
        if path.startswith(_NON_NEGATIVE) and value < 0:
            note, value = f"measured {value:g}, negative: written as 0; ", 0.0
        shown = propose(path, value)
        if not path.startswith(_NON_NEGATIVE) and shown <= 0:
            continue  # a limit must be > 0; nothing to record
        tree.setdefault(section, {})[key] = shown
        how = "" if path in _NO_HEADROOM or not value else f" + {HEADROOM - 1:.0%} headroom"
        notes[path] = note or f"measured {value:.4g}{how}; "
        notes[path] += "from " + ", ".join(sources)
    lines = [
        f"# kvgate record mode: limits proposed from run {run_id} ({now:%Y-%m-%d %H:%M} UTC)",
        f"# on {endpoint or 'no endpoint'} (server {server_version or 'version unknown'}).",
        f"# Each limit is what this server did plus {HEADROOM - 1:.0%} headroom (its comment says what was measured):",
        "# review, then commit (e.g. as profiles/NAME-calibrated.yaml) or copy the values into the profile.",
        f"extends: {profile_ref}",
    ]
    for section, values in tree.items():
        lines.append(f"{section}:")
        for key, value in values.items():
            dumped = yaml.safe_dump({key: value}, default_flow_style=True).strip().strip("{}")
            lines.append(f"  {dumped}  # {notes[f'{section}.{key}']}")
    if accuracy is not None:
        k, n, how = accuracy
        lines += ["answers:", "  accuracy:", f"    recorded_correct: {k}  # {how}", f"    recorded_items: {n}"]
    if not tree and accuracy is None:
        lines.append("# no recordable value was measured (no latency, streaming, load, soak or answers gate ran)")
    if measured_only:
        lines.append("# measured, but a limit the measurement cannot set (set it yourself):")
        lines += measured_only
    if unmapped:
        lines.append("# measured, with no profile field to hold it:")
        lines += [f"#   {u}" for u in unmapped]
    return "\n".join(lines) + "\n"
