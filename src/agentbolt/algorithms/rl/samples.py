"""Training samples: what the optimizer consumes (DESIGN.md, LightningRL step 4). Pure, no torch.

For now one transition makes one sample: ``input_ids = prompt + response``, with the loss mask on the response
tokens only. Merging consecutive transitions whose prompt extends the previous prompt + response (the "extension
property") into one sample comes later in ``adapter/merge.py``; :class:`TrainingSample` already allows several
masked spans, so merged samples need no new type.

Worked example: prompt ``[5, 6, 7]``, response ``[8, 9]`` with sampling logprobs ``[-0.1, -0.2]``::

    input_ids         = [5,   6,   7,   8,    9   ]
    loss_mask         = [0,   0,   0,   1,    1   ]
    sampling_logprobs = [0.0, 0.0, 0.0, -0.1, -0.2]

``sampling_logprobs[i]`` is log pi_old(input_ids[i] | input_ids[:i]): it is aligned with the token it scores, not
with the position that predicts it; the trainer shifts by one when it reads the model's logits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agentbolt.errors import ConfigError
from agentbolt.types import Trajectory


@dataclass(frozen=True)
class TrainingSample:
    """One sequence to train on.

    Attributes:
        input_ids: ``(L,)`` prompt token ids followed by response token ids.
        loss_mask: ``(L,)`` 1 on tokens the model generated (trained on), 0 on prompt tokens. ``loss_mask[0]`` is
            always 0: the first token has no context to be predicted from.
        sampling_logprobs: ``(L,)`` log pi_old of each token under the sampling policy (the gateway's logprobs);
            0.0 where ``loss_mask`` is 0.
        advantage: the rollout's advantage, applied to every masked token (fp64 Python float).
        rollout_id: the rollout it came from (for per-rollout weighting and debugging).
        sampling_temperature: the temperature the response was sampled at; the gateway's logprobs are those of
            ``logits / temperature``, so the trainer divides by the same value (1.0 for greedy calls, whose
            logprobs are of the plain logits).

    Raises:
        ConfigError: (on construction) the three lists differ in length, ``loss_mask`` has a value other than 0/1
            or is 1 at position 0, the advantage is not finite, or the temperature is not > 0.
    """

    input_ids: list[int]
    loss_mask: list[int]
    sampling_logprobs: list[float]
    advantage: float
    rollout_id: str
    sampling_temperature: float = 1.0

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.loss_mask) != n or len(self.sampling_logprobs) != n:
            raise ConfigError(
                f"sample of rollout {self.rollout_id}: input_ids, loss_mask and sampling_logprobs must have one entry "
                f"per token, got {n}, {len(self.loss_mask)} and {len(self.sampling_logprobs)}"
            )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ConfigError(f"sample of rollout {self.rollout_id}: loss_mask values must be 0 or 1")
        if n and self.loss_mask[0]:
            raise ConfigError(
                f"sample of rollout {self.rollout_id}: loss_mask[0] must be 0 (the first token cannot be predicted); "
                "a transition needs a non-empty prompt"
            )
        if not math.isfinite(self.advantage):
            raise ConfigError(f"sample of rollout {self.rollout_id}: advantage must be finite, got {self.advantage}")
        if not self.sampling_temperature > 0:
            raise ConfigError(
                f"sample of rollout {self.rollout_id}: sampling_temperature must be > 0, got "
                f"{self.sampling_temperature} (use 1.0 for greedy calls)"
            )

    @property
    def n_tokens(self) -> int:
        """L, the sequence length."""
        return len(self.input_ids)

    @property
    def n_loss_tokens(self) -> int:
        """The number of trained (masked) tokens."""
        return sum(self.loss_mask)


def samples_from_trajectories(
    trajectories: Sequence[Trajectory], advantages_by_rollout: Mapping[str, float]
) -> list[TrainingSample]:
    """One :class:`TrainingSample` per transition, carrying its rollout's advantage.

    Args:
        trajectories: trajectories in any order; transitions keep their order within each.
        advantages_by_rollout: ``rollout_id -> advantage`` (one advantage per rollout, e.g. from
            :func:`agentbolt.algorithms.rl.advantages.advantages_by_group`).

    Returns:
        Samples in trajectory order, then transition order. A transition's ``metadata["temperature"]`` (recorded
        from the request) becomes ``sampling_temperature``; 0 (greedy) or missing becomes 1.0.

    Raises:
        ConfigError: a trajectory's rollout has no advantage, or a transition has an empty prompt.
    """
    samples: list[TrainingSample] = []
    for trajectory in trajectories:
        if trajectory.rollout_id not in advantages_by_rollout:
            raise ConfigError(
                f"no advantage for rollout {trajectory.rollout_id}; compute advantages for every trajectory's rollout"
            )
        advantage = float(advantages_by_rollout[trajectory.rollout_id])
        for transition in trajectory.transitions:
            n_prompt = len(transition.prompt_token_ids)
            n_response = len(transition.response_token_ids)
            if n_prompt == 0:
                raise ConfigError(
                    f"transition {transition.span_id} of rollout {trajectory.rollout_id} has an empty prompt; "
                    "its first response token cannot be scored"
                )
            temperature = transition.metadata.get("temperature")
            samples.append(
                TrainingSample(
                    input_ids=[*transition.prompt_token_ids, *transition.response_token_ids],
                    loss_mask=[0] * n_prompt + [1] * n_response,
                    sampling_logprobs=[0.0] * n_prompt + [float(x) for x in transition.sampling_logprobs],
                    advantage=advantage,
                    rollout_id=trajectory.rollout_id,
                    sampling_temperature=float(temperature) if temperature else 1.0,
                )
            )
    return samples


def plan_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group sequences into right-padded micro-batches of at most ``max_tokens`` tokens, padding included.

    Sequences are sorted by length, longest first (so the largest micro-batch runs first and an out-of-memory
    error shows at once), then packed greedily: a sequence joins the current micro-batch while
    ``(size + 1) * longest <= max_tokens``, where ``longest`` is the micro-batch's first (longest) sequence. A
    sequence longer than ``max_tokens`` gets a micro-batch of its own. Sorting keeps padding small.

    Args:
        lengths: ``(N,)`` sequence lengths (>= 1).
        max_tokens: the token budget of one padded micro-batch, ``rows * longest`` (>= 1).

    Returns:
        Lists of indices into ``lengths``; every index appears exactly once.

    Raises:
        ConfigError: ``max_tokens < 1``.
    """
    if max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    longest = 0
    for i in order:
        if batches and (len(batches[-1]) + 1) * longest <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
            longest = lengths[i]
    return batches
