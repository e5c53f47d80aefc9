"""The `--runner verl` preflight and its settings: the real probe program runs with this Python
(verl 0.9.1 and Hydra are real here; vLLM, megatron-core, transformer-engine and the bridges
cannot install on a CPU with Python 3.11, so small stand-in packages with real metadata play
them, put first on PYTHONPATH), then the CLI: exit 2, one line, no file written."""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from pathlib import Path

import pytest

from tuner import verl_command
from tuner.cli import main
from tuner.errors import UserError
from tuner.export import export_recipe
from tuner.runners.verl import VerlRunner
from tuner.runners.verl_preflight import preflight
from tuner.verl_settings import VerlSettings

pytestmark = [
    pytest.mark.verl,
    pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="needs verl"),
]
TORCH = __import__("importlib.metadata").metadata.version("torch").split("+")[0]


def _package(site: Path, dist: str, version: str, files: dict[str, str], requires=()) -> None:
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    meta = ["Metadata-Version: 2.1", f"Name: {dist}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)


def stand_ins(
    site: Path,
    *,
    vllm: str = "0.24.0",
    te: bool = True,
    mbridge_old: bool = False,
    flashinfer: bool = False,
    deep_ep: bool = False,
) -> Path:
    """vLLM, megatron-core (with its ModelType enum), transformer-engine and both bridges."""
    _package(site, "vllm", vllm, {"vllm/__init__.py": ""}, requires=[f"torch=={TORCH}"])
    enums = "import enum\nclass ModelType(enum.Enum):\n    encoder_or_decoder = 1\n"
    _package(
        site,
        "megatron-core",
        "0.19.2",
        {"megatron/core/__init__.py": "", "megatron/core/enums.py": enums},
    )
    _package(site, "megatron-bridge", "0.6.2", {"megatron/bridge/__init__.py": ""})
    util = "x = ModelType.encoder_and_decoder\n" if mbridge_old else "x = 1\n"
    _package(
        site,
        "mbridge",
        "0.15.1",
        {"mbridge/__init__.py": "", "mbridge/core/__init__.py": "", "mbridge/core/util.py": util},
    )
    if te:
        _package(
            site,
            "transformer-engine",
            "2.20.2",
            {"transformer_engine/__init__.py": "", "transformer_engine/pytorch/__init__.py": ""},
        )
    if flashinfer:
        _package(site, "flashinfer-python", "0.5.0", {"flashinfer/__init__.py": ""})
    if deep_ep:
        _package(site, "deep-ep", "1.2.1", {"deep_ep/__init__.py": ""})
    return site


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Make a stand-in site with the given options and put it first on PYTHONPATH."""

    def make(**kw: object) -> Path:
        site = stand_ins(tmp_path / f"site{len(list(tmp_path.iterdir()))}", **kw)  # type: ignore[arg-type]
        monkeypatch.setenv("PYTHONPATH", str(site))
        return site

    return make


def test_a_complete_host_passes_and_says_what_trials_need(host) -> None:
    host()
    pf = preflight(sys.executable, VerlSettings(bridge="mbridge"))
    assert pf.versions["verl"] == "0.9.1" and pf.versions["vllm"] == "0.24.0"
    assert pf.env == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}  # no flashinfer on this host
    # no flash_attn, no APEX extension, no DeepEP either
    assert pf.pinned == (
        ("attention_backend", "auto"),
        ("gradient_accumulation_fusion", False),
        ("moe_token_dispatcher_type", "alltoall"),
    )
    assert "megatron-core=0.19.2" in pf.versions_text


def test_the_moe_dispatcher_is_free_where_deepep_imports(host) -> None:
    """Issue 37: verl's MoE example sets the flex dispatcher, which megatron-core runs on DeepEP;
    a host without it pins alltoall (above) instead of failing each flex trial at model build."""
    host(deep_ep=True)
    pf = preflight(sys.executable, VerlSettings(bridge="mbridge"))
    assert "moe_token_dispatcher_type" not in dict(pf.pinned)


def test_flashinfer_present_needs_no_environment(host) -> None:
    host(flashinfer=True)
    assert preflight(sys.executable, VerlSettings(bridge="mbridge")).env == {}


@pytest.mark.parametrize(
    ("kw", "settings", "fragment"),
    [
        ({"vllm": "0.23.1"}, {}, "vLLM 0.23.1"),
        ({"te": False}, {}, "transformer-engine"),
        ({"mbridge_old": True}, {"bridge": "mbridge"}, "ModelType.encoder_and_decoder"),
        (
            {},
            {"bridge": "mbridge", "overrides": (("actor_rollout_ref.actor.nope", "1"),)},
            "Could not override 'actor_rollout_ref.actor.nope'",
        ),
    ],
)
def test_what_would_fail_a_trial_is_one_line_before_it(host, kw, settings, fragment) -> None:
    host(**kw)
    with pytest.raises(UserError) as e:
        preflight(sys.executable, VerlSettings(**settings))
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_no_vllm_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with pytest.raises(UserError, match=r"vLLM 0\.24\.0 \(verl 0\.9\.1's pin\) does not import"):
        preflight(sys.executable, VerlSettings())


def test_verls_default_bridge_missing_says_which_to_install(host, tmp_path: Path) -> None:
    site = host()
    (site / "megatron" / "bridge" / "__init__.py").write_text("raise ImportError('broken')\n")
    with pytest.raises(UserError, match="megatron-bridge bridge does not import.*--verl-bridge"):
        preflight(sys.executable, VerlSettings())


def test_an_override_of_a_key_the_tuner_sets_is_refused() -> None:
    ov = VerlSettings.parse(
        bridge=None, overrides=["actor_rollout_ref.rollout.gpu_memory_utilization=0.9"]
    )
    with pytest.raises(UserError, match="knob gpu_memory_utilization"):
        VerlRunner(model_path="/m", settings=ov)


@pytest.mark.parametrize(
    ("overrides", "env", "fragment"),
    [
        (["no_equals_sign"], [], "give KEY=VALUE"),
        (["a.b=1", "+a.b=2"], [], "given twice"),
        ([], ["1BAD=x"], "give NAME=VALUE"),
    ],
)
def test_settings_refuse_bad_text(overrides, env, fragment) -> None:
    with pytest.raises(UserError, match=fragment):
        VerlSettings.parse(bridge=None, overrides=overrides, env=env)


def test_settings_round_trip_through_a_row_and_into_the_command() -> None:
    s = VerlSettings.parse(
        bridge="mbridge",
        overrides=["+actor_rollout_ref.rollout.engine_kwargs.vllm.x='a b'", "trainer.seed=7"],
        env=["VLLM_USE_FLASHINFER_SAMPLER=0", "A=has space"],
    )
    assert VerlSettings.from_record(s.record()) == s
    assert VerlSettings.from_record({"verl_bridge": ""}) is None
    args = s.override_args()
    assert args[0] == "actor_rollout_ref.actor.megatron.vanilla_mbridge=True"
    assert "+actor_rollout_ref.rollout.engine_kwargs.vllm.x='a b'" in args
    assert verl_command.format_value(verl_command.Raw("'a b'")) == "'a b'"


def test_cli_refuses_an_unknown_override_key_before_anything(
    host,
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's user: --runner verl with an unknown --verl-override is exit 2 and one line,
    and no results folder, storage or trial exists afterwards (a stand-in nvidia-smi shows the
    one GPU asked for)."""
    host()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\necho "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    model = tmp_path / "model"
    model.mkdir()
    before = sorted(p.name for p in workdir.iterdir())
    code = main(
        [
            "--runner", "verl", "--model", "qwen2.5-7b", "--model-path", str(model),
            "--gpus", "1", "--gpus-per-node", "1", "--verl-bridge", "mbridge",
            "--verl-override", "actor_rollout_ref.rollout.not_a_key=1", "--trials", "1",
        ]
    )  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "not_a_key" in err, err
    assert sorted(p.name for p in workdir.iterdir()) == before


def test_an_exported_verl_row_runs_what_the_row_ran(workdir: Path) -> None:
    """A row's bridge, overrides and environment come back in `tune export`'s recipe."""
    from tuner.hardware import Cluster, get_gpu
    from tuner.models import get_model
    from tuner.results import Status, TrialRecord, csv_text
    from tuner.space import Candidate, ParallelLayout
    from tuner.study.objective import candidate_fields

    s = VerlSettings.parse(
        bridge="mbridge",
        overrides=["actor_rollout_ref.rollout.free_cache_engine=True"],
        env=["VLLM_USE_FLASHINFER_SAMPLER=0"],
    )
    m, cl = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=1)
    c = Candidate(layout=ParallelLayout(world=1))
    rec = TrialRecord(
        study="s", trial=0, status=Status.OK, source="verl", runner="verl", model=m.name,
        gpu="h100", num_gpus=1, gpus_per_node=1, workload="grpo-short", algorithm="grpo",
        max_prompt_len=512, max_response_len=1024, bs=8, mini_bs=8, n=2,
        tokens_per_s_per_gpu=100.0, **candidate_fields(c), **s.record(),
    )  # fmt: skip
    csv = workdir / "s.csv"
    csv.write_text(csv_text([rec.to_row()]))
    path = export_recipe(csv, recipes_dir=workdir / "recipes")
    text = path.read_text()
    assert "export VLLM_USE_FLASHINFER_SAMPLER=0" in text
    assert "actor_rollout_ref.actor.megatron.vanilla_mbridge=True" in text
    assert "actor_rollout_ref.rollout.free_cache_engine=True" in text
    assert "bridge mbridge" in text
    assert cl.num_gpus == 1 and shlex.split(rec.verl_env) == ["VLLM_USE_FLASHINFER_SAMPLER=0"]


def test_on_a_cluster_the_overrides_are_composed_here() -> None:
    """--launcher slurm: the nodes' packages are the first trial's business, but an unknown
    --verl-override is refused before anything is submitted (this Python's verl composes it)."""
    from tuner.runners.launchers import SlurmLauncher

    bad = VerlSettings.parse(bridge=None, overrides=["actor_rollout_ref.rollout.no_such=1"])
    r = VerlRunner(model_path="/m", launcher=SlurmLauncher(partition="p"), settings=bad)
    with pytest.raises(UserError, match="no_such"):
        r.preflight()
    ok = VerlSettings.parse(
        bridge=None, overrides=["actor_rollout_ref.rollout.free_cache_engine=True"]
    )
    r = VerlRunner(model_path="/m", launcher=SlurmLauncher(partition="p"), settings=ok)
    assert r.preflight() is None


def test_the_bridge_is_set_by_its_option_not_an_override() -> None:
    """An override of vanilla_mbridge would make the row's verl_bridge lie."""
    for key in ("actor_rollout_ref.actor.megatron", "critic.megatron"):
        with pytest.raises(UserError, match="use --verl-bridge"):
            VerlSettings.parse(bridge="mbridge", overrides=[f"{key}.vanilla_mbridge=False"])


def test_a_study_made_before_the_dispatcher_pin_resumes_under_it() -> None:
    """The committed verl studies (results/verl4k-h100-x1.sqlite3: Qwen3-1.7B, the H100's pins
    attention_backend and gradient_accumulation_fusion) were made before the DeepEP pin; the pin
    is the Candidate's default, so the study loop resumes them (SearchSpace.added_since)."""
    from tuner.hardware import Cluster, get_gpu
    from tuner.models import get_model
    from tuner.space import SearchSpace, SpaceLimits
    from tuner.workload import get_workload

    root = Path(__file__).resolve().parents[2]
    m = get_model(str(root / "scripts" / "models" / "qwen3-1.7b" / "config.json"))
    cl = Cluster(gpu=get_gpu("h100"), num_gpus=1, gpus_per_node=1)
    w = get_workload("dapo-math").with_overrides(
        prompt_len=256, prompt_mean=256, response_len=4096, response_mean=4096, batch_size=8,
        n=4, mini_batch_size=4,
    )  # fmt: skip
    old = (("attention_backend", "auto"), ("gradient_accumulation_fusion", False))
    new = (*old, ("moe_token_dispatcher_type", "alltoall"))
    before = SearchSpace(model=m, cluster=cl, workload=w, limits=SpaceLimits(pinned=old))
    after = SearchSpace(model=m, cluster=cl, workload=w, limits=SpaceLimits(pinned=new))
    assert after.fingerprint() != before.fingerprint()
    assert after.added_since(before.fingerprint()) == ["moe_token_dispatcher_type"]
