"""LightningRL's batch step: a training step's finished rollouts -> the samples its update trains on.

The RL loop (:class:`agentbolt.trainer.loop.RLTrainer`) enqueues rollouts, waits, reads each rollout's last attempt
back from the store and hands them here; :meth:`LightningRL.batch` does the algorithm's part, with no I/O:

1. **Selection** (:func:`~agentbolt.adapter.batch.select_trajectories`): trainable trajectories of the succeeded,
   scored rollouts, under ``agent_match``; failures counted by kind.
2. **Credit assignment** over each multi-call trajectory (``credit_assignment``: one reward per transition), then
   **advantages** per group of the same task and resources version (``advantage_estimator``), the max_tokens policy
   (``truncated``), the staleness bound of asynchronous training, and merging of calls that extend each other
   (:func:`~agentbolt.adapter.batch.samples_for_step`). This is LightningRL's hierarchical credit assignment
   (Luo et al. 2025, arXiv:2508.03680): the episode's reward is assigned to each call, and each call
   becomes a single-turn sample for a GRPO/PPO-style update.

With ``advantage_estimator: gae`` (PPO with a value head) the samples leave here with step rewards and zero
advantages (:attr:`LightningRL.needs_values`); the loop gets ``V(s)`` from the trainer backend and computes token
advantages (:func:`agentbolt.algorithms.rl.ppo_gae.rollout_gae`), since that needs the policy's tensors.

Torch-free, like the rest of :mod:`agentbolt.adapter`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agentbolt.adapter.advantages import VALUE_HEAD_ESTIMATOR, check_estimator_name
from agentbolt.adapter.agents import compile_agent_match
from agentbolt.adapter.batch import (
    StalenessSettings,
    StepBatch,
    TrajectorySelection,
    samples_for_step,
    select_trajectories,
)
from agentbolt.adapter.credit import build_credit_scheme
from agentbolt.adapter.samples import TrainingSample
from agentbolt.config import GRPOConfig
from agentbolt.types import Attempt, Rollout, Span, Trajectory, Transition

UNNAMED_AGENT = "(unnamed)"
"""How calls made outside any ``agentbolt.agent(...)`` scope are counted per agent."""

FinishedRollout = tuple[Rollout, Attempt | None, Sequence[Span]]
"""A terminal rollout, its last attempt (``None``: it never ran) and that attempt's spans."""


def count_by_agent(transitions: Sequence[Transition]) -> dict[str, int]:
    """Transitions per agent name (``Transition.agent_name``, or :data:`UNNAMED_AGENT`), names sorted."""
    counts: dict[str, int] = {}
    for transition in transitions:
        name = transition.agent_name or UNNAMED_AGENT
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


@dataclass
class TrainingBatch:
    """What :meth:`LightningRL.batch` made of one step's rollouts.

    Attributes:
        selection: the trainable trajectories and the counts of what was left out.
        step_batch: the samples before any value head, with the batch's token counts and the staleness report.
        staleness: the staleness bound that was applied (``None``: synchronous training).
        samples: what the update trains on; starts as ``step_batch.batch.samples`` (the loop replaces it with the
            GAE samples under ``gae``).
    """

    selection: TrajectorySelection
    step_batch: StepBatch
    staleness: StalenessSettings | None
    samples: list[TrainingSample] = field(default_factory=list)

    @property
    def trajectories(self) -> list[Trajectory]:
        """The trained trajectories, in rollout order."""
        return self.selection.trajectories

    @property
    def rewards(self) -> list[float]:
        """Final rewards of the trained trajectories."""
        return [t.final_reward for t in self.trajectories if t.final_reward is not None]

    @property
    def n_transitions(self) -> int:
        """Transitions in the batch (after ``agent_match``)."""
        return sum(len(t.transitions) for t in self.trajectories)

    @property
    def batch_span_ids(self) -> list[str]:
        """The LLM spans whose calls are in the batch, in trajectory order."""
        return [t.span_id or "" for trajectory in self.trajectories for t in trajectory.transitions]

    @property
    def kept_by_agent(self) -> dict[str, int]:
        """Transitions in the batch per agent name."""
        return count_by_agent([t for trajectory in self.trajectories for t in trajectory.transitions])

    @property
    def dropped_by_agent(self) -> dict[str, int]:
        """Trainable transitions ``agent_match`` left out, per agent name."""
        return count_by_agent(self.selection.dropped)


class LightningRL:
    """The batch step of LightningRL (module docstring) for one run's settings.

    Args:
        config: the run's RL settings (credit assignment, advantage estimator, max_tokens policy, merging, staleness).
        agent_match: regular expression over agent names (:mod:`agentbolt.adapter.agents`); only matching agents'
            calls become samples. ``None``: every call.

    Raises:
        ConfigError: an unknown credit assignment or advantage estimator name, or a bad ``agent_match`` pattern.
    """

    def __init__(self, config: GRPOConfig, *, agent_match: str | None = None) -> None:
        compile_agent_match(agent_match)
        check_estimator_name(config.advantage_estimator)  # an unknown name fails here, listing the known ones
        self.config = config
        self.agent_match = agent_match
        self.credit = build_credit_scheme(
            config.credit_assignment, gamma=config.credit_gamma, air_weights=config.air_weights
        )

    @property
    def needs_values(self) -> bool:
        """Whether the advantages come from a value head (``gae``): the loop must add them to :attr:`samples`."""
        return self.config.advantage_estimator == VALUE_HEAD_ESTIMATOR

    def staleness_settings(self, versions: Sequence[str]) -> StalenessSettings | None:
        """The staleness bound for a batch trained when ``versions`` (oldest first) have been served; ``None`` under
        synchronous training (``async_rollouts: 0``)."""
        if self.config.async_rollouts == 0:
            return None
        return StalenessSettings(
            versions=tuple(versions),
            max_staleness=self.config.effective_max_staleness,
            policy=self.config.stale_policy,
            decay=self.config.stale_decay,
        )

    def batch(self, finished: Sequence[FinishedRollout], *, versions: Sequence[str]) -> TrainingBatch:
        """Select, credit and score one step's rollouts (module docstring). Writes each kept transition's credited
        ``reward`` onto it (the one side effect, as :func:`~agentbolt.adapter.batch.samples_for_step`).

        Args:
            finished: every rollout of the step, terminal.
            versions: the weights versions served so far, oldest first (the staleness bound's reference).

        Raises:
            ConfigError: bad credit inputs or staleness settings (see ``samples_for_step``).
        """
        selection = select_trajectories(finished, agent_match=self.agent_match)
        staleness = self.staleness_settings(versions)
        step_batch = samples_for_step(
            selection.trajectories,
            credit=self.credit,
            estimator=self.config.advantage_estimator,
            truncated=self.config.truncated,
            truncated_reward=self.config.truncated_reward,
            merge=self.config.merge_samples,
            staleness=staleness,
        )
        return TrainingBatch(selection, step_batch, staleness, list(step_batch.batch.samples))
