"""The knob table: every knob declared once (`KNOBS`).

Each `Knob` names its Candidate field, its group, the choices the sampler offers (derived from
the model, cluster, workload and the values drawn before it: choices.py), its bounds (the rules
of rules.py are named after their knob and read the bounds from here), the verl keys it sets
and verl 0.9.1's default at them (`verl_default`, and why the Candidate's default differs
where it does), the key and type of the megatron worker's spec that carries it
(`WorkerKey`) or the value that worker always runs (`worker_runs`; with its te layers:
`te_runs`; in the pins' stored order: `pin_rank`), the vLLM engine argument of
measured generation (`vllm`), and the term of the cost model that scores it. `sample()`,
`params_for()`, `knob_overrides()` (hence the recipes and the verl runner), `worker_values()` (the
megatron runner's worker spec, which the worker reads by the same keys and types: `WORKER_KEYS`),
the megatron runner's pins (megatron.MEGATRON_PINNED) and what its measured generation searches
(megatron_generation.ROLLOUT_SEARCHED), `validate()`, the CSV columns and their types
(candidate.KNOB_COLUMN_TYPES) and the report's knob groups (`KNOB_GROUP_OF`) all read that table;
adding a knob is one entry here and its Candidate field, plus its cost-model term (the cost
model's memo keys a term by the fields it reads: estimate/memo.py), and no verl key belongs to
two knobs (`check_verl_keys`) (torchtitan's parallel_dims / Optuna's distributions: one
declaration, many readers).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from typing import Any

from tuner.bounds import Bounds
from tuner.models import ModelSpec
from tuner.space.candidate import (
    ATTENTION_BACKEND_CHOICES,
    ATTENTION_BACKENDS,
    ENFORCE_EAGER_CHOICES,
    LAYOUT_FIELDS,
    MAX_NUM_SEQS_CHOICES,
    MOE_DISPATCHERS,
    RECOMPUTE_GRANULARITIES,
    RECOMPUTE_METHODS,
    Candidate,
)
from tuner.space.choices import (
    BATCHED_TOKEN_FACTORS,
    BOOLS,
    GPU_MEMORY_UTILIZATIONS,
    LOG_PROB_BUDGET_FACTORS,
    MAX_MICRO_BATCH_LOG2,
    TOKEN_BUDGET_FACTORS,
    Choices,
    Drawn,
    SpaceView,
    budget_fields,
    dispatcher_choices,
    grouped_gemm_choices,
    log2,
    micro_choices,
    modules_choices,
    moe_space,
    nearest,
    nlayers_choices,
    pow2,
    rollout_dp_choices,
    rollout_ep_choices,
    sp_choices,
)
from tuner.space.layout import ParallelLayout
from tuner.space.worker_key import WorkerKey

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
TF_CONFIG = "megatron.override_transformer_config"


KNOB_GROUP_ORDER = ("layout", "pipeline", "memory", "batching", "rollout", "kernels")
"""The knobs' groups (`Knob.group`), in the order the report shows them."""


REACH_PARTS = (
    "generation",
    "sync",
    "update",
    "log_prob",
    "generation_device",
    "update_device",
    "log_prob_device",
)
"""The parts of the cost model's colocated step a knob can change (`Knob.reaches`): the time of
generation, of the weight sync, of the update and of the log-prob passes, and the device total
of the generation, update and log-prob phases (runner_memory.memory_view's)."""
TRAINING_REACH = ("update", "log_prob", "update_device", "log_prob_device")
"""A training knob's reach: both training passes' time and device totals."""
STEP_REACH = REACH_PARTS
"""The placement's reach: every part."""
LAYOUT_REACH = tuple(part for part in REACH_PARTS if part != "generation")
"""The actor's layout's reach (and param offload's): every part but generation's time (vLLM's
own layout is the rollout knobs')."""


class Undeclared(enum.Enum):
    """The type of `UNDECLARED` (one value, so that None stays verl's `null`)."""

    UNDECLARED = "undeclared"

    def __repr__(self) -> str:
        return "UNDECLARED"


UNDECLARED = Undeclared.UNDECLARED
"""`Knob.verl_default` of a knob whose key verl 0.9.1 does not declare (a `+` key: the library
behind it, megatron-core's TransformerConfig, decides) or that sets no verl key."""


class AsCandidate(enum.Enum):
    """The type of `AS_CANDIDATE`."""

    AS_CANDIDATE = "as the candidate"

    def __repr__(self) -> str:
        return "AS_CANDIDATE"


AS_CANDIDATE = AsCandidate.AS_CANDIDATE
"""`Knob.te_runs` of a knob the megatron runner's te layers run as the candidate says."""


def _identity(v: Any, *_: Any) -> Any:
    return v


def _always(c: Candidate, m: ModelSpec | None) -> bool:
    return True


def _null_if_one(v: Any) -> Any:
    return None if v == 1 else v


def _null_if_zero(v: Any) -> Any:
    return None if v == 0 else v


def _module_list(v: Any) -> list[str]:
    """The comma-joined recompute modules as the list verl and the worker take."""
    return [x for x in str(v).split(",") if x]


@dataclass(frozen=True, slots=True, kw_only=True)
class Knob:
    """One tuner knob, declared once: what it is, what the sampler offers, what verl key it sets
    and verl's default there, what the megatron worker calls it (or runs instead), what vLLM
    calls it and what the cost model reads."""

    name: str
    """Candidate field (or ParallelLayout field; `layout` is the layout itself)."""
    help: str
    """One line for docs and `tune show`."""
    group: str
    """What it is about (KNOB_GROUP_ORDER): the report shows the knobs by group."""
    verl_keys: tuple[str, ...] = ()
    """Full dotted keys (actor and ref get the same value); a leading `+` adds a key verl's
    schema leaves open. Empty only for `layout` (its degrees are knobs of their own) and
    `rollout_gpus` (a split sets the entry point and the pools: verl_command.split_overrides)."""
    verl_default: Any = UNDECLARED
    """What verl 0.9.1's own config (`ppo_megatron_trainer`, composed) holds at the first of
    `verl_keys`, as verl holds it: null is None, a list is a tuple here. What a verl run gets
    where the recipe leaves the key out (the recipe writes each knob whenever `when` holds).
    UNDECLARED for a `+` key (verl leaves it open) and for a knob without verl keys.
    tests/test_knob_table.py composes verl's config and checks each."""
    default_differs: str = ""
    """Why the Candidate field's default, as verl takes it (`to_verl`), is not `verl_default`;
    empty where they agree (the same test checks both ways)."""
    worker: WorkerKey | None = None
    """Where the megatron worker's spec carries it. None where the worker takes no value of it:
    the rollout knobs (generation is not the worker's), the layout's degrees (the spec's `layout`
    is the whole ParallelLayout: its world and LAYOUT_FIELDS) and the kernels the worker always
    runs its own way (`worker_runs`)."""
    worker_runs: Any = None
    """The value the megatron runner's worker runs in megatron-core's local layers whatever the
    candidate says (no transformer-engine or apex there: local layers, flash kernels,
    grouped-GEMM experts, alltoall dispatch), so that runner pins the knob at it
    (megatron.MEGATRON_PINNED; its te layers make some of them: megatron_layers.TE_MEASURED).
    None where the worker runs the candidate's value or takes none of it."""
    pin_rank: int | None = None
    """Where the megatron runner's pin of it at `worker_runs` stands among that runner's kernel
    pins: the order stored study fingerprints (SpaceLimits.summary) and the committed recipes'
    pinned blocks spell, from when the pins were a hand list. None: after those, in table
    order."""
    te_runs: Any = None
    """What the megatron runner's worker runs with the te layers (megatron_layers.layer_spec_pins)
    instead of `worker_runs`: AS_CANDIDATE where those layers make the knob as the candidate says
    (then searched: megatron_layers.TE_MEASURED), another value where they pin it at that value
    (megatron_layers.TE_PINS); None where they run `worker_runs` too."""
    vllm: str = ""
    """The vLLM engine argument (`vllm.LLM(**kwargs)`, vllm_gen.EngineCfg's field) that carries
    it where the megatron runner measures generation, which then searches it
    (megatron_generation.ROLLOUT_SEARCHED); empty where that one engine takes none of it (rollout
    DP and EP: one offline engine of data parallel 1)."""
    cost: str
    """The cost-model term that scores it (tuner/estimate), or `neutral prior: <why>` where no
    model exists yet and the measured runner decides."""
    reaches: tuple[str, ...] = TRAINING_REACH
    """The parts of the cost model's step it changes (REACH_PARTS); every other part is the same
    whatever its value. The exact search (tuner/study/exact.py) takes each part's knobs from
    here, and tests/test_exact_search.py holds the cost model to it."""
    fastest: Any = UNDECLARED
    """A value that makes no part of the cost model's step slower, whatever the other knobs
    (memory is not ordered by it): the exact search's bounds. UNDECLARED where none does."""
    alike: tuple[Any, ...] = ()
    """Values the cost model scores exactly alike (a neutral prior's): the exact search
    searches the first the space offers. Empty where it tells them apart."""
    joint: str = ""
    """The name of a group of knobs whose settings the device totals read only through one key
    (exact.JOINT_KEYS: the three fusions, through the fused activation and whether all three
    are off); empty where they read the knob itself."""
    choices: Choices | None = None
    """Sampler values valid given what was drawn before (None: not sampled, the default or the
    layout's value stands; one value: fixed, not suggested)."""
    old_param: str = ""
    """The name the sampler's parameter had before each knob had one name (`rollout_dp_log2`):
    what older Optuna storages hold; read back under the knob's name (sampling.current_params)."""
    int_range: bool = False
    """The choices are a contiguous int range drawn with suggest_int."""
    decode: Callable[[Any, SpaceView, Drawn], Any] = _identity
    """Drawn value -> the knob's value. The sampler suggests each knob under its name; where
    the draw is not the value itself (log2 of a power of two, a budget's multiple of one
    sample's tokens, rollout EP on or off) Optuna's parameter holds the draw."""
    encode: Callable[[Any, SpaceView, Drawn], Any] = _identity
    """The knob's value -> its draw (params_for, and a pin: SpaceLimits.pinned holds values)."""
    to_verl: Callable[[Any], Any] = _identity
    """Value as verl wants it; None becomes `null`."""
    when: Callable[[Candidate, ModelSpec | None], bool] = _always
    """Whether the keys are emitted (e.g. recompute keys only when on, MoE keys on MoE models)."""
    bounds: Bounds | None = None
    """The numbers verl (or vLLM, megatron-core) takes for it, whatever the sampler offers: a
    CSV cell, `tune export` and the options that set it (tune estimate) are checked here."""
    allowed: tuple[Any, ...] = ()
    """The names verl (megatron-core) takes for it (empty: not a name); as `bounds`."""

    def __post_init__(self) -> None:
        unknown = [part for part in self.reaches if part not in REACH_PARTS]
        if unknown:
            raise ValueError(
                f"knob {self.name}: reaches {unknown}, which are not parts of the step: "
                + ", ".join(REACH_PARTS)
            )
        if self.alike and self.fastest is not UNDECLARED:
            raise ValueError(
                f"knob {self.name}: values scored alike have no fastest: give alike or fastest"
            )
        if self.group not in KNOB_GROUP_ORDER:
            raise ValueError(
                f"knob {self.name}: group {self.group!r} is not one of "
                + ", ".join(KNOB_GROUP_ORDER)
            )
        open_key = not self.verl_keys or self.verl_keys[0].startswith("+")
        if open_key and self.verl_default is not UNDECLARED:
            raise ValueError(
                f"knob {self.name}: verl_default {self.verl_default!r} given, but verl declares "
                "no key of it (a `+` key or none): leave verl_default out"
            )
        if self.default_differs and self.verl_default is UNDECLARED:
            raise ValueError(
                f"knob {self.name}: default_differs says why it differs from verl's default, "
                "but the knob has none (verl_default is UNDECLARED): leave it out"
            )

    @property
    def field_default(self) -> Any:
        """The default of its Candidate field (of the ParallelLayout field for the layout's
        degrees and pipeline split); dataclasses.MISSING for `layout`."""
        if self.name in LAYOUT_FIELDS:
            return ParallelLayout.__dataclass_fields__[self.name].default
        f = Candidate.__dataclass_fields__.get(self.name)
        return MISSING if f is None else f.default

    def value(self, c: Candidate) -> Any:
        if self.name == "layout":
            return c.layout
        if self.name in LAYOUT_FIELDS:
            return getattr(c.layout, self.name)
        return getattr(c, self.name)


def check_verl_keys(knobs: tuple[Knob, ...]) -> None:
    """Raise ValueError where two knobs (or one knob twice) set the same verl key (its `+`
    dropped): the later would run while the row credits the earlier. The command's other
    sources (workload, trainer, placement) are checked against the knobs where the command is
    put together (verl_command.set_once)."""
    by: dict[str, str] = {}
    for k in knobs:
        for key in k.verl_keys:
            bare = key.lstrip("+")
            if bare in by:
                raise ValueError(
                    f"knob {k.name}: verl key {bare} is already the knob {by[bare]}'s: a verl key "
                    "belongs to one knob"
                )
            by[bare] = k.name


def _both(suffix: str) -> tuple[str, ...]:
    return (f"{ACTOR}.{suffix}", f"{REF}.{suffix}")


def _tf(key: str, declared: bool = False) -> tuple[str, ...]:
    """An override_transformer_config key of the actor (the ref's follows it by interpolation);
    `+` unless verl declares the key."""
    return (("" if declared else "+") + f"{ACTOR}.{TF_CONFIG}.{key}",)


def _moe(c: Candidate, m: ModelSpec | None) -> bool:
    return m is not None and m.is_moe


_TOKEN_BUDGET = Bounds(low=0, high=2**24, unit="tokens per GPU (0: off)")
_MICRO_BATCH = Bounds(low=1, high=2**16, unit="samples")
_ROLLOUT_DEGREE = Bounds(low=1, high=65536, why="the most GPUs any one job runs on")

# verl_default: verl 0.9.1's trainer/config (the installed package's): engine/megatron.yaml for
# the megatron.* keys and the override_transformer_config keys it declares, actor/actor.yaml,
# model/hf_model.yaml and rollout/rollout.yaml; the ref's keys and the rollout's log-prob keys
# follow the actor's by interpolation (ref/megatron_ref.yaml, ref/ref.yaml, rollout/rollout.yaml),
# so each knob's keys share one default.
KNOBS: tuple[Knob, ...] = (
    Knob(
        name="rollout_gpus",
        reaches=STEP_REACH,
        group="layout",
        help="placement: 0 colocated; r: vLLM on r GPUs of its own, one step off-policy",
        cost="time: a split step is max(generation on r, training on N - r) + weight sync "
        "(estimate._split_estimate); memory: each pool on its own (no vLLM beside the actor)",
        choices=lambda s, d: s.placements if s.allow_off_policy else None,
        bounds=Bounds(low=0, high=65535, unit="GPUs for the rollout (0: colocated)"),
    ),
    Knob(
        name="layout",
        reaches=LAYOUT_REACH,
        group="layout",
        help="actor/ref parallel layout (degrees below)",
        cost="time: every training phase (_layout_lin, phase_times_of); memory: every shard",
        choices=lambda s, d: sorted(s.layouts_of(d)),
        decode=lambda v, s, d: s.layouts_of(d)[v],
        encode=lambda lay, s, d: lay.notation,
    ),
    Knob(
        name="tp",
        reaches=LAYOUT_REACH,
        group="layout",
        help="tensor parallel",
        verl_keys=_both("megatron.tensor_model_parallel_size"),
        verl_default=1,
        cost="time: _layout_lin(tp)",
    ),
    Knob(
        name="pp",
        reaches=LAYOUT_REACH,
        group="layout",
        help="pipeline parallel",
        verl_keys=_both("megatron.pipeline_model_parallel_size"),
        verl_default=1,
        cost="time: pipeline bubble and p2p (phase_times_of)",
    ),
    Knob(
        name="vpp",
        reaches=LAYOUT_REACH,
        group="layout",
        help="virtual pipeline stages (null = off)",
        verl_keys=_both("megatron.virtual_pipeline_model_parallel_size"),
        verl_default=None,
        cost="time: bubble / vpp",
        to_verl=_null_if_one,
    ),
    Knob(
        name="first_stage_layers",
        reaches=LAYOUT_REACH,
        group="pipeline",
        help="layers of the first pipeline stage (0 = even split)",
        verl_keys=_tf("num_layers_in_first_pipeline_stage"),
        cost="time: the slowest stage's layers (phase_times_of)",
        to_verl=_null_if_zero,
        when=lambda c, m: c.layout.first_stage_layers > 0,
    ),
    Knob(
        name="last_stage_layers",
        reaches=LAYOUT_REACH,
        group="pipeline",
        help="layers of the last pipeline stage (0 = even split)",
        verl_keys=_tf("num_layers_in_last_pipeline_stage"),
        cost="time: the slowest stage's layers (phase_times_of)",
        to_verl=_null_if_zero,
        when=lambda c, m: c.layout.last_stage_layers > 0,
    ),
    Knob(
        name="cp",
        reaches=LAYOUT_REACH,
        group="layout",
        help="context parallel",
        verl_keys=_both("megatron.context_parallel_size"),
        verl_default=1,
        cost="time: _layout_lin(cp) ring exchange",
    ),
    Knob(
        name="ep",
        reaches=LAYOUT_REACH,
        group="layout",
        help="expert parallel",
        verl_keys=_both("megatron.expert_model_parallel_size"),
        verl_default=1,
        cost="time: _layout_lin(ep) all-to-all",
    ),
    Knob(
        name="etp",
        reaches=LAYOUT_REACH,
        group="layout",
        help="expert tensor parallel",
        verl_keys=_both("megatron.expert_tensor_parallel_size"),
        verl_default=None,
        default_differs="verl's null is `as tp` in megatron-core (parallel_state."
        "initialize_model_parallel); the layout's 1 is expert tensor parallel off",
        cost="time: _layout_lin(etp)",
    ),
    Knob(
        name="sequence_parallel",
        group="memory",
        help="sequence parallel",
        verl_keys=_both("megatron.sequence_parallel"),
        verl_default=True,
        default_differs="verl turns its True off at tp 1 (workers/config/engine.py "
        "McoreEngineConfig); the field's False is what tp 1 runs, and the sampler draws it where "
        "tp > 1 (choices.sp_choices)",
        worker=WorkerKey("sequence_parallel", bool),
        cost="time: _layout_lin(sp) collectives; memory: activations / tp",
        choices=sp_choices,
    ),
    Knob(
        name="moe_token_dispatcher_type",
        reaches=("update", "log_prob"),
        alike=("alltoall", "flex"),
        group="kernels",
        help="MoE token dispatcher",
        verl_keys=_tf("moe_token_dispatcher_type"),
        worker_runs="alltoall",
        pin_rank=4,
        cost="time: _layout_lin dispatch (allgather volume); flex vs alltoall is a neutral prior",
        choices=dispatcher_choices,
        allowed=MOE_DISPATCHERS,
        when=_moe,
    ),
    Knob(
        name="moe_permute_fusion",
        reaches=("update", "log_prob"),
        fastest=True,
        group="kernels",
        help="MoE fused permute",
        verl_keys=_tf("moe_permute_fusion"),
        worker_runs=False,
        pin_rank=6,
        te_runs=AS_CANDIDATE,
        worker=WorkerKey("kernels.moe_permute_fusion", bool),
        cost="time: _layout_lin permute passes",
        choices=moe_space(BOOLS),
        when=_moe,
    ),
    Knob(
        name="recompute_granularity",
        reaches=("update", "update_device", "log_prob_device"),
        fastest="none",
        group="memory",
        help="activation recompute granularity",
        verl_keys=_tf("recompute_granularity", declared=True),
        verl_default=None,
        worker=WorkerKey("recompute.granularity", str),
        cost="time: recompute term (phase_times_of); memory: kept activations",
        choices=lambda s, d: list(RECOMPUTE_GRANULARITIES),
        allowed=RECOMPUTE_GRANULARITIES,
        to_verl=lambda v: None if v == "none" else v,  # megatron-core: None = no recompute
    ),
    Knob(
        name="recompute_method",
        reaches=("update", "update_device", "log_prob_device"),
        fastest="block",
        group="memory",
        help="full recompute method",
        verl_keys=_tf("recompute_method", declared=True),
        verl_default=None,
        default_differs="written only with full recompute (`when`), which megatron-core refuses "
        "without a method (transformer_config.py); verl's null goes with its null granularity",
        worker=WorkerKey("recompute.method", str),
        cost="time: recompute fraction (block)",
        choices=lambda s, d: (
            list(RECOMPUTE_METHODS) if d["recompute_granularity"] == "full" else None
        ),
        allowed=RECOMPUTE_METHODS,
        when=lambda c, m: c.recompute_granularity == "full",
    ),
    Knob(
        name="recompute_num_layers",
        reaches=("update", "update_device", "log_prob_device"),
        fastest=1,
        group="memory",
        help="full recompute layers",
        verl_keys=_tf("recompute_num_layers", declared=True),
        verl_default=None,
        default_differs="written only with full recompute (`when`), which megatron-core refuses "
        "without a layer count (transformer_config.py); verl's null goes with its null granularity",
        worker=WorkerKey("recompute.num_layers", int, off=0),
        cost="time: recompute fraction (block)",
        choices=nlayers_choices,
        int_range=True,
        when=lambda c, m: c.recompute_granularity == "full",
    ),
    Knob(
        name="recompute_modules",
        reaches=("update", "update_device", "log_prob_device"),
        group="memory",
        help="selective recompute modules",
        verl_keys=_tf("recompute_modules", declared=True),
        verl_default=("core_attn",),
        worker=WorkerKey("recompute.modules", list, to_worker=_module_list),
        cost="time: forward of each listed module repeated (_Lin.*_fwd_slope)",
        choices=modules_choices,
        to_verl=_module_list,
        when=lambda c, m: c.recompute_granularity == "selective",
    ),
    Knob(
        name="moe_grouped_gemm",
        reaches=("update", "log_prob"),
        group="kernels",
        help="MoE grouped GEMM",
        verl_keys=_tf("moe_grouped_gemm"),
        worker_runs=True,
        pin_rank=5,
        te_runs=AS_CANDIDATE,
        worker=WorkerKey("kernels.moe_grouped_gemm", bool),
        cost="time: _layout_lin per-expert GEMM launches when off",
        choices=grouped_gemm_choices,
        when=_moe,
    ),
    Knob(
        name="param_offload",
        reaches=LAYOUT_REACH,  # the weights' home: the sync, both passes, every device total
        fastest=False,
        group="memory",
        help="offload parameters and gradients",
        verl_keys=_both("megatron.param_offload"),
        verl_default=False,
        worker=WorkerKey("offload.param", bool),
        cost="time: PCIe copies of weights and grads; memory: weights and grads leave the GPU",
        choices=lambda s, d: [False, True],
    ),
    Knob(
        name="optimizer_offload",
        reaches=("update", "generation_device", "update_device", "log_prob_device"),
        fastest=False,
        group="memory",
        help="offload optimizer",
        verl_keys=(f"{ACTOR}.megatron.optimizer_offload",),
        verl_default=False,
        worker=WorkerKey("offload.optimizer", bool),
        cost="time: PCIe copies of the optimizer shard; memory: optimizer leaves the GPU",
        choices=lambda s, d: [False, True],
    ),
    Knob(
        name="use_fused_kernels",
        fastest=True,
        group="kernels",
        help="verl fused log-prob kernels",
        verl_keys=("actor_rollout_ref.model.use_fused_kernels",),
        verl_default=False,  # trainer/config/model/hf_model.yaml
        default_differs="the tuner's starting value (the sampler draws both): verl's unfused "
        "log-prob path holds the full-vocabulary logits",
        worker=WorkerKey("use_fused_kernels", bool),
        cost="time: _logits_slope; memory: logits",
        choices=lambda s, d: [True, False],
    ),
    Knob(
        name="apply_rope_fusion",
        fastest=True,
        joint="fusions",
        group="kernels",
        help="fused RoPE",
        verl_keys=_tf("apply_rope_fusion"),
        worker_runs=False,
        pin_rank=0,
        te_runs=AS_CANDIDATE,
        worker=WorkerKey("kernels.apply_rope_fusion", bool),
        cost="time: _layout_lin elementwise passes over q and k",
        choices=lambda s, d: list(BOOLS),
    ),
    Knob(
        name="bias_activation_fusion",
        fastest=True,
        joint="fusions",
        group="kernels",
        help="fused bias + SwiGLU",
        verl_keys=_tf("bias_activation_fusion"),
        worker_runs=False,
        pin_rank=1,
        te_runs=AS_CANDIDATE,
        worker=WorkerKey("kernels.bias_activation_fusion", bool),
        cost="time: _layout_lin elementwise passes over the MLP activation",
        choices=lambda s, d: list(BOOLS),
    ),
    Knob(
        name="masked_softmax_fusion",
        group="kernels",
        help="fused masked softmax (unfused attention backend only)",
        verl_keys=_tf("masked_softmax_fusion"),
        cost="time: score-matrix passes of the unfused/local backend; neutral under flash/fused",
        choices=lambda s, d: None,
    ),
    Knob(
        name="gradient_accumulation_fusion",
        reaches=("update", "update_device", "log_prob_device"),
        fastest=True,
        joint="fusions",
        group="kernels",
        help="wgrad accumulated in the GEMM",
        verl_keys=_tf("gradient_accumulation_fusion"),
        worker_runs=False,
        pin_rank=2,
        cost="time: _layout_lin backward fp32 main-grad read/write",
        choices=lambda s, d: list(BOOLS),
    ),
    Knob(
        name="attention_backend",
        reaches=("update", "log_prob"),
        alike=("flash", "fused", "auto"),
        group="kernels",
        help="megatron attention backend",
        verl_keys=_tf("attention_backend", declared=True),
        verl_default="flash",
        worker_runs="flash",
        pin_rank=3,
        te_runs="auto",
        worker=WorkerKey("kernels.attention_backend", str),
        cost="neutral prior: flash, fused and auto score alike (no measured model yet, the "
        "measured runner decides); unfused/local: score-matrix cost in _layout_lin",
        choices=lambda s, d: list(ATTENTION_BACKEND_CHOICES),
        allowed=ATTENTION_BACKENDS,
    ),
    Knob(
        name="use_dynamic_bsz",
        group="batching",
        help="dynamic batch size",
        verl_keys=(
            f"{ACTOR}.use_dynamic_bsz",
            f"{REF}.log_prob_use_dynamic_bsz",
            f"{ROLLOUT}.log_prob_use_dynamic_bsz",
        ),
        verl_default=False,  # trainer/config/actor/actor.yaml
        default_differs="the tuner's starting value (the sampler draws both): micro-batches "
        "packed by tokens suit RL's varied response lengths",
        worker=WorkerKey("batch.use_dynamic_bsz", bool),
        cost="time and memory: micro-batch count and size (estimate/micro_batches.py)",
        choices=lambda s, d: [True, False],
    ),
    Knob(
        name="ppo_max_token_len_per_gpu",
        reaches=("update", "update_device"),
        group="batching",
        help="actor tokens per micro-batch per GPU",
        verl_keys=(f"{ACTOR}.ppo_max_token_len_per_gpu",),
        verl_default=16384,
        default_differs="0 is unset: a drawn candidate's budget is a multiple of one sample's "
        "tokens (choices.TOKEN_BUDGET_FACTORS), as the workload sizes it",
        worker=WorkerKey("batch.max_token_len_per_gpu", int, off=0),
        cost="time: update micro-batches; memory: activations",
        old_param="ppo_max_token_len_factor",
        bounds=_TOKEN_BUDGET,
        when=lambda c, m: c.use_dynamic_bsz,
        **budget_fields(TOKEN_BUDGET_FACTORS),
    ),
    Knob(
        name="log_prob_max_token_len_per_gpu",
        reaches=("log_prob", "log_prob_device"),
        group="batching",
        help="log-prob tokens per micro-batch per GPU",
        verl_keys=(
            f"{REF}.log_prob_max_token_len_per_gpu",
            f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
        ),
        verl_default=16384,  # ref/ref.yaml: the actor's ppo_max_token_len_per_gpu
        default_differs="0 is unset: a drawn candidate's budget is a multiple of one sample's "
        "tokens (choices.LOG_PROB_BUDGET_FACTORS), as the workload sizes it",
        worker=WorkerKey("batch.log_prob_max_token_len_per_gpu", int, off=0),
        cost="time: log-prob micro-batches; memory: log-prob activations",
        old_param="log_prob_max_token_len_factor",
        bounds=_TOKEN_BUDGET,
        when=lambda c, m: c.use_dynamic_bsz,
        **budget_fields(LOG_PROB_BUDGET_FACTORS),
    ),
    Knob(
        name="ppo_micro_batch_size_per_gpu",
        reaches=("update", "update_device"),
        group="batching",
        help="actor samples per micro-batch per GPU",
        verl_keys=(f"{ACTOR}.ppo_micro_batch_size_per_gpu",),
        verl_default=None,
        default_differs="written only without dynamic batching (`when`), which needs a number of "
        "samples; 1 is the least",
        worker=WorkerKey("batch.micro_batch_size_per_gpu", int, off=0),
        cost="time: update micro-batches; memory: activations",
        old_param="ppo_micro_batch_log2",
        bounds=_MICRO_BATCH,
        choices=micro_choices,
        int_range=True,
        decode=pow2,
        encode=log2,
        when=lambda c, m: not c.use_dynamic_bsz,
    ),
    Knob(
        name="log_prob_micro_batch_size_per_gpu",
        reaches=("log_prob", "log_prob_device"),
        group="batching",
        help="log-prob samples per micro-batch per GPU",
        verl_keys=(
            f"{REF}.log_prob_micro_batch_size_per_gpu",
            f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",
        ),
        verl_default=None,
        default_differs="written only without dynamic batching (`when`), which needs a number of "
        "samples; 1 is the least",
        worker=WorkerKey("batch.log_prob_micro_batch_size_per_gpu", int, off=0),
        cost="time: log-prob micro-batches; memory: log-prob activations",
        old_param="log_prob_micro_batch_log2",
        bounds=_MICRO_BATCH,
        choices=lambda s, d: (
            None if d["use_dynamic_bsz"] else list(range(0, MAX_MICRO_BATCH_LOG2 + 2))
        ),
        int_range=True,
        decode=pow2,
        encode=log2,
        when=lambda c, m: not c.use_dynamic_bsz,
    ),
    Knob(
        name="rollout_tp",
        reaches=("generation", "sync", "generation_device", "update_device", "log_prob_device"),
        group="rollout",
        help="vLLM tensor parallel (may span nodes)",
        bounds=_ROLLOUT_DEGREE,
        verl_keys=(f"{ROLLOUT}.tensor_model_parallel_size",),
        verl_default=2,
        default_differs="1 divides every model's heads and every GPU count (the megatron runner "
        "pins it there where it runs no generation); the sampler draws it "
        "(SearchSpace.rollout_tps_of)",
        vllm="tensor_parallel_size",
        cost="time: _generation engines, _decode_step_s TP all-reduce (inter-node beyond a node)",
        choices=lambda s, d: s.rollout_tps_of(d),
    ),
    Knob(
        name="rollout_dp",
        reaches=("generation", "generation_device"),
        group="rollout",
        help="vLLM data parallel inside a replica (MoE)",
        bounds=_ROLLOUT_DEGREE,
        verl_keys=(f"{ROLLOUT}.data_parallel_size",),
        verl_default=1,
        cost="time: _decode_step_s expert weights over tp*dp and their collectives",
        old_param="rollout_dp_log2",
        choices=rollout_dp_choices,
        int_range=True,
        decode=pow2,
        encode=log2,
    ),
    Knob(
        name="rollout_ep",
        reaches=("generation",),
        group="rollout",
        help="vLLM expert parallel (1 or tp*dp)",
        bounds=_ROLLOUT_DEGREE,
        verl_keys=(f"{ROLLOUT}.expert_parallel_size",),
        verl_default=1,
        cost="time: _decode_step_s all-to-all instead of expert-TP all-reduce",
        old_param="rollout_expert_parallel",
        choices=rollout_ep_choices,
        decode=lambda on, s, d: d["rollout_tp"] * d.get("rollout_dp", 1) if on else 1,
        encode=lambda v, s, d: v > 1,
    ),
    Knob(
        name="gpu_memory_utilization",
        reaches=("generation", "generation_device"),
        group="rollout",
        help="vLLM memory share",
        bounds=Bounds(low=0, high=1, low_open=True, why="a share of the GPU's memory"),
        verl_keys=(f"{ROLLOUT}.gpu_memory_utilization",),
        verl_default=0.5,
        default_differs="0.6 is what verl's Megatron GRPO example sets; it is the megatron "
        "runner's pin, which stored study fingerprints hold, so it stays",
        vllm="gpu_memory_utilization",
        cost="memory: KV cache -> time: _generation concurrency",
        choices=lambda s, d: list(GPU_MEMORY_UTILIZATIONS),
        encode=lambda v, s, d: nearest(v, GPU_MEMORY_UTILIZATIONS),
    ),
    Knob(
        name="max_num_batched_tokens",
        reaches=("generation",),
        group="rollout",
        help="vLLM tokens per scheduler step",
        bounds=Bounds(low=0, high=2**24, unit="tokens (0: prompt + response)"),
        verl_keys=(f"{ROLLOUT}.max_num_batched_tokens",),
        verl_default=8192,
        default_differs="0 is prompt + response (the cost model and measured generation read it "
        "so); a drawn candidate carries a multiple of it (choices.BATCHED_TOKEN_FACTORS)",
        vllm="max_num_batched_tokens",
        cost="time: _generation concurrency bound; memory: vLLM activations",
        old_param="max_num_batched_tokens_factor",
        choices=lambda s, d: list(BATCHED_TOKEN_FACTORS),
        decode=lambda f, s, d: s.workload.max_seq_len * int(f),
        encode=lambda v, s, d: nearest(
            (v or s.workload.max_seq_len) / s.workload.max_seq_len, BATCHED_TOKEN_FACTORS
        ),
    ),
    Knob(
        name="max_num_seqs",
        reaches=("generation",),
        group="rollout",
        help="vLLM sequences per engine at once",
        bounds=Bounds(low=1, high=2**16, unit="sequences"),
        verl_keys=(f"{ROLLOUT}.max_num_seqs",),
        verl_default=256,
        vllm="max_num_seqs",
        cost="time: _generation concurrency (busy phase steps); memory: sampler logits",
        choices=lambda s, d: list(MAX_NUM_SEQS_CHOICES),
    ),
    Knob(
        name="enforce_eager",
        reaches=("generation",),
        fastest=False,
        group="rollout",
        help="vLLM without CUDA graphs",
        verl_keys=(f"{ROLLOUT}.enforce_eager",),
        # rollout.yaml: "Default False to best performance"; verl 0.5 and older defaulted to True
        verl_default=False,
        vllm="enforce_eager",
        cost="time: _decode_step_s launch term (eager: every kernel launched from Python; "
        "graphs: one replay at the batch padded to vLLM's next capture size); memory: graph "
        "pool ignored (vLLM takes it out of the KV share)",
        choices=lambda s, d: list(ENFORCE_EAGER_CHOICES),
    ),
)
KNOB_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
check_verl_keys(KNOBS)
VERL_DEFAULT_MAX_NUM_SEQS: int = KNOB_BY_NAME["max_num_seqs"].verl_default
"""`actor_rollout_ref.rollout.max_num_seqs` in verl 0.9.1's ppo_megatron_trainer (the knob's)."""
VERL_DEFAULT_ENFORCE_EAGER: bool = KNOB_BY_NAME["enforce_eager"].verl_default
"""`actor_rollout_ref.rollout.enforce_eager` in verl 0.9.1's rollout config (the knob's);
verl releases before 2025-08-08 (0.5 and older) defaulted to True."""
KNOB_GROUP_OF: dict[str, str] = {k.name: k.group for k in KNOBS if k.name != "layout"}
"""Each knob's CSV column (the record's layout degrees, then KNOB_COLUMN_TYPES) -> its group;
the layout itself is the record's `train_parallel` column."""
NEUTRAL_PRIOR = "neutral prior"
"""Prefix of `Knob.cost` for knobs the cost model scores alike on purpose."""


def knob_overrides(c: Candidate, m: ModelSpec | None = None) -> dict[str, Any]:
    """Every verl key the candidate sets, with its value (None means null). MoE knobs are
    emitted only with a MoE `m`."""
    out: dict[str, Any] = {}
    for k in KNOBS:
        if not k.verl_keys or not k.when(c, m):
            continue
        v = k.to_verl(k.value(c))
        for key in k.verl_keys:
            out[key] = v
    return out


def knob_refusal(name: str, value: Any) -> str | None:
    """Why `value` is not one knob `name` may take (`Knob.bounds`, `Knob.allowed`): a sentence
    that gives the range or the names; None where it may (and for knobs that declare neither)."""
    k = KNOB_BY_NAME[name]
    if k.allowed and value not in k.allowed:
        return f"must be one of {', '.join(map(str, k.allowed))}, got {value!r}"
    if k.bounds is not None and isinstance(value, int | float):
        return k.bounds.refusal(value)
    return None


def candidate_refusals(c: Candidate) -> list[tuple[str, str]]:
    """(knob, why) for each knob value of `c` outside what the knob declares it may take
    (knob_refusal): what a CSV cell read back into a Candidate must pass before a study
    measures it or a recipe writes it."""
    out = []
    for k in KNOBS:
        if k.name == "layout" or not (k.bounds or k.allowed):
            continue
        why = knob_refusal(k.name, k.value(c))
        if why is not None:
            out.append((k.name, why))
    return out


WORKER_KEYS: tuple[WorkerKey, ...] = tuple(k.worker for k in KNOBS if k.worker is not None)
"""Every key of the megatron worker's spec that a knob fills, with its type (what the worker
reads them by)."""


def worker_values(c: Candidate, m: ModelSpec) -> dict[str, Any]:
    """The candidate's knobs as the megatron worker's spec carries them (`Knob.worker`), nested by
    section: `{"recompute": {"granularity": ...}, "sequence_parallel": ..., ...}`."""
    out: dict[str, Any] = {}
    for k in KNOBS:
        w = k.worker
        if w is None:
            continue
        v = w.to_worker(k.value(c)) if w.off is None or k.when(c, m) else w.off
        (out.setdefault(w.section, {}) if w.section else out)[w.name] = v
    return out
