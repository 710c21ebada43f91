"""``agentbolt eval CONFIG --resources rs-N``: score a stored resources version on the tasks of a prompt-optimization
config (``algorithm: apo|gepa``, e.g. ``examples/room_agent/config.yaml``), on this machine, with the config's model.

The job (:func:`run_eval`):

1. opens the existing SQLite store that holds the version (``--store``, default ``out_dir/store.db`` of the config;
   never replaced) and reads the version;
2. starts :func:`~agentbolt.trainer.local.local_serving` over that file (embedded model, server on a free loopback
   port, runner processes executing the config's agent);
3. points the version's ``llm`` resource at this server: a stored ``llm`` names the server and model of the job that
   published it, which are gone, so when its endpoint or model differs a new version is published with the same
   prompts, that ``llm`` rewritten, and metadata ``{"eval_of": "rs-N"}`` (the job says so); the rollouts run against
   that version;
4. enqueues one rollout per task of the split (``val``: the first validation set, ``val_size`` tasks; ``test``:
   ``load_test_tasks()``) with mode ``val`` / ``test`` and metadata ``{"eval_of", "task_id", "candidate"}``, shows a
   bar, and reads each reward back (:class:`~agentbolt.algorithms.apo.store_evaluator.StoreEvaluator`);
5. prints the accuracy and writes ``eval.json`` to the output directory (default ``out_dir/eval-rs-N-SPLIT``).

Every rollout and span stays in the store, so the dashboard and ``agentbolt export`` see the evaluation.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console
from rich.progress import TextColumn

from agentbolt.adapter.trajectory import describe_success, is_correct
from agentbolt.errors import ConfigError, NotFoundError
from agentbolt.trainer.progress_bars import JobProgress
from agentbolt.types import LLM, PromptTemplate, RolloutMode

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore
    from agentbolt.trainer.prompt_opt import PromptOptConfig
    from agentbolt.types import ResourcesUpdate

EvalSplit = Literal["val", "test"]
SPLIT_MODES: dict[str, RolloutMode] = {"val": RolloutMode.VAL, "test": RolloutMode.TEST}
"""The rollout mode of each split."""


def split_tasks(config: PromptOptConfig, split: str) -> list[dict[str, Any]]:
    """The tasks of ``split``: ``val``, the first set of ``load_val_sets(val_size)``; ``test``, ``load_test_tasks()``.

    Raises:
        ConfigError: an unknown split, a tasks module that does not import or has no ``load_test_tasks``, or no tasks.
    """
    from agentbolt.trainer.job_config import load_tasks_module, load_test_tasks

    if split not in SPLIT_MODES:
        raise ConfigError(f"split must be one of {', '.join(SPLIT_MODES)}, got {split!r}")
    module = load_tasks_module(config.tasks)
    if split == "val":
        tasks = list(next(iter(module.load_val_sets(n_per_set=config.val_size).values()), []))
    else:
        tasks = load_test_tasks(module, config.tasks, "evaluate --split val")
    if not tasks:
        raise ConfigError(f"{config.tasks} gave no {split} tasks")
    return [dict(task) for task in tasks]


async def _read_version(db_path: Path, resources_id: str) -> ResourcesUpdate:
    """The version ``resources_id`` of the store file, read before the model loads (a wrong id fails fast)."""
    from agentbolt.store.sqlite import SqliteLightningStore

    if not db_path.is_file():
        raise ConfigError(f"no store file at {db_path}; pass --store PATH (the store.db of the run that made it)")
    store = SqliteLightningStore(db_path)
    try:
        version = await store.get_resources(resources_id)
    except NotFoundError:
        version = None
    finally:
        await store.close()
    if version is None:
        raise ConfigError(f"{db_path} has no resources version {resources_id!r}")
    return version


async def serving_version(
    store: LightningStore, version: ResourcesUpdate, *, url: str, model: str, sampling: dict[str, Any]
) -> tuple[ResourcesUpdate, bool]:
    """The version to run: ``version`` itself when its ``llm`` resource already names ``url`` and ``model``, else a
    new version with the same resources, the ``llm`` rewritten (or added, with ``sampling``) and metadata
    ``{"eval_of": version.resources_id}``; and whether one was published."""
    resources = dict(version.resources)
    names = [name for name, resource in resources.items() if isinstance(resource, LLM)]
    if names:
        current = resources[names[0]]
        assert isinstance(current, LLM)
        if current.endpoint.rstrip("/") == url.rstrip("/") and current.model == model:
            return version, False
        resources[names[0]] = current.model_copy(update={"endpoint": url, "model": model})
    else:
        resources["llm"] = LLM(endpoint=url, model=model, sampling_parameters=sampling, sampling_enforced=True)
    published = await store.add_resources(resources, metadata={"eval_of": version.resources_id})
    return published, True


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


async def run_eval(
    config: PromptOptConfig,
    *,
    resources_id: str,
    split: str = "val",
    store_path: Path | None = None,
    out_dir: Path | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run the job of the module docstring; return its summary (also written to ``OUT/eval.json``).

    Raises:
        ConfigError: a bad split, tasks module, model or agent; no store file; no such version (all before the
            model loads).
    """
    from agentbolt.algorithms.apo import StoreEvaluator
    from agentbolt.algorithms.apo.types import Candidate
    from agentbolt.inference.model_files import get_model_spec
    from agentbolt.trainer.job_config import check_device
    from agentbolt.trainer.prompt_opt import serve_job
    from agentbolt.types import RolloutConfig

    console = console or Console()
    t_start = time.perf_counter()
    if not Path(config.model).is_dir():
        get_model_spec(config.model)
    check_device(config.device)
    tasks = split_tasks(config, split)
    mode = SPLIT_MODES[split]
    db_path = store_path if store_path is not None else config.out_dir / "store.db"
    out = out_dir if out_dir is not None else config.out_dir / f"eval-{resources_id}-{split}"
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; --out must be a directory")
    version = await _read_version(db_path, resources_id)
    prompts = {n: r.template for n, r in version.resources.items() if isinstance(r, PromptTemplate)}
    console.print(
        f"[bold]agentbolt eval[/]: {resources_id} ({', '.join(sorted(prompts)) or 'no prompts'}) on {len(tasks)} "
        f"{split} tasks of {config.tasks}, model={config.model}, store={db_path}"
    )

    async with serve_job(config, db_path, console) as serving:
        sampling = {"temperature": config.agent_temperature, "max_tokens": config.agent_max_tokens}
        run_version, published = await serving_version(
            serving.store, version, url=serving.url, model=serving.backend.model_name, sampling=sampling
        )
        if published:
            console.print(
                f"{resources_id}'s llm resource points at another server or model; published "
                f"{run_version.resources_id} (same prompts, llm -> {serving.url} {serving.backend.model_name}, "
                f'metadata {{"eval_of": "{resources_id}"}}) and evaluating that'
            )
        progress = JobProgress(console, TextColumn("{task.fields[score]}"))
        bar = progress.add_task(f"{split} rollouts", total=len(tasks), score="")

        evaluator = StoreEvaluator(
            serving.store,
            reward_name=config.reward_name,
            rollout_config=RolloutConfig(
                max_attempts=config.max_attempts,
                timeout_seconds=config.rollout_timeout_s,
                unresponsive_seconds=config.rollout_unresponsive_s,
            ),
            metadata={"eval_of": resources_id},
            on_finished=lambda count: progress.advance(bar, count),
        )
        candidate = Candidate(candidate_id=run_version.resources_id, prompts=prompts)
        t_eval = time.perf_counter()
        with progress:
            results = await evaluator(candidate, tasks, mode=mode)
            n_correct = sum(is_correct(r.reward, config.success_threshold) for r in results)
            progress.update(bar, score=f"accuracy {n_correct}/{len(results)}")
        eval_s = time.perf_counter() - t_eval
        rollouts = [await serving.store.get_rollout(r.rollout_id) for r in results if r.rollout_id is not None]
        generation = serving.backend.stats
        model_setup_s = serving.model_setup_s

    rewards = [r.reward for r in results]
    summary: dict[str, Any] = {
        "resources_id": resources_id,
        "eval_resources_id": run_version.resources_id,
        "published_version": published,
        "split": split,
        "mode": mode.value,
        "store": str(db_path),
        "model": config.model,
        "agent": config.agent,
        "tasks": config.tasks,
        "n": len(results),
        "success_rule": describe_success(config.reward_name, config.success_threshold),
        "reward_name_missing": evaluator.reward_name_missing,
        "n_correct": n_correct,
        "accuracy": n_correct / len(rewards),
        "mean_reward": _mean(rewards),
        "rollout_status": {
            s: sum(r.status.value == s for r in rollouts) for s in sorted({r.status.value for r in rollouts})
        },
        "results": [
            {
                "task_id": r.task_id,
                "rollout_id": r.rollout_id,
                "reward": r.reward,
                "answer": r.trace.answer if r.trace else None,
            }
            for r in results
        ],
        "prompts": prompts,
        "wall_seconds": time.perf_counter() - t_start,
        "timing_s": {"model_setup": model_setup_s, "eval": eval_s},
        "generation": {
            "generated_tokens": generation.generated_tokens,
            "tokens_per_s": generation.tokens_per_s,
            "requests": generation.requests,
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    console.print(
        f"[bold]{resources_id}[/] on {split}: accuracy {summary['accuracy']:.3f} "
        f"({summary['n_correct']}/{len(results)}), mean reward {summary['mean_reward']:.3f}; "
        f"rollouts under {run_version.resources_id} (mode {mode.value}); wrote {out / 'eval.json'}"
    )
    if evaluator.reward_name_missing:
        from agentbolt.trainer.prompt_opt import missing_reward_warning

        console.print(missing_reward_warning(config.reward_name), markup=False, highlight=False)
    return summary
