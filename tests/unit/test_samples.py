"""Training samples from trajectories, and micro-batch planning."""

from __future__ import annotations

import pytest

from agentbolt.algorithms.rl.samples import TrainingSample, plan_micro_batches, samples_from_trajectories
from agentbolt.errors import ConfigError
from agentbolt.types import Trajectory, Transition


def _trajectory(rollout_id: str, *calls: tuple[list[int], list[int]], temperature: float | None = None) -> Trajectory:
    transitions = [
        Transition(
            prompt_token_ids=prompt,
            response_token_ids=response,
            sampling_logprobs=[-0.5] * len(response),
            span_id=f"{rollout_id}-{i}",
            metadata={} if temperature is None else {"temperature": temperature},
        )
        for i, (prompt, response) in enumerate(calls)
    ]
    return Trajectory(rollout_id=rollout_id, attempt_id="at-1", task_id="t", transitions=transitions, final_reward=1.0)


def test_one_sample_per_transition_with_mask_on_the_response() -> None:
    trajectories = [
        _trajectory("ro-a", ([5, 6, 7], [8, 9]), ([5, 6, 7, 8, 9, 3], [4]), temperature=0.7),
        _trajectory("ro-b", ([1], [2, 3, 4]), temperature=0.0),
    ]
    samples = samples_from_trajectories(trajectories, {"ro-a": 1.5, "ro-b": -0.5})
    assert [s.rollout_id for s in samples] == ["ro-a", "ro-a", "ro-b"]
    first = samples[0]
    assert first.input_ids == [5, 6, 7, 8, 9]
    assert first.loss_mask == [0, 0, 0, 1, 1]
    assert first.sampling_logprobs == [0.0, 0.0, 0.0, -0.5, -0.5]
    assert first.advantage == 1.5
    assert first.sampling_temperature == 0.7
    assert (first.n_tokens, first.n_loss_tokens) == (5, 2)
    assert samples[1].loss_mask == [0, 0, 0, 0, 0, 0, 1]
    assert samples[2].advantage == -0.5
    assert samples[2].sampling_temperature == 1.0  # greedy calls record logprobs of the plain logits


def test_missing_advantage_or_empty_prompt_is_refused() -> None:
    with pytest.raises(ConfigError, match="no advantage for rollout ro-a"):
        samples_from_trajectories([_trajectory("ro-a", ([1], [2]))], {})
    with pytest.raises(ConfigError, match="empty prompt"):
        samples_from_trajectories([_trajectory("ro-a", ([], [2]))], {"ro-a": 1.0})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_mask": [0, 1]}, "one entry per token"),
        ({"loss_mask": [0, 2, 1]}, "0 or 1"),
        ({"loss_mask": [1, 1, 1]}, r"loss_mask\[0\]"),
        ({"advantage": float("nan")}, "finite"),
        ({"sampling_temperature": 0.0}, "temperature"),
    ],
)
def test_training_sample_validation(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {
        "input_ids": [1, 2, 3],
        "loss_mask": [0, 1, 1],
        "sampling_logprobs": [0.0, -1.0, -1.0],
        "advantage": 1.0,
        "rollout_id": "ro-1",
    }
    fields.update(kwargs)
    with pytest.raises(ConfigError, match=message):
        TrainingSample(**fields)  # type: ignore[arg-type]


def test_plan_micro_batches_packs_longest_first_within_budget() -> None:
    lengths = [10, 50, 20, 40, 30, 5]
    # sorted: 50(1) 40(3) 30(4) 20(2) 10(0) 5(5); budget 100 tokens incl. padding:
    # [50, 40] -> 2 * 50 = 100; adding 30 would be 3 * 50 = 150 > 100
    # [30, 20, 10] -> 3 * 30 = 90; adding 5 would be 4 * 30 = 120 > 100
    # [5]
    assert plan_micro_batches(lengths, 100) == [[1, 3], [4, 2, 0], [5]]


def test_plan_micro_batches_edge_cases() -> None:
    assert plan_micro_batches([], 10) == []
    assert plan_micro_batches([300, 2], 100) == [[0], [1]]  # too long: alone, never dropped
    plan = plan_micro_batches([7, 7, 7, 7], 14)
    assert plan == [[0, 1], [2, 3]]  # ties keep input order
    assert sorted(i for batch in plan_micro_batches([3, 9, 1, 4, 4], 8) for i in batch) == [0, 1, 2, 3, 4]
    with pytest.raises(ConfigError, match="max_tokens"):
        plan_micro_batches([1], 0)
