"""Training data: transitions and trajectories (DESIGN.md, "Adapter and LightningRL").

A transition is one LLM call seen as an MDP step: state = the exact prompt token ids, action = the exact response
token ids the model generated, with the sampling logprob of each response token as recorded by the gateway.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator


class Transition(BaseModel):
    """One LLM call as training data.

    Attributes:
        prompt_token_ids: ``(P,)`` token ids fed to the model.
        response_token_ids: ``(R,)`` token ids the model generated, stop token included when it stopped on one.
        sampling_logprobs: ``(R,)`` log pi_old(token) under the sampling policy (the gateway's logprobs).
        reward: the reward credited to this transition (set by credit assignment; ``None`` before).
        finish_reason: ``stop`` or ``length``.
        span_id: the LLM span it came from.
        metadata: e.g. the resources version and the agent name.
    """

    prompt_token_ids: list[int]
    response_token_ids: list[int]
    sampling_logprobs: list[float]
    reward: float | None = None
    finish_reason: str | None = None
    span_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _logprobs_match_response(self) -> Transition:
        if len(self.sampling_logprobs) != len(self.response_token_ids):
            raise ValueError(
                f"sampling_logprobs has {len(self.sampling_logprobs)} entries but response_token_ids has "
                f"{len(self.response_token_ids)}; the gateway must record one logprob per generated token"
            )
        return self


class Trajectory(BaseModel):
    """The ordered transitions of one attempt, with the rollout's final reward.

    Attributes:
        rollout_id / attempt_id: where it came from.
        task_id: the task, used to form groups.
        resources_id: the resources version it ran against.
        transitions: LLM calls in store sequence order.
        final_reward: the outcome reward (``None`` if the agent never gave one).
        intermediate_rewards: ``(sequence_id, value)`` of every reward span, in order.
    """

    rollout_id: str
    attempt_id: str
    task_id: str
    resources_id: str | None = None
    transitions: list[Transition]
    final_reward: float | None = None
    intermediate_rewards: list[tuple[int, float]] = Field(default_factory=list)
