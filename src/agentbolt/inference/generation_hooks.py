"""Pieces of one ``model.generate`` call of the embedded backend: the logits processor that records sampling
logprobs, the per-row token budget, and the throughput counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import LogitsProcessor, StoppingCriteria


@dataclass
class ThroughputStats:
    """Counters since load (read them for tokens/s reports; they only grow).

    Attributes:
        generated_tokens: response ids returned (after the per-request cut), summed over requests.
        generation_s: wall seconds spent inside ``model.generate``, summed over batches.
        batches: batches run.
        requests: requests answered (successfully) by those batches.
        failed_requests: requests that got a BackendError from the worker.
    """

    generated_tokens: int = 0
    generation_s: float = 0.0
    batches: int = 0
    requests: int = 0
    failed_requests: int = 0

    @property
    def mean_batch_size(self) -> float:
        """Requests per batch (0.0 before the first batch)."""
        return self.requests / self.batches if self.batches else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of generation time (0.0 before the first batch)."""
        return self.generated_tokens / self.generation_s if self.generation_s else 0.0


class SamplingLogprobs(LogitsProcessor):
    """Records ``log_softmax(raw_logits / temperature)`` at each chosen id, one step behind.

    At step t it receives the raw logits ``(B, V)``; the id chosen from them is only known at step t+1 (the last
    column of ``input_ids``) or, for the last step, from the returned sequences (:meth:`finish`).
    """

    def __init__(self, temperature: float) -> None:
        self._temperature = temperature
        self._pending: torch.Tensor | None = None
        self._chosen: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self._pending is not None:
            self._chosen.append(self._pending.gather(1, input_ids[:, -1:]).squeeze(1))
        self._pending = torch.log_softmax(scores.float() / self._temperature, dim=-1)
        return scores

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` logprobs of ``generated`` ``(B, T)``, the ids generate returned after the prompt."""
        steps = generated.shape[1]
        if self._pending is not None and len(self._chosen) < steps:
            self._chosen.append(self._pending.gather(1, generated[:, len(self._chosen)].unsqueeze(1)).squeeze(1))
        self._pending = None
        if not self._chosen:
            return torch.zeros(generated.shape, dtype=torch.float32)
        return torch.stack(self._chosen[:steps], dim=1)


class RowBudget(StoppingCriteria):
    """Stops each row at its own ``max_tokens`` (``(B,)``), so a batch ends when every row is done."""

    def __init__(self, prompt_len: int, max_tokens_B: torch.Tensor) -> None:
        self._prompt_len = prompt_len
        self._max_tokens_B = max_tokens_B

    def __call__(
        self, input_ids: torch.LongTensor, scores: tuple[torch.Tensor] | None, **kwargs: Any
    ) -> torch.BoolTensor:
        done = (input_ids.shape[1] - self._prompt_len) >= self._max_tokens_B
        return done  # type: ignore[return-value]
