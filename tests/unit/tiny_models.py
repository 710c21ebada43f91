"""A tiny random causal LM for trainer tests that need real transformers + peft code but no model files (not a test
module: imported by tests in this folder)."""

from __future__ import annotations

from typing import Any

import torch


def tiny_qwen2(vocab_size: int, *, max_positions: int = 128, seed: int = 0) -> Any:
    """A 2-layer Qwen2 (hidden 32, 4 heads, 2 KV heads, untied head) in float32, eval mode, seeded weights."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
