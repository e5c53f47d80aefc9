"""Write the cost model's outputs on a fixed set of inputs, to pin its behaviour (issue 31 item 5).

    python scripts/golden_estimates.py                 # rewrites tests/data/estimate_golden.json
    python scripts/golden_estimates.py --keep-inputs   # the file's cases on their stored inputs,
                                                       # plus the cases it lacks

`--keep-inputs`: each stored case's outputs computed again on its stored inputs (what the test
does), and the cases of leaderboard rows committed since added; the drawn candidates stay the
ones stored, so a change of the cost model's numbers shows as output lines alone (without it,
the draws follow the current sampler and space rules).

The inputs: every row of the committed leaderboards (results/*.csv, read with tuner.results
readers and rebuilt as tuner.fit.validate rebuilds our own rows), the reference rows
(tests/data/anchors/*.csv, tuner.fit.validate.load_cases: verl <= 0.5's rollout in the actor,
vLLM without async scheduling, the full-logits rows), and candidates drawn by space.sample with a
seeded RandomSuggester for a spread of studies (dense and MoE, one to 64 GPUs, GRPO/DAPO/PPO,
split placements), a few of them again with estimate()'s keyword arguments and a non-default
profile. Each case stores its inputs (the candidate's record, the model's name or path, the
cluster, the workload's fields, the keyword arguments) and estimate()'s whole output
(Estimate.as_dict: every phase time and every MemoryBreakdown field), so the test
(tests/estimate/test_golden.py) re-runs the cost model on the stored inputs, independent of the
CSVs and of the sampler.

Rewrite the file only when a change of the cost model's numbers is meant; a refactor must leave
it as it is.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.estimate import Estimate, Profile, estimate
from tuner.fileio import write_atomic
from tuner.fit.validate import load_cases, row_setup
from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.results import read_rows
from tuner.space import Candidate, RandomSuggester, SearchSpace, sample
from tuner.workload import Workload, get_workload

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "data" / "estimate_golden.json"
SCHEMA = 1
SEED = 31

STUDIES: tuple[tuple[str, str, int, int, str, dict[str, int], bool, int], ...] = (
    # model, gpu, gpus, gpus per node, workload, its overrides, off-policy allowed, candidates
    ("qwen2.5-7b", "h100", 8, 8, "dapo-math", {}, True, 30),
    ("qwen3-30b-moe", "h100", 32, 8, "dapo-math", {}, True, 30),
    ("llama3.1-70b", "h200", 64, 8, "ppo-gsm8k", {}, False, 20),
    ("qwen2.5-7b", "h20", 32, 8, "grpo-math", {}, False, 20),
    # mini-batches too large to plan (micro_batches.BATCH_PLAN_MAX_SAMPLES): the moments' model
    ("qwen2.5-7b", "h100", 16, 8, "grpo-math", {"mini_batch_size": 256}, False, 20),
    ("qwen3-8b", "h200", 4, 4, "grpo-short", {}, True, 20),
    ("scripts/models/qwen3-1.7b/config.json", "h100", 1, 1, "dapo-math", {}, False, 15),
    ("scripts/models/qwen3-30b-moe-8l/config.json", "h200", 2, 2, "dapo-math", {}, True, 15),
)
"""The studies candidates are drawn for."""
VARIANTS: tuple[dict[str, Any], ...] = (
    {"headroom_gib": 2.0},
    {"verl_logits": "0.4.1"},
    {"rollout_in_actor": True},
    {"async_scheduling": False},
    {"profile": {"gemm_efficiency": 0.7, "hbm_efficiency": 0.6, "layer_host_s": 2e-3}},
)
"""estimate()'s keyword arguments the first candidates of each study are scored with again."""
VARIANT_CANDIDATES = 2


def inputs_of(c: Candidate, model: str, cl: Cluster, w: Workload, **kwargs: Any) -> dict[str, Any]:
    """One case's inputs as JSON."""
    rec = c.to_record()
    return {
        "candidate": {k: v for k, v in rec.items() if _DEFAULT_RECORD.get(k) != v},
        "world": c.layout.world + c.rollout_gpus,
        "model": model,
        "cluster": {"gpu": cl.gpu.name, "num_gpus": cl.num_gpus, "gpus_per_node": cl.gpus_per_node},
        "workload": {k: v for k, v in asdict(w).items() if _DEFAULT_WORKLOAD[k] != v},
        "kwargs": kwargs,
    }


_DEFAULT_RECORD = {f.name: f.default for f in fields(Candidate) if f.name != "layout"}
"""A candidate's knobs at their defaults: a case stores only the others (and its layout)."""
_DEFAULT_WORKLOAD = asdict(Workload())


def run(inputs: dict[str, Any]) -> Estimate:
    """estimate() on one case's stored inputs."""
    cl = Cluster(
        gpu=get_gpu(inputs["cluster"]["gpu"]),
        **{k: v for k, v in inputs["cluster"].items() if k != "gpu"},
    )
    c = Candidate.from_record(inputs["candidate"], inputs["world"])
    kw = dict(inputs["kwargs"])
    profile = Profile(**kw.pop("profile")) if "profile" in kw else None
    return estimate(
        c, get_model(inputs["model"]), cl, Workload(**inputs["workload"]), profile, **kw
    )


def outputs_of(e: Estimate) -> dict[str, Any]:
    """estimate()'s whole output as JSON (floats kept to the last bit by json's repr)."""
    return e.as_dict()


def leaderboard_cases() -> list[tuple[str, dict[str, Any]]]:
    """Every row of results/*.csv that names a model, a cluster, a workload and a layout."""
    out = []
    for path in sorted((REPO / "results").glob("*.csv")):
        for i, row in enumerate(read_rows(path)):
            try:
                _, cl, w, c = row_setup(row)
            except (UserError, KeyError, ValueError) as err:
                print(f"{path.name}:{i}: left out ({err})", file=sys.stderr)
                continue
            out.append((f"{path.name}:{i}", inputs_of(c, row["model"], cl, w)))
    return out


def anchor_cases() -> list[tuple[str, dict[str, Any]]]:
    """The reference rows, as tuner.fit.validate rebuilds them."""
    out = []
    paths = sorted((REPO / "tests" / "data" / "anchors").glob("*.csv"))
    for i, case in enumerate(load_cases(paths)):
        kw = {
            "verl_logits": case.verl_logits,
            "rollout_in_actor": case.rollout_in_actor,
            "async_scheduling": case.async_scheduling,
        }
        model = case.model.name
        inputs = inputs_of(case.candidate, model, case.cluster, case.workload, **kw)
        out.append((f"anchor:{i}:{case.label}", inputs))
    return out


def generated_cases() -> list[tuple[str, dict[str, Any]]]:
    """Candidates drawn for each of STUDIES, and the first few again with each of VARIANTS."""
    out = []
    rng = random.Random(SEED)
    for model, gpu, gpus, per_node, wl, overrides, off_policy, n in STUDIES:
        m = get_model(model)
        cl = Cluster(gpu=get_gpu(gpu), num_gpus=gpus, gpus_per_node=per_node)
        w = get_workload(wl).with_overrides(**overrides)
        space = SearchSpace(model=m, cluster=cl, workload=w, allow_off_policy=off_policy)
        name = f"{Path(model).parent.name or model}-{gpu}x{gpus}-{wl}"
        name += "".join(f"-{k}{v}" for k, v in overrides.items())
        for i in range(n):
            c = sample(RandomSuggester(rng), space)
            out.append((f"{name}:{i}", inputs_of(c, model, cl, w)))
            if i < VARIANT_CANDIDATES:
                for v, kw in enumerate(VARIANTS):
                    out.append((f"{name}:{i}:variant{v}", inputs_of(c, model, cl, w, **kw)))
    return out


def golden() -> dict[str, Any]:
    cases = {}
    for label, inputs in leaderboard_cases() + anchor_cases() + generated_cases():
        if label in cases:
            raise ValueError(f"two cases named {label}")
        cases[label] = {"inputs": inputs, "outputs": outputs_of(run(inputs))}
    return {"schema": SCHEMA, "cases": cases}


def coverage(cases: dict[str, Any]) -> dict[str, int]:
    """How many cases exercise each part of the cost model (printed, to check the spread)."""
    counts: dict[str, int] = {}
    for case in cases.values():
        c = Candidate.from_record(case["inputs"]["candidate"], case["inputs"]["world"])
        lay = c.layout
        marks = {
            "dynamic batching": c.use_dynamic_bsz,
            "fixed micro batches": not c.use_dynamic_bsz,
            "moe (ep > 1)": lay.ep > 1,
            "pp > 1": lay.pp > 1,
            "vpp > 1": lay.vpp > 1,
            "cp > 1": lay.cp > 1,
            "tp > 1": lay.tp > 1,
            "dp > 1": lay.dp > 1,
            "full recompute": c.recompute_granularity == "full",
            "selective recompute": c.recompute_granularity == "selective",
            "param offload": c.param_offload,
            "optimizer offload": c.optimizer_offload,
            "split placement": c.rollout_gpus > 0,
            "estimate kwargs": bool(case["inputs"]["kwargs"]),
            "fits": case["outputs"]["fits"],
            "does not fit": not case["outputs"]["fits"],
        }
        for k, v in marks.items():
            counts[k] = counts.get(k, 0) + bool(v)
    return counts


def main(argv: list[str] | None = None) -> int:
    data = golden()
    if "--keep-inputs" in (sys.argv[1:] if argv is None else argv):
        stored = json.loads(GOLDEN.read_text())["cases"]
        for case in stored.values():
            case["outputs"] = json.loads(json.dumps(outputs_of(run(case["inputs"]))))
        data["cases"] = {**stored, **{k: v for k, v in data["cases"].items() if k not in stored}}
    # one case a line: a change of the numbers shows as the lines of the cases it moves
    lines = [
        f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True, separators=(',', ':'))}"
        for k, v in data["cases"].items()
    ]
    text = f'{{"schema": {SCHEMA}, "cases": {{\n' + ",\n".join(lines) + "\n}}\n"
    write_atomic(GOLDEN, text)
    print(f"{len(data['cases'])} cases -> {GOLDEN.relative_to(REPO)}")
    for k, v in coverage(data["cases"]).items():
        print(f"  {k:22} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
