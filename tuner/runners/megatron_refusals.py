"""What megatron-core 0.19.2 refuses, checked on the CPU before a launch.

Each rule names where megatron-core enforces it (the file under megatron/core/) and whether it is
refused when the config is built (`config`: TransformerConfig / ModelParallelConfig
__post_init__, so a GPU host can check this function against megatron-core by building
TransformerConfig for every layout: scripts/gpu_refusals.py) or later (`runtime`: process
groups, the first forward, the schedule)."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.models import ModelSpec
from tuner.runners.megatron_worker.model import CONFIG_MOE_GROUPED_GEMM
from tuner.space import Candidate, modules_of


@dataclass(frozen=True, slots=True)
class Refusal:
    rule: str
    """Short id."""
    when: str
    """config (TransformerConfig/ModelParallelConfig __post_init__) or runtime."""
    message: str


def unbuilt_recompute_modules(m: ModelSpec) -> tuple[str, ...]:
    """Selective-recompute modules megatron-core refuses in the TransformerConfig the worker
    builds for `m` (model.config_kwargs): moe_act needs moe_grouped_gemm, which the worker sets
    to CONFIG_MOE_GROUPED_GEMM on a MoE and leaves at megatron-core's False on a dense model,
    whatever the candidate's moe_grouped_gemm says. The one rule refusals() checks and the
    megatron runner's space leaves out (MegatronRunner.space_limits)."""
    return () if (CONFIG_MOE_GROUPED_GEMM and m.is_moe) else ("moe_act",)


def refusals(c: Candidate, m: ModelSpec) -> list[Refusal]:
    """Every megatron-core 0.19.2 rule the candidate breaks (see the module docstring)."""
    lay = c.layout
    out: list[Refusal] = []

    def add(cond: bool, rule: str, when: str, msg: str) -> None:
        if cond:
            out.append(Refusal(rule, when, msg))

    # transformer_config.py: "num_attention_heads must be a multiple of tensor_model_parallel_size"
    add(
        m.num_attention_heads % lay.tp != 0,
        "tp_heads",
        "config",
        f"tp({lay.tp}) does not divide the {m.num_attention_heads} attention heads",
    )
    # transformer_config.py: "num_query_groups must be a multiple or divisor of tp"
    add(
        m.num_kv_heads % lay.tp != 0 and lay.tp % m.num_kv_heads != 0,
        "tp_kv_heads",
        "config",
        f"tp({lay.tp}) and the {m.num_kv_heads} kv heads do not divide one another",
    )
    # model_parallel_config.py: "Cannot use sequence parallelism without tensor parallelism"
    add(
        c.sequence_parallel and lay.tp == 1,
        "sp_needs_tp",
        "config",
        "sequence parallel needs tp > 1",
    )
    # transformer_config.py: "num_moe_experts must be non None to use expert-parallel"
    add(not m.is_moe and lay.ep > 1, "ep_needs_moe", "config", f"ep({lay.ep}) > 1 on a dense model")
    # parallel_state.py: experts are split over ep ranks (moe_layer: num_local_experts)
    add(
        m.is_moe and m.num_experts % lay.ep != 0,
        "ep_experts",
        "runtime",
        f"ep({lay.ep}) does not divide the {m.num_experts} experts",
    )
    # not megatron-core's refusal but the worker's: its one local layer spec builds every layer
    # with the MoE block (model.layer_spec), so leading dense layers would be built as MoE
    add(
        m.num_dense_layers > 0,
        "dense_layers_not_built",
        "runtime",
        f"the megatron runner's worker builds every layer as MoE: this model's "
        f"{m.num_dense_layers} leading dense layers (first_k_dense_replace) are not measured; "
        "use --runner verl or the estimator",
    )
    # moe/moe_layer.py forward: "MoE and tensor parallelism ... without sequence parallelism"
    add(
        m.is_moe and lay.tp > 1 and not c.sequence_parallel,
        "moe_tp_needs_sp",
        "runtime",
        "a MoE model with tp > 1 needs sequence parallel (megatron-core raises in training)",
    )
    # transformer_config.py: vpp needs a pipeline; the split rules (uneven stages, divisibility)
    if lay.vpp > 1 and lay.pp == 1:
        # schedules.py: without a pipeline the no-pipelining schedule takes one model chunk
        add(True, "vpp_needs_pp", "runtime", f"vpp({lay.vpp}) needs pp > 1")
        stages = None
    else:
        try:
            stages = lay.stage_layers(m.num_layers)
        except ValueError as e:
            # uneven first/last stages are checked in TransformerConfig.__post_init__; the even
            # split only when the layers are built (transformer_block.get_num_layers_to_build)
            add(True, "pipeline_split", "config" if lay.uneven else "runtime", str(e))
            stages = None
    # transformer_config.py names the range 1..num_layers // pp but only refuses a missing
    # value (measured on megatron-core 0.19.2); transformer_block applies it per chunk
    if c.recompute_granularity == "full":
        top = m.num_layers // lay.pp
        add(
            not 1 <= c.recompute_num_layers <= top,
            "recompute_num_layers",
            "runtime",
            f"recompute_num_layers({c.recompute_num_layers}) must lie in 1..{top} "
            "(num_layers / pp)",
        )
        if stages is not None:
            chunk = min(stages) // lay.vpp
            add(
                c.recompute_num_layers > chunk,
                "recompute_chunk",
                "runtime",
                f"recompute_num_layers({c.recompute_num_layers}) exceeds the {chunk} layers of "
                "one pipeline chunk",
            )
    if c.recompute_granularity == "selective":
        mods = modules_of(c)
        # transformer_config.py: "moe_act in recompute_modules is only supported with
        # moe_grouped_gemm", checked against the flag the worker builds (not the candidate's)
        unbuilt = sorted(set(mods) & set(unbuilt_recompute_modules(m)))
        add(
            bool(unbuilt),
            "moe_act_needs_grouped_gemm",
            "config",
            f"recompute module {', '.join(unbuilt)} needs megatron-core's moe_grouped_gemm, which "
            "the megatron runner's worker builds off (its own grouped-GEMM experts): drop it",
        )
        add(
            ("moe_act" in mods or "moe" in mods) and not m.is_moe,
            "moe_recompute_dense",
            "runtime",
            "MoE recompute modules on a dense model recompute nothing",
        )
    return out


def megatron_refusals(candidate: Candidate, model: ModelSpec) -> list[str]:
    """Sentences for every megatron-core 0.19.2 rule the candidate breaks; empty if none."""
    return [r.message for r in refusals(candidate, model)]
