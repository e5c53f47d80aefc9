"""A synthetic RL workload for performance runs: a parquet file of prompts of a controlled token
length and a trivial reward function beside it, so that a verl trial needs only a model path.

The files follow what verl 0.9's `RLHFDataset` and reward loop read: columns `data_source`,
`prompt` (chat messages), `ability`, `reward_model` ({style, ground_truth}) and `extra_info`
({split, index}); `reward.py` defines `compute_score(data_source, solution_str, ground_truth,
extra_info)` for `reward.custom_reward_function.path`.

Prompt length: with the model's tokenizer, every prompt is built to the target length after
the chat template (`apply_chat_template(..., add_generation_prompt=True)`, as verl's agent loop
tokenizes). Without one, each prompt holds more words than the target has tokens (every word of
the list is at least one token), and verl's agent loop left-truncates it to `max_prompt_length`,
so prompts are exactly the maximum; a shorter target is then approximate (one token per word).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tuner.errors import UserError

if TYPE_CHECKING:
    from tuner.workload import Workload

SCHEMA_VERSION = 2
"""2: `response_caps` and `agent_name` columns where responses are drawn (`agent_loops.yaml`)."""
DATA_SOURCE = "verl-tuner/synthetic"
TRAIN_FILE = "train.parquet"
REWARD_FILE = "reward.py"
META_FILE = "meta.json"
AGENT_LOOPS_FILE = "agent_loops.yaml"
DRAWN_AGENT = "verl_tuner_drawn"
"""The agent loop (tuner/verl_agent_loop.py) that caps each response at its drawn length, under
the name the rows' `agent_name` column picks (verl 0.9.1 experimental/agent_loop/agent_loop.py:
AgentLoopWorker reads `rollout.agent.agent_loop_config_path`, a list of {name, _target_}, into
its registry, and runs each sample with the loop its `agent_name` names)."""
DRAWN_AGENT_TARGET = "tuner.verl_agent_loop.DrawnLengthAgentLoop"
DRAW_SEED = 0
"""Seed of a synthetic dataset's drawn response lengths: step s draws with DRAW_SEED + s, the
draw tuner.lengths.prompt_and_response_lengths makes, so each step's caps have the workload's
mean to the token."""
TRUNCATION_MARGIN_WORDS = 32
"""Extra words when prompts are cut to the maximum by verl: covers a chat template's tokens."""

REWARD_SOURCE = '''\
"""verl-tuner's reward for performance runs: a deterministic score in [0, 1) from the response
text. It costs next to nothing and differs between the responses to one prompt, so GRPO groups
have a non-zero advantage and the actor update does real work."""

import zlib


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return (zlib.crc32(solution_str.encode("utf-8", "replace")) % 1000) / 1000.0
'''

_WORD_TEXT = """
    the of and to in is was for on that with as by at from his it an were are which be this has
    or had not but first one their its new after who they have her she two been other when
    there all during into school time may years more most only over city some world would where
    later up such used many can state about national out known university united then made film
    three also under between these season team well year will age river game part group house
    water north south east west home music life book work line high long day small large great
    old young early late good best last next same each both few every much number people family
    name place area town road park field light power money point body order case week month
    hour side head hand eye face word story form level land air fire wood stone iron gold blue
    green red black white open close run walk read write play sing call give take make find
    keep hold move turn show try ask tell feel seem leave put mean become begin help talk start
    stand bring lose pay meet set learn change lead build
"""
WORDS = tuple(_WORD_TEXT.split())
"""Common English words; each is one token (with its leading space) in the usual BPE vocabularies
and never less than one."""


WORD_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
"""The chat template of `write_word_tokenizer`'s tokenizer (whitespace between its tokens)."""


QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""The byte-level BPE split Qwen2's tokenizer class sets on any tokenizer it loads
(transformers 5 models/qwen2/tokenization_qwen2.py, PRETOKENIZE_REGEX)."""


def write_word_tokenizer(folder: Path, vocab_size: int | None = None) -> int:
    """A tokenizer built offline for performance runs: one token per word of WORDS (and the chat
    roles) after a space, the 256 byte-level symbols (so "\n" is one token, as verl's Qwen agent
    loop demands, and any text encodes), Qwen's special tokens, then `w<i>` fillers up to
    `vocab_size` (a random-weight model samples any id; each one decodes). A prompt's token
    count is its word count after the chat template.

    It is a byte-level BPE whose merges build each word from its letters, with the
    pre-tokenizer of Qwen's: transformers 5 loads a folder whose config.json says `qwen2` with
    its own Qwen2Tokenizer, which keeps only the vocabulary and merges of tokenizer.json and
    sets that pre-tokenizer. A word-level tokenizer lost every word there (verl measured
    1-token prompts: scripts/verl_prompt_check.py); this one tokenizes the same under either
    class. Saved to `folder`; returns the vocabulary size."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab: dict[str, int] = {t: i for i, t in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab.setdefault(ch, len(vocab))
    merges: list[tuple[str, str]] = []
    for word in dict.fromkeys(["user", "assistant", "system", *WORDS]):
        piece = "\u0120"  # the byte-level symbol of a space
        for ch in word:
            if piece + ch not in vocab:
                merges.append((piece, ch))
                vocab[piece + ch] = len(vocab)
            piece += ch
    if vocab_size is not None:
        i = 0
        while len(vocab) < vocab_size:
            vocab.setdefault(f"w{i}", len(vocab))
            i += 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=WORD_CHAT_TEMPLATE,
    )
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    return len(fast)


class ChatTokenizer(Protocol):
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Dataset:
    """The data a verl trial trains on."""

    train_file: Path
    reward_fn: Path | None
    """A file with compute_score(), or None for verl's built-in scorer of each data_source."""
    synthetic: bool
    prompt_tokens: int = 0
    """Synthetic: the target prompt length in tokens, chat template included."""
    exact: bool = False
    """Synthetic: whether every prompt was built to the target length with the tokenizer (or is
    cut to it by verl, when the target is the maximum)."""
    response_caps_mean: float | None = None
    """Synthetic with drawn responses: the mean of the lengths the rows ask for (every step's
    rows have the same mean); None where responses are not drawn."""
    agent_loops: Path | None = None
    """The agent-loop config (`agent_loops.yaml`) of drawn responses, else None."""

    def describe(self) -> dict[str, Any]:
        """For the trial's `extra` column."""
        if not self.synthetic:
            return {"dataset": str(self.train_file)}
        out: dict[str, Any] = {
            "dataset": "synthetic",
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_exact": self.exact,
        }
        if self.response_caps_mean is not None:
            out["response_mean_asked"] = round(self.response_caps_mean, 2)
        return out


def user_dataset(train_file: Path, reward_fn: Path | None = None) -> Dataset:
    """The user's own parquet; its reward is `reward_fn`, else reward.py beside it if present,
    else verl's built-in scorer (the same rule as a recipe's REWARD_FN)."""
    if reward_fn is None and (train_file.parent / REWARD_FILE).is_file():
        reward_fn = train_file.parent / REWARD_FILE
    return Dataset(train_file=train_file, reward_fn=reward_fn, synthetic=False)


def load_tokenizer(model_path: str | Path) -> tuple[ChatTokenizer | None, str]:
    """The model's tokenizer if it can be loaded here (a local folder, transformers installed,
    a chat template present); else None and why. Hub ids are not fetched."""
    if not Path(model_path).expanduser().is_dir():
        return None, f"{model_path} is not a folder on this machine"
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None, "transformers is not installed"
    try:
        tok = AutoTokenizer.from_pretrained(str(Path(model_path).expanduser()))
    except Exception as e:  # a missing path, an unknown tokenizer class, a gated repo, ...
        return None, f"cannot load a tokenizer from {model_path}: {type(e).__name__}"
    if not getattr(tok, "chat_template", None):
        return None, f"the tokenizer at {model_path} has no chat template"
    return tok, ""


def _prompt_len(tok: ChatTokenizer, text: str) -> int:
    ids = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return len(ids)


def _exact_words(
    tok: ChatTokenizer, rng: random.Random, target: int, overhead: int
) -> tuple[list[str], bool]:
    words = [rng.choice(WORDS) for _ in range(max(1, target - overhead))]
    for _ in range(8):
        n = _prompt_len(tok, " ".join(words))
        if n == target:
            return words, True
        if n < target:
            words += [rng.choice(WORDS) for _ in range(target - n)]
        elif len(words) > 1:
            del words[max(1, len(words) - (n - target)) :]
        else:
            break
    return words, _prompt_len(tok, " ".join(words)) == target


def write_synthetic(
    root: Path,
    *,
    prompt_tokens: int,
    max_prompt_len: int,
    rows: int,
    seed: int = 0,
    tokenizer: ChatTokenizer | None = None,
    response_caps: list[list[int]] | None = None,
) -> Dataset:
    """Write (once) `root/<name>/train.parquet` and `reward.py`; return where they are.

    `response_caps`: one list of n lengths per row (`draw_response_caps`); the rows then name
    the DRAWN_AGENT loop, which caps the k-th response to a row at its k-th length, and the
    folder holds the loop's config (AGENT_LOOPS_FILE).

    The folder is built aside and renamed into place, so concurrent trials and a kill at any
    moment leave either no folder or a whole one."""
    if not 1 <= prompt_tokens <= max_prompt_len:
        raise ValueError(f"prompt_tokens({prompt_tokens}) must lie in 1..{max_prompt_len}")
    if rows < 1:
        raise ValueError(f"rows({rows}) must be at least 1")
    if response_caps is not None and len(response_caps) != rows:
        raise ValueError(f"response_caps has {len(response_caps)} rows, the dataset {rows}")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(
            "the synthetic dataset needs pyarrow: pip install 'verl-tuner[verl]'"
        ) from None
    by_truncation = tokenizer is None and prompt_tokens == max_prompt_len
    mode = "tok" if tokenizer is not None else ("cut" if by_truncation else "words")
    name = f"synthetic-p{prompt_tokens}-m{max_prompt_len}-r{rows}-s{seed}-{mode}"
    if response_caps is not None:
        name += f"-drawn{_caps_digest(response_caps)}"
    final = root / name
    if (final / META_FILE).is_file():
        found = json.loads((final / META_FILE).read_text())
        return _dataset(final, found)

    rng = random.Random(seed)
    overhead = _prompt_len(tokenizer, "") if tokenizer is not None else 0
    prompts: list[list[dict[str, str]]] = []
    exact = True
    for _ in range(rows):
        if tokenizer is not None:
            words, ok = _exact_words(tokenizer, rng, prompt_tokens, overhead)
            exact = exact and ok
        else:
            count = prompt_tokens + (TRUNCATION_MARGIN_WORDS if by_truncation else 0)
            words = [rng.choice(WORDS) for _ in range(count)]
        prompts.append([{"role": "user", "content": " ".join(words)}])
    exact = exact if tokenizer is not None else by_truncation
    columns: dict[str, Any] = {
        "data_source": [DATA_SOURCE] * rows,
        "prompt": prompts,
        "ability": ["synthetic"] * rows,
        "reward_model": [{"style": "rule", "ground_truth": ""}] * rows,
        "extra_info": [{"split": "train", "index": i} for i in range(rows)],
    }
    if response_caps is not None:
        columns["agent_name"] = [DRAWN_AGENT] * rows
        columns["response_caps"] = [[int(x) for x in caps] for caps in response_caps]
    table = pa.table(columns)
    meta: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "prompt_tokens": prompt_tokens,
        "max_prompt_len": max_prompt_len,
        "rows": rows,
        "seed": seed,
        "exact": exact,
        "length_by": mode,
    }
    if response_caps is not None:
        flat = [x for caps in response_caps for x in caps]
        meta["response_caps_mean"] = sum(flat) / len(flat)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        pq.write_table(table, tmp / TRAIN_FILE)
        (tmp / REWARD_FILE).write_text(REWARD_SOURCE)
        if response_caps is not None:
            (tmp / AGENT_LOOPS_FILE).write_text(
                f"- name: {DRAWN_AGENT}\n  _target_: {DRAWN_AGENT_TARGET}\n"
            )
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
        with contextlib.suppress(FileExistsError, OSError):
            os.rename(tmp, final)  # fails if another trial got there first: keep theirs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _dataset(final, json.loads((final / META_FILE).read_text()))


def _dataset(folder: Path, meta: dict[str, Any]) -> Dataset:
    caps_mean = meta.get("response_caps_mean")
    return Dataset(
        train_file=folder / TRAIN_FILE,
        reward_fn=folder / REWARD_FILE,
        synthetic=True,
        prompt_tokens=int(meta["prompt_tokens"]),
        exact=bool(meta["exact"]),
        response_caps_mean=float(caps_mean) if caps_mean is not None else None,
        agent_loops=folder / AGENT_LOOPS_FILE if caps_mean is not None else None,
    )


def draw_response_caps(workload: Workload, steps: int) -> list[list[int]]:
    """The drawn response lengths of a synthetic dataset of `steps` x batch rows, one list of n
    per row: step s's rows are the draw tuner.lengths.prompt_and_response_lengths makes with
    seed DRAW_SEED + s (the fast runner's draw of the same seed), a prompt's n responses
    adjacent. verl must read the rows in order (`data.shuffle=False`) for step s to run them."""
    from tuner.lengths import prompt_and_response_lengths

    out: list[list[int]] = []
    for s in range(steps):
        _, rlens = prompt_and_response_lengths(workload, workload.batch_size, DRAW_SEED + s)
        n = workload.n
        out += [rlens[i * n : (i + 1) * n] for i in range(workload.batch_size)]
    return out


def _caps_digest(caps: list[list[int]]) -> str:
    import hashlib

    text = ";".join(",".join(str(x) for x in row) for row in caps)
    return hashlib.sha256(text.encode()).hexdigest()[:10]
