"""Token-level GAE (Schulman et al. 2016, arXiv:1506.02438, eq. 16): hand-computed advantages and returns."""

from __future__ import annotations

import pytest
import torch

from agentbolt.algorithms.rl.gae import gae_advantages, outcome_token_rewards
from agentbolt.errors import ConfigError

torch.set_num_threads(1)


def _gae(
    rewards: list[list[float]], values: list[list[float]], mask: list[list[int]], *, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return gae_advantages(torch.tensor(rewards), torch.tensor(values), torch.tensor(mask), gamma=gamma, lam=lam)


def test_gae_golden_lambda_half() -> None:
    # rewards [0, 0, 1], V = [0.5, 0.6, 0.7], gamma 1, lambda 0.5; after the last token V = 0
    # t=2: delta = 1 + 0 - 0.7 = 0.3;   A2 = 0.3
    # t=1: delta = 0 + 0.7 - 0.6 = 0.1; A1 = 0.1 + 0.5 * 0.3 = 0.25
    # t=0: delta = 0 + 0.6 - 0.5 = 0.1; A0 = 0.1 + 0.5 * 0.25 = 0.225
    # returns = A + V = [0.725, 0.85, 1.0]
    adv, ret = _gae([[0.0, 0.0, 1.0]], [[0.5, 0.6, 0.7]], [[1, 1, 1]], gamma=1.0, lam=0.5)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    assert adv[0].tolist() == pytest.approx([0.225, 0.25, 0.3], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0.725, 0.85, 1.0], abs=1e-6)


def test_gae_lambda_one_is_discounted_return_minus_value() -> None:
    # gamma 0.9, lambda 1: A_t = G_t - V_t with G = [0.81, 0.9, 1.0] -> [0.31, 0.3, 0.3]
    # step by step: t=2: 1 - 0.7 = 0.3; t=1: 0.9 * 0.7 - 0.6 + 0.9 * 0.3 = 0.03 + 0.27 = 0.3;
    #               t=0: 0.9 * 0.6 - 0.5 + 0.9 * 0.3 = 0.04 + 0.27 = 0.31
    adv, ret = _gae([[0.0, 0.0, 1.0]], [[0.5, 0.6, 0.7]], [[1, 1, 1]], gamma=0.9, lam=1.0)
    assert adv[0].tolist() == pytest.approx([0.31, 0.3, 0.3], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0.81, 0.9, 1.0], abs=1e-6)


def test_gae_lambda_zero_is_one_step_td() -> None:
    # lambda 0: A_t = delta_t = [0.6 - 0.5, 0.7 - 0.6, 1 - 0.7] = [0.1, 0.1, 0.3]
    adv, _ = _gae([[0.0, 0.0, 1.0]], [[0.5, 0.6, 0.7]], [[1, 1, 1]], gamma=1.0, lam=0.0)
    assert adv[0].tolist() == pytest.approx([0.1, 0.1, 0.3], abs=1e-6)


def test_untrained_tokens_are_skipped() -> None:
    # row 0: a tool output (mask 0, garbage reward and value) between two trained tokens, then padding.
    # The trained tokens form the chain [V 0.5, r 0] -> [V 0.7, r 1] -> end; gamma 1, lambda 0.5:
    # t=2: delta = 1 - 0.7 = 0.3, A = 0.3; t=0: delta = 0 + 0.7 - 0.5 = 0.2, A = 0.2 + 0.5 * 0.3 = 0.35
    # row 1: the same chain without holes gives the same numbers, so the two rows agree on trained tokens.
    rewards = [[0.0, 99.0, 1.0, 5.0], [0.0, 1.0, 0.0, 0.0]]
    values = [[0.5, -99.0, 0.7, 9.0], [0.5, 0.7, 0.0, 0.0]]
    mask = [[1, 0, 1, 0], [1, 1, 0, 0]]
    adv, ret = _gae(rewards, values, mask, gamma=1.0, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.35, 0.0, 0.3, 0.0], [0.35, 0.3, 0.0, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, torch.tensor([[0.85, 0.0, 1.0, 0.0], [0.85, 1.0, 0.0, 0.0]]), atol=1e-6, rtol=0)


def test_bootstrap_value_after_the_last_trained_token() -> None:
    # one token, r = 0, V = 0.5, the next sample of the rollout starts at V = 0.8: delta = 0 + 1 * 0.8 - 0.5 = 0.3
    adv, ret = gae_advantages(
        torch.tensor([[0.0]]), torch.tensor([[0.5]]), torch.tensor([[1]]), bootstrap_values_B=torch.tensor([0.8])
    )
    assert adv.item() == pytest.approx(0.3, abs=1e-6)
    assert ret.item() == pytest.approx(0.8, abs=1e-6)


def test_values_gradient_does_not_flow() -> None:
    values = torch.tensor([[0.5, 0.6]], requires_grad=True)
    adv, ret = gae_advantages(torch.zeros(1, 2), values, torch.ones(1, 2))
    assert not adv.requires_grad and not ret.requires_grad


def test_outcome_token_rewards_sit_on_the_last_trained_token() -> None:
    mask = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    out = outcome_token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert out.tolist() == [[0.0, 0.0, 2.0, 0.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]


def test_bad_arguments() -> None:
    z = torch.zeros(1, 2)
    with pytest.raises(ConfigError, match=r"\(B, T\)"):
        gae_advantages(z, torch.zeros(1, 3), z)
    with pytest.raises(ConfigError, match="lam"):
        gae_advantages(z, z, z, lam=1.5)
    with pytest.raises(ConfigError, match="bootstrap"):
        gae_advantages(z, z, z, bootstrap_values_B=torch.zeros(2))
    with pytest.raises(ConfigError, match=r"\(B,\)"):
        outcome_token_rewards(torch.zeros(2), z)
