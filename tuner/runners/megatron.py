"""The megatron runner: each trial measures verl's actor update (the Megatron part of an RL step)
on this node's GPUs with megatron-core, through the torchrun worker `megatron_worker`.

One trial, in order (each step a plain function of the previous one's output):
  1. the spec: `worker_spec()` turns the candidate, model and workload into the worker's
     schema-1 JSON (the step's sample lengths drawn from the workload with the trial's seed),
     written to trials/<n>/spec.json;
  2. the launch: `torchrun --standalone --nproc-per-node <gpus> -m tuner.runners.megatron_worker`
     with a timeout, the log kept as trials/<n>/worker.log;
  3. the result: trials/<n>/result.json (written by the worker, also on OOM and failure) →
     TrialResult; without it, the log tells OOM from a crash.

What the row means: `update_actor_s` is the measured update of the whole step (scaled from the
mini-batches that ran, see `mini_batches`), `tokens_per_s_per_gpu` and `mfu_pct` are the update's
(generation and log-prob phases are not run: `step_s` is left empty), `peak_mem_gib` is the
update's peak allocated memory, max over GPUs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import tuner
from tuner.errors import UserError
from tuner.estimate import Estimate
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.results import Status, TrialResult
from tuner.runners.base import Predicted, Runner, TrialSpec
from tuner.runners.batching import RESPONSE_LENGTH_DISTRIBUTION, draw_step_lengths
from tuner.runners.megatron_worker import SCHEMA, WorkerSpec, parse_result
from tuner.runners.process import Launch, ProcessResult, run_process
from tuner.space import Candidate, SpaceLimits
from tuner.workload import Workload

SPEC_NAME = "spec.json"
RESULT_NAME = "result.json"
LOG_NAME = "worker.log"
WORKER_MODULE = "tuner.runners.megatron_worker"
DEFAULT_MINI_BATCHES = 2
"""Mini-batches (optimizer steps) run per measured step by default: the update's throughput does
not depend on how many there are, and a full dapo-math step (16 of them) would take minutes."""
WORKER_ENV = {
    "PYTHONUNBUFFERED": "1",
    # NVLink multicast off: the shared hosts require it.
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    # As verl's Megatron workers set it (ordered kernel launches for TP/PP communication).
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
}
MEGATRON_PINNED = (
    ("rollout_tp", 1),
    ("gpu_memory_utilization", 0.6),
    ("max_num_batched_tokens_factor", 1),
    ("log_prob_max_token_len_factor", 2.0),
    ("log_prob_micro_batch_log2", 0),
    ("use_fused_kernels", False),
)
"""Sampler parameters the worker does not measure (generation and log-prob), and the fused
kernels, which it does not have (it computes full vocab-parallel logits)."""
OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory")


def worker_spec(
    candidate: Candidate,
    model: ModelSpec,
    workload: Workload,
    *,
    seed: int = 0,
    mini_batches: int = DEFAULT_MINI_BATCHES,
    steps: int = 3,
    warmup_steps: int = 1,
) -> dict[str, Any]:
    """The worker's schema-1 spec for one trial (raises ValueError if the worker cannot run it).

    `mini_batches` of the step's `workload.mini_batches_per_step` are run (0 = all); the samples
    are drawn for those only, from the same length distribution."""
    total = workload.mini_batches_per_step
    run = total if mini_batches <= 0 else min(mini_batches, total)
    c, lay = candidate, candidate.layout
    if c.use_dynamic_bsz and c.ppo_max_token_len_per_gpu * lay.cp < workload.max_seq_len:
        raise ValueError(
            f"ppo_max_token_len_per_gpu ({c.ppo_max_token_len_per_gpu}) x cp ({lay.cp}) is below "
            f"prompt + response ({workload.max_seq_len}): verl refuses it"
        )
    lengths = draw_step_lengths(
        prompts=run * workload.mini_batch_size,
        n=workload.n,
        prompt_max=workload.prompt_len,
        prompt_mean=workload.mean_prompt_len,
        response_max=workload.response_len,
        response_mean=workload.mean_response_len,
        seed=seed,
    )
    spec = {
        "schema": SCHEMA,
        "model": {
            "name": model.name,
            "num_layers": model.num_layers,
            "hidden_size": model.hidden_size,
            "ffn_hidden_size": model.ffn_hidden_size,
            "num_attention_heads": model.num_attention_heads,
            "num_query_groups": model.num_kv_heads,
            "kv_channels": model.head_dim,
            "vocab_size": model.vocab_size,
            "num_experts": model.num_experts,
            "moe_router_topk": model.moe_topk,
            "moe_ffn_hidden_size": model.moe_ffn_hidden_size,
            "qkv_bias": model.qkv_bias,
            "tie_word_embeddings": model.tie_word_embeddings,
            "qk_layernorm": model.qk_layernorm,
        },
        "layout": {
            "tp": lay.tp,
            "pp": lay.pp,
            "vpp": lay.vpp,
            "cp": lay.cp,
            "ep": lay.ep,
            "etp": lay.etp,
            "sp": c.sequence_parallel,
        },
        "recompute": {
            "granularity": c.recompute_granularity,
            "method": c.recompute_method,
            "num_layers": c.recompute_num_layers if c.recompute_granularity == "full" else 0,
        },
        "offload": {
            "param": c.param_offload,
            "grad": c.param_offload,  # verl 0.9.1: param_offload moves grads too
            "optimizer": c.optimizer_offload,
        },
        "batch": {
            "sequence_lengths": lengths,
            "mini_batch_size": workload.mini_batch_size * workload.n,
            "use_dynamic_bsz": c.use_dynamic_bsz,
            "max_token_len_per_gpu": c.ppo_max_token_len_per_gpu if c.use_dynamic_bsz else 0,
            "micro_batch_size_per_gpu": 0 if c.use_dynamic_bsz else c.ppo_micro_batch_size_per_gpu,
        },
        "steps": steps,
        "warmup_steps": warmup_steps,
        "seed": seed,
        # Not read by the worker: how the lengths were drawn, for the row.
        "lengths": {
            "distribution": RESPONSE_LENGTH_DISTRIBUTION,
            "mini_batches_run": run,
            "mini_batches_per_step": total,
        },
    }
    WorkerSpec.from_dict(spec).layout.dp(lay.world)  # the worker's own checks, here first
    return spec


class MegatronRunner(Runner):
    """Measures the actor update with megatron-core on this node; see the module docstring."""

    name = "megatron"

    def __init__(
        self,
        *,
        python: str | None = None,
        mini_batches: int = DEFAULT_MINI_BATCHES,
        steps: int = 3,
        warmup_steps: int = 1,
        launch: Launch | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.python = python or sys.executable
        self.mini_batches = mini_batches
        self.steps = steps
        self.warmup_steps = warmup_steps
        self._launch = launch or run_process
        self.env = dict(env or {})

    def space_limits(self, model: ModelSpec) -> SpaceLimits:
        """Without transformer-engine megatron-core has no context or sequence parallel, so the
        space leaves those out; the generation and log-prob knobs are pinned, as the worker runs
        only the update, and so are the fused kernels, as it computes full logits."""
        te = importlib.util.find_spec("transformer_engine") is not None
        return SpaceLimits(
            context_parallel=te,
            sequence_parallel=te,
            pinned=MEGATRON_PINNED,
            why="" if te else "no transformer-engine here: no context or sequence parallel",
        )

    def predicted(self, pred: Estimate, cluster: Cluster) -> Predicted:
        """The update only: its throughput, and its peak less the reference model's weights
        (the worker builds no reference model)."""
        mem = pred.memory
        peak = mem.update_peak_gib - mem.reference_gib
        cap = cluster.gpu.memory_gib
        upd = pred.update_actor_s
        return Predicted(
            tokens_per_s_per_gpu=pred.tokens_per_step / upd / cluster.num_gpus if upd else 0.0,
            peak_gib=peak,
            phase="update_actor",
            unfit=f"peak {peak:.1f} GiB in update_actor > {cap:.1f} GiB" if peak > cap else "",
        )

    def check_available(self, cluster: Cluster) -> None:
        if cluster.num_nodes > 1:
            raise UserError(
                f"--runner megatron measures on one node; {cluster.num_gpus} GPUs span "
                f"{cluster.num_nodes} nodes: use --runner verl for several nodes"
            )
        if importlib.util.find_spec("megatron") is None:
            raise UserError(
                "--runner megatron needs megatron-core (Python >= 3.12 and a CUDA torch): "
                "pip install 'verl-tuner[megatron]'"
            )
        from tuner.runners.launchers.local import count_local_gpus

        have = count_local_gpus()
        if have < cluster.num_gpus:
            raise UserError(
                f"--gpus {cluster.num_gpus} but this node shows {have} GPU(s) (nvidia-smi -L)"
            )

    def command(self, spec: TrialSpec) -> list[str]:
        d = spec.trial_dir.resolve()
        return [
            self.python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(spec.cluster.num_gpus),
            "-m",
            WORKER_MODULE,
            "--spec",
            str(d / SPEC_NAME),
            "--out",
            str(d / RESULT_NAME),
        ]

    def run(self, spec: TrialSpec) -> TrialResult:
        try:
            wspec = worker_spec(
                spec.candidate,
                spec.model,
                spec.workload,
                seed=spec.seed,
                mini_batches=self.mini_batches,
                steps=self.steps,
                warmup_steps=self.warmup_steps,
            )
        except ValueError as e:
            return TrialResult(status=Status.FAILED, source=self.name, reason=str(e)[:300])
        d = spec.trial_dir.resolve()
        d.mkdir(parents=True, exist_ok=True)
        result_path = d / RESULT_NAME
        result_path.unlink(missing_ok=True)
        (d / SPEC_NAME).write_text(json.dumps(wspec) + "\n")
        package_root = str(Path(tuner.__file__).resolve().parents[1])
        pythonpath = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        env = {**WORKER_ENV, "PYTHONPATH": pythonpath, **self.env}
        res = self._launch(
            self.command(spec), log_path=d / LOG_NAME, timeout_s=spec.timeout_s, env=env, cwd=d
        )
        return to_trial_result(res, result_path, wspec, spec)


def to_trial_result(
    res: ProcessResult, result_path: Path, wspec: dict[str, Any], spec: TrialSpec
) -> TrialResult:
    """The row from what the launch left: result.json if the worker wrote it, else the log."""
    lengths = wspec["lengths"]
    scale = lengths["mini_batches_per_step"] / lengths["mini_batches_run"]
    extra: dict[str, Any] = {
        "measured": "actor update",
        "mini_batches_run": lengths["mini_batches_run"],
        "mini_batches_per_step": lengths["mini_batches_per_step"],
        "seed": wspec["seed"],
        "lengths": lengths["distribution"],
        "launch_s": round(res.duration_s, 1),
    }
    common: dict[str, Any] = {"source": "megatron", "log_path": str(res.log_path)}
    try:
        r = parse_result(result_path.read_text())
    except FileNotFoundError:
        r = None
    except ValueError as e:
        return TrialResult(
            status=Status.FAILED, reason=f"unreadable {RESULT_NAME}: {e}", extra=extra, **common
        )
    if r is None:
        tail = res.tail()
        if res.timed_out:
            return TrialResult(
                status=Status.TIMEOUT,
                reason=f"no result within {spec.timeout_s:.0f} s",
                extra=extra,
                **common,
            )
        oom = any(m in tail for m in OOM_MARKERS)
        last = _last_error_line(tail) or f"worker exited {res.returncode} without a result"
        return TrialResult(
            status=Status.OOM if oom else Status.FAILED, reason=last[:300], extra=extra, **common
        )
    extra.update({k: v for k, v in r.extra.items() if k != "micro_batches_per_mini_batch"})
    extra.update(phase=r.phase, num_micro_batches=r.num_micro_batches)
    common.update(
        hardware=f"{r.world_size}x {r.gpu}" if r.gpu else "",
        versions=" ".join(f"{k}={v}" for k, v in sorted(r.versions.items())),
    )
    if r.status != "ok":
        status = Status.OOM if r.status == "oom" else Status.FAILED
        return TrialResult(
            status=status, reason=f"{r.phase}: {r.reason}"[:300], extra=extra, **common
        )
    extra["step_times_s"] = "/".join(f"{t:.3f}" for t in r.step_times_s)
    extra["update_s_measured"] = round(r.step_s or 0.0, 3)
    update_s = (r.step_s or math.nan) * scale
    return TrialResult(
        status=Status.OK,
        update_actor_s=update_s,
        tokens_per_s_per_gpu=r.tokens_per_s_per_gpu,
        mfu_pct=r.mfu_pct,
        peak_mem_gib=r.peak_mem_allocated_gib,
        peak_mem_reserved_gib=r.peak_mem_reserved_gib,
        extra=extra,
        **common,
    )


def _last_error_line(log: str) -> str:
    for line in reversed(log.splitlines()):
        s = line.strip()
        if s and ("Error" in s or "error" in s) and not s.startswith("warnings.warn"):
            return s
    return ""
