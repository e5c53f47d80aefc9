"""Host memory (tuner/estimate/host_memory.py): what verl 0.9.1 offloads, priced per trainer GPU;
the measured rows it was fitted on; the rows Ray's memory monitor killed, pruned on their node;
the CLI's --host-mem-gib and the verl runner's default of this machine's memory."""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli_request import Setup, with_local_host_memory
from tuner.estimate import estimate
from tuner.estimate.host_memory import RAY_KILL_FRACTION, host_unfit, offloaded_bytes
from tuner.estimate.memory import OPTIMIZER_BYTES, params_local
from tuner.fit.validate import case_from_row
from tuner.hardware import GIB, Cluster, get_gpu
from tuner.models import get_model
from tuner.results import read_raw
from tuner.results.record import parse_extra
from tuner.runners import make_runner
from tuner.space import Candidate, ParallelLayout
from tuner.workload import get_workload

REPO = Path(__file__).resolve().parents[2]
MOE = REPO / "results" / "moe2k-h200-x1.csv"
NODE_GIB = 135148564480 / GIB
"""The node of moe2k-h200-x1, as Ray's kill message in its trial 0 log gives it."""


def _case(row: dict[str, str]):  # type: ignore[no-untyped-def]
    case = case_from_row({**row, "status": "ok", "update_actor_s": "1"})
    assert case is not None
    return case


def test_offloaded_bytes_are_what_verl_copies_to_the_host() -> None:
    """param_offload: the actor's bf16 weights, and the reference's where GRPO has one;
    optimizer_offload: fp32 master + both Adam moments of the distributed optimizer's shard."""
    from tuner.estimate.context import get_context
    from tuner.estimate.profile import Profile

    m = get_model("qwen3-30b-moe")
    cl = Cluster(gpu=get_gpu("h200"), num_gpus=8)
    lay = ParallelLayout(world=8, tp=2, ep=4, pp=2)
    base = Candidate(layout=lay, param_offload=False, optimizer_offload=False)
    for algo, refs in (("grpo", 2), ("dapo", 1)):
        w = get_workload("dapo-math").with_overrides(algorithm=algo)
        ctx = get_context(m, cl, w, Profile())
        dense, expert = params_local(ctx, lay)
        assert offloaded_bytes(ctx, base) == 0
        po = dataclasses.replace(base, param_offload=True)
        assert offloaded_bytes(ctx, po) == pytest.approx(refs * 2 * (dense + expert))
        oo = dataclasses.replace(base, optimizer_offload=True)
        shard = dense / (lay.dp * lay.cp) + expert / lay.expert_dp
        assert offloaded_bytes(ctx, oo) == pytest.approx(OPTIMIZER_BYTES * shard)


def test_every_measured_row_is_predicted_within_5_percent() -> None:
    """verl's perf/cpu_memory_used_gb of every committed colocated verl row against the
    prediction; a split row's node (vLLM and the actor on GPUs of their own) is not modelled,
    and its prediction is held to err on the side that prunes (above the measured)."""
    seen = split = 0
    for path in sorted((REPO / "results").glob("*.csv")):
        for row in read_raw(path):
            used = parse_extra(row.get("extra", "")).get("cpu_memory_used_gb")
            if row.get("runner") != "verl" or used is None:
                continue
            case = _case(row)
            got = estimate(case.candidate, case.model, case.cluster, case.workload).host_mem_gib
            label = f"{path.name}:{row['trial']}"
            if case.candidate.rollout_gpus:
                assert got > float(used), label
                split += 1
                continue
            assert got == pytest.approx(float(used), rel=0.05), label
            seen += 1
    assert seen >= 12 and split >= 1


def test_the_moe_rows_ray_killed_are_pruned_on_their_node_and_the_one_that_ran_is_not() -> None:
    log = (REPO / "results" / "moe2k-h200-x1" / "trials" / "0" / "verl.log.gz").read_bytes()
    import gzip

    limit = re.search(rb"\(95\.0% of (\d+)B limit\)", gzip.decompress(log))
    assert limit is not None and int(limit.group(1)) / GIB == pytest.approx(NODE_GIB)
    rows = {r["trial"]: r for r in read_raw(MOE)}
    for trial, killed in (("0", True), ("1", False), ("2", True)):
        row = rows[trial]
        assert (parse_extra(row["extra"]).get("failure") == "host-oom") is killed
        case = _case(row)
        cl = dataclasses.replace(case.cluster, host_mem_gib=NODE_GIB)
        e = estimate(case.candidate, case.model, cl, case.workload)
        assert e.fits is not killed, (trial, e.fit_reason)
        if killed:
            assert e.fit_reason.startswith("host memory") and "optimizer_offload" in e.fit_reason
        # what prunes before a launch: the runners' view of the estimate
        for runner in (make_runner("estimate"), make_runner("verl", model_path="/m")):
            unfit = runner.predicted(e, cl).unfit
            assert unfit.startswith("host memory") if killed else not unfit, (runner, unfit)
        # on a node of unknown size nothing is decided by host memory
        assert estimate(case.candidate, case.model, case.cluster, case.workload).fits


def test_host_unfit_is_ray_s_kill_line() -> None:
    assert host_unfit(RAY_KILL_FRACTION * 100 - 0.01, 100, True) == ""
    assert host_unfit(RAY_KILL_FRACTION * 100 + 0.01, 100, True).startswith("host memory")
    assert host_unfit(1e9, None, True) == ""
    assert "--host-mem-gib" in host_unfit(200, 100, False)


def _setup(nodes: int = 1) -> Setup:
    m, w = get_model("qwen2.5-7b"), get_workload("dapo-math")
    return Setup(model=m, cluster=Cluster(gpu=get_gpu("h100"), num_gpus=8 * nodes), workload=w)


def test_the_verl_runner_s_default_is_this_machine_s_memory_where_it_launches() -> None:
    with open("/proc/meminfo") as f:
        kib = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    here = argparse.Namespace(host_mem_gib=None, launcher="local", ray_address=None)
    assert with_local_host_memory(here, _setup()).cluster.host_mem_gib == kib / 1024**2
    # told, elsewhere, or over several nodes: left as given
    told = argparse.Namespace(host_mem_gib=64.0, launcher="local", ray_address=None)
    assert with_local_host_memory(told, _setup()).cluster.host_mem_gib is None
    remote = argparse.Namespace(host_mem_gib=None, launcher="ray", ray_address="http://h:8265")
    assert with_local_host_memory(remote, _setup()).cluster.host_mem_gib is None
    assert with_local_host_memory(here, _setup(nodes=2)).cluster.host_mem_gib is None


def _tune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True
    )


MOE_SETUP = (
    "--model",
    str(REPO / "scripts" / "models" / "qwen3-30b-moe-8l" / "config.json"),
    "--gpus",
    "1",
    "--gpus-per-node",
    "1",
    "--gpu",
    "h200",
    "--workload",
    "grpo-short",
    "--layout",
    "dp1",
    "--offload",
)


def test_tune_estimate_says_the_host_memory_and_refuses_it_on_a_small_node(tmp_path: Path) -> None:
    small = _tune("estimate", *MOE_SETUP, "--host-mem-gib", "126", cwd=tmp_path)
    assert small.returncode == 0, small.stderr
    assert "does NOT fit: host memory" in small.stdout
    assert re.search(r"host memory [\d.]+ GiB a node of the node's 126.0", small.stdout)
    big = _tune("estimate", *MOE_SETUP, "--host-mem-gib", "2048", cwd=tmp_path)
    assert "does NOT fit" not in big.stdout
    for bad in ("0", "-5", "nan", "1e9"):
        r = _tune("estimate", *MOE_SETUP, "--host-mem-gib", bad, cwd=tmp_path)
        assert r.returncode == 2 and "--host-mem-gib" in r.stderr, (bad, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
