#!/bin/bash
# Superseded by scripts/gpu_runner_check.sh (schema-2 worker: refusals vs megatron-core, one-shot
# and pooled trials, fused vs full logits, pp2 vpp2, early stop). Kept as an alias:
#   bash scripts/gpu_worker_smoke.sh OUT_DIR [MODEL [--no-oneshot]]
exec bash "$(dirname "$0")/gpu_runner_check.sh" "${1:-${OUT:-/tmp/smoke}}" "${@:2}"
