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
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch

MIN_PACKED_ELEMENTS = 65_536
"""Weights with fewer elements keep the plain forward (a LoRA rank-16 matrix of a 896-wide layer has 14,336)."""

BATCH_HINT = 16
"""Rows oneDNN is told to expect when a weight is reordered (it works for any number of rows)."""

_packed: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Any, ...]] = weakref.WeakKeyDictionary()
"""Linear -> ``(identity, packed weight)``. Kept outside the modules: ``copy.deepcopy`` of a model (the trainer copies
the served one) cannot copy oneDNN's opaque tensors."""
_FAILED = ("failed",)
"""Stored instead of a packed copy when packing failed for a layer: it keeps the plain forward from then on."""
_state = threading.local()
logger = logging.getLogger(__name__)


def available(device: torch.device | str = "cpu") -> bool:
    """Whether packed bf16 linears can run here: a CPU device, oneDNN built in, and bf16 support in oneDNN."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
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
        if isinstance(module, torch.nn.Linear):
            forward = module.__dict__.get("forward")
            if isinstance(forward, functools.partial) and forward.func is _forward:
                del module.forward
            _packed.pop(module, None)


def forget_trainable(model: Any) -> None:
    """Drop the packed copies of weights that require gradients (call it when the weights may have changed: an
    update that wrote them through ``.data`` would not bump ``_version``). Frozen weights, such as a LoRA model's
    base layers, keep theirs."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.requires_grad:
            _packed.pop(module, None)


def _forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if not getattr(_state, "on", False) or x.dtype != torch.bfloat16:
        return torch.nn.functional.linear(x, module.weight, module.bias)
    weight = module.weight
    if weight.is_inference():  # made under inference_mode: no version counter to tell a change by
        return torch.nn.functional.linear(x, weight, module.bias)
    identity = (weight.data_ptr(), weight._version)
    entry = _packed.get(module)
    if entry is _FAILED:
        return torch.nn.functional.linear(x, weight, module.bias)
    try:
        if entry is None or entry[0] != identity:
            entry = (identity, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), BATCH_HINT))
            _packed[module] = entry
        return torch.ops.mkldnn._linear_pointwise(x, entry[1], module.bias, "none", [], "")
    except RuntimeError as exc:  # a oneDNN build or CPU that reports bf16 support but cannot run this: stay plain
        shape = tuple(weight.shape)
        logger.warning("prepacked bf16 linear unavailable (%s); the plain linear runs for %s", exc, shape)
        _packed[module] = _FAILED
        return torch.nn.functional.linear(x, weight, module.bias)
