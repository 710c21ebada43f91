"""The ``openai`` backend: forwards to any OpenAI-compatible chat completions API (OpenAI, a hosted model, Ollama,
another agentbolt gateway...).

Such an API returns text, not token ids, so every result says ``trainable=False`` and carries no ids: the gateway
records the call (messages, answer, tool calls, usage counts reported by the server) for prompt optimization and
evaluation, and flags it as not trainable by RL (``agentbolt.llm.trainable = False``).

What is sent: ``model`` (the configured name; the agent's is mapped to it), ``messages``, ``tools``,
``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``; streams ask for ``stream_options.include_usage``.
Tool calls come back parsed by the server and are passed through; if the server returns them as text instead, the
gateway parses the text. A request with ``n > 1`` becomes ``n`` requests (the prompt is paid ``n`` times).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx

from agentbolt.errors import BackendError
from agentbolt.inference.base import FinishReason, GenerationRequest, GenerationResult
from agentbolt.inference.remote import (
    ChatEndpoint,
    ChunkAccumulator,
    RemoteStream,
    forwarded_fields,
    refuse_unforwarded,
)

_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}


class OpenAICompatBackend:
    """An :class:`~agentbolt.inference.base.InferenceBackend` (streaming too) over an OpenAI-compatible URL.

    Build it with :meth:`connect`.

    Attributes:
        model_name: the remote model every request names.
        model_version: stamped on every result (default: ``model_name``; the remote weights are not ours).
        endpoint: the HTTP endpoint.
    """

    refused_request_fields: frozenset[str] = frozenset({"prompt", "chat_template_kwargs"})
    """:class:`~agentbolt.inference.base.GenerationRequest` fields this backend cannot pass on (refused with a 400
    naming them; docs/gateway_conformance.md)."""

    def __init__(self, endpoint: ChatEndpoint, model_name: str) -> None:
        self.endpoint = endpoint
        self.model_name = model_name
        self.model_version = model_name

    @classmethod
    async def connect(
        cls,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> OpenAICompatBackend:
        """Use the API at ``base_url`` (its root, e.g. ``https://api.openai.com/v1``).

        Args:
            model: the remote model to call; default the first one ``GET /models`` lists (many APIs list
                dozens: name it).
            api_key: sent as a bearer token.
            timeout_s: longest wait for an answer, or for the next chunk of a stream.
            transport: an httpx transport instead of the network (tests).

        Raises:
            ConfigError: bad URL.
            BackendError: no ``model`` given and the server does not list one.
        """
        endpoint = ChatEndpoint(
            base_url, api_key=api_key, timeout_s=timeout_s, label="the OpenAI-compatible server", transport=transport
        )
        if model is None:
            try:
                served = await endpoint.model_names()
            except BaseException:
                await endpoint.close()
                raise
            if not served:
                await endpoint.close()
                raise BackendError(f"{endpoint.where} lists no model; name the model to use (--model)")
            model = served[0]
        return cls(endpoint, model)

    def payload(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body sent for ``request``: its own fields (``stop``, ``tool_choice``, ``parallel_tool_calls``,
        ``response_format``, ``logprobs``/``top_logprobs``, penalties, ``logit_bias``, ``seed``), for the server to
        honour.

        Raises:
            RequestRefused: a raw ``prompt`` or ``chat_template_kwargs``, which an OpenAI API does not take.
        """
        refuse_unforwarded(request, "openai", self.refused_request_fields)
        body: dict[str, Any] = {
            "model": self.model_name,
            "messages": request.messages,
            "max_completion_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            **forwarded_fields(request),
        }
        if request.presence_penalty:
            body["presence_penalty"] = request.presence_penalty
        if request.frequency_penalty:
            body["frequency_penalty"] = request.frequency_penalty
        if request.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = request.top_logprobs
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """One completion (no token ids: ``trainable=False``).

        Raises:
            ContextLengthExceededError, ConfigError, BackendError, UpstreamError: see :mod:`agentbolt.inference.remote`.
        """
        body = await self.endpoint.complete(self.payload(request, stream=False))
        choice = body["choices"][0]
        message = choice.get("message") or {}
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        logprobs = choice.get("logprobs")
        entries = logprobs.get("content") if isinstance(logprobs, dict) else None
        result = self._result(
            text=message.get("content") or "",
            tool_calls=message.get("tool_calls") or None,
            finish=str(choice.get("finish_reason") or "stop"),
            usage=usage or {},
        )
        if request.logprobs and isinstance(entries, list):
            result = dataclasses.replace(result, token_logprobs=[dict(e) for e in entries])
        return result

    async def stream(self, request: GenerationRequest) -> RemoteStream:
        """Start a streamed completion; returns once the server accepted it.

        Raises:
            as :meth:`generate`, for errors answered before the stream starts.
        """
        response = await self.endpoint.open_stream(self.payload(request, stream=True))
        return RemoteStream(response, self.endpoint.where, self._build_streamed)

    async def close(self) -> None:
        """Close the connection pool."""
        await self.endpoint.close()

    def _build_streamed(self, chunks: ChunkAccumulator, cancelled: bool) -> GenerationResult:
        finish = chunks.finish_reason or ("abort" if cancelled else "stop")
        return self._result(
            text=chunks.content, tool_calls=chunks.tool_call_list(), finish=finish, usage=chunks.usage or {}
        )

    def _result(
        self, *, text: str, tool_calls: list[dict[str, Any]] | None, finish: str, usage: dict[str, Any]
    ) -> GenerationResult:
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
        return GenerationResult(
            prompt_token_ids=[],
            response_token_ids=[],
            response_logprobs=[],
            text=text,
            finish_reason="abort" if finish == "abort" else _FINISH_REASONS.get(finish, "stop"),
            model_version=self.model_version,
            tool_calls=tool_calls,
            trainable=False,
            prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else 0,
            completion_tokens=completion_tokens if isinstance(completion_tokens, int) else 0,
        )
