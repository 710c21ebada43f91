"""PPO with a value head over multi-call trajectories: step rewards and token-level GAE per rollout.

The advantage estimator ``gae`` replaces the group baseline of GRPO-style estimators by a learned value ``V(s)``,
one estimate per generated token (the trainer's value head, :mod:`agentbolt.algorithms.rl.torch_backend`). Its
data path, after credit assignment gave each transition ``t`` of a trajectory a reward ``r_t``
(:mod:`agentbolt.adapter.credit`) and the trajectory's outcome is ``R``:

1. **Step rewards** (:func:`~agentbolt.adapter.per_transition.step_rewards`, torch-free, so the batch code below
   the server can make them): transition ``t`` earns ``d_t = r_t - R`` for ``t < T - 1`` and
   ``d_{T-1} = r_{T-1}``, placed on its last response token
   (:func:`~agentbolt.adapter.samples.merge_transitions`).
   So ``sum_t d_t = R + sum_t (r_t - R)``: under ``broadcast`` the outcome alone, on the last token; under
   ``intermediate`` (AIR) each call's shaping bonus on its own last token plus the outcome at the end. The
   ``discounted`` scheme is refused with ``gae`` (:class:`~agentbolt.config.GRPOConfig`): discounting is ``gamma``'s
   job there.
2. **Values**: the value head's ``V(s_k)`` at every trained token ``k`` of every sample, with the weights before
   the update (one no-grad forward over the batch).
3. **GAE per rollout** (:func:`rollout_gae`): the trained tokens of all the rollout's samples, in order, form one
   sequence of steps (a rollout split into several samples is still one episode, so the advantage flows across the
   split); a step reward that sits on an untrained token (a response under the ``mask`` policy, a stale call) moves
   to the nearest earlier trained token of the rollout, or the next one when there is none. Then
   :func:`~agentbolt.algorithms.rl.gae.gae_advantages` (Schulman et al. 2016, arXiv:1506.02438, eq. 16) gives
   ``A_k`` and the value target ``returns_k = A_k + V(s_k)``; the episode ends after the rollout's last trained
   token (bootstrap 0).

The PPO loss then uses ``A_k`` per token (Schulman et al. 2017, arXiv:1707.06347, eq. 7) and the value head is
regressed on ``returns_k`` (eq. 9's ``L^VF``, squared error, weight ``vf_coef``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from agentbolt.adapter.samples import TrainingSample
from agentbolt.algorithms.rl.gae import gae_advantages
from agentbolt.errors import ConfigError

GAE_ESTIMATOR = "gae"
"""The estimator name that selects PPO with a value head."""


def rollout_gae(
    samples: Sequence[TrainingSample],
    values: Sequence[Sequence[float]],
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> list[TrainingSample]:
    """Token-level GAE over each rollout's samples (module docstring, step 3).

    Args:
        samples: the batch's samples, each with ``token_rewards``; the samples of one rollout in trajectory order
            (as :func:`~agentbolt.adapter.samples.build_samples` makes them; other rollouts may sit between).
        values: ``values[i][k]`` is ``V(s_k)`` of sample ``i``'s token ``k`` (read on trained tokens only), one
            list of ``len(input_ids)`` floats per sample.
        gamma / lam: GAE's discount and lambda, in ``[0, 1]``.

    Returns:
        Copies of the samples with ``token_advantages`` and ``token_returns`` set (0 on untrained tokens).

    Raises:
        ConfigError: a sample has no ``token_rewards``, ``values`` does not match the samples, or ``gamma``/``lam``
            is outside ``[0, 1]``.
    """
    if len(values) != len(samples):
        raise ConfigError(f"got {len(samples)} samples but {len(values)} value lists; give one per sample")
    by_rollout: dict[str, list[int]] = {}
    for i, sample in enumerate(samples):
        if sample.token_rewards is None:
            raise ConfigError(
                f"sample of rollout {sample.rollout_id} has no token_rewards; build samples with step rewards for gae"
            )
        if len(values[i]) != sample.n_tokens:
            raise ConfigError(f"sample {i}: {sample.n_tokens} tokens but {len(values[i])} values")
        by_rollout.setdefault(sample.rollout_id, []).append(i)

    out = list(samples)
    for indices in by_rollout.values():
        steps: list[tuple[int, int]] = []  # (sample index, token index) of each trained token, in order
        rewards: list[float] = []
        pending = 0.0  # rewards seen before the rollout's first trained token
        for i in indices:
            sample = samples[i]
            assert sample.token_rewards is not None
            for k, (m, r) in enumerate(zip(sample.loss_mask, sample.token_rewards, strict=True)):
                if m:
                    steps.append((i, k))
                    rewards.append(pending + r)
                    pending = 0.0
                elif r:
                    if rewards:
                        rewards[-1] += r
                    else:
                        pending += r
        if not steps:
            continue
        rewards_1L = torch.tensor([rewards], dtype=torch.float64)
        values_1L = torch.tensor([[float(values[i][k]) for i, k in steps]], dtype=torch.float64)
        advantages_1L, returns_1L = gae_advantages(
            rewards_1L, values_1L, torch.ones_like(values_1L), gamma=gamma, lam=lam
        )
        per_sample: dict[int, tuple[list[float], list[float]]] = {
            i: ([0.0] * samples[i].n_tokens, [0.0] * samples[i].n_tokens) for i in indices
        }
        for j, (i, k) in enumerate(steps):
            per_sample[i][0][k] = float(advantages_1L[0, j])
            per_sample[i][1][k] = float(returns_1L[0, j])
        for i, (adv, ret) in per_sample.items():
            out[i] = dataclasses.replace(samples[i], token_advantages=adv, token_returns=ret)
    return out
