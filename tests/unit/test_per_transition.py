"""Per-transition advantages, the max_tokens policy, and a step's samples (credit -> advantages -> merged samples)."""

from __future__ import annotations

import math

import pytest

from agentbolt.adapter.batch import samples_for_step
from agentbolt.adapter.credit import BROADCAST, build_credit_scheme, discounted
from agentbolt.adapter.per_transition import apply_truncation_policy, outcome_scales, transition_advantages
from agentbolt.config import GRPOConfig
from agentbolt.errors import ConfigError
from agentbolt.types import Trajectory, Transition

SQRT_HALF = math.sqrt(0.5)  # 0.70711: the sample std of rewards [1, 0]: sqrt(((1-.5)^2 + (0-.5)^2) / (2-1))


def test_transition_advantage_adds_the_scaled_deviation_from_the_outcome() -> None:
    # A_i = 0.5, R = 1, s = 2: r = [1, 0, 2] -> 0.5 + (0, -1, 1) / 2 = [0.5, 0.0, 1.0]
    assert transition_advantages(0.5, [1.0, 0.0, 2.0], 1.0, 2.0) == [0.5, 0.0, 1.0]
    with pytest.raises(ConfigError, match="scale must be > 0"):
        transition_advantages(0.5, [1.0], 1.0, 0.0)


def test_outcome_scales_follow_the_estimator() -> None:
    rewards, keys = [1.0, 0.0, 3.0, 3.0], ["a", "a", "b", "b"]
    # grpo: group a std = sqrt(0.5); group b std 0 -> 1
    assert outcome_scales(rewards, keys, "grpo") == pytest.approx([SQRT_HALF, SQRT_HALF, 1.0, 1.0])
    # reinforce_pp: batch std of [1, 0, 3, 3]: mean 1.75, squares .5625 + 3.0625 + 1.5625 * 2 = 6.75, /3 = 2.25 -> 1.5
    assert outcome_scales(rewards, keys, "reinforce_pp") == [1.5] * 4
    # reinforce_pp_baseline: centered [.5, -.5, 0, 0]: mean 0, squares .5, /3 -> sqrt(1/6)
    assert outcome_scales(rewards, keys, "reinforce_pp_baseline") == pytest.approx([math.sqrt(1 / 6)] * 4)
    assert outcome_scales(rewards, keys, "rloo") == [1.0] * 4


def test_truncation_policies() -> None:
    reasons = ["stop", "length", None]
    assert apply_truncation_policy(reasons, [1.0, 1.0, 1.0], "keep", -1.0) == ([1.0, 1.0, 1.0], [True] * 3)
    assert apply_truncation_policy(reasons, [1.0, 1.0, 1.0], "mask", -1.0) == ([1.0, 1.0, 1.0], [True, False, True])
    assert apply_truncation_policy(reasons, [1.0, 1.0, 1.0], "penalize", -1.0) == ([1.0, -1.0, 1.0], [True] * 3)
    with pytest.raises(ConfigError, match="unknown max_tokens policy"):
        apply_truncation_policy(reasons, [1.0] * 3, "drop", -1.0)  # type: ignore[arg-type]


def _call(prompt: list[int], response: list[int], finish: str = "stop") -> Transition:
    return Transition(
        prompt_token_ids=prompt,
        response_token_ids=response,
        sampling_logprobs=[-0.1] * len(response),
        finish_reason=finish,
    )


def _group() -> list[Trajectory]:
    """One task, two rollouts: a (R = 1; its second call, which extends the first, was cut at max_tokens), b (R = 0)."""
    a = Trajectory(
        rollout_id="a",
        attempt_id="at",
        task_id="t",
        final_reward=1.0,
        transitions=[_call([1], [2]), _call([1, 2, 3], [4], "length")],
    )
    b = Trajectory(rollout_id="b", attempt_id="at", task_id="t", final_reward=0.0, transitions=[_call([1], [5])])
    return [a, b]


def _view(trajectories: list[Trajectory], **kwargs: object) -> list[tuple[str, list[int], list[int], float]]:
    batch = samples_for_step(trajectories, **kwargs).batch  # type: ignore[arg-type]
    return [(s.rollout_id, s.input_ids, s.loss_mask, s.advantage) for s in batch.samples]


def test_broadcast_keep_gives_the_rollout_advantage_and_merges() -> None:
    # GRPO on [1, 0]: mean .5, std sqrt(.5) -> A = +-0.5 / 0.70711 = +-0.70711; broadcast: A_t = A_i.
    got = _view(_group(), credit=BROADCAST, estimator="grpo")
    assert got == [
        ("a", [1, 2, 3, 4], [0, 1, 0, 1], pytest.approx(SQRT_HALF, rel=1e-5)),
        ("b", [1, 5], [0, 1], pytest.approx(-SQRT_HALF, rel=1e-5)),
    ]


def test_penalize_lowers_the_cut_call_and_splits_the_sample() -> None:
    # a's cut call gets r = -1: A = 0.70711 + (-1 - 1) / 0.70711 = 0.70711 - 2.82843 = -2.12132. Its advantage now
    # differs from the first call's, so the two calls are separate samples.
    trajectories = _group()
    got = _view(trajectories, credit=BROADCAST, estimator="grpo", truncated="penalize", truncated_reward=-1.0)
    assert got == [
        ("a", [1, 2], [0, 1], pytest.approx(SQRT_HALF, rel=1e-5)),
        ("a", [1, 2, 3, 4], [0, 0, 0, 1], pytest.approx(SQRT_HALF - 2 / SQRT_HALF, rel=1e-5)),
        ("b", [1, 5], [0, 1], pytest.approx(-SQRT_HALF, rel=1e-5)),
    ]
    assert [t.reward for t in trajectories[0].transitions] == [1.0, -1.0]  # written onto the transitions


def test_mask_keeps_the_cut_call_as_context_only() -> None:
    got = _view(_group(), credit=BROADCAST, estimator="grpo", truncated="mask")
    assert [(r, ids, mask) for r, ids, mask, _ in got] == [("a", [1, 2, 3, 4], [0, 1, 0, 0]), ("b", [1, 5], [0, 1])]


def test_discounted_credit_changes_per_transition_advantages() -> None:
    # discounted(0.5) on a (R = 1, T = 2): r = [0.5, 1]; A_t = 0.70711 + (r - 1) / 0.70711 = [0.0, 0.70711].
    got = _view(_group(), credit=discounted(0.5), estimator="grpo")
    assert got == [
        ("a", [1, 2], [0, 1], pytest.approx(0.0, abs=1e-5)),
        ("a", [1, 2, 3, 4], [0, 0, 0, 1], pytest.approx(SQRT_HALF, rel=1e-5)),
        ("b", [1, 5], [0, 1], pytest.approx(-SQRT_HALF, rel=1e-5)),
    ]


def test_batch_estimator_reinforce_pp_runs_by_name() -> None:
    # Two tasks of one rollout each: grpo would give 0 (groups of one); reinforce_pp normalizes over the batch
    # [1, 0] -> +-0.70711.
    a, b = _group()
    b = b.model_copy(update={"task_id": "other"})
    got = _view([a, b], credit=BROADCAST, estimator="reinforce_pp")
    assert [adv for *_, adv in got] == [pytest.approx(SQRT_HALF, rel=1e-5), pytest.approx(-SQRT_HALF, rel=1e-5)]
    assert [adv for *_, adv in _view([a, b], credit=BROADCAST, estimator="grpo")] == [0.0, 0.0]


def test_build_credit_scheme_from_config_values() -> None:
    assert build_credit_scheme("discounted", gamma=0.5)(1.0, 3) == [0.25, 0.5, 1.0]
    scheme = build_credit_scheme("intermediate", gamma=0.5, air_weights={"tool_call_failed": -0.5})
    a = _group()[0]
    a.transitions[0].metadata["air.tool_calls_failed"] = 2
    assert scheme(a) == pytest.approx([0.5 - 1.0, 1.0])  # 0.5 * 1 + 2 * -0.5 = -0.5; last call 1.0
    with pytest.raises(ConfigError, match="unknown AIR weight"):
        build_credit_scheme("intermediate", air_weights={"tool_ok": 1.0})
    with pytest.raises(ConfigError, match="takes no gamma"):
        build_credit_scheme("broadcast", gamma=0.5)
    with pytest.raises(ConfigError, match="unknown"):
        build_credit_scheme("nope")


def test_grpo_config_new_fields() -> None:
    config = GRPOConfig(credit_assignment="intermediate", credit_gamma=0.9, truncated="mask", merge_samples=False)
    assert (config.truncated, config.truncated_reward, config.merge_samples) == ("mask", -1.0, False)
    with pytest.raises(ValueError, match="truncated"):
        GRPOConfig(truncated="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="credit_gamma"):
        GRPOConfig(credit_gamma=1.5)
