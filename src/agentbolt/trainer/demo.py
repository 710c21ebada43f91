"""``agentbolt train CONFIG.yaml`` and ``agentbolt demo``: train an agent with LightningRL on this machine, end to end.

Everything runs locally: a SQLite store file, the server (store API + gateway) on a free loopback port, the embedded
model (served from a plain copy, trained with LoRA in this process), and runner processes that execute the agent
against the gateway. ``agentbolt demo`` is the calculator agent of ``examples/calc_agent`` with default settings;
``agentbolt train`` reads the same settings from a YAML file (:class:`TrainConfig`, e.g.
``examples/calc_agent/config.yaml``). Outputs in ``out_dir``: ``store.db``, ``reward_curve.png``, ``summary.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import json
import logging
import math
import resource
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator, model_validator
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentbolt.config import GRPOConfig, _Config
from agentbolt.errors import ConfigError
from agentbolt.trainer.checkpoint import CheckpointConfig

if TYPE_CHECKING:
    from agentbolt.trainer.checkpoint import CheckpointInfo
    from agentbolt.trainer.loop import StepResult
    from agentbolt.trainer.prompt_opt import PromptOptConfig
    from agentbolt.types import Metric

logger = logging.getLogger(__name__)

DEFAULT_AGENT = "examples.calc_agent.agent:calc_agent"
DEFAULT_TASKS = "examples.calc_agent.tasks"


class TrainConfig(_Config):
    """Settings of ``agentbolt train`` (the YAML file) and ``agentbolt demo``.

    Attributes:
        algorithm: ``lightningrl`` (the only value here; ``apo`` / ``gepa`` files are read as
            :class:`~agentbolt.trainer.prompt_opt.PromptOptConfig` by :func:`load_job_config`).
        out_dir: where ``store.db``, ``reward_curve.png`` and ``summary.json`` are written.
        model: embedded model name (``qwen2.5-0.5b`` or ``smollm2-135m``) or a prepared bf16 model directory.
        grpo: the RL settings (:class:`~agentbolt.config.GRPOConfig`: estimator, credit assignment, asynchronous
            training...).
        tasks: the module that provides the tasks, as ``package.module``, imported from the current folder; it must
            define ``load_train_tasks(size) -> list[dict]`` and ``load_val_sets(n_per_set) -> dict[str, list[dict]]``.
        train_size: training tasks asked of ``load_train_tasks``.
        val_size: tasks per validation set (``None``: whole set; 0: no evaluation).
        eval_before / eval_after: evaluate on the validation sets before / after training.
        torch_trainer: more settings of the torch trainer backend
            (:class:`~agentbolt.algorithms.rl.torch_backend.TorchTrainerConfig` fields such as ``kl_coef``,
            ``tis_cap``, ``loss_aggregation``, ``micro_batch_tokens``); ``learning_rate`` is set above.
        runner_processes / runner_concurrency: runner fan-out (processes x rollouts at once each).
        max_batch_size: gateway batch limit of the embedded backend.
        batch_wait_s: how long the backend waits for more requests before starting a batch (seconds).
        learning_rate: AdamW learning rate of the LoRA update.
        overwrite: replace an existing ``store.db`` in ``out_dir`` instead of refusing.
        agent: the agent as ``module:attribute``.
        agent_match: regular expression over agent names; only the matching agents' LLM calls are trained
            (``None``: all of them).
        device: where the model is served and trained (``cpu``, ``cuda``, ``cuda:N``).
        checkpoint: when checkpoints ``out_dir/checkpoints/step-N`` are written and which are kept
            (:class:`~agentbolt.trainer.checkpoint.CheckpointConfig`).
        eval_every: also evaluate on the validation sets after every ``eval_every`` steps (``None``: only before and
            after training); each such checkpoint records its accuracy, and the best one is kept.
        resume: continue the run in ``out_dir`` from its newest complete checkpoint, on the same store
            (``agentbolt train --resume``).
        report_to: experiment trackers that also get every metric the job records (``tensorboard``, ``mlflow``,
            ``wandb``; W&B offline unless it has an API key), see :mod:`agentbolt.trainer.trackers`.
    """

    algorithm: Literal["lightningrl"] = "lightningrl"
    out_dir: Path = Path("runs/demo")
    model: str = "qwen2.5-0.5b"
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    tasks: str = DEFAULT_TASKS
    train_size: int = Field(default=512, ge=1)
    val_size: int | None = Field(default=8, ge=0)
    eval_before: bool = True
    eval_after: bool = True
    torch_trainer: dict[str, Any] = Field(default_factory=dict)
    learning_rate: float = Field(default=2e-4, gt=0)
    runner_processes: int = 2
    runner_concurrency: int = 8
    max_batch_size: int = 16
    batch_wait_s: float = Field(default=0.25, ge=0)
    overwrite: bool = False
    agent: str = DEFAULT_AGENT
    agent_match: str | None = None
    device: str = "cpu"
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    eval_every: int | None = Field(default=None, ge=1)
    resume: bool = False
    report_to: tuple[str, ...] = ()

    @field_validator("report_to", mode="before")
    @classmethod
    def _known_trackers(cls, value: Any) -> tuple[str, ...]:
        from agentbolt.trainer.trackers import validate_report_to

        return validate_report_to(value)

    @model_validator(mode="after")
    def _resume_or_overwrite(self) -> TrainConfig:
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite exclude each other: --resume continues OUT, --overwrite replaces it")
        return self


RUN_PURPOSE = "run"
"""``metadata["purpose"]`` of the resources version a train job writes when it starts (and again when it resumes):
no resources, the metadata ``config`` (the resolved settings), ``out_dir`` (absolute) and ``resumed_from_step``
(``None`` for a fresh run). The dashboard's Run page reads it."""


def _peak_rss_mb() -> dict[str, float]:
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"trainer_and_server_mb": self_kb / 1024, "largest_child_mb": child_kb / 1024}


def check_device(device: str) -> None:
    """Raises ConfigError unless ``device`` is ``cpu``, or ``cuda`` / ``cuda:N`` with CUDA available to torch."""
    if device == "cpu":
        return
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        raise ConfigError(
            f"device {device!r} is not available here (torch sees {torch.cuda.device_count()} CUDA devices); "
            "use device cpu, cuda or cuda:N"
        )


def load_tasks_module(name: str) -> Any:
    """Import the tasks module ``name`` (the current folder first on ``sys.path``) and check its two functions.

    Raises:
        ConfigError: it cannot be imported (e.g. the calc example outside a clone of the repository) or lacks
            ``load_train_tasks`` / ``load_val_sets``.
    """
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        hint = (
            "; the calc example lives in examples/calc_agent: run from the root of a clone of the agentbolt repository"
            if name.startswith("examples.")
            else ""
        )
        raise ConfigError(f"cannot import the tasks module {name!r} ({exc}){hint}") from exc
    for function in ("load_train_tasks", "load_val_sets"):
        if not callable(getattr(module, function, None)):
            raise ConfigError(f"tasks module {name!r} has no function {function}(); see TrainConfig.tasks")
    return module


def read_settings(path: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The mapping of settings in a YAML file, with ``key.sub=value`` overrides applied on top.

    Args:
        path: the YAML file (a mapping).
        overrides: ``dotted.key=value`` strings; each value is read as YAML (``3``, ``0.5``, ``true``, ``rloo``).

    Raises:
        ConfigError: the file is missing, unreadable (a directory) or not a YAML mapping, or an override has no ``=``,
            a value that is not valid YAML, or goes through a value that is not a section.
    """
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        reason = exc.strerror or exc
        raise ConfigError(f"cannot read config file {path}: {reason}; give the path of a YAML file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of settings (key: value), got {type(data).__name__}")
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like key=value, e.g. grpo.advantage_estimator=rloo")
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
            node = child
        try:
            node[parts[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or exc
            raise ConfigError(
                f"override {item!r}: the value is not valid YAML ({problem}); quote it, "
                f"e.g. --set '{key.strip()}=\"...\"'"
            ) from None
    return data


ConfigT = TypeVar("ConfigT", bound=_Config)


def validate_settings(model: type[ConfigT], data: dict[str, Any], path: Path) -> ConfigT:
    """``model.model_validate(data)``, with a validation error turned into one ConfigError naming each bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{path}: {problems}") from None


def load_train_config(path: Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a :class:`TrainConfig` from a YAML file, with ``key.sub=value`` overrides (see :func:`read_settings`).

    Raises:
        ConfigError: as :func:`read_settings`, or a value is invalid (the message names the field).
    """
    return validate_settings(TrainConfig, read_settings(path, overrides), path)


ALGORITHMS = ("lightningrl", "apo", "gepa")
"""The values of ``algorithm`` in a job file: RL (the default) or one of the two prompt optimizers."""


def load_job_config(path: Path, overrides: Sequence[str] = ()) -> TrainConfig | PromptOptConfig:
    """The job of ``agentbolt train``: a :class:`TrainConfig` (``algorithm: lightningrl`` or absent) or a
    :class:`~agentbolt.trainer.prompt_opt.PromptOptConfig` (``algorithm: apo`` or ``gepa``).

    Raises:
        ConfigError: as :func:`read_settings`, an unknown ``algorithm``, or an invalid value.
    """
    from agentbolt.trainer.prompt_opt import PromptOptConfig

    data = read_settings(path, overrides)
    algorithm = data.get("algorithm", "lightningrl")
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"{path}: algorithm {algorithm!r} is unknown; use one of {', '.join(ALGORITHMS)}")
    if algorithm in ("apo", "gepa"):
        return validate_settings(PromptOptConfig, data, path)
    return validate_settings(TrainConfig, data, path)


def plot_reward_curves(path: Path, runs: dict[str, list[float]], *, title: str = "train reward per step") -> None:
    """Write one figure with a train-reward curve per run (e.g. one run per advantage estimator).

    Args:
        path: the PNG to write.
        runs: ``label -> mean train reward of each step`` (step 1 first).
        title: the figure's title.

    Raises:
        ConfigError: ``runs`` is empty.
    """
    if not runs:
        raise ConfigError("no runs to plot; give at least one summary.json")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, rewards in runs.items():
        ax.plot(list(range(1, len(rewards) + 1)), rewards, marker="o", label=label)
    ax.set_xlabel("train step")
    ax.set_ylabel("mean train reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_reward_curve(
    path: Path, train_reward: list[float], val_before: dict[str, float], val_after: dict[str, float]
) -> None:
    """Write the demo's figure: train reward per step (left), validation accuracy before/after per set (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    steps = list(range(1, len(train_reward) + 1))
    ax1.plot(steps, train_reward, marker="o")
    ax1.set_xlabel("train step")
    ax1.set_ylabel("mean train reward (shaped)")
    ax1.set_title("train reward")
    ax1.grid(alpha=0.3)
    names = list(dict.fromkeys([*val_before, *val_after]))
    xs = range(len(names))
    width = 0.38
    ax2.bar([x - width / 2 for x in xs], [val_before.get(n, 0.0) for n in names], width, label="before")
    ax2.bar([x + width / 2 for x in xs], [val_after.get(n, 0.0) for n in names], width, label="after")
    ax2.set_xticks(list(xs), names, rotation=15)
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("accuracy")
    ax2.set_title("validation accuracy")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def step_row(result: StepResult) -> dict[str, Any]:
    """The figures of one step that the summary and a checkpoint keep (JSON-serializable)."""
    staleness = None
    if result.staleness is not None:
        staleness = {
            "by_staleness": result.staleness.by_staleness,
            "dropped": result.staleness.n_dropped,
            "reweighted": result.staleness.n_reweighted,
        }
    return {
        "train_step": result.train_step,
        "reward_mean": result.reward_mean,
        "reward_std": result.reward_std,
        "n_rollouts": result.n_rollouts,
        "n_failed": result.n_failed,
        "n_infra_failed": result.n_infra_failed,
        "n_transitions": result.n_transitions,
        "n_samples": result.n_samples,
        "rollout_s": result.rollout_s,
        "wait_s": result.wait_s,
        "update_s": result.update_s,
        "update_stats": {k: v for k, v in result.update_stats.items() if math.isfinite(v)},
        "staleness": staleness,
    }


def _check_resume(config: TrainConfig) -> tuple[Path, CheckpointInfo | None]:
    """The store to reuse and the checkpoint to resume from (``None``: the run died before its first checkpoint,
    so it restarts at step 1 on the same store); partial checkpoint folders are deleted.

    Raises:
        ConfigError: ``out_dir`` holds no store (nothing to resume), or the checkpoint was trained from another model.
    """
    from agentbolt.trainer.checkpoint import latest_checkpoint, remove_partial

    db_path = config.out_dir / "store.db"
    if not db_path.is_file():
        raise ConfigError(f"nothing to resume in {config.out_dir}: it has no store.db; run without --resume")
    remove_partial(config.out_dir)
    info = latest_checkpoint(config.out_dir)
    if info is not None and info.model != config.model:
        raise ConfigError(
            f"{info.path} was trained from model {info.model!r}, not {config.model!r}; resume with --set "
            f"model={info.model} or start a new run in another --out"
        )
    return db_path, info


async def run_training(config: TrainConfig, console: Console | None = None) -> dict[str, Any]:
    """Run the whole job and return the summary (also written to ``out_dir/summary.json``).

    Writes a checkpoint after every ``checkpoint.every`` steps and the last (:mod:`agentbolt.trainer.checkpoint`).
    With ``config.resume`` the job continues the run in ``out_dir`` from its newest complete checkpoint, on the same
    store: rollouts a killed run left unfinished are cancelled, the adapter, optimizer and loop state are loaded, and
    steps go on from the checkpoint's step + 1 (the summary and curves hold every step once).

    Raises:
        ConfigError: an unknown model name, bad torch trainer settings, an existing store without ``overwrite``, the
            tasks module not importable (the calc example outside a clone of the repository), a bad
            ``agent_match`` pattern, or (``resume``) nothing to resume; all before anything is written.
    """
    console = console or Console()
    t_start = time.perf_counter()
    from agentbolt.adapter.advantages import check_estimator_name
    from agentbolt.adapter.agents import compile_agent_match
    from agentbolt.adapter.credit import build_credit_scheme
    from agentbolt.algorithms.rl.torch_backend import TorchTrainerConfig
    from agentbolt.inference.model_files import get_model_spec
    from agentbolt.runner.processes import load_agent
    from agentbolt.trainer.checkpoint import (
        RunCheckpointer,
        cancel_unfinished,
        ensure_checkpoint_published,
        restore_missing_metrics,
    )
    from agentbolt.trainer.local import fresh_db_path, local_training, resolve_model
    from agentbolt.trainer.trackers import open_trackers

    if not Path(config.model).is_dir():
        get_model_spec(config.model)  # an unknown name fails here, before anything is written
    compile_agent_match(config.agent_match)
    build_credit_scheme(
        config.grpo.credit_assignment, gamma=config.grpo.credit_gamma, air_weights=config.grpo.air_weights
    )  # an unknown scheme fails here, naming the known ones
    check_estimator_name(config.grpo.advantage_estimator)  # likewise an unknown estimator
    try:
        trainer_config = TorchTrainerConfig(learning_rate=config.learning_rate, **config.torch_trainer)
    except (ValidationError, TypeError) as exc:
        raise ConfigError(f"torch_trainer: {exc}") from None
    if config.grpo.advantage_estimator == "gae" and not trainer_config.value_head:
        trainer_config = trainer_config.model_copy(update={"value_head": True})  # PPO: the value head is needed
    check_device(config.device)
    tasks_mod = load_tasks_module(config.tasks)
    load_agent(config.agent)  # an agent that does not import fails here, before --overwrite removes a store
    resume_info: CheckpointInfo | None = None
    if config.resume:
        db_path, resume_info = _check_resume(config)
    else:
        db_path = fresh_db_path(config.out_dir, overwrite=config.overwrite)

    train_tasks = tasks_mod.load_train_tasks(size=config.train_size)
    evaluating = config.val_size != 0 and (config.eval_before or config.eval_after or config.eval_every)
    val_sets: dict[str, list[dict[str, Any]]] = tasks_mod.load_val_sets(n_per_set=config.val_size) if evaluating else {}
    grpo = config.grpo
    console.print(
        f"[bold]agentbolt train[/]: model={config.model} steps={grpo.steps} tasks/step={grpo.tasks_per_step} "
        f"group={grpo.group_size} estimator={grpo.advantage_estimator} credit={grpo.credit_assignment} "
        f"async_rollouts={grpo.async_rollouts} val={ {k: len(v) for k, v in val_sets.items()} }"
    )
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    )

    def tracker(description: str, total: int) -> Callable[[int, int], None]:
        task_id = progress.add_task(description, total=total)

        def update(done: int, all_: int) -> None:
            progress.update(task_id, completed=done, total=all_)

        return update

    def report(result: StepResult) -> None:
        stale = ""
        if result.staleness is not None:
            stale = f"  staleness {result.staleness.mean_staleness:.2f} dropped {result.staleness.n_dropped}"
        progress.console.print(
            f"step {result.train_step}: reward {result.reward_mean:.3f}±{result.reward_std:.3f}  "
            f"waited {result.wait_s:.0f}s  update {result.update_s:.0f}s  transitions {result.n_transitions}  "
            f"failed {result.n_failed}  infra {result.n_infra_failed}{stale}"
        )

    # What the job keeps across a resume (also in every checkpoint's job state).
    job: dict[str, Any] = {"steps": [], "val_before": {}, "eval_before_done": False, "timing_s": {}}
    if resume_info is not None:
        job.update(json.loads(json.dumps(resume_info.job)))
        if resume_info.step < grpo.steps and "val_after" in job:
            # the run goes on past the step that was evaluated last: that result becomes a mid-run evaluation
            job.setdefault("val_during", {})[str(resume_info.step)] = job.pop("val_after")
    first_step = 1 if resume_info is None else resume_info.step + 1

    async with (
        contextlib.AsyncExitStack() as stack,
        local_training(
            model=config.model,
            db_path=db_path,
            agent=config.agent,
            grpo=grpo,
            learning_rate=config.learning_rate,
            trainer_config=trainer_config,
            runner_processes=config.runner_processes,
            runner_concurrency=config.runner_concurrency,
            max_batch_size=config.max_batch_size,
            batch_wait_s=config.batch_wait_s,
            agent_match=config.agent_match,
            console=console,
            device=config.device,
            resume_from=None if resume_info is None else resume_info.path,
        ) as local,
    ):
        trainer, store, backend = local.trainer, local.store, local.backend
        trackers = await asyncio.to_thread(
            open_trackers,
            config.report_to,
            out_dir=config.out_dir,
            run_name=config.out_dir.name if resume_info is None else f"{config.out_dir.name}-from-{resume_info.step}",
            config=json.loads(config.model_dump_json()),
        )
        stack.push(lambda exc_type, *_: trackers.close(failed=exc_type is not None))  # a failed run is marked so

        def to_trackers(metrics: Sequence[Metric]) -> None:
            by_step: dict[int, dict[str, float]] = {}
            for metric in metrics:
                by_step.setdefault(metric.train_step, {})[metric.name] = metric.value
            for step in sorted(by_step):
                trackers.log(by_step[step], step)

        trainer.metric_listeners.append(to_trackers)
        await store.add_resources(
            {},
            metadata={
                "purpose": RUN_PURPOSE,
                "config": json.loads(config.model_dump_json()),
                "out_dir": str(config.out_dir.resolve()),
                "resumed_from_step": None if resume_info is None else resume_info.step,
            },
        )
        if config.resume:
            cancelled = await cancel_unfinished(store)
            where = "from the start" if resume_info is None else f"from {resume_info.path} (step {resume_info.step})"
            console.print(f"resuming {where}; {len(cancelled)} unfinished rollouts of the stopped run cancelled")
        if resume_info is not None:
            trainer.load_state_dict(resume_info.loop)
            trainer.checkpoint_paths[resume_info.model_version] = str(resume_info.path)
            await restore_missing_metrics(store, resume_info)
            await ensure_checkpoint_published(trainer, resume_info)
        n_val = sum(len(v) for v in val_sets.values())

        async def evaluate_at(step: int) -> dict[str, float]:
            accuracy = await trainer.evaluate(
                val_sets, on_progress=tracker(f"eval step {step}", n_val), label=f"step-{step}"
            )
            job.setdefault("val_during", {})[str(step)] = accuracy
            return accuracy

        checkpointer = RunCheckpointer(
            config.out_dir,
            config.checkpoint,
            trainer=trainer,
            save_files=local.updater.save_state,
            model=config.model,
            base_model_dir=resolve_model(config.model),
            config_yaml=dump_config_yaml(config),
            last_step=grpo.steps,
            job_state=lambda: json.loads(json.dumps(job)),
            evaluate=evaluate_at if val_sets and config.eval_every else None,
            eval_every=config.eval_every,
        )

        def record(result: StepResult) -> None:
            report(result)
            job["steps"].append(step_row(result))

        timing = job["timing_s"]
        with progress:
            if val_sets and config.eval_before and not job["eval_before_done"]:
                t0 = time.perf_counter()
                job["val_before"] = await trainer.evaluate(
                    val_sets, on_progress=tracker("eval before", n_val), label="before"
                )
                job["eval_before_done"] = True
                timing["eval_before"] = time.perf_counter() - t0
            t_train = time.perf_counter()
            await trainer.train(
                train_tasks,
                first_step=first_step,
                on_step_start=lambda step, total: tracker(f"step {step}: rollouts", total),
                on_step_end=record,
                after_step=checkpointer.after_step,
            )
            timing["train"] = timing.get("train", 0.0) + time.perf_counter() - t_train
            last = checkpointer.written[-1] if checkpointer.written else None
            if last is None and resume_info is not None and resume_info.step >= grpo.steps:
                last = resume_info.path  # every step was done before the stop: only the evaluation is left
            if val_sets and config.eval_after and "val_after" not in job:
                t1 = time.perf_counter()
                job["val_after"] = await trainer.evaluate(
                    val_sets, on_progress=tracker("eval after", n_val), label="after"
                )
                timing["eval_after"] = time.perf_counter() - t1
            if last is not None:
                await checkpointer.finish(last, val_accuracy=job.get("val_after"))
            else:
                await trainer.flush_metrics()
        n_rollouts = len(await store.query_rollouts())
        gen = backend.stats
        counters = {
            "generated_tokens": gen.generated_tokens,
            "generation_s": gen.generation_s,
            "tokens_per_s": gen.tokens_per_s,
            "requests": gen.requests,
            "batches": gen.batches,
            "mean_batch_size": gen.mean_batch_size,
        }
        gate = trainer.swap_gate
        model_setup_s = local.model_setup_s

    summary = build_summary(config, job, n_rollouts=n_rollouts, generation=counters)
    summary["wall_seconds"] = time.perf_counter() - t_start
    summary["resumed_from_step"] = None if resume_info is None else resume_info.step
    summary["timing_s"]["model_setup"] = model_setup_s
    summary["weight_swaps"] = None if gate is None else dataclasses.asdict(gate.stats)
    summary["checkpoints"] = _checkpoint_rows(config.out_dir)
    (config.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_reward_curve(
        config.out_dir / "reward_curve.png",
        summary["train_reward"],
        summary["val_accuracy_before"],
        summary["val_accuracy_after"],
    )
    _print_summary(console, summary)
    _print_next_steps(console, config, summary)
    return summary


def dump_config_yaml(config: TrainConfig) -> str:
    """The resolved settings as YAML (every default filled in); ``agentbolt train`` reads it back."""
    import yaml

    data = json.loads(config.model_dump_json())
    data.pop("resume", None)
    data.pop("overwrite", None)
    return yaml.safe_dump(data, sort_keys=False)


def build_summary(
    config: TrainConfig, job: dict[str, Any], *, n_rollouts: int, generation: dict[str, Any]
) -> dict[str, Any]:
    """``summary.json`` from the job state (the steps of every run segment, in order)."""
    rows = job["steps"]
    timing = dict(job.get("timing_s", {}))
    timing["per_step_rollouts"] = [r["rollout_s"] for r in rows]
    timing["per_step_wait"] = [r["wait_s"] for r in rows]
    timing["per_step_update"] = [r["update_s"] for r in rows]
    grpo = config.grpo
    return {
        "steps": grpo.steps,
        "advantage_estimator": grpo.advantage_estimator,
        "credit_assignment": grpo.credit_assignment,
        "async_rollouts": grpo.async_rollouts,
        "train_reward": [r["reward_mean"] for r in rows],
        "train_reward_std": [r["reward_std"] for r in rows],
        "step_numbers": [r["train_step"] for r in rows],
        "val_accuracy_before": job.get("val_before", {}),
        "val_accuracy_after": job.get("val_after", {}),
        "val_accuracy_during": job.get("val_during", {}),
        "n_rollouts": n_rollouts,
        "n_transitions": sum(r["n_transitions"] for r in rows),
        "model": config.model,
        "timing_s": timing,
        "staleness": [r["staleness"] for r in rows],
        "update_stats": [r["update_stats"] for r in rows],
        "generation": generation,
        "peak_rss": _peak_rss_mb(),
        "config": json.loads(config.model_dump_json()),
    }


def _checkpoint_rows(out_dir: Path) -> list[dict[str, Any]]:
    from agentbolt.trainer.checkpoint import list_checkpoints

    return [
        {"step": info.step, "path": str(info.path), "val_accuracy": info.val_accuracy}
        for info in list_checkpoints(out_dir)
    ]


def _print_next_steps(console: Console, config: TrainConfig, summary: dict[str, Any]) -> None:
    """The files the job wrote and the commands that use them."""
    from agentbolt.trainer.checkpoint import best_checkpoint, list_checkpoints

    out = config.out_dir
    console.print(f"wrote {out / 'store.db'}, {out / 'summary.json'}, {out / 'reward_curve.png'}")
    found = list_checkpoints(out)
    if not found:
        return
    console.print("checkpoints: " + ", ".join(f"{info.path.name}" for info in found) + f" (in {out / 'checkpoints'})")
    chosen = best_checkpoint(found) or found[-1]
    model = shlex.quote(config.model)
    console.print("next:")
    console.print(f"  agentbolt serve --model {model} --adapter {shlex.quote(str(chosen.path))}   # serve it")
    console.print(f"  agentbolt export-model {shlex.quote(str(chosen.path))} --out {shlex.quote(str(out / 'model'))}")
    console.print(f"  agentbolt serve --store {shlex.quote(str(out / 'store.db'))}   # dashboard of this run")


def _print_summary(console: Console, summary: dict[str, Any]) -> None:
    table = Table(title="validation accuracy")
    table.add_column("set")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    before, after = summary["val_accuracy_before"], summary["val_accuracy_after"]
    for name in dict.fromkeys([*before, *after]):
        table.add_row(
            name,
            f"{before[name]:.1%}" if name in before else "-",
            f"{after[name]:.1%}" if name in after else "-",
        )
    if before or after:
        console.print(table)
    console.print(
        f"train reward per step: {[round(r, 3) for r in summary['train_reward']]}  "
        f"rollouts: {summary['n_rollouts']}  transitions: {summary['n_transitions']}  "
        f"wall: {summary['wall_seconds']:.0f}s"
    )
