"""The OpenAI Chat Completions wire format, as the gateway reads and writes it. Pure: no I/O.

- :class:`ChatCompletionBody`: the request fields the gateway reads (others are accepted and ignored).
- :func:`completion_body` / :func:`chunk_body` / :func:`usage_body`: a ``chat.completion`` and the
  ``chat.completion.chunk`` objects of a stream (https://platform.openai.com/docs/api-reference/chat-streaming).
- :func:`error_info` / :func:`error_body`: ``{"error": {"message", "type", "param", "code"}}`` for an exception.
- :func:`assistant_message`: a :class:`~agentbolt.inference.base.GenerationResult` as the assistant message.
- :func:`backend_messages`: the request's messages as the backends get them (a role-less tool-call message gets one).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from agentbolt.errors import BackendError, ConfigError, ConflictError, NotFoundError
from agentbolt.inference.base import ContextLengthExceededError, GenerationResult, UpstreamError
from agentbolt.server.gateway.toolcalls import ToolCall, parse_tool_calls

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 512
"""Generated-token budget of a request that sets neither ``max_completion_tokens`` nor ``max_tokens``."""

MAX_CHOICES = 128
"""Largest accepted ``n`` (OpenAI's own limit)."""


class StreamOptions(BaseModel):
    """``stream_options`` of a streamed request."""

    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = None
    """Send one more chunk before ``[DONE]``, with empty ``choices`` and the request's ``usage``."""


class ChatCompletionBody(BaseModel):
    """The subset of the OpenAI Chat Completions request that the gateway reads; other fields (``tool_choice``,
    ``parallel_tool_calls``, ``response_format``...) are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    """Any name: the gateway always answers with the served model (and records the name asked for)."""
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    """Number of choices; each is generated separately and recorded as its own span (one transition each)."""
    stream: bool | None = None
    """Answer as server-sent events (``text/event-stream``) of ``chat.completion.chunk`` objects."""
    stream_options: StreamOptions | None = None
    seed: int | None = None
    """Sampling seed; choice ``i`` of ``n`` uses ``seed + i`` so that the choices differ."""

    @property
    def choice_count(self) -> int:
        return self.n or 1


def backend_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's messages as the inference backend gets them: a message without a ``role`` that holds
    ``tool_calls`` (some agent frameworks write the assistant's tool-call turn so) gets ``role: "assistant"``;
    every other message is passed as it is. The input is not modified, and the gateway records it as sent."""
    return [
        {"role": "assistant", **message} if "role" not in message and message.get("tool_calls") else message
        for message in messages
    ]


@dataclass(frozen=True)
class ErrorInfo:
    """An OpenAI-style error: HTTP status and the four fields of ``error``."""

    status: int
    type: str
    message: str
    code: str | None = None
    param: str | None = None


def error_info(exc: BaseException) -> ErrorInfo:
    """The OpenAI-style answer for an exception raised while serving a call.

    ContextLengthExceededError -> 400 ``context_length_exceeded``; other ConfigError -> 400; NotFoundError -> 404;
    ConflictError -> 409; UpstreamError -> 502 ``upstream_error``; other BackendError -> 503
    ``backend_unavailable``; anything else -> 500 ``internal_error`` (a bug in agentbolt).
    """
    message = str(exc) or type(exc).__name__
    if isinstance(exc, ContextLengthExceededError):
        return ErrorInfo(400, "invalid_request_error", message, "context_length_exceeded", "messages")
    if isinstance(exc, ConfigError):
        return ErrorInfo(400, "invalid_request_error", message, "invalid_value")
    if isinstance(exc, NotFoundError):
        return ErrorInfo(404, "not_found_error", message, "not_found")
    if isinstance(exc, ConflictError):
        return ErrorInfo(409, "conflict_error", message, "attempt_finished")
    if isinstance(exc, UpstreamError):
        return ErrorInfo(502, "api_error", message, "upstream_error")
    if isinstance(exc, BackendError):
        return ErrorInfo(503, "api_error", message, "backend_unavailable")
    return ErrorInfo(
        500,
        "server_error",
        f"internal error in the agentbolt gateway (a bug; please report it): {type(exc).__name__}: {message}",
        "internal_error",
    )


def error_body(info: ErrorInfo) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": info.message, "type": info.type, "param": info.param, "code": info.code}}


def error_response(info: ErrorInfo) -> JSONResponse:
    """The error as an HTTP answer."""
    return JSONResponse(status_code=info.status, content=error_body(info))


def assistant_message(result: GenerationResult, tool_names: frozenset[str]) -> tuple[str | None, list[ToolCall]]:
    """``(content, tool_calls)`` of the assistant message for ``result``: the calls a remote server already parsed,
    else the calls of the functions the request declared (``tool_names``) written in the text
    (:func:`~agentbolt.server.gateway.toolcalls.parse_tool_calls`). A request that offered no tools gets the text as
    content, whatever it looks like: an answer in JSON such as ``{"name": "Ada", "arguments": [...]}`` is an answer,
    not a call."""
    if not tool_names and not result.tool_calls:
        return (result.text or None), []
    if result.tool_calls:
        calls = [dict(call) for call in result.tool_calls]
        for call in calls:
            call.setdefault("type", "function")
            if not call.get("id"):
                call["id"] = f"call_{uuid.uuid4().hex[:24]}"
        return (result.text or None), calls
    return parse_tool_calls(result.text, tool_names)


def finish_reason(result: GenerationResult, has_tool_calls: bool) -> str:
    """OpenAI's finish reason: ``tool_calls`` when the model stopped after calling tools."""
    if has_tool_calls and result.finish_reason == "stop":
        return "tool_calls"
    return result.finish_reason


def message_body(content: str | None, tool_calls: list[ToolCall]) -> dict[str, Any]:
    """``{"role": "assistant", "content": ..., "tool_calls": [...]}`` (``tool_calls`` only when there are some)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def usage_body(results: list[GenerationResult]) -> dict[str, int]:
    """Usage of a request whose choices are ``results``: the prompt counted once, completions summed (as OpenAI
    counts ``n > 1``)."""
    prompt = results[0].num_prompt_tokens if results else 0
    completion = sum(r.num_completion_tokens for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(
    *,
    response_id: str,
    created_s: int,
    model: str,
    choices: list[tuple[GenerationResult, dict[str, Any], str]],
) -> dict[str, Any]:
    """A whole ``chat.completion``. ``choices``: ``(result, message, finish_reason)`` in index order.

    Extensions, named as vLLM names them, present only when the backend has exact ids: ``prompt_token_ids`` at the
    top and ``token_ids`` per choice (the ids recorded for training).
    """
    results = [result for result, _, _ in choices]
    exact = all(r.trainable and r.prompt_token_ids for r in results)
    body_choices = []
    for index, (result, message, finish) in enumerate(choices):
        choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish, "logprobs": None}
        if exact:
            choice["token_ids"] = result.response_token_ids
        body_choices.append(choice)
    body: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion",
        "created": created_s,
        "model": model,
        "choices": body_choices,
        "usage": usage_body(results),
        "system_fingerprint": results[0].model_version if results else None,
    }
    if exact and results:
        body["prompt_token_ids"] = results[0].prompt_token_ids
    return body


def chunk_body(
    *,
    response_id: str,
    created_s: int,
    model: str,
    index: int,
    delta: dict[str, Any],
    finish: str | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` carrying ``delta`` for choice ``index`` (and its ``finish_reason`` when
    ``finish`` is given)."""
    return {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": created_s,
        "model": model,
        "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }


def usage_chunk_body(*, response_id: str, created_s: int, model: str, usage: dict[str, int]) -> dict[str, Any]:
    """The last chunk of a stream asked with ``stream_options.include_usage``: no choices, the usage."""
    return {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": created_s,
        "model": model,
        "choices": [],
        "usage": usage,
    }


def tool_call_deltas(tool_calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Stream deltas for whole tool calls: each with its ``index``, ``id``, ``type`` and whole ``function``."""
    return [
        {
            "index": index,
            "id": call.get("id"),
            "type": call.get("type", "function"),
            "function": dict(call.get("function") or {}),
        }
        for index, call in enumerate(tool_calls)
    ]
