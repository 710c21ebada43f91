"""A LoRA layer's forward and backward as one autograd function, in the CPU's fast matmul dtype.

peft's LoRA linear computes ``base(x) + lora_B(lora_A(x)) * scaling`` (Hu et al. 2021, "LoRA: Low-Rank Adaptation
of Large Language Models", eq. 3) as separate modules: with a bf16 base and float32 adapters (the trainer's
layout) it runs the base matmul in bf16, widens the input to float32 for the adapter, writes the adapter's
``(rows, out)`` product in float32, multiplies it by ``scaling``, adds the bf16 base result (widened again) and
rounds the sum back to bf16: four passes over a ``(rows, out)`` float32 tensor besides the matmuls, about 45% of a
CPU update's time in a profile of Qwen2.5-0.5B. On a CPU without native bf16 (:func:`packed_linear.native_bf16`)
the bf16 matmuls themselves are emulated and 2-5x slower than float32 ones.

:class:`LoRALinearFunction` computes the same layer with ``compute`` as the base matmul's dtype:

- forward: ``y = x W^T + b`` in ``compute``, then ``y += scaling * (x A^T) B^T`` in float32 in place (``addmm``),
  rounded once to the input's dtype. With ``compute = float32`` the output is the exact sum rounded once (peft
  rounds the base product first); with ``compute = bf16`` the base product is rounded as peft rounds it.
- backward, for ``g = dL/dy`` (shapes: ``x (M, in)``, ``W (out, in)``, ``A (r, in)``, ``B (out, r)``)::

      dL/dx = g W + scaling * (g B) A
      dL/dA = scaling * (g B)^T x
      dL/dB = scaling * g^T (x A^T)

  with the adapter terms in float32 and ``g W`` in ``compute``. The base weight and bias get no gradient (LoRA
  trains the adapter only).

Only ``x A^T`` (``M x r``) is kept for the backward besides ``x``; peft keeps a float32 copy of ``x`` too.
"""

from __future__ import annotations

from typing import Any

import torch


class LoRALinearFunction(torch.autograd.Function):
    """``y = x W^T + b + scaling * (x A^T) B^T`` with a frozen ``W``/``b`` (see the module docstring).

    ``apply(x, weight, bias, lora_A, lora_B, scaling, compute)``: ``x (..., in)`` in any float dtype, ``weight
    (out, in)``, ``bias (out,)`` or None, ``lora_A (r, in)`` and ``lora_B (out, r)`` (float32, trainable),
    ``scaling`` a float, ``compute`` the dtype of the base matmul. Returns ``(..., out)`` in ``x``'s dtype.
    """

    @staticmethod
    def forward(  # type: ignore[override]  # pyright: ignore[reportIncompatibleMethodOverride]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        lora_A: torch.Tensor,
        lora_B: torch.Tensor,
        scaling: float,
        compute: torch.dtype,
    ) -> torch.Tensor:
        shape = x.shape
        x_MI = x.reshape(-1, shape[-1])
        adapter = lora_A.dtype
        bias_O = None if bias is None else bias.to(compute)
        y_MO = torch.nn.functional.linear(x_MI.to(compute), weight.to(compute), bias_O)
        xa_MR = x_MI.to(adapter) @ lora_A.t()
        y_MO = y_MO.to(adapter) if y_MO.dtype != adapter else y_MO
        y_MO.addmm_(xa_MR, lora_B.t(), alpha=scaling)
        ctx.save_for_backward(x, weight, lora_A, lora_B, xa_MR)
        ctx.scaling = scaling
        ctx.compute = compute
        return y_MO.to(x.dtype).reshape(*shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # pyright: ignore[reportIncompatibleMethodOverride]
        x, weight, lora_A, lora_B, xa_MR = ctx.saved_tensors
        scaling: float = ctx.scaling
        compute: torch.dtype = ctx.compute
        adapter = lora_A.dtype
        g_MO = grad_outputs[0].reshape(-1, weight.shape[0])
        g_adapter = g_MO.to(adapter)
        gb_MR = g_adapter @ lora_B
        grad_x = grad_A = grad_B = None
        if ctx.needs_input_grad[0]:
            dx_MI = g_MO.to(compute) @ weight.to(compute)
            dx_MI = dx_MI.to(adapter) if dx_MI.dtype != adapter else dx_MI
            dx_MI.addmm_(gb_MR, lora_A, alpha=scaling)
            grad_x = dx_MI.to(x.dtype).reshape(x.shape)
        if ctx.needs_input_grad[3]:
            grad_A = (gb_MR.t() @ x.reshape(-1, x.shape[-1]).to(adapter)).mul_(scaling)
        if ctx.needs_input_grad[4]:
            grad_B = (g_adapter.t() @ xa_MR).mul_(scaling)
        return grad_x, None, None, grad_A, grad_B, None, None


def lora_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    lora_A: torch.Tensor,
    lora_B: torch.Tensor,
    scaling: float,
    compute: torch.dtype,
) -> torch.Tensor:
    """:class:`LoRALinearFunction` applied (see there for shapes and the formulas)."""
    out = LoRALinearFunction.apply(x, weight, bias, lora_A, lora_B, scaling, compute)
    assert isinstance(out, torch.Tensor)
    return out


class FrozenLinearFunction(torch.autograd.Function):
    """``y = x W^T + b`` with a frozen ``W``/``b``, the matmuls in ``compute``, rounded once to ``x``'s dtype.

    ``apply(x, weight, bias, compute)``; backward ``dL/dx = g W`` (in ``compute``); no gradient for ``W`` or ``b``.
    Used for the output projection of a LoRA policy on a CPU that emulates bf16 (Qwen2.5-0.5B's is 151,936 x 896:
    the largest matmul of an update).
    """

    @staticmethod
    def forward(  # type: ignore[override]  # pyright: ignore[reportIncompatibleMethodOverride]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, compute: torch.dtype
    ) -> torch.Tensor:
        ctx.save_for_backward(weight)
        ctx.compute = compute
        bias_O = None if bias is None else bias.to(compute)
        return torch.nn.functional.linear(x.to(compute), weight.to(compute), bias_O).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # pyright: ignore[reportIncompatibleMethodOverride]
        (weight,) = ctx.saved_tensors
        g = grad_outputs[0]
        grad_x = (g.to(ctx.compute) @ weight.to(ctx.compute)).to(g.dtype) if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None


def frozen_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, compute: torch.dtype
) -> torch.Tensor:
    """:class:`FrozenLinearFunction` applied."""
    out = FrozenLinearFunction.apply(x, weight, bias, compute)
    assert isinstance(out, torch.Tensor)
    return out
