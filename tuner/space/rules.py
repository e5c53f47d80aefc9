"""Validity rules, each named (`RULES`), and the shared rules other modules apply.

`validate()` checks every rule, because candidates also come from users, reference recipes and
resumed studies. Rules are the ones megatron-core 0.19, vLLM and verl 0.9.1 enforce, no
stricter; each message says what to change. This is the one copy: a runner whose backend refuses
more adds its own `Rule`s and passes `RULES + its rules` to `broken_rules` (the megatron runner's
`tuner.runners.megatron_refusals.MEGATRON_RULES`), never a restatement of one here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.errors import UserError
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.space.candidate import (
    ATTENTION_BACKENDS,
    MOE_DISPATCHERS,
    RECOMPUTE_GRANULARITIES,
    RECOMPUTE_METHODS,
    RECOMPUTE_MODULES_ALLOWED,
    Candidate,
    modules_of,
)
from tuner.space.choices import min_token_budget
from tuner.space.knobs import knob_refusal
from tuner.space.layout import ParallelLayout, RolloutDims
from tuner.space.placement import pools
from tuner.workload import Workload

# --------------------------------------------------------------------------------------------
# Shared rules other modules apply (one function each)
# --------------------------------------------------------------------------------------------


def token_budget_problem(name: str, budget: int, cp: int, max_seq_len: int) -> str | None:
    """The sentence when a dynamic-batching budget times cp is below one sample; else None."""
    if budget * cp >= max_seq_len:
        return None
    return (
        f"{name}({budget}) * cp({cp}) is below one sample's {max_seq_len} tokens: raise it to "
        f"at least {min_token_budget(max_seq_len, cp)}"
    )


# --------------------------------------------------------------------------------------------
# Validity rules, each named
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """One validity rule as megatron-core, vLLM or verl enforce it."""

    name: str
    """Short id, used by tests and in docs."""
    knob: str
    """The knob (Candidate field, or `layout`) the rule is about."""
    check: Callable[[Candidate, ModelSpec, Cluster, Workload], list[str]]
    """Sentences naming what to change; empty when the candidate passes."""


def layout_model_rules(lay: ParallelLayout, m: ModelSpec) -> list[tuple[str, str]]:
    """(rule name, sentence) of the layout rules that read the model alone (tp_heads, tp_kv_heads,
    vpp_needs_pp or pipeline_split, dense_no_ep, ep_experts): part of RULES, and what the megatron
    worker checks of a spec too (megatron_worker.spec; a spec has no cluster or workload)."""
    r: list[tuple[str, str]] = []
    if m.num_attention_heads % lay.tp:
        r.append(
            (
                "tp_heads",
                f"tp({lay.tp}) does not divide the {m.num_attention_heads} attention heads",
            )
        )
    # megatron-core: num_query_groups must be a multiple or a divisor of tp; above the kv heads
    # each rank holds a replica of its group (TransformerConfig.__post_init__)
    if m.num_kv_heads % lay.tp and lay.tp % m.num_kv_heads:
        r.append(
            (
                "tp_kv_heads",
                f"tp({lay.tp}) and the {m.num_kv_heads} kv heads do not divide one another",
            )
        )
    if lay.vpp > 1 and lay.pp == 1:
        r.append(("vpp_needs_pp", f"vpp({lay.vpp}) needs pp > 1"))
    else:
        try:
            lay.stage_layers(m.num_layers)
        except ValueError as e:
            r.append(("pipeline_split", f"megatron-core refuses the pipeline split: {e}"))
    # megatron-core: "num_moe_experts must be non None to use expert-parallel"
    # (TransformerConfig.__post_init__); etp > 1 on a dense model is not refused there (nothing
    # uses it), so it is not here
    if not m.is_moe and lay.ep > 1:
        r.append(("dense_no_ep", f"ep({lay.ep}) > 1 on a dense model: set it to 1"))
    if m.is_moe and m.num_experts % lay.ep:
        r.append(("ep_experts", f"ep({lay.ep}) does not divide the {m.num_experts} experts"))
    # megatron-core splits a linear layer's inner dimension over its group with `divide`, an
    # assert (tensor_parallel/layers.py, extensions/transformer_engine.py): the dense MLP and the
    # shared experts over tp, each routed expert over etp (moe/experts.py: their group is
    # expt_tp); an FFN width no tp divides was scored at tp > 1 (issue 38 item 4)
    for what, width in m.tp_split_widths:
        if width % lay.tp:
            r.append(("tp_ffn", f"tp({lay.tp}) does not divide the {what}, {width}"))
    if m.is_moe and m.moe_ffn_hidden_size % lay.etp:
        r.append(
            (
                "etp_ffn",
                f"etp({lay.etp}) does not divide the experts' width (moe_intermediate_size), "
                f"{m.moe_ffn_hidden_size}",
            )
        )
    return r


def _lay_rules(
    lay: ParallelLayout, m: ModelSpec, cl: Cluster, w: Workload
) -> list[tuple[str, str]]:
    r: list[tuple[str, str]] = []
    if lay.world != cl.num_gpus:
        r.append(("world", f"layout is for {lay.world} GPUs, the cluster has {cl.num_gpus}"))
    r += layout_model_rules(lay, m)
    # megatron-core accepts etp > 1 on a dense model (transformer_config.py refuses expert
    # parallelism without experts, not etp) and shards nothing with it: `tp2etp2` of a dense
    # model is tp2 under another name, a second row of one candidate (issue 38 item 4). The
    # megatron worker runs what megatron-core runs, so its spec check (layout_model_rules)
    # does not refuse it
    if not m.is_moe and lay.etp > 1:
        r.append(
            ("dense_no_etp", f"etp({lay.etp}) > 1 on a dense model shards nothing: set it to 1")
        )
    # no rule on the sequence length under cp: verl 0.9.1 pads each packed sequence to a
    # multiple of tp*cp*2 itself (verl/models/mcore/util.py preprocess_packed_seqs, align_size)
    if (w.mini_batch_size * w.n) % lay.dp:
        r.append(
            (
                "mini_batch_dp",
                f"mini batch {w.mini_batch_size} * n {w.n} is not divisible by dp({lay.dp}): "
                "change --mini-batch or the layout",
            )
        )
    return r


LAYOUT_RULE_NAMES = (
    "world",
    "tp_heads",
    "tp_kv_heads",
    "vpp_needs_pp",
    "pipeline_split",
    "dense_no_ep",
    "ep_experts",
    "tp_ffn",
    "etp_ffn",
    "dense_no_etp",
    "mini_batch_dp",
)


def validate_layout(
    lay: ParallelLayout, model: ModelSpec, cluster: Cluster, workload: Workload
) -> list[str]:
    """Reasons the layout cannot run this model on this cluster; empty when it can."""
    return [msg for _, msg in _lay_rules(lay, model, cluster, workload)]


def _one(cond: bool, msg: str) -> list[str]:
    return [msg] if cond else []


def sequence_parallel_problems(sequence_parallel: bool, tp: int) -> list[str]:
    """The rule sp_needs_tp (the megatron worker checks a spec with it too)."""
    return _one(
        sequence_parallel and tp == 1, "sequence parallel needs tp > 1: turn it off or raise tp"
    )


def _sp_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    return sequence_parallel_problems(c.sequence_parallel, c.layout.tp)


def _moe_sp_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    # megatron-core raises at the first training step ("performance may degrade if MoE and
    # tensor parallelism are enabled without also enabling sequence parallelism"), measured
    return _one(
        m.is_moe and c.layout.tp > 1 and not c.sequence_parallel,
        "Megatron needs sequence parallel for a MoE model with tp > 1: turn it on",
    )


def _flex_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    # megatron-core 0.19.2 transformer/moe/token_dispatcher.py MoEFlexTokenDispatcher: "DeepEP
    # dispatcher requires TPxEP > 1" (an assert at the model's build; measured: a verl trial of
    # qwen3-30b-moe-8l at tp1 ep1 on one H200 failed there)
    lay = c.layout
    return _one(
        m.is_moe and c.moe_token_dispatcher_type == "flex" and lay.tp * lay.ep == 1,
        "the flex (DeepEP) token dispatcher needs tp x ep > 1: use alltoall, or tp or ep > 1",
    )


def choice_problems(name: str, value: Any, allowed: Sequence[Any]) -> list[str]:
    """The choice rules (recompute_granularity, recompute_method, attention_backend, ...): the
    value is one of `allowed` (the megatron worker checks a spec's with it too)."""
    return _one(value not in allowed, f"{name} {value!r} is not one of {tuple(allowed)}")


def _choice_rule(name: str, allowed: Sequence[Any]) -> Callable[..., list[str]]:
    def check(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
        return choice_problems(name, getattr(c, name), allowed)

    return check


def recompute_layers_problems(
    granularity: str, num_layers: int, lay: ParallelLayout, m: ModelSpec
) -> list[str]:
    """The rule recompute_num_layers (the megatron worker checks a spec with it too)."""
    # megatron-core 0.19 refuses only a missing value (its message names 1..num_layers // pp);
    # recompute.checkpointed_forward applies the value per model chunk: 0 never advances the
    # uniform loop, and above a chunk's layers it runs as that chunk's count (uniform caps each
    # unit at the chunk, block recomputes every layer). The bound is the smallest chunk's
    # layers, which is never above num_layers // pp.
    if granularity != "full":
        return []
    try:
        stages = lay.stage_layers(m.num_layers)
    except ValueError:
        return []  # the rule pipeline_split says why
    chunk = min(stages) // lay.vpp
    return _one(
        not 1 <= num_layers <= max(1, chunk),
        f"recompute_num_layers({num_layers}) must lie in 1..{max(1, chunk)}, the layers of one "
        "pipeline chunk",
    )


def _recompute_layers_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    return recompute_layers_problems(c.recompute_granularity, c.recompute_num_layers, c.layout, m)


def _recompute_modules_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    if c.recompute_granularity != "selective":
        return []
    mods = modules_of(c)
    bad = sorted(set(mods) - set(RECOMPUTE_MODULES_ALLOWED))
    r = _one(
        bool(bad),
        f"recompute_modules {bad} are not megatron-core modules: use some of "
        f"{', '.join(RECOMPUTE_MODULES_ALLOWED)}",
    )
    # TransformerConfig: moe_act recompute needs the grouped GEMM
    r += _one(
        "moe_act" in mods and not c.moe_grouped_gemm,
        "recompute module moe_act needs moe_grouped_gemm: turn it on or drop moe_act",
    )
    r += _one("mla_up_proj" in mods, "recompute module mla_up_proj needs multi-latent attention")
    r += _one("gdn_norm_out" in mods, "recompute module gdn_norm_out needs gated delta net")
    return r


def _budget_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    if not c.use_dynamic_bsz:
        return []
    out = []
    for name in ("ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"):
        p = token_budget_problem(name, getattr(c, name), c.layout.cp, w.max_seq_len)
        if p:
            out.append(p)
    return out


def _micro_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    if c.use_dynamic_bsz:
        return []
    per_rank = w.mini_batch_size * w.n // c.layout.dp
    mb = c.ppo_micro_batch_size_per_gpu
    r = _one(
        mb < 1 or per_rank % mb != 0,
        f"ppo_micro_batch_size_per_gpu({mb}) does not divide the {per_rank} samples each DP rank "
        "gets per mini batch",
    )
    lmb = c.log_prob_micro_batch_size_per_gpu
    r += _one(lmb < 1, f"log_prob_micro_batch_size_per_gpu({lmb}) must be at least 1")
    return r


def _rollout_tp_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    rtp, local = c.rollout_tp, cl.local_gpus
    if rtp < 1:
        return [f"rollout tp({rtp}) must be at least 1"]
    r: list[str] = []
    # verl RolloutReplica: a replica of tp*dp GPUs is whole nodes or part of one node; vLLM runs
    # TP across nodes (Ray), so tp may exceed a node
    world = rtp * c.rollout_dp
    r += _one(
        world % min(local, world) != 0 or cl.num_gpus % world != 0,
        f"rollout tp({rtp}) * dp({c.rollout_dp}) = {world} must divide the {cl.num_gpus} GPUs and "
        f"be whole {local}-GPU nodes or fit in one",
    )
    r += _one(
        m.num_attention_heads % rtp != 0,
        f"rollout tp({rtp}) does not divide the {m.num_attention_heads} heads",
    )
    # vLLM: kv heads are split when tp divides them and replicated when kv heads divide tp
    r += _one(
        m.num_kv_heads % rtp != 0 and rtp % m.num_kv_heads != 0,
        f"rollout tp({rtp}) and the {m.num_kv_heads} kv heads do not divide one another",
    )
    return r + rollout_width_problems(m, rtp, experts=c.rollout_ep <= 1)


def rollout_width_problems(m: ModelSpec, rtp: int, *, experts: bool) -> list[str]:
    """vLLM splits an MLP's inner width over the rollout's tp with `divide` (an assert; its
    Column/RowParallelLinear): the dense MLP and the shared experts always, and with `experts`
    (rollout ep 1) the routed experts too; with rollout ep > 1 each rank holds whole experts
    (FusedMoE's tp is 1 under expert parallelism)."""
    r = [
        f"rollout tp({rtp}) does not divide the {what}, {width}"
        for what, width in m.tp_split_widths
        if width % rtp
    ]
    r += _one(
        experts and m.is_moe and m.moe_ffn_hidden_size % rtp != 0,
        f"rollout tp({rtp}) does not divide the experts' width (moe_intermediate_size), "
        f"{m.moe_ffn_hidden_size}: pick a rollout tp that does, or rollout ep > 1",
    )
    return r


def _rollout_dp_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    d = c.rollout_dp
    if d < 1:
        return [f"rollout dp({d}) must be at least 1"]
    # vllm_async_server: data parallel needs gpus_per_node divisible by tp
    return _one(
        d > 1 and cl.local_gpus % c.rollout_tp != 0,
        f"rollout dp({d}) > 1 needs rollout tp({c.rollout_tp}) to divide the {cl.local_gpus} GPUs "
        "of a node",
    )


def _rollout_ep_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    e = c.rollout_ep
    # verl RolloutConfig.__post_init__: expert_parallel_size == tp * dp when > 1
    why = RolloutDims.of(c, cl.num_gpus).ep_problem
    r = _one(bool(why), why)
    r += _one(e > 1 and not m.is_moe, f"rollout ep({e}) > 1 on a dense model: set it to 1")
    r += _one(
        e > 1 and m.is_moe and m.num_experts % e != 0,
        f"rollout ep({e}) does not divide the {m.num_experts} experts",
    )
    return r


def _declared_rule(name: str) -> Callable[..., list[str]]:
    """Knob `name`'s value within what its table entry declares (`Knob.bounds`): the bounds are
    the knob's, said once."""

    def check(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
        v = getattr(c, name)
        why = knob_refusal(name, v)
        return _one(why is not None, f"{name}({v}) {why}")

    return check


def _mnbt_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    t, seq = c.max_num_batched_tokens, w.max_seq_len
    return _one(
        bool(t) and t < seq,
        f"max_num_batched_tokens({t}) is below one sample's {seq} tokens",
    )


def _layout_rule(name: str) -> Callable[..., list[str]]:
    def check(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
        return [msg for n, msg in _lay_rules(c.layout, m, cl, w) if n == name]

    return check


RULES: tuple[Rule, ...] = (
    *(Rule(n, "layout", _layout_rule(n)) for n in LAYOUT_RULE_NAMES),
    Rule("sp_needs_tp", "sequence_parallel", _sp_rule),
    Rule("moe_tp_needs_sp", "sequence_parallel", _moe_sp_rule),
    Rule(
        "recompute_granularity",
        "recompute_granularity",
        _choice_rule("recompute_granularity", RECOMPUTE_GRANULARITIES),
    ),
    Rule(
        "recompute_method", "recompute_method", _choice_rule("recompute_method", RECOMPUTE_METHODS)
    ),
    Rule("recompute_num_layers", "recompute_num_layers", _recompute_layers_rule),
    Rule("recompute_modules", "recompute_modules", _recompute_modules_rule),
    Rule(
        "attention_backend",
        "attention_backend",
        _choice_rule("attention_backend", ATTENTION_BACKENDS),
    ),
    Rule(
        "moe_token_dispatcher_type",
        "moe_token_dispatcher_type",
        _choice_rule("moe_token_dispatcher_type", MOE_DISPATCHERS),
    ),
    Rule("flex_needs_tp_ep", "moe_token_dispatcher_type", _flex_rule),
    Rule("token_budget", "ppo_max_token_len_per_gpu", _budget_rule),
    Rule("micro_batch", "ppo_micro_batch_size_per_gpu", _micro_rule),
    Rule("rollout_tp", "rollout_tp", _rollout_tp_rule),
    Rule("rollout_dp", "rollout_dp", _rollout_dp_rule),
    Rule("rollout_ep", "rollout_ep", _rollout_ep_rule),
    Rule(
        "gpu_memory_utilization", "gpu_memory_utilization", _declared_rule("gpu_memory_utilization")
    ),
    Rule("max_num_batched_tokens", "max_num_batched_tokens", _mnbt_rule),
    Rule("max_num_seqs", "max_num_seqs", _declared_rule("max_num_seqs")),
)


def broken_rules(
    c: Candidate,
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    rules: Sequence[Rule] = RULES,
) -> list[tuple[str, str]]:
    """(rule name, sentence) of every rule the candidate breaks: of `RULES`, or of a runner's
    `RULES + its own rules`. A split candidate (rollout_gpus > 0) is checked pool by pool: the
    rollout knobs' rules on the rollout's r GPUs, the others on the trainer's N - r."""
    try:
        p = pools(c.rollout_gpus, cluster)
    except ValueError as e:
        return [("placement", str(e))]
    return [
        (rule.name, msg)
        for rule in rules
        for msg in rule.check(
            c, model, p.rollout if rule.knob in ROLLOUT_POOL_KNOBS else p.trainer, workload
        )
    ]


ROLLOUT_POOL_KNOBS = frozenset(
    (
        "rollout_tp",
        "rollout_dp",
        "rollout_ep",
        "gpu_memory_utilization",
        "max_num_batched_tokens",
        "max_num_seqs",
    )
)
"""The knobs of vLLM, whose rules a split candidate checks on the rollout's pool."""


def validate(c: Candidate, model: ModelSpec, cluster: Cluster, workload: Workload) -> list[str]:
    """Reasons the candidate cannot run; an empty list means valid."""
    return [msg for _, msg in broken_rules(c, model, cluster, workload)]


def check_candidate(c: Candidate, model: ModelSpec, cluster: Cluster, workload: Workload) -> None:
    """Raise one UserError line naming every broken rule (what `tune estimate --layout` shows)."""
    broken = broken_rules(c, model, cluster, workload)
    if broken:
        raise UserError(
            f"layout {c.layout.spec}: " + "; ".join(f"[{n}] {msg}" for n, msg in broken)
        )
