"""`tune`: parse the command line, call the library, print.

Every argument is checked before a command creates or launches anything: its syntax by the
`type=` functions of `tuner.cli_args`, what needs the file system by `cli_args.validate`. Bad
input, and a file-system error inside a command (a read-only folder, a file where a folder
should be), is one line on stderr and exit code 2. When the reader of the output goes away
(`tune show ... | head`), tune stops quietly with exit code 1, as Python's documentation
advises for SIGPIPE (library/signal.html, "Note on SIGPIPE").
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.cli_args import (
    OneLineParser,
    env_assignment,
    error_line,
    fraction,
    layout_text,
    model_arg,
    non_negative_float,
    non_negative_int,
    os_error_line,
    path_text,
    positive_float,
    positive_int,
    seed,
    study_name,
    validate,
    verl_override_text,
)
from tuner.errors import UserError

DESCRIPTION = """\
Find the fastest verl Megatron configuration for a model, an RL workload and a GPU count.

  tune --model qwen3-30b-moe --gpus 32          search (runner auto: estimator without a GPU)
  tune show results/<study>.csv                 ranked leaderboard (ours or a reference CSV)
  tune export results/<study>.csv --rank 1      the best row as a runnable verl script
  tune plot results/<study>.csv                 search progress and best layouts as a PNG
  tune report results/<study>.csv               one HTML page: the answer, progress, costs
  tune models                                   the model registry
  tune estimate --model qwen2.5-7b --gpus 8 --layout tp4pp2    the cost model for one layout
"""


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        type=model_arg,
        help="registry name (see `tune models`) or a path to a Hugging Face "
        "config.json or its folder",
    )
    p.add_argument("--gpus", type=positive_int, required=True, help="GPUs in all")
    p.add_argument(
        "--gpus-per-node", type=positive_int, default=8, help="GPUs per node (default 8)"
    )
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
    g.add_argument("--prompt-len", type=positive_int, help="max prompt tokens")
    g.add_argument("--response-len", type=positive_int, help="max response tokens")
    g.add_argument(
        "--response-mean",
        type=positive_int,
        help="mean response tokens (default: 15%% of the max, early-training math runs)",
    )
    g.add_argument(
        "--prompt-mean",
        type=positive_int,
        help="mean prompt tokens, unpadded (default: 10%% of the max)",
    )
    g.add_argument("--batch", type=positive_int, help="prompts per step (data.train_batch_size)")
    g.add_argument("--n", type=positive_int, help="responses per prompt (rollout.n)")
    g.add_argument("--mini-batch", type=positive_int, help="PPO mini batch in prompts")


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
        type=path_text,
        help="a verl parquet of prompts (default: a synthetic one of the workload's lengths)",
    )
    g.add_argument(
        "--reward-fn",
        type=path_text,
        help="a Python file with compute_score() (default: reward.py beside --train-file, "
        "else verl's scorer for each row's data_source)",
    )
    g.add_argument(
        "--verl-bridge",
        choices=("megatron-bridge", "mbridge"),
        help="how verl builds the Megatron model: megatron-bridge (verl 0.9.1's default) or "
        "mbridge (actor.megatron.vanilla_mbridge=True); recorded in each row and the recipe",
    )
    g.add_argument(
        "--verl-override",
        action="append",
        default=[],
        type=verl_override_text,
        metavar="KEY=VALUE",
        help="another verl Hydra override for every trial (repeatable), checked against verl's "
        "own config before anything launches; recorded in each row and the recipe",
    )
    g.add_argument(
        "--verl-env",
        action="append",
        default=[],
        type=env_assignment,
        metavar="NAME=VALUE",
        help="an environment variable for every trial (repeatable); recorded in each row and "
        "the recipe (the preflight adds what the host needs, e.g. VLLM_USE_FLASHINFER_SAMPLER=0 "
        "where flashinfer is absent)",
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


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
        type=positive_int,
        default=50,
        help="trials the study should hold; a resumed study runs the rest (default 50)",
    )
    g.add_argument(
        "--timeout",
        type=positive_float,
        default=None,
        help="stop starting trials after this many seconds (default: none)",
    )
    g.add_argument(
        "--trial-timeout",
        type=positive_float,
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
        "--study",
        type=study_name,
        default="",
        help="study name: ASCII letters, digits and . _ -, at most 100 "
        "(default: model-gpuxN[-workload]-runner)",
    )
    g.add_argument("--seed", type=seed, default=0, help="sampler seed (default 0)")
    g.add_argument(
        "--no-warm-start",
        action="store_true",
        help="do not try the reference layouts and the estimator's best first",
    )
    g.add_argument(
        "--hand-grid",
        action="store_true",
        help="also measure what a user would try by hand (plain layouts x recompute none/full "
        "x token budget 1x/2x; rows say origin=hand grid), so the leaderboard states the tuned "
        "best against the hand best",
    )
    g.add_argument(
        "--verl-example",
        action="store_true",
        help="also measure verl's own Megatron GRPO example (examples/grpo_trainer/"
        "run_qwen2-7b_math_megatron.sh) scaled to --gpus, first (origin=hand: verl example)",
    )
    g.add_argument("--results-dir", type=path_text, default=Path("results"))
    g.add_argument("--recipes-dir", type=path_text, default=Path("recipes"))
    g.add_argument(
        "--recipes",
        type=non_negative_int,
        default=3,
        help="write recipe scripts for this many best rows (default 3; 0: none)",
    )
    g.add_argument(
        "--headroom-gib",
        type=non_negative_float,
        default=None,
        help="GPU memory to keep free when pruning what cannot fit (default: learned from "
        "measured trials)",
    )
    g.add_argument(
        "--profile",
        type=path_text,
        default=None,
        help="calibration profile (default results/calibration.json if present)",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_verl_runner_args(run)

    show = sub.add_parser(
        "show",
        help="print leaderboards, ranked, references beside the tuned rows",
        description="Rank the rows of one or more leaderboards (ours or published reference "
        "CSVs). vs_ref is each row's throughput over the best ok reference row (a published "
        "row, or a reference layout run in the study) of the same model on the same GPU kind "
        "and count.",
    )
    show.add_argument(
        "csv", type=path_text, nargs="+", help="leaderboard CSV(s), ours or reference"
    )
    show.add_argument("--gpu", help="only rows of this GPU kind (h200) or kind and count (h200x2)")
    show.add_argument("--model", help="only rows whose model contains this text")
    show.add_argument(
        "--status", help="only rows with this status (ok, oom, failed, ...; comma-separated)"
    )
    show.add_argument(
        "--source", help="only rows from this source (estimate, megatron, verl, reference)"
    )
    show.add_argument("--top", type=positive_int, default=None, help="only the first N rows")
    show.add_argument(
        "--sort",
        help="column to sort by (default: tokens_per_s_per_gpu, or step_s where no row has a "
        "throughput)",
    )
    show.add_argument("--asc", action="store_true", help="ascending")
    show.add_argument(
        "--columns", help="comma-separated columns to print (names or headings; `all`)"
    )
    show.add_argument(
        "--format",
        choices=("table", "csv", "json", "markdown"),
        default="table",
        help="table (default), csv, json (a list of objects) or markdown",
    )

    exp = sub.add_parser("export", help="write a row as a runnable verl recipe script")
    exp.add_argument("csv", type=path_text, help="leaderboard CSV")
    exp.add_argument(
        "--rank", type=positive_int, default=None, help="rank among ok rows (default 1)"
    )
    exp.add_argument(
        "--trial", type=non_negative_int, default=None, help="or a trial number (not with --rank)"
    )
    exp.add_argument(
        "--steps", type=positive_int, default=3, help="trainer.total_training_steps (default 3)"
    )
    exp.add_argument("--recipes-dir", type=path_text, default=Path("recipes"))

    plot = sub.add_parser("plot", help="draw a leaderboard as a PNG (needs matplotlib)")
    plot.add_argument("csv", type=path_text, help="leaderboard CSV")
    plot.add_argument(
        "--out", type=path_text, default=None, help="PNG path (default: beside the CSV, same name)"
    )

    rep = sub.add_parser(
        "report",
        help="one self-contained HTML report of a study (needs matplotlib)",
        description="Write one HTML file (figures inline, opens offline): the best "
        "configuration and its ratio to the best reference on the same GPUs, search progress, "
        "throughput vs peak memory, knob importances (fANOVA, from the Optuna storage), time "
        "per phase, failures, cost, predicted vs measured. Prints its path.",
    )
    rep.add_argument("csv", type=path_text, help="leaderboard CSV")
    rep.add_argument(
        "--storage",
        default=None,
        help="the study's Optuna storage, for knob importances (default: the one the CSV "
        "names, else studies.sqlite3 beside the CSV)",
    )
    rep.add_argument(
        "--reference",
        type=path_text,
        action="append",
        default=[],
        metavar="CSV",
        help="published reference CSV to compare with (repeatable; default: the model's "
        "files under tests/data/anchors or $TUNER_REFERENCE_DIR)",
    )
    rep.add_argument(
        "-o",
        "--out",
        type=path_text,
        default=None,
        help="HTML path (default: beside the CSV, same name)",
    )

    sub.add_parser("models", help="list the model registry")

    est = sub.add_parser("estimate", help="the cost model's prediction for one configuration")
    _add_cluster_args(est)
    _add_workload_args(est)
    est.add_argument(
        "--layout",
        required=True,
        type=layout_text,
        help="tp4pp2vpp2, tp2cp2, ep8cp4, tp4ep16, ...",
    )
    est.add_argument("--rollout-tp", type=positive_int, default=1)
    est.add_argument(
        "--max-token-len",
        type=positive_int,
        default=None,
        help="ppo_max_token_len_per_gpu (default 2x prompt+response)",
    )
    est.add_argument(
        "--logprob-max-token-len",
        type=positive_int,
        default=None,
        help="log_prob_max_token_len_per_gpu (default 3x prompt+response)",
    )
    est.add_argument("--offload", action="store_true", help="param, grad and optimizer offload")
    est.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    est.add_argument("--no-fused-kernels", action="store_true")
    est.add_argument("--no-sequence-parallel", action="store_true")
    est.add_argument("--gpu-memory-utilization", type=fraction, default=0.6)
    est.add_argument(
        "--micro-batch",
        type=positive_int,
        default=None,
        help="fixed micro-batch size per GPU instead of dynamic token budgets",
    )
    est.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=None,
        help="vLLM tokens per scheduler step (default prompt + response)",
    )
    est.add_argument(
        "--profile",
        type=path_text,
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
    cal.add_argument("csv", type=path_text, nargs="+", help="leaderboard CSV(s) with measured rows")
    cal.add_argument(
        "--out",
        type=path_text,
        default=None,
        help="profile to write (default results/calibration.json)",
    )
    cal.add_argument(
        "--start",
        type=path_text,
        default=None,
        help="profile to start from (default: the built-in constants)",
    )
    cal.add_argument("--gpu", default=None, help="only rows of this GPU kind (e.g. h100)")
    cal.add_argument(
        "--dry-run", action="store_true", help="print the fit, do not write the profile"
    )
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def _stdout_gone() -> int:
    """The reader of stdout went away (`tune show ... | head`): stop quietly. Python flushes
    stdout at exit; pointing it at /dev/null keeps that flush from raising again. Exit 1, as
    Python's documentation does (library/signal.html, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
        pass
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        if sys.stdout is None:  # started with stdout closed (`tune ... >&-`)
            raise UserError("stdout is closed: run tune with its output open, e.g. > tune.out")
        if args_list and not args_list[0].startswith("-"):
            if args_list[0] not in _subcommands(parser):
                known = ", ".join(sorted(_subcommands(parser)))
                raise UserError(
                    f"unknown command {args_list[0]!r}: use one of {known}, or start with "
                    "--model to search"
                )
        elif args_list and args_list[0] not in ("-h", "--help"):
            args_list.insert(0, "run")
        args = parser.parse_args(args_list)
        if args.command is None:
            parser.print_help()
            return 2
        validate(args)
        code = int(COMMANDS[args.command](args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except UserError as e:
        print(f"tune: error: {error_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _stdout_gone()
    except OSError as e:
        print(f"tune: error: {os_error_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tune: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


def cmd_run(args: argparse.Namespace) -> int:
    from tuner.cli_args import storage_failure_line
    from tuner.request import build_request, build_setup, check_request_paths, verl_runner_options
    from tuner.runners import make_runner
    from tuner.study import Progress, run_study

    setup = build_setup(args)
    options = verl_runner_options(args) if args.runner == "verl" else {}
    runner = make_runner(args.runner, **options)
    req = build_request(args, setup, runner)
    check_request_paths(req)
    # before the space is drawn: the verl runner's preflight decides what the host can run
    runner.check_available(setup.cluster)
    if args.runner == "auto" and runner.name == "estimate":
        print(
            "tune: no GPU here: using the estimator (rows say source=estimate; nothing is measured)"
        )
    else:
        print(f"tune: runner {runner.name}")
    why = runner.space_limits(setup.model).why
    if why:
        print(f"tune: {why}")
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
    except Exception as e:  # the storage failing mid-study (its disk full): one line
        line = storage_failure_line(e, str(req.storage_url))
        if line is None:
            raise
        raise UserError(line) from None
    finally:
        if bar is not None:
            bar.close()
    notes = list(getattr(summary, "notes", ()) or ())
    if nothing_fits(summary):  # the README's promise: a GPU count no layout fits is exit 2
        raise UserError(notes[-1] if notes else f"no candidate fits: see {summary.csv_path}")
    for note in notes:
        print(f"tune: {note}", file=sys.stderr)
    print(summary_text(summary))
    return 0


def nothing_fits(summary: Any) -> bool:
    """The study could launch nothing: no trial in it at all, and this run gave up after
    MAX_CONSECUTIVE_UNFIT candidates pruned before launch."""
    from tuner.study.loop import MAX_CONSECUTIVE_UNFIT

    pruned = int(getattr(summary, "pruned_before_launch", 0) or 0)
    return summary.trials_total == 0 and not summary.best_rows and pruned >= MAX_CONSECUTIVE_UNFIT


def summary_text(summary: Any) -> str:
    """What a finished `tune run` prints on stdout: the study, how its trials' wall time split,
    the best rows and the recipes (StudySummary fields this version may lack: getattr)."""
    from tuner.results import SHOW_COLUMNS, format_table

    lines = []
    if summary.resumed_from:
        lines.append(
            f"resumed study {summary.name}: {summary.resumed_from} trials were done before"
        )
    pruned = getattr(summary, "pruned_before_launch", 0) or 0
    lines.append(
        f"study {summary.name}: {summary.trials_run} trials run, {summary.trials_total} in all"
        + (f", {pruned} pruned before launch" if pruned else "")
        + f"; leaderboard {summary.csv_path}"
    )
    measured = float(getattr(summary, "measured_s", 0.0) or 0.0)
    launch = float(getattr(summary, "launch_s", 0.0) or 0.0)
    other = float(getattr(summary, "other_s", 0.0) or 0.0)
    if measured + launch > 0:
        lines.append(
            f"wall time: {measured:.0f} s in measured steps, {launch:.0f} s launching"
            + (f", {other:.0f} s other" if other else "")
            + f" ({100 * measured / (measured + launch + other):.0f}% measuring)"
        )
    if summary.best_rows:
        lines.append(format_table(summary.best_rows, [c for c in SHOW_COLUMNS if c != "reason"]))
    else:
        lines.append("no trial finished ok: see the reason column of the leaderboard")
    lines += [f"recipe: {p}" for p in summary.recipe_paths]
    return "\n".join(lines)


def cmd_show(args: argparse.Namespace) -> int:
    from tuner.leaderboard import (
        load_leaderboard,
        rank,
        render,
        resolve_columns,
        select,
        with_reference_ratio,
    )

    df = with_reference_ratio(load_leaderboard(args.csv))
    df = select(df, gpu=args.gpu, model=args.model, status=args.status, source=args.source)
    df = rank(df, sort=args.sort, ascending=True if args.asc else None, top=args.top)
    cols = resolve_columns(df, args.columns.split(",") if args.columns else None)
    if not args.columns and len(args.csv) > 1:
        cols = ["study", *cols]
    print(render(df, cols, args.format))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tuner.export import export_recipe

    print(
        export_recipe(
            args.csv,
            rank=args.rank or 1,
            trial=args.trial,
            steps=args.steps,
            recipes_dir=args.recipes_dir,
        )
    )
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from tuner.leaderboard import load_leaderboard
    from tuner.plots import plot_leaderboard

    out = args.out or args.csv.with_suffix(".png")
    print(plot_leaderboard(load_leaderboard(args.csv), out, title=args.csv.stem))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from tuner.report import write_report

    print(write_report(args.csv, args.out, storage=args.storage, references=args.reference))
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
    import json

    from tuner.cli_args import finite_json
    from tuner.estimate import estimate, load_profile
    from tuner.estimate.report_text import format_estimate
    from tuner.request import build_candidate, build_setup

    s = build_setup(args)
    c = build_candidate(args, s)
    e = estimate(c, s.model, s.cluster, s.workload, load_profile(args.profile))
    if args.json:
        print(json.dumps(finite_json(e.as_dict()), default=float, allow_nan=False))
    else:
        print(format_estimate(e, c, s.model, s.cluster, s.workload))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from tuner.estimate import load_profile
    from tuner.estimate.report_text import fit_leaderboards, format_fit, save_fit

    start = load_profile(args.start) if args.start else None
    fit = fit_leaderboards(args.csv, gpu=args.gpu, start=start)
    print(format_fit(fit))
    if args.dry_run:
        return 0
    path = save_fit(fit, args.out)
    print(f"profile written to {path} (tune uses it by default when run from this folder)")
    return 0


COMMANDS = {
    "run": cmd_run,
    "show": cmd_show,
    "export": cmd_export,
    "plot": cmd_plot,
    "report": cmd_report,
    "models": cmd_models,
    "estimate": cmd_estimate,
    "calibrate": cmd_calibrate,
}

if __name__ == "__main__":
    raise SystemExit(main())
