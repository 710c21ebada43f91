"""Frozen, YAML-friendly configuration objects. They hold no live handles; runtime objects are built from them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentbolt.errors import ConfigError
from agentbolt.types.core import DEFAULT_UNRESPONSIVE_S


class _Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GRPOConfig(_Config):
    """One GRPO training run (LightningRL with broadcast credit; Luo et al. 2025, arXiv:2508.03680).

    Attributes:
        steps: optimizer steps (one per batch of rollouts).
        tasks_per_step: distinct tasks sampled per step.
        group_size: rollouts per task (the GRPO group, ``n``); must be >= 2 for a non-zero advantage.
        temperature: sampling temperature of training rollouts (the trainer's logprobs use the same one).
        max_tokens: per-call generation limit handed to the agent through the LLM resource.
        eval_temperature: temperature of validation rollouts (0 = greedy).
        credit_assignment: name in :data:`agentbolt.adapter.credit.CREDIT_ASSIGNMENT` (``broadcast``,
            ``discounted``, ``intermediate`` or a registered user function).
        credit_gamma: the per-turn discount in ``(0, 1]`` of ``discounted`` (default 0.9), and, when set, of the
            outcome part of ``intermediate``; ``None`` for other schemes.
        air_weights: reward per AIR signal for ``intermediate`` (fields of
            :class:`agentbolt.adapter.credit.AIRWeights`: ``tool_call_ok``, ``tool_call_failed``,
            ``exception``, ``format_valid``, ``format_invalid``); missing ones keep their defaults.
        advantage_estimator: name in :data:`agentbolt.adapter.advantages.ADVANTAGE_ESTIMATORS` or
            ``BATCH_ADVANTAGE_ESTIMATORS`` (``grpo``, ``grpo_no_std``, ``rloo``, ``reinforce_pp``,
            ``reinforce_pp_baseline``), or ``gae`` (PPO with a value head on the policy: token-level GAE, needs a
            trainer backend with a value head).
        truncated: what to do with a response cut at ``max_tokens`` (``finish_reason == "length"``): ``keep`` (train
            it like any other), ``mask`` (context only, loss mask 0) or ``penalize`` (its reward becomes
            ``truncated_reward``); see :mod:`agentbolt.adapter.per_transition`.
        truncated_reward: the reward of a cut response under ``penalize`` (unit: reward; default -1.0).
        merge_samples: merge consecutive calls whose prompt extends the previous prompt + response into one sample
            (:func:`agentbolt.adapter.samples.merge_transitions`).
        rollout_timeout_s: lease of one attempt; an attempt running longer is stopped by its runner and marked
            ``timeout``.
        rollout_unresponsive_s: an attempt with no heartbeat, span or gateway call for this long (its runner died) is
            marked ``unresponsive`` and its rollout retried (runners beat every 2 s; seconds).
        max_attempts: tries per rollout (retries only on timeout/unresponsive).
        fail_after: stop the job (exit code 1, with a summary of the failure causes) after this many consecutive
            steps without a trainable trajectory; 0 never stops.
        accuracy_reward_name: the named reward that validation reads as a rollout's accuracy reward; ``None``
            (default) or ``""``: its final reward (what the agent returned). A rollout without a reward of that name
            is scored by its final reward, and an evaluation in which no rollout recorded it says so (a warning, and
            ``accuracy_reward_missing`` in ``summary.json``) instead of falling back in silence.
        success_threshold: a validation rollout counts as a success (correct) when it succeeded and its accuracy
            reward is at least this (unit: reward; default 1.0; :func:`agentbolt.adapter.trajectory.is_correct`).
            The job's header line shows the rule, e.g. ``success: final reward >= 1.0``.
        seed: shuffles the training tasks.
        async_rollouts: steps of rollouts enqueued ahead of the update (asynchronous training,
            :meth:`agentbolt.trainer.loop.RLTrainer.train`): 0 = synchronous; ``k`` = runners keep generating the
            next ``k`` steps' rollouts while the trainer updates, so a batch holds calls up to ``k`` versions old.
        max_staleness: under asynchronous training, calls made by weights more than this many versions behind the
            trainer's are stale (:mod:`agentbolt.adapter.staleness`); ``None``: ``async_rollouts``.
        stale_policy: ``drop`` stale calls (loss mask 0) or ``reweight`` them (advantage times
            ``stale_decay ** (staleness - max_staleness)``).
        stale_decay: the per-version weight of ``reweight``, in ``(0, 1]``.
        gae_gamma / gae_lambda: discount per token and GAE's lambda of the ``gae`` estimator (PPO with a value head,
            :mod:`agentbolt.algorithms.rl.ppo_gae`), in ``[0, 1]``. Both default to 1 (verl's defaults for outcome
            rewards): every generated token gets ``return - V(s)``. With ``lambda < 1`` and an untrained value head
            the credit piles onto the last tokens of a rollout (measured on the calc agent with 0.95: the policy
            learned to drop its tool call and guess the answer within one step).
    """

    steps: int = Field(default=4, ge=0)
    tasks_per_step: int = Field(default=4, ge=1)
    group_size: int = Field(default=4, ge=1)
    temperature: float = Field(default=1.0, gt=0)
    max_tokens: int = Field(default=96, ge=1)
    eval_temperature: float = Field(default=0.0, ge=0)
    credit_assignment: str = "broadcast"
    credit_gamma: float | None = Field(default=None, gt=0, le=1)
    air_weights: dict[str, float] = Field(default_factory=dict)
    advantage_estimator: str = "grpo"
    truncated: Literal["keep", "mask", "penalize"] = "keep"
    truncated_reward: float = Field(default=-1.0, allow_inf_nan=False)
    merge_samples: bool = True
    rollout_timeout_s: float = Field(default=600.0, gt=0)
    rollout_unresponsive_s: float = Field(default=DEFAULT_UNRESPONSIVE_S, gt=0)
    max_attempts: int = Field(default=2, ge=1)
    fail_after: int = Field(default=2, ge=0)
    accuracy_reward_name: str | None = None
    success_threshold: float = Field(default=1.0, allow_inf_nan=False)
    seed: int = 0
    async_rollouts: int = Field(default=0, ge=0)
    max_staleness: int | None = Field(default=None, ge=0)
    stale_policy: Literal["drop", "reweight"] = "drop"
    stale_decay: float = Field(default=0.5, gt=0, le=1)
    gae_gamma: float = Field(default=1.0, ge=0, le=1)
    gae_lambda: float = Field(default=1.0, ge=0, le=1)

    @property
    def effective_max_staleness(self) -> int:
        """``max_staleness``, or ``async_rollouts`` when it is unset."""
        return self.async_rollouts if self.max_staleness is None else self.max_staleness

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        if self.advantage_estimator == "gae" and self.credit_assignment == "discounted":
            raise ConfigError(
                "advantage_estimator gae discounts per token itself (gae_gamma); use credit_assignment broadcast "
                "or intermediate with it"
            )
        if self.advantage_estimator == "gae" and self.stale_policy == "reweight":
            raise ConfigError("stale_policy reweight scales per-rollout advantages; with gae use stale_policy drop")
        if self.steps > 0 and self.group_size < 2:
            raise ConfigError(
                f"group_size={self.group_size}: GRPO normalizes rewards within a group, so a group of 1 always gets "
                "advantage 0 and nothing is learned; set group_size >= 2"
            )
        return self
