"""The megatron runner: each trial measures the training side of verl's step (old_log_prob and
the actor update) on this node's GPUs with megatron-core, through the torchrun worker
`tuner.runners.megatron_worker`, in transformer-engine layers as verl builds them or in
megatron-core's local layers (`--layer-spec`, tuner.megatron_layers; the row's extra says which,
and `nccl_init=lazy`: how the worker starts NCCL, estimate/device.py WORKER_NCCL_INIT).

One trial, in order (each step a plain function of the previous one's output):
  1. the spec: `worker_spec()` turns the candidate, model, cluster and workload into the
     worker's schema-2 JSON (the step's sample lengths drawn from the workload's response-length
     model, `tuner.lengths`, with the trial's seed), written to trials/<n>/spec.json; the rules
     (the shared ones and the worker's own: megatron_refusals) and the batch plans of both
     phases are checked here first, so a refused candidate costs no launch;
  2. the launch: by default a pool (`megatron_pool.WorkerPool`: one torchrun kept up across
     trials, the trial handed over as a request file); `pool=False` launches
     `torchrun --standalone --nproc-per-node <gpus> -m tuner.runners.megatron_worker` per trial;
     both with the trial's timeout;
  3. while it runs, the worker appends a line per measured step to trials/<n>/progress.jsonl;
     `spec.should_stop(step, tokens/s/GPU)` is asked after each, and True abandons the trial
     (Status.PRUNED_SLOW with the partial times);
  4. the result: trials/<n>/result.json (written by the worker, also on OOM and failure) →
     TrialResult; without it, the log tells OOM from a crash.

What the row means: `old_log_prob_s` and `update_actor_s` are measured (the median measured
step's), both scaled from the mini-batches that ran to the whole step (see `mini_batches`), so
they mean what the cost model's and verl's phases mean; the times of the mini-batches run are in
`extra` (`old_log_prob_s_run`, `update_s_run`); `mfu_update_pct` is the update's model FLOPs
(ModelSpec.training_flops of the samples run) over its measured time x GPUs x the GPU's bf16 peak;
`step_s` is left empty; `generation_s` too where generation is predicted (extra
`generation=predicted`: the study writes the cost model's in its pred_ columns), else it is
measured by a vLLM engine before the training phases (`megatron_generation`, extra
`generation=measured(vllm)`); `tokens_per_s_per_gpu` = tokens of the step run /
(old_log_prob_s + update_actor_s of the mini-batches run) / GPUs, with the measured generation
added to the time where there is one (`megatron_generation.finish`); memory three ways, max over
GPUs: `peak_mem_gib` (allocated), `peak_mem_reserved_gib`, `peak_mem_device_gib` (device used,
what an OOM is decided on); `launch_s` (hand-over to the first measured step: start-up in the
one-shot mode, model build and warm-up step always) and `measured_s` (wall in measured steps).
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
from tuner.batching import DEFAULT_MINI_BATCHES
from tuner.errors import UserError
from tuner.estimate import Estimate
from tuner.estimate.device import NCCL_INIT_KEY, WORKER_NCCL_INIT, megatron_worker_gib
from tuner.fields import same_named
from tuner.hardware import Cluster
from tuner.lengths import step_lengths
from tuner.megatron_layers import layer_spec_pins, resolve_layer_spec, te_present
from tuner.models import ModelSpec
from tuner.results import MEASURE_COLUMNS, OLD_LOG_PROB_RUN, Status, TrialResult
from tuner.runners.base import Predicted, Runner, TrialSpec, memory_view
from tuner.runners.megatron_generation import GenerationPhase, finish, with_generation
from tuner.runners.megatron_pool import PoolOutcome, WorkerPool
from tuner.runners.megatron_refusals import megatron_refusals, unbuilt_recompute_modules
from tuner.runners.megatron_worker import SCHEMA, WorkerSpec, parse_result
from tuner.runners.megatron_worker.protocol import ProgressWatch
from tuner.runners.megatron_worker.spec import layout_to_dict
from tuner.runners.megatron_worker.trial import more_steps, plan_phase
from tuner.runners.process import Launch, ProcessResult, run_process
from tuner.space import KNOBS, Candidate, RolloutDims, SpaceLimits, check_pins, worker_values
from tuner.workload import Workload

__all__ = ["MegatronRunner", "megatron_refusals", "to_trial_result", "worker_spec"]

SPEC_NAME = "spec.json"
RESULT_NAME = "result.json"
PROGRESS_NAME = "progress.jsonl"
ABANDON_NAME = "abandon"
LOG_NAME = "worker.log"
WORKER_MODULE = "tuner.runners.megatron_worker"
BACKEND = "megatron-core: old_log_prob + update_actor (generation predicted, not run)"
WARMUP_STEPS = 1
MEASURED_STEPS = 2
"""Three steps in all, as the reference leaderboards run them: one warm-up, then the 2nd and
3rd measured (their median, i.e. mean, reported); the pruner can stop a slow trial after the
2nd."""
MIN_MEASURED_S = 12.0
MAX_MEASURED_STEPS = 8
"""Past the 2 measured steps, steps go on until the measured window lasts MIN_MEASURED_S (at most
MAX_MEASURED_STEPS): steps of 1.4-3 s varied by up to 30% from one to the next on the H200s
(results/README.md), and the MoE study's 2.7 s steps left 19% of its trial wall time in measured
steps. A 7B step of 19 s stops at 2, as before."""
WORKER_ENV = {
    "PYTHONUNBUFFERED": "1",
    # NVLink multicast off: the shared hosts require it.
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    # As verl's Megatron workers set it (ordered kernel launches for TP/PP communication).
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    # Fewer allocator splits between trials of a pool.
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}


def _pins() -> tuple[tuple[str, Any], ...]:
    rollout = [k for k in KNOBS if k.group == "rollout" and k.choices is not None]
    kernels = [k for k in KNOBS if k.worker_runs is not None]
    last = len(kernels)
    kernels.sort(key=lambda k: last if k.pin_rank is None else k.pin_rank)  # stable: table order
    return tuple((k.name, k.field_default) for k in rollout) + tuple(
        (k.name, k.worker_runs) for k in kernels
    )


MEGATRON_PINNED = _pins()
"""Knobs the worker does not measure, at the value it runs: generation (vLLM is not run), every
sampled knob of the rollout group at its Candidate field's default (0 batched tokens: prompt +
response), then the kernel choices it cannot make here, at the value it runs instead
(`Knob.worker_runs`: local layers, flash kernels, grouped-GEMM experts, alltoall dispatch; in the
order stored fingerprints spell them, `Knob.pin_rank`, a newer one after them), so no trial is
spent on a knob it ignores. The log-prob knobs and use_fused_kernels are measured.
Checked on import (check_pins)."""
check_pins(MEGATRON_PINNED)
OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory")


def worker_spec(
    candidate: Candidate,
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    *,
    seed: int = 0,
    mini_batches: int = DEFAULT_MINI_BATCHES,
    steps: int = MEASURED_STEPS,
    warmup_steps: int = WARMUP_STEPS,
    min_measured_s: float = 0.0,
    max_steps: int = 0,
    layer_spec: str = "local",
) -> dict[str, Any]:
    """The worker's schema-2 spec for one trial; raises ValueError if verl, megatron-core or
    the worker would refuse it (megatron_refusals: the shared rules and the worker's own; then
    the batch plans of both phases). `layer_spec`: the layers the worker builds (te or local,
    megatron_layers); the te layers run the candidate's kernel choices (`kernels`). The candidate's
    knobs go where the knob table says (tuner.space.worker_values), the layout as
    megatron_worker.spec.layout_to_dict writes it."""
    total = workload.mini_batches_per_step
    run = total if mini_batches <= 0 else min(mini_batches, total)
    c, lay = candidate, candidate.layout
    problems = megatron_refusals(c, model, cluster, workload)
    if problems:
        raise ValueError("refused before a launch: " + "; ".join(problems))
    knobs = worker_values(c, model)  # the candidate's, by the knob table's keys (Knob.worker)
    knobs["batch"] = {
        "sequence_lengths": step_lengths(workload, run * workload.mini_batch_size, seed),
        "mini_batch_size": workload.mini_batch_size * workload.n,
        **knobs["batch"],
    }
    spec = {
        "schema": SCHEMA,
        "model": {k: getattr(model, k) for k in model.__dataclass_fields__},
        "layout": layout_to_dict(lay),
        **knobs,
        "layer_spec": layer_spec,
        "phases": ["old_log_prob", "update_actor"],
        "steps": steps,
        "warmup_steps": warmup_steps,
        "min_measured_s": min_measured_s,
        "max_steps": max_steps,
        "seed": seed,
        # Not read by the worker: how the lengths were drawn, for the row.
        "lengths": {
            "distribution": "tuner.lengths",
            "mini_batches_run": run,
            "mini_batches_per_step": total,
        },
    }
    ws = WorkerSpec.from_dict(spec)  # the worker's own checks, here first
    for phase in ws.phases:
        plan_phase(ws, phase, lay.dp)  # raises ValueError where the plan is refused
    return spec


class MegatronRunner(Runner):
    """Measures old_log_prob and the actor update with megatron-core on this node; see the
    module docstring. Call `close()` at the end of a study (it ends the worker pool)."""

    name = "megatron"

    def __init__(
        self,
        *,
        python: str | None = None,
        mini_batches: int = DEFAULT_MINI_BATCHES,
        steps: int = MEASURED_STEPS,
        warmup_steps: int = WARMUP_STEPS,
        min_measured_s: float = MIN_MEASURED_S,
        max_steps: int = MAX_MEASURED_STEPS,
        pool: bool = True,
        pool_dir: Path | None = None,
        launch: Launch | None = None,
        env: dict[str, str] | None = None,
        generation: bool | None = None,
        model_config: str | None = None,
        layer_spec: str = "auto",
    ) -> None:
        self.python = python or sys.executable
        # te or local (megatron_layers); --layer-spec te without transformer-engine: UserError
        self.layer_spec = resolve_layer_spec(layer_spec)
        self.mini_batches = mini_batches
        self.steps = steps
        self.warmup_steps = warmup_steps
        self.min_measured_s = min_measured_s
        self.max_steps = max(steps, max_steps)
        self.use_pool = pool and launch is None
        self.pool_dir = pool_dir
        self._launch = launch or run_process
        self.env = dict(env or {})
        self._pool: WorkerPool | None = None
        # generation with vLLM (megatron_generation): None measures it where vLLM imports and
        # `model_config` (--model) is a config.json; True demands it; False never
        self.generation = GenerationPhase(
            mode=generation, model_config=model_config, python=self.python, env=self._gen_env
        )

    def measured_window_s(self, step_s: float) -> float:
        """How long the measured steps of a trial whose steps take `step_s` last, by the
        worker's own rule (`more_steps`)."""
        n = 0
        while more_steps(
            n,
            n * step_s,
            steps=self.steps,
            max_steps=self.max_steps,
            min_measured_s=self.min_measured_s,
        ):
            n += 1
        return n * step_s

    def space_limits(self, model: ModelSpec) -> SpaceLimits:
        """The local layers have no context or sequence parallel (megatron-core needs
        transformer-engine), so the space leaves those out; the te layers have both. The
        generation knobs and the kernel choices the layers cannot make are pinned
        (MEGATRON_PINNED, less what the te layers make: megatron_layers.layer_spec_pins);
        log-prob batching and fused kernels are measured; recompute modules megatron-core
        refuses in the worker's config are not offered."""
        te = self.layer_spec == "te"
        # the dense sets hold no MoE module: left unnamed there, so the fingerprint is unchanged
        refused = unbuilt_recompute_modules(model) if model.is_moe else ()
        why = "" if te else "no transformer-engine here: no context or sequence parallel"
        if not te and te_present():
            why = (
                "--layer-spec local: megatron-core's local layers, no context or sequence parallel"
            )
        return SpaceLimits(
            context_parallel=te,
            sequence_parallel=te,
            pinned=self.generation.pins(layer_spec_pins(MEGATRON_PINNED, self.layer_spec)),
            why="; ".join(x for x in (why, self.generation.decide()[1]) if x),
            recompute_modules_refused=refused,
        )

    def predicted(
        self, pred: Estimate, cluster: Cluster, *, headroom_gib: float | None = None
    ) -> Predicted:
        """old_log_prob + update: their throughput, and their peaks (allocated and device) less
        the reference model's weights (the worker builds no reference model), with what the
        worker's process holds outside PyTorch (device.megatron_worker_gib) for verl's."""
        peak, device, phase, unfit = memory_view(
            pred,
            cluster,
            phases=("old_log_prob", "update_actor"),
            drop_reference=True,
            headroom_gib=headroom_gib,
            process_gib=megatron_worker_gib(),
        )
        t = (pred.update_actor_s or 0.0) + (getattr(pred, "old_log_prob_s", 0.0) or 0.0)
        p = Predicted(
            tokens_per_s_per_gpu=pred.tokens_per_step / t / cluster.num_gpus if t else 0.0,
            peak_gib=peak,
            phase=phase,
            device_gib=device,
            unfit=unfit,
        )
        return with_generation(p, pred, cluster, headroom_gib) if self.generation.on else p

    def check_available(self, cluster: Cluster) -> None:
        if cluster.num_nodes > 1:
            raise UserError(
                f"--runner megatron measures on one node; {cluster.num_gpus} GPUs span "
                f"{cluster.num_nodes} nodes: use --runner verl for several nodes"
            )
        self.generation.check_available()
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

    def torchrun(self, num_gpus: int) -> list[str]:
        return [
            self.python, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(num_gpus), "-m", WORKER_MODULE,
        ]  # fmt: skip

    def command(self, spec: TrialSpec) -> list[str]:
        d = spec.trial_dir.resolve()
        return [
            *self.torchrun(spec.cluster.num_gpus),
            "--spec", str(d / SPEC_NAME), "--out", str(d / RESULT_NAME),
            "--progress", str(d / PROGRESS_NAME), "--abandon", str(d / ABANDON_NAME),
        ]  # fmt: skip

    def _env(self) -> dict[str, str]:
        package_root = str(Path(tuner.__file__).resolve().parents[1])
        pythonpath = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        return {**WORKER_ENV, "PYTHONPATH": pythonpath, **self.env}

    def _gen_env(self) -> dict[str, str]:
        """The vLLM worker's: the NCCL settings, not the training allocator's or launch order."""
        skip = ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_DEVICE_MAX_CONNECTIONS")
        return {k: v for k, v in self._env().items() if k not in skip or k in self.env}

    def run(self, spec: TrialSpec) -> TrialResult:
        try:
            wspec = worker_spec(
                spec.candidate,
                spec.model,
                spec.cluster,
                spec.workload,
                seed=spec.seed,
                mini_batches=self.mini_batches,
                steps=self.steps,
                warmup_steps=self.warmup_steps,
                min_measured_s=self.min_measured_s,
                max_steps=self.max_steps,
                layer_spec=self.layer_spec,
            )
        except ValueError as e:
            return TrialResult(
                status=Status.PRUNED_INVALID,
                source=self.name,
                reason=str(e)[:300],
                backend=BACKEND,
            )
        d = spec.trial_dir.resolve()
        d.mkdir(parents=True, exist_ok=True)
        paths = {n: d / n for n in (RESULT_NAME, PROGRESS_NAME, ABANDON_NAME)}
        for p in paths.values():
            p.unlink(missing_ok=True)
        (d / SPEC_NAME).write_text(json.dumps(wspec) + "\n")
        gen = self.generation.run(spec, d) if self.generation.on else None  # before training
        if gen is not None and gen.row is not None:
            return gen.row
        g_s = (gen.result.generation_s or 0.0) if gen is not None and gen.result else 0.0
        lens = wspec["lengths"]  # early stop is told what the row's objective will say
        g_run = g_s * lens["mini_batches_run"] / lens["mini_batches_per_step"]
        watch = ProgressWatch(paths[PROGRESS_NAME], spec.cluster.num_gpus, spec.should_stop, g_run)
        if self.use_pool:
            out = self._run_pool(spec, d, paths, watch)
        else:
            out = self._launch(
                self.command(spec),
                log_path=d / LOG_NAME,
                timeout_s=spec.timeout_s,
                env=self._env(),
                cwd=d,
                poll=watch.poll if spec.should_stop else None,
            )
        replicas = RolloutDims.of(spec.candidate, spec.cluster.num_gpus).replicas
        return finish(
            to_trial_result(out, paths[RESULT_NAME], wspec, spec, watch), gen, replicas=replicas
        )

    def _run_pool(
        self, spec: TrialSpec, d: Path, paths: dict[str, Path], watch: ProgressWatch
    ) -> ProcessResult:
        if self._pool is None or self._pool_world != spec.cluster.num_gpus:
            if self._pool is not None:
                self._pool.close()
            folder = self.pool_dir or spec.trial_dir.resolve().parent.parent / "pool"
            self._pool = WorkerPool(
                folder / "p", self.torchrun(spec.cluster.num_gpus), env=self._env()
            )
            self._pool_world = spec.cluster.num_gpus
        o: PoolOutcome = self._pool.run(
            spec=d / SPEC_NAME,
            out=paths[RESULT_NAME],
            progress=paths[PROGRESS_NAME],
            abandon=paths[ABANDON_NAME],
            timeout_s=spec.timeout_s,
            poll=watch.poll if spec.should_stop else None,
        )
        log = d / LOG_NAME
        log.write_text(f"pool log: {self._pool.log_path}\n")
        return ProcessResult(
            returncode=o.returncode if not o.finished else 0,
            timed_out=o.timed_out,
            duration_s=o.duration_s,
            log_path=self._pool.log_path,
            stopped=o.stopped,
            started_pool=o.started_pool,
        )

    def close(self) -> None:
        """End the worker pools (the study calls this at its end)."""
        self.generation.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    _pool_world = 0


def to_trial_result(
    res: ProcessResult,
    result_path: Path,
    wspec: dict[str, Any],
    spec: TrialSpec,
    watch: ProgressWatch | None = None,
) -> TrialResult:
    """The row from what the launch left: result.json if the worker wrote it, else the log (and
    the progress lines, for a trial stopped early)."""
    lengths = wspec["lengths"]
    scale = lengths["mini_batches_per_step"] / lengths["mini_batches_run"]
    extra: dict[str, Any] = {
        "measured": "old_log_prob + actor update",
        "mini_batches_run": lengths["mini_batches_run"],
        "mini_batches_per_step": lengths["mini_batches_per_step"],
        "seed": wspec["seed"],
        "lengths": lengths["distribution"],
        "wall_s": round(res.duration_s, 1),
        "pool_started": res.started_pool,
        "layer_spec": wspec.get("layer_spec", "local"),
        NCCL_INIT_KEY: WORKER_NCCL_INIT,
    }
    common: dict[str, Any] = {
        "source": "megatron",
        "log_path": str(res.log_path),
        "backend": BACKEND,
    }
    try:
        r = parse_result(result_path.read_text())
    except FileNotFoundError:
        r = None
    except ValueError as e:
        return TrialResult(
            status=Status.FAILED, reason=f"unreadable {RESULT_NAME}: {e}", extra=extra, **common
        )
    seen = watch.seen if watch is not None else []
    if r is None or r.status == "abandoned":
        if res.stopped or (r is not None and r.status == "abandoned"):
            extra_s = watch.extra_s if watch is not None else 0.0
            return _pruned(seen, spec, extra, common, r, scale, extra_s)
        tail = res.tail()
        if res.timed_out:
            return TrialResult(
                status=Status.TIMEOUT,
                reason=f"no result within {spec.timeout_s:.0f} s"
                + (f" ({len(seen)} measured steps done)" if seen else ""),
                extra=extra,
                **common,
            )
        oom = any(m in tail for m in OOM_MARKERS)
        last = _last_error_line(tail) or f"worker exited {res.returncode} without a result"
        return TrialResult(
            status=Status.OOM if oom else Status.FAILED, reason=last[:300], extra=extra, **common
        )
    extra.update({k: v for k, v in r.extra.items() if not isinstance(v, list)})
    extra.update(phase=r.phase, num_micro_batches=r.num_micro_batches)
    common.update(
        hardware=f"{r.world_size}x {r.gpu}" if r.gpu else "",
        versions=" ".join(f"{k}={v}" for k, v in sorted(r.versions.items())),
    )
    if r.status != "ok":
        if r.mem_at_failure:
            extra.update({f"oom_{k}_gib": v for k, v in r.mem_at_failure.items()})
        status = Status.OOM if r.status == "oom" else Status.FAILED
        return TrialResult(
            status=status, reason=f"{r.phase}: {r.reason}"[:300], extra=extra, **common
        )
    extra["step_times_s"] = "/".join(f"{t:.3f}" for t in r.step_times_s)
    extra["update_s_run"] = round(r.update_actor_s or 0.0, 3)
    if r.old_log_prob_s is not None:
        extra[OLD_LOG_PROB_RUN] = round(r.old_log_prob_s, 4)
    upd = (r.update_actor_s or math.nan) * scale
    return TrialResult(
        status=Status.OK,
        old_log_prob_s=None if r.old_log_prob_s is None else r.old_log_prob_s * scale,
        update_actor_s=upd,
        tokens_per_s_per_gpu=r.tokens_per_s_per_gpu,
        mfu_update_pct=update_mfu_pct(spec, wspec, r.update_actor_s),
        extra=extra,
        **worker_measures(r),
        **common,
    )


RUNNER_TIMES = (
    "step_s",
    "old_log_prob_s",
    "update_actor_s",
    "tokens_per_s_per_gpu",
    "mfu_update_pct",
)
"""The worker's measures the runner does not take as they are: the phase times it scales to the
whole step, the step it leaves empty, the throughput (a stopped trial's is its last step's),
the update's MFU it computes (update_mfu_pct)."""


def worker_measures(r: Any) -> dict[str, Any]:
    """The worker's measures a row keeps as they are: its TrialMeasures (results.MEASURE_COLUMNS:
    memory, launch and measured wall time) but RUNNER_TIMES."""
    same = same_named(r, TrialResult, skip=RUNNER_TIMES)
    return {k: v for k, v in same.items() if k in MEASURE_COLUMNS}


def update_mfu_pct(
    spec: TrialSpec, wspec: dict[str, Any], update_run_s: float | None
) -> float | None:
    """The actor update's MFU in percent: ModelSpec.training_flops of the samples run (the
    tuner's one formula, as the cost model's) over the update's measured time of those samples
    x GPUs x the study's GPU's dense bf16 peak; None without a time."""
    if not update_run_s or update_run_s <= 0:
        return None
    cl = spec.cluster
    flops = spec.model.training_flops(wspec["batch"]["sequence_lengths"])
    return 100.0 * flops / (update_run_s * cl.num_gpus * cl.gpu.bf16_tflops * 1e12)


def _pruned(
    seen: list[Any],
    spec: TrialSpec,
    extra: dict[str, Any],
    common: dict[str, Any],
    r: Any,
    scale: float,
    extra_s: float = 0.0,
) -> TrialResult:
    """A trial stopped early: PRUNED_SLOW with the times of the steps it measured (old_log_prob
    scaled to the step, as an ok row's) and the throughput the pruner was told: over the step
    plus `extra_s`, the generation measured before it (ProgressWatch.extra_s), so a whole-step
    row's number is a whole step's."""
    world = spec.cluster.num_gpus
    if r is not None and r.peak_mem_gib is not None:
        common = {**common, **worker_measures(r)}
    if not seen:
        return TrialResult(status=Status.PRUNED_SLOW, reason="stopped early", extra=extra, **common)
    last = seen[-1]
    extra["step_times_s"] = "/".join(f"{p.seconds:.3f}" for p in seen)
    extra[OLD_LOG_PROB_RUN] = round(last.old_log_prob_s, 4)
    return TrialResult(
        status=Status.PRUNED_SLOW,
        reason=f"stopped after measured step {last.step}: "
        f"{last.tokens_per_s_per_gpu(world, extra_s):.0f} tokens/s/GPU",
        old_log_prob_s=last.old_log_prob_s * scale,
        tokens_per_s_per_gpu=last.tokens_per_s_per_gpu(world, extra_s),
        extra=extra,
        **common,
    )


def _last_error_line(log: str) -> str:
    for line in reversed(log.splitlines()):
        s = line.strip()
        if s and ("Error" in s or "error" in s) and not s.startswith("warnings.warn"):
            return s
    return ""
