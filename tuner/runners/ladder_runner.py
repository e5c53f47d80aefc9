"""The fidelity ladder as one runner: the fast runner (megatron-core training phases in a
persistent pool + vLLM-measured generation) screens every candidate the study proposes, real
verl confirms the best few. Which candidates climb to verl is the study's decision
(tuner.study.ladder: it knows every row and the ratios learned between the rungs); this runner
measures a candidate on the rung it is asked for and says which in the row's `source`
(`megatron` or `verl`: the rung, the one notion rows and `tune show` already have).

Rows' runner is `ladder`; a confirmation's `extra` names the screened trial it confirms
(`confirms=<n>`), also written to the trial's folder (CONFIRMS_NAME) so that a confirmation
read back after its worker died (`recover`) keeps the link."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from tuner.estimate import Estimate
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.results import TrialResult
from tuner.runners.base import Predicted, Runner, TrialSpec
from tuner.space import SpaceLimits

CONFIRMS_NAME = "confirms.json"
"""In a confirmation's trial folder: {"confirms": <screened trial>}."""
DEFAULT_CONFIRM_TOP = 3
"""--confirm-top's default: the screened candidates verl confirms at the study's end."""


class LadderRunner(Runner):
    """Screens with `fast`, confirms with `confirm` (see the module docstring). Call `close()`
    at the end of a study (it ends the fast runner's pool)."""

    name = "ladder"

    def __init__(self, *, fast: Runner, confirm: Runner, confirm_top: int = DEFAULT_CONFIRM_TOP):
        if confirm_top < 1:
            raise ValueError(f"confirm_top must be at least 1, got {confirm_top}")
        self.fast = fast
        self.confirm = confirm
        self.confirm_top = confirm_top

    # what the study's proposals ask of the runner: the screening rung's, where it measures
    @property
    def screen_source(self) -> str:
        """The `source` of a screened row (the fast runner's name)."""
        return self.fast.name

    @property
    def steps(self) -> int:
        return int(getattr(self.fast, "steps", 3) or 3)

    def measured_window_s(self, step_s: float) -> float:
        window = getattr(self.fast, "measured_window_s", None)
        return float(window(step_s)) if callable(window) else self.steps * step_s

    def run(self, spec: TrialSpec) -> TrialResult:
        """Screen `spec`'s candidate on the fast rung."""
        return self.fast.run(spec)

    def run_confirmation(self, spec: TrialSpec, screened: int) -> TrialResult:
        """Measure `spec`'s candidate with real verl, as the confirmation of screened trial
        `screened`."""
        d = spec.trial_dir
        d.mkdir(parents=True, exist_ok=True)
        (d / CONFIRMS_NAME).write_text(json.dumps({"confirms": screened}) + "\n")
        return _linked(self.confirm.run(spec), screened)

    def recover(self, spec: TrialSpec) -> TrialResult | None:
        """A confirmation's verl measurement where the folder says it confirms a trial, else
        the fast runner's."""
        link = spec.trial_dir / CONFIRMS_NAME
        if link.is_file():
            try:
                screened = int(json.loads(link.read_text())["confirms"])
            except (ValueError, KeyError, TypeError):
                return None
            res = self.confirm.recover(spec)
            return _linked(res, screened) if res is not None else None
        return self.fast.recover(spec)

    def check_available(self, cluster: Cluster) -> None:
        self.fast.check_available(cluster)
        self.confirm.check_available(cluster)

    def record_fields(self) -> dict[str, str]:
        """verl's settings: every row says how its candidate runs (or ran) under verl."""
        return self.confirm.record_fields()

    def space_limits(self, model: ModelSpec) -> SpaceLimits:
        """What both rungs can run: the fast runner's space, with verl's own pins (its
        preflight's) added where the fast runner leaves the knob free."""
        f, v = self.fast.space_limits(model), self.confirm.space_limits(model)
        own = {k for k, _ in f.pinned}
        extra = tuple((k, x) for k, x in v.pinned if k not in own)
        if not extra and not v.why:
            return f
        return replace(
            f,
            pinned=f.pinned + extra,
            why="; ".join(x for x in (f.why, v.why) if x),
        )

    def predicted(
        self, pred: Estimate, cluster: Cluster, *, headroom_gib: float | None = None
    ) -> Predicted:
        """The fast runner's view (what a screen measures), unfit where either rung's is: a
        candidate verl could not run is not worth screening."""
        p = self.fast.predicted(pred, cluster, headroom_gib=headroom_gib)
        if p.unfit:
            return p
        v = self.confirm.predicted(pred, cluster, headroom_gib=headroom_gib)
        return replace(p, unfit=v.unfit) if v.unfit else p

    def close(self) -> None:
        for r in (self.fast, self.confirm):
            close = getattr(r, "close", None)
            if callable(close):
                close()


def _linked(res: TrialResult, screened: int) -> TrialResult:
    extra: dict[str, Any] = {**res.extra, "confirms": screened}
    return replace(res, extra=extra)
