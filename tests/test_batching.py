"""Batch forming as verl does it: placement invariants (hypothesis), counts, drawn lengths."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.batching import (
    assign_to_dp_ranks,
    balanced_partitions,
    ceil_div,
    karmarkar_karp,
    plan_step,
    round_up,
    seq_workload,
)
from tuner.lengths import draw_response_lengths, step_lengths
from tuner.workload import PRESETS


@st.composite
def steps(draw: st.DrawFn) -> dict:
    dp = draw(st.sampled_from([1, 2, 3, 4, 8]))
    per_rank = draw(st.integers(1, 12))
    minis = draw(st.integers(1, 3))
    mini = dp * per_rank
    max_len = draw(st.integers(1, 4096))
    lengths = draw(st.lists(st.integers(1, max_len), min_size=mini * minis, max_size=mini * minis))
    return {"lengths": lengths, "dp": dp, "mini": mini}


def _check_placement(plan, lengths, dp, mini) -> None:
    seen: list[int] = []
    for m, ranks in enumerate(plan.micro_batches):
        assert len(ranks) == dp
        counts = {len(r) for r in ranks}
        assert len(counts) == 1, f"mini-batch {m}: micro-batch counts differ across ranks"
        for r in ranks:
            assert sum(len(mb) for mb in r) == mini // dp
            for mb in r:
                assert mb, "empty micro-batch"
                seen.extend(mb)
    assert sorted(seen) == list(range(len(lengths))), "every sample exactly once"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps(), st.integers(1, 3), st.sampled_from([1, 2, 4]), st.booleans())
def test_dynamic_plan_places_every_sample_once_with_equal_counts(case, slack, mult, strict):
    lengths, dp, mini = case["lengths"], case["dp"], case["mini"]
    budget = max(lengths) * slack
    per_rank = mini // dp
    try:
        plan = plan_step(
            lengths,
            dp=dp,
            mini_batch_size=mini,
            use_dynamic_bsz=True,
            max_token_len_per_gpu=budget,
            micro_batch_multiple=mult,
            strict_budget=strict,
        )
    except ValueError as e:
        # Only when the rounded-up count cannot fit in the rank's samples.
        assert "micro-batches" in str(e) and mult > 1 or strict
        return
    _check_placement(plan, lengths, dp, mini)
    for ranks in plan.micro_batches:
        k = len(ranks[0])
        assert k % mult == 0
        assert k <= per_rank
        # verl's count: the largest rank's ceil(tokens / budget), rounded to the multiple.
        want = max(
            min(per_rank, ceil_div(sum(lengths[i] for r in [rk] for mb in r for i in mb), budget))
            for rk in ranks
        )
        if not strict:
            assert k == round_up(want, mult)
        else:
            assert k >= round_up(want, mult)
            for r in ranks:
                for mb in r:
                    assert sum(lengths[i] for i in mb) <= budget
    assert plan.token_budget == budget


@settings(max_examples=100, deadline=None)
@given(steps(), st.integers(1, 6))
def test_fixed_plan_cuts_in_order(case, mbs):
    lengths, dp, mini = case["lengths"], case["dp"], case["mini"]
    plan = plan_step(
        lengths, dp=dp, mini_batch_size=mini, use_dynamic_bsz=False, micro_batch_size_per_gpu=mbs
    )
    _check_placement(plan, lengths, dp, mini)
    for ranks in plan.micro_batches:
        assert len(ranks[0]) == ceil_div(mini // dp, mbs)
        for r in ranks:
            assert all(len(mb) <= mbs for mb in r)


def test_budget_is_multiplied_by_cp():
    lengths = [3000] * 8
    plan = plan_step(
        lengths, dp=1, mini_batch_size=8, use_dynamic_bsz=True, max_token_len_per_gpu=3000, cp=2
    )
    assert plan.token_budget == 6000
    assert plan.micro_batch_counts() == [4]
    assert all(len(mb) == 2 for mb in plan.micro_batches[0][0])


def test_sample_longer_than_budget_is_an_error_that_names_the_knob():
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu"):
        plan_step(
            [10, 5000], dp=1, mini_batch_size=2, use_dynamic_bsz=True, max_token_len_per_gpu=4096
        )


def test_mini_batch_must_split_over_dp():
    with pytest.raises(ValueError, match="data-parallel"):
        plan_step(
            [1] * 6, dp=4, mini_batch_size=6, use_dynamic_bsz=False, micro_batch_size_per_gpu=1
        )


def test_fixed_count_must_be_a_multiple_for_interleaving():
    with pytest.raises(ValueError, match="multiple of 2"):
        plan_step(
            [5] * 3,
            dp=1,
            mini_batch_size=3,
            use_dynamic_bsz=False,
            micro_batch_size_per_gpu=1,
            micro_batch_multiple=2,
        )


def test_count_is_equal_across_ranks_even_when_one_rank_is_heavier():
    # Unbalanced on purpose (balance_batch off): rank 0 gets the long samples.
    lengths = [1000] * 4 + [10] * 4
    plan = plan_step(
        lengths,
        dp=2,
        mini_batch_size=8,
        use_dynamic_bsz=True,
        max_token_len_per_gpu=1000,
        balance_batch=False,
    )
    assert plan.micro_batch_counts() == [4]
    assert [len(r) for r in plan.micro_batches[0]] == [4, 4]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=60), st.integers(1, 8))
def test_partition_is_a_partition(values, k):
    k = min(k, len(values))
    parts = balanced_partitions(values, k, equal_size=False)
    assert len(parts) == k
    assert sorted(i for p in parts for i in p) == list(range(len(values)))
    # Largest differencing: the spread of sums is at most the largest item.
    sums = [sum(values[i] for i in p) for p in parts]
    assert max(sums) - min(sums) <= max(values)


def test_equal_size_partition_and_dp_order():
    values = [seq_workload(s) for s in [100, 200, 300, 400, 500, 600, 700, 800]]
    parts = karmarkar_karp(values, 4, equal_size=True)
    assert all(len(p) == 2 for p in parts)
    ranks = assign_to_dp_ranks([100, 200, 300, 400, 500, 600, 700, 800], 2)
    assert sorted(i for r in ranks for i in r) == list(range(8))
    for r in ranks:
        # Light samples at both ends, heaviest in the middle.
        w = [values[i] for i in r]
        assert w.index(max(w)) not in (0, len(w) - 1)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.integers(1, 20_000), st.floats(0, 1), st.integers(0, 10))
def test_drawn_lengths_have_the_mean_and_stay_in_range(count, max_len, frac, seed):
    """The one response-length model (tuner.lengths) the runner draws a step from."""
    mean = 1 + frac * (max_len - 1)
    out = draw_response_lengths(count, max_len=max_len, mean_len=mean, seed=seed)
    assert len(out) == count
    assert all(1 <= x <= max_len for x in out)
    assert sum(out) == round(count * mean)
    assert out == draw_response_lengths(count, max_len=max_len, mean_len=mean, seed=seed)


def test_step_lengths_are_reproducible_spread_and_share_the_prompt_within_a_group():
    w = PRESETS["dapo-math"].with_overrides(
        prompt_len=512, prompt_mean=100, response_len=1024, response_mean=300, n=4
    )
    out = step_lengths(w, 8, seed=3)
    assert len(out) == 32
    assert all(2 <= x <= 512 + 1024 for x in out)
    assert out == step_lengths(w, 8, seed=3)
    assert out != step_lengths(w, 8, seed=4)
    assert sum(out) == 4 * round(8 * 100) + round(32 * 300)
    assert min(out) < 100 + 100 and max(out) > 100 + 700
