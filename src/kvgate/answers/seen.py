"""Every answer a run sees, scanned for degeneration as it goes by: the answers gate's own answers
(strictly: U+FFFD, repetition loops, empty content, token soup) and the load gates' and the soak's
outputs (leniently: those requests generate past EOS with ``ignore_eos``, where a loop or an empty
delta is what a model does, so only U+FFFD and control, surrogate or unassigned characters count).

Bounded: texts are scanned and dropped; only counts and the first :data:`KEEP` findings are kept,
so an hours-long soak costs no memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from kvgate.answers.checks import clip, degeneration, wire_findings

#: Findings kept (the verdict quotes the first few; the count is exact).
KEEP = 40


@dataclass
class Seen:
    """Counts of answers scanned (``strict``, ``lenient``, per source kind), and the findings."""

    max_repeat_fraction: float = 0.5
    strict: int = 0
    lenient: int = 0
    by_source: dict[str, int] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    found: int = 0

    def add(self, source: str, text: str, finish_reason: str | None, *, strict: bool = True) -> None:
        """Scan one answer. ``source``: where it came from (``golden/capital-france``,
        ``latency/slo``); ``strict``: an answer that ended on its own (not ``ignore_eos``)."""
        kind = source.split("/")[0]
        self.by_source[kind] = self.by_source.get(kind, 0) + 1
        if strict:
            self.strict += 1
            found = degeneration(text, finish_reason, max_repeat_fraction=self.max_repeat_fraction)
        else:
            self.lenient += 1
            found = wire_findings(text)
        if found:
            self.found += 1
            if len(self.findings) < KEEP:
                self.findings.append({"source": source, "findings": found, "text": clip(text, 200),
                                      "strict": strict})

    def add_records(self, source: str, records: Iterable[Any]) -> None:
        """Scan the load records' generated texts (:class:`kvgate.load.record.RequestRecord`:
        ``text``, ``finish_reason``; answered ones only), leniently."""
        for r in records:
            if getattr(r, "status", 0) == 200 and getattr(r, "text", ""):
                self.add(source, r.text, getattr(r, "finish_reason", None), strict=False)

    @property
    def checked(self) -> int:
        return self.strict + self.lenient
