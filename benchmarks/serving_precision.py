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
  activations, nor the output projection), ``smooth_qkv_gate_up`` and ``smooth_qkv_gate_up_head`` (SmoothQuant
  scales folded into the RMSNorm weights first, ``--alpha``, calibrated on other prompts of the same set).

Measured on a 2-core Intel Xeon (AVX512-VNNI, no AVX512-BF16), Qwen2.5-0.5B, 2026-12-04
(``benchmarks/results/serving-precision-2026-12-04-xeon.jsonl``; 6 prompts x 40 sampled tokens, so the approx_kl
figures are rough): the linears of a decode step at 1 / 10 / 16 rows take 72 / 109 / 126 ms prepacked float32
(served today), 24 / 42 / 46 ms all in int8 and 39 / 60 / 76 ms mixed (q, k, v, gate, up and the output projection
in int8), 1.65-1.9x faster. approx_kl (k3) against float32: every linear in int8 6.1e+03 (mean |dlogp| 0.79: the
answers break), attention and gate/up without smoothing 3.5e-02 (0.071); smoothed (alpha 0.8) q, k, v, gate, up
1.0e-03 (0.016), and with the output projection 1.5e-03 (0.020). For scale: today's float32 serving against the
trainer measured 5.2e-04 (mean |diff| 0.018) on the demo's step-4 adapter. So int8 needs the smoothing, and it
serves logprobs a few times farther from the trainer's than today's.

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

SCOPES = (
    "all",
    "attn_gate_up",
    "smooth_qkv_gate_up",
    "smooth_qkv_gate_up_head",
    "served_float32",
    "served_int8",
    "served_int8_o",
    "served_int8_all",
)
"""Which linears are served in int8: ``smooth_*`` first fold SmoothQuant scales into the RMSNorm weights before them
(``o_proj`` and ``down_proj`` stay float32; ``_head`` also quantizes the output projection, smoothed into the final
norm)."""

MIXED_INT8 = ("q", "k", "v", "gate", "up", "head")
"""The linears the speed part's ``int8_mixed`` arm runs in int8 (``smooth_qkv_gate_up_head``); o and down stay
prepacked float32."""


def linear_shapes(config: Any) -> list[tuple[str, int, int]]:
    """``(kind, out, in)`` of every linear one token goes through: per layer q, k, v, o, gate, up, down; then the
    output projection (``head``)."""
    hidden, inter = config.hidden_size, config.intermediate_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    layer = [
        ("q", heads * head_dim, hidden),
        ("k", kv_heads * head_dim, hidden),
        ("v", kv_heads * head_dim, hidden),
        ("o", hidden, heads * head_dim),
        ("gate", inter, hidden),
        ("up", inter, hidden),
        ("down", hidden, inter),
    ]
    return layer * config.num_hidden_layers + [("head", config.vocab_size, hidden)]


def measure_speed(config: Any, rows: list[int], repeats: int) -> list[dict[str, Any]]:
    """Median ms of one pass over every linear of a decode step, float32 and dynamic int8, per row count."""
    import torch
    import torch.ao.quantization as quantization

    shapes = linear_shapes(config)
    linears = [torch.nn.Linear(i, o, bias=False) for _, o, i in shapes]
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

    def run_mixed(x: dict[int, Any]) -> None:
        for (kind, _, width), int8, (weight, _) in zip(shapes, quantized, packed, strict=True):
            if kind in MIXED_INT8:
                int8(x[width])
            else:
                torch.ops.mkldnn._linear_pointwise(x[width], weight, None, "none", [], "")

    arms = (
        ("float32", run_modules(list(stack))),
        ("float32_packed", run_packed),
        ("int8_dynamic", run_modules(list(quantized))),
        ("int8_mixed", run_mixed),
    )
    out: list[dict[str, Any]] = []
    for n in rows:
        inputs = {i: torch.randn(n, i) for _, _, i in shapes}
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
        line["mixed_over_served"] = round(line["float32_packed_ms"] / line["int8_mixed_ms"], 2)
        out.append(line)
    return out


def smooth(model: Any, calibration: list[list[int]], alpha: float, head: bool) -> None:
    """Fold SmoothQuant scales into ``model`` in place (Xiao et al. 2023, eq. 4: ``s_j = max|X_j|^alpha /
    max|W_j|^(1 - alpha)``): each layer's input norm weight is divided by ``s`` and q, k, v's input columns
    multiplied by it, the same for the post-attention norm and gate, up; with ``head``, the final norm and the output
    projection. The function is unchanged (up to rounding); the inputs of the scaled linears lose their outlier
    channels. ``max|X_j|`` is taken over the ``calibration`` prompts' tokens."""
    import torch

    seen: dict[str, torch.Tensor] = {}

    def record(name: str) -> Any:
        def hook(module: Any, inputs: tuple[torch.Tensor, ...]) -> None:
            peak = inputs[0].detach().abs().reshape(-1, inputs[0].shape[-1]).amax(0)
            seen[name] = torch.maximum(seen[name], peak) if name in seen else peak

        return hook

    layers = model.model.layers
    hooks = [layer.self_attn.q_proj.register_forward_pre_hook(record(f"{i}.qkv")) for i, layer in enumerate(layers)]
    hooks += [layer.mlp.gate_proj.register_forward_pre_hook(record(f"{i}.gu")) for i, layer in enumerate(layers)]
    hooks.append(model.lm_head.register_forward_pre_hook(record("head")))
    with torch.no_grad():
        for ids in calibration:
            model(torch.tensor([ids]))
    for hook in hooks:
        hook.remove()

    def fold(norm: Any, linears: list[Any], peak: torch.Tensor) -> None:
        weight_peak = torch.cat([linear.weight.abs() for linear in linears], 0).amax(0)
        scale = (peak.clamp(min=1e-5) ** alpha / weight_peak.clamp(min=1e-5) ** (1 - alpha)).clamp(min=1e-5)
        norm.weight.div_(scale)
        for linear in linears:
            linear.weight.mul_(scale)

    with torch.no_grad():
        for i, layer in enumerate(layers):
            attention, mlp = layer.self_attn, layer.mlp
            fold(layer.input_layernorm, [attention.q_proj, attention.k_proj, attention.v_proj], seen[f"{i}.qkv"])
            fold(layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj], seen[f"{i}.gu"])
        if head:
            fold(model.model.norm, [model.lm_head], seen["head"])


def quantize(model: Any, scope: str, calibration: list[list[int]], alpha: float) -> Any:
    """A copy of ``model`` with the ``scope``'s linears dynamically quantized (per-channel int8 weights), smoothed
    first for the ``smooth_*`` scopes (:func:`smooth`)."""
    import torch
    import torch.ao.quantization as quantization

    spec = {torch.nn.Linear: quantization.per_channel_dynamic_qconfig}
    copied = copy.deepcopy(model)
    if scope == "all":
        return quantization.quantize_dynamic(copied, spec, dtype=torch.qint8)

    def one(parent: Any, name: str) -> None:
        linear = torch.nn.Sequential(getattr(parent, name))
        setattr(parent, name, quantization.quantize_dynamic(linear, spec, dtype=torch.qint8)[0])

    if scope.startswith("smooth_"):
        head = scope.endswith("_head")
        smooth(copied, calibration, alpha, head)
        for layer in copied.model.layers:
            for name in ("q_proj", "k_proj", "v_proj"):
                one(layer.self_attn, name)
            for name in ("gate_proj", "up_proj"):
                one(layer.mlp, name)
        if head:
            one(copied, "lm_head")
        return copied
    for layer in copied.model.layers:
        layer.self_attn = quantization.quantize_dynamic(layer.self_attn, spec, dtype=torch.qint8)
        for name in ("gate_proj", "up_proj"):
            one(layer.mlp, name)
    return copied


SERVED = {
    "served_float32": (),
    "served_int8": ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head"),
    "served_int8_o": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "lm_head"),
    "served_int8_all": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"),
}
"""Scopes that run the embedded backend's own serving path on the bf16 model: prepacked linears
(:mod:`agentbolt.inference.packed_linear`) and, for ``served_int8*``, these linears in int8 with per-linear
SmoothQuant scales calibrated on the served rows (:mod:`agentbolt.inference.int8_linear`; ``served_int8`` is what
``inference.quantization: int8`` serves)."""


class _Served:
    """A bf16 model called the way the embedded backend serves it (inside ``packed_linears``)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, ids: Any) -> Any:
        import torch

        from agentbolt.inference import packed_linear

        with torch.inference_mode(), packed_linear.packed_linears():
            return self.model(ids)

    def generate(self, ids: Any, **kwargs: Any) -> Any:
        import torch

        from agentbolt.inference import packed_linear

        with torch.inference_mode(), packed_linear.packed_linears():
            return self.model.generate(ids, **kwargs)


def served_model(directory: Path, scope: str, calibration: list[list[int]]) -> _Served:
    """The bf16 model with the embedded backend's packed linears, int8 per :data:`SERVED`; int8 linears calibrate
    on ``calibration`` (run once, float32 until each linear has seen ``CALIBRATION_ROWS`` rows)."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentbolt.inference import int8_linear, packed_linear

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).eval()
    packed_linear.install(model)
    served = _Served(model)
    if SERVED[scope]:
        int8_linear.mark(model, SERVED[scope])
        for ids in calibration:
            served(torch.tensor([ids]))
        missing = [m for m in model.modules() if int8_linear.is_marked(m) and int8_linear._states[m].packed is None]
        if missing:
            raise SystemExit(f"{scope}: {len(missing)} linears did not calibrate; give more calibration prompts")
    return served


def measure_quality(
    directory: Path, scopes: list[str], prompts: int, tokens: int, seed: int, alpha: float
) -> list[dict[str, Any]]:
    """approx_kl (k3) and mean |logprob difference| of int8-served tokens against the float32 model, per scope."""
    import generation
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    reference = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    # calibration prompts for smoothing: other questions than the measured ones, each with a short answer
    pool = generation.load_questions("train", seed, 2 * prompts)
    questions, others = pool[:prompts], pool[prompts:]
    answer = tokenizer("Answer: 42", add_special_tokens=False)["input_ids"]
    calibration = [generation.prompt_ids(tokenizer, question) + answer for question in others]
    out: list[dict[str, Any]] = []
    for scope in scopes:
        if scope in SERVED:
            served: Any = served_model(directory, scope, calibration)
        else:
            served = quantize(reference, scope, calibration, alpha)
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
                "alpha": alpha if scope.startswith("smooth_") else None,
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
    parser.add_argument("--alpha", type=float, default=0.8, help="SmoothQuant migration strength of smooth_* scopes")
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
        lines += measure_quality(directory, scopes, args.prompts, args.tokens, args.seed, args.alpha)
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
