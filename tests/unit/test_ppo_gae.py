"""PPO with a value head over multi-call trajectories: step rewards, token rewards in merged samples, and GAE over a
rollout split into two samples, all by hand."""

from __future__ import annotations

import pytest

from agentbolt.adapter.advantages import check_estimator_name, compute_advantages
from agentbolt.adapter.batch import samples_for_step
from agentbolt.adapter.credit import BROADCAST
from agentbolt.adapter.per_transition import step_rewards
from agentbolt.adapter.samples import TrainingSample, merge_transitions
from agentbolt.algorithms.rl.ppo_gae import rollout_gae
from agentbolt.config import GRPOConfig
from agentbolt.errors import ConfigError
from agentbolt.types import Trajectory, Transition


def _t(prompt: list[int], response: list[int]) -> Transition:
    return Transition(prompt_token_ids=prompt, response_token_ids=response, sampling_logprobs=[-1.0] * len(response))


def _s(ids: list[int], mask: list[int], rewards: list[float], rollout: str) -> TrainingSample:
    return TrainingSample(ids, mask, [0.0] * len(ids), 0.0, rollout, token_rewards=rewards)


def test_step_rewards_keep_the_outcome_on_the_last_call() -> None:
    assert step_rewards([1.0, 1.0, 1.0], 1.0) == [0.0, 0.0, 1.0]  # broadcast: only the outcome, at the end
    assert step_rewards([0.5, 0.7, 1.2], 1.0) == pytest.approx([-0.5, -0.3, 1.2])
    assert step_rewards([], 1.0) == []
    with pytest.raises(ConfigError, match="finite"):
        step_rewards([float("nan")], 1.0)


def test_merged_sample_carries_each_calls_reward_on_its_last_token() -> None:
    (sample,) = merge_transitions(
        [_t([1, 2], [3, 4]), _t([1, 2, 3, 4, 5], [6])], [0.0, 0.0], "r", step_rewards_T=[0.1, 1.0]
    )
    assert sample.input_ids == [1, 2, 3, 4, 5, 6] and sample.loss_mask == [0, 0, 1, 1, 0, 1]
    assert sample.token_rewards == [0.0, 0.0, 0.0, 0.1, 0.0, 1.0]
    # An untrained call that makes a sample of its own is left out; its reward moves to the previous sample.
    samples = merge_transitions(
        [_t([1], [2]), _t([7], [8])], [0.0, 0.0], "r", trained_T=[True, False], step_rewards_T=[0.2, 1.0]
    )
    assert [(s.input_ids, s.token_rewards) for s in samples] == [([1, 2], [0.0, pytest.approx(1.2)])]
    # ... or, when it comes first, to the next one's first trained token.
    samples = merge_transitions(
        [_t([7], [8]), _t([1], [2, 3])], [0.0, 0.0], "r", trained_T=[False, True], step_rewards_T=[0.5, 1.0]
    )
    assert [(s.input_ids, s.token_rewards) for s in samples] == [([1, 2, 3], [0.0, 0.5, 1.0])]
    plain = merge_transitions([_t([1], [2])], [0.3], "r")
    assert plain[0].token_rewards is None


def test_gae_flows_across_the_samples_of_one_rollout() -> None:
    # Rollout "a" was split into two samples (the second prompt does not extend the first), with rollout "b" between.
    # Broadcast, R = 1: step rewards [0, 1]. Trained steps of "a" in order: values [0.5, 0.4, 0.2, 0.6], rewards
    # [0, 0, 0, 1]; gamma = 1, lambda = 0.5, backwards:
    #   t3: delta = 1 - 0.6 = 0.4                A3 = 0.4
    #   t2: delta = 0 + 0.6 - 0.2 = 0.4          A2 = 0.4 + 0.5 * 0.4 = 0.6
    #   t1: delta = 0 + 0.2 - 0.4 = -0.2         A1 = -0.2 + 0.5 * 0.6 = 0.1
    #   t0: delta = 0 + 0.4 - 0.5 = -0.1         A0 = -0.1 + 0.5 * 0.1 = -0.05
    # returns = A + V = [0.45, 0.5, 0.8, 1.0]. Rollout "b" (one token, reward 2 on an untrained token after it,
    # which moves back onto it): A = 2 - 0.5 = 1.5, return 2.
    a1 = _s([1, 2, 3, 4], [0, 0, 1, 1], [0.0, 0.0, 0.0, 0.0], "a")
    b = _s([1, 5, 6], [0, 1, 0], [0.0, 0.0, 2.0], "b")
    a2 = _s([9, 5, 6], [0, 1, 1], [0.0, 0.0, 1.0], "a")
    values = [[9.0, 9.0, 0.5, 0.4], [9.0, 0.5, 9.0], [9.0, 0.2, 0.6]]  # 9.0: untrained tokens, never read
    got_a1, got_b, got_a2 = rollout_gae([a1, b, a2], values, gamma=1.0, lam=0.5)
    assert got_a1.token_advantages == pytest.approx([0.0, 0.0, -0.05, 0.1])
    assert got_a1.token_returns == pytest.approx([0.0, 0.0, 0.45, 0.5])
    assert got_a2.token_advantages == pytest.approx([0.0, 0.6, 0.4])
    assert got_a2.token_returns == pytest.approx([0.0, 0.8, 1.0])
    assert got_b.token_advantages == pytest.approx([0.0, 1.5, 0.0]) and got_b.token_returns == pytest.approx([0, 2, 0])
    assert got_a1.input_ids == a1.input_ids and got_a1.token_rewards == a1.token_rewards  # otherwise unchanged

    with pytest.raises(ConfigError, match="value lists"):
        rollout_gae([a1], [])
    with pytest.raises(ConfigError, match="no token_rewards"):
        rollout_gae([TrainingSample([1, 2], [0, 1], [0.0, 0.0], 0.0, "x")], [[0.0, 0.0]])


def test_samples_for_step_under_gae_gives_step_rewards_and_zero_advantages() -> None:
    a = Trajectory(rollout_id="a", attempt_id="at", task_id="t", final_reward=1.0, transitions=[_t([1], [2])])
    b = Trajectory(rollout_id="b", attempt_id="at", task_id="t", final_reward=0.0, transitions=[_t([1], [3])])
    step = samples_for_step([a, b], credit=BROADCAST, estimator="gae")
    assert [(s.advantage, s.token_rewards) for s in step.batch.samples] == [(0.0, [0.0, 1.0]), (0.0, [0.0, 0.0])]


def test_gae_is_a_known_name_that_compute_advantages_refers_to_the_trainer() -> None:
    check_estimator_name("gae")
    check_estimator_name("grpo")
    with pytest.raises(ConfigError, match="known: .*gae"):
        check_estimator_name("nope")
    with pytest.raises(ConfigError, match="value head"):
        compute_advantages([1.0], ["t"], "gae")
    with pytest.raises(ValueError, match="gae_gamma"):  # pydantic's ValidationError, a ValueError
        GRPOConfig(advantage_estimator="gae", credit_assignment="discounted")
    with pytest.raises(ValueError, match="stale_policy drop"):
        GRPOConfig(advantage_estimator="gae", stale_policy="reweight")
