"""The one RL job: ``agentbolt train CONFIG.yaml``, ``agentbolt demo``, the SQL example and the GPU check all run it.

:func:`run_training` starts, on this machine, a SQLite store file, the server (store API + gateway) on a free loopback
port, the embedded model (served from a plain copy, trained with LoRA in this process) and runner processes that
execute the agent against the gateway (:func:`~agentbolt.trainer.local.local_training`); then evaluates before,
trains ``grpo.steps`` steps with a checkpoint after each ``checkpoint.every`` (:mod:`agentbolt.trainer.checkpoint`),
evaluates after, and writes ``summary.json`` and ``reward_curve.png`` into ``out_dir``. A caller changes what it
needs through :class:`JobSeams` (its own tasks, a per-step hook, a time budget, extra summary fields) instead of
copying the job. The settings are :class:`~agentbolt.trainer.job_config.TrainConfig`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from agentbolt.adapter.trajectory import describe_success
from agentbolt.errors import ConfigError
from agentbolt.trainer.job_config import (
    RUN_PURPOSE,
    TrainConfig,
    check_device,
    check_tasks,
    check_trainer,
    load_task_sets,
)
from agentbolt.trainer.job_output import print_run_end, print_summary
from agentbolt.trainer.plots import plot_reward_curve
from agentbolt.trainer.progress_bars import JobProgress
from agentbolt.trainer.step_report import (
    FailureWatch,
    NothingToTrain,
    skipped_update_reason,
    step_line,
    update_counts,
)

if TYPE_CHECKING:
    from agentbolt.trainer.checkpoint import CheckpointInfo
    from agentbolt.trainer.loop import StepResult
    from agentbolt.types import Metric

logger = logging.getLogger(__name__)

TaskSets = tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]
"""Training tasks and validation sets (set name -> tasks)."""


@dataclass(frozen=True)
class JobSeams:
    """Where a caller plugs into :func:`run_training`; each ``None`` keeps the train job's behaviour.

    Attributes:
        tasks: the training tasks and validation sets to use instead of the config's tasks module (e.g. the SQL
            example's bands).
        on_step: called with each step's result after the job has reported it (e.g. a GPU check's record).
        keep_going: called with a step number before that step's rollouts are enqueued; ``False`` ends training
            there (e.g. a time budget). The steps done are checkpointed, evaluated and summarized as usual.
        summary: called with the summary before it is written; may add fields to it.
    """

    tasks: TaskSets | None = None
    on_step: Callable[[StepResult], None] | None = None
    keep_going: Callable[[int], bool] | None = None
    summary: Callable[[dict[str, Any]], None] | None = None


def _peak_rss_mb() -> dict[str, float]:
    """This process's peak resident memory, MiB (the runners' are added by the job: ``RUSAGE_CHILDREN`` would charge
    each of them the trainer's size at its fork, see :func:`agentbolt.runner.processes.peak_rss_mb`)."""
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"trainer_and_server_mb": self_kb / 1024}


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
        "kept_by_agent": result.kept_by_agent,
        "dropped_by_agent": result.dropped_by_agent,
        "n_unmatched": result.n_unmatched,
        "causes": result.causes,
        "n_truncated": result.n_truncated,
        "untrainable_calls": result.untrainable_calls,
        "n_calls": result.n_calls,
        "update_skipped": skipped_update_reason(result),
    }


def _check_resume(config: TrainConfig) -> tuple[Path, CheckpointInfo | None]:
    """The store to reuse and the checkpoint to resume from (``None``: the run died before its first checkpoint,
    so it restarts at step 1 on the same store); partial checkpoint folders are deleted.

    Raises:
        ConfigError: ``out_dir`` holds no store (nothing to resume), another process has the store open (e.g. an
            ``agentbolt serve`` on it: the job's store is the job's alone), the checkpoint was trained from another
            model, or the run is finished (its last step is checkpointed and evaluated: only more steps would
            continue it).
    """
    from agentbolt.store.sqlite_lock import exclusive_store
    from agentbolt.trainer.checkpoint import latest_checkpoint, remove_partial

    db_path = config.out_dir / "store.db"
    if not db_path.is_file():
        raise ConfigError(f"nothing to resume in {config.out_dir}: it has no store.db; run without --resume")
    with exclusive_store(db_path, action="--resume would cancel that process's rollouts and share the store with it"):
        pass  # only a check: the job opens the store itself below
    remove_partial(config.out_dir)
    info = latest_checkpoint(config.out_dir)
    if info is not None and info.model != config.model:
        raise ConfigError(
            f"{info.path} was trained from model {info.model!r}, not {config.model!r}; resume with --set "
            f"model={info.model} or start a new run in another --out"
        )
    finished = info is not None and info.step >= config.grpo.steps
    if info is not None and finished and ("val_after" in info.job or not config.eval_after or config.val_size == 0):
        raise ConfigError(
            f"the run in {config.out_dir} is finished: {info.path.name} is its last step (grpo.steps="
            f"{config.grpo.steps}) and its summary is written; to train it further resume with --set "
            f"grpo.steps={info.step + config.grpo.steps}, or score it with agentbolt eval"
        )
    return db_path, info


async def run_training(
    config: TrainConfig, console: Console | None = None, *, seams: JobSeams | None = None
) -> dict[str, Any]:
    """Run the whole job and return the summary (also written to ``out_dir/summary.json``).

    Writes a checkpoint after every ``checkpoint.every`` steps and the last (:mod:`agentbolt.trainer.checkpoint`).
    With ``config.resume`` the job continues the run in ``out_dir`` from its newest complete checkpoint, on the same
    store: rollouts a killed run left unfinished are cancelled, the adapter, optimizer and loop state are loaded, and
    steps go on from the checkpoint's step + 1 (the summary and curves hold every step once).

    With ``overwrite`` the previous run's files are moved into ``out_dir/.overwritten-<time>/``, never deleted. A
    fresh run that fails (an error, not a stop by a signal) before any rollout ended removes the store it created,
    so the same command can be rerun.

    Raises:
        ConfigError: an unknown model name, bad torch trainer settings, an existing store without ``overwrite``,
            another process having the store open (e.g. ``agentbolt serve`` on it; the message names it), the tasks
            module not importable (the calc example outside a clone of the repository), a task that is not a JSON
            object (a file's message names the file and line), a bad ``agent_match`` pattern, or (``resume``)
            nothing to resume; all before the model loads and before anything is written.
    """
    console = console or Console()
    seams = seams or JobSeams()
    t_start = time.perf_counter()
    from agentbolt.inference.model_files import get_model_spec
    from agentbolt.runner.processes import load_agent
    from agentbolt.trainer.out_lock import hold_out_dir

    # The config's names (estimator, credit, algorithm, torch trainer fields) were checked when it was parsed; what
    # needs the machine is checked here, before anything is written.
    if not Path(config.model).is_dir():
        get_model_spec(config.model)  # an unknown name fails here, before anything is written
    check_device(config.device)
    check_trainer(config)
    tasks = _job_tasks(config, seams)  # every task is checked here, before the model loads and anything is written
    load_agent(config.agent)  # an agent that does not import fails here, before --overwrite moves a store aside
    command = "agentbolt train" + (" --resume" if config.resume else "")
    with hold_out_dir(config.out_dir, command=command, create=not config.resume):
        resume_info: CheckpointInfo | None = None
        if config.resume:
            db_path, resume_info = _check_resume(config)
        else:
            from agentbolt.trainer.local import fresh_db_path

            db_path = fresh_db_path(config.out_dir, overwrite=config.overwrite, console=console)
        try:
            return await _run_job(config, console, seams, tasks, t_start, db_path, resume_info)
        except Exception:  # not a stop by Ctrl-C: that run can be resumed (the message says how), so it stays
            if not config.resume:  # a run that failed before any rollout ended leaves nothing that blocks a rerun
                from agentbolt.trainer.local import discard_unused_store

                discard_unused_store(db_path, console)
            raise


def _job_tasks(config: TrainConfig, seams: JobSeams) -> TaskSets:
    """The training tasks and validation sets of the job (the seams' or the config's), checked.

    Raises:
        ConfigError: as :func:`~agentbolt.trainer.job_config.load_task_sets`.
    """
    if seams.tasks is None:
        return load_task_sets(config)
    train, val_sets = seams.tasks
    train = check_tasks(train, "the job's training tasks")
    if config.val_size == 0 or not (config.eval_before or config.eval_after or config.eval_every):
        return train, {}
    return train, {name: check_tasks(tasks, f"validation set {name!r}") for name, tasks in val_sets.items()}


async def _run_job(
    config: TrainConfig,
    console: Console,
    seams: JobSeams,
    tasks: TaskSets,
    t_start: float,
    db_path: Path,
    resume_info: CheckpointInfo | None,
) -> dict[str, Any]:
    """:func:`run_training` once the config and the tasks are checked, ``out_dir`` is this job's and its store is
    ``db_path`` (``resume_info``: the checkpoint a resume continues from)."""
    from agentbolt.trainer.checkpoint import (
        RunCheckpointer,
        cancel_unfinished,
        ensure_checkpoint_published,
        restore_missing_metrics,
    )
    from agentbolt.trainer.local import LocalMachine, local_training, resolve_model, with_serving_tis
    from agentbolt.trainer.trackers import open_trackers

    train_tasks, val_sets = tasks
    grpo = config.grpo
    console.print(
        f"[bold]agentbolt train[/]: model={config.model} steps={grpo.steps} "
        f"tasks/step={min(grpo.tasks_per_step, len(train_tasks))} "
        f"group={grpo.group_size} estimator={grpo.advantage_estimator} credit={grpo.credit_assignment} "
        f"async_rollouts={grpo.async_rollouts} val={ {k: len(v) for k, v in val_sets.items()} } "
        f"success: {describe_success(grpo.accuracy_reward_name, grpo.success_threshold)}"
    )
    if config.inference.quantization == "int8":
        tis_cap = with_serving_tis(config.trainer_settings, config.inference).tis_cap
        console.print(
            "serving: int8 linears (inference.quantization; SmoothQuant scales calibrated on the first served "
            f"prompts); truncated importance sampling tis_cap={tis_cap}"
        )
    progress = JobProgress(console)

    def tracker(description: str, total: int) -> Callable[[int, int], None]:
        task_id = progress.add_task(f"{description}: rollouts", total=total)  # what done/total counts

        def update(done: int, all_: int) -> None:
            progress.update(task_id, completed=done, total=all_)

        return update

    watch = FailureWatch(grpo.fail_after)

    def report(result: StepResult) -> None:
        watch.add(result)
        progress.console.print(step_line(result), markup=False, highlight=False)
        unscoped = watch.unscoped_line()
        if unscoped is not None:
            progress.console.print(unscoped, markup=False, highlight=False)

    # What the job keeps across a resume (also in every checkpoint's job state).
    job: dict[str, Any] = {"steps": [], "val_before": {}, "eval_before_done": False, "timing_s": {}}
    if resume_info is not None:
        job.update(json.loads(json.dumps(resume_info.job)))
        if resume_info.step < grpo.steps and "val_after" in job:
            # the run goes on past the step that was evaluated last: that result becomes a mid-run evaluation
            job.setdefault("val_during", {})[str(resume_info.step)] = job.pop("val_after")
    first_step = 1 if resume_info is None else resume_info.step + 1
    wall_before = float(job.pop("wall_s", 0.0))  # the wall time of the stopped runs, up to their last checkpoint

    def job_state() -> dict[str, Any]:
        state = json.loads(json.dumps(job))
        state["wall_s"] = wall_before + time.perf_counter() - t_start
        return state

    async with (
        contextlib.AsyncExitStack() as stack,
        local_training(
            LocalMachine.of(config),
            db_path=db_path,
            grpo=grpo,
            trainer_config=config.trainer_settings,
            agent_match=config.agent_match,
            console=console,
            resume_from=None if resume_info is None else resume_info.path,
        ) as local,
    ):
        trainer, store, backend = local.trainer, local.store, local.backend
        trackers = await asyncio.to_thread(
            open_trackers,
            config.report_to,
            out_dir=config.out_dir,
            run_name=config.out_dir.name if resume_info is None else f"{config.out_dir.name}-from-{resume_info.step}",
            config=config.to_settings(),
        )
        stack.push(lambda exc_type, *_: trackers.close(failed=exc_type is not None))  # a failed run is marked so

        def to_trackers(metrics: Sequence[Metric]) -> None:
            by_step: dict[int, dict[str, float]] = {}
            for metric in metrics:
                by_step.setdefault(metric.train_step, {})[metric.name] = metric.value
            for step in sorted(by_step):
                trackers.log(by_step[step], step)

        trainer.metric_listeners.append(to_trackers)
        watch.unscoped_calls = local.unscoped_calls
        runner_exits = local.runner_exits  # filled while the job runs
        runner_peaks = local.runners.peak_rss_mb  # filled when the runners stop
        await store.add_resources(
            {},
            metadata={
                "purpose": RUN_PURPOSE,
                "config": config.to_settings(),
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

        async def evaluate(
            description: str, label: str, on_enqueued: Callable[[], object] | None = None
        ) -> dict[str, float]:
            accuracy = await trainer.evaluate(
                val_sets, on_progress=tracker(description, n_val), label=label, on_enqueued=on_enqueued
            )
            if label in trainer.accuracy_reward_missing:  # the warning is logged; the summary keeps it too
                job.setdefault("accuracy_reward_missing", []).append(label)
            return accuracy

        async def evaluate_at(step: int) -> dict[str, float]:
            accuracy = await evaluate(f"eval step {step}", f"step-{step}")
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
            job_state=job_state,
            evaluate=evaluate_at if val_sets and config.eval_every else None,
            eval_every=config.eval_every,
        )

        def record(result: StepResult) -> None:
            report(result)
            job["steps"].append(step_row(result))
            if seams.on_step is not None:
                seams.on_step(result)

        async def after_step(result: StepResult) -> None:
            if watch.nothing_trained:  # a checkpoint now would hold the weights this run started from
                return
            await checkpointer.after_step(result)

        timing = job["timing_s"]
        try:
            with progress:
                eval_before: asyncio.Task[None] | None = None
                enqueued = asyncio.Event()

                async def run_eval_before(t0: float) -> None:
                    job["val_before"] = await evaluate("eval before", "before", on_enqueued=enqueued.set)
                    job["eval_before_done"] = True
                    timing["eval_before"] = time.perf_counter() - t0

                t_train = time.perf_counter()
                try:
                    if val_sets and config.eval_before and not job["eval_before_done"]:
                        # The first step's rollouts run alongside it (same weights; the first update waits for it),
                        # queued after its own, so the runners and the running batch stay full through its tail.
                        progress.console.print(
                            "evaluating before training, alongside step 1's rollouts (the same weights; the first "
                            "update waits for it)",
                            markup=False,
                            highlight=False,
                        )
                        eval_before = asyncio.create_task(run_eval_before(t_train))
                        queued = asyncio.create_task(enqueued.wait())
                        await asyncio.wait({eval_before, queued}, return_when=asyncio.FIRST_COMPLETED)
                        queued.cancel()
                    results = await trainer.train(
                        train_tasks,
                        first_step=first_step,
                        on_step_start=lambda step, total: tracker(f"step {step}", total),
                        on_step_end=record,
                        after_step=after_step,
                        keep_going=lambda step: (
                            not watch.tripped and (seams.keep_going is None or seams.keep_going(step))
                        ),
                        first_update_after=eval_before,
                    )
                    if eval_before is not None:
                        await eval_before  # no step ran (stopped before the first): the evaluation still counts
                finally:
                    if eval_before is not None and not eval_before.done():
                        eval_before.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await eval_before
                timing["train"] = timing.get("train", 0.0) + time.perf_counter() - t_train
                if watch.failed:
                    pass  # nothing was trained: no checkpoint, no evaluation; the summary below says why
                elif results and (done := results[-1].train_step) < grpo.steps and done % config.checkpoint.every:
                    await checkpointer.save(done)  # stopped early (keep_going) between checkpoints
                last = checkpointer.written[-1] if checkpointer.written else None
                if last is None and resume_info is not None and resume_info.step >= grpo.steps:
                    last = resume_info.path  # every step was done before the stop: only the evaluation is left
                if val_sets and config.eval_after and "val_after" not in job and not watch.failed:
                    t1 = time.perf_counter()
                    job["val_after"] = await evaluate("eval after", "after")
                    timing["eval_after"] = time.perf_counter() - t1
                if last is not None:
                    await checkpointer.finish(last, val_accuracy=job.get("val_after"))
                else:
                    await trainer.flush_metrics()
        except asyncio.CancelledError:  # Ctrl-C (or every runner exited): keep what the finished steps found
            from agentbolt.trainer.local import RUNNER_STOP_ON_CANCEL_S, stop_runners

            # The runners first: an agent whose rollout is cancelled under it would only log the refused calls.
            await asyncio.to_thread(stop_runners, local.runners, RUNNER_STOP_ON_CANCEL_S)
            await _write_stopped_summary(config, console, job, store, _generation_counters(backend), watch)
            raise
        n_rollouts = len(await store.query_rollouts())
        counters = _generation_counters(backend)
        gate = trainer.swap_gate
        model_setup_s = local.model_setup_s

    summary = build_summary(config, job, n_rollouts=n_rollouts, generation=counters)
    summary["wall_seconds"] = time.perf_counter() - t_start  # this process
    summary["wall_seconds_total"] = wall_before + summary["wall_seconds"]  # with the stopped runs' time, if resumed
    summary["resumed_from_step"] = None if resume_info is None else resume_info.step
    summary["timing_s"]["model_setup"] = model_setup_s
    summary["weight_swaps"] = None if gate is None else dataclasses.asdict(gate.stats)
    summary["checkpoints"] = _checkpoint_rows(config.out_dir)
    summary.update(watch.to_summary())
    summary["store"] = str(config.out_dir / "store.db")
    summary["runner_exits"] = runner_exits
    summary["peak_rss"]["runners_mb"] = runner_peaks
    if seams.summary is not None:
        seams.summary(summary)
    (config.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_reward_curve(
        config.out_dir / "reward_curve.png",
        summary["train_reward"],
        summary["val_accuracy_before"],
        summary["val_accuracy_after"],
    )
    print_summary(console, summary)
    if watch.failed:
        raise NothingToTrain(watch.report(store=str(config.out_dir / "store.db")))
    print_run_end(console, config, summary)
    return summary


def _generation_counters(backend: Any) -> dict[str, Any]:
    """The embedded backend's generation counters, as the summary keeps them."""
    gen = backend.stats
    return {
        "generated_tokens": gen.generated_tokens,
        "generation_s": gen.generation_s,
        "tokens_per_s": gen.tokens_per_s,
        "requests": gen.requests,
        "batches": gen.batches,
        "mean_batch_size": gen.mean_batch_size,
    }


async def _write_stopped_summary(
    config: TrainConfig,
    console: Console,
    job: dict[str, Any],
    store: Any,
    generation: dict[str, Any],
    watch: FailureWatch,
) -> None:
    """On a stop (the job's task cancelled, e.g. by Ctrl-C): cancel every rollout still open in the store (their
    attempts are not waited for) and write ``summary.json`` with the steps finished so far and ``stopped: true``.
    Never raises: the job is already stopping (a failure here is logged)."""
    from agentbolt.trainer.checkpoint import cancel_unfinished

    try:
        cancelled = await cancel_unfinished(store)
        summary = build_summary(config, job, n_rollouts=len(await store.query_rollouts()), generation=generation)
        summary["stopped"] = True
        summary["rollouts_cancelled"] = len(cancelled)
        summary.update(watch.to_summary())
        (config.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    except Exception as exc:  # the stop goes on; what was recorded stays in the store
        logger.warning("could not write the summary of the stopped run: %r", exc)
        return
    console.print(
        f"stopped after {_count(len(job['steps']), 'finished step')}; {_count(len(cancelled), 'unfinished rollout')} "
        f"cancelled; wrote {config.out_dir / 'summary.json'}"
    )


def dump_config_yaml(config: TrainConfig) -> str:
    """The resolved settings as YAML (every default filled in); ``agentbolt train`` reads it back."""
    import yaml

    data = config.to_settings()
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
    applied, skipped = update_counts(rows)
    return {
        "steps": grpo.steps,
        "updates_applied": applied,  # steps whose update moved the weights (0: the checkpoints are untrained)
        "updates_skipped": skipped,  # the other steps, per reason
        "advantage_estimator": grpo.advantage_estimator,
        "credit_assignment": grpo.credit_assignment,
        "async_rollouts": grpo.async_rollouts,
        "train_reward": [r["reward_mean"] for r in rows],
        "train_reward_std": [r["reward_std"] for r in rows],
        "step_numbers": [r["train_step"] for r in rows],
        "step_rows": rows,
        "val_accuracy_before": job.get("val_before", {}),
        "val_accuracy_after": job.get("val_after", {}),
        "val_accuracy_during": job.get("val_during", {}),
        "success_rule": describe_success(grpo.accuracy_reward_name, grpo.success_threshold),
        "accuracy_reward_missing": bool(job.get("accuracy_reward_missing")),
        "accuracy_reward_missing_in": job.get("accuracy_reward_missing", []),
        "n_rollouts": n_rollouts,
        "n_transitions": sum(r["n_transitions"] for r in rows),
        "model": config.model,
        "timing_s": timing,
        "staleness": [r["staleness"] for r in rows],
        "update_stats": [r["update_stats"] for r in rows],
        "generation": generation,
        "peak_rss": _peak_rss_mb(),
        "config": config.to_settings(),
    }


def _checkpoint_rows(out_dir: Path) -> list[dict[str, Any]]:
    from agentbolt.trainer.checkpoint import list_checkpoints

    return [
        {"step": info.step, "path": str(info.path), "val_accuracy": info.val_accuracy}
        for info in list_checkpoints(out_dir)
    ]


def _count(n: int, noun: str) -> str:
    """``"1 finished step"``, ``"3 finished steps"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
