"""The gateway's routes: four wire protocols under ``/v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1``.

- ``POST .../chat/completions``: OpenAI Chat Completions (:mod:`agentbolt.server.gateway.openai_format`);
- ``POST .../completions``: OpenAI (legacy) Completions, text in and text out, no chat template
  (:mod:`agentbolt.server.gateway.completions_format`);
- ``POST .../responses``: OpenAI Responses (:mod:`agentbolt.server.gateway.responses_format`), with
  ``previous_response_id`` resolved from the calls recorded in the same rollout;
- ``POST .../messages`` and ``POST .../messages/count_tokens``: Anthropic Messages
  (:mod:`agentbolt.server.gateway.anthropic_format`); ``x-api-key`` is accepted like a bearer token;
- ``GET .../models``: the served model.

Each protocol module turns its body into a :class:`~agentbolt.server.gateway.calls.CallSpec` (a field it cannot
honour is a 400 naming it, in the protocol's own error shape) and writes the answer back; everything between is
shared (:func:`serve_call`): the sampling rules of the attempt's resources version
(:mod:`agentbolt.server.gateway.sampling`), the inference backend, and the recording of one ``agentbolt.llm_call``
span per choice with the exact prompt and response token ids and per-token sampling logprobs
(:mod:`agentbolt.server.gateway.recording`). Nothing is re-tokenized: the backend applies the chat template once
and the gateway stores what it got. Every protocol's messages are OpenAI chat messages by then, rendered by the
same template, so transitions of all four merge across turns by the same prefix rule.

- ``stream: true``: a real server-sent event stream (:mod:`agentbolt.server.gateway.streaming`), recorded whole once
  generation ends.
- ``n > 1`` (Chat Completions, Completions): ``n`` separate generations (choice ``i`` seeded ``seed + i``), ``n``
  choices, ``n`` spans: one transition per choice.
- Tool calls both ways; tool calls the model writes (Qwen/Hermes ``<tool_call>`` tags, several in one answer, or a
  bare JSON call) come back as the protocol's tool calls (:mod:`agentbolt.server.gateway.toolcalls`), only when the
  request offered tools (and ``tool_choice`` is not ``none``) and only for the functions it declared.
- Any model name is accepted and served by the backend's model (the name asked for is recorded; a name other than
  the served one is logged once per process: :func:`other_model_note`).
- Agent names: a ``x-agentbolt-agent`` request header is recorded as ``agentbolt.agent.name`` on the call's spans,
  and a W3C ``traceparent`` header makes them children of the caller's span (:mod:`agentbolt.adapter.join`).
- Weight swaps: while a trainer swaps the serving weights, new calls wait instead of being rejected, up to the
  gate's hold limit (:mod:`agentbolt.server.gateway.swap`); the wait is recorded as ``agentbolt.llm.swap_wait_s``.
- Errors: no backend 503 (the message says how to start one), unknown rollout or attempt 404, attempt or rollout
  already finished 409, context length exceeded 400 ``context_length_exceeded``, other bad values 400, remote server
  failed 502, backend unavailable 503. A call that reached the backend and failed is recorded as a span with status
  ERROR and ``agentbolt.llm.trainable = False``: it never becomes a training sample.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from agentbolt import semconv
from agentbolt.errors import AgentboltError, ConflictError
from agentbolt.inference.base import (
    GenerationRequest,
    GenerationResult,
    GenerationStream,
    InferenceBackend,
    start_stream,
)
from agentbolt.inference.remote import refuse_unforwarded
from agentbolt.server.gateway import anthropic_format, completions_format, responses_format
from agentbolt.server.gateway.calls import CallSpec, ChoiceOutput, RequestRefused, StreamEncoder
from agentbolt.server.gateway.openai_format import (
    ChatStreamEncoder,
    ErrorInfo,
    chat_call,
    choice_output,
    completion_body,
    error_body,
    error_info,
    message_body,
    offered_tool_names,
)
from agentbolt.server.gateway.recording import REASON_NOT_DELIVERED, CallRecorder, keepalive_interval
from agentbolt.server.gateway.sampling import Sampling, resolve_sampling
from agentbolt.server.gateway.streaming import SessionResponse, StreamSession
from agentbolt.server.gateway.swap import WeightSwapGate
from agentbolt.store.base import LightningStore
from agentbolt.types import TERMINAL_ATTEMPT_STATUSES, TERMINAL_ROLLOUT_STATUSES, Attempt, Rollout, Span

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1")

NO_BACKEND_MESSAGE = (
    "this agentbolt server has no inference backend, so its gateway cannot answer LLM calls; restart it with one: "
    "'agentbolt serve --model smollm2-135m' (embedded, on this machine's CPU), "
    "'agentbolt serve --backend vllm --backend-url http://HOST:8000/v1' (a running vLLM server), or "
    "'agentbolt serve --backend openai --backend-url URL --model NAME --api-key KEY' (any OpenAI-compatible API)"
)


@dataclass(frozen=True)
class CallContext:
    """What a protocol needs besides the spec and the outputs to write its answer."""

    response_id: str
    created_s: int
    model: str
    sampling: Sampling
    prompt_tokens: int | None = None
    """The prompt's length when the backend can tell it before generating (Anthropic's ``message_start``)."""


@dataclass(frozen=True)
class Wire:
    """One wire protocol as the shared serving code sees it."""

    name: str
    id_prefix: str
    body: Callable[[CallSpec, list[ChoiceOutput], CallContext], dict[str, Any]]
    encoder: Callable[[CallSpec, CallContext], StreamEncoder]
    error_body: Callable[[ErrorInfo], dict[str, Any]] = error_body


def wire_error(wire: Wire, info: ErrorInfo) -> JSONResponse:
    return JSONResponse(status_code=info.status, content=wire.error_body(info))


CHAT = Wire(
    "chat.completions",
    "chatcmpl-",
    lambda spec, outputs, ctx: completion_body(
        spec, outputs, response_id=ctx.response_id, created_s=ctx.created_s, model=ctx.model
    ),
    lambda spec, ctx: ChatStreamEncoder(spec, response_id=ctx.response_id, created_s=ctx.created_s, model=ctx.model),
)
COMPLETIONS = Wire(
    "completions",
    "cmpl-",
    lambda spec, outputs, ctx: completions_format.completion_body(
        spec, outputs, response_id=ctx.response_id, created_s=ctx.created_s, model=ctx.model
    ),
    lambda spec, ctx: completions_format.CompletionsStreamEncoder(
        spec, response_id=ctx.response_id, created_s=ctx.created_s, model=ctx.model
    ),
)


def _applied(ctx: CallContext) -> dict[str, Any]:
    return {
        "temperature": ctx.sampling.temperature,
        "top_p": ctx.sampling.top_p,
        "max_tokens": ctx.sampling.max_tokens,
    }


RESPONSES = Wire(
    "responses",
    "resp_",
    lambda spec, outputs, ctx: responses_format.response_body(
        spec,
        outputs[0],
        response_id=ctx.response_id,
        created_s=ctx.created_s,
        model=ctx.model,
        applied=_applied(ctx),
    ),
    lambda spec, ctx: responses_format.ResponsesStreamEncoder(
        spec, response_id=ctx.response_id, created_s=ctx.created_s, model=ctx.model, applied=_applied(ctx)
    ),
)
MESSAGES = Wire(
    "messages",
    "msg_",
    lambda spec, outputs, ctx: anthropic_format.message_body(outputs[0], message_id=ctx.response_id, model=ctx.model),
    lambda spec, ctx: anthropic_format.MessagesStreamEncoder(
        message_id=ctx.response_id, model=ctx.model, input_tokens=ctx.prompt_tokens or 0
    ),
    lambda info: anthropic_format.anthropic_error_body(info.status, info.message),
)


async def _check_attempt_open(store: LightningStore, rollout_id: str, attempt_id: str) -> tuple[Rollout, Attempt]:
    """The rollout and attempt; raises NotFoundError (unknown ids) or ConflictError (the attempt or its rollout is
    finished)."""
    attempt = await store.get_attempt(rollout_id, attempt_id)
    if attempt.status in TERMINAL_ATTEMPT_STATUSES:
        raise ConflictError(f"attempt {attempt_id} is already {attempt.status.value}; it takes no more LLM calls")
    rollout = await store.get_rollout(rollout_id)
    if rollout.status in TERMINAL_ROLLOUT_STATUSES:
        raise ConflictError(f"rollout {rollout_id} is already {rollout.status.value}; it takes no more LLM calls")
    return rollout, attempt


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")


def _traceparent(header: str | None) -> tuple[str, str] | None:
    """``(trace_id, parent span id)`` of a W3C ``traceparent`` header; ``None`` when absent, malformed or all zeros."""
    match = _TRACEPARENT.match((header or "").strip().lower())
    if match is None or not match.group(1).strip("0") or not match.group(2).strip("0"):
        return None
    return match.group(1), match.group(2)


TOOL_CALL_END = "</tool_call>"
"""Where a tagged tool call ends: with ``parallel_tool_calls: false`` generation stops there (kept in the text)."""


def generation_requests(spec: CallSpec, sampling: Sampling) -> list[GenerationRequest]:
    """The backend requests of ``spec``: one per choice (choice ``i`` seeded ``seed + i``)."""
    single_call = not spec.parallel_tool_calls and spec.tool_choice.mode == "auto" and bool(offered_tool_names(spec))
    return [
        GenerationRequest(
            messages=spec.messages,
            tools=spec.tools,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=None if spec.seed is None else spec.seed + index,
            prompt=spec.prompt,
            stop=spec.stop,
            stop_inclusive=(TOOL_CALL_END,) if single_call else (),
            logprobs=spec.logprobs,
            top_logprobs=spec.top_logprobs,
            presence_penalty=spec.presence_penalty,
            frequency_penalty=spec.frequency_penalty,
            logit_bias=spec.logit_bias,
            tool_choice=spec.tool_choice,
            parallel_tool_calls=spec.parallel_tool_calls,
            output_format=spec.output_format,
            chat_template_kwargs=spec.chat_template_kwargs,
        )
        for index in range(spec.n)
    ]


def check_backend_fields(backend: InferenceBackend, request: GenerationRequest) -> None:
    """Refuse, before anything is generated or recorded, a request field the backend cannot pass on (its
    ``refused_request_fields``, e.g. a raw prompt on the ``vllm`` backend).

    Raises:
        RequestRefused: naming the field.
    """
    refused: frozenset[str] = getattr(backend, "refused_request_fields", frozenset())
    if refused:
        refuse_unforwarded(request, getattr(backend, "backend_name", type(backend).__name__), refused)


def _enforce_version(spec: CallSpec, sampling: Sampling, enforced: bool) -> tuple[CallSpec, dict[str, Any]]:
    """Under a job's version (``enforced``) the penalties and logit bias are not applied either: the trainer's
    logprobs assume the plain tempered distribution. Returns the spec to serve and what the caller asked for."""
    requested: dict[str, Any] = dict(sampling.requested)
    asked = {
        "presence_penalty": spec.presence_penalty,
        "frequency_penalty": spec.frequency_penalty,
        "logit_bias": spec.logit_bias,
    }
    asked = {key: value for key, value in asked.items() if value}
    requested.update(asked)
    if enforced and asked:
        spec = dataclasses.replace(spec, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None)
    return spec, requested


def _request_attributes(
    spec: CallSpec, sampling: Sampling, requested: dict[str, Any], backend: InferenceBackend, request: Request
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        semconv.LLM_PROTOCOL: spec.protocol,
        semconv.GEN_AI_REQUEST_MODEL: spec.model or backend.model_name,
        semconv.GEN_AI_RESPONSE_MODEL: backend.model_name,
        semconv.GEN_AI_REQUEST_TEMPERATURE: sampling.temperature,
        semconv.GEN_AI_REQUEST_TOP_P: sampling.top_p,
        semconv.GEN_AI_REQUEST_MAX_TOKENS: sampling.max_tokens,
        semconv.LLM_STREAM: spec.stream,
        **spec.attributes,
    }
    if spec.prompt is not None:
        attributes[semconv.LLM_REQUEST_PROMPT] = spec.prompt
    else:
        attributes[semconv.LLM_REQUEST_MESSAGES] = spec.record_messages or spec.messages
    if spec.presence_penalty:
        attributes[semconv.GEN_AI_REQUEST_PRESENCE_PENALTY] = spec.presence_penalty
    if spec.frequency_penalty:
        attributes[semconv.GEN_AI_REQUEST_FREQUENCY_PENALTY] = spec.frequency_penalty
    if spec.stop:
        attributes[semconv.GEN_AI_REQUEST_STOP_SEQUENCES] = list(spec.stop)
    if spec.seed is not None:
        attributes[semconv.GEN_AI_REQUEST_SEED] = spec.seed
    if spec.n != 1:
        attributes[semconv.GEN_AI_REQUEST_CHOICE_COUNT] = spec.n
    constraints: dict[str, Any] = {}
    if spec.tool_choice.mode != "auto":
        constraints["tool_choice"] = dataclasses.asdict(spec.tool_choice)
    if not spec.parallel_tool_calls:
        constraints["parallel_tool_calls"] = False
    if spec.output_format is not None:
        constraints["response_format"] = dataclasses.asdict(spec.output_format)
    if constraints:
        attributes[semconv.LLM_REQUEST_CONSTRAINTS] = constraints
    if requested:
        attributes[semconv.LLM_SAMPLING_REQUESTED] = requested
    if spec.tools:
        attributes[semconv.LLM_REQUEST_TOOLS] = spec.tools
    agent_name = (request.headers.get(semconv.AGENT_NAME_HEADER) or "").strip()
    if agent_name:
        attributes[semconv.AGENT_NAME] = agent_name
    return attributes


def _failed_call_spans(
    recorder: CallRecorder, outcomes: list[GenerationResult | BaseException], spec: CallSpec
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
            output = choice_output(index, outcome, spec)
            message = message_body(output.content, output.tool_calls)
            spans.append(
                recorder.result_span(index, outcome, message, output.finish, not_trainable_reason=REASON_NOT_DELIVERED)
            )
    return answer, spans


async def build_spec(make_spec: Callable[[], Any]) -> CallSpec:
    """The call's spec from ``make_spec`` (sync, or returning a coroutine). Raises what it raises (RequestRefused:
    a field that cannot be honoured)."""
    spec = make_spec()
    if asyncio.iscoroutine(spec):
        spec = await spec
    assert isinstance(spec, CallSpec)
    return spec


_MODEL_NAMES_SEEN: set[tuple[str, str]] = set()


def other_model_note(requested: str | None, served: str) -> str | None:
    """The line to log, once per process and name, when a call names another model than the one served: the gateway
    answers every name with its model (an agent written for ``gpt-4o`` runs unchanged; the name asked for is
    recorded as ``gen_ai.request.model``), where vLLM would answer 404. ``None`` when the names match or the note
    was given."""
    if not requested or requested == served or (requested, served) in _MODEL_NAMES_SEEN:
        return None
    _MODEL_NAMES_SEEN.add((requested, served))
    return (
        f"LLM calls name the model {requested!r}; this gateway answers every model name with {served!r} (the name "
        "asked for is recorded as gen_ai.request.model)"
    )


def note_other_model(spec: CallSpec, backend: InferenceBackend) -> None:
    """Log :func:`other_model_note` for this call, if any."""
    note = other_model_note(spec.model, backend.model_name)
    if note is not None:
        logger.warning(note)


async def serve_call(
    request: Request, rollout_id: str, attempt_id: str, make_spec: Callable[[], Any], wire: Wire
) -> Response:
    """Serve one call of any protocol in attempt ``attempt_id``: check the attempt, build the spec
    (``make_spec``, sync or async; RequestRefused -> 400 naming the field), resolve sampling against the attempt's
    resources version, generate, record one span per choice, answer in the protocol's shape."""
    store: LightningStore = request.app.state.store
    backend: InferenceBackend | None = request.app.state.backend
    if backend is None:
        return wire_error(wire, ErrorInfo(503, "api_error", NO_BACKEND_MESSAGE, "no_backend"))
    try:
        rollout, attempt = await _check_attempt_open(store, rollout_id, attempt_id)
        spec = await build_spec(make_spec)
    except AgentboltError as exc:
        return wire_error(wire, error_info(exc))
    note_other_model(spec, backend)

    llm = await request.app.state.version_llms.get(store, attempt.resources_id)
    sampling = resolve_sampling(spec.sampling_requested, llm)
    spec, requested = _enforce_version(spec, sampling, llm is not None and llm.sampling_enforced)
    requests = generation_requests(spec, sampling)
    try:
        check_backend_fields(backend, requests[0])
    except AgentboltError as exc:
        return wire_error(wire, error_info(exc))
    attributes = _request_attributes(spec, sampling, requested, backend, request)
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
        f"{wire.id_prefix}{uuid.uuid4().hex[:24]}",
        parent=_traceparent(request.headers.get("traceparent")),
        worker_id=attempt.worker_id,
        keepalive_s=keepalive_interval(rollout.config.unresponsive_seconds),
    )
    if held is not None:  # the weight swap outlasted the gate's hold limit
        answer, spans = _failed_call_spans(recorder, [held] * len(requests), spec)
        await recorder.record(spans)
        return wire_error(wire, answer)
    context = CallContext(recorder.response_id, int(recorder.start_s), backend.model_name, sampling)
    if spec.stream:  # the session keeps the attempt alive while it streams
        return await serve_stream(recorder, backend, requests, spec, wire, context)
    async with recorder.keepalive():
        return await serve_whole(request, recorder, backend, requests, spec, wire, context)


DISCONNECT_POLL_S = 0.5
"""How often (seconds) a non-streamed call asks again whether its client left, with an ASGI server whose
``receive()`` does not wait for the disconnect (uvicorn waits: no polling there)."""
CLIENT_GONE_CODE = "client_disconnected"
"""``agentbolt.llm.error_code`` of a non-streamed call whose client left before the answer: never trained (the agent
did not see it), not an infrastructure failure."""


async def _generate_while_connected(
    request: Request, backend: InferenceBackend, requests: list[GenerationRequest]
) -> list[GenerationResult | BaseException] | None:
    """Generate every choice; ``None`` when the client disconnected first (generation is then cancelled, which ends
    the backend's rows at once)."""
    task = asyncio.ensure_future(asyncio.gather(*(backend.generate(r) for r in requests), return_exceptions=True))
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return list(task.result())
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None
    finally:
        gone.cancel()
        if not task.done():  # this handler was cancelled (server shutdown): the generation goes with it
            task.cancel()


async def _client_gone(request: Request) -> None:
    """Return once the client has disconnected. The request body has been read, so the ASGI server's next message is
    ``http.disconnect`` and ``receive()`` waits for it without polling (uvicorn wakes it when the connection is
    lost); a server that answers at once with anything else is asked again every ``DISCONNECT_POLL_S``. Polling
    ``request.is_disconnected()`` instead woke the event loop twice a second per call in flight, and each wake-up
    takes the GIL from the embedded backend's generation thread."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return
        await asyncio.sleep(DISCONNECT_POLL_S)


async def serve_whole(
    request: Request,
    recorder: CallRecorder,
    backend: InferenceBackend,
    requests: list[GenerationRequest],
    spec: CallSpec,
    wire: Wire,
    context: CallContext,
) -> Response:
    maybe = await _generate_while_connected(request, backend, requests)
    if maybe is None:  # nobody to answer: the call is recorded as failed, so it is neither trained nor lost
        gone = ErrorInfo(499, "client_closed_request", "the client disconnected before the answer", CLIENT_GONE_CODE)
        exc = ConnectionAbortedError(gone.message)
        await recorder.record([recorder.error_span(index, gone, exc) for index in range(len(requests))])
        return wire_error(wire, gone)
    outcomes: list[GenerationResult | BaseException] = maybe
    refused = next((o for o in outcomes if isinstance(o, RequestRefused)), None)
    if refused is not None:  # a field the backend cannot honour: nothing was generated, nothing is recorded
        return wire_error(wire, error_info(refused))
    if any(isinstance(o, BaseException) for o in outcomes):
        answer, spans = _failed_call_spans(recorder, outcomes, spec)
        await recorder.record(spans)
        return wire_error(wire, answer)
    outputs = [choice_output(index, o, spec) for index, o in enumerate(outcomes) if isinstance(o, GenerationResult)]
    await recorder.record(
        [recorder.result_span(o.index, o.result, message_body(o.content, o.tool_calls), o.finish) for o in outputs]
    )
    return JSONResponse(wire.body(spec, outputs, context))


async def serve_stream(
    recorder: CallRecorder,
    backend: InferenceBackend,
    requests: list[GenerationRequest],
    spec: CallSpec,
    wire: Wire,
    context: CallContext,
) -> Response:
    started: list[GenerationStream | BaseException] = list(
        await asyncio.gather(*(start_stream(backend, r) for r in requests), return_exceptions=True)
    )
    if any(isinstance(s, BaseException) for s in started):
        # Known before the first byte (context length, bad values, backend down): a plain HTTP error.
        refused = next((s for s in started if isinstance(s, RequestRefused)), None)
        if refused is not None:  # nothing was generated, nothing is recorded
            for stream in started:
                if not isinstance(stream, BaseException):
                    stream.cancel()
            return wire_error(wire, error_info(refused))
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
        answer, spans = _failed_call_spans(recorder, outcomes, spec)
        await recorder.record(spans)
        return wire_error(wire, answer)
    streams = [s for s in started if not isinstance(s, BaseException)]
    prompt_tokens = getattr(streams[0], "prompt_tokens", None) if streams else None
    context = dataclasses.replace(context, prompt_tokens=prompt_tokens)
    session = StreamSession(recorder, streams, spec, wire.encoder(spec, context))
    session.start()
    return SessionResponse(session)


def gateway_validation_error(path: str, message: str) -> JSONResponse | None:
    """The answer to a body that is not valid JSON (or not an object) on a gateway LLM route: a 400 in the
    protocol's error shape (Anthropic's on ``.../messages``, OpenAI's elsewhere); ``None`` for other routes."""
    if not path.startswith("/v1/") or not path.endswith(("/completions", "/responses", "/messages", "/count_tokens")):
        return None
    wire = MESSAGES if path.endswith(("/messages", "/count_tokens")) else CHAT
    return wire_error(wire, ErrorInfo(400, "invalid_request_error", message, "invalid_json"))


BODY_DOC = "The protocol's request body (JSON object); every field is honoured, recorded or refused with a 400."


class OpenAIErrorObject(BaseModel):
    """``error`` of an answer in OpenAI's error shape."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorAnswer(BaseModel):
    """An error of the OpenAI-protocol routes: ``{"error": {"message", "type", "param", "code"}}``."""

    error: OpenAIErrorObject


class AnthropicErrorObject(BaseModel):
    """``error`` of an answer in Anthropic's error shape."""

    type: str
    message: str


class AnthropicErrorAnswer(BaseModel):
    """An error of the Anthropic-protocol routes: ``{"type": "error", "error": {"type", "message"}}``."""

    type: Literal["error"]
    error: AnthropicErrorObject


_GATEWAY_ERRORS: dict[int, str] = {
    400: "a field the gateway cannot honour (named in the error), a bad value, a body that is not a JSON object, or "
    "context_length_exceeded; nothing is generated",
    404: "unknown rollout or attempt",
    409: "the attempt or its rollout has finished: it takes no more LLM calls",
    502: "the remote inference server failed (recorded as a failed call)",
    503: "no inference backend (agentbolt serve without --model or --backend; the message says how to start one), "
    "or the backend is unavailable",
}
"""The gateway's error answers, in the protocol's own shape (the guards' 401 and 413 are declared app-wide)."""


def errors_doc(answer: type[BaseModel], *statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": answer, "description": _GATEWAY_ERRORS[status]} for status in statuses}


_CALL_ERRORS = (400, 404, 409, 502, 503)


def responses_doc(kind: str, errors: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "description": f"{kind}, or with ``stream: true`` a server-sent event stream.",
            "content": {"application/json": {}, "text/event-stream": {}},
        },
        **errors,
    }


@router.post(
    "/chat/completions",
    responses=responses_doc("A ``chat.completion`` object", errors_doc(OpenAIErrorAnswer, *_CALL_ERRORS)),
)
async def chat_completions(
    rollout_id: str, attempt_id: str, request: Request, body: dict[str, Any] = Body(description=BODY_DOC)
) -> Response:
    """OpenAI Chat Completions for one attempt: served by the inference backend, recorded as one
    ``agentbolt.llm_call`` span per choice with the exact token ids. Every request field of the real API is
    honoured, recorded or refused with a 400 that names it (docs/gateway_conformance.md): ``stop``, ``tool_choice``,
    ``parallel_tool_calls``, ``response_format`` (constrained decoding), ``logprobs``/``top_logprobs``, ``n``,
    ``seed``, penalties, ``stream`` with ``stream_options.include_usage``; images and audio are refused (text-only
    model). Errors answer in OpenAI's shape: 503 without a backend, 404 unknown attempt, 409 finished attempt, 400
    ``context_length_exceeded`` or bad values, 502/503 backend failures (recorded as failed calls)."""
    return await serve_call(request, rollout_id, attempt_id, lambda: chat_call(body), CHAT)


@router.post(
    "/completions",
    responses=responses_doc("A ``text_completion`` object", errors_doc(OpenAIErrorAnswer, *_CALL_ERRORS)),
)
async def completions(
    rollout_id: str, attempt_id: str, request: Request, body: dict[str, Any] = Body(description=BODY_DOC)
) -> Response:
    """OpenAI (legacy) Completions for one attempt: the prompt (text or token ids) is fed as it is, without a chat
    template; recorded like a chat call, with the exact ids. ``stop``, ``logprobs`` (0..5, the legacy shape),
    ``n``, ``seed``, penalties, ``stream`` are honoured; ``echo``, ``suffix``, ``best_of`` > ``n`` and several
    prompts in one request are refused with a 400 that names the field."""
    return await serve_call(
        request, rollout_id, attempt_id, lambda: completions_format.completions_call(body), COMPLETIONS
    )


async def previous_messages(store: LightningStore, rollout_id: str, response_id: str) -> list[dict[str, Any]]:
    """The conversation of Responses call ``response_id`` recorded in ``rollout_id``: its request messages and the
    assistant message it answered, as chat messages.

    Raises:
        RequestRefused: no such response in this rollout (param ``previous_response_id``).
    """
    spans = await store.query_spans(rollout_id)
    for span in reversed(spans):
        attributes = span.attributes
        if span.name != semconv.SPAN_LLM_CALL or attributes.get(semconv.GEN_AI_RESPONSE_ID) != response_id:
            continue
        if span.status.code == "ERROR" or attributes.get(semconv.LLM_CHOICE_INDEX, 0) != 0:
            continue
        messages = list(attributes.get(semconv.LLM_REQUEST_MESSAGES) or [])
        answer = attributes.get(semconv.LLM_RESPONSE_MESSAGE)
        return messages + ([answer] if isinstance(answer, dict) else [])
    raise RequestRefused(
        f"previous_response_id {response_id!r} is not a response of rollout {rollout_id}; responses are kept per "
        "rollout: send the whole conversation as input instead",
        "previous_response_id",
        "previous_response_not_found",
    )


@router.post(
    "/responses", responses=responses_doc("A ``response`` object", errors_doc(OpenAIErrorAnswer, *_CALL_ERRORS))
)
async def responses(
    rollout_id: str, attempt_id: str, request: Request, body: dict[str, Any] = Body(description=BODY_DOC)
) -> Response:
    """OpenAI Responses for one attempt: ``instructions``, input items (messages, ``function_call``,
    ``function_call_output``), function tools, ``previous_response_id`` (resolved from the calls recorded in this
    rollout), ``text.format`` (constrained decoding), ``stream`` with the typed events. Recorded like a chat call,
    with the exact ids. Fields that cannot be honoured (hosted tools, images, ``background``...) get a 400 that
    names them."""
    store: LightningStore = request.app.state.store

    async def make_spec() -> CallSpec:
        previous_id = body.get("previous_response_id") if isinstance(body, dict) else None
        history = await previous_messages(store, rollout_id, previous_id) if isinstance(previous_id, str) else None
        return responses_format.responses_call(body, history)

    return await serve_call(request, rollout_id, attempt_id, make_spec, RESPONSES)


@router.post(
    "/messages",
    responses=responses_doc("An Anthropic ``message`` object", errors_doc(AnthropicErrorAnswer, *_CALL_ERRORS)),
)
async def messages(
    rollout_id: str, attempt_id: str, request: Request, body: dict[str, Any] = Body(description=BODY_DOC)
) -> Response:
    """Anthropic Messages for one attempt: ``system``, content blocks, ``tool_use``/``tool_result``,
    ``stop_sequences``, ``tool_choice``, ``stream`` with the typed events; ``x-api-key`` is accepted like a bearer
    token. Recorded like a chat call, with the exact ids. Errors answer in Anthropic's shape
    (``{"type": "error", "error": {"type", "message"}}``)."""
    return await serve_call(request, rollout_id, attempt_id, lambda: anthropic_format.messages_call(body), MESSAGES)


@router.post("/messages/count_tokens", responses=errors_doc(AnthropicErrorAnswer, 400, 404, 409, 503))
async def count_tokens(
    rollout_id: str, attempt_id: str, request: Request, body: dict[str, Any] = Body(description=BODY_DOC)
) -> Response:
    """Anthropic ``count_tokens``: ``{"input_tokens": N}``, the prompt's length as the served model's chat template
    renders it. Needs a backend that tokenizes (embedded, a token engine); others answer 400."""
    if request.app.state.backend is not None:
        try:
            await _check_attempt_open(request.app.state.store, rollout_id, attempt_id)
        except AgentboltError as exc:
            return wire_error(MESSAGES, error_info(exc))
    return count_prompt_tokens(request.app.state.backend, body)


def count_prompt_tokens(backend: InferenceBackend | None, body: dict[str, Any]) -> Response:
    """Anthropic ``count_tokens`` of ``body`` on ``backend``: ``{"input_tokens": N}``, or the error in Anthropic's
    shape (503 no backend; 400 a bad body, or a backend that does not tokenize)."""
    if backend is None:
        return wire_error(MESSAGES, ErrorInfo(503, "api_error", NO_BACKEND_MESSAGE, "no_backend"))
    try:
        spec = anthropic_format.count_tokens_call(body)
        encode = getattr(backend, "encode_prompt", None)
        if encode is None:
            raise RequestRefused("count_tokens needs a backend that tokenizes the prompt (embedded, or a token engine)")
        ids = encode(spec.messages, spec.tools, spec.chat_template_kwargs)
    except AgentboltError as exc:
        return wire_error(MESSAGES, error_info(exc))
    return JSONResponse({"input_tokens": len(ids)})


def models_body(backend: InferenceBackend) -> dict[str, Any]:
    """``GET /v1/models``: the served model (every name asked for is served by it)."""
    return {
        "object": "list",
        "data": [{"id": backend.model_name, "object": "model", "created": 0, "owned_by": "agentbolt"}],
    }


@router.get("/models", responses=errors_doc(OpenAIErrorAnswer, 404, 503))
async def rollout_models(rollout_id: str, attempt_id: str, request: Request) -> Response:
    """OpenAI ``GET /v1/models`` under the attempt's base URL: the served model (404 for an unknown attempt)."""
    backend: InferenceBackend | None = request.app.state.backend
    if backend is None:
        return wire_error(CHAT, ErrorInfo(503, "api_error", NO_BACKEND_MESSAGE, "no_backend"))
    try:
        await request.app.state.store.get_attempt(rollout_id, attempt_id)
    except AgentboltError as exc:
        return wire_error(CHAT, error_info(exc))
    return JSONResponse(models_body(backend))
