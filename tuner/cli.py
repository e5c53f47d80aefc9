"""`tune`: parse the command line, call the library, print.

Every argument is checked before a command creates or launches anything: its syntax by the
`type=` functions of `tuner.cli_args`, what needs the file system by `cli_args.validate`. Bad
input, and a file-system error inside a command (a read-only folder, a file where a folder
should be), is one line on stderr and exit code 2. When the reader of the output goes away
(`tune show ... | head`), tune stops quietly with exit code 1, as Python's documentation
advises for SIGPIPE (library/signal.html, "Note on SIGPIPE").
The parser, its arguments and their help are built in `tuner.cli_parser`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner.errors import UserError

if TYPE_CHECKING:
    import argparse

    from tuner.cli_parser import build_parser

__all__ = ["COMMANDS", "build_parser", "main", "nothing_fits", "summary_text"]


def __getattr__(name: str) -> Any:
    # Lazy: importing this module imports nothing of the parser's, so that `tune`'s console
    # script reaches main's handlers at once; a Ctrl-C while the parser's modules load is
    # then the one line of an interrupt, not a traceback (issue 38).
    if name == "build_parser":
        from tuner.cli_parser import build_parser

        return build_parser
    raise AttributeError(f"module 'tuner.cli' has no attribute {name!r}")


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


def _storage_named(args: argparse.Namespace) -> str:
    """The storage a command reads, as its errors name it: --storage, or run's default."""
    given = getattr(args, "storage", None)
    if given:
        return str(given)
    if args.command == "run":
        return str(os.path.join(args.results_dir, "studies.sqlite3"))
    return "of the study"


def _tolerant_output() -> None:
    """Text the terminal's encoding cannot show (a model folder's non-ASCII name under
    PYTHONIOENCODING=ascii or LANG=C) is printed as `\\u...` escapes, not a UnicodeEncodeError
    traceback (issue 38); stderr does so by Python's default already."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if callable(reconfigure):
            with contextlib.suppress(ValueError, OSError):  # a closed or detached stream
                reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    """`tune` with the arguments `argv` (sys.argv's by default); returns the exit code. Every
    import and the parser's construction are inside the handlers: a Ctrl-C in the first
    moments was a traceback (issue 38)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("tune: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        _tolerant_output()
        from tuner.cli_args import validate
        from tuner.cli_parser import build_parser, subcommands

        parser = build_parser()
        if sys.stdout is None:  # started with stdout closed (`tune ... >&-`)
            raise UserError("stdout is closed: run tune with its output open, e.g. > tune.out")
        if args_list and not args_list[0].startswith("-"):
            if args_list[0] not in subcommands(parser):
                known = ", ".join(sorted(subcommands(parser)))
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
        try:
            code = int(COMMANDS[args.command](args) or 0)
        except UserError:
            raise
        except Exception as e:  # a storage failing, or keeping what Optuna cannot read back
            from tuner.cli_args import storage_failure_line

            line = storage_failure_line(e, _storage_named(args))
            if line is None:
                raise
            raise UserError(line) from None
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except UserError as e:
        from tuner.cli_args import error_line

        print(f"tune: error: {error_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _stdout_gone()
    except OSError as e:
        from tuner.cli_args import os_error_line

        print(f"tune: error: {os_error_line(e)}", file=sys.stderr)
        return 2
    except MemoryError:  # a memory limit (`ulimit -v`) below what the command needs
        print(
            "tune: error: out of memory: raise the memory limit (ulimit -v) or pass smaller files",
            file=sys.stderr,
        )
        return 2


def cmd_run(args: argparse.Namespace) -> int:
    from tuner.cli_args import storage_failure_line
    from tuner.cli_request import (
        build_request,
        build_setup,
        check_request_paths,
        megatron_runner_options,
        probe_request_paths,
        verl_runner_options,
        with_local_host_memory,
    )
    from tuner.runners import make_runner
    from tuner.study import Progress, run_study

    setup = build_setup(args)
    if args.runner in ("verl", "ladder"):  # real verl launches: its node's RAM bounds offload
        setup = with_local_host_memory(args, setup)
    options: dict[str, Any] = {}
    if args.runner == "verl":
        options = verl_runner_options(args)
    elif args.runner == "ladder":  # the fast runner screens, real verl confirms
        options = {
            "fast": megatron_runner_options(args),
            "confirm": verl_runner_options(args),
            "confirm_top": args.confirm_top,
        }
    elif args.runner in ("megatron", "auto"):  # auto may choose megatron
        options = megatron_runner_options(args)
    runner = make_runner(args.runner, **options)
    req = build_request(args, setup, runner)
    check_request_paths(req)
    # before the space is drawn: the verl runner's preflight decides what the host can run
    runner.check_available(setup.cluster)
    limits = runner.space_limits(setup.model)
    refuse_if_nothing_fits(req, limits)  # before the storage or the leaderboard is written
    probe_request_paths(req)  # the folders take a file (os.access alone misses some)
    if args.runner == "auto" and runner.name == "estimate":
        print(
            "tune: no GPU here: using the estimator (rows say source=estimate; nothing is measured)"
        )
    else:
        print(f"tune: runner {runner.name}")
    if limits.why:
        print(f"tune: {limits.why}")
    if setup.cluster.host_mem_gib is not None:
        whose = "--host-mem-gib" if args.host_mem_gib is not None else "this machine's"
        print(
            f"tune: host memory {setup.cluster.host_mem_gib:.1f} GiB a node ({whose}): "
            "candidates predicted to offload past Ray's kill line are pruned"
        )
    if req.profile_source:  # a `tune calibrate` here changes every prediction: say so
        print(
            f"tune: cost model calibrated by the profile {req.profile_source} (rows say "
            "profile=... in extra; move the file away or pass --profile for another)"
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


def refuse_if_nothing_fits(req: Any, limits: Any) -> None:
    """UserError (exit 2, nothing written) when no candidate of the study's space is predicted
    to fit its GPUs: the README's promise for a GPU count no layout fits."""
    from tuner.space import SearchSpace
    from tuner.study.warmstart import nothing_fits_why

    space = SearchSpace(
        model=req.model,
        cluster=req.cluster,
        workload=req.workload,
        limits=limits,
        allow_off_policy=req.allow_off_policy,
    )
    space.check_nonempty()
    space.check_splits()
    if req.candidates_from is not None:
        from tuner.study.grid import candidates_from_params

        candidates_from_params(req.candidates_from, space)  # its refusals, before any write
    why = nothing_fits_why(
        space, req.profile, req.runner, seed=req.seed, headroom_gib=req.headroom_gib
    )
    if why:
        raise UserError(why)


def nothing_fits(summary: Any) -> bool:
    """The study could launch nothing: no trial in it at all, and this run gave up after
    MAX_CONSECUTIVE_UNFIT candidates pruned before launch."""
    from tuner.study.loop import MAX_CONSECUTIVE_UNFIT

    pruned = int(getattr(summary, "pruned_before_launch", 0) or 0)
    return summary.trials_total == 0 and not summary.best_rows and pruned >= MAX_CONSECUTIVE_UNFIT


def summary_text(summary: Any) -> str:
    """What a finished `tune run` prints on stdout: the study, how its trials' wall time split,
    the best rows and the recipes (StudySummary fields this version may lack: getattr)."""
    from tuner.results import SHOW_COLUMNS, SUMMARY_LEAVES_OUT, format_table
    from tuner.results.scope import MEANINGS, scope_of

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
    warmup = float(getattr(summary, "warmup_s", 0.0) or 0.0)
    unmeasured = float(getattr(summary, "unmeasured_s", 0.0) or 0.0)
    other = float(getattr(summary, "other_s", 0.0) or 0.0)
    if measured + launch > 0:
        total = measured + launch + warmup + unmeasured + other
        lines.append(
            f"wall time: {measured:.0f} s in measured steps, {launch:.0f} s launching"
            + (f", {warmup:.0f} s in warm-up steps" if warmup else "")
            + (f", {unmeasured:.0f} s in trials that gave no number" if unmeasured else "")
            + (f", {other:.0f} s other" if other else "")
            + f" ({100 * measured / total:.0f}% measuring)"
        )
    hours = tuple(getattr(summary, "gpu_hours", ()) or ())
    if hours:
        lines.append(
            "GPU-hours by rung: "
            + ", ".join(f"{src} {h:.2f}" for src, h in hours)
            + f" ({sum(h for _, h in hours):.2f} in all)"
        )
    if summary.best_rows:
        shown = [c for c in SHOW_COLUMNS if c not in SUMMARY_LEAVES_OUT]
        lines.append(format_table(summary.best_rows, shown))
        rows = summary.best_rows
        scopes = sorted({scope_of(r.get("source", ""), r.get("extra", "")) for r in rows})
        covers = "; ".join(MEANINGS[sc] for sc in scopes if sc)
        if covers:
            lines.append(f"tok/s/gpu covers: {covers}")
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


def cmd_reread(args: argparse.Namespace) -> int:
    from tuner.study.reread import reread

    for line in reread(args.study, args.results_dir, storage=args.storage):
        print(line)
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
    from tuner.cli_request import build_candidate, build_setup
    from tuner.estimate import estimate, load_profile
    from tuner.estimate.report_text import format_estimate, out_of_range

    s = build_setup(args)
    c = build_candidate(args, s)
    e = estimate(c, s.model, s.cluster, s.workload, load_profile(args.profile))
    why = out_of_range(e, c, s.model, s.cluster, s.workload)
    if why:  # an infinite step or a negative KV cache is no estimate to print
        raise UserError(why)
    if args.json:
        print(json.dumps(finite_json(e.as_dict()), default=float, allow_nan=False))
    else:
        print(format_estimate(e, c, s.model, s.cluster, s.workload))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from tuner.estimate import load_profile
    from tuner.fit.leaderboards import fit_leaderboards, format_fit, save_fit

    start = load_profile(args.start) if args.start else None
    fit = fit_leaderboards(args.csv, gpu=args.gpu, start=start, source=args.source)
    print(format_fit(fit))
    if args.dry_run:
        return 0
    path = save_fit(fit, args.out)
    print(f"profile written to {path} ({profile_use(path)})")
    return 0


def profile_use(path: Any) -> str:
    """How tune comes to use the profile written at `path`: by default only at
    DEFAULT_PROFILE_PATH (relative to where tune runs); anywhere else through --profile."""
    from pathlib import Path

    from tuner.estimate.profile import DEFAULT_PROFILE_PATH

    if Path(path).resolve() == Path(DEFAULT_PROFILE_PATH).resolve():
        return "tune and tune estimate use it by default when run from this folder"
    return (
        f"tune uses {DEFAULT_PROFILE_PATH} by default, not this file: pass --profile {path} to "
        "tune and tune estimate"
    )


COMMANDS = {
    "run": cmd_run,
    "show": cmd_show,
    "export": cmd_export,
    "plot": cmd_plot,
    "report": cmd_report,
    "reread": cmd_reread,
    "models": cmd_models,
    "estimate": cmd_estimate,
    "calibrate": cmd_calibrate,
}

if __name__ == "__main__":
    raise SystemExit(main())
