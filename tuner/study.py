"""Optuna wiring: storage, resume, warm start, the trial loop, rows and recipes.

The storage is the source of truth; the CSV row of a trial is written before the trial is told
to the storage, so a kill at any moment loses no finished row, and a resumed study upserts by
trial number, so no row is doubled."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import random
import socket
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from tuner import recipes
from tuner.errors import UserError
from tuner.estimate import Estimate, Profile, estimate
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.references import reference_candidates
from tuner.results import Status, TrialResult, read_raw, upsert_row
from tuner.runners.base import Runner, TrialSpec
from tuner.runners.estimate import EstimateRunner
from tuner.space import Candidate, RandomSuggester, SearchSpace, params_for, sample, validate
from tuner.workload import Workload

WARM_START_POOL = 2000
"""Random candidates the estimator ranks before a new study starts."""
WARM_START_BEST = 3
"""How many of the estimator's best are tried first."""


@dataclass(frozen=True, kw_only=True)
class TuneRequest:
    model: ModelSpec
    model_arg: str
    """What the user passed for --model (a registry name or a config.json path)."""
    cluster: Cluster
    workload: Workload
    runner: Runner
    trials: int = 50
    """Finished trials the study should hold; a resumed study runs only the rest."""
    timeout_s: float | None = None
    """Wall-clock budget of this invocation."""
    trial_timeout_s: float = 1800.0
    storage: str = ""
    study_name: str = ""
    results_dir: Path = Path("results")
    recipes_dir: Path = Path("recipes")
    recipes: int = 3
    """Recipe scripts written for the best finished rows."""
    seed: int = 0
    warm_start: bool = True
    profile: Profile = field(default_factory=Profile)

    def __post_init__(self) -> None:
        if self.trials <= 0:
            raise UserError(f"--trials must be positive, got {self.trials}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise UserError(f"--timeout must be positive, got {self.timeout_s}")

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
    return f"{recipes._slug(m.name)}-{cl.label}{wl}-{runner}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    done: int
    total: int
    status: str
    best_tokens_per_s_per_gpu: float | None
    best_layout: str


@dataclass(frozen=True, kw_only=True, slots=True)
class StudySummary:
    name: str
    csv_path: Path
    storage: str
    trials_run: int
    trials_total: int
    resumed_from: int
    best_rows: list[dict[str, str]]
    recipe_paths: list[Path]


# --------------------------------------------------------------------------------------------
# Storage
# --------------------------------------------------------------------------------------------


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage from a URL (sqlite://, postgresql://, mysql://) or a file path
    (`*.log`/`*.jsonl`: a journal file for several workers; anything else: SQLite)."""
    if "://" not in url:
        path = Path(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix in (".log", ".jsonl", ".journal"):
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
        url = f"sqlite:///{path}"
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        _sqlite_wal()
    try:
        return optuna.storages.RDBStorage(url, skip_compatibility_check=False)
    except Exception as e:  # sqlalchemy raises many types for a bad file or URL
        first = str(e).splitlines()[0][:160]
        raise UserError(
            f"storage {url} cannot be opened as an Optuna storage ({first}): "
            "move the file aside or pass --storage with another path"
        ) from None


def _sqlite_on_connect(dbapi_conn: object, _record: object) -> None:
    import sqlite3

    if isinstance(dbapi_conn, sqlite3.Connection):
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()


def _sqlite_wal() -> None:
    """SQLite in WAL mode with synchronous=NORMAL: a commit survives the process being killed
    (only an OS crash can lose the last one), without an fsync per write, which made the
    storage most of the tuner's own time; readers in other processes are not blocked."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "connect", _sqlite_on_connect):
        event.listen(Engine, "connect", _sqlite_on_connect)


# --------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def make_row(
    req: TuneRequest,
    number: int,
    c: Candidate,
    pred: Estimate,
    res: TrialResult,
    started: str,
    duration_s: float,
    origin: str = "",
) -> dict[str, Any]:
    w, cl = req.workload, req.cluster
    p = req.runner.predicted(pred, cl)
    return {
        "study": req.name,
        "trial": number,
        "status": res.status.value,
        "reason": res.reason,
        "source": res.source,
        "runner": req.runner.name,
        "model": req.model_arg,
        "gpu": cl.gpu.name,
        "num_gpus": cl.num_gpus,
        "gpus_per_node": cl.gpus_per_node,
        "backend": "megatron+vllm",
        "infer_parallel": f"tp{c.rollout_tp}",
        **c.to_record(),
        "tokens_per_s_per_gpu": res.tokens_per_s_per_gpu,
        "step_s": res.step_s,
        "generation_s": res.generation_s,
        "old_log_prob_s": res.old_log_prob_s,
        "ref_s": res.ref_s,
        "update_actor_s": res.update_actor_s,
        "reshard_s": res.reshard_s,
        "mfu_pct": res.mfu_pct,
        "peak_mem_gib": res.peak_mem_gib,
        "peak_mem_reserved_gib": res.peak_mem_reserved_gib,
        "pred_tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
        "pred_step_s": pred.step_s,
        "pred_generation_s": pred.generation_s,
        "pred_old_log_prob_s": pred.old_log_prob_s,
        "pred_update_actor_s": pred.update_actor_s,
        "pred_peak_mem_gib": p.peak_gib,
        "pred_peak_phase": p.phase,
        "pred_fits": not p.unfit,
        "pred_bottleneck": pred.bottleneck,
        "workload": w.name,
        "algorithm": w.algorithm,
        "max_prompt_len": w.prompt_len,
        "max_response_len": w.response_len,
        "response_mean_len": w.mean_response_len,
        "bs": w.batch_size,
        "mini_bs": w.mini_batch_size,
        "n": w.n,
        "hardware": res.hardware,
        "versions": res.versions,
        "log_path": res.log_path,
        "extra": {**res.extra, "origin": origin} if origin else res.extra,
        "started_at": started,
        "finished_at": _now(),
        "duration_s": duration_s,
    }


def _state_for(status: Status) -> optuna.trial.TrialState:
    if status is Status.OK:
        return optuna.trial.TrialState.COMPLETE
    if status in (Status.PRUNED_INVALID, Status.PRUNED_OOM):
        return optuna.trial.TrialState.PRUNED
    return optuna.trial.TrialState.FAIL


# --------------------------------------------------------------------------------------------
# Resume
# --------------------------------------------------------------------------------------------

_WORKER = f"{socket.gethostname()}:{os.getpid()}"


def _alive(worker: str) -> bool:
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname():
        return True  # another host's worker: not ours to reclaim
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def _reclaim_interrupted(study: optuna.Study, csv_path: Path) -> int:
    """Close trials left RUNNING by a killed worker of this host: with the row it wrote, if it
    wrote one (killed between row and tell), else as FAIL (nothing finished, nothing lost)."""
    rows = {r["trial"]: r for r in read_raw(csv_path)} if csv_path.exists() else {}
    n = 0
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = str(t.user_attrs.get("worker", ""))
        if not worker or _alive(worker):
            continue
        row = rows.get(str(t.number))
        if row and row.get("study") == study.study_name:
            status = Status(row["status"])
            value = float(row["tokens_per_s_per_gpu"]) if status is Status.OK else None
            study.tell(t.number, value if value is not None else None, state=_state_for(status))
        else:
            study._storage.set_trial_user_attr(t._trial_id, "status", "interrupted")
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        n += 1
    return n


# --------------------------------------------------------------------------------------------
# Warm start
# --------------------------------------------------------------------------------------------


def warm_start_params(
    space: SearchSpace,
    profile: Profile,
    seed: int,
    runner: Runner | None = None,
    pool: int = WARM_START_POOL,
    best: int = WARM_START_BEST,
) -> list[tuple[dict[str, Any], str]]:
    """Reference layouts that are valid here (scaled to this GPU count where the reference used
    more), then the estimator's best of a random pool, as (sampler params, origin) pairs."""
    m, cl, w = space.model, space.cluster, space.workload
    runner = runner or EstimateRunner()
    out: list[tuple[dict[str, Any], str]] = []
    seen: set[tuple[Any, ...]] = set()

    def add(params: dict[str, Any], origin: str) -> None:
        key = tuple(sorted(params.items()))
        if key not in seen:
            seen.add(key)
            out.append((params, origin))

    refs = reference_candidates(m, cl, w)
    for c, origin in refs:
        if c.layout.notation not in space.layouts or validate(c, m, cl, w):
            continue
        if not runner.predicted(estimate(c, m, cl, w, profile), cl).unfit:
            add(params_for(c, space), origin)
    rng = random.Random(seed)
    scored: list[tuple[float, dict[str, Any]]] = []
    for _ in range(pool):
        s = RandomSuggester(rng)
        c = sample(s, space)
        p = runner.predicted(estimate(c, m, cl, w, profile), cl)
        if not p.unfit:
            scored.append((p.tokens_per_s_per_gpu, s.params))
    scored.sort(key=lambda x: -x[0])
    limit = best + len(out)
    for _, params in scored:
        if len(out) >= limit:
            break
        add(params, "estimator")
    return out


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------

_FINISHED = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
    optuna.trial.TrialState.FAIL,
)


def run_study(
    req: TuneRequest,
    on_progress: Callable[[Progress], None] | None = None,
) -> StudySummary:
    space = SearchSpace(
        model=req.model,
        cluster=req.cluster,
        workload=req.workload,
        limits=req.runner.space_limits(req.model),
    )
    space.check_nonempty()
    req.runner.check_available(req.cluster)
    optuna.logging.set_verbosity(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    storage = open_storage(req.storage_url)
    sampler = optuna.samplers.TPESampler(
        seed=req.seed, multivariate=True, group=True, n_startup_trials=10, constant_liar=True
    )
    try:
        study = optuna.create_study(
            study_name=req.name,
            storage=storage,
            sampler=sampler,
            direction="maximize",
            load_if_exists=True,
        )
    except Exception as e:
        first = str(e).splitlines()[0][:160]
        raise UserError(
            f"cannot open study {req.name} in {req.storage_url} ({first}): "
            "pass --storage with another path"
        ) from None
    fingerprint = f"{space.fingerprint()}|{req.runner.name}"
    old = study.user_attrs.get("space")
    if old is None:
        study.set_user_attr("space", fingerprint)
    elif old != fingerprint:
        raise UserError(
            f"study {req.name} was made for another model/cluster/workload/runner "
            f"({old}); pass --study NEW_NAME to start a new one"
        )
    _reclaim_interrupted(study, req.csv_path)

    finished = [t for t in study.get_trials(deepcopy=False) if t.state in _FINISHED]
    resumed_from = len(finished)
    if req.warm_start and not study.get_trials(deepcopy=False):
        for params, origin in warm_start_params(space, req.profile, req.seed, req.runner):
            study.enqueue_trial(params, user_attrs={"origin": origin}, skip_if_exists=True)

    seen: dict[tuple[Any, ...], int] = {tuple(sorted(t.params.items())): t.number for t in finished}
    rows_by_trial = {r["trial"]: r for r in read_raw(req.csv_path)} if req.csv_path.exists() else {}
    best = _best(study)
    done, deadline = len(finished), (time.monotonic() + req.timeout_s if req.timeout_s else None)
    ran = 0
    while done < req.trials and (deadline is None or time.monotonic() < deadline):
        trial = study.ask()
        trial.set_user_attr("worker", _WORKER)
        started, t0 = _now(), time.monotonic()
        c = sample(trial, space)
        pred = estimate(c, req.model, req.cluster, req.workload, req.profile)
        key = tuple(sorted(trial.params.items()))
        res = _evaluate(req, trial.number, c, pred, seen.get(key), rows_by_trial)
        origin = str(trial.user_attrs.get("origin", ""))
        row = make_row(req, trial.number, c, pred, res, started, time.monotonic() - t0, origin)
        upsert_row(req.csv_path, row)
        rows_by_trial[str(trial.number)] = {k: str(v) for k, v in row.items()}
        for k in ("status", "reason", "train_parallel", "source"):
            trial.set_user_attr(k, str(row[k]))
        state = _state_for(res.status)
        study.tell(
            trial, res.value if state is optuna.trial.TrialState.COMPLETE else None, state=state
        )
        seen.setdefault(key, trial.number)
        done, ran = done + 1, ran + 1
        if res.value is not None and (best is None or res.value > best[0]):
            best = (res.value, c.layout.notation)
        if on_progress:
            on_progress(
                Progress(
                    done=done,
                    total=req.trials,
                    status=res.status.value,
                    best_tokens_per_s_per_gpu=best[0] if best else None,
                    best_layout=best[1] if best else "",
                )
            )
    paths = write_best_recipes(req)
    best_rows = _ok_rows(req)[: max(req.recipes, 3)]
    return StudySummary(
        name=req.name,
        csv_path=req.csv_path,
        storage=req.storage_url,
        trials_run=ran,
        trials_total=done,
        resumed_from=resumed_from,
        best_rows=best_rows,
        recipe_paths=paths,
    )


def _evaluate(
    req: TuneRequest,
    number: int,
    c: Candidate,
    pred: Estimate,
    same_as: int | None,
    rows: dict[str, dict[str, str]],
) -> TrialResult:
    reasons = validate(c, req.model, req.cluster, req.workload)
    if reasons:
        return TrialResult(status=Status.PRUNED_INVALID, source="tuner", reason="; ".join(reasons))
    unfit = req.runner.predicted(pred, req.cluster).unfit
    if unfit:
        return TrialResult(
            status=Status.PRUNED_OOM,
            source="estimate",
            reason=f"predicted {unfit} of a {req.cluster.gpu.name}",
            peak_mem_gib=None,
        )
    if same_as is not None and str(same_as) in rows and req.runner.name != "estimate":
        return _copy_of(rows[str(same_as)], same_as)
    spec = TrialSpec(
        number=number,
        candidate=c,
        model=req.model,
        cluster=req.cluster,
        workload=req.workload,
        trial_dir=req.results_dir / req.name / "trials" / str(number),
        timeout_s=req.trial_timeout_s,
        prediction=pred,
        seed=req.seed,
    )
    try:
        return req.runner.run(spec)
    except Exception as e:  # a runner bug must not lose the study; the row says what happened
        return TrialResult(
            status=Status.FAILED,
            source=req.runner.name,
            reason=f"runner error: {type(e).__name__}: {e}"[:300],
        )


def _copy_of(row: dict[str, str], number: int) -> TrialResult:
    def f(k: str) -> float | None:
        v = row.get(k) or ""
        return float(v) if v else None

    return TrialResult(
        status=Status(row["status"]),
        source=row.get("source", ""),
        reason=f"same candidate as trial {number}; not re-run",
        step_s=f("step_s"),
        generation_s=f("generation_s"),
        old_log_prob_s=f("old_log_prob_s"),
        ref_s=f("ref_s"),
        update_actor_s=f("update_actor_s"),
        reshard_s=f("reshard_s"),
        tokens_per_s_per_gpu=f("tokens_per_s_per_gpu"),
        mfu_pct=f("mfu_pct"),
        peak_mem_gib=f("peak_mem_gib"),
        peak_mem_reserved_gib=f("peak_mem_reserved_gib"),
        hardware=row.get("hardware", ""),
        versions=row.get("versions", ""),
        log_path=row.get("log_path", ""),
    )


def _best(study: optuna.Study) -> tuple[float, str] | None:
    with contextlib.suppress(ValueError):
        t = study.best_trial
        if t.value is not None:
            return float(t.value), str(t.user_attrs.get("train_parallel", ""))
    return None


def _ok_rows(req: TuneRequest) -> list[dict[str, str]]:
    from tuner.results import rank

    if not req.csv_path.exists():
        return []
    rows = [r for r in read_raw(req.csv_path) if r.get("study") == req.name]
    return rank(rows, status="ok")


def write_best_recipes(req: TuneRequest) -> list[Path]:
    """Recipes for the best finished rows; their paths go into the rows' `recipe` column."""
    paths: list[Path] = []
    for row in _ok_rows(req)[: req.recipes]:
        c = Candidate.from_record(row, req.cluster.num_gpus)
        recipe = recipes.render(
            c, req.model, req.cluster, req.workload, origin=recipes.origin_of(req.csv_path, row)
        )
        path = recipes.write(
            recipe, req.recipes_dir / recipes._slug(req.model.name), suffix=f"t{row['trial']}"
        )
        if row.get("recipe") != str(path):
            upsert_row(req.csv_path, {**{k: v for k, v in row.items() if k}, "recipe": str(path)})
        paths.append(path)
    return paths
