"""Recent generations as text and ids, so that the next turn's prompt reuses the ids the model generated. Pure: no
torch, no I/O.

An agent sends the model's answer back in its next request, and the chat template renders it as text again. The
text is the same, but tokenizing it again need not give the ids the model generated (``' '`` + ``'"'`` where the
model wrote ``' "'``), and then the next prompt does not extend the previous prompt + response token for token: the
two calls cannot merge into one training sample, and the model is shown a tokenization it never produced.

:class:`TranscriptCache` keeps, for each recent generation, the text of its prompt + response (special tokens
written out, as the template writes them) and those ids. When a new prompt's rendered text starts with such a
text, its ids are those ids followed by the tokenization of the rest (:meth:`TranscriptCache.encode`). Every id
sequence it returns is a tokenization of the rendered text, so the prompt the model is fed is still exactly what
the gateway records; only the split into tokens follows the model's own. A rendered answer whose text differs
(a tool call written back in another layout, a cut stop string) simply does not match.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable


class TranscriptCache:
    """The last ``size`` generations' ``(text, ids)``, thread-safe (the worker thread adds, the event loop reads).

    Args:
        size: generations kept (least recently used dropped first).
        min_chars: shorter texts are not kept (nothing to gain).
    """

    def __init__(self, size: int = 256, min_chars: int = 16) -> None:
        self.size = size
        self.min_chars = min_chars
        self._entries: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        """Prompts that reused a generation's ids."""

    def add(self, text: str, ids: list[int]) -> None:
        """Keep ``ids`` (a prompt + its response) under ``text`` (their decoding, special tokens written out)."""
        if len(text) < self.min_chars or not ids:
            return
        with self._lock:
            self._entries[text] = list(ids)
            self._entries.move_to_end(text)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def longest_prefix(self, text: str) -> tuple[str, list[int]] | None:
        """The kept ``(text, ids)`` whose text is the longest prefix of ``text``, or ``None``."""
        with self._lock:
            best: str | None = None
            for kept in self._entries:
                if (best is None or len(kept) > len(best)) and text.startswith(kept):
                    best = kept
            if best is None:
                return None
            self._entries.move_to_end(best)
            return best, list(self._entries[best])

    def encode(self, text: str, tokenize: Callable[[str], list[int]]) -> list[int]:
        """The ids of ``text``: a kept generation's ids for its longest kept prefix, then ``tokenize`` of the rest
        (``tokenize`` must not add special tokens: the text holds them); ``tokenize(text)`` when none is kept."""
        found = self.longest_prefix(text)
        if found is None:
            return tokenize(text)
        kept, ids = found
        self.hits += 1
        rest = text[len(kept) :]
        return ids + (tokenize(rest) if rest else [])
