"""GPU-host check of the megatron runner, in one process (run by scripts/gpu_runner_check.sh):

1. refusals: for every layout of a few search spaces (and recompute/SP variants) build
   megatron-core's TransformerConfig and compare what it refuses with
   tuner.runners.megatron_refusals (rules marked `config`);
2. one-shot trial (torchrun per trial) of a dense model, tp = all GPUs;
3. a pool of trials: the same candidate, the same with fused kernels, pp2 vpp2 (where 2+ GPUs),
   and one stopped early by should_stop (PRUNED_SLOW), then close();
4. a summary table (launch_s vs measured_s, memory three ways, fused vs full logits).

    python scripts/gpu_runner_check.py OUT_DIR [MODEL]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path

from tuner.estimate import estimate
from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.runners.base import TrialSpec
from tuner.runners.megatron import MegatronRunner
from tuner.runners.megatron_refusals import refusals
from tuner.runners.megatron_worker.model import config_kwargs
from tuner.runners.megatron_worker.spec import BatchCfg, OffloadCfg, RecomputeCfg, WorkerSpec
from tuner.space import Candidate, ParallelLayout, SearchSpace, SpaceLimits
from tuner.workload import Workload


def check_refusals(out: Path) -> dict:
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    cases = [("qwen2.5-7b", 8), ("qwen3-30b-moe", 8), ("qwen3-30b-moe", 16), ("qwen2.5-7b", 6)]
    w = Workload(prompt_len=1024, response_len=4096, batch_size=16, n=4, mini_batch_size=16)
    n = agree = 0
    disagree = []
    for name, world in cases:
        try:
            m = get_model(name)
        except Exception as e:  # noqa: BLE001
            disagree.append(f"{name}: {e}")
            continue
        cl = Cluster(gpu=get_gpu("h200"), num_gpus=world, gpus_per_node=world)
        space = SearchSpace(model=m, cluster=cl, workload=w, limits=SpaceLimits())
        # every layout the space offers, plus raw grids the space filters out
        lays = list(space.layouts.values())
        for tp in (1, 2, 4, 8):
            for pp in (1, 2, 3, 4):
                for vpp in (1, 2, 3):
                    with contextlib.suppress(ValueError):
                        lays.append(ParallelLayout(world=world, tp=tp, pp=pp, vpp=vpp))
        for lay in lays:
            variants = [
                dict(),
                dict(sequence_parallel=True),
                dict(recompute_granularity="full", recompute_num_layers=1),
                dict(recompute_granularity="full", recompute_num_layers=m.num_layers // lay.pp + 1),
                dict(recompute_granularity="selective", recompute_modules="core_attn,mlp"),
                dict(
                    recompute_granularity="selective",
                    recompute_modules="moe_act",
                    moe_grouped_gemm=False,
                ),
                # the runner pins moe_grouped_gemm on; the worker's config has it off
                dict(recompute_granularity="selective", recompute_modules="core_attn,moe_act"),
            ]
            for v in variants:
                c = Candidate(layout=lay, **v)
                ours = sorted(r.rule for r in refusals(c, m, cl, w) if r.when == "config")
                spec = WorkerSpec(
                    model=m,
                    layout=lay,
                    sequence_parallel=c.sequence_parallel,
                    recompute=RecomputeCfg(
                        granularity=c.recompute_granularity,
                        method=c.recompute_method,
                        num_layers=c.recompute_num_layers,
                        modules=tuple(c.recompute_modules.split(",")),
                    ),
                    offload=OffloadCfg(),
                    batch=BatchCfg(
                        sequence_lengths=(1,),
                        mini_batch_size=1,
                        use_dynamic_bsz=True,
                        max_token_len_per_gpu=1,
                    ),
                )
                kw = config_kwargs(spec)  # what the worker builds, not the candidate's flags
                try:
                    TransformerConfig(
                        **kw,
                        activation_func=F.silu,
                        params_dtype=torch.bfloat16,
                        pipeline_dtype=torch.bfloat16,
                    )
                    theirs = ""
                except Exception as e:  # noqa: BLE001
                    theirs = f"{type(e).__name__}: {e}"[:200]
                n += 1
                if bool(ours) == bool(theirs):
                    agree += 1
                else:
                    disagree.append(f"{name} w{world} {lay.spec} {v}: ours={ours} mcore={theirs!r}")
    kinds: dict[str, int] = {}
    for d in disagree:
        key = d.split(": ours=", 1)[-1]
        key = key.split(" mcore=")[0] + " mcore=" + key.split(" mcore=")[-1][:70]
        kinds[key] = kinds.get(key, 0) + 1
    res = {"checked": n, "agree": agree, "kinds": kinds, "disagree": disagree[:20]}
    (out / "refusals.json").write_text(json.dumps(res, indent=1))
    return res


def trial_spec(tmp: Path, n: int, c: Candidate, m, cl, w, stop=None, timeout=400.0) -> TrialSpec:
    return TrialSpec(
        number=n,
        candidate=c,
        model=m,
        cluster=cl,
        workload=w,
        trial_dir=tmp / "trials" / str(n),
        timeout_s=timeout,
        prediction=estimate(c, m, cl, w),
        seed=1,
        should_stop=stop,
    )


def main() -> int:
    out = Path(sys.argv[1])
    model = sys.argv[2] if len(sys.argv) > 2 else "qwen2.5-7b"
    out.mkdir(parents=True, exist_ok=True)
    import torch

    gpus = torch.cuda.device_count()
    t = time.monotonic()
    ref = check_refusals(out)
    print(f"refusals: {ref['agree']}/{ref['checked']} agree ({time.monotonic() - t:.0f}s)")
    for k, v in sorted(ref["kinds"].items(), key=lambda kv: -kv[1]):
        print(f"  DISAGREE x{v}: {k}")
    for d in ref["disagree"][:5]:
        print("  e.g.", d)
    m = get_model(model)
    cl = Cluster(gpu=get_gpu("h200"), num_gpus=gpus, gpus_per_node=gpus)
    w = Workload(
        prompt_len=1024, response_len=4096, response_mean=2500, batch_size=8, n=4, mini_batch_size=4
    )
    budget = 2 * w.max_seq_len
    base = Candidate(
        layout=ParallelLayout(world=gpus, tp=gpus),
        use_fused_kernels=False,
        ppo_max_token_len_per_gpu=budget,
        log_prob_max_token_len_per_gpu=2 * budget,
    )
    rows = []
    work = out / "work"

    def record(label: str, r, wall: float) -> None:
        row = {
            "case": label,
            "status": r.status.value,
            "wall_s": round(wall, 1),
            **{
                k: getattr(r, k)
                for k in (
                    "launch_s",
                    "measured_s",
                    "old_log_prob_s",
                    "update_actor_s",
                    "tokens_per_s_per_gpu",
                    "mfu_update_pct",
                    "peak_mem_gib",
                    "peak_mem_reserved_gib",
                    "peak_mem_device_gib",
                    "reason",
                )
            },
            "extra": r.extra,
        }
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "extra"}), flush=True)

    if "--no-oneshot" not in sys.argv:
        one = MegatronRunner(pool=False)
        t = time.monotonic()
        r = one.run(trial_spec(work / "one", 0, base, m, cl, w))
        record("oneshot tp", r, time.monotonic() - t)

    pool = MegatronRunner(pool=True, pool_dir=work / "pool")
    cands = [
        ("pool tp full-logits", base),
        ("pool tp fused", dataclasses.replace(base, use_fused_kernels=True)),
    ]
    if gpus >= 2:
        # 8 of the model's layers: pp2 vpp2 with variable-length micro-batches (the
        # split_with_sizes mismatch) without the full model's memory on one stage
        cands.append(
            (
                "pool pp2vpp2 8l",
                dataclasses.replace(
                    base, layout=ParallelLayout(world=gpus, pp=2, vpp=2, tp=gpus // 2)
                ),
            )
        )
    t_pool = time.monotonic()
    for i, (label, c) in enumerate(cands, start=1):
        t = time.monotonic()
        mm = dataclasses.replace(m, name=f"{m.name}-8l", num_layers=8) if "8l" in label else m
        record(label, pool.run(trial_spec(work / "p", i, c, mm, cl, w)), time.monotonic() - t)
    t = time.monotonic()
    r = pool.run(trial_spec(work / "p", 9, base, m, cl, w, stop=lambda step, tps: step >= 0))
    record("pool early-stop", r, time.monotonic() - t)
    pool.close()
    pool_wall = time.monotonic() - t_pool
    pooled = [x for x in rows if x["case"].startswith("pool")]
    measured = sum(x["measured_s"] or 0 for x in pooled)
    print(
        f"pool: {len(pooled)} trials in {pool_wall:.0f}s wall, {measured:.0f}s measured "
        f"({100 * measured / pool_wall:.0f}%)"
    )
    (out / "rows.json").write_text(json.dumps(rows, indent=1, default=str))
    print(
        "\ncase                 status  wall  launch measured  logp_s  upd_s  tok/s/gpu  "
        "alloc/resv/device GiB"
    )
    for x in rows:
        f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
        print(
            f"{x['case']:20s} {x['status']:7s} {x['wall_s']:5.0f} {f(x['launch_s']):>6s} "
            f"{f(x['measured_s']):>8s} {f(x['old_log_prob_s'], 2):>7s} "
            f"{f(x['update_actor_s'], 2):>6s} {f(x['tokens_per_s_per_gpu'], 0):>9s}  "
            f"{f(x['peak_mem_gib'])}/{f(x['peak_mem_reserved_gib'])}/"
            f"{f(x['peak_mem_device_gib'])}  {(x['reason'] or '')[:100]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
