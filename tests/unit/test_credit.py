"""Credit assignment: hand-computed rewards for every scheme, output checks, and the registry."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from agentbolt.adapter.credit import (
    AIR_EXCEPTIONS,
    AIR_FORMAT_VALID,
    AIR_TOOL_CALLS_FAILED,
    AIR_TOOL_CALLS_OK,
    BROADCAST,
    CREDIT_ASSIGNMENT,
    AIRSignals,
    AIRWeights,
    air_reward,
    air_signals,
    broadcast,
    discounted,
    discounted_rewards,
    from_function,
    get_credit_assignment,
    intermediate,
    register_credit_assignment,
    resolve_credit_assignment,
)
from agentbolt.errors import ConfigError
from agentbolt.types import Trajectory, Transition


def _trajectory(final_reward: float | None, *metadata: dict[str, Any]) -> Trajectory:
    transitions = [
        Transition(prompt_token_ids=[1], response_token_ids=[2], sampling_logprobs=[-0.1], metadata=dict(m))
        for m in metadata
    ]
    return Trajectory(
        rollout_id="ro-1", attempt_id="at-1", task_id="t", transitions=transitions, final_reward=final_reward
    )


# ---- broadcast -----------------------------------------------------------------------------------------------------


def test_broadcast_gives_every_transition_the_final_reward() -> None:
    assert broadcast(0.5, 3) == [0.5, 0.5, 0.5]
    assert broadcast(-1.0, 1) == [-1.0]
    assert broadcast(1.0, 0) == []
    assert BROADCAST(_trajectory(0.5, {}, {}, {})) == [0.5, 0.5, 0.5]


def test_broadcast_rejects_bad_input() -> None:
    with pytest.raises(ConfigError, match="finite"):
        broadcast(math.inf, 2)
    with pytest.raises(ConfigError, match="n_transitions"):
        broadcast(1.0, -1)


# ---- discounted ----------------------------------------------------------------------------------------------------


def test_discounted_golden() -> None:
    # T = 3, gamma = 0.5, R = 1: gamma^(T-1-t) * R = [0.5^2, 0.5^1, 0.5^0] = [0.25, 0.5, 1.0]
    assert discounted_rewards(1.0, 3, 0.5) == [0.25, 0.5, 1.0]
    assert discounted(0.5)(_trajectory(1.0, {}, {}, {})) == [0.25, 0.5, 1.0]
    # T = 2, gamma = 0.9, R = 2: [0.9 * 2, 2] = [1.8, 2.0]
    assert discounted(0.9)(_trajectory(2.0, {}, {})) == pytest.approx([1.8, 2.0], rel=1e-15)
    # R = -1, T = 4, gamma = 0.5: [-0.125, -0.25, -0.5, -1]
    assert discounted_rewards(-1.0, 4, 0.5) == [-0.125, -0.25, -0.5, -1.0]
    # gamma = 1 is broadcast
    assert discounted_rewards(0.7, 3, 1.0) == broadcast(0.7, 3)
    # the registered scheme uses DEFAULT_GAMMA = 0.9: [0.81, 0.9, 1.0]
    assert get_credit_assignment("discounted")(_trajectory(1.0, {}, {}, {})) == pytest.approx([0.81, 0.9, 1.0])


@pytest.mark.parametrize("gamma", [0.0, -0.5, 1.5, math.nan])
def test_discounted_rejects_gamma_outside_0_1(gamma: float) -> None:
    with pytest.raises(ConfigError, match="gamma"):
        discounted(gamma)
    with pytest.raises(ConfigError, match="gamma"):
        discounted_rewards(1.0, 2, gamma)


# ---- intermediate (AIR) --------------------------------------------------------------------------------------------

WEIGHTS = AIRWeights(tool_call_ok=0.05, tool_call_failed=-0.1, exception=-0.2, format_valid=0.02, format_invalid=-0.1)
SIGNALS = (
    {AIR_TOOL_CALLS_OK: 2, AIR_TOOL_CALLS_FAILED: 1, AIR_FORMAT_VALID: True},
    {AIR_EXCEPTIONS: 1, AIR_FORMAT_VALID: False},
    {"sequence_id": 7},  # no AIR key: no signal
)


def test_air_signals_and_reward_golden() -> None:
    signals = air_signals(SIGNALS[0])
    assert signals == AIRSignals(tool_calls_ok=2, tool_calls_failed=1, exceptions=0, format_valid=True)
    # 2 * 0.05 + 1 * (-0.1) + 0 * (-0.2) + 0.02 (format valid) = 0.1 - 0.1 + 0.02 = 0.02
    assert air_reward(signals, WEIGHTS) == pytest.approx(0.02, abs=1e-15)
    # 1 exception * (-0.2) + format invalid (-0.1) = -0.3
    assert air_reward(air_signals(SIGNALS[1]), WEIGHTS) == pytest.approx(-0.3, abs=1e-15)
    assert air_reward(air_signals(SIGNALS[2]), WEIGHTS) == 0.0


def test_intermediate_over_broadcast_golden() -> None:
    # R = 1 broadcast to [1, 1, 1], plus AIR [0.02, -0.3, 0] = [1.02, 0.7, 1.0]
    rewards = intermediate(WEIGHTS)(_trajectory(1.0, *SIGNALS))
    assert rewards == pytest.approx([1.02, 0.7, 1.0], abs=1e-12)


def test_intermediate_over_discounted_golden() -> None:
    # discounted(0.5) of R = 1 over 3 turns: [0.25, 0.5, 1.0]; plus AIR [0.02, -0.3, 0] = [0.27, 0.2, 1.0]
    rewards = intermediate(WEIGHTS, base=discounted(0.5))(_trajectory(1.0, *SIGNALS))
    assert rewards == pytest.approx([0.27, 0.2, 1.0], abs=1e-12)


def test_intermediate_default_weights_golden() -> None:
    # defaults: ok 0, failed -0.1, exception -0.2, format valid 0, invalid -0.1
    # t0: 2 * 0 + 1 * (-0.1) + 0 = -0.1; t1: -0.2 - 0.1 = -0.3; t2: 0. R = 0: [-0.1, -0.3, 0.0]
    assert get_credit_assignment("intermediate")(_trajectory(0.0, *SIGNALS)) == pytest.approx([-0.1, -0.3, 0.0])


@pytest.mark.parametrize(
    ("metadata", "key"),
    [
        ({AIR_TOOL_CALLS_OK: -1}, AIR_TOOL_CALLS_OK),
        ({AIR_TOOL_CALLS_FAILED: 1.5}, AIR_TOOL_CALLS_FAILED),
        ({AIR_EXCEPTIONS: True}, AIR_EXCEPTIONS),
        ({AIR_FORMAT_VALID: "yes"}, AIR_FORMAT_VALID),
    ],
)
def test_air_refuses_badly_typed_metadata(metadata: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"rollout ro-1, transition 1 \(span None\): transition metadata '{key}'"):
        intermediate()(_trajectory(1.0, {}, metadata))


def test_air_weights_must_be_finite() -> None:
    with pytest.raises(ConfigError, match="exception"):
        AIRWeights(exception=math.nan)


# ---- user functions and output checks -----------------------------------------------------------------------------


def test_user_function_passed_directly() -> None:
    def last_only(trajectory: Trajectory) -> list[float]:
        n = len(trajectory.transitions)
        return [0.0] * (n - 1) + [float(trajectory.final_reward or 0.0)]

    scheme = resolve_credit_assignment(last_only)
    assert scheme.name == "last_only"
    assert scheme(_trajectory(2.0, {}, {}, {})) == [0.0, 0.0, 2.0]


@pytest.mark.parametrize(
    ("output", "match"),
    [
        ([1.0], r"returned 1 rewards for rollout ro-1 with 2 transitions"),
        ([1.0, math.nan], "non-finite"),
        (1.0, "must return a sequence of numbers"),
        (["a", "b"], "must return a sequence of numbers"),
    ],
)
def test_user_function_output_is_checked(output: Any, match: str) -> None:
    def bad(trajectory: Trajectory) -> Sequence[float]:
        return output

    with pytest.raises(ConfigError, match=match):
        from_function(bad)(_trajectory(1.0, {}, {}))


def test_no_final_reward_is_refused() -> None:
    with pytest.raises(ConfigError, match="no final reward"):
        BROADCAST(_trajectory(None, {}))


def test_outcome_form_is_kept_for_outcome_only_schemes() -> None:
    # scheme(final_reward, n_transitions), as trainer/loop.py calls it today
    assert get_credit_assignment("broadcast")(0.5, 3) == [0.5, 0.5, 0.5]
    assert get_credit_assignment("discounted")(1.0, 2) == pytest.approx([0.9, 1.0])
    with pytest.raises(ConfigError, match="reads the transitions"):
        get_credit_assignment("intermediate")(1.0, 2)


# ---- registry ------------------------------------------------------------------------------------------------------


def test_registry() -> None:
    assert get_credit_assignment("broadcast") is BROADCAST
    assert set(CREDIT_ASSIGNMENT) == {"broadcast", "discounted", "intermediate"}
    with pytest.raises(ConfigError, match="known: broadcast, discounted, intermediate"):
        get_credit_assignment("uniform")
    with pytest.raises(ConfigError, match="already registered"):
        register_credit_assignment("broadcast", BROADCAST)


def test_register_user_function_by_name() -> None:
    def first_only(trajectory: Trajectory) -> list[float]:
        n = len(trajectory.transitions)
        return [float(trajectory.final_reward or 0.0)] + [0.0] * (n - 1)

    register_credit_assignment("test_first_only", first_only)
    try:
        scheme = resolve_credit_assignment("test_first_only")
        assert scheme(_trajectory(3.0, {}, {})) == [3.0, 0.0]
        with pytest.raises(ConfigError, match="reads the transitions"):
            scheme(3.0, 2)
    finally:
        del CREDIT_ASSIGNMENT["test_first_only"]
