"""The software versions a prediction assumes: what the cost model's defaults, the knob table's
keys and validity rules, and the exported recipes were written against.

Sources: verl 0.9.1 is the version installed beside the tuner (its Hydra config is what
tests/test_verl_command.py composes); vLLM 0.24.0 and torch 2.11.0 are what verl 0.9.1 pins in
its `vllm` extra (verl-0.9.1.dist-info/METADATA: `vllm==0.24.0; extra == "vllm"`,
`torch==2.11.0`); megatron-core 0.19.2 is the source the layout rules were read from
(transformer_config.py, transformer_block.py).
"""

from __future__ import annotations

VERL = "0.9.1"
VLLM = "0.24.0"
MEGATRON_CORE = "0.19.2"
TORCH = "2.11.0"

ASSUMED: dict[str, str] = {
    "verl": VERL,
    "vllm": VLLM,
    "megatron_core": MEGATRON_CORE,
    "torch": TORCH,
}
"""Package -> version a prediction assumes (leaderboard rows carry it as `assumed_versions`)."""


def summary() -> str:
    """`verl 0.9.1, vllm 0.24.0, megatron_core 0.19.2, torch 2.11.0`."""
    return ", ".join(f"{k} {v}" for k, v in ASSUMED.items())
