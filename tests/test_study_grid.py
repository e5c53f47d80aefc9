"""The hand grid: what a user would try by hand, enqueued once, each candidate what sample()
returns for its params, and measured in the same study as the search."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY, get_model
from tuner.results import read_raw
from tuner.runners.estimate import EstimateRunner
from tuner.runners.megatron import MegatronRunner
from tuner.space import SearchSpace, round_up, sample, validate
from tuner.study import TuneRequest, run_study
from tuner.study.grid import HAND_GRID_ORIGIN, hand_grid, hand_grid_params, plain_layouts
from tuner.workload import PRESETS

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = PRESETS["dapo-math"].with_overrides(
    prompt_len=1024, response_len=8192, response_mean=6000, batch_size=8, n=4, mini_batch_size=8
)


def _space(model: str, gpus: int, runner: object) -> SearchSpace:
    m = get_model(model)
    cl = Cluster(gpu=get_gpu("h200"), num_gpus=gpus, gpus_per_node=gpus)
    limits = runner.space_limits(m)  # type: ignore[attr-defined]
    return SearchSpace(model=m, cluster=cl, workload=WORKLOAD, limits=limits)


def test_dense_grid_is_plain_layouts_times_recompute_times_budget() -> None:
    space = _space("qwen2.5-7b", 2, MegatronRunner())
    grid = hand_grid(space)
    assert [lay.notation for lay in plain_layouts(space)] == ["tp2", "pp2"]
    assert len(grid) == 8
    seq = WORKLOAD.max_seq_len
    for c, label in grid:
        assert validate(c, space.model, space.cluster, space.workload) == []
        assert c.recompute_granularity in ("none", "full")
        assert c.ppo_max_token_len_per_gpu in (round_up(seq, 1024), round_up(2 * seq, 1024))
        assert not (c.param_offload or c.optimizer_offload)
        assert c.layout.notation in label


def test_moe_grid_leaves_out_tensor_parallel_without_sequence_parallel() -> None:
    """Megatron needs sequence parallel for MoE with tp > 1; without transformer-engine the
    megatron runner has none, so the grid starts from expert parallel."""
    model = str(ROOT / "scripts/models/qwen3-30b-moe-8l/config.json")
    space = _space(model, 2, MegatronRunner())
    lays = [lay.notation for lay in plain_layouts(space)]
    if space.limits.sequence_parallel:
        pytest.skip("transformer-engine is installed here: tp2 with sequence parallel is valid")
    assert lays[0] == "ep2" and "tp2" not in lays


def test_grid_params_make_sample_return_the_grid_candidate() -> None:
    space = _space("qwen2.5-7b", 2, EstimateRunner())
    params = hand_grid_params(space)
    assert len({tuple(sorted(p.items())) for p, _ in params}) == len(params)
    for (c, _), (p, origin) in zip(hand_grid(space), params, strict=True):
        assert origin.startswith(HAND_GRID_ORIGIN)
        got = sample(optuna.trial.FixedTrial(p), space)
        assert got.layout == c.layout
        assert got.recompute_granularity == c.recompute_granularity
        assert got.ppo_max_token_len_per_gpu == c.ppo_max_token_len_per_gpu


def test_study_with_hand_grid_runs_each_grid_candidate_once_first(tmp_path: Path) -> None:
    cl = Cluster(gpu=get_gpu("h100"), num_gpus=8)
    req = TuneRequest(
        model=REGISTRY["qwen2.5-7b"],
        model_arg="qwen2.5-7b",
        cluster=cl,
        workload=PRESETS["dapo-math"],
        runner=EstimateRunner(),
        trials=20,
        hand_grid=True,
        results_dir=tmp_path / "results",
        recipes_dir=tmp_path / "recipes",
    )
    run_study(req)
    rows = read_raw(req.csv_path)
    space = SearchSpace(model=req.model, cluster=cl, workload=req.workload)
    n = len(hand_grid_params(space))
    grid_rows = [r for r in rows if r["origin"].startswith(HAND_GRID_ORIGIN)]
    assert len(grid_rows) == n > 0
    assert sorted(int(r["trial"]) for r in grid_rows) == list(range(n))
    # a resumed study does not enqueue the grid again
    run_study(req)
    again = [r for r in read_raw(req.csv_path) if r["origin"].startswith(HAND_GRID_ORIGIN)]
    assert len(again) == n


def test_verl_example_is_scaled_to_the_gpus_and_survives_sampling() -> None:
    from tuner.study.grid import verl_example, verl_example_params

    got = verl_example(_space("qwen2.5-7b", 8, EstimateRunner()))
    assert got is not None
    c, origin = got
    assert (c.layout.tp, c.layout.pp, c.rollout_tp) == (2, 2, 2)
    assert (c.use_dynamic_bsz, c.ppo_micro_batch_size_per_gpu, c.gpu_memory_utilization) == (
        False,
        4,
        0.6,
    )
    assert origin.startswith("hand: verl example") and "tp2pp2" in origin
    one = _space("qwen2.5-7b", 1, EstimateRunner())
    ((params, _),) = verl_example_params(one)
    back = sample(optuna.trial.FixedTrial(params), one)
    assert (back.layout.world, back.ppo_micro_batch_size_per_gpu, back.use_dynamic_bsz) == (
        1,
        4,
        False,
    )


def test_the_verl_example_is_launched_even_where_predicted_not_to_fit(workdir: Path) -> None:
    """What a user writes by hand is measured, not pruned: Qwen2.5-7B on one H100 is predicted
    not to fit, and its row is the runner's result (the estimator's oom), not a prune."""
    m = get_model("qwen2.5-7b")
    req = TuneRequest(
        model=m,
        model_arg="qwen2.5-7b",
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=1),
        workload=WORKLOAD,
        runner=EstimateRunner(),
        trials=1,
        warm_start=False,
        verl_example=True,
        results_dir=workdir / "results",
    )
    run_study(req)
    (row,) = read_raw(req.csv_path)
    assert row["origin"].startswith("hand: verl example")
    assert row["status"] == "oom" and row["source"] == "estimate"
    assert row["pred_fits"] == "False"


VERL_CSV = ROOT / "results" / "verl4k-h100-x1.csv"
VERL_ARGS = [
    "--model", str(ROOT / "scripts" / "models" / "qwen3-1.7b" / "config.json"),
    "--gpus", "1", "--gpus-per-node", "1", "--gpu", "h100", "--workload", "dapo-math",
    "--prompt-len", "256", "--prompt-mean", "256", "--response-len", "4096",
    "--response-mean", "4096", "--batch", "8", "--n", "4", "--mini-batch", "4",
]  # fmt: skip


def test_candidates_from_a_verl_leaderboard_are_measured_first(tmp_path: Path) -> None:
    """The fast runner against real verl: a study measures the ok rows' configurations of the
    committed verl leaderboard first, each the row's knobs (here through the estimator)."""
    from tuner.cli import main
    from tuner.space import Candidate

    verl_ok: dict[str, dict[str, str]] = {}
    for r in read_raw(VERL_CSV):  # each candidate once: repeat rows are its first row's
        if r["status"] == "ok" and Candidate.from_record(r, 1) not in [
            Candidate.from_record(v, 1) for v in verl_ok.values()
        ]:
            verl_ok[r["trial"]] = r
    assert len(verl_ok) < sum(r["status"] == "ok" for r in read_raw(VERL_CSV))  # repeats there
    rc = main(
        ["run", *VERL_ARGS, "--runner", "estimate", "--candidates-from", str(VERL_CSV),
         "--no-warm-start", "--trials", str(len(verl_ok) + 1), "--results-dir", str(tmp_path),
         "--recipes-dir", str(tmp_path / "r"), "--study", "cf", "--no-progress"]
    )  # fmt: skip
    assert rc == 0
    rows = read_raw(tmp_path / "cf.csv")
    firsts = {r["origin"]: r for r in rows[: len(verl_ok)]}
    assert set(firsts) == {f"from verl4k-h100-x1.csv trial {t}" for t in verl_ok}
    for t, vr in verl_ok.items():
        got = Candidate.from_record(firsts[f"from verl4k-h100-x1.csv trial {t}"], 1)
        assert got == Candidate.from_record(vr, 1), t


def test_candidates_from_another_workload_is_one_line_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.cli import main

    args = [a if a != "4096" else "2048" for a in VERL_ARGS]
    out = tmp_path / "res"
    rc = main(
        ["run", *args, "--runner", "estimate", "--candidates-from", str(VERL_CSV),
         "--results-dir", str(out), "--no-progress"]
    )  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "another workload" in err[0] and "max_response_len 4096 (here 2048)" in err[0]
    assert not out.exists()


def test_hand_rollout_is_the_least_parallelism_and_the_largest_utilization() -> None:
    """The published rule (verl docs/perf/perf_tuning.rst): smaller rollout TP, larger
    gpu_memory_utilization; the grid starts each candidate there."""
    from tuner.space import GPU_MEMORY_UTILIZATIONS

    space = _space("qwen2.5-7b", 8, EstimateRunner())
    assert min(space.rollout_tps) < max(space.rollout_tps)
    for c, _ in hand_grid(space):
        assert (c.rollout_tp, c.rollout_dp, c.rollout_ep) == (min(space.rollout_tps), 1, 1)
        assert c.gpu_memory_utilization == max(GPU_MEMORY_UTILIZATIONS)


def _hand_study(
    tmp_path: Path, gpu: str, runner: object, trials: int
) -> tuple[TuneRequest, list[dict[str, str]]]:
    """Qwen2.5-7B on 8 GPUs with the hand grid and no warm start: the request and its hand
    rows."""
    req = TuneRequest(
        model=REGISTRY["qwen2.5-7b"],
        model_arg="qwen2.5-7b",
        cluster=Cluster(gpu=get_gpu(gpu), num_gpus=8),
        workload=PRESETS["dapo-math"],
        runner=runner,  # type: ignore[arg-type]
        trials=trials,
        hand_grid=True,
        warm_start=False,
        results_dir=tmp_path / "results",
    )
    run_study(req)
    rows = [r for r in read_raw(req.csv_path) if r["origin"].startswith(HAND_GRID_ORIGIN)]
    return req, rows


def test_hand_utilization_is_the_largest_not_predicted_oom_in_generation(tmp_path: Path) -> None:
    """Where the cost model says the largest utilization leaves the actor no room in
    generation, the hand row takes the next one down, and says which it passed over."""
    from tuner.space import GPU_MEMORY_UTILIZATIONS

    req, rows = _hand_study(tmp_path, "h100", EstimateRunner(), 8)
    cl = req.cluster
    lowered = [r for r in rows if float(r["gpu_memory_utilization"]) < max(GPU_MEMORY_UTILIZATIONS)]
    assert lowered, "the 7B on 8 H100 is predicted not to fit generation at 0.8"
    for r in lowered:
        assert "predicted OOM in generation" in r["origin"]
        assert "in generation" not in r["reason"]  # the lowered one is not a generation OOM
    assert all(
        r["rollout_tp"]
        == str(min(SearchSpace(model=req.model, cluster=cl, workload=req.workload).rollout_tps))
        for r in rows
    )


def test_a_hand_trial_that_ran_out_of_memory_in_generation_is_retried_one_step_lower() -> None:
    from tuner.results import Status, TrialRecord
    from tuner.study.grid import hand_retry_params

    p = {"gpu_memory_utilization": 0.7, "recompute": "none"}
    origin = f"{HAND_GRID_ORIGIN}: tp1 recompute none budget 1x"

    def rec(status: Status, reason: str, from_: str = origin) -> TrialRecord:
        return TrialRecord(study="s", trial=0, status=status, reason=reason, origin=from_)

    why = "generation: CUDA out of memory. Tried to allocate 2.0 GiB"
    gen_oom = rec(Status.OOM, why)
    got = hand_retry_params(p, gen_oom)
    assert got is not None
    params, new_origin = got
    assert params == {"gpu_memory_utilization": 0.6, "recompute": "none"}
    assert new_origin.startswith(origin) and "0.6 after OOM in generation at 0.7" in new_origin
    # a second retry keeps the first label, not a chain of notes
    again = hand_retry_params(params, rec(Status.OOM, why, new_origin))
    assert again is not None and again[1].count("after OOM") == 1
    verl_oom = rec(Status.OOM, "CUDA OOM in gen: Tried to allocate 1.2 GiB")
    assert hand_retry_params(p, verl_oom) is not None
    # not: another phase, a sync peak, a KV cache too small, a searched trial, the lowest one
    assert hand_retry_params(p, rec(Status.OOM, "update_actor: CUDA out of memory")) is None
    sync = rec(Status.PRUNED_OOM, "predicted verl's weight sync holds 70 GiB whatever ...")
    assert hand_retry_params(p, sync) is None
    kv = rec(Status.PRUNED_OOM, "KV cache holds no full sequence")
    assert hand_retry_params(p, kv) is None
    assert hand_retry_params(p, rec(Status.OOM, why, "estimator")) is None
    assert hand_retry_params({**p, "gpu_memory_utilization": 0.4}, gen_oom) is None
    assert hand_retry_params(p, rec(Status.OK, "")) is None


class _GenerationOOMAbove(EstimateRunner):
    """The estimator, except that generation runs out of memory above a utilization: what a
    GPU shows and a CPU cannot (the retry is the loop's, whatever the runner)."""

    def run(self, spec):  # type: ignore[no-untyped-def]
        from tuner.results import Status, TrialResult

        if spec.candidate.gpu_memory_utilization > 0.6:
            return TrialResult(
                status=Status.OOM, source="estimate", reason="generation: CUDA out of memory"
            )
        return super().run(spec)


def test_a_study_retries_the_hand_trial_lower_after_a_measured_generation_oom(
    tmp_path: Path,
) -> None:
    _, rows = _hand_study(tmp_path, "h200", _GenerationOOMAbove(), 40)
    first = [r for r in rows if "after OOM" not in r["origin"]]
    assert first and all(
        r["status"] == "oom" for r in first if float(r["gpu_memory_utilization"]) > 0.6
    )
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(r["gpu_memory_utilization"] == "0.6" for r in ok)
    assert all("after OOM in generation" in r["origin"] for r in ok)


def test_the_hand_utilization_note_names_only_the_values_passed_over() -> None:
    from tuner.space import GPU_MEMORY_UTILIZATIONS
    from tuner.study.grid import largest_utilization

    (c, _), *_ = hand_grid(_space("qwen2.5-7b", 8, EstimateRunner()))
    oom = "gpu_memory_utilization(0.80) leaves no room for the actor"
    top = max(GPU_MEMORY_UTILIZATIONS)
    got, note = largest_utilization(c, lambda cu: oom if cu.gpu_memory_utilization == top else "")
    assert got.gpu_memory_utilization < top and note.endswith(
        f"({top:g} predicted OOM in generation)"
    )
    got, note = largest_utilization(c, lambda cu: "")
    assert got.gpu_memory_utilization == top and note == ""
    got, note = largest_utilization(c, lambda cu: oom)
    low = min(GPU_MEMORY_UTILIZATIONS)
    assert got.gpu_memory_utilization == low
    assert (
        note == f", gpu_memory_utilization {low:g} (every one offered predicted OOM in generation)"
    )


MOE20 = str(ROOT / "scripts" / "models" / "qwen3-30b-a3b-20l" / "config.json")
MOE_WORKLOAD = PRESETS["grpo-short"].with_overrides(
    prompt_len=512, prompt_mean=512, response_len=2048, response_mean=2048, batch_size=32, n=4,
    mini_batch_size=8,
)  # fmt: skip


def _moe_space(gpus: int, pinned: tuple[tuple[str, object], ...] = ()) -> SearchSpace:
    from tuner.space import SpaceLimits

    cl = Cluster(gpu=get_gpu("h200"), num_gpus=gpus, gpus_per_node=gpus)
    limits = SpaceLimits(pinned=pinned, why="as the verl runner's preflight")
    return SearchSpace(model=get_model(MOE20), cluster=cl, workload=MOE_WORKLOAD, limits=limits)


def test_a_moe_model_gets_verls_moe_example_scaled_to_the_gpus() -> None:
    """Issue 37 item 2: --verl-example on a MoE model is verl's Qwen3-30B-A3B example
    (ep8, rollout tp4, full offload, one-sample token budgets, gpu_memory_utilization 0.7,
    eager vLLM, grouped GEMM, fused permute, DeepEP's flex dispatcher), its ep8 halved to the
    study's GPUs; a knob the runner pins runs as pinned and the origin says so; sample() gives
    back the same candidate from its params."""
    from tuner.study.grid import VERL_MOE_EXAMPLE, verl_example, verl_example_params

    space = _moe_space(4)
    got = verl_example(space)
    assert got is not None
    c, origin = got
    assert (c.layout.notation, c.layout.ep, c.layout.etp, c.rollout_tp) == ("ep4", 4, 1, 4)
    assert (c.param_offload, c.optimizer_offload, c.use_fused_kernels) == (True, True, False)
    assert c.use_dynamic_bsz and c.ppo_max_token_len_per_gpu == round_up(2560, 1024)
    assert c.log_prob_max_token_len_per_gpu == c.ppo_max_token_len_per_gpu
    assert (c.gpu_memory_utilization, c.enforce_eager) == (0.7, True)
    assert c.max_num_batched_tokens == 2560
    assert (c.moe_token_dispatcher_type, c.moe_grouped_gemm, c.moe_permute_fusion) == (
        "flex",
        True,
        True,
    )
    assert c.recompute_granularity == "none"
    assert origin == f"hand: verl example ({VERL_MOE_EXAMPLE} as ep4, rollout tp4)"
    ((params, _),) = verl_example_params(space)
    assert sample(optuna.trial.FixedTrial(params), space) == c

    pins = (("moe_token_dispatcher_type", "alltoall"), ("gradient_accumulation_fusion", False))
    pinned = _moe_space(4, pins)
    c2, origin2 = verl_example(pinned) or (None, "")
    assert c2 is not None and c2.moe_token_dispatcher_type == "alltoall"
    assert not c2.gradient_accumulation_fusion
    pinned_note = "pinned here: moe_token_dispatcher_type alltoall, gradient_accumulation_fusion"
    assert f"{pinned_note} False" in origin2
    ((params2, _),) = verl_example_params(pinned)
    assert sample(optuna.trial.FixedTrial(params2), pinned) == c2
    two = verl_example(_moe_space(2))
    assert two is not None and (two[0].layout.notation, two[0].rollout_tp) == ("ep2", 2)


def test_the_committed_moe_candidates_are_ones_the_moe_study_measures() -> None:
    """scripts/moe2k-h200-x4.candidates.csv (scripts/moe_candidates.py) is what
    scripts/gpu_moe_study.sh passes to --candidates-from: its rows are of the study's model,
    GPUs and workload, inside the space the verl runner's pins leave, and hold >= 2 EP sizes."""
    from tuner.space import Candidate
    from tuner.study.grid import candidates_from_params

    pins = (
        ("attention_backend", "auto"),
        ("gradient_accumulation_fusion", False),
        ("moe_token_dispatcher_type", "alltoall"),
    )
    space = _moe_space(4, pins)
    path = ROOT / "scripts" / "moe2k-h200-x4.candidates.csv"
    got = candidates_from_params(path, space)
    assert len(got) >= 5
    eps = {Candidate.from_record(r, 4).layout.ep for r in read_raw(path)}
    assert len(eps) >= 2
    for params, _ in got:
        assert not validate(sample(optuna.trial.FixedTrial(params), space), *_moe_args())


def _moe_args() -> tuple[object, object, object]:
    s = _moe_space(4)
    return s.model, s.cluster, s.workload
