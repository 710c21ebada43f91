"""The RL loop: enqueue rollouts -> wait -> read them back -> the algorithm's batch -> update -> swap weights.

The trainer never calls the agent: it writes rollouts and resources into the store, runners execute them, and the
trainer reads the spans back. What a step trains on is the algorithm's part
(:class:`~agentbolt.adapter.lightning_rl.LightningRL`: selection, credit assignment, advantages, staleness, merging;
no I/O); this loop does the rest: enqueue, wait, the value head's estimates under ``gae``, the trained record, the
update, the weight swap, metrics, and the hooks a job checkpoints in. The policy update runs in a thread, so the
server (and the runners' heartbeats) stay live during it. When the backend serves a copy of the policy
(``sync_weights``), generation goes on during the update and only the weight swap pauses it, behind the gateway's
swap gate (:mod:`agentbolt.server.gateway.swap`).

**Asynchronous training** (``GRPOConfig.async_rollouts = k > 0``, :meth:`RLTrainer.train`): the rollouts of the next
``k`` steps are enqueued before the current step's update, so the runners keep generating while the trainer
updates. A step's batch then holds calls made by weights up to ``k`` versions old; the staleness bound
(``max_staleness``, ``stale_policy``) drops or reweights older ones (:mod:`agentbolt.adapter.staleness`). This
is one-step (``k = 1``) or k-step off-policy training, as in AReaL (arXiv:2505.24298) and verl's one-step-off-policy
recipe; ``tis_cap`` of the torch backend corrects the remaining off-policyness by truncated importance sampling.

Multi-agent systems: with ``agent_match`` (a regular expression over agent names, set with ``agentbolt.agent(name)``
on the agent side) only the LLM calls of matching agents become transitions of the trajectories, hence training
samples; the other agents' calls stay recorded in the store but are left out of the batch. Credit assignment and
advantages see only the kept transitions; the rollout's reward is the whole system's. Each :class:`StepResult`
counts kept and dropped transitions per agent name.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import math
import random
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from agentbolt.adapter.lightning_rl import FinishedRollout, LightningRL
from agentbolt.adapter.samples import TrainingSample
from agentbolt.adapter.staleness import StalenessReport
from agentbolt.adapter.trajectory import accuracy_reward, has_named_reward, is_correct
from agentbolt.algorithms.rl.ppo_gae import rollout_gae
from agentbolt.config import GRPOConfig
from agentbolt.errors import ConfigError
from agentbolt.inference.openmp_threads import run_then_release
from agentbolt.server.gateway.swap import WeightSwapGate
from agentbolt.store.base import EnqueueRequest, LightningStore
from agentbolt.trainer.memory import release_freed_memory
from agentbolt.trainer.trained_record import record_trained_batch
from agentbolt.types import (
    LLM,
    Metric,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

ProgressCallback = Callable[[int, int], None]
"""Called with (finished, total) while rollouts run."""

AfterStep = Callable[["StepResult"], Awaitable[None]]
"""Awaited after each step of :meth:`RLTrainer.train`, before the next step's rollouts are enqueued (e.g. to write a
checkpoint)."""


class PolicyUpdater(Protocol):
    """What the loop needs from a trainer backend: one optimizer step on a batch of samples."""

    def train_step(self, samples: list[TrainingSample]) -> dict[str, float]: ...


class ValueHeadUpdater(PolicyUpdater, Protocol):
    """A trainer backend with a value head, as the ``gae`` estimator needs (PPO)."""

    def values(self, samples: list[TrainingSample]) -> list[list[float]]: ...


class ServingBackend(Protocol):
    """What the loop needs from the inference backend: pause during updates and a weights version."""

    model_name: str
    model_version: str

    def paused(self) -> Any: ...

    def set_model_version(self, version: str) -> None: ...


def task_identity(task: dict[str, Any]) -> str:
    """A task's ``task_id`` as text, or for a task without one ``task-`` and 12 hex digits of a SHA-256 of its JSON
    (sorted keys): the same task gets the same id in every step and run, and rollouts of one task in a step form one
    GRPO group either way (the id was the task's position within its step, which repeated across steps)."""
    given = task.get("task_id")
    if given is not None:
        return str(given)
    text = json.dumps(task, sort_keys=True, default=str, ensure_ascii=False)
    return "task-" + hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class PendingStep:
    """A step whose rollouts are enqueued (:meth:`RLTrainer.start_step`).

    Attributes:
        train_step: the step number.
        rollout_ids: its rollouts, ``group_size`` per task.
        model_version: the weights version current when they were enqueued.
        enqueued_at: ``time.perf_counter()`` when the step started.
    """

    train_step: int
    rollout_ids: list[str]
    model_version: str
    enqueued_at: float


@dataclass
class StepResult:
    """Figures of one training step. Seconds are wall time.

    Attributes:
        train_step: the step number.
        rewards: final rewards of the trained rollouts.
        n_rollouts: rollouts run.
        n_failed: rollouts not trained: failed (not for infrastructure reasons), never ran, unscored, or without any
            trainable call at all (rules in :mod:`agentbolt.adapter.batch`).
        n_transitions: transitions in the batch (after ``agent_match``).
        rollout_s / update_s: wall seconds of the rollouts and of the policy update.
        update_stats: what the trainer backend reported.
        n_unmatched: succeeded, scored rollouts left out because none of their calls matched ``agent_match``.
        kept_by_agent: transitions in the batch per agent name (:func:`~agentbolt.adapter.lightning_rl.count_by_agent`).
        dropped_by_agent: trainable transitions left out by ``agent_match``, per agent name, over every succeeded,
            scored rollout of the step (those in ``n_unmatched`` included); with ``kept_by_agent`` they add up to all
            the trainable calls of those rollouts.
        batch_span_ids: the LLM spans whose calls are in the batch, in trajectory order.
        infra_failures: rollouts excluded because their last attempt failed for infrastructure reasons (timeout,
            unresponsive, gateway/backend error), by reason; never trained, never scored 0, not in ``n_failed``.
        n_samples: training samples in the batch (after merging).
        tokens_unmerged / tokens_merged: the batch's tokens with one sample per transition, and as trained after
            merging (:class:`~agentbolt.algorithms.rl.samples.SampleBatch`); the difference is what merging saved.
        wait_s: wall seconds the trainer waited for the step's rollouts (``rollout_s`` counts from their enqueue,
            which under asynchronous training is during an earlier step).
        staleness: what the staleness bound did (asynchronous training only; ``None`` otherwise).
        causes / cause_details: rollouts not trained (failed and infrastructure) by cause
            (:mod:`agentbolt.adapter.causes`), and the first detail seen per cause.
        n_truncated / n_calls: trained calls cut at ``max_tokens``, and all trained calls.
        untrainable_calls: answered calls of the trained rollouts recorded as untrainable, by reason (left out).
    """

    train_step: int
    rewards: list[float]
    n_rollouts: int
    n_failed: int
    n_transitions: int
    rollout_s: float
    update_s: float
    update_stats: dict[str, float] = field(default_factory=dict)
    n_unmatched: int = 0
    kept_by_agent: dict[str, int] = field(default_factory=dict)
    dropped_by_agent: dict[str, int] = field(default_factory=dict)
    batch_span_ids: list[str] = field(default_factory=list)
    infra_failures: dict[str, int] = field(default_factory=dict)
    n_samples: int = 0
    tokens_unmerged: int = 0
    tokens_merged: int = 0
    wait_s: float = 0.0
    staleness: StalenessReport | None = None
    causes: dict[str, int] = field(default_factory=dict)
    cause_details: dict[str, str] = field(default_factory=dict)
    n_truncated: int = 0
    n_calls: int = 0
    untrainable_calls: dict[str, int] = field(default_factory=dict)

    @property
    def n_infra_failed(self) -> int:
        """Rollouts excluded for infrastructure failures."""
        return sum(self.infra_failures.values())

    @property
    def n_dropped(self) -> int:
        """Transitions left out by ``agent_match``."""
        return sum(self.dropped_by_agent.values())

    @property
    def reward_mean(self) -> float | None:
        """Mean reward of the step's scored rollouts; ``None`` when none was scored (not a reward of 0)."""
        return statistics.fmean(self.rewards) if self.rewards else None

    @property
    def reward_std(self) -> float | None:
        """Population standard deviation of those rewards (0.0 for one); ``None`` when none was scored."""
        if not self.rewards:
            return None
        return statistics.pstdev(self.rewards) if len(self.rewards) > 1 else 0.0


class RLTrainer:
    """GRPO over the store.

    Args:
        store: the store the runners and gateway use.
        backend: the inference backend serving the policy (paused during updates).
        updater: the trainer backend that owns the policy's trainable weights; ``None`` for a trainer that only
            evaluates (:meth:`evaluate`; ``agentbolt eval --checkpoint``).
        config: run settings.
        gateway_url: root URL of the server, put into the ``LLM`` resource.
        sync_weights: called after each update, with the backend paused, to publish the new weights to the
            serving model (e.g. merged LoRA weights, see :mod:`agentbolt.algorithms.rl.weight_sync`). ``None``
            when the backend serves the trained module itself.
        publish_weights: awaited after ``sync_weights`` (with the backend paused) with the new version, to hand the
            new weights to an engine in another process (a token engine's :meth:`load_adapter
            <agentbolt.inference.token_engines.TokenEngineBackend.load_adapter>`); ``None``: nothing more to do.
            Either callable means the backend serves a copy, so rollouts may go on during the update.
        agent_match: regular expression searched in agent names (rules in :mod:`agentbolt.adapter.agents`): only the
            calls of matching agents become training samples; ``None`` trains every call. A call without an agent
            name never matches a pattern. ``"writer"`` also selects ``"sql_writer"``; anchor it (``"^writer$"``) to
            select one name exactly.
        swap_gate: the server's gate that holds gateway calls during a weight swap (``None``: the backend's
            ``paused()`` alone; calls queue in the backend).

    Attributes:
        versions: the weights versions the trainer has served, oldest first (the last is the current one).

    Raises:
        ConfigError: ``agent_match`` is not a valid regular expression.
    """

    def __init__(
        self,
        store: LightningStore,
        backend: ServingBackend,
        updater: PolicyUpdater | None,
        config: GRPOConfig,
        *,
        gateway_url: str,
        sync_weights: Callable[[], object] | None = None,
        agent_match: str | None = None,
        swap_gate: WeightSwapGate | None = None,
        publish_weights: Callable[[str], Awaitable[object]] | None = None,
    ) -> None:
        self.algorithm = LightningRL(config, agent_match=agent_match)
        self.swap_gate = swap_gate
        self.versions: list[str] = [backend.model_version]
        self.last_train_step = 0  # the last finished step: the train_step of evaluate()'s val_accuracy metrics
        self.agent_match = agent_match
        self.store = store
        self.sync_weights = sync_weights
        self.publish_weights = publish_weights
        self.backend = backend
        self._throughput_mark = self._throughput()
        self.updater = updater
        self.config = config
        self.gateway_url = gateway_url
        if self.algorithm.needs_values:
            self._value_head()
        self.rng = random.Random(config.seed)
        self.metric_buffer: list[Metric] | None = None
        """``None``: metrics are written at once. A list: they are kept here until :meth:`flush_metrics`, so a job
        that writes checkpoints records a step's metrics only once its checkpoint exists (a resumed run then never
        records a step twice)."""
        self.checkpoint_paths: dict[str, str] = {}
        """Weights version -> the checkpoint folder holding those weights; :meth:`publish_resources` names it in the
        resources metadata, so every rollout leads to the exact weights that produced it."""
        self._sampler_states: dict[int, Any] = {}
        self._update_executor: ThreadPoolExecutor | None = None
        self.metric_listeners: list[Callable[[Sequence[Metric]], None]] = []
        """Called with every batch of metrics as it is recorded (e.g. experiment trackers); must not raise."""
        self.accuracy_reward_missing: list[str] = []
        """The labels of the evaluations (:meth:`evaluate`) in which ``accuracy_reward_name`` was set and no rollout
        recorded a reward of that name."""

    async def on_update_thread(self, function: Callable[..., T], *args: Any) -> T:
        """Run ``function(*args)`` on the trainer's one update thread and return its result.

        Every step that touches the policy's tensors (the update, value estimates, the weight sync, a checkpoint's
        save) runs on this same thread. The update allocates and frees gigabytes of activations each step; glibc
        gives each thread its own malloc arena, so when these ran on whichever thread of the default pool was
        free, each thread's arena kept its own freed blocks and the process grew step after step (measured,
        SmolLM2-135M, 5 steps: peak RSS 4.8, 8.1, 8.7, 8.9, 9.0 GB on the pool; 4.6, 5.1, 5.3, 5.6 GB with
        ``MALLOC_ARENA_MAX=2``; Qwen2.5-0.5B reached 21 GB at step 3 and was killed by the OOM killer at step 4).
        After each update the freed heap pages go back to the system
        (:func:`~agentbolt.trainer.memory.release_freed_memory`). After each call the thread's OpenMP workers end
        (:func:`~agentbolt.inference.openmp_threads.release_openmp_threads`), so the generation thread's parallel
        regions keep their full spinning.
        """
        if self._update_executor is None:
            self._update_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentbolt-update")
        return await asyncio.get_running_loop().run_in_executor(
            self._update_executor, functools.partial(run_then_release, function, *args)
        )

    def close(self) -> None:
        """Stop the update thread (after the last step; waits for nothing: no work is left by then)."""
        if self._update_executor is not None:
            self._update_executor.shutdown(wait=False)
            self._update_executor = None

    async def record_metrics(self, metrics: Sequence[Metric]) -> None:
        """Write ``metrics`` to the store, or keep them in :attr:`metric_buffer` when it is a list; either way hand
        them to every :attr:`metric_listeners` at once."""
        for listener in self.metric_listeners:
            listener(metrics)
        if self.metric_buffer is None:
            await self.store.add_metrics(metrics)
        else:
            self.metric_buffer.extend(metrics)

    async def flush_metrics(self) -> list[Metric]:
        """Write the kept metrics (:attr:`metric_buffer`) to the store and empty the buffer; return what was written."""
        if not self.metric_buffer:
            return []
        flushed, self.metric_buffer[:] = list(self.metric_buffer), []
        await self.store.add_metrics(flushed)
        return flushed

    def sampler_state_before(self, train_step: int) -> Any:
        """The task sampler's RNG state before the tasks of ``train_step`` were drawn (``random.Random.getstate()``);
        the current state when that step has not been drawn yet. A checkpoint after step ``N`` keeps the state
        before step ``N + 1``, so a resumed run draws the same tasks, even when asynchronous training had drawn
        later steps already."""
        return self._sampler_states.get(train_step, self.rng.getstate())

    def state_dict(self, train_step: int) -> dict[str, Any]:
        """The loop's own state after ``train_step`` (JSON-serializable): the step, the served weights versions
        (the staleness ledger), the version -> checkpoint map and the task sampler's position.

        Restored by :meth:`load_state_dict`.
        """
        version, internal, gauss = self.sampler_state_before(train_step + 1)
        return {
            "train_step": train_step,
            "versions": list(self.versions),
            "checkpoint_paths": dict(self.checkpoint_paths),
            "sampler_state": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned: the next step is ``state["train_step"] + 1``. The serving
        backend's weights version becomes the last served version."""
        version, internal, gauss = state["sampler_state"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.versions = list(state["versions"])
        self.checkpoint_paths = dict(state.get("checkpoint_paths", {}))
        self.last_train_step = int(state["train_step"])
        self.backend.set_model_version(self.versions[-1])
        self._sampler_states = {}

    def llm_resource(self, temperature: float) -> LLM:
        """The ``llm`` resource of this trainer's versions: the gateway and served model, sampling at
        ``temperature`` with top_p 1.0 and ``max_tokens``, enforced at the gateway
        (:mod:`agentbolt.server.gateway.sampling`): the update's logprobs assume these settings whatever the agent
        passes."""
        return LLM(
            endpoint=self.gateway_url,
            model=self.backend.model_name,
            sampling_parameters={"temperature": temperature, "top_p": 1.0, "max_tokens": self.config.max_tokens},
            sampling_enforced=True,
        )

    async def publish_resources(self, *, temperature: float, purpose: str) -> str:
        """Write a resources version pointing at the gateway with the current weights; return its id."""
        llm = self.llm_resource(temperature)
        version = self.backend.model_version
        metadata: dict[str, Any] = {"model_version": version, "purpose": purpose}
        if version in self.checkpoint_paths:
            metadata["checkpoint"] = self.checkpoint_paths[version]
        update = await self.store.add_resources({"llm": llm}, metadata=metadata)
        return update.resources_id

    async def run_rollouts(
        self,
        tasks: Sequence[dict[str, Any]],
        *,
        mode: RolloutMode,
        resources_id: str,
        repeats: int = 1,
        on_progress: ProgressCallback | None = None,
        metadata: dict[str, Any] | None = None,
        on_enqueued: Callable[[], object] | None = None,
    ) -> list[Rollout]:
        """Enqueue every task ``repeats`` times (then call ``on_enqueued``) and wait until all are terminal."""
        ids = await self._enqueue(tasks, mode, resources_id, repeats=repeats, metadata=metadata)
        if on_enqueued is not None:
            on_enqueued()
        return await self._wait_all(ids, on_progress)

    async def _enqueue(
        self,
        tasks: Sequence[dict[str, Any]],
        mode: RolloutMode,
        resources_id: str,
        *,
        repeats: int,
        metadata: dict[str, Any] | None = None,
    ) -> list[str]:
        """Enqueue every task ``repeats`` times under ``resources_id`` with the run's attempt settings; return the
        rollout ids (metadata: :func:`task_identity` as ``task_id``, and ``metadata``)."""
        cfg = RolloutConfig(
            max_attempts=self.config.max_attempts,
            timeout_seconds=self.config.rollout_timeout_s,
            unresponsive_seconds=self.config.rollout_unresponsive_s,
        )
        requests = [
            EnqueueRequest(
                input=task,
                mode=mode,
                resources_id=resources_id,
                config=cfg,
                metadata={"task_id": task_identity(task), **(metadata or {})},
            )
            for task in tasks
            for _ in range(repeats)
        ]
        return [r.rollout_id for r in await self.store.enqueue_many(requests)]

    async def _wait_all(self, ids: list[str], on_progress: ProgressCallback | None) -> list[Rollout]:
        """Wait until every rollout of ``ids`` is terminal, reporting ``(finished, total)`` each second."""
        while True:
            done = await self.store.wait_for_rollouts(ids, timeout_s=1.0)
            if on_progress is not None:
                on_progress(len(done), len(ids))
            if len(done) == len(ids):
                return done

    async def accuracy_of(self, rollout: Rollout) -> float:
        """1.0 when the rollout succeeded and its accuracy reward reaches ``success_threshold``, else 0.0.

        The accuracy reward is the reward named ``accuracy_reward_name`` when the attempt recorded one, else its
        final reward (:func:`agentbolt.adapter.trajectory.accuracy_reward`); a success means at least
        ``success_threshold`` (:func:`agentbolt.adapter.trajectory.is_correct`), the rule prompt optimization's
        evaluation uses too.
        """
        score, _ = await self._score(rollout)
        return score

    async def _score(self, rollout: Rollout) -> tuple[float, bool]:
        """:meth:`accuracy_of` and whether the rollout recorded the reward named ``accuracy_reward_name``
        (:func:`agentbolt.adapter.trajectory.has_named_reward`)."""
        spans = await self.store.query_spans(rollout.rollout_id)
        name = self.config.accuracy_reward_name
        named = has_named_reward(spans, name)
        if rollout.status is not RolloutStatus.SUCCEEDED:
            return 0.0, named
        value = accuracy_reward(spans, name, rollout.final_reward)
        return (1.0 if is_correct(value, self.config.success_threshold) else 0.0), named

    async def evaluate(
        self,
        val_sets: dict[str, list[dict[str, Any]]],
        *,
        on_progress: ProgressCallback | None = None,
        label: str = "eval",
        on_enqueued: Callable[[], object] | None = None,
    ) -> dict[str, float]:
        """Run every validation task once (greedy by default); return accuracy per set, in [0, 1].
        ``on_enqueued`` is called once its rollouts are in the queue.

        Also stores each as metric ``val_accuracy/<set name>`` at ``train_step`` = the last finished step (0 before
        the first). When ``accuracy_reward_name`` is set and not one of the evaluation's rollouts recorded a reward
        of that name (every rollout was then scored by its final reward), a warning says so and ``label`` is added
        to :attr:`accuracy_reward_missing`. Rollouts that did not succeed count as wrong, and a warning says how many
        per set (an accuracy of 0% from an agent that raises is not a score of the model).
        """
        resources_id = await self.publish_resources(temperature=self.config.eval_temperature, purpose=label)
        flat = [(name, task) for name, tasks in val_sets.items() for task in tasks]
        rollouts = await self.run_rollouts(
            [task for _, task in flat],
            mode=RolloutMode.VAL,
            resources_id=resources_id,
            on_progress=on_progress,
            metadata={"eval": label},
            on_enqueued=on_enqueued,
        )
        by_set: dict[str, list[float]] = {name: [] for name in val_sets}
        failed: dict[str, int] = {}
        any_named = False
        for (name, _), rollout in zip(flat, rollouts, strict=True):
            score, named = await self._score(rollout)
            by_set[name].append(score)
            any_named = any_named or named
            if rollout.status is not RolloutStatus.SUCCEEDED:
                failed[name] = failed.get(name, 0) + 1
        if failed:
            logger.warning(
                "evaluation %r: %d of %d validation rollouts did not succeed and count as wrong (%s); "
                "`agentbolt rollouts --store STORE --mode val --status failed,cancelled` lists them with their cause",
                label,
                sum(failed.values()),
                len(rollouts),
                ", ".join(f"{name}: {n} of {len(by_set[name])}" for name, n in failed.items()),
            )
        if rollouts and not any_named:
            self.accuracy_reward_missing.append(label)
            logger.warning(
                "evaluation %r: no validation rollout recorded a reward named %r (grpo.accuracy_reward_name), so "
                "each was scored by its final reward; emit_reward(value, name=%r) in the agent, or set "
                "grpo.accuracy_reward_name to null to score the final reward",
                label,
                self.config.accuracy_reward_name,
                self.config.accuracy_reward_name,
            )
        accuracy = {name: (statistics.fmean(v) if v else 0.0) for name, v in by_set.items()}
        now = time.time()
        await self.record_metrics(
            [
                Metric(name=f"val_accuracy/{name}", train_step=self.last_train_step, value=v, time=now)
                for name, v in accuracy.items()
            ]
        )
        return accuracy

    def sample_tasks(self, tasks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Draw ``tasks_per_step`` distinct tasks (with the trainer's seeded RNG)."""
        k = min(self.config.tasks_per_step, len(tasks))
        return self.rng.sample(list(tasks), k)

    async def start_step(self, train_step: int, tasks: Sequence[dict[str, Any]]) -> PendingStep:
        """Publish resources with the current weights and enqueue ``group_size`` rollouts per task; return at once."""
        t0 = time.perf_counter()
        resources_id = await self.publish_resources(temperature=self.config.temperature, purpose="train")
        ids = await self._enqueue(
            tasks, RolloutMode.TRAIN, resources_id, repeats=self.config.group_size, metadata={"train_step": train_step}
        )
        return PendingStep(train_step, ids, self.versions[-1], t0)

    async def finish_step(
        self,
        pending: PendingStep,
        *,
        on_rollout_progress: ProgressCallback | None = None,
        update_after: Awaitable[object] | None = None,
    ) -> StepResult:
        """Wait for a step's rollouts, build its batch, update the policy and swap the serving weights.

        Under asynchronous training (``async_rollouts > 0``) the staleness bound applies to the batch
        (:mod:`agentbolt.adapter.staleness`), and the update runs while other steps' rollouts go on: only the
        weight swap holds the gateway's calls (:meth:`swap_weights`). ``update_after``: awaited after the rollouts
        and before the update (its exception ends the step), e.g. an evaluation of the same weights running
        alongside the rollouts; the wait counts in ``wait_s``.
        """
        t_wait = time.perf_counter()
        rollouts = await self._wait_all(pending.rollout_ids, on_rollout_progress)
        if update_after is not None:
            await update_after
        wait_s = time.perf_counter() - t_wait
        rollout_s = time.perf_counter() - pending.enqueued_at
        train_step = pending.train_step

        finished: list[FinishedRollout] = []
        for rollout in rollouts:
            attempts = await self.store.query_attempts(rollout.rollout_id)
            if not attempts:
                finished.append((rollout, None, []))
                continue
            last = attempts[-1]
            finished.append((rollout, last, list(await self.store.query_spans(rollout.rollout_id, last.attempt_id))))
        batch = self.algorithm.batch(finished, versions=self.versions)
        selection = batch.selection
        if selection.infra_failures:
            logger.warning(
                "step %d: %d rollouts excluded for infrastructure failures (not trained, not scored 0): %s",
                train_step,
                selection.n_infra_failed,
                selection.infra_failures,
            )
        gae_s = 0.0
        if self.algorithm.needs_values and batch.samples:
            # PPO with a value head: V(s) of every trained token under the pre-update weights, then GAE per rollout.
            t_gae = time.perf_counter()
            values = await self.on_update_thread(self._value_head().values, batch.samples)
            batch.samples = rollout_gae(batch.samples, values, gamma=self.config.gae_gamma, lam=self.config.gae_lambda)
            gae_s = time.perf_counter() - t_gae

        # What this update trains on goes to the store (shown by the dashboard and `agentbolt export --kind rl`).
        await record_trained_batch(
            self.store, train_step, batch.samples, batch.trajectories, config=self.config, staleness=batch.staleness
        )

        t1 = time.perf_counter()
        if not self.serves_copy:  # the backend serves the trained module itself: no generation during the update
            stats = await self.on_update_thread(self._update_paused, batch.samples)
        else:
            stats = dict(await self.on_update_thread(self._updater().train_step, batch.samples))
        # An update that did not step (no samples, every advantage 0, a non-finite gradient) left the weights as they
        # were: the serving copy is already current, so nothing is published (a llama.cpp restart costs seconds).
        swap_s = await self.swap_weights(f"step-{train_step}", changed=stats.get("stepped", 1.0) != 0.0)
        await self.on_update_thread(release_freed_memory)  # the update's activations, back to the system
        if self.serves_copy:
            stats["weight_sync_s"] = swap_s
        if gae_s:
            stats["values_s"] = gae_s
        update_s = time.perf_counter() - t1

        result = StepResult(
            train_step=train_step,
            rewards=batch.rewards,
            n_rollouts=len(rollouts),
            n_failed=selection.n_failed,
            n_transitions=batch.n_transitions,
            rollout_s=rollout_s,
            update_s=update_s,
            update_stats=stats,
            n_unmatched=selection.n_unmatched,
            kept_by_agent=batch.kept_by_agent,
            dropped_by_agent=batch.dropped_by_agent,
            batch_span_ids=batch.batch_span_ids,
            infra_failures=selection.infra_failures,
            n_samples=len(batch.samples),
            tokens_unmerged=batch.step_batch.batch.tokens_unmerged,
            tokens_merged=batch.step_batch.batch.tokens_merged,
            wait_s=wait_s,
            staleness=batch.step_batch.staleness,
            causes=selection.causes,
            cause_details=selection.cause_details,
            n_truncated=selection.n_truncated,
            untrainable_calls=dict(selection.untrainable_calls),
            n_calls=selection.n_calls,
        )
        if self.agent_match is not None:
            logger.info(
                "step %d: agent_match %r kept %s, dropped %s transitions; %d rollouts without a matching call",
                train_step,
                self.agent_match,
                result.kept_by_agent,
                result.dropped_by_agent,
                selection.n_unmatched,
            )
        metrics = self._metrics(result)
        tokens_per_s = self._tokens_per_s_since_last()
        if tokens_per_s is not None:
            metrics.append(Metric(name="tokens_per_s", train_step=train_step, value=tokens_per_s, time=time.time()))
        await self.record_metrics(metrics)
        self.last_train_step = train_step
        return result

    def _throughput(self) -> tuple[int, float] | None:
        """``(generated_tokens, generation_s)`` of the backend's counters, or ``None`` when it keeps none."""
        stats = getattr(self.backend, "stats", None)
        tokens, seconds = getattr(stats, "generated_tokens", None), getattr(stats, "generation_s", None)
        if isinstance(tokens, int) and isinstance(seconds, (int, float)):
            return tokens, float(seconds)
        return None

    def _tokens_per_s_since_last(self) -> float | None:
        """Generated tokens per second of generation time since the previous call (``None``: no counters, or no
        generation in between)."""
        now, before = self._throughput(), self._throughput_mark
        self._throughput_mark = now
        if now is None or before is None or now[1] <= before[1]:
            return None
        return (now[0] - before[0]) / (now[1] - before[1])

    async def train_step(
        self,
        train_step: int,
        tasks: Sequence[dict[str, Any]],
        *,
        on_rollout_progress: ProgressCallback | None = None,
    ) -> StepResult:
        """One synchronous step: ``group_size`` rollouts per task, the algorithm's batch (:meth:`LightningRL.batch`),
        one update, the weight swap."""
        pending = await self.start_step(train_step, tasks)
        return await self.finish_step(pending, on_rollout_progress=on_rollout_progress)

    async def train(
        self,
        tasks: Sequence[dict[str, Any]],
        *,
        steps: int | None = None,
        first_step: int = 1,
        on_step_start: Callable[[int, int], ProgressCallback | None] | None = None,
        on_step_end: Callable[[StepResult], None] | None = None,
        after_step: AfterStep | None = None,
        keep_going: Callable[[int], bool] | None = None,
        first_update_after: Awaitable[object] | None = None,
    ) -> list[StepResult]:
        """Run training steps ``first_step`` .. ``steps`` (default ``config.steps``) on tasks drawn from ``tasks``.

        With ``config.async_rollouts = k > 0`` the rollouts of the next ``k`` steps are enqueued ahead, so runners
        keep generating while the trainer updates: step ``s`` trains on rollouts that were enqueued when the
        weights were ``k`` versions older (the staleness bound then drops or reweights calls made by weights older
        than ``max_staleness``). With ``k = 0`` each step waits for its own rollouts and they wait for the update
        (synchronous, on-policy).

        Args:
            tasks: the training tasks; each step draws ``tasks_per_step`` of them (:meth:`sample_tasks`).
            steps: the last step; ``None``: ``config.steps``.
            first_step: the first step (a resumed run starts after its checkpoint's step, with the loop state
                restored by :meth:`load_state_dict`).
            on_step_start: called with ``(step, number of rollouts)`` when the trainer starts waiting for a step's
                rollouts; may return a progress callback for them.
            on_step_end: called with each step's result.
            after_step: awaited with each step's result after ``on_step_end``, before any later step is enqueued
                (steps enqueued ahead by asynchronous training excepted); a checkpoint is written there.
            keep_going: called with a step number before its rollouts are enqueued; ``False`` enqueues no more steps
                (those already enqueued finish), e.g. to stop at a time budget.
            first_update_after: awaited before the first update of this call (after its rollouts): the job's
                evaluation before training runs alongside the first step's rollouts, on the same weights, and the
                weights change only once it is done.

        Returns:
            The results of the steps run here, in order.
        """
        n_steps = self.config.steps if steps is None else steps
        ahead = self.config.async_rollouts
        if ahead > 0 and not self.serves_copy:
            raise ConfigError(
                "async_rollouts > 0 needs a serving copy of the model (sync_weights): the backend serves the trained "
                "module itself, so it cannot generate while the update runs; set async_rollouts: 0"
            )
        queued: deque[PendingStep] = deque()
        next_step = first_step
        results: list[StepResult] = []
        while True:
            while next_step <= n_steps and len(queued) <= ahead:
                if keep_going is not None and not keep_going(next_step):
                    n_steps = next_step - 1
                    break
                self._sampler_states[next_step] = self.rng.getstate()
                queued.append(await self.start_step(next_step, self.sample_tasks(tasks)))
                next_step += 1
            if not queued:
                return results
            pending = queued.popleft()
            progress = None
            if on_step_start is not None:
                progress = on_step_start(pending.train_step, len(pending.rollout_ids))
            result = await self.finish_step(pending, on_rollout_progress=progress, update_after=first_update_after)
            first_update_after = None
            results.append(result)
            if on_step_end is not None:
                on_step_end(result)
            if after_step is not None:
                await after_step(result)
            self._sampler_states.pop(pending.train_step, None)

    @property
    def serves_copy(self) -> bool:
        """Whether the backend serves a copy of the policy (``sync_weights`` or ``publish_weights`` given), so that
        generation can go on while the update runs."""
        return self.sync_weights is not None or self.publish_weights is not None

    async def swap_weights(self, version: str, *, changed: bool = True) -> float:
        """Publish the policy's weights to the serving model as ``version``; return the seconds it took.

        New gateway calls wait at the swap gate meanwhile (when the trainer has one); calls inside the backend
        finish first (``backend.paused()``). Without ``sync_weights`` only the version changes; so it does when
        ``changed`` is false (the update left the weights as they were: nothing to publish).
        """
        t0 = time.perf_counter()
        if not changed:
            self.backend.set_model_version(version)
            self.versions.append(version)
            return time.perf_counter() - t0
        async with contextlib.AsyncExitStack() as stack:
            if self.swap_gate is not None:
                await stack.enter_async_context(self.swap_gate.swapping())
            if self.serves_copy:
                await stack.enter_async_context(self.backend.paused())
            if self.sync_weights is not None:
                await self.on_update_thread(self.sync_weights)
            if self.publish_weights is not None:
                await self.publish_weights(version)
            self.backend.set_model_version(version)
            self.versions.append(version)
        return time.perf_counter() - t0

    def _updater(self) -> PolicyUpdater:
        if self.updater is None:
            raise ConfigError("this trainer only evaluates (it was built without an updater); it cannot train")
        return self.updater

    def _value_head(self) -> ValueHeadUpdater:
        if not callable(getattr(self.updater, "values", None)):
            raise ConfigError(
                "advantage_estimator gae needs a trainer backend with a value head (the torch backend with "
                "value_head=True); use a group estimator such as grpo otherwise"
            )
        return cast("ValueHeadUpdater", self.updater)

    def _update_paused(self, samples: list[TrainingSample]) -> dict[str, float]:
        with self.backend.paused():
            return dict(self._updater().train_step(samples))

    @staticmethod
    def _metrics(result: StepResult) -> list[Metric]:
        now = time.time()
        values = {
            "rollout_s": result.rollout_s,
            "update_s": result.update_s,
            "n_rollouts": float(result.n_rollouts),
            "n_failed_rollouts": float(result.n_failed),
            "n_infra_failed_rollouts": float(result.n_infra_failed),
            "n_samples": float(result.n_samples),
            "tokens_saved_by_merge": float(result.tokens_unmerged - result.tokens_merged),
            "n_transitions": float(result.n_transitions),
            "n_transitions_dropped": float(result.n_dropped),
            "n_unmatched_rollouts": float(result.n_unmatched),
            "wait_s": result.wait_s,
        }
        if result.reward_mean is not None and result.reward_std is not None:  # a step with no scored rollout has none
            values["train_reward_mean"] = result.reward_mean
            values["train_reward_std"] = result.reward_std
        if result.staleness is not None:
            values["staleness_mean"] = result.staleness.mean_staleness
            values["n_stale_dropped"] = float(result.staleness.n_dropped)
            values["n_stale_reweighted"] = float(result.staleness.n_reweighted)
        values.update({f"update_{k}": float(v) for k, v in result.update_stats.items()})
        # Non-finite values (e.g. a KL estimate of a step that trained nothing) are not curve points.
        return [
            Metric(name=k, train_step=result.train_step, value=v, time=now)
            for k, v in values.items()
            if math.isfinite(v)
        ]
