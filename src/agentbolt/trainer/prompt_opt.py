"""``agentbolt train CONFIG.yaml`` with ``algorithm: apo`` or ``algorithm: gepa``: prompt optimization on this
machine, end to end, with no GPU.

The job (:func:`run_prompt_optimization`) starts what :func:`~agentbolt.trainer.local.local_serving` starts (the
embedded model, a SQLite store, the server, runner processes executing the agent), then:

1. publishes every candidate prompt as a resources version (``llm`` pointing at the gateway, plus one
   ``PromptTemplate`` per prompt name) and scores it through the store (:class:`~agentbolt.algorithms.apo.
   store_evaluator.StoreEvaluator`): each task is a rollout, its reward and trace are read back from its spans;
2. asks the optimizer LLM (by default the same embedded model, through the server's unrecorded
   ``/v1/chat/completions``) for critiques and edits (APO) or reflections (GEPA);
3. runs the seed and the best candidate on the held-out test tasks (``mode=test``) when the tasks module has
   ``load_test_tasks``.

Shown while it runs: a bar of rounds (APO) or iterations (GEPA), a bar of rollouts, one line per round. Written to
``out_dir``: ``store.db``, ``summary.json`` (scores, usage, timings, every candidate), ``best_prompts.json`` and one
``best_prompt.<name>.txt`` per prompt, and ``prompt.diff`` (unified diff from the seed).
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import json
import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field
from rich.console import Console
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table

from agentbolt.algorithms.apo.config import APOConfig, GEPAConfig
from agentbolt.algorithms.apo.optimizer_llm import OptimizerLLMConfig
from agentbolt.config import _Config
from agentbolt.errors import ConfigError
from agentbolt.trainer.progress_bars import JobProgress
from agentbolt.types import DEFAULT_UNRESPONSIVE_S, LLM

if TYPE_CHECKING:
    from agentbolt.algorithms.apo.templates import TemplateSet
    from agentbolt.trainer.local import LocalServing

DEFAULT_PROMPT_AGENT = "examples.room_agent.agent:room_agent"
DEFAULT_PROMPT_TASKS = "examples.room_agent.tasks"
DEFAULT_SEED_PROMPTS = "examples.room_agent.agent:BASELINE_PROMPT"
EMBEDDED_OPTIMIZER_TIMEOUT_S = 3600.0
"""Request timeout (seconds) at least, when the job's embedded model is the optimizer."""


class PromptOptConfig(_Config):
    """Settings of ``agentbolt train`` for prompt optimization (the YAML file, e.g.
    ``examples/room_agent/config.yaml``).

    Attributes:
        algorithm: ``apo`` (textual-gradient beam search) or ``gepa`` (reflective Pareto search).
        out_dir: where the store, the summary and the best prompt are written.
        model: the agent's embedded model (``qwen2.5-0.5b``, ``smollm2-135m``...) or a prepared bf16 directory.
        agent: the agent as ``module:attribute``; it must read its prompts from resources named as in
            ``seed_prompts``.
        tasks: module with ``load_train_tasks(size)``, ``load_val_sets(n_per_set)`` (the first set is the
            validation set) and optionally ``load_test_tasks()``; every task needs a string ``task_id``.
        seed_prompts: prompt name -> starting text; when empty, read from ``seed_prompts_from``.
        seed_prompts_from: ``module:ATTRIBUTE`` holding the starting text (a string, named ``prompt_name``) or a
            mapping of name -> text.
        prompt_name: the resource name of a single seed prompt given as a string.
        apo / gepa: the optimizer's settings (only the one named by ``algorithm`` is used).
        optimizer: the optimizer LLM; ``base_url: null`` (the default) means an embedded model of this job (the
            agent's, or ``optimizer_model``), and ``model: null`` its name. Its call cache lives in
            ``optimizer.cache_dir``.
        optimizer_model: an embedded model (name or prepared bf16 directory) loaded in this job only to serve as the
            optimizer, e.g. ``qwen2.5-coder-1.5b`` (extra ``models-1-5b``); ``None``: the agent's model. Not used
            (nor loaded) when ``optimizer.base_url`` is set.
        train_size / val_size: tasks asked of the tasks module (``None``: all).
        eval_test: score the seed and the best candidate on ``load_test_tasks()`` at the end.
        agent_temperature / agent_max_tokens: sampling of the agent's LLM calls (the ``llm`` resource).
        reward_name: which reward is the score (``None``: the final, unnamed one). When no rollout of the job
            recorded a reward of that name, the job warns and ``summary.json`` says ``reward_name_missing: true``.
        success_threshold: ``agentbolt eval`` counts a rollout correct when its score is at least this (unit:
            reward; default 1.0), as ``grpo.success_threshold`` does for an RL job.
        max_attempts / rollout_timeout_s / rollout_unresponsive_s: per rollout (as in ``GRPOConfig``);
            infrastructure failures are retried by the store.
        runner_processes / runner_concurrency / max_batch_size / batch_wait_s / device: as in ``TrainConfig``.
        overwrite: replace an existing ``store.db`` in ``out_dir``.
    """

    algorithm: Literal["apo", "gepa"]
    out_dir: Path = Path("runs/prompt-opt")
    model: str = "qwen2.5-0.5b"
    agent: str = DEFAULT_PROMPT_AGENT
    tasks: str = DEFAULT_PROMPT_TASKS
    seed_prompts: dict[str, str] = Field(default_factory=dict)
    seed_prompts_from: str | None = DEFAULT_SEED_PROMPTS
    prompt_name: str = "prompt_template"
    apo: APOConfig = Field(default_factory=APOConfig)
    gepa: GEPAConfig = Field(default_factory=GEPAConfig)
    optimizer: OptimizerLLMConfig = Field(default_factory=OptimizerLLMConfig)
    optimizer_model: str | None = None
    train_size: int | None = Field(default=None, ge=1)
    val_size: int | None = Field(default=None, ge=1)
    eval_test: bool = True
    agent_temperature: float = Field(default=0.0, ge=0.0)
    agent_max_tokens: int = Field(default=256, gt=0)
    reward_name: str | None = None
    success_threshold: float = Field(default=1.0, allow_inf_nan=False)
    max_attempts: int = Field(default=2, ge=1)
    rollout_timeout_s: float = Field(default=600.0, gt=0)
    rollout_unresponsive_s: float = Field(default=DEFAULT_UNRESPONSIVE_S, gt=0)
    runner_processes: int = Field(default=2, ge=1)
    runner_concurrency: int = Field(default=8, ge=1)
    max_batch_size: int = Field(default=16, ge=1)
    batch_wait_s: float = Field(default=0.25, ge=0)
    overwrite: bool = False
    device: str = "cpu"


def resolve_seed_prompts(config: PromptOptConfig) -> dict[str, str]:
    """The seed prompts: ``config.seed_prompts``, else the object named by ``seed_prompts_from``.

    Raises:
        ConfigError: neither is set, the reference does not import, or it is not a string or a mapping of strings.
    """
    if config.seed_prompts:
        return dict(config.seed_prompts)
    reference = config.seed_prompts_from
    if not reference:
        raise ConfigError("set seed_prompts (name: text) or seed_prompts_from (module:ATTRIBUTE)")
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"seed_prompts_from must look like package.module:ATTRIBUTE, got {reference!r}")
    try:
        value = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load seed_prompts_from {reference!r}: {exc}") from exc
    if isinstance(value, str):
        return {config.prompt_name: value}
    if isinstance(value, Mapping) and value and all(isinstance(v, str) for v in value.values()):
        return {str(k): str(v) for k, v in value.items()}
    raise ConfigError(f"seed_prompts_from {reference!r} must be a string or a mapping of name -> text")


def check_job_inputs(
    config: PromptOptConfig,
) -> tuple[dict[str, str], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Check the model name and device, and load the seed prompts and the train / validation / test tasks (test
    empty unless ``eval_test`` and the tasks module has ``load_test_tasks``); nothing is written.

    Raises:
        ConfigError: unknown model (agent or optimizer) or device, tasks module, agent or seed prompts that do not load,
            a task that is not a JSON object (module, function and index named), no training or validation tasks.
        BackendError: a model that is neither prepared nor installed (the message gives the pip command).
    """
    from agentbolt.inference.model_files import check_model_available
    from agentbolt.runner.processes import load_agent
    from agentbolt.trainer.job_config import check_device, check_tasks, load_tasks_module

    optimizer_model = config.optimizer_model if config.optimizer.base_url is None else None
    for model in (config.model, optimizer_model):
        if model is not None and not Path(model).is_dir():
            check_model_available(model)
    check_device(config.device)
    tasks_mod = load_tasks_module(config.tasks)
    load_agent(config.agent)  # an agent that does not import fails here, before --overwrite removes a store
    seed_prompts = resolve_seed_prompts(config)
    source = config.tasks
    train_tasks = check_tasks(tasks_mod.load_train_tasks(size=config.train_size), f"{source} load_train_tasks()")
    val_sets = tasks_mod.load_val_sets(n_per_set=config.val_size)
    if not isinstance(val_sets, dict):
        raise ConfigError(f"{source} load_val_sets() returned {type(val_sets).__name__}, not a dict of set -> tasks")
    first_set = next(iter(val_sets.items()), None)
    val_tasks = [] if first_set is None else check_tasks(first_set[1], f"{source} load_val_sets() set {first_set[0]!r}")
    test_tasks: list[dict[str, Any]] = []
    if config.eval_test and callable(getattr(tasks_mod, "load_test_tasks", None)):
        test_tasks = check_tasks(tasks_mod.load_test_tasks(), f"{source} load_test_tasks()")
    if not train_tasks or not val_tasks:
        raise ConfigError(
            f"{config.tasks} gave {len(train_tasks)} training and {len(val_tasks)} validation tasks; both are needed"
        )
    return seed_prompts, train_tasks, val_tasks, test_tasks


def serve_job(config: PromptOptConfig, db_path: Path, console: Console) -> AbstractAsyncContextManager[LocalServing]:
    """:func:`~agentbolt.trainer.local.local_serving` with the job's model, agent, runner and batching settings."""
    from agentbolt.trainer.local import LocalMachine, local_serving

    return local_serving(LocalMachine.of(config), db_path=db_path, console=console)


def agent_llm(config: PromptOptConfig, serving: LocalServing) -> LLM:
    """The ``llm`` resource the agent gets: the job's gateway and model, with the job's agent sampling settings,
    enforced at the gateway (an agent that passes none is still scored at them)."""
    return LLM(
        endpoint=serving.url,
        model=serving.backend.model_name,
        sampling_parameters={"temperature": config.agent_temperature, "max_tokens": config.agent_max_tokens},
        sampling_enforced=True,
    )


async def job_optimizer(
    config: PromptOptConfig, serving: LocalServing, stack: AsyncExitStack, console: Console
) -> tuple[OptimizerLLMConfig, float]:
    """The optimizer settings with its endpoint resolved, and the seconds spent loading an optimizer model.

    ``optimizer.base_url`` set: used as is (0 s). Otherwise a model of this job answers: ``optimizer_model``, loaded
    and served on its own loopback server entered on ``stack`` (so it stops with the job), else the agent's model on
    the job's server; either way through the unrecorded ``/v1/chat/completions``, with no retries (the model would
    still be generating the abandoned answer) and a timeout of at least :data:`EMBEDDED_OPTIMIZER_TIMEOUT_S` (a long
    critique on 2 CPU cores takes minutes).
    """
    optimizer_config = config.optimizer
    if optimizer_config.base_url is not None:
        return optimizer_config, 0.0
    url, name, setup_s = serving.url, serving.backend.model_name, 0.0
    if config.optimizer_model is not None:
        from agentbolt.trainer.local import model_serving

        served = await stack.enter_async_context(
            model_serving(
                model=config.optimizer_model,
                max_batch_size=config.max_batch_size,
                batch_wait_s=config.batch_wait_s,
                console=console,
                device=config.device,
            )
        )
        url, name, setup_s = served.url, served.backend.model_name, served.model_setup_s
    resolved = optimizer_config.model_copy(
        update={
            "base_url": f"{url}/v1",
            "model": optimizer_config.model or name,
            "max_retries": 0,
            "timeout_s": max(optimizer_config.timeout_s, EMBEDDED_OPTIMIZER_TIMEOUT_S),
        }
    )
    return resolved, setup_s


def prompt_diff(seed: Mapping[str, str], best: Mapping[str, str]) -> str:
    """Unified diff, prompt by prompt (in the seed's order), from ``seed`` to ``best``; ``""`` when equal."""
    parts: list[str] = []
    for name in dict.fromkeys([*seed, *best]):
        before, after = seed.get(name, ""), best.get(name, "")
        if before == after:
            continue
        lines = difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"seed/{name}",
            tofile=f"best/{name}",
        )
        parts.append("".join(line if line.endswith("\n") else line + "\n" for line in lines))
    return "".join(parts)


async def run_prompt_optimization(config: PromptOptConfig, console: Console | None = None) -> dict[str, Any]:
    """Run the job of the module docstring and return its summary (also written to ``out_dir/summary.json``).

    Raises:
        ConfigError: bad settings (unknown model, tasks module or agent that does not import, no seed prompt, no
            training or validation tasks, an existing store without ``overwrite``), all before anything is written.
    """
    from agentbolt.algorithms.apo.templates import load_templates
    from agentbolt.trainer.out_lock import hold_out_dir

    console = console or Console()
    t_start = time.perf_counter()
    inputs = check_job_inputs(config)
    settings = config.apo if config.algorithm == "apo" else config.gepa
    templates = load_templates(settings.templates)  # a bad override fails here, before anything is written
    with hold_out_dir(config.out_dir, command=f"agentbolt train ({config.algorithm})"):
        return await _optimize(config, console, inputs, templates, t_start)


async def _optimize(
    config: PromptOptConfig,
    console: Console,
    inputs: tuple[dict[str, str], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]],
    templates: TemplateSet,
    t_start: float,
) -> dict[str, Any]:
    """:func:`run_prompt_optimization` once the inputs are checked and ``out_dir`` is this job's."""
    from agentbolt.algorithms.apo import StoreEvaluator, build_optimizer_llm, optimize_apo, optimize_gepa
    from agentbolt.algorithms.apo.candidates import ProgressEvent
    from agentbolt.algorithms.apo.types import Candidate, TaskResult
    from agentbolt.trainer.local import fresh_db_path
    from agentbolt.types import RolloutConfig, RolloutMode

    seed_prompts, train_tasks, val_tasks, test_tasks = inputs
    settings = config.apo if config.algorithm == "apo" else config.gepa
    db_path = fresh_db_path(config.out_dir, overwrite=config.overwrite, resumable=False)
    rounds = config.apo.rounds if config.algorithm == "apo" else config.gepa.max_iterations
    console.print(
        f"[bold]agentbolt train[/]: algorithm={config.algorithm} model={config.model} prompts={sorted(seed_prompts)} "
        f"train={len(train_tasks)} val={len(val_tasks)} test={len(test_tasks)}"
    )

    progress = JobProgress(console)
    round_bar = progress.add_task("rounds" if config.algorithm == "apo" else "iterations", total=rounds)
    rollout_bar = progress.add_task("rollouts", total=0)

    def enqueued(count: int) -> None:
        task = progress.tasks[rollout_bar]
        progress.update(rollout_bar, total=(task.total or 0) + count)

    def report(event: ProgressEvent) -> None:
        progress.update(round_bar, completed=event.round_index)
        label = "seed" if event.phase == "seed" else f"{event.phase} {event.round_index}/{event.rounds}"
        progress.console.print(
            f"{label}: best val {event.best_val_score:.3f}  rollouts {event.rollouts}  {event.message}"
        )

    async with AsyncExitStack() as stack:
        serving = await stack.enter_async_context(serve_job(config, db_path, console))
        backend = serving.backend
        llm = agent_llm(config, serving)
        optimizer_config, optimizer_setup_s = await job_optimizer(config, serving, stack, console)
        console.print(f"optimizer: {optimizer_config.model} at {optimizer_config.base_url}")
        optimizer = build_optimizer_llm(optimizer_config)
        evaluator = StoreEvaluator(
            serving.store,
            reward_name=config.reward_name,
            rollout_config=RolloutConfig(
                max_attempts=config.max_attempts,
                timeout_seconds=config.rollout_timeout_s,
                unresponsive_seconds=config.rollout_unresponsive_s,
            ),
            metadata={"algorithm": config.algorithm},
            on_enqueued=enqueued,
            on_finished=lambda count: progress.advance(rollout_bar, count),
        )
        arguments: dict[str, Any] = {
            "seed_prompts": seed_prompts,
            "train_tasks": train_tasks,
            "val_tasks": val_tasks,
            "store": serving.store,
            "evaluator": evaluator,
            "optimizer": optimizer,
            "base_resources": {"llm": llm},
            "run_metadata": {"job": "agentbolt train", "model": config.model},
            "on_progress": report,
            "templates": templates,
        }
        try:
            with progress:
                t_opt = time.perf_counter()
                if isinstance(settings, APOConfig):
                    result = await optimize_apo(settings, **arguments)
                else:
                    result = await optimize_gepa(settings, **arguments)
                optimize_s = time.perf_counter() - t_opt
                test_before = test_after = None
                test_rollouts = 0
                t_test = time.perf_counter()
                if test_tasks:
                    progress.update(rollout_bar, description="test rollouts", total=0, completed=0)

                    async def test_score(candidate: Candidate) -> float:
                        results: list[TaskResult] = await evaluator(candidate, test_tasks, mode=RolloutMode.TEST)
                        return sum(r.reward for r in results) / len(results)

                    if result.best.candidate.candidate_id == result.seed.candidate.candidate_id:
                        test_before = test_after = await test_score(result.seed.candidate)
                        test_rollouts = len(test_tasks)
                    else:  # together, so the two candidates' calls share the model's batches
                        test_before, test_after = await asyncio.gather(
                            test_score(result.seed.candidate), test_score(result.best.candidate)
                        )
                        test_rollouts = 2 * len(test_tasks)
                test_s = time.perf_counter() - t_test
        finally:
            await optimizer.aclose()
        generation = backend.stats

    best_prompts = dict(result.best.candidate.prompts)
    diff = prompt_diff(seed_prompts, best_prompts)
    summary: dict[str, Any] = {
        "algorithm": config.algorithm,
        "model": config.model,
        "optimizer_model": optimizer_config.model,
        "optimizer_base_url": optimizer_config.base_url if config.optimizer.base_url is not None else "embedded",
        "optimizer_embedded_model": config.optimizer_model if config.optimizer.base_url is None else None,
        "seed_candidate": result.seed.candidate.candidate_id,
        "best_candidate": result.best.candidate.candidate_id,
        "val_before": result.seed.val_score,
        "val_after": result.best.val_score,
        "n_val": len(val_tasks),
        "test_before": test_before,
        "test_after": test_after,
        "n_test": len(test_tasks),
        "rollouts": {"optimization": result.usage.rollouts, "test": test_rollouts},
        "optimizer_calls": result.usage.optimizer_calls,
        "optimizer_cache_hits": result.usage.cache_hits,
        "rejected_edits": result.usage.rejected_edits,
        "wall_seconds": time.perf_counter() - t_start,
        "timing_s": {
            "model_setup": serving.model_setup_s,
            "optimizer_model_setup": optimizer_setup_s,
            "optimize": optimize_s,
            "test": test_s,
        },
        "generation": {
            "generated_tokens": generation.generated_tokens,
            "tokens_per_s": generation.tokens_per_s,
            "requests": generation.requests,
        },
        "candidates": [
            {
                "candidate_id": scored.candidate.candidate_id,
                "origin": scored.candidate.origin,
                "round": scored.candidate.round_index,
                "parents": list(scored.candidate.parent_ids),
                "accepted": scored.accepted,
                "val_score": scored.val_score if scored.val_scores else None,
                "val_scores": dict(scored.val_scores),
                "prompts": dict(scored.candidate.prompts),
            }
            for scored in result.candidates
        ],
        "best_prompts": best_prompts,
        "seed_prompts": seed_prompts,
        "reward_name_missing": evaluator.reward_name_missing,
        "config": json.loads(config.model_dump_json()),
    }
    write_outputs(config.out_dir, summary, diff)
    print_result(console, summary, diff)
    if evaluator.reward_name_missing:
        console.print(missing_reward_warning(config.reward_name), markup=False, highlight=False)
    return summary


def write_outputs(out_dir: Path, summary: Mapping[str, Any], diff: str) -> None:
    """Write ``summary.json``, ``best_prompts.json``, ``best_prompt.<name>.txt`` and ``prompt.diff`` to ``out_dir``."""
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    best: Mapping[str, str] = summary["best_prompts"]
    (out_dir / "best_prompts.json").write_text(json.dumps(best, indent=2))
    for name, text in best.items():
        (out_dir / f"best_prompt.{name}.txt").write_text(text)
    (out_dir / "prompt.diff").write_text(diff)


def print_result(console: Console, summary: Mapping[str, Any], diff: str) -> None:
    """The table of candidates, the best prompt, its diff from the seed, and the before/after scores."""
    table = Table(title="candidates (each is a resources version)")
    for column, justify in (("resources", "left"), ("origin", "left"), ("round", "right"), ("parents", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    table.add_column("val score", justify="right")
    table.add_column("tasks", justify="right")
    best_id = summary["best_candidate"]
    for row in summary["candidates"]:
        score = "rejected" if row["val_score"] is None else f"{row['val_score']:.3f}"
        marker = " *" if row["candidate_id"] == best_id else ""
        table.add_row(
            row["candidate_id"] + marker,
            row["origin"],
            str(row["round"]),
            ", ".join(row["parents"]) or "-",
            score,
            str(len(row["val_scores"])),
        )
    console.print(table)
    for name, text in summary["best_prompts"].items():
        console.print(Panel(text, title=f"best prompt: {name} ({best_id})"))
    if diff:
        console.print(Syntax(diff, "diff", word_wrap=True))
    else:
        console.print("the best candidate is the seed: no edit scored higher on validation")
    scores = Table(title="accuracy")
    scores.add_column("split")
    scores.add_column("seed", justify="right")
    scores.add_column("best", justify="right")
    scores.add_row(f"validation ({summary['n_val']})", f"{summary['val_before']:.1%}", f"{summary['val_after']:.1%}")
    if summary["test_before"] is not None:
        scores.add_row(f"test ({summary['n_test']})", f"{summary['test_before']:.1%}", f"{summary['test_after']:.1%}")
    console.print(scores)
    rollouts = summary["rollouts"]
    console.print(
        f"rollouts: {rollouts['optimization']} optimizing + {rollouts['test']} test  "
        f"optimizer calls: {summary['optimizer_calls']} ({summary['optimizer_cache_hits']} from cache)  "
        f"wall: {summary['wall_seconds']:.0f}s"
    )


def missing_reward_warning(reward_name: str | None) -> str:
    """The warning printed when no rollout recorded the reward named ``reward_name``."""
    return (
        f"warning: no rollout recorded a reward named {reward_name!r} (reward_name), so every score is the final "
        f"reward; emit_reward(value, name={reward_name!r}) in the agent, or set reward_name to null"
    )
