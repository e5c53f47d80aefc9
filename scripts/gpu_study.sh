#!/bin/bash
# The measured leaderboards (results/README.md): megatron-runner studies on this node's GPUs with
# the hand grid measured in the same study. Run from the repository root on a GPU host (wheels
# carried in .whl, see scripts/gpu_setup.sh):
#   bash scripts/gpu_study.sh CASE OUT_DIR SECONDS [TRIALS]
# CASE (each the workload issue 9 names):
#   dense  Qwen2.5-7B on 2 GPUs: prompts 1024, responses up to 8192 (mean 6000), 8 prompts x 4,
#          mini batch 8
#   moe    Qwen3-30B-A3B's layers, 8 of 48 (scripts/models/qwen3-30b-moe-8l), on 2 GPUs:
#          prompts 1024, responses up to 8192 (mean 3000), 8 prompts x 4, mini batch 4
#   small  Qwen3-1.7B (QK-norm; scripts/models/qwen3-1.7b) on 1 GPU: prompts 1024, responses up
#          to 15360 (mean 6000), 4 prompts x 4, mini batch 2
#   smoke  the moe model and workload, 2 trials: checks the host before a long study
#   gen8k  the whole step (issue 18): Qwen3-1.7B on 1 GPU, generation measured by vLLM
#          (--measure-generation; needs the kit in $SITE, scripts/gpu_verl_host.sh install):
#          prompts up to 1024 (mean 102), responses up to 8192 (mean 6000), 8 prompts x 4, mini batch 4
# The study stops launching after SECONDS; the finished rows, the Optuna storage and the
# trials' log tails are packed into OUT_DIR/<study>.tgz, the console into OUT_DIR/<study>.log.
# TRIAL_TIMEOUT (default 900 s, tune's --trial-timeout) bounds one launch: a trial launched just
# before SECONDS still ends with its row (ok, or `timeout`) before the script's own deadline,
# SECONDS + TRIAL_TIMEOUT + 120. (It was SECONDS + 200, which killed a gen8k enforce_eager trial,
# about 6 minutes long, mid-step: no row.) Size SECONDS to the host's time left accordingly.
set -u
# shellcheck source=scripts/gpu_pack.sh
source "$(dirname "$0")/gpu_pack.sh"
case_=${1:?give dense, moe, small or smoke}
out=${2:?give an output folder}
budget=${3:?give the seconds after which no trial is launched}
trials=${4:-24}
common=(--workload dapo-math --prompt-len 1024 --response-len 8192)
case $case_ in
  dense) model=qwen2.5-7b; gpus=2; wl=(--response-mean 6000 --batch 8 --n 4 --mini-batch 8) ;;
  moe | smoke) model=scripts/models/qwen3-30b-moe-8l/config.json; gpus=2
    wl=(--response-mean 3000 --batch 8 --n 4 --mini-batch 4) ;;
  small) model=scripts/models/qwen3-1.7b/config.json; gpus=1
    wl=(--response-len 15360 --response-mean 6000 --batch 4 --n 4 --mini-batch 2) ;;
  gen8k) model=scripts/models/qwen3-1.7b/config.json; gpus=1
    wl=(--response-mean 6000 --batch 8 --n 4 --mini-batch 4 --measure-generation) ;;
  *) echo "gpu_study: dense, moe, small, smoke or gen8k, not $case_" >&2; exit 2 ;;
esac
[ "$case_" = smoke ] && trials=2
if [ "$case_" = gen8k ]; then
  # shellcheck disable=SC1091
  source "${SITE:-/tmp/gpu-site}/env.sh" || { echo "gpu_study: install the kit first" >&2; exit 1; }
fi
python3 -c "import megatron.core, optuna" 2>/dev/null || source scripts/gpu_setup.sh .whl || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case $gpu in *H200*) kind=h200 ;; *H100*) kind=h100 ;; *A100*) kind=a100 ;; *H20*) kind=h20 ;; *) kind=h100 ;; esac
study=$case_-$kind-x$gpus
mkdir -p "$out/r/results"
# RESUME_FROM=<a results folder of an earlier run>: the study goes on from its storage
[ -n "${RESUME_FROM:-}" ] && cp -r "$RESUME_FROM"/. "$out/r/results/"
grid=(--hand-grid)
[ "$case_" = smoke ] && grid=(--no-warm-start)
trial_timeout=${TRIAL_TIMEOUT:-900}
timeout $((budget + trial_timeout + 120)) python3 -m tuner --model "$model" --gpus "$gpus" --gpus-per-node "$gpus" \
  --gpu "$kind" --runner megatron "${common[@]}" "${wl[@]}" "${grid[@]}" --trials "$trials" \
  --timeout "$budget" --trial-timeout "$trial_timeout" --study "$study" --results-dir "$out/r/results" --recipes-dir "$out/r/recipes" \
  --no-progress 2>&1 | tee "$out/$study.log"
rc=${PIPESTATUS[0]}
echo "gpu_study: $study exit $rc"
# keep the logs' tails only (the full ones can be large), then pack the study
pack_folder "$out/r" "$out/$study.tgz"
exit "$rc"
