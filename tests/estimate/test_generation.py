"""vLLM's eager decode step: the ops vLLM 0.24.0 calls from Python, their host time, and the
H100 measurements (scripts/eager_decode_fit.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tuner.estimate import Profile, estimate
from tuner.estimate.context import get_context
from tuner.estimate.generation import (
    EAGER,
    FULL_GRAPH,
    VLLM_ASYNC_SCHEDULING,
    _decode_step_s,
    eager_ops,
)
from tuner.fit.validate import load_cases
from tuner.hardware import GPUS, Cluster
from tuner.models import get_model
from tuner.space import Candidate, ParallelLayout
from tuner.workload import Workload

REPO = Path(__file__).resolve().parents[2]
QWEN3_1_7B = get_model(str(REPO / "scripts" / "models" / "qwen3-1.7b" / "config.json"))
H100 = Cluster(gpu=GPUS["h100"], num_gpus=1, gpus_per_node=1)
EXACT_4K = Workload(
    name="dapo-math",
    algorithm="dapo",
    prompt_len=256,
    prompt_mean=256,
    response_len=4096,
    response_mean=4096,
    batch_size=8,
    n=4,
    mini_batch_size=4,
)
"""scripts/gpu_verl_study.sh's workload: 32 sequences, prompts 256, responses exactly 4096."""
EAGER_ROLLOUT = Candidate(
    layout=ParallelLayout.parse("dp1", 1),
    rollout_tp=1,
    gpu_memory_utilization=0.7,
    max_num_seqs=64,
    max_num_batched_tokens=4352,
    enforce_eager=True,
)
"""The rollout of results/verl4k-h100-x1.csv trial 6 and of the fast runner's eager row."""
MEASURED_EAGER_S = {"vllm LLM.generate": 82.152, "verl 0.9.1": 108.186}
"""Eager generation of EAGER_ROLLOUT on one H100: the megatron runner's vLLM engine
(results/gen-check-local-h100-x1.csv trial 4) and verl's timing_s/gen (verl4k-h100-x1 trial 6)."""
H100_EAGER_OP_HOST_S = 56.7e-6
"""The per-op host time scripts/eager_decode_fit.out.txt fits to both rows together."""


def test_eager_ops_are_vllms_calls_per_layer_with_the_qk_norms_where_the_model_has_them() -> None:
    """12 per Qwen3 layer (two RMSNorms on q and k), 10 per Qwen2.5 layer, and 3 outside the
    layers (token cast, embedding, final norm)."""
    qwen25 = get_model("qwen2.5-7b")
    assert QWEN3_1_7B.qk_layernorm and not qwen25.qk_layernorm
    for model, per_layer in ((QWEN3_1_7B, 12), (qwen25, 10)):
        ctx = get_context(model, H100, EXACT_4K, Profile())
        assert eager_ops(ctx) == ctx.layers * per_layer + 3


def test_a_small_eager_step_waits_on_the_host_op_by_op() -> None:
    """32 sequences of Qwen3-1.7B: the GPU's weight and KV reads hide under the host's calls,
    so each microsecond per op costs the step eager_ops microseconds."""
    step = {}
    for c in (20e-6, 40e-6):
        ctx = get_context(QWEN3_1_7B, H100, EXACT_4K, Profile(eager_op_host_s=c))
        step[c] = _decode_step_s(ctx, 1, 1, 1, 32, 256 + 2048, EAGER)
    assert step[40e-6] - step[20e-6] == pytest.approx(eager_ops(ctx) * 20e-6, rel=1e-9)


def test_one_host_time_per_op_predicts_both_h100_eager_measurements() -> None:
    """With the per-op host time the H100 rows imply, the eager phase lies within 25% of the
    fast runner's and of verl's measurement; the same rollout with CUDA graphs is left as it
    was (it never reads the eager cost)."""
    p = Profile(eager_op_host_s=H100_EAGER_OP_HOST_S)
    eager = estimate(EAGER_ROLLOUT, QWEN3_1_7B, H100, EXACT_4K, p).generation_s
    for source, measured in MEASURED_EAGER_S.items():
        assert abs(eager - measured) / measured < 0.25, (source, eager, measured)
    graphs = dataclasses.replace(EAGER_ROLLOUT, enforce_eager=False)
    default = estimate(graphs, QWEN3_1_7B, H100, EXACT_4K, Profile()).generation_s
    assert estimate(graphs, QWEN3_1_7B, H100, EXACT_4K, p).generation_s == default


def test_graph_runs_never_read_the_eager_cost() -> None:
    """Every step of a rollout with graphs costs the same whatever the eager op's host time:
    full graphs, and in a busy phase of 1024 sequences the steps that admit a prompt, which at
    max_num_seqs 64 exceed the largest capture size (128) and run the compiled model without a
    graph (their launches cost decode_launch_s)."""
    wide = dataclasses.replace(EXACT_4K, batch_size=256)
    for mns in (64, 1024):
        c = dataclasses.replace(EAGER_ROLLOUT, enforce_eager=False, max_num_seqs=mns)
        a, b = (
            estimate(c, QWEN3_1_7B, H100, wide, Profile(eager_op_host_s=x)).generation_s
            for x in (5e-6, 2e-4)
        )
        assert a == b
    c = dataclasses.replace(EAGER_ROLLOUT, enforce_eager=False)
    a, b = (
        estimate(c, QWEN3_1_7B, H100, wide, Profile(decode_launch_s=x)).generation_s
        for x in (5e-6, 2e-4)
    )
    assert a < b


NO_ENGINE = Profile(decode_step_overhead_s=0.0, decode_seq_overhead_s=0.0)
"""The default profile without the engine's host work: a step is then its GPU's (or launches')."""


def _step(p: Profile, mode: int, batch: int, context: int, async_scheduling: bool) -> float:
    ctx = get_context(QWEN3_1_7B, H100, EXACT_4K, p)
    rows = batch if mode == FULL_GRAPH else 0
    return _decode_step_s(ctx, 1, 1, 1, batch, context, mode, rows, async_scheduling)


def test_async_scheduling_overlaps_the_engines_host_work_with_the_gpu() -> None:
    """vLLM 0.24.0 schedules step k+1 before it waits for step k (EngineCore
    step_with_batch_queue), so a graph step whose engine work (3 ms + 25 us per sequence)
    outlasts its GPU work costs the engine's, and one whose GPU work is longer costs the GPU's:
    the longer of the two, where synchronous scheduling (the reference rows' vLLM) adds them.
    32 sequences at their prompt's 256 tokens are host-bound, 128 at 4352 GPU-bound (KV reads)."""
    assert VLLM_ASYNC_SCHEDULING
    p = Profile()
    for batch, context, host_bound in ((32, 256, True), (128, 256 + 4096, False)):
        gpu = _step(NO_ENGINE, FULL_GRAPH, batch, context, True)
        assert gpu == _step(NO_ENGINE, FULL_GRAPH, batch, context, False)  # one GPU, TP 1
        engine = p.decode_step_overhead_s + batch * p.decode_seq_overhead_s
        assert (engine > 1.5 * gpu) if host_bound else (gpu > 1.5 * engine)
        on, off = (_step(p, FULL_GRAPH, batch, context, a) for a in (True, False))
        assert on == pytest.approx(max(gpu, engine), rel=1e-12)
        assert off == pytest.approx(gpu + engine, rel=1e-12)


def test_an_eager_step_bound_by_its_launches_gains_nothing_from_async_scheduling() -> None:
    """With enforce_eager the launches and the engine's work are one host chain (the uni
    executor runs execute_model on the engine core's thread): 32 sequences cost eager_ops
    launches plus the engine's work whether vLLM schedules asynchronously or not."""
    p = Profile()
    ctx = get_context(QWEN3_1_7B, H100, EXACT_4K, p)
    host = eager_ops(ctx) * p.eager_op_host_s + p.decode_step_overhead_s + 32 * 25e-6
    for a in (True, False):
        assert _step(p, EAGER, 32, 256 + 2048, a) == pytest.approx(host, rel=1e-12)


def test_the_reference_rows_schedule_synchronously_and_ours_asynchronously() -> None:
    """The published rows' vLLM predates async scheduling by default; this project's rows ran
    vLLM 0.24.0. Each case predicts with its own flag, and the generation cache keeps the two
    apart (verl4k-h100-x1 trial 1, graphs: 33.9 s without overlap, 20.0 s with)."""
    ref = load_cases(sorted((REPO / "tests" / "data" / "anchors").glob("*.csv")))
    assert ref and not any(c.async_scheduling for c in ref)
    (own,) = [
        c for c in load_cases([REPO / "results" / "verl4k-h100-x1.csv"]) if c.label.endswith(":1")
    ]
    assert own.async_scheduling
    args = (own.candidate, own.model, own.cluster, own.workload)
    on, off = (estimate(*args, async_scheduling=a).generation_s for a in (True, False))
    assert own.predict().generation_s == on
    assert on == pytest.approx(20.0, abs=0.1) and off == pytest.approx(33.9, abs=0.1)
    assert estimate(*args).generation_s == on  # after False: not served the cached False
    r = ref[0]
    ref_off = r.predict().generation_s
    ref_on = estimate(r.candidate, r.model, r.cluster, r.workload, async_scheduling=True)
    assert ref_on.generation_s < ref_off
