"""The verl runner: each trial runs verl's `main_ppo` with the `ppo_megatron_trainer` config for
3 training steps, on this node, a Ray cluster or a Slurm allocation, and reads the 3rd step.

One trial, in order (each step a plain function of the previous one's output):
  1. the data: the user's parquet, or a synthetic one written once per study under
     results/<study>/data/ (tuner.dataset);
  2. the command: verl_command.overrides() with this trial's paths (the same mapping a recipe
     uses, so `tune export` reproduces the row), written to trials/<n>/command.sh;
  3. the launch: launchers/ run it with a timeout, the log kept as trials/<n>/verl.log;
  4. the result: the step metrics from verl's file logger (trials/<n>/verl-tuner/<exp>.jsonl),
     else its console lines; a failure's cause from the log (verl_log.classify).
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from tuner import verl_command
from tuner.dataset import (
    ChatTokenizer,
    Dataset,
    draw_response_caps,
    load_tokenizer,
    user_dataset,
    write_synthetic,
)
from tuner.errors import UserError
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.recipes import experiment_name
from tuner.results import Status, TrialResult
from tuner.runners.base import Runner, TrialSpec
from tuner.runners.launchers import (
    Job,
    Launcher,
    LaunchResult,
    LocalLauncher,
    RayLauncher,
    SlurmLauncher,
)
from tuner.runners.launchers.slurm import require_slurm
from tuner.runners.process import Launch, log_tail, run_process
from tuner.runners.verl_device import (
    SMI_LOG,
    DeviceMemorySampler,
    device_peak,
    pool_peaks,
    predicted_pools,
    read_device_samples,
)
from tuner.runners.verl_log import (
    MEASURED_STEP,
    StepMeasures,
    classify,
    last_exception,
    last_step,
    measures,
    read_console,
    read_jsonl,
    root_exception,
    split_wall_time,
    step_times,
)
from tuner.runners.verl_preflight import Preflight, preflight, run_probe
from tuner.runners.verl_probe import PACKAGES
from tuner.runners.verl_timeline import CLOCK_NAME, LogClock, timeline
from tuner.runners.verl_workload import (
    data_overrides,
    response_mode,
    workload_mismatch,
)
from tuner.space import SpaceLimits
from tuner.space.placement import OFF_POLICY, placement_label
from tuner.verl_settings import VerlSettings, bare_key

LOG_NAME = "verl.log"
COMMAND_NAME = "command.sh"
LOG_TAIL_BYTES = 4_000_000
"""How much of the end of a log is searched for a failure's cause."""
_PROBE_PY = (
    "import importlib.metadata as md\n"
    "def v(p):\n"
    "    try:\n"
    "        return md.version(p)\n"
    "    except Exception:\n"
    "        return '-'\n"
    f"print('verl-tuner versions:', ' '.join(f'{{p}}={{v(p)}}' for p in {PACKAGES!r}))\n"
)
_PROBE_GPU = (
    "nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 "
    "| sed 's/^/verl-tuner gpu: /'"
)
_VERSIONS = re.compile(r"verl-tuner versions: (.*)$", re.M)
_GPU = re.compile(r"verl-tuner gpu: (.*)$", re.M)


def probe_line(python: str) -> str:
    """A shell line that prints the versions and the GPU where the command runs."""
    return f"{shlex.quote(python)} -c {shlex.quote(_PROBE_PY)}; {_PROBE_GPU}; true"


class VerlRunner(Runner):
    """Runs real verl trials; see the module docstring.

    Responses: the workload's `response_mean == response_len` means fixed-length responses
    (vLLM ignores EOS, every response is `response_len` tokens). Otherwise, on the synthetic
    dataset, each response is drawn from the workload's length model (a long tail; the rows
    carry the lengths and tuner/verl_agent_loop.py caps each response at its own, EOS ignored:
    `drawn`); on the user's data the model stops where it stops (`natural`). The row's `extra`
    says which, with the measured mean lengths; a row whose measured prompt or response mean is
    off what was asked by more than WORKLOAD_TOLERANCE is not ok."""

    name = "verl"

    def __init__(
        self,
        *,
        model_path: str | None = None,
        launcher: str | Launcher = "local",
        ray_address: str | None = None,
        shared_ray: bool = False,
        train_file: str | Path | None = None,
        reward_fn: str | Path | None = None,
        slurm_partition: str | None = None,
        slurm_account: str | None = None,
        slurm_args: Sequence[str] = (),
        slurm_setup: str = "",
        python: str | None = None,
        steps: int = MEASURED_STEP,
        entrypoint: Sequence[str] | None = None,
        launch: Launch | None = None,
        settings: VerlSettings | None = None,
        preflight: bool | None = None,
    ) -> None:
        if not model_path:
            raise UserError(
                "--runner verl needs --model-path: a copy of the model's Hugging Face weights "
                "that every node can read"
            )
        self.model_path = str(model_path)
        self.launcher = self._make_launcher(
            launcher,
            ray_address=ray_address,
            shared_ray=shared_ray,
            python=python,
            launch=launch,
            slurm=dict(
                partition=slurm_partition,
                account=slurm_account,
                sbatch_args=tuple(slurm_args),
                setup=slurm_setup,
            ),
        )
        local = self.launcher.name == "local"
        self.python = python or (sys.executable if local else "python3")
        self.entrypoint = (
            tuple(entrypoint)
            if entrypoint is not None
            else (self.python, *verl_command.ENTRYPOINT[1:])
        )
        self.split_entrypoint = (
            self.entrypoint
            if entrypoint is not None
            else (self.python, *verl_command.SPLIT_ENTRYPOINT[1:])
        )
        """What runs a split candidate: verl's one-step-off-policy trainer (a stand-in
        entrypoint stands in for both)."""
        self.train_file = Path(train_file).expanduser().resolve() if train_file else None
        self.reward_fn = Path(reward_fn).expanduser().resolve() if reward_fn else None
        self.steps = steps
        self._tokenizer: tuple[ChatTokenizer | None, str] | None = None
        self.user_settings = settings or VerlSettings()
        self._check_override_keys()
        self.run_preflight = entrypoint is None if preflight is None else preflight
        """The preflight runs where the trials run verl's own main_ppo (tests pass a stand-in)."""
        self._preflight: Preflight | None = None

    def close(self) -> None:
        """The study's end (study.loop closes its runner): the launcher's shared Ray head."""
        self.launcher.close()

    def _check_override_keys(self) -> None:
        """A `--verl-override` of a key the tuner sets would make the row lie: refused."""
        owned = verl_command.tuner_keys()
        for key, _ in self.user_settings.overrides:
            bare = bare_key(key)
            if bare in owned:
                raise UserError(f"--verl-override {bare}: it is set by {owned[bare]}; leave it out")

    def preflight(self) -> Preflight | None:
        """The host check, once per study (None where it does not run: a stand-in entrypoint
        is not verl; on Ray and Slurm clusters the nodes' packages are checked by the first
        trial, and only the overrides are composed here, with this Python's verl if any)."""
        if not self.run_preflight:
            return None
        if self.launcher.name != "local":
            if self.user_settings.overrides and importlib.util.find_spec("verl") is not None:
                found = run_probe(sys.executable, self.user_settings, compose_only=True)
                error = found.get("compose_error")
                if error:
                    raise UserError(f"--verl-override: verl's config refuses it: {error}")
            return None
        if self._preflight is None:
            self._preflight = preflight(self.python, self.user_settings)
        return self._preflight

    @property
    def settings(self) -> VerlSettings:
        """The user's settings with what the host needs (the preflight's environment)."""
        pf = self._preflight
        return self.user_settings.with_env(pf.env) if pf is not None else self.user_settings

    def split_refusal(self) -> str | None:
        """The launcher's say (launchers.base.Launcher.split_refusal): the built-in ones run the
        one-step-off command as they run main_ppo (the tuner passes verl's config search path,
        so the working directory does not matter)."""
        return self.launcher.split_refusal()

    def record_fields(self) -> dict[str, str]:
        """The row's verl settings columns."""
        return self.settings.record()

    def space_limits(self, model: ModelSpec) -> SpaceLimits:
        pf = self.preflight()
        if pf is None or not pf.pinned:
            return SpaceLimits()
        return SpaceLimits(pinned=pf.pinned, why="; ".join(pf.notes))

    @staticmethod
    def _make_launcher(
        launcher: str | Launcher,
        *,
        ray_address: str | None,
        shared_ray: bool,
        python: str | None,
        launch: Launch | None,
        slurm: dict[str, Any],
    ) -> Launcher:
        if isinstance(launcher, Launcher):
            return launcher
        if launcher == "local":
            return LocalLauncher(launch or run_process, shared_ray=shared_ray, python=python)
        if launcher == "ray":
            if not ray_address:
                raise UserError(
                    "--launcher ray needs --ray-address: the cluster's dashboard, "
                    "e.g. http://head-node:8265"
                )
            return RayLauncher(ray_address)
        if launcher == "slurm":
            return SlurmLauncher(**slurm)
        raise UserError(f"unknown launcher {launcher!r}: use local, ray or slurm")

    # ----------------------------------------------------------------------------------------

    def check_available(self, cluster: Cluster) -> None:
        if isinstance(self.launcher, SlurmLauncher):
            require_slurm()
        local_path = self.launcher.name == "local" and _looks_local(self.model_path)
        if local_path and not Path(self.model_path).expanduser().exists():
            raise UserError(f"--model-path {self.model_path} does not exist on this node")
        if self.train_file is not None and not self.train_file.is_file():
            raise UserError(f"--train-file {self.train_file} is not a file")
        self.launcher.check(cluster.num_gpus, cluster.num_nodes)
        self.preflight()

    def command(self, spec: TrialSpec, data: Dataset) -> list[str]:
        """The exact command of the trial: the overrides recipes render, then the synthetic
        data's own (DATA_OVERRIDES: drawn responses), which a recipe on the user's data has no
        use for."""
        c, m, cl, w = spec.candidate, spec.model, spec.cluster, spec.workload
        ov = verl_command.overrides(
            c,
            m,
            cl,
            w,
            steps=self.steps,
            model_path=self.model_path,
            train_file=str(data.train_file),
            reward_fn=str(data.reward_fn) if data.reward_fn else "null",
            nnodes=cl.num_nodes,
            experiment=experiment_name(c, m, cl),
            settings=self.settings,
        )
        ov.update(data_overrides(data))
        entry = self.split_entrypoint if c.rollout_gpus else self.entrypoint
        return [*entry, *verl_command.override_args(ov)]

    def dataset(self, spec: TrialSpec) -> Dataset:
        """The user's data, or the study's synthetic data (written by the first trial)."""
        if self.train_file is not None:
            return user_dataset(self.train_file, self.reward_fn)
        w = spec.workload
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.model_path)
        target = max(1, min(w.prompt_len, round(w.mean_prompt_len)))
        drawn = not verl_command.fixed_response_length(w)
        ds = write_synthetic(
            spec.trial_dir.resolve().parent.parent / "data",
            prompt_tokens=target,
            max_prompt_len=w.prompt_len,
            rows=w.batch_size * self.steps,
            tokenizer=self._tokenizer[0],
            response_caps=draw_response_caps(w, self.steps) if drawn else None,
        )
        return replace(ds, reward_fn=self.reward_fn) if self.reward_fn else ds

    def run(self, spec: TrialSpec) -> TrialResult:
        trial_dir = spec.trial_dir.resolve()
        trial_dir.mkdir(parents=True, exist_ok=True)
        data = self.dataset(spec)
        cmd = self.command(spec, data)
        env = {
            **self.settings.environment(),
            verl_command.METRICS_ROOT_ENV: str(trial_dir),
            "HYDRA_FULL_ERROR": "1",
            "PYTHONUNBUFFERED": "1",
        }
        if data.agent_loops is not None:  # verl's agent-loop workers import tuner.verl_agent_loop
            env["PYTHONPATH"] = _with_tuner_on_path(env.get("PYTHONPATH"))
        env.update(self.compile_cache(trial_dir))
        job_env = env
        if self.launcher.shared_ray:
            # workers of a joined cluster take the head's environment: the trial's reaches them
            # through verl's job runtime env, and the head's own stays the study's (the trial's
            # metrics folder, the one key that differs per trial, is left out of it)
            cmd = [*cmd, *verl_command.runtime_env_args(env)]
            job_env = {k: v for k, v in env.items() if k not in PER_TRIAL_ENV}
        (trial_dir / COMMAND_NAME).write_text(
            "#!/usr/bin/env bash\n# the verl command of this trial, as the tuner ran it\n"
            + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
            + " \\\n    ".join(shlex.quote(a) for a in cmd)
            + "\n"
        )
        job = Job(
            name=f"verl-tuner-t{spec.number}",
            cmd=cmd,
            env=job_env,
            log_path=trial_dir / LOG_NAME,
            timeout_s=spec.timeout_s,
            nnodes=spec.cluster.num_nodes,
            gpus_per_node=spec.cluster.local_gpus,
            prologue=probe_line(self.python),
            workdir=trial_dir,
        )
        cache = Path(env["VLLM_CACHE_ROOT"]) if "VLLM_CACHE_ROOT" in env else None
        before = count_files(cache)
        with (
            DeviceMemorySampler(trial_dir / SMI_LOG, enabled=self.launcher.name == "local"),
            LogClock(job.log_path, trial_dir / CLOCK_NAME),
        ):
            res = self.launcher.launch(job)
        out = self.result(spec, data, res, self.metrics_file(spec))
        if cache is not None:  # 0 new files: vLLM's compiled graphs came from the study's cache
            out.extra["vllm_cache_files"] = before
            out.extra["vllm_cache_new_files"] = count_files(cache) - before
        return out

    def compile_cache(self, trial_dir: Path) -> dict[str, str]:
        """The trial's vLLM compile-cache environment: the study's own cache on the local
        launcher (compile_cache_env), unless the user's `--verl-env` decides; {} elsewhere. The
        row's `extra` says `vllm_compile_cache=study` where it applied, `verl` where verl's
        setting (or the user's) held."""
        if self.launcher.name != "local":
            return {}
        return compile_cache_env(
            self.settings.environment(), trial_dir.parent.parent / VLLM_CACHE_DIR
        )

    def metrics_file(self, spec: TrialSpec) -> Path:
        """Where verl's file logger writes the trial's step metrics."""
        return verl_command.metrics_path(
            spec.trial_dir.resolve(), experiment_name(spec.candidate, spec.model, spec.cluster)
        )

    def recover(self, spec: TrialSpec) -> TrialResult | None:
        """The row of a trial whose worker died after verl logged the measured step, from the
        files its launch left in the trial's folder (metrics file or console lines, the log's
        head, the device-memory samples), read by `result` as after a launch; the launch's end
        was not seen (no exit code, no wall time, so no `launch_s`). None unless the measured
        step is there."""
        metrics_file = self.metrics_file(spec)
        log_path = _log_of(spec.trial_dir.resolve())
        steps, _ = _read_steps(metrics_file, log_path)
        if self.measured(steps, spec) is None:
            return None
        unseen = LaunchResult(returncode=None, timed_out=False, duration_s=0.0, log_path=log_path)
        res = self.result(spec, self.dataset(spec), unseen, metrics_file)
        return res if res.status is Status.OK else None

    @property
    def first_measured(self) -> int:
        """The first step a row measures: the 3rd (MEASURED_STEP), or the last of a shorter
        run; every later step of the run is measured too (`measures`' window)."""
        return min(MEASURED_STEP, self.steps)

    def measured(self, steps: dict[int, dict[str, float]], spec: TrialSpec) -> StepMeasures | None:
        """The row's measures: steps first_measured .. self.steps, the throughput over every
        GPU of the study (verl_log.throughput)."""
        return measures(steps, self.first_measured, last=self.steps, num_gpus=spec.cluster.num_gpus)

    # ----------------------------------------------------------------------------------------

    def result(
        self, spec: TrialSpec, data: Dataset, res: LaunchResult, metrics_file: Path
    ) -> TrialResult:
        """The trial's row from what the launch left: metrics file, log, exit."""
        log = log_text_tail(res.log_path)
        head = _head(res.log_path)
        steps, source = _read_steps(metrics_file, res.log_path, log)
        got = self.measured(steps, spec)
        w = spec.workload
        cached = self.compile_cache(spec.trial_dir.resolve())
        extra: dict[str, Any] = {
            "launcher": self.launcher.name,
            "response_mode": response_mode(w, data),
            "vllm_compile_cache": "study" if cached else "verl",
            **data.describe(),
        }
        if self.launcher.shared_ray:  # start-up compared by scripts/launch_cost
            extra["ray_cluster"] = "study"
        if spec.candidate.rollout_gpus:  # the row says what algorithm ran
            extra["placement"] = placement_label(spec.candidate.rollout_gpus, spec.cluster.num_gpus)
            extra["off_policy"] = OFF_POLICY
        if res.job_id:
            extra["job_id"] = res.job_id
        if res.queued_s >= 1:
            extra["queued_s"] = round(res.queued_s, 1)
        common: dict[str, Any] = {
            "source": self.name,
            "hardware": self._hardware(spec, head),
            "versions": _versions(head),
            "log_path": str(res.log_path),
        }
        samples = read_device_samples(spec.trial_dir.resolve() / SMI_LOG)
        device = device_peak(samples)
        if device is not None:
            common["peak_mem_device_gib"] = device
            extra["device_mem_sampled"] = "nvidia-smi"
        if spec.candidate.rollout_gpus:  # each pool's device peak beside its prediction
            trainer_gpus = spec.cluster.num_gpus - spec.candidate.rollout_gpus
            extra.update(pool_peaks(samples, trainer_gpus))
            extra.update(predicted_pools(spec.prediction))
        if got is not None:
            extra.update(got.extra, metrics=source, step=got.step, measured_steps=got.count)
            common.update(split_wall_time(steps, got.step, res.duration_s, extra))
            extra.update(
                timeline(
                    res.log_path,
                    spec.trial_dir.resolve() / CLOCK_NAME,
                    step_times(steps),
                    res.duration_s,
                )
            )
            reason = ""
            if res.timed_out:
                reason = f"step {got.step} measured; the run was stopped at the timeout"
            elif res.returncode not in (0, None):
                reason = f"step {got.step} measured; verl then exited with {res.returncode}"
            measured: dict[str, Any] = {**common, **got.fields}
            off = workload_mismatch(w, data, got.extra)
            if off:
                extra["failure"] = "workload"
                return TrialResult(status=Status.FAILED, reason=off, extra=extra, **measured)
            return TrialResult(status=Status.OK, reason=reason, extra=extra, **measured)
        reached = last_step(steps)
        extra["last_step"] = reached
        failure = classify(log)
        if failure is not None:
            extra["failure"] = failure.kind
            if failure.phase:
                extra["phase"] = failure.phase
            return TrialResult(status=failure.status, reason=failure.reason, extra=extra, **common)
        if res.timed_out:
            extra["failure"] = "timeout"
            return TrialResult(
                status=Status.TIMEOUT,
                reason=f"no result within {spec.timeout_s:.0f} s (hang?); last step logged: "
                f"{reached}",
                extra=extra,
                **common,
            )
        if res.returncode == 0:
            why = f"verl exited 0 without logging step {self.steps} (it logged {reached})"
        elif res.returncode is None:
            why = f"{self.launcher.name} launch did not run: {res.state or last_exception(log)}"
        else:
            cause = root_exception(log)
            rc = res.returncode
            if cause:
                why = f"{cause} (verl exited {rc})"
            elif rc < 0:
                why = f"verl was killed by signal {-rc} after step {reached}; no error in the log"
            else:
                why = f"verl exited {rc} after step {reached}; no error in the log"
        extra["failure"] = "error"
        return TrialResult(status=Status.FAILED, reason=why[:300], extra=extra, **common)

    def _hardware(self, spec: TrialSpec, log: str) -> str:
        cl = spec.cluster
        found = _GPU.findall(log)
        name = found[-1].strip() if found else f"{cl.gpu.name} (as requested)"
        return f"{cl.num_gpus}x {name}"


VLLM_CACHE_DIR = "vllm-cache"
"""The study's vLLM cache (torch.compile artefacts), beside its trials: `results/<study>/`."""


PER_TRIAL_ENV = (verl_command.METRICS_ROOT_ENV,)
"""The trial environment's keys that differ from trial to trial: under `--shared-ray` they reach
verl's workers through its job runtime env only, so the study's Ray head is not started again
for each trial (launchers.ray_head)."""


def compile_cache_env(env: dict[str, str], folder: Path) -> dict[str, str]:
    """vLLM's compile cache kept between a study's trials on this host, unless the user's
    `--verl-env` says otherwise: verl 0.9.1 sets VLLM_DISABLE_COMPILE_CACHE=1 in Ray's runtime
    env (trainer/constants_ppo.py, for vllm#31199, a cache corrupted by concurrent writers), but
    keeps a value the launching environment already holds; the trials of a study on one host
    run one at a time, each with the study's own VLLM_CACHE_ROOT. The measured step is not
    affected; start-up is (results/README.md: vLLM's start 135 -> 102 s on one H100). Not in the
    row's `verl_env` nor the recipe: a launch-speed setting of the tuner's trials."""
    if "VLLM_DISABLE_COMPILE_CACHE" in env:
        return {}
    return {"VLLM_DISABLE_COMPILE_CACHE": "0", "VLLM_CACHE_ROOT": str(folder)}


def count_files(folder: Path | None) -> int:
    """Files under `folder` (0 for none): a compile cache's size before and after a launch."""
    if folder is None or not folder.is_dir():
        return 0
    return sum(1 for p in folder.rglob("*") if p.is_file())


def _with_tuner_on_path(pythonpath: str | None) -> str:
    """PYTHONPATH with the folder holding this tuner package first."""
    import tuner

    root = str(Path(tuner.__file__).resolve().parent.parent)
    rest = pythonpath if pythonpath is not None else os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([root, *([rest] if rest else [])])


def _read_steps(
    metrics_file: Path, log_path: Path, log: str | None = None
) -> tuple[dict[int, dict[str, float]], str]:
    """Step -> metrics from verl's metrics file, else from the console lines of its log (`log`:
    the log's tail, if already read); and which (`file` or `console`)."""
    steps = read_jsonl(metrics_file)
    if steps:
        return steps, "file"
    return read_console(log_text_tail(log_path) if log is None else log), "console"


def _versions(log: str) -> str:
    found = _VERSIONS.findall(log)
    return found[-1].strip() if found else ""


def _head(path: Path, n_bytes: int = 200_000) -> str:
    """The start of a log, where the probe printed versions and the GPU."""
    if path.suffix == ".gz":
        return _gunzipped(path)[:n_bytes].decode(errors="replace")
    try:
        with open(path, "rb") as f:
            return f.read(n_bytes).decode(errors="replace")
    except FileNotFoundError:
        return ""


def log_text_tail(path: Path, n_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last `n_bytes` of a trial's log as text, where its console lines are: a log gzipped
    after its trial (scripts/gpu_verl_study.sh `pack`) decompressed as a stream, only its end
    kept; '' for no file. The runner's reading and `tune reread`'s."""
    if path.suffix != ".gz":
        return log_tail(path, n_bytes)
    tail = bytearray()
    with contextlib.suppress(FileNotFoundError, EOFError, gzip.BadGzipFile), gzip.open(path) as f:
        while chunk := f.read(1 << 20):
            tail = (tail + chunk)[-n_bytes:]
    return bytes(tail).decode(errors="replace")


def _gunzipped(path: Path) -> bytes:
    """A log compressed after its trial (scripts/gpu_verl_study.sh `pack`); as much as can be
    read of a file cut short."""
    out = bytearray()
    with contextlib.suppress(FileNotFoundError, EOFError, gzip.BadGzipFile), gzip.open(path) as f:
        while chunk := f.read(1 << 20):
            out += chunk
    return bytes(out)


def _log_of(trial_dir: Path) -> Path:
    """The trial's log: verl.log, or verl.log.gz where only that is left."""
    log = trial_dir / LOG_NAME
    packed = log.with_name(LOG_NAME + ".gz")
    return packed if not log.exists() and packed.is_file() else log


def _looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~"))
