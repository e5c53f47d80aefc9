"""Argument types of the `tune` command line: the syntax of one value, checked by argparse.

The `type=` functions (`positive_int`, `study_name`, `layout_text`, ...) raise
`argparse.ArgumentTypeError`; `OneLineParser` turns every argparse complaint into a `UserError`
that names the argument (`argument --top: ...`), which `tuner.cli.main` prints as one line that
says what to change, exit 2.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from tuner.bounds import TRIAL_SECONDS as TRIAL_SECONDS  # re-exported: --trial-timeout
from tuner.bounds import Bounds
from tuner.errors import UserError
from tuner.verl_settings import split_env, split_override

MAX_NAME_CHARS = 100
"""Longest study name: it becomes file names (`<study>.csv`, `<study>/trials/`) and Optuna's
study name, and the file system allows 255 bytes per name."""

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=@,-]*")
_INT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
SEED_MAX = 2**32 - 1
"""numpy's (and so Optuna's samplers') largest seed."""


def shown(text: str, limit: int = 40) -> str:
    """The user's value, quoted and cut short, for a one-line message."""
    s = text if len(text) <= limit else text[:limit] + "..."
    return repr(s)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a `UserError` (one line, exit 2 in `main`) instead of
    the usage block plus a message that argparse prints and exits with."""

    commands: tuple[str, ...] = ()
    """The names of its subcommands, as `tuner.cli_parser.build_parser` declares them (read
    here, not from argparse's private `_actions`)."""

    def error(self, message: str) -> NoReturn:
        hint = f" (see `{self.prog} --help`)"
        raise UserError(" ".join(message.splitlines()) + hint)


# --------------------------------------------------------------------------------------------
# Numbers. int()/float() alone accept full-width digits, `1_000`, `nan` and `inf`: refused.
# --------------------------------------------------------------------------------------------


def _whole(text: str) -> int:
    s = text.strip()
    if not _INT_RE.fullmatch(s):
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a whole number: write e.g. 8")
    return int(s)


def _real(text: str) -> float:
    s = text.strip()
    if not _FLOAT_RE.fullmatch(s):
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a number: write e.g. 1800 or 0.5")
    v = float(s)
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{shown(text)} is too large: write a finite number")
    return v


# --------------------------------------------------------------------------------------------
# The options' bounds, declared once: their argparse types below ask these (a knob's bounds are
# the knob's own: tuner.space.knobs, asked by `knob_value`).
# --------------------------------------------------------------------------------------------

GPUS = Bounds(low=1, high=65536, unit="GPUs", why="the most any one training job runs on")
"""--gpus."""
GPUS_PER_NODE = Bounds(low=1, high=576, unit="GPUs", why="the largest NVLink domain")
"""--gpus-per-node: one node's NVLink domain."""
TOKENS = Bounds(
    low=1, high=2**20, unit="tokens", why="2**20, beyond any model's context window here"
)
"""--prompt-len, --response-len and their means."""
PROMPTS = Bounds(low=1, high=65536, unit="prompts", why="128 times the dapo-math preset's 512")
"""--batch and --mini-batch: prompts per step (data.train_batch_size) or per mini batch."""
RESPONSES = Bounds(low=1, high=1024, unit="responses per prompt")
"""--n: rollout.n."""
TRIALS = Bounds(
    low=1,
    high=100_000,
    unit="trials",
    why="a 100,000-trial leaderboard is about 200 MiB, near what tune reads back",
)
"""--trials."""
HOST_MEM = Bounds(low=1, high=65536, unit="GiB", why="64 TiB, beyond any one node's RAM")
"""--host-mem-gib: one node's host memory."""
STUDY_SECONDS = Bounds(low=1, high=30 * 86400, unit="s", why="30 days")
"""--timeout: how long a study starts trials."""
# --trial-timeout: TRIAL_SECONDS, declared in tuner.bounds (tune calibrate's measured times
# are bounded by it too); a launch ends as `timeout` after it; under a second none starts.
STEPS = Bounds(low=1, high=1_000_000, unit="steps")
"""tune export --steps: trainer.total_training_steps."""
VERL_STEPS = Bounds(low=1, high=100, unit="steps")
"""tune run --verl-steps: the training steps of each verl trial, steps 3.. measured (a trial is
a few minutes of start-up and tens of seconds a step: a hundred is already a long run)."""


def _bounded(read: Callable[[str], float], bounds: Bounds, doc: str) -> Callable[[str], Any]:
    def arg(text: str) -> Any:
        v = read(text)
        why = bounds.refusal(v)
        if why is not None:
            raise argparse.ArgumentTypeError(why)
        return v

    arg.__doc__ = f"{doc} {bounds.text}."
    return arg


def whole_in(bounds: Bounds) -> Callable[[str], int]:
    """An argparse type: a whole number within `bounds` (the option's declaration)."""
    return _bounded(positive_int if bounds.low >= 1 else _whole, bounds, "A whole number")


def real_in(bounds: Bounds) -> Callable[[str], float]:
    """An argparse type: a finite number within `bounds` (the option's declaration)."""
    positive = bounds.low > 0 or (bounds.low_open and bounds.low == 0)
    return _bounded(positive_float if positive else _real, bounds, "A finite number")


def knob_value(name: str, whole: bool, positive: bool = False) -> Callable[[str], Any]:
    """An argparse type for an option that sets knob `name` (`tune estimate
    --gpu-memory-utilization`): the number within the knob's own bounds
    (tuner.space.knobs.Knob.bounds), the same check a CSV cell and `tune export` get."""

    def arg(text: str) -> Any:
        from tuner.space.knobs import knob_refusal

        v = _whole(text) if whole else _real(text)
        if positive and v <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {v}")
        why = knob_refusal(name, v)
        if why is not None:
            raise argparse.ArgumentTypeError(why)
        return v

    arg.__doc__ = f"A value of knob {name}, within its bounds."
    return arg


def positive_int(text: str) -> int:
    """A whole number >= 1 (GPUs, trials, lengths, batch sizes, --top, --steps)."""
    v = _whole(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {v}")
    return v


def _checked_by(check: Callable[[str], object], doc: str) -> Callable[[str], str]:
    """An argparse type that runs `check` on the text (its UserError becomes argparse's
    message) and returns the text."""

    def arg(text: str) -> str:
        try:
            check(text)
        except UserError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1]) from None
        return text

    arg.__doc__ = doc
    return arg


verl_override_text = _checked_by(
    split_override,
    "`KEY=VALUE`, a Hydra override of verl's config (the keys are checked against verl's own "
    "config by the verl runner's preflight).",
)
env_assignment = _checked_by(split_env, "`NAME=VALUE`, a variable for every verl trial.")


def non_negative_int(text: str) -> int:
    """A whole number >= 0 (--recipes 0 writes none; trial numbers start at 0)."""
    v = _whole(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


def seed(text: str) -> int:
    """A sampler seed, 0 .. 2**32-1 (numpy's range)."""
    v = _whole(text)
    if not 0 <= v <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be between 0 and {SEED_MAX}, got {v}")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds)."""
    v = _real(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text.strip()}")
    return v


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (GiB of headroom)."""
    v = _real(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text.strip()}")
    return v


# --------------------------------------------------------------------------------------------
# Names and layouts
# --------------------------------------------------------------------------------------------


def study_name(text: str) -> str:
    """A study name that stays a plain file name under results/ and recipes/: ASCII letters,
    digits and `. _ - + = @ ,`, starting with a letter or digit, at most MAX_NAME_CHARS; empty
    means the default name. Refuses `/`, `\\`, `..` (a path out of results/), spaces and
    non-ASCII."""
    if text == "":
        return text
    if len(text) > MAX_NAME_CHARS:
        raise argparse.ArgumentTypeError(
            f"{shown(text)} has {len(text)} characters: use at most {MAX_NAME_CHARS}"
        )
    if not _NAME_RE.fullmatch(text) or ".." in text:
        raise argparse.ArgumentTypeError(
            f"{shown(text)} is not a plain name: use ASCII letters, digits and . _ - "
            "(no / or .., it names files under results/)"
        )
    return text


def model_arg(text: str) -> str:
    """A registry name or a path to a config.json; refuses what cannot be either (empty, control
    characters, names longer than a file system allows) with the same advice as an unknown
    name, instead of an OSError from the path lookup."""
    if not text.strip() or not text.isprintable():
        raise argparse.ArgumentTypeError(
            f"{shown(text)} is not a model: pass a name from `tune models` or a config.json path"
        )
    too_long = len(os.fsencode(text)) > 4095 or any(
        len(os.fsencode(part)) > 255 for part in Path(text).parts
    )
    if too_long:
        raise argparse.ArgumentTypeError(
            f"unknown model {shown(text)} ({len(text)} characters): pass a name from "
            "`tune models` or a config.json path"
        )
    return text


def layout_text(text: str) -> str:
    """A parallel layout in the reference notation (`tp4pp2vpp2`, `ep8cp2`, `dp8`,
    `pp8first10last12`), read by the layout's own grammar (tuner.space.layout.read_degrees).
    The degrees' fit to the GPU count is checked by `ParallelLayout.parse` once the cluster is
    known."""
    from tuner.space.layout import read_degrees

    try:
        read_degrees(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None  # the parser adds `see --help`
    return text


def path_text(text: str) -> Path:
    """A path argument: not empty, printable, names the file system allows."""
    if not text.strip() or not text.isprintable():
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a path: pass a file or folder")
    if any(len(os.fsencode(p)) > 255 for p in Path(text).parts):
        raise argparse.ArgumentTypeError(
            f"{shown(text)} has a name longer than 255 bytes: shorten it"
        )
    return Path(text)
