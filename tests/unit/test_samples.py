"""Training samples from trajectories, and micro-batch planning."""

from __future__ import annotations

import pytest

from agentbolt.adapter.samples import (
    TrainingSample,
    build_samples,
    merge_transitions,
    plan_micro_batches,
    plan_packed_micro_batches,
    samples_from_trajectories,
)
from agentbolt.algorithms.rl.losses import rollout_mean_weights
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


def _call(prompt: list[int], response: list[int], logprobs: list[float]) -> Transition:
    return Transition(prompt_token_ids=prompt, response_token_ids=response, sampling_logprobs=logprobs)


def test_three_calls_that_extend_each_other_merge_into_one_sample() -> None:
    # Call 2's prompt = call 1's prompt + response + tool token 5; call 3's = call 2's prompt + response + 7, 8.
    calls = [
        _call([1, 2], [3, 4], [-0.1, -0.2]),
        _call([1, 2, 3, 4, 5], [6], [-0.3]),
        _call([1, 2, 3, 4, 5, 6, 7, 8], [9, 10], [-0.4, -0.5]),
    ]
    trajectory = Trajectory(rollout_id="ro-m", attempt_id="at", task_id="t", transitions=calls, final_reward=1.0)
    batch = build_samples([trajectory], {"ro-m": [0.5, 0.5, 0.5]})
    assert len(batch.samples) == 1
    (sample,) = batch.samples
    assert sample.input_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert sample.loss_mask == [0, 0, 1, 1, 0, 1, 0, 0, 1, 1]  # 1 exactly on the generated 3, 4 / 6 / 9, 10
    assert sample.sampling_logprobs == [0.0, 0.0, -0.1, -0.2, 0.0, -0.3, 0.0, 0.0, -0.4, -0.5]
    assert (sample.advantage, sample.rollout_id) == (0.5, "ro-m")
    # unmerged: (2 + 2) + (5 + 1) + (8 + 2) = 4 + 6 + 10 = 20 tokens; merged: 10; saved 10
    assert (batch.tokens_unmerged, batch.tokens_merged, batch.tokens_saved) == (20, 10, 10)
    # Without merging: three samples, the same 20 tokens.
    unmerged = build_samples([trajectory], {"ro-m": [0.5, 0.5, 0.5]}, merge=False)
    assert [s.n_tokens for s in unmerged.samples] == [4, 6, 10] and unmerged.tokens_saved == 0


def test_four_calls_split_where_the_prompt_rewrites_history() -> None:
    # Call 3 rewrites the history (token 3, 4 replaced by 99): it does not extend call 2, so a new sample starts;
    # call 4 extends call 3 and joins it.
    calls = [
        _call([1, 2], [3, 4], [-0.1, -0.2]),
        _call([1, 2, 3, 4, 5], [6], [-0.3]),
        _call([1, 2, 99, 5, 6, 7], [8], [-0.4]),
        _call([1, 2, 99, 5, 6, 7, 8, 11], [12], [-0.5]),
    ]
    trajectory = Trajectory(rollout_id="ro-s", attempt_id="at", task_id="t", transitions=calls, final_reward=1.0)
    batch = build_samples([trajectory], {"ro-s": [1.0] * 4})
    first, second = batch.samples
    assert first.input_ids == [1, 2, 3, 4, 5, 6]
    assert first.loss_mask == [0, 0, 1, 1, 0, 1]
    assert first.sampling_logprobs == [0.0, 0.0, -0.1, -0.2, 0.0, -0.3]
    assert second.input_ids == [1, 2, 99, 5, 6, 7, 8, 11, 12]
    assert second.loss_mask == [0, 0, 0, 0, 0, 0, 1, 0, 1]
    assert second.sampling_logprobs == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.4, 0.0, -0.5]
    assert first.rollout_id == second.rollout_id == "ro-s"
    # unmerged: 4 + 6 + 7 + 9 = 26; merged: 6 + 9 = 15; saved 11
    assert (batch.tokens_unmerged, batch.tokens_merged, batch.tokens_saved) == (26, 15, 11)


def test_merge_needs_equal_advantages_and_masks_untrained_calls() -> None:
    calls = [_call([1], [2], [-0.1]), _call([1, 2, 3], [4], [-0.2]), _call([1, 2, 3, 4, 5], [6], [-0.3])]
    # Advantage changes at call 3: calls 1-2 merge, call 3 is alone.
    samples = merge_transitions(calls, [1.0, 1.0, 2.0], "ro")
    assert [(s.input_ids, s.loss_mask, s.advantage) for s in samples] == [
        ([1, 2, 3, 4], [0, 1, 0, 1], 1.0),
        ([1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 1], 2.0),
    ]
    # Call 2 not trained (e.g. cut at max_tokens under the "mask" policy): its tokens stay as context, mask 0.
    (merged,) = merge_transitions(calls, [1.0] * 3, "ro", trained_T=[True, False, True])
    assert merged.loss_mask == [0, 1, 0, 0, 0, 1]
    assert merged.sampling_logprobs == [0.0, -0.1, 0.0, 0.0, 0.0, -0.3]
    # A lone untrained call makes no sample.
    assert merge_transitions(calls[:1], [1.0], "ro", trained_T=[False]) == []
    with pytest.raises(ConfigError, match="one of each per transition"):
        merge_transitions(calls, [1.0], "ro")


def test_merged_samples_keep_rollout_mean_weights_per_rollout() -> None:
    # rollout a: one merged sample of 3 trained tokens; rollout b: two samples of 1 trained token each.
    # rollout_mean: R = 2 rollouts; a: 1 / (2 * 3) per token; b: 1 / (2 * 2) per token -> each rollout totals 1/2.
    a = Trajectory(
        rollout_id="a",
        attempt_id="at",
        task_id="t",
        final_reward=1.0,
        transitions=[_call([1], [2, 3], [-0.1, -0.1]), _call([1, 2, 3, 4], [5], [-0.1])],
    )
    b = Trajectory(
        rollout_id="b",
        attempt_id="at",
        task_id="t",
        final_reward=0.0,
        transitions=[_call([1], [2], [-0.1]), _call([7], [8], [-0.1])],
    )
    batch = build_samples([a, b], {"a": [1.0, 1.0], "b": [-1.0, -1.0]})
    ids = [s.rollout_id for s in batch.samples]
    assert ids == ["a", "b", "b"]
    weights = rollout_mean_weights(ids, [s.n_loss_tokens for s in batch.samples])
    assert weights == pytest.approx([1 / 6, 1 / 4, 1 / 4])


def test_packed_micro_batches_fill_rows_longest_first() -> None:
    # capacity 10 (the longest); first-fit decreasing: 10 | 7+3 | 6+4 | 5+2(+...)
    lengths = [3, 10, 6, 7, 2, 4, 5]
    plans = plan_packed_micro_batches(lengths, max_tokens=20)  # 2 rows of 10 per micro-batch
    assert [(p.n_rows, p.width) for p in plans] == [(2, 10), (2, 10)]
    assert [p.indices for p in plans] == [[1, 3, 0], [2, 5, 6, 4]]
    assert [p.rows for p in plans] == [[0, 1, 1], [0, 0, 1, 1]]
    assert [p.offsets for p in plans] == [[0, 0, 7], [0, 6, 0, 5]]
    assert sorted(i for p in plans for i in p.indices) == list(range(len(lengths)))
    # the last micro-batch's width is its fullest row; a budget below the capacity still gives one row each
    (single,) = plan_packed_micro_batches([4, 3], max_tokens=100)
    assert (single.n_rows, single.width, single.indices, single.offsets) == (2, 4, [0, 1], [0, 0])
    assert [p.n_rows for p in plan_packed_micro_batches([5, 5, 1], max_tokens=3)] == [1, 1, 1]
    assert plan_packed_micro_batches([], max_tokens=8) == []


def test_packed_micro_batches_refuse_bad_budgets_and_lengths() -> None:
    with pytest.raises(ConfigError, match="max_tokens"):
        plan_packed_micro_batches([3], max_tokens=0)
    with pytest.raises(ConfigError, match="length"):
        plan_packed_micro_batches([3, 0], max_tokens=8)
