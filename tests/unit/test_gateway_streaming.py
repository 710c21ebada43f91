"""Pure pieces of the gateway's streaming: what content may be sent before a tool call is known
(``ContentHoldBack``), the chunk shapes (validated with the ``openai`` package's own types), and how a remote
stream's chunks add up (``ChunkAccumulator``, ``sse_chunks``).

Hold-back property (seeded random splits of each text into deltas): the sent pieces plus the rest given by
``finish`` add up to the content a non-streamed call returns, and no sent piece holds tool-call markup.
"""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from agentbolt.errors import BackendError, ConfigError
from agentbolt.inference.base import ContextLengthExceededError, GenerationResult, UpstreamError
from agentbolt.inference.remote import ChunkAccumulator, raise_for_answer, sse_chunks
from agentbolt.server.gateway.calls import CallSpec
from agentbolt.server.gateway.openai_format import (
    ChatStreamEncoder,
    assistant_message,
    choice_output,
    completion_body,
    error_info,
)
from agentbolt.server.gateway.streaming import ContentHoldBack
from agentbolt.server.gateway.toolcalls import parse_tool_calls

CALL = '{"name": "lookup", "arguments": {"q": "x"}}'
TEXTS = [
    "",
    "Plain answer, no tools.",
    "  leading spaces and a trailing newline\n",
    "Compare: 3 < 4 and <b>bold</b> and <tool but not a call.",
    f"Let me check.\n<tool_call>\n{CALL}\n</tool_call>",
    f"<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{CALL}\n</tool_call>",
    f"Before.\n<tool_call>\n{CALL}\n</tool_call>\nAfter the call.",
    f"Unclosed: <tool_call>\n{CALL}",
    "Broken: <tool_call>{not json}</tool_call> stays",
    CALL,
    f"```json\n{CALL}\n```",
    "[1, 2, 3] is a list, not a call",
    "{curly prose}",
    "Ünïcödé ✓ text <tool",
]


def _split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 12)))) if len(text) > 1 else []
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


@pytest.mark.parametrize("text", TEXTS)
def test_held_back_pieces_add_up_to_the_parsed_content(text: str) -> None:
    content, calls = parse_tool_calls(text)
    for seed in range(40):
        hold = ContentHoldBack()
        sent = "".join(hold.feed(piece) for piece in _split(text, random.Random(seed)))
        assert "<tool_call>" not in sent
        if calls:
            assert CALL not in sent
        rest, received = hold.finish(text, content, calls)
        assert received == (sent + rest or None)
        if calls:
            assert (received or "").strip() == (content or "")
        else:
            assert received == (text or None)


def test_plain_text_is_sent_as_it_comes() -> None:
    hold = ContentHoldBack()
    assert [hold.feed(p) for p in ["Hello", " world", ", how", " are you?"]] == [
        "Hello",
        " world",
        ", how",
        " are you?",
    ]
    hold = ContentHoldBack()
    assert [hold.feed(p) for p in ["Use ", "<to", "ol_call>"]] == ["Use", "", ""]  # a tag in the making is held


def _sse_json(event: str) -> dict:
    assert event.startswith("data: ") and event.endswith("\n\n")
    return json.loads(event[len("data: ") :])


def test_chunks_and_completions_validate_as_openai_types() -> None:
    result = GenerationResult([1, 2], [3, 4, 0], [-0.1, -0.2, -0.3], f"ok <tool_call>{CALL}</tool_call>", "stop", "v1")
    spec = CallSpec("chat.completions", tools=[{"type": "function", "function": {"name": "lookup"}}], n=2)
    output = choice_output(0, result, spec)
    assert output.content == "ok" and len(output.tool_calls) == 1 and output.finish == "tool_calls"
    completion = completion_body(spec, [output], response_id="chatcmpl-1", created_s=1, model="m")
    parsed = ChatCompletion.model_validate(completion)
    assert parsed.choices[0].message.tool_calls and completion["choices"][0]["token_ids"] == [3, 4, 0]
    assert completion["prompt_token_ids"] == [1, 2] and parsed.usage and parsed.usage.total_tokens == 5
    no_ids = GenerationResult([], [], [], "x", "stop", "v", trainable=False, prompt_tokens=7, completion_tokens=2)
    plain = CallSpec("chat.completions")
    body = completion_body(plain, [choice_output(0, no_ids, plain)], response_id="c", created_s=1, model="m")
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]
    assert body["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 2,
        "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    cached = GenerationResult([1, 2, 3], [4], [-0.1], "x", "stop", "v", extra={"cached_prompt_tokens": 2})
    body = completion_body(plain, [choice_output(0, cached, plain)], response_id="c", created_s=1, model="m")
    usage = ChatCompletion.model_validate(body).usage
    assert usage and usage.prompt_tokens_details and usage.prompt_tokens_details.cached_tokens == 2
    spec.include_usage = True
    encoder = ChatStreamEncoder(spec, response_id="c", created_s=1, model="m")
    events = [
        *encoder.begin(),
        *encoder.choice_begin(0),
        *encoder.choice_begin(1),
        *encoder.text(1, "hi"),
        *encoder.choice_end(output),
        *encoder.end([output]),
    ]
    assert events[-1] == "data: [DONE]\n\n"
    chunks = [ChatCompletionChunk.model_validate(_sse_json(event)) for event in events[:-1]]
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 5
    assert chunks[-2].choices[0].finish_reason == "tool_calls"


def test_remote_tool_calls_pass_through_with_ids() -> None:
    remote = [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]
    result = GenerationResult([], [], [], "", "tool_calls", "v", tool_calls=remote, trainable=False)
    content, calls = assistant_message(result, frozenset())
    assert content is None and calls[0]["id"].startswith("call_") and calls[0]["function"]["name"] == "f"


def test_error_info_maps_each_error_to_an_openai_error() -> None:
    cases = [
        (ContextLengthExceededError("long"), 400, "context_length_exceeded"),
        (ConfigError("bad"), 400, "invalid_value"),
        (UpstreamError("remote 500"), 502, "upstream_error"),
        (BackendError("down"), 503, "backend_unavailable"),
        (RuntimeError("bug"), 500, "internal_error"),
    ]
    for exc, status, code in cases:
        info = error_info(exc)
        assert (info.status, info.code) == (status, code) and info.message


def test_remote_answers_map_to_agentbolt_errors() -> None:
    where = "the vLLM server at http://h/v1"
    overflow = b'{"error": {"message": "This model\'s maximum context length is 2048 tokens.", "code": 400}}'
    with pytest.raises(ContextLengthExceededError, match="2048"):
        raise_for_answer(400, overflow, where)
    with pytest.raises(ContextLengthExceededError):
        raise_for_answer(400, b'{"error": {"message": "x", "code": "context_length_exceeded"}}', where)
    with pytest.raises(ConfigError, match="temperature"):
        raise_for_answer(400, b'{"object": "error", "message": "temperature must be >= 0", "code": 400}', where)
    with pytest.raises(BackendError, match="API key"):
        raise_for_answer(401, b"{}", where)
    with pytest.raises(UpstreamError, match="503: overloaded"):
        raise_for_answer(503, b"overloaded", where)
    raise_for_answer(200, b"", where)


def test_chunks_add_up_and_sse_events_are_parsed() -> None:
    raw = (
        b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],'
        b' "prompt_token_ids": [1, 2]}\n\n'
        b": keep-alive comment\n\n"
        b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}, "token_ids": [5, 6],'
        b' "logprobs": {"content": [{"token": "H", "logprob": -0.5}, {"token": "i", "logprob": -0.25}]}}]}\n\n'
        b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",'
        b' "function": {"name": "f", "arguments": "{\\"a\\""}}]}}]}\n\n'
        b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},'
        b' "token_ids": [0], "logprobs": {"content": [{"token": "", "logprob": -1.0}]},'
        b' "finish_reason": "tool_calls"}]}\n\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}\n\n'
        b"data: [DONE]\n\n"
    )

    async def main() -> ChunkAccumulator:
        response = httpx.Response(200, content=raw)
        acc = ChunkAccumulator()
        deltas = [acc.add(chunk, "srv") async for chunk in sse_chunks(response)]
        assert deltas == ["", "Hi", "", "", ""]
        return acc

    acc = asyncio.run(main())
    assert acc.prompt_token_ids == [1, 2] and acc.token_ids == [5, 6, 0] and acc.logprobs == [-0.5, -0.25, -1.0]
    assert (
        acc.content == "Hi"
        and acc.finish_reason == "tool_calls"
        and acc.usage == {"prompt_tokens": 2, "completion_tokens": 3}
    )
    assert acc.tool_call_list() == [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    ]
    with pytest.raises(UpstreamError, match="mid-stream: boom"):
        acc.add({"error": {"message": "boom"}}, "srv")


def test_no_tools_offered_means_no_tool_call_and_nothing_held_back() -> None:
    """An answer in JSON to a request without tools is the answer (issue: a JSON answer came back as a call named
    "Ada Lovelace"), and a call of a function the request did not declare stays content."""
    answer = '{"name": "Ada Lovelace", "arguments": ["analytical engine"]}'
    result = GenerationResult([1], [2], [-0.1], answer, "stop", "v1")
    assert assistant_message(result, frozenset()) == (answer, [])
    assert assistant_message(result, frozenset({"lookup"})) == (answer, [])  # "Ada Lovelace" is not declared
    tagged = GenerationResult([1], [2], [-0.1], f"<tool_call>{CALL}</tool_call>", "stop", "v1")
    assert assistant_message(tagged, frozenset())[1] == []
    assert len(assistant_message(tagged, frozenset({"lookup"}))[1]) == 1
    hold = ContentHoldBack(tools_offered=False)
    assert [hold.feed(p) for p in ['{"name"', ': "Ada"} ', "<tool_call>"]] == ['{"name"', ': "Ada"} ', "<tool_call>"]
    assert hold.finish('{"name": "Ada"} <tool_call>', '{"name": "Ada"} <tool_call>', []) == (
        "",
        '{"name": "Ada"} <tool_call>',
    )
