"""Training data: transitions and trajectories (DESIGN.md, "Adapter and LightningRL").

A transition is one LLM call seen as an MDP step: state = the exact prompt token ids, action = the exact response
token ids the model generated, with the sampling logprob of each response token as recorded by the gateway.
"""

from __future__ import annotations

import itertools
import math
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, Field, model_validator

from agentbolt.types.bounds import INT32_MAX, INT64_MAX

# Keys of ``Transition.metadata`` that the adapter sets (:mod:`agentbolt.adapter.signals`) and credit assignment
# reads (:mod:`agentbolt.adapter.credit`). A missing key means "no such signal".
REWARDS_ATTACHED: Final = "rewards"
"""list[[sequence_id, value]]: the reward spans attached to this call (each reward goes to the latest LLM call
recorded before it, by store sequence order), named or not, in order."""
AIR_TOOL_CALLS_OK: Final = "air.tool_calls_ok"
"""int >= 0: tool calls caused by this transition's response that succeeded."""
AIR_TOOL_CALLS_FAILED: Final = "air.tool_calls_failed"
"""int >= 0: tool calls caused by this transition's response that failed (span status ERROR)."""
AIR_EXCEPTIONS: Final = "air.exceptions"
"""int >= 0: exceptions the agent recorded after this transition's call (outside tool spans)."""
AIR_FORMAT_VALID: Final = "air.format_valid"
"""bool: whether this transition's response had the expected format; missing when not checked."""


class Transition(BaseModel):
    """One LLM call as training data.

    Attributes:
        prompt_token_ids: ``(P,)`` token ids fed to the model.
        response_token_ids: ``(R,)`` token ids the model generated, stop token included when it stopped on one.
        sampling_logprobs: ``(R,)`` log pi_old(token) under the sampling policy (the gateway's logprobs).
        reward: the reward credited to this transition (set by credit assignment; ``None`` before).
        finish_reason: ``stop`` or ``length``.
        span_id: the gateway LLM span it came from.
        agent_name: the agent the call was made under (rules in :mod:`agentbolt.adapter.agents`); ``None`` when no
            recorded span names one.
        metadata: e.g. the store sequence id, the model version, the sampling temperature.
    """

    prompt_token_ids: list[int]
    response_token_ids: list[int]
    sampling_logprobs: list[float]
    reward: float | None = None
    finish_reason: str | None = None
    span_id: str | None = None
    agent_name: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _logprobs_match_response(self) -> Transition:
        if len(self.sampling_logprobs) != len(self.response_token_ids):
            raise ValueError(
                f"sampling_logprobs has {len(self.sampling_logprobs)} entries but response_token_ids has "
                f"{len(self.response_token_ids)}; the gateway must record one logprob per generated token"
            )
        return self


class TrajectoryFlag(StrEnum):
    """Why a trajectory must not be trained on (the adapter sets them; trainers skip flagged trajectories)."""

    REWARD_WITHOUT_CALLS = "reward_without_calls"
    """The attempt has a final reward but the gateway captured no trainable LLM call: the agent did not call the
    gateway's base URL, every call failed, or the backend returns no token ids. There is nothing to credit."""
    NO_MATCHING_AGENT = "no_matching_agent"
    """The gateway captured trainable calls but none was made by an agent that ``agent_match`` selects."""


class Trajectory(BaseModel):
    """The ordered transitions of one attempt, with the rollout's final reward.

    Attributes:
        rollout_id / attempt_id: where it came from.
        task_id: the task, used to form groups.
        resources_id: the resources version it ran against.
        transitions: LLM calls in store sequence order (those of the agents ``agent_match`` selects).
        final_reward: the outcome reward (``None`` if the agent never gave one).
        intermediate_rewards: ``(sequence_id, value)`` of every reward span, in order.
        flags: why it must not be trained on (empty: nothing against it).
        excluded_calls: trainable calls left out because their agent does not match ``agent_match``.
        untrainable_calls: gateway calls that cannot be trained on (failed, no token ids, client gone).
        tracer_only_calls: LLM calls the tracer saw but the gateway did not record (made to another endpoint, or
            lost): they have no exact tokens and are never trained on.
    """

    rollout_id: str
    attempt_id: str
    task_id: str
    resources_id: str | None = None
    transitions: list[Transition]
    final_reward: float | None = None
    intermediate_rewards: list[tuple[int, float]] = Field(default_factory=list)
    flags: list[TrajectoryFlag] = Field(default_factory=list)
    excluded_calls: int = 0
    untrainable_calls: int = 0
    tracer_only_calls: int = 0

    @property
    def trainable(self) -> bool:
        """True when it has a final reward, at least one transition, and no flag."""
        return self.final_reward is not None and bool(self.transitions) and not self.flags


class TrainedCall(BaseModel):
    """One LLM call merged into a :class:`TrainedSample`, located by token offsets.

    The tokens are not stored again: they are the gateway span's. With ``input_ids`` the sample's tokens,
    ``input_ids[:response_start]`` is this call's prompt and ``input_ids[response_start:response_end]`` its response
    (the span's ``prompt_token_ids`` and ``response_token_ids``); the last call's prompt + response is the whole
    sample, so its length is ``calls[-1].response_end``.

    Attributes:
        span_id: the gateway LLM span of the call.
        response_start / response_end: ``[start, end)`` positions of the call's response tokens in the sample.
        reward: the reward credit assignment gave the call (``None``: none was given).
        staleness: how many weights versions the call's weights were behind the trainer's when it trained
            (:mod:`agentbolt.adapter.staleness`); ``None`` under synchronous training, or for a version the
            trainer never published (then ``staleness_weight`` is 0).
        staleness_weight: what the staleness rule multiplied the call's advantage by: 1.0 for a fresh call, 0.0 for a
            dropped one (its loss mask is 0, it is context only), in between under ``stale_policy: reweight``.
    """

    span_id: str
    response_start: int = Field(ge=1, le=INT32_MAX)
    response_end: int = Field(ge=1, le=INT32_MAX)
    reward: float | None = Field(default=None, allow_inf_nan=False)
    staleness: int | None = Field(default=None, ge=0, le=INT64_MAX)
    staleness_weight: float = Field(default=1.0, ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> TrainedCall:
        if self.response_end < self.response_start:
            raise ValueError(f"call {self.span_id}: response_end {self.response_end} < response_start")
        return self


class TrainedSample(BaseModel):
    """One training sample exactly as a policy update received it, by reference to the recorded calls.

    Written by the trainer before each update (:mod:`agentbolt.trainer.trained_record`) and kept by the store
    (:meth:`~agentbolt.store.base.LightningStore.put_trained_samples`), so the dashboard and ``agentbolt export``
    show the advantages, loss masks and sample boundaries the update used rather than a recomputation. Token ids and
    logprobs stay in the LLM spans (:class:`TrainedCall`); the sample's length is ``L = calls[-1].response_end``.

    Attributes:
        train_step: the training step whose update received it.
        sample_index: its position in that update's batch (0-based).
        rollout_id / attempt_id: the rollout and the attempt whose calls it holds.
        calls: the merged calls, in order (at least one; several when calls extended each other).
        loss_mask_ranges: ``[start, end)`` runs of positions where the loss mask is 1 (trained tokens), sorted and
            disjoint, within ``[1, L]``; the loss mask is 0 elsewhere.
        advantage: the advantage of every trained token (group estimators; after any staleness reweighting); 0.0
            under ``gae``, whose advantages are per token.
        token_advantages / token_returns: ``gae`` only: the advantage and value target of each trained token, in
            position order (one per position of ``loss_mask_ranges``); ``None`` for other estimators.
        sampling_temperature: the temperature the calls were sampled at (1.0 for greedy calls).
        trained: whether the update could learn from it: False when it was skipped for an advantage of exactly 0
            (a group whose rollouts all scored the same), as the torch backend does.
        advantage_estimator / credit_assignment: the trainer's settings that produced ``advantage``.
    """

    train_step: int = Field(ge=0, le=INT64_MAX)
    sample_index: int = Field(ge=0, le=INT32_MAX)
    rollout_id: str
    attempt_id: str
    calls: list[TrainedCall] = Field(min_length=1)
    loss_mask_ranges: list[tuple[int, int]]
    advantage: float = Field(allow_inf_nan=False)
    token_advantages: list[float] | None = None
    token_returns: list[float] | None = None
    sampling_temperature: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    trained: bool = True
    advantage_estimator: str
    credit_assignment: str

    @property
    def n_tokens(self) -> int:
        """``L``, the sample's length: the end of its last call's response."""
        return self.calls[-1].response_end

    def trained_positions(self) -> list[int]:
        """The positions where the loss mask is 1, in order."""
        return [k for start, end in self.loss_mask_ranges for k in range(start, end)]

    def loss_mask(self) -> list[int]:
        """The ``(L,)`` loss mask (1 on trained tokens)."""
        mask = [0] * self.n_tokens
        for k in self.trained_positions():
            mask[k] = 1
        return mask

    def advantages_by_position(self) -> dict[int, float]:
        """The advantage applied at each trained position: ``advantage`` everywhere, or the per-token ``gae`` one."""
        positions = self.trained_positions()
        if self.token_advantages is None:
            return dict.fromkeys(positions, self.advantage)
        return dict(zip(positions, self.token_advantages, strict=True))

    @model_validator(mode="after")
    def _consistent(self) -> TrainedSample:
        where = f"trained sample {self.sample_index} of step {self.train_step} (rollout {self.rollout_id})"
        for before, after in itertools.pairwise(self.calls):
            if after.response_start < before.response_end:
                raise ValueError(f"{where}: calls must be in order, each response after the previous one")
        previous_end = 1
        for start, end in self.loss_mask_ranges:
            if not previous_end <= start < end <= self.n_tokens:
                raise ValueError(
                    f"{where}: loss_mask_ranges must be sorted, disjoint, non-empty [start, end) runs within "
                    f"[1, {self.n_tokens}], got {self.loss_mask_ranges}"
                )
            previous_end = end
        n_trained = sum(end - start for start, end in self.loss_mask_ranges)
        for name in ("token_advantages", "token_returns"):
            values = getattr(self, name)
            if values is not None and (len(values) != n_trained or not all(math.isfinite(v) for v in values)):
                raise ValueError(f"{where}: {name} must hold one finite value per trained token ({n_trained})")
        return self
