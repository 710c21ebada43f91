"""The gateway outside any rollout: the four protocols under the server's plain ``/v1``, recorded nowhere.

For callers that are not agents in a training job: an agent served a trained checkpoint with ``agentbolt serve
--adapter`` (its own client, whatever API it was written for), the optimizer LLM of APO and GEPA, a quick check
with the ``openai`` or ``anthropic`` package. Each route is its rollout-scoped twin of
:mod:`agentbolt.server.gateway.routes` without the attempt: the same request parsing (a field that cannot be
honoured is a 400 naming it), the same sampling defaults, the same backend, the same answers and the same real
server-sent event streams token by token; nothing is stored and no attempt is kept alive
(:class:`~agentbolt.server.gateway.recording.UnrecordedCall`).

- ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses`` (``previous_response_id`` is
  refused: nothing is kept to continue from), ``POST /v1/messages``, ``POST /v1/messages/count_tokens``;
- ``GET /v1/models``: the served model.

Every call counts in ``app.state.unscoped_calls``: a training job warns when its agents' calls land here (an agent
that ignored ``llm.endpoint`` trains nothing).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response

from agentbolt.errors import AgentboltError
from agentbolt.inference.base import InferenceBackend
from agentbolt.server.gateway import anthropic_format, completions_format, responses_format
from agentbolt.server.gateway.calls import CallSpec, RequestRefused
from agentbolt.server.gateway.openai_format import ErrorInfo, chat_call, error_info
from agentbolt.server.gateway.recording import UnrecordedCall
from agentbolt.server.gateway.routes import (
    BODY_DOC,
    CHAT,
    COMPLETIONS,
    MESSAGES,
    NO_BACKEND_MESSAGE,
    RESPONSES,
    AnthropicErrorAnswer,
    CallContext,
    OpenAIErrorAnswer,
    Wire,
    build_spec,
    check_backend_fields,
    count_prompt_tokens,
    errors_doc,
    generation_requests,
    models_body,
    note_other_model,
    responses_doc,
    serve_stream,
    serve_whole,
    wire_error,
)
from agentbolt.server.gateway.sampling import resolve_sampling
from agentbolt.server.gateway.swap import WeightSwapGate

plain_router = APIRouter(prefix="/v1")
"""The routes of this module (mounted by :func:`agentbolt.server.app.create_app`)."""

_PLAIN_ERRORS = (400, 502, 503)


async def serve_unscoped(request: Request, make_spec: Callable[[], Any], wire: Wire) -> Response:
    """Serve one call of any protocol outside a rollout: build the spec (``make_spec``, sync or async;
    RequestRefused -> 400 naming the field), wait out a weight swap, sample with the request's own values (the
    defaults where absent), generate, answer in the protocol's shape (streamed when asked), store nothing."""
    backend: InferenceBackend | None = request.app.state.backend
    request.app.state.unscoped_calls += 1
    if backend is None:
        return wire_error(wire, ErrorInfo(503, "api_error", NO_BACKEND_MESSAGE, "no_backend"))
    try:
        spec = await build_spec(make_spec)
    except AgentboltError as exc:
        return wire_error(wire, error_info(exc))
    note_other_model(spec, backend)
    sampling = resolve_sampling(spec.sampling_requested, None)
    requests = generation_requests(spec, sampling)
    try:
        check_backend_fields(backend, requests[0])
    except AgentboltError as exc:
        return wire_error(wire, error_info(exc))
    gate: WeightSwapGate | None = getattr(request.app.state, "swap_gate", None)
    if gate is not None:
        try:
            await gate.admit()
        except AgentboltError as exc:
            return wire_error(wire, error_info(exc))
    call = UnrecordedCall(request.app.state.store, f"{wire.id_prefix}{uuid.uuid4().hex[:24]}")
    context = CallContext(call.response_id, int(call.start_s), backend.model_name, sampling)
    if spec.stream:
        return await serve_stream(call, backend, requests, spec, wire, context)
    return await serve_whole(request, call, backend, requests, spec, wire, context)


@plain_router.get("/models", responses=errors_doc(OpenAIErrorAnswer, 503))
async def plain_models(request: Request) -> Response:
    """OpenAI ``GET /v1/models``: the served model."""
    backend: InferenceBackend | None = request.app.state.backend
    if backend is None:
        return wire_error(CHAT, ErrorInfo(503, "api_error", NO_BACKEND_MESSAGE, "no_backend"))
    return JSONResponse(models_body(backend))


@plain_router.post(
    "/chat/completions",
    responses=responses_doc("A ``chat.completion`` object", errors_doc(OpenAIErrorAnswer, *_PLAIN_ERRORS)),
)
async def plain_chat_completions(request: Request, body: dict[str, Any] = Body(description=BODY_DOC)) -> Response:
    """OpenAI Chat Completions served by the inference backend and recorded nowhere: the fields, streaming and
    errors of the rollout route (``.../chat/completions`` under an attempt) without the attempt."""
    return await serve_unscoped(request, lambda: chat_call(body), CHAT)


@plain_router.post(
    "/completions",
    responses=responses_doc("A ``text_completion`` object", errors_doc(OpenAIErrorAnswer, *_PLAIN_ERRORS)),
)
async def plain_completions(request: Request, body: dict[str, Any] = Body(description=BODY_DOC)) -> Response:
    """OpenAI (legacy) Completions, recorded nowhere: the prompt (text or token ids) is fed as it is, without a chat
    template."""
    return await serve_unscoped(request, lambda: completions_format.completions_call(body), COMPLETIONS)


@plain_router.post(
    "/responses", responses=responses_doc("A ``response`` object", errors_doc(OpenAIErrorAnswer, *_PLAIN_ERRORS))
)
async def plain_responses(request: Request, body: dict[str, Any] = Body(description=BODY_DOC)) -> Response:
    """OpenAI Responses, recorded nowhere. ``previous_response_id`` is refused with a 400 (no response is kept
    here: send the whole conversation as ``input``)."""

    def make_spec() -> CallSpec:
        if isinstance(body, dict) and body.get("previous_response_id") is not None:
            raise RequestRefused(
                "previous_response_id: the server's plain /v1 routes keep no responses to continue from; send the "
                "whole conversation as input (responses are kept per rollout under a rollout's llm.endpoint)",
                "previous_response_id",
                "previous_response_not_found",
            )
        return responses_format.responses_call(body, None)

    return await serve_unscoped(request, make_spec, RESPONSES)


@plain_router.post(
    "/messages",
    responses=responses_doc("An Anthropic ``message`` object", errors_doc(AnthropicErrorAnswer, *_PLAIN_ERRORS)),
)
async def plain_messages(request: Request, body: dict[str, Any] = Body(description=BODY_DOC)) -> Response:
    """Anthropic Messages, recorded nowhere; errors in Anthropic's shape."""
    return await serve_unscoped(request, lambda: anthropic_format.messages_call(body), MESSAGES)


@plain_router.post("/messages/count_tokens", responses=errors_doc(AnthropicErrorAnswer, 400, 503))
async def plain_count_tokens(request: Request, body: dict[str, Any] = Body(description=BODY_DOC)) -> Response:
    """Anthropic ``count_tokens``: ``{"input_tokens": N}`` as the served model's chat template renders the prompt."""
    return count_prompt_tokens(request.app.state.backend, body)
