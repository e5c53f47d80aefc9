"""A leaderboard row back into a runnable verl recipe script (`tune export`)."""

from __future__ import annotations

from pathlib import Path

from tuner.errors import UserError


def choose_row(
    rows: list[dict[str, str]], csv_path: Path, *, rank: int = 1, trial: int | None = None
) -> dict[str, str]:
    """The row of trial `trial`, else the `rank`-th ok candidate by throughput (1 = best; rows
    of one candidate, a repeat's copied result among them, count once: recipes.distinct)."""
    from tuner.recipes import distinct
    from tuner.results import rank as ranked

    if trial is not None:
        chosen = [r for r in rows if r.get("trial") == str(trial)]
        if not chosen:
            raise UserError(f"no trial {trial} in {csv_path}: pick one from `tune show`")
        return chosen[0]
    ok = distinct(ranked(rows, status="ok"))
    if not ok:
        raise UserError(f"{csv_path} has no ok row to export: pass --trial N for another row")
    if not 1 <= rank <= len(ok):
        raise UserError(
            f"{csv_path} has {len(ok)} ok rows of distinct candidates: pass --rank 1..{len(ok)}"
        )
    return ok[rank - 1]


def export_recipe(
    csv_path: Path,
    *,
    rank: int = 1,
    trial: int | None = None,
    steps: int = 3,
    recipes_dir: Path = Path("recipes"),
) -> Path:
    """Write the chosen row as `recipes_dir/<model>/<name>.sh`; returns its path."""
    from tuner import recipes
    from tuner.hardware import Cluster, get_gpu
    from tuner.models import get_model
    from tuner.results import read_raw
    from tuner.runners import pinned_knobs
    from tuner.space import Candidate
    from tuner.space.knobs import candidate_refusals
    from tuner.verl_settings import VerlSettings
    from tuner.workload import PRESETS, Workload, get_workload

    rows = read_raw(csv_path)
    row = choose_row(rows, csv_path, rank=rank, trial=trial)
    where = f"{csv_path} line {_line_of(rows, row)} (trial {row.get('trial')})"
    try:
        model = get_model(row["model"])
        cluster = Cluster(
            gpu=get_gpu(row["gpu"]),
            num_gpus=int(row["num_gpus"]),
            gpus_per_node=int(row["gpus_per_node"]),
        )
        base = get_workload(row["workload"]) if row.get("workload") in PRESETS else Workload()
        workload = base.with_overrides(
            algorithm=row["algorithm"],
            prompt_len=int(row["max_prompt_len"]),
            response_len=int(row["max_response_len"]),
            batch_size=int(row["bs"]),
            n=int(row["n"]),
            mini_batch_size=int(row["mini_bs"]),
            # the lengths the row was scored with travel into the recipe's comment
            prompt_mean=round(float(row.get("prompt_mean_len") or 0)),
            response_mean=round(float(row.get("response_mean_len") or 0)),
        )
        cand = Candidate.from_record(row, cluster.num_gpus)
        settings = VerlSettings.from_record(row)
    except (KeyError, ValueError) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(
            f"{csv_path} trial {row.get('trial')} cannot be exported ({type(e).__name__}: {e}): "
            "the row is incomplete or damaged; pick another with --trial"
        ) from None
    refused = candidate_refusals(cand)
    if refused:
        column, why = refused[0]
        raise UserError(
            f"{where}, column {column}: {why}: fix the cell, or pick another row with --trial"
        )
    recipe = recipes.render(
        cand,
        model,
        cluster,
        workload,
        steps=steps,
        origin=recipes.origin_of(csv_path, row),
        settings=settings,
        pinned=pinned_knobs(row.get("source", ""), row.get("extra", "")),
        runner=row.get("source", ""),
        drawn=recipes.drawn_responses(row.get("extra", "")),
    )
    folder = recipes.model_folder(recipes_dir, model.name)
    study = row.get("study") or csv_path.stem
    return recipes.write(
        recipe,
        folder,
        suffix=recipes.suffix_of(study, row["trial"]),
        owner=recipes.owner_of(csv_path, row),
    )


def _line_of(rows: list[dict[str, str]], row: dict[str, str]) -> int:
    """The line of `row` in its file (the header is line 1)."""
    return next((i for i, r in enumerate(rows, 2) if r is row), 0) or rows.index(row) + 2
