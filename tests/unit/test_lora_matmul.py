"""LoRALinearFunction (inference/lora_matmul.py): its gradients against finite differences, and the layer against
peft's own LoRA linear (forward and every gradient) on real peft modules."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from agentbolt.inference import packed_linear  # noqa: E402  (after the importorskip)
from agentbolt.inference.lora_matmul import LoRALinearFunction, lora_linear  # noqa: E402


def test_gradients_match_finite_differences() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 6, dtype=torch.float64)
    bias = torch.randn(5, dtype=torch.float64)
    lora_A = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    lora_B = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)

    def layer(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return lora_linear(x, weight, bias, a, b, 0.75, torch.float64)

    assert torch.autograd.gradcheck(layer, (x, lora_A, lora_B))
    expected = x @ weight.T + bias + 0.75 * (x @ lora_A.T) @ lora_B.T  # LoRA, eq. 3
    assert torch.allclose(layer(x, lora_A, lora_B), expected)


def _peft_layer(rows_in: int = 64, rows_out: int = 96) -> torch.nn.Module:
    torch.manual_seed(1)
    base = torch.nn.Sequential(torch.nn.Linear(rows_in, rows_out))
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["0"], lora_dropout=0.0))
    layer = model.base_model.model[0]
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_(0, 0.1)
    return layer


def test_float32_layer_equals_peft_in_forward_and_gradients() -> None:
    """All in float32 (no rounding to bf16 anywhere): the same values as peft's modules, and the same gradients for
    the input, A and B."""
    layer = _peft_layer()
    x = torch.randn(7, 64, requires_grad=True)
    grad_out = torch.randn(7, 96)

    def run(forward: object) -> tuple[torch.Tensor, ...]:
        for p in layer.parameters():
            p.grad = None
        x.grad = None
        y = forward(x)  # type: ignore[operator]
        y.backward(grad_out)
        A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        assert A.grad is not None and B.grad is not None and x.grad is not None
        return y.detach(), x.grad.clone(), A.grad.clone(), B.grad.clone()

    base = layer.base_layer
    ours = run(
        lambda t: LoRALinearFunction.apply(
            t,
            base.weight,
            base.bias,
            layer.lora_A["default"].weight,
            layer.lora_B["default"].weight,
            layer.scaling["default"],
            torch.float32,
        )
    )
    theirs = run(lambda t: type(layer).forward(layer, t))
    for mine, peft_value in zip(ours, theirs, strict=True):
        assert torch.allclose(mine, peft_value, rtol=1e-5, atol=1e-6)
    assert base.weight.grad is None  # the base stays frozen


def test_bf16_base_with_float32_adapters_as_the_trainer_runs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's layout (bf16 base, float32 adapters) through the installed forward, against peft's: bf16
    compute gives peft's output bit for bit; float32 compute rounds the exact sum once (within half a bf16 unit of
    it), where peft rounds the base product first."""
    layer = _peft_layer(256, 512)
    layer.base_layer.to(torch.bfloat16)
    packed_linear.install(torch.nn.ModuleList([layer]))
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    monkeypatch.setenv(packed_linear.COMPUTE_ENV, "bf16")
    peft_out = type(layer).forward(layer, x)  # its base layer: the plain bf16 linear
    assert torch.equal(layer(x), peft_out)
    monkeypatch.setenv(packed_linear.COMPUTE_ENV, "float32")
    out = layer(x)
    base, A, B = layer.base_layer, layer.lora_A["default"].weight, layer.lora_B["default"].weight
    exact = x.double() @ base.weight.double().T + base.bias.double()
    exact = exact + layer.scaling["default"] * (x.double() @ A.double().T @ B.double().T)
    error = (out.double() - exact).abs()
    half_unit = torch.finfo(torch.bfloat16).eps / 2 * exact.abs() * 1.01
    assert out.dtype == torch.bfloat16 and bool((error <= half_unit).all())
    assert error.mean() <= (peft_out.double() - exact).abs().mean()
    out.float().square().sum().backward()  # gradients reach the adapter, not the base
    assert layer.lora_A["default"].weight.grad is not None and layer.base_layer.weight.grad is None


def test_frozen_linear_gradient_and_the_installed_output_projection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A frozen layer (a LoRA policy's lm_head) outside generation: FrozenLinearFunction in float32 where the CPU
    emulates bf16; the input's gradient matches finite differences and the output the bf16 matmul's within a unit."""
    from agentbolt.inference.lora_matmul import frozen_linear

    torch.manual_seed(2)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    weight, bias = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: frozen_linear(t, weight, bias, torch.float64), (x,))

    head = torch.nn.Linear(256, 1024, bias=False).to(torch.bfloat16).requires_grad_(False)
    packed_linear.install(torch.nn.ModuleList([head]))
    hidden = torch.randn(8, 256, dtype=torch.bfloat16, requires_grad=True)
    plain = torch.nn.functional.linear(hidden, head.weight)
    monkeypatch.setenv(packed_linear.COMPUTE_ENV, "float32")
    out = head(hidden)
    assert out.grad_fn is not None and "FrozenLinearFunction" in type(out.grad_fn).__name__
    unit = torch.finfo(torch.bfloat16).eps * plain.detach().float().abs().clamp_min(2.0**-100)
    assert bool(((out.detach().float() - plain.detach().float()).abs() <= unit).all())
    out.float().sum().backward()
    assert hidden.grad is not None
    expected = head.weight.float().sum(0).expand(8, -1)
    assert torch.allclose(hidden.grad.float(), expected, rtol=1e-2, atol=1e-2)
