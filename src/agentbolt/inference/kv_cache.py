"""Keys and values: the prefix cache of recent sequences, and the glue to transformers' cache objects.

:class:`PrefixCache` keeps the keys and values of finished sequences by their token ids (the idea of vLLM's automatic
prefix caching and SGLang's RadixAttention, Zheng et al. 2024), so a new prompt is prefilled only from the end of its
longest cached prefix. The functions below wrap per-layer ``(keys, values)`` tensors in transformers'
``DynamicCache`` and back, whichever name (``cache`` or ``past_key_values``) the installed transformers uses; the
continuous batch (:mod:`agentbolt.inference.continuous`) and the trainer's shared-prefix forward both use them.

Shapes: ``H`` key/value heads, ``T`` cached tokens, ``D`` head dim.
"""

from __future__ import annotations

import collections
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer ``(keys, values)``, each ``(batch, H, T, D)``."""


@dataclass
class _Entry:
    tokens: np.ndarray
    kv: KV  # per layer (1, H, len(tokens), D)
    nbytes: int


class PrefixCache:
    """Keys and values of recent token sequences, found by longest common prefix of token ids.

    Entries are kept least-recently-used first and evicted past ``max_bytes``. Inserting a sequence drops the
    entries that are prefixes of it (the new entry answers every lookup they answered).

    Args:
        max_bytes: the most bytes of keys and values kept (0 disables the cache).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[int, _Entry] = collections.OrderedDict()
        self._next_key = 0
        self.nbytes = 0
        self.hit_tokens = 0
        """Prompt tokens found in the cache, since creation (they were not prefilled)."""
        self.lookup_tokens = 0
        """Prompt tokens looked up, since creation."""

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry (the weights changed: cached keys and values no longer match them)."""
        self._entries.clear()
        self.nbytes = 0

    def lookup(self, tokens: Sequence[int]) -> tuple[int, KV | None]:
        """``(n, kv)``: the longest cached prefix of ``tokens``, ``n`` tokens long, and its keys and values (views
        of the cache's tensors, ``(1, H, n, D)`` per layer; do not write to them); ``(0, None)`` when none."""
        query = np.asarray(tokens, dtype=np.int64)
        best_n, best_key = 0, None
        for key, entry in self._entries.items():
            n = min(len(query), len(entry.tokens))
            if n <= best_n:
                continue
            same = entry.tokens[:n] == query[:n]
            common = n if bool(same.all()) else int(np.argmin(same))
            if common > best_n:
                best_n, best_key = common, key
        self.lookup_tokens += len(query)
        if best_key is None:
            return 0, None
        entry = self._entries[best_key]
        self._entries.move_to_end(best_key)
        self.hit_tokens += best_n
        return best_n, [(k[:, :, :best_n], v[:, :, :best_n]) for k, v in entry.kv]

    def insert(self, tokens: Sequence[int], kv: KV) -> None:
        """Keep ``kv`` (per layer ``(1, H, len(tokens), D)``, owned by the cache from now on) as the keys and values
        of ``tokens``."""
        if self.max_bytes <= 0 or not tokens:
            return
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if nbytes > self.max_bytes:
            return
        new = np.asarray(tokens, dtype=np.int64)
        for key in [k for k, e in self._entries.items() if len(e.tokens) <= len(new)]:
            entry = self._entries[key]
            if np.array_equal(entry.tokens, new[: len(entry.tokens)]):
                self.nbytes -= entry.nbytes
                del self._entries[key]
        self._entries[self._next_key] = _Entry(new, kv, nbytes)
        self._next_key += 1
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes and self._entries:
            _, dropped = self._entries.popitem(last=False)
            self.nbytes -= dropped.nbytes


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix all of ``sequences`` share (0 for fewer than two)."""
    if len(sequences) < 2:
        return 0
    n = min(len(s) for s in sequences)
    first = np.asarray(sequences[0][:n], dtype=np.int64)
    same = np.ones(n, dtype=bool)
    for other in sequences[1:]:
        same &= np.asarray(other[:n], dtype=np.int64) == first
    return n if bool(same.all()) else int(np.argmin(same))


# ---------------------------------------------------------------------- transformers cache objects


def cache_kwarg(model: Any) -> str:
    """``cache`` (transformers >= 5.x renamed it) or ``past_key_values``: the forward's name for the cache."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    parameters = inspect.signature(type(base).forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def as_cache(kv: KV) -> DynamicCache:
    """A ``DynamicCache`` holding ``kv`` as it is (no copy; the forward's update concatenates into new tensors)."""
    cache = DynamicCache()
    for keys, values in kv:
        layer = DynamicLayer()
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        cache.layers.append(layer)
    return cache


def output_cache(out: Any) -> Any:
    """The cache a forward returned (``cache`` in transformers >= 5.x, ``past_key_values`` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer ``(keys, values)`` of a ``DynamicCache``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


class AppendLayer(DynamicLayer):
    """A cache layer over ``(rows capacity, H, columns capacity, D)`` buffers whose ``[:rows, :, :length]`` corner
    is filled: ``update`` writes the new columns after it, in place, and returns views of the filled part.

    Raises:
        RuntimeError: the update does not fit in the buffers' spare columns.
    """

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, rows: int, length: int) -> None:
        super().__init__()
        self.lazy_initialization(key_buffer, value_buffer)
        self.key_buffer, self.value_buffer = key_buffer[:rows], value_buffer[:rows]
        self.length = length
        self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.length
        end = start + key_states.shape[2]
        if end > self.key_buffer.shape[2]:
            raise RuntimeError(f"{end} cache columns do not fit in a buffer of {self.key_buffer.shape[2]}")
        self.key_buffer[:, :, start:end].copy_(key_states)
        self.value_buffer[:, :, start:end].copy_(value_states)
        self.length = end
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
