#!/bin/bash
# A bare GPU host (Python 3.12, a CUDA torch 2.11, no package index) made verl-ready: verl 0.9.1,
# vLLM 0.24.0, megatron-core 0.19.2, transformer-engine 2.20.2, mbridge, Ray, and this tuner's own
# needs (optuna), installed into /tmp/gpu-site without touching the host's packages.
#
#   here (with a package index):   bash scripts/gpu_verl_host.sh fetch KIT
#       KIT (git-ignored, e.g. .kit): the shared kit's wheels in chunks of <= 50 MiB
#       (../shared/tools/gpu-verl-kit/fetch.sh) and KIT/extra/, the tuner's wheels
#   on the host, one call per chunk: bash scripts/gpu_verl_host.sh stage KIT/chunks/NN
#   on the host, after the last one:  bash scripts/gpu_verl_host.sh install KIT
#       joins and checks the chunks, installs them and KIT/extra, patches mbridge (below), and
#       writes /tmp/gpu-site/env.sh; then `source /tmp/gpu-site/env.sh` before `tune`.
#   bash scripts/gpu_verl_host.sh patch-mbridge [SITE]
#       mbridge 0.15.1 compares with ModelType.encoder_and_decoder, which megatron-core 0.19.2
#       removed (mbridge/core/util.py): the model build fails there. The comparison is made
#       tolerant (getattr(..., None): a GPT model is never encoder-and-decoder). `tune --runner
#       verl --verl-bridge mbridge` refuses to launch on an unpatched host.
#   bash scripts/gpu_verl_host.sh check    the tuner's preflight (what `tune --runner verl` runs)
set -euo pipefail
cmd=${1:?give fetch, stage, install, patch-mbridge or check}
SITE=${SITE:-/tmp/gpu-site}
STAGE=${STAGE:-/tmp/stage}
repo=$(cd "$(dirname "$0")/.." && pwd)

patch_mbridge() {
  local site=${1:-$SITE} f
  f=$(ls "$site"/mbridge/core/util.py 2>/dev/null || true)
  [ -n "$f" ] || { echo "gpu_verl_host: no mbridge in $site" >&2; return 1; }
  sed -i 's/ModelType\.encoder_and_decoder/getattr(ModelType, "encoder_and_decoder", None)/g' "$f"
  echo "gpu_verl_host: patched $f ($(grep -c 'getattr(ModelType' "$f") comparisons)"
}

case $cmd in
  fetch)
    kit=${2:?give a git-ignored folder for the kit}
    shared=${KIT_SOURCE:-$repo/../shared/tools/gpu-verl-kit}
    [ -x "$shared/fetch.sh" ] || { echo "gpu_verl_host: no kit at $shared (KIT_SOURCE=...)" >&2; exit 2; }
    bash "$shared/fetch.sh" "$kit"
    mkdir -p "$kit/extra"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$kit/extra" \
      optuna==5.0.0 alembic colorlog sqlalchemy mako 2>&1 | grep -v WARNING || true
    echo "gpu_verl_host: $(ls "$kit"/chunks | wc -l) chunks, $(ls "$kit/extra" | wc -l) extra wheels in $kit"
    ;;
  stage)
    mkdir -p "$STAGE" && cp "${2:?give KIT/chunks/NN}"/* "$STAGE"/
    echo "gpu_verl_host: staged $(ls "$STAGE" | wc -l) file(s) in $STAGE"
    ;;
  install)
    kit=${2:?give the kit folder (its extra/ wheels)}
    cd "$STAGE"
    cat part.* > kit.tar && sha256sum -c kit.tar.sha256 && rm -f part.*
    mkdir -p /tmp/gpu-kit && tar xf kit.tar -C /tmp/gpu-kit && rm -f kit.tar
    cd "$repo"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" /tmp/gpu-kit/wheels/*.whl "$kit"/extra/*.whl
    patch_mbridge "$SITE"
    # bytecode now, as a normal pip install does (--no-compile above keeps pip's own pass off):
    # else each trial process of the first launch compiles the modules it imports (verl, vLLM,
    # megatron, transformer-engine, ray) and that launch's start-up counts it
    python3 -m compileall -q -j 0 "$SITE" > /dev/null 2>&1 || true
    cat > "$SITE/env.sh" <<EOF
export PYTHONPATH=$SITE:$repo\${PYTHONPATH:+:\$PYTHONPATH}
export PATH=$SITE/bin:\$PATH
export PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 WANDB_MODE=disabled
export TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0
# the shared hosts need NVLink multicast off
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
EOF
    # shellcheck disable=SC1091
    . "$SITE/env.sh"
    python3 -c "import importlib.metadata as md; print('gpu_verl_host:', ', '.join(f'{p} {md.version(p)}' for p in ('verl', 'vllm', 'megatron-core', 'transformer-engine', 'mbridge', 'ray', 'optuna', 'torch', 'transformers')))"
    ;;
  patch-mbridge)
    patch_mbridge "${2:-$SITE}"
    ;;
  check)
    # shellcheck disable=SC1091
    . "$SITE/env.sh"
    python3 - <<'PY'
from tuner.runners.verl_preflight import preflight
from tuner.verl_settings import VerlSettings
import sys
pf = preflight(sys.executable, VerlSettings(bridge="mbridge"))
print("gpu_verl_host: preflight ok in", pf.seconds, "s:", pf.versions_text)
print("gpu_verl_host: trials need", pf.env or "nothing more", "; pinned", pf.pinned or "nothing")
PY
    ;;
  *) echo "gpu_verl_host: fetch, stage, install, patch-mbridge or check, not $cmd" >&2; exit 2 ;;
esac
