"""The response-length sampler's adjustment to the workload's mean (tuner.lengths._spread)."""

from __future__ import annotations

import random
import time

import pytest

from tuner.lengths import _spread, draw_response_lengths


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
