"""OpenAI-compatible ``POST /v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1/chat/completions``.

Every call is recorded in the attempt named in the URL as ``agentbolt.llm_call`` spans, one per choice, with the
exact prompt and response token ids and per-token sampling logprobs returned by the inference backend
(:mod:`agentbolt.server.gateway.recording`). Nothing is re-tokenized: the backend applies the chat template once and
the gateway stores what it got.

- ``stream: true``: a real server-sent event stream (:mod:`agentbolt.server.gateway.streaming`), recorded whole once
  generation ends.
- ``n > 1``: ``n`` separate generations (batched by the embedded backend; choice ``i`` seeded ``seed + i``), ``n``
  choices indexed ``0..n-1``, ``n`` spans: one transition per choice.
- Tool calls both ways: incoming assistant ``tool_calls`` (several, ``content`` null or absent) and ``role: tool``
  messages go to the backend's chat template as they are; tool calls the model writes (Qwen/Hermes
  ``<tool_call>`` tags, several in one answer, or a bare JSON call) come back as OpenAI ``tool_calls`` with unique
  ids (:mod:`agentbolt.server.gateway.toolcalls`), only when the request offered ``tools`` and only for the functions
  it declared; otherwise the text is the content, JSON or not.
- Any model name is accepted and served by the backend's model (the name asked for is recorded).
- Agent names: a ``x-agentbolt-agent`` request header is recorded as ``agentbolt.agent.name`` on the call's spans,
  and a W3C ``traceparent`` header makes them children of the caller's span (its trace id and parent span id), so
  the adapter can name the agent of a call no instrumented client recorded (:mod:`agentbolt.adapter.join`).
- Weight swaps: while a trainer swaps the serving weights, new calls wait instead of being rejected, up to the
  gate's hold limit (:mod:`agentbolt.server.gateway.swap`); the wait is recorded as ``agentbolt.llm.swap_wait_s``.
- Errors answer in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: no backend 503 (the message
  says how to start one), unknown rollout or attempt 404, attempt or rollout already finished 409, context length
  exceeded 400 ``context_length_exceeded``, other bad values 400, remote server failed 502, backend unavailable 503.
  A call that reached the backend and failed is recorded as a span with status ERROR and
  ``agentbolt.llm.trainable = False``: it never becomes a training sample.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from agentbolt import semconv
from agentbolt.errors import AgentboltError, ConflictError
from agentbolt.inference.base import (
    GenerationRequest,
    GenerationResult,
    GenerationStream,
    InferenceBackend,
    start_stream,
)
from agentbolt.server.gateway.openai_format import (
    ChatCompletionBody,
    ErrorInfo,
    assistant_message,
    backend_messages,
    completion_body,
    error_info,
    error_response,
    finish_reason,
    message_body,
)
from agentbolt.server.gateway.recording import REASON_NOT_DELIVERED, CallRecorder
from agentbolt.server.gateway.sampling import Sampling, requested_sampling, resolve_sampling
from agentbolt.server.gateway.streaming import SessionResponse, StreamSession
from agentbolt.server.gateway.swap import WeightSwapGate
from agentbolt.server.gateway.toolcalls import declared_tool_names
from agentbolt.store.base import LightningStore
from agentbolt.types import TERMINAL_ATTEMPT_STATUSES, TERMINAL_ROLLOUT_STATUSES, Attempt, Span

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1")

NO_BACKEND_MESSAGE = (
    "this agentbolt server has no inference backend, so its gateway cannot answer LLM calls; restart it with one: "
    "'agentbolt serve --model smollm2-135m' (embedded, on this machine's CPU), "
    "'agentbolt serve --backend vllm --backend-url http://HOST:8000/v1' (a running vLLM server), or "
    "'agentbolt serve --backend openai --backend-url URL --model NAME --api-key KEY' (any OpenAI-compatible API)"
)

_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A ``chat.completion`` object, or with ``stream: true`` a server-sent event stream of "
        "``chat.completion.chunk`` objects ending with ``data: [DONE]``.",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}


async def _check_attempt_open(store: LightningStore, rollout_id: str, attempt_id: str) -> Attempt:
    """The attempt; raises NotFoundError (unknown ids) or ConflictError (the attempt or its rollout is finished)."""
    attempt = await store.get_attempt(rollout_id, attempt_id)
    if attempt.status in TERMINAL_ATTEMPT_STATUSES:
        raise ConflictError(f"attempt {attempt_id} is already {attempt.status.value}; it takes no more LLM calls")
    rollout = await store.get_rollout(rollout_id)
    if rollout.status in TERMINAL_ROLLOUT_STATUSES:
        raise ConflictError(f"rollout {rollout_id} is already {rollout.status.value}; it takes no more LLM calls")
    return attempt


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")


def _traceparent(header: str | None) -> tuple[str, str] | None:
    """``(trace_id, parent span id)`` of a W3C ``traceparent`` header; ``None`` when absent, malformed or all zeros."""
    match = _TRACEPARENT.match((header or "").strip().lower())
    if match is None or not match.group(1).strip("0") or not match.group(2).strip("0"):
        return None
    return match.group(1), match.group(2)


def _generation_requests(body: ChatCompletionBody, sampling: Sampling) -> list[GenerationRequest]:
    messages = backend_messages(body.messages)
    return [
        GenerationRequest(
            messages=messages,
            tools=body.tools or None,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=None if body.seed is None else body.seed + index,
        )
        for index in range(body.choice_count)
    ]


def _failed_call_spans(
    recorder: CallRecorder, outcomes: list[GenerationResult | BaseException], tool_names: frozenset[str]
) -> tuple[ErrorInfo, list[Span]]:
    """Spans of a request in which some choice failed: ERROR spans for the failures; the choices that did generate
    are recorded too but never delivered, so not trainable. Returns the error to answer with (the first one)."""
    first = next(o for o in outcomes if isinstance(o, BaseException))
    answer = error_info(first)
    if answer.code == "internal_error":
        logger.error("a gateway call failed", exc_info=first)
    spans: list[Span] = []
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, BaseException):
            spans.append(recorder.error_span(index, error_info(outcome), outcome))
        else:
            content, tool_calls = assistant_message(outcome, tool_names)
            finish = finish_reason(outcome, bool(tool_calls))
            message = message_body(content, tool_calls)
            spans.append(
                recorder.result_span(index, outcome, message, finish, not_trainable_reason=REASON_NOT_DELIVERED)
            )
    return answer, spans


async def _start_streams(
    backend: InferenceBackend, requests: list[GenerationRequest]
) -> list[GenerationStream | BaseException]:
    outcomes = await asyncio.gather(*(start_stream(backend, r) for r in requests), return_exceptions=True)
    return list(outcomes)


@router.post("/chat/completions", responses=_RESPONSES)
async def chat_completions(rollout_id: str, attempt_id: str, body: ChatCompletionBody, request: Request) -> Response:
    """OpenAI Chat Completions for one attempt: served by the inference backend, recorded as one
    ``agentbolt.llm_call`` span per choice with the exact token ids. Supports ``stream`` (server-sent events,
    ``stream_options.include_usage``), ``n``, ``tools`` and tool-call messages; any ``model`` name maps to the
    served model. Errors answer in OpenAI's shape: 503 without a backend, 404 unknown attempt, 409 finished
    attempt, 400 ``context_length_exceeded`` or bad values, 502/503 backend failures (recorded as failed calls)."""
    store: LightningStore = request.app.state.store
    backend: InferenceBackend | None = request.app.state.backend
    if backend is None:
        return error_response(ErrorInfo(503, "api_error", NO_BACKEND_MESSAGE, "no_backend"))
    try:
        attempt = await _check_attempt_open(store, rollout_id, attempt_id)
    except AgentboltError as exc:
        return error_response(error_info(exc))

    llm = await request.app.state.version_llms.get(store, attempt.resources_id)
    sampling = resolve_sampling(requested_sampling(body), llm)
    requests = _generation_requests(body, sampling)
    attributes: dict[str, Any] = {
        semconv.GEN_AI_REQUEST_MODEL: body.model or backend.model_name,
        semconv.GEN_AI_RESPONSE_MODEL: backend.model_name,
        semconv.GEN_AI_REQUEST_TEMPERATURE: sampling.temperature,
        semconv.GEN_AI_REQUEST_TOP_P: sampling.top_p,
        semconv.GEN_AI_REQUEST_MAX_TOKENS: sampling.max_tokens,
        semconv.LLM_REQUEST_MESSAGES: body.messages,
        semconv.LLM_STREAM: bool(body.stream),
    }
    if sampling.requested:
        attributes[semconv.LLM_SAMPLING_REQUESTED] = sampling.requested
    if body.tools:
        attributes[semconv.LLM_REQUEST_TOOLS] = body.tools
    agent_name = (request.headers.get(semconv.AGENT_NAME_HEADER) or "").strip()
    if agent_name:
        attributes[semconv.AGENT_NAME] = agent_name
    held: AgentboltError | None = None
    gate: WeightSwapGate | None = getattr(request.app.state, "swap_gate", None)
    if gate is not None:
        try:
            waited_s = await gate.admit()
        except AgentboltError as exc:
            held, waited_s = exc, gate.hold_limit_s
        if waited_s > 0:
            attributes[semconv.LLM_SWAP_WAIT_S] = waited_s
    recorder = CallRecorder(
        store,
        rollout_id,
        attempt_id,
        attributes,
        f"chatcmpl-{uuid.uuid4().hex[:24]}",
        parent=_traceparent(request.headers.get("traceparent")),
    )
    if held is not None:  # the weight swap outlasted the gate's hold limit
        answer, spans = _failed_call_spans(recorder, [held] * len(requests), declared_tool_names(body.tools))
        await recorder.record(spans)
        return error_response(answer)

    if body.stream:
        return await _serve_stream(recorder, backend, requests, body)
    return await _serve_whole(recorder, backend, requests, declared_tool_names(body.tools))


async def _serve_whole(
    recorder: CallRecorder, backend: InferenceBackend, requests: list[GenerationRequest], tool_names: frozenset[str]
) -> Response:
    outcomes: list[GenerationResult | BaseException] = list(
        await asyncio.gather(*(backend.generate(r) for r in requests), return_exceptions=True)
    )
    if any(isinstance(o, BaseException) for o in outcomes):
        answer, spans = _failed_call_spans(recorder, outcomes, tool_names)
        await recorder.record(spans)
        return error_response(answer)
    results = [o for o in outcomes if isinstance(o, GenerationResult)]
    choices: list[tuple[GenerationResult, dict[str, Any], str]] = []
    for result in results:
        content, tool_calls = assistant_message(result, tool_names)
        choices.append((result, message_body(content, tool_calls), finish_reason(result, bool(tool_calls))))
    await recorder.record([recorder.result_span(index, *choice) for index, choice in enumerate(choices)])
    body = completion_body(
        response_id=recorder.response_id,
        created_s=int(recorder.start_s),
        model=backend.model_name,
        choices=choices,
    )
    return JSONResponse(body)


async def _serve_stream(
    recorder: CallRecorder, backend: InferenceBackend, requests: list[GenerationRequest], body: ChatCompletionBody
) -> Response:
    started = await _start_streams(backend, requests)
    if any(isinstance(s, BaseException) for s in started):
        # Known before the first byte (context length, bad values, backend down): a plain HTTP error.
        outcomes: list[GenerationResult | BaseException] = []
        for stream in started:
            if isinstance(stream, BaseException):
                outcomes.append(stream)
                continue
            stream.cancel()
            try:
                outcomes.append(await stream.result())
            except Exception as exc:
                outcomes.append(exc)
        answer, spans = _failed_call_spans(recorder, outcomes, declared_tool_names(body.tools))
        await recorder.record(spans)
        return error_response(answer)
    streams = [s for s in started if not isinstance(s, BaseException)]
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    session = StreamSession(
        recorder,
        streams,
        model=backend.model_name,
        include_usage=include_usage,
        tool_names=declared_tool_names(body.tools),
    )
    session.start()
    return SessionResponse(session)


plain_router = APIRouter(prefix="/v1")
"""``POST /v1/chat/completions``: the served model outside any rollout, for callers that are not agents (the prompt
optimizer's LLM, a quick check with the ``openai`` client). Nothing is recorded."""


@plain_router.post("/chat/completions", responses=_RESPONSES)
async def plain_chat_completions(body: ChatCompletionBody, request: Request) -> Response:
    """OpenAI Chat Completions served by the inference backend and recorded nowhere (no rollout, no spans): for
    callers that are not agents, such as the optimizer LLM of APO and GEPA. Supports ``n``, ``tools`` and tool-call
    messages like the rollout route; ``stream`` is refused (400: use the rollout route). The weight-swap gate
    applies. Errors answer in OpenAI's shape: 503 without a backend, 400 bad values or context length exceeded,
    502/503 backend failures."""
    backend: InferenceBackend | None = request.app.state.backend
    if backend is None:
        return error_response(ErrorInfo(503, "api_error", NO_BACKEND_MESSAGE, "no_backend"))
    if body.stream:
        message = (
            "stream is not served on /v1/chat/completions (it records nothing); ask without stream, or call the "
            "rollout route /v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1/chat/completions"
        )
        return error_response(ErrorInfo(400, "invalid_request_error", message, "stream_unsupported"))
    gate: WeightSwapGate | None = getattr(request.app.state, "swap_gate", None)
    if gate is not None:
        try:
            await gate.admit()
        except AgentboltError as exc:
            return error_response(error_info(exc))
    requests = _generation_requests(body, resolve_sampling(requested_sampling(body), None))
    outcomes = await asyncio.gather(*(backend.generate(r) for r in requests), return_exceptions=True)
    failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failed is not None:
        return error_response(error_info(failed))
    choices: list[tuple[GenerationResult, dict[str, Any], str]] = []
    tool_names = declared_tool_names(body.tools)
    for result in [o for o in outcomes if isinstance(o, GenerationResult)]:
        content, tool_calls = assistant_message(result, tool_names)
        choices.append((result, message_body(content, tool_calls), finish_reason(result, bool(tool_calls))))
    body_out = completion_body(
        response_id=f"chatcmpl-{uuid.uuid4().hex[:24]}",
        created_s=int(time.time()),
        model=backend.model_name,
        choices=choices,
    )
    return JSONResponse(body_out)
