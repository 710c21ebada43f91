"""``agentbolt demo``: train the calculator agent with GRPO on this machine, end to end.

Everything runs locally: a SQLite store file, the server (store API + gateway) on a free loopback port, the embedded
model (served and trained with LoRA in this process, sharing one set of weights), and runner processes that execute
the agent in ``examples/calc_agent`` against the gateway. Outputs: ``store.db``, ``reward_curve.png``, ``summary.json``.
"""

from __future__ import annotations

import json
import logging
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentbolt.config import GRPOConfig, _Config
from agentbolt.errors import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_AGENT = "examples.calc_agent.agent:calc_agent"


class DemoConfig(_Config):
    """Settings of ``agentbolt demo``.

    Attributes:
        out_dir: where ``store.db``, ``reward_curve.png`` and ``summary.json`` are written.
        model: embedded model name (``qwen2.5-0.5b`` or ``smollm2-135m``).
        grpo: the RL settings.
        train_size: training tasks generated (reasoning-gym, fixed seed).
        val_size: tasks per validation set (``None``: whole set).
        runner_processes / runner_concurrency: runner fan-out (processes x rollouts at once each).
        max_batch_size: gateway batch limit of the embedded backend.
        batch_wait_s: how long the backend waits for more requests before starting a batch (seconds).
        learning_rate: AdamW learning rate of the LoRA update.
        overwrite: replace an existing ``store.db`` in ``out_dir`` instead of refusing.
        agent: the agent as ``module:attribute``.
        agent_match: regular expression over agent names; only the matching agents' LLM calls are trained
            (``None``: all of them).
    """

    out_dir: Path = Path("runs/demo")
    model: str = "qwen2.5-0.5b"
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    train_size: int = 512
    val_size: int | None = 8
    learning_rate: float = Field(default=2e-4, gt=0)
    runner_processes: int = 2
    runner_concurrency: int = 8
    max_batch_size: int = 16
    batch_wait_s: float = Field(default=0.25, ge=0)
    overwrite: bool = False
    agent: str = DEFAULT_AGENT
    agent_match: str | None = None


def _peak_rss_mb() -> dict[str, float]:
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"trainer_and_server_mb": self_kb / 1024, "largest_child_mb": child_kb / 1024}


def _load_example() -> Any:
    """Import the calc example from the repository (``examples/`` next to the working directory)."""
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        from examples.calc_agent import tasks
    except ImportError as exc:
        raise ConfigError(
            "agentbolt demo runs the example agent in examples/calc_agent; run it from the root of a clone of the "
            f"agentbolt repository ({exc})"
        ) from exc
    return tasks


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
    ax1.set_title("GRPO train reward")
    ax1.grid(alpha=0.3)
    names = list(val_before)
    xs = range(len(names))
    width = 0.38
    ax2.bar([x - width / 2 for x in xs], [val_before[n] for n in names], width, label="before")
    ax2.bar([x + width / 2 for x in xs], [val_after.get(n, 0.0) for n in names], width, label="after")
    ax2.set_xticks(list(xs), names, rotation=15)
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("accuracy")
    ax2.set_title("validation accuracy")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run_demo(config: DemoConfig, console: Console | None = None) -> dict[str, Any]:
    """Run the whole loop and return the summary (also written to ``out_dir/summary.json``).

    Raises:
        ConfigError: an unknown model name, an existing store without ``overwrite``, the example not importable
            (not run from a clone of the repository), or a bad ``agent_match`` pattern.
    """
    console = console or Console()
    t_start = time.perf_counter()
    from agentbolt.adapter.agents import compile_agent_match
    from agentbolt.inference.model_files import get_model_spec
    from agentbolt.trainer.local import fresh_db_path, local_training

    if not Path(config.model).is_dir():
        get_model_spec(config.model)  # an unknown name fails here, before anything is written
    compile_agent_match(config.agent_match)
    db_path = fresh_db_path(config.out_dir, overwrite=config.overwrite)
    tasks_mod = _load_example()

    train_tasks = tasks_mod.load_train_tasks(size=config.train_size)
    val_sets = tasks_mod.load_val_sets(n_per_set=config.val_size)
    console.print(
        f"[bold]agentbolt demo[/]: model={config.model} steps={config.grpo.steps} "
        f"tasks/step={config.grpo.tasks_per_step} group={config.grpo.group_size} "
        f"val={ {k: len(v) for k, v in val_sets.items()} }"
    )
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    )

    def tracker(description: str, total: int) -> Callable[[int, int], None]:
        task_id = progress.add_task(description, total=total)

        def update(done: int, all_: int) -> None:
            progress.update(task_id, completed=done, total=all_)

        return update

    async with local_training(
        model=config.model,
        db_path=db_path,
        agent=config.agent,
        grpo=config.grpo,
        learning_rate=config.learning_rate,
        runner_processes=config.runner_processes,
        runner_concurrency=config.runner_concurrency,
        max_batch_size=config.max_batch_size,
        batch_wait_s=config.batch_wait_s,
        agent_match=config.agent_match,
        console=console,
    ) as local:
        trainer, store, backend = local.trainer, local.store, local.backend
        n_val = sum(len(v) for v in val_sets.values())
        with progress:
            t0 = time.perf_counter()
            val_before = await trainer.evaluate(val_sets, on_progress=tracker("eval before", n_val), label="before")
            eval_before_s = time.perf_counter() - t0
            steps = []
            for step in range(1, config.grpo.steps + 1):
                batch = trainer.sample_tasks(train_tasks)
                total = len(batch) * config.grpo.group_size
                result = await trainer.train_step(
                    step, batch, on_rollout_progress=tracker(f"step {step}: rollouts", total)
                )
                steps.append(result)
                progress.console.print(
                    f"step {step}: reward {result.reward_mean:.3f}±{result.reward_std:.3f}  "
                    f"rollouts {result.rollout_s:.0f}s  update {result.update_s:.0f}s  "
                    f"transitions {result.n_transitions}  failed {result.n_failed}  infra {result.n_infra_failed}"
                )
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
        summary: dict[str, Any] = {
            "steps": config.grpo.steps,
            "train_reward": train_reward,
            "val_accuracy_before": val_before,
            "val_accuracy_after": val_after,
            "n_rollouts": n_rollouts,
            "n_transitions": sum(s.n_transitions for s in steps),
            "wall_seconds": time.perf_counter() - t_start,
            "model": config.model,
            "timing_s": {
                "model_setup": local.model_setup_s,
                "eval_before": eval_before_s,
                "eval_after": eval_after_s,
                "per_step_rollouts": [s.rollout_s for s in steps],
                "per_step_update": [s.update_s for s in steps],
            },
            "update_stats": [s.update_stats for s in steps],
            "generation": counters,
            "peak_rss": _peak_rss_mb(),
            "config": json.loads(config.model_dump_json()),
        }

    (config.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_reward_curve(config.out_dir / "reward_curve.png", summary["train_reward"], val_before, val_after)
    _print_summary(console, summary)
    return summary


def _print_summary(console: Console, summary: dict[str, Any]) -> None:
    table = Table(title="validation accuracy")
    table.add_column("set")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    for name, before in summary["val_accuracy_before"].items():
        table.add_row(name, f"{before:.1%}", f"{summary['val_accuracy_after'].get(name, 0.0):.1%}")
    console.print(table)
    console.print(
        f"train reward per step: {[round(r, 3) for r in summary['train_reward']]}  "
        f"rollouts: {summary['n_rollouts']}  transitions: {summary['n_transitions']}  "
        f"wall: {summary['wall_seconds']:.0f}s"
    )
