"""The OpenAI Responses wire format (``POST /v1/responses``), as the gateway reads and writes it. Pure: no I/O.

Spec: https://platform.openai.com/docs/api-reference/responses (types: ``openai.types.responses``).

- :func:`responses_call`: a request body as a :class:`~agentbolt.server.gateway.calls.CallSpec` of OpenAI Chat
  messages and tools, or :class:`~agentbolt.server.gateway.calls.RequestRefused` naming the field it cannot honour.
- :func:`response_body`: one generated choice as a whole ``response`` object.
- :class:`ResponsesStreamEncoder`: the same answer as ``response.*`` server-sent events.

Input items become chat messages so: a string is one user message; a ``message`` item (``type`` may be left out)
keeps its role, ``developer`` becoming ``system``, and its text parts joined with ``"\\n"``; ``function_call`` items
become ``tool_calls`` of one assistant message, together with the assistant ``message`` item just before them (the
model wrote them in one turn, and the gateway's own answers are recorded so, which keeps the prompt prefix stable
across turns); a ``function_call_output`` item becomes a ``role: tool`` message. The served model reads and writes
text only, has no reasoning mode and no hosted tools, and the gateway keeps no conversation state of its own beyond
what the route looks up for ``previous_response_id``. :data:`RESPONSES_FIELDS` says what happens to every field.

Recorded fields go to ``CallSpec.attributes`` under ``agentbolt.llm.request.<field>`` (the ``ATTR_*`` constants);
:func:`response_body` reads the echoed ones back from there.

Output item ids are derived from the response id (``msg_...``, ``fc_...``), so a streamed answer's items and
:func:`response_body` of the same choice are equal.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from agentbolt.inference.base import TOP_LOGPROBS_MAX, GenerationResult
from agentbolt.server.gateway.calls import CallSpec, ChoiceOutput, OutputFormat, RequestRefused, ToolCall, ToolChoice
from agentbolt.server.gateway.openai_format import (
    cached_prompt_tokens,
    check_tool_choice,
    number_field,
    text_of_parts,
)

PROTOCOL: Final = "responses"
"""``CallSpec.protocol`` of a Responses call."""

_ATTR_PREFIX = "agentbolt.llm.request."
ATTR_INSTRUCTIONS: Final = "agentbolt.llm.request.instructions"
"""str: the request's ``instructions`` (also the first system message)."""
ATTR_PREVIOUS_RESPONSE_ID: Final = "agentbolt.llm.request.previous_response_id"
ATTR_METADATA: Final = "agentbolt.llm.request.metadata"
"""dict[str, str]: the request's ``metadata``."""
ATTR_CLIENT_METADATA: Final = "agentbolt.llm.request.client_metadata"
"""dict[str, str]: the request's ``client_metadata`` (Codex CLI sends its thread, turn and window ids there on
every call); recorded, not echoed."""
ATTR_USER: Final = "agentbolt.llm.request.user"
ATTR_SAFETY_IDENTIFIER: Final = "agentbolt.llm.request.safety_identifier"
ATTR_PROMPT_CACHE_KEY: Final = "agentbolt.llm.request.prompt_cache_key"
ATTR_PROMPT_CACHE_RETENTION: Final = "agentbolt.llm.request.prompt_cache_retention"
ATTR_PROMPT_CACHE_OPTIONS: Final = "agentbolt.llm.request.prompt_cache_options"
ATTR_SERVICE_TIER: Final = "agentbolt.llm.request.service_tier"
"""str: the tier asked for (the answer always says ``default``)."""
ATTR_STORE: Final = "agentbolt.llm.request.store"
ATTR_TRUNCATION: Final = "agentbolt.llm.request.truncation"
ATTR_REASONING: Final = "agentbolt.llm.request.reasoning"
"""dict: the request's ``reasoning`` (e.g. Codex CLI's ``{"effort": "medium", "summary": "auto"}``); the served
model has no reasoning mode, so it changes nothing."""
ATTR_INCLUDE: Final = "agentbolt.llm.request.include"
ATTR_MAX_TOOL_CALLS: Final = "agentbolt.llm.request.max_tool_calls"
ATTR_TEXT: Final = "agentbolt.llm.request.text"
"""dict: the request's ``text`` config as sent (``format``, ``verbosity``)."""
ATTR_TOOLS_STRICT: Final = "agentbolt.llm.request.tools_strict"
"""list[bool | None]: each function tool's ``strict`` as sent, in ``CallSpec.tools`` order (echoed; the gateway
does not constrain arguments to the schema)."""

RESPONSES_FIELDS: dict[str, str] = {
    "model": "recorded; any name is served by the backend's model",
    "input": "honoured: a string, or message / function_call / function_call_output items (text parts joined with a "
    "newline; developer becomes system; image, file and audio parts refused: text-only model); item_reference, "
    "reasoning and every other item type refused",
    "instructions": "honoured: a first system message; the instructions of a previous response are not carried over",
    "previous_response_id": "honoured (the route looks the earlier messages up); recorded, echoed",
    "tools": "honoured: function tools (name, description, parameters, strict); every other tool type refused",
    "tool_choice": "honoured: auto, none, required, {type: function, name}; other forms refused",
    "parallel_tool_calls": "honoured (false: the answer ends after its first tool call)",
    "text": "honoured: format text, json_object, json_schema; verbosity null or medium (others refused)",
    "temperature": "honoured, [0, 2] (a job's version overrides it in its rollouts)",
    "top_p": "honoured, (0, 1] (a job's version overrides it in its rollouts)",
    "max_output_tokens": "honoured, >= 1 (a job's version may cap it)",
    "top_logprobs": "honoured, 0..20 (> 0 also turns logprobs on)",
    "include": "message.output_text.logprobs honoured; the other known values accepted: what they include "
    "(hosted-tool results, input image URLs, encrypted reasoning) never occurs here",
    "stream": "honoured (server-sent events)",
    "stream_options": "accepted: include_obfuscation (nothing is obfuscated)",
    "reasoning": "recorded (the served model has no reasoning mode: no reasoning item is ever produced)",
    "truncation": "honoured: disabled; auto refused (a too long input is a 400)",
    "max_tool_calls": "recorded, echoed (it limits hosted-tool calls, which are never made here)",
    "store": "recorded, echoed (every call is stored in the rollout anyway)",
    "metadata": "recorded, echoed",
    "client_metadata": "recorded (not in ResponseCreateParams: Codex CLI's per-turn ids, a map of strings)",
    "user": "recorded, echoed",
    "safety_identifier": "recorded, echoed",
    "prompt_cache_key": "recorded, echoed (prefix caching is the backend's own)",
    "prompt_cache_retention": "recorded",
    "prompt_cache_options": "recorded; prewarm: true refused (every call generates)",
    "service_tier": "recorded (answered as default)",
    "image": "accepted (image options; image inputs are refused anyway)",
    "prompt": "refused unless null (no stored prompt templates)",
    "conversation": "refused unless null (no stored conversations)",
    "background": "refused when true",
    "background_options": "refused unless null",
    "context_management": "refused unless null or empty (no server-side compaction)",
    "moderation": "refused unless null",
    "access_programs": "refused unless null",
}
"""What the gateway does with each Responses request field (the keys of the ``openai`` package's
``ResponseCreateParams``, plus ``client_metadata``, which Codex CLI sends on every call); a key not here is refused
as OpenAI refuses it ("Unrecognized request argument supplied")."""

_INCLUDABLE = frozenset(
    {
        "message.output_text.logprobs",
        "reasoning.encrypted_content",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
    }
)
"""``include`` values accepted: the first turns logprobs on; the others name things that never occur here."""

_SERVICE_TIERS = frozenset({"auto", "default", "flex", "scale", "priority", "fast", "ultrafast"})
_METADATA_MAX_KEYS = 16


def responses_call(body: dict[str, Any], previous_messages: list[dict[str, Any]] | None = None) -> CallSpec:
    """The call a Responses request asks for, as OpenAI Chat messages and tools (see the module docstring).

    Args:
        body: the request's JSON body (``openai.types.responses.ResponseCreateParams``).
        previous_messages: with ``previous_response_id``: the chat messages of the earlier response, its answer
            included, as the route recorded them (``CallSpec.record_messages`` plus the assistant message). Its
            first message is dropped when it is a system message (the earlier ``instructions``).

    Returns:
        ``protocol="responses"``, ``n=1``; ``messages`` = system(``instructions``), the history, then ``input``;
        ``record_messages`` the same messages; ``attributes`` the recorded fields (``ATTR_*``).

    Raises:
        RequestRefused: a field the gateway cannot honour (``code="unsupported_parameter"``), a bad value in one
            (``invalid_value``), a missing required value (``missing_required_parameter``) or an unknown key
            (``unknown_parameter``); ``param`` names it (``input[2].content[1]``, ``tools[0]``, ``text.format``...).
    """
    if not isinstance(body, dict):
        raise RequestRefused("the request body must be a JSON object", None, "invalid_value")
    unknown = sorted(key for key in body if key not in RESPONSES_FIELDS)
    if unknown:
        raise RequestRefused(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0], "unknown_parameter")
    _refuse_unserved(body)
    attributes = _recorded_attributes(body)
    tools, tools_strict = _tools(body.get("tools"))
    if tools:
        attributes[ATTR_TOOLS_STRICT] = tools_strict
    top_logprobs = int(number_field(body, "top_logprobs", 0, TOP_LOGPROBS_MAX, integer=True) or 0)
    logprobs = top_logprobs > 0 or "message.output_text.logprobs" in attributes.get(ATTR_INCLUDE, [])

    messages: list[dict[str, Any]] = []
    instructions = attributes.get(ATTR_INSTRUCTIONS)
    if instructions:
        messages.append({"role": "system", "content": instructions})
    history = list(previous_messages or [])
    if history and history[0].get("role") == "system":
        history = history[1:]  # the earlier instructions: not carried over
    messages += history
    messages += _input_messages(body.get("input"))
    if all(message.get("role") == "system" for message in messages):
        raise RequestRefused("the request has no input; send input", "input", "missing_required_parameter")
    parallel = body.get("parallel_tool_calls")
    return CallSpec(
        protocol=PROTOCOL,
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        parallel_tool_calls=True if parallel is None else parallel,
        output_format=_text_format(attributes.get(ATTR_TEXT)),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        n=1,
        sampling_requested=_sampling(body),
        stream=bool(body.get("stream")),
        model=body.get("model"),
        record_messages=list(messages),
        attributes=attributes,
    )


def response_body(
    spec: CallSpec,
    output: ChoiceOutput,
    *,
    response_id: str,
    created_s: float,
    model: str,
    applied: Mapping[str, float | int],
) -> dict[str, Any]:
    """A whole ``response`` object (``openai.types.responses.Response``) for the one choice of a call.

    Output items: a ``message`` (one ``output_text`` part, with the tokens' ``logprobs`` when ``spec.logprobs``,
    from ``output.result.token_logprobs``) when ``output.content`` is not ``None``, then one
    ``function_call`` item per tool call. ``status`` is ``incomplete`` when generation ended on the token budget
    (``incomplete_details.reason = "max_output_tokens"``), a content filter or an abort, else ``completed``.

    Args:
        spec: the call (:func:`responses_call`); its echoed fields are read back from ``spec.attributes``.
        output: the generated choice.
        response_id: ``resp_<hex>``; item ids are derived from it.
        created_s: creation time, float seconds since the epoch.
        model: the served model's name.
        applied: the sampling settings the call ran with: ``temperature``, ``top_p``, ``max_tokens``.
    """
    status, incomplete = _status(output.finish)
    items = _output_items(spec, output, response_id, message_status=_item_status(status))
    return _response_object(
        spec,
        response_id=response_id,
        created_s=created_s,
        model=model,
        applied=applied,
        status=status,
        output=items,
        incomplete_details=incomplete,
        usage=_usage(output.result),
    )


class ResponsesStreamEncoder:
    """The server-sent events of a streamed Responses answer (implements
    :class:`~agentbolt.server.gateway.calls.StreamEncoder`); each event is ``event: TYPE\\ndata: {json}\\n\\n``
    and carries a ``sequence_number`` that starts at 0 and grows by 1.

    Order: ``response.created``, ``response.in_progress``; with the first text, ``response.output_item.added``
    (the message) and ``response.content_part.added``, then one ``response.output_text.delta`` per delta (with
    ``logprobs: []``; the tokens' logprobs come whole in the done events); at the choice's end
    ``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``, then per tool
    call ``response.output_item.added``, ``response.function_call_arguments.delta`` (the whole arguments),
    ``response.function_call_arguments.done``, ``response.output_item.done``; last ``response.completed`` (or
    ``response.incomplete``) with the whole response, equal to :func:`response_body`. A failure sends one
    ``error`` event and nothing after it.

    Args: as :func:`response_body`.
    """

    def __init__(
        self,
        spec: CallSpec,
        *,
        response_id: str,
        created_s: float,
        model: str,
        applied: Mapping[str, float | int],
    ) -> None:
        self.spec = spec
        self.response_id = response_id
        self.created_s = created_s
        self.model = model
        self.applied = dict(applied)
        self._sequence = 0
        self._items: list[dict[str, Any]] = []
        self._message_id: str | None = None
        self._sent: list[str] = []

    def begin(self) -> list[str]:
        """``response.created`` and ``response.in_progress``, each with the response as yet (no output)."""
        skeleton = self._object("in_progress", [], None, None)
        return [
            self._event("response.created", response=skeleton),
            self._event("response.in_progress", response=skeleton),
        ]

    def choice_begin(self, index: int) -> list[str]:
        """Nothing: the message item opens with its first text (an answer of tool calls alone has none)."""
        return []

    def text(self, index: int, delta: str) -> list[str]:
        """``response.output_text.delta`` for ``delta`` (opening the message item first if needed)."""
        if not delta:
            return []
        events = self._open_message()
        self._sent.append(delta)
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=self._message_id,
                output_index=len(self._items),
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        )
        return events

    def choice_end(self, output: ChoiceOutput) -> list[str]:
        """Close the message item (its text is ``output.content``, or what was sent when that is ``None``), then
        send each tool call as a ``function_call`` item."""
        status, _ = _status(output.finish)
        events: list[str] = []
        if self._message_id is None and output.content is not None:
            events += self._open_message()
            if output.content:
                events += self.text(output.index, output.content)
        if self._message_id is not None:
            text = output.content if output.content is not None else "".join(self._sent)
            events += self._close_message(text, output.result, _item_status(status))
        for call in output.tool_calls:
            index = len(self._items)
            item = _function_call_item(call, self.response_id, index)
            opened = {**item, "status": "in_progress", "arguments": ""}
            events.append(self._event("response.output_item.added", output_index=index, item=opened))
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=item["arguments"],
                )
            )
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                )
            )
            events.append(self._event("response.output_item.done", output_index=index, item=item))
            self._items.append(item)
        return events

    def end(self, outputs: list[ChoiceOutput]) -> list[str]:
        """``response.completed`` (or ``response.incomplete``) with the whole response: its ``output`` is the
        items sent, which is :func:`response_body`'s whenever the sent text is the content."""
        if not outputs:
            return [self._event("response.completed", response=self._object("completed", self._items, None, None))]
        output = outputs[0]
        status, incomplete = _status(output.finish)
        body = self._object(status, self._items, incomplete, _usage(output.result))
        return [self._event(f"response.{status}", response=body)]

    def error(self, status: int, type_: str, message: str, code: str | None) -> list[str]:
        """One ``error`` event (``ResponseErrorEvent``: ``code``, ``message``, ``param``); ``code`` falls back to
        ``type_``. The HTTP ``status`` is already sent (200) and goes nowhere."""
        return [self._event("error", code=code or type_, message=message, param=None)]

    def _open_message(self) -> list[str]:
        if self._message_id is not None:
            return []
        index = len(self._items)
        self._message_id = _item_id("msg", self.response_id, index)
        item = {"id": self._message_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self._event("response.output_item.added", output_index=index, item=item),
            self._event(
                "response.content_part.added", item_id=self._message_id, output_index=index, content_index=0, part=part
            ),
        ]

    def _close_message(self, text: str, result: GenerationResult, status: str) -> list[str]:
        index = len(self._items)
        message_id = self._message_id
        assert message_id is not None
        item = _message_item(message_id, text, _token_logprobs(self.spec, result), status)
        part = item["content"][0]
        done_logprobs = [
            {
                "token": entry["token"],
                "logprob": entry["logprob"],
                "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in entry["top_logprobs"]],
            }
            for entry in part["logprobs"]
        ]
        events = [
            self._event(
                "response.output_text.done",
                item_id=message_id,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=done_logprobs,
            ),
            self._event(
                "response.content_part.done", item_id=message_id, output_index=index, content_index=0, part=part
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]
        self._items.append(item)
        return events

    def _object(
        self,
        status: str,
        items: list[dict[str, Any]],
        incomplete: dict[str, Any] | None,
        usage: dict[str, Any] | None,
    ) -> dict[str, Any]:
        return _response_object(
            self.spec,
            response_id=self.response_id,
            created_s=self.created_s,
            model=self.model,
            applied=self.applied,
            status=status,
            output=[dict(item) for item in items],
            incomplete_details=incomplete,
            usage=usage,
        )

    def _event(self, type_: str, **fields: Any) -> str:
        payload = {"type": type_, **fields, "sequence_number": self._sequence}
        self._sequence += 1
        return f"event: {type_}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


# ----- request -> CallSpec -----


def _typed(body: Mapping[str, Any], key: str, kind: type, param: str | None = None) -> Any:
    """``body[key]`` checked to be of ``kind`` (a bool is no int here), or ``None`` when absent or null."""
    value = body.get(key)
    if value is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
        where = param or key
        raise RequestRefused(f"{where} must be a {_KIND_NAMES[kind]}, got {value!r}", where, "invalid_value")
    return value


_KIND_NAMES = {str: "string", bool: "boolean", int: "integer", dict: "JSON object", list: "list"}


def _refuse_unserved(body: Mapping[str, Any]) -> None:
    """Refuse the fields that ask for something the gateway does not do, and check the accepted-only ones."""
    for key in ("prompt", "conversation", "background_options", "moderation", "access_programs"):
        if body.get(key) is not None:
            raise RequestRefused(f"{key} is not served: {RESPONSES_FIELDS[key]}", key)
    if _typed(body, "background", bool):
        raise RequestRefused("background responses are not served; send background: false", "background")
    if _typed(body, "context_management", list):
        raise RequestRefused(
            f"context_management is not served: {RESPONSES_FIELDS['context_management']}", "context_management"
        )
    truncation = _typed(body, "truncation", str)
    if truncation == "auto":
        raise RequestRefused(
            "truncation 'auto' is not served (no input item is ever dropped); send 'disabled'", "truncation"
        )
    if truncation not in (None, "disabled"):
        raise RequestRefused(f"truncation must be 'disabled', got {truncation!r}", "truncation", "invalid_value")
    if (_typed(body, "prompt_cache_options", dict) or {}).get("prewarm"):
        raise RequestRefused(
            "prompt_cache_options.prewarm is not served: every call generates", "prompt_cache_options.prewarm"
        )
    stream_options = _typed(body, "stream_options", dict) or {}
    extra = sorted(set(stream_options) - {"include_obfuscation"})
    if extra:
        raise RequestRefused(f"stream_options.{extra[0]} is not served", f"stream_options.{extra[0]}")
    for key, kind in (("model", str), ("image", dict), ("stream", bool), ("parallel_tool_calls", bool)):
        _typed(body, key, kind)


def _recorded_attributes(body: dict[str, Any]) -> dict[str, Any]:
    """The recorded fields (checked) under their ``ATTR_*`` keys; absent and null ones are left out."""
    kinds: dict[str, type] = {
        ATTR_INSTRUCTIONS: str,
        ATTR_PREVIOUS_RESPONSE_ID: str,
        ATTR_USER: str,
        ATTR_SAFETY_IDENTIFIER: str,
        ATTR_PROMPT_CACHE_KEY: str,
        ATTR_PROMPT_CACHE_RETENTION: str,
        ATTR_PROMPT_CACHE_OPTIONS: dict,
        ATTR_STORE: bool,
        ATTR_TRUNCATION: str,
        ATTR_REASONING: dict,
        ATTR_TEXT: dict,
        ATTR_METADATA: dict,
        ATTR_CLIENT_METADATA: dict,
        ATTR_SERVICE_TIER: str,
        ATTR_MAX_TOOL_CALLS: int,
        ATTR_INCLUDE: list,
    }
    attributes: dict[str, Any] = {}
    for attribute, kind in kinds.items():
        key = attribute.removeprefix(_ATTR_PREFIX)
        value = _typed(body, key, kind)
        if value is not None:
            attributes[attribute] = value
    metadata = attributes.get(ATTR_METADATA, {})
    if len(metadata) > _METADATA_MAX_KEYS or not all(isinstance(v, str) for v in metadata.values()):
        raise RequestRefused(
            f"metadata must map at most {_METADATA_MAX_KEYS} keys to string values", "metadata", "invalid_value"
        )
    if not all(isinstance(v, str) for v in attributes.get(ATTR_CLIENT_METADATA, {}).values()):
        raise RequestRefused("client_metadata must map keys to string values", "client_metadata", "invalid_value")
    tier = attributes.get(ATTR_SERVICE_TIER)
    if tier is not None and tier not in _SERVICE_TIERS:
        raise RequestRefused(f"service_tier must be one of {sorted(_SERVICE_TIERS)}", "service_tier", "invalid_value")
    number_field(body, "max_tool_calls", 1, 10**9, integer=True)
    for i, value in enumerate(attributes.get(ATTR_INCLUDE, [])):
        if not isinstance(value, str) or value not in _INCLUDABLE:
            raise RequestRefused(
                f"include[{i}] {value!r} is not known; send some of {sorted(_INCLUDABLE)}",
                f"include[{i}]",
                "invalid_value",
            )
    return attributes


def _tools(value: Any) -> tuple[list[dict[str, Any]] | None, list[bool | None]]:
    """Chat tool definitions for the request's function tools, and each one's ``strict`` as sent."""
    if value is None or value == []:
        return None, []
    if not isinstance(value, list):
        raise RequestRefused("tools must be a list of function tools", "tools", "invalid_value")
    tools: list[dict[str, Any]] = []
    strict: list[bool | None] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        if not isinstance(tool, dict) or kind != "function":
            raise RequestRefused(f"{where}: tool type {kind!r} is not served; only function tools are", where)
        extra = sorted(key for key, item in tool.items() if key not in _FUNCTION_TOOL_KEYS and item is not None)
        if extra:
            raise RequestRefused(
                f"{where}.{extra[0]} is not served (function tools: name, description, parameters, strict)",
                f"{where}.{extra[0]}",
            )
        name = _typed(tool, "name", str, f"{where}.name")
        if not name:
            raise RequestRefused(f"{where}.name is required", f"{where}.name", "missing_required_parameter")
        if any(seen["function"]["name"] == name for seen in tools):
            raise RequestRefused(f"{where}: two tools are named {name!r}", f"{where}.name", "invalid_value")
        function: dict[str, Any] = {"name": name}
        for key, kind in (("description", str), ("parameters", dict)):
            item = _typed(tool, key, kind, f"{where}.{key}")
            if item is not None:
                function[key] = item
        tools.append({"type": "function", "function": function})
        strict.append(_typed(tool, "strict", bool, f"{where}.strict"))
    return tools, strict


_FUNCTION_TOOL_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> ToolChoice:
    if value is None:
        return ToolChoice("auto")
    if value in ("auto", "none", "required"):
        return check_tool_choice(ToolChoice(value), tools, "tool_choice")
    if isinstance(value, dict) and value.get("type") == "function" and set(value) <= {"type", "name"}:
        return check_tool_choice(ToolChoice("function", value.get("name")), tools, "tool_choice")
    raise RequestRefused(
        f'tool_choice {value!r} is not served; send auto, none, required or {{"type": "function", "name": ...}}',
        "tool_choice",
    )


def _text_format(text: dict[str, Any] | None) -> OutputFormat | None:
    """``text.format`` as an :class:`OutputFormat` (``None``: plain text), ``text.verbosity`` checked."""
    if text is None:
        return None
    extra = sorted(set(text) - {"format", "verbosity"})
    if extra:
        raise RequestRefused(
            f"Unrecognized request argument supplied: text.{extra[0]}", f"text.{extra[0]}", "unknown_parameter"
        )
    verbosity = text.get("verbosity")
    if verbosity not in (None, "medium"):
        raise RequestRefused(
            f"text.verbosity {verbosity!r} is not served: the served model has one register; send 'medium' or null",
            "text.verbosity",
        )
    fmt = _typed(text, "format", dict, "text.format")
    kind = None if fmt is None else fmt.get("type")
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat("json_object")
    if kind == "json_schema":
        name = _typed(fmt, "name", str, "text.format.name")
        schema = _typed(fmt, "schema", dict, "text.format.schema")
        _typed(fmt, "strict", bool, "text.format.strict")
        if not name or schema is None:
            raise RequestRefused(
                "text.format json_schema needs a name and a schema", "text.format", "missing_required_parameter"
            )
        return OutputFormat("json_schema", schema, name)
    raise RequestRefused(
        f"text.format type {kind!r} is not served; send text, json_object or json_schema", "text.format"
    )


def _sampling(body: dict[str, Any]) -> dict[str, float | int]:
    """``temperature``, ``top_p`` and ``max_tokens`` (from ``max_output_tokens``), where the request sets them."""
    asked = {
        "temperature": number_field(body, "temperature", 0, 2),
        "top_p": number_field(body, "top_p", 0, 1, low_open=True),
        "max_tokens": number_field(body, "max_output_tokens", 1, 10**9, integer=True),
    }
    return {key: value for key, value in asked.items() if value is not None}


def _input_messages(value: Any) -> list[dict[str, Any]]:
    """The chat messages of ``input`` (see the module docstring)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise RequestRefused("input must be a string or a list of items", "input", "invalid_value")
    messages: list[dict[str, Any]] = []
    turn_open = False  # the last message is an assistant turn of this input: function calls join it
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestRefused(f"{where} must be a JSON object", where, "invalid_value")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
            turn_open = messages[-1]["role"] == "assistant"
        elif kind == "function_call":
            call = _function_call(item, where)
            if turn_open:
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                turn_open = True
        elif kind == "function_call_output":
            call_id = _typed(item, "call_id", str, f"{where}.call_id")
            if not call_id:
                raise RequestRefused(f"{where}.call_id is required", f"{where}.call_id", "missing_required_parameter")
            output = item.get("output")
            if not isinstance(output, str | list):
                raise RequestRefused(
                    f"{where}.output must be a string or a list of parts", f"{where}.output", "invalid_value"
                )
            content = text_of_parts(output, f"{where}.output", text_types=("input_text",))
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
            turn_open = False
        else:
            raise RequestRefused(f"{where}: input item type {kind!r} is not served; {_item_advice(kind)}", where)
    return messages


def _item_advice(kind: Any) -> str:
    if kind == "item_reference":
        return "the gateway keeps no items: send the item itself, or use previous_response_id"
    if kind == "reasoning":
        return "the served model has no reasoning mode, so no reasoning item can come from it"
    return "send message, function_call and function_call_output items (only function tools are served)"


def _message(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise RequestRefused(
            f"{where}.role must be user, system, developer or assistant, got {role!r}", f"{where}.role", "invalid_value"
        )
    content = item.get("content")
    if not isinstance(content, str | list):
        raise RequestRefused(
            f"{where}.content must be a string or a list of parts", f"{where}.content", "invalid_value"
        )
    text = text_of_parts(content, f"{where}.content", text_types=("input_text", "output_text"))
    return {"role": "system" if role == "developer" else role, "content": text}


def _function_call(item: Mapping[str, Any], where: str) -> ToolCall:
    if item.get("namespace"):
        raise RequestRefused(f"{where}.namespace is not served (no namespace tools)", f"{where}.namespace")
    fields = {key: _typed(item, key, str, f"{where}.{key}") for key in ("call_id", "name", "arguments")}
    for key, value in fields.items():
        if value is None:
            raise RequestRefused(f"{where}.{key} is required", f"{where}.{key}", "missing_required_parameter")
    return {
        "id": fields["call_id"],
        "type": "function",
        "function": {"name": fields["name"], "arguments": fields["arguments"]},
    }


# ----- answer -> response object -----


def _item_id(prefix: str, response_id: str, output_index: int) -> str:
    """``<prefix>_<48 hex>``, derived from the response id and the item's output index."""
    return f"{prefix}_{hashlib.sha256(f'{response_id}/{output_index}'.encode()).hexdigest()[:48]}"


def _status(finish: str) -> tuple[str, dict[str, Any] | None]:
    """``(status, incomplete_details)`` for a chat finish reason."""
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    if finish == "abort":
        return "incomplete", {"reason": None}
    return "completed", None


def _item_status(status: str) -> str:
    return "incomplete" if status == "incomplete" else "completed"


def _token_logprobs(spec: CallSpec, result: GenerationResult) -> list[dict[str, Any]]:
    """The ``logprobs`` of an ``output_text`` part: ``[]`` unless ``spec.logprobs``; else per token ``{token,
    logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`` from ``result.token_logprobs`` (or, from a backend
    that puts them there, ``result.extra["token_logprobs"]``; ``[]`` when the backend gives none), at most
    ``spec.top_logprobs`` alternatives each. The entries cover every generated token, tool-call text included."""
    if not spec.logprobs:
        return []
    entries = result.token_logprobs if result.token_logprobs is not None else result.extra.get("token_logprobs")
    return [
        {
            **_token(entry),
            "top_logprobs": [_token(alt) for alt in (entry.get("top_logprobs") or [])[: spec.top_logprobs]],
        }
        for entry in entries or []
    ]


def _token(entry: Mapping[str, Any]) -> dict[str, Any]:
    token = str(entry["token"])
    raw = entry.get("bytes")
    return {"token": token, "logprob": float(entry["logprob"]), "bytes": list(token.encode() if raw is None else raw)}


def _message_item(item_id: str, text: str, logprobs: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}],
    }


def _function_call_item(call: Mapping[str, Any], response_id: str, output_index: int) -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "id": _item_id("fc", response_id, output_index),
        "type": "function_call",
        "status": "completed",
        "call_id": call["id"],
        "name": function["name"],
        "arguments": function.get("arguments") or "",
    }


def _output_items(
    spec: CallSpec, output: ChoiceOutput, response_id: str, *, message_status: str
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if output.content is not None:
        message_id = _item_id("msg", response_id, 0)
        items.append(_message_item(message_id, output.content, _token_logprobs(spec, output.result), message_status))
    for call in output.tool_calls:
        items.append(_function_call_item(call, response_id, len(items)))
    return items


def _usage(result: GenerationResult) -> dict[str, Any]:
    prompt, completion = result.num_prompt_tokens, result.num_completion_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": min(prompt, cached_prompt_tokens(result)), "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _tools_echo(spec: CallSpec) -> list[dict[str, Any]]:
    strict = spec.attributes.get(ATTR_TOOLS_STRICT) or []
    echo = []
    for i, tool in enumerate(spec.tools or []):
        function = tool.get("function") or {}
        echo.append(
            {
                "type": "function",
                "name": function.get("name"),
                "description": function.get("description"),
                "parameters": function.get("parameters"),
                "strict": strict[i] if i < len(strict) else None,
            }
        )
    return echo


def _tool_choice_echo(choice: ToolChoice) -> str | dict[str, Any]:
    if choice.mode == "function":
        return {"type": "function", "name": choice.name}
    return choice.mode


def _text_echo(spec: CallSpec) -> dict[str, Any]:
    sent = (spec.attributes.get(ATTR_TEXT) or {}).get("format") or {}
    fmt: dict[str, Any]
    if spec.output_format is None:
        fmt = {"type": "text"}
    elif spec.output_format.kind == "json_object":
        fmt = {"type": "json_object"}
    else:
        fmt = {
            "type": "json_schema",
            "name": spec.output_format.name or "response",
            "schema": spec.output_format.schema or {},
            "strict": sent.get("strict"),
            "description": sent.get("description"),
        }
    return {"format": fmt, "verbosity": "medium"}


def _response_object(
    spec: CallSpec,
    *,
    response_id: str,
    created_s: float,
    model: str,
    applied: Mapping[str, float | int],
    status: str,
    output: list[dict[str, Any]],
    incomplete_details: dict[str, Any] | None,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    attributes = spec.attributes
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_s,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": incomplete_details,
        "instructions": attributes.get(ATTR_INSTRUCTIONS),
        "max_output_tokens": applied.get("max_tokens"),
        "max_tool_calls": attributes.get(ATTR_MAX_TOOL_CALLS),
        "metadata": dict(attributes.get(ATTR_METADATA) or {}),
        "model": model,
        "output": output,
        "parallel_tool_calls": spec.parallel_tool_calls,
        "previous_response_id": attributes.get(ATTR_PREVIOUS_RESPONSE_ID),
        "prompt_cache_key": attributes.get(ATTR_PROMPT_CACHE_KEY),
        "reasoning": {"effort": None, "summary": None},
        "safety_identifier": attributes.get(ATTR_SAFETY_IDENTIFIER),
        "service_tier": "default",
        "store": attributes.get(ATTR_STORE, True),
        "temperature": applied.get("temperature"),
        "text": _text_echo(spec),
        "tool_choice": _tool_choice_echo(spec.tool_choice),
        "tools": _tools_echo(spec),
        "top_logprobs": spec.top_logprobs,
        "top_p": applied.get("top_p"),
        "truncation": "disabled",
        "usage": usage,
        "user": attributes.get(ATTR_USER),
    }
