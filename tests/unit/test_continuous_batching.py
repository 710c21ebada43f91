"""The pieces of the embedded backend's continuous batching that need no model: the prefix cache, grouping of
prefills, and per-row sampling, against hand-computed values. (The running batch on a real model is tested in
tests/integration/test_embedded.py: its logprobs equal a forward pass in float32.)"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from agentbolt.inference.continuous import prefill_groups, sample_rows  # noqa: E402
from agentbolt.inference.kv_cache import PrefixCache, common_prefix_length  # noqa: E402


def _kv(n: int, value: float = 0.0, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (1, H=1, n, D=2) keys/values whose column t holds ``value + t``."""
    column = (torch.arange(n, dtype=torch.float32) + value).view(1, 1, n, 1).expand(1, 1, n, 2).contiguous()
    return [(column.clone(), column.clone()) for _ in range(layers)]


def test_lookup_finds_the_longest_common_prefix_and_its_columns() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    cache.insert([1, 2, 3, 4, 5], _kv(5, value=100.0))
    cache.insert([1, 2, 9], _kv(3, value=200.0))
    n, kv = cache.lookup([1, 2, 3, 7, 7])
    assert n == 3 and kv is not None
    assert kv[0][0].shape == (1, 1, 3, 2)
    assert kv[1][1][0, 0, :, 0].tolist() == [100.0, 101.0, 102.0]  # the first entry's first three columns
    n, kv = cache.lookup([1, 2, 9, 9])
    assert n == 3 and kv is not None and kv[0][0][0, 0, 2, 0].item() == 202.0
    assert cache.lookup([5, 5]) == (0, None)
    assert cache.hit_tokens == 6 and cache.lookup_tokens == 11


def test_a_sequence_replaces_the_entries_it_extends_and_the_oldest_go_first() -> None:
    one_entry = 2 * 2 * 4 * 2 * 4  # layers x (k, v) x tokens x D x float32 bytes, 4 tokens
    cache = PrefixCache(max_bytes=2 * one_entry)
    cache.insert([1, 2], _kv(2))
    cache.insert([1, 2, 3, 4], _kv(4))  # extends [1, 2]: that entry is dropped
    assert len(cache) == 1 and cache.nbytes == one_entry
    cache.insert([5, 6, 7, 8], _kv(4))
    cache.lookup([1, 2, 3, 4])  # now the most recently used
    cache.insert([9, 9, 9, 9], _kv(4))  # over budget: the least recently used ([5, 6, 7, 8]) goes
    assert len(cache) == 2
    assert cache.lookup([5, 6, 7, 8]) == (0, None)
    assert cache.lookup([1, 2, 3, 4])[0] == 4
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.lookup([1, 2])[0] == 0


def test_a_disabled_cache_keeps_nothing() -> None:
    cache = PrefixCache(max_bytes=0)
    cache.insert([1, 2, 3], _kv(3))
    assert len(cache) == 0 and cache.lookup([1, 2, 3]) == (0, None)


def test_common_prefix_length() -> None:
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2, 3, 5]]) == 2
    assert common_prefix_length([[1, 2], [1, 2, 3]]) == 2
    assert common_prefix_length([[1, 2], [3]]) == 0
    assert common_prefix_length([[1, 2]]) == 0


def test_prefill_groups_keep_padding_small() -> None:
    # sorted: 10, 12, 20, 90, 100, 300; a group takes the next length while longest - shortest <= max(16, 0.25 * it)
    groups = prefill_groups([100, 10, 300, 12, 90, 20])
    assert groups == [[1, 3, 5], [4, 0], [2]]


def test_greedy_rows_take_the_argmax_and_record_the_untempered_logprob() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.0, 0.0, 5.0]])
    ids, logprobs, top = sample_rows(logits, [0.0, 0.0], [1.0, 1.0], top_k=2)
    assert ids.tolist() == [1, 2]
    z0 = math.log(math.exp(1) + math.exp(3) + math.exp(2))
    z1 = math.log(2 + math.exp(5))
    assert logprobs.tolist() == pytest.approx([3 - z0, 5 - z1], abs=1e-6)
    assert top is not None
    assert top[1].tolist() == [[1, 2], [2, 0]] or top[1].tolist() == [[1, 2], [2, 1]]
    assert top[0][0].tolist() == pytest.approx([3 - z0, 2 - z0], abs=1e-6)


def test_sampled_rows_record_the_tempered_logprob_and_stay_in_the_nucleus() -> None:
    torch.manual_seed(0)
    # probabilities at temperature 1: softmax([ln 0.5, ln 0.3, ln 0.2]) = [0.5, 0.3, 0.2]
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(400, 1)
    ids, logprobs, _ = sample_rows(logits, [1.0] * 400, [0.7] * 400)
    # top_p 0.7: 0.5 alone is below 0.7, so the nucleus is {0, 1}; id 2 is never drawn
    assert set(ids.tolist()) == {0, 1}
    for token_id, logprob in zip(ids.tolist(), logprobs.tolist(), strict=True):
        assert logprob == pytest.approx(math.log([0.5, 0.3, 0.2][token_id]), abs=1e-6)  # not renormalized
    share = ids.eq(0).float().mean().item()
    assert 0.5 < share < 0.75  # 0.5 / 0.8 = 0.625 expected
    # temperature 2 on the same logits: logprob = log_softmax(logits / 2)
    ids, logprobs, _ = sample_rows(logits[:1], [2.0], [1.0])
    tempered = torch.log_softmax(logits[0] / 2, dim=-1)
    assert logprobs.item() == pytest.approx(tempered[ids.item()].item(), abs=1e-6)


def test_the_two_level_draw_follows_the_weights_across_blocks() -> None:
    # 300 ids: three blocks of 128 (the last one padded); mass on ids at both sides of a block boundary and at the end
    torch.manual_seed(0)
    probs = torch.zeros(300)
    probs[[5, 127, 128, 299]] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = torch.log(probs).repeat(20_000, 1)  # -inf elsewhere: weight 0, never drawn
    ids, logprobs, _ = sample_rows(logits, [1.0] * 20_000, [1.0] * 20_000)
    counts = torch.bincount(ids, minlength=300)
    assert set(ids.unique().tolist()) == {5, 127, 128, 299}
    for token_id, p in [(5, 0.1), (127, 0.2), (128, 0.3), (299, 0.4)]:
        # 4.5 standard deviations of a binomial share over 20,000 draws (at most 0.0156)
        assert abs(counts[token_id].item() / 20_000 - p) < 4.5 * math.sqrt(p * (1 - p) / 20_000)
        assert logprobs[ids == token_id][0].item() == pytest.approx(math.log(p), abs=1e-6)


def test_logprobs_match_log_softmax_on_a_real_vocabulary_size() -> None:
    torch.manual_seed(1)
    logits = (torch.randn(4, 151_936) * 3).to(torch.bfloat16)
    ids, logprobs, top = sample_rows(logits, [1.0, 0.7, 0.0, 1.3], [1.0, 0.9, 1.0, 1.0], top_k=3)
    for b, t in enumerate([1.0, 0.7, 1.0, 1.3]):
        expected = torch.log_softmax(logits[b].double() / t, dim=-1)
        assert logprobs[b].item() == pytest.approx(expected[ids[b]].item(), abs=2e-5)
        assert top is not None
        assert top[0][b].tolist() == pytest.approx(expected.topk(3).values.tolist(), abs=2e-5)
    assert ids[2].item() == int(logits[2].float().argmax())


def test_rows_of_one_call_keep_their_own_settings() -> None:
    logits = torch.tensor([[0.0, 10.0, 0.0], [10.0, 0.0, 0.0]])
    ids, _, _ = sample_rows(logits, [0.0, 1.0], [1.0, 1e-6])  # greedy row; a sampled row with a one-id nucleus
    assert ids.tolist() == [1, 0]
