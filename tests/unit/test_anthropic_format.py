"""The Anthropic Messages wire format: requests -> CallSpec (OpenAI Chat messages and tools), whole messages, stream
events, errors. No model, no server: GenerationResult objects are built by hand, and Anthropic's own SDK (types,
stream accumulator, exceptions) reads what the module writes, through an in-process transport."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentbolt.inference.base import GenerationResult
from agentbolt.server.gateway.anthropic_format import (
    ATTR_METADATA,
    ATTR_SERVICE_TIER,
    COUNT_TOKENS_FIELDS,
    MESSAGES_FIELDS,
    RAW_INPUT_KEY,
    MessagesStreamEncoder,
    anthropic_error_body,
    count_tokens_body,
    count_tokens_call,
    message_body,
    messages_call,
    tool_input,
)
from agentbolt.server.gateway.calls import ChoiceOutput, OutputFormat, RequestRefused, ToolChoice

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather of a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CHAT_WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": WEATHER_TOOL["input_schema"],
    },
}


def _body(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": "claude-any", "max_tokens": 64, "messages": messages, **fields}


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def _output(
    content: str | None,
    tool_calls: list[dict[str, Any]] | None = None,
    *,
    finish: str = "stop",
    stop_sequence: str | None = None,
    prompt_tokens: int = 7,
    completion_tokens: int = 5,
) -> ChoiceOutput:
    result = GenerationResult(
        prompt_token_ids=list(range(100, 100 + prompt_tokens)),
        response_token_ids=list(range(200, 200 + completion_tokens)),
        response_logprobs=[-0.5] * completion_tokens,
        text=content or "",
        finish_reason="length" if finish == "length" else "stop",
        model_version="base",
    )
    return ChoiceOutput(
        index=0,
        result=result,
        content=content,
        tool_calls=tool_calls or [],
        finish=finish,
        stop_sequence=stop_sequence,
    )


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# --- requests -----------------------------------------------------------------------------------------------------


def test_system_string_and_plain_user_turn() -> None:
    spec = messages_call(_body([_user("Hi")], system="Be brief."))
    assert spec.protocol == "messages"
    assert spec.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert spec.record_messages == spec.messages
    assert spec.tools is None
    assert spec.n == 1
    assert spec.sampling_requested == {"max_tokens": 64}
    assert spec.stream is False


def test_system_blocks_and_text_blocks_join_with_newline() -> None:
    system = [
        {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Answer in French."},
    ]
    turn = _user(
        [{"type": "text", "text": "one"}, {"type": "text", "text": "two", "cache_control": {"type": "ephemeral"}}]
    )
    spec = messages_call(_body([turn], system=system, cache_control={"type": "ephemeral"}))
    assert spec.messages == [
        {"role": "system", "content": "You are terse.\nAnswer in French."},
        {"role": "user", "content": "one\ntwo"},
    ]


def test_tool_use_and_tool_result_round_trip() -> None:
    messages = [
        _user("Weather in Paris and Köln?"),
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Köln"}},
            ],
        },
        _user(
            [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "rain"}, {"type": "text", "text": "12C"}],
                    "is_error": False,
                },
                {"type": "text", "text": "And tomorrow?"},
            ]
        ),
    ]
    spec = messages_call(_body(messages, tools=[WEATHER_TOOL]))
    assert spec.messages == [
        {"role": "user", "content": "Weather in Paris and Köln?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Köln"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "rain\n12C"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert spec.tools == [CHAT_WEATHER_TOOL]
    assert spec.tool_choice == ToolChoice("auto")
    assert spec.parallel_tool_calls is True


def test_tool_results_come_before_text_and_alone_make_no_user_message() -> None:
    messages = [
        _user("go"),
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
        _user(
            [
                {"type": "text", "text": "note first"},
                {"type": "tool_result", "tool_use_id": "t1", "content": "boom", "is_error": True},
            ]
        ),
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "get_weather", "input": {}}]},
        _user([{"type": "tool_result", "tool_use_id": "t2"}]),
    ]
    spec = messages_call(_body(messages, tools=[WEATHER_TOOL]))
    assert spec.messages[1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "boom"},
        {"role": "user", "content": "note first"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "t2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "t2", "content": ""},
    ]


def test_system_turn_inside_messages() -> None:
    spec = messages_call(_body([{"role": "system", "content": [{"type": "text", "text": "rules"}]}, _user("hi")]))
    assert spec.messages == [{"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}]


def test_sampling_stop_stream_metadata() -> None:
    spec = messages_call(
        _body(
            [_user("x")],
            max_tokens=32,
            temperature=0,
            top_p=0.9,
            stop_sequences=["\n\nHuman:", "END"],
            stream=True,
            metadata={"user_id": "u-1"},
            service_tier="auto",
            thinking={"type": "disabled"},
        )
    )
    assert spec.sampling_requested == {"max_tokens": 32, "temperature": 0.0, "top_p": 0.9}
    assert spec.stop == ("\n\nHuman:", "END")
    assert spec.stream is True
    assert spec.attributes == {ATTR_METADATA: {"user_id": "u-1"}, ATTR_SERVICE_TIER: "auto"}


@pytest.mark.parametrize(
    ("tool_choice", "expected", "parallel"),
    [
        ({"type": "auto"}, ToolChoice("auto"), True),
        ({"type": "any"}, ToolChoice("required"), True),
        ({"type": "any", "disable_parallel_tool_use": True}, ToolChoice("required"), False),
        ({"type": "tool", "name": "get_weather"}, ToolChoice("function", "get_weather"), True),
        ({"type": "auto", "disable_parallel_tool_use": True}, ToolChoice("auto"), False),
        ({"type": "none"}, ToolChoice("none"), True),
    ],
)
def test_tool_choice(tool_choice: dict[str, Any], expected: ToolChoice, parallel: bool) -> None:
    spec = messages_call(_body([_user("x")], tools=[{**WEATHER_TOOL, "type": "custom"}], tool_choice=tool_choice))
    assert spec.tool_choice == expected
    assert spec.parallel_tool_calls is parallel
    assert spec.tools == [CHAT_WEATHER_TOOL]


def test_strict_tool_and_missing_description() -> None:
    tool = {"name": "f", "input_schema": {"type": "object"}, "strict": True, "cache_control": {"type": "ephemeral"}}
    spec = messages_call(_body([_user("x")], tools=[tool]))
    assert spec.tools == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}
    ]


@pytest.mark.parametrize("key", ["output_config", "output_format"])
def test_structured_output(key: str) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "schema": schema}
    spec = messages_call(_body([_user("x")], **{key: {"format": fmt} if key == "output_config" else fmt}))
    assert spec.output_format == OutputFormat("json_schema", schema=schema)


def test_model_and_null_or_empty_refused_fields_pass() -> None:
    body = _body([_user("x")], top_k=None, container=None, mcp_servers=[], context_management={})
    assert messages_call(body).model == "claude-any"


def test_every_sdk_field_has_a_rule() -> None:
    """Each key of the SDK's request types is in the tables (a new SDK field fails here, not in a user's call)."""
    types = pytest.importorskip("anthropic.types")
    create = set(types.message_create_params.MessageCreateParamsBase.__annotations__) | {"stream"}
    count = set(types.message_count_tokens_params.MessageCountTokensParams.__annotations__)
    assert create <= set(MESSAGES_FIELDS)
    assert count <= set(COUNT_TOKENS_FIELDS)


def test_adaptive_thinking_is_accepted() -> None:
    assert messages_call(_body([_user("x")], thinking={"type": "adaptive"})).messages == [
        {"role": "user", "content": "x"}
    ]


def test_count_tokens_uses_the_same_conversion_without_max_tokens() -> None:
    body = _body([_user("hi")], system="sys", tools=[WEATHER_TOOL], tool_choice={"type": "any"})
    del body["max_tokens"]
    spec = count_tokens_call(body)
    assert spec.messages == messages_call({**body, "max_tokens": 1}).messages
    assert spec.tools == [CHAT_WEATHER_TOOL]
    assert spec.tool_choice == ToolChoice("required")
    assert count_tokens_body(12) == {"input_tokens": 12}
    with pytest.raises(RequestRefused) as refused:
        count_tokens_call({**body, "max_tokens": 5})
    assert (refused.value.param, refused.value.code) == ("max_tokens", "unknown_parameter")


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"messages": [_user([{"type": "text", "text": "see"}, IMAGE])]}, "messages[0].content[1]", None),
        (
            {
                "messages": [
                    _user("x"),
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                    _user(
                        [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "a"}, IMAGE]}]
                    ),
                ]
            },
            "messages[2].content[0].content[1]",
            None,
        ),
        (
            {
                "messages": [
                    _user([{"type": "document", "source": {"type": "text", "data": "d", "media_type": "text/plain"}}])
                ]
            },
            "messages[0].content[0]",
            None,
        ),
        (
            {
                "messages": [
                    _user("x"),
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}]},
                    _user("y"),
                ]
            },
            "messages[1].content[0]",
            None,
        ),
        (
            {
                "messages": [
                    _user("x"),
                    {
                        "role": "assistant",
                        "content": [{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}],
                    },
                    _user("y"),
                ]
            },
            "messages[1].content[0]",
            None,
        ),
        (
            {"messages": [_user([{"type": "tool_use", "id": "t", "name": "f", "input": {}}])]},
            "messages[0].content[0]",
            None,
        ),
        ({"tools": [WEATHER_TOOL, {"type": "web_search_20250305", "name": "web_search"}]}, "tools[1]", None),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0]", None),
        (
            {"tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "nope"}},
            "tool_choice.name",
            "invalid_value",
        ),
        ({"tool_choice": {"type": "any"}}, "tool_choice", "invalid_value"),
        ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools[1].name", "invalid_value"),
        ({"tools": [{**WEATHER_TOOL, "input_examples": [{"city": "Rome"}]}]}, "tools[0].input_examples", None),
        ({"frobnicate": 1}, "frobnicate", "unknown_parameter"),
        ({"top_k": 40}, "top_k", None),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking", None),
        ({"container": "c-1"}, "container", None),
        ({"mcp_servers": [{"type": "url", "url": "https://mcp.test", "name": "m"}]}, "mcp_servers", None),
        ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "context_management", None),
        ({"output_config": {"effort": "low"}}, "output_config.effort", None),
        ({"max_tokens": None}, "max_tokens", "invalid_value"),
        ({"max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"temperature": 1.5}, "temperature", "invalid_value"),
        ({"top_p": 0}, "top_p", "invalid_value"),
        ({"stop_sequences": ["ok", 3]}, "stop_sequences[1]", "invalid_value"),
        ({"messages": []}, "messages", "invalid_value"),
        ({"messages": [_user("x"), {"role": "assistant", "content": "The answer is ("}]}, "messages[1]", None),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ],
)
def test_refusals_name_the_field(fields: dict[str, Any], param: str, code: str | None) -> None:
    body = {**_body([_user("x")]), **fields}
    if body["max_tokens"] is None:
        del body["max_tokens"]
    with pytest.raises(RequestRefused) as refused:
        messages_call(body)
    assert refused.value.param == param
    assert refused.value.code == (code or "unsupported_parameter")
    assert refused.value.http_status == 400


def test_refusal_messages_say_why() -> None:
    with pytest.raises(RequestRefused, match="text-only"):
        messages_call(_body([_user([IMAGE])]))
    with pytest.raises(RequestRefused, match="temperature and top_p only"):
        messages_call(_body([_user("x")], top_k=5))
    with pytest.raises(RequestRefused, match="no extended thinking"):
        messages_call(_body([_user("x")], thinking={"type": "enabled", "budget_tokens": 1024}))
    with pytest.raises(RequestRefused, match="web_search_20250305"):
        messages_call(_body([_user("x")], tools=[{"type": "web_search_20250305", "name": "web_search"}]))


# --- whole messages ---------------------------------------------------------------------------------------------


def _validated_message(body: dict[str, Any]) -> Any:
    types = pytest.importorskip("anthropic.types")
    return types.Message.model_validate(body)


def test_message_body_end_turn() -> None:
    body = message_body(_output("Bonjour."), message_id="msg_1", model="served")
    message = _validated_message(body)
    assert message.stop_reason == "end_turn"
    assert message.stop_sequence is None
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Bonjour."
    assert (message.usage.input_tokens, message.usage.output_tokens) == (7, 5)
    assert (message.usage.cache_creation_input_tokens, message.usage.cache_read_input_tokens) == (0, 0)
    assert (message.id, message.model, message.role, message.type) == ("msg_1", "served", "assistant", "message")


def test_message_body_max_tokens_and_stop_sequence() -> None:
    cut = _validated_message(message_body(_output("Once upon", finish="length"), message_id="m", model="s"))
    assert cut.stop_reason == "max_tokens"
    stopped = _validated_message(message_body(_output("a, b", stop_sequence="END"), message_id="m", model="s"))
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "END")


def test_message_body_tool_use() -> None:
    calls = [_call("call_a", "get_weather", '{"city": "Köln"}'), _call("call_b", "get_weather", "not json")]
    output = _output("Checking.", calls, finish="tool_calls")
    message = _validated_message(message_body(output, message_id="m", model="s"))
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["text", "tool_use", "tool_use"]
    first, second = message.content[1], message.content[2]
    assert (first.id, first.name, first.input) == ("call_a", "get_weather", {"city": "Köln"})
    assert second.input == {RAW_INPUT_KEY: "not json"}
    only_calls = message_body(_output(None, calls[:1], finish="tool_calls"), message_id="m", model="s")
    assert [block["type"] for block in only_calls["content"]] == ["tool_use"]


def test_tool_input() -> None:
    assert tool_input('{"a": [1, 2]}') == {"a": [1, 2]}
    assert tool_input("") == {}
    assert tool_input("[1]") == {RAW_INPUT_KEY: "[1]"}


def test_answer_then_next_request_round_trips_the_call() -> None:
    """The assistant content a client sends back (the message's blocks) gives back the call the model made."""
    calls = [_call("call_a", "get_weather", '{"city": "Paris"}')]
    answer = message_body(_output("Let me look.", calls, finish="tool_calls"), message_id="m", model="s")
    follow_up = [
        _user("Weather?"),
        {"role": "assistant", "content": answer["content"]},
        _user([{"type": "tool_result", "tool_use_id": "call_a", "content": "18C"}]),
    ]
    spec = messages_call(_body(follow_up, tools=[WEATHER_TOOL]))
    assert spec.messages[1] == {"role": "assistant", "content": "Let me look.", "tool_calls": calls}
    assert spec.messages[2] == {"role": "tool", "tool_call_id": "call_a", "content": "18C"}


# --- streams ------------------------------------------------------------------------------------------------------


def _stream_text(encoder: MessagesStreamEncoder, deltas: list[str], output: ChoiceOutput) -> str:
    events = encoder.begin() + encoder.choice_begin(0)
    for delta in deltas:
        events += encoder.text(0, delta)
    events += encoder.choice_end(output) + encoder.end([output])
    return "".join(events)


def _parse_sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    assert text.endswith("\n\n")
    parsed = []
    for chunk in text[:-2].split("\n\n"):
        event_line, data_line = chunk.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        parsed.append((event_line[len("event: ") :], json.loads(data_line[len("data: ") :])))
    return parsed


def test_stream_events_validate_and_add_up() -> None:
    pydantic = pytest.importorskip("pydantic")
    types = pytest.importorskip("anthropic.types")
    adapter = pydantic.TypeAdapter(types.RawMessageStreamEvent)
    calls = [_call("call_a", "get_weather", '{"city": "Köln"}'), _call("call_b", "get_weather", "{}")]
    output = _output("Let me check.", calls, finish="tool_calls", prompt_tokens=11, completion_tokens=9)
    encoder = MessagesStreamEncoder(message_id="msg_s", model="served", input_tokens=11)
    events = _parse_sse(_stream_text(encoder, ["Let ", "me ", "", "check."], output))
    for name, data in events:
        assert name == data["type"]
        adapter.validate_python(data)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert (start["content"], start["stop_reason"], start["usage"]["input_tokens"]) == ([], None, 11)
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta" and d["index"] == 0)
    assert text == "Let me check."
    tool_starts = [d for n, d in events if n == "content_block_start" and d["content_block"]["type"] == "tool_use"]
    assert [(d["index"], d["content_block"]["id"], d["content_block"]["input"]) for d in tool_starts] == [
        (1, "call_a", {}),
        (2, "call_b", {}),
    ]
    inputs = [json.loads(d["delta"]["partial_json"]) for n, d in events if n == "content_block_delta" and d["index"]]
    assert inputs == [{"city": "Köln"}, {}]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": 11, "output_tokens": 9}


def test_stream_without_text_or_input_count() -> None:
    """No text: no text block; the input count unknown at the start comes exact in message_delta."""
    output = _output(None, [_call("c", "f", "oops")], finish="tool_calls", prompt_tokens=4)
    events = _parse_sse(_stream_text(MessagesStreamEncoder(message_id="m", model="s"), [], output))
    assert events[0][1]["message"]["usage"]["input_tokens"] == 0
    assert events[1][1]["content_block"]["type"] == "tool_use"
    assert json.loads(events[2][1]["delta"]["partial_json"]) == {RAW_INPUT_KEY: "oops"}
    assert events[-2][1]["usage"]["input_tokens"] == 4


def test_stream_error_event() -> None:
    encoder = MessagesStreamEncoder(message_id="m", model="s")
    [event] = encoder.error(503, "api_error", "backend closed", "backend_unavailable")
    [(name, data)] = _parse_sse(event)
    assert name == "error"
    assert data == {"type": "error", "error": {"type": "api_error", "message": "backend closed"}}


# --- errors -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (409, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "api_error"),
        (529, "overloaded_error"),
        (418, "invalid_request_error"),
    ],
)
def test_error_body(status: int, error_type: str) -> None:
    body = anthropic_error_body(status, "what went wrong")
    assert body == {"type": "error", "error": {"type": error_type, "message": "what went wrong"}}
    if error_type != "request_too_large":  # documented by Anthropic, absent from the SDK's ErrorObject union
        shared = pytest.importorskip("anthropic.types.shared")
        assert shared.ErrorResponse.model_validate(body).error.type == error_type


# --- Anthropic's SDK reads what the module writes -------------------------------------------------------------------


def _httpx() -> Any:
    """The HTTP package the ``anthropic`` SDK runs on (``httpx2``; it refuses ``httpx`` objects)."""
    return pytest.importorskip("httpx2")


def _sdk_client(handler: Any) -> Any:
    """Anthropic's client over an in-process transport (the SDK's HTTP package, ``httpx2``): ``handler`` answers
    each request."""
    anthropic = pytest.importorskip("anthropic")
    httpx = _httpx()
    return anthropic.Anthropic(
        api_key="test",
        base_url="http://gateway.test",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )


def test_sdk_accumulates_the_stream() -> None:
    calls = [_call("call_a", "get_weather", '{"city": "Köln"}')]
    output = _output("Let me check.", calls, finish="tool_calls", prompt_tokens=11, completion_tokens=9)
    sse = _stream_text(MessagesStreamEncoder(message_id="msg_s", model="served"), ["Let me", " check."], output)
    seen: list[dict[str, Any]] = []

    def handler(request: Any) -> Any:
        seen.append(json.loads(request.content))
        return _httpx().Response(200, headers={"content-type": "text/event-stream"}, content=sse.encode())

    client = _sdk_client(handler)
    request = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "Weather in Köln?"}]}
    with client.messages.stream(**request, tools=[WEATHER_TOOL]) as stream:
        streamed_text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed_text == "Let me check."
    assert final.stop_reason == "tool_use"
    assert [block.type for block in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"city": "Köln"}
    assert (final.usage.input_tokens, final.usage.output_tokens) == (11, 9)
    whole = message_body(output, message_id="msg_s", model="served")
    assert final.model_dump(include={"content", "stop_reason", "usage"}, exclude_none=True) == {
        key: whole[key] for key in ("content", "stop_reason", "usage")
    }
    messages_call(seen[0])  # what the SDK sends is accepted


def test_sdk_reads_message_error_and_stream_error() -> None:
    anthropic = pytest.importorskip("anthropic")
    answer = message_body(_output("Hi!"), message_id="msg_1", model="served")

    def handler(request: Any) -> Any:
        body = json.loads(request.content)
        if body["max_tokens"] == 1:
            return _httpx().Response(400, json=anthropic_error_body(400, "top_k is not supported"))
        if body.get("stream"):
            encoder = MessagesStreamEncoder(message_id="m", model="s")
            events = encoder.begin() + encoder.text(0, "par") + encoder.error(500, "server_error", "bug", None)
            return _httpx().Response(
                200, headers={"content-type": "text/event-stream"}, content="".join(events).encode()
            )
        return _httpx().Response(200, json=answer)

    client = _sdk_client(handler)
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    message = client.messages.create(**request, max_tokens=10)
    assert message.content[0].text == "Hi!"
    with pytest.raises(anthropic.BadRequestError, match="top_k is not supported"):
        client.messages.create(**request, max_tokens=1)
    with (
        pytest.raises(anthropic.APIStatusError, match="bug"),
        client.messages.stream(**request, max_tokens=10) as stream,
    ):
        stream.get_final_message()


def test_sdk_reads_count_tokens() -> None:
    client = _sdk_client(lambda request: _httpx().Response(200, json=count_tokens_body(42)))
    counted = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens == 42
