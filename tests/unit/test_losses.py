"""PPO-clip loss: hand-computed values (Schulman et al. 2017, eq. 7; DAPO clip-higher) and exact accumulation."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from agentbolt.algorithms.rl.losses import ppo_clip_loss
from agentbolt.errors import ConfigError

torch.set_num_threads(1)


def _one_token(ratio: float, advantage: float, **kwargs: float) -> tuple[float, float, float]:
    """Loss, d loss / d logprob and clip fraction for a single trained token with the given ratio."""
    logprobs = torch.tensor([[math.log(ratio)]], dtype=torch.float32, requires_grad=True)
    loss, stats = ppo_clip_loss(logprobs, torch.zeros(1, 1), torch.tensor([advantage]), torch.ones(1, 1), **kwargs)
    loss.backward()
    assert logprobs.grad is not None
    return loss.item(), float(logprobs.grad.item()), stats.clip_fraction


def test_ratio_inside_the_clip_range() -> None:
    # ratio 1.1 in [0.8, 1.28]: loss = -min(1.1 * 2, 1.1 * 2) = -2.2; d/dlogp (-ratio * A) = -ratio * A = -2.2
    loss, grad, clipped = _one_token(1.1, 2.0)
    assert loss == pytest.approx(-2.2, rel=1e-6)
    assert grad == pytest.approx(-2.2, rel=1e-6)
    assert clipped == 0.0


def test_ratio_above_upper_clip_with_positive_advantage_is_clipped() -> None:
    # clip_high 0.2: ratio 1.5 -> clipped 1.2; loss = -min(1.5, 1.2) * 1 = -1.2; the clipped term is constant: grad 0
    loss, grad, clipped = _one_token(1.5, 1.0, clip_low=0.2, clip_high=0.2)
    assert loss == pytest.approx(-1.2, rel=1e-6)
    assert grad == 0.0
    assert clipped == 1.0


def test_clip_higher_moves_the_upper_bound() -> None:
    # DAPO clip_high 0.28: ratio 1.25 is inside [0.8, 1.28], loss = -1.25 and the gradient flows (-1.25)
    loss, grad, clipped = _one_token(1.25, 1.0, clip_low=0.2, clip_high=0.28)
    assert (loss, grad, clipped) == pytest.approx((-1.25, -1.25, 0.0), rel=1e-6)
    # ... while the symmetric 0.2 clips it at 1.2
    loss, grad, clipped = _one_token(1.25, 1.0, clip_low=0.2, clip_high=0.2)
    assert (loss, grad, clipped) == pytest.approx((-1.2, 0.0, 1.0), rel=1e-6)


def test_ratio_below_lower_clip_with_negative_advantage_is_clipped() -> None:
    # ratio 0.5, A = -1: -min(0.5 * -1, 0.8 * -1) = -min(-0.5, -0.8) = 0.8; clipped term active: grad 0
    loss, grad, clipped = _one_token(0.5, -1.0, clip_low=0.2, clip_high=0.2)
    assert loss == pytest.approx(0.8, rel=1e-6)
    assert grad == 0.0
    assert clipped == 1.0


def test_pessimistic_side_is_never_clipped() -> None:
    # ratio 0.5, A = +1: -min(0.5, 0.8) = -0.5, unclipped, grad -0.5 (the min keeps the pessimistic bound)
    assert _one_token(0.5, 1.0) == pytest.approx((-0.5, -0.5, 0.0), rel=1e-6)
    # ratio 1.5, A = -1: -min(-1.5, -1.28) = 1.5, unclipped, grad = -ratio * A = 1.5
    assert _one_token(1.5, -1.0) == pytest.approx((1.5, 1.5, 0.0), rel=1e-6)


def test_token_mean_ignores_masked_tokens_and_reports_stats() -> None:
    # Two sequences, B = 2, T = 3. Masked-out positions hold garbage (even inf) and must not matter.
    logprobs = torch.tensor([[math.inf, math.log(1.1), math.log(0.9)], [-math.inf, 0.0, math.log(2.0)]])
    sampling = torch.tensor([[5.0, 0.0, 0.0], [7.0, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1]])
    advantages = torch.tensor([1.0, -0.5])
    loss, stats = ppo_clip_loss(logprobs, sampling, advantages, mask, clip_low=0.2, clip_high=0.2)
    # seq 0 (A = 1):    ratio 1.1 -> -1.1;  ratio 0.9 -> -0.9
    # seq 1 (A = -0.5): ratio 1.0 -> 0.5;   ratio 2.0 -> -min(-1.0, -0.6) = 1.0 (unclipped side)
    # token mean = (-1.1 - 0.9 + 0.5 + 1.0) / 4 = -0.125
    assert loss.item() == pytest.approx(-0.125, rel=1e-6)
    assert stats.n_loss_tokens == 4
    assert stats.clip_fraction == 0.0
    assert stats.ratio_mean == pytest.approx((1.1 + 0.9 + 1.0 + 2.0) / 4, rel=1e-6)
    # k3 = (r - 1) - log r per token
    k3 = [(r - 1) - math.log(r) for r in (1.1, 0.9, 1.0, 2.0)]
    assert stats.approx_kl == pytest.approx(sum(k3) / 4, rel=1e-5)


def test_sequence_mean_weighs_sequences_equally() -> None:
    # seq 0: 1 trained token, loss -1 (ratio 1, A = 1); seq 1: 3 trained tokens, loss +1 each (ratio 1, A = -1)
    # sequence_mean = ((-1) + (3 / 3)) / 2 = 0; token_mean = (-1 + 3) / 4 = 0.5
    logprobs = torch.zeros(2, 4)
    mask = torch.tensor([[0, 1, 0, 0], [0, 1, 1, 1]])
    advantages = torch.tensor([1.0, -1.0])
    seq, _ = ppo_clip_loss(logprobs, torch.zeros(2, 4), advantages, mask, aggregation="sequence_mean")
    tok, _ = ppo_clip_loss(logprobs, torch.zeros(2, 4), advantages, mask, aggregation="token_mean")
    assert seq.item() == pytest.approx(0.0, abs=1e-7)
    assert tok.item() == pytest.approx(0.5, rel=1e-6)


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_micro_batches_with_global_normalizer_equal_one_batch(aggregation: str) -> None:
    torch.manual_seed(0)
    B, T = 5, 7
    base = torch.randn(B, T) * 0.3
    sampling = base + torch.randn(B, T) * 0.2
    mask = (torch.rand(B, T) > 0.3).long()
    mask[:, 0] = 0
    mask[:, 1] = 1  # every sequence has a trained token
    advantages = torch.randn(B)
    kwargs: dict[str, Any] = {"clip_low": 0.2, "clip_high": 0.28, "aggregation": aggregation}

    full = base.clone().requires_grad_(True)
    full_loss, _ = ppo_clip_loss(full, sampling, advantages, mask, **kwargs)
    full_loss.backward()

    normalizer = float(mask.sum()) if aggregation == "token_mean" else float(B)
    accumulated = base.clone().requires_grad_(True)
    total = 0.0
    for rows in ([0, 1], [2], [3, 4]):
        part, old, part_mask = accumulated[rows], sampling[rows], mask[rows]
        if rows == [2]:  # a micro-batch padded wider than needed: extra untrained columns change nothing
            pad = torch.full((1, 3), 50.0)
            part, old, part_mask = (
                torch.cat([part, pad], 1),
                torch.cat([old, -pad], 1),
                torch.cat([part_mask, 0 * pad], 1),
            )
        loss, _ = ppo_clip_loss(part, old, advantages[rows], part_mask, normalizer=normalizer, **kwargs)
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(full_loss.item(), rel=1e-5, abs=1e-7)
    assert full.grad is not None and accumulated.grad is not None
    torch.testing.assert_close(accumulated.grad, full.grad, rtol=1e-5, atol=1e-7)


def test_nothing_masked_gives_zero_loss() -> None:
    logprobs = torch.zeros(1, 3, requires_grad=True)
    loss, stats = ppo_clip_loss(logprobs, torch.zeros(1, 3), torch.ones(1), torch.zeros(1, 3))
    loss.backward()
    assert loss.item() == 0.0 and stats.n_loss_tokens == 0
    assert logprobs.grad is not None and float(logprobs.grad.abs().sum()) == 0.0


def test_huge_log_ratio_does_not_overflow() -> None:
    # log-ratio 1000 is clamped to 20 before exp: finite loss with a negative advantage
    loss, _ = ppo_clip_loss(
        torch.tensor([[0.0, 1000.0]]), torch.zeros(1, 2), torch.tensor([-1.0]), torch.tensor([[0, 1]])
    )
    assert math.isfinite(loss.item())


def test_bad_arguments() -> None:
    z = torch.zeros(1, 2)
    with pytest.raises(ConfigError, match=r"\(B, T\)"):
        ppo_clip_loss(z, torch.zeros(1, 3), torch.zeros(1), z)
    with pytest.raises(ConfigError, match=r"\(B,\)"):
        ppo_clip_loss(z, z, torch.zeros(2), z)
    with pytest.raises(ConfigError, match="clip_low"):
        ppo_clip_loss(z, z, torch.zeros(1), z, clip_low=1.0)
    with pytest.raises(ConfigError, match="normalizer"):
        ppo_clip_loss(z, z, torch.zeros(1), z, normalizer=0.0)
    with pytest.raises(ConfigError, match="aggregation"):
        ppo_clip_loss(z, z, torch.zeros(1), z, aggregation="sum")  # type: ignore[arg-type]
