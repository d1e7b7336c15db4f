"""Prometheus ``/metrics`` parsing (``prometheus_client``'s parser) and vLLM metric names.

vLLM renamed metrics across versions (shared/VLLM_FACTS.md): ``vllm:gpu_cache_usage_perc`` became
``vllm:kv_cache_usage_perc`` by 0.20. :data:`ALIASES` lists the names to try, newest first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

#: logical name -> metric names across vLLM versions, newest first
ALIASES: dict[str, tuple[str, ...]] = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "cache_config": ("vllm:cache_config_info",),
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


def cache_config(scrape: Scrape) -> dict[str, str] | None:
    """Labels of ``vllm:cache_config_info`` (block_size, gpu_memory_utilization, cache_dtype,
    num_gpu_blocks, kv_cache_memory_bytes, kv_cache_size_tokens, ...), or None if absent."""
    hit = scrape.first("cache_config")
    return dict(hit[0]) if hit else None
