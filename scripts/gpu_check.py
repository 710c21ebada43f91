#!/usr/bin/env python3
"""GPU check of the embedded path: generation and training throughput of the torch backend, then GRPO steps.

Made for a machine with one GPU, torch, transformers and peft, and nothing else: no network, no model weights, at most
64 MiB of files per call (``docs/gpu.md``). It runs, in order, each part within what is left of ``--budget-s``:

1. ``environment``: versions, the device, bf16 support, memory.
2. ``generation``: tokens/s of :class:`agentbolt.inference.embedded.EmbeddedBackend` (its queue, batcher and
   ``model.generate`` call with the sampling-logprob recorder, exactly the path the gateway uses) at each
   ``--gen-batch-sizes``, with ``--prompt-tokens`` random prompt ids and ``--response-tokens`` sampled tokens per
   request (temperature 1; a row that samples an end-of-turn id stops early, so the count is of tokens actually
   generated). A synthetic tokenizer stands in for the real one (random ids in, no text out). One untimed warm-up
   batch per size, then ``--gen-repeats`` timed ones; the figure is the median.
3. ``training``: tokens/s of :meth:`TorchPolicyTrainer.train_step` (collate, forward, PPO-clip loss, backward,
   gradient clip, AdamW) on ``--train-samples`` synthetic samples in groups of ``--group-size`` (prompt and response
   lengths drawn from the given ranges; sampling logprobs from the policy itself, untimed), LoRA ``--lora-r`` on every
   projection, for each ``--train-configs`` entry ``MICRO_BATCH_TOKENS:ckpt|nockpt``. One untimed warm-up step,
   then ``--train-steps`` timed; median tokens/s (prompt + response, no padding), trained tokens/s (response tokens)
   and the peak device memory of a step (CUDA). An out-of-memory error is reported and the next entry runs.
4. ``grpo``: ``--grpo-steps`` GRPO steps of the calc agent through :func:`agentbolt.trainer.local.local_training`
   (the ``agentbolt demo`` machinery: store, server, gateway, runner processes, merged-LoRA weight sync) on
   ``--device``, only when ``--model-dir`` names a real model directory; otherwise skipped with the reason.

Throughput parts use randomly initialised weights built from ``src/agentbolt/inference/configs/qwen2.5-0.5b.json``
(the architecture of the embedded ``qwen2.5-0.5b``: 24 layers, hidden 896, 14 heads / 2 KV heads, MLP 4864, vocab
151,936, untied lm_head as in the converted GGUF), so no weights are needed: speed and memory do not depend on the
values. ``--tiny`` swaps in a 2-layer, 64-wide model with a 1,024-token vocabulary and small sizes everywhere, to
test the script on a CPU in well under a minute.

Output: one JSON object per line on stdout (``{"check": "environment" | "generation" | "training" | "grpo" |
"done", ...}``; also appended to ``--out``), then a readable summary. Units: ``*_s`` seconds, ``*_bytes`` bytes,
``*_per_s`` per second of wall-clock time (after a device synchronize). Exit status 0 when every part ran or was
skipped for a stated reason, 1 when a part failed, 2 when a needed package is missing.

Usage::

    scripts/gpu_check.sh                                   # cuda, Qwen2.5-0.5B architecture, bf16, <= 420 s
    scripts/gpu_check.sh --device cpu --tiny               # the CPU smoke test
    scripts/gpu_check.sh --model-dir /path/qwen2.5-0.5b-bf16 --grpo-steps 2
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_PATH = REPO_ROOT / "src" / "agentbolt" / "inference" / "configs" / "qwen2.5-0.5b.json"
TINY_OVERRIDES: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "max_window_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
FULL_DEFAULTS: dict[str, Any] = {
    "gen_batch_sizes": "1,16,64",
    "prompt_tokens": 256,
    "response_tokens": 128,
    "train_samples": 64,
    "group_size": 8,
    "prompt_range": "200,450",
    "response_range": "32,512",
    "train_configs": "16384:nockpt,32768:nockpt,32768:ckpt,65536:ckpt",
}
TINY_DEFAULTS: dict[str, Any] = {
    "gen_batch_sizes": "1,4",
    "prompt_tokens": 32,
    "response_tokens": 16,
    "train_samples": 8,
    "group_size": 4,
    "prompt_range": "16,48",
    "response_range": "8,32",
    "train_configs": "256:nockpt,256:ckpt",
}


class Report:
    """Prints each result as one JSON line (stdout, flushed; also appended to ``out``) and keeps it for the summary."""

    def __init__(self, out: Path | None) -> None:
        self.records: list[dict[str, Any]] = []
        self.out = out
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        line = json.dumps(record, default=str)
        print(line, flush=True)
        if self.out is not None:
            with self.out.open("a") as handle:
                handle.write(line + "\n")


class Budget:
    """Wall-clock budget of the whole run: ``allows(estimate_s)`` is false once starting a unit of that length would
    overrun it."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def allows(self, estimate_s: float) -> bool:
        return self.left_s() > estimate_s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--tiny", action="store_true", help="2-layer tiny model and small sizes (CPU smoke test)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="weights dtype")
    parser.add_argument("--budget-s", type=float, default=420.0, help="wall-clock budget of the whole run (s)")
    parser.add_argument("--gen-batch-sizes", help="comma-separated batch sizes (default 1,16,64; tiny 1,4)")
    parser.add_argument("--prompt-tokens", type=int, help="prompt length of each request (default 256; tiny 32)")
    parser.add_argument("--response-tokens", type=int, help="tokens generated per request (default 128; tiny 16)")
    parser.add_argument("--gen-repeats", type=int, default=2, help="timed batches per batch size")
    parser.add_argument("--train-samples", type=int, help="samples per train step (default 64; tiny 8)")
    parser.add_argument("--group-size", type=int, help="samples sharing a prompt (default 8; tiny 4)")
    parser.add_argument("--prompt-range", help="MIN,MAX prompt tokens of a sample (default 200,450; tiny 16,48)")
    parser.add_argument("--response-range", help="MIN,MAX response tokens of a sample (default 32,512; tiny 8,32)")
    parser.add_argument(
        "--train-configs",
        help="comma-separated MICRO_BATCH_TOKENS:ckpt|nockpt (default 16384:nockpt,32768:nockpt,32768:ckpt,"
        "65536:ckpt; tiny 256:nockpt,256:ckpt)",
    )
    parser.add_argument("--train-steps", type=int, default=3, help="timed train steps per config")
    parser.add_argument("--lora-r", type=int, default=16, help="LoRA rank (alpha = 2r)")
    parser.add_argument("--model-dir", type=Path, help="a real bf16 model directory: enables the GRPO part")
    parser.add_argument("--grpo-steps", type=int, default=2, help="GRPO steps when --model-dir is given")
    parser.add_argument("--grpo-tasks-per-step", type=int, default=8)
    parser.add_argument("--grpo-group-size", type=int, default=8)
    parser.add_argument("--grpo-max-tokens", type=int, default=256, help="per-call generation limit of the agent")
    parser.add_argument("--grpo-runner-processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    args = parser.parse_args(argv)
    defaults = TINY_DEFAULTS if args.tiny else FULL_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _train_configs(text: str) -> list[tuple[int, bool]]:
    """``"16384:nockpt,65536:ckpt"`` -> ``[(16384, False), (65536, True)]``; ValueError on anything else."""
    out = []
    for item in text.split(","):
        tokens, _, mode = item.strip().partition(":")
        if mode not in ("ckpt", "nockpt"):
            raise ValueError(f"--train-configs entry {item!r}: expected MICRO_BATCH_TOKENS:ckpt or :nockpt")
        out.append((int(tokens), mode == "ckpt"))
    return out


# ---------------------------------------------------------------------------------------------------------------
# environment


def check_imports() -> str | None:
    """None when the throughput parts can run, else what is missing and how to get it."""
    missing = []
    for module in ("torch", "transformers", "peft", "pydantic"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        return (
            f"missing Python packages: {', '.join(missing)}. pydantic is the only one agentbolt adds to torch, "
            "transformers and peft; offline, set AGENTBOLT_WHEELS to a folder of wheels (docs/gpu.md)"
        )
    try:
        import agentbolt.algorithms.rl.torch_backend  # noqa: F401
        import agentbolt.inference.embedded  # noqa: F401
    except ImportError as exc:
        return f"agentbolt cannot be imported ({exc!r}); run through scripts/gpu_check.sh, which sets PYTHONPATH=src"
    return None


def environment(args: argparse.Namespace) -> dict[str, Any]:
    import peft
    import torch
    import transformers

    record: dict[str, Any] = {
        "check": "environment",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "device": args.device,
        "dtype": args.dtype,
        "tiny": args.tiny,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "commit": _git_commit(),
    }
    if args.device.startswith("cuda") and torch.cuda.is_available():
        device = torch.device(args.device)
        props = torch.cuda.get_device_properties(device)
        record.update(
            device_name=props.name,
            compute_capability=f"{props.major}.{props.minor}",
            device_memory_bytes=props.total_memory,
            bf16_supported=torch.cuda.is_bf16_supported(),
            cuda_version=torch.version.cuda,
        )
    return record


def _git_commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ---------------------------------------------------------------------------------------------------------------
# the random-init model


def model_config(tiny: bool) -> Any:
    """The Qwen2.5-0.5B architecture from the shipped JSON (tiny: with ``TINY_OVERRIDES``)."""
    from transformers import Qwen2Config

    values = json.loads(CONFIG_PATH.read_text())
    if tiny:
        values.update(TINY_OVERRIDES)
    return Qwen2Config(**{k: v for k, v in values.items() if k not in ("architectures", "model_type")})


def random_model(args: argparse.Namespace) -> Any:
    """A randomly initialised causal LM of ``model_config``, built directly on ``args.device`` in ``args.dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model_config(args.tiny)
    torch.manual_seed(args.seed)
    try:
        with torch.device(args.device):  # initialise on the device: seconds instead of a minute on the host
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # a transformers version that does not honour the device context: build, then move
        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_config(config).to(args.device)
    model.to(device=args.device, dtype=_dtype(args.dtype))  # also where a version initialised it elsewhere
    model.eval()
    return model


def _dtype(name: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


class SyntheticTokenizer:
    """Stands in for a tokenizer in :class:`EmbeddedBackend`: the "chat template" turns a message whose content is
    ``"<seed>"`` into ``prompt_tokens`` random ids (never an end-of-turn id); decoding gives no text."""

    chat_template = None
    model_max_length = 1 << 30

    def __init__(self, vocab_size: int, prompt_tokens: int, eos_token_id: int, pad_token_id: int) -> None:
        self.vocab_size = vocab_size
        self.prompt_tokens = prompt_tokens
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id

    def apply_chat_template(
        self, messages: list[dict[str, Any]], tokenize: bool = True, **_: Any
    ) -> str | dict[str, list[int]]:
        text = str(messages[-1]["content"])  # the "rendered template": the seed itself
        return self(text) if tokenize else text

    def __call__(self, text: str, **_: Any) -> dict[str, list[int]]:
        rng = random.Random(text)
        ids = [rng.randrange(3, self.vocab_size) for _ in range(self.prompt_tokens)]
        return {"input_ids": [i if i != self.eos_token_id else 3 for i in ids]}

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return {}

    def decode(self, ids: list[int], **_: Any) -> str:
        return ""


# ---------------------------------------------------------------------------------------------------------------
# 2. generation


def run_generation(args: argparse.Namespace, report: Report, budget: Budget) -> bool:
    """Time the embedded backend's batched generation at each batch size; True when nothing failed."""
    ok = _generation(args, report, budget)
    _free(args.device)  # the model went out of scope with _generation
    return ok


def _generation(args: argparse.Namespace, report: Report, budget: Budget) -> bool:
    from agentbolt.inference.base import GenerationRequest
    from agentbolt.inference.embedded import EmbeddedBackend

    model = random_model(args)
    config = model.config
    tokenizer = SyntheticTokenizer(config.vocab_size, args.prompt_tokens, config.eos_token_id, config.pad_token_id)
    backend = EmbeddedBackend(
        model,
        tokenizer,  # type: ignore[arg-type]
        model_name="random-init",
        device=args.device,
        max_batch_size=1,
        batch_wait_s=2.0,  # every request of a batch is queued at once; the batch starts when it is full
        num_threads=args.threads or None,
    )
    ok = True
    last_s = 0.0

    async def one_batch(batch_size: int, max_tokens: int, tag: str) -> tuple[float, int, int]:
        requests = [
            GenerationRequest(messages=[{"role": "user", "content": f"{tag}-{i}"}], max_tokens=max_tokens)
            for i in range(batch_size)
        ]
        results = await asyncio.gather(*(backend.generate(r) for r in requests))
        seconds = float(results[0].extra["generation_s"])
        sizes = {int(r.extra["batch_size"]) for r in results}
        return seconds, sum(len(r.response_token_ids) for r in results), max(sizes)

    async def main() -> None:
        nonlocal ok, last_s
        try:
            for batch_size in _int_list(args.gen_batch_sizes):
                record: dict[str, Any] = {
                    "check": "generation",
                    "batch_size": batch_size,
                    "prompt_tokens": args.prompt_tokens,
                    "response_tokens": args.response_tokens,
                    "dtype": args.dtype,
                }
                if not budget.allows(2 * last_s + 5):
                    report.emit({**record, "skipped": f"budget: {budget.left_s():.0f} s left"})
                    continue
                started = time.monotonic()
                _reset_peak(args.device)
                try:
                    backend.max_batch_size = batch_size
                    await one_batch(batch_size, min(8, args.response_tokens), f"warmup-{batch_size}")
                    runs = []
                    for repeat in range(args.gen_repeats):
                        if repeat and not budget.allows(runs[-1][0] + 5):
                            break
                        runs.append(await one_batch(batch_size, args.response_tokens, f"{batch_size}-{repeat}"))
                except Exception as exc:  # an OOM or a backend failure: report it, go on with the next size
                    ok = False
                    report.emit({**record, "error": repr(exc)[:500]})
                    _free(args.device)
                    continue
                rates = [tokens / seconds for seconds, tokens, _ in runs]
                report.emit(
                    {
                        **record,
                        "tokens_per_s": statistics.median(rates),
                        "tokens_per_s_runs": rates,
                        "batch_s": statistics.median(s for s, _, _ in runs),
                        "generated_tokens": [t for _, t, _ in runs],
                        "batched_together": all(b == batch_size for _, _, b in runs),
                        "peak_device_memory_bytes": _peak_device_memory(args.device),
                    }
                )
                last_s = time.monotonic() - started
        finally:
            await backend.close()

    asyncio.run(main())
    return ok


def _reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(torch.device(device))


def _peak_device_memory(device: str) -> int | None:
    import torch

    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(torch.device(device)))
    return None


# ---------------------------------------------------------------------------------------------------------------
# 3. training


def synthetic_samples(args: argparse.Namespace, vocab_size: int) -> list[Any]:
    """``--train-samples`` samples in groups of ``--group-size`` sharing a prompt; advantages are ``+-1`` (never 0,
    so every sample is trained); sampling logprobs are filled in later by the policy."""
    from agentbolt.adapter.samples import TrainingSample

    rng = random.Random(args.seed)
    p_lo, p_hi = _int_list(args.prompt_range)
    r_lo, r_hi = _int_list(args.response_range)
    samples = []
    for group in range((args.train_samples + args.group_size - 1) // args.group_size):
        prompt = [rng.randrange(3, vocab_size) for _ in range(rng.randint(p_lo, p_hi))]
        for member in range(args.group_size):
            index = group * args.group_size + member
            if index >= args.train_samples:
                break
            response = [rng.randrange(3, vocab_size) for _ in range(rng.randint(r_lo, r_hi))]
            samples.append(
                TrainingSample(
                    input_ids=prompt + response,
                    loss_mask=[0] * len(prompt) + [1] * len(response),
                    sampling_logprobs=[0.0] * (len(prompt) + len(response)),
                    advantage=1.0 if member % 2 == 0 else -1.0,
                    rollout_id=f"rollout-{index}",
                )
            )
    return samples


def run_training(args: argparse.Namespace, report: Report, budget: Budget) -> bool:
    """Time ``TorchPolicyTrainer.train_step`` for each train config; True when nothing failed."""
    import dataclasses

    import torch

    from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, TorchTrainerConfig, attach_lora

    ok = True
    last_s = 0.0
    vocab_size = int(model_config(args.tiny).vocab_size)
    base_samples = synthetic_samples(args, vocab_size)
    n_tokens = sum(s.n_tokens for s in base_samples)
    n_loss_tokens = sum(s.n_loss_tokens for s in base_samples)
    for micro_batch_tokens, checkpointing in _train_configs(args.train_configs):
        record: dict[str, Any] = {
            "check": "training",
            "micro_batch_tokens": micro_batch_tokens,
            "gradient_checkpointing": checkpointing,
            "lora_r": args.lora_r,
            "dtype": args.dtype,
            "n_samples": len(base_samples),
            "tokens_per_step": n_tokens,
            "trained_tokens_per_step": n_loss_tokens,
        }
        if not budget.allows(1.5 * last_s + 5):
            report.emit({**record, "skipped": f"budget: {budget.left_s():.0f} s left"})
            continue
        started = time.monotonic()
        model = trainer = None
        error: str | None = None
        steps: list[dict[str, float]] = []
        try:
            config = TorchTrainerConfig(
                lora_r=args.lora_r,
                lora_alpha=2 * args.lora_r,
                micro_batch_tokens=micro_batch_tokens,
                gradient_checkpointing=checkpointing,
            )
            model = attach_lora(random_model(args), config)
            trainer = TorchPolicyTrainer(model, config, pad_token_id=int(model.config.pad_token_id or 0))
            logprobs = trainer.trainer_logprobs(base_samples)  # on-policy sampling logprobs (untimed)
            samples = [
                dataclasses.replace(s, sampling_logprobs=lp) for s, lp in zip(base_samples, logprobs, strict=True)
            ]
            trainer.train_step(samples)  # warm-up (untimed)
            for _ in range(args.train_steps):
                if steps and not budget.allows(steps[-1]["train_step_s"] + 5):
                    break
                _synchronize(args.device)
                steps.append(trainer.train_step(samples))
        except torch.cuda.OutOfMemoryError as exc:
            error = f"out of device memory: {str(exc)[:300]}"
        except Exception as exc:
            error = repr(exc)[:500]
        if error is not None:  # freed here, outside the except block: the traceback holds the step's tensors
            ok = False
            report.emit({**record, "error": error})
            del model, trainer
            _free(args.device)
            continue
        if not all(s["stepped"] == 1.0 for s in steps):
            ok = False
        step_s = [s["train_step_s"] for s in steps]
        peak = [s["peak_device_memory_bytes"] for s in steps if "peak_device_memory_bytes" in s]
        report.emit(
            {
                **record,
                "tokens_per_s": n_tokens / statistics.median(step_s),
                "trained_tokens_per_s": n_loss_tokens / statistics.median(step_s),
                "train_step_s": statistics.median(step_s),
                "train_step_s_runs": step_s,
                "n_micro_batches": steps[-1]["n_micro_batches"],
                "n_padding_tokens": steps[-1]["n_padding_tokens"],
                "stepped": all(s["stepped"] == 1.0 for s in steps),
                "peak_device_memory_bytes": max(peak) if peak else None,
                "peak_rss_bytes": steps[-1]["peak_rss_bytes"],
            }
        )
        del model, trainer
        _free(args.device)
        last_s = time.monotonic() - started
    return ok


# ---------------------------------------------------------------------------------------------------------------
# 4. GRPO steps of the calc agent


GRPO_MODULES = ("openai", "fastapi", "uvicorn", "httpx", "opentelemetry.sdk", "rich", "matplotlib")


def run_grpo(args: argparse.Namespace, report: Report, budget: Budget) -> bool:
    """A few GRPO steps through ``local_training`` when ``--model-dir`` is given; else a skip with the reason."""
    record: dict[str, Any] = {"check": "grpo", "model_dir": str(args.model_dir) if args.model_dir else None}
    if args.model_dir is None:
        report.emit(
            {
                **record,
                "skipped": "no --model-dir: a bf16 Qwen2.5-0.5B is about 1.2 GB, i.e. 19+ calls of 64 MiB to carry "
                "to a machine without network, which does not fit a 15-minute device budget; the throughput "
                "figures above use random weights of the same architecture",
            }
        )
        return True
    if not (args.model_dir / "config.json").is_file():
        report.emit({**record, "error": f"{args.model_dir} has no config.json: not a Hugging Face model directory"})
        return False
    missing = []
    for module in GRPO_MODULES:
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        report.emit({**record, "skipped": f"the demo machinery needs {', '.join(missing)}, not installed here"})
        return True
    if not budget.allows(60):
        report.emit({**record, "skipped": f"budget: {budget.left_s():.0f} s left, 60 s needed at least"})
        return True
    try:
        asyncio.run(_grpo_steps(args, report, budget, record))
    except Exception as exc:
        report.emit({**record, "error": repr(exc)[:500]})
        return False
    return True


async def _grpo_steps(args: argparse.Namespace, report: Report, budget: Budget, record: dict[str, Any]) -> None:
    """The GRPO steps through the one RL job (:func:`agentbolt.trainer.job.run_training`), with a per-step record and
    the time budget plugged in as seams; no evaluation, outputs in a temporary folder."""
    from rich.console import Console

    from agentbolt.config import GRPOConfig
    from agentbolt.trainer.job import JobSeams, run_training
    from agentbolt.trainer.job_config import TrainConfig

    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))  # examples.calc_agent, also for the runner processes
    from examples.calc_agent import tasks

    train_tasks: list[dict[str, Any]] = [
        dict(task) for task in tasks.load_train_tasks(size=max(64, args.grpo_steps * args.grpo_tasks_per_step))
    ]
    started = time.monotonic()
    step_started = [time.monotonic()]
    last_s = [0.0]

    def keep_going(step: int) -> bool:
        if budget.allows(1.3 * last_s[0] + 10):
            step_started[0] = time.monotonic()
            return True
        report.emit({**record, "step": step, "skipped": f"budget: {budget.left_s():.0f} s left"})
        return False

    def on_step(result: Any) -> None:
        last_s[0] = time.monotonic() - step_started[0]
        stats = result.update_stats
        report.emit(
            {
                **record,
                "step": result.train_step,
                "reward_mean": result.reward_mean,
                "rollout_s": result.rollout_s,
                "update_s": result.update_s,
                "step_s": last_s[0],
                "n_transitions": result.n_transitions,
                "update_tokens_per_s": stats.get("tokens_per_s"),
                "peak_device_memory_bytes": stats.get("peak_device_memory_bytes"),
            }
        )

    with tempfile.TemporaryDirectory(prefix="gpu-check-grpo-") as tmp:
        config = TrainConfig(
            out_dir=Path(tmp),
            model=str(args.model_dir),
            grpo=GRPOConfig(
                steps=args.grpo_steps,
                tasks_per_step=args.grpo_tasks_per_step,
                group_size=args.grpo_group_size,
                max_tokens=args.grpo_max_tokens,
            ),
            val_size=0,
            device=args.device,
            runner_processes=args.grpo_runner_processes,
        )
        summary = await run_training(
            config,
            Console(stderr=True),
            seams=JobSeams(tasks=(train_tasks, {}), on_step=on_step, keep_going=keep_going),
        )
        report.emit(
            {
                **record,
                "phase": "setup",
                "model_setup_s": summary["timing_s"]["model_setup"],
                "generation_tokens_per_s": summary["generation"]["tokens_per_s"],
            }
        )
    report.emit({**record, "phase": "done", "wall_s": time.monotonic() - started})


# ---------------------------------------------------------------------------------------------------------------


def summary_lines(records: list[dict[str, Any]]) -> list[str]:
    """The readable summary of the JSON records."""
    lines = ["", "== gpu_check summary =="]
    for r in records:
        check = r["check"]
        if check == "environment":
            where = r.get("device_name") or r["device"]
            lines.append(
                f"environment: torch {r['torch']}, transformers {r['transformers']}, peft {r['peft']}; {where} "
                f"(bf16 {r.get('bf16_supported', 'n/a')}), dtype {r['dtype']}{', tiny model' if r['tiny'] else ''}"
            )
        elif "skipped" in r or "error" in r:
            what = {k: v for k, v in r.items() if k in ("batch_size", "micro_batch_tokens", "gradient_checkpointing")}
            status = f"skipped ({r['skipped']})" if "skipped" in r else f"FAILED: {r['error']}"
            lines.append(f"{check}{' ' + str(what) if what else ''}: {status}")
        elif check == "generation":
            lines.append(
                f"generation batch {r['batch_size']:>3} ({r['prompt_tokens']}+{r['response_tokens']} tokens): "
                f"{r['tokens_per_s']:10.1f} tokens/s, {r['batch_s']:.2f} s/batch{_gib(r['peak_device_memory_bytes'])}"
            )
        elif check == "training":
            ckpt = "ckpt   " if r["gradient_checkpointing"] else "no ckpt"
            lines.append(
                f"training micro_batch_tokens {r['micro_batch_tokens']:>6} {ckpt}: {r['tokens_per_s']:10.1f} tokens/s "
                f"({r['trained_tokens_per_s']:.1f} trained), {r['train_step_s']:.2f} s/step, "
                f"{r['n_micro_batches']:.0f} micro-batches{_gib(r['peak_device_memory_bytes'])}"
            )
        elif check == "grpo" and "step" in r:
            lines.append(
                f"grpo step {r['step']}: reward {r['reward_mean']:.3f}, rollouts {r['rollout_s']:.1f} s, "
                f"update {r['update_s']:.1f} s"
            )
        elif check == "done":
            lines.append(f"done in {r['wall_s']:.1f} s, ok={r['ok']}")
    return lines


def _gib(value: float | None) -> str:
    return f", peak {value / 2**30:.2f} GiB" if value else ""


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    report = Report(args.out)
    problem = check_imports()
    if problem is not None:
        report.emit({"check": "environment", "error": problem})
        return 2
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        report.emit({"check": "environment", "error": f"--device {args.device} but torch sees no CUDA device"})
        return 2
    budget = Budget(args.budget_s)
    report.emit(environment(args))
    ok = run_generation(args, report, budget)
    ok = run_training(args, report, budget) and ok
    ok = run_grpo(args, report, budget) and ok
    report.emit({"check": "done", "ok": ok, "wall_s": time.monotonic() - started, "budget_s": args.budget_s})
    print("\n".join(summary_lines(report.records)), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
