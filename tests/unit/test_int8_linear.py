"""Int8 serving (inference/int8_linear.py): SmoothQuant scales by hand, calibration on the served rows, int8
outputs near the float ones, smoothing that beats plain int8 on inputs with outlier channels, re-quantization when the
weight or the LoRA adapter changes, and only the chosen linears of a real (tiny, random) Qwen2 model in int8."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from agentbolt.inference import int8_linear, packed_linear  # noqa: E402  (after the importorskip)

pytestmark = pytest.mark.skipif(not int8_linear.available(), reason="no int8 engine (fbgemm/x86) in this torch")


def test_smoothing_scales_by_hand() -> None:
    act = torch.tensor([4.0, 1.0, 0.0, 9.0])
    wgt = torch.tensor([1.0, 4.0, 2.0, 0.25])
    # s_j = act_j^0.5 / wgt_j^0.5; a channel never seen non-zero counts as 1e-5
    expected = [2.0, 0.5, math.sqrt(1e-5) / math.sqrt(2.0), 6.0]
    assert int8_linear.smoothing_scales(act, wgt, 0.5).tolist() == pytest.approx(expected, rel=1e-6)
    assert int8_linear.smoothing_scales(act, wgt, 1.0).tolist() == pytest.approx([4.0, 1.0, 1e-5, 9.0], rel=1e-6)
    assert int8_linear.smoothing_scales(act, wgt, 0.0).tolist() == pytest.approx([1.0, 0.25, 0.5, 4.0], rel=1e-6)
    with pytest.raises(ValueError, match="alpha must be in"):
        int8_linear.smoothing_scales(act, wgt, 1.5)
    with pytest.raises(ValueError, match="different shapes"):
        int8_linear.smoothing_scales(act, wgt[:2], 0.5)


def _outlier_inputs(rows: int, width: int, seed: int) -> torch.Tensor:
    """Activations as an RMSNorm gives them to q/k/v: most channels ~N(0, 1), a few 60x larger."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=generator)
    x[:, [3, 70, 200]] *= 60.0
    return x


def _relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.detach().float() - ref.detach().float()).norm() / ref.detach().float().norm())


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(256, 384)
        self.down_proj = torch.nn.Linear(384, 256, bias=False)


def test_a_marked_linear_calibrates_then_serves_int8_close_to_float() -> None:
    torch.manual_seed(0)
    block = _Block().to(torch.bfloat16)
    assert int8_linear.mark(block) == 1 and int8_linear.is_marked(block.q_proj)
    assert not int8_linear.is_marked(block.down_proj)
    layer = block.q_proj
    weight = lambda: layer.weight.detach().float()  # noqa: E731
    calibration = _outlier_inputs(int8_linear.CALIBRATION_ROWS, 256, seed=1)
    half = int8_linear.CALIBRATION_ROWS // 2
    # calibrating: the caller's float path runs (None), twice half the rows
    assert int8_linear.forward(layer, calibration[:half].bfloat16(), weight, layer.bias, (0,)) is None
    state = int8_linear._states[layer]
    assert state.rows == half and state.inv_scale is None
    out = int8_linear.forward(layer, calibration[half:].bfloat16(), weight, layer.bias, (0,))
    assert out is not None and out.dtype == torch.bfloat16 and state.scale is not None
    peaks = calibration.bfloat16().float().abs().amax(0)  # over every calibration row, as served (bf16)
    expected = int8_linear.smoothing_scales(peaks, weight().abs().amax(0), int8_linear.DEFAULT_ALPHA)
    assert torch.allclose(state.scale, expected, rtol=1e-6)
    x = _outlier_inputs(24, 256, seed=2).bfloat16().reshape(2, 12, 256)
    served = int8_linear.forward(layer, x, weight, layer.bias, (0,))
    reference = torch.nn.functional.linear(x.float(), weight(), layer.bias.float())
    assert served is not None and served.shape == (2, 12, 384)
    assert _relative_error(served, reference) < 0.02


def test_smoothing_beats_plain_int8_on_outlier_channels() -> None:
    """The same per-channel int8 weight and per-tensor dynamic inputs, with and without the SmoothQuant scales."""
    torch.manual_seed(0)
    weight = torch.randn(512, 256) * 0.05
    x = _outlier_inputs(64, 256, seed=3)
    reference = x @ weight.T
    plain = torch.ops.quantized.linear_dynamic(x, int8_linear.quantize_weight(weight, None), reduce_range=False)
    scale = int8_linear.smoothing_scales(x.abs().amax(0), weight.abs().amax(0), 0.8)
    packed = int8_linear.quantize_weight(weight * scale, None)
    smoothed = torch.ops.quantized.linear_dynamic(x / scale, packed, reduce_range=False)
    plain_error, smoothed_error = _relative_error(plain, reference), _relative_error(smoothed, reference)
    assert smoothed_error < plain_error / 3, (smoothed_error, plain_error)


def _lora_qwen() -> torch.nn.Module:
    """A real Qwen2 causal LM (2 layers, random weights: nothing downloaded) with a LoRA adapter on every linear."""
    pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from tiny_models import tiny_qwen2

    model = tiny_qwen2(
        512, max_positions=256, hidden_size=256, intermediate_size=512, tie_word_embeddings=True, dtype=torch.bfloat16
    )
    lora = peft.LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"]
    )
    policy = peft.get_peft_model(model, lora)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)  # a trained adapter (B starts at 0)
    return policy.eval()


def test_a_lora_model_serves_its_rms_norm_fed_linears_in_int8_and_follows_adapter_updates() -> None:
    policy = _lora_qwen()
    packed_linear.install(policy)
    # per layer q, k, v, o, gate, up (the LoRA wrappers where adapted), plus the output projection
    assert int8_linear.mark(policy) == 2 * 6 + 1
    marked = [name for name, module in policy.named_modules() if int8_linear.is_marked(module)]
    assert not any(name.endswith(("down_proj", "base_layer")) for name in marked), marked
    ids = torch.randint(0, 512, (4, 160), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        reference = torch.log_softmax(policy(input_ids=ids).logits.float(), -1)  # the trainer's path (no context)
        with packed_linear.packed_linears():
            policy(input_ids=ids)  # 640 rows: calibrates every marked linear
            served = torch.log_softmax(policy(input_ids=ids).logits.float(), -1)
    up = policy.base_model.model.model.layers[0].mlp.up_proj
    assert int8_linear._states[up].packed is not None
    # the served distribution stays near the float one: mean KL(float || int8) per position
    kl = (reference.exp() * (reference - served)).sum(-1).mean().item()
    assert 0.0 < kl < 1e-3, kl  # measured 2.0e-05
    before = int8_linear._states[up].packed
    with torch.no_grad():
        up.lora_B["default"].weight.mul_(3)  # an optimizer step on the adapter
    with torch.inference_mode():
        after_reference = torch.log_softmax(policy(input_ids=ids).logits.float(), -1)
        with packed_linear.packed_linears():
            after = torch.log_softmax(policy(input_ids=ids).logits.float(), -1)
    assert int8_linear._states[up].packed is not before  # quantized again from the new merged weight
    kl_after = (after_reference.exp() * (after_reference - after)).sum(-1).mean().item()
    assert kl_after < 1e-3 and (after - served).abs().max() > 0.05
    packed_linear.uninstall(policy)
    assert not any(int8_linear.is_marked(module) for module in policy.modules())


def test_one_outlier_row_does_not_cost_the_other_rows_their_precision() -> None:
    """The op quantizes its input per tensor; rows are scaled to one peak first, so a row 1000x larger than the rest
    (a sequence's first position carries such activations) leaves the others as precise as alone."""
    torch.manual_seed(0)
    block = _Block()
    int8_linear.mark(block)
    layer = block.q_proj
    weight = lambda: layer.weight.detach().float()  # noqa: E731
    calibration = _outlier_inputs(int8_linear.CALIBRATION_ROWS, 256, seed=5)
    assert int8_linear.forward(layer, calibration, weight, layer.bias, (0,)) is not None
    x = _outlier_inputs(16, 256, seed=6)
    x[0] *= 1000.0
    with torch.no_grad():
        served = int8_linear.forward(layer, x, weight, layer.bias, (0,))
        reference = layer(x)
    assert served is not None
    assert _relative_error(served[1:], reference[1:]) < 0.02
    assert _relative_error(served[:1], reference[:1]) < 0.02
