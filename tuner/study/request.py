"""What a study is asked to do (TuneRequest) and what it reports (Progress, StudySummary)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tuner import recipes
from tuner.errors import UserError
from tuner.estimate import Profile
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.runners.base import Runner
from tuner.workload import Workload


@dataclass(frozen=True, kw_only=True)
class TuneRequest:
    """One `tune` invocation: the model, cluster, workload, runner and budget of a study."""

    model: ModelSpec
    model_arg: str
    """What the user passed for --model (a registry name or a config.json path)."""
    cluster: Cluster
    workload: Workload
    runner: Runner
    trials: int = 50
    """Trials the study should hold, over all workers on its storage (like Optuna's
    MaxTrialsCallback). Candidates pruned before launch (invalid, predicted not to fit) and
    trials interrupted by a kill do not count; a resumed study runs only the rest."""
    timeout_s: float | None = None
    """Wall-clock budget of this invocation."""
    trial_timeout_s: float = 1800.0
    """Cap of one trial's time limit; the limit itself comes from the study's launch costs and
    the predicted time of the measured steps."""
    headroom_gib: float | None = None
    """Device memory kept free when deciding whether a candidate fits; None: the memory
    guard's learned default."""
    storage: str = ""
    study_name: str = ""
    results_dir: Path = Path("results")
    recipes_dir: Path = Path("recipes")
    recipes: int = 3
    """Recipe scripts written for the best finished rows."""
    seed: int = 0
    warm_start: bool = True
    hand_grid: bool = False
    """Also measure the hand grid (tuner.study.grid): plain layouts x recompute none/full x
    token budget 1x/2x, enqueued first with origin `hand grid`, so the leaderboard states how
    the tuned best compares with what a user would try by hand."""
    verl_example: bool = False
    """Measure verl's own Megatron example (study.grid.VERL_EXAMPLE) scaled to the GPUs first,
    with `origin=hand: verl example`: the configuration a verl user writes by hand."""
    candidates_from: Path | None = None
    """Another leaderboard whose ok rows' candidates this study measures first (origin `from
    <csv> trial <n>`): the same configurations through this study's runner."""
    profile: Profile = field(default_factory=Profile)
    profile_source: str = ""
    """The calibration profile file `profile` was read from (`tune calibrate`'s, or --profile);
    '' for the built-in constants. Every row's `extra` names it (`profile=<path>`)."""
    allow_off_policy: bool = False
    """`--allow-off-policy`: placement is searched (colocated, or vLLM on r GPUs of its own
    and the actor on the rest, one step off-policy: tuner/space/placement.py). The runner must
    run it (Runner.split_refusal) and some split must fit the GPUs (SearchSpace.check_splits)."""

    def __post_init__(self) -> None:
        if self.allow_off_policy:
            why = self.runner.split_refusal()
            if why is not None:
                raise UserError(f"--allow-off-policy: {why}")
        if self.trials <= 0:
            raise UserError(f"--trials must be positive, got {self.trials}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise UserError(f"--timeout must be positive, got {self.timeout_s}")
        cap = self.cluster.gpu.memory_gib
        if self.headroom_gib is not None and not 0 <= self.headroom_gib < cap:
            raise UserError(
                f"--headroom-gib must lie in 0..{cap:.0f} (the {self.cluster.gpu.name}'s GiB), "
                f"got {self.headroom_gib}"
            )

    @property
    def name(self) -> str:
        return self.study_name or default_study_name(
            self.model, self.cluster, self.workload, self.runner.name
        )

    @property
    def csv_path(self) -> Path:
        return self.results_dir / f"{self.name}.csv"

    @property
    def storage_url(self) -> str:
        return self.storage or f"sqlite:///{self.results_dir / 'studies.sqlite3'}"


def default_study_name(m: ModelSpec, cl: Cluster, w: Workload, runner: str) -> str:
    wl = "" if w.name == "dapo-math" else f"-{w.name}"
    return f"{recipes.slug(m.name)}-{cl.label}{wl}-{runner}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """Reported after each trial this worker finishes."""

    done: int
    """Trials of the study that count against --trials, all workers."""
    total: int
    status: str
    best_tokens_per_s_per_gpu: float | None
    best_layout: str


@dataclass(frozen=True, kw_only=True, slots=True)
class StudySummary:
    """What one invocation did, and where the study stands."""

    name: str
    csv_path: Path
    storage: str
    trials_run: int
    """Counted trials this invocation ran."""
    trials_total: int
    """Counted trials the study holds now (all workers)."""
    resumed_from: int
    """Counted trials the study held when this invocation started."""
    best_rows: list[dict[str, str]]
    recipe_paths: list[Path]
    pruned_before_launch: int = 0
    """Candidates this invocation pruned before launch (invalid or predicted not to fit)."""
    measured_s: float = 0.0
    """Wall time of the study's trials spent in measured steps (sum of `measured_s`)."""
    launch_s: float = 0.0
    """Wall time of the study's trials from launch to the first measured step (sum of
    `launch_s`: start-up, model build, warm-up)."""
    warmup_s: float = 0.0
    """Wall time in the warm-up steps between the first step and the measured one, where the
    runner times them apart (verl rows' `extra` warmup_s; the megatron runner counts its warm-up
    in launch_s)."""
    unmeasured_s: float = 0.0
    """Wall time of the trials that gave no measured step (failed, OOM, timed out)."""
    other_s: float = 0.0
    """The rest of the trials' wall time (sum of `duration_s` less the four above)."""
    gpu_hours: tuple[tuple[str, float], ...] = ()
    """GPU-hours the study's trials held, by the rung (row `source`) that measured them:
    (megatron, h), (verl, h); what the fidelity ladder spent on each rung."""
    notes: tuple[str, ...] = ()
    """Lines for stderr: a damaged leaderboard set aside, a space where nothing fits, ..."""
