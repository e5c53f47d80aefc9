"""The synthetic workload: verl's own dataset class reads the parquet, verl's own loader imports
the reward function, and prompt lengths are what was asked."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tuner.dataset import (
    DATA_SOURCE,
    TRUNCATION_MARGIN_WORDS,
    load_tokenizer,
    user_dataset,
    write_synthetic,
)

pytestmark = [
    pytest.mark.verl,
    pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="needs verl"),
]


def _helpers() -> Any:
    path = Path(__file__).resolve().with_name("verl_helpers.py")
    spec = importlib.util.spec_from_file_location("verl_helpers", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _helpers().write_tiny_model(tmp_path_factory.mktemp("tok"), config=False)


def _rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def test_verl_reads_the_parquet_and_the_reward(tmp_path: Path, tokenizer_dir: Path) -> None:
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.import_utils import load_extern_object

    ds = write_synthetic(tmp_path, prompt_tokens=64, max_prompt_len=64, rows=12)
    tok, why = load_tokenizer(tokenizer_dir)
    assert tok is not None, why
    config = OmegaConf.create(
        {"max_prompt_length": 64, "filter_overlong_prompts": False, "cache_dir": str(tmp_path)}
    )
    data = RLHFDataset(data_files=[str(ds.train_file)], tokenizer=tok, config=config)
    assert len(data) == 12
    item = data[5]
    assert item["data_source"] == DATA_SOURCE
    assert item["raw_prompt"][0]["role"] == "user"
    assert item["index"] == 5
    assert item["reward_model"]["ground_truth"] == ""

    assert ds.reward_fn is not None
    score = load_extern_object(str(ds.reward_fn), "compute_score")
    values = {
        score(data_source=DATA_SOURCE, solution_str=s, ground_truth="", extra_info={})
        for s in ("a", "b", "a longer answer", "")
    }
    assert all(0.0 <= v < 1.0 for v in values) and len(values) > 1


def test_prompts_at_the_maximum_are_cut_to_it_by_verl(tmp_path: Path) -> None:
    """Without a tokenizer: more words than tokens asked, verl's agent loop left-truncates."""
    ds = write_synthetic(tmp_path, prompt_tokens=128, max_prompt_len=128, rows=5)
    assert ds.exact and ds.synthetic and ds.prompt_tokens == 128
    rows = _rows(ds.train_file)
    words = [len(r["prompt"][0]["content"].split()) for r in rows]
    assert words == [128 + TRUNCATION_MARGIN_WORDS] * 5
    assert len({r["prompt"][0]["content"] for r in rows}) == 5  # distinct: no shared prefix


def test_exact_lengths_with_the_models_tokenizer(tmp_path: Path, tokenizer_dir: Path) -> None:
    tok, _ = load_tokenizer(tokenizer_dir)
    ds = write_synthetic(tmp_path, prompt_tokens=100, max_prompt_len=512, rows=6, tokenizer=tok)
    assert ds.exact
    for r in _rows(ds.train_file):
        ids = tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True)
        ids = ids if isinstance(ids, list) else ids["input_ids"]
        assert len(ids) == 100


def test_written_once_and_reused(tmp_path: Path) -> None:
    a = write_synthetic(tmp_path, prompt_tokens=16, max_prompt_len=32, rows=4)
    mtime = a.train_file.stat().st_mtime_ns
    b = write_synthetic(tmp_path, prompt_tokens=16, max_prompt_len=32, rows=4)
    assert a == b and b.train_file.stat().st_mtime_ns == mtime
    assert not a.exact  # shorter than the maximum and no tokenizer: one token per word
    assert [p.name for p in tmp_path.iterdir()] == [a.train_file.parent.name]


def test_users_dataset_reward_rule(tmp_path: Path) -> None:
    train = tmp_path / "train.parquet"
    assert user_dataset(train).reward_fn is None
    (tmp_path / "reward.py").write_text("")
    assert user_dataset(train).reward_fn == tmp_path / "reward.py"
    assert user_dataset(train, Path("/r.py")).reward_fn == Path("/r.py")


def test_no_tokenizer_from_a_hub_id_or_missing_folder(tmp_path: Path) -> None:
    assert load_tokenizer("Qwen/Qwen2.5-7B-Instruct")[0] is None
    assert load_tokenizer(tmp_path / "absent")[0] is None


def test_the_word_tokenizer_covers_a_models_vocabulary(tmp_path: Path) -> None:
    """scripts/verl_model.py's tokenizer: the model's whole vocabulary (a random model samples
    any id), and "\\n" one token (verl's Qwen agent loop refuses a tokenizer without it: found
    on the H100)."""
    from transformers import AutoTokenizer

    from tuner.dataset import write_word_tokenizer

    assert write_word_tokenizer(tmp_path, 4096) == 4096
    tok = AutoTokenizer.from_pretrained(tmp_path)
    (newline,) = tok.encode("\n", add_special_tokens=False)
    assert tok.decode([newline]) == "\n" and tok.decode([4000]).startswith("w")
    ids = tok.apply_chat_template([{"role": "user", "content": "the city"}], tokenize=True)
    assert tok.unk_token_id not in ids


@pytest.mark.parametrize("config", ["qwen2.5-3b", "qwen3-1.7b", "qwen3-30b-a3b-20l"])
def test_verls_prompt_path_sees_the_prompts_length(tmp_path: Path, config: str) -> None:
    """The model folder as scripts/verl_model.py writes it (the word tokenizer beside a Qwen
    config.json): transformers then loads the tokenizer with the config's own class (Qwen2's
    for qwen2, which keeps only the vocabulary and merges), and verl 0.9.1's agent-loop
    tokenization of each synthetic prompt (hf_tokenizer, the Continuous Token builder of the
    model type) gives exactly the target length. A word-level tokenizer gave 1 token there."""
    pytest.importorskip("verl")
    import importlib.util
    import shutil

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(
        "verl_prompt_check", root / "scripts" / "verl_prompt_check.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from tuner.dataset import write_word_tokenizer

    model = tmp_path / "model"
    write_word_tokenizer(model, 151936)
    shutil.copy(root / "scripts" / "models" / config / "config.json", model / "config.json")
    got = mod.check(model, 200, tmp_path / "data")
    assert got["exact"] is True
    assert (got["verl_min"], got["verl_max"]) == (200, 200), got
