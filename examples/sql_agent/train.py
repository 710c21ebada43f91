"""Train only the writer of the two-agent SQL system with GRPO, on this machine (CPU is enough).

Run from the repository root::

    python -m examples.sql_agent.train                     # qwen2.5-0.5b, 2 steps of 4 easy tasks x 4 rollouts
    python -m examples.sql_agent.train --model smollm2-135m --steps 1 --tasks-per-step 2 --group-size 2

It runs the one RL job of ``agentbolt train`` (:func:`agentbolt.trainer.job.run_training`: embedded model served and
trained with LoRA, SQLite store, server with the gateway, runner processes, checkpoints) with the agent
``examples.sql_agent.agents:sql_agents`` and ``agent_match="writer"``: the checker runs on the same model and its
calls are recorded, but only the writer's calls become training samples. Each step prints its mean reward (a point
of the reward curve) and the transitions kept and dropped per agent; ``<out>/summary.json`` holds them all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
AGENT_REFERENCE = "examples.sql_agent.agents:sql_agents"
BANDS = ("easy", "medium", "hard")


@dataclass(frozen=True)
class SqlTrainConfig:
    """Settings of one training run of the writer.

    Attributes:
        out_dir: where ``store.db`` and ``summary.json`` are written.
        model: embedded model name (``qwen2.5-0.5b``, ``smollm2-135m``) or a prepared model directory.
        steps / tasks_per_step / group_size: GRPO steps, distinct tasks per step, rollouts per task.
        max_tokens: generation limit of each call (writer and checker).
        temperature: sampling temperature of training rollouts.
        bands: the training tasks' bands (of the 45 training tasks, 15 per band).
        val_size: validation tasks per band evaluated (greedy) before and after training; 0 skips evaluation.
        agent_match: regular expression over agent names; only matching agents are trained.
        learning_rate: AdamW learning rate of the LoRA update.
        runner_processes / runner_concurrency: runner fan-out.
        checker_base_url / checker_model: put the checker on another OpenAI-compatible endpoint (both or neither).
        overwrite: replace an existing ``store.db`` in ``out_dir``.
        seed: draws the tasks of each step.
    """

    out_dir: Path = Path("runs/sql_agent")
    model: str = "qwen2.5-0.5b"
    steps: int = 2
    tasks_per_step: int = 4
    group_size: int = 4
    max_tokens: int = 128
    temperature: float = 1.0
    bands: tuple[str, ...] = ("easy",)
    val_size: int = 0
    agent_match: str = "writer"
    learning_rate: float = 2e-4
    runner_processes: int = 1
    runner_concurrency: int = 8
    checker_base_url: str | None = None
    checker_model: str | None = None
    overwrite: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.bands) - set(BANDS))
        if unknown or not self.bands:
            raise ValueError(f"bands must be a non-empty subset of {BANDS}, got {self.bands}")
        if (self.checker_base_url is None) != (self.checker_model is None):
            raise ValueError("give both checker_base_url and checker_model to put the checker elsewhere, or neither")
        if self.val_size < 0:
            raise ValueError(f"val_size must be >= 0, got {self.val_size}")


async def train_writer(config: SqlTrainConfig) -> dict[str, Any]:
    """Train the writer with GRPO (``agent_match``) and return the summary, also written to ``summary.json``.

    It is the one RL job of ``agentbolt train`` (:func:`agentbolt.trainer.job.run_training`) with this example's
    tasks (the chosen bands) plugged in through :class:`~agentbolt.trainer.job.JobSeams`, so it also writes
    checkpoints (``<out>/checkpoints/step-N``), resumable and servable like any train run.

    Returns:
        The train job's summary: ``train_reward`` (mean reward per step), ``step_rows`` (per step: reward,
        ``kept_by_agent``, ``dropped_by_agent``, ``n_unmatched``, ``n_failed``, ``rollout_s``, ``update_s``...),
        ``val_accuracy_before``/``_after`` ({band: accuracy}; empty when ``val_size`` is 0), ``n_rollouts``,
        ``wall_seconds``, ``config`` (the train job's resolved settings) and ``example_config`` (these).

    Raises:
        ConfigError: an unknown model name, an existing store without ``overwrite``, or a bad ``agent_match``.
    """
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))  # the runner processes import examples.* with this sys.path
    from examples.sql_agent.agents import CHECKER_KEY_ENV, CHECKER_MODEL_ENV, CHECKER_URL_ENV
    from examples.sql_agent.tasks import load_splits

    from agentbolt.config import GRPOConfig
    from agentbolt.trainer.job import JobSeams, run_training
    from agentbolt.trainer.job_config import TrainConfig

    if config.checker_base_url is not None and config.checker_model is not None:
        os.environ[CHECKER_URL_ENV] = config.checker_base_url  # read by the runner processes (spawned after this)
        os.environ[CHECKER_MODEL_ENV] = config.checker_model
        os.environ.setdefault(CHECKER_KEY_ENV, "agentbolt")
    train, val = load_splits()
    train_tasks = [t.model_dump(mode="json") for t in train if t.band in config.bands]
    val_sets = {
        band: [t.model_dump(mode="json") for t in val if t.band == band][: config.val_size]
        for band in config.bands
        if config.val_size > 0
    }
    job = TrainConfig(
        out_dir=config.out_dir,
        model=config.model,
        agent=AGENT_REFERENCE,
        agent_match=config.agent_match,
        tasks="examples.sql_agent.tasks",
        grpo=GRPOConfig(
            steps=config.steps,
            tasks_per_step=config.tasks_per_step,
            group_size=config.group_size,
            temperature=config.temperature,
            max_tokens=config.max_tokens,
            seed=config.seed,
        ),
        val_size=config.val_size,
        learning_rate=config.learning_rate,
        runner_processes=config.runner_processes,
        runner_concurrency=config.runner_concurrency,
        overwrite=config.overwrite,
    )
    print(
        f"training the writer ({config.agent_match!r}) of the SQL system: model={config.model} steps={config.steps} "
        f"tasks/step={config.tasks_per_step} group={config.group_size} bands={list(config.bands)}",
        flush=True,
    )

    def report_agents(result: Any) -> None:
        print(
            f"  step {result.train_step}: trained {result.kept_by_agent}  left out {result.dropped_by_agent}  "
            f"rollouts without a writer call {result.n_unmatched}",
            flush=True,
        )

    def add_example_config(summary: dict[str, Any]) -> None:
        summary["example_config"] = json.loads(json.dumps(asdict(config), default=str))

    return await run_training(
        job, seams=JobSeams(tasks=(train_tasks, val_sets), on_step=report_agents, summary=add_example_config)
    )


def parse_args(argv: Sequence[str] | None = None) -> SqlTrainConfig:
    """Parse the command line into a :class:`SqlTrainConfig` (``--help`` lists the options).

    Raises:
        SystemExit: bad options (argparse prints why).
    """
    defaults = SqlTrainConfig()
    parser = argparse.ArgumentParser(
        prog="python -m examples.sql_agent.train", description="Train only the writer of the two-agent SQL system."
    )
    parser.add_argument("--out", type=Path, default=defaults.out_dir, help="output folder (store.db, summary.json)")
    parser.add_argument("--model", default=defaults.model, help="qwen2.5-0.5b, smollm2-135m, or a model folder")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--tasks-per-step", type=int, default=defaults.tasks_per_step)
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    parser.add_argument("--temperature", type=float, default=defaults.temperature)
    parser.add_argument("--bands", nargs="+", choices=BANDS, default=list(defaults.bands))
    parser.add_argument("--val-size", type=int, default=defaults.val_size, help="val tasks per band (0: no eval)")
    parser.add_argument("--agent-match", default=defaults.agent_match, help="regex over agent names to train")
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--runner-processes", type=int, default=defaults.runner_processes)
    parser.add_argument("--runner-concurrency", type=int, default=defaults.runner_concurrency)
    parser.add_argument("--checker-base-url", default=None, help="OpenAI-compatible URL for the checker")
    parser.add_argument("--checker-model", default=None, help="the checker's model name at --checker-base-url")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing store.db in --out")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = parser.parse_args(argv)
    try:
        return SqlTrainConfig(
            out_dir=args.out,
            model=args.model,
            steps=args.steps,
            tasks_per_step=args.tasks_per_step,
            group_size=args.group_size,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            bands=tuple(args.bands),
            val_size=args.val_size,
            agent_match=args.agent_match,
            learning_rate=args.learning_rate,
            runner_processes=args.runner_processes,
            runner_concurrency=args.runner_concurrency,
            checker_base_url=args.checker_base_url,
            checker_model=args.checker_model,
            overwrite=args.overwrite,
            seed=args.seed,
        )
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse the options, train, return the exit status (2 on a configuration error)."""
    from pydantic import ValidationError

    from agentbolt.errors import ConfigError

    config = parse_args(argv)
    try:
        asyncio.run(train_writer(config))
    except (ConfigError, ValidationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
