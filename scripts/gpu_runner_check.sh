#!/bin/bash
# The megatron runner's GPU check (refusals vs megatron-core, one-shot vs pooled trials, fused vs
# full logits, early stop), from the repository root on a GPU host with the wheels in .whl:
#   bash scripts/gpu_runner_check.sh OUT_DIR [MODEL [--no-oneshot]]
set -u
# shellcheck source=scripts/gpu_pack.sh
source "$(dirname "$0")/gpu_pack.sh"
out=${1:?give an output folder}
python3 -c "import megatron.core, optuna" 2>/dev/null || source scripts/gpu_setup.sh .whl || exit 1
mkdir -p "$out"
python3 scripts/gpu_runner_check.py "$out" "${2:-qwen2.5-7b}" "${@:3}" 2>&1 | tee "$out/check.log"
rc=${PIPESTATUS[0]}
# keep the worker logs' tails (the full ones can be large)
trim_logs "$out/work"
tar czf "$out/work.tgz" -C "$out" work && rm -rf "$out/work"
exit $rc
