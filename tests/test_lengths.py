"""The response-length model: the sampler's adjustment to the workload's mean
(tuner.lengths._spread) and the moments the cost model integrates."""

from __future__ import annotations

import math
import random
import time

import pytest

from tuner.lengths import ResponseLengths, _spread, draw_response_lengths


def _one_token_per_pass(out: list[int], order: list[int], diff: int, max_len: int) -> None:
    """The loop `_spread` replaced: passes over `order`, one token per length per pass (a
    10^8-token cap made it run for minutes)."""
    while diff:
        step = 1 if diff > 0 else -1
        moved = False
        for i in order:
            if diff == 0:
                break
            if 1 <= out[i] + step <= max_len:
                out[i] += step
                diff -= step
                moved = True
        if not moved:
            break


@pytest.mark.parametrize("seed", range(5))
def test_spread_gives_the_lengths_of_the_pass_loop(seed: int) -> None:
    """Same lengths as before for any lengths, order, cap and difference (so every estimate
    and every measured trial's lengths are unchanged)."""
    rng = random.Random(seed)
    for _ in range(2000):
        n, cap = rng.randint(1, 12), rng.randint(1, 30)
        out = [rng.randint(1, cap) for _ in range(n)]
        order = list(range(n))
        rng.shuffle(order)
        diff = rng.randint(-n * cap, n * cap)
        old, new = out[:], out[:]
        _one_token_per_pass(old, order, diff, cap)
        if diff:
            _spread(new, order, diff, cap)
        assert new == old, (out, order, diff, cap)


def test_a_huge_cap_takes_no_time() -> None:
    """--response-len 100000000 hung in the pass loop."""
    t0 = time.monotonic()
    out = draw_response_lengths(8192, max_len=10**8, mean_len=15e6, seed=1)
    assert time.monotonic() - t0 < 2
    assert sum(out) == round(8192 * 15e6) and max(out) <= 10**8 and min(out) >= 1


MOMENT_CASES = [(4096, 4096, 0.0), (4096, 4096, 0.1), (3000, 4096, 0.05), (2000, 4096, 0.1)]
MOMENT_CASES += [(3300, 20000, 0.0), (1500, 8192, 0.02), (500, 8192, 0.0)]
"""(mean, cap, q): every response at the cap, means near it, and means far below it."""


@pytest.mark.parametrize(("mean", "cap", "q"), MOMENT_CASES)
def test_second_moment_is_the_mixtures_own(mean: float, cap: int, q: float) -> None:
    """E[L^2] against a Monte-Carlo draw of the mixture as defined (q at the cap, else
    min(Exp(θ), cap)) and against ∫ 2x S(x) dx over [0, cap) (midpoint rule). The old formula
    counted the exponential's mass beyond the cap twice: 2·cap² at mean == cap."""
    m = ResponseLengths.of(mean, cap, q)
    rng = random.Random(mean + cap)
    draws = 200_000
    total = 0.0
    for _ in range(draws):
        length = cap if rng.random() < m.clip_fraction else min(rng.expovariate(1 / m.theta), cap)
        total += length * length
    assert m.second_moment() == pytest.approx(total / draws, rel=0.02)
    steps = 100_000
    h = cap / steps
    integral = h * math.fsum(2 * x * m.survival(x) for x in ((i + 0.5) * h for i in range(steps)))
    assert m.second_moment() == pytest.approx(integral, rel=1e-7)
    if mean == cap:
        assert m.second_moment() == pytest.approx(cap * cap, rel=1e-3)
        assert m.mean_residual() == pytest.approx(cap / 2, rel=1e-3)
