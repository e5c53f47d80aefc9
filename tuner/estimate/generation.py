"""Seconds of the generation phase: vLLM's decode steps, colocated, one engine per rollout-TP
group.

A decode step streams the engine's weights and KV cache or computes, whichever is longer, then
its collectives; its host work overlaps them under vLLM's async scheduling and follows them
without it (VLLM_ASYNC_SCHEDULING); how it is launched (with `enforce_eager` every op from
Python, a full CUDA graph, piecewise graphs, compiled code no graph covers) follows vLLM
0.24.0's configuration and capture sizes. The phase integrates the steps over the response-length
distribution (tuner.lengths): a busy phase at the engine's concurrency, then the long tail.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass
from typing import Any

from tuner.estimate.context import (
    BF16,
    DECODE_KERNELS_DENSE_LAYER,
    DECODE_KERNELS_MOE_EXTRA,
    Context,
    bandwidth_between,
)
from tuner.estimate.rollout_memory import rollout_params_per_gpu
from tuner.space.layout import RolloutDims

INTERNODE_LATENCY_FACTOR = 4.0
"""A collective that crosses nodes costs this many NVLink collective latencies (network round
trips of tens of microseconds)."""
VLLM_MAX_CAPTURE_SIZE = 512
"""Ceiling of vLLM 0.24.0's default CUDA-graph capture sizes on Hopper and older (vllm/config/
vllm.py, VllmConfig._set_cudagraph_sizes: min(max_num_seqs * 2, 512), then at most
max_num_batched_tokens)."""
PIECEWISE_EAGER_KERNELS = 2
"""Kernels per layer a piecewise CUDA graph leaves to eager launches: vLLM splits its compiled
graph at attention (KV-cache write and the attention kernel) and replays the pieces between."""
EAGER_OPS_DENSE_LAYER = 10
"""Kernel-launching host calls of one dense decoder layer in a vLLM 0.24.0 decode step with
`enforce_eager=True`. enforce_eager is more than no CUDA graphs: it sets compilation mode NONE
as well (vllm/config/vllm.py, VllmConfig.__post_init__: "Enforce eager set, disabling
torch.compile and CUDAGraphs"), so nothing is fused by Inductor, custom_ops falls to "all" (the
same file) and the IR ops' priority to the vllm_c CUDA kernels (vllm/platforms/cuda.py,
get_default_ir_op_priority). The layer (vllm/model_executor/models/qwen3.py Qwen3DecoderLayer
and Qwen3Attention, qwen2.py Qwen2MLP; llama's is the same without the q/k norms) then calls,
one kernel each: input RMSNorm (fused with the residual add, torch.ops._C.fused_add_rms_norm via
vllm/kernels/vllm_c.py), QKV GEMM (F.linear, layers/utils.py default_unquantized_gemm), rotary
embedding (torch.ops._C.rotary_embedding, rotary_embedding/base.py forward_cuda), the KV-cache
write and the attention (two torch.ops.vllm custom ops implemented in Python,
layers/attention/attention.py unified_kv_cache_update and unified_attention_with_output:
reshape_and_cache_flash and the FA3 varlen kernel, v1/attention/backends/flash_attn.py), output
GEMM, post-attention RMSNorm, gate/up GEMM, SiLU-and-mul (torch.ops._C.silu_and_mul) and down
GEMM."""
EAGER_OPS_QK_NORM = 2
"""More calls per layer of a model with per-head q/k RMSNorm (Qwen3): torch.ops._C.rms_norm on
q and on k before the rotary embedding (qwen3.py Qwen3Attention.forward); with compilation off
they are not fused with the rope (the fused_qk_norm_rope kernel is a compile pass's)."""
EAGER_OPS_MODEL = 3
"""Calls per eager forward outside the layers: the token ids' cast and the embedding lookup
(layers/vocab_parallel_embedding.py, VocabParallelEmbedding.forward) and the final norm. The
logits GEMM and the sampler run eagerly with CUDA graphs too (decode_step_overhead_s)."""


@dataclass(frozen=True, slots=True)
class Generation:
    """The generation phase of one rollout layout."""

    seconds: float
    concurrency: float
    """Sequences one engine runs at once in its busy phase."""
    kv_tokens: float
    """KV-cache capacity of one engine, tokens."""


@functools.lru_cache(maxsize=64)
def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> tuple[int, ...]:
    """The decode batch sizes vLLM 0.24.0 (what verl 0.9.1 pins) captures CUDA graphs at when
    `cudagraph_capture_sizes` is unset, as verl 0.9.1 leaves it (vllm/config/vllm.py,
    VllmConfig._set_cudagraph_sizes): 1, 2, 4, then multiples of 8 below 256 and multiples of 16
    from 256, up to min(2 * max_num_seqs, 512, max_num_batched_tokens), plus
    max_num_batched_tokens itself when it lies below that ceiling. (The sequence-parallel pass
    that would keep only multiples of the TP size is off by default in 0.24.0: IS_DENSE = False.)"""
    top = min(2 * max_num_seqs, VLLM_MAX_CAPTURE_SIZE, max_num_batched_tokens)
    sizes = {s for s in (1, 2, 4) if s <= top}
    sizes.update(range(8, min(top + 1, 256), 8))
    sizes.update(range(256, top + 1, 16))
    if max_num_batched_tokens <= top:
        sizes.add(max_num_batched_tokens)
    return tuple(sorted(sizes))


def padded_batch(batch: float, sizes: tuple[int, ...]) -> int:
    """The captured size a decode step of `batch` sequences replays: the smallest capture size
    at least as large (vLLM pads the batch to it; vllm/v1/cudagraph_dispatcher.py), or 0 when the
    batch exceeds the largest and the step runs eagerly."""
    i = bisect.bisect_left(sizes, math.ceil(batch - 1e-9))
    return sizes[i] if i < len(sizes) else 0


VLLM_ASYNC_SCHEDULING = True
"""Whether vLLM schedules asynchronously, overlapping a decode step's host work with the GPU's
previous step: vLLM 0.24.0's default in both engines this project runs, so the default of
`estimate(async_scheduling=...)`. SchedulerConfig.async_scheduling defaults to None
(vllm/config/scheduler.py) and VllmConfig.__post_init__ (vllm/config/vllm.py) turns None into
True unless the model pools, a speculative decoder other than EAGLE/MTP/n-gram runs, or the
executor lacks `supports_async_scheduling`. Both executors have it: UniProcExecutor
(v1/executor/uniproc_executor.py; the fast runner's `vllm.LLM` at TP 1, which names no
distributed_executor_backend, so ParallelConfig picks "uni", vllm/config/parallel.py) and
MultiprocExecutor (v1/executor/multiproc_executor.py; "mp", the fast runner's above TP 1 and
verl 0.9.1's: verl/workers/rollout/vllm_rollout/vllm_async_server.py `launch_server`). Neither
runner sets async_scheduling (tuner.runners.vllm_gen.spec EngineCfg.llm_kwargs; verl's
launch_server args). With it VllmConfig.max_concurrent_batches is 2 and EngineCore steps with
step_with_batch_queue (vllm/v1/engine/core.py): it schedules step k+1 and calls execute_model
and sample_tokens without blocking before it waits for step k's output, then updates the
scheduler from step k while the GPU runs step k+1. The model runner feeds the sampled tokens to
the next step on the GPU and copies them to the host on a side stream (the V2 runner, the
default for Qwen3ForCausalLM and LlamaForCausalLM, vllm/config/vllm.py
DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES: v1/worker/gpu/model_runner.py sample_tokens,
v1/worker/gpu/async_utils.py AsyncOutput; the V1 runner: v1/worker/gpu_model_runner.py
AsyncGPUModelRunnerOutput, _prepare_input_ids from prev_sampled_token_ids), so no per-step host
synchronisation sits between two steps' kernels. Without it (EngineCore.step) the engine waits
for each step's output before it schedules the next. vLLM added async scheduling as the opt-in
`--async-scheduling` in June 2025 (vllm-project/vllm#19970) and made it the default with #27614
(opened 2025-10-27); the reference leaderboards ran before that (tuner.fit.validate
REFERENCE_VLLM_ASYNC_SCHEDULING: their rows pass False)."""

EAGER, FULL_GRAPH, PIECEWISE_GRAPH, COMPILED = 0, 1, 2, 3
"""How a vLLM decode step is launched: with `enforce_eager=True` every op of the uncompiled
model from Python (EAGER_OPS_DENSE_LAYER); else one full CUDA graph, piecewise graphs with
attention launched eagerly between them, or the torch.compile'd model with no graph (COMPILED).
verl 0.9.1 asks vLLM for `cudagraph_mode=FULL_AND_PIECEWISE` (verl/workers/rollout/vllm_rollout/
vllm_async_server.py): uniform decode batches replay a full graph, batches that mix in a prefill
chunk replay the piecewise graphs when their tokens fit the largest capture size, and batches
beyond it run the compiled model without a graph (vllm/v1/cudagraph_dispatcher.py,
CudagraphDispatcher.dispatch)."""


def eager_ops(ctx: Context) -> int:
    """Kernel-launching host calls of one decode step's dense forward with `enforce_eager=True`
    (a MoE layer's router and expert calls are priced apart: DECODE_KERNELS_MOE_EXTRA)."""
    per_layer = EAGER_OPS_DENSE_LAYER + (EAGER_OPS_QK_NORM if ctx.model.qk_layernorm else 0)
    return ctx.layers * per_layer + EAGER_OPS_MODEL


def _decode_step_s(
    ctx: Context,
    rollout_tp: int,
    rollout_dp: int,
    rollout_ep: int,
    batch: float,
    context_len: float,
    mode: int = EAGER,
    rows: float = 0.0,
    async_scheduling: bool = VLLM_ASYNC_SCHEDULING,
) -> float:
    """One vLLM decode step of `batch` sequences (per engine) whose mean context is
    `context_len`: the GPU streams weights and KV cache or computes, whichever is longer, then
    the TP all-reduces (over the network when TP spans nodes) and, for a MoE with rollout DP,
    the expert collectives; beside them the host's work (below). At low batch the weight read
    dominates: the long tail's steps cost nearly a full one.

    `mode` says how the step is launched. Eager (`enforce_eager`): the host calls every op of
    the uncompiled model from Python (eager_ops, each eager_op_host_s) and the GPU cannot run
    ahead of it, so at low batch the host bounds the step; compiled with no graph: the host
    launches the compiled model's kernels (DECODE_KERNELS_DENSE_LAYER, each decode_launch_s). A
    CUDA graph replays the captured forward in one launch, at `rows` (the batch padded to the
    capture size): the padding rows cost GEMM FLOPs and collective bytes; attention reads only
    the real sequences' KV cache. Piecewise graphs leave attention to eager launches.

    The host's share of a step is the launches and the engine's work (decode_step_overhead_s,
    decode_seq_overhead_s); the GPU's is the kernels and collectives. With `async_scheduling`
    (VLLM_ASYNC_SCHEDULING) they overlap across steps and a step takes the longer of the two;
    without it the engine's work waits for the step's output and adds to it. The launches and
    the engine's work stay one host chain either way: with UniProcExecutor execute_model, where
    the model runner prepares the inputs and launches the ops, runs on the engine core's thread
    between the scheduler calls (uniproc_executor.py collective_rpc calls the worker directly),
    so an eager step bound by its launches gains nothing from async scheduling. With
    MultiprocExecutor the worker process launches (multiproc_executor.py WorkerProc
    worker_busy_loop) while the engine core process schedules and updates from the output, so
    there the engine core's part of the engine's work hides under the launches too. The engine
    term is one number, not split by process, and the model keeps it whole on the launching
    chain: for a launch-bound step under MultiprocExecutor (verl's, the fast runner's above TP 1)
    an upper bound, by at most the engine core's part."""
    profile = ctx.profile
    rows = max(rows, batch)
    # an untied input embedding is looked up row by row, never streamed (only the output
    # layer's table is read whole); a tied table is counted once, as the output layer. What one
    # GPU holds of the rest: rollout_memory.rollout_params_per_gpu (kv heads replicated above
    # rollout_tp, MoE experts over the replica's tp * dp GPUs)
    streamed = ctx.total_params - (ctx.embed_params if ctx.head_params else 0.0)
    dense_p, expert_p = rollout_params_per_gpu(ctx, rollout_tp, rollout_dp, streamed)
    dense_w, expert_w = dense_p * BF16, expert_p * BF16
    group = rollout_tp * rollout_dp
    if ctx.is_moe:
        touched = 1.0 - (1.0 - ctx.topk / ctx.experts) ** max(batch * rollout_dp, 1.0)
        expert_w *= touched
    kv_heads_local = max(1.0, ctx.kv_heads / rollout_tp)
    kv_token = 2 * ctx.layers * kv_heads_local * ctx.head_dim * BF16
    # the GEMMs (weights streamed or FLOPs, whichever is longer) and the attention kernels
    # (KV cache streamed) are separate kernels that run one after the other: their times add
    rate = ctx.peak * profile.gemm_efficiency
    linear = 2 * rows * (ctx.layers * ctx.layer_active_linear + ctx.head_or_embed())
    gemm = max((dense_w + expert_w) / ctx.hbm, linear / rollout_tp / rate)
    attn_flops = 4 * batch * ctx.layers * ctx.q_dim * context_len
    attn = max(batch * context_len * kv_token / ctx.hbm, attn_flops / rollout_tp / rate)
    launch = 0.0
    if mode == FULL_GRAPH:
        gpu = gemm + attn + profile.decode_graph_replay_s
    else:
        if mode == PIECEWISE_GRAPH:
            launch = ctx.layers * (
                PIECEWISE_EAGER_KERNELS * profile.decode_launch_s + profile.decode_graph_replay_s
            )
        elif mode == EAGER:
            launch = eager_ops(ctx) * profile.eager_op_host_s
            if ctx.is_moe:  # router and experts as before: no eager MoE row measured
                launch += ctx.layers * DECODE_KERNELS_MOE_EXTRA * profile.decode_launch_s
        else:
            kernels = DECODE_KERNELS_DENSE_LAYER + (DECODE_KERNELS_MOE_EXTRA if ctx.is_moe else 0)
            launch = ctx.layers * kernels * profile.decode_launch_s
        gpu = gemm + attn
    comm = 0.0
    lat = profile.collective_latency_s
    if rollout_tp > 1:
        bw = bandwidth_between(ctx, rollout_tp)
        lat_tp = lat * (INTERNODE_LATENCY_FACTOR if rollout_tp > ctx.local_gpus else 1.0)
        per = rows * ctx.hidden * BF16 * 2 * (rollout_tp - 1) / rollout_tp / bw
        comm = 2 * ctx.layers * (lat_tp + per)
    if ctx.is_moe and rollout_dp > 1:
        bw = bandwidth_between(ctx, group)
        lat_g = lat * (INTERNODE_LATENCY_FACTOR if group > ctx.local_gpus else 1.0)
        if rollout_ep > 1:  # all-to-all dispatch and combine of the routed tokens
            vol = 2 * rows * ctx.topk * ctx.hidden * BF16 * (group - 1) / group
        else:  # experts tensor-parallel over tp*dp: gather the dp ranks' tokens, reduce back
            vol = 2 * rows * rollout_dp * ctx.hidden * BF16 * (group - 1) / group
        comm += ctx.layers * (2 * lat_g + vol / bw)
    # the GPU runs each launched kernel as it comes, so it cannot run ahead of the launches
    engine = profile.decode_step_overhead_s + batch * profile.decode_seq_overhead_s
    if async_scheduling:
        return max(gpu + comm, launch + engine)
    return max(gpu, launch) + comm + engine


DRAIN_SEGMENTS = 48
"""Pieces the decode tail is integrated over."""


def _tail_end(n: float, survival: Any, cap: float) -> float:
    """Where n·survival(x) falls to one: the expected end of the longest of n (bisection)."""
    if n * survival(cap * (1 - 1e-9)) >= 1.0:
        return cap
    lo, hi = 0.0, cap
    for _ in range(40):
        mid = (lo + hi) / 2
        if n * survival(mid) >= 1.0:
            lo = mid
        else:
            hi = mid
    return hi


def generation(
    ctx: Context,
    rollout_tp: int,
    rollout_dp: int,
    rollout_ep: int,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    kv_bytes: float,
    eager: bool = False,
    async_scheduling: bool = VLLM_ASYNC_SCHEDULING,
) -> Generation:
    """Seconds the slowest engine needs for its share of the batch, from the response-length
    model (tuner.lengths) and the scheduler's concurrency.

    Each vLLM scheduler (one per rollout-TP group; a DP rank has its own) runs at most
    C = min(its share, max_num_seqs, max_num_batched_tokens, KV capacity / in-flight context)
    sequences. While sequences wait, every finished one is replaced: C run at once. When the
    queue empties the C in flight have residual lengths from the length-biased residual law, so
    the active count decays as C·P(residual > r) and the step ends when the longest response of
    the whole batch ends (where the in-flight count of all engines falls to one): the last
    decode steps run at low occupancy, each costing nearly a full weight read. When the share
    fits at once, all start together and the count decays as share·P(length > t).

    With CUDA graphs (`eager` False) a pure decode step replays the graph of its batch padded to
    the next capture size; in the busy phase the steps that admit a new sequence also prefill its
    prompt, and such a mixed batch runs on piecewise graphs, or the compiled model without a graph
    when its tokens exceed the largest capture size. With `eager` every step runs the uncompiled
    model op by op. Prefill itself is compute-bound and costed by its FLOPs either way.
    `async_scheduling`: whether the engine overlaps each step's host work with the GPU
    (VLLM_ASYNC_SCHEDULING, _decode_step_s)."""
    key = (
        rollout_tp,
        rollout_dp,
        rollout_ep,
        gpu_memory_utilization,
        max_num_batched_tokens,
        max_num_seqs,
        eager,
        async_scheduling,
    )
    hit = ctx.generation_cache.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    lengths = ctx.lengths
    if lengths is None:  # set in Context.__post_init__
        raise RuntimeError("context without a response-length model")
    schedulers = RolloutDims(world=ctx.cluster.num_gpus, tp=rollout_tp, dp=rollout_dp).schedulers
    share = ctx.samples / schedulers
    kv_heads_local = max(1.0, ctx.kv_heads / rollout_tp)
    kv_token = 2 * ctx.layers * kv_heads_local * ctx.head_dim * BF16
    kv_tokens = max(0.0, kv_bytes) / kv_token
    if kv_tokens < ctx.max_seq:
        gen = Generation(math.inf, 0.0, kv_tokens)
        ctx.generation_cache[key] = gen
        return gen
    cap = float(ctx.response_max)
    prompt, mean = ctx.prompt_mean, ctx.response_mean
    res_mean = lengths.mean_residual()
    concurrency = min(
        share, float(max_num_seqs), float(max_num_batched_tokens), kv_tokens / (prompt + res_mean)
    )
    concurrency = max(concurrency, 1.0)
    sizes = () if eager else cudagraph_capture_sizes(max_num_seqs, max_num_batched_tokens)

    def decode(batch: float, context_len: float) -> float:
        """A uniform decode step: the full graph of its padded size (piecewise graphs where the
        padded size exceeds max_num_seqs: vLLM captures full decode graphs only up to it), the
        compiled model beyond the largest capture size, eager with enforce_eager."""
        if not sizes:
            return _decode_step_s(
                ctx,
                rollout_tp,
                rollout_dp,
                rollout_ep,
                batch,
                context_len,
                EAGER,
                async_scheduling=async_scheduling,
            )
        rows = padded_batch(batch, sizes)
        mode = COMPILED if not rows else (FULL_GRAPH if rows <= max_num_seqs else PIECEWISE_GRAPH)
        return _decode_step_s(
            ctx,
            rollout_tp,
            rollout_dp,
            rollout_ep,
            batch,
            context_len,
            mode,
            rows,
            async_scheduling,
        )

    seconds = 0.0
    if share > concurrency:
        # busy phase: C in flight; the tokens left to the drain are C mean residuals
        steps = max(0.0, (share * mean - concurrency * res_mean) / concurrency)
        step = decode(concurrency, prompt + res_mean)
        if sizes:
            # C / mean sequences end per step (a renewal process); the step that admits their
            # successors prefills their prompts too: a mixed batch, on piecewise graphs when its
            # tokens fit the largest capture size, compiled without a graph otherwise
            # (cudagraph_dispatcher.py)
            ended = concurrency / mean
            mixed = 1.0 - math.exp(-ended)
            tokens = concurrency + prompt * ended / mixed
            mode = PIECEWISE_GRAPH if padded_batch(tokens, sizes) else COMPILED
            mixed_step = _decode_step_s(
                ctx,
                rollout_tp,
                rollout_dp,
                rollout_ep,
                concurrency,
                prompt + res_mean,
                mode,
                async_scheduling=async_scheduling,
            )
            step = (1.0 - mixed) * step + mixed * mixed_step
        seconds += steps * step
        survival: Any = lengths.residual_survival
        end = _tail_end(concurrency * schedulers, survival, cap)
        segment = end / DRAIN_SEGMENTS
        for i in range(DRAIN_SEGMENTS):
            r = (i + 0.5) * segment
            active = max(1.0, concurrency * survival(r))
            # survivors r tokens into the drain: their age when the queue emptied is
            # conditioned on reaching r more tokens under the cap
            context_tokens = prompt + min(cap, lengths.mean_age_alive(r) + r)
            seconds += segment * decode(active, context_tokens)
    else:
        survival = lengths.survival
        end = _tail_end(share * schedulers, survival, cap)
        segment = end / DRAIN_SEGMENTS
        for i in range(DRAIN_SEGMENTS):
            t = (i + 0.5) * segment
            active = max(1.0, share * survival(t))
            seconds += segment * decode(active, prompt + t)
    # prefill of the engine's prompts (chunked into the decode steps, compute-bound); vLLM
    # computes logits only at each prompt's last position (the one it samples from)
    profile = ctx.profile
    prefill_flops = share * (
        prompt * (2 * ctx.layers * ctx.layer_active_linear + 2 * ctx.layers * ctx.q_dim * prompt)
        + 2 * ctx.head_or_embed()
    )
    seconds += prefill_flops / rollout_tp / (ctx.peak * profile.gemm_efficiency)
    gen = Generation(seconds, concurrency, kv_tokens)
    ctx.generation_cache[key] = gen
    return gen
