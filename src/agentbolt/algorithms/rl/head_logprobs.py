"""Token logprobs through the output projection, with a hand-written backward of the log-softmax.

For ``N`` positions with last hidden states ``h (N, H)``, targets ``t (N,)`` and inverse temperatures ``c (N,)``::

    s = float32(head(h)) * c                      (N, V) tempered scores, head in the model's dtype
    logprob_n = s[n, t_n] - logsumexp(s[n, :])    (N,) float32

and for an upstream gradient ``g (N,)`` (Bridle 1990: the gradient of log-softmax is ``onehot - softmax``)::

    dL/ds[n, v] = g_n * ([v == t_n] - softmax(s[n])_v)
    dL/dh       = (dL/ds * c) cast to the head's dtype, back through the head

:class:`HeadLogprobs` computes this over chunks of positions: the forward keeps only ``h``, the targets, ``c`` and
the ``(N,)`` log-normalizers; the backward recomputes one chunk's logits at a time and writes its softmax gradient
in place over them. It replaces autograd through ``head -> float -> mul -> gather, logsumexp`` under activation
checkpointing, which recomputes the whole forward of a chunk and then makes a zero-filled ``(chunk, V)`` scatter for
the gather, a ``(chunk, V)`` softmax for the logsumexp, their sum and a product for the temperature: measured
on Qwen2.5-0.5B (V = 151,936) on a 2-core CPU, those passes were about a sixth of an update. The results are the
same numbers: the forward runs the same operations, and the backward applies autograd's formulas in autograd's
order (``-g * exp(s - lse)`` plus ``g`` at the target, then times ``c``, then the cast), so gradients match it to
float32 rounding of the same expressions (tested against the autograd path).

The head must be frozen (no parameter requiring a gradient): a LoRA policy's output projection. The head's own
backward (``torch.autograd.grad`` through it) gives ``dL/dh``, so any head module works (a plain ``nn.Linear``, the
float32-compute one of :mod:`agentbolt.inference.packed_linear`).
"""

from __future__ import annotations

from typing import Any

import torch


class HeadLogprobs(torch.autograd.Function):
    """``apply(hidden_NH, targets_N, inverse_temperatures_N, head, chunk)`` -> ``(N,)`` float32 logprobs (see the
    module docstring). ``head``: a module mapping ``(n, H)`` to ``(n, V)`` logits, with no trainable parameter;
    ``chunk``: positions per pass (at most one ``(chunk, V)`` float32 block is alive at a time)."""

    @staticmethod
    def forward(  # type: ignore[override]  # pyright: ignore[reportIncompatibleMethodOverride]
        ctx: Any,
        hidden_NH: torch.Tensor,
        targets_N: torch.Tensor,
        inverse_temperatures_N: torch.Tensor,
        head: torch.nn.Module,
        chunk: int,
    ) -> torch.Tensor:
        n = hidden_NH.shape[0]
        out_N = torch.empty(n, dtype=torch.float32, device=hidden_NH.device)
        lse_N = torch.empty(n, dtype=torch.float32, device=hidden_NH.device)
        tempered = bool((inverse_temperatures_N != 1.0).any())
        for lo in range(0, n, chunk):
            scores = _scores(head, hidden_NH[lo : lo + chunk], inverse_temperatures_N[lo : lo + chunk], tempered)
            lse = torch.logsumexp(scores, dim=1)
            out_N[lo : lo + chunk] = scores.gather(1, targets_N[lo : lo + chunk].unsqueeze(1)).squeeze(1) - lse
            lse_N[lo : lo + chunk] = lse
            del scores
        ctx.save_for_backward(hidden_NH, targets_N, inverse_temperatures_N, lse_N)
        ctx.head, ctx.chunk, ctx.tempered = head, chunk, tempered
        return out_N

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # pyright: ignore[reportIncompatibleMethodOverride]
        hidden_NH, targets_N, inverse_temperatures_N, lse_N = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        g_N = grad_outputs[0].float()
        grad_NH = torch.empty_like(hidden_NH)
        head: torch.nn.Module = ctx.head
        for lo in range(0, hidden_NH.shape[0], ctx.chunk):
            hi = min(lo + ctx.chunk, hidden_NH.shape[0])
            with torch.enable_grad():
                h = hidden_NH[lo:hi].detach().requires_grad_(True)
                logits = head(h)
            g = g_N[lo:hi].unsqueeze(1)  # (n, 1)
            scores = logits.detach().to(torch.float32, copy=True)  # a float32 head's logits stay untouched
            if ctx.tempered:
                scores.mul_(inverse_temperatures_N[lo:hi].unsqueeze(1))
            # logsumexp's backward: grad * exp(s - lse) with grad = -g; then the gather's g at the target
            grad_scores = scores.sub_(lse_N[lo:hi].unsqueeze(1)).exp_().mul_(-g)
            rows = torch.arange(hi - lo, device=grad_scores.device)
            targets = targets_N[lo:hi]
            grad_scores[rows, targets] = grad_scores[rows, targets] + g.squeeze(1)
            if ctx.tempered:
                grad_scores.mul_(inverse_temperatures_N[lo:hi].unsqueeze(1))
            (grad_h,) = torch.autograd.grad(logits, h, grad_scores.to(logits.dtype))
            grad_NH[lo:hi] = grad_h
            del logits, scores, grad_scores
        return grad_NH, None, None, None, None


def _scores(
    head: torch.nn.Module, hidden_nH: torch.Tensor, inverse_temperatures_n: torch.Tensor, tempered: bool
) -> torch.Tensor:
    """``(n, V)`` float32 ``head(hidden) * inverse_temperature`` (the product skipped when every factor is 1)."""
    scores = head(hidden_nH).float()
    return scores.mul_(inverse_temperatures_n.unsqueeze(1)) if tempered else scores


def head_logprobs(
    hidden_NH: torch.Tensor,
    targets_N: torch.Tensor,
    inverse_temperatures_N: torch.Tensor,
    head: torch.nn.Module,
    chunk: int,
) -> torch.Tensor:
    """:class:`HeadLogprobs` applied: ``(N,)`` float32 logprobs of ``targets_N`` under
    ``softmax(float32(head(hidden_NH)) * inverse_temperatures_N)``.

    Raises:
        ValueError: ``head`` has a parameter that requires a gradient (its gradient would be lost), or ``chunk < 1``.
    """
    if any(p.requires_grad for p in head.parameters()):
        raise ValueError("head_logprobs needs a frozen head: it returns no gradient for the head's parameters")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    out = HeadLogprobs.apply(hidden_NH, targets_N, inverse_temperatures_N, head, chunk)
    assert isinstance(out, torch.Tensor)
    return out
