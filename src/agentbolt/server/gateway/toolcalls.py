"""Tool calls out of generated text, as OpenAI ``tool_calls``. Pure: no torch, no I/O.

Backends return plain text; the gateway turns the tool calls in it into the OpenAI message shape agents expect. Two
forms are recognized:

1. Tagged (Qwen2.5 / Hermes chat templates): one or more ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
   blocks anywhere in the text. The text outside the parsed blocks stays the content. A final block whose closing
   tag is missing or cut short (the model stopped right after the JSON, or max_tokens ended it inside
   ``</tool_call>``) is accepted too.
2. Bare JSON, only when the JSON makes up the whole message (surrounding whitespace aside): one object
   ``{"name": ..., "arguments": {...}}``, several such objects one after another (e.g. one per line), or a list of
   them, optionally inside one ```` ```json ```` fence. Prose plus JSON is NOT a tool call: the text stays content
   (a model that explains a JSON format must not trigger a call).

A block whose JSON is malformed, is not an object with a string ``name``, or names a function the request did not
declare (when ``names`` is given), is not a tool call: its text stays in the content unchanged. Bare objects also
need an ``arguments`` key, so an answer such as ``{"name": "Ada"}`` stays content. ``parameters`` is accepted as
another spelling of ``arguments``.

``arguments`` comes out as a JSON string, as in OpenAI's API: an object is serialized (``ensure_ascii=False``), a
string is passed through unchanged, a missing value becomes ``"{}"``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from typing import Any

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)\n?[ \t]*```", re.DOTALL)

ToolCall = dict[str, Any]
"""``{"id": "call_<hex>", "type": "function", "function": {"name": str, "arguments": str}}``."""


def parse_tool_calls(text: str, names: Collection[str] | None = None) -> tuple[str | None, list[ToolCall]]:
    """Split generated ``text`` into message content and OpenAI tool calls.

    Args:
        text: the decoded response (special tokens already skipped).
        names: the functions the request declared in ``tools``; a call of any other name is content. ``None``: any
            name (the gateway always passes the declared ones; with no tools offered it does not parse at all).

    Returns:
        ``(content, tool_calls)``. ``content`` is the text left once the parsed calls are removed, stripped, or
        ``None`` when nothing is left; when no tool call is found it is ``text`` unchanged (``None`` if empty).
        ``tool_calls`` is in order of appearance, each with a fresh random ``call_<24 hex>`` id.
    """
    if "<tool_call>" in text:
        content, calls = _parse_tagged(text, names)
        if calls:
            return content, calls
    calls = _parse_bare(text, names)
    if calls:
        return None, calls
    return (text or None), []


_CLOSE = "</tool_call>"


def _without_partial_close(text: str) -> str:
    """``text`` without a trailing beginning of ``</tool_call>`` (an answer cut at max_tokens inside the closing
    tag): the block before it is then an unclosed final block, read like one."""
    stripped = text.rstrip()
    for length in range(len(_CLOSE) - 1, 1, -1):
        if stripped.endswith(_CLOSE[:length]):
            return stripped[:-length]
    return text


def _parse_tagged(text: str, names: Collection[str] | None) -> tuple[str | None, list[ToolCall]]:
    text = _without_partial_close(text)
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for match in _TAGGED.finditer(text):
        call = _to_tool_call(_loads(match.group(1)), require_arguments=False, names=names)
        if call is None:
            continue  # malformed: the block stays in the content
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(call)
    kept.append(text[position:])
    content = "".join(kept).strip()
    return (content or None), calls


def _parse_bare(text: str, names: Collection[str] | None) -> list[ToolCall]:
    body = text.strip()
    fenced = _FENCE.fullmatch(body)
    if fenced is not None:
        body = fenced.group(1).strip()
    if not body.startswith(("{", "[")):
        return []
    values = _loads_sequence(body)
    if values is None:
        return []
    if len(values) == 1 and isinstance(values[0], list):
        values = values[0]
    calls: list[ToolCall] = []
    for value in values:
        call = _to_tool_call(value, require_arguments=True, names=names)
        if call is None:
            return []  # all or nothing: a message that is partly something else is content
        calls.append(call)
    return calls


def _loads(raw: str) -> Any:
    """``json.loads`` that returns None instead of raising."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _loads_sequence(body: str) -> list[Any] | None:
    """Decode JSON values separated only by whitespace; None if anything else is in ``body``."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    index = 0
    while index < len(body):
        try:
            value, index = decoder.raw_decode(body, index)
        except ValueError:
            return None
        values.append(value)
        while index < len(body) and body[index].isspace():
            index += 1
    return values


def _to_tool_call(value: Any, *, require_arguments: bool, names: Collection[str] | None) -> ToolCall | None:
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name or (names is not None and name not in names):
        return None
    key = "arguments" if "arguments" in value else "parameters" if "parameters" in value else None
    if key is None and require_arguments:
        return None
    arguments = value.get(key) if key is not None else None
    if arguments is None:
        arguments_json = "{}"
    elif isinstance(arguments, str):
        arguments_json = arguments
    else:
        arguments_json = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments_json},
    }


def declared_tool_names(tools: list[dict[str, Any]] | None) -> frozenset[str]:
    """The function names a request's ``tools`` declare (``{"type": "function", "function": {"name": ...}}``, or a
    bare ``{"name": ...}``); empty when it offers none."""
    names: set[str] = set()
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str) and name:
            names.add(name)
    return frozenset(names)
