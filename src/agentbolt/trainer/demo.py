"""``agentbolt train CONFIG.yaml`` and ``agentbolt demo``: train an agent with LightningRL on this machine, end to end.

Everything runs locally: a SQLite store file, the server (store API + gateway) on a free loopback port, the embedded
model (served from a plain copy, trained with LoRA in this process), and runner processes that execute the agent
against the gateway. ``agentbolt demo`` is the calculator agent of ``examples/calc_agent`` with default settings;
``agentbolt train`` reads the same settings from a YAML file (:class:`TrainConfig`, e.g.
``examples/calc_agent/config.yaml``). Outputs in ``out_dir``: ``store.db``, ``reward_curve.png``, ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import Field, ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentbolt.config import GRPOConfig, _Config
from agentbolt.errors import ConfigError

if TYPE_CHECKING:
    from agentbolt.trainer.loop import StepResult
    from agentbolt.trainer.prompt_opt import PromptOptConfig

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


def _peak_rss_mb() -> dict[str, float]:
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"trainer_and_server_mb": self_kb / 1024, "largest_child_mb": child_kb / 1024}


DemoConfig = TrainConfig
"""The settings of ``agentbolt demo`` are those of ``agentbolt train``."""


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


async def run_training(config: TrainConfig, console: Console | None = None) -> dict[str, Any]:
    """Run the whole job and return the summary (also written to ``out_dir/summary.json``).

    Raises:
        ConfigError: an unknown model name, bad torch trainer settings, an existing store without ``overwrite``, the
            tasks module not importable (the calc example outside a clone of the repository), or a bad
            ``agent_match`` pattern; all before anything is written.
    """
    console = console or Console()
    t_start = time.perf_counter()
    from agentbolt.adapter.agents import compile_agent_match
    from agentbolt.algorithms.rl.advantages import check_estimator_name
    from agentbolt.algorithms.rl.credit import build_credit_scheme
    from agentbolt.algorithms.rl.torch_backend import TorchTrainerConfig
    from agentbolt.inference.model_files import get_model_spec
    from agentbolt.runner.processes import load_agent
    from agentbolt.trainer.local import fresh_db_path, local_training

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
    db_path = fresh_db_path(config.out_dir, overwrite=config.overwrite)

    train_tasks = tasks_mod.load_train_tasks(size=config.train_size)
    evaluating = config.val_size != 0 and (config.eval_before or config.eval_after)
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

    async with local_training(
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
    ) as local:
        trainer, store, backend = local.trainer, local.store, local.backend
        n_val = sum(len(v) for v in val_sets.values())
        val_before: dict[str, float] = {}
        val_after: dict[str, float] = {}
        eval_before_s = eval_after_s = 0.0
        with progress:
            if val_sets and config.eval_before:
                t0 = time.perf_counter()
                val_before = await trainer.evaluate(val_sets, on_progress=tracker("eval before", n_val), label="before")
                eval_before_s = time.perf_counter() - t0
            t_train = time.perf_counter()
            steps = await trainer.train(
                train_tasks,
                on_step_start=lambda step, total: tracker(f"step {step}: rollouts", total),
                on_step_end=report,
            )
            train_s = time.perf_counter() - t_train
            if val_sets and config.eval_after:
                t1 = time.perf_counter()
                val_after = await trainer.evaluate(val_sets, on_progress=tracker("eval after", n_val), label="after")
                eval_after_s = time.perf_counter() - t1
        n_rollouts = len(await store.query_rollouts())
        train_reward = [s.reward_mean for s in steps]
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
        summary: dict[str, Any] = {
            "steps": grpo.steps,
            "advantage_estimator": grpo.advantage_estimator,
            "credit_assignment": grpo.credit_assignment,
            "async_rollouts": grpo.async_rollouts,
            "train_reward": train_reward,
            "train_reward_std": [s.reward_std for s in steps],
            "val_accuracy_before": val_before,
            "val_accuracy_after": val_after,
            "n_rollouts": n_rollouts,
            "n_transitions": sum(s.n_transitions for s in steps),
            "wall_seconds": time.perf_counter() - t_start,
            "model": config.model,
            "timing_s": {
                "model_setup": local.model_setup_s,
                "eval_before": eval_before_s,
                "train": train_s,
                "eval_after": eval_after_s,
                "per_step_rollouts": [s.rollout_s for s in steps],
                "per_step_wait": [s.wait_s for s in steps],
                "per_step_update": [s.update_s for s in steps],
            },
            "staleness": [
                None
                if s.staleness is None
                else {
                    "by_staleness": s.staleness.by_staleness,
                    "dropped": s.staleness.n_dropped,
                    "reweighted": s.staleness.n_reweighted,
                }
                for s in steps
            ],
            "weight_swaps": None if gate is None else dataclasses.asdict(gate.stats),
            "update_stats": [s.update_stats for s in steps],
            "generation": counters,
            "peak_rss": _peak_rss_mb(),
            "config": json.loads(config.model_dump_json()),
        }

    (config.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_reward_curve(config.out_dir / "reward_curve.png", summary["train_reward"], val_before, val_after)
    _print_summary(console, summary)
    return summary


run_demo = run_training
"""``agentbolt demo`` runs the same job as ``agentbolt train``."""


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
