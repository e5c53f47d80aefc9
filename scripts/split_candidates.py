"""The candidates of a placement study (issue 35 item 3): the cost model's best of each placement
(colocated, and the rollout on r = 1 .. N-1 GPUs), each searched on its own with the knobs the
verl runner pins on the kit's hosts (attention_backend auto, gradient_accumulation_fusion off:
tuner/runners/verl_preflight.py), written as a leaderboard of predicted rows that
`tune run --candidates-from` measures, in the order given (by default the best split first).

usage: python scripts/split_candidates.py OUT.csv --model CONFIG --gpus N --gpu KIND WORKLOAD...
(the workload options of `tune run`). The estimator runs each placement's search as a
`tune --runner estimate` study would (warm start with the cost model's search), then keeps that
study's best row.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.estimate import load_profile  # noqa: E402
from tuner.hardware import Cluster, get_gpu  # noqa: E402
from tuner.models import ModelSpec, get_model  # noqa: E402
from tuner.results import read_raw  # noqa: E402
from tuner.runners.estimate import EstimateRunner  # noqa: E402
from tuner.space import SpaceLimits  # noqa: E402
from tuner.study import TuneRequest  # noqa: E402
from tuner.study.loop import run_study  # noqa: E402
from tuner.workload import Workload, get_workload  # noqa: E402

VERL_PINS = (("attention_backend", "auto"), ("gradient_accumulation_fusion", False))


class PinnedEstimate(EstimateRunner):
    """The estimator with the verl runner's pins and one placement."""

    def __init__(self, pins: tuple[tuple[str, object], ...]) -> None:
        super().__init__()
        self.pins = pins

    def space_limits(self, model):  # type: ignore[no-untyped-def]
        return SpaceLimits(pinned=self.pins, why="as the verl runner on the kit's hosts")

    def split_refusal(self) -> str | None:
        return None


def add_setup_args(p: argparse.ArgumentParser) -> None:
    """The study's model, GPUs and workload, as `tune run` names them (this script's and
    scripts/moe_candidates.py's)."""
    p.add_argument("out", type=Path)
    p.add_argument("--model", required=True)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--gpu", default="h200")
    p.add_argument("--workload", default="grpo-short")
    for flag in ("--prompt-len", "--prompt-mean", "--response-len", "--response-mean"):
        p.add_argument(flag, type=int)
    for flag in ("--batch", "--n", "--mini-batch"):
        p.add_argument(flag, type=int)


def setup_of(a: argparse.Namespace, **more: object) -> tuple[ModelSpec, Cluster, Workload]:
    """The model, the one-node cluster and the workload of `add_setup_args`' values (`more`:
    other workload overrides)."""
    model = get_model(a.model)
    cl = Cluster(gpu=get_gpu(a.gpu), num_gpus=a.gpus, gpus_per_node=a.gpus)
    w = get_workload(a.workload).with_overrides(
        prompt_len=a.prompt_len,
        prompt_mean=a.prompt_mean,
        response_len=a.response_len,
        response_mean=a.response_mean,
        batch_size=a.batch,
        n=a.n,
        mini_batch_size=a.mini_batch,
        **more,
    )
    return model, cl, w


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    add_setup_args(p)
    p.add_argument("--trials", type=int, default=40)
    a = p.parse_args(argv)
    model, cl, w = setup_of(a)
    best: list[tuple[int, dict[str, str]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.gpus):
            runner = PinnedEstimate((("rollout_gpus", r), *VERL_PINS))
            req = TuneRequest(
                model=model,
                model_arg=a.model,
                cluster=cl,
                workload=w,
                runner=runner,
                trials=a.trials,
                study_name=f"r{r}",
                results_dir=Path(tmp),
                recipes=0,
                profile=load_profile(None),
                allow_off_policy=True,
            )
            run_study(req)
            rows = [x for x in read_raw(Path(tmp) / f"r{r}.csv") if x["status"] == "ok"]
            if rows:
                top = max(rows, key=lambda x: float(x["tokens_per_s_per_gpu"]))
                best.append((r, top))
                print(
                    f"r={r}: {top['train_parallel']} rollout {top['infer_parallel']} "
                    f"{float(top['tokens_per_s_per_gpu']):.0f} tok/s/gpu predicted, "
                    f"step {float(top['step_s']):.1f} s"
                )
    # the best split first, then the best colocated, then the other splits by prediction
    splits = sorted((x for x in best if x[0]), key=lambda x: -float(x[1]["tokens_per_s_per_gpu"]))
    coloc = [x for x in best if not x[0]]
    order = [*splits[:1], *coloc, *splits[1:]]
    with open(a.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(order[0][1]))
        writer.writeheader()
        for i, (_, row) in enumerate(order):
            writer.writerow({**row, "trial": i, "study": a.out.stem})
    print(f"wrote {a.out}: {len(order)} candidates")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
