"""The linear roofline of benchmarks/generation.py (in benchmarks/roofline.py): the probe on a real model's shapes
(SmolLM2-135M) and the floor of a level's work, interpolated by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # generation.py imports roofline.py from its own folder, as a script does
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_benchmark_under_test", BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load("roofline")


def test_generation_benchmark_uses_the_roofline_module() -> None:
    generation = _load("generation")
    assert generation.linear_floor_fields.__module__ == "roofline"
    assert generation.measure_linear_floor.__module__ == "roofline"


def test_linear_floor_interpolates_the_step_time_and_adds_prefill(bench: ModuleType) -> None:
    roof = {"linear_step_ms": {"1": 40.0, "4": 44.0, "8": 52.0, "16": 64.0}, "prefill_ms_per_token": 2.0}
    # 10 steps of 6 rows: halfway between 4 (44 ms) and 8 (52 ms) = 48 ms; 100 prefilled ids at 2 ms
    assert bench.linear_floor_s(roof, decode_rows=60, decode_steps=10, prefill_tokens=100) == pytest.approx(0.68)
    # outside the measured rows: the nearest measured count (no extrapolation)
    assert bench.linear_floor_s(roof, decode_rows=64, decode_steps=2, prefill_tokens=0) == pytest.approx(0.128)
    assert bench.linear_floor_s(roof, decode_rows=0, decode_steps=0, prefill_tokens=5) is None
    line = {"generated_tokens": 136, "requests": 8, "wall_s": 1.7, "concurrency": 8}
    fields = bench.linear_floor_fields(roof, line, {"decode_rows": 60, "decode_steps": 10, "prefill_tokens": 100})
    # full batch: 136 - 8 first tokens (from the prefill) = 128 in steps of 8 rows = 16 steps at 52 ms (832 ms)
    # + 100 ids at 2 ms = 1.032 s; 136 / 1.032 = 131.8
    assert fields == {
        "linear_floor_s": 0.68,
        "linear_floor_tokens_per_s": 200.0,
        "linear_floor_share": 0.4,
        "full_batch_roofline_tokens_per_s": 131.8,
    }
    assert bench.full_batch_floor_s(roof, concurrency=8, decoded_tokens=128, prefill_tokens=100) == pytest.approx(1.032)
    assert bench.full_batch_floor_s(roof, concurrency=12, decoded_tokens=128, prefill_tokens=100) == 0.0
    assert set(bench.linear_floor_fields(roof, line, None).values()) == {None}  # an arm without step counts


def test_linear_probe_covers_every_matrix_of_the_model(bench: ModuleType, smollm2_dir: Path) -> None:
    shapes, head = bench._weight_shapes(smollm2_dir)
    # SmolLM2-135M: 30 layers of q, k, v, o, gate, up, down; the tied 49,152 x 576 embedding is the output projection
    assert len(shapes) == 30 * 7 and head == (49152, 576)
    assert (576, 576) in shapes and (1536, 576) in shapes and (576, 1536) in shapes
    probe = bench.measure_linear_floor(smollm2_dir, threads=1, rows=[1, 4], prefill_rows=8, repeats=1)
    assert probe["linear_matrices"] == 30 * 7 + 1
    assert set(probe["linear_step_ms"]) == {"1", "4"} and all(ms > 0 for ms in probe["linear_step_ms"].values())
    for rows, tokens_per_s in probe["linear_roofline_tokens_per_s"].items():
        assert tokens_per_s == pytest.approx(int(rows) / probe["linear_step_ms"][rows] * 1000, rel=1e-2)
    assert probe["prefill_ms_per_token"] > 0
    # the rates: 2 FLOPs per weight per row, and the packed weights' bytes, over the measured time
    from agentbolt.inference import packed_linear

    elements = sum(out * width for out, width in shapes) + head[0] * head[1]
    element_bytes = 4 if packed_linear.compute_dtype() == torch.float32 else 2
    for rows, ms in probe["linear_step_ms"].items():
        assert probe["linear_gflops"][rows] == pytest.approx(2 * elements * int(rows) / (ms / 1e3) / 1e9, rel=1e-2)
        assert probe["linear_read_gb_s"][rows] == pytest.approx(elements * element_bytes / (ms / 1e3) / 1e9, rel=1e-2)
    body = elements - head[0] * head[1]
    assert probe["prefill_gflops"] == pytest.approx(2 * body / (probe["prefill_ms_per_token"] / 1e3) / 1e9, rel=1e-2)
