"""The embedded inference backend: transformers on the CPU (or one CUDA GPU), batched, with exact token ids.

Imports torch and transformers at module level, so only the training side imports this module, lazily (the agent
side never does; STYLE.md section 1).

How a call goes: :meth:`EmbeddedBackend.generate` renders the chat template once into prompt token ids (in the
caller's event loop, so a prompt that does not fit fails at once with ConfigError), queues the request and awaits
its future. ONE worker thread runs the model, under ``torch.inference_mode()``, and resolves each future through
``loop.call_soon_threadsafe``. Plain sampling requests join its running batch between decode steps and leave when
they end (continuous batching and a prefix cache: :mod:`agentbolt.inference.continuous`); the others (a grammar,
penalties or ``logit_bias``, a ``seed``) run as one ``model.generate`` over up to ``max_batch_size`` queued requests
that share sampling settings (:mod:`agentbolt.inference.batched_generate`).

Streaming (:meth:`EmbeddedBackend.stream`): true token-by-token. Each streaming row's new id goes to its event loop as
soon as it is sampled; the stream decodes ids incrementally into text deltas (a delta is held back while it ends
inside a multi-byte character). :meth:`_EmbeddedStream.cancel` stops that row at its next step; the result then
holds the ids generated until then, with ``finish_reason="abort"``. Other rows of the batch are not affected.

Sampling logprobs: for each generated id, ``log_softmax(logits.float() / temperature)`` (temperature 1 when greedy)
of the raw model logits, gathered at the id, recorded step by step. top_p truncation is not folded in: the logprob
is the one of the tempered full distribution, as in vLLM's default.

Training updates: the trainer updates ``backend.model`` in place (or swaps in a peft model with :meth:`set_model`)
inside ``with backend.paused():`` / ``async with backend.paused():``, which waits for the running batch and keeps
new ones from starting, then bumps :meth:`set_model_version`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from agentbolt.errors import BackendError, ConfigError
from agentbolt.inference import int8_linear, packed_linear
from agentbolt.inference.base import (
    ContextLengthExceededError,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    RequestRefused,
)
from agentbolt.inference.batched_generate import generate_batch
from agentbolt.inference.continuous import Row, RunningBatch
from agentbolt.inference.continuous import supports as supports_continuous
from agentbolt.inference.generation_hooks import ThroughputStats
from agentbolt.inference.kv_cache import PrefixCache
from agentbolt.inference.model_files import MARKER_FILE, MODEL_SPECS, prepare_model
from agentbolt.inference.openmp_threads import release_openmp_threads
from agentbolt.inference.prompt_encoding import PromptEncoder, check_sampling, entries_within
from agentbolt.inference.stop_text import StopTextFilter, cut_at_stop

logger = logging.getLogger(__name__)

DEFAULT_PREFIX_CACHE_BYTES = 512 * 1024 * 1024
"""Keys and values the prefix cache keeps by default (about 40k tokens of Qwen2.5-0.5B, 22k of SmolLM2-135M)."""


@dataclass
class _Pending:
    """A queued request and where its answer goes."""

    request: GenerationRequest
    prompt_token_ids: list[int]
    future: asyncio.Future[GenerationResult]
    loop: asyncio.AbstractEventLoop
    enqueued_s: float = field(default_factory=time.monotonic)
    on_token: Callable[[int], None] | None = None
    """Streaming requests: called from the worker thread with each new id, as it is sampled (``model.generate``)."""
    deliver: Callable[[int], None] | None = None
    """Streaming requests in the running batch: called in the event loop with each new id; the ids of one decode step
    go to the loop in one ``call_soon_threadsafe`` (one wake-up of the loop per step, not per row)."""
    cancel_requested: bool = False
    """Set (from the event loop) to stop generating this row; read by the worker thread."""
    grammar: str | None = None
    """The llguidance grammar the answer must match (constrained decoding), or ``None``."""

    def is_cancelled(self) -> bool:
        return self.cancel_requested

    @property
    def batch_key(self) -> tuple[float, float]:
        return (self.request.temperature, self.request.top_p)


class _PauseGuard:
    """What :meth:`EmbeddedBackend.paused` returns: usable with ``with`` and with ``async with``."""

    def __init__(self, backend: EmbeddedBackend) -> None:
        self._backend = backend

    def __enter__(self) -> EmbeddedBackend:
        self._backend._pause_acquire()
        return self._backend

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None):
        self._backend._pause_release()

    async def __aenter__(self) -> EmbeddedBackend:
        waiting = asyncio.ensure_future(asyncio.to_thread(self._backend._pause_acquire))
        try:
            await asyncio.shield(waiting)
        except asyncio.CancelledError:
            # The thread cannot be stopped; undo the pause once it has been taken.
            waiting.add_done_callback(lambda _: self._backend._pause_release())
            raise
        return self._backend

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._backend._pause_release()


class EmbeddedBackend:
    """An :class:`~agentbolt.inference.base.InferenceBackend` running a transformers model in this process.

    Build it with :meth:`load`. Attributes the trainer uses:

    Attributes:
        model: the model ``generate`` runs; a peft model after :meth:`set_model`.
        tokenizer: its tokenizer (owns the chat template).
        model_name: the served name (the gateway maps any requested name to it).
        model_version: weights version stamped on every result, ``base`` until :meth:`set_model_version`.
        device: where the model runs.
        max_context_tokens: the model's maximum positions; prompt + ``max_tokens`` must fit.
        stop_token_ids: ids that end a response (kept in the response ids).
        stats: :class:`ThroughputStats`.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model_name: str,
        device: torch.device | str | None = None,
        max_batch_size: int = 16,
        batch_wait_s: float = 0.02,
        num_threads: int | None = None,
        continuous_batching: bool = True,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
        quantization: str = "none",
    ) -> None:
        """Serve an already loaded ``model`` (most callers want :meth:`load`). Starts the worker thread.

        ``device`` is where inputs are sent; ``None`` (the default) means the device of the model's first parameter,
        so a model already moved to ``cuda`` is served there. ``continuous_batching`` (default on) serves plain
        sampling requests with :mod:`agentbolt.inference.continuous` (rows join and leave the running batch at every
        step; prompts start from their longest cached prefix, ``prefix_cache_bytes`` of keys and values kept; 0
        turns the prefix cache off); off, every request goes through ``model.generate`` batches. ``quantization``
        ``int8`` serves the attention's and the MLP's gate/up linears and the output projection in int8 with
        SmoothQuant scales calibrated on the first served rows (:mod:`agentbolt.inference.int8_linear`: faster on a
        CPU without native bf16, and logprobs farther from the trainer's); ``none`` serves the weights as they are.

        Raises:
            ConfigError: ``max_batch_size < 1``, ``batch_wait_s < 0``, an unknown ``quantization``, or ``int8`` where
                it cannot run (not a CPU, or a torch without a quantized engine).
        """
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_wait_s < 0:
            raise ConfigError(f"batch_wait_s must be >= 0, got {batch_wait_s}")
        if quantization not in ("none", "int8"):
            raise ConfigError(f"quantization must be 'none' or 'int8', got {quantization!r}")
        self.model: Any = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.model_version = "base"
        self.device = torch.device(device) if device is not None else _model_device(model)
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.num_threads = num_threads or os.cpu_count() or 1
        self.max_context_tokens = _max_positions(model, tokenizer)
        configured_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.encoder = PromptEncoder(tokenizer, eos_token_ids=configured_eos)
        """Chat template, stop ids, decoding and logprob entries (:mod:`agentbolt.inference.prompt_encoding`)."""
        self.stop_token_ids = self.encoder.stop_token_ids
        pad_token_id = tokenizer.pad_token_id
        self.pad_token_id = pad_token_id if isinstance(pad_token_id, int) else self.stop_token_ids[0]
        self.stats = ThroughputStats()
        self.transcripts = self.encoder.transcripts
        """Recent generations' prompt + response, reused by :meth:`encode_prompt`."""
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        """Keys and values of recent sequences (:mod:`agentbolt.inference.continuous`); emptied when the weights
        change."""
        self._continuous_batching = continuous_batching
        self.admit_group = 4
        """With rows running and joins that prefill on their own (no one-pass step), queued requests join together
        once this many wait (see :meth:`_admit_now`)."""
        self.admit_wait_s = 0.25
        """... or once the oldest has waited this long (seconds)."""
        self._engine_ok = continuous_batching and supports_continuous(model)
        self._batch = RunningBatch(model, self.device, self.pad_token_id, self.prefix_cache)
        self.quantization = quantization
        self.int8_linears = 0
        """Linears served in int8 (``quantization`` ``int8``; each runs float32 until it has calibrated)."""
        if quantization == "int8":
            if not int8_linear.available(self.device) or not self._batch.packed_linears:
                raise ConfigError(
                    f"quantization int8 runs on a CPU with PyTorch's quantized engine (x86/fbgemm) and oneDNN; "
                    f"this backend serves on {self.device}: set inference.quantization to none"
                )
            self.int8_linears = int8_linear.mark(model)
        self._prefix_stale = False

        self._queue: collections.deque[_Pending] = collections.deque()
        self._cond = threading.Condition()
        self._pause_count = 0
        self._busy = False
        self._last_batch_end_s = 0.0
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="agentbolt-embedded-generate", daemon=True)
        self._worker.start()

    @classmethod
    def load(
        cls,
        name_or_path: str | Path,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        max_batch_size: int = 16,
        batch_wait_s: float = 0.02,
        num_threads: int | None = None,
        cache_dir: Path | str | None = None,
        model_name: str | None = None,
        continuous_batching: bool = True,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
        quantization: str = "none",
    ) -> EmbeddedBackend:
        """Load a model and start serving it.

        Args:
            name_or_path: an embedded model name (a key of ``MODEL_SPECS``, prepared on first use with
                :func:`~agentbolt.inference.model_files.prepare_model`) or a Hugging Face model directory.
            device: ``cpu``, ``cuda`` or ``cuda:N``. On CUDA the weights are loaded on the host, then moved; the
                generation timings in :attr:`stats` include the device synchronization (results are copied back to
                the host before the clock stops).
            dtype: weights dtype (bf16 by default; the embedded models are converted to bf16; a CUDA GPU older than
                Ampere gets a warning, as it has no native bf16).
            max_batch_size: most requests per ``generate`` call.
            batch_wait_s: how long the worker waits, after the oldest queued request arrived, for more requests
                to fill a batch.
            num_threads: torch intra-op threads (``torch.set_num_threads``); default ``os.cpu_count()``.
            cache_dir: where embedded models are prepared (see ``prepare_model``).
            model_name: the served name; default the embedded model's name (also for a directory made by
                ``prepare_model``), else the directory's name.
            continuous_batching, prefix_cache_bytes, quantization: see :class:`EmbeddedBackend`.

        Raises:
            ConfigError: unknown model name, or a device that is not available.
            BackendError: the model files are missing or corrupt, or loading failed.
        """
        torch.set_num_threads(num_threads or os.cpu_count() or 1)
        if str(device).startswith("cuda"):
            if not torch.cuda.is_available():
                raise ConfigError(f"device {device!r} was asked for but CUDA is not available; use device='cpu'")
            if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
                logger.warning(
                    "%s has no native bf16 (pre-Ampere); bf16 runs emulated and slow, pass dtype=float16", device
                )
        name = str(name_or_path)
        if name in MODEL_SPECS:
            path = prepare_model(name, cache_dir)
        else:
            path = Path(name).expanduser()
            if not path.is_dir():
                raise ConfigError(
                    f"{name!r} is neither an embedded model ({', '.join(sorted(MODEL_SPECS))}) nor a model directory"
                )
        started_s = time.monotonic()
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        except Exception as exc:
            raise BackendError(f"loading the model from {path} failed: {exc!r}") from exc
        model.to(device)  # type: ignore[arg-type]
        model.eval()
        logger.info("loaded %s on %s in %.1f s", path, device, time.monotonic() - started_s)
        return cls(
            model,
            tokenizer,
            model_name=model_name or _served_name(name, path),
            device=device,
            max_batch_size=max_batch_size,
            batch_wait_s=batch_wait_s,
            num_threads=num_threads,
            continuous_batching=continuous_batching,
            prefix_cache_bytes=prefix_cache_bytes,
            quantization=quantization,
        )

    # ------------------------------------------------------------------ training hooks

    def paused(self) -> _PauseGuard:
        """A guard (``with`` or ``async with``) during which no batch runs: entering waits for the running batch
        to finish; queued requests wait until the last guard exits. Re-entrant. Prefer ``async with`` inside an
        event loop (the plain ``with`` blocks the calling thread for up to one batch)."""
        return _PauseGuard(self)

    def set_model(self, model: Any, version: str | None = None) -> None:
        """Generate with ``model`` from now on (e.g. ``peft.get_peft_model(backend.model, lora_config)``, which
        wraps the same weights). Waits for the running batch. ``version``, when given, becomes ``model_version``."""
        with self.paused():
            if self.quantization == "int8":  # a peft model wraps the same linears: theirs become base layers
                int8_linear.unmark(self.model)
            self.model = model
            self._engine_ok = self._continuous_batching and supports_continuous(model)
            if self.quantization == "int8":
                self.int8_linears = int8_linear.mark(model)
            self._prefix_stale = True
            if version is not None:
                self.model_version = version

    def set_model_version(self, version: str) -> None:
        """Stamp results from now on with ``version`` (call it after updating the weights, under ``paused()``).
        The prefix cache is emptied before the next request runs."""
        self.model_version = version
        self._prefix_stale = True

    # ------------------------------------------------------------------ the Protocol

    def encode_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """The exact prompt ids for ``messages`` (:meth:`PromptEncoder.encode_prompt
        <agentbolt.inference.prompt_encoding.PromptEncoder.encode_prompt>`).

        Raises:
            ConfigError: the template rejects the messages.
        """
        return self.encoder.encode_prompt(messages, tools, chat_template_kwargs)

    def _vocab_size(self) -> int:
        """Ids the tokenizer can produce (added tokens included); the model's vocabulary when the tokenizer cannot
        say."""
        try:
            return len(self.tokenizer)
        except TypeError:
            return int(getattr(self.model.config, "vocab_size", 0) or getattr(self.tokenizer, "vocab_size", 0))

    def encode_text(self, prompt: str | list[int]) -> list[int]:
        """The ids of a raw prompt (:meth:`PromptEncoder.encode_text
        <agentbolt.inference.prompt_encoding.PromptEncoder.encode_text>`).

        Raises:
            ConfigError: an empty prompt, or an id outside the vocabulary.
        """
        return self.encoder.encode_text(prompt)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate one completion; concurrent calls are batched.

        Raises:
            ContextLengthExceededError: prompt + ``max_tokens`` exceeds ``max_context_tokens``.
            ConfigError: bad sampling values, or the chat template rejects the messages.
            BackendError: the backend is closed or generation failed.
        """
        pending = self._submit(request, grammar=await self._answer_grammar(request))
        return await pending.future

    async def stream(self, request: GenerationRequest) -> _EmbeddedStream:
        """Start one completion and stream it token by token (see the module docstring); it is batched with
        concurrent requests like :meth:`generate`.

        Raises:
            ContextLengthExceededError, ConfigError, BackendError: as :meth:`generate`, before anything is generated.
        """
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue[int | None] = asyncio.Queue()

        def on_token(token_id: int) -> None:  # worker thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
                loop.call_soon_threadsafe(tokens.put_nowait, token_id)

        pending = self._submit(request, on_token, await self._answer_grammar(request), deliver=tokens.put_nowait)
        # Runs in the loop after every token callback scheduled before the future was settled: the end marker.
        pending.future.add_done_callback(lambda _: tokens.put_nowait(None))
        return _EmbeddedStream(self, pending, tokens)

    async def _answer_grammar(self, request: GenerationRequest) -> str | None:
        """The grammar of a constrained request (:func:`~agentbolt.inference.constrained.answer_grammar`), or
        ``None``. The llguidance tokenizer is built once, off the event loop (0.7-2.8 s).

        Raises:
            RequestRefused: a schema or tool choice that cannot be compiled (names the field).
        """
        if request.output_format is None and request.tool_choice.mode not in ("required", "function"):
            return None
        from agentbolt.inference.constrained import answer_grammar, tokenizer_info  # llguidance: only when asked

        info = await asyncio.to_thread(tokenizer_info, self.tokenizer)
        return answer_grammar(
            request.output_format, request.tool_choice, request.tools, request.parallel_tool_calls, tokenizer=info
        )

    def _submit(
        self,
        request: GenerationRequest,
        on_token: Callable[[int], None] | None = None,
        grammar: str | None = None,
        deliver: Callable[[int], None] | None = None,
    ) -> _Pending:
        """Check and encode ``request`` (in the caller's loop), then queue it for the worker."""
        check_sampling(request)
        if request.logit_bias:
            vocab = self._vocab_size()
            outside = [token_id for token_id in request.logit_bias if not 0 <= token_id < vocab]
            if outside:
                raise RequestRefused(
                    f"logit_bias token id {outside[0]} is outside the vocabulary (0..{vocab - 1})", "logit_bias"
                )
        prompt_token_ids = self.encoder.request_ids(request)
        if len(prompt_token_ids) + request.max_tokens > self.max_context_tokens:
            raise ContextLengthExceededError(
                f"the prompt has {len(prompt_token_ids)} tokens and max_tokens is {request.max_tokens}: together "
                f"more than the model's context of {self.max_context_tokens} tokens; shorten the conversation "
                "or lower max_tokens"
            )
        loop = asyncio.get_running_loop()
        pending = _Pending(
            request, prompt_token_ids, loop.create_future(), loop, on_token=on_token, grammar=grammar, deliver=deliver
        )
        with self._cond:
            if self._closed:
                raise BackendError("the embedded backend is closed")
            self._queue.append(pending)
            self._cond.notify_all()
        return pending

    async def close(self) -> None:
        """Stop the worker: queued requests and the running batch's rows get BackendError at once (a
        ``model.generate`` batch already started is waited for). Idempotent."""
        with self._cond:
            self._closed = True
            dropped = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for pending in dropped:
            _resolve(pending, BackendError("the embedded backend was closed before this request ran"))
        await asyncio.to_thread(self._worker.join)

    # ------------------------------------------------------------------ worker

    def _pause_acquire(self) -> None:
        with self._cond:
            self._pause_count += 1
            while self._busy:
                self._cond.wait()
            self._prefix_stale = True  # the weights may change in place while paused

    def _pause_release(self) -> None:
        with self._cond:
            self._pause_count -= 1
            self._cond.notify_all()

    def _fast_path(self, pending: _Pending) -> bool:
        """Whether the continuous-batching engine takes ``pending`` (see :mod:`agentbolt.inference.continuous`)."""
        request = pending.request
        return self._engine_ok and pending.grammar is None and not request.penalized and request.seed is None

    def _run(self) -> None:
        torch.set_num_threads(self.num_threads)
        while True:
            work = self._next_work()
            if work is None:
                return
            kind, taken = work
            try:
                if kind == "generate":
                    self._run_generate(taken)
                elif kind == "close":
                    self._end_running_rows()
                else:
                    self._run_engine(taken)
            finally:
                with self._cond:
                    self._busy = bool(self._batch.rows)
                    self._last_batch_end_s = time.monotonic()
                    idle = not self._busy and not self._queue
                    self._cond.notify_all()
            if idle:  # nothing to run: this thread's OpenMP workers must not slow another thread's (an update's)
                release_openmp_threads()

    def _next_work(self) -> tuple[str, list[_Pending]] | None:
        """Block until there is work; take it. ``("engine", admitted)`` runs one step of the running batch after
        admitting ``admitted`` (possibly none); ``("generate", batch)`` runs one ``model.generate``. None once closed
        with nothing running."""
        with self._cond:
            while True:
                running = bool(self._batch.rows)
                while not running and not self._closed and (self._pause_count > 0 or not self._queue):
                    self._cond.wait()
                if self._closed:
                    if running:
                        self._busy = True
                        return "close", []
                    return None
                if self._pause_count > 0:
                    if running:  # drain: no new rows while a pause waits
                        self._busy = True
                        return "engine", []
                    continue
                if not running:
                    # Wait batch_wait_s from the later of the oldest arrival and the end of the previous batch: the
                    # clients that batch just answered send their next turn a few ms later, and should ride along.
                    deadline_s = max(self._queue[0].enqueued_s, self._last_batch_end_s) + self.batch_wait_s
                    while len(self._queue) < self.max_batch_size and not self._closed:
                        remaining_s = deadline_s - time.monotonic()
                        if remaining_s <= 0:
                            break
                        self._cond.wait(remaining_s)
                    if self._closed or self._pause_count > 0:
                        continue
                self._drop_cancelled()
                legacy_waiting = any(not self._fast_path(p) for p in self._queue)
                if legacy_waiting and not running:
                    batch = self._take_batch()
                    if batch:
                        self._busy = True
                        return "generate", batch
                    continue
                admitted: list[_Pending] = []
                if not legacy_waiting and self._admit_now(running):
                    free = self.max_batch_size - len(self._batch.rows)
                    for pending in list(self._queue):
                        if len(admitted) >= free:
                            break
                        admitted.append(pending)
                        self._queue.remove(pending)
                if running or admitted:
                    self._busy = True
                    return "engine", admitted

    def _admit_now(self, running: bool) -> bool:
        """Whether the queued requests join the running batch before this step. Where the step runs joining
        prompts in its own pass (``RunningBatch.ragged``), a join costs only its ids' compute: they join at once.
        Otherwise a join prefills on its own, and a prefill reads all the weights like a decode step does, stalling
        the running rows for about one step whether it prefills one prompt or several: with rows running, requests
        join in groups of ``admit_group`` (or as many as there are free slots), or once the oldest has waited
        ``admit_wait_s``."""
        if not self._queue:
            return False
        if not running:
            return True
        free = self.max_batch_size - len(self._batch.rows)
        if free <= 0:
            return False
        if self._batch.ragged:
            return True
        if len(self._queue) >= min(free, self.admit_group):
            return True
        return time.monotonic() - self._queue[0].enqueued_s >= self.admit_wait_s

    def _drop_cancelled(self) -> None:
        """Take out of the queue the requests nobody waits for, and answer the streams cancelled before they
        started (nothing was generated)."""
        live: list[_Pending] = []
        for pending in self._queue:
            if pending.future.cancelled():
                continue
            if pending.cancel_requested:
                _resolve(pending, self._empty_result(pending))
                continue
            live.append(pending)
        self._queue.clear()
        self._queue.extend(live)

    def _take_batch(self) -> list[_Pending]:
        """Remove from the queue the oldest request that the engine does not take and the queued
        ones that can share its ``model.generate`` batch: same temperature and top_p, no seed, and the padded prompt
        plus the longest ``max_tokens`` fits the context. A seeded request runs alone (the seed sets the sampling RNG
        for the whole batch)."""
        live = [p for p in self._queue if not self._fast_path(p)]
        if not live:
            return []
        first = live[0]
        batch = [first]
        if first.request.seed is None:
            longest_prompt = len(first.prompt_token_ids)
            longest_budget = first.request.max_tokens
            for pending in live[1:]:
                if len(batch) >= self.max_batch_size:
                    break
                if pending.batch_key != first.batch_key or pending.request.seed is not None:
                    continue
                prompt = max(longest_prompt, len(pending.prompt_token_ids))
                budget = max(longest_budget, pending.request.max_tokens)
                if prompt + budget > self.max_context_tokens:
                    continue
                batch.append(pending)
                longest_prompt, longest_budget = prompt, budget
        taken = {id(p) for p in batch}
        remaining = [p for p in self._queue if id(p) not in taken]
        self._queue.clear()
        self._queue.extend(remaining)
        return batch

    def _run_generate(self, batch: list[_Pending]) -> None:
        try:
            outcomes: list[GenerationResult] | BaseException = self._generate_batch(batch)
        except Exception as exc:
            logger.exception("embedded generation failed for a batch of %d", len(batch))
            outcomes = BackendError(f"embedded generation failed: {exc!r}")
        if isinstance(outcomes, BaseException):
            self.stats.failed_requests += len(batch)
            for pending in batch:
                _resolve(pending, BackendError(str(outcomes)))
        else:
            for pending, result in zip(batch, outcomes, strict=True):
                _resolve(pending, result)

    def _run_engine(self, admitted: list[_Pending]) -> None:
        """Admit ``admitted`` into the running batch, then run one decode step; answer the rows that ended."""
        engine = self._batch
        if self._prefix_stale and not engine.rows:
            self.prefix_cache.clear()
            packed_linear.forget_trainable(self.model)
            self._prefix_stale = False
        model = self.model
        if engine.model is not model:
            engine.set_model(model)
        was_training = bool(getattr(model, "training", False))
        started_s = time.monotonic()
        rows_before = len(engine.rows)
        try:
            model.eval()
            with torch.inference_mode():
                rows = [self._row_of(pending) for pending in admitted]
                if engine.ragged:  # joining prompts and the running rows' next ids in one pass
                    live = list(engine.rows)
                    engine.advance(rows)
                    if live:  # a decode step that also prefilled the joining rows
                        self._count_decode_step(len(live), time.monotonic() - started_s)
                    else:
                        self.stats.prefill_s += time.monotonic() - started_s
                    self._stream_new_ids(live + rows)
                    self._answer(engine.finished(self._should_stop))
                    return
                engine.admit(rows)
                admitted_s = time.monotonic()
                self.stats.prefill_s += admitted_s - started_s
                self._stream_new_ids(rows)
                self._answer(engine.finished(self._should_stop))
                if engine.rows:
                    live = list(engine.rows)
                    step_started_s = time.monotonic()
                    engine.step()
                    self._count_decode_step(len(live), time.monotonic() - step_started_s)
                    self._stream_new_ids(live)
                    self._answer(engine.finished(self._should_stop))
        except Exception as exc:
            logger.exception("embedded generation failed for a running batch of %d", rows_before + len(admitted))
            failed = [row.owner for row in engine.rows] + [p for p in admitted if not p.future.done()]
            engine.reset()
            self.stats.failed_requests += len(failed)
            for pending in failed:
                _resolve(pending, BackendError(f"embedded generation failed: {exc!r}"))
        finally:
            if was_training:
                model.train()
            self.stats.generation_s += time.monotonic() - started_s

    def _count_decode_step(self, rows: int, seconds: float) -> None:
        """Add one decode step of ``rows`` running rows that took ``seconds`` to :attr:`stats`."""
        self.stats.decode_s += seconds
        self.stats.decode_steps += 1
        self.stats.decode_rows += rows

    def _end_running_rows(self) -> None:
        """The backend is closing: the running rows get BackendError now instead of running to ``max_tokens``."""
        pending = [row.owner for row in self._batch.rows]
        self._batch.reset()
        for owner in pending:
            _resolve(owner, BackendError("the embedded backend was closed while this request was generating"))

    def _row_of(self, pending: _Pending) -> Row:
        request = pending.request
        return Row(
            owner=pending,
            prompt=list(pending.prompt_token_ids),
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            top_logprobs=request.top_logprobs if request.logprobs else 0,
            stop_ids=frozenset(self.stop_token_ids),
        )

    def _stream_new_ids(self, rows: list[Row]) -> None:
        # On two cores every wake-up of the event loop takes a core from the next step's threads: one per step.
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Callable[[int], None], int]]] = {}
        for row in rows:
            pending: _Pending = row.owner
            if pending.deliver is not None and row.generated and not pending.cancel_requested:
                by_loop.setdefault(pending.loop, []).append((pending.deliver, row.generated[-1]))
        for loop, calls in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
                loop.call_soon_threadsafe(_deliver_all, calls)

    def _should_stop(self, row: Row) -> str | None:
        """``abort`` for a cancelled row, ``stop`` once its text holds one of its stop strings (only the tail is
        decoded: enough ids to hold the longest stop string, and a few more for a character split over ids)."""
        pending: _Pending = row.owner
        if pending.cancel_requested or pending.future.cancelled():
            return "abort"
        stops = (*pending.request.stop, *pending.request.stop_inclusive)
        if stops and row.generated:
            tail = max(len(stop.encode()) for stop in stops) + 4
            text = self._decode(row.generated[-tail:])
            if any(stop in text for stop in stops):
                return "stop"
        return None

    def _answer(self, ended: list[Row]) -> None:
        for row in ended:
            pending: _Pending = row.owner
            finished_s = time.monotonic()
            top_TK = None
            if row.top:
                top_TK = (torch.tensor([v for v, _ in row.top]), torch.tensor([i for _, i in row.top]))
            result = self._result(
                pending,
                row.generated,
                row.finish_reason or "stop",  # type: ignore[arg-type]
                torch.tensor(row.logprobs, dtype=torch.float32),
                top_TK,
                {
                    "batch_size": row.peak_batch,
                    "queue_wait_s": row.admitted_s - pending.enqueued_s,
                    "generation_s": finished_s - row.admitted_s,
                    "cached_prompt_tokens": row.cached_prefix,
                },
            )
            self.stats.requests += 1
            self.stats.generated_tokens += len(result.response_token_ids)
            _resolve(pending, result)

    def _empty_result(self, pending: _Pending) -> GenerationResult:
        return GenerationResult(
            prompt_token_ids=list(pending.prompt_token_ids),
            response_token_ids=[],
            response_logprobs=[],
            text="",
            finish_reason="abort",
            model_version=self.model_version,
        )

    def _decode(self, ids: list[int]) -> str:
        return self.encoder.decode(ids)

    def _token_logprobs(
        self,
        ids: list[int],
        logprobs_T: torch.Tensor,
        top_TK: tuple[torch.Tensor, torch.Tensor] | None,
        k: int,
    ) -> list[dict[str, Any]]:
        """OpenAI ``ChatCompletionTokenLogprob`` entries for ``ids`` (a final stop id left out: it is not text)."""
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        entries: list[dict[str, Any]] = []
        for step, token_id in enumerate(ids):
            entry = self.encoder.token_entry(token_id, float(logprobs_T[step]))
            alternatives: list[dict[str, Any]] = []
            if top_TK is not None and k > 0:
                values, top_ids = top_TK
                for value, alt in zip(values[step, :k].tolist(), top_ids[step, :k].tolist(), strict=True):
                    alternatives.append(self.encoder.token_entry(int(alt), float(value)))
            entry["top_logprobs"] = alternatives
            entries.append(entry)
        return entries

    def _result(
        self,
        pending: _Pending,
        ids: list[int],
        finish_reason: FinishReason,
        logprobs_T: torch.Tensor,
        top_TK: tuple[torch.Tensor, torch.Tensor] | None,
        extra: dict[str, Any],
    ) -> GenerationResult:
        """The answer to ``pending``: ``ids`` (cut already), their logprobs ``(T,)`` (at least ``len(ids)``) and
        top alternatives ``((T, k), (T, k))``; the text is cut at a stop string, and the transcript kept."""
        request = pending.request
        text = self._decode(ids)
        stop_sequence = None
        if request.stop or request.stop_inclusive:
            text, stop_sequence = cut_at_stop(text, request.stop, request.stop_inclusive)
        token_logprobs = None
        if request.logprobs:
            token_logprobs = self._token_logprobs(ids, logprobs_T, top_TK, request.top_logprobs)
            if stop_sequence is not None:  # the stop string's tokens are not in the returned text
                token_logprobs = entries_within(token_logprobs, len(text))
        if finish_reason != "abort" and request.prompt is None:
            self.encoder.remember(pending.prompt_token_ids, ids)
        return GenerationResult(
            prompt_token_ids=list(pending.prompt_token_ids),
            response_token_ids=list(ids),
            response_logprobs=logprobs_T[: len(ids)].tolist(),
            text=text,
            finish_reason=finish_reason,
            model_version=self.model_version,
            extra=extra,
            stop_sequence=stop_sequence,
            token_logprobs=token_logprobs,
        )

    def _generate_batch(self, batch: list[_Pending]) -> list[GenerationResult]:
        """Run one ``model.generate`` over ``batch`` (:func:`~agentbolt.inference.batched_generate.generate_batch`)."""
        generated = generate_batch(
            self.model,
            batch,
            device=self.device,
            pad_token_id=self.pad_token_id,
            stop_token_ids=self.stop_token_ids,
            decode=self._decode,
            tokenizer=self.tokenizer,
        )
        results = [
            self._result(
                pending,
                row.ids,
                row.finish_reason,
                row.logprobs_T,
                row.top_TK,
                {
                    "batch_size": len(batch),
                    "queue_wait_s": generated.started_s - pending.enqueued_s,
                    "generation_s": generated.elapsed_s,
                },
            )
            for pending, row in zip(batch, generated.rows, strict=True)
        ]
        self.stats.batches += 1
        self.stats.decode_steps += 1
        self.stats.decode_rows += len(batch)
        self.stats.requests += len(batch)
        self.stats.generation_s += generated.elapsed_s
        self.stats.generated_tokens += sum(len(r.response_token_ids) for r in results)
        return results


def _deliver_all(calls: list[tuple[Callable[[int], None], int]]) -> None:
    for deliver, token_id in calls:
        deliver(token_id)


class _EmbeddedStream:
    """A :class:`~agentbolt.inference.base.GenerationStream` of the embedded backend (built by
    :meth:`EmbeddedBackend.stream`)."""

    def __init__(self, backend: EmbeddedBackend, pending: _Pending, tokens: asyncio.Queue[int | None]) -> None:
        self.prompt_tokens = len(pending.prompt_token_ids)
        """The prompt's length in tokens, known before the first token."""
        self._backend = backend
        self._pending = pending
        self._tokens = tokens

    async def text_deltas(self) -> AsyncIterator[str]:
        """Text as ids arrive. Incremental decoding: only the ids since the last complete character are decoded
        again at each step (O(1) per token), so a multi-byte character split over ids is sent whole. With stop
        strings, a piece that may be the start of one is held back and nothing after one is sent
        (:class:`~agentbolt.inference.stop_text.StopTextFilter`)."""
        tokenizer = self._backend.tokenizer
        request = self._pending.request
        stops = StopTextFilter(request.stop, request.stop_inclusive)
        ids: list[int] = []
        prefix_offset = read_offset = 0
        sent = 0  # characters sent
        while True:
            token_id = await self._tokens.get()
            if token_id is None:
                break
            ids.append(token_id)
            prefix_text = str(tokenizer.decode(ids[prefix_offset:read_offset], skip_special_tokens=True))
            text = str(tokenizer.decode(ids[prefix_offset:], skip_special_tokens=True))
            if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
                delta = stops.feed(text[len(prefix_text) :])
                prefix_offset, read_offset = read_offset, len(ids)
                if delta:
                    sent += len(delta)
                    yield delta
        result = await self.result()
        if sent < len(result.text):
            yield result.text[sent:]  # held back at the very end (a character, a possible stop string's start)

    async def result(self) -> GenerationResult:
        """The whole result (see :class:`~agentbolt.inference.base.GenerationStream`)."""
        return await asyncio.shield(self._pending.future)

    def cancel(self) -> None:
        """Stop this row at its next generation step (or before it starts)."""
        self._pending.cancel_requested = True
        with self._backend._cond:
            self._backend._cond.notify_all()


# ---------------------------------------------------------------------- pure helpers


def _served_name(name: str, path: Path) -> str:
    """``name`` if it is an embedded model, else the name in a ``prepare_model`` marker, else the directory name."""
    if name in MODEL_SPECS:
        return name
    with contextlib.suppress(OSError, ValueError, AttributeError):
        marked = json.loads((path / MARKER_FILE).read_text()).get("name")
        if isinstance(marked, str) and marked:
            return marked
    return path.name


def _model_device(model: Any) -> torch.device:
    """The device of ``model``'s first parameter (``cpu`` for a model without parameters)."""
    try:
        return next(iter(model.parameters())).device
    except (StopIteration, AttributeError, TypeError):
        return torch.device("cpu")


def _max_positions(model: Any, tokenizer: PreTrainedTokenizerBase) -> int:
    positions = getattr(model.config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        return positions
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < 10**7:
        return limit
    raise ConfigError("cannot tell the model's context length: config.max_position_embeddings is missing")


def _resolve(pending: _Pending, outcome: GenerationResult | BaseException) -> None:
    """Hand ``outcome`` to the request's event loop (thread-safe); a cancelled request is skipped."""

    def settle() -> None:
        if pending.future.done():
            return
        if isinstance(outcome, BaseException):
            pending.future.set_exception(outcome)
        else:
            pending.future.set_result(outcome)

    with contextlib.suppress(RuntimeError):  # RuntimeError: the loop is closed, nobody is waiting
        pending.loop.call_soon_threadsafe(settle)
