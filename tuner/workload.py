"""The RL workload one training step does: algorithm, batch, responses per prompt, lengths."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from tuner.bounds import Bounds
from tuner.errors import UserError
from tuner.lengths import DEFAULT_CLIP_FRACTION, ResponseLengths

ALGORITHMS = ("grpo", "dapo", "ppo")

DEFAULT_RESPONSE_MEAN_FRACTION = 0.15
"""Mean response length over the maximum when --response-mean is not given.

Tuning runs measure the first steps of training (the reference leaderboards report the 3rd step),
when the policy is still close to its base model. Base and instruct models of the 7B-30B class
answer competition-math prompts (DAPO-Math-17k, MATH, GSM8K) in roughly 1k-1.5k tokens at the
start of DAPO/GRPO training; response length then grows slowly over hundreds to thousands of
steps (the DAPO paper's length curve; verl's published DAPO and GRPO logs). With the usual 8k cap
that is about 15% of the maximum; a few responses still run into the cap, which the generation
model's long tail accounts for. This is a public-knowledge prior, not a fit to any reference row:
set --response-mean to your own run's `response_length/mean` whenever you know it."""

DEFAULT_PROMPT_MEAN_FRACTION = 0.1
"""Mean prompt length over `max_prompt_length` when --prompt-mean is not given.

verl left-pads prompts to the cap in its batch tensors, but vLLM sees the unpadded prompt and the
Megatron actor packs sequences without padding (THD), so compute and KV cache scale with the real
prompt. Math prompts with their chat template and instruction are 100-300 tokens (DAPO-Math-17k,
GSM8K, MATH) against the usual 2k cap: about 10%."""

EXPERT_IMBALANCE = Bounds(
    low=1, high=64, why="1: a balanced router; 64: one expert with 64 times its share"
)
"""`--expert-imbalance`: the busiest routed expert's tokens over the mean expert's, as verl
0.9.1's rollout MoE load-balance metric `rollout/moe/max_vio/avg` plus 1 (metric_utils.py
`_compute_rollout_moe_load_balance_metrics_from_counts`: max over experts of load * E / total
- 1). A model's own ceiling, every token on the same top-k experts, is experts / top-k; the
study refuses a value above it (tuner.cli_request.build_setup)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """One RL step of verl's trainer."""

    name: str = "custom"
    """Preset this came from, for the study name and the CSV."""
    algorithm: str = "dapo"
    """grpo, dapo or ppo (ppo adds a critic)."""
    prompt_len: int = 2048
    """`data.max_prompt_length` in tokens."""
    response_len: int = 8192
    """`data.max_response_length` in tokens."""
    response_mean: int = 0
    """Mean generated length in tokens; 0 means DEFAULT_RESPONSE_MEAN_FRACTION of the max."""
    prompt_mean: int = 0
    """Mean prompt length in tokens (unpadded); 0 means DEFAULT_PROMPT_MEAN_FRACTION of the max."""
    response_clip_fraction: float = -1.0
    """Share of responses truncated at the cap (verl's `response_length/clip_ratio`); negative
    means tuner.lengths.DEFAULT_CLIP_FRACTION."""
    batch_size: int = 512
    """`data.train_batch_size`: prompts per step."""
    n: int = 16
    """`actor_rollout_ref.rollout.n`: responses per prompt."""
    mini_batch_size: int = 32
    """`actor_rollout_ref.actor.ppo_mini_batch_size`, in prompts."""
    expert_imbalance: float = 1.0
    """MoE routing: the busiest expert's routed tokens over the mean expert's
    (EXPERT_IMBALANCE). A random router, as the studies' random-weight models have, is near 1;
    a trained one is not. 1.0, the default, is what the cost model assumed before it had this
    setting (every expert-parallel rank routes the same tokens); the cost model prices the
    busiest expert-parallel rank's expert GEMMs with it (tuner.estimate.time). Dense models
    ignore it."""

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise UserError(f"unknown algorithm {self.algorithm!r}: use one of {ALGORITHMS}")
        for f in ("prompt_len", "response_len", "batch_size", "n", "mini_batch_size"):
            if getattr(self, f) <= 0:
                raise UserError(f"workload {f} must be positive, got {getattr(self, f)}")
        if self.response_mean < 0 or self.response_mean > self.response_len:
            raise UserError(
                f"--response-mean {self.response_mean} must lie in 0..--response-len "
                f"({self.response_len})"
            )
        if self.prompt_mean < 0 or self.prompt_mean > self.prompt_len:
            raise UserError(
                f"--prompt-mean {self.prompt_mean} must lie in 0..--prompt-len ({self.prompt_len})"
            )
        if not self.response_clip_fraction < 1:
            raise UserError(
                f"response clip fraction {self.response_clip_fraction} must be below 1 (a share "
                "of the responses)"
            )
        why = EXPERT_IMBALANCE.refusal(self.expert_imbalance)
        if why is not None:
            raise UserError(
                f"--expert-imbalance {why}: give the busiest expert's load over the mean"
            )
        if self.batch_size % self.mini_batch_size:
            raise UserError(
                f"--batch {self.batch_size} is not a multiple of --mini-batch "
                f"{self.mini_batch_size}: pick a mini batch that divides the batch"
            )

    @property
    def max_seq_len(self) -> int:
        """Longest sample: prompt plus response."""
        return self.prompt_len + self.response_len

    @property
    def mean_response_len(self) -> float:
        if self.response_mean:
            return float(self.response_mean)
        return self.response_len * DEFAULT_RESPONSE_MEAN_FRACTION

    @property
    def clip_fraction(self) -> float:
        """Share of responses truncated at the cap the length model assumes."""
        if self.response_clip_fraction >= 0:
            return self.response_clip_fraction
        return DEFAULT_CLIP_FRACTION

    @property
    def response_lengths(self) -> ResponseLengths:
        """The response-length distribution of this workload (tuner.lengths): the one the cost
        model integrates and the measuring runners draw from."""
        return ResponseLengths.of(self.mean_response_len, self.response_len, self.clip_fraction)

    @property
    def mean_prompt_len(self) -> float:
        if self.prompt_mean:
            return float(self.prompt_mean)
        return max(1.0, self.prompt_len * DEFAULT_PROMPT_MEAN_FRACTION)

    @property
    def num_samples(self) -> int:
        """Sequences trained on per step."""
        return self.batch_size * self.n

    @property
    def mean_seq_len(self) -> float:
        """Mean tokens per sample, unpadded (verl packs sequences without their padding)."""
        return self.mean_prompt_len + self.mean_response_len

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens a step trains on, all samples."""
        return self.num_samples * self.mean_seq_len

    @property
    def mini_batches_per_step(self) -> int:
        return self.batch_size // self.mini_batch_size

    def with_overrides(self, **overrides: Any) -> Workload:
        """A copy with the non-None overrides applied (CLI flags)."""
        given = {k: v for k, v in overrides.items() if v is not None}
        unknown = set(given) - {f.name for f in fields(Workload)}
        if unknown:
            raise UserError(f"unknown workload field(s): {', '.join(sorted(unknown))}")
        return replace(self, **given)


PRESETS: dict[str, Workload] = {
    w.name: w
    for w in (
        # The reference DAPO math runs: 2k prompt, 8k response, 512 prompts x 16, mini batch 32.
        Workload(
            name="dapo-math",
            algorithm="dapo",
            prompt_len=2048,
            response_len=8192,
            batch_size=512,
            n=16,
            mini_batch_size=32,
        ),
        Workload(
            name="grpo-math",
            algorithm="grpo",
            prompt_len=2048,
            response_len=8192,
            batch_size=512,
            n=16,
            mini_batch_size=32,
        ),
        Workload(
            name="grpo-short",
            algorithm="grpo",
            prompt_len=1024,
            response_len=2048,
            batch_size=256,
            n=8,
            mini_batch_size=64,
        ),
        Workload(
            name="ppo-gsm8k",
            algorithm="ppo",
            prompt_len=512,
            response_len=1024,
            batch_size=1024,
            n=1,
            mini_batch_size=256,
        ),
    )
}


def get_workload(name: str) -> Workload:
    if name not in PRESETS:
        raise UserError(f"unknown workload {name!r}: use one of {', '.join(PRESETS)}")
    return PRESETS[name]
