"""The contract between the gateway and an inference backend.

The backend owns the tokenizer and the chat template: it turns chat messages into the exact prompt token ids, generates,
and returns the exact generated ids with one sampling logprob per id. The gateway never tokenizes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable


@dataclass(frozen=True)
class GenerationRequest:
    """One chat completion to generate.

    Attributes:
        messages: OpenAI chat messages (``role``, ``content``, optional ``tool_calls``/``tool_call_id``).
        tools: OpenAI tool definitions (``{"type": "function", "function": {...}}``), passed to the chat template.
        max_tokens: upper bound on generated tokens (>= 1).
        temperature: 0 means greedy; otherwise sampling at this temperature.
        top_p: nucleus sampling mass in (0, 1].
        seed: optional sampling seed.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class GenerationResult:
    """What the backend generated, exactly.

    Attributes:
        prompt_token_ids: ``(P,)`` ids the model was fed (chat template applied once, by the backend).
        response_token_ids: ``(R,)`` ids generated, the stop token included when generation stopped on one.
        response_logprobs: ``(R,)`` log-probability of each generated id under the sampling distribution
            (logits / temperature; plain logits when greedy), float32 math.
        text: the generated ids decoded with special tokens skipped.
        finish_reason: ``stop`` (a stop token) or ``length`` (``max_tokens`` reached).
        model_version: weights version that produced it (e.g. ``base`` or ``step-3``).
    """

    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float]
    text: str
    finish_reason: Literal["stop", "length"]
    model_version: str
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class InferenceBackend(Protocol):
    """An inference backend behind the gateway."""

    model_name: str
    """The served model's name; the gateway maps any requested name to it."""

    model_version: str
    """Current weights version; changes after each training update."""

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate one completion. Concurrent calls may be batched. Raises BackendError on backend failure,
        ConfigError when the prompt does not fit the context."""
        ...

    async def close(self) -> None:
        """Stop background work and free the model."""
        ...
