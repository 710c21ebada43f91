"""What one gateway call is, whatever wire protocol it came in: the protocol-neutral core. Pure: no I/O.

Four protocols reach the gateway: OpenAI Chat Completions, OpenAI (legacy) Completions, OpenAI Responses and
Anthropic Messages. Each protocol module turns its request body into a :class:`CallSpec` (raising
:class:`RequestRefused` for a field it cannot honour), the route serves the spec the same way for every protocol
(sampling rules, backend, recording of exact ids), and the protocol module writes the answer back: a whole body from
the :class:`ChoiceOutput` list, or a stream through its :class:`StreamEncoder`.

Messages inside a :class:`CallSpec` are always OpenAI Chat messages as the backend gets them (``role``, ``content``
a string, assistant ``tool_calls`` with JSON-string ``arguments``, ``role: tool`` with ``tool_call_id``), and tools
are OpenAI Chat tool definitions (``{"type": "function", "function": {"name", "description", "parameters"}}``). So
every protocol renders through the same chat template, and the transitions of all four merge across turns by the
same prompt-prefix rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from agentbolt.inference.base import GenerationResult, OutputFormat, RequestRefused, ToolChoice

__all__ = [
    "CallSpec",
    "ChoiceOutput",
    "OutputFormat",
    "RequestRefused",
    "StreamEncoder",
    "ToolCall",
    "ToolChoice",
]

ToolCall = dict[str, Any]
"""``{"id": "call_<hex>", "type": "function", "function": {"name": str, "arguments": str}}``."""


@dataclass
class CallSpec:
    """One call, protocol-neutral.

    Attributes:
        protocol: ``chat.completions``, ``completions``, ``responses`` or ``messages`` (recorded on the spans).
        messages: OpenAI Chat messages as the backend gets them (see the module docstring); empty for ``completions``.
        prompt: ``completions`` only: the raw prompt, text or token ids, fed without any chat template.
        tools: OpenAI Chat tool definitions offered to the model, or ``None``.
        tool_choice: see :class:`ToolChoice`.
        parallel_tool_calls: False: at most one tool call per answer.
        stop: stop strings; generation ends at the first one, which is not returned.
        output_format: constrained decoding of the answer, or ``None``.
        logprobs: return the chosen tokens' logprobs; ``top_logprobs``: and the ``k`` most likely (0..20).
        n: number of choices.
        seed: sampling seed (choice ``i`` uses ``seed + i``).
        presence_penalty / frequency_penalty: OpenAI's penalties, in ``[-2, 2]``.
        logit_bias: token id -> bias in ``[-100, 100]``, or ``None``.
        sampling_requested: what the caller set of ``temperature``, ``top_p``, ``max_tokens`` (resolved against
            the rollout's resources version by :func:`agentbolt.server.gateway.sampling.resolve_sampling`).
        stream: answer as server-sent events.
        include_usage: Chat Completions ``stream_options.include_usage``: a usage chunk ends the stream.
        model: the model name asked for (recorded; the backend's model serves every name).
        chat_template_kwargs: extra variables for the chat template (vLLM's field of the same name).
        record_messages: what the spans record as the request's messages (the chat messages above, unless a
            protocol records something else).
        attributes: more attributes for the spans (``user``, ``metadata``...).
    """

    protocol: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    prompt: str | list[int] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    stop: tuple[str, ...] = ()
    output_format: OutputFormat | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    n: int = 1
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    sampling_requested: dict[str, float | int] = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    record_messages: list[dict[str, Any]] | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChoiceOutput:
    """One generated choice, as the caller gets it.

    Attributes:
        index: choice index.
        result: what the backend generated (exact ids, logprobs, text, finish reason).
        content: the answer's text once tool calls are taken out (``None``: no text).
        tool_calls: OpenAI tool calls parsed from the text (or parsed by a remote server), with unique ids.
        finish: OpenAI Chat finish reason: ``stop``, ``length``, ``tool_calls``, ``content_filter`` or ``abort``.
        stop_sequence: the stop string that ended generation, if one did.
    """

    index: int
    result: GenerationResult
    content: str | None
    tool_calls: list[ToolCall]
    finish: str
    stop_sequence: str | None = None


class StreamEncoder(Protocol):
    """How one protocol writes a streamed answer: each method returns the server-sent events to send, already
    formatted (``"event: NAME\\ndata: {...}\\n\\n"`` or ``"data: {...}\\n\\n"``).

    Call order: :meth:`begin`; per choice :meth:`choice_begin`, :meth:`text` for each content delta, then
    :meth:`choice_end`; then :meth:`end`. On a failure after the stream started, :meth:`error` instead of
    :meth:`end`.
    """

    def begin(self) -> list[str]:
        """Events before any choice (``response.created``, ``message_start``...)."""
        ...

    def choice_begin(self, index: int) -> list[str]:
        """Events that open choice ``index``."""
        ...

    def text(self, index: int, delta: str) -> list[str]:
        """Events carrying ``delta``, the next piece of choice ``index``'s content."""
        ...

    def choice_end(self, output: ChoiceOutput) -> list[str]:
        """Events that close a choice: its tool calls, finish reason, closing events."""
        ...

    def end(self, outputs: list[ChoiceOutput]) -> list[str]:
        """Last events (usage, ``response.completed``, ``message_stop``, ``[DONE]``)."""
        ...

    def error(self, status: int, type_: str, message: str, code: str | None) -> list[str]:
        """The event that reports a failure after the stream started."""
        ...
