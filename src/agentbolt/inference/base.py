"""The contract between the gateway and an inference backend.

The backend owns the tokenizer and the chat template: it turns chat messages into the exact prompt token ids, generates,
and returns the exact generated ids with one sampling logprob per id. The gateway never tokenizes anything.

Backends (DESIGN.md, "Components"): ``embedded`` (:mod:`agentbolt.inference.embedded`, transformers in this process),
``vllm`` (:mod:`agentbolt.inference.vllm`, ids from the engine through ``return_token_ids``) and ``openai``
(:mod:`agentbolt.inference.openai_compat`, any OpenAI-compatible URL; no token ids, so its results say
``trainable=False``). :func:`agentbolt.inference.backends.open_backend` builds one by name.

Streaming is optional: a backend that also has ``stream`` (:class:`StreamingInferenceBackend`) hands the gateway
text deltas while it generates; for any other backend the gateway streams the whole result once it is done.

Errors a backend raises (the gateway turns each into an OpenAI-style error answer and a failed, untrainable span):

    ConfigError                      400  the request cannot be served as sent (bad sampling values, template)
     ├── ContextLengthExceededError  400  prompt + max_tokens do not fit the model's context
     └── RequestRefused              400  a request field that cannot be honoured (names the field)
    BackendError                     503  the backend is missing, closed or unreachable
     └── UpstreamError               502  the server a remote backend forwards to answered with an error
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from agentbolt.errors import BackendError, ConfigError

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "abort"]
"""Why generation ended: ``stop`` (a stop token), ``length`` (``max_tokens``), ``tool_calls`` / ``content_filter``
(as reported by a remote server), ``abort`` (stopped early with :meth:`GenerationStream.cancel`)."""


class ContextLengthExceededError(ConfigError):
    """The prompt plus ``max_tokens`` does not fit the model's context (OpenAI code ``context_length_exceeded``).
    The message gives both numbers and says what to shorten."""

    http_status = 400


class RequestRefused(ConfigError):
    """A request field the gateway cannot honour, or a bad value in one: answered 400 in the protocol's error shape,
    with ``param`` naming the field (``messages[2].content[1]``, ``response_format``...). The message says what the
    gateway does support, so the caller knows what to send instead."""

    http_status = 400

    def __init__(self, message: str, param: str | None = None, code: str = "unsupported_parameter") -> None:
        super().__init__(message)
        self.param = param
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.param, self.code))


class UpstreamError(BackendError):
    """The server a remote backend (``vllm``, ``openai``) forwards to answered with an error or broke the protocol.
    The message names the server, its HTTP status and its own message."""

    http_status = 502


@dataclass(frozen=True)
class ToolChoice:
    """Which tool calls the model may or must make.

    ``auto``: may call any declared function or answer in text; ``none``: answers in text, nothing is parsed as a
    call; ``required``: must call at least one declared function; ``function``: must call the function ``name``.
    """

    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None


@dataclass(frozen=True)
class OutputFormat:
    """A constraint on the answer's text (OpenAI ``response_format``, Responses ``text.format``, Anthropic
    ``output_format``). ``json_object``: any JSON object; ``json_schema``: JSON valid against ``schema``."""

    kind: Literal["json_object", "json_schema"]
    schema: dict[str, Any] | None = None
    name: str | None = None


TOP_LOGPROBS_MAX = 20
"""Largest ``top_logprobs`` served (OpenAI's limit)."""

MAX_STOP_STRINGS = 16
"""Most stop strings in one request, every protocol (OpenAI allows 4; vLLM more)."""


@dataclass(frozen=True)
class GenerationRequest:
    """One completion to generate: a chat (``messages``) or, for the legacy Completions protocol, a raw ``prompt``.

    Attributes:
        messages: OpenAI chat messages (``role``, ``content``, optional ``tool_calls``/``tool_call_id``).
        tools: OpenAI tool definitions (``{"type": "function", "function": {...}}``), passed to the chat template.
        max_tokens: upper bound on generated tokens (>= 1).
        temperature: 0 means greedy; otherwise sampling at this temperature.
        top_p: nucleus sampling mass in (0, 1].
        seed: optional sampling seed.
        prompt: a raw prompt (text, or token ids) fed as it is, without any chat template; ``messages`` and
            ``tools`` are then ignored.
        stop: stop strings: generation ends once the generated text contains one; the text returned ends before
            it (the ids keep every generated token, the one that completed the stop string included).
        stop_inclusive: stop strings kept in the returned text (the gateway uses ``</tool_call>`` to end an answer
            after its first tool call when ``parallel_tool_calls`` is false).
        logprobs: return :attr:`GenerationResult.token_logprobs` (each chosen token's text and logprob).
        top_logprobs: with ``logprobs``, also the ``k`` most likely tokens at each step (0..20).
        presence_penalty / frequency_penalty: OpenAI's penalties in ``[-2, 2]``: each logit is lowered by
            ``frequency_penalty * count + presence_penalty * (count > 0)``, ``count`` being how often the token was
            generated so far in this answer (https://platform.openai.com/docs/advanced-usage#frequency-and-presence-penalties).
        logit_bias: token id -> bias in ``[-100, 100]`` added to its logit at every step.
        tool_choice / parallel_tool_calls / output_format: the answer's constraints (constrained decoding).
        chat_template_kwargs: extra variables for the chat template.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    prompt: str | list[int] | None = None
    stop: tuple[str, ...] = ()
    stop_inclusive: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    output_format: OutputFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def penalized(self) -> bool:
        """Whether penalties or a logit bias change the sampling distribution."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)


@dataclass(frozen=True)
class GenerationResult:
    """What the backend generated, exactly.

    Attributes:
        prompt_token_ids: ``(P,)`` ids the model was fed (chat template applied once, by the backend); empty when the
            backend cannot know them (``openai``).
        response_token_ids: ``(R,)`` ids generated, the stop token included when generation stopped on one; empty
            when the backend cannot know them.
        response_logprobs: ``(R,)`` log-probability of each generated id under the sampling distribution
            (logits / temperature; plain logits when greedy), float32 math. Empty when the ids are.
        text: the generated ids decoded with special tokens skipped (for remote backends: the message content).
        finish_reason: see :data:`FinishReason`.
        model_version: weights version that produced it (e.g. ``base`` or ``step-3``).
        extra: backend-specific facts (batch size, queue wait...), recorded nowhere by the gateway.
        tool_calls: OpenAI ``tool_calls`` already parsed by a remote server (vLLM with a tool parser, an OpenAI
            endpoint); ``None`` means the gateway parses them out of ``text``.
        trainable: False when the ids are not the exact ones the model saw and produced (``openai`` backend), or a
            logprob is missing: the call is recorded for prompt optimization and evaluation but never becomes a
            training sample (``extra["not_trainable_reason"]`` says why, when it is not the missing ids).
        prompt_tokens / completion_tokens: token counts reported by a backend that has no ids; ``None`` means
            ``len`` of the ids (see :attr:`num_prompt_tokens`, :attr:`num_completion_tokens`).
        stop_sequence: the stop string that ended generation (``finish_reason`` is then ``stop``), else ``None``.
        token_logprobs: when the request asked for ``logprobs``: one entry per returned token, in OpenAI's
            ``ChatCompletionTokenLogprob`` shape ``{"token": str, "logprob": float, "bytes": [int], "top_logprobs":
            [{"token", "logprob", "bytes"}]}``; ``None`` when not asked for (or the backend cannot give them).
    """

    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float]
    text: str
    finish_reason: FinishReason
    model_version: str
    extra: dict[str, Any] = field(default_factory=dict)
    tool_calls: list[dict[str, Any]] | None = None
    trainable: bool = True
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    stop_sequence: str | None = None
    token_logprobs: list[dict[str, Any]] | None = None

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length in tokens (reported count, else ``len(prompt_token_ids)``)."""
        return self.prompt_tokens if self.prompt_tokens is not None else len(self.prompt_token_ids)

    @property
    def num_completion_tokens(self) -> int:
        """Response length in tokens (reported count, else ``len(response_token_ids)``)."""
        return self.completion_tokens if self.completion_tokens is not None else len(self.response_token_ids)


@dataclass
class ThroughputStats:
    """Counters since load (read them for tokens/s reports; they only grow).

    Attributes:
        generated_tokens: response ids returned (after the per-request cut), summed over requests.
        generation_s: wall seconds spent generating (inside ``model.generate`` or the running batch; for a remote
            engine, seconds with at least one request in flight).
        batches: batches run.
        requests: requests answered (successfully) by those batches.
        failed_requests: requests that got a BackendError from the worker.
        decode_steps: forward passes that generated one id per row (a ``model.generate`` batch counts once). With
            the embedded backend's one-pass step (``RunningBatch.ragged``) a step also prefills the rows joining it.
        decode_rows: running rows in those passes, summed (joining rows not counted; a ``model.generate`` batch
            counts its requests).
        prefill_s: wall seconds of ``generation_s`` spent admitting rows into the embedded continuous batch on their
            own (prefix cache lookups, prefills, first ids): every join without the one-pass step, only the joins
            into an empty batch with it; the rest of its time went to decode steps (``decode_s``).
        decode_s: wall seconds of the embedded continuous batch's decode steps (with their joins, one-pass).
    """

    generated_tokens: int = 0
    generation_s: float = 0.0
    batches: int = 0
    requests: int = 0
    failed_requests: int = 0
    decode_steps: int = 0
    decode_rows: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def mean_batch_size(self) -> float:
        """Rows per decode step (0.0 before the first one)."""
        return self.decode_rows / self.decode_steps if self.decode_steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of generation time (0.0 before the first batch)."""
        return self.generated_tokens / self.generation_s if self.generation_s else 0.0


@runtime_checkable
class InferenceBackend(Protocol):
    """An inference backend behind the gateway."""

    model_name: str
    """The served model's name; the gateway maps any requested name to it."""

    model_version: str
    """Current weights version; changes after each training update."""

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate one completion. Concurrent calls may be batched.

        Raises:
            ContextLengthExceededError: the prompt plus ``max_tokens`` does not fit the context.
            ConfigError: other request values the backend cannot serve.
            BackendError: the backend failed (UpstreamError: the remote server answered with an error).
        """
        ...

    async def close(self) -> None:
        """Stop background work and free the model."""
        ...


@runtime_checkable
class GenerationStream(Protocol):
    """One generation in progress: text deltas while it runs, then the whole :class:`GenerationResult`.

    Use: iterate :meth:`text_deltas` to its end, then ``await result()``. ``"".join(deltas) == result().text``
    whenever the backend's decoding is prefix-stable (true of byte-level BPE; a backend that must correct an
    already sent delta logs it, and ``result()`` stays the truth).
    """

    def text_deltas(self) -> AsyncIterator[str]:
        """The generated text, piece by piece, as it is generated (empty pieces are never yielded).

        Raises:
            BackendError: generation failed midway (UpstreamError: the remote server reported an error).
        """
        ...

    async def result(self) -> GenerationResult:
        """The whole result, once generation has ended (waits for it). After :meth:`cancel`, what was generated up
        to then, with ``finish_reason="abort"`` unless it had already ended.

        Raises:
            BackendError: generation failed.
        """
        ...

    def cancel(self) -> None:
        """Ask the backend to stop generating (the client went away). Idempotent, never blocks, never raises;
        :meth:`text_deltas` then ends soon and :meth:`result` returns the partial result."""
        ...


@runtime_checkable
class StreamingInferenceBackend(InferenceBackend, Protocol):
    """A backend that can hand out text while it generates."""

    async def stream(self, request: GenerationRequest) -> GenerationStream:
        """Start one generation. Returns once it has been accepted, so that errors known before the first token
        (context length, bad values, an unreachable server) are raised here, as by :meth:`generate`."""
        ...


class FinishedStream:
    """A :class:`GenerationStream` over an already finished result: the whole text as one delta. The gateway uses
    it for backends without ``stream``."""

    def __init__(self, result: GenerationResult) -> None:
        self._result = result

    async def text_deltas(self) -> AsyncIterator[str]:
        """Yield the whole text once (nothing when it is empty)."""
        if self._result.text:
            yield self._result.text

    async def result(self) -> GenerationResult:
        """The result given at construction."""
        return self._result

    def cancel(self) -> None:
        """Nothing to stop."""


async def start_stream(backend: InferenceBackend, request: GenerationRequest) -> GenerationStream:
    """Start ``request`` on ``backend`` as a stream: the backend's own ``stream`` when it has one, else a
    :class:`FinishedStream` over ``generate`` (the whole text arrives at the end). Raises what the backend raises."""
    if isinstance(backend, StreamingInferenceBackend):
        return await backend.stream(request)
    return FinishedStream(await backend.generate(request))
