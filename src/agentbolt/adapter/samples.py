"""Training samples: what the optimizer consumes (DESIGN.md, LightningRL step 4). Pure, no torch.

:func:`samples_from_trajectories` makes one sample per transition: ``input_ids = prompt + response``, with the loss
mask on the response tokens only. :func:`merge_transitions` / :func:`build_samples` merge consecutive transitions
that satisfy the **extension property** into one sample (the rule is in :func:`merge_transitions`); a trajectory of T
calls whose prompts keep growing then costs O(T) tokens instead of O(T^2) (prime-rl ``docs/algorithms.md``;
tinker-cookbook ``rl/data_processing.py`` ``trajectory_to_data``).

Worked example of one transition: prompt ``[5, 6, 7]``, response ``[8, 9]`` with sampling logprobs ``[-0.1, -0.2]``::

    input_ids         = [5,   6,   7,   8,    9   ]
    loss_mask         = [0,   0,   0,   1,    1   ]
    sampling_logprobs = [0.0, 0.0, 0.0, -0.1, -0.2]

``sampling_logprobs[i]`` is log pi_old(input_ids[i] | input_ids[:i]): it is aligned with the token it scores, not
with the position that predicts it; the trainer shifts by one when it reads the model's logits.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agentbolt.errors import ConfigError
from agentbolt.types import Trajectory, Transition


@dataclass(frozen=True)
class SampleCall:
    """Where one LLM call sits in a :class:`TrainingSample`: its prompt is ``input_ids[:response_start]`` and its
    response ``input_ids[response_start:response_end]``.

    Attributes:
        span_id: the gateway LLM span of the call (``Transition.span_id``).
        response_start / response_end: ``[start, end)`` positions of its response tokens in the sample.
    """

    span_id: str | None
    response_start: int
    response_end: int


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
        token_rewards: ``(L,)`` for PPO with a value head (estimator ``gae``): each merged call's step reward on
            its last response token, 0 elsewhere (:func:`agentbolt.adapter.per_transition.step_rewards`); ``None``
            otherwise.
        token_advantages / token_returns: ``(L,)`` per-token GAE advantages and value targets, 0 where
            ``loss_mask`` is 0 (:func:`agentbolt.algorithms.rl.ppo_gae.rollout_gae`); when set, the trainer uses
            ``token_advantages`` instead of ``advantage`` and regresses its value head on ``token_returns``.
        calls: the LLM calls merged into it, in order (:func:`merge_transitions` sets them; empty for a sample made
            another way, e.g. read back from an export); provenance only: the trainer ignores them, equality does
            too, and the store's record of what was trained keeps them (:class:`~agentbolt.types.TrainedSample`).

    Raises:
        ConfigError: (on construction) the lists differ in length, ``loss_mask`` has a value other than 0/1
            or is 1 at position 0, the advantage is not finite, or the temperature is not > 0.
    """

    input_ids: list[int]
    loss_mask: list[int]
    sampling_logprobs: list[float]
    advantage: float
    rollout_id: str
    sampling_temperature: float = 1.0
    token_rewards: list[float] | None = None
    token_advantages: list[float] | None = None
    token_returns: list[float] | None = None
    calls: tuple[SampleCall, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.loss_mask) != n or len(self.sampling_logprobs) != n:
            raise ConfigError(
                f"sample of rollout {self.rollout_id}: input_ids, loss_mask and sampling_logprobs must have one entry "
                f"per token, got {n}, {len(self.loss_mask)} and {len(self.sampling_logprobs)}"
            )
        for name in ("token_rewards", "token_advantages", "token_returns"):
            values = getattr(self, name)
            if values is not None and (len(values) != n or not all(math.isfinite(v) for v in values)):
                raise ConfigError(f"sample of rollout {self.rollout_id}: {name} must hold {n} finite values")
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
        end = 1
        for call in self.calls:
            if not end <= call.response_start <= call.response_end <= n:
                raise ConfigError(
                    f"sample of rollout {self.rollout_id}: calls must be in order, each response within the sample's "
                    f"{n} tokens and after the previous one, got {self.calls}"
                )
            end = call.response_end

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
            :func:`agentbolt.adapter.advantages.advantages_by_group`).

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
                    calls=(SampleCall(transition.span_id, n_prompt, n_prompt + n_response),),
                )
            )
    return samples


def _temperature(transition: Transition) -> float:
    temperature = transition.metadata.get("temperature")
    return float(temperature) if temperature else 1.0


def merge_transitions(
    transitions: Sequence[Transition],
    advantages_T: Sequence[float],
    rollout_id: str,
    *,
    trained_T: Sequence[bool] | None = None,
    step_rewards_T: Sequence[float] | None = None,
) -> list[TrainingSample]:
    """The samples of one trajectory, merging consecutive transitions that extend each other.

    **Rule.** Transitions are taken in order. Transition ``k + 1`` joins the sample that ends with transition ``k``
    when (1) its prompt starts with that sample's tokens exactly (for a sample of one transition: ``prompt_k +
    response_k``; for a merged one: the last merged prompt + its response), token for token, (2) its advantage
    equals transition ``k``'s (a sample carries one advantage), and (3) it was sampled at the same temperature.
    Otherwise it starts a new sample. A merged sample's tokens are the last merged prompt + its response; its loss
    mask is 1 exactly on the response tokens of each merged call (model-generated) and 0 on everything else (the
    first prompt, and the tool/user tokens each later prompt adds); ``sampling_logprobs`` holds each response
    token's recorded logprob at its position and 0.0 elsewhere.

    Worked example: ``([1, 2] -> [3, 4])``, ``([1, 2, 3, 4, 5] -> [6])`` merge into ``input_ids = [1, 2, 3, 4, 5,
    6]``, ``loss_mask = [0, 0, 1, 1, 0, 1]`` (6 tokens instead of 4 + 6 = 10).

    Args:
        transitions: ``(T,)`` the trajectory's transitions, in order; prompts must be non-empty.
        advantages_T: ``(T,)`` the advantage of each transition.
        rollout_id: written on every sample (the loss weights rollouts by it, ``rollout_mean``).
        trained_T: ``(T,)`` False for a transition whose response must not be trained on (e.g. cut at max_tokens
            under the ``mask`` policy): its tokens stay as context, with loss mask 0. Default: all True.
        step_rewards_T: ``(T,)`` for PPO with a value head: each transition's step reward, placed on its last
            response token in the samples' ``token_rewards`` (``None``: no token rewards).

    Returns:
        The samples, in order, each with the ``calls`` merged into it (span ids and response offsets); a sample with
        no trained token at all is left out, and its step rewards move to the last trained token of the previous
        sample (or, when there is none, the first trained token of the next).

    Raises:
        ConfigError: lengths differ, or a transition has an empty prompt.
    """
    trained = list(trained_T) if trained_T is not None else [True] * len(transitions)
    if len(advantages_T) != len(transitions) or len(trained) != len(transitions):
        raise ConfigError(
            f"rollout {rollout_id}: got {len(transitions)} transitions, {len(advantages_T)} advantages and "
            f"{len(trained)} trained flags; give one of each per transition"
        )
    if step_rewards_T is not None and len(step_rewards_T) != len(transitions):
        raise ConfigError(f"rollout {rollout_id}: got {len(transitions)} transitions, {len(step_rewards_T)} rewards")
    samples: list[TrainingSample] = []
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    token_rewards: list[float] = []
    calls: list[SampleCall] = []
    advantage = 0.0
    temperature = 1.0

    carried = 0.0  # step rewards of untrained samples that no earlier sample could take

    def flush() -> None:
        nonlocal carried
        if not ids:
            return
        if not any(mask):
            # Left out; its rewards go to the last trained token of the previous sample, else to the next sample.
            lost = math.fsum(token_rewards) if step_rewards_T is not None else 0.0
            if lost and samples:
                previous = samples[-1]
                assert previous.token_rewards is not None
                moved = list(previous.token_rewards)
                moved[max(i for i, m in enumerate(previous.loss_mask) if m)] += lost
                samples[-1] = dataclasses.replace(previous, token_rewards=moved)
            else:
                carried += lost
            return
        rewards = None
        if step_rewards_T is not None:
            rewards = list(token_rewards)
            if carried:
                rewards[mask.index(1)] += carried
                carried = 0.0
        samples.append(
            TrainingSample(
                list(ids),
                list(mask),
                list(logprobs),
                advantage,
                rollout_id,
                temperature,
                token_rewards=rewards,
                calls=tuple(calls),
            )
        )

    for k, transition in enumerate(transitions):
        prompt = transition.prompt_token_ids
        if not prompt:
            raise ConfigError(
                f"transition {transition.span_id} of rollout {rollout_id} has an empty prompt; "
                "its first response token cannot be scored"
            )
        extends = (
            k > 0
            and float(advantages_T[k]) == advantage
            and _temperature(transition) == temperature
            and len(prompt) >= len(ids)
            and prompt[: len(ids)] == ids
        )
        if not extends:
            flush()
            ids, mask, logprobs, token_rewards, calls = [], [], [], [], []
            advantage, temperature = float(advantages_T[k]), _temperature(transition)
        added = len(prompt) - len(ids)
        ids.extend(prompt[len(ids) :])
        mask.extend([0] * added)
        logprobs.extend([0.0] * added)
        token_rewards.extend([0.0] * added)
        calls.append(SampleCall(transition.span_id, len(ids), len(ids) + len(transition.response_token_ids)))
        ids.extend(transition.response_token_ids)
        on = 1 if trained[k] else 0
        n_response = len(transition.response_token_ids)
        mask.extend([on] * n_response)
        logprobs.extend(float(x) if on else 0.0 for x in transition.sampling_logprobs)
        token_rewards.extend([0.0] * n_response)
        if step_rewards_T is not None and n_response:
            token_rewards[-1] = float(step_rewards_T[k])
    flush()
    return samples


@dataclass(frozen=True)
class SampleBatch:
    """The samples of a batch and what merging saved.

    Attributes:
        samples: in trajectory order, then transition order.
        tokens_unmerged: sum over the transitions of ``len(prompt) + len(response)``: the tokens of one sample per
            transition (transitions of samples left out for having no trained token included).
        tokens_merged: sum over the samples of their lengths.
    """

    samples: list[TrainingSample]
    tokens_unmerged: int
    tokens_merged: int

    @property
    def tokens_saved(self) -> int:
        """``tokens_unmerged - tokens_merged`` (>= 0)."""
        return self.tokens_unmerged - self.tokens_merged


def build_samples(
    trajectories: Sequence[Trajectory],
    advantages_by_rollout: Mapping[str, Sequence[float]],
    *,
    trained_by_rollout: Mapping[str, Sequence[bool]] | None = None,
    merge: bool = True,
    step_rewards_by_rollout: Mapping[str, Sequence[float]] | None = None,
) -> SampleBatch:
    """The samples of a batch: :func:`merge_transitions` per trajectory (``merge=False``: one per transition).

    Args:
        trajectories: in any order; transitions keep their order within each.
        advantages_by_rollout: ``rollout_id -> advantages_T``, one advantage per transition.
        trained_by_rollout: ``rollout_id -> trained_T`` (see :func:`merge_transitions`); missing: all trained.
        merge: merge transitions that extend each other (default) or not.
        step_rewards_by_rollout: ``rollout_id -> step_rewards_T`` for PPO with a value head (see
            :func:`merge_transitions`); ``None``: no token rewards.

    Returns:
        A :class:`SampleBatch` (``tokens_unmerged`` counts every transition, trained or not).

    Raises:
        ConfigError: a rollout has no advantages, or lengths differ (see :func:`merge_transitions`).
    """
    samples: list[TrainingSample] = []
    tokens_unmerged = 0
    for trajectory in trajectories:
        if trajectory.rollout_id not in advantages_by_rollout:
            raise ConfigError(
                f"no advantage for rollout {trajectory.rollout_id}; compute advantages for every trajectory's rollout"
            )
        advantages = advantages_by_rollout[trajectory.rollout_id]
        trained = trained_by_rollout.get(trajectory.rollout_id) if trained_by_rollout is not None else None
        n = len(trajectory.transitions)
        if len(advantages) != n or (trained is not None and len(trained) != n):
            raise ConfigError(
                f"rollout {trajectory.rollout_id}: got {n} transitions, {len(advantages)} advantages and "
                f"{n if trained is None else len(trained)} trained flags; give one of each per transition"
            )
        tokens_unmerged += sum(len(t.prompt_token_ids) + len(t.response_token_ids) for t in trajectory.transitions)
        steps = None if step_rewards_by_rollout is None else step_rewards_by_rollout[trajectory.rollout_id]
        if merge:
            samples.extend(
                merge_transitions(
                    trajectory.transitions, advantages, trajectory.rollout_id, trained_T=trained, step_rewards_T=steps
                )
            )
            continue
        for k, transition in enumerate(trajectory.transitions):
            samples.extend(
                merge_transitions(
                    [transition],
                    [advantages[k]],
                    trajectory.rollout_id,
                    trained_T=None if trained is None else [trained[k]],
                    step_rewards_T=None if steps is None else [steps[k]],
                )
            )
    return SampleBatch(samples, tokens_unmerged, sum(s.n_tokens for s in samples))


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


@dataclass(frozen=True)
class PackedMicroBatch:
    """One micro-batch whose sequences are packed several to a row (:func:`plan_packed_micro_batches`).

    Attributes:
        indices: ``(N,)`` indices into the planned lengths, in collation order.
        rows: ``(N,)`` the packed row of each sequence, ``0 .. n_rows - 1``.
        offsets: ``(N,)`` where each sequence starts in its row.
        n_rows: packed rows.
        width: the longest row (positions per row once packed; shorter rows are padded to it).
    """

    indices: list[int]
    rows: list[int]
    offsets: list[int]
    n_rows: int
    width: int


def plan_packed_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[PackedMicroBatch]:
    """Pack sequences several to a row, then group the rows into micro-batches of at most ``max_tokens`` positions.

    Rows have the capacity of the longest sequence. Sequences are placed longest first, each into the first row
    with room for it (first-fit decreasing bin packing, Johnson 1974: at most 11/9 of the optimal number of rows,
    plus a constant), so a short sequence fills the space a long one left instead of being padded to it. Rows are
    then grouped in order, ``max(1, max_tokens // capacity)`` to a micro-batch; a micro-batch's ``width`` is its
    fullest row, so it forwards ``n_rows * width <= max_tokens`` positions (one row when the longest sequence
    alone exceeds the budget).

    Args:
        lengths: ``(N,)`` sequence lengths (>= 1).
        max_tokens: positions per micro-batch, padding included (>= 1).

    Returns:
        The micro-batches; every index appears in exactly one, once.

    Raises:
        ConfigError: ``max_tokens < 1`` or a length below 1.
    """
    if max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, got {max_tokens}")
    if any(n < 1 for n in lengths):
        raise ConfigError(f"every sequence length must be >= 1, got {min(lengths)}")
    if not lengths:
        return []
    capacity = max(lengths)
    bins: list[list[int]] = []
    used: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for b, filled in enumerate(used):
            if filled + lengths[i] <= capacity:
                bins[b].append(i)
                used[b] += lengths[i]
                break
        else:
            bins.append([i])
            used.append(lengths[i])
    per_batch = max(1, max_tokens // capacity)
    plans: list[PackedMicroBatch] = []
    for first in range(0, len(bins), per_batch):
        group = bins[first : first + per_batch]
        indices, rows, offsets = [], [], []
        for row, members in enumerate(group):
            offset = 0
            for i in members:
                indices.append(i)
                rows.append(row)
                offsets.append(offset)
                offset += lengths[i]
        width = max(used[first : first + per_batch])
        plans.append(PackedMicroBatch(indices, rows, offsets, len(group), width))
    return plans
