"""How often honest sampling repeats itself: the chance that ``n`` independent draws from a
sampler give one particular outcome at least ``k`` times, when that outcome's probability is at
most ``p``.

The security gate's cache case (:func:`kvgate.gates.security.cache_verdict`) asks it of a sampled
(temperature 1, unseeded) chat answer sent again: vLLM draws every answer afresh, so a later
answer byte-identical to the first happens with the first's probability -- ``exp`` of the sum of
its tokens' logprobs, which the server reports. A response cache repeats it every time.

:func:`repeat_chance` is the binomial upper tail ``P(X >= k)``, ``X ~ Binomial(n, p)``: the
p-value of "these repeats are what sampling gives". ``p`` is an upper bound, so the tail is too:
a FAIL taken at ``repeat_chance(...) < alpha`` is wrong at most ``alpha`` of the time
(tests/test_stats_coincidence.py simulates it).
"""

from __future__ import annotations

import math

from scipy import stats as _st


def repeat_chance(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, p)`` (a probability; 1.0 when ``k <= 0``). ``p`` is
    clipped into [0, 1]. Raises ValueError when ``n < 0`` or ``k > n``."""
    if n < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if k <= 0:
        return 1.0
    p = min(1.0, max(0.0, p))
    return float(_st.binom.sf(k - 1, n, p))


def sequence_probability(logprobs: list[float], slack: float = 1.0) -> float:
    """The probability of a sampled sequence from its tokens' logprobs (nats), times ``slack`` (a
    factor >= 1 for what the logprobs leave out: top-k/top-p renormalisation, other tokenisations of
    the same text), capped at 1. No logprobs: 1.0 (nothing bounds it)."""
    if not logprobs:
        return 1.0
    return min(1.0, math.exp(sum(logprobs)) * max(1.0, slack))


__all__ = ["repeat_chance", "sequence_probability"]
