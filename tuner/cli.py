"""`tune`: argument parsing and printing only; the work happens in the library."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.errors import UserError

SUBCOMMANDS = ("run", "show", "export", "plot", "models", "estimate", "calibrate")

DESCRIPTION = """\
Find the fastest verl Megatron configuration for a model, an RL workload and a GPU count.

  tune --model qwen3-30b-moe --gpus 32          search (runner auto: estimator without a GPU)
  tune show results/<study>.csv                 ranked leaderboard (ours or a reference CSV)
  tune export results/<study>.csv --rank 1      the best row as a runnable verl script
  tune plot results/<study>.csv                 search progress and best layouts as a PNG
  tune models                                   the model registry
  tune estimate --model qwen2.5-7b --gpus 8 --layout tp4pp2    the cost model for one layout
"""


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        help="registry name (see `tune models`) or a path to a Hugging Face "
        "config.json or its folder",
    )
    p.add_argument("--gpus", type=int, required=True, help="GPUs in all")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--gpu", default="h100", help="GPU kind: h100, h200, h20, a100 (default h100)")


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    from tuner.workload import PRESETS

    g = p.add_argument_group("workload (a preset, each field overridable)")
    g.add_argument(
        "--workload",
        default="dapo-math",
        help=f"preset: {', '.join(PRESETS)} (default dapo-math: 2048-token prompts, "
        "8192-token responses, 512 prompts x 16, mini batch 32)",
    )
    g.add_argument("--algorithm", choices=("grpo", "dapo", "ppo"))
    g.add_argument("--prompt-len", type=int, help="max prompt tokens")
    g.add_argument("--response-len", type=int, help="max response tokens")
    g.add_argument(
        "--response-mean",
        type=int,
        help="mean response tokens (default: 15%% of the max, early-training math runs)",
    )
    g.add_argument(
        "--prompt-mean", type=int, help="mean prompt tokens, unpadded (default: 10%% of the max)"
    )
    g.add_argument("--batch", type=int, help="prompts per step (data.train_batch_size)")
    g.add_argument("--n", type=int, help="responses per prompt (rollout.n)")
    g.add_argument("--mini-batch", type=int, help="PPO mini batch in prompts")


def _add_verl_runner_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "verl runner (--runner verl: real verl main_ppo trials of 3 steps; see docs/clusters.md)"
    )
    g.add_argument(
        "--launcher",
        choices=("local", "ray", "slurm"),
        default="local",
        help="where trials run: this node, a Ray cluster (Jobs API) or Slurm (default local)",
    )
    g.add_argument(
        "--model-path",
        help="the model's Hugging Face weights (a folder every node can read)",
    )
    g.add_argument(
        "--train-file",
        type=Path,
        help="a verl parquet of prompts (default: a synthetic one of the workload's lengths)",
    )
    g.add_argument(
        "--reward-fn",
        type=Path,
        help="a Python file with compute_score() (default: reward.py beside --train-file, "
        "else verl's scorer for each row's data_source)",
    )
    g.add_argument("--ray-address", help="--launcher ray: the dashboard, http://<head>:8265")
    g.add_argument("--slurm-partition", help="--launcher slurm: #SBATCH --partition")
    g.add_argument("--slurm-account", help="--launcher slurm: #SBATCH --account")
    g.add_argument(
        "--slurm-arg",
        action="append",
        default=[],
        metavar="OPTION",
        help="--launcher slurm: another #SBATCH option, e.g. --slurm-arg=--qos=high (repeatable)",
    )
    g.add_argument(
        "--slurm-setup",
        default="",
        help="--launcher slurm: shell lines run first in the job, e.g. "
        "'source /shared/venv/bin/activate'",
    )


def _verl_runner_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "launcher": args.launcher,
        "model_path": args.model_path,
        "train_file": args.train_file,
        "reward_fn": args.reward_fn,
        "ray_address": args.ray_address,
        "slurm_partition": args.slurm_partition,
        "slurm_account": args.slurm_account,
        "slurm_args": args.slurm_arg,
        "slurm_setup": args.slurm_setup,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tune", description=DESCRIPTION, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")

    run = sub.add_parser(
        "run",
        help="search for the fastest configuration (the default command)",
        description="Search with Optuna. Every trial becomes a row of results/<study>.csv; the "
        "best rows become scripts under recipes/<model>/. Stop it any time and run "
        "the same command again to resume.",
    )
    _add_cluster_args(run)
    _add_workload_args(run)
    g = run.add_argument_group("search")
    g.add_argument(
        "--trials",
        type=int,
        default=50,
        help="trials the study should hold; a resumed study runs the rest (default 50)",
    )
    g.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="stop starting trials after this many seconds (default: none)",
    )
    g.add_argument(
        "--trial-timeout",
        type=float,
        default=1800.0,
        help="seconds one launched trial may run before it ends as `timeout` (default 1800)",
    )
    g.add_argument(
        "--runner",
        default="auto",
        choices=("auto", "estimate", "megatron", "verl"),
        help="auto: megatron on a GPU machine, else the estimator (default auto)",
    )
    g.add_argument(
        "--storage",
        default="",
        help="Optuna storage: a URL (sqlite:///, postgresql://, mysql://), a "
        "*.log journal file for several workers, or a SQLite path "
        "(default results/studies.sqlite3)",
    )
    g.add_argument(
        "--study", default="", help="study name (default: model-gpuxN[-workload]-runner)"
    )
    g.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    g.add_argument(
        "--no-warm-start",
        action="store_true",
        help="do not try the reference layouts and the estimator's best first",
    )
    g.add_argument("--results-dir", type=Path, default=Path("results"))
    g.add_argument("--recipes-dir", type=Path, default=Path("recipes"))
    g.add_argument(
        "--recipes",
        type=int,
        default=3,
        help="write recipe scripts for this many best rows (default 3)",
    )
    g.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="calibration profile (default results/calibration.json if present)",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_verl_runner_args(run)

    show = sub.add_parser("show", help="print a leaderboard, ranked")
    show.add_argument("csv", type=Path, nargs="+", help="leaderboard CSV(s), ours or reference")
    show.add_argument("--status", help="only rows with this status (ok, oom, failed, ...)")
    show.add_argument("--top", type=int, default=None, help="only the first N rows")
    show.add_argument(
        "--sort",
        help="column to sort by (default: tokens_per_s_per_gpu, or step_s where a leaderboard "
        "has no throughput column)",
    )
    show.add_argument("--asc", action="store_true", help="ascending")
    show.add_argument("--columns", help="comma-separated columns to print")

    exp = sub.add_parser("export", help="write a row as a runnable verl recipe script")
    exp.add_argument("csv", type=Path, help="leaderboard CSV")
    exp.add_argument("--rank", type=int, default=1, help="rank among ok rows (default 1)")
    exp.add_argument("--trial", type=int, default=None, help="or a trial number")
    exp.add_argument("--steps", type=int, default=3, help="trainer.total_training_steps")
    exp.add_argument("--recipes-dir", type=Path, default=Path("recipes"))

    plot = sub.add_parser("plot", help="draw a leaderboard as a PNG (needs matplotlib)")
    plot.add_argument("csv", type=Path, help="leaderboard CSV")
    plot.add_argument(
        "--out", type=Path, default=None, help="PNG path (default: beside the CSV, same name)"
    )

    sub.add_parser("models", help="list the model registry")

    est = sub.add_parser("estimate", help="the cost model's prediction for one configuration")
    _add_cluster_args(est)
    _add_workload_args(est)
    est.add_argument("--layout", required=True, help="tp4pp2vpp2, tp2cp2, ep8cp4, tp4ep16, ...")
    est.add_argument("--rollout-tp", type=int, default=1)
    est.add_argument(
        "--max-token-len",
        type=int,
        default=None,
        help="ppo_max_token_len_per_gpu (default 2x prompt+response)",
    )
    est.add_argument(
        "--logprob-max-token-len",
        type=int,
        default=None,
        help="log_prob_max_token_len_per_gpu (default 3x prompt+response)",
    )
    est.add_argument("--offload", action="store_true", help="param, grad and optimizer offload")
    est.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    est.add_argument("--no-fused-kernels", action="store_true")
    est.add_argument("--no-sequence-parallel", action="store_true")
    est.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    est.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="fixed micro-batch size per GPU instead of dynamic token budgets",
    )
    est.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="vLLM tokens per scheduler step (default prompt + response)",
    )
    est.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="calibration profile (default results/calibration.json if present)",
    )
    est.add_argument("--json", action="store_true", help="one JSON object")

    cal = sub.add_parser(
        "calibrate",
        help="fit the cost model's efficiency constants to your measured rows",
        description="Fit the cost model's efficiency constants (GEMM, attention, memory and "
        "network efficiencies, host overheads) to the measured rows of leaderboards (rows "
        "whose source is a real runner, not the estimator), by least squares on log errors, "
        "and store them as the profile `tune` uses by default.",
    )
    cal.add_argument("csv", type=Path, nargs="+", help="leaderboard CSV(s) with measured rows")
    cal.add_argument(
        "--out",
        type=Path,
        default=None,
        help="profile to write (default results/calibration.json)",
    )
    cal.add_argument(
        "--start",
        type=Path,
        default=None,
        help="profile to start from (default: the built-in constants)",
    )
    cal.add_argument("--gpu", default=None, help="only rows of this GPU kind (e.g. h100)")
    cal.add_argument(
        "--dry-run", action="store_true", help="print the fit, do not write the profile"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] not in SUBCOMMANDS and args_list[0] not in ("-h", "--help"):
        args_list.insert(0, "run")
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(COMMANDS[args.command](args) or 0)
    except UserError as e:
        print(f"tune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tune: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


def _cluster_model_workload(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from tuner.hardware import Cluster, get_gpu
    from tuner.models import get_model
    from tuner.workload import get_workload

    model = get_model(args.model)
    cluster = Cluster(gpu=get_gpu(args.gpu), num_gpus=args.gpus, gpus_per_node=args.gpus_per_node)
    workload = get_workload(args.workload).with_overrides(
        algorithm=args.algorithm,
        prompt_len=args.prompt_len,
        response_len=args.response_len,
        response_mean=args.response_mean,
        prompt_mean=args.prompt_mean,
        batch_size=args.batch,
        n=args.n,
        mini_batch_size=args.mini_batch,
    )
    return model, cluster, workload


def cmd_run(args: argparse.Namespace) -> int:
    from tuner.estimate import load_profile
    from tuner.runners import make_runner
    from tuner.study import Progress, TuneRequest, run_study

    model, cluster, workload = _cluster_model_workload(args)
    options = _verl_runner_options(args) if args.runner == "verl" else {}
    runner = make_runner(args.runner, **options)
    if args.runner == "auto" and runner.name == "estimate":
        print(
            "tune: no GPU here: using the estimator (rows say source=estimate; nothing is measured)"
        )
    else:
        print(f"tune: runner {runner.name}")
    why = runner.space_limits(model).why
    if why:
        print(f"tune: {why}")
    req = TuneRequest(
        model=model,
        model_arg=args.model,
        cluster=cluster,
        workload=workload,
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
        profile=load_profile(args.profile),
    )
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(
            total=req.trials, unit="trial", desc=req.name, dynamic_ncols=True, file=sys.stderr
        )

    def progress(p: Progress) -> None:
        if bar is None:
            return
        if bar.n == 0 and p.done > 1:
            bar.update(p.done - 1)
        bar.update(1)
        best = (
            f"{p.best_tokens_per_s_per_gpu:.0f} tok/s/gpu {p.best_layout}"
            if p.best_tokens_per_s_per_gpu
            else "none yet"
        )
        bar.set_postfix_str(f"best {best}, last {p.status}")

    try:
        summary = run_study(req, progress)
    finally:
        if bar is not None:
            bar.close()
    from tuner.results import SHOW_COLUMNS, format_table

    if summary.resumed_from:
        print(f"resumed study {summary.name}: {summary.resumed_from} trials were done before")
    print(
        f"study {summary.name}: {summary.trials_run} trials run, {summary.trials_total} in all; "
        f"leaderboard {summary.csv_path}"
    )
    if summary.best_rows:
        print(format_table(summary.best_rows, [c for c in SHOW_COLUMNS if c != "reason"]))
    else:
        print("no trial finished ok: see the reason column of the leaderboard")
    for p in summary.recipe_paths:
        print(f"recipe: {p}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from tuner.results import SHOW_COLUMNS, format_table, rank, read_rows

    rows = [r for path in args.csv for r in read_rows(path)]
    rows = rank(
        rows,
        sort_by=args.sort,
        status=args.status,
        top=args.top,
        descending=False if args.asc else None,
    )
    cols = args.columns.split(",") if args.columns else SHOW_COLUMNS
    if len(args.csv) > 1 and not args.columns:
        cols = ("study", *cols)
    print(format_table(rows, cols))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tuner import recipes
    from tuner.hardware import Cluster, get_gpu
    from tuner.models import get_model
    from tuner.results import rank, read_raw
    from tuner.space import Candidate
    from tuner.workload import Workload, get_workload

    rows = read_raw(args.csv)
    if args.trial is not None:
        chosen = [r for r in rows if r.get("trial") == str(args.trial)]
        if not chosen:
            raise UserError(f"no trial {args.trial} in {args.csv}")
        row = chosen[0]
    else:
        ok = rank(rows, status="ok")
        if not 1 <= args.rank <= len(ok):
            raise UserError(f"{args.csv} has {len(ok)} ok rows: pass --rank 1..{len(ok)}")
        row = ok[args.rank - 1]
    model = get_model(row["model"])
    cluster = Cluster(
        gpu=get_gpu(row["gpu"]),
        num_gpus=int(row["num_gpus"]),
        gpus_per_node=int(row["gpus_per_node"]),
    )
    base = get_workload(row["workload"]) if row.get("workload") in _presets() else Workload()
    workload = base.with_overrides(
        algorithm=row["algorithm"],
        prompt_len=int(row["max_prompt_len"]),
        response_len=int(row["max_response_len"]),
        batch_size=int(row["bs"]),
        n=int(row["n"]),
        mini_batch_size=int(row["mini_bs"]),
    )
    cand = Candidate.from_record(row, cluster.num_gpus)
    recipe = recipes.render(
        cand, model, cluster, workload, steps=args.steps, origin=recipes.origin_of(args.csv, row)
    )
    path = recipes.write(
        recipe, args.recipes_dir / recipes._slug(model.name), suffix=f"t{row['trial']}"
    )
    print(path)
    return 0


def _presets() -> set[str]:
    from tuner.workload import PRESETS

    return set(PRESETS)


def cmd_plot(args: argparse.Namespace) -> int:
    from tuner.plots import plot_leaderboard
    from tuner.results import read_rows

    out = args.out or args.csv.with_suffix(".png")
    print(plot_leaderboard(read_rows(args.csv), out, title=args.csv.stem))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from tuner.models import REGISTRY

    head = (
        f"{'name':16} {'params':>8} {'active':>8} {'layers':>6} {'hidden':>6} {'heads':>5} "
        f"{'kv':>3} {'experts':>7} {'topk':>4}  hf"
    )
    print(head)
    for m in REGISTRY.values():
        print(
            f"{m.name:16} {m.num_params / 1e9:7.1f}B {m.num_active_params / 1e9:7.1f}B "
            f"{m.num_layers:6} {m.hidden_size:6} {m.num_attention_heads:5} {m.num_kv_heads:3} "
            f"{m.num_experts:7} {m.moe_topk:4}  {m.hf_id}"
        )
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from tuner.estimate import estimate, load_profile
    from tuner.space import Candidate, ParallelLayout, validate

    model, cluster, workload = _cluster_model_workload(args)
    lay = ParallelLayout.parse(args.layout, cluster.num_gpus)
    seq = workload.max_seq_len
    fixed = args.micro_batch is not None
    c = Candidate(
        layout=lay,
        sequence_parallel=lay.tp > 1 and not args.no_sequence_parallel,
        recompute_granularity=args.recompute,
        param_offload=args.offload,
        grad_offload=args.offload,
        optimizer_offload=args.offload,
        use_fused_kernels=not args.no_fused_kernels,
        use_dynamic_bsz=not fixed,
        ppo_max_token_len_per_gpu=args.max_token_len or 2 * seq,
        log_prob_max_token_len_per_gpu=args.logprob_max_token_len or 3 * seq,
        ppo_micro_batch_size_per_gpu=args.micro_batch or 1,
        log_prob_micro_batch_size_per_gpu=args.micro_batch or 1,
        rollout_tp=args.rollout_tp,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_batched_tokens=args.max_num_batched_tokens or seq,
    )
    problems = validate(c, model, cluster, workload)
    if problems:
        raise UserError(f"layout {args.layout}: " + "; ".join(problems))
    e = estimate(c, model, cluster, workload, load_profile(args.profile))
    if args.json:
        print(json.dumps(e.as_dict(), default=float))
        return 0
    mem = e.memory
    print(
        f"{model.name} on {cluster.num_gpus}x {cluster.gpu.name}, actor {lay.notation} (dp"
        f"{lay.dp}), rollout tp{args.rollout_tp}, {workload.algorithm} "
        f"{workload.batch_size}x{workload.n}, mean sample {workload.mean_seq_len:.0f} tokens "
        "(source=estimate)"
    )
    print("time per step")
    for label, v in (
        ("generation", e.generation_s),
        ("old log-prob", e.old_log_prob_s),
        ("ref log-prob", e.ref_s),
        ("update actor", e.update_actor_s),
        ("critic", e.critic_s),
        ("reshard", e.reshard_s),
        ("step", e.step_s),
    ):
        if label == "critic" and not v:
            continue
        print(f"  {label:16} {v:9.1f} s")
    print(f"  {'of which offload':16} {e.offload_s:9.1f} s (PCIe)")
    print(f"  {'throughput':16} {e.throughput_tokens_per_s_per_gpu:9.0f} tokens/s/GPU")
    print(f"  {'mfu':16} {e.mfu * 100:9.1f} % (actor update)")
    print(f"  {'bottleneck':16} {e.bottleneck:>9}")
    print("memory per GPU (GiB)")
    for label, v in (
        ("weights", mem.weights_gib),
        ("gradients", mem.grads_gib),
        ("optimizer", mem.optimizer_gib),
        ("activations", mem.activations_gib),
        ("logits", mem.logits_gib),
        ("moe dispatch", mem.dispatch_gib),
        ("reference", mem.reference_gib),
        ("vLLM share", mem.rollout_gib),
        ("vLLM KV cache", mem.kv_cache_gib),
        ("context etc.", mem.overhead_gib),
    ):
        if v:
            print(f"  {label:16} {v:9.1f}")
    for label, v in (
        ("generation peak", mem.generation_peak_gib),
        ("log-prob peak", mem.log_prob_peak_gib),
        ("update peak", mem.update_peak_gib),
    ):
        print(f"  {label:16} {v:9.1f}")
    verdict = "fits" if e.fits else f"does NOT fit: {e.fit_reason}"
    print(
        f"  peak {e.peak_mem_gib:.1f} GiB in {e.peak_phase} of {cluster.gpu.memory_gib:.1f} GiB: "
        f"{verdict}"
    )
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from tuner.estimate import load_profile, save_profile
    from tuner.estimate.calibrate import calibrate, observations_from_rows
    from tuner.estimate.profile import DEFAULT_PROFILE_PATH, Profile
    from tuner.estimate.validate import reported_response_mean
    from tuner.results import read_rows

    rows: list[dict[str, str]] = []
    obs = []
    for path in args.csv:
        file_rows = read_rows(path)
        if args.gpu:
            file_rows = [r for r in file_rows if (r.get("gpu") or "").lower() == args.gpu.lower()]
        rows += file_rows
        obs += observations_from_rows(file_rows, response_mean=reported_response_mean(file_rows))
    start = load_profile(args.start) if args.start else Profile()
    res = calibrate(obs, start)
    kinds = sorted({o.case.cluster.gpu.name for o in obs})
    sources = sorted({r.get("source", "") for r in rows if r.get("status") == "ok"} - {"estimate"})
    print(
        f"calibrating on {res.rows} measured rows ({res.observations} phase times; GPU "
        f"{', '.join(kinds)}; sources {', '.join(sources)})"
    )
    phases = sorted(set(res.error_before) | set(res.error_after))
    for label, err, rms in (
        ("before", res.error_before, res.rms_log_before),
        ("after", res.error_after, res.rms_log_after),
    ):
        parts = ", ".join(f"{ph} {err.get(ph, float('nan')) * 100:.1f}%" for ph in phases)
        print(f"  {label:6} median abs error: {parts}; rms log error {rms:.3f}")
    for name, (old, new) in res.changes().items():
        print(f"  {name:24} {old:.4g} -> {new:.4g}")
    if not res.changes():
        print("  no constant changed")
    if args.dry_run:
        return 0
    path = save_profile(
        res.profile,
        args.out or DEFAULT_PROFILE_PATH,
        rows=res.rows,
        observations=res.observations,
        gpus=kinds,
        sources=[str(p) for p in args.csv],
        fitted=list(res.fitted),
        error_before=res.error_before,
        error_after=res.error_after,
    )
    print(f"profile written to {path} (tune uses it by default when run from this folder)")
    return 0


COMMANDS = {
    "run": cmd_run,
    "show": cmd_show,
    "export": cmd_export,
    "plot": cmd_plot,
    "models": cmd_models,
    "estimate": cmd_estimate,
    "calibrate": cmd_calibrate,
}

if __name__ == "__main__":
    raise SystemExit(main())
