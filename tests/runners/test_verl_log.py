"""Reading verl runs: step metrics written by verl's own Tracking logger, and failure causes from
recorded logs (tests/data/verl_logs; README.md there says where each one's shape comes from)."""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from tuner.results import Status
from tuner.runners.verl_log import (
    classify,
    last_exception,
    last_step,
    measures,
    read_console,
    read_jsonl,
    root_exception,
)

LOGS = Path(__file__).resolve().parents[1] / "data" / "verl_logs"


def step_metrics(step: int) -> dict[str, float]:
    """Keys and units as verl 0.9's trainer logs them (perf/*, timing_s/*, lengths)."""
    return {
        "training/global_step": step,
        "perf/throughput": 1200.0 + step,
        "perf/time_per_step": 95.0 + step,
        "perf/total_num_tokens": 4_000_000,
        "perf/max_memory_allocated_gb": 61.5,
        "perf/max_memory_reserved_gb": 70.0,
        "perf/mfu/actor": 0.285,
        "timing_s/step": 95.0 + step,
        "timing_s/gen": 41.0,
        "timing_s/old_log_prob": 11.0,
        "timing_s/ref": 10.0,
        "timing_s/update_actor": 27.0,
        "timing_s/update_weights": 3.5,
        "timing_s/reward": 1.25,
        "response_length/mean": 1800.5,
        "prompt_length/mean": 204.0,
    }


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Three steps logged through verl.utils.tracking.Tracking with the file and console
    backends, as the trainer does; returns the JSONL path and the console output."""
    tracking = pytest.importorskip("verl.utils.tracking")
    root = tmp_path_factory.mktemp("logger")
    mp = pytest.MonkeyPatch()
    mp.setenv("VERL_FILE_LOGGER_ROOT", str(root))
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            t = tracking.Tracking(
                project_name="verl-tuner",
                experiment_name="exp",
                default_backend=["console", "file"],
            )
            for step in (1, 2, 3):
                t.log(data=step_metrics(step), step=step)
            t.finish()
    finally:
        mp.undo()
    return root / "verl-tuner" / "exp.jsonl", out.getvalue()


def test_step_3_from_verls_file_logger(verl_run: tuple[Path, str]) -> None:
    jsonl, _ = verl_run
    steps = read_jsonl(jsonl)
    assert sorted(steps) == [1, 2, 3]
    got = measures(steps)
    assert got is not None and got.step == 3
    f = got.fields
    assert f["tokens_per_s_per_gpu"] == 1203.0
    assert f["step_s"] == 98.0
    assert f["generation_s"] == 41.0
    assert f["old_log_prob_s"] == 11.0
    assert f["ref_s"] == 10.0
    assert f["update_actor_s"] == 27.0
    assert f["reshard_s"] == 3.5
    assert f["peak_mem_gib"] == 61.5
    assert f["peak_mem_reserved_gib"] == 70.0
    assert f["verl_mfu_actor_pct"] == pytest.approx(28.5) and "mfu_update_pct" not in f
    assert got.extra["total_num_tokens"] == 4_000_000
    assert got.extra["response_length_mean"] == 1800.5
    assert got.extra["prompt_length_mean"] == 204.0


def test_console_lines_give_the_same_numbers(verl_run: tuple[Path, str]) -> None:
    jsonl, console = verl_run
    # As a Ray job's log shows them: prefixed by the actor, with colour codes.
    ray_log = "".join(
        f"\x1b[36m(TaskRunnerV1 pid=4242)\x1b[0m {line}\n" for line in console.splitlines()
    )
    from_console = read_console(ray_log)
    from_file = read_jsonl(jsonl)
    assert from_console.keys() == from_file.keys()
    for step, data in from_file.items():
        assert from_console[step] == pytest.approx(data)


def test_torn_last_line_and_missing_step(tmp_path: Path, verl_run: tuple[Path, str]) -> None:
    jsonl, _ = verl_run
    lines = jsonl.read_text().splitlines()
    torn = tmp_path / "torn.jsonl"
    torn.write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])
    steps = read_jsonl(torn)
    assert sorted(steps) == [1, 2]
    assert measures(steps) is None
    assert last_step(steps) == 2
    assert read_jsonl(tmp_path / "absent.jsonl") == {}


@pytest.mark.parametrize(
    ("log", "status", "kind", "phase", "fragment"),
    [
        ("oom_update_actor.log", Status.OOM, "oom", "update_actor", "tried to allocate 3.71 GiB"),
        ("oom_ref.log", Status.OOM, "oom", "ref", "CUDA OOM in ref"),
        ("oom_vllm_kv.log", Status.OOM, "oom", "gen", "KV cache"),
        ("oom_vllm_wake_up.log", Status.OOM, "oom", "update_weights", "CUDA Error: out of"),
        ("ray_host_oom.log", Status.OOM, "host-oom", "", "host memory"),
        ("nccl_timeout.log", Status.FAILED, "nccl-timeout", "", "Watchdog caught collective"),
        ("nccl_error.log", Status.FAILED, "nccl-error", "", "unhandled system error"),
        ("ray_actor_died.log", Status.FAILED, "worker-died", "update_actor", "SYSTEM_ERROR"),
        ("config_unknown_key.log", Status.FAILED, "config-error", "", "grad_offload"),
        ("config_validate.log", Status.FAILED, "config-error", "", "TypeError: unsupported"),
    ],
)
def test_failure_causes_from_recorded_logs(
    log: str, status: Status, kind: str, phase: str, fragment: str
) -> None:
    f = classify((LOGS / log).read_text())
    assert f is not None
    assert (f.status, f.kind) == (status, kind)
    if phase:
        assert f.phase == phase
    assert fragment in f.reason
    assert len(f.reason) <= 220 and "\n" not in f.reason


def test_a_missing_module_is_named_with_what_to_do() -> None:
    """The issue's case: Ray wraps a worker's ModuleNotFoundError in RayTaskError; the reason is
    the module and what to do, not the exit code."""
    text = (LOGS / "missing_module.log").read_text()
    f = classify(text)
    assert f is not None and f.kind == "missing-module" and f.status is Status.FAILED
    assert "transfer_queue" in f.reason and "install it where the trials run" in f.reason
    assert last_exception(text) == "ModuleNotFoundError: No module named 'transfer_queue'"


def test_an_agent_loop_error_is_its_cause_not_a_config_error() -> None:
    """Found on the H100: a tokenizer verl's Qwen agent loop refuses fails every rollout; Hydra's
    InstantiationException wraps the cause and verl then stops for want of trajectories. The
    reason is the ValueError, not a 'config error'."""
    text = (LOGS / "agent_loop_error.log").read_text()
    assert classify(text) is None
    assert root_exception(text).startswith("ValueError: Expected Qwen newline to tokenize")


def test_an_import_error_that_is_no_missing_module_is_not_called_one() -> None:
    """`cannot import name` is two versions that do not go together, not a package to install."""
    text = "Traceback (most recent call last):\nImportError: cannot import name 'X' from 'y'\n"
    assert classify(text) is None
    assert root_exception(text) == "ImportError: cannot import name 'X' from 'y'"


def test_the_root_exception_is_the_first_one_a_wrapper_carries() -> None:
    text = (
        "Traceback (most recent call last):\n"
        "ray.exceptions.RayTaskError(ValueError): ray::WorkerDict.init_model()\n"
        "ValueError: hidden_size 100 is not divisible by num_attention_heads 3\n"
        "RuntimeError: the trainer stopped\n"
    )
    assert root_exception(text).startswith("ValueError: hidden_size 100")
    assert root_exception("no exception here\n") == ""


def test_a_clean_log_is_no_failure(verl_run: tuple[Path, str]) -> None:
    _, console = verl_run
    assert classify(console) is None


def test_a_real_h100_runs_metrics_file_gives_every_column() -> None:
    """verl 0.9.1's own file-logger output of an ok trial on one H100 (trial 2 of
    results/verl4k-h100-x1.csv): the actor's memory comes as `actor/perf/max_memory_*`,
    which the row must still read (it was left empty before)."""
    steps = read_jsonl(
        Path(__file__).resolve().parents[1]
        / "data"
        / "verl_metrics"
        / "h100_qwen3-1.7b_trial2.jsonl"
    )
    got = measures(steps)
    assert got is not None and got.step == 3
    f = got.fields
    assert f["tokens_per_s_per_gpu"] == pytest.approx(4295.69, abs=0.01)
    assert f["generation_s"] == pytest.approx(24.0923, abs=1e-4)
    assert f["peak_mem_gib"] == pytest.approx(44.70, abs=0.01)
    assert f["peak_mem_reserved_gib"] == pytest.approx(45.04, abs=0.01)
    assert got.extra["cpu_memory_used_gb"] > 0


def test_a_split_step_that_never_waited_for_its_generation_gives_a_bound_not_a_time() -> None:
    """verl's one-step-off trainer closes `generate_async` when its event loop next runs: where
    the trainer did not wait (`gen` ~ 0), that is the training's time, so the row keeps it as
    generation_at_most_s in `extra` and leaves generation_s empty; where it waited, the
    generation is measured (verl_log.GEN_WAIT_NONE_S)."""
    base = {k: v for k, v in step_metrics(3).items() if k != "timing_s/gen"}
    split = {"timing_s/generate_async": 32.5, "timing_s/sync_rollout_weights": 0.6}
    done = measures({3: {**base, **split, "timing_s/gen": 6.8e-05}})
    waited = measures({3: {**base, **split, "timing_s/gen": 4.0}})
    assert done is not None and waited is not None
    assert "generation_s" not in done.fields
    assert done.extra["generation_at_most_s"] == 32.5 and done.extra["gen_wait_s"] == 6.8e-05
    assert waited.fields["generation_s"] == 32.5 and waited.extra["gen_wait_s"] == 4.0
    assert "generation_at_most_s" not in waited.extra


def test_the_committed_split_runs_generation_is_a_bound() -> None:
    """results/split4k-h200-x2 trial 1 (r1+t1 on 2 x H200): in its steady steps the trainer
    never waited, and generate_async (32.5, 31.8 s) is ref + update (31.8, 31.6 s), not vLLM's
    time; its colocated twin (trial 2) measures generation as every colocated run does."""
    import gzip

    trials = Path(__file__).resolve().parents[2] / "results" / "split4k-h200-x2" / "trials"
    got = {}
    for trial in (1, 2):
        text = gzip.decompress((trials / str(trial) / "verl.log.gz").read_bytes()).decode()
        got[trial] = measures(read_console(text), 3, last=4, num_gpus=2)
    split, colocated = got[1], got[2]
    assert split is not None and colocated is not None
    assert "generation_s" not in split.fields
    assert split.extra["generation_at_most_s"] == pytest.approx(32.14, abs=0.05)
    assert split.extra["gen_wait_s"] < 1e-3
    training = split.fields["ref_s"] + split.fields["update_actor_s"]
    assert split.extra["generation_at_most_s"] == pytest.approx(training, rel=0.03)
    assert colocated.fields["generation_s"] == pytest.approx(20.17, abs=0.05)
