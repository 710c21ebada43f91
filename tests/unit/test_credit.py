"""Credit assignment schemes and their registry."""

from __future__ import annotations

import math

import pytest

from agentbolt.algorithms.rl.credit import (
    CREDIT_ASSIGNMENT,
    broadcast,
    get_credit_assignment,
    register_credit_assignment,
)
from agentbolt.errors import ConfigError


def test_broadcast_gives_every_transition_the_final_reward() -> None:
    assert broadcast(0.5, 3) == [0.5, 0.5, 0.5]
    assert broadcast(-1.0, 1) == [-1.0]
    assert broadcast(1.0, 0) == []


def test_broadcast_rejects_bad_input() -> None:
    with pytest.raises(ConfigError, match="finite"):
        broadcast(math.inf, 2)
    with pytest.raises(ConfigError, match="n_transitions"):
        broadcast(1.0, -1)


def test_registry() -> None:
    assert get_credit_assignment("broadcast") is broadcast
    assert set(CREDIT_ASSIGNMENT) == {"broadcast"}
    with pytest.raises(ConfigError, match="known: broadcast"):
        get_credit_assignment("discounted")
    with pytest.raises(ConfigError, match="already registered"):
        register_credit_assignment("broadcast", broadcast)


def test_register_new_scheme() -> None:
    def last_only(final_reward: float, n_transitions: int) -> list[float]:
        return [0.0] * (n_transitions - 1) + [final_reward] if n_transitions else []

    register_credit_assignment("test_last_only", last_only)
    try:
        assert get_credit_assignment("test_last_only")(2.0, 3) == [0.0, 0.0, 2.0]
    finally:
        del CREDIT_ASSIGNMENT["test_last_only"]
