#!/bin/bash
# The fidelity ladder on a 2- or 4-GPU host (issue 28 item 1): `tune --runner ladder` screens
# every candidate with the megatron runner (megatron-core training phases in a persistent pool,
# generation measured by a vLLM engine at the candidate's rollout TP, one replica with its share
# of the sequences) and confirms the best with real verl 0.9.1 (as scripts/gpu_verl_study.sh
# runs it). Its rows say which rung measured them (`source` megatron or verl); the console's
# last lines give the GPU-hours each rung spent. RUNNER=verl runs the verl-only study of the same
# workload and space beside it, for the comparison the issue asks for (the ladder's best within
# 3% of the verl-only best, for fewer GPU-hours). Run on a host made ready by
# scripts/gpu_verl_host.sh. A study outlives one device call: `start` detaches it.
#
#   bash scripts/gpu_ladder_study.sh start RESULTS SECONDS [TRIALS [CONFIRM_TOP]]  # detached
#   bash scripts/gpu_ladder_study.sh status RESULTS                    # progress, the CSV so far
#   bash scripts/gpu_ladder_study.sh pack RESULTS OUT                  # CSV, storage, logs -> OUT
#
# TRIALS (default 16) counts the screens; confirmations come on top (CONFIRM_TOP, default 3, at
# the end, and one each time a screen is predicted to beat the best confirmed).
# MODEL_CONFIG, WORKLOAD, GPUS, HAND, EXTRA and RESUME_FROM as in scripts/gpu_verl_study.sh;
# STUDY defaults to ladder4k-<gpu>-x<GPUS> (verl4k-... with RUNNER=verl).
set -u
cmd=${1:?give start, status or pack}
res=${2:?give a results folder}
repo=$(cd "$(dirname "$0")/.." && pwd)
SITE=${SITE:-/tmp/gpu-site}
RUNNER=${RUNNER:-ladder}
MODEL_CONFIG=${MODEL_CONFIG:-scripts/models/qwen3-1.7b/config.json}
MODEL_DIR=${MODEL_DIR:-/tmp/verl-$(basename "$(dirname "$MODEL_CONFIG")")}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case $gpu in *H200*) kind=h200 ;; *H100*) kind=h100 ;; *) kind=h100 ;; esac
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
[ "${GPUS:-0}" -ge 1 ] 2>/dev/null || GPUS=1
case $RUNNER in
  ladder) study=${STUDY:-ladder4k-$kind-x$GPUS} ;;
  verl) study=${STUDY:-verl4k-$kind-x$GPUS} ;;
  *) echo "gpu_ladder_study: RUNNER is ladder or verl, not $RUNNER" >&2; exit 2 ;;
esac
WORKLOAD=${WORKLOAD:---workload dapo-math --prompt-len 256 --prompt-mean 256 --response-len 4096 --response-mean 4096 --batch 8 --n 4 --mini-batch 4}

case $cmd in
  start)
    budget=${3:?give the seconds after which no trial is launched}
    trials=${4:-16}
    top=${5:-3}
    # shellcheck disable=SC1091
    . "$SITE/env.sh"
    mkdir -p "$res"
    [ -n "${RESUME_FROM:-}" ] && cp -rn "$RESUME_FROM"/. "$res"/
    rm -rf /tmp/vt-repo && cp -r "$repo" /tmp/vt-repo && cd /tmp/vt-repo || exit 1
    export PYTHONPATH=$SITE:/tmp/vt-repo
    ls "$MODEL_DIR"/*.safetensors >/dev/null 2>&1 ||
      python3 scripts/verl_model.py "$MODEL_CONFIG" "$MODEL_DIR" || exit 1
    ladder=()
    [ "$RUNNER" = ladder ] && ladder=(--confirm-top "$top" --measure-generation)
    # shellcheck disable=SC2086
    setsid nohup python3 -m tuner --runner "$RUNNER" "${ladder[@]}" --verl-bridge mbridge \
      --model "$MODEL_CONFIG" --model-path "$MODEL_DIR" \
      --gpus "$GPUS" --gpus-per-node "$GPUS" --gpu "$kind" $WORKLOAD \
      ${HAND---verl-example} --trials "$trials" --timeout "$budget" \
      --trial-timeout 900 --study "$study" --results-dir "$res" --recipes-dir "$res/recipes" \
      --no-progress ${EXTRA:-} > "$res/$study.console.log" 2>&1 < /dev/null &
    echo "gpu_ladder_study: $study started (pid $!), budget $budget s, console $res/$study.console.log"
    ;;
  status)
    tail -n 8 "$res/$study.console.log" 2>/dev/null
    pgrep -f "tuner --runner $RUNNER" >/dev/null && echo "gpu_ladder_study: running" || echo "gpu_ladder_study: not running"
    # trial, status, source (the rung), tokens/s/GPU, origin
    [ -f "$res/$study.csv" ] && python3 - "$res/$study.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(r["trial"], r["status"], r["source"], r["tokens_per_s_per_gpu"], r["origin"])
PY
    ;;
  pack)
    # gpu_verl_study.sh's pack: logs gzipped, the CSV, the storage as <study>.sqlite3
    STUDY=$study bash "$repo/scripts/gpu_verl_study.sh" pack "$res" "${3:?give an output folder}"
    ;;
  *) echo "gpu_ladder_study: start, status or pack, not $cmd" >&2; exit 2 ;;
esac
