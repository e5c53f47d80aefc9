"""The model of one trial: megatron's TransformerConfig from the spec, the layers (the local GPT
layer spec with our flash core attention and grouped-GEMM experts, or transformer-engine's as
verl builds them: `layer_spec` te), the chunks of this pipeline rank, megatron's DDP and
distributed optimizer as verl sets them up, and the teardown that lets the next trial of a pool
build another model in the same processes."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from functools import partial
from typing import Any

from tuner.runners.megatron_worker.pipeline import p2p_settings
from tuner.runners.megatron_worker.spec import WorkerSpec

CONFIG_MOE_GROUPED_GEMM = False
"""TransformerConfig.moe_grouped_gemm as the worker builds it, whatever the candidate's
moe_grouped_gemm says: the local spec's experts are SequentialMLP, which our grouped-GEMM experts
(experts.py) replace, so megatron-core's flag stays off (its GroupedMLP needs grouped_gemm / TE).
megatron-core refuses what needs the flag on (recompute module moe_act: megatron_refusals).
The transformer-engine layers (layer_spec te) take the candidate's instead (te_kernel_kwargs)."""


def config_kwargs(spec: WorkerSpec) -> dict[str, Any]:
    """TransformerConfig arguments for the spec that need no torch (the refusal check on the GPU
    host builds TransformerConfig from these for every layout of a space)."""
    m, lay, r = spec.model, spec.layout, spec.recompute
    kw: dict[str, Any] = {}
    if r.granularity == "selective":
        kw.update(recompute_granularity="selective", recompute_modules=list(r.modules))
    elif r.granularity == "full":
        kw.update(
            recompute_granularity="full",
            recompute_method=r.method,
            recompute_num_layers=r.num_layers,
        )
    if m.is_moe:
        kw.update(
            num_moe_experts=m.num_experts,
            moe_router_topk=m.moe_topk,
            moe_ffn_hidden_size=m.moe_ffn_hidden_size,
            moe_shared_expert_intermediate_size=m.shared_expert_ffn_hidden_size or None,
            moe_shared_expert_gate=m.shared_expert_gate,
            moe_grouped_gemm=CONFIG_MOE_GROUPED_GEMM,
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-3,
            moe_router_dtype="fp32",
            moe_permute_fusion=False,
        )
    if lay.first_stage_layers:
        kw["num_layers_in_first_pipeline_stage"] = lay.first_stage_layers
    if lay.last_stage_layers:
        kw["num_layers_in_last_pipeline_stage"] = lay.last_stage_layers
    return dict(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size if m.ffn_hidden_size > 0 else m.moe_ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_kv_heads,
        kv_channels=m.head_dim,
        add_bias_linear=False,
        add_qkv_bias=m.qkv_bias,
        gated_linear_unit=True,
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,
        qk_layernorm=m.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=True,
        tensor_model_parallel_size=lay.tp,
        pipeline_model_parallel_size=lay.pp,
        virtual_pipeline_model_parallel_size=lay.vpp if lay.vpp > 1 else None,
        context_parallel_size=lay.cp,
        expert_model_parallel_size=lay.ep,
        expert_tensor_parallel_size=lay.etp,
        sequence_parallel=spec.sequence_parallel,
        **p2p_settings(lay.pp, lay.vpp),
        # megatron refuses variable lengths with the default allgather dispatcher, MoE or not.
        moe_token_dispatcher_type="alltoall",
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        cross_entropy_loss_fusion=False,
        deallocate_pipeline_outputs=True,
        init_method_std=0.02,
        **kw,
    ) | te_kernel_kwargs(spec)


def te_kernel_kwargs(spec: WorkerSpec) -> dict[str, Any]:
    """The candidate's kernel choices over config_kwargs' local set, for the transformer-engine
    layers only (the local layers keep theirs): fused RoPE (TE's fused_apply_rotary_pos_emb_thd,
    megatron/core/models/common/embeddings/rope_utils.py), the SwiGLU fusion (mlp.py and
    TEGroupedMLP, moe/experts.py), the attention backend (TEDotProductAttention's kernel:
    LanguageModule._set_attention_backend sets NVTE_*_ATTN from it; AttnBackend's name here,
    transformer_config converts it) and, on a MoE, TEGroupedMLP or SequentialMLP
    (moe_grouped_gemm) and TE's fused permute (moe_permute_fusion, moe/moe_utils.py)."""
    if spec.layer_spec != "te":
        return {}
    kw = dataclasses.asdict(spec.kernels)  # TransformerConfig's names (spec.KernelCfg)
    # megatron-core's MoE arguments (moe_*) only on a MoE, as the local layers leave them
    return {k: v for k, v in kw.items() if spec.model.is_moe or not k.startswith("moe_")}


def transformer_config(spec: WorkerSpec, **overrides: Any) -> Any:
    """megatron's TransformerConfig for the spec (local layers: no fused kernels that need
    transformer-engine or apex; te layers: the candidate's kernels, te_kernel_kwargs)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    kw = {
        **config_kwargs(spec),
        "activation_func": F.silu,
        "params_dtype": torch.bfloat16,
        "pipeline_dtype": torch.bfloat16,
        **overrides,
    }
    if isinstance(kw.get("attention_backend"), str):
        kw["attention_backend"] = AttnBackend[kw["attention_backend"]]
    return TransformerConfig(**kw)


def layer_spec(spec: WorkerSpec, core_attention: type, experts: type | None = None) -> Any:
    """megatron-core's local GPT layer spec with our flash core attention and, for MoE, our
    grouped-GEMM experts in place of SequentialMLP when `experts` is given."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    m = spec.model
    ls = get_gpt_layer_local_spec(
        num_experts=m.num_experts or None,
        moe_grouped_gemm=CONFIG_MOE_GROUPED_GEMM,
        qk_layernorm=m.qk_layernorm,
        normalization="RMSNorm",
    )
    ls.submodules.self_attention.submodules.core_attention = core_attention
    if m.is_moe and experts is not None:
        moe = ls.submodules.mlp  # partial(MoELayer, submodules=MoESubmodules(...))
        subs = dataclasses.replace(moe.keywords["submodules"], experts=experts)
        ls.submodules.mlp = partial(moe.func, *moe.args, **{**moe.keywords, "submodules": subs})
    return ls


def te_block_spec(config: Any, vp_stage: int | None) -> Any:
    """The transformer-engine layers of one model chunk, as verl builds its actor: mbridge
    0.15.1 (core/llm_bridge.py `_get_transformer_layer_spec`, the Qwen2/Qwen3 dense and MoE
    bridges' path) and verl 0.9.1's own initializer (models/mcore/model_initializer.py) call
    `get_gpt_decoder_block_spec(config, use_transformer_engine=True, vp_stage=vp_stage)`, which
    builds `get_gpt_layer_with_transformer_engine_spec(num_experts, moe_grouped_gemm,
    qk_layernorm, ...)` from the config (megatron/core/models/gpt/gpt_layer_specs.py) and keeps
    this chunk's layers: TELayerNormColumnParallelLinear, TEDotProductAttention (packed THD
    micro-batches through PackedSeqParams, context parallel in TE), TENorm for the q/k norms,
    TEGroupedMLP or SequentialMLP of TE linears for the experts."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    return get_gpt_decoder_block_spec(config, use_transformer_engine=True, vp_stage=vp_stage)


TE_ATTENTION_ENV = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")
"""What megatron-core's LanguageModule._set_attention_backend sets from attention_backend; it
refuses a value set before that differs (a pool's earlier trial), so each build starts clean."""


def reset_te_attention() -> None:
    """Let this trial's attention_backend decide TE's kernel: clear what an earlier trial of the
    pool set, and have TE select its backend again at the next forward (its choice is cached by
    the attention's shapes, not by the environment: dot_product_attention.py
    `_attention_backends`)."""
    for k in TE_ATTENTION_ENV:
        os.environ.pop(k, None)
    with contextlib.suppress(ImportError, AttributeError, KeyError, TypeError):
        from transformer_engine.pytorch.attention.dot_product_attention import (
            dot_product_attention as dpa,
        )

        dpa._attention_backends["backend_selection_requires_update"] = True


def build_chunks(
    spec: WorkerSpec, config: Any, lspec_of: Callable[[int | None], Any]
) -> tuple[list[Any], int]:
    """This rank's GPTModel chunks (one per virtual stage) and the padded vocabulary;
    `lspec_of(vp_stage)` is the chunk's layer spec (a ModuleSpec is callable itself, so the
    spec comes through a function, never a callable() test)."""
    from megatron.core import parallel_state as mpu
    from megatron.core.models.gpt import GPTModel

    m, lay = spec.model, spec.layout
    padded_vocab = -(-m.vocab_size // lay.tp) * lay.tp
    max_len = max(spec.batch.sequence_lengths)

    def build_chunk(vp_stage: int | None) -> Any:
        kwargs = {} if vp_stage is None else {"ignore_virtual": False, "vp_stage": vp_stage}
        return GPTModel(
            config=config,
            transformer_layer_spec=lspec_of(vp_stage),
            vocab_size=padded_vocab,
            max_sequence_length=max_len,
            pre_process=mpu.is_pipeline_first_stage(**kwargs),
            post_process=mpu.is_pipeline_last_stage(**kwargs),
            share_embeddings_and_output_weights=m.tie_word_embeddings,
            position_embedding_type="rope",
            rotary_base=1_000_000,
            vp_stage=vp_stage,
        )

    if lay.vpp > 1:
        return [build_chunk(i) for i in range(lay.vpp)], padded_vocab
    return [build_chunk(None)], padded_vocab


def build(spec: WorkerSpec, core_attention: type | None, experts: type | None) -> Any:
    """(DDP chunks, optimizer, config, padded vocab) as verl builds its actor; the local layers
    take our core attention and experts, the te layers neither."""
    import torch
    from megatron.core import tensor_parallel
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module

    config = transformer_config(spec)
    if spec.layer_spec == "te":
        reset_te_attention()
        chunks, padded_vocab = build_chunks(spec, config, partial(te_block_spec, config))
    else:
        assert core_attention is not None
        local = layer_spec(spec, core_attention, experts)
        chunks, padded_vocab = build_chunks(spec, config, lambda _vp_stage: local)
    for c in chunks:
        for p in c.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(p)
        c.cuda(torch.cuda.current_device())
    chunks = [Float16Module(config, c) for c in chunks]
    # verl's DDP settings (verl/utils/megatron_utils.py): fp32 grad reduce, no overlap.
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=True, grad_reduce_in_fp32=True, overlap_grad_reduce=False
    )
    model = [
        DistributedDataParallel(
            config=config, ddp_config=ddp_config, module=c, disable_bucketing=(i > 0)
        )
        for i, c in enumerate(chunks)
    ]
    for c in model:
        c.broadcast_params()
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=1e-6,
        weight_decay=0.01,
        clip_grad=1.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=True,
    )
    optimizer = get_megatron_optimizer(opt_config, model)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = [c.no_sync for c in model] if len(model) > 1 else model[0].no_sync
    config.grad_scale_func = optimizer.scale_loss
    return model, optimizer, config, padded_vocab


def gpt_of(chunk: Any) -> Any:
    """The GPTModel inside DDP(Float16Module(GPTModel))."""
    m = chunk
    while not hasattr(m, "decoder") and hasattr(m, "module"):
        m = m.module
    return m


def init_parallel(spec: WorkerSpec) -> None:
    """megatron's process groups and RNG trackers for this trial's layout."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel

    lay = spec.layout
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=lay.tp,
        pipeline_model_parallel_size=lay.pp,
        virtual_pipeline_model_parallel_size=lay.vpp if lay.vpp > 1 else None,
        context_parallel_size=lay.cp,
        expert_model_parallel_size=lay.ep,
        expert_tensor_parallel_size=lay.etp,
    )
    tensor_parallel.model_parallel_cuda_manual_seed(spec.seed, force_reset_rng=True)
    torch.manual_seed(spec.seed + dist.get_rank())


def teardown_parallel() -> None:
    """Destroy the process groups megatron made (it only forgets them) and its globals, so the
    next trial starts clean in the same processes."""
    import contextlib

    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    groups: dict[int, Any] = {}

    def collect(v: Any) -> None:
        if isinstance(v, dist.ProcessGroup) and v is not dist.group.WORLD:
            groups[id(v)] = v
        elif isinstance(v, (list, tuple)):
            for x in v:
                collect(x)
        elif isinstance(v, dict):
            for x in v.values():
                collect(x)

    for name, v in list(vars(mpu).items()):
        if name.startswith("_") and name.isupper() or name.startswith("_") and "GROUP" in name:
            collect(v)
    mpu.destroy_model_parallel()
    for g in groups.values():
        with contextlib.suppress(Exception):
            dist.destroy_process_group(g)
