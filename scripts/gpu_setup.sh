# Source this on a GPU host with no package index, from the repository root:
#   source scripts/gpu_setup.sh [WHEEL_DIR]      (default .whl, made by ../shared/tools/gpu-wheels.sh)
# It installs the carried wheels (megatron-core, optuna and their pure-Python needs) into
# /tmp/site without touching the host's torch, and puts /tmp/site and the checkout on PYTHONPATH.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 ...): the shared hosts require it.
_whl_dir=${1:-.whl}
if ! ls "$_whl_dir"/*.whl >/dev/null 2>&1; then
  echo "gpu_setup: no wheels in $_whl_dir" >&2
  return 1 2>/dev/null || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$_whl_dir"/*.whl || { return 1 2>/dev/null || exit 1; }
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
python3 -c "import torch, megatron.core as m; print('gpu_setup: torch', torch.__version__, \
'megatron-core', m.__version__, 'gpus', torch.cuda.device_count())"
unset _whl_dir
