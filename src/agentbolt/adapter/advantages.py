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

Batch estimators (``BATCH_ADVANTAGE_ESTIMATORS``) see the whole batch at once, ``(rewards_N, group_keys_N) ->
advantages_N``; :func:`compute_advantages` runs an estimator of either kind by name:

- ``reinforce_pp``: ``(r_i - mean_batch(r)) / (std_batch(r) + eps)`` (REINFORCE++, Hu 2025, arXiv:2501.03262,
  eq. 10: "global advantage normalization" over the batch instead of within a group; the KL term of its eq. 8 is left
  to the loss here, see :mod:`agentbolt.algorithms.rl.losses`).
- ``reinforce_pp_baseline``: subtract each group's mean first, then normalize over the batch (REINFORCE++-baseline,
  same paper, for group sizes > 1).

Both normalize over rollouts, one value per rollout, while verl and OpenRLHF whiten over tokens (a long response
counts once per token there). Token-level GAE for PPO with a value head is in :mod:`agentbolt.algorithms.rl.gae`.

Which standard deviation: the paper does not say. We use the **sample (Bessel-corrected, ``ddof=1``)** std, as TRL's
``GRPOTrainer`` (``rewards.view(-1, G).std(dim=1)``, torch's default ``correction=1``) and verl's
``compute_grpo_outcome_advantage`` (``torch.std``) do, so our numbers match theirs. Where we differ: a group of one
gets advantage 0 here (no baseline, no signal), while verl uses mean 0, std 1 and so passes the raw reward through.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from agentbolt.errors import ConfigError
from agentbolt.registry import Registry

K = TypeVar("K", bound=Hashable)

AdvantageEstimator = Callable[[Sequence[float]], list[float]]
"""One group's rewards ``rewards_G`` -> its advantages ``advantages_G`` (same length and order)."""


def _checked(rewards_G: Sequence[float]) -> list[float]:
    rewards = [float(r) for r in rewards_G]
    bad = [r for r in rewards if not math.isfinite(r)]
    if bad:
        raise ConfigError(f"rewards must be finite numbers, got {bad[0]} in a group of {len(rewards)}")
    return rewards


def _sample_std(centered: Sequence[float]) -> float:
    return math.sqrt(math.fsum(c * c for c in centered) / (len(centered) - 1))


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
    std = _sample_std(centered)
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


def reinforce_pp_advantages(
    rewards_N: Sequence[float],
    group_keys_N: Sequence[Hashable] | None = None,
    *,
    subtract_group_mean: bool = False,
    eps: float = 1e-6,
) -> list[float]:
    """REINFORCE++'s batch-normalized advantage (Hu 2025, arXiv:2501.03262, eq. 10).

    ``A_i = (x_i - mean(x)) / (std(x) + eps)`` over the whole batch, where ``x_i = r_i`` (``reinforce_pp``) or
    ``x_i = r_i - mean(rewards of i's group)`` (``subtract_group_mean=True``, REINFORCE++-baseline). ``std`` is the
    sample std (Bessel-corrected), as for GRPO here and as verl's ``masked_whiten`` does.

    Args:
        rewards_N: ``(N,)`` one reward per rollout of the batch.
        group_keys_N: ``(N,)`` the group of each rollout; needed only with ``subtract_group_mean``.
        subtract_group_mean: subtract the group mean before the batch normalization.
        eps: added to the std; ``>= 0``.

    Returns:
        ``(N,)`` advantages: zero mean over the batch up to rounding; all ``0.0`` exactly when every ``x_i`` is
        equal (a batch of one included); ``[]`` for an empty batch.

    Raises:
        ConfigError: a reward is not finite, ``eps < 0``, or ``group_keys_N`` is missing or of another length when
            ``subtract_group_mean`` is set.
    """
    if eps < 0:
        raise ConfigError(f"eps must be >= 0, got {eps}")
    x = _checked(rewards_N)
    if subtract_group_mean:
        if group_keys_N is None or len(group_keys_N) != len(x):
            n_keys = "no" if group_keys_N is None else len(group_keys_N)
            raise ConfigError(
                f"REINFORCE++-baseline subtracts each group's mean: give one group key per reward "
                f"(got {len(x)} rewards and {n_keys} keys)"
            )
        for indices in group_indices(group_keys_N).values():
            group = [x[i] for i in indices]
            if all(r == group[0] for r in group):
                for i in indices:
                    x[i] = 0.0
                continue
            mean = math.fsum(group) / len(group)
            for i in indices:
                x[i] -= mean
    n = len(x)
    if n <= 1 or all(v == x[0] for v in x):
        return [0.0] * n
    mean = math.fsum(x) / n
    centered = [v - mean for v in x]
    std = _sample_std(centered)
    return [c / (std + eps) for c in centered]


def reinforce_pp_baseline_advantages(rewards_N: Sequence[float], group_keys_N: Sequence[Hashable]) -> list[float]:
    """REINFORCE++-baseline: group mean subtracted, then normalized over the batch (:func:`reinforce_pp_advantages`)."""
    return reinforce_pp_advantages(rewards_N, group_keys_N, subtract_group_mean=True)


def _reinforce_pp_batch(rewards_N: Sequence[float], group_keys_N: Sequence[Hashable]) -> list[float]:
    """``reinforce_pp`` as a batch estimator: the group keys are not used."""
    return reinforce_pp_advantages(rewards_N)


BatchAdvantageEstimator = Callable[[Sequence[float], Sequence[Hashable]], list[float]]
"""A batch's rewards ``rewards_N`` and group keys ``group_keys_N`` -> ``advantages_N`` (same order)."""


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "advantage estimator",
    {
        "grpo": grpo_advantages,
        "grpo_no_std": grpo_no_std_advantages,
        "rloo": rloo_advantages,
    },
)
"""Advantage estimators by name. Add one with :func:`register_advantage_estimator`."""


BATCH_ADVANTAGE_ESTIMATORS: Registry[BatchAdvantageEstimator] = Registry(
    "batch advantage estimator",
    {
        "reinforce_pp": _reinforce_pp_batch,
        "reinforce_pp_baseline": reinforce_pp_baseline_advantages,
    },
)
"""Estimators that see the whole batch, by name. Add one with :func:`register_batch_advantage_estimator`."""


VALUE_HEAD_ESTIMATOR = "gae"
"""Token-level GAE with a value head (PPO): computed by the trainer from the value head's estimates
(:mod:`agentbolt.algorithms.rl.ppo_gae`), not from rewards alone, so :func:`compute_advantages` does not run it."""


def _known_names() -> str:
    return ", ".join(sorted([*ADVANTAGE_ESTIMATORS, *BATCH_ADVANTAGE_ESTIMATORS, VALUE_HEAD_ESTIMATOR]))


def check_estimator_name(name: str) -> None:
    """Raises ConfigError (listing the known names) unless ``name`` is a registered estimator or ``gae``."""
    if name != VALUE_HEAD_ESTIMATOR and name not in ADVANTAGE_ESTIMATORS and name not in BATCH_ADVANTAGE_ESTIMATORS:
        raise ConfigError(f"unknown advantage estimator {name!r}; known: {_known_names()}")


def register_advantage_estimator(name: str, implementation: AdvantageEstimator) -> None:
    """Register a per-group ``implementation`` under ``name``.

    Raises:
        ConfigError: ``name`` is already registered, as a group or a batch estimator.
    """
    if name in BATCH_ADVANTAGE_ESTIMATORS:
        raise ConfigError(f"advantage estimator {name!r} is already registered; pick another name")
    ADVANTAGE_ESTIMATORS.register(name, implementation)


def register_batch_advantage_estimator(name: str, implementation: BatchAdvantageEstimator) -> None:
    """Register a whole-batch ``implementation`` under ``name``.

    Raises:
        ConfigError: ``name`` is already registered, as a group or a batch estimator.
    """
    if name in ADVANTAGE_ESTIMATORS:
        raise ConfigError(f"advantage estimator {name!r} is already registered; pick another name")
    BATCH_ADVANTAGE_ESTIMATORS.register(name, implementation)


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The per-group implementation registered as ``name``.

    Raises:
        ConfigError: unknown name (the message lists the known ones), or ``name`` is a batch estimator, which
            cannot run one group at a time (use :func:`compute_advantages`).
    """
    if name in BATCH_ADVANTAGE_ESTIMATORS:
        raise ConfigError(
            f"advantage estimator {name!r} normalizes over the whole batch, not within one group; "
            f"call compute_advantages(rewards_N, group_keys_N, {name!r})"
        )
    if name not in ADVANTAGE_ESTIMATORS:
        raise ConfigError(f"unknown advantage estimator {name!r}; known: {_known_names()}")
    return ADVANTAGE_ESTIMATORS[name]


def compute_advantages(rewards_N: Sequence[float], group_keys_N: Sequence[K], estimator: str) -> list[float]:
    """The advantages of a batch under the estimator called ``estimator``, of either kind.

    Args:
        rewards_N: ``(N,)`` one reward per rollout.
        group_keys_N: ``(N,)`` the group of each rollout: ``(task_id, resources_id)``, the rollouts of one task
            under one resources version.
        estimator: a name in ``ADVANTAGE_ESTIMATORS`` (run within each group) or ``BATCH_ADVANTAGE_ESTIMATORS``.

    Returns:
        ``(N,)`` advantages in the order of ``rewards_N``.

    Raises:
        ConfigError: unknown name (the message lists every known one), ``gae`` (see :data:`VALUE_HEAD_ESTIMATOR`),
            lengths differ, or a reward is not finite.
    """
    if len(rewards_N) != len(group_keys_N):
        raise ConfigError(f"got {len(rewards_N)} rewards but {len(group_keys_N)} group keys; give one key per reward")
    if estimator == VALUE_HEAD_ESTIMATOR:
        raise ConfigError(
            "the gae estimator needs the value head's estimates: the trainer computes it per token "
            "(agentbolt.algorithms.rl.ppo_gae.rollout_gae), not compute_advantages"
        )
    if estimator in BATCH_ADVANTAGE_ESTIMATORS:
        return BATCH_ADVANTAGE_ESTIMATORS[estimator](rewards_N, group_keys_N)
    return advantages_by_group(rewards_N, group_keys_N, get_advantage_estimator(estimator))
