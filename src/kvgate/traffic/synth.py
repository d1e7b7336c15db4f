"""A synthetic traffic sample shaped like a support chat (``kvgate traffic synth``), seeded.

:func:`synth` draws, with ``numpy.random.default_rng(seed)``:

* ``sessions`` conversations of ``turns`` (uniform) turns, starting as a Poisson process over the
  first ``session_window`` share of ``duration_s``. Every session opens with the one shared system
  prompt (``prefix_id``, ``prefix_tokens``: counted inside ``prompt_tokens``). Turn 0's prompt is
  ``first_prompt`` tokens (uniform); turn n+1's is turn n's prompt + turn n's output + new user
  tokens (``user_tokens``, uniform): the history grows exactly by what was said. A turn arrives
  ``think_s`` (uniform) after the previous reply would have finished on the tiny-cpu server
  (``prefill_s`` + output x ``per_token_s``). A session ends early when its next turn would not
  fit ``max_total`` (prompt + output).
* ``singles`` single-turn requests, a Poisson process over ``duration_s``: a ``shared_single``
  share with the system prompt (prompts ``first_prompt``), ``long_singles`` long documents
  (prompts ``long_prompt``, no prefix), the rest short questions without it (``short_prompt``).
* outputs ``output`` tokens (uniform) everywhere.

The defaults make ``profiles/traffic/tiny-chat.jsonl``, sized for the embedded tiny-cpu server
(max_model_len 2,048, max_num_seqs 8, ~10-20 ms per output token on 2 CPU cores, a 1,900-token
prefill ~0.3-0.5 s: measured on the embedded vLLM of ``profiles/tiny-cpu.yaml``): ~300 requests over
~150 s (~2 requests/s), every request's prompt + output at most 1,500 tokens.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SynthSpec:
    """What :func:`synth` draws (see the module docstring); ranges are inclusive ``(low, high)``.
    Tokens unless named ``_s`` (seconds)."""

    seed: int = 0
    sessions: int = 50
    turns: tuple[int, int] = (2, 5)
    singles: int = 125
    duration_s: float = 150.0
    session_window: float = 0.85
    prefix_id: str = "sys-support"
    prefix_tokens: int = 256
    first_prompt: tuple[int, int] = (300, 700)
    user_tokens: tuple[int, int] = (8, 120)
    output: tuple[int, int] = (16, 96)
    think_s: tuple[float, float] = (1.0, 4.0)
    prefill_s: float = 0.4
    per_token_s: float = 0.015
    shared_single: float = 0.4
    long_singles: int = 8
    long_prompt: tuple[int, int] = (1000, 1400)
    short_prompt: tuple[int, int] = (32, 400)
    max_total: int = 1500

    def __post_init__(self) -> None:
        lo, hi = self.first_prompt
        if not 0 < self.prefix_tokens < lo <= hi or hi + self.output[1] > self.max_total:
            raise ValueError(f"first_prompt {self.first_prompt} must be above prefix_tokens {self.prefix_tokens} and "
                             f"leave room for output {self.output[1]} within max_total {self.max_total}")
        if self.long_prompt[1] + self.output[1] > self.max_total:
            raise ValueError(f"long_prompt {self.long_prompt} + output {self.output[1]} exceeds max_total {self.max_total}")
        if self.turns[0] < 1 or self.turns[0] > self.turns[1]:
            raise ValueError(f"turns {self.turns} must be 1 <= low <= high")
        if not 0 <= self.long_singles <= self.singles:
            raise ValueError(f"long_singles {self.long_singles} must be from 0 to singles {self.singles} (the long "
                             "documents are some of the single-turn requests)")
        if self.seed < 0:
            raise ValueError(f"seed {self.seed} must be a non-negative integer")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"duration {self.duration_s} must be a finite number of seconds > 0")


def _uniform(rng: np.random.Generator, pair: tuple[int, int]) -> int:
    return int(rng.integers(pair[0], pair[1] + 1))


def _poisson(rng: np.random.Generator, n: int, span_s: float) -> np.ndarray:
    """``n`` arrival times of a Poisson process (exponential gaps, mean ``span_s / n``)."""
    return np.cumsum(rng.exponential(span_s / max(n, 1), n)) if n else np.zeros(0)


def synth(spec: SynthSpec = SynthSpec()) -> list[dict[str, Any]]:
    """The sample's rows (dicts in the JSONL sample format), sorted by ``arrival_s`` (seconds,
    rounded to 1 ms). Deterministic for a given ``spec``."""
    rng = np.random.default_rng(spec.seed)
    rows: list[dict[str, Any]] = []
    width = len(str(max(spec.sessions - 1, 0)))
    for i, start in enumerate(_poisson(rng, spec.sessions, spec.duration_s * spec.session_window)):
        n_turns = _uniform(rng, spec.turns)
        prompt, t = _uniform(rng, spec.first_prompt), float(start)
        for turn in range(n_turns):
            out = _uniform(rng, spec.output)
            if prompt + out > spec.max_total:
                break
            rows.append({"prompt_tokens": prompt, "output_tokens": out, "arrival_s": round(t, 3),
                         "session": f"s{i:0{width}d}", "turn": turn, "prefix_id": spec.prefix_id,
                         "prefix_tokens": spec.prefix_tokens})
            t += spec.prefill_s + out * spec.per_token_s + float(rng.uniform(*spec.think_s))
            prompt += out + _uniform(rng, spec.user_tokens)
    kinds = ["long"] * spec.long_singles + ["shared"] * round((spec.singles - spec.long_singles) * spec.shared_single)
    kinds += ["short"] * (spec.singles - len(kinds))
    for kind, t in zip(rng.permutation(kinds), _poisson(rng, spec.singles, spec.duration_s)):
        row: dict[str, Any] = {"prompt_tokens": _uniform(rng, {"long": spec.long_prompt, "shared": spec.first_prompt,
                                                              "short": spec.short_prompt}[kind]),
                               "output_tokens": _uniform(rng, spec.output), "arrival_s": round(float(t), 3)}
        if kind == "shared":
            row |= {"prefix_id": spec.prefix_id, "prefix_tokens": spec.prefix_tokens}
        rows.append(row)
    rows.sort(key=lambda r: (r["arrival_s"], r.get("session") or "", r.get("turn") or 0))
    return rows


def jsonl_text(rows: list[dict[str, Any]]) -> str:
    """The rows as JSON lines (keys in a fixed order, compact): byte-identical for the same rows."""
    return "".join(json.dumps(r, separators=(", ", ": ")) + "\n" for r in rows)


def write(spec: SynthSpec, path: str | Path) -> Path:
    """Write :func:`synth` ``(spec)`` to ``path`` as JSONL; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jsonl_text(synth(spec)), encoding="utf-8")
    return path


def spec_fields() -> dict[str, Any]:
    """The defaults of :class:`SynthSpec` (name -> value), for the command line and the README."""
    return asdict(SynthSpec())
