"""The one-pass forward of running rows and joining prompts (agentbolt.inference.ragged_step) on a real transformers
Qwen2 model with random weights (grouped-query attention, q/k/v biases), float32: every row's greedy ids and logprobs
equal a plain forward pass of its own prompt + answer, through joins beside running rows, prefixes taken from the
prefix cache, a joining prompt longer than the batch (buffers rebuilt) and rows leaving. (SmolLM2, a Llama, is tested
the same way in tests/integration/test_embedded.py.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from agentbolt.inference import ragged_step  # noqa: E402
from agentbolt.inference.continuous import Row, RunningBatch  # noqa: E402
from agentbolt.inference.kv_cache import PrefixCache  # noqa: E402
from agentbolt.inference.ragged_step import RaggedForward, supports_ragged  # noqa: E402


def _tiny_qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return Qwen2ForCausalLM(config).float().eval()


def drive_and_check(model: torch.nn.Module, vocab: int) -> list[Row]:
    """Run five rows through ``RunningBatch.advance`` (joins beside running rows, a shared prefix cached, a long
    prompt joining late) and check each against a forward pass of prompt + answer. Returns the rows."""
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(5, vocab, (30,), generator=generator).tolist()

    def row(n: int, max_tokens: int, shared: bool = True) -> Row:
        prompt = (prefix if shared else []) + torch.randint(5, vocab, (n,), generator=generator).tolist()
        return Row(None, prompt, max_tokens, 0.0, 1.0, 0, frozenset())

    batch = RunningBatch(model, torch.device("cpu"), 0, PrefixCache(2**28))
    assert batch.ragged
    ended: list[Row] = []

    def run(steps: int, joining: list[Row]) -> None:
        for step in range(steps):
            ended.extend(batch.finished(lambda _: None))
            batch.advance(joining if step == 0 else [])
        ended.extend(batch.finished(lambda _: None))

    with torch.inference_mode():
        first, unshared = row(5, 40), row(50, 6, shared=False)
        run(8, [first, unshared])  # the 50 + 0 prompt sets the width; `unshared` ends after 6 ids
        third, fourth = row(3, 12), row(9, 70)
        run(5, [third, fourth])  # join beside `first`; their shared prefix is prefilled once for both
        late = row(120, 5, shared=False)
        run(90, [late])  # longer than the batch: buffers rebuilt, running rows shifted right
    rows = [first, unshared, third, fourth, late]
    assert [r.cached_prefix for r in rows] == [0, 0, 0, 30, 0]
    assert not batch.rows
    for finished in rows:
        assert finished in ended and len(finished.generated) == finished.max_tokens
        ids = torch.tensor([finished.prompt + finished.generated])
        with torch.inference_mode():
            logits = model(ids).logits[0, len(finished.prompt) - 1 : -1]
        assert finished.generated == logits.argmax(dim=-1).tolist()
        expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(finished.generated).unsqueeze(1))
        assert torch.allclose(torch.tensor(finished.logprobs), expected.squeeze(1), atol=1e-4, rtol=0)
    return rows


def test_ragged_advance_equals_a_forward_pass_on_qwen2() -> None:
    drive_and_check(_tiny_qwen2(), 512)


def test_long_joining_prompts_attend_in_chunks_with_the_same_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ragged_step, "QUERY_CHUNK", 7)  # every joining suffix here spans several chunks
    drive_and_check(_tiny_qwen2(), 512)


def test_only_llama_style_decoders_without_a_sliding_window_are_taken() -> None:
    model = _tiny_qwen2()
    assert supports_ragged(model)
    model.config.use_sliding_window = True
    assert not supports_ragged(model)
    with pytest.raises(ValueError, match="Llama-style"):
        RaggedForward(model)
    assert not supports_ragged(torch.nn.Linear(2, 2))


def test_without_the_ragged_pass_advance_prefills_then_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTBOLT_RAGGED_STEP", "0")
    model = _tiny_qwen2()
    batch = RunningBatch(model, torch.device("cpu"), 0, PrefixCache(0))
    assert not batch.ragged
    prompt = list(range(10, 30))
    row = Row(None, prompt, 3, 0.0, 1.0, 0, frozenset())
    with torch.inference_mode():
        batch.advance([row])  # admit (first id) then one step (second id)
        assert len(row.generated) == 2
        logits = model(torch.tensor([prompt + row.generated])).logits[0, len(prompt) - 1 : -1]
    assert row.generated == logits.argmax(dim=-1).tolist()


def _captured_logits(batch: RunningBatch) -> list[torch.Tensor]:
    """Every logits tensor the batch samples from, in order (a wrapper around its ``_sample_into``)."""
    seen: list[torch.Tensor] = []
    original = batch._sample_into

    def capture(rows: list[Row], logits_BV: torch.Tensor, only_live: bool = False) -> None:
        seen.append(logits_BV.clone())
        original(rows, logits_BV, only_live)

    batch._sample_into = capture  # type: ignore[method-assign]
    return seen


def test_a_request_alone_gets_the_logits_of_transformers_own_forward_in_bf16() -> None:
    """bf16, one request at a time: a prompt with nothing cached, then one whose first 40 ids come from the prefix
    cache. Each step's logits are those of transformers' own passes with its cache, replayed the same way (the first
    prompt in one pass, then one id a pass; for the second, that cache cut to 40 columns, then its suffix in one
    pass): bit for bit where the packed linears compute as the plain ones do (native bf16), else to bf16 rounding."""
    from transformers import DynamicCache

    from agentbolt.inference import packed_linear

    model = _tiny_qwen2().to(torch.bfloat16)
    generator = torch.Generator().manual_seed(3)
    prefix = torch.randint(5, 512, (40,), generator=generator).tolist()
    batch = RunningBatch(model, torch.device("cpu"), 0, PrefixCache(2**28))
    logits = _captured_logits(batch)
    cache = DynamicCache()
    for suffix_len in (9, 6):  # the second finds the first's prompt + answer in the prefix cache
        prompt = prefix + torch.randint(5, 512, (suffix_len,), generator=generator).tolist()
        row = Row(None, prompt, 5, 0.0, 1.0, 0, frozenset())
        logits.clear()
        with torch.inference_mode():
            while row.finish_reason is None:
                batch.advance([row] if not row.generated else [])
            batch.finished(lambda _: None)
            if cache.get_seq_length() > row.cached_prefix:  # keep what the prefix cache gave the row
                cache.crop(row.cached_prefix - cache.get_seq_length())
            run = [prompt[row.cached_prefix :], *([token] for token in row.generated[:-1])]
            expected = [model(torch.tensor([ids]), past_key_values=cache, use_cache=True).logits[0, -1] for ids in run]
        served = torch.stack([step[0] for step in logits])
        if packed_linear.native_bf16():
            assert torch.equal(served, torch.stack(expected))
        else:
            assert torch.allclose(served.float(), torch.stack(expected).float(), atol=0.05, rtol=0)
    assert row.cached_prefix == 40
