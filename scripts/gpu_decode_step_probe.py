"""vLLM 0.24.0's decode step measured against the cost model's, with and without async scheduling.

The cost model's decode step (tuner.estimate.generation._decode_step_s) overlaps the engine's
per-step host work with the GPU's where vLLM schedules asynchronously, the default of vLLM
0.24.0 (c1ae917: max(GPU, host) instead of GPU + host). This checks that on a GPU: one engine
per `async_scheduling` setting (Qwen3-1.7B's architecture, dummy weights, CUDA graphs as verl
runs them: tuner.runners.vllm_gen's EngineCfg.llm_kwargs), for each batch size B, B sequences
of a 128-token prompt generated for exactly T1 and T2 tokens; the decode step is the difference
over the T2 - T1 extra steps (prefill and start-up cancel), at the mean context of those steps.

On a GPU host with vLLM (the kit, scripts/gpu_verl_host.sh install; without flashinfer, which
the kit leaves out, vLLM 0.24's sampler needs VLLM_USE_FLASHINFER_SAMPLER=0, as
tuner.runners.vllm_gen.main sets it):
    source /tmp/gpu-site/env.sh; export VLLM_USE_FLASHINFER_SAMPLER=0
    python scripts/gpu_decode_step_probe.py measure OUT.jsonl

Measured on one H100 and one H200 host (results/decode-step-h{100,200}-x1.jsonl; the output in
.out.txt): async scheduling takes 1.4-2.8 ms (H100) and 0.8-1.3 ms (H200) off every step (batch
1: 3.89 -> 2.54 ms and 2.83 -> 2.06 ms), so the engine's host work does overlap the GPU's. At
batch 1, where the GPU needs ~1.3 / ~0.9 ms for the weights, the host's step is ~2.5 ms (H100
host) and ~2.0 ms (H200 host), under Profile.decode_step_overhead_s (3 ms): the model of each
setting is -6% to +20% off on the H100, +17% to +47% over on the H200 at these short contexts.
Here (no GPU), the measured lines beside the cost model's step, both settings:
    python scripts/gpu_decode_step_probe.py compare results/decode-step-h100-x1.jsonl \
        results/decode-step-h200-x1.jsonl > scripts/gpu_decode_step_probe.out.txt
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

MODEL = Path(__file__).resolve().parent / "models" / "qwen3-1.7b"
PROMPT = 128
T1, T2 = 256, 1280
BATCHES = (1, 8, 32, 64)


def measure(out: Path) -> None:
    import torch
    from vllm import LLM

    from tuner.runners.vllm_gen.engine import generate
    from tuner.runners.vllm_gen.spec import EngineCfg

    sha = hashlib.sha256((MODEL / "config.json").read_bytes()).hexdigest()
    cfg = EngineCfg(
        model=str(MODEL),
        config_sha=sha,
        tensor_parallel_size=1,
        gpu_memory_utilization=0.5,
        max_num_seqs=128,
        max_num_batched_tokens=8192,
        enforce_eager=False,
        max_model_len=4096,
    )
    gpu = torch.cuda.get_device_name(0)
    with out.open("a") as f:
        for async_ in (True, False):
            t0 = time.perf_counter()
            llm = LLM(**cfg.llm_kwargs(), async_scheduling=async_)
            start_s = time.perf_counter() - t0
            for b in BATCHES:
                prompts = [
                    {"prompt_token_ids": [(7 * i + j) % 50000 + 1 for j in range(PROMPT)]}
                    for i in range(b)
                ]
                generate(llm, prompts, [32] * b)  # warm-up
                s1, n1 = generate(llm, prompts, [T1] * b)
                s2, n2 = generate(llm, prompts, [T2] * b)
                row = {
                    "gpu": gpu,
                    "async_scheduling": async_,
                    "batch": b,
                    "prompt": PROMPT,
                    "t1": T1,
                    "t2": T2,
                    "s1": round(s1, 4),
                    "s2": round(s2, 4),
                    "tokens": [n1, n2],
                    "step_ms": round((s2 - s1) / (T2 - T1) * 1e3, 4),
                    "engine_start_s": round(start_s, 1),
                }
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row) + "\n")
            del llm
            import gc

            gc.collect()
            torch.cuda.empty_cache()


def compare(paths: list[Path]) -> None:
    for path in paths:
        _compare(path)


def _compare(path: Path) -> None:
    from tuner.estimate import Profile
    from tuner.estimate.context import get_context
    from tuner.estimate.generation import FULL_GRAPH, _decode_step_s
    from tuner.hardware import Cluster, get_gpu
    from tuner.models import get_model
    from tuner.workload import Workload

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print(f"{path}: {len(rows)} measured lines; step in ms, the mean context of the timed steps")
    print("  async  batch  context  measured  model(async)  model(serial)  err(model, its setting)")
    for r in rows:
        gpu = "h200" if "H200" in r["gpu"] else "h100"
        # the step depends on the model, the GPU and the profile; the workload only sizes
        # the context, given here
        w = Workload(prompt_len=PROMPT, response_len=T2, batch_size=64, n=1, mini_batch_size=1)
        cl = Cluster(gpu=get_gpu(gpu), num_gpus=1, gpus_per_node=1)
        ctx = get_context(get_model(str(MODEL / "config.json")), cl, w, Profile())
        context = r["prompt"] + (r["t1"] + r["t2"]) / 2
        model = {
            a: _decode_step_s(ctx, 1, 1, 1, r["batch"], context, FULL_GRAPH, async_scheduling=a)
            * 1e3
            for a in (True, False)
        }
        own = model[r["async_scheduling"]]
        err = (own - r["step_ms"]) / r["step_ms"]
        print(
            f"  {str(r['async_scheduling']):5}  {r['batch']:5}  {context:7.0f}  {r['step_ms']:8.3f}"
            f"  {model[True]:12.3f}  {model[False]:13.3f}  {err:+.1%}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("measure", "compare"))
    ap.add_argument("files", type=Path, nargs="+", help="measure: one output; compare: inputs")
    a = ap.parse_args()
    if a.mode == "measure":
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        measure(a.files[0])
    else:
        compare(a.files)


if __name__ == "__main__":
    main()
