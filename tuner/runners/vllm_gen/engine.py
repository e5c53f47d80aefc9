"""The one engine a generation worker keeps: build it, wake it, generate the step's share with
exact lengths (a warm-up, then the timed generate), read its KV-cache capacity, put it to sleep.

Imports vLLM (only here). The calls, as vLLM 0.24.0 defines them: `LLM(**kwargs)`,
`LLM.generate(prompts, sampling_params, use_tqdm=False)` with `{"prompt_token_ids": [...]}`
prompts (vllm/inputs/llm.py TokensPrompt) and one SamplingParams per prompt,
`SamplingParams(max_tokens=r, min_tokens=r, ignore_eos=True, detokenize=False)`
(vllm/sampling_params.py), `LLM.sleep(level=1)`, `LLM.wake_up()`, `LLM.reset_prefix_cache()`
(vllm/entrypoints/llm.py), `llm.llm_engine.vllm_config.cache_config`
(vllm/v1/engine/llm_engine.py)."""

from __future__ import annotations

import math
import random
import time
from typing import Any

from tuner.runners.vllm_gen.spec import SLEEP_LEVEL, GenResult, GenSpec

GIB = float(2**30)


def prompts_of(spec: GenSpec, seed: int) -> list[dict[str, list[int]]]:
    """Token-id prompts of the spec's lengths: random ids, one draw per group, shared by the
    group's sequences (so prefix caching sees what it sees in verl)."""
    rng = random.Random(seed)
    out: list[dict[str, list[int]]] = []
    g = spec.group_size
    for start in range(0, len(spec.prompt_lengths), g):
        ids = [rng.randrange(spec.vocab_size) for _ in range(spec.prompt_lengths[start])]
        out += [{"prompt_token_ids": ids} for _ in range(g)]
    return out


def generate(
    llm: Any, prompts: list[dict[str, list[int]]], lengths: list[int]
) -> tuple[float, int]:
    """(seconds, tokens generated) of one generate: each response exactly its length, at
    verl's default sampling (temperature 1, top_p 1, top_k off)."""
    from vllm import SamplingParams

    params = [
        SamplingParams(
            n=1,
            temperature=1.0,
            top_p=1.0,
            max_tokens=r,
            min_tokens=r,
            ignore_eos=True,
            detokenize=False,
        )
        for r in lengths
    ]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    return seconds, sum(len(o.outputs[0].token_ids) for o in outs)


def kv_capacity(llm: Any, max_model_len: int) -> dict[str, Any]:
    """Blocks, block size, tokens and vLLM's max concurrency at max_model_len."""
    cc = llm.llm_engine.vllm_config.cache_config
    blocks, size = cc.num_gpu_blocks, cc.block_size
    if not blocks or not size:
        return {}
    return {
        "kv_cache_blocks": int(blocks),
        "kv_block_size": int(size),
        "kv_cache_tokens": int(blocks) * int(size),
        "max_concurrency": round(blocks / math.ceil(max_model_len / size), 2),
    }


def device_used_gib(gpu: int = 0) -> float | None:
    """Device memory in use on GPU `gpu` by NVML (no CUDA context in this process), or None."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        return round(int(pynvml.nvmlDeviceGetMemoryInfo(h).used) / GIB, 2)
    except Exception:  # noqa: BLE001 (a reading, not a result)
        return None


class Engine:
    """One vLLM engine for the worker's life (its settings never change: the runner starts
    another worker for other settings). Between requests it sleeps."""

    def __init__(self) -> None:
        self.llm: Any = None
        self.key = ""

    def serve(self, spec: GenSpec) -> GenResult:
        import vllm

        res = GenResult(
            status="ok",
            engine_key=spec.engine.key(),
            sequences=len(spec.response_lengths),
            tokens_requested=spec.tokens_requested,
            versions={"vllm": str(vllm.__version__)},
        )
        if self.llm is None:
            t0 = time.perf_counter()
            self.llm = vllm.LLM(**spec.engine.llm_kwargs())
            self.key = res.engine_key
            res.engine_start_s = round(time.perf_counter() - t0, 2)
        elif res.engine_key != self.key:
            raise ValueError("this worker's engine has other settings: start another worker")
        else:
            t0 = time.perf_counter()
            self.llm.wake_up()
            res.wake_s = round(time.perf_counter() - t0, 2)
            res.engine_reused = True
        for k, v in kv_capacity(self.llm, spec.engine.max_model_len).items():
            setattr(res, k, v)
        warm = min(spec.warmup_response_tokens, min(spec.response_lengths))
        res.warmup_s, _ = generate(
            self.llm, prompts_of(spec, spec.seed + 1), [warm] * len(spec.response_lengths)
        )
        self.llm.reset_prefix_cache()  # the timed prompts must not hit the warm-up's blocks
        timed = prompts_of(spec, spec.seed)
        seconds, tokens = generate(self.llm, timed, list(spec.response_lengths))
        res.generation_s, res.tokens_generated = seconds, tokens
        t0 = time.perf_counter()
        self.llm.sleep(level=SLEEP_LEVEL)
        res.sleep_s = round(time.perf_counter() - t0, 2)
        res.device_used_after_sleep_gib = device_used_gib()
        if tokens != spec.tokens_requested:
            res.status = "failed"
            res.reason = (
                f"vLLM generated {tokens} tokens where {spec.tokens_requested} were requested "
                "(min_tokens = max_tokens, ignore_eos): the time is not of the step's lengths"
            )
        return res
