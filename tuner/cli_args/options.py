"""The `tune run` options that serve only some runners (and launchers), declared once: the parser
adds each through `tuner.cli_parser`'s helper, which takes its default and the launcher its help
names from here, and `check_runner_options` refuses one given where it would do nothing (a
`--ray-address` under `--runner estimate` was ignored without a word).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from tuner.errors import UserError


@dataclass(frozen=True, kw_only=True, slots=True)
class Runners:
    """The `--runner` values an option serves, and how a refusal names them."""

    names: tuple[str, ...]
    """The `--runner` values under which the option does something."""
    text: str
    """What a refusal says the option applies to: `--runner verl only`."""
    fix: str
    """What a refusal asks, `{flag}` standing for the option: `add --runner verl or ...`."""


VERL = Runners(
    names=("verl", "ladder"),
    text="--runner verl or ladder only",
    fix="add --runner verl or leave {flag} out",
)
MEGATRON = Runners(
    names=("megatron", "auto", "ladder"),
    text="the megatron runner (--runner megatron, auto, or ladder's screening rung)",
    fix="leave it out",
)
LADDER = Runners(
    names=("ladder",),
    text="--runner ladder only",
    fix="add --runner ladder or leave {flag} out",
)
LAUNCHING = Runners(
    names=("megatron", "verl", "ladder", "auto"),
    text="the runners that launch trials (megatron, verl, ladder, or auto where it picks megatron)",
    fix="leave {flag} out (the estimator launches nothing)",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOption:
    """A `tune run` option that serves only some runners, or one launcher of the verl runner."""

    flag: str
    """Its name on the command line: `--ray-address`."""
    runners: Runners
    """The runners it serves; under another it is refused."""
    launcher: str = ""
    """The `--launcher` it serves ("" for any); its help opens with `--launcher <it>:`."""
    default: Any = None
    """Its value when not given, the parser's default (a tuple for a repeatable option: the
    parser's default is a list of it)."""
    note: str = ""
    """Said after the refusal's fix, in parentheses, where the refusal needs a reason."""
    echo: bool = False
    """The refusal names the option as given (`--layer-spec local`, `--no-measure-generation`)."""

    @property
    def dest(self) -> str:
        """Its attribute on the parsed arguments."""
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def parser_default(self) -> Any:
        """The default the parser is given (a fresh list for a repeatable option)."""
        return list(self.default) if isinstance(self.default, tuple) else self.default

    def given(self, value: Any) -> bool:
        """Whether `value` (from the parsed arguments) is other than the option left out."""
        return value is not None and value != self.parser_default

    def as_given(self, value: Any) -> str:
        """The option as the command line had it, for a refusal."""
        if not self.echo:
            return self.flag
        if value is False:
            return f"--no-{self.flag[2:]}"
        if value is True:
            return self.flag
        return f"{self.flag} {value}"


RUN_OPTIONS: dict[str, RunOption] = {
    o.flag: o
    for o in (
        RunOption(flag="--trial-timeout", runners=LAUNCHING, default=1800.0),
        RunOption(flag="--confirm-top", runners=LADDER, default=3),
        RunOption(
            flag="--measure-generation",
            runners=MEGATRON,
            echo=True,
            note="the verl runner always generates, the estimator never does",
        ),
        RunOption(flag="--layer-spec", runners=MEGATRON, default="auto", echo=True),
        RunOption(flag="--launcher", runners=VERL, default="local"),
        RunOption(flag="--model-path", runners=VERL),
        RunOption(flag="--train-file", runners=VERL),
        RunOption(flag="--reward-fn", runners=VERL),
        RunOption(flag="--verl-bridge", runners=VERL),
        RunOption(flag="--verl-override", runners=VERL, default=()),
        RunOption(flag="--verl-env", runners=VERL, default=()),
        RunOption(flag="--verl-steps", runners=VERL, default=3),
        RunOption(flag="--ray-address", runners=VERL, launcher="ray"),
        RunOption(flag="--shared-ray", runners=VERL, launcher="local", default=False),
        RunOption(flag="--slurm-partition", runners=VERL, launcher="slurm"),
        RunOption(flag="--slurm-account", runners=VERL, launcher="slurm"),
        RunOption(flag="--slurm-arg", runners=VERL, launcher="slurm", default=()),
        RunOption(flag="--slurm-setup", runners=VERL, launcher="slurm", default=""),
    )
}
"""Each `tune run` option that serves only some runners or launchers, by its flag, in the order
`check_runner_options` asks them."""


def check_runner_options(args: argparse.Namespace) -> None:
    """No option of `RUN_OPTIONS` is given where it does nothing: under a runner it does not
    serve, or under a launcher other than its own."""
    for opt in RUN_OPTIONS.values():
        value = getattr(args, opt.dest, opt.parser_default)
        if not opt.given(value):
            continue
        runners = opt.runners
        if args.runner not in runners.names:
            note = f" ({opt.note})" if opt.note else ""
            raise UserError(
                f"{opt.as_given(value)} applies to {runners.text}, not --runner {args.runner}: "
                f"{runners.fix.format(flag=opt.flag)}{note}"
            )
        if opt.launcher and args.launcher != opt.launcher:
            raise UserError(
                f"{opt.flag} applies to --launcher {opt.launcher} only, not --launcher "
                f"{args.launcher}: add --launcher {opt.launcher} or leave {opt.flag} out"
            )
