"""Memory of the LoRA policy update over steps: resident memory after and peak during each ``train_step``.

The job's update runs ``TorchPolicyTrainer.train_step`` on one dedicated thread (``RLTrainer.on_update_thread``).
This script does the same on synthetic samples shaped like the calc agent's batches (prompt ~300 tokens, response
~70 tokens, the same count every step), so what changes from step to step is the process, not the batch:

    .venv/bin/python benchmarks/update_memory.py --model qwen2.5-0.5b --steps 4 --samples 20
    .venv/bin/python benchmarks/update_memory.py --model qwen2.5-0.5b --steps 4 --samples 20 --trim

``--trim`` calls glibc's ``malloc_trim(0)`` after each step (returns freed heap pages to the system). It prints one
line per step: RSS after the step and the peak RSS during it (``/proc/self/status`` ``VmHWM``, reset before each step
through ``/proc/self/clear_refs``), in GB. Linux only.
"""

from __future__ import annotations

import argparse
import ctypes
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="embedded model name or bf16 model directory")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--samples", type=int, default=20, help="samples per step")
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--response-tokens", type=int, default=70)
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) after each step")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from agentbolt.adapter.samples import TrainingSample
    from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, TorchTrainerConfig, attach_lora
    from agentbolt.trainer.local import resolve_model

    model_dir = resolve_model(args.model)
    config = TorchTrainerConfig()
    policy = attach_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16), config)
    trainer = TorchPolicyTrainer(policy, config, pad_token_id=0)
    vocab = policy.config.vocab_size
    rng = random.Random(0)
    libc = ctypes.CDLL("libc.so.6") if args.trim else None

    def batch() -> list[TrainingSample]:
        samples = []
        for i in range(args.samples):
            n_prompt = args.prompt_tokens + rng.randint(-20, 20)
            n_response = args.response_tokens + rng.randint(-30, 30)
            ids = [rng.randrange(vocab) for _ in range(n_prompt + n_response)]
            mask = [0] * n_prompt + [1] * n_response
            logprobs = [0.0] * n_prompt + [-1.0] * n_response
            samples.append(
                TrainingSample(ids, mask, logprobs, advantage=1.0 if i % 2 else -1.0, rollout_id=f"r{i // 4}")
            )
        return samples

    print(
        f"model {args.model}, {args.samples} samples/step, trim={args.trim}; RSS after load "
        f"{_status_kb('VmRSS') / 1e6:.2f} GB"
    )
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentbolt-update") as update_thread:
        for step in range(1, args.steps + 1):
            samples = batch()
            _reset_peak()
            t0 = time.perf_counter()
            stats = update_thread.submit(trainer.train_step, samples).result()
            if libc is not None:
                update_thread.submit(libc.malloc_trim, 0).result()
                libc.malloc_trim(0)
            print(
                f"step {step}: {stats['n_tokens']:.0f} tokens in {time.perf_counter() - t0:.0f} s; "
                f"RSS after {_status_kb('VmRSS') / 1e6:.2f} GB, peak during {_status_kb('VmHWM') / 1e6:.2f} GB "
                f"(threads {threading.active_count()})",
                flush=True,
            )


if __name__ == "__main__":
    main()
