"""chat_format: OpenAI messages adapted for Hugging Face chat templates."""

from __future__ import annotations

import copy

from agentbolt.inference.chat_format import normalize_messages, tools_in_system_message
from agentbolt.server.gateway.toolcalls import parse_tool_calls

CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'}}


def test_none_and_list_content_become_text() -> None:
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}],
        },
        {"role": "assistant", "content": None},
    ]
    assert normalize_messages(messages) == [{"role": "user", "content": "a\nb"}, {"role": "assistant", "content": ""}]


def test_tool_call_arguments_string_becomes_an_object_and_input_is_untouched() -> None:
    messages = [{"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "tool", "content": "42"}]
    before = copy.deepcopy(messages)
    out = normalize_messages(messages)
    assert messages == before
    assert out[0]["content"] == ""
    assert out[0]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "6*7"}}}
    ]
    assert out[1] == {"role": "tool", "content": "42"}


def test_arguments_that_are_not_a_json_object_stay_as_given() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}
    out = normalize_messages([{"role": "assistant", "content": "", "tool_calls": [call]}])
    assert out[0]["tool_calls"][0]["function"]["arguments"] == "not json"


def test_inline_tool_calls_round_trip_through_the_parser() -> None:
    out = normalize_messages(
        [{"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]}], inline_tool_calls=True
    )
    assert "tool_calls" not in out[0]
    content, calls = parse_tool_calls(out[0]["content"])
    assert content == "Let me check."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("calculator", '{"expression": "6*7"}')
    ]


def test_empty_tool_calls_are_dropped() -> None:
    assert normalize_messages([{"role": "assistant", "content": "hi", "tool_calls": []}]) == [
        {"role": "assistant", "content": "hi"}
    ]


def test_tools_go_into_the_system_message() -> None:
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
    with_system = tools_in_system_message(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}], tools
    )
    assert with_system[0]["content"].startswith("Be brief.\n\n# Tools")
    assert '"name": "calculator"' in with_system[0]["content"] and "<tool_call>" in with_system[0]["content"]
    without = tools_in_system_message([{"role": "user", "content": "x"}], tools)
    assert [m["role"] for m in without] == ["system", "user"]
