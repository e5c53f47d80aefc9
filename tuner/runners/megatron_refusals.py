"""What the megatron runner refuses before a launch: the shared rules plus its worker's own.

The rules verl, vLLM and megatron-core enforce live once, in `tuner.space.RULES`; this module
adds only what the runner's worker refuses beyond them (`MEGATRON_RULES`, `Rule`s of the same
form) and checks both with `tuner.space.broken_rules`. Each verdict says when it would be
refused (`when`): `config` (megatron-core's TransformerConfig / ModelParallelConfig
__post_init__, so a GPU host can compare refusals() with megatron-core by building
TransformerConfig for every layout: scripts/gpu_runner_check.py), `runtime` (megatron-core or
the worker later: process groups, the layer build, the first forward, the schedule) or `verl`
(verl or vLLM refuse it; megatron-core never sees it)."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.runners.megatron_worker.model import CONFIG_MOE_GROUPED_GEMM
from tuner.space import RULES, Candidate, Rule, broken_rules, modules_of
from tuner.workload import Workload


@dataclass(frozen=True, slots=True)
class Refusal:
    rule: str
    """The rule's name (a `tuner.space.RULES` or `MEGATRON_RULES` name)."""
    when: str
    """config, runtime or verl (see the module docstring)."""
    message: str


def unbuilt_recompute_modules(m: ModelSpec) -> tuple[str, ...]:
    """Selective-recompute modules megatron-core refuses in the TransformerConfig the worker
    builds for `m` (model.config_kwargs): moe_act needs moe_grouped_gemm, which the worker sets
    to CONFIG_MOE_GROUPED_GEMM on a MoE and leaves at megatron-core's False on a dense model,
    whatever the candidate's moe_grouped_gemm says. The rule moe_act_needs_grouped_gemm checks it
    and the megatron runner's space leaves them out (MegatronRunner.space_limits)."""
    return () if (CONFIG_MOE_GROUPED_GEMM and m.is_moe) else ("moe_act",)


def _dense_layers_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    # not megatron-core's refusal but the worker's: its one local layer spec builds every layer
    # with the MoE block (model.layer_spec), so leading dense layers would be built as MoE
    if m.num_dense_layers <= 0:
        return []
    return [
        f"the megatron runner's worker builds every layer as MoE: this model's "
        f"{m.num_dense_layers} leading dense layers (first_k_dense_replace) are not measured; "
        "use --runner verl or the estimator"
    ]


def _unbuilt_modules_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    # transformer_config.py: "moe_act in recompute_modules is only supported with
    # moe_grouped_gemm", against the flag the worker builds (the shared rule reads the
    # candidate's, which is what verl builds)
    if c.recompute_granularity != "selective":
        return []
    unbuilt = sorted(set(modules_of(c)) & set(unbuilt_recompute_modules(m)))
    if not unbuilt:
        return []
    return [
        f"recompute module {', '.join(unbuilt)} needs megatron-core's moe_grouped_gemm, which "
        "the megatron runner's worker builds off (its own grouped-GEMM experts): drop it"
    ]


def _moe_recompute_dense_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    # megatron-core accepts it and recomputes nothing: the runner does not spend a trial on it
    mods = modules_of(c)
    if c.recompute_granularity != "selective" or m.is_moe or not {"moe_act", "moe"} & set(mods):
        return []
    return ["MoE recompute modules on a dense model recompute nothing: drop them"]


MEGATRON_RULES: tuple[Rule, ...] = (
    Rule("dense_layers_not_built", "layout", _dense_layers_rule),
    Rule("moe_act_needs_grouped_gemm", "recompute_modules", _unbuilt_modules_rule),
    Rule("moe_recompute_dense", "recompute_modules", _moe_recompute_dense_rule),
)
"""What the megatron runner refuses beyond `tuner.space.RULES` (none restates one of them)."""

RUNNER_RULES: tuple[Rule, ...] = (*RULES, *MEGATRON_RULES)
"""Every rule the megatron runner checks before a launch."""

AT_CONFIG = frozenset(
    {
        "tp_heads",  # transformer_config.py: heads a multiple of tp
        "tp_kv_heads",  # transformer_config.py: num_query_groups a multiple or divisor of tp
        "sp_needs_tp",  # model_parallel_config.py: no sequence parallelism without tp
        "dense_no_ep",  # transformer_config.py: num_moe_experts needed for expert parallel
        "recompute_granularity",  # transformer_config.py: full or selective
        "recompute_method",  # transformer_config.py: block or uniform
        "recompute_modules",  # transformer_config.py: allowed modules and what each needs
        "moe_act_needs_grouped_gemm",
    }
)
"""Rules megatron-core refuses when the config is built; `pipeline_split` too where the split
is uneven (the even split is checked when the layers are built)."""
AT_RUNTIME = frozenset(
    {
        "vpp_needs_pp",  # schedules.py: without a pipeline one model chunk only
        "pipeline_split",  # transformer_block.get_num_layers_to_build
        "ep_experts",  # moe_layer: experts split over the ep ranks
        "moe_tp_needs_sp",  # moe_layer forward: MoE with tp and no sequence parallel
        "recompute_num_layers",  # the worker's spec check (megatron-core applies it per chunk)
        "moe_token_dispatcher_type",  # moe_layer.py: "Unsupported token dispatcher type"
        "dense_layers_not_built",
        "dense_no_etp",  # megatron-core runs it and shards nothing: never launched
        "tp_ffn",  # the layer build: linear layers divide their width over tp
        "etp_ffn",  # the layer build: the experts' linear layers divide theirs over etp
        "moe_recompute_dense",
    }
)
"""Rules refused later, by megatron-core or the worker; every other rule is verl's or vLLM's."""


def when_refused(rule: str, c: Candidate) -> str:
    """config, runtime or verl: when a verdict of `rule` would stop the candidate."""
    if rule in AT_CONFIG or (rule == "pipeline_split" and c.layout.uneven):
        return "config"
    return "runtime" if rule in AT_RUNTIME else "verl"


def refusals(c: Candidate, m: ModelSpec, cluster: Cluster, workload: Workload) -> list[Refusal]:
    """Every rule of RUNNER_RULES the candidate breaks, with when it is refused."""
    return [
        Refusal(name, when_refused(name, c), msg)
        for name, msg in broken_rules(c, m, cluster, workload, RUNNER_RULES)
    ]


def megatron_refusals(
    candidate: Candidate, model: ModelSpec, cluster: Cluster, workload: Workload
) -> list[str]:
    """`[rule] sentence` for every rule of RUNNER_RULES the candidate breaks; empty if none."""
    return [f"[{r.rule}] {r.message}" for r in refusals(candidate, model, cluster, workload)]
