"""The Run page's API: what a train job (``agentbolt train``) left in the store, read back as one view per run.

- ``GET /v1/runs``: the runs of the store, oldest first (:class:`RunSummary`).
- ``GET /v1/runs/{run_id}``: one run (:class:`RunView`): its resolved config, the validation table (one row per
  evaluated step, one column per validation set; ``before`` and ``after`` training when measured), one row per
  training step (reward, samples trained, why an update was skipped) and its checkpoints with the commands that
  serve and score each.

Where it comes from (every read goes through the store contract):

- A train job writes a resources version with ``metadata.purpose == "run"`` when it starts and again at each resume
  (:data:`agentbolt.trainer.job_config.RUN_PURPOSE`): ``config`` (the resolved settings as JSON), ``out_dir`` (absolute)
  and ``resumed_from_step`` (``None`` for a fresh run). A fresh one starts a run; a resume continues the run before it
  (a *segment* of the run). The run's id is the ``resources_id`` of its first version.
- Its other versions are those written after it and before the next run: ``purpose: checkpoint`` (``train_step``,
  ``model_version``, ``checkpoint``: the folder) and the evaluations (``before``, ``after``, ``step-N``).
- Its metrics are those recorded from its start until the next run starts (by ``Metric.time``; a store normally
  holds one run, which then has them all): per step ``train_reward_mean``... and the trainer's ``update_*`` stats,
  and ``val_accuracy/<set>`` at the step after which the weights were evaluated (0: before training).

Checkpoints are checked on the server's file system: a folder that is gone was deleted by pruning when its run's
``checkpoints`` folder is still here (``keep_last`` plus the best), and is "not on this machine" when the run's
output folder is not (a store file copied elsewhere).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, JsonValue

from agentbolt.errors import NotFoundError
from agentbolt.server.errors import error_responses
from agentbolt.store.base import LightningStore
from agentbolt.types import Metric, ResourcesUpdate

router = APIRouter(prefix="/v1", tags=["dashboard"])

RUN_PURPOSE: Final = "run"
"""``metadata.purpose`` of the version a train job writes at its start and at each resume (the trainer's
``RUN_PURPOSE``; a test keeps the two equal)."""
CHECKPOINT_PURPOSE: Final = "checkpoint"
"""``metadata.purpose`` of a checkpoint's version."""
EVAL_PURPOSES: Final = frozenset({"before", "after"})
"""``metadata.purpose`` of the evaluations before and after training (mid-run ones are ``step-N``)."""
CONFIG_FILE: Final = "config.yaml"
"""The job's resolved settings inside a checkpoint folder (the trainer's ``CONFIG_FILE``)."""
VAL_PREFIX: Final = "val_accuracy/"
"""Validation metrics are named ``val_accuracy/<set>``."""
RUN_ONLY_CONFIG_KEYS: Final = frozenset({"resume", "overwrite"})
"""Config keys that say how a segment was started, not how it trains: left out of :attr:`RunSegment.changed`."""
ALL_ZERO_ADVANTAGE: Final = "update skipped: all advantages are zero"
"""The reason shown for a step whose every sample had advantage 0 (e.g. every rollout of each group scored the same)."""

CheckpointState = Literal["on_disk", "pruned", "not_on_this_machine"]
"""Where a checkpoint's folder is: ``on_disk`` (here), ``pruned`` (deleted: its run's ``checkpoints`` folder is here
without it), ``not_on_this_machine`` (the run's output folder is not here either)."""
CHECKPOINT_STATE_LABELS: Final[dict[str, str]] = {
    "on_disk": "on disk",
    "pruned": "deleted (pruned)",
    "not_on_this_machine": "not on this machine",
}
"""How the page words each :data:`CheckpointState`."""

_STEP_VERSION = re.compile(r"^step-(\d+)$")


# ------------------------------------------------------------------------------------------------------ models
class RunSummary(BaseModel):
    """One train job in the store.

    ``run_id``: the ``resources_id`` of the version its job wrote when it started; ``start_time``: when (seconds
    since the epoch); ``model``, ``out_dir``: from its config and metadata; ``n_segments``: 1 plus the number of times
    it was resumed; ``last_train_step``: the highest step with a recorded metric (``None``: none yet).
    """

    run_id: str
    start_time: float
    model: str | None
    out_dir: str | None
    n_segments: int
    last_train_step: int | None


class RunSegment(BaseModel):
    """One start of the run's job: the first, then one per ``--resume``.

    ``resources_id`` and ``start_time``: the version it wrote and when; ``resumed_from_step``: the checkpoint's step it
    went on from (``None``: the fresh start); ``config``: its resolved settings; ``changed``: the dotted keys whose
    value differs from the previous segment's (``resume`` and ``overwrite`` left out; empty for the first).
    """

    resources_id: str
    start_time: float
    resumed_from_step: int | None
    config: dict[str, JsonValue]
    changed: list[str]


class ValidationRow(BaseModel):
    """The validation accuracy of the weights after ``train_step`` (0: before training), per set, in [0, 1].

    ``label``: ``before`` (step 0), ``after`` (the evaluation that ended training, the last row), or ``step N`` (a
    mid-run evaluation, ``eval_every``); ``mean_accuracy``: the mean over the sets (``None``: no set);
    ``model_version`` and ``checkpoint``: the weights evaluated, when the evaluation's resources version names them.
    """

    train_step: int
    label: str
    accuracy: dict[str, float]
    mean_accuracy: float | None
    model_version: str | None = None
    checkpoint: str | None = None


class ValidationTable(BaseModel):
    """The rows of :class:`ValidationRow` in step order, and the set names (the columns) in order of appearance."""

    sets: list[str]
    rows: list[ValidationRow]


class StepRow(BaseModel):
    """One training step, from its metrics (``None``: not recorded).

    ``reward_mean`` / ``reward_std``: of the step's training rollouts; ``n_rollouts`` / ``n_failed_rollouts`` /
    ``n_infra_failed_rollouts``: how many ran, failed, failed by infrastructure (left out of training);
    ``n_samples``: training samples in the update's batch; ``trained_samples``: those the update learned from
    (``update_n_samples``); ``n_skipped_zero_advantage`` / ``n_skipped_no_loss_tokens``: samples it skipped, and why;
    ``stepped``: whether the optimizer took the step; ``skipped_reason``: why not (:func:`update_skip_reason`);
    ``loss``, ``approx_kl``, ``grad_norm``, ``clip_fraction``: the update's; ``rollout_s``, ``update_s``,
    ``wait_s``: wall seconds; ``segment``: the index in :attr:`RunView.segments` of the job start that ran it.
    """

    train_step: int
    reward_mean: float | None = None
    reward_std: float | None = None
    n_rollouts: int | None = None
    n_failed_rollouts: int | None = None
    n_infra_failed_rollouts: int | None = None
    n_samples: int | None = None
    trained_samples: int | None = None
    n_skipped_zero_advantage: int | None = None
    n_skipped_no_loss_tokens: int | None = None
    stepped: bool | None = None
    skipped_reason: str | None = None
    loss: float | None = None
    approx_kl: float | None = None
    grad_norm: float | None = None
    clip_fraction: float | None = None
    rollout_s: float | None = None
    update_s: float | None = None
    wait_s: float | None = None
    segment: int = 0


class CheckpointRow(BaseModel):
    """One checkpoint of the run (its resources version), and how to use it.

    ``path``: the folder (absolute, as the job wrote it); ``state`` / ``state_label``: whether it is still there
    (:data:`CheckpointState`); ``mean_accuracy``: the mean validation accuracy of its weights (``None``: not
    evaluated); ``best``: the highest ``mean_accuracy`` of the run (the newest among equals), the one pruning keeps;
    ``serve_command``: ``agentbolt serve`` with its adapter behind the gateway (``None``: the run's config names no
    model); ``eval_command``: ``agentbolt eval`` of its weights, with the config the checkpoint holds. Both are
    shell-quoted and meant to be run in the folder the train job ran in (the config's ``agent`` and ``tasks``
    modules are imported from there).
    """

    resources_id: str
    create_time: float
    train_step: int
    model_version: str | None
    path: str
    state: CheckpointState
    state_label: str
    mean_accuracy: float | None
    best: bool
    serve_command: str | None
    eval_command: str


class RunView(RunSummary):
    """Everything the Run page shows about one run (see the module docstring).

    ``config``: the resolved settings of its latest segment; ``segments``: each job start; ``validation``: the
    validation table; ``steps``: one row per training step; ``checkpoints``: in step order.
    """

    config: dict[str, JsonValue]
    segments: list[RunSegment]
    validation: ValidationTable
    steps: list[StepRow]
    checkpoints: list[CheckpointRow]


# ------------------------------------------------------------------------------------------------------ reading
@dataclass
class _RunRecords:
    """The versions and metrics of one run (see the module docstring)."""

    segments: list[ResourcesUpdate]
    versions: list[ResourcesUpdate]
    metrics: list[Metric]


def _is_run(update: ResourcesUpdate) -> bool:
    return update.metadata.get("purpose") == RUN_PURPOSE


def _split_runs(versions: Sequence[ResourcesUpdate], metrics: Sequence[Metric]) -> list[_RunRecords]:
    """Group the store's versions (oldest first) into runs; each run's metrics are those from its start to the
    next run's (no bound before the first run or after the last)."""
    runs: list[_RunRecords] = []
    for update in versions:
        if _is_run(update) and (not runs or update.metadata.get("resumed_from_step") is None):
            runs.append(_RunRecords(segments=[update], versions=[], metrics=[]))
        elif _is_run(update):
            runs[-1].segments.append(update)
        elif runs:
            runs[-1].versions.append(update)
    for index, run in enumerate(runs):
        start = run.segments[0].create_time if index > 0 else -math.inf
        end = runs[index + 1].segments[0].create_time if index + 1 < len(runs) else math.inf
        run.metrics = [m for m in metrics if start <= m.time < end]
    return runs


def _config(update: ResourcesUpdate) -> dict[str, JsonValue]:
    config = update.metadata.get("config")
    return dict(config) if isinstance(config, dict) else {}


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _changed(before: Mapping[str, JsonValue], after: Mapping[str, JsonValue], prefix: str = "") -> list[str]:
    """The dotted keys whose value differs between two configs, sorted; a section that is empty or missing on one
    side is one key (``torch_trainer``), not one per setting in it."""
    out: list[str] = []
    for key in sorted(set(before) | set(after)):
        if not prefix and key in RUN_ONLY_CONFIG_KEYS:
            continue
        old, new = before.get(key, ...), after.get(key, ...)
        if isinstance(old, dict) and isinstance(new, dict) and old and new:
            out.extend(_changed(old, new, f"{prefix}{key}."))
        elif old != new:
            out.append(f"{prefix}{key}")
    return out


def _model_step(model_version: object) -> int | None:
    """The step of a weights version ``step-N`` (``None`` for ``base`` and anything else)."""
    match = _STEP_VERSION.match(model_version) if isinstance(model_version, str) else None
    return int(match.group(1)) if match else None


def update_skip_reason(values: Mapping[str, float]) -> str | None:
    """Why the update of a step took no optimizer step, from the step's metrics (``update_stepped``,
    ``update_n_samples``, ``update_n_skipped_zero_advantage``, ``update_n_skipped_no_loss_tokens``: the torch
    trainer's :meth:`~agentbolt.algorithms.rl.torch_backend.TorchPolicyTrainer.train_step` stats); ``None`` when it
    stepped or ``update_stepped`` was not recorded.

    The first that applies: samples were trained but no step was taken (a non-finite gradient norm); every skipped
    sample had advantage 0 (:data:`ALL_ZERO_ADVANTAGE`); none had tokens to train; both; no sample at all.
    """
    if values.get("update_stepped", 1.0) != 0.0:
        return None
    trained = values.get("update_n_samples", 0.0)
    zero = int(values.get("update_n_skipped_zero_advantage", 0.0))
    empty = int(values.get("update_n_skipped_no_loss_tokens", 0.0))
    if trained > 0:
        return "update skipped: non-finite gradient norm"
    if zero and not empty:
        return ALL_ZERO_ADVANTAGE
    if empty and not zero:
        return "update skipped: no sample has tokens to train (loss mask all 0)"
    if zero and empty:
        return f"update skipped: {zero} samples with advantage 0, {empty} with no tokens to train"
    return "update skipped: no training sample (no LLM call captured, or every rollout failed)"


def _by_step(metrics: Iterable[Metric]) -> dict[int, dict[str, float]]:
    """``train_step -> name -> value`` (the last value recorded wins)."""
    out: dict[int, dict[str, float]] = {}
    for metric in metrics:
        out.setdefault(metric.train_step, {})[metric.name] = metric.value
    return out


def _current_metrics(metrics: Sequence[Metric], segments: Sequence[RunSegment]) -> list[Metric]:
    """The metrics of the run as it stands: a metric of step ``s`` recorded before the segment that ran ``s``
    started is superseded (a run resumed from an older checkpoint, after the newest was deleted, runs ``s`` again;
    the store keeps both records)."""
    return [m for m in metrics if m.time >= segments[_segment_of(m.train_step, segments)].start_time]


def _segment_of(step: int, segments: Sequence[RunSegment]) -> int:
    """The index of the last segment that started before ``step`` (a resume from step k runs k + 1 on)."""
    index = 0
    for i, segment in enumerate(segments):
        if (segment.resumed_from_step or 0) < step:
            index = i
    return index


def _count(values: Mapping[str, float], name: str) -> int | None:
    value = values.get(name)
    return None if value is None else int(value)


def _step_rows(by_step: Mapping[int, Mapping[str, float]], segments: Sequence[RunSegment]) -> list[StepRow]:
    rows: list[StepRow] = []
    for step in sorted(by_step):
        values = by_step[step]
        if step < 1 or all(name.startswith(VAL_PREFIX) for name in values):
            continue  # an evaluation, not a training step
        stepped = values.get("update_stepped")
        rows.append(
            StepRow(
                train_step=step,
                reward_mean=values.get("train_reward_mean"),
                reward_std=values.get("train_reward_std"),
                n_rollouts=_count(values, "n_rollouts"),
                n_failed_rollouts=_count(values, "n_failed_rollouts"),
                n_infra_failed_rollouts=_count(values, "n_infra_failed_rollouts"),
                n_samples=_count(values, "n_samples"),
                trained_samples=_count(values, "update_n_samples"),
                n_skipped_zero_advantage=_count(values, "update_n_skipped_zero_advantage"),
                n_skipped_no_loss_tokens=_count(values, "update_n_skipped_no_loss_tokens"),
                stepped=None if stepped is None else stepped != 0.0,
                skipped_reason=update_skip_reason(values),
                loss=values.get("update_loss"),
                approx_kl=values.get("update_approx_kl"),
                grad_norm=values.get("update_grad_norm"),
                clip_fraction=values.get("update_clip_fraction"),
                rollout_s=values.get("rollout_s"),
                update_s=values.get("update_s"),
                wait_s=values.get("wait_s"),
                segment=_segment_of(step, segments),
            )
        )
    return rows


def _validation(
    by_step: Mapping[int, Mapping[str, float]], metrics: Sequence[Metric], versions: Sequence[ResourcesUpdate]
) -> ValidationTable:
    sets = list(dict.fromkeys(m.name.removeprefix(VAL_PREFIX) for m in metrics if m.name.startswith(VAL_PREFIX)))
    evaluations: dict[int, ResourcesUpdate] = {}  # step -> the (last) evaluation of the weights after it
    for update in versions:
        purpose = update.metadata.get("purpose")
        if purpose in EVAL_PURPOSES or (isinstance(purpose, str) and _STEP_VERSION.match(purpose)):
            evaluations[_model_step(update.metadata.get("model_version")) or 0] = update
    steps = [s for s in sorted(by_step) if any(name.startswith(VAL_PREFIX) for name in by_step[s])]
    rows: list[ValidationRow] = []
    for step in steps:
        accuracy = {
            name: by_step[step][f"{VAL_PREFIX}{name}"] for name in sets if f"{VAL_PREFIX}{name}" in by_step[step]
        }
        evaluation = evaluations.get(step)
        purpose = evaluation.metadata.get("purpose") if evaluation is not None else None
        label = "before" if step == 0 else "after" if purpose == "after" and step == steps[-1] else f"step {step}"
        checkpoint = evaluation.metadata.get("checkpoint") if evaluation is not None else None
        model_version = evaluation.metadata.get("model_version") if evaluation is not None else None
        rows.append(
            ValidationRow(
                train_step=step,
                label=label,
                accuracy=accuracy,
                mean_accuracy=math.fsum(accuracy.values()) / len(accuracy) if accuracy else None,
                model_version=model_version if isinstance(model_version, str) else None,
                checkpoint=checkpoint if isinstance(checkpoint, str) else None,
            )
        )
    return ValidationTable(sets=sets, rows=rows)


def _checkpoint_state(path: Path) -> CheckpointState:
    if path.is_dir():
        return "on_disk"
    return "pruned" if path.parent.is_dir() else "not_on_this_machine"


def _checkpoint_rows(
    versions: Sequence[ResourcesUpdate], validation: ValidationTable, model: str | None
) -> list[CheckpointRow]:
    accuracy_at = {row.train_step: row.mean_accuracy for row in validation.rows}
    # By path, the newest version wins: a run resumed from an older checkpoint (the newest was deleted) trains that
    # step again and publishes the same folder again; the folder now holds the new weights.
    found: dict[str, CheckpointRow] = {}
    for update in versions:
        meta = update.metadata
        path, step = meta.get("checkpoint"), _int_or_none(meta.get("train_step"))
        if meta.get("purpose") != CHECKPOINT_PURPOSE or not isinstance(path, str) or step is None:
            continue
        state = _checkpoint_state(Path(path))
        version = meta.get("model_version")
        quoted = shlex.quote(path)
        serve = None if model is None else f"agentbolt serve --model {shlex.quote(model)} --adapter {quoted}"
        config_yaml = shlex.quote(str(Path(path) / CONFIG_FILE))
        found[path] = CheckpointRow(
            resources_id=update.resources_id,
            create_time=update.create_time,
            train_step=step,
            model_version=version if isinstance(version, str) else None,
            path=path,
            state=state,
            state_label=CHECKPOINT_STATE_LABELS[state],
            mean_accuracy=accuracy_at.get(step),
            best=False,
            serve_command=serve,
            eval_command=f"agentbolt eval {config_yaml} --checkpoint {quoted}",
        )
    rows = sorted(found.values(), key=lambda row: (row.train_step, row.create_time))
    scored = [row for row in rows if row.mean_accuracy is not None]
    if scored:
        max(scored, key=lambda row: (row.mean_accuracy, row.train_step)).best = True
    return rows


def _summary(run: _RunRecords) -> RunSummary:
    first, latest = run.segments[0], run.segments[-1]
    model = _config(latest).get("model")
    out_dir = latest.metadata.get("out_dir")
    steps = [m.train_step for m in run.metrics]
    return RunSummary(
        run_id=first.resources_id,
        start_time=first.create_time,
        model=model if isinstance(model, str) else None,
        out_dir=out_dir if isinstance(out_dir, str) else None,
        n_segments=len(run.segments),
        last_train_step=max(steps) if steps else None,
    )


def _build_run_view(run: _RunRecords) -> RunView:
    """The :class:`RunView` of one run's records (checkpoint folders are looked up on this machine)."""
    summary = _summary(run)
    segments: list[RunSegment] = []
    for update in run.segments:
        config = _config(update)
        segments.append(
            RunSegment(
                resources_id=update.resources_id,
                start_time=update.create_time,
                resumed_from_step=_int_or_none(update.metadata.get("resumed_from_step")),
                config=config,
                changed=_changed(segments[-1].config, config) if segments else [],
            )
        )
    metrics = _current_metrics(run.metrics, segments)
    by_step = _by_step(metrics)
    validation = _validation(by_step, metrics, run.versions)
    return RunView(
        **summary.model_dump(),
        config=segments[-1].config,
        segments=segments,
        validation=validation,
        steps=_step_rows(by_step, segments),
        checkpoints=_checkpoint_rows(run.versions, validation, summary.model),
    )


async def _runs(store: LightningStore) -> list[_RunRecords]:
    return _split_runs(await store.query_resources(), await store.query_metrics())


# ------------------------------------------------------------------------------------------------------ routes
@router.get("/runs", response_model=list[RunSummary])
async def list_runs(request: Request) -> list[RunSummary]:
    """The train jobs recorded in the store (``agentbolt train`` writes a ``purpose: run`` resources version when it
    starts and at each resume), oldest first; empty when none."""
    return [_summary(run) for run in await _runs(request.app.state.store)]


@router.get("/runs/{run_id}", response_model=RunView, responses=error_responses(404))
async def get_run(run_id: str, request: Request) -> RunView:
    """One train job: its resolved config, validation table (before/after training), one row per step (reward,
    samples trained, why an update was skipped) and checkpoints with the commands that serve and score each; 404 when
    no run starts at ``run_id``."""
    for run in await _runs(request.app.state.store):
        if run.segments[0].resources_id == run_id:
            return _build_run_view(run)
    raise NotFoundError(f"no run {run_id!r}: GET /v1/runs lists the runs (their first resources version)")
