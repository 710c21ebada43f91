"""The Anthropic Messages wire format (``POST /v1/messages``, ``POST /v1/messages/count_tokens``), as the gateway
reads and writes it. Pure: no I/O.

- :func:`messages_call` / :func:`count_tokens_call`: a request body as a :class:`~.calls.CallSpec` (OpenAI Chat
  messages and tools, see :mod:`~agentbolt.server.gateway.calls`), or :class:`~.calls.RequestRefused` naming the
  field the gateway cannot honour.
- :func:`message_body`: a whole ``message``; :class:`MessagesStreamEncoder`: the server-sent events of a stream;
  :func:`count_tokens_body`: the answer of ``count_tokens``.
- :func:`anthropic_error_type` / :func:`anthropic_error_body`: ``{"type": "error", "error": {"type", "message"}}``.

Spec: https://docs.anthropic.com/en/api/messages (streaming: https://docs.anthropic.com/en/api/messages-streaming,
errors: https://docs.anthropic.com/en/api/errors); field names as the ``anthropic`` SDK 2.15 types spell them.

:data:`MESSAGES_FIELDS` (and :data:`COUNT_TOKENS_FIELDS`) say what happens to each top-level field; a key not
there is refused. Recorded fields go to ``CallSpec.attributes`` under ``agentbolt.llm.request.<field>`` (the
``ATTR_*`` constants). Turns become chat messages so:

- ``text`` blocks of a turn are joined with ``"\\n"``; ``system`` (a string or text blocks) is the first message,
  and a ``system`` turn inside ``messages`` a system message where it stands.
- A user turn's ``tool_result`` blocks become ``role: tool`` messages (``tool_call_id`` = ``tool_use_id``, content
  a string or text blocks) placed before the rest of its text, which follows as one user message. ``is_error`` has
  no slot in a chat tool message and is not rendered: the result's text is passed as it is.
- An assistant turn's ``tool_use`` blocks become its ``tool_calls`` (``arguments`` =
  ``json.dumps(input, ensure_ascii=False)``), after its text.
- Consecutive turns of one role stay separate chat messages (Anthropic merges them into one turn; a chat template
  renders each as its own).
- Refused, naming ``messages[i].content[j]``: ``image`` / ``document`` / ``search_result`` blocks, in a tool result
  too (the served model is text-only); ``thinking`` / ``redacted_thinking`` (the served model has no extended
  thinking, so they can only come from another model); server-tool blocks (``server_tool_use``,
  ``*_tool_result``, ``container_upload``...). A last ``assistant`` turn (prefill) is refused: the backends render
  whole turns and cannot continue a partial one.
- ``cache_control`` on blocks and tools is ignored (a caching hint: the embedded backend caches prompt prefixes on
  its own, whatever the hint says), and so are
  ``citations`` (they point into documents, which are refused).

``temperature``, ``top_p`` and ``top_k`` are in the API reference but no longer in the ``anthropic`` SDK 2.15
types, whose users send them with ``extra_body``.

Answers: one text block (when there is text) then one ``tool_use`` block per call; ``stop_reason`` from the
choice's finish (:func:`stop_reason`); usage counts the exact prompt and response tokens, cache counts 0.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from agentbolt.inference.base import MAX_STOP_STRINGS
from agentbolt.server.gateway.calls import CallSpec, ChoiceOutput, OutputFormat, RequestRefused, ToolCall, ToolChoice

PROTOCOL: Final = "messages"
""":attr:`~.calls.CallSpec.protocol` of both endpoints."""

ATTR_METADATA: Final = "agentbolt.llm.request.metadata"
"""dict: the request's ``metadata`` (``{"user_id": ...}``), as sent."""
ATTR_SERVICE_TIER: Final = "agentbolt.llm.request.service_tier"
"""str: the request's ``service_tier`` (``auto`` / ``standard_only``); the gateway has one tier."""
ATTR_SPEED: Final = "agentbolt.llm.request.speed"
"""str: the request's ``speed`` (``standard`` / ``fast``); the gateway has one speed."""

RAW_INPUT_KEY: Final = "_raw"
"""A tool call whose ``arguments`` is not a JSON object (a malformed call passed on by a remote backend) comes out
as ``input: {"_raw": arguments}``: Anthropic's ``input`` must be an object, and so the tool, or the agent, sees
exactly what the model wrote and can say what is wrong with it."""

MESSAGES_FIELDS: Final[Mapping[str, str]] = {
    "model": "recorded; any name is served by the backend's model",
    "messages": "honoured: user, assistant and system turns; text, tool_use (assistant) and tool_result (user) "
    "blocks; image, document, search_result, thinking, redacted_thinking and server-tool blocks refused; a last "
    "assistant turn (prefill) refused",
    "system": "honoured: the first system message (text blocks joined with a newline; cache_control ignored)",
    "max_tokens": "honoured, required, >= 1 (a job's version may cap it); 0 (prompt-cache pre-warming) refused",
    "temperature": "honoured, [0, 1] (a job's version overrides it in its rollouts)",
    "top_p": "honoured, (0, 1] (a job's version overrides it in its rollouts)",
    "top_k": "refused unless null: the backends sample with temperature and top_p only",
    "stop_sequences": "honoured",
    "stream": "honoured (server-sent events)",
    "tools": "honoured: client tools (name, description, input_schema; strict passed on; cache_control and "
    "eager_input_streaming ignored); server tools, input_examples, defer_loading and allowed_callers other than "
    "direct refused",
    "tool_choice": "honoured: auto, any, tool, none; disable_parallel_tool_use",
    "thinking": "honoured: disabled, adaptive (the served model never thinks); enabled and between_tools refused",
    "output_config": "honoured: format json_schema; effort refused (the served model has no effort levels)",
    "output_format": "honoured: the earlier top-level spelling of output_config.format",
    "metadata": "recorded",
    "service_tier": "recorded (the gateway has one tier)",
    "speed": "recorded (the gateway has one speed)",
    "cache_control": "accepted, ignored: a caching hint (the embedded backend caches prompt prefixes on its own)",
    "diagnostics": "accepted, ignored: prompt-cache miss reports (not produced)",
    "inference_geo": "accepted, ignored",
    "user_profile_id": "accepted, ignored (Anthropic account routing)",
    "workspace_id": "accepted, ignored (Anthropic account routing)",
    "container": "refused unless null: code-execution containers belong to Anthropic's server tools",
    "mcp_servers": "refused unless null or empty: the gateway connects to no MCP server",
    "context_management": "refused unless null or empty: the gateway edits no context",
}
"""What the gateway does with each Messages request field (the keys of the ``anthropic`` package's
``MessageCreateParams``, ``temperature``, ``top_p`` and ``top_k`` of the API reference, the earlier
``output_format`` and the beta ``mcp_servers`` / ``context_management``); any other key is refused."""

COUNT_TOKENS_FIELDS: Final[Mapping[str, str]] = {
    key: MESSAGES_FIELDS[key]
    for key in (
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "output_format",
        "cache_control",
        "speed",
        "user_profile_id",
        "workspace_id",
        "mcp_servers",
        "context_management",
    )
}
"""The fields of ``count_tokens`` (``MessageCountTokensParams``); what happens to each as in
:data:`MESSAGES_FIELDS`."""

_REFUSALS: Final[Mapping[str, str]] = {
    "top_k": "top_k is not supported: the gateway's backends sample with temperature and top_p only; leave it unset",
    "container": "container is not supported: containers belong to Anthropic's code-execution server tools, which "
    "the gateway does not run",
    "mcp_servers": "mcp_servers is not supported: the gateway connects to no MCP server; declare the server's tools "
    "as client tools (name, description, input_schema) and run them in the agent",
    "context_management": "context_management is not supported: the gateway clears nothing from the context; it "
    "renders every message as sent",
}
_TOOL_KEYS = frozenset(
    {
        "name",
        "description",
        "input_schema",
        "type",
        "cache_control",
        "strict",
        "eager_input_streaming",
        "defer_loading",
        "allowed_callers",
        "input_examples",
    }
)
_TEXT_ONLY_BLOCKS = frozenset({"image", "document", "search_result"})
_THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})
_SERVER_TOOL_BLOCKS = frozenset(
    {
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "tool_reference",
        "container_upload",
        "mcp_tool_use",
        "mcp_tool_result",
    }
)


def messages_call(body: dict[str, Any]) -> CallSpec:
    """A ``POST /v1/messages`` request as a call (https://docs.anthropic.com/en/api/messages).

    Args:
        body: the decoded JSON request body.

    Returns:
        A :class:`~.calls.CallSpec` with ``protocol="messages"``, ``n=1``, the chat messages (also as
        ``record_messages``) and tools, ``sampling_requested`` (``max_tokens`` always, ``temperature`` and
        ``top_p`` when set), ``stop``, ``stream``, ``tool_choice``, ``parallel_tool_calls``, ``output_format``,
        ``model`` (the name asked for) and ``attributes`` (``metadata``, ``service_tier``, ``speed`` when set).
        :data:`MESSAGES_FIELDS` says what happens to each field, the module docstring how turns are converted.

    Raises:
        RequestRefused: a field the gateway cannot honour (``code="unsupported_parameter"``), an unknown key
            (``"unknown_parameter"``), a missing or bad value (``"invalid_value"``); ``param`` names the field
            (``max_tokens``, ``messages[2].content[1]``, ``tools[0]``...).
    """
    _check_keys(body, MESSAGES_FIELDS)
    spec = _conversation(body)
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise _invalid("max_tokens", "is required: the most tokens to generate (>= 1)")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _invalid("max_tokens", f"must be an integer >= 1, not {max_tokens!r}")
    spec.sampling_requested = {"max_tokens": max_tokens}
    for key, interval in (("temperature", "[0, 1]"), ("top_p", "(0, 1]")):
        value = body.get(key)
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not (0 < value <= 1 if key == "top_p" else 0 <= value <= 1):
            raise _invalid(key, f"must be a number in {interval}, not {value!r}")
        spec.sampling_requested[key] = float(value)
    spec.stop = _stop_sequences(body.get("stop_sequences"))
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _invalid("stream", "must be true or false")
    spec.stream = bool(stream)
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise _invalid("metadata", 'must be an object ({"user_id": ...})')
        spec.attributes[ATTR_METADATA] = metadata
    _record_string(body, "service_tier", ATTR_SERVICE_TIER, spec)
    return spec


def count_tokens_call(body: dict[str, Any]) -> CallSpec:
    """A ``POST /v1/messages/count_tokens`` request as a call: the conversion of :func:`messages_call` for the
    fields this endpoint has (:data:`COUNT_TOKENS_FIELDS`); nothing is sampled, so there is no ``max_tokens``. The
    route renders the prompt and answers :func:`count_tokens_body`
    (https://docs.anthropic.com/en/api/messages-count-tokens).

    Raises:
        RequestRefused: as :func:`messages_call`; ``max_tokens`` and the other sampling fields are unknown keys
            here, as in Anthropic's API.
    """
    _check_keys(body, COUNT_TOKENS_FIELDS)
    return _conversation(body)


def count_tokens_body(input_tokens: int) -> dict[str, int]:
    """``{"input_tokens": N}``, the answer of ``count_tokens``: N is the rendered prompt's length in tokens."""
    return {"input_tokens": input_tokens}


def _conversation(body: dict[str, Any]) -> CallSpec:
    """The fields both endpoints read: messages, tools, tool choice, thinking, output format, speed."""
    messages = _chat_messages(body)
    tools = _chat_tools(body.get("tools"))
    tool_choice, parallel = _tool_choice(body.get("tool_choice"), [tool["function"]["name"] for tool in tools or []])
    _check_thinking(body.get("thinking"))
    spec = CallSpec(
        protocol=PROTOCOL,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        output_format=_output_format(body),
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        record_messages=list(messages),
    )
    _record_string(body, "speed", ATTR_SPEED, spec)
    return spec


def _invalid(param: str, problem: str) -> RequestRefused:
    """A bad value: ``"<param> <problem>"``, code ``invalid_value``."""
    return RequestRefused(f"{param} {problem}", param=param, code="invalid_value")


def _unsupported(param: str, problem: str) -> RequestRefused:
    """A value the gateway cannot serve: ``"<param> <problem>"``, code ``unsupported_parameter``."""
    return RequestRefused(f"{param} {problem}", param=param)


def _check_keys(body: dict[str, Any], fields: Mapping[str, str]) -> None:
    """Refuse a key the endpoint does not have, and a refused field that is set."""
    for key, value in body.items():
        if key not in fields:
            raise RequestRefused(
                f"unknown field {key!r}; the gateway reads {', '.join(sorted(fields))}",
                param=key,
                code="unknown_parameter",
            )
        if key in _REFUSALS and value is not None and value != [] and value != {}:
            raise RequestRefused(_REFUSALS[key], param=key)


def _record_string(body: dict[str, Any], key: str, attribute: str, spec: CallSpec) -> None:
    value = body.get(key)
    if value is not None:
        if not isinstance(value, str):
            raise _invalid(key, "must be a string")
        spec.attributes[attribute] = value


def _stop_sequences(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _invalid("stop_sequences", "must be a list of strings")
    for k, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise _invalid(f"stop_sequences[{k}]", f"must be a non-empty string, not {item!r}")
    if len(value) > MAX_STOP_STRINGS:
        raise _invalid("stop_sequences", f"takes at most {MAX_STOP_STRINGS} strings, got {len(value)}")
    return tuple(value)


# --- messages ---------------------------------------------------------------------------------------------------


def _chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``system`` and ``messages`` as OpenAI Chat messages (rules in the module docstring)."""
    out: list[dict[str, Any]] = []
    if body.get("system") is not None:
        out.append({"role": "system", "content": _plain_text(body["system"], "system")})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", 'is required: a non-empty list of {"role", "content"} turns')
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _invalid(param, 'must be an object {"role", "content"}')
        role, content = message.get("role"), message.get("content")
        if role == "system":
            out.append({"role": "system", "content": _plain_text(content, f"{param}.content")})
        elif role == "user":
            out.extend(_user_messages(_blocks(content, f"{param}.content")))
        elif role == "assistant":
            out.append(_assistant_message(_blocks(content, f"{param}.content")))
        else:
            raise _invalid(f"{param}.role", f"must be user, assistant or system, not {role!r}")
    if messages[-1].get("role") == "assistant":
        raise _unsupported(
            f"messages[{len(messages) - 1}]",
            "is an assistant turn: the gateway cannot continue a partial assistant answer (prefill); end the "
            "messages with a user turn",
        )
    return out


def _blocks(content: Any, param: str) -> list[tuple[str, dict[str, Any]]]:
    """A turn's content as ``(param, block)`` pairs (a string is one text block)."""
    if isinstance(content, str):
        return [(param, {"type": "text", "text": content})]
    if not isinstance(content, list):
        raise _invalid(param, "must be a string or a list of content blocks")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _invalid(f"{param}[{j}]", 'must be a content block {"type": ...}')
    return [(f"{param}[{j}]", block) for j, block in enumerate(content)]


def _user_messages(blocks: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """A user turn: its ``tool_result`` blocks as tool messages, then its text as one user message (when it has
    text, or nothing else)."""
    results: list[dict[str, Any]] = []
    texts: list[str] = []
    for param, block in blocks:
        if block["type"] == "text":
            texts.append(_block_text(block, param))
        elif block["type"] == "tool_result":
            results.append(_tool_message(block, param))
        else:
            raise _refused_block(block["type"], param, "user")
    if texts or not results:
        return [*results, {"role": "user", "content": "\n".join(texts)}]
    return results


def _assistant_message(blocks: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """An assistant turn: its text, then its ``tool_use`` blocks as ``tool_calls``."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for param, block in blocks:
        if block["type"] == "text":
            texts.append(_block_text(block, param))
        elif block["type"] == "tool_use":
            calls.append(_tool_call(block, param))
        else:
            raise _refused_block(block["type"], param, "assistant")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _block_text(block: dict[str, Any], param: str) -> str:
    if not isinstance(block.get("text"), str):
        raise _invalid(f"{param}.text", "must be a string")
    return block["text"]


def _plain_text(content: Any, param: str) -> str:
    """A string, or text blocks joined with ``"\\n"`` (``system``, a system turn, a tool result's content)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid(param, "must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str):
            raise _invalid(f"{param}[{j}]", 'must be a text block {"type": "text", "text": ...}')
        if kind != "text":
            raise _refused_block(kind, f"{param}[{j}]", None)
        texts.append(_block_text(block, f"{param}[{j}]"))
    return "\n".join(texts)


def _tool_message(block: dict[str, Any], param: str) -> dict[str, Any]:
    """A ``tool_result`` block as ``{"role": "tool", "tool_call_id", "content"}``."""
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise _invalid(f"{param}.tool_use_id", "must be the id of the tool_use it answers")
    content = block.get("content")
    text = "" if content is None else _plain_text(content, f"{param}.content")
    return {"role": "tool", "tool_call_id": tool_use_id, "content": text}


def _tool_call(block: dict[str, Any], param: str) -> ToolCall:
    """A ``tool_use`` block as an OpenAI tool call with JSON-string ``arguments``."""
    for key in ("id", "name"):
        if not isinstance(block.get(key), str) or not block[key]:
            raise _invalid(f"{param}.{key}", "must be a non-empty string")
    if not isinstance(block.get("input"), dict):
        raise _invalid(f"{param}.input", "must be an object")
    caller = block.get("caller")
    if caller is not None and (not isinstance(caller, dict) or caller.get("type") != "direct"):
        raise _unsupported(
            f"{param}.caller",
            "is not served: only direct tool calls are (programmatic calls come from Anthropic's code execution)",
        )
    arguments = json.dumps(block["input"], ensure_ascii=False)
    return {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}


def _refused_block(kind: str, param: str, role: str | None) -> RequestRefused:
    """The refusal of a content block of type ``kind`` in a ``role`` turn (``None``: where only text goes)."""
    if kind in _TEXT_ONLY_BLOCKS:
        return _unsupported(param, f"is a {kind} block: the served model is text-only; send the content as text")
    if kind in _THINKING_BLOCKS:
        return _unsupported(
            param,
            f"is a {kind} block: the served model has no extended thinking and never produces one; remove thinking "
            "blocks from the history",
        )
    if kind in _SERVER_TOOL_BLOCKS:
        return _unsupported(param, f"is a {kind} block: the gateway does not run Anthropic's server tools")
    accepted = {"user": "text and tool_result", "assistant": "text and tool_use", None: "text"}[role]
    where = f"a {role} turn" if role else "this field"
    return _unsupported(param, f"is a {kind} block, which {where} cannot hold; it takes {accepted} blocks")


# --- tools and options --------------------------------------------------------------------------------------------


def _chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Client tools as chat function tools; ``None`` when the request declares none."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _invalid("tools", "must be a list of tool definitions")
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _invalid(param, "must be an object")
        if tool.get("type") not in (None, "custom"):
            raise _unsupported(
                param,
                f"is Anthropic's server tool {tool['type']!r}, which runs on Anthropic's servers; the gateway serves "
                'client tools only ({"name", "description", "input_schema"}), which the agent runs',
            )
        for key in tool:
            if key not in _TOOL_KEYS:
                raise RequestRefused(f"{param} has no field {key!r}", param=f"{param}.{key}", code="unknown_parameter")
        function = _chat_function(tool, param)
        if function["name"] in names:
            raise _invalid(f"{param}.name", f"{function['name']!r} is declared twice")
        names.add(function["name"])
        out.append({"type": "function", "function": function})
    return out


def _chat_function(tool: dict[str, Any], param: str) -> dict[str, Any]:
    """A client tool's chat ``function``: ``name``, ``description`` (when given), ``parameters``, ``strict``."""
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise _invalid(f"{param}.name", "must be a non-empty string")
    if not isinstance(tool.get("input_schema"), dict):
        raise _invalid(f"{param}.input_schema", "must be a JSON schema object")
    if tool.get("input_examples"):
        raise _unsupported(f"{param}.input_examples", "is not supported; put the examples in the description")
    if tool.get("defer_loading"):
        raise _unsupported(f"{param}.defer_loading", "needs Anthropic's tool search server tool; leave it out")
    callers = tool.get("allowed_callers")
    if callers is not None and (not isinstance(callers, list) or any(caller != "direct" for caller in callers)):
        raise _unsupported(
            f"{param}.allowed_callers", 'can only be ["direct"]: other callers are Anthropic\'s code execution'
        )
    function: dict[str, Any] = {"name": tool["name"]}
    if tool.get("description") is not None:
        if not isinstance(tool["description"], str):
            raise _invalid(f"{param}.description", "must be a string")
        function["description"] = tool["description"]
    function["parameters"] = tool["input_schema"]
    if tool.get("strict") is not None:
        if not isinstance(tool["strict"], bool):
            raise _invalid(f"{param}.strict", "must be true or false")
        function["strict"] = tool["strict"]
    return function


_TOOL_CHOICE_KEYS: Final[Mapping[str, frozenset[str]]] = {
    "auto": frozenset({"type", "disable_parallel_tool_use"}),
    "any": frozenset({"type", "disable_parallel_tool_use"}),
    "tool": frozenset({"type", "name", "disable_parallel_tool_use"}),
    "none": frozenset({"type"}),
}


def _tool_choice(value: Any, names: list[str]) -> tuple[ToolChoice, bool]:
    """``(tool_choice, parallel_tool_calls)`` from Anthropic's ``tool_choice``."""
    if value is None:
        return ToolChoice(), True
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(value, dict) or kind not in _TOOL_CHOICE_KEYS:
        raise _invalid("tool_choice", 'must be {"type": "auto" | "any" | "none"} or {"type": "tool", "name": ...}')
    for key in value:
        if key not in _TOOL_CHOICE_KEYS[kind]:
            raise RequestRefused(
                f"tool_choice {kind!r} has no field {key!r}", param=f"tool_choice.{key}", code="unknown_parameter"
            )
    disable = value.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise _invalid("tool_choice.disable_parallel_tool_use", "must be true or false")
    parallel = not disable
    if kind in ("auto", "none"):
        return ToolChoice(kind), parallel
    if not names:
        raise _invalid("tool_choice", f"{kind!r} needs tools, and the request declares none")
    if kind == "any":
        return ToolChoice("required"), parallel
    if value.get("name") not in names:
        raise _invalid("tool_choice.name", f"{value.get('name')!r} is not a declared tool ({', '.join(names)})")
    return ToolChoice("function", value["name"]), parallel


def _check_thinking(value: Any) -> None:
    """``thinking``: absent, ``disabled`` and ``adaptive`` pass; extended thinking is refused."""
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or kind in ("disabled", "adaptive"):
        return
    if kind in ("enabled", "between_tools"):
        raise _unsupported(
            "thinking",
            f'{kind!r}: the served model has no extended thinking; send {{"type": "disabled"}} or leave it out',
        )
    raise _invalid("thinking", 'must be {"type": "disabled"}, {"type": "adaptive"} or {"type": "enabled", ...}')


def _output_format(body: dict[str, Any]) -> OutputFormat | None:
    """``output_config.format`` (or its earlier top-level spelling ``output_format``) as a ``json_schema``
    constraint; ``output_config.effort`` is refused."""
    config = body.get("output_config")
    found = None
    if config is not None:
        if not isinstance(config, dict):
            raise _invalid("output_config", 'must be an object {"format", "effort"}')
        for key in config:
            if key not in ("format", "effort"):
                raise RequestRefused(
                    f"output_config has no field {key!r}", param=f"output_config.{key}", code="unknown_parameter"
                )
        if config.get("effort") is not None:
            raise _unsupported("output_config.effort", "is not supported: the served model has no effort levels")
        found = _json_schema_format(config.get("format"), "output_config.format")
    legacy = _json_schema_format(body.get("output_format"), "output_format")
    if found is not None and legacy is not None:
        raise _invalid("output_format", "and output_config.format are both set; send one")
    return found or legacy


def _json_schema_format(value: Any, param: str) -> OutputFormat | None:
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") != "json_schema" or not isinstance(value.get("schema"), dict):
        raise _invalid(param, 'must be {"type": "json_schema", "schema": {...}}')
    return OutputFormat("json_schema", schema=value["schema"])


# --- answers ----------------------------------------------------------------------------------------------------


def stop_reason(output: ChoiceOutput) -> str:
    """Anthropic's ``stop_reason`` for a choice: ``max_tokens`` when generation hit the budget (even when calls were
    parsed: the turn was cut off), ``tool_use`` when the model called tools, ``stop_sequence`` when a stop string
    ended it, ``refusal`` for a remote server's ``content_filter``, else ``end_turn`` (``abort`` included: the
    client that stopped it is gone)."""
    if output.finish == "length":
        return "max_tokens"
    if output.tool_calls or output.finish == "tool_calls":
        return "tool_use"
    if output.stop_sequence is not None:
        return "stop_sequence"
    return "refusal" if output.finish == "content_filter" else "end_turn"


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's JSON-string ``arguments`` as a ``tool_use`` ``input``: the decoded object; ``{}`` for empty
    arguments; ``{RAW_INPUT_KEY: arguments}`` when they are not a JSON object (see :data:`RAW_INPUT_KEY`)."""
    if not arguments.strip():
        return {}
    try:
        decoded = json.loads(arguments)
    except ValueError:
        return {RAW_INPUT_KEY: arguments}
    return decoded if isinstance(decoded, dict) else {RAW_INPUT_KEY: arguments}


def _tool_use_block(call: ToolCall) -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "type": "tool_use",
        "id": call["id"],
        "name": function.get("name", ""),
        "input": tool_input(function.get("arguments") or ""),
    }


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message_body(output: ChoiceOutput, *, message_id: str, model: str) -> dict[str, Any]:
    """A whole ``message``, as ``anthropic.types.Message`` parses it.

    ``content``: a ``text`` block when ``output.content`` is not ``None``, then one ``tool_use`` block per tool call
    (``id`` the call's id, ``input`` by :func:`tool_input`). ``stop_reason``: :func:`stop_reason`;
    ``stop_sequence``: the stop string when ``stop_reason`` is ``stop_sequence``, else ``None``. ``usage``: the
    exact prompt and response token counts; cache counts 0 (cache hits of the embedded backend are not reported yet).
    """
    content: list[dict[str, Any]] = []
    if output.content is not None:
        content.append({"type": "text", "text": output.content})
    content.extend(_tool_use_block(call) for call in output.tool_calls)
    reason = stop_reason(output)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": output.stop_sequence if reason == "stop_sequence" else None,
        "usage": _usage(output.result.num_prompt_tokens, output.result.num_completion_tokens),
    }


def _sse(body: dict[str, Any]) -> str:
    """One event: ``event: <body's type>\\ndata: <body as JSON>\\n\\n``."""
    return f"event: {body['type']}\ndata: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


class MessagesStreamEncoder:
    """The server-sent events of a streamed message (a :class:`~.calls.StreamEncoder`;
    https://docs.anthropic.com/en/api/messages-streaming). One choice only (``n`` is always 1): the ``index``
    arguments are accepted and ignored.

    Events, each ``event: <type>\\ndata: <json>\\n\\n``: ``message_start`` (empty content, ``stop_reason`` null,
    ``usage.input_tokens`` = ``input_tokens``); a ``text`` block opened by the first text delta
    (``content_block_start``, then one ``content_block_delta`` with a ``text_delta`` per delta) and closed at the
    choice's end (``content_block_stop``); per tool call a whole ``tool_use`` block (``content_block_start`` with
    ``input: {}``, one ``input_json_delta`` with the whole arguments, ``content_block_stop``); ``message_delta``
    (``stop_reason``, ``stop_sequence``, ``usage`` with ``output_tokens`` and the exact ``input_tokens``);
    ``message_stop``. No ``ping`` events.

    Args:
        message_id: the message's ``id`` (``msg_...``).
        model: the model name the message reports.
        input_tokens: the prompt's length when the route knows it before generation (``message_start`` is sent
            before any result exists), else 0. ``message_delta`` always carries the exact count, which Anthropic's
            SDK takes over the ``message_start`` one.
    """

    def __init__(self, *, message_id: str, model: str, input_tokens: int = 0) -> None:
        self.message_id = message_id
        self.model = model
        self.input_tokens = input_tokens
        self._blocks = 0
        self._text_index: int | None = None
        self._last: ChoiceOutput | None = None

    def begin(self) -> list[str]:
        """``message_start``."""
        message = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(self.input_tokens, 0),
        }
        return [_sse({"type": "message_start", "message": message})]

    def choice_begin(self, index: int) -> list[str]:
        """Nothing: the text block opens with the first text."""
        return []

    def text(self, index: int, delta: str) -> list[str]:
        """A ``text_delta`` (after the text block's ``content_block_start`` on the first one); nothing for ``""``."""
        if not delta:
            return []
        events = []
        if self._text_index is None:
            self._text_index = self._open({"type": "text", "text": ""}, events)
        events.append(self._delta(self._text_index, {"type": "text_delta", "text": delta}))
        return events

    def choice_end(self, output: ChoiceOutput) -> list[str]:
        """Close the text block, then one whole ``tool_use`` block per tool call."""
        events = []
        if self._text_index is not None:
            events.append(_sse({"type": "content_block_stop", "index": self._text_index}))
            self._text_index = None
        for call in output.tool_calls:
            block = _tool_use_block(call)
            index = self._open({**block, "input": {}}, events)
            arguments = (call.get("function") or {}).get("arguments") or ""
            # the arguments as the model wrote them when they are an object, else the input message_body gives
            partial = arguments if _is_object(arguments) else json.dumps(block["input"], ensure_ascii=False)
            events.append(self._delta(index, {"type": "input_json_delta", "partial_json": partial}))
            events.append(_sse({"type": "content_block_stop", "index": index}))
        self._last = output
        return events

    def end(self, outputs: list[ChoiceOutput]) -> list[str]:
        """``message_delta`` (stop reason, usage) and ``message_stop``. ``outputs``: the choice (that of
        :meth:`choice_end` when empty)."""
        output = outputs[0] if outputs else self._last
        delta: dict[str, Any] = {"stop_reason": "end_turn", "stop_sequence": None}
        usage = {"input_tokens": self.input_tokens, "output_tokens": 0}
        if output is not None:
            reason = stop_reason(output)
            delta = {
                "stop_reason": reason,
                "stop_sequence": output.stop_sequence if reason == "stop_sequence" else None,
            }
            usage = {
                "input_tokens": output.result.num_prompt_tokens,
                "output_tokens": output.result.num_completion_tokens,
            }
        return [_sse({"type": "message_delta", "delta": delta, "usage": usage}), _sse({"type": "message_stop"})]

    def error(self, status: int, type_: str, message: str, code: str | None) -> list[str]:
        """``event: error`` with :func:`anthropic_error_body`: the error type follows ``status``; ``type_`` and
        ``code`` (OpenAI's) have no place in Anthropic's shape."""
        return [_sse(anthropic_error_body(status, message))]

    def _open(self, block: dict[str, Any], events: list[str]) -> int:
        index = self._blocks
        self._blocks += 1
        events.append(_sse({"type": "content_block_start", "index": index, "content_block": block}))
        return index

    def _delta(self, index: int, delta: dict[str, Any]) -> str:
        return _sse({"type": "content_block_delta", "index": index, "delta": delta})


def _is_object(arguments: str) -> bool:
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


_ERROR_TYPES: Final[Mapping[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status (https://docs.anthropic.com/en/api/errors): 400, 409 and 422
    ``invalid_request_error`` (409: the attempt is finished, so the request cannot be served as sent), 401
    ``authentication_error``, 402 ``billing_error``, 403 ``permission_error``, 404 ``not_found_error``, 413
    ``request_too_large``, 429 ``rate_limit_error``, 500 / 502 / 503 ``api_error`` (502: the remote backend's
    server failed; 503: the backend is missing or closed, which is not Anthropic's overload), 504
    ``timeout_error``, 529 ``overloaded_error``; any other 4xx ``invalid_request_error``, anything else
    ``api_error``. Anthropic's SDK picks its exception class by the status, not by this type."""
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """``{"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}``."""
    return {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}
