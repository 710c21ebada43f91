"""Which finished rollouts of a step are trained on, and why the others are not. Pure: no store, no I/O, no torch
(the server's dashboard and ``agentbolt export`` run it with the ``[server]`` extra alone).

:func:`select_trajectories` takes each rollout with its last attempt and that attempt's spans (read from the store
by the loop) and sorts it into exactly one of:

- **infrastructure failure** (:func:`agentbolt.adapter.signals.infrastructure_failure`): the last attempt ended
  ``timeout`` or ``unresponsive``, or the gateway recorded a backend failure (``upstream_error``,
  ``backend_unavailable``, ``internal_error``). Excluded and counted by reason; never trained as reward 0, since
  the policy did not cause it. This check comes first: a succeeded rollout whose agent caught a 502 and returned 0
  is still excluded.
- **failed**: the rollout did not succeed for another reason (the agent raised, it was cancelled, it never ran),
  it has no final reward, or it is flagged ``reward_without_calls``. Excluded and counted.
- **unmatched**: succeeded and scored, but ``agent_match`` selected none of its calls. Excluded and counted.
- **trained**: everything else.

:func:`samples_for_step` then turns the trained trajectories into samples: credit (``scheme(trajectory)``, so
``discounted``, ``intermediate``/AIR and user functions see the whole trajectory), the max_tokens policy, one
advantage per rollout by name (:func:`~agentbolt.adapter.advantages.compute_advantages`, so batch estimators
such as ``reinforce_pp`` work), one advantage per transition
(:mod:`agentbolt.adapter.per_transition`), and merged samples
(:func:`~agentbolt.adapter.samples.build_samples`). Under asynchronous training, transitions sampled by
weights too many versions old are dropped or reweighted before merging (:mod:`agentbolt.adapter.staleness`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agentbolt import semconv
from agentbolt.adapter import build_trajectory
from agentbolt.adapter.advantages import VALUE_HEAD_ESTIMATOR, compute_advantages
from agentbolt.adapter.causes import FailureCause, failure_cause
from agentbolt.adapter.credit import CreditScheme
from agentbolt.adapter.per_transition import (
    TruncationPolicy,
    apply_truncation_policy,
    outcome_scales,
    step_rewards,
    transition_advantages,
)
from agentbolt.adapter.samples import SampleBatch, build_samples
from agentbolt.adapter.signals import infrastructure_failure
from agentbolt.adapter.staleness import StalenessReport, StalePolicy, apply_staleness
from agentbolt.errors import ConfigError
from agentbolt.types import Attempt, Rollout, RolloutStatus, Span, Trajectory, TrajectoryFlag, Transition


@dataclass(frozen=True)
class StalenessSettings:
    """The staleness bound of asynchronous training (:mod:`agentbolt.adapter.staleness`).

    Attributes:
        versions: the trainer's published weights versions, oldest first; the last is the current one.
        max_staleness: transitions more versions behind than this are stale.
        policy: ``drop`` or ``reweight`` the stale ones.
        decay: the per-version weight of ``reweight``, in ``(0, 1]``.
    """

    versions: tuple[str, ...]
    max_staleness: int
    policy: StalePolicy = "drop"
    decay: float = 0.5


@dataclass(frozen=True)
class StepBatch:
    """What :func:`samples_for_step` made: the samples, and what the staleness rule did (``None`` without one)."""

    batch: SampleBatch
    staleness: StalenessReport | None = None


@dataclass
class TrajectorySelection:
    """What :func:`select_trajectories` made of a step's rollouts.

    Attributes:
        trajectories: the trainable trajectories, in rollout order.
        dropped: trainable transitions that ``agent_match`` left out, over every succeeded, scored rollout.
        n_failed: rollouts excluded for a reason other than infrastructure (see the module docstring).
        n_unmatched: succeeded, scored rollouts none of whose calls ``agent_match`` selected.
        infra_failures: rollouts excluded because their last attempt failed for infrastructure reasons, by reason
            (``"attempt timeout"``, ``"gateway error upstream_error"``...).
        causes: every excluded rollout (failed and infrastructure, not unmatched) by its cause
            (:func:`agentbolt.adapter.causes.failure_cause`), in the order first met.
        cause_details: the detail of the first rollout met per cause (e.g. ``ValueError: bad input``).
        n_truncated / n_calls: calls cut at ``max_tokens`` among the trained trajectories' transitions, and all
            of their transitions.
        untrainable_calls: answered LLM calls of the trained rollouts that the gateway recorded as untrainable
            (``agentbolt.llm.trainable`` false), by their ``not_trainable_reason``: left out of the trajectories.
    """

    trajectories: list[Trajectory] = field(default_factory=list)
    dropped: list[Transition] = field(default_factory=list)
    n_failed: int = 0
    n_unmatched: int = 0
    infra_failures: dict[str, int] = field(default_factory=dict)
    causes: dict[str, int] = field(default_factory=dict)
    cause_details: dict[str, str] = field(default_factory=dict)
    n_truncated: int = 0
    n_calls: int = 0
    untrainable_calls: dict[str, int] = field(default_factory=dict)

    @property
    def n_infra_failed(self) -> int:
        """Rollouts excluded for infrastructure failures."""
        return sum(self.infra_failures.values())

    def count_cause(self, found: FailureCause | None) -> None:
        """Count one excluded rollout under its cause (``None``: an unexplained exclusion, ``unknown``)."""
        cause, detail = (found.cause, found.detail) if found is not None else ("unknown", "")
        self.causes[cause] = self.causes.get(cause, 0) + 1
        self.cause_details.setdefault(cause, detail)


def select_trajectories(
    finished: Sequence[tuple[Rollout, Attempt | None, Sequence[Span]]], *, agent_match: str | None = None
) -> TrajectorySelection:
    """Sort each finished rollout into trained / infrastructure failure / failed / unmatched (module docstring).

    Args:
        finished: ``(rollout, last attempt or None if it never ran, that attempt's spans)`` per rollout.
        agent_match: as in :func:`agentbolt.adapter.build_trajectory`.

    Returns:
        A :class:`TrajectorySelection`; every rollout is counted exactly once.
    """
    out = TrajectorySelection()
    for rollout, attempt, spans in finished:
        if attempt is None:
            out.n_failed += 1
            out.count_cause(failure_cause(rollout, None, spans))
            continue
        reason = infrastructure_failure(attempt.status, spans)
        if reason is not None:
            out.infra_failures[reason] = out.infra_failures.get(reason, 0) + 1
            out.count_cause(failure_cause(rollout, attempt, spans))
            continue
        if rollout.status is not RolloutStatus.SUCCEEDED:
            out.n_failed += 1
            out.count_cause(failure_cause(rollout, attempt, spans))
            continue
        trajectory = build_trajectory(rollout, attempt.attempt_id, spans, agent_match=agent_match)
        if trajectory.final_reward is None:
            out.n_failed += 1
            out.count_cause(failure_cause(rollout, attempt, spans))
            continue
        if agent_match is not None:
            everything = build_trajectory(rollout, attempt.attempt_id, spans)
            kept = {t.span_id for t in trajectory.transitions}
            out.dropped.extend(t for t in everything.transitions if t.span_id not in kept)
        if not trajectory.trainable:
            if TrajectoryFlag.NO_MATCHING_AGENT in trajectory.flags:
                out.n_unmatched += 1
            else:
                out.n_failed += 1
                out.count_cause(failure_cause(rollout, attempt, spans, trainable=False))
            continue
        out.trajectories.append(trajectory)
        for reason in untrainable_reasons(spans):
            out.untrainable_calls[reason] = out.untrainable_calls.get(reason, 0) + 1
        out.n_calls += len(trajectory.transitions)
        out.n_truncated += sum(1 for t in trajectory.transitions if t.finish_reason == "length")
    return out


def untrainable_reasons(spans: Sequence[Span]) -> list[str]:
    """The ``not_trainable_reason`` of each answered (not ERROR) LLM span marked untrainable by the gateway."""
    return [
        str(span.attributes.get(semconv.LLM_NOT_TRAINABLE_REASON) or "not trainable")
        for span in spans
        if span.name == semconv.SPAN_LLM_CALL
        and span.status.code != "ERROR"
        and span.attributes.get(semconv.LLM_TRAINABLE) is False
    ]


def samples_for_step(
    trajectories: Sequence[Trajectory],
    *,
    credit: CreditScheme,
    estimator: str,
    truncated: TruncationPolicy = "keep",
    truncated_reward: float = -1.0,
    merge: bool = True,
    staleness: StalenessSettings | None = None,
) -> StepBatch:
    """Credit, advantages and samples of a step's trained trajectories (module docstring).

    For trajectory ``i`` with outcome ``R_i`` and transitions ``t``: ``r_t = credit(trajectory)[t]``, then the
    max_tokens policy (:func:`~agentbolt.adapter.per_transition.apply_truncation_policy`), written onto
    ``transition.reward`` (the one side effect); ``A_i = compute_advantages(R, groups, estimator)[i]`` with groups
    ``(task_id, resources_id)``; ``A_t = A_i + (r_t - R_i) / s_i``
    (:func:`~agentbolt.adapter.per_transition.transition_advantages`). Under ``gae`` (PPO with a value head)
    every advantage is left at 0 and the samples carry step rewards instead
    (:func:`~agentbolt.adapter.per_transition.step_rewards`); the trainer computes token advantages from its value
    head (:func:`~agentbolt.algorithms.rl.ppo_gae.rollout_gae`).

    Args:
        trajectories: trainable trajectories (each has a final reward).
        credit: the credit-assignment scheme.
        estimator: an advantage estimator's name (per group or batch).
        truncated / truncated_reward: the max_tokens policy and the ``penalize`` reward.
        merge: merge transitions that extend each other into one sample.
        staleness: the staleness bound (asynchronous training), applied after the per-transition advantages and
            before merging; ``None``: every transition is fresh.

    Raises:
        ConfigError: a trajectory has no final reward, the estimator is unknown, credit fails its checks, or bad
            staleness settings.
    """
    outcomes: list[float] = []
    for trajectory in trajectories:
        if trajectory.final_reward is None:
            raise ConfigError(
                f"trajectory of rollout {trajectory.rollout_id} has no final reward; it cannot be trained on"
            )
        outcomes.append(float(trajectory.final_reward))
    keys = [(t.task_id, t.resources_id) for t in trajectories]
    value_head = estimator == VALUE_HEAD_ESTIMATOR
    if value_head:  # advantages come later, per token, from the value head (rollout_gae)
        if staleness is not None and staleness.policy == "reweight":
            raise ConfigError("stale_policy reweight scales per-rollout advantages; with gae use stale_policy drop")
        advantages_N, scales_N = [0.0] * len(outcomes), [1.0] * len(outcomes)
    else:
        advantages_N = compute_advantages(outcomes, keys, estimator)
        scales_N = outcome_scales(outcomes, keys, estimator)
    advantages: dict[str, list[float]] = {}
    trained: dict[str, list[bool]] = {}
    steps: dict[str, list[float]] = {}
    for trajectory, outcome, advantage, scale in zip(trajectories, outcomes, advantages_N, scales_N, strict=True):
        rewards_T, trained_T = apply_truncation_policy(
            [t.finish_reason for t in trajectory.transitions], credit(trajectory), truncated, truncated_reward
        )
        for transition, reward in zip(trajectory.transitions, rewards_T, strict=True):
            transition.reward = reward
        if value_head:
            advantages[trajectory.rollout_id] = [0.0] * len(rewards_T)
            steps[trajectory.rollout_id] = step_rewards(rewards_T, outcome)
        else:
            advantages[trajectory.rollout_id] = transition_advantages(advantage, rewards_T, outcome, scale)
        trained[trajectory.rollout_id] = trained_T
    report = None
    if staleness is not None:
        report = apply_staleness(
            trajectories,
            advantages,
            trained,
            versions=staleness.versions,
            max_staleness=staleness.max_staleness,
            policy=staleness.policy,
            decay=staleness.decay,
        )
    batch = build_samples(
        trajectories,
        advantages,
        trained_by_rollout=trained,
        merge=merge,
        step_rewards_by_rollout=steps if value_head else None,
    )
    return StepBatch(batch, report)
