"""kvgate.stats.coincidence: the chance that honest sampling repeats one outcome, and its error
rate simulated (a FAIL at ``repeat_chance < alpha`` on honest draws at most ``alpha`` of the time)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvgate.stats.coincidence import repeat_chance, sequence_probability


def test_the_tail_is_the_binomial_upper_tail():
    assert repeat_chance(0, 2, 0.3) == 1.0
    assert repeat_chance(2, 2, 0.3) == pytest.approx(0.09)
    assert repeat_chance(1, 2, 0.3) == pytest.approx(1 - 0.49)
    assert repeat_chance(2, 2, 1.7) == 1.0  # p clipped
    with pytest.raises(ValueError):
        repeat_chance(3, 2, 0.5)


def test_sequence_probability_is_exp_of_the_sum_with_slack_capped():
    assert sequence_probability([-1.0, -2.0]) == pytest.approx(math.exp(-3))
    assert sequence_probability([-1.0, -2.0], slack=10) == pytest.approx(10 * math.exp(-3))
    assert sequence_probability([-0.01], slack=10) == 1.0
    assert sequence_probability([]) == 1.0  # nothing bounds it: never a FAIL


@pytest.mark.parametrize("p", [0.001, 0.03, 0.3, 0.9])
def test_honest_draws_fail_at_most_alpha_of_the_time(p):
    # 20,000 simulated runs of 2 later draws of an outcome of probability p, judged with its exact p
    rng = np.random.default_rng(48)
    k = rng.binomial(2, p, size=20_000)
    for alpha in (1e-3, 0.05):
        chance = {x: repeat_chance(x, 2, p) for x in range(3)}
        rate = np.mean([chance[int(x)] < alpha for x in k])
        assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / k.size), (p, alpha, rate)


def test_a_replay_is_found_at_once():
    # 12 tokens at -0.9 nats (10x slack): a cache's 2 of 2 repeats have chance ~4e-8
    p = sequence_probability([-0.9] * 12, slack=10)
    assert repeat_chance(2, 2, p) < 1e-7
