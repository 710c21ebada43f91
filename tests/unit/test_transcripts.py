"""TranscriptCache: a prompt whose text starts with a recent generation's text keeps that generation's ids; the
rest is tokenized; nothing else changes. Hand-made texts and ids (a character per id)."""

from __future__ import annotations

from agentbolt.inference.transcripts import TranscriptCache


def _chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_a_prompt_that_extends_a_generation_keeps_its_ids_and_tokenizes_the_rest() -> None:
    cache = TranscriptCache(min_chars=1)
    cache.add("<s>user: hi</s><s>assistant: hello</s>", [1, 2, 3, 4])  # the model's own split of that text
    ids = cache.encode("<s>user: hi</s><s>assistant: hello</s><s>user: more", _chars)
    assert ids == [1, 2, 3, 4, *_chars("<s>user: more")]
    assert cache.hits == 1
    # a text that does not start with a kept one is tokenized whole
    assert cache.encode("<s>user: other", _chars) == _chars("<s>user: other") and cache.hits == 1


def test_the_longest_kept_prefix_wins_and_the_oldest_entries_go_first() -> None:
    cache = TranscriptCache(size=2, min_chars=1)
    cache.add("ab", [10])
    cache.add("abcd", [20, 21])
    assert cache.encode("abcdef", _chars) == [20, 21, *_chars("ef")]
    assert cache.encode("abc", _chars) == [10, *_chars("c")]
    cache.add("xy", [30])  # size 2: "abcd" (least recently used) goes
    assert cache.encode("abcdef", _chars) == [10, *_chars("cdef")]
    assert cache.encode("ab", _chars) == [10]  # exactly a kept text: its ids, nothing more


def test_short_texts_and_empty_ids_are_not_kept() -> None:
    cache = TranscriptCache(min_chars=16)
    cache.add("short", [1])
    cache.add("long enough to be kept", [])
    assert cache.longest_prefix("short and more") is None
    assert cache.longest_prefix("long enough to be kept, and more") is None
