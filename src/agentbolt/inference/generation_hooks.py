"""Pieces of one ``model.generate`` call of the embedded backend: the logits processor that records sampling
logprobs, the per-row token budget, per-row cancellation and streaming, and the throughput counters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import LogitsProcessor, StoppingCriteria
from transformers.generation.streamers import BaseStreamer

from agentbolt.inference.base import ThroughputStats as ThroughputStats  # re-exported: it lived here


class SamplingLogprobs(LogitsProcessor):
    """Records ``log_softmax(raw_logits / temperature)`` at each chosen id, one step behind, and with ``top_k > 0``
    the ``top_k`` largest values of that distribution and their ids at each step.

    At step t it receives the raw logits ``(B, V)``; the id chosen from them is only known at step t+1 (the last
    column of ``input_ids``) or, for the last step, from the returned sequences (:meth:`finish`).
    """

    def __init__(self, temperature: float, top_k: int = 0) -> None:
        self._temperature = temperature
        self._top_k = top_k
        self._pending: torch.Tensor | None = None
        self._chosen: list[torch.Tensor] = []
        self._top_values: list[torch.Tensor] = []
        self._top_ids: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self._pending is not None:
            self._chosen.append(self._pending.gather(1, input_ids[:, -1:]).squeeze(1))
        self._pending = torch.log_softmax(scores.float() / self._temperature, dim=-1)
        if self._top_k > 0:
            top = torch.topk(self._pending, self._top_k, dim=-1)
            self._top_values.append(top.values)
            self._top_ids.append(top.indices)
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

    def top(self, steps: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(values (B, T, k), ids (B, T, k))`` of the first ``steps`` steps; ``None`` when ``top_k`` is 0."""
        if self._top_k <= 0 or not self._top_values:
            return None
        return torch.stack(self._top_values[:steps], dim=1), torch.stack(self._top_ids[:steps], dim=1)


class RowPenalties(LogitsProcessor):
    """OpenAI's presence and frequency penalties and logit bias, per row: ``logit[v] -= frequency[row] * count[v]
    + presence[row] * (count[v] > 0)`` then ``logit[v] += bias[row][v]``, ``count`` being how often ``v`` was
    generated so far in the row (the prompt does not count). Applied after :class:`SamplingLogprobs`, so the
    recorded logprobs are those of the model's own distribution, the one the trainer recomputes
    (https://platform.openai.com/docs/advanced-usage#frequency-and-presence-penalties)."""

    def __init__(
        self,
        prompt_len: int,
        presence: list[float],
        frequency: list[float],
        biases: list[dict[int, float] | None],
    ) -> None:
        self._prompt_len = prompt_len
        self._presence = torch.tensor(presence, dtype=torch.float32).unsqueeze(1)
        self._frequency = torch.tensor(frequency, dtype=torch.float32).unsqueeze(1)
        self._biases = biases

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        generated = input_ids[:, self._prompt_len :]
        out = scores.float()
        if generated.shape[1] > 0:
            counts = torch.zeros_like(out)
            counts.scatter_add_(1, generated, torch.ones_like(generated, dtype=out.dtype))
            presence = self._presence.to(out.device)
            frequency = self._frequency.to(out.device)
            out = out - frequency * counts - presence * (counts > 0).to(out.dtype)
        for row, bias in enumerate(self._biases):
            if bias:
                ids = torch.tensor(list(bias), dtype=torch.long, device=out.device)
                values = torch.tensor(list(bias.values()), dtype=out.dtype, device=out.device)
                out[row].index_add_(0, ids, values)
        return out.to(scores.dtype)


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


class RowCancel(StoppingCriteria):
    """Stops the rows whose request was cancelled (``cancelled[row]()`` is true) and remembers, in
    :attr:`stopped_at`, how many ids each had generated when it stopped (those ids are real; later ones are padding).
    """

    def __init__(self, prompt_len: int, cancelled: list[Callable[[], bool]]) -> None:
        self._prompt_len = prompt_len
        self._cancelled = cancelled
        self.stopped_at: list[int | None] = [None] * len(cancelled)

    def __call__(
        self, input_ids: torch.LongTensor, scores: tuple[torch.Tensor] | None, **kwargs: Any
    ) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self._prompt_len
        for row, is_cancelled in enumerate(self._cancelled):
            if self.stopped_at[row] is None and is_cancelled():
                self.stopped_at[row] = generated
        done = [at is not None for at in self.stopped_at]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]


class RowStopStrings(StoppingCriteria):
    """Stops each row once its generated text contains one of its stop strings (``stops[row]``; empty: never).
    Only the tail of the text is decoded at each step (enough tokens to hold the longest stop string), so the cost
    does not grow with the answer. :attr:`stopped_at` holds how many ids each row had generated when it stopped
    (the id that completed the stop string included)."""

    def __init__(self, decode: Callable[[list[int]], str], prompt_len: int, stops: list[tuple[str, ...]]) -> None:
        self._decode = decode
        self._prompt_len = prompt_len
        self._stops = stops
        # a token is at least one byte; a few more ids cover a character split over ids
        self._tail = [max((len(s.encode()) for s in row), default=0) + 4 for row in stops]
        self.stopped_at: list[int | None] = [None] * len(stops)

    def __call__(
        self, input_ids: torch.LongTensor, scores: tuple[torch.Tensor] | None, **kwargs: Any
    ) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self._prompt_len
        for row, stops in enumerate(self._stops):
            if not stops or self.stopped_at[row] is not None or generated <= 0:
                continue
            start = max(self._prompt_len, input_ids.shape[1] - self._tail[row])
            tail = self._decode(input_ids[row, start:].tolist())
            if any(stop in tail for stop in stops):
                self.stopped_at[row] = generated
        done = [at is not None for at in self.stopped_at]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]


class RowStreamer(BaseStreamer):
    """A ``generate`` streamer that hands each streaming row's new id to ``sinks[row]`` (from the generation
    thread) as soon as it is sampled, until the row ends: on a stop id (which is handed over too), at
    ``max_tokens[row]`` ids, when ``cancelled[row]()``, or once ``ended(row)`` (a stopping criterion ended it at the
    previous step: what ``generate`` puts for it now is padding). Rows whose sink is ``None`` are not streamed.

    ``generate`` first puts the prompt ids ``(B, L)``, then one ``(B,)`` tensor of new ids per step.
    """

    def __init__(
        self,
        sinks: list[Callable[[int], None] | None],
        stop_ids: set[int],
        max_tokens: list[int],
        cancelled: list[Callable[[], bool]],
        ended: Callable[[int], bool] | None = None,
    ) -> None:
        self._ended = ended
        self._sinks = sinks
        self._stop_ids = stop_ids
        self._max_tokens = max_tokens
        self._cancelled = cancelled
        self._counts = [0] * len(sinks)
        self._live = [sink is not None for sink in sinks]
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        for row, token_id in enumerate(value.reshape(-1).tolist()):
            sink = self._sinks[row]
            if not self._live[row] or sink is None:
                continue
            if self._cancelled[row]() or (self._ended is not None and self._ended(row)):
                self._live[row] = False
                continue
            self._counts[row] += 1
            sink(int(token_id))
            if token_id in self._stop_ids or self._counts[row] >= self._max_tokens[row]:
                self._live[row] = False

    def end(self) -> None:
        return None
