"""From one advantage per rollout to one advantage per transition, the max_tokens policy, and the step rewards of
``gae`` (:func:`step_rewards`). Pure, no torch.

**Per-transition advantage.** Estimators (:mod:`agentbolt.adapter.advantages`) give one advantage ``A_i``
per rollout from its outcome ``R_i``. Credit assignment (:mod:`agentbolt.adapter.credit`) gives one reward
``r_t`` per transition. With ``broadcast`` every ``r_t = R_i`` and each transition simply gets ``A_i`` (LightningRL,
arXiv:2508.03680, section 3). Other schemes (``discounted``, ``intermediate``/AIR, the ``penalize`` policy below)
make ``r_t`` differ from ``R_i``, and that difference must reach the loss. We use::

    A_t = A_i + (r_t - R_i) / s_i

where ``s_i`` is the scale the estimator divided the outcome by: the sample std of ``i``'s group for ``grpo``, the
sample std of the batch's (group-centered, for ``reinforce_pp_baseline``) rewards for ``reinforce_pp`` /
``reinforce_pp_baseline``, and 1 for estimators that do not divide (``grpo_no_std``, ``rloo``, user estimators); a
scale of 0 (all rewards equal) or a group of one is replaced by 1, so a per-transition deviation is never blown up.
So a deviation of one std moves a transition's advantage by 1, as an outcome difference of one std moves a rollout's;
with ``broadcast`` ``A_t = A_i`` exactly. This is our choice, in the spirit of GRPO's process supervision
(DeepSeekMath, Shao et al. 2024, arXiv:2402.03300, section 4.1.3), which normalizes step rewards by the group's
statistics and adds them to the tokens of the step; it differs in keeping the outcome advantage as the base and in
not summing future steps (``discounted`` already spreads the outcome over turns).

**max_tokens policy** (:func:`apply_truncation_policy`). A response cut at ``max_tokens`` (``finish_reason ==
"length"``) is unfinished text. ``keep``: trained like any other. ``mask``: kept as context of later calls but
its tokens get loss mask 0 (DAPO's "overlong filtering", Yu et al. 2025, arXiv:2503.14476, section 3.4). ``penalize``:
its reward ``r_t`` is replaced by a fixed value (e.g. -1), which lowers its advantage through the rule above
(a fixed-penalty variant of DAPO's overlong reward shaping, same section).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Final, Literal

from agentbolt.adapter.advantages import group_indices
from agentbolt.errors import ConfigError

TruncationPolicy = Literal["keep", "mask", "penalize"]
TRUNCATION_POLICIES: Final[tuple[TruncationPolicy, ...]] = ("keep", "mask", "penalize")
FINISH_REASON_LENGTH: Final = "length"
"""OpenAI ``finish_reason`` of a response cut at ``max_tokens``."""


def _sample_std(values: Sequence[float]) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    mean = math.fsum(values) / n
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def outcome_scales(rewards_N: Sequence[float], group_keys_N: Sequence[Hashable], estimator: str) -> list[float]:
    """``s_i`` of each rollout (module docstring): the std the estimator divided the outcome by, 1 when none or 0.

    Args:
        rewards_N: ``(N,)`` final rewards, one per rollout.
        group_keys_N: ``(N,)`` group of each rollout.
        estimator: the advantage estimator's name.

    Returns:
        ``(N,)`` scales, all > 0.

    Raises:
        ConfigError: lengths differ.
    """
    if len(rewards_N) != len(group_keys_N):
        raise ConfigError(f"got {len(rewards_N)} rewards but {len(group_keys_N)} group keys; give one key per reward")
    n = len(rewards_N)
    scales = [1.0] * n
    if estimator == "grpo":
        for indices in group_indices(group_keys_N).values():
            std = _sample_std([rewards_N[i] for i in indices])
            for i in indices:
                scales[i] = std if std > 0 else 1.0
    elif estimator in ("reinforce_pp", "reinforce_pp_baseline"):
        x = [float(r) for r in rewards_N]
        if estimator == "reinforce_pp_baseline":
            for indices in group_indices(group_keys_N).values():
                mean = math.fsum(x[i] for i in indices) / len(indices)
                for i in indices:
                    x[i] -= mean
        std = _sample_std(x)
        scales = [std if std > 0 else 1.0] * n
    return scales


def transition_advantages(
    rollout_advantage: float, rewards_T: Sequence[float], outcome: float, scale: float
) -> list[float]:
    """``A_t = rollout_advantage + (r_t - outcome) / scale`` for each transition (module docstring).

    Args:
        rollout_advantage: ``A_i``, the rollout's advantage.
        rewards_T: ``(T,)`` the credited reward of each transition.
        outcome: ``R_i``, the rollout's final reward.
        scale: ``s_i > 0`` (:func:`outcome_scales`).

    Raises:
        ConfigError: ``scale`` is not > 0.
    """
    if not scale > 0:
        raise ConfigError(f"scale must be > 0, got {scale}")
    return [float(rollout_advantage) + (float(r) - float(outcome)) / scale for r in rewards_T]


def apply_truncation_policy(
    finish_reasons_T: Sequence[str | None], rewards_T: Sequence[float], policy: TruncationPolicy, penalty: float
) -> tuple[list[float], list[bool]]:
    """Apply the max_tokens policy to one trajectory (module docstring).

    Args:
        finish_reasons_T: ``(T,)`` each transition's finish reason; ``"length"`` marks a cut response.
        rewards_T: ``(T,)`` credited rewards.
        policy: ``keep``, ``mask`` or ``penalize``.
        penalty: the reward a cut transition gets under ``penalize`` (finite).

    Returns:
        ``(rewards_T, trained_T)``: the rewards (changed under ``penalize`` only) and whether each transition's
        response is trained (False only for cut transitions under ``mask``).

    Raises:
        ConfigError: unknown policy, lengths differ, or ``penalty`` is not finite.
    """
    if policy not in TRUNCATION_POLICIES:
        raise ConfigError(f"unknown max_tokens policy {policy!r}; known: {', '.join(TRUNCATION_POLICIES)}")
    if len(finish_reasons_T) != len(rewards_T):
        raise ConfigError(f"got {len(finish_reasons_T)} finish reasons but {len(rewards_T)} rewards")
    if not math.isfinite(penalty):
        raise ConfigError(f"the max_tokens penalty must be finite, got {penalty}")
    cut = [reason == FINISH_REASON_LENGTH for reason in finish_reasons_T]
    rewards = [float(r) for r in rewards_T]
    if policy == "penalize":
        rewards = [float(penalty) if c else r for c, r in zip(cut, rewards, strict=True)]
    trained = [not c for c in cut] if policy == "mask" else [True] * len(cut)
    return rewards, trained


def step_rewards(rewards_T: Sequence[float], outcome: float) -> list[float]:
    """Per-transition step rewards of one trajectory, for PPO with a value head (estimator ``gae``).

    Step 1 of :mod:`agentbolt.algorithms.rl.ppo_gae`: transition ``t`` earns ``r_t - R``, the last one ``r_{T-1}``, so
    the rewards sum to ``R + sum_t (r_t - R)``; :func:`~agentbolt.adapter.samples.merge_transitions` puts each on its
    call's last response token.

    Args:
        rewards_T: ``(T,)`` the credited reward of each transition.
        outcome: ``R``, the trajectory's final reward.

    Returns:
        ``(T,)`` ``[r_0 - R, ..., r_{T-2} - R, r_{T-1}]``; empty for an empty trajectory.

    Raises:
        ConfigError: a value is not finite.
    """
    if not all(math.isfinite(float(r)) for r in rewards_T) or not math.isfinite(float(outcome)):
        raise ConfigError("rewards and the outcome must be finite for GAE step rewards")
    n = len(rewards_T)
    return [float(r) - float(outcome) if t < n - 1 else float(r) for t, r in enumerate(rewards_T)]
