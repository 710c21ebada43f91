"""Linear layers with prepacked oneDNN weights for the embedded backend's generation on a CPU.

On a CPU, ``torch.nn.functional.linear`` with bf16 weights runs oneDNN's matmul, which first reorders the weight
into its blocked layout, on every call. At decode that reorder reads and writes the whole weight once more per step,
and most of a decode step is matmuls: measured on a 2-core AMD EPYC (AVX512-BF16) with Qwen2.5-0.5B's 24 layers of
linears at 16 rows per step, 84 ms per step plain against 50 ms with the weights reordered once ahead of time
(``torch.ops.mkldnn._reorder_linear_weight``, then ``torch.ops.mkldnn._linear_pointwise``: the same pair that
PyTorch's inductor uses when it freezes a bf16 model); the 151,936-row output projection 41 ms against 25 ms. The
results are bitwise equal to the plain path (the same oneDNN kernel on the same blocked layout), so the logprobs the
engine records do not change.

:func:`install` gives every large bf16 ``nn.Linear`` of a model a forward that uses a packed copy of its weight
while :func:`packed_linears` is active in the calling thread, and the plain forward otherwise (the trainer's
forward and backward in another thread never see the packed copy). The copy is made on first use and made again
when the weight changes: its identity is ``(data_ptr, _version)`` (an optimizer step or ``copy_`` in place bumps
``_version``), and :func:`forget_trainable` drops the copies of trainable weights when the backend's weights version
moves. LoRA adapters' own small matrices are left plain (below :data:`MIN_PACKED_ELEMENTS`); their frozen
base layers are packed once. The copies cost the weights' size once more in memory (about 1 GB for Qwen2.5-0.5B).

A CPU without bf16 dot-product instructions (no AVX512-BF16 and no AMX: oneDNN then emulates bf16 matmuls) runs the
packed linears in float32 instead (:func:`compute_dtype`): the weight is packed as float32, the bf16 input is widened,
and the output rounded back to bf16. Each product of two bf16 numbers is exact in float32 and oneDNN's bf16 matmul
accumulates in float32 too, so the outputs match the plain bf16 linear's except for the accumulation order: measured
on Qwen2.5-0.5B's shapes, about 1 element in 10,000 differs, by one bf16 unit in the last place. It is the faster
path there by far: on a 2-core Intel Xeon (AVX512 without BF16), a 896x4864 linear at 16 rows takes 0.7 ms against
2.9 ms packed bf16, and the 151,936-row output projection 39 ms against 94 ms. The float32 copies cost twice the
weights' size in memory (about 2 GB for Qwen2.5-0.5B).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from agentbolt.inference import int8_linear
from agentbolt.inference.lora_matmul import frozen_linear, lora_linear

MIN_PACKED_ELEMENTS = 65_536
"""Weights with fewer elements keep the plain forward (a LoRA rank-16 matrix of a 896-wide layer has 14,336)."""

BATCH_HINT = 16
"""Rows oneDNN is told to expect when a weight is reordered (it works for any number of rows)."""

_packed: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Any, ...]] = weakref.WeakKeyDictionary()
"""Linear (or LoRA layer, merged) -> ``(identity, packed weight, bias in the compute dtype)``. Kept outside the
modules: ``copy.deepcopy`` of a model (the trainer copies the served one) cannot copy oneDNN's opaque tensors."""
_FAILED = ("failed",)
"""Stored instead of a packed copy when packing failed for a layer: it keeps the plain forward from then on."""
_state = threading.local()
logger = logging.getLogger(__name__)

COMPUTE_ENV = "AGENTBOLT_PACKED_COMPUTE"
"""Environment variable that overrides :func:`compute_dtype`: ``bf16`` or ``float32``."""


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU has bf16 dot-product instructions (AVX512-BF16 or AMX tiles) that oneDNN runs natively."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # an older torch without the probes
        return False


def compute_dtype() -> torch.dtype:
    """The dtype packed linears multiply in: bf16 where the CPU runs bf16 natively (:func:`native_bf16`), float32
    where oneDNN would emulate it, or what ``AGENTBOLT_PACKED_COMPUTE`` (``bf16`` | ``float32``) says.

    Raises:
        ValueError: ``AGENTBOLT_PACKED_COMPUTE`` is set to anything else.
    """
    chosen = os.environ.get(COMPUTE_ENV, "").strip().lower()
    if chosen in ("bf16", "bfloat16"):
        return torch.bfloat16
    if chosen in ("float32", "fp32"):
        return torch.float32
    if chosen:
        raise ValueError(f"{COMPUTE_ENV}={chosen!r}: use bf16 or float32, or unset it to choose by the CPU")
    return torch.bfloat16 if native_bf16() else torch.float32


def available(device: torch.device | str = "cpu") -> bool:
    """Whether packed linears can run here: a CPU device, oneDNN built in, and, where they multiply in bf16
    (:func:`compute_dtype`), bf16 support in oneDNN."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if compute_dtype() == torch.float32:
        return True
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@contextlib.contextmanager
def packed_linears() -> Iterator[None]:
    """In the calling thread, linears prepared by :func:`install` use their packed weights until the block ends."""
    previous = getattr(_state, "on", False)
    _state.on = True
    try:
        yield
    finally:
        _state.on = previous


def install(model: Any) -> int:
    """Give ``model``'s large bf16 ``nn.Linear`` modules the packed forward (idempotent; nothing is packed yet).

    Returns:
        How many linears have it (0 when :func:`available` is false for the model's device).
    """
    installed = 0
    for module in model.modules():
        if _is_lora_linear(module) and available(module.base_layer.weight.device) and "forward" not in module.__dict__:
            module.forward = functools.partial(_lora_forward, module)  # type: ignore[method-assign]  # pyright: ignore[reportAttributeAccessIssue]
        if not isinstance(module, torch.nn.Linear):
            continue
        weight = module.weight
        if weight.dtype != torch.bfloat16 or weight.dim() != 2 or weight.numel() < MIN_PACKED_ELEMENTS:
            continue
        if not available(weight.device):
            continue
        if "forward" not in module.__dict__:
            module.forward = functools.partial(_forward, module)  # type: ignore[method-assign]  # pyright: ignore[reportAttributeAccessIssue]
        installed += 1
    return installed


def uninstall(model: Any) -> None:
    """Give every linear of ``model`` back its plain forward and drop the packed copies."""
    for module in model.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, functools.partial) and forward.func in (_forward, _lora_forward):
            del module.forward
        _packed.pop(module, None)
    int8_linear.unmark(model)


def forget_trainable(model: Any) -> None:
    """Drop the packed copies of weights that require gradients (call it when the weights may have changed: an
    update that wrote them through ``.data`` would not bump ``_version``), and the merged copies of LoRA layers.
    Frozen weights, such as a LoRA model's base layers, keep theirs. Int8 weights (:mod:`~agentbolt.inference.
    int8_linear`) are kept: quantizing them costs seconds (the output projection alone about 2 s on two cores), so
    they are made again only when their weight's identity moves (a ``copy_`` or an optimizer step bumps
    ``_version``; assigning ``.data`` changes ``data_ptr``)."""
    for module in model.modules():
        if module in _packed and any(p.requires_grad for p in module.parameters()):
            _packed.pop(module, None)


def _forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.bfloat16:
        return torch.nn.functional.linear(x, module.weight, module.bias)
    if not getattr(_state, "on", False):
        # the trainer's forward (and backward): a frozen layer (a LoRA policy's output projection) multiplies in
        # float32 where the CPU emulates bf16, rounded once to bf16 as the bf16 matmul rounds
        if module.weight.requires_grad or compute_dtype() != torch.float32:
            return torch.nn.functional.linear(x, module.weight, module.bias)
        return frozen_linear(x, module.weight, module.bias, torch.float32)
    weight = module.weight
    if weight.is_inference():  # made under inference_mode: no version counter to tell a change by
        return torch.nn.functional.linear(x, weight, module.bias)
    identity = (weight.data_ptr(), weight._version)
    if int8_linear.is_marked(module):
        out = int8_linear.forward(module, x, lambda: weight.detach().float(), module.bias, identity)
        if out is not None:
            return out
    entry = _packed.get(module)
    if entry is _FAILED:
        return torch.nn.functional.linear(x, weight, module.bias)
    try:
        if entry is None or entry[0] != identity:
            dtype = compute_dtype()
            bias = None if module.bias is None else module.bias.detach().to(dtype)
            entry = (identity, torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), BATCH_HINT), bias)
            _packed[module] = entry
        packed, bias = entry[1], entry[2]
        if packed.dtype == torch.bfloat16:
            return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise(x.to(packed.dtype), packed, bias, "none", [], "").to(x.dtype)
    except RuntimeError as exc:  # a oneDNN build or CPU that reports bf16 support but cannot run this: stay plain
        shape = tuple(weight.shape)
        logger.warning("prepacked bf16 linear unavailable (%s); the plain linear runs for %s", exc, shape)
        _packed[module] = _FAILED
        return torch.nn.functional.linear(x, weight, module.bias)


def _is_lora_linear(module: torch.nn.Module) -> bool:
    """A peft LoRA layer around an ``nn.Linear`` (duck-typed: peft is an optional dependency)."""
    return (
        type(module).__module__.startswith("peft.")
        and isinstance(getattr(module, "base_layer", None), torch.nn.Linear)
        and all(hasattr(module, name) for name in ("lora_A", "lora_B", "scaling", "active_adapters", "merged"))
    )


def _plain_adapter(module: Any, x: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The one plain LoRA adapter (no dropout, no DoRA or other variant, not merged by peft, not disabled) that
    runs in this forward, or None when peft's own forward must run."""
    if args or kwargs or module.merged or module.disable_adapters or getattr(module, "fan_in_fan_out", False):
        return None
    if x.device.type != "cpu" or not x.is_floating_point():
        return None
    active = [name for name in module.active_adapters if name in module.lora_A]
    if len(active) != 1 or active[0] in getattr(module, "lora_variant", {}):
        return None
    name = active[0]
    dropout = module.lora_dropout[name]
    if not isinstance(dropout, torch.nn.Identity) and (module.training or dropout.training):
        return None
    return name


def _lora_forward(module: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A LoRA layer's forward (Hu et al. 2021, "LoRA", eq. 3: ``W x + b + scaling * B A x``).

    - Inside :func:`packed_linears` with float32 compute: one matmul with the packed float32 ``W + scaling * B @ A``
      (merging changes no output beyond rounding: the sum is rounded once), merged again when the base weight,
      ``A``, ``B`` or the scaling changes.
    - Inside :func:`packed_linears` with bf16 compute: peft's forward (its base layer runs packed).
    - Elsewhere on a CPU (the trainer's forward and backward): :class:`~agentbolt.inference.lora_matmul.
      LoRALinearFunction` in :func:`compute_dtype` for bf16 inputs, in the input's own dtype otherwise (a float32
      or float64 model is never multiplied in bf16).
    - With dropout, several adapters, a variant (DoRA), or peft's merged or disabled states: peft's forward.
    """
    name = _plain_adapter(module, x, args, kwargs)
    if name is None:
        return type(module).forward(module, x, *args, **kwargs)
    base, lora_A, lora_B = module.base_layer, module.lora_A[name].weight, module.lora_B[name].weight
    scaling = float(module.scaling[name])
    if not getattr(_state, "on", False):
        # bf16 inputs multiply in the CPU's fast dtype; a float32 or float64 model keeps its own precision
        compute = compute_dtype() if x.dtype == torch.bfloat16 else x.dtype
        return lora_linear(x, base.weight, base.bias, lora_A, lora_B, scaling, compute)
    if base.weight.is_inference() or lora_A.is_inference() or lora_B.is_inference():
        return type(module).forward(module, x, *args, **kwargs)
    identity = (name, scaling) + tuple((t.data_ptr(), t._version) for t in (base.weight, lora_A, lora_B))
    if int8_linear.is_marked(module):
        out = int8_linear.forward(module, x, lambda: _merged(base.weight, lora_A, lora_B, scaling), base.bias, identity)
        if out is not None:
            return out
    mergeable = compute_dtype() == torch.float32 and x.dtype == torch.bfloat16
    if not mergeable or base.weight.numel() < MIN_PACKED_ELEMENTS:
        return type(module).forward(module, x, *args, **kwargs)
    entry = _packed.get(module)
    if entry is _FAILED:
        return type(module).forward(module, x, *args, **kwargs)
    try:
        if entry is None or entry[0] != identity:
            with torch.no_grad():
                merged = _merged(base.weight, lora_A, lora_B, scaling)
                bias = None if base.bias is None else base.bias.detach().float()
                entry = (identity, torch.ops.mkldnn._reorder_linear_weight(merged, BATCH_HINT), bias)
            del merged
            _packed[module] = entry
        return torch.ops.mkldnn._linear_pointwise(x.float(), entry[1], entry[2], "none", [], "").to(x.dtype)
    except RuntimeError as exc:
        logger.warning("merged LoRA linear unavailable (%s); peft's forward runs for %s", exc, tuple(base.weight.shape))
        _packed[module] = _FAILED
        return type(module).forward(module, x, *args, **kwargs)


def _merged(weight: torch.Tensor, lora_A: torch.Tensor, lora_B: torch.Tensor, scaling: float) -> torch.Tensor:
    """``W + scaling * B @ A`` in float32, ``(out, in)``, rounded once."""
    with torch.no_grad():
        merged = weight.detach().float()
        return merged.addmm_(lora_B.detach().float(), lora_A.detach().float(), alpha=scaling)
