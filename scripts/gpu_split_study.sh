#!/bin/bash
# Split placement against colocation (issue 29 item 4), measured with real verl 0.9.1 on one
# 4-GPU host: one `tune --runner verl --allow-off-policy` study, so the colocated candidates
# (verl's main_ppo, generation and training taking turns on all 4 GPUs) and the split ones
# (verl.experimental.one_step_off_policy: vLLM on r of the 4 GPUs, the Megatron actor on 4 - r,
# the next step's generation overlapping this step's training, weights over NCCL) are searched
# and measured in the same study with the same workload, model and data. Run on a host made ready
# by scripts/gpu_verl_host.sh (as scripts/gpu_verl_study.sh). A study outlives one device call:
# `start` detaches it.
#
#   bash scripts/gpu_split_study.sh start RESULTS SECONDS [TRIALS]   # detached; returns at once
#   bash scripts/gpu_split_study.sh status RESULTS                   # progress, the CSV so far
#   bash scripts/gpu_split_study.sh compare RESULTS                  # best colocated vs best split
#   bash scripts/gpu_split_study.sh pack RESULTS OUT                 # CSV, storage, logs -> OUT
#
# Steps measured: the 3rd, as every leaderboard row (runners/verl_log.MEASURED_STEP). In a split
# run step 1 waits for a generation nothing overlapped; step 2's generation was started after
# step 1's weight sync and ran beside step 1's training, so steps 2 and 3 are steady state, and
# the 3rd is measured as the colocated rows' is. A split row's generation_s is verl's
# `timing_s/generate_async` (the whole generation, overlapped); its wait is `gen_wait_s` in the
# row's `extra`, its sync `reshard_s` (`timing_s/sync_rollout_weights`). Throughput is per GPU of
# all 4 in both placements, so the rows compare directly (vs_ref too: the same GPU count).
#
# The workload: generation and training of comparable length, where a split can pay (the goal:
# the best split >= 1.3x the best colocated). Qwen2.5-3B's architecture (scripts/models/
# qwen2.5-3b, random bf16 weights, offline tokenizer: scripts/verl_model.py), GRPO, prompts of
# 256 tokens, responses of exactly 4096 (ignore_eos), 32 prompts x 4 responses, mini batch 8.
# Where the best split does not reach 1.3x, the rows say why: compare prints each best row's
# generation, training (old_log_prob + update) and sync; a split whose generation (r GPUs) or
# training (4 - r) dominates cannot overlap the other.
# MODEL_CONFIG, WORKLOAD, GPUS (default 4; a split needs 2 or more) and STUDY (default
# split4k-<gpu>-x<GPUS>) set another study; EXTRA adds tune options (word-split), e.g.
# EXTRA="--verl-env KEY=VALUE". RESUME_FROM as in gpu_verl_study.sh.
# CANDIDATES (default scripts/split4k-h200-x4.candidates.csv where the study is that one):
# the candidates measured after verl's example, in order (--candidates-from): the cost model's
# best of each placement, written by scripts/split_candidates.py; "" leaves the order to the
# warm start. STEPS (default 4): --verl-steps, the 3rd and later steps measured. The study's
# Ray head is shared by its trials (--shared-ray).
set -u
cmd=${1:?give start, status, compare or pack}
res=${2:?give a results folder}
repo=$(cd "$(dirname "$0")/.." && pwd)
SITE=${SITE:-/tmp/gpu-site}
MODEL_CONFIG=${MODEL_CONFIG:-scripts/models/qwen2.5-3b/config.json}
MODEL_DIR=${MODEL_DIR:-/tmp/verl-$(basename "$(dirname "$MODEL_CONFIG")")}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case $gpu in *H200*) kind=h200 ;; *H100*) kind=h100 ;; *) kind=h100 ;; esac
GPUS=${GPUS:-4}
study=${STUDY:-split4k-$kind-x$GPUS}
CANDIDATES=${CANDIDATES-scripts/$study.candidates.csv}
STEPS=${STEPS:-4}
WORKLOAD=${WORKLOAD:---workload grpo-short --prompt-len 256 --prompt-mean 256 --response-len 4096 --response-mean 4096 --batch 32 --n 4 --mini-batch 8}

case $cmd in
  start)
    budget=${3:?give the seconds after which no trial is launched}
    trials=${4:-12}
    seen=$(nvidia-smi -L 2>/dev/null | wc -l)
    if [ "$seen" -lt "$GPUS" ]; then
      echo "gpu_split_study: this host has $seen GPU(s), the study needs $GPUS" >&2
      exit 2
    fi
    # shellcheck disable=SC1091
    . "$SITE/env.sh"
    mkdir -p "$res"
    [ -n "${RESUME_FROM:-}" ] && cp -rn "$RESUME_FROM"/. "$res"/
    rm -rf /tmp/vt-repo && cp -r "$repo" /tmp/vt-repo && cd /tmp/vt-repo || exit 1
    export PYTHONPATH=$SITE:/tmp/vt-repo
    ls "$MODEL_DIR"/*.safetensors >/dev/null 2>&1 ||
      python3 scripts/verl_model.py "$MODEL_CONFIG" "$MODEL_DIR" || exit 1
    # --verl-example: verl's own colocated example first, the baseline a user writes by hand;
    # then the CANDIDATES (the cost model's best of each placement), then the warm start's
    from=()
    [ -n "$CANDIDATES" ] && [ -f "$CANDIDATES" ] && from=(--candidates-from "$CANDIDATES")
    # shellcheck disable=SC2086
    setsid nohup python3 -m tuner --runner verl --verl-bridge mbridge --allow-off-policy \
      --shared-ray --verl-steps "$STEPS" "${from[@]}" \
      --model "$MODEL_CONFIG" --model-path "$MODEL_DIR" \
      --gpus "$GPUS" --gpus-per-node "$GPUS" --gpu "$kind" $WORKLOAD \
      --verl-example --trials "$trials" --timeout "$budget" \
      --trial-timeout 900 --study "$study" --results-dir "$res" --recipes-dir "$res/recipes" \
      --no-progress ${EXTRA:-} > "$res/$study.console.log" 2>&1 < /dev/null &
    echo "gpu_split_study: $study started (pid $!), budget $budget s, console $res/$study.console.log"
    ;;
  status)
    tail -n 5 "$res/$study.console.log" 2>/dev/null
    pgrep -f "tuner --runner verl" >/dev/null && echo "gpu_split_study: running" || echo "gpu_split_study: not running"
    for t in "$res/$study"/trials/*/; do
      [ -d "$t" ] || continue
      echo "trial $(basename "$t"): $(grep -aoE 'step:[0-9]+ ' "$t/verl.log" 2>/dev/null | tail -1) $(tail -c 300 "$t/verl.log" 2>/dev/null | tr '\n' ' ' | cut -c1-200)"
    done
    [ -f "$res/$study.csv" ] && cut -d, -f1-4 "$res/$study.csv" | tail -n 20
    ;;
  compare)
    # the best ok row of each placement, their phases, and the split's ratio to colocation
    PYTHONPATH=$repo python3 - "$res/$study.csv" <<'EOF'
import sys
from tuner.results import parse_extra, read_raw
from tuner.space.placement import placement_label

rows = [r for r in read_raw(sys.argv[1]) if r["status"] == "ok" and r["tokens_per_s_per_gpu"]]
def f(r, k):
    return float(r.get(k) or 0)
best = {}
for r in rows:
    split = int(r.get("rollout_gpus") or 0) > 0
    if split not in best or f(r, "tokens_per_s_per_gpu") > f(best[split], "tokens_per_s_per_gpu"):
        best[split] = r
def gen(r):  # a split row whose trainer never waited has a bound, not a time (verl_log)
    bound = parse_extra(r.get("extra", "")).get("generation_at_most_s")
    return f"{f(r, 'generation_s'):.1f}" if r.get("generation_s") else f"<= {float(bound or 0):.1f}"
for split, r in sorted(best.items()):
    place = placement_label(int(r.get("rollout_gpus") or 0), int(r["num_gpus"]))
    train = f(r, "old_log_prob_s") + f(r, "ref_s") + f(r, "update_actor_s")
    print(f"{place:>14}  trial {r['trial']:>3}  {r['train_parallel']} / rollout {r['infer_parallel']}"
          f"  {f(r, 'tokens_per_s_per_gpu'):.0f} tok/s/gpu  step {f(r, 'step_s'):.1f} s"
          f"  gen {gen(r)}  train {train:.1f}  sync {f(r, 'reshard_s'):.1f}")
for r in rows:  # every ok row: what bounds its step, and each pool's memory against its prediction
    ex = parse_extra(r.get("extra", ""))
    pools = ""
    if "trainer_device_peak_gib" in ex:
        pools = (f"  trainer {float(ex['trainer_device_peak_gib']):.1f} GiB (pred "
                 f"{float(ex.get('pred_trainer_device_gib', 0)):.1f})  rollout "
                 f"{float(ex['rollout_device_peak_gib']):.1f} GiB (pred "
                 f"{float(ex.get('pred_rollout_device_gib', 0)):.1f})")
    print(f"trial {r['trial']:>3}  {placement_label(int(r.get('rollout_gpus') or 0), int(r['num_gpus'])):>14}"
          f"  step {f(r, 'step_s'):.1f}  gen_wait {float(ex.get('gen_wait_s', 0)):.1f}"
          f"  verl's figure {ex.get('verl_throughput', '-')}{pools}")
if len(best) == 2:
    ratio = f(best[True], "tokens_per_s_per_gpu") / f(best[False], "tokens_per_s_per_gpu")
    print(f"best split / best colocated: {ratio:.2f}x (goal >= 1.3x)")
else:
    print("gpu_split_study: no ok row of " + ("split" if False in best else "colocated") + " yet")
EOF
    ;;
  pack)
    # gpu_verl_study.sh's pack: logs gzipped, the CSV, the storage as <study>.sqlite3
    STUDY=$study bash "$repo/scripts/gpu_verl_study.sh" pack "$res" "${3:?give an output folder}"
    ;;
  *) echo "gpu_split_study: start, status, compare or pack, not $cmd" >&2; exit 2 ;;
esac
