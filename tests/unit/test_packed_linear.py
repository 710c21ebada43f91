"""Prepacked oneDNN linears (inference/packed_linear.py) on real bf16 layers: bitwise the plain results, only
inside the context and only in the thread that entered it, repacked after an in-place change of the weight."""

from __future__ import annotations

import copy
import threading

import pytest

torch = pytest.importorskip("torch")

from agentbolt.inference import packed_linear  # noqa: E402  (after the importorskip)

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="oneDNN bf16 is not available on this CPU")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512, bias=False))
    model.append(torch.nn.Linear(512, 16))  # below MIN_PACKED_ELEMENTS: stays plain (LoRA-sized)
    return model.to(torch.bfloat16)


def test_packed_results_equal_the_plain_ones_bit_for_bit() -> None:
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


def test_a_weight_changed_in_place_is_packed_again() -> None:
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


def test_a_model_with_packed_copies_can_be_deep_copied() -> None:
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


def test_a_layer_that_cannot_be_packed_stays_plain(monkeypatch: pytest.MonkeyPatch) -> None:
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
