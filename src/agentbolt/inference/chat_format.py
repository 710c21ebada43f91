"""OpenAI chat messages -> what Hugging Face chat templates render. Pure: no torch, no I/O.

The embedded backend applies the model's chat template itself (the gateway never tokenizes), and OpenAI messages
do not always fit a template as they are: ``content`` may be ``None`` or a list of parts, tool-call ``arguments``
are a JSON string where the Qwen2.5 template wants an object, and small models' templates (SmolLM2) know nothing
of tools. These functions close those gaps; the text forms they write for tools are the Hermes/Qwen ones that
:func:`agentbolt.server.gateway.toolcalls.parse_tool_calls` reads back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def normalize_messages(messages: list[dict[str, Any]], *, inline_tool_calls: bool = False) -> list[dict[str, Any]]:
    """Adapt OpenAI chat messages to what Hugging Face chat templates render.

    - ``content: None`` becomes ``""``; a list of content parts becomes its text parts joined with ``"\n"``.
    - ``tool_calls[].function.arguments`` given as a JSON string (OpenAI's form) becomes the decoded object: the
      Qwen2.5 template writes ``arguments | tojson``, so a string would be rendered as a quoted string. A string that
      is not a JSON object is left as is.
    - With ``inline_tool_calls`` (templates that ignore ``tool_calls``, e.g. SmolLM2's), each call is appended to
      the content as ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` and ``tool_calls`` is dropped.

    The input is not modified.
    """
    normalized: list[dict[str, Any]] = []
    for message in messages:
        out = {key: value for key, value in message.items() if value is not None or key == "content"}
        out["content"] = content_text(message.get("content"))
        calls = [_normalize_tool_call(call) for call in (message.get("tool_calls") or [])]
        out.pop("tool_calls", None)
        if calls and inline_tool_calls:
            blocks = [
                "<tool_call>\n"
                + json.dumps(
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}, ensure_ascii=False
                )
                + "\n</tool_call>"
                for c in calls
            ]
            out["content"] = "\n".join(([out["content"]] if out["content"] else []) + blocks)
        elif calls:
            out["tool_calls"] = calls
        normalized.append(out)
    return normalized


def content_text(content: Any) -> str:
    """The text of an OpenAI message ``content``: ``None`` -> ``""``, a string as is, a list of parts -> the parts'
    ``text`` fields joined with ``"\n"`` (as vLLM and SGLang join them, so that every backend renders the same
    prompt), anything else -> ``str(content)``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping) and "text" in part)
    return str(content)


def _normalize_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            function["arguments"] = decoded
    elif arguments is None:
        function["arguments"] = {}
    out = {key: value for key, value in call.items() if key != "function"}
    out["type"] = call.get("type") or "function"
    out["function"] = function
    return out


def tools_in_system_message(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For templates without tool support: describe ``tools`` in the system message, asking for tagged calls in
    the format :func:`~agentbolt.server.gateway.toolcalls.parse_tool_calls` reads."""
    listing = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    section = (
        "# Tools\n\nYou can call these functions (JSON signatures):\n<tools>\n"
        f"{listing}\n</tools>\n\nTo call one, answer with its name and arguments as JSON inside tags:\n"
        '<tool_call>\n{"name": "<function name>", "arguments": {<arguments as a JSON object>}}\n</tool_call>'
    )
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{section}" if out[0]["content"] else section
    else:
        out.insert(0, {"role": "system", "content": section})
    return out
