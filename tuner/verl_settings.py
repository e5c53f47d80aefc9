"""What a verl trial runs besides the candidate's knobs: the Megatron bridge, the user's extra Hydra
overrides (`--verl-override`) and the environment (`--verl-env`, and what the host needs, found by
the preflight). One typed value, recorded in every row (`verl_bridge`, `verl_overrides`,
`verl_env`) and exported in the recipe: what the row ran is what the recipe runs."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tuner.errors import UserError

BRIDGES: dict[str, bool] = {"megatron-bridge": False, "mbridge": True}
"""Bridge name -> `vanilla_mbridge`. verl 0.9.1 builds Megatron models only through a bridge
(verl/workers/engine/megatron/transformer_impl.py: `vanilla_mbridge` imports
verl/models/mcore/mbridge.py -> `mbridge`, else verl/models/mcore/bridge.py -> `megatron.bridge`).
The ref inherits the actor's value (ref/megatron_ref.yaml `oc.select`); PPO's critic has its own
(critic/megatron_critic.yaml takes engine/megatron.yaml: False), so it is set too."""
BRIDGE_KEY = "megatron.vanilla_mbridge"
"""The bridge's key below the actor and the critic."""
BRIDGE_MODULES: dict[str, str] = {"megatron-bridge": "megatron.bridge", "mbridge": "mbridge"}
BRIDGE_PACKAGES: dict[str, str] = {"megatron-bridge": "megatron-bridge", "mbridge": "mbridge"}
DEFAULT_BRIDGE = "megatron-bridge"
"""verl 0.9.1's default (trainer/config/engine/megatron.yaml: `vanilla_mbridge: False`)."""

_KEY = re.compile(r"(\+\+|\+|~)?[A-Za-z_][\w\-]*(\.[\w\-]+)*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _assignment(text: str, pattern: re.Pattern[str], option: str, example: str) -> tuple[str, str]:
    """`NAME=VALUE` with NAME matching `pattern`; UserError saying what to give."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not pattern.fullmatch(name) or name.startswith("~"):
        raise UserError(f"{option} {text!r}: give {example}")
    if "\n" in value or "\0" in value:
        raise UserError(f"{option} {name}: the value has a line break or NUL; remove it")
    return name, value


def split_override(text: str) -> tuple[str, str]:
    """`KEY=VALUE` (Hydra's grammar: `+KEY` adds, `++KEY` adds or sets) -> (KEY, VALUE)."""
    return _assignment(
        text,
        _KEY,
        "--verl-override",
        "KEY=VALUE with a dotted verl config key, e.g. "
        "actor_rollout_ref.rollout.free_cache_engine=True",
    )


def bare_key(key: str) -> str:
    """The config key without Hydra's `+`/`++` prefix."""
    return key.lstrip("+")


def split_env(text: str) -> tuple[str, str]:
    return _assignment(
        text,
        _ENV_NAME,
        "--verl-env",
        "NAME=VALUE with a shell variable name, e.g. VLLM_USE_FLASHINFER_SAMPLER=0",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class VerlSettings:
    """The settings of every trial of a `--runner verl` study (not searched)."""

    bridge: str = DEFAULT_BRIDGE
    """`megatron-bridge` (verl's default) or `mbridge` (`vanilla_mbridge=True`)."""
    overrides: tuple[tuple[str, str], ...] = ()
    """Extra Hydra overrides, (key as given, value as Hydra text), after the tuner's own."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment of the trial (and the recipe): the user's and what the host needs."""

    def __post_init__(self) -> None:
        if self.bridge not in BRIDGES:
            raise UserError(
                f"--verl-bridge {self.bridge!r}: use one of {', '.join(BRIDGES)} "
                f"(verl's default is {DEFAULT_BRIDGE})"
            )
        seen: set[str] = set()
        for key, _ in self.overrides:
            if bare_key(key).endswith(BRIDGE_KEY):
                raise UserError(f"--verl-override {bare_key(key)}: use --verl-bridge instead")
            if bare_key(key) in seen:
                raise UserError(f"--verl-override {bare_key(key)} is given twice: keep one")
            seen.add(bare_key(key))
        names = [n for n, _ in self.env]
        for n in names:
            if names.count(n) > 1:
                raise UserError(f"--verl-env {n} is given twice: keep one")

    @classmethod
    def parse(
        cls, *, bridge: str | None, overrides: Iterable[str] = (), env: Iterable[str] = ()
    ) -> VerlSettings:
        """From the command line's values; UserError naming what to change."""
        return cls(
            bridge=bridge or DEFAULT_BRIDGE,
            overrides=tuple(split_override(o) for o in overrides),
            env=tuple(split_env(e) for e in env),
        )

    def with_env(self, extra: Mapping[str, str]) -> VerlSettings:
        """The settings with `extra` variables the user did not set (the user's value wins)."""
        have = {n for n, _ in self.env}
        added = tuple((k, v) for k, v in extra.items() if k not in have)
        return VerlSettings(bridge=self.bridge, overrides=self.overrides, env=self.env + added)

    @property
    def bridge_module(self) -> str:
        return BRIDGE_MODULES[self.bridge]

    def hydra_overrides(self, *, critic: bool = False) -> dict[str, str]:
        """key -> Hydra text of the bridge (the actor's, and the critic's with `critic`) and the
        user's overrides, in order."""
        vanilla = "True" if BRIDGES[self.bridge] else "False"
        out = {f"actor_rollout_ref.actor.{BRIDGE_KEY}": vanilla}
        if critic:
            out[f"critic.{BRIDGE_KEY}"] = vanilla
        out.update(self.overrides)
        return out

    def override_args(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.hydra_overrides().items()]

    def environment(self) -> dict[str, str]:
        return dict(self.env)

    # ---- the row ---------------------------------------------------------------------------

    def record(self) -> dict[str, str]:
        """The row's columns (shell words, so a row reads back exactly)."""
        return {
            "verl_bridge": self.bridge,
            "verl_overrides": shlex.join(f"{k}={v}" for k, v in self.overrides),
            "verl_env": shlex.join(f"{k}={v}" for k, v in self.env),
        }

    @classmethod
    def from_record(cls, row: Mapping[str, object]) -> VerlSettings | None:
        """The settings a row ran with, or None for a row of another runner (or an older one)."""
        bridge = str(row.get("verl_bridge") or "")
        if not bridge:
            return None
        try:
            return cls.parse(
                bridge=bridge,
                overrides=shlex.split(str(row.get("verl_overrides") or "")),
                env=shlex.split(str(row.get("verl_env") or "")),
            )
        except ValueError as e:
            raise UserError(f"the row's verl settings cannot be read ({e})") from None
