#!/bin/bash
# A recipe reproduces its row (issue 17 item 5): the row of a verl study exported with
# `tune export` and run by bash as a user would run it, on a host made ready by
# scripts/gpu_verl_host.sh; its 3rd step's perf/throughput is then set beside the row's.
#
#   bash scripts/gpu_verl_recipe.sh start RESULTS [TRIAL]   # detached; default the best ok row
#   bash scripts/gpu_verl_recipe.sh status RESULTS          # the run's last lines, then the ratio
#
# RESULTS is the folder of scripts/gpu_verl_study.sh (its CSV, and the synthetic data the study's
# trials wrote under <study>/data: the recipe runs on the same prompts). The run's files go to
# RESULTS/reproduce/: the recipe, verl's log, its metrics file, and compare.txt.
set -u
cmd=${1:?give start or status}
res=${2:?give the study results folder}
SITE=${SITE:-/tmp/gpu-site}
MODEL_DIR=${MODEL_DIR:-/tmp/verl-qwen3-1.7b}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case $gpu in *H200*) kind=h200 ;; *) kind=h100 ;; esac
study=${STUDY:-verl4k-$kind-x1}
csv=$res/$study.csv
work=$res/reproduce
# shellcheck disable=SC1091
. "$SITE/env.sh"
export PYTHONPATH=$SITE:${TUNER_REPO:-/tmp/vt-repo}

case $cmd in
  start)
    trial=${3:-}
    mkdir -p "$work"
    train=$(ls "$res/$study"/data/*/train.parquet 2>/dev/null | head -1)
    [ -n "$train" ] || { echo "gpu_verl_recipe: no study data under $res/$study/data" >&2; exit 2; }
    pick=(--rank 1)
    [ -n "$trial" ] && pick=(--trial "$trial")
    recipe=$(python3 -m tuner export "$csv" "${pick[@]}" --recipes-dir "$work/recipes") || exit 2
    echo "$recipe" > "$work/recipe.path"
    # what a user runs: the recipe with its environment, the model and the data
    (cd "$work" && MODEL_PATH=$MODEL_DIR TRAIN_FILE=$train VERL_FILE_LOGGER_ROOT=$work \
      setsid nohup bash "$recipe" > "$work/verl.log" 2>&1 < /dev/null &)
    echo "gpu_verl_recipe: started $recipe (log $work/verl.log)"
    ;;
  status)
    tail -c 400 "$work/verl.log" 2>/dev/null | tr '\r' '\n' | tail -n 3
    pgrep -f "[v]erl.trainer.main_ppo" >/dev/null && { echo "gpu_verl_recipe: running"; exit 0; }
    python3 - "$csv" "$work" <<'PY' | tee "$work/compare.txt"
import csv, glob, sys
from pathlib import Path
from tuner.runners.verl_log import measures, read_jsonl
csv_path, work = sys.argv[1], Path(sys.argv[2])
recipe = (work / "recipe.path").read_text().strip()
name = Path(recipe).stem
rows = list(csv.DictReader(open(csv_path)))
trial = next(line.split("trial ")[1].split(" ")[0] for line in open(recipe) if line.startswith("# origin:"))
row = next(r for r in rows if r["trial"] == trial)
files = glob.glob(str(work / "verl-tuner" / "*.jsonl"))
got = measures(read_jsonl(Path(files[0]))) if files else None
if got is None:
    print(f"gpu_verl_recipe: {name}: no 3rd step in the recipe's run; see {work}/verl.log")
    sys.exit(1)
row_tps = float(row["tokens_per_s_per_gpu"])
tps = got.fields["tokens_per_s_per_gpu"]
print(f"recipe {name} (trial {trial}): {tps:.1f} tokens/s/GPU; the row {row_tps:.1f}; "
      f"ratio {tps / row_tps:.4f} ({100 * (tps / row_tps - 1):+.2f}%)")
for f in ("step_s", "generation_s", "old_log_prob_s", "update_actor_s", "reshard_s"):
    if f in got.fields and row.get(f):
        print(f"  {f}: recipe {got.fields[f]:.3f} s, row {float(row[f]):.3f} s")
PY
    ;;
  *) echo "gpu_verl_recipe: start or status, not $cmd" >&2; exit 2 ;;
esac
