"""Tokens per GPU of the largest micro-batch of a step, what the memory model must hold.

With dynamic batching, verl cuts each rank's share into micro-batches balanced by tokens: the
largest is planned on the megatron runner's own sample lengths where that is cheap
(tuner.batching.plan_step), else estimated from the length distribution's moments.
"""

from __future__ import annotations

import math

from tuner.estimate.context import Context
from tuner.space import Candidate
from tuner.workload import Workload


def micro_batch_tokens(c: Candidate, w: Workload, log_prob: bool = False) -> float:
    """Most tokens one GPU holds in one micro-batch (what memory must hold)."""
    if c.use_dynamic_bsz:
        budget = c.log_prob_max_token_len_per_gpu if log_prob else c.ppo_max_token_len_per_gpu
        return float(max(budget, math.ceil(w.max_seq_len / c.layout.cp)))
    mbs = c.log_prob_micro_batch_size_per_gpu if log_prob else c.ppo_micro_batch_size_per_gpu
    return mbs * w.max_seq_len / c.layout.cp


BATCH_PLAN_SEED = 0
"""Seed of the sample lengths the largest micro-batch is planned on: the megatron runner's
default (`tuner.runners.megatron.worker_spec(seed=0)`), so the plan is the one it measures."""
BATCH_PLAN_MAX_SAMPLES = 4096
"""Above this many samples in the planned mini-batches the plan is not simulated (pure-Python
partitioning; a cost model call must stay cheap) and the analytic estimate stands."""


def peak_micro_tokens(ctx: Context, c: Candidate, log_prob: bool) -> float:
    """Tokens per GPU of the largest micro-batch a step is expected to see.

    With dynamic batching, the micro-batches of the sample lengths the megatron runner draws
    (`tuner.lengths.step_lengths`, seed BATCH_PLAN_SEED, the mini-batches it runs),
    placed by `tuner.batching.plan_step` as verl does: the budget sets the count of
    micro-batches, not a cap, and verl's workload-balanced partition (24576 s + s^2 per
    sample) puts more than the budget in some. Measured: budget 9216 gave 11508-token
    micro-batches on Qwen2.5-7B 8k (results/dense8k-h200-x2.csv, extra
    `update_actor_max_micro_batch_tokens`), and the model that capped them at the budget
    under-predicted the tp2 no-recompute rows by 18% (86.5 against 109.4 GiB allocated).
    Where the plan cannot be made, `_analytic_micro_tokens`."""
    if c.use_dynamic_bsz:
        planned = _planned_micro_tokens(ctx, c, log_prob)
        if planned is not None:
            return planned
    return _analytic_micro_tokens(ctx, c, log_prob)


_PLANS: dict[tuple[object, ...], float | None] = {}
"""Largest planned micro-batch by (workload, log_prob, dp, cp, multiple, budget)."""
_PLAN_LENGTHS: dict[tuple[object, ...], list[int]] = {}
"""The runner's drawn step lengths by (workload, mini-batches run)."""


def _planned_micro_tokens(ctx: Context, c: Candidate, log_prob: bool) -> float | None:
    """Largest micro-batch of the runner's batch plan, tokens per GPU (None: no plan)."""
    lay = c.layout
    budget = c.log_prob_max_token_len_per_gpu if log_prob else c.ppo_max_token_len_per_gpu
    if log_prob and not budget:
        budget = c.ppo_max_token_len_per_gpu
    multiple = lay.pp if (lay.vpp > 1 and not log_prob) else 1
    # The plan depends on the workload, the layout's dp/cp and the budget only: cached per
    # process, not per context, so calibration (a new Profile, so a new context, per step)
    # does not rebuild it.
    key = (ctx.workload, log_prob, lay.dp, lay.cp, multiple, budget)
    if key in _PLANS:
        return _PLANS[key]
    from tuner.batching import DEFAULT_MINI_BATCHES, plan_step
    from tuner.lengths import step_lengths

    w = ctx.workload
    run = min(DEFAULT_MINI_BATCHES, max(1, w.mini_batches_per_step))
    out: float | None = None
    if budget > 0 and run * w.mini_batch_size * w.n <= BATCH_PLAN_MAX_SAMPLES:
        try:
            lkey = (w, run)
            if lkey not in _PLAN_LENGTHS:
                _PLAN_LENGTHS[lkey] = step_lengths(w, run * w.mini_batch_size, BATCH_PLAN_SEED)
            lengths = _PLAN_LENGTHS[lkey]
            plan = plan_step(
                lengths,
                dp=lay.dp,
                mini_batch_size=len(lengths) if log_prob else w.mini_batch_size * w.n,
                use_dynamic_bsz=True,
                max_token_len_per_gpu=budget,
                cp=lay.cp,
                micro_batch_multiple=multiple,
            )
            out = plan.max_micro_tokens() / lay.cp
        except ValueError:
            out = None
    _PLANS[key] = out
    return out


def _analytic_micro_tokens(ctx: Context, c: Candidate, log_prob: bool) -> float:
    """Tokens per GPU of the largest micro-batch a step is expected to see, from the length
    distribution's moments alone.

    Without dynamic batching: the samples per micro-batch at the step's longest sample. With it,
    verl (`rearrange_micro_batches`) cuts each DP rank's share of a mini-batch (of the whole batch
    in a log-prob pass) into ceil(tokens / budget) micro-batches balanced by tokens (rounded up
    to a multiple of pp under interleaving), so a micro-batch holds the share over that count,
    plus about one sample of imbalance: never more than the budget, and less where the share is
    smaller than the budget (the rows with a large budget were over-predicted when the model
    took the budget itself; results/README.md). The share is the largest of the step's
    mini-batches on any rank: mean + z sd over the samples, z for the maximum of that many draws
    (at least 1)."""
    lay = c.layout
    if not c.use_dynamic_bsz:
        mbs = c.log_prob_micro_batch_size_per_gpu if log_prob else c.ppo_micro_batch_size_per_gpu
        return mbs * ctx.longest_sample / lay.cp
    budget = max(1, c.log_prob_max_token_len_per_gpu if log_prob else c.ppo_max_token_len_per_gpu)
    cap = float(max(budget, math.ceil(ctx.workload.max_seq_len / lay.cp)))
    groups = 1 if log_prob else max(1, ctx.minis)
    samples = ctx.samples / (lay.dp * groups)
    draws = groups * lay.dp
    z = max(1.0, math.sqrt(2 * math.log(draws)) if draws > 1 else 0.0)
    share = samples * ctx.seq_mean + z * math.sqrt(samples) * ctx.seq_sd
    if lay.dp > 1:
        share += ctx.seq_mean  # balancing over DP ranks leaves about one sample of difference
    n = max(1, math.ceil(share / (budget * lay.cp)))
    if not log_prob and lay.vpp > 1 and n % lay.pp:
        n += lay.pp - n % lay.pp
    per = share / (n * lay.cp)
    if n > 1:
        per += ctx.seq_mean / lay.cp
    return min(cap, max(per, ctx.longest_sample / lay.cp))
