"""How megatron-core's pipeline exchanges activations of variable-length micro-batches, as a
pure model, and the p2p settings the worker (and verl) use so that it works.

With `variable_seq_lengths=True` every p2p call first exchanges the shapes of what it sends
(`P2PCommunicator._communicate_shapes`, megatron/core/pipeline_parallel/p2p_communication.py,
megatron-core 0.19.2): one `batch_isend_irecv` over the pipeline group holding, in this order,
send-prev, recv-prev, send-next, recv-next. Messages between one pair of ranks are matched in
the order they were posted. With pp = 2 the previous and the next rank are the same rank, so a
call that sends and receives in both directions at once (the interleaved schedule's
`send_forward_backward_recv_forward_backward`, used when `overlap_p2p_comm` is off: schedules.py,
forward_backward_pipelining_with_interleaving) matches the peer's send-prev (a gradient's shape)
with this rank's recv-prev (an activation's): the activation buffer gets another micro-batch's
length and the packed sequence parameters no longer add up (`split_with_sizes expects
split_sizes to sum exactly to 6780 ... got [7688]`, seen with pp2 vpp2 on 2 H200s).

verl's Megatron engine sets `overlap_p2p_comm=True, batch_p2p_comm=False` with virtual stages
(verl/workers/engine/megatron/transformer_impl.py); then the schedule sends forward and backward
in separate calls, one direction each, and the shapes match. `p2p_settings` returns that."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


def p2p_settings(pp: int, vpp: int) -> dict[str, bool]:
    """ModelParallelConfig p2p keys for a layout (verl's choice)."""
    interleaved = pp > 1 and vpp > 1
    return {
        "variable_seq_lengths": True,
        "overlap_p2p_comm": interleaved,
        "batch_p2p_comm": not interleaved,
    }


@dataclass(frozen=True, slots=True)
class P2PCall:
    """One rank's part of one p2p call: the lengths it sends, whether it receives."""

    send_prev: int | None = None
    """Length (tokens) of the gradient sent to the previous stage."""
    recv_prev: bool = False
    send_next: int | None = None
    """Length of the activation sent to the next stage."""
    recv_next: bool = False


def exchange_shapes(pp: int, calls: dict[int, P2PCall]) -> dict[int, tuple[int | None, int | None]]:
    """(received-from-prev, received-from-next) lengths per rank after one round of
    `_communicate_shapes`, matching each pair of ranks' messages in post order as NCCL does."""
    queues: dict[tuple[int, int], list[int]] = defaultdict(list)
    for rank in range(pp):
        c = calls.get(rank, P2PCall())
        prev, nxt = (rank - 1) % pp, (rank + 1) % pp
        # _communicate_shapes posts send-prev before send-next.
        if c.send_prev is not None:
            queues[(rank, prev)].append(c.send_prev)
        if c.send_next is not None:
            queues[(rank, nxt)].append(c.send_next)
    out: dict[int, tuple[int | None, int | None]] = {}
    for rank in range(pp):
        c = calls.get(rank, P2PCall())
        prev, nxt = (rank - 1) % pp, (rank + 1) % pp
        got_prev = queues[(prev, rank)].pop(0) if c.recv_prev else None
        got_next = queues[(nxt, rank)].pop(0) if c.recv_next else None
        out[rank] = (got_prev, got_next)
    return out


def steady_state_calls(
    pp: int, act_len: dict[int, int], grad_len: dict[int, int], *, overlap_p2p_comm: bool
) -> list[dict[int, P2PCall]]:
    """The p2p calls of one steady-state step of the interleaved schedule on every rank: each
    rank sends an activation (length act_len[rank]) forward and a gradient (grad_len[rank])
    backward, and receives both; one combined call without overlap, two calls with it."""
    if overlap_p2p_comm:
        fwd = {r: P2PCall(send_next=act_len[r], recv_prev=True) for r in range(pp)}
        bwd = {r: P2PCall(send_prev=grad_len[r], recv_next=True) for r in range(pp)}
        return [fwd, bwd]
    both = {
        r: P2PCall(send_prev=grad_len[r], recv_prev=True, send_next=act_len[r], recv_next=True)
        for r in range(pp)
    }
    return [both]
