"""Checkpoints of an RL job: ``OUT/checkpoints/step-N/``, written atomically, tied to the store, resumable.

A checkpoint folder holds:

- ``adapter_config.json`` + ``adapter_model.safetensors``: the LoRA adapter in peft's format (loads with
  ``PeftModel.from_pretrained(base_model, folder)``); ``value_head.safetensors`` when the run has a value head;
  ``trainer_state.pt``: optimizer state, optimizer step count and torch RNG states
  (:meth:`~agentbolt.algorithms.rl.torch_backend.TorchPolicyTrainer.save_state`);
- ``config.yaml``: the job's resolved settings (every default filled in);
- ``checkpoint.json``, written last (:class:`CheckpointInfo`): the step, the model and the bf16 directory that was
  trained, the weights version (``step-N``), the validation accuracy when it was measured, the loop's state (served
  versions, the task sampler's position: :meth:`~agentbolt.trainer.loop.RLTrainer.state_dict`), the job's own
  state (per-step figures, the "before" accuracy) and the metrics first recorded with this checkpoint.

Atomicity: everything is written into ``checkpoints/.tmp-step-N-<pid>/``, flushed to disk, then renamed to
``step-N`` (a rename within one folder is atomic on POSIX). A folder without ``checkpoint.json``, or a ``.tmp-``
folder, is a checkpoint that was cut short: :func:`list_checkpoints` ignores it and :func:`remove_partial` deletes
it.

Tied to the store: each checkpoint is also a resources version (metadata ``purpose: checkpoint``, ``train_step``,
``model_version``, ``checkpoint``: the folder's absolute path), and every later training rollout's resources name
the same folder (:attr:`~agentbolt.trainer.loop.RLTrainer.checkpoint_paths`), so any rollout leads to the weights
that produced it.

Metrics are recorded once: while checkpoints are on, the trainer keeps each step's metrics back
(:attr:`~agentbolt.trainer.loop.RLTrainer.metric_buffer`) and writes them to the store right after the checkpoint
that covers the step exists; a run killed in between wrote them to ``checkpoint.json`` too, and the resumed run adds
the ones the store lacks (:func:`restore_missing_metrics`). A step after the last checkpoint was never recorded, and
the resumed run runs it again.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import stat
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from agentbolt.config import _Config
from agentbolt.errors import ConfigError, InvalidTransitionError
from agentbolt.types import Metric, RolloutStatus

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore
    from agentbolt.trainer.loop import RLTrainer

CHECKPOINTS_DIR = "checkpoints"
"""The checkpoints' folder inside a run's output folder."""

CHECKPOINT_FILE = "checkpoint.json"
"""Written last into a checkpoint folder: its presence marks a complete checkpoint."""

CONFIG_FILE = "config.yaml"
"""The job's resolved settings in a checkpoint folder."""

FORMAT_VERSION = 1
"""``checkpoint.json``'s ``format``; a reader refuses a newer one."""

_TMP_PREFIX = ".tmp-"
_STEP_PREFIX = "step-"


class CheckpointConfig(_Config):
    """When checkpoints are written and which are kept (``checkpoint:`` in a train config).

    Attributes:
        every: write a checkpoint after every ``every`` steps (and always after the last one). Each costs the
            adapter (a few MB for LoRA r16 on a 0.5B model) plus the AdamW moments (twice the adapter) and under a
            second on a CPU; on a CPU every step is worth it (a step takes minutes).
        keep_last: the newest checkpoints to keep (>= 1); older ones are deleted, except the best.
        keep_best: also keep the checkpoint with the best mean validation accuracy (measured with ``eval_every``
            or at the end by ``eval_after``).
    """

    every: int = Field(default=1, ge=1)
    keep_last: int = Field(default=2, ge=1)
    keep_best: bool = True


@dataclass(frozen=True)
class CheckpointInfo:
    """What ``checkpoint.json`` says about one complete checkpoint.

    Attributes:
        path: the checkpoint folder.
        step: the training step after which it was written (its weights served step ``step + 1``'s rollouts).
        model: the model as the job config gave it (an embedded name such as ``qwen2.5-0.5b``, or a directory).
        base_model_dir: absolute path of the bf16 Hugging Face directory that was trained.
        model_version: the weights version the gateway stamped on calls made with these weights (``step-N``).
        val_accuracy: validation accuracy per set (in [0, 1]) of these weights, when it was measured.
        created_at: when it was written (seconds since the epoch).
        loop: the trainer loop's state (:meth:`~agentbolt.trainer.loop.RLTrainer.state_dict`).
        job: the job's own state (per-step figures, evaluation results so far).
        metrics: the metrics first recorded with this checkpoint, as ``Metric`` JSON objects.
    """

    path: Path
    step: int
    model: str
    base_model_dir: str
    model_version: str
    val_accuracy: dict[str, float] | None
    created_at: float
    loop: dict[str, Any]
    job: dict[str, Any]
    metrics: list[dict[str, Any]]

    @property
    def val_score(self) -> float | None:
        """Mean validation accuracy over the sets, or ``None`` when it was not measured."""
        if not self.val_accuracy:
            return None
        return statistics.fmean(self.val_accuracy.values())


def checkpoints_dir(out_dir: Path) -> Path:
    """``out_dir/checkpoints``."""
    return Path(out_dir) / CHECKPOINTS_DIR


def read_checkpoint(path: Path | str) -> CheckpointInfo:
    """Read a checkpoint folder's ``checkpoint.json``.

    Raises:
        ConfigError: ``path`` is not a folder, has no ``checkpoint.json`` (not a checkpoint, or one cut short), or
            the file is unreadable or of a newer format.
    """
    folder = Path(path)
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        steps = (
            sorted(
                (p.name for p in folder.parent.glob("step-*") if (p / CHECKPOINT_FILE).is_file()),
                key=lambda name: (len(name), name),  # step-2 before step-10
            )
            if folder.parent.is_dir()
            else []
        )
        there = f"; the checkpoints in {folder.parent}: {', '.join(steps)}" if steps else ""
        raise ConfigError(f"{folder} {what}: give a checkpoint folder, OUT/checkpoints/step-N{there}")
    meta_file = folder / CHECKPOINT_FILE
    if not meta_file.is_file():
        raise ConfigError(
            f"{folder} has no {CHECKPOINT_FILE}: it is not a complete checkpoint (written by agentbolt train into "
            "OUT/checkpoints/step-N; a folder cut short by a crash has none)"
        )
    try:
        data = json.loads(meta_file.read_text())
        if int(data.get("format", 0)) > FORMAT_VERSION:
            raise ConfigError(
                f"{meta_file} has format {data['format']}, newer than this agentbolt reads ({FORMAT_VERSION}); "
                "upgrade agentbolt"
            )
        return CheckpointInfo(
            path=folder.resolve(),
            step=int(data["step"]),
            model=str(data["model"]),
            base_model_dir=str(data["base_model_dir"]),
            model_version=str(data["model_version"]),
            val_accuracy=data.get("val_accuracy"),
            created_at=float(data["created_at"]),
            loop=dict(data["loop"]),
            job=dict(data.get("job", {})),
            metrics=list(data.get("metrics", [])),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{meta_file} is not a valid checkpoint file ({exc!r})") from None


def list_checkpoints(out_dir: Path) -> list[CheckpointInfo]:
    """The complete checkpoints of a run, oldest step first; folders cut short are skipped."""
    root = checkpoints_dir(out_dir)
    if not root.is_dir():
        return []
    found: list[CheckpointInfo] = []
    for folder in root.iterdir():
        if not folder.name.startswith(_STEP_PREFIX) or not (folder / CHECKPOINT_FILE).is_file():
            continue
        with contextlib.suppress(ConfigError):
            found.append(read_checkpoint(folder))
    return sorted(found, key=lambda info: info.step)


def latest_checkpoint(out_dir: Path) -> CheckpointInfo | None:
    """The complete checkpoint with the highest step, or ``None``."""
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def remove_partial(out_dir: Path) -> list[Path]:
    """Delete the checkpoint folders a killed run left unfinished (``.tmp-*``, or ``step-N`` without
    ``checkpoint.json``); return them."""
    root = checkpoints_dir(out_dir)
    if not root.is_dir():
        return []
    removed = []
    for folder in root.iterdir():
        partial = folder.name.startswith(_TMP_PREFIX) or (
            folder.name.startswith(_STEP_PREFIX) and not (folder / CHECKPOINT_FILE).is_file()
        )
        if partial and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def make_readable(folder: Path) -> None:
    """Give every file in ``folder`` the mode a new file gets (``0o666`` less the umask, read off the folder's own
    mode, which ``mkdir`` set from it): transformers and safetensors write the weights 0600."""
    mode = stat.S_IMODE(folder.stat().st_mode) & 0o666
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(mode)


def _fsync_tree(folder: Path) -> None:
    """Flush every file of ``folder`` and the folder itself to disk."""
    for item in folder.iterdir():
        if item.is_file():
            with open(item, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}-{os.getpid()}")
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_checkpoint(
    out_dir: Path,
    step: int,
    *,
    save_files: Callable[[Path], None],
    meta: dict[str, Any],
    config_yaml: str,
) -> Path:
    """Write ``out_dir/checkpoints/step-{step}`` atomically and return it.

    Args:
        save_files: writes the weights and trainer state into the folder it is given (e.g.
            ``TorchPolicyTrainer.save_state``).
        meta: the fields of ``checkpoint.json`` other than ``format``, ``step`` and ``created_at``.
        config_yaml: the job's resolved settings, written as ``config.yaml``.

    Raises:
        ConfigError: ``step-{step}`` exists already (a checkpoint is never overwritten; see :func:`update_checkpoint`).
    """
    root = checkpoints_dir(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_STEP_PREFIX}{step}"
    if final.exists():
        raise ConfigError(f"checkpoint {final} exists already; a checkpoint is never overwritten")
    tmp = root / f"{_TMP_PREFIX}{_STEP_PREFIX}{step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        save_files(tmp)
        (tmp / CONFIG_FILE).write_text(config_yaml)
        data = {"format": FORMAT_VERSION, "step": step, "created_at": time.time(), **meta}
        (tmp / CHECKPOINT_FILE).write_text(json.dumps(data, indent=2))
        make_readable(tmp)
        _fsync_tree(tmp)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final.resolve()


def update_checkpoint(path: Path, **fields: Any) -> CheckpointInfo:
    """Replace fields of a checkpoint's ``checkpoint.json`` atomically (e.g. its ``val_accuracy`` once measured);
    the weights are never touched. Returns the new info.

    Raises:
        ConfigError: ``path`` is not a complete checkpoint.
    """
    read_checkpoint(path)  # a complete checkpoint, or ConfigError
    meta_file = Path(path) / CHECKPOINT_FILE
    data = json.loads(meta_file.read_text())
    data.update(fields)
    _write_json_atomic(meta_file, data)
    return read_checkpoint(path)


def prune_checkpoints(out_dir: Path, *, keep_last: int, keep_best: bool) -> list[Path]:
    """Delete complete checkpoints other than the newest ``keep_last`` and, with ``keep_best``, the one with the
    best :attr:`CheckpointInfo.val_score` (the newest among equals); return the deleted folders."""
    found = list_checkpoints(out_dir)
    keep = {info.path for info in found[-keep_last:]}
    best = best_checkpoint(found) if keep_best else None
    if best is not None:
        keep.add(best.path)
    removed = []
    for info in found:
        if info.path not in keep:
            shutil.rmtree(info.path, ignore_errors=True)
            removed.append(info.path)
    return removed


def best_checkpoint(found: list[CheckpointInfo]) -> CheckpointInfo | None:
    """The checkpoint with the highest validation score (the newest among equals); ``None`` when none was
    evaluated."""
    scored = [info for info in found if info.val_score is not None]
    if not scored:
        return None
    return max(scored, key=lambda info: (info.val_score, info.step))


async def cancel_unfinished(store: LightningStore) -> list[str]:
    """Cancel every rollout that is not terminal (queuing, preparing, running, requeuing): a killed run's rollouts
    that no step will ever read. Returns their ids."""
    open_states = [RolloutStatus.QUEUING, RolloutStatus.PREPARING, RolloutStatus.RUNNING, RolloutStatus.REQUEUING]
    cancelled = []
    for rollout in await store.query_rollouts(status=open_states):
        with contextlib.suppress(InvalidTransitionError):  # it ended meanwhile
            await store.cancel_rollout(rollout.rollout_id)
            cancelled.append(rollout.rollout_id)
    return cancelled


async def restore_missing_metrics(store: LightningStore, info: CheckpointInfo) -> int:
    """Write the metrics recorded with ``info`` that the store lacks (a run killed after writing the checkpoint and
    before writing its metrics); return how many were written. A metric is present when the store has a point
    with the same name and ``train_step``."""
    if not info.metrics:
        return 0
    present = {(m.name, m.train_step) for m in await store.query_metrics()}
    missing = [Metric.model_validate(m) for m in info.metrics]
    missing = [m for m in missing if (m.name, m.train_step) not in present]
    if missing:
        await store.add_metrics(missing)
    return len(missing)


class RunCheckpointer:
    """Writes a run's checkpoints after its steps (:meth:`after_step` is the trainer's ``after_step`` hook).

    Args:
        out_dir: the run's output folder.
        settings: when to write and what to keep.
        trainer: the RL loop (its metric buffer is switched on here).
        save_files: writes the weights and trainer state into a folder (``TorchPolicyTrainer.save_state``).
        model: the model as the config gave it; base_model_dir: the trained bf16 directory.
        config_yaml: the job's resolved settings.
        last_step: the run's last step (always checkpointed).
        job_state: returns the job's own state to keep (per-step figures...), called at each checkpoint.
        evaluate: when given, awaited with the step before a checkpoint whose step is a multiple of ``eval_every``
            (not the last: the job's final evaluation covers it); returns validation accuracy per set.
        eval_every: steps between evaluations (``None``: none during training).
    """

    def __init__(
        self,
        out_dir: Path,
        settings: CheckpointConfig,
        *,
        trainer: RLTrainer,
        save_files: Callable[[Path], None],
        model: str,
        base_model_dir: Path,
        config_yaml: str,
        last_step: int,
        job_state: Callable[[], dict[str, Any]],
        evaluate: Callable[[int], Any] | None = None,
        eval_every: int | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.settings = settings
        self.trainer = trainer
        self.save_files = save_files
        self.model = model
        self.base_model_dir = str(Path(base_model_dir).resolve())
        self.config_yaml = config_yaml
        self.last_step = last_step
        self.job_state = job_state
        self.evaluate = evaluate
        self.eval_every = eval_every
        self.written: list[Path] = []
        """The checkpoints written by this run, in order."""
        trainer.metric_buffer = []

    async def after_step(self, result: Any) -> None:
        """Evaluate (every ``eval_every`` steps) and write a checkpoint when the step is due."""
        step = int(result.train_step)
        val_accuracy = None
        if self.evaluate is not None and self.eval_every and step % self.eval_every == 0 and step != self.last_step:
            val_accuracy = await self.evaluate(step)
        if step % self.settings.every == 0 or step == self.last_step or val_accuracy is not None:
            await self.save(step, val_accuracy=val_accuracy)

    async def save(self, step: int, *, val_accuracy: dict[str, float] | None = None) -> Path:
        """Write the checkpoint of ``step`` (the weights now served are version ``step-{step}``), publish it as a
        resources version, then record the metrics kept back since the last one; prune old checkpoints."""
        import asyncio

        trainer = self.trainer
        version = trainer.backend.model_version
        pending = [m.model_dump(mode="json") for m in trainer.metric_buffer or []]
        meta = {
            "model": self.model,
            "base_model_dir": self.base_model_dir,
            "model_version": version,
            "val_accuracy": val_accuracy,
            "loop": trainer.state_dict(step),
            "job": self.job_state(),
            "metrics": pending,
        }
        # on the update thread: the save reads the policy's tensors, and their memory stays in one malloc arena
        path = await trainer.on_update_thread(
            functools.partial(
                write_checkpoint,
                self.out_dir,
                step,
                save_files=self.save_files,
                meta=meta,
                config_yaml=self.config_yaml,
            )
        )
        trainer.checkpoint_paths[version] = str(path)
        await publish_checkpoint(trainer, path, step=step, version=version)
        await trainer.flush_metrics()
        self.written.append(path)
        await asyncio.to_thread(
            prune_checkpoints, self.out_dir, keep_last=self.settings.keep_last, keep_best=self.settings.keep_best
        )
        return path

    async def finish(self, path: Path, *, val_accuracy: dict[str, float] | None) -> None:
        """Record the final evaluation in the last checkpoint, then write the metrics kept back (the "after"
        accuracy) and prune again (the best may have changed)."""
        import asyncio

        fields: dict[str, Any] = {"job": self.job_state()}
        if val_accuracy is not None:
            fields["val_accuracy"] = val_accuracy
        fields["metrics"] = read_checkpoint(path).metrics + [
            m.model_dump(mode="json") for m in self.trainer.metric_buffer or []
        ]
        await asyncio.to_thread(update_checkpoint, path, **fields)
        await self.trainer.flush_metrics()
        await asyncio.to_thread(
            prune_checkpoints, self.out_dir, keep_last=self.settings.keep_last, keep_best=self.settings.keep_best
        )


async def publish_checkpoint(trainer: RLTrainer, path: Path, *, step: int, version: str) -> str:
    """Write the resources version of a checkpoint (an ``llm`` at the gateway; metadata ``purpose: checkpoint``,
    ``train_step``, ``model_version`` and ``checkpoint``, the folder's absolute path); return its id."""
    update = await trainer.store.add_resources(
        {"llm": trainer.llm_resource(trainer.config.temperature)},
        metadata={"purpose": "checkpoint", "train_step": step, "model_version": version, "checkpoint": str(path)},
    )
    return update.resources_id


async def ensure_checkpoint_published(trainer: RLTrainer, info: CheckpointInfo) -> None:
    """Publish ``info`` as a resources version unless the store has one for it (a run killed in between)."""
    for update in await trainer.store.query_resources():
        if update.metadata.get("checkpoint") == str(info.path):
            return
    await publish_checkpoint(trainer, info.path, step=info.step, version=info.model_version)
