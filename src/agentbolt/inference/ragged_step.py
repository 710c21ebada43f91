"""One forward pass over the running batch's next ids and the prompts joining it, without padding (ragged batching).

A decode step of the running batch reads every weight matrix once for one new id per row; a joining prompt used to
be prefilled by a forward of its own, which reads every weight again: on a CPU, where a decode step of Qwen2.5-0.5B
is mostly that read (54 ms of linears for one row, 69 ms for sixteen), each join stalled the running rows for about
one more step. Here both go through the same matrix products, as in Sarathi-Serve's mixed batches (Agrawal et al.
2024, "Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve", OSDI'24) and vLLM's chunked prefill:
the ``N = B + sum(s_g)`` ids (one per running row, then each joining row's uncached suffix of ``s_g`` ids) are
flattened into one ``(1, N, hidden)`` sequence for the token-wise parts of every layer (norms, projections, rotary
embedding, MLP), and only attention is done per part:

- the running rows' one query each attends to its row of the batch's key/value buffers (a ``(B, 1, 1, W + 1)``
  mask), with the query heads of a key/value head stacked as that head's queries (no key/value copies for grouped
  query attention), as transformers' SDPA path runs a one-id step;
- a joining row's ``s_g`` queries attend to its cached prefix (copied into its buffer row before the pass) and to its
  own earlier suffix ids, one attention call per joining row, in the form transformers uses for the same prompt (a
  causal call without a mask when nothing was cached; keys repeated per query head and a causal mask aligned to the
  end of the keys after a cached prefix), so that a request served alone gets the ids and logprobs a plain
  transformers forward gives, bit for bit where the linears are (native bf16).

The weights are the model's own modules (``embed_tokens``, each layer's ``input_layernorm``, ``q/k/v/o_proj``,
``post_attention_layernorm``, ``mlp``, the final ``norm``, ``lm_head``), called as they are, so LoRA layers, the
backend's prepacked linears and int8 serving apply unchanged; the rotary embedding is the model's ``rotary_emb``.
The layer structure is the Llama one (Llama, Qwen2, SmolLM2, Mistral without a sliding window):
:func:`supports_ragged` checks the model type and the modules, and anything else keeps the transformers forward.
Numerically the ops are transformers' own in the same order (``(q * cos) + (rotate_half(q) * sin)``, residual adds,
norms on rows); what differs is which rows share a matrix product and the attention kernel's blocking, as with any
change of batch.

Shapes: ``B`` running rows, ``G`` joining rows, ``N`` ids in the pass, ``Hq``/``Hkv`` query and key/value heads,
``D`` head dim, ``W`` the column the running rows' new keys go to (the batch is ``W + 1`` columns wide after the
pass), ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

RAGGED_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})
"""``config.model_type`` values whose decoder layer is the Llama one this module runs."""

QUERY_CHUNK = 256
"""A joining row's ids after a cached prefix (or more than this many) attend in chunks of this many, so that their
mask (chunk by the row's columns, bool) stays small for a long prompt: 4 MB for 16k columns, where a 16k-id prompt at
once would need 256 MB."""


@dataclass(frozen=True)
class JoiningRow:
    """A row that joins in this pass.

    Attributes:
        buffer_row: its row in the key/value buffers (``B + g``).
        past: ids of its prompt whose keys and values are already in that buffer row (from the prefix cache), in
            columns ``W + 1 - past - len(ids)`` to ``W + 1 - len(ids)``.
        ids: the ids run in this pass (``len(ids) >= 1``); their keys and values go to the ``len(ids)`` columns
            that end at column ``W``.
    """

    buffer_row: int
    past: int
    ids: Sequence[int]


def _decoder(model: Any) -> tuple[Any, Any]:
    """``(causal LM, its decoder)``: through a peft wrapper to the transformers model, then its ``.model``."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    return lm, getattr(lm, "model", None)


def supports_ragged(model: Any) -> bool:
    """Whether :class:`RaggedForward` can run ``model``: a Llama-style decoder (``config.model_type`` in
    :data:`RAGGED_MODEL_TYPES`, no sliding window, every layer with ``self_attn.q/k/v/o_proj``, the two norms and
    ``mlp``; no per-head query/key norms), an ``lm_head`` and a ``rotary_emb``."""
    lm, decoder = _decoder(model)
    config = getattr(lm, "config", None)
    if config is None or decoder is None or getattr(config, "model_type", None) not in RAGGED_MODEL_TYPES:
        return False
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", window is not None) or "sliding_attention" in (
        getattr(config, "layer_types", None) or ()
    ):
        return False
    if not all(hasattr(decoder, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    if not hasattr(lm, "lm_head"):
        return False
    for layer in decoder.layers:
        attention = getattr(layer, "self_attn", None)
        if attention is None or any(not hasattr(attention, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return False
        if hasattr(attention, "q_norm") or hasattr(attention, "k_norm"):
            return False
        if not all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm", "mlp")):
            return False
    return True


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RaggedForward:
    """The forward pass described in the module docstring, over ``model``'s own modules.

    Args:
        model: a model :func:`supports_ragged` accepts (a transformers causal LM or a peft model around one).

    Raises:
        ValueError: the model is not one :func:`supports_ragged` accepts.
    """

    def __init__(self, model: Any) -> None:
        if not supports_ragged(model):
            raise ValueError("RaggedForward runs Llama-style decoders only (see supports_ragged)")
        self.lm, self.decoder = _decoder(model)
        config = self.lm.config
        self.q_heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.q_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.q_heads
        self.group = self.q_heads // self.kv_heads

    def __call__(
        self,
        decode_ids: Sequence[int],
        decode_positions: Sequence[int],
        joining: Sequence[JoiningRow],
        buffers: Sequence[tuple[torch.Tensor, torch.Tensor]],
        width: int,
        decode_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Run the pass; write every id's keys and values into ``buffers``; return the next-id logits.

        Args:
            decode_ids: the running rows' last sampled ids (``B``, possibly 0); row ``b`` is buffer row ``b``.
            decode_positions: their positions (ids before them in their sequence).
            joining: the rows joining (``G``, possibly 0), with their buffer rows after the running ones.
            buffers: per layer ``(keys, values)``, each ``(rows, Hkv, columns, D)`` with ``columns > width``.
            width: ``W``, the column of the running rows' new keys and values (and of each joining row's last id).
            decode_mask: ``(B, W + 1)`` bool, the columns each running row attends to (its new column included);
                None when ``B == 0``.

        Returns:
            ``(B + G, V)`` logits: the running rows' in order, then each joining row's at its last id.
        """
        B = len(decode_ids)
        device = buffers[0][0].device
        ids = list(decode_ids)
        positions = list(decode_positions)
        spans: list[tuple[int, int]] = []  # per joining row, its ids' offsets in the pass
        for row in joining:
            spans.append((len(ids), len(ids) + len(row.ids)))
            ids.extend(row.ids)
            positions.extend(range(row.past, row.past + len(row.ids)))
        N = len(ids)
        id_tensor = torch.tensor([ids], dtype=torch.long, device=device)
        position_tensor = torch.tensor([positions], dtype=torch.long, device=device)
        hidden = self.decoder.embed_tokens(id_tensor)  # (1, N, hidden)
        cos, sin = self.decoder.rotary_emb(hidden, position_tensor)  # (1, N, D) each
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # (N, 1, D)
        decode_mask_4d = decode_mask[:, None, None, :] if decode_mask is not None and B > 0 else None
        for layer, (keys, values) in zip(self.decoder.layers, buffers, strict=True):
            attention = layer.self_attn
            normed = layer.input_layernorm(hidden)
            q = attention.q_proj(normed).view(N, self.q_heads, self.head_dim)
            k = attention.k_proj(normed).view(N, self.kv_heads, self.head_dim)
            v = attention.v_proj(normed).view(N, self.kv_heads, self.head_dim)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            scale = getattr(attention, "scaling", self.head_dim**-0.5)
            outputs: list[torch.Tensor] = []
            if B > 0:
                keys[:B, :, width].copy_(k[:B])
                values[:B, :, width].copy_(v[:B])
                query = q[:B].view(B, self.kv_heads, self.group, self.head_dim)
                out = F.scaled_dot_product_attention(
                    query, keys[:B, :, : width + 1], values[:B, :, : width + 1], attn_mask=decode_mask_4d, scale=scale
                )
                outputs.append(out.reshape(B, self.q_heads * self.head_dim))
            for row, (start, end) in zip(joining, spans, strict=True):
                s = end - start
                first = width + 1 - row.past - s
                keys[row.buffer_row, :, width + 1 - s : width + 1].copy_(k[start:end].transpose(0, 1))
                values[row.buffer_row, :, width + 1 - s : width + 1].copy_(v[start:end].transpose(0, 1))
                row_keys = keys[row.buffer_row : row.buffer_row + 1, :, first : width + 1]  # (1, Hkv, L, D)
                row_values = values[row.buffer_row : row.buffer_row + 1, :, first : width + 1]
                queries = q[start:end].transpose(0, 1).unsqueeze(0)  # (1, Hq, s, D)
                if row.past == 0 and s <= QUERY_CHUNK:  # as transformers runs a prompt without a cache
                    out = F.scaled_dot_product_attention(
                        queries, row_keys, row_values, is_causal=True, scale=scale, enable_gqa=self.group > 1
                    )
                    outputs.append(out[0].transpose(0, 1).reshape(s, self.q_heads * self.head_dim))
                    continue
                # as transformers runs a prompt after a cached prefix: keys repeated per query head, a causal mask
                row_keys, row_values = _repeat_heads(row_keys, self.group), _repeat_heads(row_values, self.group)
                for offset in range(0, s, QUERY_CHUNK):
                    c = min(QUERY_CHUNK, s - offset)
                    out = F.scaled_dot_product_attention(
                        queries[:, :, offset : offset + c],
                        row_keys,
                        row_values,
                        attn_mask=_causal_mask(c, row.past + offset, row.past + s, device),
                        scale=scale,
                    )
                    outputs.append(out[0].transpose(0, 1).reshape(c, self.q_heads * self.head_dim))
            attended = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
            hidden = hidden + attention.o_proj(attended.unsqueeze(0))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        last = list(range(B)) + [end - 1 for _, end in spans]
        kept = hidden[:, last] if len(last) < N else hidden
        return self.lm.lm_head(self.decoder.norm(kept))[0]


def _repeat_heads(t: torch.Tensor, group: int) -> torch.Tensor:
    """``(1, Hkv, L, D)`` -> ``(1, Hkv * group, L, D)``, each key/value head repeated for its query heads."""
    if group == 1:
        return t
    one, heads, length, dim = t.shape
    return t[:, :, None].expand(one, heads, group, length, dim).reshape(one, heads * group, length, dim)


def _causal_mask(queries: int, before: int, columns: int, device: torch.device) -> torch.Tensor:
    """``(1, 1, queries, columns)`` bool: query ``i`` (the id after ``before + i`` others) sees columns ``<= before +
    i``."""
    return torch.ones((queries, columns), dtype=torch.bool, device=device).tril(diagonal=before)[None, None]
