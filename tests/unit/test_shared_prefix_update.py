"""The shared-prefix forward of the torch trainer gives the loss and gradients of the full forward.

A small Qwen2 (``tiny_models.tiny_qwen2``: 2 layers, random weights) in float64, so that only the order of sums
differs (the trainer's log-softmax runs in float32, so gradients agree to float32 rounding: each tensor's
difference is below 1e-6 of its norm; measured 1.9e-8), with LoRA adapters whose B matrices are random (fresh
adapters have B = 0, which would hide the gradient of A). Samples share a 24-token prefix (a "system prompt"), then
differ; two of them share their whole prompt (a GRPO group). The same train step runs on two copies of the model,
with the shared prefix on and off.
"""

from __future__ import annotations

import copy
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import tiny_qwen2  # noqa: E402

from agentbolt.adapter.samples import TrainingSample  # noqa: E402
from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, TorchTrainerConfig, attach_lora  # noqa: E402


def _model() -> object:
    return tiny_qwen2(128, max_positions=256).to(torch.float64)


def _samples(seed: int = 1) -> list[TrainingSample]:
    rng = random.Random(seed)
    system = [rng.randrange(3, 128) for _ in range(24)]
    prompts = [system + [rng.randrange(3, 128) for _ in range(n)] for n in (5, 9, 9, 14)]
    prompts[2] = list(prompts[1])  # a group: the same prompt, another answer
    samples = []
    for i, prompt in enumerate(prompts):
        answer = [rng.randrange(3, 128) for _ in range(6 + 3 * i)]
        ids = prompt + answer
        mask = [0] * len(prompt) + [1] * len(answer)
        samples.append(
            TrainingSample(
                input_ids=ids,
                loss_mask=mask,
                sampling_logprobs=[(-1.0 - 0.1 * i) if m else 0.0 for m in mask],
                advantage=[1.0, -0.5, 0.75, -1.25][i],
                rollout_id=f"ro-{i}",
            )
        )
    return samples


def _trainer(shared: int, micro_batch_tokens: int) -> TorchPolicyTrainer:
    config = TorchTrainerConfig(
        shared_prefix_min_tokens=shared, micro_batch_tokens=micro_batch_tokens, learning_rate=1e-3
    )
    model = attach_lora(copy.deepcopy(_model()), config)
    generator = torch.Generator().manual_seed(3)
    for name, parameter in model.named_parameters():
        if "lora_" in name:
            with torch.no_grad():
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
    model.to(torch.float64)
    return TorchPolicyTrainer(model, config, pad_token_id=0)


def _relative(a: object, b: object) -> float:
    """``|a - b| / |b|`` (Frobenius norms)."""
    return float((a - b).detach().norm() / b.detach().norm())  # type: ignore[operator, union-attr]


def _gradients(trainer: TorchPolicyTrainer, samples: list[TrainingSample], prefix_len: int) -> dict[str, object]:
    trainer.model.train()
    tensors = trainer._collate(samples)
    logprobs, _ = trainer._token_logprobs_and_values(tensors, prefix_len=prefix_len)
    weights = torch.arange(1, logprobs.numel() + 1, dtype=logprobs.dtype).view_as(logprobs)
    (logprobs * weights).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.model.zero_grad(set_to_none=True)
    trainer.model.eval()
    return {"logprobs": logprobs.detach(), **grads}


def test_shared_prefix_gives_the_full_forwards_logprobs_and_gradients() -> None:
    samples = _samples()
    trainer = _trainer(shared=8, micro_batch_tokens=4096)
    assert trainer._shared_prefix_length(samples) == 24  # the system prompt; the group's longer prefix is not shared
    full = _gradients(trainer, samples, prefix_len=0)
    shared = _gradients(trainer, samples, prefix_len=24)
    assert full.keys() == shared.keys() and len(full) > 2
    for name, value in full.items():
        assert _relative(shared[name], value) < 1e-6, name
    assert any("lora_A" in name and full[name].abs().sum() > 0 for name in full)  # the gradient reached A


@pytest.mark.parametrize("micro_batch_tokens", [4096, 40])
def test_a_train_step_is_the_same_with_and_without_the_shared_prefix(micro_batch_tokens: int) -> None:
    samples = _samples()
    on, off = _trainer(8, micro_batch_tokens), _trainer(0, micro_batch_tokens)
    stats_on, stats_off = on.train_step(samples), off.train_step(samples)
    assert stats_on["shared_prefix_tokens"] == 24 and stats_off["shared_prefix_tokens"] == 0
    assert stats_on["n_forwarded_positions"] < stats_off["n_forwarded_positions"]
    _assert_same_step(on, off, stats_on, stats_off, samples)


def _assert_same_step(
    a: TorchPolicyTrainer, b: TorchPolicyTrainer, stats_a: dict, stats_b: dict, samples: list[TrainingSample]
) -> None:
    """The two trainers' steps gave the same statistics, adapters and (afterwards) trainer logprobs."""
    for key in ("loss", "grad_norm", "approx_kl", "clip_fraction", "ratio_mean", "n_loss_tokens", "n_tokens"):
        assert stats_a[key] == pytest.approx(stats_b[key], rel=1e-6, abs=1e-9), key
    for (name, x), (_, y) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        if "lora_" in name:
            assert _relative(x, y) < 1e-6, name
    # trainer_logprobs (used to measure the sampler/trainer mismatch) takes the same path
    for x, y in zip(a.trainer_logprobs(samples), b.trainer_logprobs(samples), strict=True):
        assert x == pytest.approx(y, rel=1e-6, abs=1e-9)


def test_no_shared_prefix_when_it_is_too_short_or_reaches_a_trained_token() -> None:
    samples = _samples()
    assert _trainer(25, 4096)._shared_prefix_length(samples) == 0  # 24 < 25
    same = [samples[1], samples[2]]  # one prompt: the prefix stops one id before the first trained token
    assert _trainer(8, 4096)._shared_prefix_length(same) == samples[1].loss_mask.index(1) - 1
    assert _trainer(8, 4096)._shared_prefix_length(samples[:1]) == 0  # one sample: nothing to share


def _packing_trainer(packing: bool, micro_batch_tokens: int) -> TorchPolicyTrainer:
    trainer = _trainer(8, micro_batch_tokens)
    trainer.config = trainer.config.model_copy(update={"sequence_packing": packing})
    return trainer


def test_packed_tails_give_the_full_forwards_logprobs_and_gradients() -> None:
    samples = _samples()
    trainer = _packing_trainer(True, 4096)
    ((indices, packing),) = trainer._plan(samples, 24)
    assert packing is not None and packing.n_rows < len(samples)  # some tails share a row
    full = _gradients(trainer, samples, prefix_len=0)
    trainer.model.train()
    tensors = trainer._collate([samples[i] for i in indices], packing)
    logprobs, _ = trainer._token_logprobs_and_values(tensors, prefix_len=24)
    order = torch.tensor(indices)
    weights = torch.arange(1, logprobs.numel() + 1, dtype=logprobs.dtype).view(len(samples), -1)
    (logprobs * weights[order]).sum().backward()  # the same weight per token as the unpacked order got
    assert _relative(logprobs, full["logprobs"][order]) < 1e-6
    for name, parameter in trainer.model.named_parameters():
        if parameter.grad is not None:
            assert _relative(parameter.grad, full[name]) < 1e-6, name


@pytest.mark.parametrize("micro_batch_tokens", [4096, 40])
def test_a_packed_train_step_equals_the_padded_one(micro_batch_tokens: int) -> None:
    samples = _samples()
    packed, padded = _packing_trainer(True, micro_batch_tokens), _packing_trainer(False, micro_batch_tokens)
    stats_packed, stats_padded = packed.train_step(samples), padded.train_step(samples)
    assert stats_packed["n_forwarded_positions"] < stats_padded["n_forwarded_positions"]
    assert stats_packed["n_padding_tokens"] < stats_padded["n_padding_tokens"]
    _assert_same_step(packed, padded, stats_packed, stats_padded, samples)
