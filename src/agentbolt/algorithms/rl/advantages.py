"""Advantage estimators: the rewards of one group -> one advantage per rollout (DESIGN.md, LightningRL step 3).

Pure functions on plain numbers; the math runs in Python floats (IEEE float64, so at least the "fp32 everywhere" the
design asks for). A *group* is the rollouts of one task under the same resources; an estimator sees one group's
rewards ``rewards_G`` and returns ``advantages_G`` in the same order. :func:`advantages_by_group` applies one to a
whole batch keyed by task. Each rollout gets exactly one advantage however many transitions it has (the
"rollout-level advantage": a rollout that made 5 LLM calls is counted once in its group's baseline, not 5 times).

Registered estimators (``ADVANTAGE_ESTIMATORS``):

- ``grpo``: ``(r_i - mean(r)) / (std(r) + eps)`` (DeepSeekMath, Shao et al. 2024, arXiv:2402.03300, section 4.1.2,
  "outcome supervision": r~_i = (r_i - mean(r)) / std(r)).
- ``grpo_no_std``: ``r_i - mean(r)`` (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783, drops the std division).
- ``rloo``: ``r_i - mean_{j != i} r_j`` (leave-one-out baseline; Kool et al. 2019, "Buy 4 REINFORCE samples, get a
  baseline for free!"; Ahmadian et al. 2024, arXiv:2402.14740).

Which standard deviation: the paper does not say. We use the **sample (Bessel-corrected, ``ddof=1``)** std, as TRL's
``GRPOTrainer`` (``rewards.view(-1, G).std(dim=1)``, torch's default ``correction=1``) and verl's
``compute_grpo_outcome_advantage`` (``torch.std``) do, so our numbers match theirs. Where we differ: a group of one
gets advantage 0 here (no baseline, no signal), while verl uses mean 0, std 1 and so passes the raw reward through.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from agentbolt.algorithms.registry import Registry
from agentbolt.errors import ConfigError

K = TypeVar("K", bound=Hashable)

AdvantageEstimator = Callable[[Sequence[float]], list[float]]
"""One group's rewards ``rewards_G`` -> its advantages ``advantages_G`` (same length and order)."""


def _checked(rewards_G: Sequence[float]) -> list[float]:
    rewards = [float(r) for r in rewards_G]
    bad = [r for r in rewards if not math.isfinite(r)]
    if bad:
        raise ConfigError(f"rewards must be finite numbers, got {bad[0]} in a group of {len(rewards)}")
    return rewards


def grpo_advantages(rewards_G: Sequence[float], *, scale_by_std: bool = True, eps: float = 1e-6) -> list[float]:
    """GRPO's group-normalized advantage (arXiv:2402.03300, section 4.1.2).

    ``A_i = (r_i - mean(r)) / (std(r) + eps)``, with ``std`` the sample std (Bessel-corrected, ``G - 1`` in the
    denominator; see the module docstring). With ``scale_by_std=False``: ``A_i = r_i - mean(r)``.

    Args:
        rewards_G: ``(G,)`` rewards of the rollouts of one group.
        scale_by_std: divide by ``std + eps`` (GRPO) or not (Dr. GRPO, arXiv:2503.20783).
        eps: added to the std so an (almost) constant group does not divide by ~0; ``>= 0``.

    Returns:
        ``(G,)`` advantages. Zero mean up to rounding. A group of one gives ``[0.0]``; a group whose rewards are all
        equal gives all ``0.0`` exactly (checked, not left to rounding). An empty group gives ``[]``.

    Raises:
        ConfigError: a reward is not finite, or ``eps < 0``.
    """
    if eps < 0:
        raise ConfigError(f"eps must be >= 0, got {eps}")
    rewards = _checked(rewards_G)
    n = len(rewards)
    if n <= 1 or all(r == rewards[0] for r in rewards):
        return [0.0] * n
    mean = math.fsum(rewards) / n
    centered = [r - mean for r in rewards]
    if not scale_by_std:
        return centered
    std = math.sqrt(math.fsum(c * c for c in centered) / (n - 1))
    return [c / (std + eps) for c in centered]


def grpo_no_std_advantages(rewards_G: Sequence[float]) -> list[float]:
    """``r_i - mean(r)``: GRPO without the std division (Dr. GRPO, arXiv:2503.20783). A group of one gives 0."""
    return grpo_advantages(rewards_G, scale_by_std=False)


def rloo_advantages(rewards_G: Sequence[float]) -> list[float]:
    """Leave-one-out baseline: ``A_i = r_i - (sum(r) - r_i) / (G - 1) = G / (G - 1) * (r_i - mean(r))``.

    Args:
        rewards_G: ``(G,)`` rewards of one group.

    Returns:
        ``(G,)`` advantages; a group of one gives ``[0.0]`` (no other rollout to form a baseline), equal rewards give
        all ``0.0`` exactly.

    Raises:
        ConfigError: a reward is not finite.
    """
    rewards = _checked(rewards_G)
    n = len(rewards)
    if n <= 1 or all(r == rewards[0] for r in rewards):
        return [0.0] * n
    total = math.fsum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


def group_indices(keys: Sequence[K]) -> dict[K, list[int]]:
    """Positions of equal keys: ``["a", "b", "a"] -> {"a": [0, 2], "b": [1]}``.

    Groups appear in order of first occurrence, and indices within a group are increasing.
    """
    groups: dict[K, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return groups


def advantages_by_group(
    rewards_N: Sequence[float], group_keys_N: Sequence[K], estimator: AdvantageEstimator = grpo_advantages
) -> list[float]:
    """Apply ``estimator`` within each group of a batch.

    Args:
        rewards_N: ``(N,)`` one reward per rollout.
        group_keys_N: ``(N,)`` the group of each rollout (usually its ``task_id``).
        estimator: one group's rewards -> its advantages, e.g. ``ADVANTAGE_ESTIMATORS["grpo"]``.

    Returns:
        ``(N,)`` advantages in the order of ``rewards_N``.

    Raises:
        ConfigError: the two sequences differ in length, or the estimator rejects a group.
    """
    if len(rewards_N) != len(group_keys_N):
        raise ConfigError(f"got {len(rewards_N)} rewards but {len(group_keys_N)} group keys; give one key per reward")
    out = [0.0] * len(rewards_N)
    for indices in group_indices(group_keys_N).values():
        for i, advantage in zip(indices, estimator([rewards_N[i] for i in indices]), strict=True):
            out[i] = advantage
    return out


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "advantage estimator",
    {
        "grpo": grpo_advantages,
        "grpo_no_std": grpo_no_std_advantages,
        "rloo": rloo_advantages,
    },
)
"""Advantage estimators by name. Add one with :func:`register_advantage_estimator`."""


def register_advantage_estimator(name: str, implementation: AdvantageEstimator) -> None:
    """Register ``implementation`` under ``name``.

    Raises:
        ConfigError: ``name`` is already registered (names are never silently replaced).
    """
    ADVANTAGE_ESTIMATORS.register(name, implementation)


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The implementation registered as ``name``.

    Raises:
        ConfigError: unknown name; the message lists the known ones.
    """
    return ADVANTAGE_ESTIMATORS.lookup(name)
