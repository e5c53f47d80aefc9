"""`tune`'s argument parser: every subcommand and its arguments, with their defaults and help.

Each argument's check is a `type=` function of `tuner.cli_args`; `tuner.cli` parses with
`build_parser()` and runs the command."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tuner.cli_args import (
    RUN_OPTIONS,
    OneLineParser,
    env_assignment,
    layout_text,
    model_arg,
    non_negative_float,
    non_negative_int,
    path_text,
    positive_int,
    seed,
    study_name,
    verl_override_text,
)
from tuner.cli_args.values import (
    GPUS,
    GPUS_PER_NODE,
    HOST_MEM,
    PROMPTS,
    RESPONSES,
    STEPS,
    STUDY_SECONDS,
    TOKENS,
    TRIAL_SECONDS,
    TRIALS,
    VERL_STEPS,
    knob_value,
    real_in,
    whole_in,
)
from tuner.hardware import GPUS as GPUS_KINDS
from tuner.headroom import PHASE_HEADROOM_GIB
from tuner.megatron_layers import LAYER_SPEC_CHOICES

CALIBRATE_SOURCES = ("megatron", "verl")
"""`tune calibrate --source`: the runners that measure (their `name`, the rows' `source`)."""

DESCRIPTION = """\
Find the fastest verl Megatron configuration for a model, an RL workload and a GPU count.

  tune --model qwen3-30b-moe --gpus 32          search (runner auto: estimator without a GPU)
  tune show results/<study>.csv                 ranked leaderboard (ours or a reference CSV)
  tune export results/<study>.csv --rank 1      the best row as a runnable verl script
  tune plot results/<study>.csv                 search progress and best layouts as a PNG
  tune report results/<study>.csv               one HTML page: the answer, progress, costs
  tune reread --study <study>                   fill old verl rows from their own logs
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
    p.add_argument("--gpus", type=whole_in(GPUS), required=True, help=f"GPUs in all ({GPUS.text})")
    p.add_argument(
        "--gpus-per-node",
        type=whole_in(GPUS_PER_NODE),
        default=8,
        help=f"GPUs per node ({GPUS_PER_NODE.text}; default 8)",
    )
    p.add_argument(
        "--gpu",
        default="h100",
        help=f"GPU kind: {', '.join(GPUS_KINDS)} (default h100)",
    )
    p.add_argument(
        "--host-mem-gib",
        type=real_in(HOST_MEM),
        help="host memory (CPU RAM) of one node, GiB: candidates whose offloaded states are "
        "predicted over Ray's kill line (95%%) are pruned (default: this machine's for "
        "`--runner verl` launched here on one node, else not checked)",
    )


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    from tuner.workload import EXPERT_IMBALANCE, PRESETS

    g = p.add_argument_group("workload (a preset, each field overridable)")
    g.add_argument(
        "--workload",
        default="dapo-math",
        help=f"preset: {', '.join(PRESETS)} (default dapo-math: 2048-token prompts, "
        "8192-token responses, 512 prompts x 16, mini batch 32)",
    )
    g.add_argument("--algorithm", choices=("grpo", "dapo", "ppo"))
    g.add_argument("--prompt-len", type=whole_in(TOKENS), help=f"max prompt tokens ({TOKENS.text})")
    g.add_argument(
        "--response-len", type=whole_in(TOKENS), help=f"max response tokens ({TOKENS.text})"
    )
    g.add_argument(
        "--response-mean",
        type=whole_in(TOKENS),
        help="mean response tokens (default: 15%% of the max, early-training math runs)",
    )
    g.add_argument(
        "--prompt-mean",
        type=whole_in(TOKENS),
        help="mean prompt tokens, unpadded (default: 10%% of the max)",
    )
    g.add_argument(
        "--batch",
        type=whole_in(PROMPTS),
        help=f"prompts per step (data.train_batch_size; {PROMPTS.text})",
    )
    g.add_argument(
        "--n", type=whole_in(RESPONSES), help=f"responses per prompt (rollout.n; {RESPONSES.text})"
    )
    g.add_argument(
        "--mini-batch", type=whole_in(PROMPTS), help=f"PPO mini batch in prompts ({PROMPTS.text})"
    )
    g.add_argument(
        "--expert-imbalance",
        type=real_in(EXPERT_IMBALANCE),
        help="MoE: the busiest expert's routed tokens over the mean expert's, as your trained "
        f"router routes them ({EXPERT_IMBALANCE.text}; default 1, perfect balance; verl's "
        "rollout/moe/max_vio/avg + 1)",
    )


def _add_run_option(g: Any, flag: str, **kwargs: Any) -> None:
    """Adds the `tune run` option `flag` as `RUN_OPTIONS` declares it (the runners and launcher
    it serves, which `check_runner_options` asks): its default from there, and its help opened
    by the launcher it serves (`--launcher ray: ...`)."""
    opt = RUN_OPTIONS[flag]
    help_text = kwargs.pop("help")
    if opt.launcher:
        help_text = f"--launcher {opt.launcher}: {help_text}"
    g.add_argument(flag, default=opt.parser_default, help=help_text, **kwargs)


def _add_verl_runner_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "verl runner (--runner verl: real verl main_ppo trials of 3 steps; see docs/clusters.md)"
    )
    _add_run_option(
        g,
        "--launcher",
        choices=("local", "ray", "slurm"),
        help="where trials run: this node, a Ray cluster (Jobs API) or Slurm (default local)",
    )
    _add_run_option(
        g,
        "--model-path",
        help="the model's Hugging Face weights (a folder every node can read)",
    )
    _add_run_option(
        g,
        "--train-file",
        type=path_text,
        help="a verl parquet of prompts (default: a synthetic one of the workload's lengths)",
    )
    _add_run_option(
        g,
        "--reward-fn",
        type=path_text,
        help="a Python file with compute_score() (default: reward.py beside --train-file, "
        "else verl's scorer for each row's data_source)",
    )
    _add_run_option(
        g,
        "--verl-bridge",
        choices=("megatron-bridge", "mbridge"),
        help="how verl builds the Megatron model: megatron-bridge (verl 0.9.1's default) or "
        "mbridge (actor.megatron.vanilla_mbridge=True); recorded in each row and the recipe",
    )
    _add_run_option(
        g,
        "--verl-override",
        action="append",
        type=verl_override_text,
        metavar="KEY=VALUE",
        help="another verl Hydra override for every trial (repeatable), checked against verl's "
        "own config before anything launches; recorded in each row and the recipe",
    )
    _add_run_option(
        g,
        "--verl-env",
        action="append",
        type=env_assignment,
        metavar="NAME=VALUE",
        help="an environment variable for every trial (repeatable); recorded in each row and "
        "the recipe (the preflight adds what the host needs, e.g. VLLM_USE_FLASHINFER_SAMPLER=0 "
        "where flashinfer is absent)",
    )
    _add_run_option(
        g,
        "--verl-steps",
        type=whole_in(VERL_STEPS),
        help=f"training steps of each trial ({VERL_STEPS.text}; default 3): the 3rd and every "
        "later one are measured, the row their mean and how many (`measured_steps` in extra); "
        "each step beyond the 3rd costs one steady step of launch time and steadies the figure",
    )
    _add_run_option(g, "--ray-address", help="the dashboard, http://<head>:8265")
    _add_run_option(
        g,
        "--shared-ray",
        action="store_true",
        help="one Ray cluster on this node for the whole study, which every trial's verl "
        "joins, instead of a Ray start per trial; stopped when the study ends",
    )
    _add_run_option(g, "--slurm-partition", help="#SBATCH --partition")
    _add_run_option(g, "--slurm-account", help="#SBATCH --account")
    _add_run_option(
        g,
        "--slurm-arg",
        action="append",
        metavar="OPTION",
        help="another #SBATCH option, e.g. --slurm-arg=--qos=high (repeatable)",
    )
    _add_run_option(
        g,
        "--slurm-setup",
        help="shell lines run first in the job, e.g. 'source /shared/venv/bin/activate'",
    )


def build_parser() -> OneLineParser:
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
        type=whole_in(TRIALS),
        default=50,
        help="trials the study should hold; a resumed study runs the rest (default 50)",
    )
    g.add_argument(
        "--timeout",
        type=real_in(STUDY_SECONDS),
        default=None,
        help=f"stop starting trials after this many seconds ({STUDY_SECONDS.text}; default: none)",
    )
    _add_run_option(
        g,
        "--trial-timeout",
        type=real_in(TRIAL_SECONDS),
        help="seconds one launched trial may run before it ends as `timeout` "
        f"({TRIAL_SECONDS.text}; default 1800)",
    )
    g.add_argument(
        "--runner",
        default="auto",
        choices=("auto", "estimate", "megatron", "verl", "ladder"),
        help="auto: megatron on a GPU machine, else the estimator (default auto); ladder: the "
        "fidelity ladder: the estimator prunes, the megatron runner screens every candidate "
        "(rows source=megatron), real verl confirms the best (rows source=verl, the whole step; "
        "needs the verl runner's options) and the study learns each phase's verl/megatron ratio",
    )
    _add_run_option(
        g,
        "--confirm-top",
        type=positive_int,
        help="--runner ladder: real verl confirms this many best screened candidates at the "
        "study's end, besides each screened one predicted (by the learned ratios) to beat the "
        "best confirmed, at once (default 3)",
    )
    _add_run_option(
        g,
        "--measure-generation",
        action=argparse.BooleanOptionalAction,
        help="the megatron runner generates each trial's rollout with vLLM (one engine kept "
        "across trials with the same rollout settings, asleep while training runs) and ranks "
        "by generation + training; default: where vLLM imports and --model is a config.json "
        "path, else generation is predicted. --measure-generation without vLLM is an error",
    )
    _add_run_option(
        g,
        "--layer-spec",
        choices=LAYER_SPEC_CHOICES,
        help="the layers the megatron runner builds: te (transformer-engine's, as verl builds "
        "its actor; its fused kernels are searched) or local (megatron-core's local layers, as "
        "the committed leaderboards ran); auto: te where transformer_engine imports (default)",
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
    g.add_argument(
        "--allow-off-policy",
        action="store_true",
        help="also search the split placement: vLLM on r GPUs of its own and the actor on the "
        "rest, the next step's generation overlapping this step's training (verl's "
        "one_step_off_policy). CHANGES THE ALGORITHM: each step trains on rollouts one step "
        "stale, with verl's rollout_correction bypass; rows and recipes say so. Runners: verl "
        "and estimate (default: off, every candidate colocated)",
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
    g.add_argument(
        "--candidates-from",
        type=path_text,
        default=None,
        metavar="CSV",
        help="also measure the ok rows' configurations of another leaderboard of the same model, "
        "GPUs and workload, first (origin=from <csv> trial <n>): e.g. the megatron runner on "
        "the candidates real verl measured, to compare the phases",
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
        help="GPU memory (GiB) to keep free in every phase when pruning what cannot fit "
        "(default: each phase's own, fitted on measured rows: "
        + ", ".join(f"{p} {v:g}" for p, v in PHASE_HEADROOM_GIB.items())
        + "; a study's memory guard then learns from its own trials)",
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
        help="column to sort by (default: the broadest scope first, step before gen+train "
        "before train only before predicted, then tokens_per_s_per_gpu, or step_s where no row "
        "has a throughput)",
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
        "--steps",
        type=whole_in(STEPS),
        default=3,
        help=f"trainer.total_training_steps ({STEPS.text}; default 3)",
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

    rr = sub.add_parser(
        "reread",
        help="fill a study's empty verl measures from its trials' own logs",
        description="Read the finished ok verl rows of a study again, from the logs their trials "
        "left in <results-dir>/<study>/trials/<n>/ (verl's metrics file, else verl.log, "
        "verl.log.gz or verl.log.tail), with this version's parser: each measured field "
        "(throughput, phase times, allocator peaks) a row has empty is filled from the same "
        "step the row reports, in a log whose throughput at that step is the row's. A value a "
        "row holds is never replaced. The values are kept in the study's storage (study user "
        "attr `reread`, with the log and the parser that read them: Optuna keeps a finished "
        "trial as it was) and shown by every reader of the study; the CSV is rebuilt and the "
        "row's extra says `reread=<fields>`. Prints one line per row. Running it again changes "
        "nothing.",
    )
    rr.add_argument("--study", type=study_name, required=True, help="the study's name")
    rr.add_argument(
        "--results-dir",
        type=path_text,
        default=Path("results"),
        help="the folder holding <study>.csv, <study>/trials/ and the storage (default results)",
    )
    rr.add_argument(
        "--storage",
        default=None,
        help="the study's Optuna storage (default: <study>.sqlite3, else studies.sqlite3, in "
        "--results-dir)",
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
    est.add_argument("--rollout-tp", type=knob_value("rollout_tp", whole=True), default=1)
    est.add_argument(
        "--max-token-len",
        type=knob_value("ppo_max_token_len_per_gpu", whole=True, positive=True),
        default=None,
        help="ppo_max_token_len_per_gpu (default 2x prompt+response)",
    )
    est.add_argument(
        "--logprob-max-token-len",
        type=knob_value("log_prob_max_token_len_per_gpu", whole=True, positive=True),
        default=None,
        help="log_prob_max_token_len_per_gpu (default 3x prompt+response)",
    )
    est.add_argument("--offload", action="store_true", help="param, grad and optimizer offload")
    est.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    est.add_argument("--no-fused-kernels", action="store_true")
    est.add_argument("--no-sequence-parallel", action="store_true")
    est.add_argument(
        "--gpu-memory-utilization",
        type=knob_value("gpu_memory_utilization", whole=False),
        default=0.6,
    )
    est.add_argument(
        "--micro-batch",
        type=knob_value("ppo_micro_batch_size_per_gpu", whole=True),
        default=None,
        help="fixed micro-batch size per GPU instead of dynamic token budgets",
    )
    est.add_argument(
        "--max-num-batched-tokens",
        type=knob_value("max_num_batched_tokens", whole=True, positive=True),
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
        "--source",
        choices=CALIBRATE_SOURCES,
        default=None,
        help="only rows measured by this runner: verl's training phases include its controller "
        "and data dispatch (up to 1.5 x the megatron runner's on the same candidates, "
        "results/README.md), so a profile for verl's steps fits verl's rows (default: all)",
    )
    cal.add_argument(
        "--dry-run", action="store_true", help="print the fit, do not write the profile"
    )
    parser.commands = tuple(sub.choices)
    return parser


def subcommands(parser: OneLineParser) -> set[str]:
    """The names of the parser's subcommands (`run`, `show`, ...), as build_parser declared them."""
    return set(parser.commands)
