"""Losses: hand-computed values for PPO-clip (Schulman et al. 2017, eq. 7; DAPO clip-higher), the KL estimators
(k1, k3), truncated importance sampling and the three aggregations, and exact micro-batch accumulation."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from agentbolt.algorithms.rl.losses import (
    Aggregation,
    aggregate_token_losses,
    kl_penalty,
    ppo_clip_loss,
    rollout_mean_weights,
    truncated_is_weights,
)
from agentbolt.errors import ConfigError

torch.set_num_threads(1)


def _one_token(ratio: float, advantage: float, **kwargs: Any) -> tuple[float, float, float]:
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


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "rollout_mean"])
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

    # rollout_mean: rows 0, 1 and 3 are one rollout, split into three samples; weights over the whole batch
    weights = torch.tensor(rollout_mean_weights(["a", "a", "b", "a", "c"], mask.sum(dim=1).tolist()))
    full_kwargs = {**kwargs, "token_weights_B": weights} if aggregation == "rollout_mean" else kwargs

    full = base.clone().requires_grad_(True)
    full_loss, _ = ppo_clip_loss(full, sampling, advantages, mask, **full_kwargs)
    full_loss.backward()

    normalizer = float(mask.sum()) if aggregation == "token_mean" else float(B)
    accumulated = base.clone().requires_grad_(True)
    total = 0.0
    for rows in ([0, 1], [2], [3, 4]):
        if aggregation == "rollout_mean":
            part_kwargs = {**kwargs, "token_weights_B": weights[rows]}
        else:
            part_kwargs = {**kwargs, "normalizer": normalizer}
        part, old, part_mask = accumulated[rows], sampling[rows], mask[rows]
        if rows == [2]:  # a micro-batch padded wider than needed: extra untrained columns change nothing
            pad = torch.full((1, 3), 50.0)
            part, old, part_mask = (
                torch.cat([part, pad], 1),
                torch.cat([old, -pad], 1),
                torch.cat([part_mask, 0 * pad], 1),
            )
        loss, _ = ppo_clip_loss(part, old, advantages[rows], part_mask, **part_kwargs)
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


# ---- aggregation: token_mean, sequence_mean, rollout_mean --------------------------------------------------------

# Two rollouts, ratio r per token (clip 0.2 / 0.28 never binds here), loss_t = -min(r * A, clip(r) * A):
#   rollout a, A = +1, ratios [1.2, 1.0, 0.8, 1.0] -> losses [-1.2, -1.0, -0.8, -1.0]  (sum -4, mean -1)
#   rollout b, A = -1, ratios [1.1, 0.9]           -> losses [ 1.1,  0.9]              (sum  2, mean  1)
RATIOS_A, RATIOS_B = [1.2, 1.0, 0.8, 1.0], [1.1, 0.9]


def _rows(splits: list[tuple[str, list[float]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """Right-padded (logprobs, advantages, mask, rollout_ids) of samples given as (rollout, ratios)."""
    width = max(len(r) for _, r in splits)
    logprobs = torch.zeros(len(splits), width)
    mask = torch.zeros(len(splits), width)
    for i, (_, ratios) in enumerate(splits):
        logprobs[i, : len(ratios)] = torch.log(torch.tensor(ratios))
        mask[i, : len(ratios)] = 1.0
    advantages = torch.tensor([1.0 if rollout == "a" else -1.0 for rollout, _ in splits])
    return logprobs, advantages, mask, [rollout for rollout, _ in splits]


def _loss(splits: list[tuple[str, list[float]]], aggregation: Aggregation) -> float:
    logprobs, advantages, mask, rollout_ids = _rows(splits)
    weights = None
    if aggregation == "rollout_mean":
        weights = torch.tensor(rollout_mean_weights(rollout_ids, [int(n) for n in mask.sum(dim=1).tolist()]))
    loss, _ = ppo_clip_loss(
        logprobs,
        torch.zeros_like(logprobs),
        advantages,
        mask,
        aggregation=aggregation,
        token_weights_B=weights,
    )
    return loss.item()


SPLIT = [("a", RATIOS_A[:1]), ("a", RATIOS_A[1:]), ("b", RATIOS_B)]  # rollout a split into samples of 1 and 3 tokens
WHOLE = [("a", RATIOS_A), ("b", RATIOS_B)]


def test_token_mean_golden() -> None:
    # (-1.2 - 1.0 - 0.8 - 1.0 + 1.1 + 0.9) / 6 = -2 / 6 = -1/3, split or not
    assert _loss(SPLIT, "token_mean") == pytest.approx(-1 / 3, rel=1e-6)
    assert _loss(WHOLE, "token_mean") == pytest.approx(-1 / 3, rel=1e-6)


def test_sequence_mean_golden_depends_on_the_split() -> None:
    # split: sample means -1.2, (-1.0 - 0.8 - 1.0) / 3 = -0.9333..., 1.0 -> (-1.2 - 2.8/3 + 1) / 3 = -0.377777...
    assert _loss(SPLIT, "sequence_mean") == pytest.approx((-1.2 - 2.8 / 3 + 1.0) / 3, rel=1e-6)
    # whole: (-1 + 1) / 2 = 0
    assert _loss(WHOLE, "sequence_mean") == pytest.approx(0.0, abs=1e-7)


def test_rollout_mean_golden_does_not_depend_on_the_split() -> None:
    # rollout means: a = -4 / 4 = -1, b = 2 / 2 = 1 -> (-1 + 1) / 2 = 0, however a is split
    assert _loss(SPLIT, "rollout_mean") == pytest.approx(0.0, abs=1e-7)
    assert _loss(WHOLE, "rollout_mean") == pytest.approx(0.0, abs=1e-7)
    # a split into three samples (2, 1 and 1 tokens): still -1 and 1 -> 0
    three = [("a", RATIOS_A[:2]), ("a", RATIOS_A[2:3]), ("a", RATIOS_A[3:]), ("b", RATIOS_B)]
    assert _loss(three, "rollout_mean") == pytest.approx(0.0, abs=1e-7)


def test_a_rollouts_total_weight_does_not_change_when_it_is_split() -> None:
    # R = 2 rollouts; a has N_a = 4 trained tokens, b has N_b = 2; weight per token = 1 / (R * N_r)
    # whole: a 1/(2*4) = 1/8, b 1/(2*2) = 1/4; total weight of a = 4 * 1/8 = 1/2, of b = 2 * 1/4 = 1/2
    assert rollout_mean_weights(["a", "b"], [4, 2]) == [1 / 8, 1 / 4]
    # a split into samples of 1 and 3 tokens: every token of a still weighs 1/8; total = 1/8 + 3/8 = 1/2
    split = rollout_mean_weights(["a", "a", "b"], [1, 3, 2])
    assert split == [1 / 8, 1 / 8, 1 / 4]
    assert split[0] * 1 + split[1] * 3 == 0.5
    # into three samples of 1, 1 and 2 tokens: 1/8 + 1/8 + 2/8 = 1/2
    three = rollout_mean_weights(["a", "b", "a", "a"], [1, 2, 1, 2])
    assert three[0] * 1 + three[2] * 1 + three[3] * 2 == 0.5 and three[1] * 2 == 0.5
    # a rollout with no trained token counts for nothing and does not dilute the others
    assert rollout_mean_weights(["a", "z", "b"], [4, 0, 2]) == [1 / 8, 0.0, 1 / 4]


def test_rollout_mean_gradient_does_not_depend_on_the_split() -> None:
    def grads(splits: list[tuple[str, list[float]]]) -> list[float]:
        logprobs, advantages, mask, rollout_ids = _rows(splits)
        logprobs.requires_grad_(True)
        weights = torch.tensor(rollout_mean_weights(rollout_ids, [int(n) for n in mask.sum(dim=1).tolist()]))
        loss, _ = ppo_clip_loss(
            logprobs, torch.zeros_like(logprobs), advantages, mask, aggregation="rollout_mean", token_weights_B=weights
        )
        loss.backward()
        assert logprobs.grad is not None
        return logprobs.grad[mask.bool()].tolist()  # trained tokens in order

    # d loss / d logp_t = w_t * -ratio_t * A: a tokens -r/8, b tokens +r/4
    expected = [-1.2 / 8, -1.0 / 8, -0.8 / 8, -1.0 / 8, 1.1 / 4, 0.9 / 4]
    assert grads(SPLIT) == pytest.approx(expected, rel=1e-6)
    assert grads(WHOLE) == pytest.approx(expected, rel=1e-6)


def test_aggregation_errors() -> None:
    loss, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ConfigError, match="rollout_mean needs token_weights_B"):
        aggregate_token_losses(loss, mask, "rollout_mean")
    with pytest.raises(ConfigError, match="already normalized"):
        aggregate_token_losses(loss, mask, "rollout_mean", normalizer=2.0, token_weights_B=torch.ones(2))
    with pytest.raises(ConfigError, match=r"\(B,\)"):
        aggregate_token_losses(loss, mask, "rollout_mean", token_weights_B=torch.ones(3))
    with pytest.raises(ConfigError, match="only used by rollout_mean"):
        aggregate_token_losses(loss, mask, "token_mean", token_weights_B=torch.ones(2))
    with pytest.raises(ConfigError, match="one per sample"):
        rollout_mean_weights(["a"], [1, 2])
    with pytest.raises(ConfigError, match=">= 0"):
        rollout_mean_weights(["a"], [-1])


# ---- KL to a reference (Schulman 2020, "Approximating KL Divergence") --------------------------------------------


def test_kl_estimators_golden() -> None:
    # pi = 0.5, pi_ref = 0.25: log_r = log(pi_ref / pi) = log 0.5 = -0.693147
    #   k1 = -log_r = 0.693147;  k3 = r - 1 - log r = 0.5 - 1 + 0.693147 = 0.193147
    # pi = 0.25, pi_ref = 0.5: log_r = log 2 = 0.693147
    #   k1 = -0.693147 (negative for one token);  k3 = 2 - 1 - 0.693147 = 0.306853
    logprobs = torch.log(torch.tensor([[0.5, 0.25]]))
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    assert kl_penalty(logprobs, ref, "k1")[0].tolist() == pytest.approx([0.693147, -0.693147], abs=1e-6)
    assert kl_penalty(logprobs, ref, "k3")[0].tolist() == pytest.approx([0.193147, 0.306853], abs=1e-6)
    assert kl_penalty(ref, ref, "k3")[0].tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("estimator", "expected_loss", "expected_grad"),
    [
        # ratio 1, A = 1 -> pg loss -1, pg grad -ratio * A = -1
        # k3: 0.193147 (above); d k3 / d logp = d (exp(ref - lp) - 1 - (ref - lp)) = 1 - exp(ref - lp) = 0.5
        #   loss = -1 + 0.1 * 0.193147 = -0.980685; grad = -1 + 0.1 * 0.5 = -0.95
        ("k3", -1.0 + 0.1 * 0.193147, -0.95),
        # k1: 0.693147; d k1 / d logp = 1 -> loss = -1 + 0.0693147 = -0.930685; grad = -1 + 0.1 = -0.9
        ("k1", -1.0 + 0.1 * 0.693147, -0.9),
    ],
)
def test_ppo_clip_with_kl_penalty_golden(estimator: str, expected_loss: float, expected_grad: float) -> None:
    logprobs = torch.tensor([[math.log(0.5)]], requires_grad=True)
    sampling = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    loss, stats = ppo_clip_loss(
        logprobs,
        sampling,
        torch.tensor([1.0]),
        torch.ones(1, 1),
        ref_logprobs_BT=ref,
        kl_coef=0.1,
        kl_estimator=estimator,  # type: ignore[arg-type]
    )
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, abs=1e-6)
    assert logprobs.grad is not None and logprobs.grad.item() == pytest.approx(expected_grad, abs=1e-6)
    assert stats.kl_reference == pytest.approx((expected_loss + 1.0) / 0.1, abs=1e-5)


def test_kl_ignores_masked_out_garbage() -> None:
    # position 0 is untrained and holds inf; the loss and the gradient stay finite
    logprobs = torch.tensor([[math.inf, 0.0]], requires_grad=True)
    loss, _ = ppo_clip_loss(
        logprobs,
        torch.zeros(1, 2),
        torch.ones(1),
        torch.tensor([[0, 1]]),
        ref_logprobs_BT=torch.tensor([[-math.inf, 0.0]]),
        kl_coef=0.5,
    )
    loss.backward()
    assert math.isfinite(loss.item())
    assert logprobs.grad is not None and torch.isfinite(logprobs.grad).all()


# ---- truncated importance sampling (Yao et al. 2025; IMPALA, arXiv:1802.01561) -----------------------------------


def test_truncated_is_weights_golden() -> None:
    # pi_old / pi_behavior = [0.6 / 0.3, 0.3 / 0.6, 0.5 / 0.5] = [2, 0.5, 1]; truncated at 1.5 -> [1.5, 0.5, 1]
    old = torch.log(torch.tensor([[0.6, 0.3, 0.5]]))
    behavior = torch.log(torch.tensor([[0.3, 0.6, 0.5]]))
    assert truncated_is_weights(old, behavior, 1.5)[0].tolist() == pytest.approx([1.5, 0.5, 1.0], rel=1e-6)


def test_ppo_clip_with_truncated_importance_sampling_golden() -> None:
    # two tokens, logprobs = pi_old (ratio 1), A = 1: pg loss per token -1, weighted by w = [1.5, 0.5] (above)
    # token mean = (-1.5 - 0.5) / 2 = -1.0; grad per token = w * -ratio * A / 2 = [-0.75, -0.25]
    old = torch.log(torch.tensor([[0.6, 0.3]]))
    behavior = torch.log(torch.tensor([[0.3, 0.6]]))
    logprobs = old.clone().requires_grad_(True)
    loss, stats = ppo_clip_loss(
        logprobs, behavior, torch.tensor([1.0]), torch.ones(1, 2), old_logprobs_BT=old, tis_cap=1.5
    )
    loss.backward()
    assert loss.item() == pytest.approx(-1.0, rel=1e-6)
    assert logprobs.grad is not None
    assert logprobs.grad[0].tolist() == pytest.approx([-0.75, -0.25], rel=1e-6)
    assert stats.tis_weight_mean == pytest.approx(1.0, rel=1e-6)
    assert stats.tis_truncated_fraction == 0.5
    assert stats.ratio_mean == pytest.approx(1.0, rel=1e-6)  # the ratio is anchored at pi_old, not pi_behavior
    # approx_kl is 0 by construction here; sampling_kl is the serving/trainer gap: d = pi_old / pi_behavior = [2, 0.5],
    # k3 = d - 1 - log d = [1 - ln 2, -0.5 + ln 2] = [0.306853, 0.193147], mean 0.25
    assert stats.approx_kl == pytest.approx(0.0, abs=1e-7)
    assert stats.sampling_kl == pytest.approx(0.25, rel=1e-5)


def test_sampling_kl_equals_approx_kl_without_truncated_importance_sampling() -> None:
    # pi / pi_behavior = 0.66 / 0.6 = 1.1: k3 = 0.1 - ln 1.1 = 0.0046898
    _, stats = ppo_clip_loss(
        torch.log(torch.tensor([[0.66]])), torch.log(torch.tensor([[0.6]])), torch.tensor([1.0]), torch.ones(1, 1)
    )
    assert stats.approx_kl == pytest.approx(0.1 - math.log(1.1), rel=1e-5)
    assert stats.sampling_kl == pytest.approx(stats.approx_kl, rel=1e-6)


def test_old_logprobs_anchor_the_ratio() -> None:
    # pi / pi_old = 0.66 / 0.6 = 1.1, whatever pi_behavior is: loss = -1.1 with A = 1, no importance weight
    loss, stats = ppo_clip_loss(
        torch.log(torch.tensor([[0.66]])),
        torch.log(torch.tensor([[0.1]])),
        torch.tensor([1.0]),
        torch.ones(1, 1),
        old_logprobs_BT=torch.log(torch.tensor([[0.6]])),
    )
    assert loss.item() == pytest.approx(-1.1, rel=1e-6)
    assert stats.tis_weight_mean == 1.0


def test_option_errors() -> None:
    z = torch.zeros(1, 2)
    with pytest.raises(ConfigError, match="tis_cap needs old_logprobs_BT"):
        ppo_clip_loss(z, z, torch.zeros(1), z, tis_cap=2.0)
    with pytest.raises(ConfigError, match="cap must be > 0"):
        ppo_clip_loss(z, z, torch.zeros(1), z, old_logprobs_BT=z, tis_cap=0.0)
    with pytest.raises(ConfigError, match="needs ref_logprobs_BT"):
        ppo_clip_loss(z, z, torch.zeros(1), z, kl_coef=0.1)
    with pytest.raises(ConfigError, match="kl_coef must be >= 0"):
        ppo_clip_loss(z, z, torch.zeros(1), z, ref_logprobs_BT=z, kl_coef=-0.1)
    with pytest.raises(ConfigError, match="KL estimator"):
        ppo_clip_loss(z, z, torch.zeros(1), z, ref_logprobs_BT=z, kl_coef=0.1, kl_estimator="k2")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="old_logprobs"):
        ppo_clip_loss(z, z, torch.zeros(1), z, old_logprobs_BT=torch.zeros(1, 3))


def test_per_token_advantages_by_hand_and_equal_to_broadcast_when_constant() -> None:
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    sampling = torch.tensor([[-1.0, -2.0, -0.5]])
    mask = torch.tensor([[1, 1, 0]])
    # ratio 1 everywhere; token mean over the 2 trained tokens: -(2 * 1 + (-1) * 1) / 2 = -0.5 (the untrained
    # token's advantage, even a non-finite one, is ignored).
    loss, _ = ppo_clip_loss(logprobs, sampling, torch.tensor([[2.0, -1.0, float("nan")]]), mask)
    assert loss.item() == pytest.approx(-0.5)
    loss.backward()
    assert logprobs.grad is not None and logprobs.grad[0].tolist() == pytest.approx([-1.0, 0.5, 0.0])
    broadcast, _ = ppo_clip_loss(logprobs, sampling, torch.tensor([0.7]), mask)
    per_token, _ = ppo_clip_loss(logprobs, sampling, torch.tensor([[0.7, 0.7, 0.7]]), mask)
    assert per_token.item() == broadcast.item()
    with pytest.raises(ConfigError, match=r"\(B, T\)"):
        ppo_clip_loss(logprobs, sampling, torch.tensor([[1.0, 2.0]]), mask)
