"""Int8 serving of the embedded backend's linears: SmoothQuant scales, int8 weights, dynamically quantized inputs.

Opt-in (``inference.quantization: int8``, :class:`~agentbolt.inference.embedded.EmbeddedBackend` ``quantization``).
On a CPU without native bf16 the embedded backend serves with float32 matmuls (:mod:`agentbolt.inference.packed_linear`)
and a decode step and the prefill are bound by them; int8 matmuls (AVX512-VNNI) are the one faster kernel family
there.

Which linears: :data:`INT8_LINEARS` (the attention's q, k, v and output projections, the MLP's gate and up, and the
model's output projection); the MLP's down projection stays as it is: its input carries the largest activation
outliers, and in int8 it moved the served distribution 2.3x farther from the float one for a small gain
(``benchmarks/serving_precision.py``; ``$AGENTBOLT_INT8_LINEARS`` changes the set).

How (Xiao et al. 2023, "SmoothQuant", arXiv:2211.10438, eq. 4): activations have a few input channels with large
magnitudes that per-tensor int8 rounds badly; dividing input channel ``j`` by ``s_j`` and multiplying the weight's
column ``j`` by it leaves ``x W^T`` unchanged and moves part of the range into the weight, which is quantized per
output channel. ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``, ``alpha`` :data:`DEFAULT_ALPHA`, with ``max|X_j|``
observed on what the layer serves first (:data:`CALIBRATION_ROWS` rows or :data:`CALIBRATION_CALLS` calls; it runs
its float path until then). The division is applied to each linear's input (one elementwise multiply per call)
instead of being folded into the RMSNorm weights, so the model the trainer shares is not changed and every linear has
scales of its own. The weight (for a LoRA layer the merged ``W + scaling B A``) is multiplied by ``s``, quantized per
output channel (symmetric int8, PyTorch's per-channel observer) and prepacked for
``torch.ops.quantized.linear_dynamic``, again whenever the weight or adapter changes (after each update); the input
is quantized at each call, per row (each row of ``x / s`` is scaled to a peak of 1 before the op, which quantizes per
tensor, and the output row scaled back: one outlier row no longer coarsens the others), 8-bit where the CPU has VNNI
(whose int32 sums cannot saturate), 7-bit elsewhere.

What it costs: the served logprobs are the int8 model's, farther from the trainer's than the float32 serving path
(``approx_kl`` at step start measures it; a job turns on truncated importance sampling with it). The recorded ids
are still exactly those the engine ran. ``torch.ao.quantization`` and quantized tensors are deprecated in favour of
torchao and may leave a later PyTorch; this module is the only place that uses them.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

INT8_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "lm_head")
"""Names (last part of the module path) of the linears served in int8 by default; every other linear (the MLP's
``down_proj``) stays as it is."""

LINEARS_ENV = "AGENTBOLT_INT8_LINEARS"
"""Environment variable that replaces :data:`INT8_LINEARS` (comma-separated names, e.g. adding ``down_proj``)."""

CALIBRATION_ROWS = 512
"""Input rows a linear observes (running float32) before its smoothing scales are fixed and it switches to int8 ..."""

CALIBRATION_CALLS = 32
"""... or calls, whichever comes first (the output projection sees one row per sequence and decode step)."""

DEFAULT_ALPHA = 0.8
"""SmoothQuant migration strength: 0.8 measured closest to float32 on Qwen2.5-0.5B (``serving_precision.py``)."""

_EPS = 1e-5


def smoothing_scales(activation_peak: torch.Tensor, weight_peak: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant per-input-channel scales ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` (Xiao et al. 2023,
    eq. 4); peaks below 1e-5 count as 1e-5, so a channel never seen non-zero gets a finite scale.

    Args:
        activation_peak: ``(in_features,)`` largest absolute input value seen per channel.
        weight_peak: ``(in_features,)`` largest absolute weight value per input channel (column).
        alpha: migration strength in [0, 1] (0: no smoothing of the activations, 1: all of their range moves).

    Returns:
        ``(in_features,)`` float32 scales, > 0.

    Raises:
        ValueError: ``alpha`` outside [0, 1] or the shapes differ.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if activation_peak.shape != weight_peak.shape:
        raise ValueError(f"peaks of different shapes: {tuple(activation_peak.shape)} vs {tuple(weight_peak.shape)}")
    act = activation_peak.float().clamp(min=_EPS)
    wgt = weight_peak.float().clamp(min=_EPS)
    return (act.pow(alpha) / wgt.pow(1.0 - alpha)).clamp(min=_EPS)


@functools.cache
def _full_range() -> bool:
    """8-bit inputs where int32 accumulation (VNNI) cannot saturate; fbgemm's other x86 kernels sum pairs of
    products in int16 and need 7-bit inputs (``reduce_range``)."""
    try:
        return bool(torch.cpu._is_vnni_supported())
    except AttributeError:
        return False


def available(device: torch.device | str = "cpu") -> bool:
    """Whether int8 linears can run here: a CPU and a quantized engine (fbgemm/x86) in this torch build."""
    if torch.device(device).type != "cpu":
        return False
    return any(engine in torch.backends.quantized.supported_engines for engine in ("x86", "fbgemm"))


def quantize_weight(weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    """Per-output-channel symmetric int8 quantization of a float32 ``(out, in)`` weight, prepacked with its float32
    bias for ``torch.ops.quantized.linear_dynamic`` (PyTorch's per-channel weight observer and packing)."""
    from torch.ao.quantization.observer import PerChannelMinMaxObserver

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.ao.quantization's notice pointing to torchao
        observer = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
        observer(weight)
        scales, zero_points = observer.calculate_qparams()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch 2.13 marks quantized tensor types as to be removed
        qweight = torch.quantize_per_channel(weight, scales.double(), zero_points.long(), 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(qweight, bias)


@dataclass
class Int8State:
    """One linear's int8 serving state: calibration peaks, then scales and the prepacked int8 weight.

    Attributes:
        peak: ``(in_features,)`` float32 running max of ``|x|`` per input channel while calibrating.
        rows / calls: input rows and calls observed.
        scale: the SmoothQuant scales ``s`` (``(in_features,)``) once calibrated (``None`` while calibrating).
        inv_scale: ``1 / s``.
        identity: what the packed weight was made from (weight and adapter versions); rebuilt when it changes.
        packed: the prepacked int8 weight (the bias is added in float after it).
    """

    peak: torch.Tensor | None = None
    rows: int = 0
    calls: int = 0
    inv_scale: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    identity: tuple[Any, ...] | None = None
    packed: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


_states: weakref.WeakKeyDictionary[torch.nn.Module, Int8State] = weakref.WeakKeyDictionary()
"""Modules served in int8 -> their state (kept outside the modules, which the trainer may deep-copy)."""


def mark(model: Any, names: tuple[str, ...] | None = None) -> int:
    """Serve ``model``'s linears named ``names`` (last part of the module path; default ``$AGENTBOLT_INT8_LINEARS``
    or :data:`INT8_LINEARS`) in int8 from now on (inside ``packed_linear.packed_linears``; idempotent). peft LoRA
    layers are marked, not their base layers.

    Returns:
        How many linears are marked (0 where :func:`available` is false).
    """
    if names is None:
        chosen = os.environ.get(LINEARS_ENV, "").strip()
        names = tuple(n.strip() for n in chosen.split(",") if n.strip()) if chosen else INT8_LINEARS
    marked = 0
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] not in names:
            continue
        weight = getattr(getattr(module, "base_layer", module), "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not available(weight.device):
            continue
        _states.setdefault(module, Int8State())
        marked += 1
    return marked


def unmark(model: Any) -> None:
    """Serve every linear of ``model`` as before :func:`mark` (the calibration is dropped too)."""
    for module in model.modules():
        _states.pop(module, None)


def is_marked(module: torch.nn.Module) -> bool:
    """Whether :func:`mark` chose this module."""
    return module in _states


def forget(module: torch.nn.Module) -> None:
    """Drop ``module``'s int8 weight (kept: its scales) so it is quantized again on next use (a weight written
    through ``.data`` does not move the version its identity has)."""
    state = _states.get(module)
    if state is not None:
        with state.lock:
            state.identity, state.packed = None, None


def forward(
    module: torch.nn.Module,
    x: torch.Tensor,
    weight: Callable[[], torch.Tensor],
    bias: torch.Tensor | None,
    identity: tuple[Any, ...],
) -> torch.Tensor | None:
    """``x W^T + b`` in int8 for a marked module, or ``None`` while it calibrates (the caller runs its float path).

    Args:
        module: a module :func:`mark` chose.
        x: ``(..., in_features)`` input (any float dtype; the output has the same dtype).
        weight: makes the float32 ``(out, in)`` weight as served (a LoRA layer's merged weight).
        bias: ``(out,)`` or ``None``.
        identity: changes whenever the weight (or adapter) does; a change quantizes it again.

    Returns:
        ``(..., out_features)`` or ``None`` (calibrating, or ``module`` not marked).
    """
    state = _states.get(module)
    if state is None:
        return None
    if (state.packed is None or state.identity != identity) and not _prepare(state, x, weight, bias, identity):
        return None
    inv_scale = state.inv_scale
    assert inv_scale is not None  # set by the calibration that made the packed weight
    # x / s, widened to float32 by the multiply, then each row scaled to a peak of 1: the op quantizes its input
    # per tensor, and one row with an outlier would otherwise cost every other row of the batch its precision
    # (per-token quantization, as SmoothQuant's W8A8 with dynamic per-token activations)
    smoothed = x * inv_scale
    peak = smoothed.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-12)
    out = torch.ops.quantized.linear_dynamic(smoothed / peak, state.packed, reduce_range=not _full_range())
    out = out * peak
    if bias is not None:
        out = out + bias
    return out.to(x.dtype)


def _prepare(
    state: Int8State,
    x: torch.Tensor,
    weight: Callable[[], torch.Tensor],
    bias: torch.Tensor | None,
    identity: tuple[Any, ...],
) -> bool:
    """Observe ``x`` while calibrating (False until done), then quantize the weight for ``identity`` (True)."""
    with state.lock, torch.no_grad():
        if state.inv_scale is None:
            peak = x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
            state.peak = peak if state.peak is None else torch.maximum(state.peak, peak)
            state.rows += x.numel() // x.shape[-1]
            state.calls += 1
            if state.rows < CALIBRATION_ROWS and state.calls < CALIBRATION_CALLS:
                return False
            full = weight()
            state.scale = smoothing_scales(state.peak, full.abs().amax(dim=0), DEFAULT_ALPHA)
            state.inv_scale = state.scale.reciprocal()
            state.peak = None
        else:
            full = weight()
        assert state.scale is not None
        state.packed = quantize_weight(full * state.scale, None)  # the bias is added after the row scale
        state.identity = identity
    return True
