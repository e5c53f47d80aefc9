"""Log-probs (and entropy) of the labels at the last pipeline stage, the two ways verl computes
them, chosen by the candidate's `use_fused_kernels`:

- full logits (use_fused_kernels=False): the output layer makes the [tokens, vocab/tp] logits,
  log p(label) is megatron's vocab-parallel cross-entropy negated
  (verl/utils/megatron/tensor_parallel.py `vocab_parallel_log_probs_from_logits`), and the
  entropy, where verl computes it (old_log_prob; the update only with an entropy coefficient,
  0 by default), is verl's `_VocabParallelEntropy` (it keeps the softmax for the backward);
- fused (use_fused_kernels=True): verl patches GPTModel's forward to stop at the final hidden
  states and calls `linear_cross_entropy` (verl/utils/kernel/, a Triton kernel), which returns
  log-probs and entropy of the output projection without materialising the logits. Here the same
  computation runs in token chunks of `FUSED_CHUNK_TOKENS` in PyTorch (a vocab-parallel
  autograd function that recomputes each chunk's logits in the backward): the memory profile of
  the fused path (no full logits) with PyTorch's matmuls, not verl's Triton kernel.

The loss is verl's shape of it: -mean(log p) over the micro-batch's tokens (the policy loss is a
function of the log-probs; its extra elementwise work is negligible)."""

from __future__ import annotations

import types
from functools import partial
from typing import Any

FUSED_CHUNK_TOKENS = 2048
"""Tokens per chunk of the fused path (logits of one chunk: chunk x vocab/tp fp32)."""


def _tp_group() -> Any:
    from megatron.core import parallel_state as mpu

    return mpu.get_tensor_model_parallel_group()


def vocab_parallel_entropy(logits: Any) -> Any:
    """verl's _VocabParallelEntropy (tensor_parallel.py), with a matmul for sum(p*z)."""
    return _entropy_fn().apply(logits)


_ENTROPY: Any = None


def _entropy_fn() -> Any:
    global _ENTROPY
    if _ENTROPY is not None:
        return _ENTROPY
    import torch
    import torch.distributed as dist

    class Entropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, z: Any) -> Any:
            g = _tp_group()
            zmax = z.max(dim=-1, keepdim=True).values
            dist.all_reduce(zmax, op=dist.ReduceOp.MAX, group=g)
            p = (z - zmax).exp_()
            s = p.sum(dim=-1, keepdim=True)
            dist.all_reduce(s, group=g)
            p.div_(s)
            spz = (p.unsqueeze(-2) @ z.unsqueeze(-1).to(p.dtype)).squeeze(-1)
            dist.all_reduce(spz, group=g)
            ctx.save_for_backward(z, p, spz)
            return (zmax + s.log() - spz).squeeze(-1)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            z, p, spz = ctx.saved_tensors
            return -(p * (z - spz) * grad.unsqueeze(-1)).to(z.dtype)

    _ENTROPY = Entropy
    return Entropy


_FUSED: Any = None


def _fused_fn() -> Any:
    """Chunked vocab-parallel linear + log-prob + entropy: hidden [t, h], weight [V/tp, h],
    labels [t] -> (log p(label) [t], entropy [t]); hidden's gradient is this rank's part
    (the caller all-reduces it over tp, as megatron's column-parallel output layer does)."""
    global _FUSED
    if _FUSED is not None:
        return _FUSED
    import torch
    import torch.distributed as dist

    def chunk_stats(h: Any, w: Any, lab: Any, lo: int) -> tuple[Any, ...]:
        g = _tp_group()
        z = (h @ w.t()).float()
        zmax = z.max(dim=-1, keepdim=True).values
        dist.all_reduce(zmax, op=dist.ReduceOp.MAX, group=g)
        e = (z - zmax).exp()
        s = e.sum(dim=-1, keepdim=True)
        dist.all_reduce(s, group=g)
        spz = (e.unsqueeze(-2) @ z.unsqueeze(-1)).squeeze(-1) / s
        dist.all_reduce(spz, group=g)
        local = lab - lo
        ok = (local >= 0) & (local < z.shape[-1])
        zl = z.gather(-1, local.clamp(0, z.shape[-1] - 1).unsqueeze(-1)) * ok.unsqueeze(-1)
        dist.all_reduce(zl, group=g)
        lse = zmax + s.log()
        return z, e / s, lse, spz, zl, local, ok

    class LinearLogProbEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, hidden: Any, weight: Any, labels: Any) -> Any:
            from megatron.core import parallel_state as mpu

            lo = mpu.get_tensor_model_parallel_rank() * weight.shape[0]
            lps, ents = [], []
            for a in range(0, hidden.shape[0], FUSED_CHUNK_TOKENS):
                b = a + FUSED_CHUNK_TOKENS
                _, _, lse, spz, zl, _, _ = chunk_stats(hidden[a:b], weight, labels[a:b], lo)
                lps.append((zl - lse).squeeze(-1))
                ents.append((lse - spz).squeeze(-1))
            ctx.save_for_backward(hidden, weight, labels)
            ctx.lo = lo
            return torch.cat(lps), torch.cat(ents)

        @staticmethod
        def backward(ctx: Any, g_lp: Any, g_ent: Any) -> Any:
            hidden, weight, labels = ctx.saved_tensors
            dh = torch.empty_like(hidden)
            dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            for a in range(0, hidden.shape[0], FUSED_CHUNK_TOKENS):
                b = a + FUSED_CHUNK_TOKENS
                h = hidden[a:b]
                z, p, _, spz, _, local, ok = chunk_stats(h, weight, labels[a:b], ctx.lo)
                # d logp/dz = onehot - p ; d H/dz = -p (z - sum p z)
                gz = -p * (g_lp[a:b].unsqueeze(-1) + g_ent[a:b].unsqueeze(-1) * (z - spz))
                rows = torch.arange(h.shape[0], device=h.device)[ok]
                gz[rows, local[ok]] += g_lp[a:b][ok]
                gz = gz.to(hidden.dtype)
                dh[a:b] = gz @ weight
                dw += (gz.t() @ h).float()
            return dh, dw.to(weight.dtype), None

    _FUSED = LinearLogProbEntropy
    return LinearLogProbEntropy


def _fused_forward(
    model: Any,
    input_ids: Any,
    position_ids: Any,
    attention_mask: Any,
    labels: Any = None,
    packed_seq_params: Any = None,
    **_: Any,
) -> Any:
    """GPTModel.forward as verl's `_fused_GPTModel_forward` does it: preprocess, decoder, then
    (last stage) log-probs and entropy from the final hidden states."""
    from megatron.core import tensor_parallel

    pre = model._preprocess(
        input_ids=input_ids,
        position_ids=position_ids,
        decoder_input=None,
        inference_context=None,
        packed_seq_params=packed_seq_params,
    )
    decoder_input, rotary_pos_emb, rotary_pos_cos, rotary_pos_sin, seq_offset = pre[:5]
    hidden = model.decoder(
        hidden_states=decoder_input,
        attention_mask=attention_mask,
        inference_context=None,
        rotary_pos_emb=rotary_pos_emb,
        rotary_pos_cos=rotary_pos_cos,
        rotary_pos_sin=rotary_pos_sin,
        packed_seq_params=packed_seq_params,
        sequence_len_offset=seq_offset,
    )
    if not model.post_process:
        return hidden
    if model.share_embeddings_and_output_weights:
        weight = model.shared_embedding_or_output_weight()
    else:
        weight = model.output_layer.weight
    if model.config.sequence_parallel:  # the te layers only; as verl's fused forward gathers
        h = tensor_parallel.gather_from_sequence_parallel_region(hidden).squeeze(1)  # [t, h]
    else:
        h = tensor_parallel.copy_to_tensor_model_parallel_region(hidden.squeeze(1))  # [t, h]
    lp, ent = _fused_fn().apply(h, weight, labels.reshape(-1))
    return lp.unsqueeze(0), ent.unsqueeze(0)


def patch_fused(chunks: list[Any]) -> None:
    """Route each chunk's GPTModel forward through the fused path."""
    from tuner.runners.megatron_worker.model import gpt_of

    for c in chunks:
        gpt = gpt_of(c)
        gpt.forward = types.MethodType(_fused_forward, gpt)


def forward_step(fused: bool, with_entropy: bool, data_iterator: Any, model: Any) -> Any:
    """megatron's forward_step_func: one packed micro-batch."""
    mb = next(data_iterator)
    meter = mb.get("meter")
    if meter is not None:
        meter.sample()
    if fused:
        out = model(mb["ids"], mb["pos"], None, labels=mb["labels"], packed_seq_params=mb["psp"])
    else:
        out = model(mb["ids"], mb["pos"], None, packed_seq_params=mb["psp"])
    return out, partial(_loss, fused, with_entropy, mb)


def _loss(fused: bool, with_entropy: bool, mb: dict[str, Any], output: Any) -> Any:
    from megatron.core import tensor_parallel

    if fused:
        logp, ent = output
    else:
        # output: logits [1, t, V/tp] (fp32 after Float16Module)
        logp = -tensor_parallel.vocab_parallel_cross_entropy(output, mb["labels"])
        ent = vocab_parallel_entropy(output) if with_entropy else None
    loss = -logp.sum() / mb["tokens"]
    stats = {"loss": loss.detach()}
    if ent is not None:
        stats["entropy"] = ent.detach().mean()
    meter = mb.get("meter")
    if meter is not None:
        meter.sample()
    return loss, stats
