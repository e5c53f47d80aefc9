"""How verl turns one step's samples into mini-batches and micro-batches (pure Python, no torch).

The rules follow verl's trainer (`RayPPOTrainer._balance_batch`) and its Megatron actor
(`MegatronPPOActor.update_policy` → `rearrange_micro_batches` in `verl/utils/seqlen_balancing.py`):

1. Balance the step across DP ranks: a Karmarkar-Karp partition of the samples' workloads into
   `dp` parts of equal sample count; each part is then ordered by workload, small ones at both
   ends (`p[::2] + p[1::2][::-1]`).
2. Each rank cuts its part, in order, into mini-batches of `mini_batch_size / dp` samples; one
   optimizer step per mini-batch.
3. Dynamic batching: the budget is `ppo_max_token_len_per_gpu * cp` (the actor multiplies by the
   context-parallel size). A rank wants `min(samples, ceil(tokens / budget))` micro-batches; all
   ranks take the largest count; with virtual pipeline stages it is rounded up to a multiple of
   `microbatch_group_size_per_vp_stage`. The rank's samples are split into that many parts by a
   Karmarkar-Karp partition of their workloads, and the parts are ordered heaviest in the middle.
   Fixed batching: the rank's mini-batch is cut, in order, into pieces of
   `micro_batch_size_per_gpu` samples.

As in verl, the budget sets the count, not a hard cap: the partition balances workloads, so a
micro-batch often holds somewhat more than the budget (about 10% at two or three samples per
micro-batch). `strict_budget=True` instead grows the count (on every rank, by the multiple) until
every micro-batch fits; that is not what verl runs, so it is off by default.

Workload of a sample of s tokens, as verl's `calculate_workload`: 24576·s + s² (linear layers of
a 7B model plus attention).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_MINI_BATCHES = 2
"""Mini-batches (optimizer steps) the megatron runner runs per measured step by default, and
that the memory model plans with: the update's throughput does not depend on how many there
are, and a full dapo-math step (16 of them) would take minutes."""

WORKLOAD_LINEAR_COEFF = 24576
"""verl's `calculate_workload` constant: 6·h² over 2·h for h = 4096."""


def seq_workload(seqlen: int) -> int:
    """verl's relative cost of one sample: 24576·s + s²."""
    return WORKLOAD_LINEAR_COEFF * seqlen + seqlen * seqlen


def ceil_div(a: int, b: int) -> int:
    return -(a // -b)


def round_up(a: int, multiple: int) -> int:
    return ceil_div(a, multiple) * multiple


# --------------------------------------------------------------------------------------------
# Balanced partitions (largest differencing method, as verl's karmarkar_karp)
# --------------------------------------------------------------------------------------------


class _State:
    """k partial sums, kept sorted largest first; merged pairwise, largest spread first."""

    __slots__ = ("sets",)

    def __init__(self, sets: list[tuple[int, list[int]]]) -> None:
        self.sets = sorted(sets, key=lambda s: (s[0], len(s[1]), s[1]), reverse=True)

    @property
    def spread(self) -> int:
        return self.sets[0][0] - self.sets[-1][0]

    def sort_key(self) -> tuple[int, int, int]:
        top = self.sets[0]
        # heapq pops the smallest: the largest spread, then the largest top set, goes first.
        return (-self.spread, -top[0], -len(top[1]))

    def merge(self, other: _State) -> None:
        k = len(self.sets)
        merged = []
        for i in range(k):
            a_sum, a_items = self.sets[i]
            b_sum, b_items = other.sets[k - 1 - i]
            merged.append((a_sum + b_sum, a_items + b_items))
        self.sets = sorted(merged, key=lambda s: (s[0], len(s[1]), s[1]), reverse=True)


def karmarkar_karp(values: Sequence[int], k: int, *, equal_size: bool) -> list[list[int]]:
    """Indices of `values` in `k` groups whose sums are close (largest differencing method).

    With `equal_size`, every group gets len(values)/k items (len(values) must divide by k)."""
    if k <= 0:
        raise ValueError(f"number of partitions must be positive, got {k}")
    if len(values) < k:
        raise ValueError(f"cannot split {len(values)} items into {k} non-empty partitions")
    if k == 1:
        return [list(range(len(values)))]
    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    heap: list[tuple[tuple[int, int, int], int, _State]] = []
    counter = 0

    def push(state: _State) -> None:
        nonlocal counter
        heapq.heappush(heap, (state.sort_key(), counter, state))
        counter += 1

    if equal_size:
        if len(values) % k:
            raise ValueError(f"{len(values)} items do not split into {k} equal partitions")
        for off in range(0, len(order), k):
            chunk = order[off : off + k]
            push(_State([(values[i], [i]) for i in chunk]))
    else:
        for i in order:
            push(_State([(values[i], [i])] + [(0, []) for _ in range(k - 1)]))
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        a.merge(b)
        push(a)
    return [items for _, items in heap[0][2].sets]


def balanced_partitions(values: Sequence[int], k: int, *, equal_size: bool) -> list[list[int]]:
    """`karmarkar_karp`, each group's indices sorted; raises if a group comes out empty."""
    parts = [sorted(p) for p in karmarkar_karp(values, k, equal_size=equal_size)]
    if any(not p for p in parts):
        raise ValueError(f"a partition of {len(values)} items into {k} came out empty")
    return parts


# --------------------------------------------------------------------------------------------
# The step plan
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchPlan:
    """One step's samples, placed: micro_batches[mini][rank][micro] is a tuple of sample
    indices into `sequence_lengths`. Every rank has the same number of micro-batches in a
    mini-batch (the pipeline schedule needs it)."""

    sequence_lengths: tuple[int, ...]
    dp: int
    micro_batches: tuple[tuple[tuple[tuple[int, ...], ...], ...], ...]
    token_budget: int
    """Tokens allowed in one micro-batch (dynamic batching; budget·cp), 0 when fixed."""

    @property
    def num_mini_batches(self) -> int:
        return len(self.micro_batches)

    def micro_batch_counts(self) -> list[int]:
        """Micro-batches per mini-batch (equal on every rank)."""
        return [len(mini[0]) for mini in self.micro_batches]

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches one rank runs in the whole step."""
        return sum(self.micro_batch_counts())

    def rank_micro_lengths(self, mini: int, rank: int) -> list[list[int]]:
        """Sequence lengths of each micro-batch of `rank` in mini-batch `mini`."""
        return [[self.sequence_lengths[i] for i in mb] for mb in self.micro_batches[mini][rank]]

    @property
    def total_tokens(self) -> int:
        return sum(self.sequence_lengths)

    def max_micro_tokens(self) -> int:
        return max(
            sum(self.sequence_lengths[i] for i in mb)
            for mini in self.micro_batches
            for rank in mini
            for mb in rank
        )


def assign_to_dp_ranks(
    sequence_lengths: Sequence[int], dp: int, *, balance: bool = True
) -> list[list[int]]:
    """Sample indices per DP rank, in the order the rank trains on them (verl's balance_batch:
    equal counts, balanced workloads, light samples at both ends)."""
    n = len(sequence_lengths)
    if n % dp:
        raise ValueError(f"{n} samples do not split evenly over dp={dp} ranks")
    if not balance:
        size = n // dp
        return [list(range(r * size, (r + 1) * size)) for r in range(dp)]
    return [list(r) for r in _balanced_ranks(tuple(sequence_lengths), dp)]


@functools.lru_cache(maxsize=256)
def _balanced_ranks(lengths: tuple[int, ...], dp: int) -> tuple[tuple[int, ...], ...]:
    """assign_to_dp_ranks' balanced placement, memoised: the cost model plans one step's
    lengths for every token budget of a layout's dp, and the placement over the ranks does not
    depend on the budget (a search scored thousands of plans, most of their time here)."""
    work = [seq_workload(s) for s in lengths]
    ranks = []
    for part in balanced_partitions(work, dp, equal_size=True):
        part = sorted(part, key=lambda i: (work[i], i))
        ranks.append(tuple(part[::2] + part[1::2][::-1]))
    return tuple(ranks)


def _dynamic_parts(lengths: Sequence[int], samples: Sequence[int], k: int) -> list[tuple[int, ...]]:
    return list(_dynamic_parts_of(tuple(lengths), tuple(samples), k))


@functools.lru_cache(maxsize=8192)
def _dynamic_parts_of(
    lengths: tuple[int, ...], samples: tuple[int, ...], k: int
) -> tuple[tuple[int, ...], ...]:
    """_dynamic_parts, memoised: budgets that give a rank's share the same micro-batch count
    give it the same partition."""
    work = [seq_workload(lengths[i]) for i in samples]
    parts = balanced_partitions(work, k, equal_size=False)
    parts.sort(key=lambda p: (sum(work[j] for j in p), p[0]), reverse=True)
    parts = parts[::2][::-1] + parts[1::2]
    return tuple(tuple(samples[j] for j in p) for p in parts)


def plan_step(
    sequence_lengths: Sequence[int],
    *,
    dp: int,
    mini_batch_size: int,
    use_dynamic_bsz: bool,
    max_token_len_per_gpu: int = 0,
    micro_batch_size_per_gpu: int = 0,
    cp: int = 1,
    micro_batch_multiple: int = 1,
    balance_batch: bool = True,
    strict_budget: bool = False,
) -> BatchPlan:
    """Place one step's samples as verl's Megatron actor would (see the module docstring).

    `mini_batch_size` is in samples (verl: ppo_mini_batch_size · rollout.n);
    `micro_batch_multiple` is microbatch_group_size_per_vp_stage when virtual pipeline stages
    are used, else 1. Raises ValueError with the rule broken."""
    lengths = tuple(int(s) for s in sequence_lengths)
    n = len(lengths)
    if n == 0:
        raise ValueError("the step has no samples")
    if min(lengths) <= 0:
        raise ValueError("sequence lengths must be positive")
    for name, v in (("dp", dp), ("mini_batch_size", mini_batch_size), ("cp", cp)):
        if v <= 0:
            raise ValueError(f"{name} must be positive, got {v}")
    if micro_batch_multiple <= 0:
        raise ValueError(f"micro_batch_multiple must be positive, got {micro_batch_multiple}")
    if n % mini_batch_size:
        raise ValueError(f"{n} samples are not a whole number of mini-batches of {mini_batch_size}")
    if mini_batch_size % dp:
        raise ValueError(
            f"mini-batch of {mini_batch_size} samples does not split over dp={dp} ranks: "
            "make ppo_mini_batch_size * rollout.n a multiple of the data-parallel size"
        )
    per_rank = mini_batch_size // dp
    budget = 0
    if use_dynamic_bsz:
        if max_token_len_per_gpu <= 0:
            raise ValueError("dynamic batching needs a positive max_token_len_per_gpu")
        budget = max_token_len_per_gpu * cp
        if max(lengths) > budget:
            raise ValueError(
                f"a {max(lengths)}-token sample exceeds the micro-batch budget {budget} "
                f"(ppo_max_token_len_per_gpu {max_token_len_per_gpu} x cp {cp}): raise "
                "ppo_max_token_len_per_gpu to at least prompt + response length"
            )
    elif micro_batch_size_per_gpu <= 0:
        raise ValueError("fixed batching needs a positive micro_batch_size_per_gpu")

    ranks = assign_to_dp_ranks(lengths, dp, balance=balance_batch)
    minis = []
    for m in range(n // mini_batch_size):
        shares = [r[m * per_rank : (m + 1) * per_rank] for r in ranks]
        if use_dynamic_bsz:
            minis.append(
                _plan_dynamic(lengths, shares, budget, micro_batch_multiple, strict_budget)
            )
        else:
            minis.append(_plan_fixed(shares, micro_batch_size_per_gpu, micro_batch_multiple))
    return BatchPlan(
        sequence_lengths=lengths, dp=dp, micro_batches=tuple(minis), token_budget=budget
    )


def _plan_dynamic(
    lengths: tuple[int, ...], shares: list[list[int]], budget: int, multiple: int, strict: bool
) -> tuple[tuple[tuple[int, ...], ...], ...]:
    size = len(shares[0])
    want = max(min(size, ceil_div(sum(lengths[i] for i in s), budget)) for s in shares)
    k = round_up(want, multiple)
    while True:
        if k > size:
            raise ValueError(
                f"{k} micro-batches (a multiple of {multiple}) needed but a rank has only "
                f"{size} samples in its mini-batch: raise the mini-batch size or the token budget"
            )
        plans = [_dynamic_parts(lengths, s, k) for s in shares]
        if not strict or all(sum(lengths[i] for i in mb) <= budget for p in plans for mb in p):
            return tuple(tuple(p) for p in plans)
        k += multiple


def _plan_fixed(
    shares: list[list[int]], mbs: int, multiple: int
) -> tuple[tuple[tuple[int, ...], ...], ...]:
    size = len(shares[0])
    count = ceil_div(size, mbs)
    if count % multiple:
        raise ValueError(
            f"{count} micro-batches per mini-batch ({size} samples per rank / micro batch {mbs}) "
            f"is not a multiple of {multiple}, as interleaved pipeline stages need"
        )
    return tuple(tuple(tuple(s[i : i + mbs]) for i in range(0, size, mbs)) for s in shares)
