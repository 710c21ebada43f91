"""responses_format: OpenAI Responses requests as chat CallSpecs, answers as ``response`` objects and events.

Every answer is checked against the ``openai`` package's own types (``Response``, ``ResponseStreamEvent``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from agentbolt.inference.base import GenerationResult
from agentbolt.server.gateway.calls import ChoiceOutput, OutputFormat, RequestRefused, ToolChoice
from agentbolt.server.gateway.responses_format import (
    ATTR_CLIENT_METADATA,
    ATTR_METADATA,
    ATTR_REASONING,
    RESPONSES_FIELDS,
    ResponsesStreamEncoder,
    response_body,
    responses_call,
)

WEATHER = {
    "type": "function",
    "name": "weather",
    "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}
APPLIED = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 64}
EVENTS = TypeAdapter(ResponseStreamEvent)


def result(text: str = "", finish: Any = "stop", **kwargs: Any) -> GenerationResult:
    return GenerationResult([1, 2, 3], [4, 5], [-0.5, -0.25], text, finish, "base", **kwargs)


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# ----- requests -----


def test_instructions_and_string_input() -> None:
    spec = responses_call({"model": "m", "instructions": "Be brief.", "input": "Hi"})
    assert spec.protocol == "responses" and spec.n == 1 and spec.model == "m"
    assert spec.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert spec.record_messages == spec.messages
    assert spec.tools is None and spec.tool_choice == ToolChoice("auto") and spec.output_format is None


def test_items_parts_joined_and_developer_is_system() -> None:
    spec = responses_call(
        {
            "input": [
                {"role": "developer", "content": "Rules."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
                },
                {"role": "assistant", "content": [{"type": "output_text", "text": "c", "annotations": []}]},
            ]
        }
    )
    assert spec.messages == [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "c"},
    ]


def test_function_call_round_trip_merges_one_turn() -> None:
    spec = responses_call(
        {
            "input": [
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {"role": "assistant", "content": "Checking.", "type": "message"},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city":"Paris"}'},
                {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": '{"city":"Rome"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
                {"type": "function_call", "call_id": "c3", "name": "weather", "arguments": '{"city":"Oslo"}'},
            ],
            "tools": [WEATHER],
        }
    )
    assert spec.messages == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [call("c1", "weather", '{"city":"Paris"}'), call("c2", "weather", '{"city":"Rome"}')],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "assistant", "content": None, "tool_calls": [call("c3", "weather", '{"city":"Oslo"}')]},
    ]
    assert spec.tools == [
        {
            "type": "function",
            "function": {"name": "weather", "description": WEATHER["description"], "parameters": WEATHER["parameters"]},
        }
    ]


def test_previous_messages_lose_their_instructions() -> None:
    previous = [
        {"role": "system", "content": "Old rules."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    spec = responses_call(
        {"instructions": "New rules.", "input": "Bye", "previous_response_id": "resp_1"}, previous_messages=previous
    )
    assert spec.messages == [
        {"role": "system", "content": "New rules."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    assert previous[0] == {"role": "system", "content": "Old rules."}  # the input is not modified


def test_fields_codex_sends_are_served_and_recorded() -> None:
    spec = responses_call(
        {
            "model": "gpt-5-codex",
            "instructions": "You are Codex.",
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]}],
            "tools": [{**WEATHER, "strict": False}],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "store": False,
            "stream": True,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "session-1",
            "metadata": {"run": "7"},
            "client_metadata": {"thread_id": "t-1", "x-codex-turn-metadata": '{"turn_id":"u-1"}'},
        }
    )
    assert spec.stream and not spec.parallel_tool_calls and not spec.logprobs
    assert spec.attributes[ATTR_REASONING] == {"effort": "medium", "summary": "auto"}
    assert spec.attributes[ATTR_METADATA] == {"run": "7"}
    assert spec.attributes[ATTR_CLIENT_METADATA] == {"thread_id": "t-1", "x-codex-turn-metadata": '{"turn_id":"u-1"}'}


def test_sampling_logprobs_format_and_tool_choice() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    spec = responses_call(
        {
            "input": "x",
            "temperature": 0,
            "top_p": 0.5,
            "max_output_tokens": 32,
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 3,
            "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}},
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "name": "weather"},
        }
    )
    assert spec.sampling_requested == {"temperature": 0, "top_p": 0.5, "max_tokens": 32}
    assert spec.logprobs and spec.top_logprobs == 3
    assert spec.output_format == OutputFormat("json_schema", schema, "answer")
    assert spec.tool_choice == ToolChoice("function", "weather")
    assert responses_call({"input": "x", "text": {"format": {"type": "json_object"}}}).output_format == OutputFormat(
        "json_object"
    )
    assert (
        responses_call({"input": "x", "text": {"format": {"type": "text"}, "verbosity": "medium"}}).output_format
        is None
    )


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_image"}]}]},
            "input[0].content[1]",
            "unsupported_content",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}]},
            "input[0].output[0]",
            "unsupported_content",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "unsupported_parameter"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]", "unsupported_parameter"),
        ({"input": "x", "tools": [WEATHER, {"type": "web_search"}]}, "tools[1]", "unsupported_parameter"),
        ({"input": "x", "tools": [{"type": "mcp", "server_label": "s"}]}, "tools[0]", "unsupported_parameter"),
        ({"input": "x", "seed": 1}, "seed", "unknown_parameter"),
        ({"input": "x", "temperature": 2.5}, "temperature", "invalid_value"),
        ({"input": "x", "top_p": 0}, "top_p", "invalid_value"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
        ({"input": "x", "top_logprobs": 21}, "top_logprobs", "invalid_value"),
        ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice", None),
        ({"input": "x", "tool_choice": {"type": "web_search_preview"}}, "tool_choice", "unsupported_parameter"),
        ({"input": "x", "text": {"verbosity": "low"}}, "text.verbosity", "unsupported_parameter"),
        ({"input": "x", "truncation": "auto"}, "truncation", "unsupported_parameter"),
        ({"input": "x", "background": True}, "background", "unsupported_parameter"),
        ({"input": "x", "prompt": {"id": "pmpt_1"}}, "prompt", "unsupported_parameter"),
        ({"input": "x", "conversation": "conv_1"}, "conversation", "unsupported_parameter"),
        ({"input": "x", "include": ["file_search_call.everything"]}, "include[0]", "invalid_value"),
        ({"input": "x", "client_metadata": {"turn": 1}}, "client_metadata", "invalid_value"),
        ({"instructions": "only instructions"}, "input", "missing_required_parameter"),
    ],
)
def test_refusals_name_the_field(body: dict[str, Any], param: str, code: str | None) -> None:
    with pytest.raises(RequestRefused) as refused:
        responses_call(body)
    assert refused.value.param == param
    if code is not None:
        assert refused.value.code == code


def test_unknown_key_message_is_openais() -> None:
    with pytest.raises(RequestRefused, match="^Unrecognized request argument supplied: seed$"):
        responses_call({"input": "x", "seed": 1})


def test_every_create_param_is_known() -> None:
    from openai.types.responses import response_create_params

    known = set(response_create_params.ResponseCreateParamsBase.__annotations__) | {"stream"}
    assert set(RESPONSES_FIELDS) - known == {"client_metadata"}  # Codex CLI's own field, recorded
    assert known <= set(RESPONSES_FIELDS)


# ----- answers -----


def test_response_body_text_with_logprobs() -> None:
    spec = responses_call(
        {"input": "x", "instructions": "I.", "include": ["message.output_text.logprobs"], "top_logprobs": 1}
    )
    token_logprobs = [
        {
            "token": "Hi",
            "logprob": -0.5,
            "bytes": [72, 105],
            "top_logprobs": [
                {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
                {"token": "Yo", "logprob": -2.0, "bytes": [89, 111]},
            ],
        },
        {"token": "!", "logprob": -0.25, "bytes": None, "top_logprobs": []},
    ]
    output = ChoiceOutput(0, result("Hi!", token_logprobs=token_logprobs), "Hi!", [], "stop")
    body = response_body(spec, output, response_id="resp_a", created_s=10.5, model="qwen", applied=APPLIED)
    response = Response.model_validate(body)
    assert response.status == "completed" and response.incomplete_details is None
    assert response.output_text == "Hi!" and response.model == "qwen" and response.created_at == 10.5
    assert response.instructions == "I." and response.temperature == 0.7 and response.max_output_tokens == 64
    [message] = body["output"]
    assert message["type"] == "message" and message["id"].startswith("msg_") and message["status"] == "completed"
    assert message["content"][0]["logprobs"] == [
        {"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": [token_logprobs[0]["top_logprobs"][0]]},
        {"token": "!", "logprob": -0.25, "bytes": [33], "top_logprobs": []},
    ]
    assert body["usage"] == {
        "input_tokens": 3,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 5,
    }


def test_response_body_incomplete_with_function_calls_and_echoes() -> None:
    spec = responses_call(
        {
            "input": "x",
            "tools": [WEATHER],
            "tool_choice": "required",
            "metadata": {"k": "v"},
            "previous_response_id": "resp_0",
            "text": {"format": {"type": "json_object"}},
        }
    )
    calls = [call("call_1", "weather", '{"city":"Paris"}'), call("call_2", "weather", '{"city":"Rome"}')]
    output = ChoiceOutput(0, result("...", finish="length"), None, calls, "length")
    body = response_body(spec, output, response_id="resp_b", created_s=1.0, model="qwen", applied=APPLIED)
    response = Response.model_validate(body)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert [item["type"] for item in body["output"]] == ["function_call", "function_call"]
    first = body["output"][0]
    assert first["id"].startswith("fc_") and first["id"] != body["output"][1]["id"]
    assert (first["call_id"], first["name"], first["arguments"], first["status"]) == (
        "call_1",
        "weather",
        '{"city":"Paris"}',
        "completed",
    )
    assert body["tools"] == [WEATHER]
    assert body["tool_choice"] == "required" and body["metadata"] == {"k": "v"}
    assert body["previous_response_id"] == "resp_0" and body["text"]["format"] == {"type": "json_object"}


def parse(events: list[str]) -> list[dict[str, Any]]:
    payloads = []
    for event in events:
        head, data, rest = event.split("\n", 2)
        assert rest == "\n" and head.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == head.removeprefix("event: ")
        EVENTS.validate_python(payload)
        payloads.append(payload)
    return payloads


def test_stream_of_text_then_a_tool_call() -> None:
    spec = responses_call({"input": "x", "tools": [WEATHER], "stream": True})
    tool_call = call("call_9", "weather", '{"city":"Oslo"}')
    output = ChoiceOutput(0, result("Let me check. <tool_call>..."), "Let me check.", [tool_call], "tool_calls")
    encoder = ResponsesStreamEncoder(spec, response_id="resp_s", created_s=2.0, model="qwen", applied=APPLIED)
    events = encoder.begin() + encoder.choice_begin(0)
    for delta in ("Let ", "me ", "check."):
        events += encoder.text(0, delta)
    events += encoder.choice_end(output) + encoder.end([output])
    payloads = parse(events)

    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert [p["type"] for p in payloads] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert payloads[0]["response"]["status"] == "in_progress" and payloads[0]["response"]["output"] == []
    deltas = [p["delta"] for p in payloads if p["type"] == "response.output_text.delta"]
    assert "".join(deltas) == "Let me check." == payloads[7]["text"]
    assert payloads[10]["item"]["status"] == "in_progress" and payloads[10]["output_index"] == 1
    assert payloads[12]["arguments"] == '{"city":"Oslo"}'
    expected = response_body(spec, output, response_id="resp_s", created_s=2.0, model="qwen", applied=APPLIED)
    assert payloads[-1]["response"] == expected
    assert [p["item"] for p in payloads if p["type"] == "response.output_item.done"] == expected["output"]


def test_stream_of_tool_calls_alone_has_no_message_and_can_end_incomplete() -> None:
    spec = responses_call({"input": "x", "tools": [WEATHER], "stream": True})
    output = ChoiceOutput(0, result("<tool_call>...", finish="length"), None, [call("c", "weather", "{}")], "length")
    encoder = ResponsesStreamEncoder(spec, response_id="resp_t", created_s=2.0, model="qwen", applied=APPLIED)
    payloads = parse(encoder.begin() + encoder.choice_begin(0) + encoder.choice_end(output) + encoder.end([output]))
    assert all(p.get("item", {}).get("type") != "message" for p in payloads)
    assert payloads[-1]["type"] == "response.incomplete"
    assert payloads[-1]["response"] == response_body(
        spec, output, response_id="resp_t", created_s=2.0, model="qwen", applied=APPLIED
    )


def test_stream_error_event() -> None:
    encoder = ResponsesStreamEncoder(
        responses_call({"input": "x"}), response_id="resp_e", created_s=0.0, model="qwen", applied=APPLIED
    )
    payloads = parse(encoder.begin() + encoder.error(503, "api_error", "backend gone", "backend_unavailable"))
    assert payloads[-1] == {
        "type": "error",
        "code": "backend_unavailable",
        "message": "backend gone",
        "param": None,
        "sequence_number": 2,
    }


def test_json_schema_echo_and_history_without_new_instructions() -> None:
    schema = {"type": "object"}
    text = {"format": {"type": "json_schema", "name": "a", "schema": schema, "strict": True, "description": "d"}}
    spec = responses_call(
        {"input": "more", "text": text}, previous_messages=[{"role": "system", "content": "Old."}, *USER_HI]
    )
    assert spec.messages == [*USER_HI, {"role": "user", "content": "more"}]
    output = ChoiceOutput(0, result("{}"), "{}", [], "stop")
    body = response_body(spec, output, response_id="resp_j", created_s=1.0, model="qwen", applied=APPLIED)
    Response.model_validate(body)
    assert body["text"] == {"format": {**text["format"]}, "verbosity": "medium"}
    assert (
        body["instructions"] is None
        and body["store"] is True
        and body["reasoning"] == {"effort": None, "summary": None}
    )


USER_HI = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
