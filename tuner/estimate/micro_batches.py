"""How one DP rank's batch splits into micro-batches: the one model the memory model and the time
model both read (`micro_batches`).

verl's Megatron actor (`rearrange_micro_batches`, verl/utils/seqlen_balancing.py; the rules are
tuner.batching's) cuts each DP rank's share of a mini-batch (the update), or of the whole batch
(a log-prob pass), into micro-batches: with dynamic batching ceil(tokens / (budget · cp)) of
them, balanced by tokens; without it pieces of micro_batch_size_per_gpu samples; under
interleaved pipelining the count rounded up to a multiple of pp (`micro_batch_count`). Each pass
then runs `count` micro-batches of `mean_tokens` each (what the time model charges) and the
largest holds `peak_micro_tokens` (what the memory model must hold; the update's count also sets
the micro-batches a pipeline keeps in flight). The count and mean are one memoized term and the
largest another, so the time model, which reads only the first, never plans a batch (planning is
most of a cold call: the cost model's exact search scores thousands of candidates by time
alone, tuner/study/exact.py).

The largest micro-batch: with dynamic batching, planned on the megatron runner's own sample
lengths where that is cheap (tuner.batching.plan_step), else the count rule applied to the
largest share a rank is expected to see (`_analytic_peak_tokens`); with fixed batching, the
micro-batch size at the step's longest sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.batching import DEFAULT_MINI_BATCHES, plan_step
from tuner.estimate.context import Context
from tuner.estimate.memo import memoized
from tuner.lengths import step_lengths
from tuner.space import Candidate

BATCH_PLAN_SEED = 0
"""Seed of the sample lengths the largest micro-batch is planned on: the megatron runner's
default (`tuner.runners.megatron.worker_spec(seed=0)`), so the plan is the one it measures."""
BATCH_PLAN_MAX_SAMPLES = 4096
"""Above this many samples in the planned mini-batches the plan is not simulated (pure-Python
partitioning; a cost model call must stay cheap) and the analytic estimate stands."""


@dataclass(frozen=True, slots=True)
class MicroBatches:
    """One pass's micro-batches on one DP rank (the update: per mini-batch)."""

    count: int
    """Micro-batches of the rank's share (`micro_batch_count` of its mean share)."""
    mean_tokens: float
    """Tokens per GPU of a micro-batch: the rank's mean share over `count` and cp."""


def micro_batch_count(
    candidate: Candidate, log_prob: bool, share_tokens: float, share_samples: float, multiple: int
) -> int:
    """Micro-batches verl cuts a rank's share of `share_tokens` tokens (dynamic batching: over
    the token budget times cp) or of `share_samples` samples (fixed: over the micro-batch size)
    into: at least one, rounded up to a multiple of `multiple` (pp under interleaving)."""
    cp = candidate.layout.cp
    if candidate.use_dynamic_bsz:
        budget = (
            candidate.log_prob_max_token_len_per_gpu
            if log_prob
            else candidate.ppo_max_token_len_per_gpu
        )
        count = math.ceil(share_tokens / (max(1, budget) * cp))
    else:
        micro_batch_size = (
            candidate.log_prob_micro_batch_size_per_gpu
            if log_prob
            else candidate.ppo_micro_batch_size_per_gpu
        )
        count = math.ceil(share_samples / max(1, micro_batch_size))
    count = max(1, count)
    if count % multiple:
        count += multiple - count % multiple
    return count


def micro_batches(ctx: Context, candidate: Candidate, log_prob: bool) -> MicroBatches:
    """The micro-batches of the update (per mini-batch) or of a log-prob pass, on one DP rank
    (their largest: `peak_micro_tokens`).

    The share is the rank's mean: the step's tokens over the DP ranks (and the mini-batches in
    the update). In the update verl balances each mini-batch's samples over the ranks by
    tokens; what is left is the granularity of one sample, and the slowest rank sets the pace,
    so its share is one mean sample more. verl 0.9.1 rounds every batch's count, forward-only
    ones too, to a multiple of microbatch_group_size_per_vp_stage (the pp size) under virtual
    pipelining (workers/engine/megatron/transformer_impl.py forward_backward_batch). Memoized
    in the context by the fields it reads (memo.memoized): the memory and the time model each
    ask."""
    return memoized(
        ctx.layout_cache,
        ("micro_batches", log_prob),
        candidate,
        lambda reading: _micro_batches(ctx, reading, log_prob),
    )


def _micro_batches(ctx: Context, candidate: Candidate, log_prob: bool) -> MicroBatches:
    layout = candidate.layout
    dp = layout.dp
    if log_prob:
        tokens = ctx.tokens_step / dp
        samples = ctx.samples / dp
    else:
        tokens = ctx.tokens_step / (dp * ctx.minis)
        samples = ctx.samples / (dp * ctx.minis)
        if dp > 1:
            tokens += ctx.seq_mean
    count = micro_batch_count(
        candidate, log_prob, tokens, samples, layout.pp if layout.vpp > 1 else 1
    )
    return MicroBatches(count=count, mean_tokens=tokens / (count * layout.cp))


def peak_micro_tokens(ctx: Context, candidate: Candidate, log_prob: bool) -> float:
    """Tokens per GPU of the largest micro-batch a step is expected to see (the update's per
    mini-batch, or a log-prob pass's), memoized in the context by the fields it reads
    (memo.memoized), apart from `micro_batches`: only the memory model asks.

    With dynamic batching, the micro-batches of the sample lengths the megatron runner draws
    (`tuner.lengths.step_lengths`, seed BATCH_PLAN_SEED, the mini-batches it runs),
    placed by `tuner.batching.plan_step` as verl does: the budget sets the count of
    micro-batches, not a cap, and verl's workload-balanced partition (24576 s + s^2 per
    sample) puts more than the budget in some. Measured: budget 9216 gave 11508-token
    micro-batches on Qwen2.5-7B 8k (results/dense8k-h200-x2.csv, extra
    `update_actor_max_micro_batch_tokens`), and the model that capped them at the budget
    under-predicted the tp2 no-recompute rows by 18% (86.5 against 109.4 GiB allocated).
    Where the plan cannot be made, `_analytic_peak_tokens`.

    Unlike the count (`micro_batches`), the largest micro-batch of a log-prob pass is found
    without rounding the count to a multiple of pp under virtual pipelining, in the plan as in
    the analytic estimate: fewer, so larger, micro-batches than verl 0.9.1 cuts there (kept:
    the memory model's numbers are fitted with it)."""
    return memoized(
        ctx.layout_cache,
        ("peak_micro_tokens", log_prob),
        candidate,
        lambda candidate: _peak(ctx, candidate, log_prob),
    )


def _peak(ctx: Context, candidate: Candidate, log_prob: bool) -> float:
    if candidate.use_dynamic_bsz:
        planned = _planned_peak_tokens(ctx, candidate, log_prob)
        if planned is not None:
            return planned
    return _analytic_peak_tokens(ctx, candidate, log_prob)


def _peak_multiple(candidate: Candidate, log_prob: bool) -> int:
    """What the largest micro-batch's count is rounded to: pp in an interleaved update."""
    layout = candidate.layout
    return layout.pp if (layout.vpp > 1 and not log_prob) else 1


_PLANS: dict[tuple[object, ...], float | None] = {}
"""Largest planned micro-batch by (workload, log_prob, dp, cp, multiple, budget)."""
_PLAN_LENGTHS: dict[tuple[object, ...], list[int]] = {}
"""The runner's drawn step lengths by (workload, mini-batches run)."""


def _planned_peak_tokens(ctx: Context, candidate: Candidate, log_prob: bool) -> float | None:
    """Largest micro-batch of the runner's batch plan, tokens per GPU (None: no plan)."""
    layout = candidate.layout
    budget = (
        candidate.log_prob_max_token_len_per_gpu
        if log_prob
        else candidate.ppo_max_token_len_per_gpu
    )
    if log_prob and not budget:
        budget = candidate.ppo_max_token_len_per_gpu
    multiple = _peak_multiple(candidate, log_prob)
    # The plan depends on the workload, the layout's dp/cp and the budget only: cached per
    # process, not per context, so calibration (a new Profile, so a new context, per step)
    # does not rebuild it.
    key = (ctx.workload, log_prob, layout.dp, layout.cp, multiple, budget)
    if key in _PLANS:
        return _PLANS[key]
    workload = ctx.workload
    run = min(DEFAULT_MINI_BATCHES, max(1, workload.mini_batches_per_step))
    out: float | None = None
    if budget > 0 and run * workload.mini_batch_size * workload.n <= BATCH_PLAN_MAX_SAMPLES:
        try:
            lengths_key = (workload, run)
            if lengths_key not in _PLAN_LENGTHS:
                _PLAN_LENGTHS[lengths_key] = step_lengths(
                    workload, run * workload.mini_batch_size, BATCH_PLAN_SEED
                )
            lengths = _PLAN_LENGTHS[lengths_key]
            plan = plan_step(
                lengths,
                dp=layout.dp,
                mini_batch_size=len(lengths) if log_prob else workload.mini_batch_size * workload.n,
                use_dynamic_bsz=True,
                max_token_len_per_gpu=budget,
                cp=layout.cp,
                micro_batch_multiple=multiple,
            )
            out = plan.max_micro_tokens() / layout.cp
        except ValueError:
            out = None
    _PLANS[key] = out
    return out


def _analytic_peak_tokens(ctx: Context, candidate: Candidate, log_prob: bool) -> float:
    """Tokens per GPU of the largest micro-batch a step is expected to see, from the length
    distribution's moments alone.

    Without dynamic batching: the samples per micro-batch at the step's longest sample. With it,
    the rank's largest share cut by `micro_batch_count`, so a micro-batch holds the share over
    that count, plus about one sample of imbalance: never more than the budget, and less where
    the share is smaller than the budget (the rows with a large budget were over-predicted when
    the model took the budget itself; results/README.md). The share is the largest of the
    step's mini-batches on any rank: mean + z sd over the samples, z for the maximum of that
    many draws (at least 1), and one mean sample more for the balancing over DP ranks (in a
    log-prob pass too, where `micro_batches`' mean share has none)."""
    layout = candidate.layout
    if not candidate.use_dynamic_bsz:
        micro_batch_size = (
            candidate.log_prob_micro_batch_size_per_gpu
            if log_prob
            else candidate.ppo_micro_batch_size_per_gpu
        )
        return micro_batch_size * ctx.longest_sample / layout.cp
    budget = max(
        1,
        candidate.log_prob_max_token_len_per_gpu
        if log_prob
        else candidate.ppo_max_token_len_per_gpu,
    )
    cap = float(max(budget, math.ceil(ctx.workload.max_seq_len / layout.cp)))
    groups = 1 if log_prob else max(1, ctx.minis)
    samples = ctx.samples / (layout.dp * groups)
    draws = groups * layout.dp
    z = max(1.0, math.sqrt(2 * math.log(draws)) if draws > 1 else 0.0)
    share = samples * ctx.seq_mean + z * math.sqrt(samples) * ctx.seq_sd
    if layout.dp > 1:
        share += ctx.seq_mean  # balancing over DP ranks leaves about one sample of difference
    count = micro_batch_count(
        candidate, log_prob, share, samples, _peak_multiple(candidate, log_prob)
    )
    per = share / (count * layout.cp)
    if count > 1:
        per += ctx.seq_mean / layout.cp
    return min(cap, max(per, ctx.longest_sample / layout.cp))
