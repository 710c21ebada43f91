"""OpenAI-compatible ``POST /v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1/chat/completions``.

Every call is recorded as an ``agentbolt.llm_call`` span of the attempt named in the URL, with the exact prompt and
response token ids and per-token sampling logprobs returned by the inference backend. Nothing is re-tokenized: the
backend applies the chat template once and the gateway stores what it got. Tool calls written by the model (Qwen
``<tool_call>`` tags or a bare JSON call) are returned as OpenAI ``tool_calls``.

Not supported yet (answered with a clear 400): ``stream: true`` and ``n > 1``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from agentbolt import semconv
from agentbolt.errors import AgentboltError, ConfigError, ConflictError
from agentbolt.inference.base import GenerationRequest, GenerationResult, InferenceBackend
from agentbolt.server.gateway.toolcalls import parse_tool_calls
from agentbolt.store.base import LightningStore
from agentbolt.tracing.context import new_span_id, new_trace_id
from agentbolt.types import TERMINAL_ATTEMPT_STATUSES, TERMINAL_ROLLOUT_STATUSES, Span, SpanStatus

router = APIRouter(prefix="/v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1")


class ChatCompletionBody(BaseModel):
    """The subset of the OpenAI Chat Completions request that the gateway reads; other fields are ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1)
    stream: bool | None = None
    seed: int | None = None


def _openai_error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"type": kind, "message": message, "code": None}})


async def _check_attempt_open(store: LightningStore, rollout_id: str, attempt_id: str) -> None:
    attempt = await store.get_attempt(rollout_id, attempt_id)
    if attempt.status in TERMINAL_ATTEMPT_STATUSES:
        raise ConflictError(f"attempt {attempt_id} is already {attempt.status.value}; it takes no more LLM calls")
    rollout = await store.get_rollout(rollout_id)
    if rollout.status in TERMINAL_ROLLOUT_STATUSES:
        raise ConflictError(f"rollout {rollout_id} is already {rollout.status.value}; it takes no more LLM calls")


def _response_message(result: GenerationResult) -> tuple[dict[str, Any], str]:
    content, tool_calls = parse_tool_calls(result.text)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    finish = result.finish_reason
    if tool_calls:
        message["tool_calls"] = tool_calls
        if finish == "stop":
            finish = "tool_calls"
    return message, finish


@router.post("/chat/completions")
async def chat_completions(rollout_id: str, attempt_id: str, body: ChatCompletionBody, request: Request):
    """Serve one chat completion for the attempt and record it as a span."""
    store: LightningStore = request.app.state.store
    backend: InferenceBackend | None = request.app.state.backend
    if backend is None:
        return _openai_error(503, "BackendError", "this server has no inference backend; start it with --model")
    if body.stream:
        return _openai_error(400, "invalid_request_error", "stream=true is not supported by the gateway yet")
    if body.n not in (None, 1):
        return _openai_error(400, "invalid_request_error", "n > 1 is not supported by the gateway yet; send n=1")
    await _check_attempt_open(store, rollout_id, attempt_id)

    gen_request = GenerationRequest(
        messages=body.messages,
        tools=body.tools or None,
        max_tokens=body.max_completion_tokens or body.max_tokens or 512,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
    )
    start = time.time()
    attributes: dict[str, Any] = {
        semconv.GEN_AI_REQUEST_MODEL: body.model or backend.model_name,
        semconv.GEN_AI_RESPONSE_MODEL: backend.model_name,
        semconv.GEN_AI_REQUEST_TEMPERATURE: gen_request.temperature,
        semconv.LLM_REQUEST_MESSAGES: body.messages,
    }
    if body.tools:
        attributes[semconv.LLM_REQUEST_TOOLS] = body.tools

    def make_span(status: SpanStatus) -> Span:
        return Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            span_id=new_span_id(),
            trace_id=new_trace_id(),
            name=semconv.SPAN_LLM_CALL,
            start_time=start,
            end_time=time.time(),
            attributes=attributes,
            status=status,
        )

    try:
        result = await backend.generate(gen_request)
    except AgentboltError as exc:
        attributes[semconv.LLM_TRAINABLE] = False
        attributes[semconv.LLM_ERROR] = f"{type(exc).__name__}: {exc}"
        await store.add_span(make_span(SpanStatus(code="ERROR", description=str(exc))))
        status = 400 if isinstance(exc, ConfigError) else exc.http_status
        return _openai_error(status, type(exc).__name__, str(exc))

    message, finish = _response_message(result)
    response_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    attributes.update(
        {
            semconv.GEN_AI_RESPONSE_ID: response_id,
            semconv.GEN_AI_RESPONSE_FINISH_REASON: [finish],
            semconv.GEN_AI_USAGE_INPUT_TOKENS: len(result.prompt_token_ids),
            semconv.GEN_AI_USAGE_OUTPUT_TOKENS: len(result.response_token_ids),
            semconv.LLM_PROMPT_TOKEN_IDS: result.prompt_token_ids,
            semconv.LLM_RESPONSE_TOKEN_IDS: result.response_token_ids,
            semconv.LLM_RESPONSE_LOGPROBS: result.response_logprobs,
            semconv.LLM_RESPONSE_TEXT: result.text,
            semconv.LLM_RESPONSE_MESSAGE: message,
            semconv.LLM_MODEL_VERSION: result.model_version,
            semconv.LLM_TRAINABLE: True,
        }
    )
    await store.add_span(make_span(SpanStatus(code="OK")))
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(start),
        "model": backend.model_name,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish,
                "logprobs": None,
                # Extensions (vLLM names them the same way): the exact ids behind this choice.
                "token_ids": result.response_token_ids,
            }
        ],
        "prompt_token_ids": result.prompt_token_ids,
        "usage": {
            "prompt_tokens": len(result.prompt_token_ids),
            "completion_tokens": len(result.response_token_ids),
            "total_tokens": len(result.prompt_token_ids) + len(result.response_token_ids),
        },
        "system_fingerprint": result.model_version,
    }
