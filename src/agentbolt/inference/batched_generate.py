"""One ``model.generate`` call over a batch of requests: the embedded backend's path for what its running batch
(:mod:`agentbolt.inference.continuous`) does not take: constrained answers (a grammar), penalties or ``logit_bias``,
a ``seed``, a model :func:`~agentbolt.inference.continuous.supports` refuses, or ``continuous_batching=False``.

The requests share their sampling settings (temperature, top_p); they are left-padded to the longest prompt, and each
row is cut at its first stop id, its own ``max_tokens``, its first stop string or its cancel. Every setting that
changes the distribution is explicit, so the model's ``generation_config.json`` (``repetition_penalty``, ``top_k``...)
cannot change what the recorded logprobs describe. Per-row rules run as transformers logits processors and stopping
criteria (:mod:`agentbolt.inference.generation_hooks`; grammars from :mod:`agentbolt.inference.constrained`).

Sampling logprobs: ``log_softmax(logits.float() / temperature)`` (temperature 1 when greedy) of the raw logits at each
generated id, recorded step by step (:class:`~agentbolt.inference.generation_hooks.SamplingLogprobs`), so memory stays
``(B, V)`` rather than ``output_logits``' ``(T, B, V)``.

Imports torch and transformers: training side only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedTokenizerBase, StoppingCriteriaList

from agentbolt.inference import packed_linear
from agentbolt.inference.base import FinishReason, GenerationRequest
from agentbolt.inference.generation_hooks import (
    RowBudget,
    RowCancel,
    RowPenalties,
    RowStopStrings,
    RowStreamer,
    SamplingLogprobs,
)


class BatchRequest(Protocol):
    """What :func:`generate_batch` reads of one queued request (the embedded backend's pending request)."""

    request: GenerationRequest
    prompt_token_ids: list[int]
    on_token: Callable[[int], None] | None
    """Streaming rows: called with each new id as it is sampled (``None``: not streamed)."""
    grammar: str | None
    """The llguidance grammar the answer must match, or ``None``."""

    def is_cancelled(self) -> bool: ...


@dataclass(frozen=True)
class GeneratedRow:
    """One row's answer.

    Attributes:
        ids: ``(R,)`` generated ids, cut (a final stop id kept).
        finish_reason: ``stop`` (stop id or stop string), ``length`` or ``abort`` (cancelled).
        logprobs_T: ``(T,)`` float32 sampling logprobs of the row's generated ids, ``T >= R`` (padding after ``R``).
        top_TK: ``((T, k), (T, k))`` the top alternatives' logprobs and ids, or ``None`` when no row asked for them.
    """

    ids: list[int]
    finish_reason: FinishReason
    logprobs_T: torch.Tensor
    top_TK: tuple[torch.Tensor, torch.Tensor] | None


@dataclass(frozen=True)
class GeneratedBatch:
    """:func:`generate_batch`'s answer: one :class:`GeneratedRow` per request, in order, and when it ran
    (``time.monotonic()`` seconds at the start, and the wall seconds ``generate`` took, the device waited for)."""

    rows: list[GeneratedRow]
    started_s: float
    elapsed_s: float


def generate_batch(
    model: Any,
    batch: Sequence[BatchRequest],
    *,
    device: torch.device,
    pad_token_id: int,
    stop_token_ids: Sequence[int],
    decode: Callable[[list[int]], str],
    tokenizer: PreTrainedTokenizerBase,
) -> GeneratedBatch:
    """Run one ``model.generate`` over ``batch`` (left-padded, ``B`` rows) under ``torch.inference_mode()``.

    Args:
        model: the causal LM (a transformers model or a peft model around one); put in eval mode for the call and
            back in train mode after when it was training.
        batch: the requests, sharing temperature and top_p (the first row's are used); seeded by the first row's
            ``seed`` when it has one.
        device: where the inputs go.
        pad_token_id: the id written into left padding (masked out).
        stop_token_ids: ids that end a row (kept in its ids).
        decode: ids -> text, for stop strings.
        tokenizer: for the grammars of constrained rows.

    Raises:
        Whatever the model raises (the caller fails the whole batch).
    """
    prompts = [p.prompt_token_ids for p in batch]
    prompt_len = max(len(ids) for ids in prompts)
    input_ids_BL = torch.full((len(batch), prompt_len), pad_token_id, dtype=torch.long)
    attention_mask_BL = torch.zeros((len(batch), prompt_len), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids_BL[row, prompt_len - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention_mask_BL[row, prompt_len - len(ids) :] = 1
    requests = [p.request for p in batch]
    max_tokens_B = torch.tensor([r.max_tokens for r in requests], dtype=torch.long)
    first = requests[0]
    greedy = first.temperature <= 0
    temperature = 1.0 if greedy else first.temperature
    sampling: dict[str, Any] = {} if greedy else {"temperature": temperature, "top_p": first.top_p, "top_k": 0}
    generation_config = GenerationConfig(
        max_new_tokens=int(max_tokens_B.max()),
        do_sample=not greedy,
        repetition_penalty=1.0,
        eos_token_id=list(stop_token_ids),
        pad_token_id=pad_token_id,
        return_dict_in_generate=True,
        **sampling,
    )
    recorder = SamplingLogprobs(temperature, max((r.top_logprobs for r in requests if r.logprobs), default=0))
    processors: list[Any] = [recorder]
    if any(r.penalized for r in requests):
        processors.append(
            RowPenalties(
                prompt_len,
                [r.presence_penalty for r in requests],
                [r.frequency_penalty for r in requests],
                [r.logit_bias for r in requests],
            )
        )
    if any(p.grammar is not None for p in batch):
        from agentbolt.inference.constrained import RowGrammars, tokenizer_info

        grammars = [p.grammar for p in batch]
        processors.append(RowGrammars(tokenizer_info(tokenizer), grammars, prompt_len, list(stop_token_ids)))
    criteria: list[Any] = [RowBudget(prompt_len, max_tokens_B.to(device))]
    row_stops: RowStopStrings | None = None
    if any(r.stop or r.stop_inclusive for r in requests):
        row_stops = RowStopStrings(decode, prompt_len, [(*r.stop, *r.stop_inclusive) for r in requests])
        criteria.append(row_stops)
    row_cancel: RowCancel | None = None
    streamer: RowStreamer | None = None
    if any(p.on_token is not None for p in batch):
        row_cancel = RowCancel(prompt_len, [p.is_cancelled for p in batch])
        criteria.append(row_cancel)
        stops = row_stops
        streamer = RowStreamer(
            [p.on_token for p in batch],
            set(stop_token_ids),
            [r.max_tokens for r in requests],
            [p.is_cancelled for p in batch],
            ended=None if stops is None else (lambda row: stops.stopped_at[row] is not None),
        )
    was_training = bool(getattr(model, "training", False))
    if first.seed is not None:
        torch.manual_seed(first.seed)
    started_s = time.monotonic()
    try:
        model.eval()
        with torch.inference_mode(), packed_linear.packed_linears():
            output = model.generate(
                input_ids=input_ids_BL.to(device),
                attention_mask=attention_mask_BL.to(device),
                generation_config=generation_config,
                logits_processor=LogitsProcessorList(processors),
                stopping_criteria=StoppingCriteriaList(criteria),
                streamer=streamer,
            )
            generated_BT = output.sequences[:, prompt_len:]
            # .cpu() waits for the device, so elapsed_s below covers all of the batch's kernels
            logprobs_BT = recorder.finish(generated_BT).cpu()
            top = recorder.top(generated_BT.shape[1])
            top_BTK = None if top is None else (top[0].cpu(), top[1].cpu())
            generated_BT = generated_BT.cpu()
    finally:
        if was_training:
            model.train()
    elapsed_s = time.monotonic() - started_s

    rows: list[GeneratedRow] = []
    stop_ids = set(stop_token_ids)
    for row, request in enumerate(requests):
        limit = request.max_tokens
        cancelled_at = row_cancel.stopped_at[row] if row_cancel is not None else None
        stopped_at = row_stops.stopped_at[row] if row_stops is not None else None
        for at in (cancelled_at, stopped_at):
            if at is not None:
                limit = min(limit, at)
        ids = generated_BT[row].tolist()[:limit]
        finish_reason: FinishReason = "length"
        if stopped_at is not None and stopped_at <= limit:
            finish_reason = "stop"
        elif cancelled_at is not None and cancelled_at < request.max_tokens:
            finish_reason = "abort"
        for index, token_id in enumerate(ids):
            if token_id in stop_ids:
                ids = ids[: index + 1]
                finish_reason = "stop"
                break
        top_TK = None if top_BTK is None else (top_BTK[0][row], top_BTK[1][row])
        rows.append(GeneratedRow(ids, finish_reason, logprobs_BT[row], top_TK))
    return GeneratedBatch(rows, started_s, elapsed_s)
