"""The `--runner verl` preflight: before the first launch, in the Python the trials use, check that
verl, vLLM, megatron-core, transformer-engine and the chosen Megatron bridge import, that their
versions go together, and that the user's `--verl-override`s compose with verl's own config.
Anything missing or mismatched is one line saying what to install (UserError: exit 2), never a
failed trial two minutes later. What the host lacks but a trial can do without becomes the
trial's environment or a pinned knob, recorded in every row."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner import versions
from tuner.errors import UserError
from tuner.verl_settings import BRIDGE_PACKAGES, VerlSettings

PROBE = Path(__file__).with_name("verl_probe.py")
PROBE_TIMEOUT_S = 300.0
"""Importing vLLM and verl takes 10-30 s on a GPU host; a hung import ends the preflight."""
MARKER = "verl-tuner preflight: "
HOST_SCRIPT = "scripts/gpu_verl_host.sh"
NO_FLASHINFER_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
"""Without flashinfer, vLLM 0.24's rollout needs its flashinfer sampler off (found on the lent
H100 and written down in ../shared/tools/gpu-verl-kit/README.md)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Preflight:
    """What the probe found and what follows for the trials."""

    python: str
    versions: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)
    """Variables every trial needs on this host (recorded in the row and the recipe)."""
    pinned: tuple[tuple[str, Any], ...] = ()
    """Knobs the host cannot run other values of (sampler parameter, value)."""
    notes: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def versions_text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.versions.items() if v)


def run_probe(
    python: str,
    settings: VerlSettings,
    timeout_s: float = PROBE_TIMEOUT_S,
    *,
    compose_only: bool = False,
) -> dict:
    """Run the probe with `python`; its JSON, or UserError when it cannot run at all.
    `compose_only`: the overrides composed with verl's config, no other import."""
    args = json.dumps(
        {
            "bridge_module": settings.bridge_module,
            "overrides": settings.override_args(),
            "compose_only": compose_only,
        }
    )
    try:
        done = subprocess.run(
            [python, str(PROBE), args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise UserError(
            f"--runner verl: the trials' Python {python} does not exist: pass an interpreter "
            "that has verl installed"
        ) from None
    except subprocess.TimeoutExpired:
        raise UserError(
            f"--runner verl preflight: importing verl and vLLM with {python} took over "
            f"{timeout_s:.0f} s: check that interpreter's packages"
        ) from None
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
    raise UserError(f"--runner verl preflight could not run with {python}: {tail}")


def interpret(found: dict, settings: VerlSettings) -> Preflight:
    """The probe's findings as a Preflight, or UserError with the first problem."""
    python = str(found.get("python", "python3"))
    v: dict[str, str] = dict(found.get("versions", {}))
    errors: dict[str, str] = dict(found.get("import_errors", {}))
    pins: dict[str, str] = dict(found.get("pins", {}))
    where = f"in {python}"
    setup = f"(a bare GPU host: {HOST_SCRIPT})"

    def need(name: str, what: str) -> None:
        if name in errors:
            raise UserError(
                f"--runner verl: {what} does not import {where} ({errors[name]}): "
                f"install it {setup}"
            )

    need("verl", f"verl {versions.VERL}")
    if v.get("verl") != versions.VERL:
        raise UserError(
            f"--runner verl: verl {v.get('verl')} {where}; the tuner's overrides are checked "
            f"against verl {versions.VERL}: install verl=={versions.VERL}"
        )
    vllm_pin = pins.get("vllm") or versions.VLLM
    need("vllm", f"vLLM {vllm_pin} (verl {versions.VERL}'s pin)")
    if v.get("vllm") != vllm_pin:
        raise UserError(
            f"--runner verl: vLLM {v.get('vllm')} {where}, verl {versions.VERL} pins "
            f"vllm=={vllm_pin}: install that"
        )
    torch_pin = pins.get("torch")
    if torch_pin and (v.get("torch") or "").split("+")[0] != torch_pin:
        raise UserError(
            f"--runner verl: torch {v.get('torch')} {where}, vLLM {vllm_pin} needs "
            f"torch=={torch_pin}: install that build"
        )
    need("megatron-core", f"megatron-core (the tuner assumes {versions.MEGATRON_CORE})")
    need(
        "transformer-engine",
        "transformer-engine (both of verl's Megatron bridges build its layers)",
    )
    if "bridge" in errors:
        other = next(b for b in BRIDGE_PACKAGES if b != settings.bridge)
        raise UserError(
            f"--runner verl: the {settings.bridge} bridge does not import {where} "
            f"({errors['bridge']}): install {BRIDGE_PACKAGES[settings.bridge]}, or pass "
            f"--verl-bridge {other} with {BRIDGE_PACKAGES[other]} installed"
        )
    if found.get("mbridge_model_type"):
        raise UserError(
            f"--runner verl: mbridge {v.get('mbridge')} reads ModelType.encoder_and_decoder, "
            f"which megatron-core {v.get('megatron-core')} removed "
            f"({found['mbridge_model_type']}): the model build would fail; patch it with "
            f"`bash {HOST_SCRIPT} patch-mbridge` or use --verl-bridge megatron-bridge"
        )
    if found.get("compose_error"):
        raise UserError(
            f"--verl-override: verl {versions.VERL}'s config refuses it: {found['compose_error']}"
        )
    optional = found.get("optional", {})
    env = {} if optional.get("flashinfer") else dict(NO_FLASHINFER_ENV)
    pinned: tuple[tuple[str, Any], ...] = ()
    notes: list[str] = []
    if not optional.get("flash_attn"):
        pinned += (("attention_backend", "auto"),)
        notes.append("flash_attn is not installed: attention_backend pinned to auto")
    if not optional.get("apex_wgrad"):
        pinned += (("gradient_accumulation_fusion", False),)
        notes.append(
            "APEX's fused_weight_gradient_mlp_cuda is not installed: "
            "gradient_accumulation_fusion pinned off"
        )
    if not optional.get("deep_ep"):
        pinned += (("moe_token_dispatcher_type", "alltoall"),)
        notes.append("DeepEP is not installed: moe_token_dispatcher_type pinned to alltoall")
    if env:
        notes.append("flashinfer is not installed: trials set VLLM_USE_FLASHINFER_SAMPLER=0")
    return Preflight(
        python=python,
        versions={k: x for k, x in v.items() if x},
        env=env,
        pinned=pinned,
        notes=tuple(notes),
        seconds=float(found.get("seconds", 0.0)),
    )


def preflight(python: str, settings: VerlSettings) -> Preflight:
    return interpret(run_probe(python, settings), settings)
