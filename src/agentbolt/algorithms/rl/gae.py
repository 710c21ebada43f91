"""Token-level generalized advantage estimation (GAE) for PPO with a value head. Numeric only; CPU or GPU.

Schulman, Moritz, Levine, Jordan, Abbeel, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", ICLR 2016, arXiv:1506.02438, eq. 16: with ``delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)``,

    A_t = sum_{l >= 0} (gamma * lambda)^l * delta_{t+l}   (computed backwards: A_t = delta_t + gamma*lambda*A_{t+1})
    returns_t = A_t + V(s_t)                               (the value head's regression target, the TD(lambda) return)

Each generated token is one step: ``r_t`` is the token's reward (usually 0 except the outcome on the last trained
token, see :func:`outcome_token_rewards`) and ``V(s_t)`` the value head's estimate at that token.

Tokens outside the loss mask (prompt tokens, and the tool outputs inside a merged multi-turn sample) are not
steps: they are skipped, so the step after a trained token is the next *trained* token of the same row (verl's
``compute_gae_advantage_return`` does the same for multi-turn samples). After the last trained token the value is
``bootstrap_values_B`` (default 0: the episode ended). The math runs in float32 without gradient.
"""

from __future__ import annotations

import torch

from agentbolt.errors import ConfigError


def gae_advantages(
    token_rewards_BT: torch.Tensor,
    values_BT: torch.Tensor,
    loss_mask_BT: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
    bootstrap_values_B: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token GAE advantages and returns (module docstring; arXiv:1506.02438, eq. 16).

    Args:
        token_rewards_BT: ``(B, T)`` reward of each token (unit: reward); read on trained tokens only.
        values_BT: ``(B, T)`` value estimates ``V(s_t)``; read on trained tokens only; detached here.
        loss_mask_BT: ``(B, T)`` 1 (or True) on trained (generated) tokens, 0 elsewhere.
        gamma: discount per token, in ``[0, 1]`` (1 is usual for LLMs: the outcome is not discounted by length).
        lam: GAE's lambda in ``[0, 1]``: 0 is the one-step TD advantage, 1 the Monte Carlo return minus ``V``.
        bootstrap_values_B: ``(B,)`` the value after each row's last trained token, for a row that does not end its
            episode (e.g. a rollout split into several samples); default 0.

    Returns:
        ``(advantages_BT, returns_BT)``: float32, no gradient, 0 outside the mask.

    Raises:
        ConfigError: shapes differ or are not 2-D, ``bootstrap_values_B`` is not ``(B,)``, or ``gamma``/``lam``
            is outside ``[0, 1]``.
    """
    if (
        token_rewards_BT.dim() != 2
        or token_rewards_BT.shape != values_BT.shape
        or values_BT.shape != loss_mask_BT.shape
    ):
        raise ConfigError(
            f"token_rewards {tuple(token_rewards_BT.shape)}, values {tuple(values_BT.shape)} and loss_mask "
            f"{tuple(loss_mask_BT.shape)} must all be (B, T)"
        )
    if not 0.0 <= gamma <= 1.0 or not 0.0 <= lam <= 1.0:
        raise ConfigError(f"gamma and lam must be in [0, 1], got gamma={gamma}, lam={lam}")
    n_rows, n_steps = values_BT.shape
    if bootstrap_values_B is not None and bootstrap_values_B.shape != (n_rows,):
        raise ConfigError(f"bootstrap_values must be (B,) = ({n_rows},), got {tuple(bootstrap_values_B.shape)}")

    with torch.no_grad():
        mask = loss_mask_BT.to(torch.bool)
        mask_f = mask.to(torch.float32)
        rewards = torch.where(mask, token_rewards_BT.to(torch.float32), torch.zeros((), dtype=torch.float32))
        values = torch.where(mask, values_BT.detach().to(torch.float32), torch.zeros((), dtype=torch.float32))
        next_value = (
            bootstrap_values_B.detach().to(torch.float32).to(values.device)
            if bootstrap_values_B is not None
            else torch.zeros(n_rows, dtype=torch.float32, device=values.device)
        )
        next_advantage = torch.zeros(n_rows, dtype=torch.float32, device=values.device)
        advantages = torch.zeros_like(values)
        for t in reversed(range(n_steps)):
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            advantage_t = delta + gamma * lam * next_advantage
            m = mask_f[:, t]
            # an untrained token is transparent: it leaves the running value and advantage as they were
            next_advantage = m * advantage_t + (1.0 - m) * next_advantage
            next_value = m * values[:, t] + (1.0 - m) * next_value
            advantages[:, t] = m * advantage_t
        returns = (advantages + values) * mask_f
    return advantages, returns


def outcome_token_rewards(rewards_B: torch.Tensor, loss_mask_BT: torch.Tensor) -> torch.Tensor:
    """Place each row's reward on its last trained token: ``(B,)`` -> ``(B, T)`` float32, 0 elsewhere.

    A row with no trained token gets no reward.

    Raises:
        ConfigError: ``rewards_B`` is not ``(B,)`` for a ``(B, T)`` mask.
    """
    if loss_mask_BT.dim() != 2 or rewards_B.shape != loss_mask_BT.shape[:1]:
        raise ConfigError(
            f"rewards must be (B,) for a (B, T) loss mask, got {tuple(rewards_B.shape)} and {tuple(loss_mask_BT.shape)}"
        )
    mask = loss_mask_BT.to(torch.bool)
    n_steps = mask.shape[1]
    positions = torch.arange(n_steps, device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=1).values  # (B,), -1: none
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] = rewards_B.to(torch.float32).to(mask.device)[rows]
    return out
