"""tuner.load_leaderboard and `tune show`: typed columns from ours (schema 1 and 2) and the
reference CSVs, filters, the ratio to the best reference, the four output formats."""

from __future__ import annotations

import csv
import json
from io import StringIO
from pathlib import Path

import pandas as pd
import pytest

import tuner
from tuner.cli import main
from tuner.errors import UserError
from tuner.leaderboard import (
    best_reference,
    load_leaderboard,
    rank,
    render,
    resolve_columns,
    select,
    with_reference_ratio,
)

REPO = Path(__file__).resolve().parents[1]
DENSE = REPO / "results" / "dense-h200-x2.csv"
MOE = REPO / "results" / "moe-h200-x2.csv"
ANCHORS = REPO / "tests" / "data" / "anchors"
"""Copies of shared/anchors (published reference leaderboards), so a clean clone has them."""


def _raw(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _err_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_ours_typed_and_equal_to_the_csv() -> None:
    df = tuner.load_leaderboard([DENSE, MOE])
    raw = _raw(DENSE) + _raw(MOE)
    assert len(df) == len(raw)
    assert str(df["trial"].dtype) == "Int64" and str(df["num_gpus"].dtype) == "Int64"
    assert df["tokens_per_s_per_gpu"].dtype == "float64"
    assert str(df["param_offload"].dtype) == "boolean"
    assert isinstance(df["status"].dtype, pd.CategoricalDtype)
    assert list(df["gpu"].unique()) == ["h200"] and list(df["num_gpus"].unique()) == [2]
    for r, (_, row) in zip(raw, df.iterrows(), strict=True):
        assert row["status"] == r["status"] and row["trial"] == int(r["trial"])
        if r["tokens_per_s_per_gpu"]:
            assert row["tokens_per_s_per_gpu"] == float(r["tokens_per_s_per_gpu"])
        else:
            assert pd.isna(row["tokens_per_s_per_gpu"])
        assert row["param_offload"] == (r["param_offload"] == "True")
    # schema 1 kept the warm start's origin in `extra`: it becomes a column
    assert df.loc[(df["study"] == "dense-h200-x2") & (df["trial"] == 1), "origin"].item() == (
        "reference tp2"
    )
    assert df["is_reference"].sum() == sum("origin=reference" in r["extra"] for r in raw)


def test_reference_csvs_typed_with_our_names() -> None:
    df = load_leaderboard(sorted(ANCHORS.glob("*.csv")))
    raw = {p.name: _raw(p) for p in sorted(ANCHORS.glob("*.csv"))}
    assert len(df) == sum(len(v) for v in raw.values())
    assert (df["source"] == "reference").all() and df["is_reference"].all()
    assert set(df["gpu"]) == {"h100", "h20"}  # written H100 / H20 in the files
    assert df["step_s"].dtype == "float64" and str(df["num_gpus"].dtype) == "Int64"
    ooms = sum(r["step"].strip().upper() == "OOM" for rows in raw.values() for r in rows)
    assert (df["status"] == "oom").sum() == ooms > 0
    grpo = df[df["file"] == "grpo_qwen2.5_7b.csv"]
    assert str(grpo["offload"].dtype) == "boolean"  # TRUE/FALSE in the file
    assert grpo["tokens_per_s_per_gpu"].max() == max(
        float(r["Throughput"]) for r in raw["grpo_qwen2.5_7b.csv"] if r["Throughput"]
    )
    # files without a model column still know which model they are about
    assert set(grpo["model_family"]) == {"qwen2.5-7b"}
    moe = df[df["file"] == "dapo_moe30b.csv"]
    assert set(moe["model_family"]) == {"qwen3-30b-moe"}
    assert grpo["actor_budget"].dropna().isin([10240, 20480]).all()  # `10k` -> 10 * 1024


def test_unknown_and_missing_columns_are_tolerated(tmp_path: Path) -> None:
    """A later schema: columns renamed away, new ones added; gpu and num_gpus come from the
    hardware column when the gpu column is gone."""
    rows = _raw(MOE)
    out = tmp_path / "v2.csv"
    drop = {"gpu", "num_gpus", "peak_mem_gib", "step_s"}
    fields = [k for k in rows[0] if k not in drop] + ["peak_mem_device_gib", "flag", "note"]
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for i, r in enumerate(rows):
            w.writerow(
                {
                    **r,
                    "schema_version": "2",
                    "hardware": "2x NVIDIA H200",
                    "peak_mem_device_gib": f"{60 + i}.5",
                    "flag": "true" if i % 2 else "false",
                    "note": f"x{i}",
                }
            )
    df = load_leaderboard(out)
    assert list(df["gpu"].unique()) == ["h200"] and list(df["num_gpus"].unique()) == [2]
    assert df["peak_mem_device_gib"].tolist() == [60.5 + i for i in range(len(rows))]
    assert str(df["flag"].dtype) == "boolean" and df["flag"].sum() == len(rows) // 2
    assert df["note"].tolist()[:2] == ["x0", "x1"]
    assert df["step_s"].isna().all() and df["peak_mem_gib"].isna().all()  # added, empty


def test_bad_files_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(UserError, match="neither a verl-tuner leaderboard"):
        load_leaderboard(tmp_path / "other.csv")
    with pytest.raises(UserError, match="is empty"):
        load_leaderboard(tmp_path / "empty.csv")
    with pytest.raises(UserError, match="no leaderboard at"):
        load_leaderboard(tmp_path / "missing.csv")
    header = DENSE.read_text().splitlines()[0]
    (tmp_path / "header.csv").write_text(header + "\n")
    df = load_leaderboard(tmp_path / "header.csv")
    assert df.empty and {"gpu", "num_gpus", "status", "tokens_per_s_per_gpu"} <= set(df.columns)


def test_filters_and_ranking() -> None:
    df = load_leaderboard([DENSE, MOE, *sorted(ANCHORS.glob("*.csv"))])
    h200 = select(df, gpu="h200x2")
    assert len(h200) == len(_raw(DENSE)) + len(_raw(MOE))
    assert len(select(df, gpu="h100x16")) == (df["gpu"].eq("h100") & df["num_gpus"].eq(16)).sum()
    assert set(select(df, model="moe")["model_family"]) == {"qwen3-30b-moe"}
    assert set(select(df, status="ok,failed")["status"]) == {"ok", "failed"}
    assert set(select(df, source="megatron")["file"]) == {DENSE.name, MOE.name}
    with pytest.raises(UserError, match="--status nope: use one of ok"):
        select(df, status="nope")
    ranked = rank(select(df, source="megatron", status="ok"))
    tputs = ranked["tokens_per_s_per_gpu"].tolist()
    assert tputs == sorted(tputs, reverse=True)
    assert rank(df, sort="update_s", ascending=True)["update_actor_s"].iloc[0] == (
        df["update_actor_s"].min()
    )
    assert len(rank(df, top=3)) == 3
    with pytest.raises(UserError, match="--top must be at least 1"):
        rank(df, top=0)
    with pytest.raises(UserError, match="--sort: no column 'speed'"):
        rank(df, sort="speed")


def test_ratio_to_the_best_reference_on_the_same_model_and_gpus() -> None:
    df = with_reference_ratio(load_leaderboard([DENSE, MOE, ANCHORS / "grpo_qwen2.5_7b.csv"]))
    for path in (DENSE, MOE):
        raw = _raw(path)
        ok = [r for r in raw if r["status"] == "ok"]
        best = max(float(r["tokens_per_s_per_gpu"]) for r in ok)
        ref = max(float(r["tokens_per_s_per_gpu"]) for r in ok if "origin=reference" in r["extra"])
        mine = df[(df["file"] == path.name) & (df["tokens_per_s_per_gpu"] == best)]
        assert mine["vs_ref"].item() == pytest.approx(best / ref)
    # the published rows are on 8 H100s: compared among themselves, never with the 2 H200s
    grpo = df[df["file"] == "grpo_qwen2.5_7b.csv"]
    assert grpo["vs_ref"].max() == pytest.approx(1.0)
    refs = best_reference(df)
    assert set(zip(refs["gpu"], refs["num_gpus"], strict=True)) == {("h200", 2), ("h100", 8)}


def test_formats() -> None:
    df = rank(with_reference_ratio(load_leaderboard(MOE)))
    cols = resolve_columns(df, None)
    assert {"gpu", "num_gpus", "vs_ref"} <= set(cols)
    assert "step_s" not in cols  # empty in every row of this leaderboard
    table = render(df, cols, "table").splitlines()
    assert table[0].split()[:5] == ["trial", "status", "source", "gpu", "gpus"]
    assert len(table) == len(df) + 1
    records = json.loads(render(df, cols, "json"))
    assert [r["trial"] for r in records] == df["trial"].tolist()
    assert records[0]["tokens_per_s_per_gpu"] == df["tokens_per_s_per_gpu"].iloc[0]
    assert records[-1]["tokens_per_s_per_gpu"] is None
    back = pd.read_csv(StringIO(render(df, cols, "csv")))
    assert back["tokens_per_s_per_gpu"].max() == df["tokens_per_s_per_gpu"].max()
    md = render(df, ["trial", "status", "reason"], "markdown").splitlines()
    assert md[0] == "| trial | status | reason |" and md[1] == "|---|---|---|"
    assert len(md) == len(df) + 2
    with pytest.raises(UserError, match="--columns: no column 'nope'"):
        resolve_columns(df, ["trial", "nope"])


def test_readme_notebook_example() -> None:
    """The README's example: filter, group by layout, compare two GPU kinds."""
    df = tuner.load_leaderboard(sorted(ANCHORS.glob("*.csv")))
    ok = df[(df.status == "ok") & (df.model_family == "qwen2.5-7b")]
    by_layout = ok.groupby("train_parallel").step_s.min().sort_values()
    assert by_layout.index[0] == ok.loc[ok.step_s.idxmin(), "train_parallel"]
    kinds = ok.pivot_table(index="num_gpus", columns="gpu", values="step_s", aggfunc="min")
    assert {"h100", "h20"} <= set(kinds.columns)
    assert kinds.loc[32, "h20"] == ok[(ok.gpu == "h20") & (ok.num_gpus == 32)].step_s.min()


# --------------------------------------------------------------------------------------------
# tune show
# --------------------------------------------------------------------------------------------


def test_show_several_files_with_references_beside(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["show", str(DENSE), str(ANCHORS / "dapo7b.csv"), str(ANCHORS / "grpo_qwen2.5_7b.csv")]
    assert main([*args, "--gpu", "h100x8", "--status", "ok", "--top", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = lines[0].split()
    assert head[0] == "study" and {"gpu", "gpus", "vs_ref"} <= set(head)
    assert len(lines) == 5 and all(" h100 " in line for line in lines[1:])
    assert lines[1].split()[head.index("vs_ref")] == "1.00x"  # the best reference itself

    assert main(["show", str(DENSE), "--format", "json", "--source", "megatron"]) == 0
    rows = json.loads(capsys.readouterr().out)
    best = max(float(r["tokens_per_s_per_gpu"]) for r in _raw(DENSE) if r["status"] == "ok")
    assert rows[0]["tokens_per_s_per_gpu"] == best
    assert rows[0]["gpu"] == "h200" and rows[0]["num_gpus"] == 2
    assert rows[0]["vs_ref"] > 1

    assert main(["show", str(MOE), "--format", "markdown", "--columns", "trial,tok/s/gpu"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "| trial | tokens_per_s_per_gpu |"

    assert main(["show", str(MOE), "--format", "csv", "--status", "failed"]) == 0
    out = pd.read_csv(StringIO(capsys.readouterr().out))
    assert len(out) == sum(r["status"] == "failed" for r in _raw(MOE))


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--columns", "trial,nope"], "'nope'"),
        (["--top", "0"], "--top"),
        (["--sort", "speed"], "--sort"),
        (["--status", "bogus"], "--status bogus: use one of ok"),
        (["--gpu", "h200-x2"], "--gpu 'h200-x2': write a GPU kind"),
        (["--format", "xml"], "--format"),
    ],
)
def test_show_bad_options_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    assert main(["show", str(MOE), *argv]) == 2
    assert fragment in _err_line(capsys)


def test_old_leaderboards_load_in_schema_3s_meaning(tmp_path: Path) -> None:
    """Committed schema-1 and -2 files and the references: MFU by what it counts, a megatron
    row's old_log_prob the whole step's, as tuner.results.read_rows reads them."""
    from tuner.results import read_rows

    paths = sorted((REPO / "results").glob("*.csv"))
    df = load_leaderboard([*paths, *sorted(ANCHORS.glob("*.csv"))])
    assert "mfu_pct" not in df.columns
    assert df["mfu_update_pct"].dtype == "float64" and df["verl_mfu_actor_pct"].dtype == "float64"
    ok_megatron = df[(df["source"] == "megatron") & (df["status"] == "ok")]
    assert (
        ok_megatron["mfu_update_pct"].notna().all()
        and ok_megatron["verl_mfu_actor_pct"].isna().all()
    )
    refs = df[df["source"] == "reference"]
    assert refs["verl_mfu_actor_pct"].notna().any() and refs["mfu_update_pct"].isna().all()
    # a schema-2 megatron row that ran 2 of 8 mini-batches: the same numbers by both readers
    raw = _raw(REPO / "results" / "moe8k-h200-x2.csv")
    for r in raw:
        r["extra"] = r["extra"].replace("mini_batches_per_step=2;", "mini_batches_per_step=8;")
    path = tmp_path / "moe8k-h200-x2.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(raw[0]))
        w.writeheader()
        w.writerows(raw)
    df = load_leaderboard(path)
    rows = read_rows(path)
    for (_, got), want, r in zip(df.iterrows(), rows, raw, strict=True):
        for c in ("old_log_prob_s", "update_actor_s", "mfu_update_pct"):
            assert (pd.isna(got[c]) and not want.get(c)) or got[c] == float(want[c])
        if r["old_log_prob_s"]:
            assert got["old_log_prob_s"] == pytest.approx(4 * float(r["old_log_prob_s"]), 1e-5)


def test_a_training_only_throughput_is_never_set_against_a_whole_step(tmp_path: Path) -> None:
    """The megatron runner's tokens/s/GPU covers old_log_prob + update (scope `train only`);
    published rows cover the whole step: no vs_ref between them, while the same row as the cost
    model's (a whole step, predicted) or as verl's gets one; `tune show` names the scope."""
    row = next(
        r for r in _raw(DENSE) if r["status"] == "ok" and "origin=reference" not in r["extra"]
    )
    row = {**row, "gpu": "h100", "num_gpus": "8", "hardware": ""}
    rows = [
        {**row, "trial": "1"},
        {**row, "trial": "2", "source": "estimate"},
        {**row, "trial": "3", "source": "verl"},
        {**row, "trial": "4", "extra": row["extra"] + ";generation=measured(vllm)"},
    ]
    ours = tmp_path / "ours.csv"
    with ours.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerows(rows)
    df = with_reference_ratio(load_leaderboard([ours, ANCHORS / "grpo_qwen2.5_7b.csv"]))
    mine = df[df["file"] == "ours.csv"].set_index("trial")
    assert list(mine["scope"]) == ["train only", "predicted", "step", "gen+train"]
    assert mine["vs_ref"].isna().tolist() == [True, False, False, True]
    assert main(["show", str(ours), "--columns", "trial,scope"]) == 0


def test_show_names_what_each_throughput_covers(capsys: pytest.CaptureFixture[str]) -> None:
    verl = REPO / "results" / "verl4k-h100-x1.csv"
    assert main(["show", str(DENSE), str(verl), "--status", "ok", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_source = {r["source"]: r["scope"] for r in rows}
    assert by_source == {"megatron": "train only", "verl": "step"}


def test_the_broadest_scope_ranks_first_and_sort_ranks_by_its_column_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fidelity ladder's leaderboard: a screened `gen+train` row faster than verl's whole step
    of the same candidate. By default the whole step heads the table (step, then gen+train, train
    only, predicted; published rows as a whole step; ok rows first), the fastest first within a
    scope; `--sort tokens_per_s_per_gpu` ranks by throughput alone."""
    row = next(
        r for r in _raw(DENSE) if r["status"] == "ok" and "origin=reference" not in r["extra"]
    )
    row = {**row, "gpu": "h100", "num_gpus": "8", "hardware": ""}
    gen = row["extra"] + ";generation=measured(vllm)"
    rows = [
        {**row, "trial": "1", "source": "megatron", "extra": gen, "tokens_per_s_per_gpu": "900"},
        {**row, "trial": "2", "source": "verl", "tokens_per_s_per_gpu": "300"},
        {**row, "trial": "3", "source": "megatron", "tokens_per_s_per_gpu": "1200"},
        {**row, "trial": "4", "source": "estimate", "tokens_per_s_per_gpu": "2000"},
        {**row, "trial": "5", "source": "verl", "tokens_per_s_per_gpu": "350"},
        {**row, "trial": "6", "source": "megatron", "extra": gen, "tokens_per_s_per_gpu": "800"},
        {**row, "trial": "7", "source": "verl", "status": "failed", "tokens_per_s_per_gpu": "5000"},
    ]
    ours = tmp_path / "ours.csv"
    with ours.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerows(rows)

    def shown(*args: str) -> list[tuple[int, str]]:
        assert main(["show", str(ours), *args, "--format", "json"]) == 0
        return [(r["trial"], r["scope"]) for r in json.loads(capsys.readouterr().out)]

    assert shown() == [
        (5, "step"),
        (2, "step"),
        (1, "gen+train"),
        (6, "gen+train"),
        (3, "train only"),
        (4, "predicted"),
        (7, "step"),  # not ok: after the ok rows, as before
    ]
    assert [t for t, _ in shown("--sort", "tokens_per_s_per_gpu")] == [4, 3, 1, 6, 5, 2, 7]
    assert [t for t, _ in shown("--sort", "tokens_per_s_per_gpu", "--asc")] == [2, 5, 6, 1, 3, 4, 7]
    # a published reference row is a whole step: it ranks among verl's rows by throughput
    df = rank(load_leaderboard([ours, ANCHORS / "grpo_qwen2.5_7b.csv"]))
    ok = df[df["status"] == "ok"]
    whole = ok["scope"].isin(["step", "published"])
    assert whole.tolist() == sorted(whole.tolist(), reverse=True) and whole.sum() > 2
    tputs = ok[whole]["tokens_per_s_per_gpu"].dropna().tolist()
    assert tputs == sorted(tputs, reverse=True)
