"""The values a setting allows (`Bounds`), declared once beside the setting: a knob's in
`tuner.space.knobs` (`Knob.bounds`), a command-line option's in `tuner.cli_args.values`. Every
entry point (the option's argparse type, a CSV cell, `tune export`, `tune calibrate`) asks that
declaration, so each says the same range in the same words. A leaf module: stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Bounds:
    """The closed range `low..high` a number must lie in (`low` itself refused where
    `low_open`); NaN and infinities never do."""

    low: float
    """The smallest value allowed (or the bound above which values lie, with `low_open`)."""
    high: float
    """The largest value allowed."""
    low_open: bool = False
    """`low` itself is refused: a share in (0, 1] (vLLM's `gt=0, le=1`)."""
    unit: str = ""
    """What the number counts, for the message (`GPUs`, `s`, `tokens`)."""
    why: str = ""
    """Why the upper end is where it is, for the message (`the largest NVLink domain`)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low > self.high:
            raise ValueError(f"Bounds: low {self.low} .. high {self.high} is not a range")

    def allows(self, value: float) -> bool:
        """Whether `value` lies in the range (a bool is no number here)."""
        if isinstance(value, bool) or not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    @property
    def text(self) -> str:
        """The range in words: `from 1 to 65536 GPUs`, `more than 0 and at most 1`."""
        unit = f" {self.unit}" if self.unit else ""
        if self.low_open:
            return f"more than {number_text(self.low)} and at most {number_text(self.high)}{unit}"
        return f"from {number_text(self.low)} to {number_text(self.high)}{unit}"

    def refusal(self, value: float) -> str | None:
        """None where `value` is allowed; else why not, as a sentence that gives the range:
        `must be from 1 to 65536 prompts (<why>), got 1000000000000`."""
        if self.allows(value):
            return None
        why = f" ({self.why})" if self.why else ""
        return f"must be {self.text}{why}, got {number_text(value)}"


def number_text(value: float) -> str:
    """A number as a message writes it: whole numbers in digits (65536, not 6.5536e+04), others
    in at most 6 significant digits (1e-300, 7.5)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if abs(value) < 10**15 else f"{value:.6g}"
    if math.isfinite(value) and float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}"


TRIAL_SECONDS = Bounds(low=1, high=7 * 86400, unit="s", why="7 days, for a trial of a few steps")
"""How long one trial may run: `tune --trial-timeout` (tuner.cli_args.values), and so the
longest time a measured row's step or phase can hold (`tune calibrate` refuses longer ones)."""
