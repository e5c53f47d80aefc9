"""Core attention on flash kernels: a megatron core-attention module for packed (THD) micro-batches.

The fastest varlen path that computes the right thing here is picked at start: PyTorch's
varlen_attn, or the aten flash ops, with native grouped-query heads or expanded ones, each checked
forward and backward against a float64 reference on random data (never the unfused softmax
path, which builds the whole score matrix)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.runners.megatron_worker.log import cumsum as _cumsum
from tuner.runners.megatron_worker.log import log as _log
from tuner.runners.megatron_worker.result import one_line


@dataclass(frozen=True, slots=True)
class _AttnImpl:
    name: str
    varlen: Any
    """fn(q, k, v, cu, max_len, scale) -> out for packed [t, heads, d] tensors."""
    expand_gqa: bool


def choose_attention() -> _AttnImpl:
    """Pick the fastest varlen flash path that computes the right thing here: PyTorch's
    varlen_attn, or the aten flash ops, with native grouped-query heads or expanded ones,
    checked forward and backward against per-sequence SDPA on random data."""
    candidates = []
    fn = _torch_varlen_attn()
    if fn is not None:
        candidates += [("varlen_attn", fn, False), ("varlen_attn", fn, True)]
    candidates += [
        ("aten_flash_varlen", _aten_flash_varlen, False),
        ("aten_flash_varlen", _aten_flash_varlen, True),
    ]
    errors = []
    for name, f, expand in candidates:
        impl = _AttnImpl(f"{name}{' (gqa expanded)' if expand else ''}", f, expand)
        try:
            err = _check_attention(impl)
        except Exception as e:  # noqa: BLE001 (each candidate may be unsupported)
            errors.append(f"{impl.name}: {one_line(e, 200)}")
            continue
        if err < 2e-2:
            return impl
        errors.append(f"{impl.name}: relative error {err:.3g}")
    _log("no varlen flash attention passed: " + "; ".join(errors))
    return _AttnImpl("sdpa per sequence", None, False)


def _torch_varlen_attn() -> Any:
    import inspect

    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception:
        return None
    params = inspect.signature(varlen_attn).parameters

    def call(q: Any, k: Any, v: Any, cu: Any, max_len: int, scale: float) -> Any:
        kw: dict[str, Any] = {"scale": scale}
        if "is_causal" in params:
            kw["is_causal"] = True
        else:
            kw["window_size"] = (-1, 0)
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)

    return call


def _aten_flash_varlen(q: Any, k: Any, v: Any, cu: Any, max_len: int, scale: float) -> Any:
    return _AtenFlash.apply(q, k, v, cu, max_len, scale)


def _make_aten_flash() -> Any:
    import torch

    class AtenFlash(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, cu: Any, max_len: int, scale: float) -> Any:
            out, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(
                q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale
            )
            ctx.save_for_backward(q, k, v, out, lse, cu, seed, offset)
            ctx.max_len, ctx.scale = max_len, scale
            return out

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:
            q, k, v, out, lse, cu, seed, offset = ctx.saved_tensors
            dq, dk, dv = torch.ops.aten._flash_attention_backward(
                dout.contiguous(),
                q,
                k,
                v,
                out,
                lse,
                cu,
                cu,
                ctx.max_len,
                ctx.max_len,
                0.0,
                True,
                seed,
                offset,
                scale=ctx.scale,
            )
            return dq, dk, dv, None, None, None

    return AtenFlash


class _LazyAtenFlash:
    fn: Any = None

    def apply(self, *args: Any) -> Any:
        if self.fn is None:
            self.fn = _make_aten_flash()
        return self.fn.apply(*args)


_AtenFlash = _LazyAtenFlash()


def _sdpa_per_sequence(q: Any, k: Any, v: Any, cu_list: list[int], scale: float) -> Any:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    outs = []
    rep = q.shape[1] // k.shape[1]
    with sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    ):
        for a, b in zip(cu_list[:-1], cu_list[1:], strict=True):
            qs = q[a:b].transpose(0, 1).unsqueeze(0)
            ks = k[a:b].transpose(0, 1).unsqueeze(0)
            vs = v[a:b].transpose(0, 1).unsqueeze(0)
            if rep > 1:
                ks = ks.repeat_interleave(rep, dim=1)
                vs = vs.repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
            outs.append(o.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)


def _check_attention(impl: _AttnImpl) -> float:
    import torch

    g = torch.Generator(device="cuda")
    g.manual_seed(1234)
    lens = [37, 128, 5, 300]
    t, hq, hk, d = sum(lens), 8, 2, 128
    cu_list = [0, *_cumsum(lens)]
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    q, k, v = (
        torch.randn(t, h, d, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()
        for h in (hq, hk, hk)
    )
    dout = torch.randn(t, hq, d, generator=g, device="cuda", dtype=torch.bfloat16)
    scale = d**-0.5
    out = _run_varlen(impl, q, k, v, cu, cu_list, max(lens), scale)
    out.backward(dout)
    got: list[Any] = [out.detach().float(), *(x.grad.float() for x in (q, k, v))]  # type: ignore[union-attr]
    qr, kr, vr = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref_out = []
    for a, b in zip(cu_list[:-1], cu_list[1:], strict=True):
        qs, ks, vs = (
            qr[a:b],
            kr[a:b].repeat_interleave(hq // hk, 1),
            vr[a:b].repeat_interleave(hq // hk, 1),
        )
        s = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        mask = torch.ones(b - a, b - a, device="cuda", dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
        ref_out.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), vs))
    ref = torch.cat(ref_out)
    ref.backward(dout.double())
    refs: list[Any] = [ref.detach(), qr.grad, kr.grad, vr.grad]
    return max(float((a.double() - b).norm() / b.norm()) for a, b in zip(got, refs, strict=True))


def _run_varlen(
    impl: _AttnImpl,
    q: Any,
    k: Any,
    v: Any,
    cu: Any,
    cu_list: list[int] | None,
    max_len: int,
    scale: float,
) -> Any:
    if impl.varlen is None:
        if cu_list is None:
            cu_list = cu.tolist()
        return _sdpa_per_sequence(q, k, v, cu_list, scale)
    if impl.expand_gqa and k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return impl.varlen(q, k, v, cu, max_len, scale)


def core_attention_class(impl: _AttnImpl) -> type:
    """A megatron core-attention module on flash kernels (replaces the local spec's unfused
    DotProductAttention). Packed (THD) input: [t, heads, d]; padded input: [s, b, heads, d]."""
    import math as _math

    import torch.nn.functional as F
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.utils import divide

    class FlashCoreAttention(MegatronModule):
        def __init__(
            self,
            config: Any,
            layer_number: int,
            attn_mask_type: Any,
            attention_type: str = "self",
            attention_dropout: Any = None,
            softmax_scale: Any = None,
            cp_comm_type: Any = None,
            pg_collection: Any = None,
            **_: Any,
        ) -> None:
            super().__init__(config=config)
            if config.context_parallel_size != 1:
                raise ValueError("the flash core attention does not do context parallelism")
            tp = config.tensor_model_parallel_size
            self.heads = divide(config.num_attention_heads, tp)
            self.groups = divide(config.num_query_groups, tp)
            self.head_dim = config.kv_channels
            self.scale = softmax_scale or 1.0 / _math.sqrt(self.head_dim)

        def forward(
            self,
            query: Any,
            key: Any,
            value: Any,
            attention_mask: Any,
            attn_mask_type: Any = None,
            attention_bias: Any = None,
            packed_seq_params: Any = None,
            **_: Any,
        ) -> Any:
            if attention_bias is not None:
                raise ValueError("attention bias is not supported")
            if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
                psp = packed_seq_params
                out = _run_varlen(
                    impl,
                    query,
                    key,
                    value,
                    psp.cu_seqlens_q,
                    None,
                    int(psp.max_seqlen_q),
                    self.scale,
                )
                return out.reshape(out.shape[0], -1)
            # [s, b, h, d] -> [b, h, s, d], causal, GQA in the kernel.
            q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(
                [
                    SDPBackend.FLASH_ATTENTION,
                    SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION,
                ]
            ):
                o = F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, scale=self.scale, enable_gqa=self.heads != self.groups
                )
            s, b = query.shape[0], query.shape[1]
            return o.permute(2, 0, 1, 3).reshape(s, b, -1)

    return FlashCoreAttention
