#!/bin/bash
# The measured leaderboard: one megatron-runner study on this node's GPUs, its CSV and trial logs
# copied to OUT_DIR. Run from the repository root on a GPU host (wheels carried in .whl):
#   bash scripts/gpu_study.sh dense|moe OUT_DIR [GPUS] [SECONDS]
#   dense: Qwen2.5-7B (registry architecture, random weights)
#   moe:   Qwen3-30B-A3B's layers with 8 of its 48 (scripts/models/qwen3-30b-moe-8l)
# Workload: DAPO's shape scaled so a step takes seconds: 512-token prompts, responses up to 2048
# (mean: the tuner's default fraction of the max), 8 prompts x 8 responses, mini batch 2 prompts.
# At most 15 trials; the study stops launching after SECONDS (default 420) and every trial is
# cut at 110 s. The reference layouts (scaled to GPUS) run first, then the estimator's picks,
# then Optuna's. Rows are source=megatron with the cost model's prediction beside each.
set -u
which=${1:?give dense or moe}
out=${2:?give an output folder}
gpus=${3:-2}
budget=${4:-420}
case $which in
  dense) model=qwen2.5-7b ;;
  moe) model=scripts/models/qwen3-30b-moe-8l/config.json ;;
  *) echo "gpu_study: dense or moe, not $which" >&2; exit 2 ;;
esac
python3 -c "import megatron.core, optuna" 2>/dev/null || source scripts/gpu_setup.sh .whl || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case $gpu in *H200*) kind=h200 ;; *H100*) kind=h100 ;; *A100*) kind=a100 ;; *H20*) kind=h20 ;; *) kind=h100 ;; esac
study=$which-$kind-x$gpus
mkdir -p "$out"
timeout $((budget + 150)) python3 -m tuner.cli --model "$model" --gpus "$gpus" --gpus-per-node "$gpus" \
  --gpu "$kind" --runner megatron --workload dapo-math --prompt-len 512 --response-len 2048 \
  --batch 8 --n 8 --mini-batch 2 --trials 15 --timeout "$budget" --trial-timeout 110 \
  --study "$study" --results-dir "$out/results" --recipes-dir "$out/recipes" --no-progress \
  2>&1 | tee "$out/$study.log"
echo "gpu_study: exit ${PIPESTATUS[0]}"
# keep the logs' tails only (the full ones can be large)
for f in "$out"/results/"$study"/trials/*/worker.log; do
  [ -f "$f" ] && tail -c 20000 "$f" > "$f.tail" && rm "$f"
done
