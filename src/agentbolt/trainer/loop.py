"""The RL loop: enqueue rollouts -> wait -> spans to trajectories -> credit and advantages -> update -> publish.

The trainer never calls the agent: it writes rollouts and resources into the store, runners execute them, and the
trainer reads the spans back. The policy update runs in a thread while the inference backend is paused, so the server
(and the runners' heartbeats) stay live during it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentbolt.adapter import build_trajectory, last_reward
from agentbolt.algorithms.rl.advantages import get_advantage_estimator, group_indices
from agentbolt.algorithms.rl.credit import get_credit_assignment
from agentbolt.algorithms.rl.samples import TrainingSample, samples_from_trajectories
from agentbolt.config import GRPOConfig
from agentbolt.store.base import EnqueueRequest, LightningStore
from agentbolt.types import LLM, Metric, Rollout, RolloutConfig, RolloutMode, RolloutStatus, Trajectory

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]
"""Called with (finished, total) while rollouts run."""


class PolicyUpdater(Protocol):
    """What the loop needs from a trainer backend: one optimizer step on a batch of samples."""

    def train_step(self, samples: list[TrainingSample]) -> dict[str, float]: ...


class ServingBackend(Protocol):
    """What the loop needs from the inference backend: pause during updates and a weights version."""

    model_name: str
    model_version: str

    def paused(self) -> Any: ...

    def set_model_version(self, version: str) -> None: ...


@dataclass
class StepResult:
    """Figures of one training step. Seconds are wall time."""

    train_step: int
    rewards: list[float]
    n_rollouts: int
    n_failed: int
    n_transitions: int
    rollout_s: float
    update_s: float
    update_stats: dict[str, float] = field(default_factory=dict)

    @property
    def reward_mean(self) -> float:
        return statistics.fmean(self.rewards) if self.rewards else 0.0

    @property
    def reward_std(self) -> float:
        return statistics.pstdev(self.rewards) if len(self.rewards) > 1 else 0.0


class RLTrainer:
    """GRPO over the store.

    Args:
        store: the store the runners and gateway use.
        backend: the inference backend serving the policy (paused during updates).
        updater: the trainer backend that owns the policy's trainable weights.
        config: run settings.
        gateway_url: root URL of the server, put into the ``LLM`` resource.
        sync_weights: called after each update, with the backend paused, to publish the new weights to the
            serving model (e.g. merged LoRA weights, see :mod:`agentbolt.algorithms.rl.weight_sync`). ``None``
            when the backend serves the trained module itself.
    """

    def __init__(
        self,
        store: LightningStore,
        backend: ServingBackend,
        updater: PolicyUpdater,
        config: GRPOConfig,
        *,
        gateway_url: str,
        sync_weights: Callable[[], object] | None = None,
    ) -> None:
        self.store = store
        self.sync_weights = sync_weights
        self.backend = backend
        self.updater = updater
        self.config = config
        self.gateway_url = gateway_url
        self.credit = get_credit_assignment(config.credit_assignment)
        self.estimator = get_advantage_estimator(config.advantage_estimator)
        self.rng = random.Random(config.seed)

    async def publish_resources(self, *, temperature: float, purpose: str) -> str:
        """Write a resources version pointing at the gateway with the current weights; return its id."""
        llm = LLM(
            endpoint=self.gateway_url,
            model=self.backend.model_name,
            sampling_parameters={"temperature": temperature, "max_tokens": self.config.max_tokens},
        )
        update = await self.store.add_resources(
            {"llm": llm}, metadata={"model_version": self.backend.model_version, "purpose": purpose}
        )
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
    ) -> list[Rollout]:
        """Enqueue every task ``repeats`` times and wait until all are terminal."""
        cfg = RolloutConfig(max_attempts=self.config.max_attempts, timeout_seconds=self.config.rollout_timeout_s)
        requests = [
            EnqueueRequest(
                input=task,
                mode=mode,
                resources_id=resources_id,
                config=cfg,
                metadata={"task_id": str(task.get("task_id", i)), **(metadata or {})},
            )
            for i, task in enumerate(tasks)
            for _ in range(repeats)
        ]
        rollouts = await self.store.enqueue_many(requests)
        ids = [r.rollout_id for r in rollouts]
        total = len(ids)
        while True:
            done = await self.store.wait_for_rollouts(ids, timeout_s=1.0)
            if on_progress is not None:
                on_progress(len(done), total)
            if len(done) == total:
                return done

    async def trajectory_of(self, rollout: Rollout) -> Trajectory | None:
        """Build the trajectory of the rollout's last attempt (``None`` if it never ran)."""
        attempts = await self.store.query_attempts(rollout.rollout_id)
        if not attempts:
            return None
        last = attempts[-1]
        spans = await self.store.query_spans(rollout.rollout_id, last.attempt_id)
        return build_trajectory(rollout, last.attempt_id, spans)

    async def named_reward(self, rollout: Rollout, name: str) -> float:
        """Value of the last reward span called ``name`` in the rollout's latest attempt (0.0 if absent)."""
        if rollout.status is not RolloutStatus.SUCCEEDED:
            return 0.0
        value = last_reward(await self.store.query_spans(rollout.rollout_id), name)
        return 0.0 if value is None else value

    async def evaluate(
        self,
        val_sets: dict[str, list[dict[str, Any]]],
        *,
        on_progress: ProgressCallback | None = None,
        label: str = "eval",
    ) -> dict[str, float]:
        """Run every validation task once (greedy by default); return accuracy per set, in [0, 1]."""
        resources_id = await self.publish_resources(temperature=self.config.eval_temperature, purpose=label)
        flat = [(name, task) for name, tasks in val_sets.items() for task in tasks]
        rollouts = await self.run_rollouts(
            [task for _, task in flat],
            mode=RolloutMode.VAL,
            resources_id=resources_id,
            on_progress=on_progress,
            metadata={"eval": label},
        )
        by_set: dict[str, list[float]] = {name: [] for name in val_sets}
        for (name, _), rollout in zip(flat, rollouts, strict=True):
            by_set[name].append(await self.named_reward(rollout, self.config.accuracy_reward_name))
        return {name: (statistics.fmean(v) if v else 0.0) for name, v in by_set.items()}

    def sample_tasks(self, tasks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Draw ``tasks_per_step`` distinct tasks (with the trainer's seeded RNG)."""
        k = min(self.config.tasks_per_step, len(tasks))
        return self.rng.sample(list(tasks), k)

    async def train_step(
        self,
        train_step: int,
        tasks: Sequence[dict[str, Any]],
        *,
        on_rollout_progress: ProgressCallback | None = None,
    ) -> StepResult:
        """One GRPO step: ``group_size`` rollouts per task, advantages per group, one policy update."""
        t0 = time.perf_counter()
        resources_id = await self.publish_resources(temperature=self.config.temperature, purpose="train")
        rollouts = await self.run_rollouts(
            tasks,
            mode=RolloutMode.TRAIN,
            resources_id=resources_id,
            repeats=self.config.group_size,
            on_progress=on_rollout_progress,
            metadata={"train_step": train_step},
        )
        rollout_s = time.perf_counter() - t0

        trajectories: list[Trajectory] = []
        n_failed = 0
        for rollout in rollouts:
            if rollout.status is not RolloutStatus.SUCCEEDED:
                n_failed += 1  # excluded, never trained as reward 0
                continue
            traj = await self.trajectory_of(rollout)
            if traj is None or traj.final_reward is None or not traj.transitions:
                n_failed += 1
                continue
            trajectories.append(traj)

        rewards = [t.final_reward for t in trajectories if t.final_reward is not None]
        groups = group_indices([(t.task_id, t.resources_id) for t in trajectories])
        advantages: dict[str, float] = {}
        for members in groups.values():
            group_adv = self.estimator([float(trajectories[i].final_reward or 0.0) for i in members])
            for i, adv in zip(members, group_adv, strict=True):
                advantages[trajectories[i].rollout_id] = adv
        for traj in trajectories:
            credited = self.credit(float(traj.final_reward or 0.0), len(traj.transitions))
            for transition, reward in zip(traj.transitions, credited, strict=True):
                transition.reward = reward
        samples = samples_from_trajectories(trajectories, advantages)

        t1 = time.perf_counter()
        stats = await asyncio.to_thread(self._update, samples)
        update_s = time.perf_counter() - t1
        self.backend.set_model_version(f"step-{train_step}")

        result = StepResult(
            train_step=train_step,
            rewards=rewards,
            n_rollouts=len(rollouts),
            n_failed=n_failed,
            n_transitions=sum(len(t.transitions) for t in trajectories),
            rollout_s=rollout_s,
            update_s=update_s,
            update_stats=stats,
        )
        await self.store.add_metrics(self._metrics(result))
        return result

    def _update(self, samples: list[TrainingSample]) -> dict[str, float]:
        with self.backend.paused():
            stats = dict(self.updater.train_step(samples))
            if self.sync_weights is not None:
                t0 = time.perf_counter()
                self.sync_weights()
                stats["weight_sync_s"] = time.perf_counter() - t0
        return stats

    @staticmethod
    def _metrics(result: StepResult) -> list[Metric]:
        now = time.time()
        values = {
            "train_reward_mean": result.reward_mean,
            "train_reward_std": result.reward_std,
            "rollout_s": result.rollout_s,
            "update_s": result.update_s,
            "n_rollouts": float(result.n_rollouts),
            "n_failed_rollouts": float(result.n_failed),
            "n_transitions": float(result.n_transitions),
        }
        values.update({f"update_{k}": float(v) for k, v in result.update_stats.items()})
        # Non-finite values (e.g. a KL estimate of a step that trained nothing) are not curve points.
        return [
            Metric(name=k, train_step=result.train_step, value=v, time=now)
            for k, v in values.items()
            if math.isfinite(v)
        ]
