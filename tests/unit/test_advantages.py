"""Advantage estimators: hand-computed golden numbers and the invariants of STYLE.md section 4."""

from __future__ import annotations

import math

import pytest

from agentbolt.adapter.advantages import (
    ADVANTAGE_ESTIMATORS,
    BATCH_ADVANTAGE_ESTIMATORS,
    advantages_by_group,
    compute_advantages,
    get_advantage_estimator,
    group_indices,
    grpo_advantages,
    register_advantage_estimator,
    register_batch_advantage_estimator,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from agentbolt.errors import ConfigError

EPS = 1e-6


def test_grpo_one_success_in_four() -> None:
    # rewards [1, 0, 0, 0]: mean = 0.25; centered = [0.75, -0.25, -0.25, -0.25]
    # sum of squares = 0.5625 + 3 * 0.0625 = 0.75; Bessel variance = 0.75 / (4 - 1) = 0.25; std = 0.5
    # A = centered / (0.5 + eps) = [1.5, -0.5, -0.5, -0.5] (times 0.5 / (0.5 + eps))
    got = grpo_advantages([1.0, 0.0, 0.0, 0.0])
    expected = [0.75 / (0.5 + EPS), -0.25 / (0.5 + EPS), -0.25 / (0.5 + EPS), -0.25 / (0.5 + EPS)]
    assert got == pytest.approx(expected, rel=1e-12)
    assert got == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)


def test_grpo_two_of_four() -> None:
    # rewards [1, 1, 0, 0]: mean 0.5; centered [0.5, 0.5, -0.5, -0.5]; variance = 4 * 0.25 / 3 = 1/3
    # std = 1/sqrt(3) = 0.57735...; A = +-0.5 * sqrt(3) = +-0.866025...
    got = grpo_advantages([1.0, 1.0, 0.0, 0.0], eps=0.0)
    half_sqrt3 = 0.5 * math.sqrt(3.0)
    assert got == pytest.approx([half_sqrt3, half_sqrt3, -half_sqrt3, -half_sqrt3], rel=1e-12)


def test_grpo_without_std_is_mean_centering() -> None:
    # rewards [3, 1, 2]: mean 2; A = [1, -1, 0]
    assert grpo_advantages([3.0, 1.0, 2.0], scale_by_std=False) == [1.0, -1.0, 0.0]


def test_single_rollout_group_gives_zero() -> None:
    assert grpo_advantages([0.7]) == [0.0]
    assert grpo_advantages([0.7], scale_by_std=False) == [0.0]
    assert rloo_advantages([0.7]) == [0.0]
    assert grpo_advantages([]) == []


@pytest.mark.parametrize("reward", [0.0, 1.0, 0.1, -3.7])
def test_equal_rewards_give_exact_zeros(reward: float) -> None:
    # 0.1 * 3 is not exactly 0.3 in floating point; the estimator must still return exact zeros
    for estimator in ADVANTAGE_ESTIMATORS.values():
        assert estimator([reward] * 3) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("rewards", [[1.0, 0.0, 0.0, 0.0], [0.2, 0.9, 0.4], [5.0, -1.0, 2.5, 2.5, 0.0]])
@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_zero_mean_and_shift_invariance(name: str, rewards: list[float]) -> None:
    estimator = get_advantage_estimator(name)
    base = estimator(rewards)
    assert math.fsum(base) == pytest.approx(0.0, abs=1e-9)
    shifted = estimator([r + 10.0 for r in rewards])
    assert shifted == pytest.approx(base, abs=1e-9)


def test_grpo_is_scale_invariant() -> None:
    # (c * r - c * mean) / (c * std) = (r - mean) / std, up to eps
    rewards = [0.2, 0.9, 0.4]
    assert grpo_advantages([10.0 * r for r in rewards], eps=0.0) == pytest.approx(grpo_advantages(rewards, eps=0.0))


def test_rloo_hand_computed() -> None:
    # rewards [1, 0, 0, 0]: A_0 = 1 - 0/3 = 1; A_i = 0 - 1/3 = -1/3 for the others
    assert rloo_advantages([1.0, 0.0, 0.0, 0.0]) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


def test_non_finite_reward_is_refused() -> None:
    with pytest.raises(ConfigError, match="finite"):
        grpo_advantages([1.0, math.nan])
    with pytest.raises(ConfigError, match="eps"):
        grpo_advantages([1.0, 0.0], eps=-1.0)


def test_group_indices_keeps_first_occurrence_order() -> None:
    assert group_indices(["b", "a", "b", "c", "a"]) == {"b": [0, 2], "a": [1, 4], "c": [3]}
    assert group_indices([]) == {}


def test_advantages_by_group_normalizes_within_each_task() -> None:
    # task t1: [1, 0] -> mean 0.5, Bessel std = sqrt(0.5) -> +-0.5 / 0.7071 = +-0.7071
    # task t2: [0.3] alone -> 0
    got = advantages_by_group([1.0, 0.3, 0.0], ["t1", "t2", "t1"], get_advantage_estimator("grpo"))
    assert got == pytest.approx([math.sqrt(0.5), 0.0, -math.sqrt(0.5)], abs=1e-5)
    with pytest.raises(ConfigError, match="group keys"):
        advantages_by_group([1.0], ["a", "b"])


def test_registry_errors_name_known_estimators() -> None:
    with pytest.raises(ConfigError, match="known: gae, grpo, grpo_no_std, reinforce_pp, reinforce_pp_baseline, rloo"):
        get_advantage_estimator("ppo")
    with pytest.raises(ConfigError, match="known: gae, grpo, grpo_no_std, reinforce_pp, reinforce_pp_baseline, rloo"):
        compute_advantages([1.0], ["a"], "ppo")
    with pytest.raises(ConfigError, match="already registered"):
        register_advantage_estimator("grpo", grpo_advantages)
    with pytest.raises(ConfigError, match="already registered"):
        register_advantage_estimator("reinforce_pp", grpo_advantages)
    with pytest.raises(ConfigError, match="already registered"):
        register_batch_advantage_estimator("rloo", reinforce_pp_baseline_advantages)


# ---- REINFORCE++ (Hu 2025, arXiv:2501.03262, eq. 10): normalized over the whole batch --------------------------------

BATCH = [1.0, 0.0, 3.0, 1.0]
KEYS = ["a", "a", "b", "b"]


def test_reinforce_pp_golden() -> None:
    # batch mean = 5 / 4 = 1.25; centered = [-0.25, -1.25, 1.75, -0.25]
    # sum of squares = 0.0625 + 1.5625 + 3.0625 + 0.0625 = 4.75; Bessel variance = 4.75 / 3; std = 1.2583057...
    # A = centered / std = [-0.198680, -0.993399, 1.390759, -0.198680]; group keys play no part
    std = math.sqrt(4.75 / 3)
    expected = [-0.25 / std, -1.25 / std, 1.75 / std, -0.25 / std]
    assert reinforce_pp_advantages(BATCH, eps=0.0) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx([-0.198680, -0.993399, 1.390759, -0.198680], abs=1e-6)
    assert compute_advantages(BATCH, KEYS, "reinforce_pp") == pytest.approx(expected, rel=1e-5)


def test_reinforce_pp_baseline_golden() -> None:
    # group means: a = (1 + 0) / 2 = 0.5, b = (3 + 1) / 2 = 2 -> x = [0.5, -0.5, 1, -1]
    # batch mean 0; sum of squares = 0.25 + 0.25 + 1 + 1 = 2.5; Bessel variance = 2.5 / 3 = 5/6
    # A = x / sqrt(5/6) = x * sqrt(1.2) = [0.547723, -0.547723, 1.095445, -1.095445]
    s = math.sqrt(1.2)
    expected = [0.5 * s, -0.5 * s, 1.0 * s, -1.0 * s]
    assert reinforce_pp_baseline_advantages(BATCH, KEYS) == pytest.approx(expected, rel=1e-5)
    assert compute_advantages(BATCH, KEYS, "reinforce_pp_baseline") == pytest.approx(expected, rel=1e-5)
    # unlike GRPO, group b's larger spread is not divided away: GRPO gives +-0.7071 in both groups
    assert compute_advantages(BATCH, KEYS, "grpo") == pytest.approx([math.sqrt(0.5), -math.sqrt(0.5)] * 2, abs=1e-5)


def test_reinforce_pp_degenerate_batches_give_exact_zeros() -> None:
    assert reinforce_pp_advantages([0.3]) == [0.0]
    assert reinforce_pp_advantages([0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]
    assert reinforce_pp_advantages([]) == []
    # every group constant: every x is 0 after the group baseline
    assert reinforce_pp_baseline_advantages([0.1, 0.1, 0.7], ["a", "a", "b"]) == [0.0, 0.0, 0.0]


def test_reinforce_pp_refuses_bad_input() -> None:
    with pytest.raises(ConfigError, match="group key"):
        reinforce_pp_advantages([1.0, 0.0], subtract_group_mean=True)
    with pytest.raises(ConfigError, match="finite"):
        reinforce_pp_advantages([1.0, math.inf])
    with pytest.raises(ConfigError, match="eps"):
        reinforce_pp_advantages([1.0, 0.0], eps=-1.0)
    with pytest.raises(ConfigError, match="whole batch"):
        get_advantage_estimator("reinforce_pp")
    with pytest.raises(ConfigError, match="group keys"):
        compute_advantages([1.0, 0.0], ["a"], "reinforce_pp")


@pytest.mark.parametrize("name", sorted(BATCH_ADVANTAGE_ESTIMATORS))
def test_batch_estimators_zero_mean_and_shift_invariance(name: str) -> None:
    rewards = [5.0, -1.0, 2.5, 2.5, 0.0, 0.4]
    keys = ["a", "a", "b", "b", "c", "c"]
    base = compute_advantages(rewards, keys, name)
    assert math.fsum(base) == pytest.approx(0.0, abs=1e-9)
    assert compute_advantages([r + 10.0 for r in rewards], keys, name) == pytest.approx(base, abs=1e-9)


def test_compute_advantages_runs_group_estimators_within_groups() -> None:
    # RLOO per group: a = [1, 0] -> [1 - 0, 0 - 1] = [1, -1]; b = [3, 1] -> [2, -2]
    assert compute_advantages(BATCH, KEYS, "rloo") == [1.0, -1.0, 2.0, -2.0]
