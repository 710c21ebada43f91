"""The torch backend's value head (PPO with GAE) on a tiny random Qwen2 in float32: it starts at 0, its loss is
0.5 (V - return)^2 over the trained tokens, it learns, and per-token advantages that are constant train exactly like
the per-sample advantage."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tiny_models import tiny_qwen2

from agentbolt.adapter.samples import TrainingSample
from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, TorchTrainerConfig, attach_lora
from agentbolt.errors import ConfigError

VOCAB = 61


def _trainer(**overrides: Any) -> TorchPolicyTrainer:
    model = tiny_qwen2(VOCAB, max_positions=64)
    settings = TorchTrainerConfig(**{"learning_rate": 1e-2, "micro_batch_tokens": 16, **overrides})
    return TorchPolicyTrainer(attach_lora(model, settings), settings, pad_token_id=0)


IDS = [[5, 6, 7, 8, 9], [11, 12, 13, 14], [21, 22, 23, 24, 25, 26]]
MASKS = [[0, 0, 1, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1, 1, 1]]


def _samples(trainer: TorchPolicyTrainer, *, per_token: bool, returns: float = 1.0) -> list[TrainingSample]:
    out = []
    for ids, mask, advantage in zip(IDS, MASKS, [0.5, -1.0, 2.0], strict=True):
        base = TrainingSample(ids, mask, [0.0] * len(ids), advantage, f"r{len(out)}")
        (logprobs,) = trainer.trainer_logprobs([base])  # on-policy: ratio exactly 1
        out.append(
            TrainingSample(
                ids,
                mask,
                logprobs,
                0.0 if per_token else advantage,
                base.rollout_id,
                token_advantages=[advantage * m for m in mask] if per_token else None,
                token_returns=[returns * m for m in mask] if per_token else None,
            )
        )
    return out


def test_values_start_at_zero_and_need_a_value_head() -> None:
    trainer = _trainer(value_head=True)
    assert trainer.values(_samples(trainer, per_token=True)) == [[0.0] * len(ids) for ids in IDS]
    plain = _trainer()
    with pytest.raises(ConfigError, match="no value head"):
        plain.values(_samples(plain, per_token=False))


def test_value_loss_by_hand_and_the_value_head_learns() -> None:
    trainer = _trainer(value_head=True, vf_coef=1.0)
    samples = _samples(trainer, per_token=True, returns=1.0)
    stats = trainer.train_step(samples)
    # V = 0 on all 7 trained tokens, returns 1: 0.5 * (0 - 1)^2 averaged = 0.5.
    assert stats["value_loss"] == pytest.approx(0.5) and stats["value_mean"] == 0.0 and stats["stepped"] == 1.0
    losses = [trainer.train_step(_samples(trainer, per_token=True))["value_loss"] for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0]
    values = trainer.values(samples)
    trained = [v for row, mask in zip(values, MASKS, strict=True) for v, m in zip(row, mask, strict=True) if m]
    assert all(0.3 < v < 1.7 for v in trained), trained


def test_constant_token_advantages_train_like_the_sample_advantage() -> None:
    # Same seed, same weights; value loss weight 0 so only the policy term differs (it must not).
    grads = []
    for per_token in (False, True):
        trainer = _trainer(value_head=True, vf_coef=0.0)
        lora_b = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
        with torch.no_grad():
            for i, p in enumerate(lora_b):
                p.copy_(torch.full_like(p, 0.01 * (i + 1)))  # non-zero B, so A gets a gradient
        captured: dict[str, torch.Tensor] = {}

        def keep(trainer: TorchPolicyTrainer = trainer, captured: dict[str, torch.Tensor] = captured) -> None:
            for name, p in trainer.model.named_parameters():
                if p.grad is not None:
                    captured[name] = p.grad.detach().clone()

        trainer.optimizer.register_step_pre_hook(lambda *_, keep=keep: keep())
        stats = trainer.train_step(_samples(trainer, per_token=per_token))
        grads.append((stats["loss"], captured))
    (loss_a, grads_a), (loss_b, grads_b) = grads
    assert loss_a == pytest.approx(loss_b, abs=1e-6) and grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-6, rtol=1e-5)


def test_a_batch_must_not_mix_per_token_and_per_sample_advantages() -> None:
    trainer = _trainer(value_head=True)
    mixed = [*_samples(trainer, per_token=True)[:1], *_samples(trainer, per_token=False)[1:]]
    with pytest.raises(ConfigError, match="every sample has token_advantages"):
        trainer.train_step(mixed)
