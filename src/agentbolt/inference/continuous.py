"""Continuous batching with a prefix cache: the embedded backend's fast path for plain sampling requests.

The old path ran one ``model.generate`` per batch: every request waited for the running batch to end, every prompt
was prefilled from its first token, and a short answer's row kept being computed (as padding) until the longest
row ended. On a CPU the calculator agent's calls spend most of their time prefilling the same ~250-token system
and tools prefix. This engine keeps one running batch that requests join and leave at every step:

- **Rows join at every step** (continuous batching, Yu et al. 2022, "Orca", OSDI'22): a request waiting for a
  slot is prefilled and its row added to the running batch's key/value cache at the next decode step, in the same
  forward pass where the model allows (:meth:`RunningBatch.advance`, :mod:`agentbolt.inference.ragged_step`),
  else by a prefill pass before it; a row that ends (stop id, ``max_tokens``, stop string, cancel) leaves at once
  and its slot is free for the next request.
- **Prefix cache** (the idea of vLLM's automatic prefix caching and SGLang's RadixAttention, Zheng et al. 2024):
  the keys and values of finished sequences (prompt + answer) are kept, by token ids, in :class:`PrefixCache`; a new
  prompt is prefilled only from the end of its longest cached prefix. A burst of new prompts that share a prefix
  (the system prompt and tools) prefills that prefix once. The cache is emptied whenever the weights change.
- **No compute on finished rows**: the decode step runs over the live rows only. Rows of different lengths share
  one cache tensor ``(B, H, T, D)`` per layer with a ``(B, T)`` attention mask; a row's missing columns are zeros
  under a 0 mask (they cost attention reads, never a matmul), and each row gets its own ``position_ids``. A
  prefill group is left-padded to its longest suffix; groups are formed from suffixes of similar length
  (:func:`prefill_groups`) so the padding stays small.

Sampling is the same as the old path's: ``log_softmax(logits / temperature)`` of the raw logits is recorded at the
chosen id (temperature 1 when greedy), top-p truncation is not folded into the recorded logprob (as in vLLM's
default). The ids and logprobs are those the engine ran: the recorded prompt ids are the ids prefilled (cached or
not), so nothing is re-tokenized. Numerically, a row's logits depend on which rows share its matmuls and on whether
its prefix came from the cache (bf16 sums in another order): the difference to the trainer's recomputation is what
``approx_kl`` at step start reports.

Requests this engine does not take (the backend runs them with ``model.generate`` as before): a grammar
(constrained decoding), presence/frequency penalties or logit bias, a seed (the seed sets the whole batch's random
generator), and models whose cache is not plain full attention (sliding-window layers).

Shapes: ``B`` live rows, ``G`` rows of a prefill group, ``H`` key/value heads, ``T`` cache columns, ``D`` head dim,
``V`` vocabulary, ``S`` suffix length of a prefill group.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agentbolt.inference import packed_linear
from agentbolt.inference.kv_cache import (
    KV,
    AppendLayer,
    PrefixCache,
    as_cache,
    cache_kwarg,
    cache_layers,
    common_prefix_length,
    output_cache,
)
from agentbolt.inference.ragged_step import JoiningRow, RaggedForward, supports_ragged


def prefill_groups(lengths: Sequence[int], slack: float = 0.25, min_slack: int = 16) -> list[list[int]]:
    """Indices of ``lengths`` (suffix lengths) grouped so that a group's padding is small: sorted by length, a
    group takes the next suffix while ``longest - shortest <= max(min_slack, slack * longest)``."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for index in order:
        if groups:
            shortest = lengths[groups[-1][0]]
            if lengths[index] - shortest <= max(min_slack, slack * lengths[index]):
                groups[-1].append(index)
                continue
        groups.append([index])
    return groups


# ---------------------------------------------------------------------- sampling


SAMPLE_BLOCK = 128
"""Ids per block of the two-level inverse-CDF draw (:func:`_inverse_cdf_sample`)."""


def sample_rows(
    logits_BV: torch.Tensor,
    temperatures: Sequence[float],
    top_ps: Sequence[float],
    top_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Sample one id per row and its logprob.

    Row ``b`` samples from ``softmax(logits[b] / temperatures[b])`` truncated to its top-p nucleus (the smallest set
    of most likely ids whose probability reaches ``top_ps[b]``; Holtzman et al. 2020, arXiv:1904.09751); temperature
    0 takes the argmax. The returned logprob is ``log_softmax(logits / T)`` at the chosen id, of the whole tempered
    distribution (``T = 1`` for greedy rows), as the trainer recomputes it: ``s - m - log(sum(exp(s - m)))`` with
    ``s = logits / T`` and ``m = max(s)``, the sum over blocks of 128 ids in float64. The ``exp(s - m)`` it needs are
    also the weights of the draw, so the ``(B, V)`` scores are read a few times and written once (about 20 ms of the
    decode step at 16 rows of Qwen's 151,936 ids went to separate ``log_softmax``, ``exp`` and float64 ``cumsum``
    passes).

    Args:
        logits_BV: raw logits ``(B, V)``.
        temperatures: ``B`` values ``>= 0``.
        top_ps: ``B`` values in ``(0, 1]``.
        top_k: also return the ``top_k`` largest logprobs and their ids per row.

    Returns:
        ``(ids (B,), logprobs (B,) float32, None or (values (B, k), ids (B, k)))``.
    """
    scores = logits_BV.float()
    if any(t > 0 and t != 1.0 for t in temperatures):
        temps = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=torch.float32, device=scores.device)
        scores = scores / temps.unsqueeze(1)
    top_BV = scores.amax(dim=-1, keepdim=True)
    weights_BV = torch.exp(scores - top_BV)  # unnormalized probabilities, the largest 1
    block_sums = _block_sums(weights_BV)  # (B, V / SAMPLE_BLOCK) float64
    log_z = top_BV + block_sums.sum(dim=-1, keepdim=True).log().float()  # (B, 1): log of the softmax normalizer
    chosen = torch.empty(scores.shape[0], dtype=torch.long, device=scores.device)
    greedy = [b for b, t in enumerate(temperatures) if t <= 0]
    sampled = [b for b, t in enumerate(temperatures) if t > 0]
    if greedy:
        index = torch.tensor(greedy, device=scores.device)
        chosen[index] = scores[index].argmax(dim=-1)
    if sampled:
        everyone = len(sampled) == len(temperatures)
        index = torch.tensor(sampled, device=scores.device)
        weights = weights_BV if everyone else weights_BV[index]
        sums = block_sums if everyone else block_sums[index]
        nucleus = [top_ps[b] for b in sampled]
        if any(p < 1.0 for p in nucleus):
            probs = weights / sums.sum(dim=-1, keepdim=True).float()
            sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
            before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the more likely ids
            limit = torch.tensor(nucleus, dtype=torch.float32, device=scores.device).unsqueeze(1)
            sorted_probs = sorted_probs.masked_fill(before >= limit, 0.0)
            weights = torch.zeros_like(probs).scatter_(1, sorted_ids, sorted_probs)
            sums = _block_sums(weights)
        chosen[index] = _inverse_cdf_sample(weights, sums)
    chosen_logprobs = (scores.gather(1, chosen.unsqueeze(1)) - log_z).squeeze(1)
    top = None
    if top_k > 0:
        values, ids = torch.topk(scores, top_k, dim=-1)
        top = (values - log_z, ids)
    return chosen, chosen_logprobs, top


def _blocks(weights_BV: torch.Tensor) -> torch.Tensor:
    """``weights_BV`` as ``(B, ceil(V / SAMPLE_BLOCK), SAMPLE_BLOCK)``, zero-padded at the end."""
    B, V = weights_BV.shape
    missing = (-V) % SAMPLE_BLOCK
    if missing:
        weights_BV = torch.nn.functional.pad(weights_BV, (0, missing))
    return weights_BV.view(B, -1, SAMPLE_BLOCK)


def _block_sums(weights_BV: torch.Tensor) -> torch.Tensor:
    """Sums of each block of :data:`SAMPLE_BLOCK` ids, ``(B, ceil(V / SAMPLE_BLOCK))`` float64 (each block summed in
    float32: 128 terms, relative error about 1e-6; the blocks' cumulative sums in float64)."""
    return _blocks(weights_BV).sum(dim=-1).double()


def _inverse_cdf_sample(weights_BV: torch.Tensor, block_sums: torch.Tensor) -> torch.Tensor:
    """One id per row drawn with probability proportional to ``weights_BV`` (``>= 0``, rows need not sum to 1), by
    inverse-CDF sampling in two levels: a uniform draw scaled to the row's total is located among the float64
    cumulative sums of the blocks (``block_sums``, from :func:`_block_sums`), then among the float64 cumulative sums
    of the ids of that block. One random number per row, where ``torch.multinomial`` draws one per vocabulary entry
    (81 ms for 16 rows of Qwen's 151,936 ids on 2 cores), and only ``V / 128 + 128`` cumulative sums per row."""
    B, V = weights_BV.shape
    cdf = block_sums.cumsum(dim=-1)  # (B, NB)
    u = torch.rand((B, 1), dtype=torch.float64, device=weights_BV.device) * cdf[:, -1:]
    last_block = (cdf.shape[1] - 1) - (block_sums.flip(1) > 0).int().argmax(dim=1, keepdim=True)
    block = torch.minimum(torch.searchsorted(cdf, u, right=True), last_block)  # (B, 1)
    before = cdf.gather(1, block) - block_sums.gather(1, block)  # mass of the blocks in front
    inside = _blocks(weights_BV).gather(1, block.unsqueeze(2).expand(B, 1, SAMPLE_BLOCK)).squeeze(1)
    inner_cdf = inside.double().cumsum(dim=-1)  # (B, SAMPLE_BLOCK)
    offset = torch.searchsorted(inner_cdf, u - before, right=True).clamp_(max=SAMPLE_BLOCK - 1)
    # a draw that rounding puts past the last nonzero weight takes that id (never a zero-weight one)
    last_nonzero = (SAMPLE_BLOCK - 1) - (inside.flip(1) > 0).int().argmax(dim=1, keepdim=True)
    offset = torch.minimum(offset, last_nonzero)
    return (block * SAMPLE_BLOCK + offset).squeeze(1).clamp_(max=V - 1)


# ---------------------------------------------------------------------- the running batch


@dataclass
class Row:
    """One request in the running batch.

    Attributes:
        owner: the backend's record of the request (opaque here).
        prompt: prompt ids.
        max_tokens: most ids to generate.
        temperature, top_p: sampling settings.
        top_logprobs: alternatives to record per step (0: none).
        stop_ids: ids that end the row (kept in its ids).
        generated: ids sampled so far.
        logprobs: their logprobs.
        top: per step ``(values, ids)`` of the ``top_logprobs`` alternatives.
        cached: ids whose keys and values are in the batch's cache (the prompt, then each id once fed).
        finish_reason: set when the row ends: ``stop``, ``length`` or ``abort``.
    """

    owner: Any
    prompt: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_logprobs: int
    stop_ids: frozenset[int]
    admitted_s: float = field(default_factory=time.monotonic)
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[list[float], list[int]]] = field(default_factory=list)
    cached: int = 0
    cached_prefix: int = 0
    """Prompt ids whose keys and values came from the prefix cache (for the first row of a burst whose shared
    prefix was prefilled on its admission, only what the cache held before)."""
    peak_batch: int = 0
    finish_reason: str | None = None

    def take(self, token_id: int, logprob: float, top: tuple[list[float], list[int]] | None) -> None:
        self.generated.append(token_id)
        self.logprobs.append(logprob)
        if top is not None:
            self.top.append(top)
        if token_id in self.stop_ids:
            self.finish_reason = "stop"
        elif len(self.generated) >= self.max_tokens:
            self.finish_reason = "length"


class RunningBatch:
    """The live rows and their keys/values: one ``(B, H, T, D)`` tensor pair per layer and a ``(B, T)`` mask.

    The keys and values live in per-layer buffers ``(rows capacity, H, columns capacity, D)``; the batch is their
    ``[:B, :, :T]`` corner, every row right-aligned at column ``T``. Nothing is copied to move the batch along: a
    decode step writes column ``T`` in place; a row that ends is replaced by the last row (one row copied); rows that
    join are written below the others when they fit. The buffers are copied into new ones only when the batch
    outgrows them (``DECODE_SPARE_COLUMNS`` columns and ``SPARE_ROWS`` rows are allocated ahead), when a joining
    prompt is longer than ``T``, or when ``TRIM_COLUMNS`` leading columns are no longer attended to.

    All methods run in the backend's worker thread under ``torch.inference_mode()``.

    Args:
        model: the causal LM (a transformers model or a peft model around one).
        device: where inputs go.
        pad_token_id: the id written into padding (never attended to).
        prefix_cache: where finished rows' keys and values are kept.
    """

    def __init__(self, model: Any, device: torch.device, pad_token_id: int, prefix_cache: PrefixCache) -> None:
        self.model = model
        self.device = device
        self.pad_token_id = pad_token_id
        self.prefix_cache = prefix_cache
        self.rows: list[Row] = []
        self._buffers: KV = []
        """Per layer ``(keys, values)`` buffers; the batch's are ``[:B, :, :T]`` of each (:meth:`_views`)."""
        self._columns = 0
        """``T``: the cache columns of the batch."""
        self._mask_BT: torch.Tensor | None = None
        self._cache_kwarg = cache_kwarg(model)
        self.packed_linears = packed_linear.install(model)
        """Linears running with prepacked weights (:mod:`agentbolt.inference.packed_linear`; 0 off a CPU)."""
        self._ragged = _ragged_forward(model)
        self.prefill_tokens = 0
        """Prompt ids prefilled (not found in the prefix cache), since creation."""
        self.padding_tokens = 0
        """Padding ids prefilled alongside them, since creation."""

    def set_model(self, model: Any) -> None:
        """Run ``model`` from now on (between steps, with no live rows)."""
        self.model = model
        self._cache_kwarg = cache_kwarg(model)
        self.packed_linears = packed_linear.install(model)
        self._ragged = _ragged_forward(model)

    @property
    def ragged(self) -> bool:
        """Whether :meth:`advance` runs joining prompts and the running rows in one pass
        (:mod:`agentbolt.inference.ragged_step`); otherwise a join is a prefill of its own before the step."""
        return self._ragged is not None

    def advance(self, joining: list[Row]) -> None:
        """Admit ``joining`` and run one decode step: every running row gets its next id and every joining row its
        first. In one forward pass where the model allows (:attr:`ragged`), else :meth:`admit` then :meth:`step`
        (the caller then checks :meth:`finished` between the two only in the second case)."""
        if self._ragged is None:
            self.admit(joining)
            self.step()
            return
        self._advance_ragged(joining)

    def _forward(self, **kwargs: Any) -> Any:
        with packed_linear.packed_linears():
            return self.model(**kwargs)

    # -------------------------------------------------------------- joining

    def admit(self, rows: list[Row]) -> None:
        """Prefill ``rows`` (prefix cache first), sample each one's first id and add them to the running batch.
        A row whose first id already ends it is added too (it leaves at the next :meth:`finished`)."""
        if not rows:
            return
        pasts = self._cached_pasts(rows)
        suffix_lengths = [len(row.prompt) - n for row, (n, _) in zip(rows, pasts, strict=True)]
        for group in prefill_groups(suffix_lengths):
            self._prefill_group([rows[i] for i in group], [pasts[i] for i in group])
        for row in self.rows:
            row.peak_batch = max(row.peak_batch, len(self.rows))

    def _cached_pasts(self, rows: list[Row]) -> list[tuple[int, KV | None]]:
        """Per row, ``(n, kv)``: the ``n`` first prompt ids found in the prefix cache (at most all but the last: one
        id runs, for the next-id logits) and their keys and values (``(1, H, n, D)`` per layer; None when 0). A burst
        of rows whose shared prefix (16+ ids) is not cached gets it prefilled once first."""
        prompts = [row.prompt for row in rows]
        shared = common_prefix_length(prompts) if self.prefix_cache.max_bytes > 0 else 0
        cached_before: int | None = None  # of the burst's shared prefix, when this admission prefilled it
        if shared >= 16:
            have, _ = self.prefix_cache.lookup(prompts[0][:shared])
            if have < shared - 8:  # prefill the burst's shared prefix once, then every row starts from it
                self._prefill_prefix(prompts[0][:shared])
                cached_before = have
        pasts: list[tuple[int, KV | None]] = []
        for index, row in enumerate(rows):
            n, kv = self.prefix_cache.lookup(row.prompt)
            n = min(n, len(row.prompt) - 1)
            if kv is not None and n > 0:
                kv = [(k[:, :, :n], v[:, :, :n]) for k, v in kv]
            pasts.append((n, kv if n > 0 else None))
            # the first row paid for the shared prefix prefilled just now: only what was cached before counts
            row.cached_prefix = n if cached_before is None or index > 0 else min(n, cached_before)
        return pasts

    def _advance_ragged(self, joining: list[Row]) -> None:
        """:meth:`advance` in one :class:`~agentbolt.inference.ragged_step.RaggedForward` pass: the joining rows'
        cached prefixes are copied into buffer rows after the running ones, right-aligned with them; the pass writes
        every new key and value in place and the batch grows by one column."""
        assert self._ragged is not None
        B, G = len(self.rows), len(joining)
        if B == 0 and G == 0:
            return
        pasts = self._cached_pasts(joining) if joining else []
        T = self._columns if B else 0
        width = max([T] + [len(row.prompt) - 1 for row in joining])  # the new column; each row ends there
        if B == 0:
            template = self._ragged.decoder.embed_tokens.weight
            shape = (G + SPARE_ROWS, self._ragged.kv_heads, width + 1 + DECODE_SPARE_COLUMNS, self._ragged.head_dim)
            self._buffers = [
                (template.new_empty(shape), template.new_empty(shape)) for _ in range(len(self._ragged.decoder.layers))
            ]
            self._columns, self._mask_BT = width, torch.zeros((0, width), dtype=torch.long, device=self.device)
        else:
            rows_capacity, columns_capacity = self._buffers[0][0].shape[0], self._buffers[0][0].shape[2]
            if width > T or rows_capacity < B + G or width + 1 > columns_capacity:
                self._rebuild(
                    max(rows_capacity, B + G + SPARE_ROWS),
                    max(columns_capacity, width + 1 + DECODE_SPARE_COLUMNS),
                    width,
                )
        assert self._mask_BT is not None
        mask = torch.zeros((B + G, width + 1), dtype=self._mask_BT.dtype, device=self.device)
        mask[:B, :width] = self._mask_BT
        mask[:B, width] = 1
        rows_in: list[JoiningRow] = []
        for g, (row, (n, kv)) in enumerate(zip(joining, pasts, strict=True)):
            first = width + 1 - len(row.prompt)
            for layer, (keys, values) in enumerate(self._buffers):
                keys[B + g, :, :first].zero_()  # never attended to (mask 0), but must be finite
                values[B + g, :, :first].zero_()
                if kv is not None:
                    keys[B + g, :, first : first + n].copy_(kv[layer][0][0])
                    values[B + g, :, first : first + n].copy_(kv[layer][1][0])
            mask[B + g, first:] = 1
            rows_in.append(JoiningRow(buffer_row=B + g, past=n, ids=row.prompt[n:]))
            self.prefill_tokens += len(row.prompt) - n
        with packed_linear.packed_linears():
            logits = self._ragged(
                [row.generated[-1] for row in self.rows],
                [row.cached for row in self.rows],
                rows_in,
                self._buffers,
                width,
                mask[:B].bool() if B else None,
            )
        for row in self.rows:
            row.cached += 1
        for row in joining:
            row.cached = len(row.prompt)
        self.rows.extend(joining)
        self._columns, self._mask_BT = width + 1, mask
        self._sample_into(self.rows, logits, only_live=True)
        for row in self.rows:
            row.peak_batch = max(row.peak_batch, len(self.rows))

    def _prefill_prefix(self, tokens: list[int]) -> None:
        kwargs = {"input_ids": torch.tensor([tokens], device=self.device), "use_cache": True, "logits_to_keep": 1}
        out = self._forward(**kwargs)
        cache = output_cache(out)
        self.prefill_tokens += len(tokens)
        self.prefix_cache.insert(tokens, [(k.clone(), v.clone()) for k, v in cache_layers(cache)])

    def _prefill_group(self, rows: list[Row], pasts: list[tuple[int, KV | None]]) -> None:
        G = len(rows)
        past_len = max(n for n, _ in pasts)
        suffixes = [row.prompt[n:] for row, (n, _) in zip(rows, pasts, strict=True)]
        S = max(len(s) for s in suffixes)
        input_ids = torch.full((G, S), self.pad_token_id, dtype=torch.long)
        position_ids = torch.zeros((G, S), dtype=torch.long)
        mask = torch.zeros((G, past_len + S), dtype=torch.long)
        for g, ((n, _), suffix) in enumerate(zip(pasts, suffixes, strict=True)):
            input_ids[g, S - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            position_ids[g, S - len(suffix) :] = torch.arange(n, n + len(suffix))
            mask[g, past_len - n : past_len] = 1
            mask[g, past_len + S - len(suffix) :] = 1
            self.prefill_tokens += len(suffix)
            self.padding_tokens += S - len(suffix)
        cache = as_cache(_stack_pasts(pasts, past_len) if past_len > 0 else [])
        out = self._forward(
            input_ids=input_ids.to(self.device),
            position_ids=position_ids.to(self.device),
            attention_mask=mask.to(self.device),
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        group_kv = cache_layers(output_cache(out))
        for row, (n, _), suffix in zip(rows, pasts, suffixes, strict=True):
            row.cached = n + len(suffix)
        self._sample_into(rows, out.logits[:, -1, :])
        self._join(group_kv, mask.to(self.device), rows)

    def _join(self, kv: KV, mask_GT: torch.Tensor, rows: list[Row]) -> None:
        """Add a prefilled group: ``kv`` per layer ``(G, H, Tg, D)``, ``mask_GT`` ``(G, Tg)``."""
        G, Tg = mask_GT.shape
        B, T = len(self.rows), self._columns
        if B == 0 or self._mask_BT is None:
            self._buffers = [
                (
                    _buffer(k, G + SPARE_ROWS, Tg + DECODE_SPARE_COLUMNS),
                    _buffer(v, G + SPARE_ROWS, Tg + DECODE_SPARE_COLUMNS),
                )
                for k, v in kv
            ]
            self._mask_BT, self._columns, self.rows = mask_GT, Tg, list(rows)
            return
        width = max(T, Tg)
        rows_capacity, columns_capacity = self._buffers[0][0].shape[0], self._buffers[0][0].shape[2]
        if width > T or rows_capacity < B + G or width >= columns_capacity:
            self._rebuild(B + G + SPARE_ROWS, width + DECODE_SPARE_COLUMNS, width)
        for (keys, values), (gk, gv) in zip(self._buffers, kv, strict=True):
            for buffer, group in ((keys, gk), (values, gv)):
                buffer[B : B + G, :, : width - Tg].zero_()  # never attended to (mask 0), but must be finite
                buffer[B : B + G, :, width - Tg : width].copy_(group)
        self._mask_BT = torch.cat([_left_pad_mask(self._mask_BT, width), _left_pad_mask(mask_GT, width)])
        self.rows.extend(rows)

    def _rebuild(self, rows_capacity: int, columns_capacity: int, width: int) -> None:
        """Copy the batch into new buffers, right-aligned at column ``width`` (``>= T``; zeros in front)."""
        B, T = len(self.rows), self._columns
        rebuilt: KV = []
        for keys, values in self._buffers:
            pair = []
            for buffer in (keys, values):
                new = buffer.new_empty((rows_capacity, buffer.shape[1], columns_capacity, buffer.shape[3]))
                new[:B, :, : width - T].zero_()
                new[:B, :, width - T : width].copy_(buffer[:B, :, :T])
                pair.append(new)
            rebuilt.append((pair[0], pair[1]))
        self._buffers, self._columns = rebuilt, width
        if self._mask_BT is not None:
            self._mask_BT = _left_pad_mask(self._mask_BT, width)

    def _views(self) -> KV:
        """The batch's keys and values, per layer ``(B, H, T, D)`` views of the buffers."""
        B, T = len(self.rows), self._columns
        return [(k[:B, :, :T], v[:B, :, :T]) for k, v in self._buffers]

    # -------------------------------------------------------------- stepping

    def step(self) -> None:
        """One decode step: feed every live row its last sampled id, sample the next one."""
        live = [row for row in self.rows if row.finish_reason is None]
        if not live:
            return
        assert self._mask_BT is not None
        B = len(self.rows)
        # The backend calls finished() before every step, so every row here is live.
        input_ids = torch.tensor([[row.generated[-1]] for row in self.rows], dtype=torch.long, device=self.device)
        position_ids = torch.tensor([[row.cached] for row in self.rows], dtype=torch.long, device=self.device)
        mask = torch.cat([self._mask_BT, torch.ones((B, 1), dtype=self._mask_BT.dtype, device=self.device)], dim=1)
        if self._columns >= self._buffers[0][0].shape[2]:
            self._rebuild(self._buffers[0][0].shape[0], self._columns + DECODE_SPARE_COLUMNS, self._columns)
        cache = DynamicCache()
        for keys, values in self._buffers:
            cache.layers.append(AppendLayer(keys, values, B, self._columns))
        out = self._forward(
            input_ids=input_ids,
            position_ids=position_ids,
            # (B, 1, 1, T + 1), used as it is: without padding transformers would drop a 2D mask and run SDPA with
            # enable_gqa, which on a CPU costs ~320 us a layer against ~60 us for its one-query path
            attention_mask=mask.bool()[:, None, None, :],
            use_cache=True,
            **{self._cache_kwarg: cache},
        )
        self._columns += 1
        self._mask_BT = mask
        for row in self.rows:
            row.cached += 1
        self._sample_into(self.rows, out.logits[:, -1, :], only_live=True)
        for row in self.rows:
            row.peak_batch = max(row.peak_batch, B)

    def _sample_into(self, rows: list[Row], logits_BV: torch.Tensor, only_live: bool = False) -> None:
        k = max((row.top_logprobs for row in rows), default=0)
        ids, logprobs, top = sample_rows(logits_BV, [r.temperature for r in rows], [r.top_p for r in rows], k)
        ids_list, logprobs_list = ids.tolist(), logprobs.float().cpu().tolist()
        top_values = top_ids = None
        if top is not None:
            top_values, top_ids = top[0].float().cpu().tolist(), top[1].cpu().tolist()
        for b, row in enumerate(rows):
            if only_live and row.finish_reason is not None:
                continue
            alternatives = None
            if top_values is not None and top_ids is not None and row.top_logprobs > 0:
                alternatives = (top_values[b][: row.top_logprobs], top_ids[b][: row.top_logprobs])
            row.take(int(ids_list[b]), float(logprobs_list[b]), alternatives)

    # -------------------------------------------------------------- leaving

    def finished(self, should_stop: Callable[[Row], str | None]) -> list[Row]:
        """Remove and return the rows that ended: by their own rule (stop id, ``max_tokens``), or because
        ``should_stop(row)`` names a reason (``stop`` for a stop string, ``abort`` for a cancel). Their keys and
        values go to the prefix cache."""
        for row in self.rows:
            if row.finish_reason is None:
                reason = should_stop(row)
                if reason is not None:
                    row.finish_reason = reason
        done = [b for b, row in enumerate(self.rows) if row.finish_reason is not None]
        if not done:
            return []
        assert self._mask_BT is not None
        ended = [self.rows[b] for b in done]
        views = self._views()
        for b in done:
            row = self.rows[b]
            columns = self._mask_BT[b].nonzero().squeeze(1)
            tokens = [*row.prompt, *row.generated][: row.cached]
            if len(columns) == len(tokens):
                self.prefix_cache.insert(
                    tokens, [(k[b : b + 1, :, columns].clone(), v[b : b + 1, :, columns].clone()) for k, v in views]
                )
        T = self._columns
        mask = self._mask_BT
        for b in reversed(done):  # the last row takes the place of an ended one (rows after b ended already)
            last = len(self.rows) - 1
            if b != last:
                for keys, values in self._buffers:
                    keys[b, :, :T].copy_(keys[last, :, :T])
                    values[b, :, :T].copy_(values[last, :, :T])
                mask[b] = mask[last]
                self.rows[b] = self.rows[last]
            self.rows.pop()
            mask = mask[:last]
        if not self.rows:
            self.reset()
            return ended
        self._mask_BT = mask
        first = int(mask.any(dim=0).nonzero()[0, 0])  # leading columns no live row attends to
        if first >= TRIM_COLUMNS:
            self._trim(first)
        return ended

    def _trim(self, first: int) -> None:
        """Drop the first ``first`` columns (no row attends to them) by copying the batch into new buffers."""
        assert self._mask_BT is not None
        B, T = len(self.rows), self._columns
        self._buffers = [
            (
                _buffer(k[:B, :, first:T], k.shape[0], T - first + DECODE_SPARE_COLUMNS),
                _buffer(v[:B, :, first:T], v.shape[0], T - first + DECODE_SPARE_COLUMNS),
            )
            for k, v in self._buffers
        ]
        self._columns = T - first
        self._mask_BT = self._mask_BT[:, first:].contiguous()

    def reset(self) -> None:
        """Drop every row (after a failed step: their state is unknown)."""
        self.rows, self._buffers, self._mask_BT, self._columns = [], [], None, 0

    def cache_tokens(self) -> int:
        """Columns of the running cache (``T``), 0 with no rows."""
        return self._columns if self.rows else 0


# ---------------------------------------------------------------------- helpers


def _ragged_forward(model: Any) -> RaggedForward | None:
    """The one-pass forward for ``model`` when it has a Llama-style decoder, unless ``AGENTBOLT_RAGGED_STEP=0``."""
    if os.environ.get("AGENTBOLT_RAGGED_STEP", "1") == "0" or not supports_ragged(model):
        return None
    return RaggedForward(model)


def supports(model: Any) -> bool:
    """Whether ``model``'s cache is plain full attention in every layer (what :class:`RunningBatch` keeps)."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    try:
        layers = DynamicCache(config=config).layers
    except Exception:
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


DECODE_SPARE_COLUMNS = 64
"""Columns allocated ahead for decode steps (one per step) each time the running cache is copied."""


SPARE_ROWS = 8
"""Rows allocated ahead each time the buffers are copied (rows that join later are written there)."""

TRIM_COLUMNS = 64
"""Leading columns no row attends to any more that make the batch be copied without them."""


def _buffer(t: torch.Tensor, rows_capacity: int, columns_capacity: int) -> torch.Tensor:
    """``t`` ``(B, H, T, D)`` copied into the ``[:B, :, :T]`` corner of a new ``(rows_capacity, H, columns_capacity,
    D)`` tensor (the rest uninitialized)."""
    new = t.new_empty((rows_capacity, t.shape[1], columns_capacity, t.shape[3]))
    new[: t.shape[0], :, : t.shape[2]].copy_(t)
    return new


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t`` ``(B, H, T, D)`` with zero columns in front up to ``width``."""
    missing = width - t.shape[2]
    if missing <= 0:
        return t
    return torch.cat([t.new_zeros((t.shape[0], t.shape[1], missing, t.shape[3])), t], dim=2)


def _left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - mask.shape[1]
    if missing <= 0:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], dim=1)


def _stack_pasts(pasts: list[tuple[int, KV | None]], past_len: int) -> KV:
    """The group's past keys/values, ``(G, H, past_len, D)`` per layer, each row right-aligned."""
    template = next(kv for _, kv in pasts if kv is not None)
    stacked: KV = []
    for layer, (k0, _) in enumerate(template):
        keys, values = [], []
        for _, kv in pasts:
            if kv is None:
                zeros = k0.new_zeros((1, k0.shape[1], past_len, k0.shape[3]))
                keys.append(zeros)
                values.append(zeros)
            else:
                keys.append(_left_pad(kv[layer][0], past_len))
                values.append(_left_pad(kv[layer][1], past_len))
        stacked.append((torch.cat(keys), torch.cat(values)))
    return stacked
