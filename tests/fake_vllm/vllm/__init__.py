"""A stand-in for vLLM 0.24.0 in tests, put on PYTHONPATH only by the tests that want it: the
few calls the generation worker (tuner.runners.vllm_gen.engine) makes, with vLLM's names,
keyword checks and failure messages, sleep-based timing, and a JSON line per call in the file
$FAKE_VLLM_LOG so a test sees which engines were built and what was asked of them.

$FAKE_VLLM_MODE: ok (default); oom (the engine's build runs out of memory); refuse (vLLM's
KV-cache refusal, printed by the "engine core" as vLLM prints it, then the front end's error);
short (every response one token short of what was asked)."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

__version__ = "0.24.0+fake"

LLM_KWARGS = frozenset(
    # vllm/entrypoints/llm.py LLM.__init__ (0.24.0) and the EngineArgs fields it forwards
    # through **kwargs (vllm/engine/arg_utils.py) that the worker uses
    {
        "model", "skip_tokenizer_init", "tensor_parallel_size", "dtype", "seed",
        "gpu_memory_utilization", "enforce_eager", "compilation_config", "load_format",
        "max_model_len", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching",
        "enable_chunked_prefill", "enable_sleep_mode", "disable_log_stats",
    }
)  # fmt: skip
KV_REFUSAL = (
    "ValueError: To serve at least one request with the model's max seq len (40960), (4.38 GiB "
    "KV cache is needed, which is larger than the available KV cache memory (1.20 GiB). Try "
    "increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
    "decreasing `max_model_len` when initializing the engine."
)


def _log(event: str, **kw: Any) -> None:
    path = os.environ.get("FAKE_VLLM_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), **kw}) + "\n")


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    detokenize: bool = True

    def __post_init__(self) -> None:  # vllm/sampling_params.py _verify_args
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must be less than or equal to max_tokens")


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        unknown = set(kwargs) - LLM_KWARGS
        if unknown:
            raise TypeError(f"LLM got unexpected keyword arguments {sorted(unknown)}")
        cfg = json.loads((Path(model) / "config.json").read_text())
        mode = os.environ.get("FAKE_VLLM_MODE", "ok")
        _log("engine", model=model, kwargs=kwargs)
        if mode == "oom":
            raise RuntimeError(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
            )
        if mode == "refuse":
            print("(EngineCore pid=1) ERROR EngineCore failed to start.", file=sys.stderr)
            print(KV_REFUSAL, file=sys.stderr, flush=True)
            raise RuntimeError(
                "Engine core initialization failed. See root cause above. Failed core proc(s): {}"
            )
        tp = kwargs.get("tensor_parallel_size", 1)
        if cfg["num_attention_heads"] % tp:
            raise ValueError("Total number of attention heads must be divisible by tp")
        util = kwargs["gpu_memory_utilization"]
        cache = SimpleNamespace(num_gpu_blocks=int(util * 10_000), block_size=16)
        self.llm_engine = SimpleNamespace(vllm_config=SimpleNamespace(cache_config=cache))
        self.sleeping = False
        self.sleep_mode = kwargs.get("enable_sleep_mode", False)

    def generate(self, prompts: list[dict[str, list[int]]], sampling_params: Any, *,
                 use_tqdm: bool = True) -> list[Any]:  # fmt: skip
        if self.sleeping:
            raise RuntimeError("generate on a sleeping engine")
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params]
        short = os.environ.get("FAKE_VLLM_MODE") == "short"
        _log(
            "generate",
            prompt_lens=[len(p["prompt_token_ids"]) for p in prompts],
            max_tokens=[p.max_tokens for p in params],
            min_tokens=[p.min_tokens for p in params],
            ignore_eos=[p.ignore_eos for p in params],
            detokenize=[p.detokenize for p in params],
        )
        tokens = sum(p.max_tokens for p in params)
        time.sleep(0.02 + 2e-5 * tokens)
        return [
            SimpleNamespace(outputs=[SimpleNamespace(token_ids=[7] * (p.max_tokens - short))])
            for p in params
        ]

    def sleep(self, level: int = 1) -> None:
        if not self.sleep_mode:
            raise ValueError("Sleep mode is not enabled")
        self.sleeping = True
        _log("sleep", level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleeping = False
        _log("wake_up")

    def reset_prefix_cache(self) -> bool:
        _log("reset_prefix_cache")
        return True
