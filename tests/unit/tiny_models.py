"""A tiny random causal LM for trainer tests that need real transformers + peft code but no model files (not a test
module: imported by tests in this folder)."""

from __future__ import annotations

from typing import Any

import torch


def tiny_qwen2(
    vocab_size: int,
    *,
    max_positions: int = 128,
    seed: int = 0,
    hidden_size: int = 32,
    intermediate_size: int = 64,
    tie_word_embeddings: bool = False,
    dtype: torch.dtype = torch.float32,
) -> Any:
    """A 2-layer Qwen2 (hidden 32, 4 heads, 2 KV heads, untied head by default) in ``dtype``, eval mode, seeded
    weights."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).to(dtype).eval()
