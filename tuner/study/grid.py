"""The hand grid: what an engineer tuning by hand tries first, measured in the same study as the
search so that "how much better is the tuned answer" is a measured ratio, not a claim.

The grid is the plain layouts (one parallel degree over the whole world, the way a hand-written
recipe starts: `tp2`, `pp2`, `ep2`, `dp2`), times recompute none/full, times a token budget of
one and two full samples. The rollout follows the published rule (HAND_ROLLOUT_RULE): the least
rollout parallelism and the largest `gpu_memory_utilization`, lowered one step after a hand
trial runs out of memory in generation (`hand_retry_params`, measured or predicted). Every other
knob keeps verl's default. Each candidate is enqueued once (before the warm start), with
`origin=hand grid`; the ones the cost model says cannot fit end as `pruned-oom-predicted` rows
without a launch, like any other candidate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.results import Status, TrialRecord
from tuner.space import (
    GPU_MEMORY_UTILIZATIONS,
    Candidate,
    ParallelLayout,
    SearchSpace,
    params_for,
    round_up,
    token_budget,
    validate,
)

HAND_GRID_ORIGIN = "hand grid"
HAND_RECOMPUTE = ("none", "full")
HAND_BUDGET_FACTORS = (1.0, 2.0)
"""ppo_max_token_len_per_gpu as multiples of one full sample (prompt + response)."""
HAND_LAYOUTS = 2
"""Plain layouts in the grid at most (largest single degree first: tp, then ep, pp, dp)."""
HAND_ROLLOUT_RULE = "least rollout parallelism, largest gpu_memory_utilization unless OOM"
"""The published rule for verl's rollout (docs/perf/perf_tuning.rst, "Rollout Generation
Tuning": "Increase gpu_memory_utilization" unless it leads to OOM, "Use a smaller
tensor_parallel_size"): the hand grid's rollout TP is the least the space allows (rollout DP
and EP 1) and its utilization the largest the space offers, lowered a step per OOM in
generation (`hand_retry_params`)."""
UTILIZATION_PARAM = "gpu_memory_utilization"
"""The sampler's parameter of the knob (tuner.space.knobs: no `param` of its own)."""


def _plain(lay: ParallelLayout) -> bool:
    degrees = [d for d in (lay.tp, lay.pp, lay.cp, lay.ep) if d > 1]
    return lay.vpp == 1 and lay.etp == 1 and len(degrees) <= 1 and lay.cp == 1


def _order(lay: ParallelLayout) -> tuple[int, int]:
    kind = 0 if lay.tp > 1 else 1 if lay.ep > 1 else 2 if lay.pp > 1 else 3
    return (kind, -max(lay.tp, lay.pp, lay.ep))


def plain_layouts(space: SearchSpace, limit: int = HAND_LAYOUTS) -> list[ParallelLayout]:
    """The layouts a hand-written recipe starts from, valid in this space."""
    lays = sorted((lay for lay in space.layouts.values() if _plain(lay)), key=_order)
    seen: set[str] = set()
    out: list[ParallelLayout] = []
    for lay in lays:
        kind = "tp" if lay.tp > 1 else "ep" if lay.ep > 1 else "pp" if lay.pp > 1 else "dp"
        if kind not in seen:
            seen.add(kind)
            out.append(lay)
    return out[:limit]


def hand_grid(space: SearchSpace, layouts: int = HAND_LAYOUTS) -> list[tuple[Candidate, str]]:
    """(candidate, label) pairs of the hand grid; only candidates that pass validate()."""
    m, cl, w = space.model, space.cluster, space.workload
    seq = w.max_seq_len
    out: list[tuple[Candidate, str]] = []
    for lay in plain_layouts(space, layouts):
        for gran in HAND_RECOMPUTE:
            for f in HAND_BUDGET_FACTORS:
                budget = token_budget(f, seq, lay.cp)
                c = Candidate(
                    layout=lay,
                    sequence_parallel=False,
                    recompute_granularity=gran,
                    use_dynamic_bsz=True,
                    ppo_max_token_len_per_gpu=budget,
                    log_prob_max_token_len_per_gpu=round_up(2 * budget, 1024),
                    rollout_tp=min(space.rollout_tps),
                    gpu_memory_utilization=max(GPU_MEMORY_UTILIZATIONS),
                )
                if m.is_moe and lay.tp > 1:
                    c = dataclasses.replace(c, sequence_parallel=True)
                if validate(c, m, cl, w):
                    continue
                out.append((c, f"{lay.notation} recompute {gran} budget {f:g}x"))
    return out


def hand_grid_params(
    space: SearchSpace, unfit: Callable[[Candidate], str] | None = None
) -> list[tuple[dict[str, Any], str]]:
    """The grid as (sampler params, origin) pairs for Optuna's enqueue_trial. With `unfit`
    (the study's prediction of a candidate: why it does not fit, '' where it does) each
    candidate's utilization is the largest not predicted to run out of memory in generation
    (HAND_ROLLOUT_RULE's "unless OOM", before a launch; an OOM measured later lowers it once
    more: hand_retry_params)."""
    out: list[tuple[dict[str, Any], str]] = []
    seen: set[tuple[Any, ...]] = set()
    for c, label in hand_grid(space):
        if unfit is not None:
            c, note = largest_utilization(c, unfit)
            label += note
        p = params_for(c, space)
        key = tuple(sorted(p.items()))
        if key not in seen:
            seen.add(key)
            out.append((p, f"{HAND_GRID_ORIGIN}: {label}"))
    return out


def generation_oom(reason: str) -> bool:
    """Whether an out-of-memory reason, measured or predicted, is generation's where a lower
    gpu_memory_utilization is what a user would try: the megatron runner's `generation: ...`
    (tuner.runners.megatron_generation), verl's `CUDA OOM in gen: ...` (runners.verl_log), the
    cost model's `... in generation + headroom` and `gpu_memory_utilization(...) leaves no room`
    (unfit_in_generation). Not the weight sync's peak (utilization does not change it) nor a
    KV cache too small for one sequence (a lower one makes that worse)."""
    if "weight sync" in reason or "KV cache" in reason:
        return False
    return (
        reason.startswith("generation")
        or " in gen:" in reason
        or " in generation +" in reason
        or "leaves no room" in reason
    )


def oom_in_generation(rec: TrialRecord) -> bool:
    """Whether the row ran (or was predicted to run) out of memory in generation."""
    return rec.status in (Status.OOM, Status.PRUNED_OOM) and generation_oom(rec.reason)


def largest_utilization(c: Candidate, unfit: Callable[[Candidate], str]) -> tuple[Candidate, str]:
    """The hand rule's utilization for `c`: the largest offered that `unfit` (the study's
    prediction, '' where it fits) does not say runs out of memory in generation, with a note
    of the ones passed over ('' when the largest is taken); the smallest where none fits, and
    the note says so (it is not one passed over)."""
    passed: list[str] = []
    for u in sorted(GPU_MEMORY_UTILIZATIONS, reverse=True):
        cu = dataclasses.replace(c, gpu_memory_utilization=u)
        if not generation_oom(unfit(cu)):
            break
        passed.append(f"{u:g}")
    else:
        return cu, f", gpu_memory_utilization {u:g} (every one offered predicted OOM in generation)"
    note = f", gpu_memory_utilization {u:g} ({'/'.join(passed)} predicted OOM in generation)"
    return cu, note if passed else ""


def hand_retry_params(
    params: dict[str, Any], rec: TrialRecord
) -> tuple[dict[str, Any], str] | None:
    """The hand trial (`rec`, its row, of sampler `params`) once more with the next lower
    gpu_memory_utilization, where it ran out of memory in generation (HAND_ROLLOUT_RULE), as
    (sampler params, origin); None for other trials, other ends, or the lowest utilization."""
    origin = rec.origin
    u = params.get(UTILIZATION_PARAM)
    if not origin.startswith(HAND_GRID_ORIGIN) or u is None or not oom_in_generation(rec):
        return None
    lower = [x for x in GPU_MEMORY_UTILIZATIONS if x < float(u)]
    if not lower:
        return None
    base = origin.split(";", 1)[0]
    return (
        {**params, UTILIZATION_PARAM: lower[-1]},
        f"{base}; gpu_memory_utilization {lower[-1]:g} after OOM in generation at {float(u):g}",
    )


VERL_EXAMPLE_ORIGIN = "hand: verl example"
"""Starts with objective.LAUNCHED_AS_WRITTEN: launched even where predicted not to fit."""
VERL_EXAMPLE = "examples/grpo_trainer/run_qwen2-7b_math_megatron.sh"
"""The Megatron GRPO example a verl user starts from (volcengine/verl): actor tp2 pp2 on 8 GPUs,
rollout tp2, fixed micro-batches of 4 for the update and the log-probs, no recompute or offload
keys, gpu_memory_utilization 0.6, every other key at verl's default."""


VERL_MOE_EXAMPLE = "examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh"
"""verl's Megatron example for Qwen3-30B-A3B (volcengine/verl; "tested in NNODES=1~4 * 96G H20
GPU"; read at the newest snapshot stored here, b178a3cd of 2026-01-29, which carries no v0.9.1
tag; the older run_qwen3moe-30b_megatron.sh, tp4 pp2 ep4 with dist checkpoints, was removed
before it). The keys it sets that a knob here carries, as verl_moe_example writes them:
actor tp1 pp1 cp1 ep8 etp1 (COMMON_*), rollout tp4 (INFER_TP; vLLM dp and ep not set: 1);
param and optimizer offload True (and grad_offload, which verl 0.9.1 folds into param_offload);
use_dynamic_bsz with ppo_max_token_len_per_gpu and log_prob_max_token_len_per_gpu of one sample
(prompt + response); gpu_memory_utilization 0.7, enforce_eager True, max_num_batched_tokens
prompt + response; use_fused_kernels False; no recompute keys (megatron-core's none);
override_transformer_config apply_rope_fusion, masked_softmax_fusion, bias_activation_fusion,
gradient_accumulation_fusion, moe_grouped_gemm, moe_permute_fusion True and
moe_token_dispatcher_type flex with moe_enable_deepep True (DeepEP).
The keys no knob carries: the optimizer's override_optimizer_config (optimizer_offload_fraction
1, overlap_cpu_optimizer_d2h_h2d, use_precision_aware_optimizer, optimizer_cpu_offload: a CPU
Adam, where optimizer_offload here is verl's offload between phases), moe_router_dtype fp32,
bias_dropout_fusion and persist_layer_norm (mbridge's Qwen3MoEBridge sets both True itself),
deallocate_pipeline_outputs (pp1: nothing to deallocate), enable_chunked_prefill (verl's default,
True), the model's max_position_embeddings override and the algorithm's keys (the workload's).
A knob the study's runner pins (no DeepEP on the host: the dispatcher alltoall; no APEX:
gradient_accumulation_fusion off) runs as pinned, and the origin says so."""


def verl_moe_example(space: SearchSpace) -> tuple[Candidate, str] | None:
    """verl's MoE example (VERL_MOE_EXAMPLE) scaled to this study's GPUs: its ep8 halved until
    it fits (references.scale_layout), rollout TP 4 or the GPUs there are where fewer; the
    space's pinned knobs replace the example's values of them. None if not valid here."""
    from tuner.references import scale_layout

    m, cl, w = space.model, space.cluster, space.workload
    lay = scale_layout("ep8", cl.num_gpus)
    if lay is None or not m.is_moe or m.num_experts % lay.ep:
        return None
    one = token_budget(1.0, w.max_seq_len, lay.cp)
    c = Candidate(
        layout=lay,
        sequence_parallel=False,
        recompute_granularity="none",
        param_offload=True,
        optimizer_offload=True,
        use_fused_kernels=False,
        gradient_accumulation_fusion=True,
        moe_token_dispatcher_type="flex",
        moe_grouped_gemm=True,
        moe_permute_fusion=True,
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=one,
        log_prob_max_token_len_per_gpu=one,
        rollout_tp=min(4, cl.num_gpus),
        gpu_memory_utilization=0.7,
        enforce_eager=True,
        max_num_batched_tokens=w.max_seq_len,
    )
    pinned = [(k, v) for k, v in space.limits.pinned if k in Candidate.__dataclass_fields__]
    changed = [f"{k} {v}" for k, v in pinned if getattr(c, k) != v]
    c = dataclasses.replace(c, **dict(pinned))
    if validate(c, m, cl, w):
        return None
    note = f"; pinned here: {', '.join(changed)}" if changed else ""
    return c, (
        f"{VERL_EXAMPLE_ORIGIN} ({VERL_MOE_EXAMPLE} as {lay.notation}, rollout "
        f"tp{c.rollout_tp}{note})"
    )


def verl_example(space: SearchSpace) -> tuple[Candidate, str] | None:
    """verl's example scaled to this study's GPUs (its tp2pp2 halved until it fits, rollout TP
    as the actor's TP); None if that is not valid here. A MoE model gets verl's MoE example
    (verl_moe_example)."""
    from tuner.references import scale_layout

    m, cl, w = space.model, space.cluster, space.workload
    if m.is_moe:
        return verl_moe_example(space)
    lay = scale_layout("tp2pp2", cl.num_gpus)
    if lay is None:
        return None
    c = Candidate(
        layout=lay,
        sequence_parallel=False,
        recompute_granularity="none",
        use_dynamic_bsz=False,
        ppo_micro_batch_size_per_gpu=4,
        log_prob_micro_batch_size_per_gpu=4,
        rollout_tp=lay.tp,
        gpu_memory_utilization=0.6,
    )
    if validate(c, m, cl, w):
        return None
    return c, f"{VERL_EXAMPLE_ORIGIN} ({VERL_EXAMPLE} as {lay.notation}, rollout tp{lay.tp})"


def verl_example_params(space: SearchSpace) -> list[tuple[dict[str, Any], str]]:
    """The example as (sampler params, origin) for Optuna's enqueue_trial, or nothing."""
    got = verl_example(space)
    return [(params_for(got[0], space), got[1])] if got else []


CANDIDATES_FROM_ORIGIN = "from"
"""Origin of a candidate taken from another leaderboard: `from <csv> trial <n>`."""


def _same_model(text: str, model: Any) -> bool:
    """A row's `model` (the --model its study was given: a registry name or a config.json
    path) is `model`: the same architecture, whatever it is called."""
    from tuner.errors import UserError
    from tuner.models import get_model

    try:
        theirs = get_model(text)
    except UserError:  # a config.json not on this machine: its name must match
        return text.lower() == model.name.lower()
    return dataclasses.replace(theirs, name=model.name, hf_id=model.hf_id) == model


def outside_space(c: Candidate, space: SearchSpace) -> tuple[str, str] | None:
    """(knob, why) of the first knob value of `c` (a candidate read from a CSV row) that is
    outside what the knob declares it may take (knobs.candidate_refusals: a
    gpu_memory_utilization of 7.5) or that this study's space does not offer, given the values
    before it (a rollout_tp of 3 where the heads allow 1, 2, 4): Optuna refused such a value
    only once the trial was created (a ValueError, an `interrupted` row), and a value the space
    snapped to its nearest choice ran another candidate under the row's label. None where the
    study can measure exactly `c`."""
    from tuner.space.knobs import candidate_refusals
    from tuner.space.sampling import offered_choices

    refused = candidate_refusals(c)
    if refused:
        return refused[0]
    if c.rollout_gpus and not space.allow_off_policy:  # its layout is of N - r GPUs, not N
        return "rollout_gpus", (
            f"{c.rollout_gpus} (a split placement, one step off-policy) is not one this study "
            "offers: pass --allow-off-policy to measure it"
        )
    drawn: dict[str, Any] = {}
    for k, ch in offered_choices(space, drawn):
        v = k.value(c)
        p = k.encode(v, space, drawn)
        offered = ch[0] <= p <= ch[-1] if k.int_range else p in ch
        if not offered or k.decode(p, space, drawn) != v:  # not there, or snapped to another
            shown = [k.decode(x, space, drawn) for x in ch]
            if k.name == "layout":
                shown = [lay.spec for lay in shown]
                v = c.layout.spec
            if k.int_range and len(shown) > 2:
                listed = f"{shown[0]} .. {shown[-1]}"
            else:
                listed = ", ".join(map(str, shown[:12])) + (", ..." if len(shown) > 12 else "")
            column = "train_parallel" if k.name == "layout" else k.name
            return column, f"{v} is not one this study offers ({listed})"
        drawn[k.name] = v
    return None


def candidates_from_params(csv_path: Path, space: SearchSpace) -> list[tuple[dict[str, Any], str]]:
    """The ok rows of another leaderboard (e.g. real verl's) as (sampler params, origin), each
    candidate once (its first row), so this study measures the same candidates with its own
    runner (issue 17: the fast runner against verl). Rows of another model, GPU count or
    workload are refused: one line, exit 2."""
    from tuner.errors import UserError
    from tuner.results import number, read_raw

    # line of each row in the file (the header is line 1), for the messages
    rows = [(i, r) for i, r in enumerate(read_raw(csv_path), 2) if r.get("status") == "ok"]
    if not rows:
        raise UserError(f"--candidates-from {csv_path}: no ok row to take candidates from")
    w, cl = space.workload, space.cluster
    # the columns a row must share with the study for its candidate to mean the same one
    want = {
        "max_prompt_len": w.prompt_len,
        "max_response_len": w.response_len,
        "bs": w.batch_size,
        "n": w.n,
        "mini_bs": w.mini_batch_size,
        "num_gpus": cl.num_gpus,
    }
    out: list[tuple[dict[str, Any], str]] = []
    taken: list[Candidate] = []
    for line, r in rows:
        where = f"--candidates-from {csv_path} line {line} (trial {r.get('trial')})"
        if not _same_model(r.get("model") or "", space.model):
            raise UserError(
                f"--candidates-from {csv_path}: trial {r.get('trial')} ran model "
                f"{r.get('model')!r}, not {space.model.name}: pass a leaderboard of this model"
            )
        diff = [f"{k} {r.get(k)} (here {v})" for k, v in want.items() if number(r.get(k)) != v]
        if diff:
            raise UserError(
                f"--candidates-from {csv_path}: trial {r.get('trial')} ran another workload or "
                f"GPU count ({', '.join(diff)}): give this study's --prompt-len/--response-len/"
                "--batch/--n/--mini-batch/--gpus as that study's"
            )
        try:
            c = Candidate.from_record(r, cl.num_gpus)
        except KeyError as e:
            raise UserError(
                f"{where} is incomplete (no {e} column): fix or delete that row"
            ) from None
        except ValueError as e:  # a cell that is not its column's type (tuner.cells), a layout
            raise UserError(f"{where}: {e}: fix the cell or delete that row") from None
        off = outside_space(c, space)
        if off is not None:
            column, why = off
            raise UserError(f"{where}, column {column}: {why}: fix the cell or delete that row")
        if c in taken:  # a repeat row ("same candidate as trial N; not re-run"): once
            continue
        taken.append(c)
        out.append(
            (params_for(c, space), f"{CANDIDATES_FROM_ORIGIN} {csv_path.name} trial {r['trial']}")
        )
    return out
