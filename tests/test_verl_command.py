"""Every override the tuner can emit composes against the installed verl's own Hydra config
(`ppo_megatron_trainer`) and passes the checks verl runs before it starts anything.

Candidates come from tuner.space.sample() with a seeded RandomSuggester over several models,
clusters and workloads; a greedy cover keeps the candidates that add a knob value not seen yet,
and the test first asserts that the pool holds every value the sampler can produce, so no knob
value escapes the composition."""

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
from tuner.space import (
    BATCHED_TOKEN_FACTORS,
    GPU_MEMORY_UTILIZATIONS,
    RECOMPUTE_GRANULARITIES,
    RECOMPUTE_METHODS,
    Candidate,
    RandomSuggester,
    SearchSpace,
    sample,
)
from tuner.workload import get_workload

pytestmark = pytest.mark.verl
hydra = pytest.importorskip("hydra")
verl = pytest.importorskip("verl")

CONFIG_DIR = Path(verl.__file__).parent / "trainer" / "config"
SETUPS = (
    # (model, GPUs, GPUs per node): one node, two nodes with MoE, a partial node
    ("qwen2.5-7b", 8, 8),
    ("qwen3-30b-moe", 16, 8),
    ("llama3.1-8b", 4, 8),
)
WORKLOADS = ("dapo-math", "grpo-short", "ppo-gsm8k")
POOL_PER_SETUP = 120


def _helpers() -> Any:
    """tests/verl_helpers.py, loaded by path (tests/ is not a package)."""
    path = Path(__file__).resolve().parents[0] / "verl_helpers.py"
    spec = importlib.util.spec_from_file_location("verl_helpers", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


H = _helpers()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PPO's critic config loads the model's config.json and tokenizer when verl validates it."""
    return H.write_tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def compose() -> Iterator[Callable[[list[str]], Any]]:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        yield lambda ov: hydra_compose(config_name=verl_command.CONFIG_NAME, overrides=ov)


def _features(c: Candidate, algorithm: str, nnodes: int) -> set[tuple[str, Any]]:
    rec = c.to_record()
    rec.pop("train_parallel")
    if not c.use_dynamic_bsz:
        rec.pop("ppo_max_token_len_per_gpu")
        rec.pop("log_prob_max_token_len_per_gpu")
    else:
        rec.pop("ppo_micro_batch_size_per_gpu")
        rec.pop("log_prob_micro_batch_size_per_gpu")
    rec.pop("max_num_batched_tokens")
    return {*rec.items(), ("algorithm", algorithm), ("nnodes", nnodes)}


def _pool() -> list[tuple[Candidate, Any, Cluster, Any, set[tuple[str, Any]]]]:
    rng = random.Random(20251122)
    pool = []
    for model_name, gpus, per_node in SETUPS:
        m = get_model(model_name)
        cl = Cluster(gpu=get_gpu("h100"), num_gpus=gpus, gpus_per_node=per_node)
        for wname in WORKLOADS:
            w = get_workload(wname)
            space = SearchSpace(model=m, cluster=cl, workload=w)
            for _ in range(POOL_PER_SETUP // len(WORKLOADS)):
                c = sample(RandomSuggester(rng), space)
                pool.append((c, m, cl, w, _features(c, w.algorithm, cl.num_nodes)))
    return pool


def _cover(pool: list[Any]) -> list[Any]:
    """Greedy set cover of the pool's (knob, value) features."""
    seen: set[tuple[str, Any]] = set()
    chosen = []
    while True:
        best = max(pool, key=lambda p: len(p[4] - seen))
        if not best[4] - seen:
            return chosen
        chosen.append(best)
        seen |= best[4]


POOL = _pool()
CHOSEN = _cover(POOL)


def test_pool_holds_every_value_the_sampler_offers() -> None:
    seen: dict[str, set[Any]] = {}
    for _c, _m, _cl, _w, feats in POOL:
        for k, v in feats:
            seen.setdefault(k, set()).add(v)
    for knob in (
        "sequence_parallel",
        "param_offload",
        "optimizer_offload",
        "use_fused_kernels",
        "use_dynamic_bsz",
    ):
        assert seen[knob] == {True, False}, knob
    assert seen["recompute_granularity"] == set(RECOMPUTE_GRANULARITIES)
    assert seen["recompute_method"] == set(RECOMPUTE_METHODS)
    assert seen["gpu_memory_utilization"] == set(GPU_MEMORY_UTILIZATIONS)
    assert seen["algorithm"] == {"grpo", "dapo", "ppo"}
    assert seen["nnodes"] == {1, 2}
    for degree in ("tp", "pp", "vpp", "cp", "ep", "etp"):
        assert max(seen[degree]) > 1, degree
    assert seen["rollout_tp"] >= {1, 2, 4, 8}
    assert max(seen["recompute_num_layers"]) > 1
    assert len(BATCHED_TOKEN_FACTORS) >= 1
    assert {1, 2, 4, 8} <= seen["ppo_micro_batch_size_per_gpu"]
    assert {1, 16} <= seen["log_prob_micro_batch_size_per_gpu"]


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
        experiment="compose-test",
    )


@pytest.mark.parametrize("index", range(len(CHOSEN)))
def test_overrides_compose_and_pass_verls_checks(
    index: int, compose: Callable[[list[str]], Any], model_dir: Path
) -> None:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    c, m, cl, w, _ = CHOSEN[index]
    ov = _overrides(c, m, cl, w, model_dir)
    cfg = compose(verl_command.override_args(ov))

    # Every value arrives as verl reads it (Hydra parsed our formatting back to the value).
    for key, value in ov.items():
        got = OmegaConf.select(cfg, key.lstrip("+"))
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        want = list(value) if isinstance(value, tuple) else value
        assert got == want, (key, got, want)

    # What main_ppo checks before Ray starts; then the rollout config's dataclass, and the
    # asserts verl's engine worker makes on the log-prob settings (engine_workers.init_model).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        validate_config(cfg, need_reference_policy(cfg), need_critic(cfg))
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.megatron)
    a, r = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert a.use_dynamic_bsz == r.log_prob_use_dynamic_bsz
    if a.use_dynamic_bsz:
        assert r.log_prob_max_token_len_per_gpu is not None and a.ppo_max_token_len_per_gpu
    else:
        assert r.log_prob_micro_batch_size_per_gpu and a.ppo_micro_batch_size_per_gpu
    assert need_reference_policy(cfg) == verl_command.uses_reference_model(w)
    assert need_critic(cfg) == (w.algorithm == "ppo")
    # The ref follows the actor's layout and recompute settings.
    ref = cfg.actor_rollout_ref.ref.megatron
    for k in (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
    ):
        assert ref[k] == a.megatron[k]
    assert ref.override_transformer_config == a.megatron.override_transformer_config
    assert cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node == cl.num_gpus


def test_plus_prefix_exactly_where_verl_has_no_key(
    compose: Callable[[list[str]], Any], model_dir: Path
) -> None:
    """A key without `+` must exist in verl's config, one with `+` must not: so the overrides
    neither invent keys nor rely on Hydra appending over a null."""
    from omegaconf import OmegaConf

    base = compose([])
    keys = {k for c, m, cl, w, _ in CHOSEN for k in _overrides(c, m, cl, w, model_dir)}
    for key in sorted(keys):
        parent, _, last = key.lstrip("+").rpartition(".")
        node = OmegaConf.select(base, parent)
        present = OmegaConf.is_dict(node) and last in list(node)  # `in` skips ??? values
        assert present != key.startswith("+"), key


def test_an_unknown_key_or_bad_value_fails(compose: Callable[[list[str]], Any]) -> None:
    """The harness itself: what the runner would hit at launch fails here."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="grad_offload"):
        compose(["actor_rollout_ref.actor.megatron.grad_offload=True"])
    with pytest.raises(ConfigCompositionException):
        compose(
            ["+actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=x"]
        )


def test_values_that_need_quoting_round_trip(compose: Callable[[list[str]], Any]) -> None:
    paths = ["/data/my data/train.parquet", "~/m", "/p/a=b,c", "it's"]
    for p in paths:
        cfg = compose([f"data.train_files={verl_command.format_value(p)}"])
        assert cfg.data.train_files == p


def test_ppo_critic_mirrors_the_actor_layout() -> None:
    m, cl, w = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=8), None
    w = get_workload("ppo-gsm8k")
    space = SearchSpace(model=m, cluster=cl, workload=w)
    c = sample(RandomSuggester(random.Random(3)), space)
    ov = verl_command.overrides(c, m, cl, w)
    for key, v in ov.items():
        if key.startswith("actor_rollout_ref.actor.megatron."):
            assert ov["critic.megatron." + key.split(".megatron.", 1)[1]] == v
    assert ov["critic.model.path"] == "${MODEL_PATH}"


def test_fixed_response_length_when_the_mean_is_the_max() -> None:
    w = get_workload("grpo-short")
    assert verl_command.workload_overrides(w)["actor_rollout_ref.rollout.ignore_eos"] is False
    fixed = w.with_overrides(response_mean=w.response_len)
    assert verl_command.workload_overrides(fixed)["actor_rollout_ref.rollout.ignore_eos"] is True


def test_no_dead_keys() -> None:
    """Keys verl 0.9 ignores or that would change what is measured are not emitted."""
    m, cl, w = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=8), None
    w = get_workload("dapo-math")
    c = sample(RandomSuggester(random.Random(0)), SearchSpace(model=m, cluster=cl, workload=w))
    ov = verl_command.overrides(c, m, cl, w)
    assert "actor_rollout_ref.rollout.load_format" not in ov  # verl's `dummy` + weight sync
    assert "data.truncation" not in ov  # unused by verl 0.9's dataset
    assert ov["trainer.resume_mode"] == "disable"  # never resume an old checkpoint
    assert ov["trainer.save_freq"] == -1 and ov["trainer.test_freq"] == -1
    assert ov["trainer.val_before_train"] is False
    assert ov["trainer.logger"] == ["console", "file"]
    assert not any(k.startswith("actor_rollout_ref.ref.") for k in ov)  # DAPO: no reference
    assert os.fspath(verl_command.metrics_path(Path("/t"), "e")) == "/t/verl-tuner/e.jsonl"


# --- every value of every knob, composed (issues 10 and 12) ----------------------------------


def _knob_values() -> list[tuple[str, Any, Candidate, Any]]:
    """(knob, value, candidate, model): each value of each knob on a valid base candidate."""
    from dataclasses import replace

    from tuner.space import (
        ATTENTION_BACKENDS,
        KNOBS,
        MAX_NUM_SEQS_CHOICES,
        MOE_DISPATCHERS,
        ParallelLayout,
    )

    moe = get_model("qwen3-30b-moe")
    base = Candidate(
        layout=ParallelLayout(world=16, tp=2, pp=2, ep=4),
        sequence_parallel=True,
        ppo_max_token_len_per_gpu=10240,
        log_prob_max_token_len_per_gpu=20480,
        rollout_tp=2,
    )
    values: dict[str, list[Any]] = {
        "recompute_granularity": list(RECOMPUTE_GRANULARITIES),
        "recompute_method": list(RECOMPUTE_METHODS),
        "recompute_num_layers": [1, 3],
        "recompute_modules": ["core_attn", "core_attn,layernorm", "moe_act", "moe", "mlp"],
        "attention_backend": list(ATTENTION_BACKENDS),
        "moe_token_dispatcher_type": list(MOE_DISPATCHERS),
        "max_num_seqs": list(MAX_NUM_SEQS_CHOICES),
        "gpu_memory_utilization": list(GPU_MEMORY_UTILIZATIONS),
        "max_num_batched_tokens": [10240, 20480],
        "ppo_max_token_len_per_gpu": [10240, 40960],
        "log_prob_max_token_len_per_gpu": [10240, 102400],
        "rollout_tp": [1, 2, 4, 8, 16],
        "rollout_dp": [1, 2],
        "rollout_ep": [1, 4],
    }
    out = []
    for k in KNOBS:
        if k.name == "layout" or k.name in ("tp", "pp", "vpp", "cp", "ep", "etp"):
            continue
        if k.name in ("first_stage_layers", "last_stage_layers"):
            lay = ParallelLayout(world=16, tp=2, pp=4, first_stage_layers=10, last_stage_layers=14)
            out.append((k.name, getattr(lay, k.name), replace(base, layout=lay), moe))
            continue
        field_type = type(k.value(base))
        vals = values.get(k.name, [True, False] if field_type is bool else [k.value(base)])
        for v in vals:
            c = replace(base, **{k.name: v})
            if k.name.startswith("recompute_") and k.name != "recompute_granularity":
                gran = "selective" if k.name == "recompute_modules" else "full"
                c = replace(c, recompute_granularity=gran)
            if k.name in ("ppo_micro_batch_size_per_gpu", "log_prob_micro_batch_size_per_gpu"):
                c = replace(c, use_dynamic_bsz=False)
            if k.name == "rollout_ep" and v > 1:
                c = replace(c, rollout_tp=2, rollout_dp=2)
            out.append((k.name, v, c, moe))
    return out


def test_every_knob_sets_a_verl_key() -> None:
    """No knob is scored that no verl key sets."""
    from tuner.space import KNOBS

    for k in KNOBS:
        # the placement's keys are verl_command.split_overrides (tests/test_verl_split.py)
        assert k.verl_keys or k.name in ("layout", "rollout_gpus"), k.name
        assert k.cost, k.name


def _composed_in_few_commands(
    compose: Callable[[list[str]], Any], cl: Cluster, w: Any, model_dir: Path
) -> list[tuple[str, Any, Candidate, Any, Any]]:
    """(knob, value, candidate, model, composed config) for each of `_knob_values()`, with the
    values merged into as few commands as keep each one's own: a value joins a merged candidate
    where the fields it changes from the base (and its knob's own field) agree with those the
    others changed, and the merged command sets each of its knob's keys exactly as its own
    command does (same keys, same text). verl composes each merged command once (a compose is
    about 1 s of CPU; one per value was 74)."""
    from dataclasses import fields, replace

    from tuner.space import KNOB_BY_NAME, LAYOUT_FIELDS

    entries = _knob_values()
    base = replace(entries[0][2])
    names = [f.name for f in fields(Candidate)]

    def changed(name: str, c: Candidate) -> dict[str, Any]:
        own = "layout" if name in LAYOUT_FIELDS else name
        return {f: getattr(c, f) for f in names if f == own or getattr(c, f) != getattr(base, f)}

    def knob_args(name: str, ov: dict[str, Any]) -> dict[str, str]:
        keys = KNOB_BY_NAME[name].verl_keys
        return {k: a for k, a in zip(ov, verl_command.override_args(ov), strict=True) if k in keys}

    def own_args(e: tuple[str, Any, Candidate, Any]) -> dict[str, str]:
        return knob_args(e[0], _overrides(e[2], e[3], cl, w, model_dir))

    groups: list[tuple[dict[str, Any], list[tuple[str, Any, Candidate, Any]]]] = []
    for e in entries:
        diff = changed(e[0], e[2])
        for fixed, members in groups:
            if (
                any(f in fixed and fixed[f] != v for f, v in diff.items())
                or e[3] is not members[0][3]
            ):
                continue
            merged = replace(base, **{**fixed, **diff})
            ov = _overrides(merged, e[3], cl, w, model_dir)
            if all(knob_args(x[0], ov) == own_args(x) for x in (*members, e)):
                fixed.update(diff)
                members.append(e)
                break
        else:
            groups.append((diff, [e]))
    out = []
    for fixed, members in groups:
        merged = replace(base, **fixed)
        cfg = compose(
            verl_command.override_args(_overrides(merged, members[0][3], cl, w, model_dir))
        )
        out += [(name, value, merged, m, cfg) for name, value, _c, m in members]
    assert len(out) == len(entries)
    return out


def test_every_value_of_every_knob_composes_and_reads_back(
    compose: Callable[[list[str]], Any], model_dir: Path
) -> None:
    """Each value of each knob goes through verl 0.9.1's ppo_megatron_trainer; the composed
    config holds, under each of the knob's keys, the value the estimator scored."""
    from omegaconf import OmegaConf

    from tuner.space import KNOB_BY_NAME

    cl = Cluster(gpu=get_gpu("h100"), num_gpus=16)
    w = get_workload("grpo-math")
    seen: set[str] = set()
    for name, value, c, _m, cfg in _composed_in_few_commands(compose, cl, w, model_dir):
        knob = KNOB_BY_NAME[name]
        assert knob.value(c) == value
        for key in knob.verl_keys:
            got = OmegaConf.select(cfg, key.lstrip("+"))
            got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
            assert got == knob.to_verl(value), (name, key, got, value)
            # the ref's transformer config follows the actor's
            if ".override_transformer_config." in key:
                ref = OmegaConf.select(cfg, key.lstrip("+").replace(".actor.", ".ref.", 1))
                ref = OmegaConf.to_container(ref) if OmegaConf.is_config(ref) else ref
                assert ref == got, key
        seen.add(name)
    assert seen == {
        k for k in KNOB_BY_NAME if k not in ("layout", "tp", "pp", "vpp", "cp", "ep", "etp")
    }


def test_max_num_seqs_is_always_written_and_verls_default_is_256(
    compose: Callable[[list[str]], Any],
) -> None:
    from tuner.space import VERL_DEFAULT_MAX_NUM_SEQS

    assert compose([]).actor_rollout_ref.rollout.max_num_seqs == VERL_DEFAULT_MAX_NUM_SEQS
    m, cl, w = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=8), None
    w = get_workload("dapo-math")
    c = sample(RandomSuggester(random.Random(1)), SearchSpace(model=m, cluster=cl, workload=w))
    assert verl_command.overrides(c, m, cl, w)["actor_rollout_ref.rollout.max_num_seqs"] == (
        c.max_num_seqs
    )


def test_enforce_eager_is_exported_and_verls_default_is_cuda_graphs(
    compose: Callable[[list[str]], Any],
) -> None:
    """verl 0.9.1 runs vLLM with CUDA graphs unless told otherwise; the recipe says which the
    estimator scored, either way."""
    from dataclasses import replace

    from tuner import recipes
    from tuner.space import VERL_DEFAULT_ENFORCE_EAGER, ParallelLayout

    assert VERL_DEFAULT_ENFORCE_EAGER is False
    assert compose([]).actor_rollout_ref.rollout.enforce_eager is VERL_DEFAULT_ENFORCE_EAGER
    m, cl, w = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=8), None
    w = get_workload("dapo-math")
    c = Candidate(layout=ParallelLayout(world=8, tp=4), sequence_parallel=True, rollout_tp=2)
    assert c.enforce_eager is False
    for eager in (False, True):
        text = recipes.render(replace(c, enforce_eager=eager), m, cl, w).text
        lines = [line.strip() for line in text.splitlines()]
        assert f"actor_rollout_ref.rollout.enforce_eager={eager} \\" in lines


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_the_bridge_reaches_every_megatron_model(
    algorithm: str, compose: Callable[[list[str]], Any], model_dir: Path
) -> None:
    """--verl-bridge mbridge: the ref follows the actor (oc.select), but PPO's critic has its
    own vanilla_mbridge (False): it was left on Megatron-Bridge, which the host may lack."""
    from tuner.verl_settings import VerlSettings

    c, m, cl, w, _ = CHOSEN[0]
    w = w.with_overrides(algorithm=algorithm)
    ov = verl_command.overrides(
        c, m, cl, w, model_path=str(model_dir), settings=VerlSettings(bridge="mbridge")
    )
    cfg = compose(verl_command.override_args(ov))
    assert cfg.actor_rollout_ref.actor.megatron.vanilla_mbridge is True
    assert cfg.actor_rollout_ref.ref.megatron.vanilla_mbridge is True
    assert cfg.critic.megatron.vanilla_mbridge is (algorithm == "ppo")


def test_a_trial_s_environment_reaches_verl_s_job_runtime_env(
    compose: Callable[[list[str]], Any],
) -> None:
    """--shared-ray passes the trial's environment as verl's job runtime env: composed by verl's
    own config, every value a string as Ray takes them (`0` stays '0'), quotes and colons kept."""
    from omegaconf import OmegaConf

    env = {"VLLM_DISABLE_COMPILE_CACHE": "0", "PYTHONPATH": "/a:/b c", "Q": "it's"}
    cfg = compose(verl_command.runtime_env_args(env))
    got = OmegaConf.to_container(cfg.ray_kwargs.ray_init.runtime_env, resolve=True)
    assert got["env_vars"] == env
    assert got["py_executable"] is None  # verl's own key is kept


# --- no verl key set twice (issue 39 item 1) --------------------------------------------------


def test_no_verl_key_is_set_twice_by_the_command() -> None:
    """Every source of the command (study, workload, knobs, critic, trainer, placement) sets keys
    of its own, for every algorithm, dense and MoE, colocated and split: set_once refuses a key
    two of them set, so building each command is the check."""
    from tuner.space import ParallelLayout

    cl = Cluster(gpu=get_gpu("h100"), num_gpus=2)
    for model in ("qwen2.5-7b", "qwen3-30b-moe"):
        m = get_model(model)
        for algo in ("grpo", "ppo", "dapo"):
            w = get_workload("grpo-short").with_overrides(algorithm=algo)
            for c in (
                Candidate(layout=ParallelLayout(world=2)),
                Candidate(layout=ParallelLayout(world=1), rollout_gpus=1),
            ):
                ov = verl_command.overrides(c, m, cl, w)
                bare = [k.lstrip("+") for k in ov]
                assert len(bare) == len(set(bare)), (model, algo, c.rollout_gpus)


def test_a_knob_with_the_workloads_key_is_refused() -> None:
    """A knob of `enable_chunked_prefill`, which the workload fixes, would have replaced it
    silently and been credited to the workload: the command refuses it, naming both."""
    w = get_workload("grpo-short")
    knob = {"actor_rollout_ref.rollout.enable_chunked_prefill": False}
    with pytest.raises(ValueError, match="enable_chunked_prefill is set by the workload and by"):
        verl_command.set_once(
            ("the workload", verl_command.workload_overrides(w)), ("the knobs", knob)
        )


def test_two_knobs_of_one_verl_key_are_refused() -> None:
    from tuner.space import Knob
    from tuner.space.knobs import check_verl_keys

    a = Knob(name="a", help="", group="kernels", cost="", verl_keys=("+x.y",))
    b = Knob(name="b", help="", group="kernels", cost="", verl_keys=("x.y",))
    with pytest.raises(ValueError, match="knob b: verl key x.y is already the knob a's"):
        check_verl_keys((a, b))


def test_verls_moe_example_composes_as_the_study_launches_it(
    compose: Callable[[list[str]], Any], model_dir: Path
) -> None:
    """Issue 37 item 2: the MoE hand row (tuner.study.grid.verl_moe_example, scaled to 4 H200s
    for scripts/models/qwen3-30b-a3b-20l) is a command verl 0.9.1's own config composes and
    checks, with the example's MoE keys as verl reads them."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from tuner.study.grid import verl_example
    from tuner.verl_settings import VerlSettings

    root = Path(__file__).resolve().parents[1]
    m = get_model(str(root / "scripts" / "models" / "qwen3-30b-a3b-20l" / "config.json"))
    cl = Cluster(gpu=get_gpu("h200"), num_gpus=4, gpus_per_node=4)
    w = get_workload("grpo-short").with_overrides(
        prompt_len=512, response_len=2048, batch_size=32, n=4, mini_batch_size=8
    )
    got = verl_example(SearchSpace(model=m, cluster=cl, workload=w))
    assert got is not None
    ov = verl_command.overrides(
        got[0],
        m,
        cl,
        w,
        model_path=str(model_dir),
        train_file="/data/synthetic/train.parquet",
        reward_fn="/data/synthetic/reward.py",
        nnodes=cl.num_nodes,
        experiment="compose-test",
        settings=VerlSettings(bridge="mbridge"),
    )
    cfg = compose(verl_command.override_args(ov))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        validate_config(cfg, need_reference_policy(cfg), need_critic(cfg))
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.megatron)
    a, r = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    meg = a.megatron
    assert (meg.tensor_model_parallel_size, meg.expert_model_parallel_size) == (1, 4)
    assert meg.expert_tensor_parallel_size in (1, None)
    assert (meg.param_offload, meg.optimizer_offload, meg.vanilla_mbridge) == (True, True, True)
    tf = OmegaConf.to_container(meg.override_transformer_config)
    assert isinstance(tf, dict)
    assert tf["moe_token_dispatcher_type"] == "flex" and tf["moe_grouped_gemm"] is True
    assert tf["moe_permute_fusion"] is True
    assert a.use_dynamic_bsz and a.ppo_max_token_len_per_gpu == 3072
    assert (r.tensor_model_parallel_size, r.gpu_memory_utilization, r.enforce_eager) == (
        4,
        0.7,
        True,
    )
    assert r.max_num_batched_tokens == 2560
    assert cfg.actor_rollout_ref.ref.megatron.expert_model_parallel_size == 4
