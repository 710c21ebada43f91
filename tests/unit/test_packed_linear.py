"""Prepacked oneDNN linears (inference/packed_linear.py) on real bf16 layers: bitwise the plain results when they
multiply in bf16, within one bf16 unit when they multiply in float32 (CPUs without native bf16), only inside the
context and only in the thread that entered it, repacked after an in-place change of the weight.

Tests that compare bit for bit pin ``AGENTBOLT_PACKED_COMPUTE=bf16`` (the :func:`bf16` fixture)."""

from __future__ import annotations

import copy
import threading

import pytest

torch = pytest.importorskip("torch")

from agentbolt.inference import packed_linear  # noqa: E402  (after the importorskip)

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="oneDNN bf16 is not available on this CPU")


@pytest.fixture
def bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(packed_linear.COMPUTE_ENV, "bf16")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512, bias=False))
    model.append(torch.nn.Linear(512, 16))  # below MIN_PACKED_ELEMENTS: stays plain (LoRA-sized)
    return model.to(torch.bfloat16)


def test_packed_results_equal_the_plain_ones_bit_for_bit(bf16: None) -> None:
    model = _model()
    assert packed_linear.install(model) == 2
    assert packed_linear.install(model) == 2  # idempotent
    with torch.inference_mode():
        model(torch.randn(3, 512, dtype=torch.bfloat16))
    assert all(m not in packed_linear._packed for m in model)  # outside the context: plain
    for rows in (1, 16, 300):
        x = torch.randn(rows, 512, dtype=torch.bfloat16)
        with torch.inference_mode():
            plain = model(x)
            with packed_linear.packed_linears():
                packed = model(x)
        assert torch.equal(plain, packed)
    assert model[0] in packed_linear._packed and model[3] not in packed_linear._packed


def test_float32_compute_matches_bf16_within_one_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the CPU lacks native bf16, the packed linears widen to float32: the same products, summed in another
    order, so an output differs from the plain bf16 linear's by at most one unit in the last place, and rarely."""
    monkeypatch.setenv(packed_linear.COMPUTE_ENV, "float32")
    model = _model()
    packed_linear.install(model)
    x = torch.randn(16, 512, dtype=torch.bfloat16)
    with torch.inference_mode():
        plain = model[0](x)
        with packed_linear.packed_linears():
            packed = model[0](x)
    entry = packed_linear._packed[model[0]]
    assert entry[1].dtype == torch.float32 and entry[2].dtype == torch.float32  # packed weight and bias
    assert packed.dtype == torch.bfloat16 and packed.shape == plain.shape
    ulp = torch.finfo(torch.bfloat16).eps * plain.float().abs().clamp_min(2.0**-126)
    assert bool(((packed.float() - plain.float()).abs() <= ulp).all())
    assert (packed != plain).float().mean().item() < 0.01


def test_the_compute_dtype_follows_the_cpu_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(packed_linear.COMPUTE_ENV, raising=False)
    expected = torch.bfloat16 if packed_linear.native_bf16() else torch.float32
    assert packed_linear.compute_dtype() == expected
    monkeypatch.setenv(packed_linear.COMPUTE_ENV, "float32")
    assert packed_linear.compute_dtype() == torch.float32
    monkeypatch.setenv(packed_linear.COMPUTE_ENV, "fp8")
    with pytest.raises(ValueError, match="use bf16 or float32"):
        packed_linear.compute_dtype()


def test_other_threads_and_autograd_use_the_plain_weights() -> None:
    model = _model()
    packed_linear.install(model)
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    seen: list[bool] = []

    def elsewhere() -> None:
        model(x)
        seen.append(model[0] in packed_linear._packed)

    with packed_linear.packed_linears():
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
    assert seen == [False]
    loss = model(x).float().square().mean()  # the trainer's forward and backward: plain, with gradients
    loss.backward()
    assert model[0].weight.grad is not None


def test_a_weight_changed_in_place_is_packed_again(bf16: None) -> None:
    model = _model()
    packed_linear.install(model)
    x = torch.randn(8, 512, dtype=torch.bfloat16)
    with torch.inference_mode(), packed_linear.packed_linears():
        before = model(x)
    with torch.no_grad():
        model[0].weight.mul_(2)  # as an optimizer step or weight_sync's copy_ writes it
    with torch.inference_mode():
        plain = model(x)
        with packed_linear.packed_linears():
            after = model(x)
    assert torch.equal(after, plain) and not torch.equal(after, before)
    model[2].weight.data.mul_(2)  # through .data: _version does not move; the backend calls forget_trainable
    packed_linear.forget_trainable(model)
    with torch.inference_mode():
        plain = model(x)
        with packed_linear.packed_linears():
            assert torch.equal(model(x), plain)


def test_a_model_with_packed_copies_can_be_deep_copied(bf16: None) -> None:
    """The trainer deep-copies the served model (trainer/local.py, weight_sync.py) after it has generated."""
    model = _model()
    packed_linear.install(model)
    x = torch.randn(2, 512, dtype=torch.bfloat16)
    with torch.inference_mode(), packed_linear.packed_linears():
        expected = model(x)
    twin = copy.deepcopy(model)
    assert twin[0] not in packed_linear._packed  # packed again on its own first use
    with torch.inference_mode(), packed_linear.packed_linears():
        assert torch.equal(twin(x), expected)
    assert twin[0] in packed_linear._packed


def test_uninstall_gives_the_plain_forward_back() -> None:
    model = _model()
    packed_linear.install(model)
    with packed_linear.packed_linears():
        model(torch.randn(2, 512, dtype=torch.bfloat16))
    packed_linear.uninstall(model)
    assert all("forward" not in m.__dict__ and m not in packed_linear._packed for m in model)


def test_a_layer_that_cannot_be_packed_stays_plain(bf16: None, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    packed_linear.install(model)
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    calls = []

    def broken(*args: object) -> None:
        calls.append(args)
        raise RuntimeError("no bf16 reorder on this CPU")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", broken)
    with torch.inference_mode():
        plain = model(x)
        with packed_linear.packed_linears():
            assert torch.equal(model(x), plain)
            assert torch.equal(model(x), plain)
    assert len(calls) == 2  # tried once per packable layer, then left plain


def _lora_model() -> torch.nn.Module:
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(512, 1024)
            self.down = torch.nn.Linear(1024, 512, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.nn.functional.gelu(self.up(x)))

    base = Tiny().to(torch.bfloat16)
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["up", "down"], lora_dropout=0.0)
    model = peft.get_peft_model(base, config)  # adapters in float32, as attach_lora makes them
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)  # a trained adapter (B starts at 0)
    return model.eval()


def _lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if packed_linear._is_lora_linear(m)]


def test_float32_compute_folds_the_lora_adapter_into_one_packed_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    """The served LoRA policy runs one matmul per layer: W + scaling * B @ A, packed in float32. Its outputs are
    peft's own (base matmul plus adapter matmuls) within bf16 rounding; a changed adapter is merged again."""
    monkeypatch.setenv(packed_linear.COMPUTE_ENV, "float32")
    model = _lora_model()
    packed_linear.install(model)
    layers = _lora_layers(model)
    assert len(layers) == 2
    x = torch.randn(16, 512, dtype=torch.bfloat16)
    with torch.inference_mode():
        plain = model(x)
        with packed_linear.packed_linears():
            merged = model(x)
    assert all(layer in packed_linear._packed for layer in layers)
    assert all(layer.base_layer not in packed_linear._packed for layer in layers)  # not packed twice
    assert torch.allclose(merged.float(), plain.float(), rtol=0.02, atol=0.02)
    # One layer against float64: the merged product is rounded once (to bf16, within half a unit), peft's twice
    # (the base product to bf16, then the sum with the adapter's): the merged one is the closer of the two.
    up = layers[0]
    A, B = up.lora_A["default"].weight.double(), up.lora_B["default"].weight.double()
    exact = x.double() @ up.base_layer.weight.double().T + up.base_layer.bias.double()
    exact = exact + up.scaling["default"] * (x.double() @ A.T @ B.T)
    with torch.inference_mode():
        peft_error = (type(up).forward(up, x).double() - exact).abs()
        unmerged_error = (up(x).double() - exact).abs()  # outside the context: LoRALinearFunction in float32
        with packed_linear.packed_linears():
            merged_error = (up(x).double() - exact).abs()
    half_unit = torch.finfo(torch.bfloat16).eps / 2 * exact.abs() * 1.01 + 1e-30
    assert bool((merged_error <= half_unit).all()) and bool((unmerged_error <= half_unit).all())
    assert merged_error.mean() < peft_error.mean()
    without = packed_linear._packed[layers[0]][1]
    with torch.no_grad():
        layers[0].lora_B["default"].weight.mul_(3)  # an optimizer step on the adapter
    with torch.inference_mode():
        plain_after = model(x)
        with packed_linear.packed_linears():
            merged_after = model(x)
    assert packed_linear._packed[layers[0]][1] is not without
    assert torch.allclose(merged_after.float(), plain_after.float(), rtol=0.02, atol=0.02)
    assert not torch.allclose(merged_after.float(), merged.float(), rtol=0.02, atol=0.02)
    packed_linear.forget_trainable(model)  # an update through .data: the merged copies go, the base ones stay
    assert all(layer not in packed_linear._packed for layer in layers)


def test_lora_layers_keep_peft_s_forward_where_they_cannot_be_folded(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _lora_model()
    packed_linear.install(model)
    layers = _lora_layers(model)
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    monkeypatch.setenv(packed_linear.COMPUTE_ENV, "bf16")  # native bf16: only the base layers are packed
    with torch.inference_mode():
        plain = model(x)
        with packed_linear.packed_linears():
            assert torch.equal(model(x), plain)
    assert all(layer not in packed_linear._packed and layer.base_layer in packed_linear._packed for layer in layers)
    monkeypatch.setenv(packed_linear.COMPUTE_ENV, "float32")
    with torch.inference_mode(), model.disable_adapter():  # the reference policy: the base weights alone
        base_only = model(x)
        with packed_linear.packed_linears():
            assert torch.allclose(model(x).float(), base_only.float(), rtol=0.02, atol=0.02)
    assert all(layer not in packed_linear._packed for layer in layers)
    packed_linear.uninstall(model)
    assert all("forward" not in layer.__dict__ for layer in layers)
