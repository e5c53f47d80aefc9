"""A split candidate's command (issue 29 item 3) composes against verl 0.9.1's own
one-step-off-policy config (`one_step_off_ppo_megatron_trainer`) from any working directory,
passes the checks verl runs before Ray starts, and sets what its trainer asserts."""

from __future__ import annotations

import importlib.util
import os
import random
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tuner import verl_command
from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.space import Candidate, RandomSuggester, SearchSpace, sample, validate
from tuner.workload import get_workload

pytestmark = pytest.mark.verl
hydra = pytest.importorskip("hydra")
verl = pytest.importorskip("verl")

SPLIT_DIR = Path(verl.__file__).parent / "experimental" / "one_step_off_policy" / "config"
SETUPS = (("qwen2.5-7b", 4, 8), ("qwen3-30b-moe", 16, 8), ("llama3.1-8b", 2, 8))


def _helpers() -> Any:
    path = Path(__file__).resolve().parents[0] / "verl_helpers.py"
    spec = importlib.util.spec_from_file_location("verl_helpers", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


H = _helpers()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return H.write_tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[list[str]], Any]]:
    """verl's split config, composed from a folder that holds no verl/trainer/config (as the
    runner's trial folder), so only the tuner's search path can find ppo_megatron_trainer."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("elsewhere"))
    try:
        with initialize_config_dir(config_dir=str(SPLIT_DIR), version_base=None):
            yield lambda ov: hydra_compose(config_name=verl_command.SPLIT_CONFIG_NAME, overrides=ov)
    finally:
        os.chdir(here)


def _splits() -> list[tuple[Candidate, Any, Cluster, Any]]:
    rng = random.Random(29)
    out = []
    for name, gpus, per_node in SETUPS:
        m = get_model(name)
        cl = Cluster(gpu=get_gpu("h100"), num_gpus=gpus, gpus_per_node=per_node)
        for wname in ("grpo-short", "dapo-math", "ppo-gsm8k"):
            w = get_workload(wname)
            space = SearchSpace(model=m, cluster=cl, workload=w, allow_off_policy=True)
            got = [c for c in (sample(RandomSuggester(rng), space) for _ in range(40))]
            out += [(c, m, cl, w) for c in got if c.rollout_gpus][:3]
    return out


SPLITS = _splits()


def _overrides(c: Candidate, m: Any, cl: Cluster, w: Any, model_dir: Path) -> dict[str, Any]:
    return verl_command.overrides(
        c,
        m,
        cl,
        w,
        model_path=str(model_dir),
        train_file="/data/synthetic/train.parquet",
        reward_fn="/data/synthetic/reward.py",
        nnodes=cl.num_nodes,
        experiment="split-test",
    )


def test_the_sample_holds_splits_of_every_setup() -> None:
    assert {cl.num_gpus for _, _, cl, _ in SPLITS} == {g for _, g, _ in SETUPS}
    assert {c.rollout_gpus for c, *_ in SPLITS} >= {1, 8}
    for c, m, cl, w in SPLITS:
        assert not validate(c, m, cl, w)


def test_without_the_search_path_verl_s_config_is_not_found(
    compose: Callable[[list[str]], Any],
) -> None:
    """What the issue found: the split config's own search path is relative to the working
    directory (a trial folder is not verl's site folder)."""
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException, match="ppo_megatron_trainer"):
        compose([])


@pytest.mark.parametrize("index", range(len(SPLITS)))
def test_split_overrides_compose_and_pass_verls_checks(
    index: int, compose: Callable[[list[str]], Any], model_dir: Path
) -> None:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    c, m, cl, w = SPLITS[index]
    ov = _overrides(c, m, cl, w, model_dir)
    cfg = compose(verl_command.override_args(ov))
    for key, value in ov.items():
        if key.startswith("hydra."):
            continue  # Hydra's own node, not in the job's config
        got = OmegaConf.select(cfg, key.lstrip("+"))
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        want = list(value) if isinstance(value, tuple) else value
        assert got == want, (key, got, want)
    # what one_step_off_policy's main and trainer need
    assert cfg.actor_rollout_ref.hybrid_engine is False  # ray_trainer.py: assert not hybrid
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.backend == "nccl"
    assert cfg.actor_rollout_ref.rollout.free_cache_engine is False
    assert cfg.algorithm.rollout_correction.bypass_mode is True
    rollout = cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node
    trainer = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    assert (rollout, trainer) == (c.rollout_gpus, cl.num_gpus - c.rollout_gpus)
    assert trainer == c.layout.world
    # main_ppo copies the rollout's pool into the rollout config, then validates
    cfg.actor_rollout_ref.rollout.nnodes = cfg.rollout.nnodes
    cfg.actor_rollout_ref.rollout.n_gpus_per_node = cfg.rollout.n_gpus_per_node
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        validate_config(cfg, need_reference_policy(cfg), need_critic(cfg))
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.megatron)


def test_plus_prefix_exactly_where_the_split_config_has_no_key(
    compose: Callable[[list[str]], Any], model_dir: Path
) -> None:
    from omegaconf import OmegaConf

    base = compose([f"hydra.searchpath=[{verl_command.SPLIT_SEARCHPATH}]"])
    keys = {k for c, m, cl, w in SPLITS for k in _overrides(c, m, cl, w, model_dir)}
    for key in sorted(k for k in keys if not k.startswith("hydra.")):
        parent, _, last = key.lstrip("+").rpartition(".")
        node = OmegaConf.select(base, parent)
        present = OmegaConf.is_dict(node) and last in list(node)
        assert present != key.startswith("+"), key


def test_a_colocated_candidate_s_command_is_unchanged() -> None:
    """No split key and the main_ppo entry point where rollout_gpus is 0."""
    m, cl, w = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=4), None
    w = get_workload("grpo-short")
    c = sample(RandomSuggester(random.Random(0)), SearchSpace(model=m, cluster=cl, workload=w))
    ov = verl_command.overrides(c, m, cl, w)
    assert not any(k.startswith(("hydra.", "rollout.")) for k in ov)
    assert "actor_rollout_ref.hybrid_engine" not in ov
    assert verl_command.entrypoint_of(c) == verl_command.ENTRYPOINT
