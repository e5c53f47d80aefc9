"""The generation worker's request (engine settings + the step's lengths) and its result, in
pure Python: the runner writes and reads them on a machine with no vLLM.

Every `LLM(...)` key and default below was read in vLLM 0.24.0's source (the wheel's
vllm/entrypoints/llm.py `LLM.__init__`, vllm/engine/arg_utils.py `EngineArgs`) and in verl
0.9.1's vllm_async_server.py (`launch_server`'s engine args), which this mirrors."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

SCHEMA = 1
STATUSES = ("ok", "oom", "refused", "failed")
"""refused: vLLM would not run the settings (a ValueError of its config or memory checks)."""
SLEEP_LEVEL = 1
"""vLLM `LLM.sleep(level=1)`: weights to CPU, KV cache discarded (vllm/entrypoints/llm.py);
`wake_up()` brings both back. Level 2 would discard the weights, which only a weight sync (as
verl's) could restore."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineCfg:
    """One vLLM engine: every field is part of the engine key (`key()`), so two trials share an
    engine exactly when their rollout settings match."""

    model: str
    """Folder holding the model's config.json (weights are not read: load_format=dummy)."""
    config_sha: str
    """sha256 of that config.json: the key names the model by its content, not its path."""
    tensor_parallel_size: int
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool
    max_model_len: int
    """verl 0.9.1's rule: rollout.max_model_len, else the config's max_position_embeddings
    (vllm_async_server.py `_validate_configs`)."""
    dtype: str = "bfloat16"
    """verl's rollout.dtype default."""
    seed: int = 42
    """verl's rollout.seed (42) + replica rank 0."""
    enable_prefix_caching: bool = True
    """verl's rollout default: a prompt's n samples share its KV blocks."""
    enable_chunked_prefill: bool = True
    """As the tuner's verl command sets it (tuner.verl_command)."""
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    """verl 0.9.1 sets compilation_config.cudagraph_mode to this by default."""

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size({self.tensor_parallel_size}) must be >= 1")
        from tuner.space.knobs import KNOB_BY_NAME, knob_refusal  # the knobs' own bounds

        for f in fields(self):
            why = knob_refusal(f.name, getattr(self, f.name)) if f.name in KNOB_BY_NAME else None
            if why is not None:
                raise ValueError(f"{f.name}({getattr(self, f.name)}) {why}")
        for name in ("max_num_batched_tokens", "max_model_len"):  # 0 is verl's, not vLLM's
            if getattr(self, name) < 1:
                raise ValueError(f"{name}({getattr(self, name)}) must be at least 1")

    def key(self) -> str:
        """The engine key: these settings less the folder's path."""
        d = asdict(self)
        d.pop("model")
        return json.dumps(d, sort_keys=True)

    def llm_kwargs(self) -> dict[str, Any]:
        """`vllm.LLM(**kwargs)` for this engine: verl's engine args, with dummy weights, no
        tokenizer (token-id prompts) and sleep mode (vllm/config/model.py `enable_sleep_mode`:
        CUDA platforms; it turns on the cumem allocator that `sleep` frees through)."""
        return {
            "model": self.model,
            "load_format": "dummy",
            "skip_tokenizer_init": True,
            "tensor_parallel_size": self.tensor_parallel_size,
            "dtype": self.dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "enforce_eager": self.enforce_eager,
            "enable_prefix_caching": self.enable_prefix_caching,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "enable_sleep_mode": True,
            "seed": self.seed,
            "compilation_config": {"cudagraph_mode": self.cudagraph_mode},
            "disable_log_stats": True,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class GenSpec:
    """One trial's generation: the engine and the sequences of its share of the step."""

    engine: EngineCfg
    prompt_lengths: tuple[int, ...]
    """One per sequence; the `group_size` sequences of a prompt are adjacent and share its
    tokens (verl sends a prompt's n samples as n requests of the same ids)."""
    response_lengths: tuple[int, ...]
    """Exact: each is requested as min_tokens = max_tokens with ignore_eos."""
    group_size: int
    vocab_size: int
    warmup_response_tokens: int = 32
    """The warm-up generate: every prompt (other token ids) with this many response tokens."""
    seed: int = 0
    schema: int = SCHEMA

    def __post_init__(self) -> None:
        if self.schema != SCHEMA:
            raise ValueError(f"generation spec schema {self.schema}, this worker reads {SCHEMA}")
        n = len(self.prompt_lengths)
        if not n or n != len(self.response_lengths):
            raise ValueError(
                f"{n} prompt lengths and {len(self.response_lengths)} response lengths: give one "
                "of each per sequence"
            )
        if self.group_size < 1 or n % self.group_size:
            raise ValueError(f"{n} sequences are not whole groups of {self.group_size}")
        if min(self.prompt_lengths) < 1 or min(self.response_lengths) < 1:
            raise ValueError("every prompt and response needs at least one token")
        pairs = zip(self.prompt_lengths, self.response_lengths, strict=True)
        longest = max(p + r for p, r in pairs)
        if longest > self.engine.max_model_len:
            raise ValueError(
                f"a {longest}-token sequence exceeds max_model_len({self.engine.max_model_len})"
            )
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size({self.vocab_size}) must be at least 2")

    @property
    def tokens_requested(self) -> int:
        return sum(self.response_lengths)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["prompt_lengths"] = list(self.prompt_lengths)
        d["response_lengths"] = list(self.response_lengths)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GenSpec:
        d = dict(d)
        d["engine"] = EngineCfg(**d["engine"])
        d["prompt_lengths"] = tuple(int(x) for x in d["prompt_lengths"])
        d["response_lengths"] = tuple(int(x) for x in d["response_lengths"])
        return cls(**d)


def load_gen_spec(path: str | Path) -> GenSpec:
    return GenSpec.from_dict(json.loads(Path(path).read_text()))


@dataclass(kw_only=True, slots=True)
class GenResult:
    """The worker's answer (gen-result.json). Times in seconds, memory in GiB."""

    status: str
    reason: str = ""
    generation_s: float | None = None
    """The timed generate of the spec's sequences (wall time around `LLM.generate`)."""
    tokens_generated: int = 0
    tokens_requested: int = 0
    sequences: int = 0
    warmup_s: float | None = None
    engine_start_s: float | None = None
    """Building the engine (model init, profiling, CUDA graphs); None when it was reused."""
    engine_reused: bool = False
    wake_s: float | None = None
    sleep_s: float | None = None
    kv_cache_blocks: int | None = None
    """vLLM's `cache_config.num_gpu_blocks` (synced to the front end by
    vllm/v1/engine/core_client.py from the engine core's profile)."""
    kv_block_size: int | None = None
    kv_cache_tokens: int | None = None
    """blocks x block size: tokens of context the KV cache holds at once."""
    max_concurrency: float | None = None
    """vLLM's "Maximum concurrency for max_model_len tokens per request": blocks over the
    blocks one max_model_len request takes (kv_cache_utils.py
    get_max_concurrency_for_kv_cache_config, one full-attention group)."""
    device_used_after_sleep_gib: float | None = None
    """Device memory in use on the engine's first GPU once it sleeps (NVML; the idle training
    pool's included): what the training phases find taken."""
    engine_key: str = ""
    versions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"generation status {self.status!r} is not one of {STATUSES}")

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}


def parse_gen_result(text: str) -> GenResult:
    """gen-result.json's text → GenResult; ValueError if it is not one."""
    d = json.loads(text)
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        raise ValueError(f"not a schema-{SCHEMA} generation result")
    known = {f.name for f in fields(GenResult)}
    return GenResult(**{k: v for k, v in d.items() if k in known})


OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "CUDA Error: out of memory",
               "CUDA error: out of memory")  # fmt: skip
_REFUSAL = re.compile(r"\b(?:ValueError|AssertionError): (.+)")
"""vLLM refuses settings with a ValueError: heads not divisible by tensor parallel size
(vllm/config/model.py verify_with_parallel_config), too little free memory for
gpu_memory_utilization (vllm/v1/worker/utils.py request_memory), no KV-cache memory or too
little for one max_model_len request (vllm/v1/core/kv_cache_utils.py); kv heads that tp does
not divide nor is a multiple of fail `divide`'s assertion (vllm/distributed/utils.py, from
QKVParallelLinear). In the engine core process: the front end raises only 'Engine core
initialization failed. See root cause above', so the root cause is read from the log."""


def classify_failure(error: str, log_tail: str = "") -> tuple[str, str]:
    """(status, reason) of a failed generation from the exception's line and the log's tail:
    oom where a CUDA OOM shows, refused where vLLM's ValueError names its reason, else failed."""
    text = f"{log_tail}\n{error}"
    refusals = _REFUSAL.findall(text)
    if any(m in text for m in OOM_MARKERS):
        line = next(
            (ln.strip() for ln in reversed(text.splitlines()) if any(m in ln for m in OOM_MARKERS)),
            error,
        )
        return "oom", line[:300]
    if refusals:
        return "refused", f"vLLM refused: {refusals[-1].strip()}"[:300]
    return "failed", (error or "generation worker failed")[:300]
