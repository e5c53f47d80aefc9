"""Check the cost model against measured leaderboard rows (the reference CSVs or our own).

Each measured row becomes a (candidate, model, cluster, workload) case; the estimator predicts it
and the errors are summarised per phase. What a reference row leaves out comes from the reference
recipes' conventions (here) and from the notes beside its file (tuner.fit.notes: its model,
recipe inputs, full-logits rows). Nothing here prints: scripts/validate_estimator.py and the
tests format what `validate()` returns.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tuner.errors import UserError
from tuner.estimate import Estimate, Profile, estimate
from tuner.estimate.generation import VLLM_ASYNC_SCHEDULING
from tuner.estimate.logits import DEFAULT_VERL
from tuner.fit.notes import FileNotes, notes_for
from tuner.hardware import Cluster, get_gpu
from tuner.models import ModelSpec, get_model
from tuner.results import number, read_rows
from tuner.space import Candidate, ParallelLayout
from tuner.workload import Workload, get_workload

PHASES = (
    ("generation_s", "generation"),
    ("old_log_prob_s", "old_log_prob"),
    ("update_actor_s", "update_actor"),
    ("step_s", "step"),
)
"""(row column, name) of the phases compared."""
GOAL_PHASES = ("generation", "old_log_prob", "update_actor")

REFERENCE_DEFAULTS = {
    "n": 16,
    "gpu_memory_utilization": 0.6,
    "offload": True,
    "max_num_seqs": 1024,
    "enforce_eager": True,
}
"""What the reference rows leave out, from the reference recipes' conventions
(shared/anchors/README.md): 16 responses per prompt, vLLM at 0.6 of memory, param/grad/optimizer
offload on, max_num_batched_tokens = prompt + response, and vLLM's max_num_seqs 1024 (the
rollout default of the verl releases the references ran, before 0.9 lowered it to 256).
vLLM ran eagerly: the DAPO_7B and DAPO_MOE30B recipe scripts (June-July 2025) do not set
`enforce_eager`, and verl defaulted it to True until volcengine/verl ff6978c14 (2025-08-08,
"enable vllm cuda graph in default"; v0.5.0's rollout.yaml still says True); the GRPO_7B recipe
sets `enforce_eager=True` itself, and the one GRPO row whose `Other` says "Cuda graph" ran with
graphs (CUDA_GRAPH_MARK). Rows that switch dynamic batching off without giving a micro-batch
size use the GRPO recipe's sizes (GRPO_RECIPE). What single rows or files leave out is in the
notes beside them (tests/data/anchors/fit.toml)."""
REFERENCE_VLLM_ASYNC_SCHEDULING = False
"""The reference rows' vLLM scheduled synchronously: each decode step's host work followed the
step's GPU work (estimate/generation.py VLLM_ASYNC_SCHEDULING). The rows record no vLLM version;
they record their runs' dates (run names dated 2025-06-26 to 07-07, rows added to the files up
to 2025-07-30, the GRPO file in September: tests/data/anchors/fit.toml) and ran verl <= 0.5's
sync-mode rollout (`rollout_in_actor`). vLLM had async scheduling then only as the opt-in
`--async-scheduling` (vllm-project/vllm#19970, June 2025; the default from #27614, opened
2025-10-27), and no reference recipe script asks for it (ISEEKYAN/verl_megatron_practice: no
`async_scheduling` in any script of any commit)."""
CUDA_GRAPH_MARK = "cuda graph"
"""`Other` of a reference row that ran vLLM with CUDA graphs (grpo_qwen2.5_7b row 8)."""
ROPE_FUSION_MARKS = ("apply_rope_fusion", "all optimization")
"""`Other` of a reference row whose recipe set `apply_rope_fusion=True` (dapo7b rows 7-9, 12, 13,
16-18 and 19-22's "all optimization option"). The dapo7b rows without it (3-6, 11) ran
megatron-core's default, unfused RoPE: verl 0.5's config converter sets the fusion only for
Mixtral (verl/models/mcore/config_converter.py), and rows 7 and 8 repeat rows 5 and 6 with the
fusion added."""
GRPO_RECIPE = {"ppo_micro_batch_size_per_gpu": 2, "log_prob_micro_batch_size_per_gpu": 4}
"""GRPO_7B/qwen2.5_7b_megatron_vllm_benchmark.sh: micro-batch sizes used when the grpo rows
switch dynamic batching off."""
FULL_LOGITS_VERL = "0.4.1"
"""The verl release whose full-logits passes the notes' `full_logits_trials` ran
(estimate/logits.py PASSES_0_4: no temperature division, no clone)."""
MFU_ATTENTION_FACTOR = 12
"""verl 0.4-0.5's FlopsCounter (verl/utils/flops_counter.py `_estimate_qwen2_flops`,
`_estimate_qwen2_moe_flops`, what the reference runs logged as perf/mfu/actor) counts attention
as 12 x sum(seqlen^2) x head_dim x heads x layers, beside 6 x N x tokens for the weights N
(attention projections, MLP or router plus top-k experts, embedding and output layer)."""

_MODEL_NAMES = {
    "qwen2.5 7b math": "qwen2.5-7b",
    "qwen2.5-7b": "qwen2.5-7b",
    "qwen3-30b": "qwen3-30b-moe",
    "qwen3-30b-a3b": "qwen3-30b-moe",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One measured row, ready to predict."""

    label: str
    """`file:number`."""
    candidate: Candidate
    model: ModelSpec
    cluster: Cluster
    workload: Workload
    status: str
    """ok or oom."""
    measured: dict[str, float] = field(default_factory=dict)
    """Phase name -> seconds, for the phases the row reports."""
    notes: str = ""
    verl_logits: str = DEFAULT_VERL
    """The verl release whose full-logits passes the row ran (estimate/logits.py): 0.4.1 for the
    notes' `full_logits_trials`."""
    rollout_in_actor: bool = False
    """vLLM ran in the actor's process, not beside it as in verl 0.9.1 (estimate/memory.py
    `memory_of`): the reference rows, verl <= 0.5's sync-mode rollout (the GRPO script sets
    rollout_mode="sync", the DAPO scripts keep that release's default, ppo_megatron_trainer.yaml
    `rollout.mode: sync`)."""
    async_scheduling: bool = VLLM_ASYNC_SCHEDULING
    """vLLM overlapped each decode step's host work with the GPU (estimate/generation.py
    VLLM_ASYNC_SCHEDULING): the default of the installed vLLM 0.24.0, which this project's own
    rows ran; False for the reference rows (REFERENCE_VLLM_ASYNC_SCHEDULING)."""

    def predict(self, profile: Profile | None = None) -> Estimate:
        """The cost model's numbers for this row, as it ran."""
        return estimate(
            self.candidate,
            self.model,
            self.cluster,
            self.workload,
            profile,
            verl_logits=self.verl_logits,
            rollout_in_actor=self.rollout_in_actor,
            async_scheduling=self.async_scheduling,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    case: Case
    estimate: Estimate


@dataclass(frozen=True, kw_only=True, slots=True)
class Summary:
    outcomes: list[Outcome]
    median_ape: dict[str, float]
    """Median absolute percentage error per phase (a fraction), over rows that report it."""
    counts: dict[str, int]
    oom_rows: int
    oom_caught: int
    """OOM rows predicted as not fitting."""
    ok_rows: int
    ok_fit: int
    """Measured rows predicted as fitting."""

    @property
    def goal_met(self) -> bool:
        return all(self.median_ape.get(p, 1.0) <= 0.20 for p in GOAL_PHASES)


def _truthy(v: str) -> bool:
    return v.strip().lower() in ("true", "1", "yes", "full", "selective")


def _model_of(row: dict[str, str], notes: FileNotes) -> str:
    name = (row.get("model") or "").strip().lower()
    if name in _MODEL_NAMES:
        return _MODEL_NAMES[name]
    if name:
        return name
    return notes.model


def case_from_row(
    row: dict[str, str], response_mean: int = 0, notes: FileNotes | None = None
) -> Case | None:
    """A Case for one row of a reference CSV or of our leaderboard; None for rows without a
    Megatron measurement (FSDP rows, rows without numbers, failed runs). `notes`: what the
    notes beside the row's file say (tuner.fit.notes; none by default)."""
    backend = (row.get("backend") or "").lower()
    if "fsdp" in backend or (row.get("train_parallel") or "").startswith("sp"):
        return None
    status = row.get("status", "")
    if status not in ("ok", "oom"):
        return None
    measured = {
        name: v for col, name in PHASES if (v := number(row.get(col))) is not None and v > 0
    }
    if status == "ok" and not measured:
        return None
    if row.get("source") == "reference":
        return _reference_case(row, status, measured, response_mean, notes or FileNotes())
    return _own_case(row, status, measured)


def reported_response_mean(rows: list[dict[str, str]]) -> int:
    """The mean response length a leaderboard's own token counts imply, 0 when it reports none.

    A reference row that gives throughput (tokens/s/GPU, unpadded prompt + response as verl
    counts them) and step time gives the step's tokens, hence the mean sample length; the rows
    of one file share one dataset, so the median over the file stands for all its rows. This is
    a property of the workload (the data set and policy), not of the cost model."""
    per_sample: list[float] = []
    for r in rows:
        thr, step = number(r.get("tokens_per_s_per_gpu")), number(r.get("step_s"))
        if thr and step and r.get("num_gpus") and r.get("bs"):
            samples = int(r["bs"]) * int(REFERENCE_DEFAULTS["n"])  # type: ignore[call-overload]
            per_sample.append(thr * int(r["num_gpus"]) * step / samples)
    if not per_sample:
        return 0
    prompt = int(number(rows[0].get("max_prompt_len")) or 2048)
    mean_prompt = Workload(prompt_len=prompt).mean_prompt_len
    return max(1, round(statistics.median(per_sample) - mean_prompt))


def _reference_case(
    row: dict[str, str],
    status: str,
    measured: dict[str, float],
    response_mean: int,
    file_notes: FileNotes,
) -> Case:
    d = REFERENCE_DEFAULTS
    model = get_model(_model_of(row, file_notes))
    gpus = int(row["num_gpus"])
    cluster = Cluster(gpu=get_gpu(row["gpu"]), num_gpus=gpus)
    study = row.get("study", "")
    algorithm = "grpo" if "grpo" in study else "dapo"
    workload = get_workload(f"{algorithm}-math").with_overrides(
        prompt_len=int(row["max_prompt_len"]),
        response_len=int(row["max_response_len"]),
        batch_size=int(row["bs"]),
        mini_batch_size=int(row["mini_bs"]),
        n=d["n"],
        response_mean=response_mean,
    )
    layout = ParallelLayout.parse(row["train_parallel"], gpus)
    other = (row.get("reason") or "").lower()
    recipe = file_notes.recipe_inputs.get(row.get("trial", ""), {})
    recompute = "none"
    if "recompute" in row:
        rc = row["recompute"].strip().lower()
        recompute = "full" if rc == "full" else ("selective" if rc == "selective" else "none")
    elif "full recompute" in other or "full_recompute" in other:
        recompute = "full"
    elif "selective recompute" in other:
        recompute = "selective"
    recompute = str(recipe.get("recompute", recompute))
    offload = _truthy(row["offload"]) if row.get("offload") else bool(d["offload"])
    util = (
        number(row.get("gpu_memory_utilization"))
        or float(recipe.get("gpu_memory_utilization", 0.0))  # type: ignore[arg-type]
        or float(d["gpu_memory_utilization"])  # type: ignore[arg-type]
    )
    actor = int(number(row.get("actor_budget")) or 0)
    logp = int(number(row.get("log_prob_budget")) or 0)
    if "dynamic_batch" in row and row["dynamic_batch"]:
        dynamic = _truthy(row["dynamic_batch"])
    else:
        dynamic = actor >= 1024
    notes = [f"response mean {response_mean} from the file's throughput"] if response_mean else []
    full_logits = int(row.get("trial") or 0) in file_notes.full_logits_trials
    if full_logits:
        notes.append("full logits: verl before its megatron fused kernels")
    if dynamic:
        kw: dict[str, int | bool] = {
            "use_dynamic_bsz": True,
            "ppo_max_token_len_per_gpu": actor,
            "log_prob_max_token_len_per_gpu": logp,
        }
    else:
        mb = actor if 0 < actor < 1024 else GRPO_RECIPE["ppo_micro_batch_size_per_gpu"]
        lmb = logp if 0 < logp < 1024 else GRPO_RECIPE["log_prob_micro_batch_size_per_gpu"]
        if actor >= 1024:
            notes.append(f"micro batch {mb}/{lmb} from the recipe")
        kw = {
            "use_dynamic_bsz": False,
            "ppo_micro_batch_size_per_gpu": mb,
            "log_prob_micro_batch_size_per_gpu": lmb,
        }
    cand = Candidate(
        layout=layout,
        sequence_parallel=layout.tp > 1,
        recompute_granularity=recompute,
        param_offload=offload,
        optimizer_offload=offload,
        use_fused_kernels=not full_logits,
        rollout_tp=int((row.get("infer_parallel") or "tp1").lower().removeprefix("tp") or 1),
        gpu_memory_utilization=util,
        max_num_batched_tokens=workload.max_seq_len,
        max_num_seqs=int(d["max_num_seqs"]),  # type: ignore[call-overload]
        enforce_eager=bool(d["enforce_eager"]) and CUDA_GRAPH_MARK not in other,
        apply_rope_fusion=file_notes.rope_fusion or any(m in other for m in ROPE_FUSION_MARKS),
        **kw,  # type: ignore[arg-type]
    )
    label = f"{study}:{row.get('trial', '')}"
    case = Case(
        label=label,
        candidate=cand,
        model=model,
        cluster=cluster,
        workload=workload,
        status=status,
        measured=measured,
        verl_logits=FULL_LOGITS_VERL if full_logits else DEFAULT_VERL,
        rollout_in_actor=True,
        async_scheduling=REFERENCE_VLLM_ASYNC_SCHEDULING,
    )
    bound = mfu_response_bound(row, case)
    if not response_mean and status == "ok":
        told = f"; its MFU x update time allow <= {bound}" if bound else ""
        notes.insert(
            0, f"response mean {round(workload.mean_response_len)}: default, no token counts{told}"
        )
    elif bound:
        notes[0] += f" (MFU x update time allow <= {bound})"
    return replace(case, notes="; ".join(notes))


def mfu_response_bound(row: dict[str, str], case: Case) -> int:
    """The longest mean response a reference row's update MFU allows, 0 when it reports none.

    verl logs perf/mfu/actor as its FlopsCounter's model FLOPs of the step's samples (see
    MFU_ATTENTION_FACTOR; the samples' lengths from the workload's length model at a given
    mean) over the time of `update_policy` x the GPUs' promised FLOP/s (989 T for H100, 148 T for
    H20 in verl's table, as in tuner.hardware). update_policy runs inside the phase the row's
    update_actor times, which adds the parameter/optimizer onload and offload and the
    controller's dispatch: MFU x update_actor x peak x GPUs is at least the step's FLOPs, so the
    mean that makes them equal is an upper bound on the row's mean response, not its value: the
    grpo rows, whose throughput gives the value, sit under their bounds by a few to over thirty
    percent (scripts/validate_estimator.py prints the spread)."""
    mfu, seconds = number(row.get("verl_mfu_actor_pct")), case.measured.get("update_actor")
    if not mfu or not seconds:
        return 0
    cl, m, w = case.cluster, case.model, case.workload
    allowed = mfu / 100 * seconds * cl.gpu.bf16_tflops * 1e12 * cl.num_gpus
    attn = m.num_attention_heads * m.head_dim
    # the weights FlopsCounter counts are the model's matmul weights (ModelSpec's one formula),
    # with the embedding and the output layer both counted, tied or not
    weights = m.layer_matmul_params * m.num_layers + 2 * m.vocab_size * m.hidden_size

    def step_flops(mean: int) -> float:
        lw = w.with_overrides(response_mean=mean)
        pm, rm = lw.mean_prompt_len, lw.mean_response_len
        e_s2 = pm * pm + 2 * pm * rm + lw.response_lengths.second_moment()
        per = 6 * weights * (pm + rm) + MFU_ATTENTION_FACTOR * e_s2 * attn * m.num_layers
        return lw.num_samples * per

    lo, hi = 1, w.response_len
    if step_flops(hi) <= allowed:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if step_flops(mid) <= allowed else (lo, mid)
    return lo


def row_setup(row: dict[str, str]) -> tuple[ModelSpec, Cluster, Workload, Candidate]:
    """The model, cluster, workload and candidate a leaderboard row of ours describes (its
    columns as the CSV writes them). Raises UserError, KeyError or ValueError for a row that
    does not name them."""
    model = get_model(row["model"])
    cluster = Cluster(
        gpu=get_gpu(row["gpu"]),
        num_gpus=int(row["num_gpus"]),
        gpus_per_node=int(row.get("gpus_per_node") or 8),
    )
    workload = Workload(
        name=row.get("workload") or "custom",
        algorithm=row.get("algorithm") or "dapo",
        prompt_len=int(row["max_prompt_len"]),
        response_len=int(row["max_response_len"]),
        response_mean=int(round(number(row.get("response_mean_len")) or 0)),
        prompt_mean=int(round(number(row.get("prompt_mean_len")) or 0)),
        batch_size=int(row["bs"]),
        n=int(row["n"]),
        mini_batch_size=int(row["mini_bs"]),
    )
    return model, cluster, workload, Candidate.from_record(row, cluster.num_gpus)


def _own_case(row: dict[str, str], status: str, measured: dict[str, float]) -> Case:
    model, cluster, workload, cand = row_setup(row)
    return Case(
        label=f"{row.get('study', '')}:{row.get('trial', '')}",
        candidate=cand,
        model=model,
        cluster=cluster,
        workload=workload,
        status=status,
        measured=measured,
    )


def load_cases(paths: Iterable[Path], reported_tokens: bool = True) -> list[Case]:
    """Cases of every usable row of the given CSVs (in order). With `reported_tokens`, a file
    whose rows report throughput sets its own mean response length (see
    `reported_response_mean`); otherwise the workload default applies. Each file's notes
    (tuner.fit.notes) apply to its rows."""
    out: list[Case] = []
    for path in paths:
        rows = read_rows(path)
        mean = reported_response_mean(rows) if reported_tokens else 0
        notes = notes_for(path)
        for row in rows:
            try:
                case = case_from_row(row, mean if row.get("source") == "reference" else 0, notes)
            except (UserError, KeyError, ValueError):
                continue
            if case is not None:
                out.append(case)
    return out


def anchor_paths(directory: Path) -> list[Path]:
    paths = sorted(directory.glob("*.csv"))
    if not paths:
        raise UserError(f"no CSV files in {directory}: pass the folder of the reference CSVs")
    return paths


def ape(predicted: float, measured: float) -> float:
    """Absolute percentage error, a fraction (inf when the prediction is not finite)."""
    if not math.isfinite(predicted):
        return math.inf
    return abs(predicted - measured) / measured


def predicted_phase(e: Estimate, phase: str) -> float:
    return {
        "generation": e.generation_s,
        "old_log_prob": e.old_log_prob_s,
        "update_actor": e.update_actor_s,
        "step": e.step_s,
    }[phase]


def validate(cases: list[Case], profile: Profile | None = None) -> Summary:
    outcomes = [Outcome(case=c, estimate=c.predict(profile)) for c in cases]
    errors: dict[str, list[float]] = {name: [] for _, name in PHASES}
    for o in outcomes:
        if o.case.status != "ok":
            continue
        for phase, measured in o.case.measured.items():
            errors[phase].append(ape(predicted_phase(o.estimate, phase), measured))
    median = {k: statistics.median(v) for k, v in errors.items() if v}
    oom = [o for o in outcomes if o.case.status == "oom"]
    ok = [o for o in outcomes if o.case.status == "ok"]
    return Summary(
        outcomes=outcomes,
        median_ape=median,
        counts={k: len(v) for k, v in errors.items()},
        oom_rows=len(oom),
        oom_caught=sum(not o.estimate.fits for o in oom),
        ok_rows=len(ok),
        ok_fit=sum(o.estimate.fits for o in ok),
    )
