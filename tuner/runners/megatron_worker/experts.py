"""MoE experts as one grouped GEMM per projection (torch grouped_mm), checked against
per-expert matmuls at start; megatron's SequentialMLP where the check fails."""

from __future__ import annotations

from typing import Any

from tuner.runners.megatron_worker.log import cumsum as _cumsum
from tuner.runners.megatron_worker.log import log as _log
from tuner.runners.megatron_worker.result import one_line

GROUP_ALIGN = 16
"""Tokens per expert are padded to a multiple of this inside the grouped GEMM (16-byte aligned
groups for the weight-gradient GEMM, as torchtitan does)."""


def _grouped_mm() -> Any:
    import torch

    return getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def choose_experts() -> tuple[type | None, str]:
    """Our grouped-GEMM experts if PyTorch's grouped_mm computes the right thing here (checked
    forward and backward against per-expert matmuls), else megatron's SequentialMLP."""
    if _grouped_mm() is None:
        return None, "SequentialMLP (no torch grouped_mm)"
    try:
        err = _check_grouped_experts()
    except Exception as e:  # noqa: BLE001 (unsupported here: fall back)
        _log(f"grouped experts unusable: {one_line(e, 300)}")
        return None, "SequentialMLP (grouped_mm failed its check)"
    if err > 2e-2:
        _log(f"grouped experts wrong: relative error {err:.3g}")
        return None, "SequentialMLP (grouped_mm failed its check)"
    return _grouped_experts_class(), "grouped_mm experts"


def _grouped_expert_forward(x: Any, counts: list[int], fc1: Any, fc2: Any, probs: Any) -> Any:
    """SwiGLU experts over tokens grouped by expert: x [T, h], fc1 [E, 2f, h], fc2 [E, h, f],
    probs [T] (applied after the activation, as megatron's MLP does)."""
    import torch
    import torch.nn.functional as F

    gmm = _grouped_mm()
    t = x.shape[0]
    if t == 0:
        return x.new_zeros(0, fc2.shape[1]) + 0.0 * (fc1.sum() + fc2.sum()).to(x.dtype)
    padded = [c + (-c) % GROUP_ALIGN for c in counts]
    idx = None
    if padded != counts:
        src = dst = 0
        shifts = []
        for c, p in zip(counts, padded, strict=True):
            shifts.append(dst - src)
            src += c
            dst += p
        shift = torch.tensor(shifts, device=x.device)
        reps = torch.tensor(counts, device=x.device)
        idx = torch.arange(t, device=x.device) + torch.repeat_interleave(shift, reps, output_size=t)
        x = x.new_zeros(dst, x.shape[1]).index_copy(0, idx, x)
        probs = probs.new_zeros(dst).index_copy(0, idx, probs)
    offs = torch.tensor(_cumsum(padded), dtype=torch.int32, device=x.device)
    h1 = gmm(x, fc1.transpose(1, 2), offs=offs)
    gate, up = torch.chunk(h1, 2, dim=-1)
    act = (F.silu(gate) * up * probs.unsqueeze(-1)).to(x.dtype)
    out = gmm(act, fc2.transpose(1, 2), offs=offs)
    return out if idx is None else out.index_select(0, idx)


def _check_grouped_experts() -> float:
    import torch
    import torch.nn.functional as F

    g = torch.Generator(device="cuda")
    g.manual_seed(4321)
    counts, h, f = [0, 5, 37, 16, 1], 128, 96
    e, t = len(counts), sum(counts)

    def rnd(*shape: int) -> Any:
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.bfloat16)

    x, w1, w2 = rnd(t, h), rnd(e, 2 * f, h) * 0.1, rnd(e, h, f) * 0.1
    probs = torch.rand(t, generator=g, device="cuda")
    dout = rnd(t, h)
    leaves = [a.clone().requires_grad_() for a in (x, w1, w2)]
    out = _grouped_expert_forward(leaves[0], counts, leaves[1], leaves[2], probs)
    out.backward(dout)
    got = [out.detach(), *(a.grad for a in leaves)]
    ref_leaves = [a.double().requires_grad_() for a in (x, w1, w2)]
    outs, start = [], 0
    for i, c in enumerate(counts):
        xs = ref_leaves[0][start : start + c]
        gate, up = torch.chunk(xs @ ref_leaves[1][i].T, 2, dim=-1)
        outs.append(
            (F.silu(gate) * up * probs[start : start + c, None].double()) @ ref_leaves[2][i].T
        )
        start += c
    ref = torch.cat(outs)
    ref.backward(dout.double())
    refs = [ref.detach(), *(a.grad for a in ref_leaves)]
    return max(
        float((a.double() - b).norm() / b.norm().clamp_min(1e-12))
        for a, b in zip(got, refs, strict=True)
    )


def _grouped_experts_class() -> type:
    """megatron experts module (SequentialMLP's interface) running all local experts in one
    grouped GEMM per projection; weights sharded over expert-tensor-parallel ranks like
    megatron's column/row parallel expert linears, with the same parallel attributes."""
    import torch
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
    from megatron.core.transformer.module import MegatronModule

    class GroupedMMExperts(MegatronModule):
        def __init__(
            self,
            num_local_experts: int,
            config: Any,
            submodules: Any = None,
            pg_collection: Any = None,
            name: str | None = None,
            **_: Any,
        ) -> None:
            super().__init__(config=config)
            etp = pg_collection.expt_tp.size() if pg_collection is not None else 1
            f = config.moe_ffn_hidden_size // etp
            h = config.hidden_size
            dev = torch.cuda.current_device()
            kw = {"device": dev, "dtype": config.params_dtype}
            self.num_local_experts = num_local_experts
            self.fc1 = torch.nn.Parameter(torch.empty(num_local_experts, 2 * f, h, **kw))
            self.fc2 = torch.nn.Parameter(torch.empty(num_local_experts, h, f, **kw))
            use_expert_pgs = config.expert_model_parallel_size > 1 or (
                config.expert_tensor_parallel_size != config.tensor_model_parallel_size
            )
            for p, dim in ((self.fc1, 1), (self.fc2, 2)):
                torch.nn.init.normal_(p, mean=0.0, std=config.init_method_std)
                set_tensor_model_parallel_attributes(p, is_parallel=True, dim=dim, stride=1)
                setattr(p, "allreduce", not use_expert_pgs)  # noqa: B010 (megatron's marker)

        def forward(
            self, permuted_local_hidden_states: Any, tokens_per_expert: Any, permuted_probs: Any
        ) -> Any:
            counts = [int(c) for c in tokens_per_expert.tolist()]
            out = _grouped_expert_forward(
                permuted_local_hidden_states, counts, self.fc1, self.fc2, permuted_probs
            )
            return out, None

        def backward_dw(self) -> None:
            pass

    return GroupedMMExperts
