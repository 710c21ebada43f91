"""parse_tool_calls: generated text -> (content, OpenAI tool_calls)."""

from __future__ import annotations

import json
import re

import pytest

from agentbolt.server.gateway.toolcalls import parse_tool_calls


def _names_and_args(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(call["function"]["name"], json.loads(call["function"]["arguments"])) for call in calls]


def test_tagged_call_with_surrounding_prose() -> None:
    text = 'Let me compute it.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me compute it."
    assert _names_and_args(calls) == [("calculator", {"expression": "2+3"})]
    call = calls[0]
    assert call["type"] == "function"
    assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"])
    assert isinstance(call["function"]["arguments"], str)


def test_tagged_call_alone_has_no_content() -> None:
    content, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}</tool_call>\n')
    assert content is None
    assert _names_and_args(calls) == [("f", {})]


def test_multiple_tagged_calls_keep_order_and_distinct_ids() -> None:
    text = (
        '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"y": "é"}}\n</tool_call>'
    )
    content, calls = parse_tool_calls(text)
    assert content is None
    assert _names_and_args(calls) == [("a", {"x": 1}), ("b", {"y": "é"})]
    assert '"é"' in calls[1]["function"]["arguments"]  # not ascii-escaped
    assert calls[0]["id"] != calls[1]["id"]


def test_tagged_call_without_closing_tag() -> None:
    content, calls = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"q": "x"}}')
    assert content is None
    assert _names_and_args(calls) == [("f", {"q": "x"})]


def test_malformed_tagged_block_stays_content_next_to_a_good_one() -> None:
    bad = '<tool_call>{"name": "a", "arguments": {</tool_call>'
    text = bad + '\n<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == bad
    assert _names_and_args(calls) == [("b", {})]


def test_bare_json_object() -> None:
    content, calls = parse_tool_calls('  {"name": "search", "arguments": {"query": "cats"}}\n')
    assert content is None
    assert _names_and_args(calls) == [("search", {"query": "cats"})]


def test_fenced_json() -> None:
    text = '```json\n{"name": "search", "arguments": {"query": "cats"}}\n```'
    content, calls = parse_tool_calls(text)
    assert content is None
    assert _names_and_args(calls) == [("search", {"query": "cats"})]


def test_several_bare_objects_one_per_line_and_a_list() -> None:
    lines = '{"name": "a", "arguments": {}}\n{"name": "b", "parameters": {"k": 2}}'
    assert _names_and_args(parse_tool_calls(lines)[1]) == [("a", {}), ("b", {"k": 2})]
    listed = '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"k": 2}}]'
    assert _names_and_args(parse_tool_calls(listed)[1]) == [("a", {}), ("b", {"k": 2})]


def test_prose_plus_bare_json_is_content() -> None:
    text = 'I would call it like this: {"name": "search", "arguments": {"query": "cats"}}'
    assert parse_tool_calls(text) == (text, [])


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "search", "arguments": {"query": ',  # truncated
        '<tool_call>{"name": "search", "arguments": }</tool_call>',  # bad JSON inside tags
        '<tool_call>["search"]</tool_call>',  # not an object
        '{"name": "Ada"}',  # bare JSON without arguments: an answer, not a call
        '{"name": "a", "arguments": {}}\nthen some words',  # partly JSON
    ],
)
def test_malformed_or_non_call_json_stays_content(text: str) -> None:
    assert parse_tool_calls(text) == (text, [])


def test_arguments_given_as_string_pass_through() -> None:
    text = '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
    _, calls = parse_tool_calls(text)
    assert calls[0]["function"]["arguments"] == '{"a": 1}'


def test_missing_arguments_in_tags_become_empty_object() -> None:
    _, calls = parse_tool_calls('<tool_call>{"name": "now"}</tool_call>')
    assert calls[0]["function"]["arguments"] == "{}"


@pytest.mark.parametrize("text", ["The answer is 42.", "Use <b>bold</b> {braces} here", "[1, 2, 3]", "{}"])
def test_plain_text_is_content(text: str) -> None:
    assert parse_tool_calls(text) == (text, [])


def test_empty_text_has_no_content() -> None:
    assert parse_tool_calls("") == (None, [])


def test_a_call_cut_inside_its_closing_tag_is_still_a_call() -> None:
    text = '<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_'
    content, calls = parse_tool_calls(text, {"lookup"})
    assert content is None and [c["function"]["name"] for c in calls] == ["lookup"]
    assert parse_tool_calls("plain text ending in </", {"lookup"}) == ("plain text ending in </", [])
