"""head_logprobs against autograd through the same chunks of head -> float -> temperature -> gather - logsumexp:
the same logprobs and the same input gradient, bit for bit, in bf16, float32 and float64; and the hand formula
of the log-softmax gradient on a 3-id vocabulary."""

from __future__ import annotations

import math

import pytest
import torch

from agentbolt.algorithms.rl.head_logprobs import head_logprobs


def _autograd_logprobs(head: torch.nn.Module, h: torch.Tensor, t: torch.Tensor, c: torch.Tensor, chunk: int):
    pieces = []
    for lo in range(0, h.shape[0], chunk):
        s = head(h[lo : lo + chunk]).float() * c[lo : lo + chunk].unsqueeze(1)
        pieces.append(s.gather(1, t[lo : lo + chunk].unsqueeze(1)).squeeze(1) - torch.logsumexp(s, dim=1))
    return torch.cat(pieces)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("temperatures", [(1.0,), (0.7,), (1.0, 0.5, 1.3)])
def test_same_logprobs_and_gradients_as_autograd(dtype: torch.dtype, temperatures: tuple[float, ...]) -> None:
    generator = torch.Generator().manual_seed(7)
    n, hidden, vocab, chunk = 37, 64, 1000, 8
    head = torch.nn.Linear(hidden, vocab, bias=False).to(dtype).requires_grad_(False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, generator=generator))
    h_ref = torch.randn(n, hidden, generator=generator).to(dtype).requires_grad_(True)
    h = h_ref.detach().clone().requires_grad_(True)
    targets = torch.randint(0, vocab, (n,), generator=generator)
    inverse = torch.tensor([1.0 / temperatures[i % len(temperatures)] for i in range(n)])
    weights = torch.randn(n, generator=generator)

    ref = _autograd_logprobs(head, h_ref, targets, inverse, chunk)
    (ref * weights).sum().backward()
    out = head_logprobs(h, targets, inverse, head, chunk)
    (out * weights).sum().backward()

    assert out.dtype == torch.float32 and out.shape == (n,)
    assert torch.equal(out, ref)
    assert h.grad is not None and h_ref.grad is not None
    assert torch.equal(h.grad, h_ref.grad)


def test_gradient_is_onehot_minus_softmax_by_hand() -> None:
    # vocabulary of 3, head = identity: scores = h * c; logprob of id 0 at temperature 2 (c = 0.5)
    head = torch.nn.Linear(3, 3, bias=False, dtype=torch.float64).requires_grad_(False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3, dtype=torch.float64))
    h = torch.tensor([[2.0, 0.0, -2.0]], dtype=torch.float64, requires_grad=True)
    out = head_logprobs(h, torch.tensor([0]), torch.tensor([0.5]), head, chunk=4)
    z = math.exp(1.0) + 1.0 + math.exp(-1.0)
    assert out.item() == pytest.approx(1.0 - math.log(z), abs=1e-7)
    out.sum().backward()
    softmax = [math.exp(1.0) / z, 1.0 / z, math.exp(-1.0) / z]
    expected = [0.5 * (1.0 - softmax[0]), -0.5 * softmax[1], -0.5 * softmax[2]]  # dL/dh = c * (onehot - softmax)
    assert h.grad is not None
    assert h.grad[0].tolist() == pytest.approx(expected, abs=1e-7)


def test_no_gradient_needed_and_bad_arguments() -> None:
    head = torch.nn.Linear(4, 5, bias=False).requires_grad_(False)
    h = torch.randn(3, 4)
    with torch.no_grad():
        out = head_logprobs(h, torch.tensor([0, 1, 4]), torch.ones(3), head, chunk=2)
    assert out.shape == (3,) and bool((out <= 0).all())
    with pytest.raises(ValueError, match="frozen head"):
        head_logprobs(h, torch.tensor([0, 1, 4]), torch.ones(3), torch.nn.Linear(4, 5), chunk=2)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        head_logprobs(h, torch.tensor([0, 1, 4]), torch.ones(3), head, chunk=0)
