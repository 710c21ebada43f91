"""Merged LoRA weights written into a plain copy of the model give the same outputs as the peft model."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")


def test_merged_weights_reproduce_the_lora_policy(smollm2_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from agentbolt.algorithms.rl.torch_backend import TorchTrainerConfig, attach_lora
    from agentbolt.algorithms.rl.weight_sync import load_weights, merged_lora_weights

    torch.manual_seed(0)
    serving = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    policy = attach_lora(copy.deepcopy(serving), TorchTrainerConfig())
    with torch.no_grad():  # move the adapters away from B = 0, as training would
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.02)
    ids = torch.tensor([[1, 504, 3303, 282, 260, 1345, 30, 2]])
    with torch.no_grad():
        before = serving(ids).logits
        expected = policy(ids).logits
    assert (expected - before).abs().max() > 1e-2  # the adapters do change the policy

    copied = load_weights(serving, merged_lora_weights(policy))
    assert copied == 30 * 7  # 30 layers x (q, k, v, o, gate, up, down)
    with torch.no_grad():
        after = serving(ids).logits
    assert torch.allclose(after, expected, atol=2e-4, rtol=1e-4)
    base_names = [n for n, _ in policy.named_parameters() if "base_layer" in n]
    assert base_names and all(not p.requires_grad for n, p in policy.named_parameters() if "base_layer" in n)
