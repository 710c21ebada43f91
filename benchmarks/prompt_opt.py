#!/usr/bin/env python3
"""Prompt optimization, side by side: agentbolt's APO, agentbolt's GEPA and the PyPI ``gepa`` package, on the room
agent's fixed split, with the same agent model, optimizer model and rollout budget.

Arms (each runs in turn, each starts its own embedded model, SQLite store, server and runner processes, and writes
``OUT/<arm>/`` with ``store.db`` and ``summary.json``):

* ``agentbolt-apo``: :func:`agentbolt.trainer.prompt_opt.run_prompt_optimization` with ``algorithm: apo`` and the
  settings of ``--config`` (default ``examples/room_agent/config.yaml``) plus the ``--set`` overrides. APO has no
  rollout budget of its own: its spend is set by ``apo.rounds`` / ``beam_width`` / ``branch_factor`` /
  ``train_batch_size`` and the validation size. ``--fit-apo-rounds`` sets ``apo.rounds`` to the most rounds whose
  worst-case spend (:func:`apo_rollout_bound`) stays within ``--budget``.
* ``agentbolt-gepa``: the same job with ``algorithm: gepa`` and ``gepa.max_rollouts = BUDGET`` (a ``--set``
  overrides it). ``gepa.max_iterations`` stays the config's (24 in the room config): a reflection that gives no
  usable prompt spends optimizer time but no rollout, so on a slow CPU optimizer the budget alone can leave the arm
  running for hours; the arm then ends below the budget and its row says how many rollouts it used.
* ``gepa-pypi``: ``gepa.optimize`` (the PyPI package, ``pip install gepa==0.1.4``) with ``max_metric_calls =
  BUDGET``, seed candidate = the seed prompts (``{"prompt_template": BASELINE_PROMPT}``), trainset / valset = the
  same train / validation tasks, and :class:`StoreGEPAAdapter`: every candidate gepa evaluates is published as a
  resources version (:class:`~agentbolt.algorithms.apo.candidates.CandidatePublisher`) and every score is a real
  rollout through the store (:class:`~agentbolt.algorithms.apo.store_evaluator.StoreEvaluator`). Its reflection LM
  (:class:`ReflectionLM`) calls the same optimizer as our arms (:func:`~agentbolt.trainer.prompt_opt.job_optimizer`:
  ``optimizer_model`` or the agent's model, through the plain ``/v1/chat/completions``) with the
  ``optimizer.temperature`` / ``optimizer.max_tokens`` of our arms (no call cache). Mapped from the same config:
  ``reflection_minibatch_size = gepa.minibatch_size``, ``use_merge = gepa.use_merge``, ``max_merge_invocations =
  gepa.max_merges``, ``perfect_score = gepa.perfect_score``, ``seed = gepa.seed``; everything else is gepa's default
  (Pareto candidate selection, its own reflection prompt showing every minibatch trace, so ``gepa.reflection_traces``
  has no counterpart; no evaluation cache). ``gepa.optimize`` is synchronous: it
  runs in a worker thread and the adapter submits its coroutines to this process's event loop. After it returns, the
  seed and the best candidate are run on the test tasks (``mode=test``) like in our arms.

Budgets are soft on both GEPA sides: ours starts no iteration once ``gepa.max_rollouts`` is reached, gepa's stops
before an iteration once ``total_num_evals >= max_metric_calls`` (one metric call = one task evaluated = one rollout
here; its seed validation run counts), so either may end a little above the budget. Rollouts of the final test runs
are counted apart.

At the end a table (arm | validation before -> after | test before -> after | rollouts (optimization + test) |
optimizer calls | wall seconds) is printed and written to ``OUT/table.md``; ``--table-only`` only reads the
existing ``OUT/<arm>/summary.json`` files and prints it.

Usage (from the repository root)::

    .venv/bin/python benchmarks/prompt_opt.py --overwrite                      # 3 arms, qwen2.5-coder-1.5b, budget 107
    .venv/bin/python benchmarks/prompt_opt.py --arms gepa,gepa-pypi --budget 80 --overwrite
    .venv/bin/python benchmarks/prompt_opt.py --table-only

    # smoke check: everything tiny
    .venv/bin/python benchmarks/prompt_opt.py --model smollm2-135m --budget 12 --test-size 2 \\
        --out runs/prompt-opt-bench-smoke --overwrite \\
        --set train_size=4 --set val_size=4 --set apo.rounds=1 --set apo.train_batch_size=2 \\
        --set optimizer.max_tokens=128 --set optimizer_model=null
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

DEFAULT_CONFIG = Path("examples/room_agent/config.yaml")
DEFAULT_OUT = Path("runs/prompt-opt-bench")
DEFAULT_BUDGET = 107
"""What the room config's APO settings spend at most: 19 + 2 x (6 + 2 x 19) rollouts."""
DEFAULT_MODEL = "qwen2.5-coder-1.5b"

ARMS = ("agentbolt-apo", "agentbolt-gepa", "gepa-pypi")
"""The arms, in their default order; ``--arms`` also takes the short names of :data:`ARM_ALIASES`."""
ARM_ALIASES = {"apo": "agentbolt-apo", "gepa": "agentbolt-gepa", "pypi": "gepa-pypi"}

TABLE_COLUMNS = (
    "arm",
    "val before -> after",
    "test before -> after",
    "rollouts (opt + test)",
    "optimizer calls",
    "wall s",
)

HIDDEN_INPUT_KEYS = ("task_id",)
"""Task keys left out of the inputs shown to gepa's reflection (besides reference keys, see :func:`task_request`)."""
REFERENCE_KEY_PREFIX = "expected"
"""Task keys starting with this hold the reference answer (``expected_choice``); the feedback tells it instead."""

T = TypeVar("T")


# --------------------------------------------------------------------------------------------------------------------
# Arms and their configs
# --------------------------------------------------------------------------------------------------------------------


def parse_arms(text: str) -> list[str]:
    """The arms named in a comma-separated list (short names allowed), in the order given, without repeats.

    Raises:
        ValueError: an unknown name or an empty list.
    """
    arms: list[str] = []
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        arm = ARM_ALIASES.get(name, name)
        if arm not in ARMS:
            raise ValueError(f"unknown arm {name!r}; use {', '.join(ARMS)} (or apo, gepa, pypi)")
        if arm not in arms:
            arms.append(arm)
    if not arms:
        raise ValueError("no arm given")
    return arms


def arm_overrides(
    arm: str, *, model: str, budget: int, out_dir: Path, overwrite: bool, user: Sequence[str]
) -> list[str]:
    """The ``key=value`` overrides of one arm's config, applied in order (a later one wins).

    Order: the benchmark's defaults (a per-arm optimizer cache in ``out_dir/optimizer_cache`` so no arm replays
    another run's optimizer replies; for ``agentbolt-gepa`` the budget as ``gepa.max_rollouts``), then the user's
    ``--set`` overrides, then what defines the arm (``algorithm``, ``model``, ``out_dir``, ``overwrite``).
    """
    defaults = [f"optimizer.cache_dir={out_dir / 'optimizer_cache'}"]
    if arm == "agentbolt-gepa":
        defaults.append(f"gepa.max_rollouts={budget}")
    algorithm = "apo" if arm == "agentbolt-apo" else "gepa"
    fixed = [f"algorithm={algorithm}", f"model={model}", f"out_dir={out_dir}", f"overwrite={str(overwrite).lower()}"]
    return [*defaults, *user, *fixed]


def apo_rollout_bound(
    rounds: int, *, beam_width: int, branch_factor: int, train_batch_size: int, n_train: int, n_val: int
) -> int:
    """The most rollouts APO can spend in ``rounds`` rounds: the seed's validation run, then per round every beam
    member (one in round 1, at most ``beam_width`` later) on the training batch and every one of its
    ``branch_factor`` edits on the validation batch (``n_val`` = the validation batch size)."""
    train_batch = min(train_batch_size, n_train)
    total = n_val
    for round_index in range(1, rounds + 1):
        members = 1 if round_index == 1 else beam_width
        total += members * train_batch + members * branch_factor * n_val
    return total


def apo_rounds_for_budget(
    budget: int, *, beam_width: int, branch_factor: int, train_batch_size: int, n_train: int, n_val: int
) -> int:
    """The most APO rounds whose :func:`apo_rollout_bound` stays within ``budget`` (at least 1)."""
    rounds = 1
    while (
        apo_rollout_bound(
            rounds + 1,
            beam_width=beam_width,
            branch_factor=branch_factor,
            train_batch_size=train_batch_size,
            n_train=n_train,
            n_val=n_val,
        )
        <= budget
    ):
        rounds += 1
    return rounds


def limited_tasks_module(name: str, test_size: int) -> str:
    """Register (in ``sys.modules``) a tasks module that is ``name`` with ``load_test_tasks()`` cut to its first
    ``test_size`` tasks, and return its module name (for ``PromptOptConfig.tasks``)."""
    from agentbolt.trainer.job_config import load_tasks_module

    base = load_tasks_module(name)
    shim_name = f"prompt_opt_bench_tasks_{name.replace('.', '_')}_test{test_size}"
    shim = types.ModuleType(shim_name, f"{name} with the first {test_size} test tasks (benchmarks/prompt_opt.py)")
    shim.load_train_tasks = base.load_train_tasks  # type: ignore[attr-defined]
    shim.load_val_sets = base.load_val_sets  # type: ignore[attr-defined]
    if callable(getattr(base, "load_test_tasks", None)):
        shim.load_test_tasks = lambda: list(base.load_test_tasks())[:test_size]  # type: ignore[attr-defined]
    sys.modules[shim_name] = shim
    return shim_name


# --------------------------------------------------------------------------------------------------------------------
# The gepa-pypi arm: adapter and reflection LM
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutRecord:
    """One gepa trajectory: the task as given and what the store gave back for it."""

    task: Mapping[str, Any]
    result: Any  # agentbolt.algorithms.apo.types.TaskResult


def task_request(task: Mapping[str, Any]) -> dict[str, Any]:
    """The task's request fields: every key but ``task_id`` and the reference keys (``expected_...``)."""
    return {
        key: value
        for key, value in task.items()
        if key not in HIDDEN_INPUT_KEYS and not key.startswith(REFERENCE_KEY_PREFIX)
    }


def render_conversation(result: Any, *, max_message_chars: int = 800, max_chars: int = 3000) -> str:
    """The rollout as text for gepa's reflection: one line per message (``[role] content | calls name(args)``, each cut
    to ``max_message_chars``), then the parsed answer; the whole cut to ``max_chars``."""
    trace = result.trace
    if trace is None:
        return "(no trace recorded)"
    lines: list[str] = []
    for message in trace.messages:
        parts = [str(message.get("content"))] if message.get("content") else []
        calls = message.get("tool_calls")
        if isinstance(calls, Sequence) and not isinstance(calls, str):
            for call in calls:
                function = call.get("function") if isinstance(call, Mapping) else None
                if isinstance(function, Mapping):
                    parts.append(f"calls {function.get('name')}({function.get('arguments')})")
        lines.append(_clip(f"[{message.get('role', '?')}] " + " | ".join(parts), max_message_chars))
    lines.append(f"Parsed answer: {trace.answer if trace.answer is not None else '(none)'}")
    return _clip("\n".join(lines), max_chars)


def reflective_record(record: RolloutRecord, *, max_chars: int = 3000) -> dict[str, Any]:
    """gepa's recommended record for one rollout: ``Inputs`` (the request fields), ``Generated Outputs`` (the
    conversation and the parsed answer), ``Feedback`` (the reward's feedback sentence, else the reward)."""
    result = record.result
    feedback = result.trace.feedback if result.trace is not None else None
    return {
        "Inputs": task_request(record.task),
        "Generated Outputs": render_conversation(result, max_chars=max_chars),
        "Feedback": feedback or f"reward {result.reward:.2f} (no feedback recorded)",
    }


@dataclass
class PublishedCandidate:
    """A gepa candidate the adapter published: its resources version, and when (gepa iteration) it first ran."""

    candidate: Any  # agentbolt.algorithms.apo.types.Candidate
    iteration: int


class StoreGEPAAdapter:
    """A ``gepa.GEPAAdapter`` whose ``evaluate`` runs each candidate through agentbolt's store.

    Called from gepa's thread; the store, server and runners live on ``loop``, so each step is a coroutine submitted
    with ``asyncio.run_coroutine_threadsafe(...).result()``. Each distinct candidate (prompt dict) is published once
    as a resources version; every task is a rollout (``mode=train`` for a batch of training tasks, else ``val``).

    Attributes:
        rollouts: task results received (one per rollout; equals gepa's metric calls).
        evaluate_calls: calls of :meth:`evaluate`.
        published: the published candidates in order, keyed by the canonical JSON of their prompts.
        iteration: gepa's current iteration (set by :meth:`on_iteration_start`, gepa's callback), 0 before the first.
    """

    def __init__(
        self,
        *,
        publisher: Any,
        evaluator: Any,
        loop: asyncio.AbstractEventLoop | None,
        train_task_ids: set[str],
        seed_prompts: Mapping[str, str],
        max_trace_chars: int = 3000,
    ) -> None:
        self.publisher = publisher
        self.evaluator = evaluator
        self.loop = loop
        self.train_task_ids = set(train_task_ids)
        self.seed_key = candidate_key(seed_prompts)
        self.max_trace_chars = max_trace_chars
        self.rollouts = 0
        self.evaluate_calls = 0
        self.iteration = 0
        self.published: dict[str, PublishedCandidate] = {}
        self.stopped = threading.Event()

    propose_new_texts = None
    """gepa reads ``adapter.propose_new_texts`` directly (``reflective_mutation.py``); ``None`` = use reflection_lm."""

    # gepa callback (duck-typed: gepa calls on_<event> of each object in ``callbacks`` that has it)
    def on_iteration_start(self, event: Mapping[str, Any]) -> None:
        self.iteration = int(event["iteration"])

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for it; gives up (``RuntimeError``) once :meth:`stop` is called, so an
        interrupted run does not leave gepa's thread waiting forever on a loop that is gone."""
        if self.loop is None:
            coroutine.close()
            raise RuntimeError("StoreGEPAAdapter has no event loop to run on")
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        while True:
            try:
                return future.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                if self.stopped.is_set():
                    future.cancel()
                    raise RuntimeError("the benchmark stopped while gepa was evaluating") from None

    def stop(self) -> None:
        """Make every later or pending :meth:`_run` give up (called when the arm is interrupted)."""
        self.stopped.set()

    def candidate_for(self, prompts: Mapping[str, str]) -> Any:
        """The published :class:`~agentbolt.algorithms.apo.types.Candidate` of ``prompts`` (published now if new)."""
        key = candidate_key(prompts)
        if key not in self.published:
            origin = "seed" if key == self.seed_key else "gepa"
            candidate = self._run(
                self.publisher.publish(
                    dict(prompts), origin=origin, round_index=self.iteration, extra_metadata={"gepa": "pypi"}
                )
            )
            self.published[key] = PublishedCandidate(candidate, self.iteration)
        return self.published[key].candidate

    def evaluate(self, batch: list[Mapping[str, Any]], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        """Run ``candidate`` on ``batch`` as rollouts; scores are the rewards, outputs the parsed answers, trajectories
        :class:`RolloutRecord` (always filled: they cost nothing more)."""
        from gepa import EvaluationBatch

        from agentbolt.types import RolloutMode

        published = self.candidate_for(candidate)
        ids = {str(task["task_id"]) for task in batch}
        mode = RolloutMode.TRAIN if ids and ids <= self.train_task_ids else RolloutMode.VAL
        results = self._run(self.evaluator(published, list(batch), mode=mode))
        self.evaluate_calls += 1
        self.rollouts += len(results)
        return EvaluationBatch(
            outputs=[
                {
                    "task_id": result.task_id,
                    "answer": result.trace.answer if result.trace is not None else None,
                    "reward": result.reward,
                    "rollout_id": result.rollout_id,
                    "candidate": published.candidate_id,
                }
                for result in results
            ],
            scores=[float(result.reward) for result in results],
            trajectories=[RolloutRecord(task, result) for task, result in zip(batch, results, strict=True)],
        )

    def make_reflective_dataset(
        self, candidate: dict[str, str], eval_batch: Any, components_to_update: list[str]
    ) -> dict[str, list[dict[str, Any]]]:
        """For each component to update, one :func:`reflective_record` per rollout of ``eval_batch`` (the same records
        for every component: each rollout used all of the candidate's prompts)."""
        records = [
            reflective_record(record, max_chars=self.max_trace_chars) for record in eval_batch.trajectories or []
        ]
        return {name: list(records) for name in components_to_update}


def candidate_key(prompts: Mapping[str, str]) -> str:
    """Canonical JSON of a prompt dict (sorted keys): one key per distinct candidate."""
    return json.dumps(dict(prompts), sort_keys=True, ensure_ascii=False)


class ReflectionLM:
    """gepa's ``reflection_lm``: a sync callable ``prompt -> reply`` over an OpenAI-compatible
    ``chat.completions.create`` (the embedded model's plain ``/v1/chat/completions``), counting its calls.

    Attributes:
        calls: requests sent.
    """

    def __init__(self, create: Callable[..., Any], *, model: str, temperature: float, max_tokens: int) -> None:
        self.create = create
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.calls = 0

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        self.calls += 1
        response = self.create(
            model=self.model, messages=messages, temperature=self.temperature, max_tokens=self.max_tokens
        )
        return (response.choices[0].message.content or "") if response.choices else ""


class FileLogger:
    """gepa's ``logger``: each message is printed (rich console) and appended to a file."""

    def __init__(self, path: Path, console: Any) -> None:
        self.path = path
        self.console = console

    def log(self, message: str) -> None:
        self.console.print(f"[dim]gepa:[/] {message}", markup=True, highlight=False)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(f"{message}\n")


async def run_gepa_pypi(config: Any, budget: int, console: Any) -> dict[str, Any]:
    """The ``gepa-pypi`` arm (see the module docstring); returns its summary, also written to
    ``config.out_dir/summary.json`` in the shape of :func:`~agentbolt.trainer.prompt_opt.run_prompt_optimization`'s.
    """
    import gepa
    from openai import OpenAI

    from agentbolt.algorithms.apo import CandidatePublisher, StoreEvaluator
    from agentbolt.algorithms.apo.types import task_id_of
    from agentbolt.trainer.local import fresh_db_path
    from agentbolt.trainer.prompt_opt import (
        agent_llm,
        check_job_inputs,
        job_optimizer,
        print_result,
        prompt_diff,
        serve_job,
        write_outputs,
    )
    from agentbolt.types import RolloutConfig, RolloutMode

    t_start = time.perf_counter()
    seed_prompts, train_tasks, val_tasks, test_tasks = check_job_inputs(config)
    db_path = fresh_db_path(config.out_dir, overwrite=config.overwrite)
    log_path = config.out_dir / "gepa_log.txt"
    log_path.unlink(missing_ok=True)
    console.print(
        f"[bold]gepa-pypi[/] {gepa_version()}: model={config.model} prompts={sorted(seed_prompts)} "
        f"train={len(train_tasks)} val={len(val_tasks)} test={len(test_tasks)} max_metric_calls={budget}"
    )

    async with AsyncExitStack() as stack:
        serving = await stack.enter_async_context(serve_job(config, db_path, console))
        backend = serving.backend
        llm = agent_llm(config, serving)
        publisher = CandidatePublisher(
            serving.store,
            algorithm="gepa-pypi",
            base_resources={"llm": llm},
            run_metadata={"job": "benchmarks/prompt_opt.py", "model": config.model},
        )
        evaluator = StoreEvaluator(
            serving.store,
            reward_name=config.reward_name,
            rollout_config=RolloutConfig(max_attempts=config.max_attempts, timeout_seconds=config.rollout_timeout_s),
            metadata={"algorithm": "gepa-pypi"},
        )
        adapter = StoreGEPAAdapter(
            publisher=publisher,
            evaluator=evaluator,
            loop=asyncio.get_running_loop(),
            train_task_ids={task_id_of(task) for task in train_tasks},
            seed_prompts=seed_prompts,
            max_trace_chars=config.gepa.max_trace_chars,
        )
        optimizer, optimizer_setup_s = await job_optimizer(config, serving, stack, console)
        client = OpenAI(
            base_url=optimizer.base_url,
            api_key=os.environ.get(optimizer.api_key_env, "agentbolt"),
            timeout=optimizer.timeout_s,
            max_retries=optimizer.max_retries,
        )
        reflection = ReflectionLM(
            client.chat.completions.create,
            model=str(optimizer.model),
            temperature=optimizer.temperature,
            max_tokens=optimizer.max_tokens,
        )
        progress = _IterationPrinter(console, adapter)
        t_opt = time.perf_counter()
        gepa_run = asyncio.to_thread(
            gepa.optimize,
            seed_candidate=dict(seed_prompts),
            trainset=train_tasks,
            valset=val_tasks,
            adapter=adapter,
            reflection_lm=reflection,
            max_metric_calls=budget,
            reflection_minibatch_size=config.gepa.minibatch_size,
            perfect_score=config.gepa.perfect_score,
            use_merge=config.gepa.use_merge,
            max_merge_invocations=config.gepa.max_merges,
            seed=config.gepa.seed,
            logger=FileLogger(log_path, console),
            callbacks=[adapter, progress],
        )
        try:
            result = await gepa_run
        except BaseException:
            adapter.stop()
            raise
        optimize_s = time.perf_counter() - t_opt
        optimization_rollouts = adapter.rollouts

        best_prompts = dict(result.best_candidate)
        # Both were evaluated by gepa, so published (candidate_for would deadlock here: it waits on this loop).
        seed = adapter.published[candidate_key(seed_prompts)].candidate
        best = adapter.published[candidate_key(best_prompts)].candidate
        test_before = test_after = None
        test_rollouts = 0
        t_test = time.perf_counter()
        if test_tasks:

            async def test_score(candidate: Any) -> float:
                results = await evaluator(candidate, test_tasks, mode=RolloutMode.TEST)
                return sum(r.reward for r in results) / len(results)

            if best.candidate_id == seed.candidate_id:
                test_before = test_after = await test_score(seed)
                test_rollouts = len(test_tasks)
            else:  # together, as in the agentbolt arms, so the two candidates' calls share the model's batches
                test_before, test_after = await asyncio.gather(test_score(seed), test_score(best))
                test_rollouts = 2 * len(test_tasks)
        test_s = time.perf_counter() - t_test
        generation = backend.stats

    candidates = gepa_candidate_rows(result, adapter, val_tasks)
    diff = prompt_diff(seed_prompts, best_prompts)
    summary: dict[str, Any] = {
        "algorithm": "gepa-pypi",
        "gepa_version": gepa_version(),
        "model": config.model,
        "optimizer_model": optimizer.model,
        "optimizer_base_url": optimizer.base_url if config.optimizer.base_url is not None else "embedded",
        "optimizer_embedded_model": config.optimizer_model if config.optimizer.base_url is None else None,
        "seed_candidate": seed.candidate_id,
        "best_candidate": best.candidate_id,
        "val_before": float(result.val_aggregate_scores[0]),
        "val_after": float(result.val_aggregate_scores[result.best_idx]),
        "n_val": len(val_tasks),
        "test_before": test_before,
        "test_after": test_after,
        "n_test": len(test_tasks),
        "rollouts": {"optimization": optimization_rollouts, "test": test_rollouts},
        "metric_calls": result.total_metric_calls,
        "num_full_val_evals": result.num_full_val_evals,
        "optimizer_calls": reflection.calls,
        "optimizer_cache_hits": 0,
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
        "candidates": candidates,
        "best_prompts": best_prompts,
        "seed_prompts": dict(seed_prompts),
        "config": json.loads(config.model_dump_json()),
    }
    write_outputs(config.out_dir, summary, diff)
    print_result(console, summary, diff)
    return summary


class _IterationPrinter:
    """gepa callback: one console line per iteration (accepted or not, metric calls and rollouts so far)."""

    def __init__(self, console: Any, adapter: StoreGEPAAdapter) -> None:
        self.console = console
        self.adapter = adapter

    def on_iteration_end(self, event: Mapping[str, Any]) -> None:
        state = event["state"]
        status = "accepted" if event["proposal_accepted"] else "no new candidate"
        self.console.print(
            f"gepa-pypi iteration {event['iteration']}: {status}; metric calls {state.total_num_evals}, "
            f"rollouts {self.adapter.rollouts}, candidates {len(state.program_candidates)}"
        )


def gepa_candidate_rows(result: Any, adapter: StoreGEPAAdapter, val_tasks: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Every candidate the adapter published, in publication order, as ``summary["candidates"]`` rows: the ones in
    gepa's pool (``result.candidates``) with their validation scores and parents, the others (failed their minibatch
    check, or a merge that did not hold up) ``accepted: false`` with no validation score."""
    pool_index = {candidate_key(prompts): index for index, prompts in enumerate(result.candidates)}
    ids_by_index = {
        index: adapter.published[key].candidate.candidate_id
        for key, index in pool_index.items()
        if key in adapter.published
    }
    val_ids = [str(task["task_id"]) for task in val_tasks]
    rows: list[dict[str, Any]] = []
    for key, published in adapter.published.items():
        candidate = published.candidate
        index = pool_index.get(key)
        if index is None:
            val_scores: dict[str, float] = {}
            parents: list[str] = []
            score = None
        else:
            val_scores = {val_ids[int(i)]: float(s) for i, s in result.val_subscores[index].items()}
            parents = [ids_by_index[p] for p in result.parents[index] if p is not None and p in ids_by_index]
            score = float(result.val_aggregate_scores[index])
        rows.append(
            {
                "candidate_id": candidate.candidate_id,
                "origin": candidate.origin,
                "round": published.iteration,
                "parents": parents,
                "accepted": index is not None,
                "gepa_index": index,
                "val_score": score,
                "val_scores": val_scores,
                "prompts": dict(candidate.prompts),
            }
        )
    return rows


def gepa_version() -> str:
    """The installed ``gepa`` package's version (``"not installed"`` without it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gepa")
    except PackageNotFoundError:
        return "not installed"


# --------------------------------------------------------------------------------------------------------------------
# Running the arms and the table
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class BenchOptions:
    """What the command line asked for (see :func:`parse_args`)."""

    arms: list[str]
    budget: int = DEFAULT_BUDGET
    model: str = DEFAULT_MODEL
    out: Path = DEFAULT_OUT
    config: Path = DEFAULT_CONFIG
    overrides: list[str] = field(default_factory=list)
    test_size: int | None = None
    fit_apo_rounds: bool = False
    overwrite: bool = False


def arm_config(arm: str, options: BenchOptions) -> tuple[Any, str]:
    """The :class:`~agentbolt.trainer.prompt_opt.PromptOptConfig` of one arm (overrides: :func:`arm_overrides`; then
    ``--test-size`` and ``--fit-apo-rounds``) and the tasks module it was given (before ``--test-size`` wrapped it)."""
    from agentbolt.trainer.job_config import load_job_config, load_tasks_module

    overrides = arm_overrides(
        arm,
        model=options.model,
        budget=options.budget,
        out_dir=options.out / arm,
        overwrite=options.overwrite,
        user=options.overrides,
    )
    config = load_job_config(options.config, overrides)
    tasks = config.tasks
    if options.test_size is not None:
        config = config.model_copy(update={"tasks": limited_tasks_module(config.tasks, options.test_size)})
    if arm == "agentbolt-apo" and options.fit_apo_rounds:
        tasks_mod = load_tasks_module(config.tasks)
        n_train = len(tasks_mod.load_train_tasks(size=config.train_size))
        n_val = len(next(iter(tasks_mod.load_val_sets(n_per_set=config.val_size).values()), []))
        apo = config.apo
        rounds = apo_rounds_for_budget(
            options.budget,
            beam_width=apo.beam_width,
            branch_factor=apo.branch_factor,
            train_batch_size=apo.train_batch_size,
            n_train=n_train,
            n_val=min(apo.val_batch_size or n_val, n_val),
        )
        config = config.model_copy(update={"apo": apo.model_copy(update={"rounds": rounds})})
    return config, tasks


async def run_arm(arm: str, options: BenchOptions, console: Any) -> dict[str, Any]:
    """Run one arm; its ``summary.json`` gets ``arm`` and ``benchmark`` (budget, tasks, test size) added."""
    from agentbolt.trainer.prompt_opt import run_prompt_optimization

    config, tasks = arm_config(arm, options)
    console.rule(f"[bold]{arm}")
    if arm == "gepa-pypi":
        summary = await run_gepa_pypi(config, options.budget, console)
    else:
        summary = await run_prompt_optimization(config, console)
    summary["arm"] = arm
    summary["benchmark"] = {
        "budget": options.budget,
        "config": str(options.config),
        "overrides": list(options.overrides),
        "tasks": tasks,
        "test_size": options.test_size,
        "fit_apo_rounds": options.fit_apo_rounds,
    }
    (config.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def load_summaries(out: Path, arms: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``arm -> summary`` for each arm with an ``out/<arm>/summary.json``."""
    summaries: dict[str, dict[str, Any]] = {}
    for arm in arms:
        path = out / arm / "summary.json"
        if path.is_file():
            summaries[arm] = json.loads(path.read_text())
    return summaries


def format_score(before: float | None, after: float | None, n: int | None) -> str:
    """``"0.316 -> 0.421 (n=19)"``; ``"-"`` when there is no score."""
    if before is None or after is None:
        return "-"
    suffix = f" (n={n})" if n else ""
    return f"{before:.3f} -> {after:.3f}{suffix}"


def table_row(arm: str, summary: Mapping[str, Any]) -> list[str]:
    """One table row (columns :data:`TABLE_COLUMNS`) from a summary of either shape."""
    rollouts = summary.get("rollouts") or {}
    optimization, test = rollouts.get("optimization", 0), rollouts.get("test", 0)
    calls = summary.get("optimizer_calls")
    hits = summary.get("optimizer_cache_hits") or 0
    calls_text = "-" if calls is None else (f"{calls} ({hits} cached)" if hits else str(calls))
    wall = summary.get("wall_seconds")
    return [
        arm,
        format_score(summary.get("val_before"), summary.get("val_after"), summary.get("n_val")),
        format_score(summary.get("test_before"), summary.get("test_after"), summary.get("n_test")),
        f"{optimization} + {test}",
        calls_text,
        "-" if wall is None else f"{wall:.0f}",
    ]


def markdown_table(summaries: Mapping[str, Mapping[str, Any]], *, title: str | None = None) -> str:
    """The comparison table as Markdown, one row per summary (in the mapping's order), columns padded to line up."""
    rows = [list(TABLE_COLUMNS)] + [table_row(arm, summary) for arm, summary in summaries.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)) + " |"

    lines = [line(rows[0]), "|" + "|".join("-" * (width + 2) for width in widths) + "|"]
    lines += [line(row) for row in rows[1:]]
    header = [f"{title}", ""] if title else []
    return "\n".join([*header, *lines]) + "\n"


def table_title(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """A line naming the agent model(s), optimizer model(s) and budget(s) of the summaries."""
    models = sorted({str(s.get("model")) for s in summaries.values()})
    optimizers = sorted({str(s.get("optimizer_model")) for s in summaries.values()} - {"None"})
    budgets = sorted({str((s.get("benchmark") or {}).get("budget")) for s in summaries.values()} - {"None"})
    text = f"Prompt optimization, room agent: model {', '.join(models) or '-'}"
    text += f", optimizer {', '.join(optimizers)}" if optimizers else ""
    return text + (f", rollout budget {', '.join(budgets)}" if budgets else "")


def write_table(out: Path, arms: Sequence[str]) -> str:
    """Read the arms' summaries under ``out``, write ``out/table.md`` and return the table ('' when none exists)."""
    summaries = load_summaries(out, arms)
    if not summaries:
        return ""
    table = markdown_table(summaries, title=table_title(summaries))
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table)
    return table


def parse_args(argv: Sequence[str] | None = None) -> tuple[BenchOptions, bool]:
    """The options and whether ``--table-only`` was given."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, in order (default {','.join(ARMS)})")
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="rollout budget of the GEPA arms")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="embedded model (agent and optimizer)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder; one subfolder per arm")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the prompt-optimization job file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting of the job file for every arm (repeatable), e.g. --set val_size=8",
    )
    parser.add_argument("--test-size", type=int, default=None, help="score on the first N test tasks only")
    parser.add_argument(
        "--fit-apo-rounds", action="store_true", help="set apo.rounds to the most rounds that fit in --budget"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace existing OUT/<arm>/store.db")
    parser.add_argument("--table-only", action="store_true", help="only print the table of existing summaries")
    args = parser.parse_args(argv)
    try:
        arms = parse_arms(args.arms)
    except ValueError as exc:
        parser.error(str(exc))
    if args.budget < 1:
        parser.error("--budget must be at least 1")
    if args.test_size is not None and args.test_size < 1:
        parser.error("--test-size must be at least 1")
    options = BenchOptions(
        arms=arms,
        budget=args.budget,
        model=args.model,
        out=args.out,
        config=args.config,
        overrides=list(args.overrides),
        test_size=args.test_size,
        fit_apo_rounds=args.fit_apo_rounds,
        overwrite=args.overwrite,
    )
    return options, bool(args.table_only)


async def run_arms(options: BenchOptions, console: Any) -> list[str]:
    """Run the arms one after the other on one event loop (clients an arm leaves behind are closed on a live loop);
    a failed arm is reported and the next one runs. Returns the failed arms."""
    import gc

    failed: list[str] = []
    for arm in options.arms:
        try:
            await run_arm(arm, options, console)
        except Exception:  # one failed arm must not lose the others' results
            console.print(f"[red]{arm} failed[/]")
            console.print(traceback.format_exc(), markup=False, highlight=False)
            failed.append(arm)
        gc.collect()
        await asyncio.sleep(0)
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    from rich.console import Console

    options, table_only = parse_args(argv)
    console = Console()
    failed: list[str] = []
    if not table_only:
        logging.basicConfig(level=logging.WARNING)
        failed = asyncio.run(run_arms(options, console))
        if failed:
            console.print(f"[red]failed arms: {', '.join(failed)}[/]")
    table = write_table(options.out, options.arms)
    if not table:
        console.print(f"no summary.json under {options.out}/<arm>/ for {', '.join(options.arms)}")
        return 1
    print(table)
    print(f"(written to {options.out / 'table.md'})")
    return 1 if failed else 0


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


if __name__ == "__main__":
    sys.exit(main())
