#!/bin/bash
# Kernel parity of the megatron runner's two sets of layers (issue 18 item 2): the same 2
# candidates of Qwen3-1.7B's architecture (scripts/models/qwen3-1.7b/config.json) measured once
# with --layer-spec local (megatron-core's local layers, the worker's flash attention: what the
# committed leaderboards ran) and once with --layer-spec te (transformer-engine's layers, as verl
# builds its actor), on one GPU; then per candidate old_log_prob_s, update_actor_s and the peak
# memory (allocated and device) local vs te and te/local.
#
# NOT RUN YET: written in a session with no GPU; a later GPU session runs it, from the
# repository root, on a host with the kit installed into /tmp/gpu-site (scripts/gpu_verl_host.sh
# install: megatron-core 0.19.2, transformer-engine 2.20.2, optuna):
#   bash scripts/gpu_te_parity.sh OUT_DIR
# The local study takes its 2 candidates from the warm start (the cost model's best and the
# known-good recipes, seed 0); the te study measures the same ones (--candidates-from the local
# CSV, no warm start). Kernel choices the local layers pin (fused RoPE and SwiGLU off) come with
# them, so the two differ in the layers only; the te study's attention is TE's choice
# (attention_backend auto: cuDNN fused attention on Hopper). Workload: prompts 256, responses
# exactly 2048, 8 prompts x 4, mini batch 4 (about a minute a trial on one H100); generation is
# not measured. Each study is cut at 4 minutes, so the whole run stays under about 8.
# What to look at: both rows ok for each candidate; te/local of the phases (below 1: TE faster)
# and of the peaks; extra's attention= (varlen_attn or the aten flash path vs
# TEDotProductAttention) and layer_spec=.
set -u
# shellcheck source=scripts/gpu_pack.sh
source "$(dirname "$0")/gpu_pack.sh"
out=${1:?give an output folder}
SITE=${SITE:-/tmp/gpu-site}
# shellcheck disable=SC1091
source "$SITE/env.sh" || { echo "gpu_te_parity: no $SITE/env.sh (install the kit)" >&2; exit 1; }
python3 -c "import transformer_engine.pytorch" || {
  echo "gpu_te_parity: transformer_engine.pytorch does not import here: nothing to compare" >&2
  exit 1
}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case $gpu in *H200*) kind=h200 ;; *) kind=h100 ;; esac
mkdir -p "$out/r"
res=$out/r/results
common=(--model scripts/models/qwen3-1.7b/config.json --gpus 1 --gpus-per-node 1 --gpu "$kind"
  --runner megatron --no-measure-generation --workload dapo-math --prompt-len 256
  --prompt-mean 256 --response-len 2048 --response-mean 2048 --batch 8 --n 4 --mini-batch 4
  --trials 2 --seed 0 --trial-timeout 150 --recipes 0 --results-dir "$res"
  --recipes-dir "$out/r/recipes" --no-progress)
local_csv=$res/te-parity-local.csv
timeout 240 python3 -m tuner "${common[@]}" --layer-spec local --study te-parity-local 2>&1 |
  tee "$out/local.log"
rc_local=${PIPESTATUS[0]}
rc_te=1
if grep -q ',ok,' "$local_csv" 2>/dev/null; then
  timeout 240 python3 -m tuner "${common[@]}" --layer-spec te --no-warm-start \
    --candidates-from "$local_csv" --study te-parity-te 2>&1 | tee "$out/te.log"
  rc_te=${PIPESTATUS[0]}
else
  echo "gpu_te_parity: no ok row in $local_csv: nothing for the te layers to repeat" | tee "$out/te.log"
fi
python3 - "$local_csv" "$res/te-parity-te.csv" <<'PY' | tee "$out/parity.txt"
import csv, os, sys

def rows(path):
    return list(csv.DictReader(open(path))) if os.path.exists(path) else []

local = {r["trial"]: r for r in rows(sys.argv[1])}
te = rows(sys.argv[2])
fields = ("old_log_prob_s", "update_actor_s", "peak_mem_gib", "peak_mem_device_gib")

def extra(r, key):
    return dict(p.partition("=")[::2] for p in r.get("extra", "").split(";")).get(key, "")

print("per candidate: local vs te (te/local); phases in s for the whole step, peaks in GiB")
for t in te:
    origin = t.get("origin", "")
    lo = local.get(origin.rsplit(" ", 1)[-1]) if origin.startswith("from ") else None
    if lo is None:
        continue
    print(f"local trial {lo['trial']} {lo['train_parallel']} fused_kernels={lo['use_fused_kernels']} "
          f"recompute={lo['recompute_granularity']}: local {lo['status']}, te {t['status']} "
          f"{(t['reason'] or lo['reason'])[:150]}")
    print(f"  attention: local {extra(lo, 'attention')} / te {extra(t, 'attention')}")
    for f in fields:
        a, b = lo.get(f) or "", t.get(f) or ""
        ratio = f"{float(b) / float(a):.3f}" if a and b and float(a) else "-"
        print(f"  {f:<20} {a or '-':>10} {b or '-':>10}   te/local {ratio}")
if not te:
    print("no te rows")
PY
pack_folder "$out/r" "$out/te-parity.tgz"
echo "gpu_te_parity: local exit $rc_local, te exit $rc_te"
[ "$rc_local" = 0 ] && [ "$rc_te" = 0 ]
