"""From the command line's values to the library's objects: the setup (model, cluster,
workload), the study request, the one candidate `tune estimate` scores. The CLI parses and
prints; these build (and raise UserError for what does not fit together)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.space import Candidate
from tuner.workload import Workload


@dataclass(frozen=True, kw_only=True, slots=True)
class Setup:
    """What a study or an estimate is about."""

    model: ModelSpec
    """The model (registry entry or read from a config.json)."""
    cluster: Cluster
    """GPU kind and count."""
    workload: Workload
    """The RL workload: the preset with the user's overrides."""


def build_setup(args: argparse.Namespace) -> Setup:
    """The model, cluster and workload of `--model --gpus --gpus-per-node --gpu --workload`
    and the workload overrides."""
    from tuner.hardware import get_gpu
    from tuner.models import get_model
    from tuner.workload import get_workload

    model = get_model(args.model)
    cluster = Cluster(
        gpu=get_gpu(args.gpu),
        num_gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        host_mem_gib=getattr(args, "host_mem_gib", None),
    )
    workload = get_workload(args.workload).with_overrides(
        algorithm=args.algorithm,
        prompt_len=args.prompt_len,
        response_len=args.response_len,
        response_mean=args.response_mean,
        prompt_mean=args.prompt_mean,
        batch_size=args.batch,
        n=args.n,
        mini_batch_size=args.mini_batch,
        expert_imbalance=getattr(args, "expert_imbalance", None),
    )
    if workload.expert_imbalance != 1.0:
        if not model.is_moe:
            raise UserError(
                f"--expert-imbalance {workload.expert_imbalance:g}: {model.name} is dense (no "
                "routed experts): leave --expert-imbalance out"
            )
        ceiling = model.num_experts / model.moe_topk
        if workload.expert_imbalance > ceiling:
            raise UserError(
                f"--expert-imbalance {workload.expert_imbalance:g} is above {model.name}'s "
                f"ceiling {ceiling:g} (every token on the same {model.moe_topk} of its "
                f"{model.num_experts} experts): give at most {ceiling:g}"
            )
    return Setup(model=model, cluster=cluster, workload=workload)


def with_local_host_memory(args: argparse.Namespace, setup: Setup) -> Setup:
    """`setup` with this machine's memory as the node's where trials of real verl launch here on
    one node and --host-mem-gib is not given (Ray's memory monitor judges the same total:
    /proc/meminfo MemTotal); unchanged elsewhere or where it cannot be read."""
    local = getattr(args, "launcher", None) in (None, "local") and not getattr(
        args, "ray_address", None
    )
    if args.host_mem_gib is not None or not local or setup.cluster.num_nodes > 1:
        return setup
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return setup
    cluster = dataclasses.replace(setup.cluster, host_mem_gib=kib / 1024**2)
    return dataclasses.replace(setup, cluster=cluster)


def verl_runner_options(args: argparse.Namespace) -> dict[str, Any]:
    """The `--runner verl` options, as VerlRunner's keyword arguments."""
    from tuner.verl_settings import VerlSettings

    return {
        "settings": VerlSettings.parse(
            bridge=args.verl_bridge, overrides=args.verl_override, env=args.verl_env
        ),
        "launcher": args.launcher,
        "model_path": args.model_path,
        "train_file": args.train_file,
        "reward_fn": args.reward_fn,
        "ray_address": args.ray_address,
        "shared_ray": args.shared_ray,
        "steps": args.verl_steps,
        "slurm_partition": args.slurm_partition,
        "slurm_account": args.slurm_account,
        "slurm_args": args.slurm_arg,
        "slurm_setup": args.slurm_setup,
    }


def megatron_runner_options(args: argparse.Namespace) -> dict[str, Any]:
    """The megatron runner's options (also for `--runner auto`, which may choose it)."""
    return {
        "generation": args.measure_generation,
        "model_config": args.model,
        "layer_spec": args.layer_spec,
    }


def _has_field(cls: type, name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(cls))


def build_request(args: argparse.Namespace, setup: Setup, runner: Any) -> Any:
    """The TuneRequest of `tune run`'s arguments (study.TuneRequest checks its own values)."""
    from tuner.estimate import load_profile, profile_source
    from tuner.study import TuneRequest

    extra: dict[str, Any] = {}
    headroom = getattr(args, "headroom_gib", None)
    if headroom is not None:
        if not _has_field(TuneRequest, "headroom_gib"):
            raise UserError("--headroom-gib is not supported by this version: leave it out")
        extra["headroom_gib"] = headroom
    return TuneRequest(
        model=setup.model,
        model_arg=args.model,
        cluster=setup.cluster,
        workload=setup.workload,
        runner=runner,
        trials=args.trials,
        timeout_s=args.timeout,
        trial_timeout_s=args.trial_timeout,
        storage=args.storage,
        study_name=args.study,
        results_dir=args.results_dir,
        recipes_dir=args.recipes_dir,
        recipes=args.recipes,
        seed=args.seed,
        warm_start=not args.no_warm_start,
        hand_grid=args.hand_grid,
        verl_example=getattr(args, "verl_example", False),
        candidates_from=getattr(args, "candidates_from", None),
        profile=load_profile(args.profile),
        profile_source=profile_source(args.profile),
        allow_off_policy=getattr(args, "allow_off_policy", False),
        **extra,
    )


def check_request_paths(req: Any) -> None:
    """The study's own files are not blocked: its CSV is not a folder, its trial folder and its
    model's recipe folder are not files, a storage path is not a folder, and no lock file the
    study takes beside them is a folder or read-only. Run before the study writes anything (a
    file in the way of recipes/<model>/ stopped the study after it had run its trials)."""
    from tuner import recipes
    from tuner.cli_args import check_storage_url, check_writable_dir, check_writable_file
    from tuner.results import lock_of

    csv_path = Path(req.csv_path)
    check_writable_file(csv_path, f"leaderboard of study {req.name}:")
    check_writable_dir(Path(req.results_dir) / req.name, f"trial folder of study {req.name}:")
    if req.recipes:
        folder = recipes.model_folder(req.recipes_dir, req.model.name)
        check_writable_dir(folder, f"recipe folder of model {req.model.name}:")
        recipes.check_name_lengths(req.model, req.cluster, recipes.suffix_of(req.name, "99999"))
    locks = [lock_of(csv_path)]  # results.upsert_row and the study's CSV view
    storage = check_storage_url(str(req.storage_url))
    if storage is not None:
        check_writable_file(storage, "--storage")
        # study.storage: open_storage's and the journal's lock, then study_lock's
        locks += [lock_of(storage), lock_of(storage.with_name(f"{storage.name}.{req.name}"))]
    for lock in locks:
        check_writable_file(lock, f"lock file of study {req.name}:")


def probe_request_paths(req: Any) -> None:
    """The folders the study writes in really take a file (`cli_args.probe_writable_dir`): its
    results folder, its model's recipe folder and its storage file's folder. Run after every
    refusal that writes nothing and just before the study writes: a recipes folder that
    `os.access` called writable but was not failed the study after its trials had run."""
    from tuner import recipes
    from tuner.cli_args import check_storage_url, probe_writable_dir

    probe_writable_dir(Path(req.results_dir), "--results-dir")
    if req.recipes:
        folder = recipes.model_folder(req.recipes_dir, req.model.name)
        probe_writable_dir(folder, f"recipe folder of model {req.model.name}:")
    storage = check_storage_url(str(req.storage_url))
    if storage is not None:
        probe_writable_dir(storage.parent, "--storage")


def build_candidate(args: argparse.Namespace, setup: Setup) -> Candidate:
    """The one configuration `tune estimate` scores, from its flags; UserError naming every
    broken rule if it is not valid for the setup."""
    from tuner.space import ParallelLayout, validate

    lay = ParallelLayout.parse(args.layout, setup.cluster.num_gpus, setup.model.num_layers)
    if args.no_sequence_parallel and lay.tp == 1:  # it needs tp > 1: off already
        raise UserError(
            f"--no-sequence-parallel with layout {args.layout} (tp 1): sequence parallelism "
            "needs tp > 1, so it is off already: leave the option out"
        )
    seq = setup.workload.max_seq_len
    fixed = args.micro_batch is not None
    offload: dict[str, Any] = {"param_offload": args.offload, "optimizer_offload": args.offload}
    if _has_field(Candidate, "grad_offload"):  # being removed: verl 0.9 offloads grads w/ params
        offload["grad_offload"] = args.offload
    c = Candidate(
        layout=lay,
        sequence_parallel=lay.tp > 1 and not args.no_sequence_parallel,
        recompute_granularity=args.recompute,
        use_fused_kernels=not args.no_fused_kernels,
        use_dynamic_bsz=not fixed,
        ppo_max_token_len_per_gpu=args.max_token_len or 2 * seq,
        log_prob_max_token_len_per_gpu=args.logprob_max_token_len or 3 * seq,
        ppo_micro_batch_size_per_gpu=args.micro_batch or 1,
        log_prob_micro_batch_size_per_gpu=args.micro_batch or 1,
        rollout_tp=args.rollout_tp,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_batched_tokens=args.max_num_batched_tokens or seq,
        **offload,
    )
    problems = validate(c, setup.model, setup.cluster, setup.workload)
    if problems:
        raise UserError(f"layout {args.layout}: " + "; ".join(problems))
    return c
