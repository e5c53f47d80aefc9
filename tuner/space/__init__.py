"""The search space: every knob declared once, the Candidate, validate() and sample().

One table (`KNOBS`) declares each knob: its Candidate field, the choices the sampler offers
(derived from the model, cluster, workload and the values drawn before it), its validity rules,
the verl keys it sets and verl 0.9.1's default there, the key and type of the megatron worker's
spec that carries it (or the value that worker always runs), its vLLM engine argument, and the
term of the cost model that scores it. `sample()`, `params_for()`, `knob_overrides()` (hence the
recipes and the verl runner), `worker_values()` (the megatron worker's spec), the megatron
runner's pins, `validate()` and the CSV columns all read that table; adding a knob is one entry in
knobs.py plus its cost-model term (torchtitan's parallel_dims / Optuna's distributions: one
declaration, many readers).

`sample()` draws only from choices that pass `validate()`, so a candidate the sampler emits is
always valid. `validate()` still checks every rule, because candidates also come from users,
reference recipes and resumed studies. Rules are the ones megatron-core 0.19, vLLM and verl 0.9.1
enforce, no stricter; each is named (`RULES`) and its message says what to change.

Modules: `layout` (ParallelLayout), `candidate` (Candidate and the knob choices), `rules`
(validate() and RULES), `choices` (what the sampler offers each knob given what was drawn
before), `knobs` (KNOBS, knob_overrides(), worker_values()), `worker_key` (WorkerKey: a knob's key
in the megatron worker's spec) and `sampling` (SearchSpace, sample(), params_for()); every public
name is re-exported here.
"""

from tuner.space.candidate import (
    ATTENTION_BACKEND_CHOICES,
    ATTENTION_BACKENDS,
    CANDIDATE_FIELDS,
    ENFORCE_EAGER_CHOICES,
    KNOB_COLUMN_TYPES,
    MAX_NUM_SEQS_CHOICES,
    MOE_DISPATCHER_CHOICES,
    MOE_DISPATCHERS,
    RECOMPUTE_GRANULARITIES,
    RECOMPUTE_METHODS,
    RECOMPUTE_MODULE_SETS_DENSE,
    RECOMPUTE_MODULE_SETS_MOE,
    RECOMPUTE_MODULES_ALLOWED,
    Candidate,
    modules_of,
)
from tuner.space.choices import (
    BATCHED_TOKEN_FACTORS,
    BOOLS,
    CP_CHOICES,
    GPU_MEMORY_UTILIZATIONS,
    LOG_PROB_BUDGET_FACTORS,
    MAX_MICRO_BATCH_LOG2,
    MAX_PP,
    MAX_VPP,
    ROLLOUT_DP_CHOICES,
    TOKEN_BUDGET_FACTORS,
    Choices,
    Drawn,
    round_up,
)
from tuner.space.knobs import (
    ACTOR,
    KNOB_BY_NAME,
    KNOB_GROUP_OF,
    KNOB_GROUP_ORDER,
    KNOBS,
    NEUTRAL_PRIOR,
    REF,
    ROLLOUT,
    TF_CONFIG,
    UNDECLARED,
    VERL_DEFAULT_ENFORCE_EAGER,
    VERL_DEFAULT_MAX_NUM_SEQS,
    WORKER_KEYS,
    Knob,
    knob_overrides,
    worker_values,
)
from tuner.space.layout import (
    LAYOUT_DEGREES,
    LAYOUT_FIELDS,
    ParallelLayout,
    balanced_split,
)
from tuner.space.rules import (
    LAYOUT_RULE_NAMES,
    RULES,
    Rule,
    broken_rules,
    budget_factor,
    check_candidate,
    choice_problems,
    layout_model_rules,
    min_token_budget,
    recompute_layers_problems,
    sequence_parallel_problems,
    token_budget,
    token_budget_problem,
    validate,
    validate_layout,
)
from tuner.space.sampling import (
    OLD_PARAMS,
    SAMPLER_PARAMS,
    FollowSuggester,
    RandomSuggester,
    SearchSpace,
    SpaceLimits,
    Suggester,
    check_pins,
    current_fingerprint,
    current_params,
    params_for,
    sample,
    walk,
)
from tuner.space.worker_key import WorkerKey

__all__ = [
    "ACTOR",
    "ATTENTION_BACKENDS",
    "ATTENTION_BACKEND_CHOICES",
    "BATCHED_TOKEN_FACTORS",
    "BOOLS",
    "CANDIDATE_FIELDS",
    "CP_CHOICES",
    "Candidate",
    "Choices",
    "Drawn",
    "ENFORCE_EAGER_CHOICES",
    "FollowSuggester",
    "GPU_MEMORY_UTILIZATIONS",
    "KNOBS",
    "KNOB_BY_NAME",
    "KNOB_COLUMN_TYPES",
    "KNOB_GROUP_OF",
    "KNOB_GROUP_ORDER",
    "Knob",
    "LAYOUT_DEGREES",
    "LAYOUT_FIELDS",
    "LAYOUT_RULE_NAMES",
    "LOG_PROB_BUDGET_FACTORS",
    "MAX_MICRO_BATCH_LOG2",
    "MAX_NUM_SEQS_CHOICES",
    "MAX_PP",
    "MAX_VPP",
    "MOE_DISPATCHERS",
    "MOE_DISPATCHER_CHOICES",
    "NEUTRAL_PRIOR",
    "ParallelLayout",
    "RECOMPUTE_GRANULARITIES",
    "RECOMPUTE_METHODS",
    "RECOMPUTE_MODULES_ALLOWED",
    "RECOMPUTE_MODULE_SETS_DENSE",
    "RECOMPUTE_MODULE_SETS_MOE",
    "REF",
    "ROLLOUT",
    "ROLLOUT_DP_CHOICES",
    "RULES",
    "RandomSuggester",
    "OLD_PARAMS",
    "SAMPLER_PARAMS",
    "Rule",
    "SearchSpace",
    "SpaceLimits",
    "Suggester",
    "TF_CONFIG",
    "UNDECLARED",
    "TOKEN_BUDGET_FACTORS",
    "VERL_DEFAULT_ENFORCE_EAGER",
    "VERL_DEFAULT_MAX_NUM_SEQS",
    "WORKER_KEYS",
    "WorkerKey",
    "balanced_split",
    "broken_rules",
    "check_candidate",
    "check_pins",
    "current_fingerprint",
    "current_params",
    "choice_problems",
    "knob_overrides",
    "layout_model_rules",
    "budget_factor",
    "min_token_budget",
    "modules_of",
    "params_for",
    "walk",
    "recompute_layers_problems",
    "round_up",
    "sample",
    "sequence_parallel_problems",
    "token_budget",
    "token_budget_problem",
    "validate",
    "validate_layout",
    "worker_values",
]
