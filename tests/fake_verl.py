"""A stand-in for `python -m verl.trainer.main_ppo` in tests: it takes the same overrides and
writes step metrics with verl's own `Tracking` logger (its `file` backend), so the tuner reads
exactly what verl would write, and prints console lines in verl's `step:<n> - k:v` format.
verl's tracking.py is loaded from the installed verl by path: importing the `verl` package
(torch, tensordict) would cost seconds per run and is not needed for the logger.
`actor_rollout_ref.model.path=fake/<mode>` says what to do:

  ok     log steps 1..trainer.total_training_steps, exit 0
  oom    log step 1, print a recorded CUDA OOM traceback (tests/data/verl_logs), exit 1
  die    log step 1, then the process kills itself (SIGKILL: no traceback)
  hang   log step 1, then sleep until killed
  config print a recorded Hydra override error and exit 1 (before any step)
  prompt1 as ok, but every prompt is measured as 1 token (a tokenizer that lost its words)

The job runtime env (`+ray_kwargs.ray_init.runtime_env.env_vars.K=V`, what `--shared-ray` passes)
is applied to its own environment, as verl's Ray workers, where the logger runs, would see it.

The lengths it reports are the data's: `meta.json` beside `data.train_files` (the synthetic
prompts' length) and, as verl runs them, each response the `data.max_response_length` cap where
`rollout.ignore_eos` holds, cut at its row's drawn length (`response_caps`) where the agent
loop of `rollout.agent.agent_loop_config_path` would cut it; step s reads rows s*batch.. in
order (`data.shuffle=False`).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "verl_logs"


def lengths(ov: dict[str, str], step: int) -> dict[str, float]:
    """The step's measured prompt and response means, from the data as verl would run it."""
    import json

    train = Path(ov.get("data.train_files", ""))
    meta_file = train.parent / "meta.json"
    out: dict[str, float] = {}
    if meta_file.is_file():
        out["prompt_length/mean"] = float(json.loads(meta_file.read_text())["prompt_tokens"])
    cap = float(ov.get("data.max_response_length", "2048"))
    if ov.get("actor_rollout_ref.rollout.ignore_eos") != "True":
        return out
    out["response_length/mean"] = cap
    if ov.get("actor_rollout_ref.rollout.agent.agent_loop_config_path") and train.is_file():
        import pyarrow.parquet as pq

        batch = int(ov["data.train_batch_size"])
        rows = (
            pq.read_table(train)
            .column("response_caps")
            .to_pylist()[(step - 1) * batch : step * batch]
        )
        flat = [min(cap, x) for caps in rows for x in caps]
        out["response_length/mean"] = sum(flat) / len(flat)
    return out


def metrics(step: int, split: bool = False, n_gpus: int = 8) -> dict[str, float]:
    """The keys verl 0.9's trainer logs each step (a subset), with plausible values; `split`
    (actor_rollout_ref.hybrid_engine=False): as verl's one-step-off-policy trainer logs them,
    `gen` the wait for the generation, `generate_async` the generation, and the sync.
    `perf/throughput` as verl computes it (trainer/ppo/metric_utils.py
    `compute_throughout_metrics`): the step's tokens over its time and `n_gpus`, the GPUs of
    verl's resource pools (`trainer.nnodes` x `trainer.n_gpus_per_node`: in a split, the
    trainer's pool alone)."""
    step_s = 100.0 + step
    if split:
        return {
            **metrics(step, n_gpus=n_gpus),
            "timing_s/gen": 5.0,
            "timing_s/generate_async": 50.0,
            "timing_s/sync_rollout_weights": 4.5,
        }
    tokens = (1000.0 + 10 * step) * step_s * n_gpus  # verl's figure 1000 + 10 * step, exactly
    return {
        "training/global_step": step,
        "perf/throughput": tokens / (step_s * n_gpus),
        "perf/time_per_step": step_s,
        "perf/total_num_tokens": tokens,
        "perf/max_memory_allocated_gb": 60.5,
        "perf/max_memory_reserved_gb": 70.25,
        "perf/mfu/actor": 0.31,
        "perf/cpu_memory_used_gb": 210.0,
        "timing_s/step": step_s,
        "timing_s/gen": 50.0,
        "timing_s/reward": 1.5,
        "timing_s/old_log_prob": 10.0,
        "timing_s/ref": 9.0,
        "timing_s/adv": 0.5,
        "timing_s/update_actor": 25.0,
        "timing_s/update_weights": 4.0,
        "response_length/mean": 1536.0,
        "response_length/max": 2048.0,
        "response_length/clip_ratio": 0.05,
        "prompt_length/mean": 200.0,
    }


def verl_tracking() -> Any:
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "utils" / "tracking.py"
    mod_spec = importlib.util.spec_from_file_location("verl_utils_tracking", path)
    assert mod_spec and mod_spec.loader
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def main(argv: list[str]) -> int:
    ov = dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith("--"))
    ov = {k: v[1:-1] if v[:1] == v[-1:] == "'" else v for k, v in ov.items()}  # Hydra quoting
    mode = ov.get("actor_rollout_ref.model.path", "fake/ok").removeprefix("fake/")
    runtime_env = "+ray_kwargs.ray_init.runtime_env.env_vars."
    for k, v in ov.items():  # what verl's Ray workers (its trainer's logger) would see
        if k.startswith(runtime_env):
            os.environ[k.removeprefix(runtime_env)] = v.replace("\\'", "'")
    if mode == "config":
        sys.stdout.write((DATA / "config_unknown_key.log").read_text())
        return 1
    tracking = verl_tracking().Tracking(
        project_name=ov["trainer.project_name"],
        experiment_name=ov["trainer.experiment_name"],
        default_backend=["file"],
    )
    steps = int(ov.get("trainer.total_training_steps", "3"))
    for step in range(1, steps + 1):
        split = ov.get("actor_rollout_ref.hybrid_engine") == "False"
        n_gpus = int(ov.get("trainer.n_gpus_per_node", "8")) * int(ov.get("trainer.nnodes", "1"))
        data = {**metrics(step, split, n_gpus), **lengths(ov, step)}
        if mode == "prompt1":
            data["prompt_length/mean"] = 1.0
        tracking.log(data=data, step=step)
        print(" - ".join([f"step:{step}", *(f"{k}:{v}" for k, v in data.items())]), flush=True)
        if mode not in ("ok", "prompt1"):
            break
    sys.stdout.flush()
    if mode == "oom":
        sys.stderr.write((DATA / "oom_update_actor.log").read_text())
        return 1
    if mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        pid_file = Path(os.environ.get("VERL_FILE_LOGGER_ROOT", ".")) / "fake_verl.pid"
        pid_file.write_text(str(os.getpid()))  # the trial folder, for the test to check
        while True:
            time.sleep(1)
    tracking.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
