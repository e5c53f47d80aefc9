#!/bin/bash
# The measured verl leaderboard (results/README.md): `tune --runner verl` on this host's GPU with
# real verl 0.9.1 (Megatron actor with transformer-engine layers through mbridge, vLLM 0.24 async
# rollout), verl's own example configuration measured first in the same study. Run on a host made
# ready by scripts/gpu_verl_host.sh. A study outlives one device call: `start` detaches it.
#
#   bash scripts/gpu_verl_study.sh start RESULTS SECONDS [TRIALS]   # detached; returns at once
#   bash scripts/gpu_verl_study.sh status RESULTS                   # progress, the CSV so far
#   bash scripts/gpu_verl_study.sh pack RESULTS OUT                 # CSV, storage, log tails -> OUT
#
# The workload (DAPO-like, long fixed responses so that the rollout's KV cache and the token
# budgets matter): Qwen3-1.7B's architecture (scripts/models/qwen3-1.7b, random bf16 weights and
# an offline tokenizer of its whole vocabulary: scripts/verl_model.py), prompts of 256 tokens,
# responses of exactly 4096 (ignore_eos), 8 prompts x 4 responses, mini batch 4 (2 updates).
# MODEL_CONFIG (a config.json), WORKLOAD (tune's workload options), GPUS (default: every GPU of
# the host) and STUDY (default verl4k-<gpu>-x<GPUS>) set another study; HAND (default
# --verl-example; empty for none, or --hand-grid) the hand rows measured first.
# RESUME_FROM=<an earlier RESULTS folder or pack>: the study goes on from its storage; RESULTS must
# then be the folder the study began in (its CSV names its storage there): /tmp/vt-res4 for the
# committed results/verl4k-h100-x1 (copy its .sqlite3 as studies.sqlite3 beside the CSV).
# EXTRA="--verl-env KEY=VALUE ...": more tune options (word-split), recorded in the rows they set;
# EXTRA=--shared-ray: one Ray head for the study (rows say ray_cluster=study in extra).
set -u
cmd=${1:?give start, status or pack}
res=${2:?give a results folder}
repo=$(cd "$(dirname "$0")/.." && pwd)
SITE=${SITE:-/tmp/gpu-site}
MODEL_CONFIG=${MODEL_CONFIG:-scripts/models/qwen3-1.7b/config.json}
MODEL_DIR=${MODEL_DIR:-/tmp/verl-$(basename "$(dirname "$MODEL_CONFIG")")}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case $gpu in *H200*) kind=h200 ;; *H100*) kind=h100 ;; *) kind=h100 ;; esac
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
[ "${GPUS:-0}" -ge 1 ] 2>/dev/null || GPUS=1
study=${STUDY:-verl4k-$kind-x$GPUS}
# WORKLOAD: the workload options (word-split); the default is verl4k's
WORKLOAD=${WORKLOAD:---workload dapo-math --prompt-len 256 --prompt-mean 256 --response-len 4096 --response-mean 4096 --batch 8 --n 4 --mini-batch 4}

case $cmd in
  start)
    budget=${3:?give the seconds after which no trial is launched}
    trials=${4:-12}
    # shellcheck disable=SC1091
    . "$SITE/env.sh"
    mkdir -p "$res"
    [ -n "${RESUME_FROM:-}" ] && cp -rn "$RESUME_FROM"/. "$res"/
    # the code of this call, copied: later calls re-send the working tree under a running study
    rm -rf /tmp/vt-repo && cp -r "$repo" /tmp/vt-repo && cd /tmp/vt-repo || exit 1
    export PYTHONPATH=$SITE:/tmp/vt-repo
    ls "$MODEL_DIR"/*.safetensors >/dev/null 2>&1 ||
      python3 scripts/verl_model.py "$MODEL_CONFIG" "$MODEL_DIR" || exit 1
    # shellcheck disable=SC2086
    setsid nohup python3 -m tuner --runner verl --verl-bridge mbridge \
      --model "$MODEL_CONFIG" --model-path "$MODEL_DIR" \
      --gpus "$GPUS" --gpus-per-node "$GPUS" --gpu "$kind" $WORKLOAD \
      ${HAND---verl-example} --trials "$trials" --timeout "$budget" \
      --trial-timeout 900 --study "$study" --results-dir "$res" --recipes-dir "$res/recipes" \
      --no-progress ${EXTRA:-} > "$res/$study.console.log" 2>&1 < /dev/null &
    echo "gpu_verl_study: $study started (pid $!), budget $budget s, console $res/$study.console.log"
    ;;
  status)
    tail -n 5 "$res/$study.console.log" 2>/dev/null
    pgrep -f "tuner --runner verl" >/dev/null && echo "gpu_verl_study: running" || echo "gpu_verl_study: not running"
    for t in "$res/$study"/trials/*/; do
      [ -d "$t" ] || continue
      echo "trial $(basename "$t"): $(grep -aoE 'step:[0-9]+ ' "$t/verl.log" 2>/dev/null | tail -1) $(tail -c 300 "$t/verl.log" 2>/dev/null | tr '\n' ' ' | cut -c1-200)"
    done
    [ -f "$res/$study.csv" ] && cut -d, -f1-4 "$res/$study.csv" | tail -n 20
    ;;
  pack)
    out=${3:?give an output folder}
    mkdir -p "$out"
    # the logs whole and compressed (~30 KiB a trial: start-up is read from their timestamps),
    # the study's CSV, storage and recipes; not the data
    # (not the study's compile caches: tens of MB a study, rebuilt by its first trial on a host)
    tmp=$(mktemp -d)
    tar cf - -C "$res" --exclude=vllm-cache --exclude='*.parquet' . | tar xf - -C "$tmp"
    find "$tmp" -name '*.log' -exec gzip -f {} \;
    find "$tmp" -name '*.parquet' -delete
    tar czf "$out/$study.tgz" -C "$tmp" . && rm -rf "$tmp"
    cp "$res/$study.csv" "$out/" 2>/dev/null
    cp "$res/studies.sqlite3" "$out/$study.sqlite3" 2>/dev/null
    echo "gpu_verl_study: packed $(du -h "$out/$study.tgz" | cut -f1) into $out"
    ;;
  *) echo "gpu_verl_study: start, status or pack, not $cmd" >&2; exit 2 ;;
esac
