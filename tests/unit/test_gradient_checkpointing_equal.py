"""Gradient checkpointing in the torch trainer backend changes memory, never the numbers.

A tiny random Qwen2 (2 layers, float32, CPU) is built twice from the same seed, LoRA is attached with
``gradient_checkpointing`` off and on, LoRA ``B`` is set to the same non-zero values in both (at its initial 0 the
gradient of ``A`` would be 0 and prove nothing), and one ``train_step`` runs on the same samples: the loss, the
gradient norm and every LoRA gradient must agree to 1e-6. Small ``micro_batch_tokens`` and ``logprob_chunk_tokens``
make the step run several micro-batches and several checkpointed ``lm_head`` chunks, so the decoder's checkpointing
(transformers, per layer) runs together with the trainer's own chunk checkpointing under peft. A forward pre-hook on
the first decoder layer's MLP proves the recomputation happened (two calls per micro-batch instead of one).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from tiny_models import tiny_qwen2

from agentbolt.adapter.samples import TrainingSample
from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, TorchTrainerConfig, attach_lora

VOCAB = 97


def _tiny_model() -> Any:
    return tiny_qwen2(VOCAB)


def _samples() -> list[TrainingSample]:
    rng = random.Random(0)
    samples = []
    for i, (prompt_len, response_len) in enumerate([(5, 7), (9, 3), (4, 12), (6, 6), (11, 2)]):
        ids = [rng.randrange(1, VOCAB) for _ in range(prompt_len + response_len)]
        mask = [0] * prompt_len + [1] * response_len
        logprobs = [-rng.uniform(1.0, 6.0) if m else 0.0 for m in mask]
        samples.append(
            TrainingSample(ids, mask, logprobs, advantage=[1.0, -0.5, 0.25, -1.5, 2.0][i], rollout_id=f"r{i}")
        )
    return samples


def _step(gradient_checkpointing: bool) -> tuple[dict[str, float], dict[str, torch.Tensor], int]:
    """One train_step; returns its stats, the LoRA gradients just before the optimizer step, and how many times
    the first decoder layer's MLP ran."""
    config = TorchTrainerConfig(
        lora_r=4,
        lora_alpha=8,
        micro_batch_tokens=32,
        logprob_chunk_tokens=5,
        gradient_checkpointing=gradient_checkpointing,
    )
    policy = attach_lora(_tiny_model(), config)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    trainer = TorchPolicyTrainer(policy, config, pad_token_id=0)
    named = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    grads: dict[str, torch.Tensor] = {}
    step = trainer.optimizer.step

    def capture_then_step(*args: Any, **kwargs: Any) -> Any:
        grads.update({n: p.grad.detach().clone() for n, p in named if p.grad is not None})
        return step(*args, **kwargs)

    trainer.optimizer.step = capture_then_step  # type: ignore[method-assign]
    calls = 0

    def count(*_: Any) -> None:
        nonlocal calls
        calls += 1

    # a pre-hook on the MLP inside the first decoder layer: transformers >= 5 checkpoints the layer's forward (so
    # the layer's own hooks run once), older ones its __call__; either way the modules inside run again in the
    # recomputation. A pre-hook, since torch's non-reentrant checkpoint stops the recomputation as soon as the last
    # saved tensor is rebuilt, before the MLP returns (a forward hook there would not fire).
    base: Any = policy.get_base_model()
    base.model.layers[0].mlp.register_forward_pre_hook(count)
    stats = trainer.train_step(_samples())
    assert stats["stepped"] == 1.0, stats
    assert len(grads) == len(named)
    return stats, grads, calls


def test_gradient_checkpointing_gives_the_same_loss_and_lora_gradients() -> None:
    torch.set_num_threads(1)
    plain_stats, plain_grads, plain_calls = _step(gradient_checkpointing=False)
    ckpt_stats, ckpt_grads, ckpt_calls = _step(gradient_checkpointing=True)

    micro_batches = int(plain_stats["n_micro_batches"])
    assert micro_batches >= 2 and ckpt_stats["n_micro_batches"] == micro_batches
    assert plain_calls == micro_batches  # one forward per micro-batch
    assert ckpt_calls == 2 * micro_batches  # forward + recomputation in the backward
    assert ckpt_stats["loss"] == pytest.approx(plain_stats["loss"], abs=1e-6)
    assert ckpt_stats["grad_norm"] == pytest.approx(plain_stats["grad_norm"], rel=1e-6)
    assert plain_stats["grad_norm"] > 0
    assert set(ckpt_grads) == set(plain_grads)
    assert any("lora_A" in n for n in plain_grads) and any("lora_B" in n for n in plain_grads)
    for name, grad in plain_grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=0, atol=1e-6, msg=name)
