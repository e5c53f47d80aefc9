"""The verl preflight's probe: run by path with the Python the trials use (no tuner import, the
standard library and what it probes only), it imports what a verl Megatron trial imports, reads
the versions and pins from the installed packages' metadata, composes the user's overrides with
verl's own Hydra config, and prints one JSON object on its last line. The tuner imports it too,
for the one list of packages whose versions a trial records (PACKAGES); importing it does
nothing else.

usage: python verl_probe.py '{"bridge_module": "mbridge", "overrides": ["k=v", ...]}'
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import os
import re
import sys
import time
from typing import Any

PACKAGES = (
    "verl",
    "vllm",
    "megatron-core",
    "transformer-engine",
    "mbridge",
    "megatron-bridge",
    "torch",
    "ray",
    "transformers",
    "flash-attn",
    "flashinfer-python",
)
"""The packages whose versions a verl trial records: this probe's `versions` and the line the
verl runner prints where each trial runs (tuner.runners.verl imports this tuple)."""
IMPORTS = {
    "verl": "verl",
    "vllm": "vllm",
    "megatron-core": "megatron.core",
    "transformer-engine": "transformer_engine.pytorch",
}
"""What every verl Megatron trial imports (the bridge is added from the arguments)."""
OPTIONAL = {
    "flash_attn": "flash_attn",
    "flashinfer": "flashinfer",
    # megatron-core's gradient_accumulation_fusion needs APEX's extension, also with TE layers
    # (megatron/core/tensor_parallel/layers.py raises "fused_weight_gradient_mlp_cuda module is
    # not found"; seen failing a verl trial on the lent H100)
    "apex_wgrad": "fused_weight_gradient_mlp_cuda",
    # megatron-core 0.19.2's flex MoE dispatcher runs on DeepEP by default
    # (transformer_config.py: moe_flex_dispatcher_backend "deepep"); without deep_ep,
    # moe/fused_a2a.py has no fused_dispatch and token_dispatcher.py's _DeepepManager raises
    "deep_ep": "deep_ep",
}


def _version(pkg: str) -> str:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return ""


def _pin(pkg: str, dep: str, extra: str) -> str:
    """The `==` pin of `dep` in `pkg`'s metadata under `extra` ('' if none)."""
    try:
        reqs = md.requires(pkg) or []
    except md.PackageNotFoundError:
        return ""
    for r in reqs:
        m = re.match(rf"{re.escape(dep)}\s*==\s*([\w.+]+)\s*(;.*)?$", r)
        if m and (not extra or (m.group(2) and f'extra == "{extra}"' in m.group(2))):
            return m.group(1)
    return ""


def _import(module: str) -> str:
    """'' when it imports, else the error's last line."""
    try:
        importlib.import_module(module)
    except BaseException as e:  # noqa: BLE001 - a broken extension raises anything
        return f"{type(e).__name__}: {e}".splitlines()[0][:300]
    return ""


def _mbridge_model_type() -> str:
    """mbridge 0.15.1 reads `ModelType.encoder_and_decoder`, which megatron-core 0.19 removed
    (mbridge/core/util.py): the model build then fails. '' when they agree."""
    try:
        from megatron.core.enums import ModelType

        if hasattr(ModelType, "encoder_and_decoder"):
            return ""
        import importlib.util

        spec = importlib.util.find_spec("mbridge.core.util")  # read, not imported
        path = (spec.origin if spec else "") or ""
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except BaseException:  # noqa: BLE001
        return ""
    if "ModelType.encoder_and_decoder" in text:
        return path
    return ""


def _compose(overrides: list[str]) -> str:
    """'' when the overrides compose with verl's ppo_megatron_trainer, else Hydra's message."""
    try:
        import verl
        from hydra import compose, initialize_config_dir

        cfg_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
        with initialize_config_dir(config_dir=cfg_dir, version_base=None):
            compose(config_name="ppo_megatron_trainer", overrides=overrides)
    except BaseException as e:  # noqa: BLE001
        return " ".join(f"{type(e).__name__}: {e}".split())[:400]
    return ""


def probe(args: dict[str, Any]) -> dict[str, Any]:
    t0 = time.monotonic()
    if args.get("compose_only"):  # where the trials run elsewhere: the overrides only
        return {"compose_error": _compose(list(args.get("overrides", [])))}
    imports = dict(IMPORTS)
    if args.get("bridge_module"):
        imports["bridge"] = str(args["bridge_module"])
    errors = {name: _import(mod) for name, mod in imports.items()}
    return {
        "python": sys.executable,
        "versions": {p: _version(p) for p in PACKAGES},
        "import_errors": {k: v for k, v in errors.items() if v},
        "optional": {k: not _import(mod) for k, mod in OPTIONAL.items()},
        "pins": {
            "vllm": _pin("verl", "vllm", "vllm"),
            "torch": _pin("vllm", "torch", ""),
        },
        "mbridge_model_type": (
            _mbridge_model_type() if args.get("bridge_module") == "mbridge" else ""
        ),
        "compose_error": (
            _compose(list(args.get("overrides", []))) if not errors.get("verl") else ""
        ),
        "seconds": round(time.monotonic() - t0, 1),
    }


def _drop_own_folder() -> None:
    """Run by path, Python puts this folder first on sys.path, where the tuner's own `verl.py`
    (the runner) would shadow the verl package: the probe imports only what is installed (it
    imports nothing from here before this; verl and the rest are imported inside probe())."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]


if __name__ == "__main__":
    _drop_own_folder()
    out = probe(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
    sys.stdout.flush()
    print("\nverl-tuner preflight: " + json.dumps(out), flush=True)
