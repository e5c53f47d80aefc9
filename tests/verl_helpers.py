"""Helpers shared by the verl runner's tests (loaded by path: tests/ is not a package):
a trial spec, the fake main_ppo, a tiny Hugging Face model folder written offline."""

from __future__ import annotations

from pathlib import Path

from tuner.estimate import estimate
from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.runners.base import TrialSpec
from tuner.space import Candidate, ParallelLayout
from tuner.workload import get_workload

FAKE_VERL = Path(__file__).resolve().with_name("fake_verl.py")
"""Stands in for `python -m verl.trainer.main_ppo`; see its docstring."""


def spec_for(tmp: Path, number: int = 0, timeout_s: float = 120.0, **cand: object) -> TrialSpec:
    """Trial `number` of a study under tmp/results/study: Qwen2.5-7B on 8 H100s, tp2pp2."""
    m, cl = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=8)
    w = get_workload("grpo-short").with_overrides(batch_size=64, mini_batch_size=16)
    c = Candidate(
        layout=ParallelLayout(world=8, tp=2, pp=2),
        sequence_parallel=True,
        ppo_max_token_len_per_gpu=6144,
        log_prob_max_token_len_per_gpu=12288,
        rollout_tp=2,
        **cand,  # type: ignore[arg-type]
    )
    return TrialSpec(
        number=number,
        candidate=c,
        model=m,
        cluster=cl,
        workload=w,
        trial_dir=tmp / "results" / "study" / "trials" / str(number),
        timeout_s=timeout_s,
        prediction=estimate(c, m, cl, w),
    )


def write_tiny_model(folder: Path, *, config: bool = True) -> Path:
    """A whitespace word-level tokenizer (one token per word of tuner.dataset.WORDS) and, with
    `config`, a Qwen2-shaped config.json (then AutoTokenizer loads the tokenizer as Qwen2's,
    which is enough for verl to load the folder, but not for counting tokens)."""
    from transformers import Qwen2Config

    from tuner.dataset import write_word_tokenizer

    n_vocab = write_word_tokenizer(folder)
    if not config:
        return folder
    Qwen2Config(
        architectures=["Qwen2ForCausalLM"],
        vocab_size=n_vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=65536,
    ).save_pretrained(folder)
    return folder
