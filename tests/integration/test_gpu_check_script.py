"""``scripts/gpu_check.sh --device cpu --tiny``: the GPU check script, run end to end in its CPU smoke mode.

The script is made for a GPU machine that this test suite never has, so this is what keeps it working: the wrapper
finds the interpreter and sets ``PYTHONPATH``, every part runs through the real code path (the embedded backend's
batched generation, ``TorchPolicyTrainer.train_step`` with and without gradient checkpointing) on a tiny random
model built from the shipped Qwen2.5-0.5B config, each figure comes out as one JSON line with a positive rate, the
GRPO part is skipped with its reason when no ``--model-dir`` is given, and ``--out`` gets the same lines.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_tiny_cpu_mode(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AGENTBOLT_WHEELS")}
    done = subprocess.run(
        [
            str(REPO_ROOT / "scripts" / "gpu_check.sh"),
            *("--device", "cpu", "--tiny", "--threads", "2", "--gen-repeats", "1", "--train-steps", "1"),
            *("--budget-s", "120", "--out", str(out)),
        ],
        cwd=tmp_path,  # not the repository root: the wrapper must find src/ itself
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by_check: dict[str, list[dict]] = {}
    for record in records:
        by_check.setdefault(record["check"], []).append(record)

    (environment,) = by_check["environment"]
    assert environment["device"] == "cpu" and environment["tiny"] is True and environment["dtype"] == "bf16"
    assert environment["torch"] and environment["transformers"] and environment["peft"]

    generation = by_check["generation"]
    assert [r["batch_size"] for r in generation] == [1, 4]
    for record in generation:
        assert "error" not in record and "skipped" not in record, record
        assert record["tokens_per_s"] > 0 and record["batched_together"] is True
        assert record["generated_tokens"][0] > 0

    training = by_check["training"]
    assert [(r["micro_batch_tokens"], r["gradient_checkpointing"]) for r in training] == [(256, False), (256, True)]
    for record in training:
        assert "error" not in record and "skipped" not in record, record
        assert record["tokens_per_s"] > 0 and record["trained_tokens_per_s"] > 0
        assert record["stepped"] is True and record["n_micro_batches"] >= 2

    (grpo,) = by_check["grpo"]
    assert "no --model-dir" in grpo["skipped"]
    (finished,) = by_check["done"]
    assert finished["ok"] is True and finished["wall_s"] < 120

    assert "== gpu_check summary ==" in done.stdout
    assert [json.loads(line) for line in out.read_text().splitlines()] == records
