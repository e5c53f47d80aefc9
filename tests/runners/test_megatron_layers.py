"""The megatron runner's layers, te or local (tuner.megatron_layers), on a CPU: the spec carries
them and the candidate's kernels, the runner chooses te where transformer_engine imports (a real
package of that name on sys.path stands in for it), `--layer-spec te` without it is one line and
exit 2, the te layers' pins, and the packing verl does for TE. No megatron import."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.errors import UserError
from tuner.estimate import estimate
from tuner.hardware import Cluster, get_gpu
from tuner.megatron_layers import TE_MEASURED, layer_spec_pins, resolve_layer_spec, te_present
from tuner.models import get_model
from tuner.runners import pinned_knobs
from tuner.runners.base import TrialSpec
from tuner.runners.megatron import MEGATRON_PINNED, MegatronRunner, worker_spec
from tuner.runners.megatron_worker import KernelCfg, WorkerSpec, spec_to_dict
from tuner.runners.megatron_worker.model import config_kwargs
from tuner.runners.megatron_worker.trial import cp_positions, te_padded_lengths
from tuner.runners.process import run_process
from tuner.space import Candidate, ParallelLayout
from tuner.workload import get_workload

CONFIG = Path(__file__).resolve().parents[2] / "scripts" / "models" / "qwen3-1.7b" / "config.json"


@pytest.fixture
def with_te(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real package named transformer_engine on sys.path (the runner only asks whether it
    imports; it never imports it)."""
    site = tmp_path / "site"
    (site / "transformer_engine").mkdir(parents=True)
    (site / "transformer_engine" / "__init__.py").write_text("__version__ = '2.20.2'\n")
    monkeypatch.syspath_prepend(str(site))
    assert te_present()
    return site


def moe_trial(tmp: Path, layout: ParallelLayout | None = None, **cand: object) -> TrialSpec:
    m, cl = get_model("qwen3-30b-moe"), Cluster(gpu=get_gpu("h100"), num_gpus=8)
    w = get_workload("dapo-math")
    c = Candidate(
        layout=layout or ParallelLayout(world=8, pp=2, ep=4),
        ppo_max_token_len_per_gpu=12288,
        log_prob_max_token_len_per_gpu=12288,
        **cand,  # type: ignore[arg-type]
    )
    return TrialSpec(
        number=1, candidate=c, model=m, cluster=cl, workload=w, trial_dir=tmp / "trials" / "1",
        timeout_s=60.0, prediction=estimate(c, m, cl, w), seed=3,
    )  # fmt: skip


def test_the_te_spec_round_trips_with_the_candidates_kernels():
    t = moe_trial(Path("/nonexistent"), apply_rope_fusion=True, moe_grouped_gemm=False)
    d = worker_spec(t.candidate, t.model, t.cluster, t.workload, seed=3, layer_spec="te")
    s = WorkerSpec.from_dict(json.loads(json.dumps(d)))
    assert s.layer_spec == "te"
    assert s.kernels == KernelCfg(
        apply_rope_fusion=True,
        bias_activation_fusion=True,
        moe_grouped_gemm=False,
        moe_permute_fusion=True,
        attention_backend="flash",
    )
    assert WorkerSpec.from_dict(spec_to_dict(s)) == s
    # the worker builds the config with them (te only)
    kw = config_kwargs(s)
    assert (kw["apply_rope_fusion"], kw["bias_activation_fusion"]) == (True, True)
    assert (kw["moe_grouped_gemm"], kw["moe_permute_fusion"], kw["attention_backend"]) == (
        False, True, "flash")  # fmt: skip


def test_the_local_spec_and_its_config_are_what_they_were():
    t = moe_trial(Path("/nonexistent"), apply_rope_fusion=True, bias_activation_fusion=True)
    d = worker_spec(t.candidate, t.model, t.cluster, t.workload, seed=3)
    s = WorkerSpec.from_dict(d)
    assert s.layer_spec == "local"
    kw = config_kwargs(s)
    assert "attention_backend" not in kw
    assert not (kw["apply_rope_fusion"] or kw["bias_activation_fusion"])
    assert not (kw["moe_grouped_gemm"] or kw["moe_permute_fusion"])
    # a spec written before the layers were named is the local one, unchanged
    old = {k: v for k, v in d.items() if k not in ("layer_spec", "kernels")}
    assert config_kwargs(WorkerSpec.from_dict(old)) == kw


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"layer_spec": "transformer-engine"}, r"\[layer_spec\] layer_spec 'transformer-engine'"),
        ({"kernels": {"attention_backend": "sdpa"}}, "kernels.attention_backend 'sdpa'"),
        ({"kernels": {"apply_rope_fusion": 1}}, "kernels.apply_rope_fusion must be true or"),
    ],
)
def test_bad_layer_fields_say_what_is_wrong(patch: dict, message: str):
    t = moe_trial(Path("/nonexistent"))
    d = worker_spec(t.candidate, t.model, t.cluster, t.workload, seed=3, layer_spec="te")
    with pytest.raises(ValueError, match=message):
        WorkerSpec.from_dict({**d, **patch})


def test_context_parallel_needs_the_te_layers():
    m, cl = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=8)
    c = Candidate(
        layout=ParallelLayout(world=8, tp=2, cp=2),
        sequence_parallel=True,
        ppo_max_token_len_per_gpu=12288,
        log_prob_max_token_len_per_gpu=12288,
    )
    w = get_workload("dapo-math")
    assert WorkerSpec.from_dict(worker_spec(c, m, cl, w, layer_spec="te")).layout.cp == 2
    with pytest.raises(ValueError, match=r"cp \(2\) needs the transformer-engine layers"):
        worker_spec(c, m, cl, w)


def test_te_packing_is_verls():
    # verl's preprocess_packed_seqs: each sequence to a multiple of tp, of tp*cp*2 with cp
    assert te_padded_lengths([5, 8, 1], tp=1, cp=1) == [5, 8, 1]
    assert te_padded_lengths([5, 8, 1], tp=2, cp=1) == [6, 8, 2]
    assert te_padded_lengths([5, 8, 17], tp=2, cp=2) == [8, 8, 24]
    padded = te_padded_lengths([37, 300, 5], tp=2, cp=4)
    assert all(n % 16 == 0 for n in padded)
    # the cp ranks' chunks cover every padded sequence once, each rank the same share of each
    held = [cp_positions(padded, 4, r) for r in range(4)]
    for i, n in enumerate(padded):
        spans = [x for rank in held for x in rank[2 * i : 2 * i + 2]]
        assert sorted(p for span in spans for p in span) == list(range(n))
    assert {sum(len(x) for x in rank) for rank in held} == {sum(padded) // 4}
    assert held[0][:2] == [range(0, 6), range(42, 48)]  # chunks 0 and 7 of 8 (37 -> 48 tokens)
    assert cp_positions([6, 2], 1, 0) == [range(6), range(2)]


def test_auto_chooses_te_where_transformer_engine_imports(with_te: Path):
    r = MegatronRunner()
    assert r.layer_spec == "te" and MegatronRunner(layer_spec="local").layer_spec == "local"
    m = get_model(str(CONFIG))
    limits = r.space_limits(m)
    assert limits.context_parallel and limits.sequence_parallel
    pins = dict(limits.pinned)
    assert not set(TE_MEASURED) & set(pins)
    assert pins["attention_backend"] == "auto" and pins["gradient_accumulation_fusion"] is False
    assert pins["rollout_tp"] == 1  # generation is still pinned: not measured here
    local = MegatronRunner(layer_spec="local").space_limits(m)
    assert local.pinned == MEGATRON_PINNED and not local.context_parallel
    assert local.why.startswith("--layer-spec local")
    assert limits.summary != local.summary  # a local study does not resume as a te one


def test_auto_chooses_local_without_transformer_engine():
    r = MegatronRunner()
    assert r.layer_spec == "local"
    limits = r.space_limits(get_model(str(CONFIG)))
    assert limits.pinned == MEGATRON_PINNED
    assert not (limits.context_parallel or limits.sequence_parallel)
    with pytest.raises(UserError, match="--layer-spec te needs transformer-engine"):
        MegatronRunner(layer_spec="te")
    with pytest.raises(UserError, match="is not one of auto, te, local"):
        resolve_layer_spec("apex")


def test_layer_spec_te_without_it_is_exit_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    args = ["--model", str(CONFIG), "--gpus", "1", "--runner", "megatron", "--layer-spec", "te",
            "--results-dir", "r", "--recipes-dir", "rc"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--layer-spec te needs transformer-engine" in err and "--layer-spec local" in err
    assert list(tmp_path.iterdir()) == []
    args[5] = "estimate"
    assert main([*args[:7], "local"]) == 2
    err = capsys.readouterr().err
    assert "--layer-spec local applies to the megatron runner" in err
    assert list(tmp_path.iterdir()) == []


def test_a_te_row_names_its_layers_and_its_pins(tmp_path: Path, with_te: Path):
    """A te trial whose worker dies without a result: the row still says which layers it ran,
    and the pins its recipe lists are the te layers'."""
    script = tmp_path / "dies.py"
    script.write_text("import sys; print('RuntimeError: boom', flush=True); sys.exit(1)\n")

    def launch(cmd: list[str], **kw: object) -> object:
        return run_process([sys.executable, str(script)], **kw)  # type: ignore[arg-type]

    t = moe_trial(tmp_path)
    row = MegatronRunner(launch=launch).run(t)  # type: ignore[arg-type]
    spec = json.loads((t.trial_dir / "spec.json").read_text())
    assert spec["layer_spec"] == "te" and spec["kernels"]["moe_grouped_gemm"] is True
    assert row.extra["layer_spec"] == "te" and "boom" in row.reason
    te_pins = layer_spec_pins(MEGATRON_PINNED, "te")
    assert pinned_knobs("megatron", row.extra) == te_pins
    assert pinned_knobs("megatron", "seed=0;layer_spec=te;wall_s=1") == te_pins
    # rows of the local layers, and rows from before the layers were recorded
    assert pinned_knobs("megatron", "layer_spec=local") == MEGATRON_PINNED
    assert pinned_knobs("megatron", "seed=0") == MEGATRON_PINNED


def test_the_te_pins_follow_the_local_ones():
    """Another knob pinned for the local layers stays pinned for te (one list)."""
    extra = (*MEGATRON_PINNED, ("some_new_knob", 3))
    assert layer_spec_pins(extra, "te")[-1] == ("some_new_knob", 3)
    assert layer_spec_pins(extra, "local") == extra
