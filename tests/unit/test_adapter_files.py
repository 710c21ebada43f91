"""The torch-free checks of a saved LoRA adapter: complete and readable files, and whether any step trained it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from agentbolt.algorithms.rl.adapter_files import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    check_adapter_files,
    untrained_adapter,
)
from agentbolt.errors import ConfigError

A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


def _adapter(folder: Path, tensors: dict[str, np.ndarray]) -> Path:
    folder.mkdir()
    (folder / ADAPTER_CONFIG).write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    save_file(tensors, str(folder / ADAPTER_WEIGHTS))
    return folder


def test_an_adapter_whose_b_matrices_are_all_zero_is_untrained(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 16)).astype(np.float32)
    fresh = _adapter(tmp_path / "fresh", {A: a, B: np.zeros((16, 4), np.float32)})
    check_adapter_files(fresh)
    assert untrained_adapter(fresh)  # peft's B = 0 start: the adapter changes nothing
    moved = np.zeros((16, 4), np.float32)
    moved[3, 1] = 1e-6  # one step moved one entry
    assert not untrained_adapter(_adapter(tmp_path / "moved", {A: a, B: moved}))
    assert not untrained_adapter(_adapter(tmp_path / "no_b", {A: a}))  # not a LoRA B layout: not claimed untrained


def test_missing_or_damaged_adapter_files_are_refused_with_what_to_give(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="holds no LoRA adapter"):
        check_adapter_files(empty)
    cut = _adapter(tmp_path / "cut", {A: np.ones((4, 16), np.float32)})
    data = (cut / ADAPTER_WEIGHTS).read_bytes()
    (cut / ADAPTER_WEIGHTS).write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match="is damaged"):
        check_adapter_files(cut)
