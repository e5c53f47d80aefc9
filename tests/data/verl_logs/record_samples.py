"""Re-record the Ray-shaped sample logs of this folder (not a test; run by hand, no GPU needed).

    python tests/data/verl_logs/record_samples.py tests/data/verl_logs

Each scenario runs a real local Ray cluster with stand-ins named and nested as verl 0.9.1 calls
them (TaskRunnerV1.run -> trainer _step_once -> _update_actor -> worker update_actor), and raises
there the exception text of the real failure: PyTorch's CUDA OOM message (c10/cuda/
CUDACachingAllocator.cpp), vLLM's KV-cache check (vllm/v1/core/kv_cache_utils.py), or a worker
process that exits. So the tracebacks, `ray::` task lines and ActorDiedError texts are Ray's own;
only the innermost message is copied from the library that would raise it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

TORCH_OOM = (
    "CUDA out of memory. Tried to allocate 3.71 GiB. GPU 3 has a total capacity of 79.11 GiB of "
    "which 2.06 GiB is free. Including non-PyTorch memory, this process has 77.04 GiB memory in "
    "use. Of the allocated memory 71.94 GiB is allocated by PyTorch, and 3.63 GiB is reserved by "
    "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
    "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
VLLM_KV = (
    "To serve at least one request with the models's max seq len (10240), (3.75 GiB KV cache) is "
    "needed, which is larger than the available KV cache memory (1.20 GiB). Based on the "
    "available memory, the estimated maximum model length is 3264. Try increasing "
    "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
)

SCENARIO = r"""
import os, sys, ray, torch

MODE = sys.argv[1]
TORCH_OOM, VLLM_KV = sys.argv[2], sys.argv[3]

@ray.remote
class WorkerDict:
    def update_actor(self, data):
        if MODE == "oom_update_actor":
            raise torch.OutOfMemoryError(TORCH_OOM)
        if MODE == "ray_actor_died":
            os._exit(1)
        return data

    def compute_ref_log_prob(self, data):
        raise torch.OutOfMemoryError(TORCH_OOM)

@ray.remote
class vLLMHttpServer:
    def launch_server(self):
        raise ValueError(VLLM_KV)

class PPOTrainerSync:
    def __init__(self):
        self.wg = WorkerDict.remote()

    def _update_actor(self, batch):
        return ray.get(self.wg.update_actor.remote(batch))

    def _compute_ref_log_prob(self, batch):
        return ray.get(self.wg.compute_ref_log_prob.remote(batch))

    def _step_once(self, batch):
        if MODE == "oom_ref":
            batch = self._compute_ref_log_prob(batch)
        batch = self._update_actor(batch)
        return batch

    def init(self):
        if MODE == "oom_vllm_kv":
            ray.get(vLLMHttpServer.remote().launch_server.remote())

@ray.remote
class TaskRunnerV1:
    def run(self, config):
        trainer = PPOTrainerSync()
        trainer.init()
        print("step:1 - perf/throughput:1520.3 - timing_s/step:98.1", flush=True)
        return trainer._step_once(config)

ray.init(address="local", num_cpus=2, include_dashboard=False)
runner = TaskRunnerV1.remote()
ray.get(runner.run.remote({"step": 2}))
"""


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    standin = Path(tempfile.mkdtemp()) / "trainer_standin.py"
    standin.write_text(SCENARIO)
    for mode in ("oom_update_actor", "oom_ref", "oom_vllm_kv", "ray_actor_died"):
        log = out / f"{mode}.log"
        with open(log, "w") as f:
            subprocess.run(
                [sys.executable, str(standin), mode, TORCH_OOM, VLLM_KV],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=300,
                check=False,
            )
        print(log)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
