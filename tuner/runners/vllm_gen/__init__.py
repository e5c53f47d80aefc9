"""The megatron runner's generation worker: one vLLM engine kept alive across trials whose
rollout settings match, generating a trial's share of the step at exact lengths.

    python -m tuner.runners.vllm_gen --pool DIR      (requests as megatron_pool's)

Modules: `spec` (request and result, pure Python), `engine` (the vLLM calls), `main` (the
request loop). Everything imported here runs without vLLM."""

from tuner.runners.vllm_gen.spec import (
    SCHEMA,
    STATUSES,
    EngineCfg,
    GenResult,
    GenSpec,
    classify_failure,
    load_gen_spec,
    parse_gen_result,
)

__all__ = [
    "SCHEMA",
    "STATUSES",
    "EngineCfg",
    "GenResult",
    "GenSpec",
    "classify_failure",
    "load_gen_spec",
    "parse_gen_result",
]
