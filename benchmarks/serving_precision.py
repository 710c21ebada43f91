#!/usr/bin/env python3
"""What a lower-precision serving path would buy on this CPU, and what it would cost the trainer's logprobs.

The embedded backend serves with float32 linears where the CPU has no native bf16 (``packed_linear.compute_dtype``),
and on such a CPU a decode step and the prefill are bound by those matmuls (docs/training.md). The one kernel family
that multiplies faster here is int8 (AVX512-VNNI, fbgemm): PyTorch's dynamic quantization
(``torch.ao.quantization.quantize_dynamic`` with per-channel int8 weights; each input quantized per tensor at run
time). This script measures both sides of that trade, on the model's own shapes and prompts:

* ``speed``: one decode step's linears (every layer's q, k, v, o, gate, up, down and the output projection, shapes
  from the model's config, random weights) at ``--rows`` rows: float32 ``nn.Linear``, float32 prepacked for oneDNN
  (what the embedded backend serves with, :mod:`agentbolt.inference.packed_linear`) and dynamic int8; each figure
  is the median of ``--repeats`` passes over all the weights (larger than the caches: read cold, as at decode).
* ``quality``: the calc agent's first-turn prompts (system, tools, question), ``--tokens`` tokens sampled at
  temperature 1 from the quantized model (as the server would), then teacher-forced logprobs of those tokens under
  the quantized model and under the float32 model (the numbers the trainer's forward matches within ~5e-4
  approx_kl, docs/training.md). It prints approx_kl (k3, Schulman 2020: mean of ``exp(r) - 1 - r`` with ``r = log
  pi_train - log pi_serve`` over served tokens, the figure the trainer reports at each step start) and the mean
  absolute logprob difference, for each ``--scope``: ``all`` (every linear), ``attn_gate_up`` (the attention
  projections and the MLP's gate and up projections: not the down projection, whose input carries the largest
  activations, nor the output projection).

Measured on a 2-core Intel Xeon (AVX512-VNNI, no AVX512-BF16), Qwen2.5-0.5B, 2026-12-04
(``benchmarks/results/serving-precision-2026-12-04-xeon.jsonl``): the linears of a decode step at 1 / 10 / 16 rows
take 77 / 109 / 125 ms prepacked float32 (served today) and 24 / 41 / 47 ms dynamic int8, 2.6-3.2x faster. But
approx_kl against float32 is 6.1e+03 with every linear quantized (mean |dlogp| 0.79: the answers break) and 3.5e-02
with ``attn_gate_up`` (mean |dlogp| 0.071), against 5.2e-04 for today's float32 serving against the trainer. So the
int8 kernel is not usable as it is: the model's activation outliers need a calibrated rescaling first (SmoothQuant,
Xiao et al. 2023, "SmoothQuant: Accurate and Efficient Post-Training Quantization for Large Language Models"), and
its logprobs would still differ from the trainer's far more than today's.

Run::

    .venv/bin/python benchmarks/serving_precision.py                      # speed + quality, qwen2.5-0.5b
    .venv/bin/python benchmarks/serving_precision.py --only speed --rows 1,16
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

SCOPES = ("all", "attn_gate_up")


def linear_shapes(config: Any) -> list[tuple[int, int]]:
    """``(out, in)`` of every linear one token goes through: per layer q, k, v, o, gate, up, down; then the output
    projection."""
    hidden, inter = config.hidden_size, config.intermediate_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    layer = [
        (heads * head_dim, hidden),
        (kv_heads * head_dim, hidden),
        (kv_heads * head_dim, hidden),
        (hidden, heads * head_dim),
        (inter, hidden),
        (inter, hidden),
        (hidden, inter),
    ]
    return layer * config.num_hidden_layers + [(config.vocab_size, hidden)]


def measure_speed(config: Any, rows: list[int], repeats: int) -> list[dict[str, Any]]:
    """Median ms of one pass over every linear of a decode step, float32 and dynamic int8, per row count."""
    import torch
    import torch.ao.quantization as quantization

    linears = [torch.nn.Linear(i, o, bias=False) for o, i in linear_shapes(config)]
    stack = torch.nn.Sequential(*linears).eval()
    quantized = quantization.quantize_dynamic(
        copy.deepcopy(stack), {torch.nn.Linear: quantization.per_channel_dynamic_qconfig}, dtype=torch.qint8
    )
    from agentbolt.inference.packed_linear import BATCH_HINT

    # the served path: float32 weights reordered once for oneDNN (agentbolt.inference.packed_linear)
    packed = [(torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), BATCH_HINT), m.in_features) for m in linears]

    def run_packed(x: dict[int, Any]) -> None:
        for weight, width in packed:
            torch.ops.mkldnn._linear_pointwise(x[width], weight, None, "none", [], "")

    def run_modules(layers: list[Any]) -> Any:
        return lambda x: [layer(x[layer.in_features]) for layer in layers]

    arms = (
        ("float32", run_modules(list(stack))),
        ("float32_packed", run_packed),
        ("int8_dynamic", run_modules(list(quantized))),
    )
    out: list[dict[str, Any]] = []
    for n in rows:
        inputs = {i: torch.randn(n, i) for _, i in linear_shapes(config)}
        line: dict[str, Any] = {"kind": "speed", "rows": n}
        for name, run in arms:
            times = []
            with torch.no_grad():
                for attempt in range(repeats + 1):
                    start = time.perf_counter()
                    run(inputs)
                    if attempt:  # the first pass warms up
                        times.append((time.perf_counter() - start) * 1000)
            line[f"{name}_ms"] = round(statistics.median(times), 1)
        line["int8_over_served"] = round(line["float32_packed_ms"] / line["int8_dynamic_ms"], 2)
        out.append(line)
    return out


def quantize(model: Any, scope: str) -> Any:
    """A copy of ``model`` with the ``scope``'s linears dynamically quantized (per-channel int8 weights)."""
    import torch
    import torch.ao.quantization as quantization

    spec = {torch.nn.Linear: quantization.per_channel_dynamic_qconfig}
    copied = copy.deepcopy(model)
    if scope == "all":
        return quantization.quantize_dynamic(copied, spec, dtype=torch.qint8)
    for layer in copied.model.layers:
        layer.self_attn = quantization.quantize_dynamic(layer.self_attn, spec, dtype=torch.qint8)
        for name in ("gate_proj", "up_proj"):
            one = torch.nn.Sequential(getattr(layer.mlp, name))
            setattr(layer.mlp, name, quantization.quantize_dynamic(one, spec, dtype=torch.qint8)[0])
    return copied


def measure_quality(directory: Path, scopes: list[str], prompts: int, tokens: int, seed: int) -> list[dict[str, Any]]:
    """approx_kl (k3) and mean |logprob difference| of int8-served tokens against the float32 model, per scope."""
    import generation
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    reference = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    questions = generation.load_questions("train", seed, prompts)
    out: list[dict[str, Any]] = []
    for scope in scopes:
        served = quantize(reference, scope)
        torch.manual_seed(seed)
        k3: list[float] = []
        gaps: list[float] = []
        start = time.perf_counter()
        for question in questions:
            ids = generation.prompt_ids(tokenizer, question)
            with torch.no_grad():
                full = served.generate(
                    torch.tensor([ids]), max_new_tokens=tokens, do_sample=True, temperature=1.0, top_p=1.0,
                    top_k=0, pad_token_id=tokenizer.eos_token_id,
                )  # fmt: skip
                drawn = full[0, len(ids) :]
                serve = torch.log_softmax(served(full).logits[0, len(ids) - 1 : -1].float(), -1)
                train = torch.log_softmax(reference(full).logits[0, len(ids) - 1 : -1].float(), -1)
            serve_lp = serve.gather(1, drawn[:, None])[:, 0]
            train_lp = train.gather(1, drawn[:, None])[:, 0]
            ratio = train_lp - serve_lp
            k3 += (torch.exp(ratio) - 1 - ratio).tolist()
            gaps += (serve_lp - train_lp).abs().tolist()
        out.append(
            {
                "kind": "quality",
                "scope": scope,
                "prompts": len(questions),
                "tokens": len(k3),
                "approx_kl_k3": float(f"{statistics.fmean(k3):.3e}"),
                "mean_abs_logprob_diff": round(statistics.fmean(gaps), 4),
                "max_abs_logprob_diff": round(max(gaps), 3),
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-0.5b", help="embedded model name (or a HF model directory)")
    parser.add_argument("--only", choices=("speed", "quality"), help="run one part (default both)")
    parser.add_argument("--rows", default="1,16", help="decode rows per step for the speed part, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scope", default=",".join(SCOPES), help=f"quality part: comma-separated, of {SCOPES}")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=40, help="tokens sampled per prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", help="JSONL file to append to (default benchmarks/results/serving-precision-<date>.jsonl)"
    )
    args = parser.parse_args()
    scopes = [s for s in args.scope.split(",") if s]
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        parser.error(f"--scope {','.join(unknown)}: use {', '.join(SCOPES)}")

    warnings.filterwarnings("ignore", category=DeprecationWarning)  # torch.ao.quantization's own deprecation notice
    import generation
    import torch
    from transformers import AutoConfig

    torch.set_num_threads(args.threads)
    directory = generation.model_dir(args.model)
    lines: list[dict[str, Any]] = [
        {
            "kind": "machine",
            "model": args.model,
            "threads": args.threads,
            "torch": torch.__version__,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
    ]
    if args.only in (None, "speed"):
        rows = [int(r) for r in args.rows.split(",") if r]
        lines += measure_speed(AutoConfig.from_pretrained(directory), rows, args.repeats)
    if args.only in (None, "quality"):
        lines += measure_quality(directory, scopes, args.prompts, args.tokens, args.seed)
    out = (
        Path(args.out)
        if args.out
        else REPO_ROOT / "benchmarks" / "results" / f"serving-precision-{time.strftime('%Y-%m-%d')}.jsonl"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as handle:
        for line in lines:
            print(json.dumps(line), flush=True)
            handle.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
