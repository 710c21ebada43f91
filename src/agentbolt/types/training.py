"""Training data: transitions and trajectories (DESIGN.md, "Adapter and LightningRL").

A transition is one LLM call seen as an MDP step: state = the exact prompt token ids, action = the exact response
token ids the model generated, with the sampling logprob of each response token as recorded by the gateway.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, Field, model_validator

# Keys of ``Transition.metadata`` that the adapter sets (:mod:`agentbolt.adapter.signals`) and credit assignment
# reads (:mod:`agentbolt.algorithms.rl.credit`). A missing key means "no such signal".
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
