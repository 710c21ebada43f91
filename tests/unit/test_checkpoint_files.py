"""Checkpoint folders on disk (``agentbolt.trainer.checkpoint``): atomic writes, what counts as complete, pruning,
the metrics a resumed run restores, and the task sampler's position across a resume."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from agentbolt.errors import ConfigError
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.trainer.checkpoint import (
    CHECKPOINT_FILE,
    best_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    read_checkpoint,
    remove_partial,
    restore_missing_metrics,
    update_checkpoint,
    write_checkpoint,
)
from agentbolt.types import Metric


def _write(out: Path, step: int, *, val: dict[str, float] | None = None, metrics: list[dict] | None = None) -> Path:
    def save(folder: Path) -> None:
        (folder / "adapter_model.safetensors").write_bytes(b"weights")

    meta = {
        "model": "smollm2-135m",
        "base_model_dir": "/models/smollm2",
        "model_version": f"step-{step}",
        "val_accuracy": val,
        "loop": {"train_step": step},
        "job": {"steps": []},
        "metrics": metrics or [],
    }
    return write_checkpoint(out, step, save_files=save, meta=meta, config_yaml="model: smollm2-135m\n")


def test_a_checkpoint_is_complete_only_with_its_file(tmp_path: Path) -> None:
    path = _write(tmp_path, 1)
    info = read_checkpoint(path)
    assert (info.step, info.model_version, info.val_score) == (1, "step-1", None)
    assert (path / "config.yaml").read_text() == "model: smollm2-135m\n"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-1"]  # no temporary folder left

    with pytest.raises(ConfigError, match="exists already"):
        _write(tmp_path, 1)

    def crash(folder: Path) -> None:
        (folder / "adapter_model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_checkpoint(tmp_path, 2, save_files=crash, meta={}, config_yaml="")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]

    # what a SIGKILL can leave: a temporary folder, a renamed folder without its file, a newer format
    (tmp_path / "checkpoints" / ".tmp-step-3-123").mkdir()
    (tmp_path / "checkpoints" / "step-4").mkdir()
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        read_checkpoint(tmp_path / "checkpoints" / "step-4")
    assert latest_checkpoint(tmp_path).step == 1  # type: ignore[union-attr]
    removed = remove_partial(tmp_path)
    assert sorted(p.name for p in removed) == [".tmp-step-3-123", "step-4"]
    future = _write(tmp_path, 5)
    data = json.loads((future / CHECKPOINT_FILE).read_text())
    (future / CHECKPOINT_FILE).write_text(json.dumps({**data, "format": 99}))
    with pytest.raises(ConfigError, match="upgrade agentbolt"):
        read_checkpoint(future)
    assert [info.step for info in list_checkpoints(tmp_path)] == [1]


def test_a_missing_checkpoint_is_named_with_the_ones_there(tmp_path: Path) -> None:
    """Found by a new-user pass: `eval --checkpoint OUT/checkpoints/step-9` said 'not a checkpoint folder'."""
    for step in (2, 10, 4):
        _write(tmp_path, step)
    with pytest.raises(ConfigError, match=r"step-9 does not exist: .*checkpoints: step-2, step-4, step-10$"):
        read_checkpoint(tmp_path / "checkpoints" / "step-9")
    with pytest.raises(ConfigError, match=r"nowhere does not exist: give a checkpoint folder, OUT/checkpoints/step-N$"):
        read_checkpoint(tmp_path / "nowhere")


def test_prune_keeps_the_last_and_the_best(tmp_path: Path) -> None:
    for step, val in [(1, None), (2, {"a": 0.9, "b": 0.5}), (3, {"a": 0.5, "b": 0.5}), (4, None), (5, None)]:
        _write(tmp_path, step, val=val)
    assert best_checkpoint(list_checkpoints(tmp_path)).step == 2  # type: ignore[union-attr]  # mean 0.7 > 0.5
    removed = prune_checkpoints(tmp_path, keep_last=2, keep_best=True)
    assert sorted(p.name for p in removed) == ["step-1", "step-3"]
    assert [info.step for info in list_checkpoints(tmp_path)] == [2, 4, 5]
    update_checkpoint(tmp_path / "checkpoints" / "step-5", val_accuracy={"a": 1.0, "b": 1.0})
    prune_checkpoints(tmp_path, keep_last=1, keep_best=True)
    assert [info.step for info in list_checkpoints(tmp_path)] == [5]
    prune_checkpoints(tmp_path, keep_last=1, keep_best=False)
    assert [info.step for info in list_checkpoints(tmp_path)] == [5]


def test_a_resumed_run_writes_only_the_metrics_the_store_lacks(tmp_path: Path) -> None:
    kept = [Metric(name=n, train_step=3, value=v, time=1.0).model_dump(mode="json") for n, v in [("r", 0.5), ("s", 1)]]
    info = read_checkpoint(_write(tmp_path, 3, metrics=kept))

    async def main() -> list[tuple[str, int, float]]:
        store = InMemoryLightningStore()
        await store.add_metrics([Metric(name="r", train_step=3, value=0.5, time=1.0)])  # written before the kill
        assert await restore_missing_metrics(store, info) == 1
        assert await restore_missing_metrics(store, info) == 0  # idempotent
        return [(m.name, m.train_step, m.value) for m in await store.query_metrics()]

    assert asyncio.run(main()) == [("r", 3, 0.5), ("s", 3, 1.0)]


def test_the_sampler_position_survives_a_resume() -> None:
    """``RLTrainer.state_dict`` keeps the sampler state before the next step, as JSON; a new trainer restored from it
    draws the same tasks as the original one would have."""
    from agentbolt.config import GRPOConfig
    from agentbolt.trainer.loop import RLTrainer

    class Backend:
        model_name = "m"
        model_version = "base"

        def paused(self) -> object:
            raise AssertionError("not used")

        def set_model_version(self, version: str) -> None:
            self.model_version = version

    tasks = [{"task_id": str(i)} for i in range(20)]
    config = GRPOConfig(tasks_per_step=3, seed=7)
    original = RLTrainer(InMemoryLightningStore(), Backend(), None, config, gateway_url="http://x")
    original.sample_tasks(tasks)  # step 1
    original.versions.append("step-1")
    state = json.loads(json.dumps(original.state_dict(1)))
    expected = [original.sample_tasks(tasks) for _ in range(2)]  # steps 2 and 3
    resumed = RLTrainer(InMemoryLightningStore(), Backend(), None, config, gateway_url="http://x")
    resumed.load_state_dict(state)
    assert [resumed.sample_tasks(tasks) for _ in range(2)] == expected
    assert resumed.versions == ["base", "step-1"] and resumed.backend.model_version == "step-1"
    assert resumed.last_train_step == 1
    assert random.Random(7).sample(tasks, 3) != expected[0]  # the state moved on from the seed


def test_export_removes_only_the_work_folders_of_dead_exports(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from agentbolt.trainer.export_model import _remove_dead_work_folders

    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)  # that process has exited
    out = tmp_path / "model"
    dead = tmp_path / f".tmp-model-{dead_pid}-abc"
    live = tmp_path / f".tmp-model-{os.getpid()}-def"  # an export running now (this process)
    other = tmp_path / f".tmp-other-{dead_pid}-ghi"  # another --out's
    for folder in (dead, live, other):
        (folder / "model").mkdir(parents=True)
    assert _remove_dead_work_folders(out) == [dead]
    assert not dead.exists() and live.is_dir() and other.is_dir()


def test_short_reason_keeps_the_first_line_and_counts_the_rest() -> None:
    from agentbolt.algorithms.rl.adapter_files import short_reason

    many = RuntimeError("Error(s) in loading state_dict:\n" + "\n".join(f"\tsize mismatch {i}" for i in range(400)))
    assert short_reason(many) == "Error(s) in loading state_dict: ... and 400 more lines"
    assert short_reason(ValueError("x" * 300)) == "x" * 197 + "..."
    assert short_reason(KeyError()) == "KeyError"
