"""The verl command a candidate means: one mapping from tuner knobs and the workload to verl
0.9 Hydra overrides of `ppo_megatron_trainer`, used by both the verl runner and recipes, so a
recipe reproduces exactly what a trial ran."""

from __future__ import annotations

from typing import Any

from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.space import ACTOR, REF, ROLLOUT, TF_CONFIG, Candidate, knob_overrides
from tuner.workload import Workload

CONFIG_NAME = "ppo_megatron_trainer"
ENTRYPOINT = ("python3", "-m", "verl.trainer.main_ppo", f"--config-name={CONFIG_NAME}")
ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "VLLM_USE_V1": "1"}


def uses_reference_model(w: Workload) -> bool:
    """GRPO and PPO keep a KL loss against a frozen reference; DAPO drops it."""
    return w.algorithm in ("grpo", "ppo")


def workload_overrides(w: Workload) -> dict[str, Any]:
    kl = uses_reference_model(w)
    out: dict[str, Any] = {
        "algorithm.adv_estimator": "gae" if w.algorithm == "ppo" else "grpo",
        "algorithm.use_kl_in_reward": False,
        "data.max_prompt_length": w.prompt_len,
        "data.max_response_length": w.response_len,
        "data.train_batch_size": w.batch_size,
        "data.filter_overlong_prompts": False,
        "data.truncation": "left",
        f"{ACTOR}.ppo_mini_batch_size": w.mini_batch_size,
        f"{ACTOR}.use_kl_loss": kl,
        f"{ACTOR}.optim.lr": 1e-6,
        f"{ROLLOUT}.name": "vllm",
        f"{ROLLOUT}.n": w.n,
        f"{ROLLOUT}.enable_chunked_prefill": True,
    }
    if kl:
        out[f"{ACTOR}.kl_loss_coef"] = 0.001
        out[f"{ACTOR}.kl_loss_type"] = "low_var_kl"
    if w.algorithm == "dapo":
        out[f"{ACTOR}.clip_ratio_low"] = 0.2
        out[f"{ACTOR}.clip_ratio_high"] = 0.28
        out[f"{ACTOR}.loss_agg_mode"] = "token-mean"
    return out


def extra_megatron_overrides(c: Candidate, m: ModelSpec) -> dict[str, Any]:
    """Switches the reference recipes always set (fusions; MoE dispatcher and router dtype)."""
    out: dict[str, Any] = {
        f"+{ACTOR}.{TF_CONFIG}.apply_rope_fusion": True,
        f"+{ACTOR}.{TF_CONFIG}.gradient_accumulation_fusion": True,
    }
    if m.is_moe:
        out[f"+{ACTOR}.{TF_CONFIG}.moe_token_dispatcher_type"] = "alltoall"
        out[f"+{ACTOR}.{TF_CONFIG}.moe_router_dtype"] = "fp32"
        out[f"+{ACTOR}.{TF_CONFIG}.moe_permute_fusion"] = True
    return out


def overrides(
    c: Candidate,
    m: ModelSpec,
    cl: Cluster,
    w: Workload,
    *,
    steps: int = 3,
    model_path: str = "${MODEL_PATH}",
    train_file: str = "${TRAIN_FILE}",
    nnodes: str | int = "${NNODES}",
    experiment: str = "tune",
    log_dir: str | None = None,
) -> dict[str, Any]:
    """Every override, in a stable order: workload, knobs, megatron extras, trainer."""
    out: dict[str, Any] = {
        "data.train_files": train_file,
        "data.val_files": train_file,
        "actor_rollout_ref.model.path": model_path,
        **workload_overrides(w),
        **knob_overrides(c),
        **extra_megatron_overrides(c, m),
        f"{ROLLOUT}.load_format": "dummy" if False else "auto",
        "trainer.logger": ["console", "file"],
        "trainer.project_name": "verl-tuner",
        "trainer.experiment_name": experiment,
        "trainer.n_gpus_per_node": cl.local_gpus,
        "trainer.nnodes": nnodes,
        "trainer.total_training_steps": steps,
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
    }
    if log_dir is not None:
        out["trainer.default_local_dir"] = log_dir
    if not uses_reference_model(w):
        for key in [k for k in out if k.startswith(f"{REF}.")]:
            out.pop(key)
    return out


def format_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, list | tuple):
        return "[" + ",".join(format_value(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def override_args(ov: dict[str, Any]) -> list[str]:
    return [f"{k}={format_value(v)}" for k, v in ov.items()]


def command(ov: dict[str, Any]) -> list[str]:
    return [*ENTRYPOINT, *override_args(ov)]
