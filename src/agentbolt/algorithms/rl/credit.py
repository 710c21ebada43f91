"""Credit assignment: a rollout's outcome -> one reward per transition (DESIGN.md, LightningRL step 2).

Pure functions on plain numbers; writing the results onto transitions is a separate, thin step.

Registered schemes (``CREDIT_ASSIGNMENT``):

- ``broadcast``: every transition gets the final reward. This is LightningRL's default (Luo et al., "Agent
  Lightning: Train ANY AI Agents with Reinforcement Learning", arXiv:2508.03680, 2025, section 3): each LLM call
  of a rollout is credited with the rollout's outcome, so a single-turn objective can be applied per call.
"""

from __future__ import annotations

import math
from typing import Protocol

from agentbolt.algorithms.registry import Registry
from agentbolt.errors import ConfigError


class CreditAssignment(Protocol):
    """A credit-assignment scheme: ``(final_reward, n_transitions) -> rewards_T`` with ``len(rewards_T) ==
    n_transitions``, one reward per transition in trajectory order."""

    def __call__(self, final_reward: float, n_transitions: int) -> list[float]: ...


def broadcast(final_reward: float, n_transitions: int) -> list[float]:
    """Give every transition the rollout's final reward (LightningRL's default, arXiv:2508.03680).

    Args:
        final_reward: the rollout's outcome reward (finite).
        n_transitions: T, the number of transitions of the trajectory (>= 0).

    Returns:
        ``rewards_T``: ``[final_reward] * T`` (empty when T is 0).

    Raises:
        ConfigError: ``final_reward`` is not finite or ``n_transitions`` is negative.
    """
    if not math.isfinite(final_reward):
        raise ConfigError(f"final_reward must be a finite number, got {final_reward}")
    if n_transitions < 0:
        raise ConfigError(f"n_transitions must be >= 0, got {n_transitions}")
    return [float(final_reward)] * n_transitions


CREDIT_ASSIGNMENT: Registry[CreditAssignment] = Registry(
    "credit assignment",
    {"broadcast": broadcast},
)
"""Credit-assignment schemes by name. Add one with :func:`register_credit_assignment`."""


def register_credit_assignment(name: str, implementation: CreditAssignment) -> None:
    """Register ``implementation`` under ``name``.

    Raises:
        ConfigError: ``name`` is already registered (names are never silently replaced).
    """
    CREDIT_ASSIGNMENT.register(name, implementation)


def get_credit_assignment(name: str) -> CreditAssignment:
    """The implementation registered as ``name``.

    Raises:
        ConfigError: unknown name; the message lists the known ones.
    """
    return CREDIT_ASSIGNMENT.lookup(name)
