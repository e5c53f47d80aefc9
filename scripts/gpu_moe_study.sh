#!/bin/bash
# A MoE model through real verl 0.9.1 (issue 37): Qwen3-30B-A3B's architecture cut to 20 of its
# 48 layers (scripts/models/qwen3-30b-a3b-20l, random bf16 weights, offline tokenizer:
# scripts/verl_model.py), the Megatron actor through mbridge's Qwen3MoEBridge, vLLM 0.24's
# rollout, colocated on one 4-GPU host. One `tune --runner verl` study: verl's own MoE example
# first (--verl-example: examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh scaled to 4
# GPUs, tuner/study/grid.VERL_MOE_EXAMPLE), then the cost model's best candidate of each
# expert-parallel size (CANDIDATES, written by scripts/moe_candidates.py), then the warm start's
# and the sampler's (EP, ETP, dispatcher, recompute with the MoE modules, token budgets, rollout
# TP/EP are all searched). Run on a host made ready by scripts/gpu_verl_host.sh (as
# scripts/gpu_verl_study.sh). A study outlives one device call: `start` detaches it.
#
#   bash scripts/gpu_moe_study.sh start RESULTS SECONDS [TRIALS]   # detached; returns at once
#   bash scripts/gpu_moe_study.sh status RESULTS                   # progress, the CSV so far
#   bash scripts/gpu_moe_study.sh compare RESULTS                  # tuned vs verl's example
#   bash scripts/gpu_moe_study.sh pack RESULTS OUT                 # CSV, storage, logs -> OUT
#
# The workload: generation and training of comparable length (predicted 8.7 s generation and
# 8.5 s update for the best ep4 candidate), GRPO, prompts of 512 tokens, responses of exactly
# 2048 (ignore_eos), 32 prompts x 4 responses, mini batch 8. Goals (issue 37 item 3): >= 5 ok rows
# with >= 2 EP sizes; tuned >= 1.3x verl's example by step time on the same tokens; device memory
# within 5%, generation and update within 15% of the predictions (medians over the ok rows):
# `compare` prints each. The routing: a random router, near balance; verl 0.9.1 logs no expert
# load in main_ppo's steps (the model folder's README says where it could), so the rows carry
# none and the cost model runs at its default --expert-imbalance 1.
# MODEL_CONFIG, WORKLOAD, GPUS (default 4) and STUDY (default moe2k-<gpu>-x<GPUS>) set another
# study; EXTRA adds tune options (word-split). RESUME_FROM as in gpu_verl_study.sh. CANDIDATES
# (default scripts/$STUDY.candidates.csv): the candidates measured after verl's example, in
# order (--candidates-from); "" leaves the order to the warm start. STEPS (default 4):
# --verl-steps, the 3rd and later steps measured. The study's Ray head is shared by its trials
# (--shared-ray).
set -u
cmd=${1:?give start, status, compare or pack}
res=${2:?give a results folder}
repo=$(cd "$(dirname "$0")/.." && pwd)
SITE=${SITE:-/tmp/gpu-site}
MODEL_CONFIG=${MODEL_CONFIG:-scripts/models/qwen3-30b-a3b-20l/config.json}
MODEL_DIR=${MODEL_DIR:-/tmp/verl-$(basename "$(dirname "$MODEL_CONFIG")")}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case $gpu in *H200*) kind=h200 ;; *H100*) kind=h100 ;; *) kind=h200 ;; esac
GPUS=${GPUS:-4}
study=${STUDY:-moe2k-$kind-x$GPUS}
CANDIDATES=${CANDIDATES-scripts/$study.candidates.csv}
STEPS=${STEPS:-4}
WORKLOAD=${WORKLOAD:---workload grpo-short --prompt-len 512 --prompt-mean 512 --response-len 2048 --response-mean 2048 --batch 32 --n 4 --mini-batch 8}

case $cmd in
  start)
    budget=${3:?give the seconds after which no trial is launched}
    trials=${4:-12}
    seen=$(nvidia-smi -L 2>/dev/null | wc -l)
    if [ "$seen" -lt "$GPUS" ]; then
      echo "gpu_moe_study: this host has $seen GPU(s), the study needs $GPUS" >&2
      exit 2
    fi
    # shellcheck disable=SC1091
    . "$SITE/env.sh"
    mkdir -p "$res"
    [ -n "${RESUME_FROM:-}" ] && cp -rn "$RESUME_FROM"/. "$res"/
    rm -rf /tmp/vt-repo && cp -r "$repo" /tmp/vt-repo && cd /tmp/vt-repo || exit 1
    export PYTHONPATH=$SITE:/tmp/vt-repo
    # 13B parameters of random bf16 weights (26 GB), written on a GPU in about a minute
    ls "$MODEL_DIR"/*.safetensors >/dev/null 2>&1 ||
      python3 scripts/verl_model.py "$MODEL_CONFIG" "$MODEL_DIR" || exit 1
    from=()
    [ -n "$CANDIDATES" ] && [ -f "$CANDIDATES" ] && from=(--candidates-from "$CANDIDATES")
    # shellcheck disable=SC2086
    setsid nohup python3 -m tuner --runner verl --verl-bridge mbridge \
      --shared-ray --verl-steps "$STEPS" "${from[@]}" \
      --model "$MODEL_CONFIG" --model-path "$MODEL_DIR" \
      --gpus "$GPUS" --gpus-per-node "$GPUS" --gpu "$kind" $WORKLOAD \
      --verl-example --trials "$trials" --timeout "$budget" \
      --trial-timeout 900 --study "$study" --results-dir "$res" --recipes-dir "$res/recipes" \
      --no-progress ${EXTRA:-} > "$res/$study.console.log" 2>&1 < /dev/null &
    echo "gpu_moe_study: $study started (pid $!), budget $budget s, console $res/$study.console.log"
    ;;
  status)
    tail -n 5 "$res/$study.console.log" 2>/dev/null
    pgrep -f "tuner --runner verl" >/dev/null && echo "gpu_moe_study: running" || echo "gpu_moe_study: not running"
    for t in "$res/$study"/trials/*/; do
      [ -d "$t" ] || continue
      echo "trial $(basename "$t"): $(grep -aoE 'step:[0-9]+ ' "$t/verl.log" 2>/dev/null | tail -1) $(tail -c 300 "$t/verl.log" 2>/dev/null | tr '\n' ' ' | cut -c1-200)"
    done
    [ -f "$res/$study.csv" ] && cut -d, -f1-4,13,14 "$res/$study.csv" | tail -n 20
    ;;
  compare)
    # verl's example against the best ok row; each ok row's MoE knobs and its errors against
    # the cost model; the medians the issue's goals are on
    PYTHONPATH=$repo python3 - "$res/$study.csv" <<'EOF_PY'
import statistics
import sys

from tuner.results import read_raw

rows = [r for r in read_raw(sys.argv[1]) if r["status"] == "ok" and r["step_s"]]
def f(r, k):
    return float(r.get(k) or 0)
def err(r, k, p):
    return abs(f(r, p) / f(r, k) - 1) if f(r, k) and f(r, p) else None
errs = {"device": [], "generation": [], "update": []}
for r in rows:
    e = {"device": err(r, "peak_mem_device_gib", "pred_device_mem_gib"),
         "generation": err(r, "generation_s", "pred_generation_s"),
         "update": err(r, "update_actor_s", "pred_update_actor_s")}
    for k, v in e.items():
        if v is not None:
            errs[k].append(v)
    shown = "  ".join(f"{k} {v:.0%}" for k, v in e.items() if v is not None)
    print(f"trial {r['trial']:>3} {r['train_parallel']:>14} ep{r['ep']} etp{r['etp']} "
          f"{r['moe_token_dispatcher_type']} recompute {r['recompute_granularity']}"
          f"({r['recompute_modules']}) rollout {r['infer_parallel']}  step {f(r, 'step_s'):.1f} s"
          f"  gen {f(r, 'generation_s'):.1f}  update {f(r, 'update_actor_s'):.1f}"
          f"  device {f(r, 'peak_mem_device_gib'):.1f} GiB  errors: {shown}  [{r['origin']}]")
for k, v in errs.items():
    if v:
        goal = 0.05 if k == "device" else 0.15
        print(f"median {k} error {statistics.median(v):.1%} over {len(v)} rows (goal <= {goal:.0%})")
print(f"ok rows {len(rows)}, EP sizes {sorted({r['ep'] for r in rows})} (goal >= 5 rows, >= 2 sizes)")
example = [r for r in rows if r["origin"].startswith("hand: verl example")]
if rows and example:
    best = min(rows, key=lambda r: f(r, "step_s"))
    ex = example[0]
    print(f"verl's example: trial {ex['trial']} step {f(ex, 'step_s'):.1f} s; best: trial "
          f"{best['trial']} step {f(best, 'step_s'):.1f} s; tuned / example "
          f"{f(ex, 'step_s') / f(best, 'step_s'):.2f}x by step time (goal >= 1.3x)")
else:
    print("gpu_moe_study: no ok row of verl's example yet")
EOF_PY
    ;;
  pack)
    # gpu_verl_study.sh's pack: logs gzipped, the CSV, the storage as <study>.sqlite3
    STUDY=$study bash "$repo/scripts/gpu_verl_study.sh" pack "$res" "${3:?give an output folder}"
    ;;
  *) echo "gpu_moe_study: start, status, compare or pack, not $cmd" >&2; exit 2 ;;
esac
