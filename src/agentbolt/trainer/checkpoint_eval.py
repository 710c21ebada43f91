"""``agentbolt eval CONFIG --checkpoint OUT/checkpoints/step-N``: score a trained policy on an RL config's tasks.

The job (:func:`run_checkpoint_eval`), in a fresh process that shares nothing with the training run but the files:

1. reads the checkpoint (:func:`~agentbolt.trainer.checkpoint.read_checkpoint`) and checks it was trained from the
   config's model;
2. starts :func:`~agentbolt.trainer.local.local_serving` over a new SQLite store in the output folder (default
   ``OUT/eval-step-N-SPLIT``) with the checkpoint's LoRA adapter merged into the served weights exactly as the
   training gateway served them (:func:`~agentbolt.algorithms.rl.weight_sync.apply_adapter`), and runner processes
   executing the config's agent;
3. runs every task of the split once with the train job's evaluation settings (``grpo.eval_temperature``, greedy by
   default, and ``grpo.max_tokens``) through :meth:`~agentbolt.trainer.loop.RLTrainer.evaluate`, the same code that
   made the train job's "before"/"after" table;
4. prints that table and writes ``eval.json``.

Splits: ``val`` is every set of ``load_val_sets(val_size)`` (what the train job evaluates); ``test`` is
``load_test_tasks()`` when the tasks module has it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from agentbolt.errors import ConfigError
from agentbolt.trainer.progress_bars import JobProgress

if TYPE_CHECKING:
    from agentbolt.trainer.checkpoint import CheckpointInfo
    from agentbolt.trainer.job_config import TrainConfig

EVAL_FILE = "eval.json"
"""What :func:`run_checkpoint_eval` writes into its output folder."""


def checkpoint_split_sets(config: TrainConfig, split: str) -> dict[str, list[dict[str, Any]]]:
    """The task sets of ``split`` for an RL config: ``val``, the ``val_tasks`` file when the config names one, else
    ``load_val_sets(val_size)``; ``test``, ``{"test": load_test_tasks()}``.

    Raises:
        ConfigError: an unknown split, ``val_size`` 0, a tasks module without ``load_test_tasks``, or no task.
    """
    from agentbolt.trainer.job_config import check_tasks, load_tasks_module, load_test_tasks, read_tasks_file

    module = load_tasks_module(config.tasks)
    if split == "val":
        if config.val_size == 0:
            raise ConfigError("val_size is 0, so the config has no validation tasks; pass --set val_size=8")
        if config.val_tasks is not None:  # a JSON Lines file of validation tasks, as the train job reads it
            path = Path(config.val_tasks)
            sets = {path.stem: read_tasks_file(path)[: config.val_size]}
        else:
            found = module.load_val_sets(n_per_set=config.val_size)
            sets = {str(name): check_tasks(tasks, f"{config.tasks} set {name!r}") for name, tasks in found.items()}
    elif split == "test":
        sets = {"test": load_test_tasks(module, config.tasks, "use --split val")}
    else:
        raise ConfigError(f"split must be val or test, got {split!r}")
    if not any(sets.values()):
        hint = (
            "; give the validation tasks with val_tasks: FILE.jsonl"
            if split == "val" and config.val_tasks is None
            else ""
        )
        raise ConfigError(f"the {split} split of {config.tasks!r} has no task{hint}")
    return sets


async def run_checkpoint_eval(
    config: TrainConfig,
    *,
    checkpoint: Path,
    split: str = "val",
    out_dir: Path | None = None,
    overwrite: bool = False,
    console: Console | None = None,
) -> dict[str, Any]:
    """Evaluate the policy of ``checkpoint`` on ``split`` (see the module docstring); return what ``eval.json``
    holds: ``accuracy`` (set -> fraction in [0, 1]), ``n_tasks`` per set, the checkpoint's path, step and weights
    version, the split, the model, the evaluation settings and ``wall_seconds``.

    Raises:
        ConfigError: not a complete checkpoint, another model than the config's, a bad split, or an output folder
            whose store exists without ``overwrite``; all before the model loads.
    """
    from agentbolt.algorithms.rl.adapter_files import check_adapter_files
    from agentbolt.runner.processes import load_agent
    from agentbolt.trainer.checkpoint import read_checkpoint
    from agentbolt.trainer.out_lock import hold_out_dir

    console = console or Console()
    info = read_checkpoint(checkpoint)
    if info.model != config.model:
        raise ConfigError(
            f"{info.path} was trained from model {info.model!r}, but the config serves {config.model!r}; pass "
            f"--set model={info.model}"
        )
    check_adapter_files(info.path)  # a damaged adapter fails here, before a folder is made or the model loads
    sets = checkpoint_split_sets(config, split)
    load_agent(config.agent)
    out = out_dir if out_dir is not None else info.path.parent.parent / f"eval-{info.path.name}-{split}"
    with hold_out_dir(out, command=f"agentbolt eval --checkpoint {info.path}"):
        return await _evaluate(config, info, sets, out, split=split, overwrite=overwrite, console=console)


async def _evaluate(
    config: TrainConfig,
    info: CheckpointInfo,
    sets: dict[str, list[dict[str, Any]]],
    out: Path,
    *,
    split: str,
    overwrite: bool,
    console: Console,
) -> dict[str, Any]:
    """:func:`run_checkpoint_eval` once the checkpoint is checked and ``out`` is this job's."""
    from agentbolt.algorithms.rl.weight_sync import apply_adapter
    from agentbolt.trainer.local import LocalMachine, fresh_db_path, load_engine, local_serving
    from agentbolt.trainer.loop import RLTrainer

    t_start = time.perf_counter()
    db_path = fresh_db_path(out, overwrite=overwrite, resumable=False)
    grpo = config.grpo

    n_tasks = sum(len(tasks) for tasks in sets.values())
    console.print(
        f"[bold]agentbolt eval[/]: {info.path} (step {info.step}, model {info.model}) on {split}: "
        f"{ {name: len(tasks) for name, tasks in sets.items()} } tasks, temperature {grpo.eval_temperature}, "
        f"max_tokens {grpo.max_tokens}"
    )
    machine = LocalMachine.of(config)
    if machine.engine != "embedded":  # the config's engine serves the checkpoint's adapter (loaded before serving)
        loaded, _ = await load_engine(machine, db_path.parent / "engine", console)
        try:
            await loaded.backend.load_adapter(info.path, info.model_version)
        except BaseException:
            await loaded.backend.close()
            raise
    else:
        loaded = machine.load_model(console)
        try:  # the adapter is merged before the server starts: the gateway serves only the trained weights
            t_merge = time.perf_counter()
            apply_adapter(loaded.backend.model, info.path)
            loaded.backend.set_model_version(info.model_version)
            loaded.setup_s += time.perf_counter() - t_merge
        except BaseException:
            await loaded.backend.close()
            raise
    async with local_serving(machine, db_path=db_path, console=console, loaded=loaded) as serving:
        evaluator = RLTrainer(
            serving.store, serving.backend, None, grpo, gateway_url=serving.url, agent_match=config.agent_match
        )
        evaluator.checkpoint_paths[info.model_version] = str(info.path)
        evaluator.last_train_step = info.step
        progress = JobProgress(console)
        with progress:
            task_id = progress.add_task(f"eval {info.path.name}: rollouts", total=n_tasks)
            accuracy = await evaluator.evaluate(
                sets,
                on_progress=lambda done, total: progress.update(task_id, completed=done, total=total),
                label=f"eval-{info.path.name}-{split}",
            )
    result = {
        "checkpoint": str(info.path),
        "step": info.step,
        "model_version": info.model_version,
        "model": info.model,
        "split": split,
        "accuracy": accuracy,
        "n_tasks": {name: len(tasks) for name, tasks in sets.items()},
        "eval_temperature": grpo.eval_temperature,
        "max_tokens": grpo.max_tokens,
        "store": str(db_path),
        "wall_seconds": time.perf_counter() - t_start,
    }
    (out / EVAL_FILE).write_text(json.dumps(result, indent=2))
    table = Table(title=f"{split} accuracy of {info.path.name}")
    table.add_column("set")
    table.add_column(info.path.name, justify="right")
    for name, value in accuracy.items():
        table.add_row(name, f"{value:.1%}")
    console.print(table)
    console.print(f"wrote {out / EVAL_FILE}; rollouts in {db_path}")
    return result
