#!/bin/bash
# The megatron runner with generation measured by real vLLM (tuner.runners.megatron_generation):
# a 2-trial study of Qwen3-1.7B's architecture (scripts/models/qwen3-1.7b/config.json; vLLM
# runs it with load_format=dummy, so no weights are needed) on one GPU, then generation_s
# (measured) beside pred_generation_s (the cost model) for each row, with the KV cache vLLM
# reported. The workload is scripts/gpu_verl_study.sh's (prompts 256, responses exactly 4096,
# 8 prompts x 4, mini batch 4), so the rows compare with the committed verl rows'
# timing_s/gen (results/verl4k-h100-x1).
#
# NOT RUN YET: written in a session with no GPU; a later GPU session runs it, from the
# repository root, on a host with the kit installed into /tmp/gpu-site (scripts/gpu_verl_host.sh
# install; vLLM 0.24.0, megatron-core 0.19.2, transformer-engine, optuna):
#   bash scripts/gpu_generation_check.sh OUT_DIR [TRIALS]
# The first trials are the configurations real verl measured (--candidates-from
# results/verl4k-h100-x1.csv), so each row is printed beside verl's own phases of the same
# configuration (issue 17 item 4: the fast runner against the real thing).
# What to look at: the rows ok with extra generation=measured(vllm); trial 2 either reused the
# engine (gen_engine_reused=True, same rollout settings) or built another; generation_s against
# pred_generation_s; the training rows' peak_mem_device_gib include the sleeping engine's
# residue (gen_device_used_after_sleep_gib).
set -u
# shellcheck source=scripts/gpu_pack.sh
source "$(dirname "$0")/gpu_pack.sh"
out=${1:?give an output folder}
trials=${2:-3}
verl_csv=${VERL_CSV:-results/verl4k-h100-x1.csv}
SITE=${SITE:-/tmp/gpu-site}
# shellcheck disable=SC1091
source "$SITE/env.sh" || { echo "gpu_generation_check: no $SITE/env.sh (install the kit)" >&2; exit 1; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case $gpu in *H200*) kind=h200 ;; *H100*) kind=h100 ;; *) kind=h100 ;; esac
study=gen-check-$kind-x1
mkdir -p "$out/r"
timeout 3000 python3 -m tuner --model scripts/models/qwen3-1.7b/config.json --gpus 1 \
  --gpus-per-node 1 --gpu "$kind" --runner megatron --measure-generation --workload dapo-math \
  --prompt-len 256 --prompt-mean 256 --response-len 4096 --response-mean 4096 --batch 8 --n 4 \
  --mini-batch 4 --no-warm-start --candidates-from "$verl_csv" --trials "$trials" --study "$study" \
  --results-dir "$out/r/results" --recipes-dir "$out/r/recipes" --no-progress 2>&1 | tee "$out/$study.log"
rc=${PIPESTATUS[0]}
python3 - "$out/r/results/$study.csv" "$verl_csv" <<'PY' | tee -a "$out/$study.log"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
verl = {r["trial"]: r for r in csv.DictReader(open(sys.argv[2]))}
print(f"{'trial':>5} {'status':>8} {'rollout':>8} {'util':>5} {'gen_s':>8} {'pred_gen_s':>10} extra")
for r in rows:
    keep = ("generation", "gen_engine_reused", "gen_kv_cache_tokens", "gen_max_concurrency",
            "gen_engine_start_s", "gen_device_used_after_sleep_gib", "train_tokens_per_s_per_gpu")
    extra = ";".join(p for p in r.get("extra", "").split(";") if p.split("=")[0] in keep)
    print(f"{r['trial']:>5} {r['status']:>8} {r['infer_parallel']:>8} "
          f"{r.get('gpu_memory_utilization', ''):>5} {r['generation_s'] or '-':>8} "
          f"{r['pred_generation_s'] or '-':>10} {extra} {r['reason'][:120]}")
print("the same configurations in real verl (fast runner / verl, per phase):")
for r in rows:
    origin = r.get("origin", "")
    v = verl.get(origin.rsplit(" ", 1)[-1]) if origin.startswith("from ") else None
    if v is None or r["status"] != "ok":
        continue
    parts = []
    for f in ("generation_s", "old_log_prob_s", "update_actor_s"):
        if r.get(f) and v.get(f):
            parts.append(f"{f} {float(r[f]):.2f}/{float(v[f]):.2f} = {float(r[f]) / float(v[f]):.3f}")
    print(f"  {origin}: " + "; ".join(parts))
PY
pack_folder "$out/r" "$out/$study.tgz"
echo "gpu_generation_check: $study exit $rc"
exit "$rc"
