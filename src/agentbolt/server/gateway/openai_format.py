"""The OpenAI Chat Completions wire format, as the gateway reads and writes it. Pure: no I/O.

- :func:`chat_call`: a request body as a :class:`~agentbolt.server.gateway.calls.CallSpec`. Every field of the
  real API (the keys of the ``openai`` package's ``CompletionCreateParams``) is honoured, recorded, or refused with
  a 400 that names it (:data:`CHAT_FIELDS` says which); a key the real API does not have is refused as OpenAI
  refuses it ("Unrecognized request argument supplied").
- :func:`completion_body` / :class:`ChatStreamEncoder`: a ``chat.completion`` and the ``chat.completion.chunk``
  events of a stream (https://platform.openai.com/docs/api-reference/chat-streaming).
- :func:`error_info` / :func:`error_body`: ``{"error": {"message", "type", "param", "code"}}`` for an exception.
- :func:`choice_output`: a :class:`~agentbolt.inference.base.GenerationResult` as the answer's content, tool calls
  and finish reason.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse

from agentbolt.errors import BackendError, ConfigError, ConflictError, NotFoundError
from agentbolt.inference.base import (
    MAX_STOP_STRINGS,
    TOP_LOGPROBS_MAX,
    ContextLengthExceededError,
    GenerationResult,
    OutputFormat,
    ToolChoice,
    UpstreamError,
)
from agentbolt.server.gateway.calls import CallSpec, ChoiceOutput, RequestRefused
from agentbolt.server.gateway.toolcalls import ToolCall, declared_tool_names, parse_tool_calls

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 512
"""Generated-token budget of a request that sets neither ``max_completion_tokens`` nor ``max_tokens``."""

MAX_CHOICES = 128
"""Largest accepted ``n`` (OpenAI's own limit)."""


TEXT_ONLY = "the served model is text-only: send text content (images, audio and files are not served)"

CHAT_FIELDS: dict[str, str] = {
    "model": "recorded; any name is served by the backend's model",
    "messages": "honoured (text content; parts joined with a newline; images, audio and files refused)",
    "tools": "honoured (function tools; other tool types refused)",
    "tool_choice": "honoured: none, auto, required, a named function (constrained decoding where the backend can)",
    "parallel_tool_calls": "honoured (false: the answer ends after its first tool call)",
    "response_format": "honoured: text, json_object, json_schema (constrained decoding where the backend can)",
    "stop": "honoured (string or list; the stop text is not returned)",
    "logprobs": "honoured (choices[].logprobs.content)",
    "top_logprobs": "honoured (0..20, needs logprobs: true)",
    "seed": "honoured (choice i uses seed + i)",
    "max_completion_tokens": "honoured (a job's version may cap it)",
    "max_tokens": "honoured (as max_completion_tokens)",
    "temperature": "honoured (a job's version overrides it in its rollouts)",
    "top_p": "honoured (a job's version overrides it in its rollouts)",
    "presence_penalty": "honoured (a job's version sets 0 in its rollouts)",
    "frequency_penalty": "honoured (a job's version sets 0 in its rollouts)",
    "logit_bias": "honoured (a job's version drops it in its rollouts)",
    "n": "honoured (1..128, one span each)",
    "stream": "honoured (server-sent events)",
    "stream_options": "honoured: include_usage; include_obfuscation accepted (nothing is obfuscated)",
    "user": "recorded",
    "metadata": "recorded",
    "safety_identifier": "recorded",
    "prompt_cache_key": "recorded (prefix caching is the backend's own)",
    "prompt_cache_retention": "recorded",
    "prompt_cache_options": "recorded",
    "store": "recorded (every call is stored in the rollout anyway)",
    "service_tier": "recorded",
    "reasoning_effort": "recorded (the served model has no reasoning mode)",
    "verbosity": "recorded (no effect on the served model)",
    "moderation": "refused unless null",
    "modalities": "honoured: ['text'] only; audio refused",
    "audio": "refused (text-only model)",
    "prediction": "refused (no predicted outputs)",
    "web_search_options": "refused (no web search)",
    "functions": "refused (deprecated: send tools)",
    "function_call": "refused (deprecated: send tool_choice)",
    "chat_template_kwargs": "honoured (vLLM's extension: extra chat template variables)",
    "return_token_ids": "accepted (vLLM's extension: the ids are always returned)",
}
"""What the gateway does with each Chat Completions request field (docs/gateway_conformance.md is made from it)."""

_RECORDED_CHAT_FIELDS = (
    "user",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "prompt_cache_options",
    "store",
    "service_tier",
    "reasoning_effort",
    "verbosity",
)


def backend_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's messages as the inference backend gets them: a message without a ``role`` that holds
    ``tool_calls`` (some agent frameworks write the assistant's tool-call turn so) gets ``role: "assistant"``;
    every other message is passed as it is. The input is not modified, and the gateway records it as sent."""
    return [
        {"role": "assistant", **message} if "role" not in message and message.get("tool_calls") else message
        for message in messages
    ]


# ---------------------------------------------------------------------- reading a request


def number_field(
    body: dict[str, Any], key: str, low: float, high: float, *, integer: bool = False, low_open: bool = False
) -> float | int | None:
    """``body[key]`` checked to be a number in ``[low, high]`` (``(low, high]`` with ``low_open``; an int with
    ``integer``), or ``None`` when absent or null.

    Raises:
        RequestRefused: not a number, or out of range (code ``invalid_value``, param ``key``).
    """
    value = body.get(key)
    if value is None:
        return None
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        raise RequestRefused(f"{key} must be {kind}, got {value!r}", key, "invalid_value")
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestRefused(f"{key} must be finite, got {value!r}", key, "invalid_value")
    bracket = "(" if low_open else "["
    if value < low or value > high or (low_open and value == low):
        raise RequestRefused(f"{key} must be in {bracket}{low}, {high}], got {value!r}", key, "invalid_value")
    return value


def stop_field(value: Any, param: str = "stop") -> tuple[str, ...]:
    """A ``stop`` value (a string, a list of strings, or null) as a tuple of non-empty strings.

    Raises:
        RequestRefused: another type, an empty string, or more than :data:`MAX_STOP_STRINGS` strings.
    """
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise RequestRefused(f"{param} must be a string or a list of strings, got {value!r}", param, "invalid_value")
    if any(not s for s in stops):
        raise RequestRefused(f"{param} must not contain an empty string", param, "invalid_value")
    if len(stops) > MAX_STOP_STRINGS:
        raise RequestRefused(f"{param} takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}", param)
    return tuple(stops)


def text_of_parts(content: Any, param: str, *, text_types: tuple[str, ...] = ("text",)) -> str:
    """The text of a message ``content``: a string as it is, ``None`` as ``""``, a list of text parts joined with
    ``"\n"`` (as vLLM and SGLang join them, so every backend sees the same prompt).

    Raises:
        RequestRefused: an image, audio or file part (the served model is text-only), or an unknown part.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestRefused(f"{param} must be a string or a list of content parts", param, "invalid_value")
    texts: list[str] = []
    for index, part in enumerate(content):
        where = f"{param}[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("refusal" if kind == "refusal" else "text") if isinstance(part, dict) else None
        if kind in text_types and isinstance(text, str):
            texts.append(text)
        elif kind in {"image_url", "input_image", "image", "input_audio", "audio", "file", "input_file"}:
            raise RequestRefused(f"{where} is an {kind} part; {TEXT_ONLY}", where, "unsupported_content")
        else:
            raise RequestRefused(f"{where}: unsupported content part {kind!r}; send text parts", where)
    return "\n".join(texts)


def function_tools(tools: Any, param: str = "tools") -> list[dict[str, Any]] | None:
    """Chat ``tools`` checked: each ``{"type": "function", "function": {"name": str, ...}}``; ``None`` when empty.

    Raises:
        RequestRefused: another tool type, or a function without a name.
    """
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise RequestRefused(f"{param} must be a list of tools", param, "invalid_value")
    for index, tool in enumerate(tools):
        where = f"{param}[{index}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise RequestRefused(f"{where}: tool type {kind!r} is not served; only function tools are", where)
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestRefused(f"{where}.function.name is required", f"{where}.function", "invalid_value")
    return tools


def check_tool_choice(choice: ToolChoice, tools: list[dict[str, Any]] | None, param: str) -> ToolChoice:
    """``choice`` checked against the declared tools: ``required`` and a named function need tools, and the named
    function must be declared.

    Raises:
        RequestRefused: otherwise.
    """
    if choice.mode in ("required", "function") and not tools:
        raise RequestRefused(f"{param} {choice.mode!r} needs tools; declare the functions in tools", param)
    if choice.mode == "function" and choice.name not in declared_tool_names(tools):
        names = ", ".join(sorted(declared_tool_names(tools))) or "none"
        raise RequestRefused(f"{param} names function {choice.name!r}, which is not in tools ({names})", param)
    return choice


def _chat_tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> ToolChoice:
    if value is None:
        return ToolChoice("auto")
    if value in ("none", "auto", "required"):
        return check_tool_choice(ToolChoice(value), tools, "tool_choice")
    if isinstance(value, dict) and value.get("type") == "function":
        name = (value.get("function") or {}).get("name")
        return check_tool_choice(ToolChoice("function", name), tools, "tool_choice")
    raise RequestRefused(
        f"tool_choice {value!r} is not served; send none, auto, required or "
        '{"type": "function", "function": {"name": ...}}',
        "tool_choice",
    )


def _response_format(value: Any) -> OutputFormat | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise RequestRefused(
                "response_format.json_schema must be an object with a schema", "response_format", "invalid_value"
            )
        return OutputFormat("json_schema", spec.get("schema") or {}, spec.get("name"))
    raise RequestRefused(
        f"response_format {value!r} is not served; send text, json_object or json_schema", "response_format"
    )


def logit_bias_field(value: Any) -> dict[int, float] | None:
    """A ``logit_bias`` value (token id strings -> bias) as ``{token_id: bias}``; ``None`` when absent or empty.

    Raises:
        RequestRefused: a key that is not a token id, or a bias outside ``[-100, 100]``.
    """
    if not value:
        return None
    if not isinstance(value, dict):
        raise RequestRefused("logit_bias must map token ids to numbers", "logit_bias", "invalid_value")
    bias: dict[int, float] = {}
    for key, number in value.items():
        try:
            token_id = int(key)
        except (TypeError, ValueError):
            raise RequestRefused(f"logit_bias key {key!r} is not a token id", "logit_bias", "invalid_value") from None
        if token_id < 0:
            raise RequestRefused(f"logit_bias key {key!r} is not a token id", "logit_bias", "invalid_value")
        if isinstance(number, bool) or not isinstance(number, int | float) or not -100 <= number <= 100:
            raise RequestRefused(f"logit_bias values must be in [-100, 100], got {number!r}", "logit_bias")
        bias[token_id] = float(number)
    return bias


def _chat_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise RequestRefused("messages must be a non-empty list", "messages", "invalid_value")
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RequestRefused(f"{where} must be an object", where, "invalid_value")
        role = message.get("role")
        if role is None and message.get("tool_calls"):
            role = "assistant"  # some agent frameworks write the assistant's tool-call turn without a role
        if role == "function":
            raise RequestRefused(f"{where}: role 'function' is deprecated; send role 'tool'", f"{where}.role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise RequestRefused(f"{where}.role must be system, developer, user, assistant or tool", f"{where}.role")
        if message.get("audio") is not None:
            raise RequestRefused(f"{where}.audio: {TEXT_ONLY}", f"{where}.audio", "unsupported_content")
        converted = dict(message)
        converted["role"] = "system" if role == "developer" else role
        content = message.get("content")
        if isinstance(content, list):  # text parts become one string, as every backend then renders it
            text_types = ("text", "refusal") if role == "assistant" else ("text",)
            converted["content"] = text_of_parts(content, f"{where}.content", text_types=text_types)
        elif content is not None and not isinstance(content, str):
            raise RequestRefused(f"{where}.content must be a string or a list of content parts", f"{where}.content")
        out.append(converted)
    return out


def chat_call(body: Any) -> CallSpec:
    """A Chat Completions request body as a :class:`~agentbolt.server.gateway.calls.CallSpec`.

    Messages get string content (text parts joined with ``"\n"``), ``developer`` becomes ``system``, a role-less
    message holding ``tool_calls`` becomes ``assistant``. See :data:`CHAT_FIELDS` for every field.

    Raises:
        RequestRefused: a field that is not served, a bad value, or a key the real API does not have; the
            ``param`` names it.
    """
    if not isinstance(body, dict):
        raise RequestRefused("the request body must be a JSON object", None, "invalid_value")
    unknown = sorted(key for key in body if key not in CHAT_FIELDS and key != "stream")
    if unknown:
        raise RequestRefused(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0], "unknown_parameter")
    for key in ("audio", "prediction", "web_search_options", "functions", "function_call", "moderation"):
        if body.get(key) is not None:
            raise RequestRefused(f"{key} is not served: {CHAT_FIELDS[key]}", key)
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise RequestRefused(f"modalities {modalities!r}: {TEXT_ONLY}", "modalities")
    tools = function_tools(body.get("tools"))
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise RequestRefused("logprobs must be true or false", "logprobs", "invalid_value")
    top_logprobs = int(number_field(body, "top_logprobs", 0, TOP_LOGPROBS_MAX, integer=True) or 0)
    if top_logprobs and not logprobs:
        raise RequestRefused("top_logprobs needs logprobs: true", "top_logprobs", "invalid_value")
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not isinstance(stream_options, dict):
            raise RequestRefused("stream_options must be an object", "stream_options", "invalid_value")
        extra = sorted(set(stream_options) - {"include_usage", "include_obfuscation"})
        if extra:
            raise RequestRefused(f"stream_options.{extra[0]} is not served", f"stream_options.{extra[0]}")
    template_kwargs = body.get("chat_template_kwargs")
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise RequestRefused("chat_template_kwargs must be an object", "chat_template_kwargs", "invalid_value")
    parallel = body.get("parallel_tool_calls")
    requested: dict[str, float | int] = {}
    for key, value in (
        ("temperature", number_field(body, "temperature", 0, 2)),
        ("top_p", number_field(body, "top_p", 0, 1, low_open=True)),
        (
            "max_tokens",
            number_field(body, "max_completion_tokens", 1, 10**9, integer=True)
            or number_field(body, "max_tokens", 1, 10**9, integer=True),
        ),
    ):
        if value is not None:
            requested[key] = value
    seed = number_field(body, "seed", -(2**63), 2**63 - 1, integer=True)
    return CallSpec(
        protocol="chat.completions",
        messages=_chat_messages(body.get("messages")),
        tools=tools,
        tool_choice=_chat_tool_choice(body.get("tool_choice"), tools),
        parallel_tool_calls=True if parallel is None else bool(parallel),
        stop=stop_field(body.get("stop")),
        output_format=_response_format(body.get("response_format")),
        logprobs=bool(logprobs),
        top_logprobs=top_logprobs,
        n=int(number_field(body, "n", 1, MAX_CHOICES, integer=True) or 1),
        seed=None if seed is None else int(seed),
        presence_penalty=float(number_field(body, "presence_penalty", -2, 2) or 0.0),
        frequency_penalty=float(number_field(body, "frequency_penalty", -2, 2) or 0.0),
        logit_bias=logit_bias_field(body.get("logit_bias")),
        sampling_requested=requested,
        stream=bool(body.get("stream")),
        include_usage=bool((stream_options or {}).get("include_usage")),
        chat_template_kwargs=template_kwargs,
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        record_messages=body.get("messages"),
        attributes={
            f"agentbolt.llm.request.{key}": body[key] for key in _RECORDED_CHAT_FIELDS if body.get(key) is not None
        },
    )


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

    RequestRefused -> 400 with its code and param; ContextLengthExceededError -> 400 ``context_length_exceeded``;
    other ConfigError -> 400; NotFoundError -> 404;
    ConflictError -> 409; UpstreamError -> 502 ``upstream_error``; other BackendError -> 503
    ``backend_unavailable``; anything else -> 500 ``internal_error`` (a bug in agentbolt).
    """
    message = str(exc) or type(exc).__name__
    if isinstance(exc, RequestRefused):
        return ErrorInfo(400, "invalid_request_error", message, exc.code, exc.param)
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


def offered_tool_names(spec: CallSpec) -> frozenset[str]:
    """The functions whose calls are parsed out of the answer: the declared ones, none with ``tool_choice: none``."""
    if spec.tool_choice.mode == "none":
        return frozenset()
    return declared_tool_names(spec.tools)


TOOL_CALL_TAG = "<tool_call>"


def choice_output(index: int, result: GenerationResult, spec: CallSpec) -> ChoiceOutput:
    """Choice ``index`` of ``spec`` as the caller gets it: content, tool calls (parsed only for offered functions; the
    first one only when ``parallel_tool_calls`` is false) and finish reason. A tool call the model did not finish
    (cut at ``max_tokens``) is neither a call nor content: the content ends before its ``<tool_call>`` tag (the
    recorded ids keep every generated token)."""
    names = offered_tool_names(spec)
    content, tool_calls = assistant_message(result, names)
    if names and content and TOOL_CALL_TAG in content:
        # a tool call the model did not finish (cut at max_tokens): its markup is not an answer
        content = content[: content.index(TOOL_CALL_TAG)].rstrip() or None
    if not spec.parallel_tool_calls:
        tool_calls = tool_calls[:1]
    return ChoiceOutput(
        index, result, content, tool_calls, finish_reason(result, bool(tool_calls)), result.stop_sequence
    )


def message_body(content: str | None, tool_calls: list[ToolCall]) -> dict[str, Any]:
    """``{"role": "assistant", "content": ..., "tool_calls": [...]}`` (``tool_calls`` only when there are some)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def cached_prompt_tokens(result: GenerationResult) -> int:
    """Prompt tokens the backend took from its prefix cache instead of computing them (``extra``'s
    ``cached_prompt_tokens``: the embedded backend's continuous batch and the token engines report it; 0 otherwise)."""
    return int(result.extra.get("cached_prompt_tokens") or 0)


def usage_body(results: list[GenerationResult]) -> dict[str, Any]:
    """Usage of a request whose choices are ``results``: the prompt counted once, completions summed (as OpenAI
    counts ``n > 1``); ``prompt_tokens_details.cached_tokens``: prompt tokens served from the prefix cache (OpenAI's
    automatic prompt caching field, a part of ``prompt_tokens``)."""
    prompt = results[0].num_prompt_tokens if results else 0
    completion = sum(r.num_completion_tokens for r in results)
    cached = min(prompt, cached_prompt_tokens(results[0])) if results else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def logprobs_body(spec: CallSpec, result: GenerationResult) -> dict[str, Any] | None:
    """``choices[].logprobs`` when the request asked for them: ``{"content": [ChatCompletionTokenLogprob...],
    "refusal": None}`` (each entry's ``top_logprobs`` cut to the ``top_logprobs`` asked for)."""
    if not spec.logprobs:
        return None
    entries = [
        {**entry, "top_logprobs": list(entry.get("top_logprobs") or [])[: spec.top_logprobs]}
        for entry in (result.token_logprobs or [])
    ]
    return {"content": entries, "refusal": None}


def completion_body(
    spec: CallSpec,
    outputs: list[ChoiceOutput],
    *,
    response_id: str,
    created_s: int,
    model: str,
) -> dict[str, Any]:
    """A whole ``chat.completion`` (https://platform.openai.com/docs/api-reference/chat/object).

    Extensions, named as vLLM names them, present only when the backend has exact ids: ``prompt_token_ids`` at the
    top and ``token_ids`` per choice (the ids recorded for training).
    """
    choices = [
        {
            "index": output.index,
            "message": message_body(output.content, output.tool_calls),
            "finish_reason": output.finish,
            "logprobs": logprobs_body(spec, output.result),
        }
        for output in outputs
    ]
    return openai_envelope(
        "chat.completion", outputs, choices, response_id=response_id, created_s=created_s, model=model
    )


def openai_envelope(
    kind: str,
    outputs: list[ChoiceOutput],
    choices: list[dict[str, Any]],
    *,
    response_id: str,
    created_s: int,
    model: str,
) -> dict[str, Any]:
    """The body around ``choices`` (one dict per output, in order) of a whole ``chat.completion`` or
    ``text_completion``: id, object, usage, fingerprint, and the exact ids when the backend has them
    (``prompt_token_ids`` at the top, ``token_ids`` per choice, as vLLM names them)."""
    results = [output.result for output in outputs]
    exact = all(r.trainable and r.prompt_token_ids for r in results)
    if exact:
        for output, choice in zip(outputs, choices, strict=True):
            choice["token_ids"] = output.result.response_token_ids
    body: dict[str, Any] = {
        "id": response_id,
        "object": kind,
        "created": created_s,
        "model": model,
        "choices": choices,
        "usage": usage_body(results),
        "system_fingerprint": results[0].model_version if results else None,
    }
    if exact and results:
        body["prompt_token_ids"] = results[0].prompt_token_ids
    return body


def stream_end_events(head: dict[str, Any], spec: CallSpec, outputs: list[ChoiceOutput]) -> list[str]:
    """The last events of an OpenAI chunk stream: the usage chunk (``include_usage``), then ``data: [DONE]``."""
    events: list[str] = []
    if spec.include_usage:
        events.append(sse_data({**head, "choices": [], "usage": usage_body([o.result for o in outputs])}))
    events.append("data: [DONE]\n\n")
    return events


def sse_data(body: dict[str, Any]) -> str:
    """One ``data: {json}`` server-sent event."""
    return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


class ChatStreamEncoder:
    """The :class:`~agentbolt.server.gateway.calls.StreamEncoder` of Chat Completions: ``chat.completion.chunk``
    events. Per choice: a first chunk with ``delta: {"role": "assistant", "content": ""}``, content deltas, one
    chunk with the tool calls (each whole: ``index``, ``id``, ``type``, ``function``) when the model called tools,
    and a last chunk with an empty delta, the ``finish_reason`` and (when asked for) the choice's ``logprobs``. With
    ``include_usage`` a chunk with empty ``choices`` and the ``usage`` comes before ``data: [DONE]``. A failure
    after the stream started is one ``data: {"error": {...}}`` event (the ``openai`` client raises it as
    ``APIError``), without ``[DONE]``."""

    def __init__(self, spec: CallSpec, *, response_id: str, created_s: int, model: str) -> None:
        self._spec = spec
        self._head = {"id": response_id, "object": "chat.completion.chunk", "created": created_s, "model": model}

    def _chunk(self, index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        return sse_data({**self._head, "choices": [choice]})

    def begin(self) -> list[str]:
        """Nothing: every chunk belongs to a choice."""
        return []

    def choice_begin(self, index: int) -> list[str]:
        """The role chunk."""
        return [self._chunk(index, {"role": "assistant", "content": ""})]

    def text(self, index: int, delta: str) -> list[str]:
        """A content chunk."""
        return [self._chunk(index, {"content": delta})]

    def choice_end(self, output: ChoiceOutput) -> list[str]:
        """The tool calls chunk (when there are calls), then the finish chunk."""
        events: list[str] = []
        if output.tool_calls:
            events.append(self._chunk(output.index, {"tool_calls": tool_call_deltas(output.tool_calls)}))
        events.append(self._chunk(output.index, {}, output.finish, logprobs_body(self._spec, output.result)))
        return events

    def end(self, outputs: list[ChoiceOutput]) -> list[str]:
        """The usage chunk (``include_usage``), then ``[DONE]``."""
        return stream_end_events(self._head, self._spec, outputs)

    def error(self, status: int, type_: str, message: str, code: str | None) -> list[str]:
        """``data: {"error": {...}}``."""
        return [sse_data(error_body(ErrorInfo(status, type_, message, code)))]


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
