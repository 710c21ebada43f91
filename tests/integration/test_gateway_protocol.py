"""The gateway's OpenAI protocol over real HTTP (uvicorn on 127.0.0.1, memory store, the ``openai`` client), with a
scripted in-process backend instead of a model, so every path runs in milliseconds.

``ScriptedBackend`` is a fake: it "generates" a scripted reply, ids are the reply's UTF-8 bytes plus a stop id 0,
and it keeps every result it returned, so the tests compare what was recorded with what was generated. The same
paths on a real model are in ``test_gateway.py`` (slow).

Pinned here: SSE format and recording of streams (also with the plain ``generate``-only fallback and a client that
goes away); tool calls out, several at once, streamed and whole; ``n`` choices -> ``n`` spans and transitions;
errors in OpenAI's shape, recorded as failed untrainable calls (context length, backend down, remote error, a bug,
a failure mid-stream); no backend 503; unknown attempt 404; finished attempt 409; any model name served.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from agentbolt import semconv
from agentbolt.adapter.trajectory import build_trajectory
from agentbolt.errors import BackendError
from agentbolt.inference.base import (
    ContextLengthExceededError,
    GenerationRequest,
    GenerationResult,
    UpstreamError,
)
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import LLM, AttemptStatus, Span

TWO_CALLS = (
    "Checking both.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>'
)


@dataclass
class FailMidway:
    """Script entry: stream ``text`` then fail with ``error``."""

    text: str
    error: Exception


Script = Callable[[GenerationRequest], "str | Exception | FailMidway"]


def _result(request: GenerationRequest, text: str, finish: str = "stop") -> GenerationResult:
    prompt = list(json.dumps(request.messages).encode())[-64:]
    response = list(text.encode()) + ([0] if finish == "stop" else [])
    return GenerationResult(
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[-0.5] * len(response),
        text=text,
        finish_reason=finish,  # type: ignore[arg-type]
        model_version="v1",
    )


@dataclass
class ScriptedStream:
    """A fake generation stream: the scripted text in 3-character pieces, a tick apart."""

    backend: ScriptedBackend
    request: GenerationRequest
    entry: str | FailMidway
    tick_s: float
    cancelled: bool = False
    sent: str = ""

    async def text_deltas(self) -> AsyncIterator[str]:
        text = self.entry.text if isinstance(self.entry, FailMidway) else self.entry
        for start in range(0, len(text), 3):
            if self.cancelled:
                return
            await asyncio.sleep(self.tick_s)
            self.sent += text[start : start + 3]
            yield text[start : start + 3]
        if isinstance(self.entry, FailMidway):
            raise self.entry.error

    async def result(self) -> GenerationResult:
        if isinstance(self.entry, FailMidway):
            raise self.entry.error
        result = _result(self.request, self.sent, "abort") if self.cancelled else _result(self.request, self.entry)
        self.backend.generated.append(result)
        return result

    def cancel(self) -> None:
        self.cancelled = True
        self.backend.cancelled += 1


@dataclass
class ScriptedBackend:
    """Fake backend (see the module docstring). ``streaming=False`` leaves out ``stream`` (generate-only)."""

    script: Script
    tick_s: float = 0.0
    model_name: str = "scripted-model"
    model_version: str = "v1"
    generated: list[GenerationResult] = field(default_factory=list)
    requests: list[GenerationRequest] = field(default_factory=list)
    cancelled: int = 0

    def _entry(self, request: GenerationRequest) -> str | FailMidway:
        self.requests.append(request)
        entry = self.script(request)
        if isinstance(entry, Exception):
            raise entry
        return entry

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        entry = self._entry(request)
        if isinstance(entry, FailMidway):
            raise entry.error
        result = _result(request, entry)
        self.generated.append(result)
        return result

    async def stream(self, request: GenerationRequest) -> ScriptedStream:
        return ScriptedStream(self, request, self._entry(request), self.tick_s)

    async def close(self) -> None:
        return None


class GenerateOnly:
    """The same fake without ``stream``: the gateway must stream its whole result."""

    def __init__(self, inner: ScriptedBackend) -> None:
        self.inner = inner
        self.model_name = inner.model_name
        self.model_version = inner.model_version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return await self.inner.generate(request)

    async def close(self) -> None:
        return None


@dataclass
class Gateway:
    store: InMemoryLightningStore
    url: str
    rollout_id: str
    attempt_id: str

    @property
    def base_url(self) -> str:
        return LLM(endpoint=self.url, model="m").for_attempt(self.rollout_id, self.attempt_id).endpoint

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key="x", max_retries=0)

    async def spans(self) -> list[Span]:
        return [
            s for s in await self.store.query_spans(self.rollout_id, self.attempt_id) if s.name == semconv.SPAN_LLM_CALL
        ]

    async def finish_attempt(self) -> None:
        await self.store.update_attempt(self.rollout_id, self.attempt_id, AttemptStatus.SUCCEEDED)


def run_gateway(backend: Any, test: Callable[[Gateway], Any]) -> None:
    """Serve ``backend`` behind a real server with one running attempt, and run ``test`` against it."""

    async def main() -> None:
        store = InMemoryLightningStore()
        async with serve_in_background(create_app(store, backend)) as url:
            rollout = await store.enqueue_rollout({"q": 1})
            claimed = await store.claim_rollout("w")
            assert claimed is not None
            attempt_id = claimed.attempt.attempt_id
            await store.update_attempt(rollout.rollout_id, attempt_id, AttemptStatus.RUNNING)
            await test(Gateway(store, url, rollout.rollout_id, attempt_id))

    asyncio.run(main())


ASK = [{"role": "user", "content": "hi"}]


def _sse_events(raw: str) -> list[str]:
    assert raw.endswith("\n\n")
    events = raw.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


# ---------------------------------------------------------------------------------------------------- streaming


def test_stream_is_server_sent_events_in_openai_chunk_format_and_recorded_whole() -> None:
    reply = "Hello there, streaming world! ünïcödé ✓"
    backend = ScriptedBackend(lambda r: reply)

    async def test(gw: Gateway) -> None:
        body = {"model": "gpt-whatever", "messages": ASK, "stream": True, "stream_options": {"include_usage": True}}
        async with httpx.AsyncClient() as http:
            resp = await http.post(f"{gw.base_url}/chat/completions", json=body)
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(resp.text)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert all(c["object"] == "chat.completion.chunk" and c["model"] == "scripted-model" for c in chunks)
        assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        choice_chunks = [c for c in chunks if c["choices"]]
        assert [c["choices"][0]["finish_reason"] for c in choice_chunks[:-1]] == [None] * (len(choice_chunks) - 1)
        assert choice_chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": None}
        contents = [c["choices"][0]["delta"].get("content") for c in choice_chunks[1:-1]]
        assert len(contents) > 3 and "".join(contents) == reply  # incremental, and adds up to the reply
        usage_chunk = chunks[-1]
        assert usage_chunk["choices"] == []
        generated = backend.generated[-1]
        assert usage_chunk["usage"]["completion_tokens"] == len(generated.response_token_ids)

        (span,) = await gw.spans()
        attrs = span.attributes
        assert span.status.code == "OK"
        assert attrs[semconv.LLM_RESPONSE_TOKEN_IDS] == generated.response_token_ids
        assert attrs[semconv.LLM_PROMPT_TOKEN_IDS] == generated.prompt_token_ids
        assert attrs[semconv.LLM_RESPONSE_LOGPROBS] == generated.response_logprobs
        assert attrs[semconv.LLM_STREAM] is True and attrs[semconv.LLM_TRAINABLE] is True
        assert attrs[semconv.LLM_RESPONSE_MESSAGE] == {"role": "assistant", "content": reply}
        assert attrs[semconv.GEN_AI_REQUEST_MODEL] == "gpt-whatever"
        assert attrs[semconv.GEN_AI_RESPONSE_ID] == chunks[0]["id"]

        # The official client consumes the same stream.
        client = gw.client()
        stream = await client.chat.completions.create(model="x", messages=ASK, stream=True)  # type: ignore[arg-type]
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == reply
        await client.close()

    run_gateway(backend, test)


def test_a_generate_only_backend_is_streamed_whole_at_the_end() -> None:
    backend = ScriptedBackend(lambda r: "all at once")

    async def test(gw: Gateway) -> None:
        client = gw.client()
        stream = await client.chat.completions.create(model="x", messages=ASK, stream=True)  # type: ignore[arg-type]
        chunks = [c async for c in stream]
        assert [c.choices[0].delta.content for c in chunks] == ["", "all at once", None]
        assert chunks[-1].choices[0].finish_reason == "stop"
        (span,) = await gw.spans()
        assert span.attributes[semconv.LLM_RESPONSE_TOKEN_IDS] == backend.generated[-1].response_token_ids
        await client.close()

    run_gateway(GenerateOnly(backend), test)


def test_a_client_that_goes_away_mid_stream_cancels_generation_and_the_call_is_recorded_flagged() -> None:
    backend = ScriptedBackend(lambda r: "x" * 3000, tick_s=0.01)  # 1000 pieces: 10 s if nobody stops it

    async def test(gw: Gateway) -> None:
        body = {"messages": ASK, "stream": True}
        url = f"{gw.base_url}/chat/completions"
        async with httpx.AsyncClient() as http, http.stream("POST", url, json=body) as resp:
            seen = 0
            async for line in resp.aiter_lines():
                seen += line.startswith("data: ")
                if seen == 4:
                    break  # leaving the block closes the connection
        for _ in range(200):
            spans = await gw.spans()
            if spans:
                break
            await asyncio.sleep(0.02)
        (span,) = spans
        attrs = span.attributes
        assert backend.cancelled == 1
        assert attrs[semconv.LLM_CLIENT_DISCONNECTED] is True and attrs[semconv.LLM_TRAINABLE] is False
        assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASON] == ["abort"]
        assert 3 <= len(attrs[semconv.LLM_RESPONSE_TOKEN_IDS]) < 3000
        assert attrs[semconv.LLM_RESPONSE_TOKEN_IDS] == backend.generated[-1].response_token_ids
        rollout = await gw.store.get_rollout(gw.rollout_id)
        assert build_trajectory(rollout, gw.attempt_id, await gw.spans()).transitions == []

    run_gateway(backend, test)


# ---------------------------------------------------------------------------------------------------- tool calls


def test_several_tool_calls_come_back_whole_and_streamed_with_unique_ids() -> None:
    backend = ScriptedBackend(lambda r: TWO_CALLS)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    history: list[Any] = [
        {"role": "user", "content": "Weather in Oslo and Lima?"},
        {
            "role": "assistant",  # no content key at all, two calls
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Lima"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "rainy"},
        {"role": "user", "content": "Again please."},
    ]

    async def test(gw: Gateway) -> None:
        client = gw.client()
        whole = await client.chat.completions.create(model="x", messages=history, tools=tools)  # type: ignore[arg-type]
        assert backend.requests[-1].messages == history and backend.requests[-1].tools == tools  # passed as sent
        message = whole.choices[0].message
        assert whole.choices[0].finish_reason == "tool_calls"
        assert message.content == "Checking both."
        calls = message.tool_calls or []
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [  # type: ignore[union-attr]
            ("get_weather", {"city": "Oslo"}),
            ("get_weather", {"city": "Lima"}),
        ]
        assert len({c.id for c in calls}) == 2

        stream = await client.chat.completions.create(
            model="x",
            messages=history,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            stream=True,
        )
        chunks = [c async for c in stream]
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert content == "Checking both." and all("<" not in (c.choices[0].delta.content or "") for c in chunks)
        streamed = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        assert [tc.index for tc in streamed] == [0, 1]
        assert [json.loads(tc.function.arguments or "") for tc in streamed] == [  # type: ignore[union-attr]
            {"city": "Oslo"},
            {"city": "Lima"},
        ]
        assert all(tc.id and tc.type == "function" for tc in streamed) and streamed[0].id != streamed[1].id
        assert chunks[-1].choices[0].finish_reason == "tool_calls"

        spans = await gw.spans()
        assert len(spans) == 2
        for span, generated in zip(spans, backend.generated, strict=True):
            attrs = span.attributes
            assert attrs[semconv.LLM_RESPONSE_TOKEN_IDS] == generated.response_token_ids
            assert attrs[semconv.LLM_RESPONSE_TEXT] == TWO_CALLS
            assert len(attrs[semconv.LLM_RESPONSE_MESSAGE]["tool_calls"]) == 2
            assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASON] == ["tool_calls"]
            assert attrs[semconv.LLM_REQUEST_MESSAGES] == history
        await client.close()

    run_gateway(backend, test)


# ---------------------------------------------------------------------------------------------------- n > 1


def test_n_choices_make_n_spans_and_n_transitions() -> None:
    backend = ScriptedBackend(lambda r: f"seed {r.seed}")

    async def test(gw: Gateway) -> None:
        client = gw.client()
        reply = await client.chat.completions.create(model="x", messages=ASK, n=3, seed=10)  # type: ignore[arg-type]
        assert [c.index for c in reply.choices] == [0, 1, 2]
        assert [c.message.content for c in reply.choices] == ["seed 10", "seed 11", "seed 12"]
        assert reply.usage is not None
        assert reply.usage.completion_tokens == sum(len(g.response_token_ids) for g in backend.generated)

        stream = await client.chat.completions.create(model="x", messages=ASK, n=2, stream=True)  # type: ignore[arg-type]
        texts = ["", ""]
        finishes: list[Any] = [None, None]
        async for chunk in stream:
            for choice in chunk.choices:
                texts[choice.index] += choice.delta.content or ""
                finishes[choice.index] = choice.finish_reason or finishes[choice.index]
        assert texts == ["seed None", "seed None"] and finishes == ["stop", "stop"]

        spans = await gw.spans()
        assert [s.attributes[semconv.LLM_CHOICE_INDEX] for s in spans] == [0, 1, 2, 0, 1]
        assert len({s.attributes[semconv.GEN_AI_RESPONSE_ID] for s in spans[:3]}) == 1
        assert [s.attributes[semconv.LLM_RESPONSE_TOKEN_IDS] for s in spans[:3]] == [
            g.response_token_ids for g in backend.generated[:3]
        ]
        rollout = await gw.store.get_rollout(gw.rollout_id)
        assert len(build_trajectory(rollout, gw.attempt_id, spans).transitions) == 5
        await client.close()

    run_gateway(backend, test)


# ---------------------------------------------------------------------------------------------------- errors


def _fail_with(error: Exception) -> Script:
    def script(request: GenerationRequest) -> Exception:
        return error

    return script


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (ContextLengthExceededError("the prompt has 9000 tokens; shorten it"), 400, "context_length_exceeded"),
        (UpstreamError("vLLM at http://h answered 500: boom"), 502, "upstream_error"),
        (BackendError("the embedded backend is closed"), 503, "backend_unavailable"),
        (RuntimeError("kaboom"), 500, "internal_error"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_backend_errors_answer_openai_errors_and_are_recorded_as_failed_untrainable_calls(
    error: Exception, status: int, code: str, stream: bool
) -> None:
    backend = ScriptedBackend(_fail_with(error))

    async def test(gw: Gateway) -> None:
        async with httpx.AsyncClient() as http:
            body = {"messages": ASK, "stream": stream, "n": 2}
            resp = await http.post(f"{gw.base_url}/chat/completions", json=body)
        assert resp.status_code == status
        assert resp.headers["content-type"].startswith("application/json")
        err = resp.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == code and err["message"]
        spans = await gw.spans()
        assert len(spans) == 2 and all(s.status.code == "ERROR" for s in spans)
        assert all(s.attributes[semconv.LLM_TRAINABLE] is False for s in spans)
        assert all(s.attributes[semconv.LLM_ERROR_CODE] == code for s in spans)
        rollout = await gw.store.get_rollout(gw.rollout_id)
        assert build_trajectory(rollout, gw.attempt_id, spans).transitions == []

    run_gateway(backend, test)


def test_context_overflow_raises_the_openai_client_error() -> None:
    backend = ScriptedBackend(_fail_with(ContextLengthExceededError("too long")))

    async def test(gw: Gateway) -> None:
        client = gw.client()
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="x", messages=ASK)  # type: ignore[arg-type]
        assert caught.value.code == "context_length_exceeded"
        await client.close()

    run_gateway(backend, test)


def test_a_failure_mid_stream_is_an_error_event_and_a_failed_call() -> None:
    backend = ScriptedBackend(lambda r: FailMidway("partial answer", UpstreamError("the vLLM server went away")))

    async def test(gw: Gateway) -> None:
        async with httpx.AsyncClient() as http:
            resp = await http.post(f"{gw.base_url}/chat/completions", json={"messages": ASK, "stream": True})
        events = _sse_events(resp.text)
        assert "[DONE]" not in events
        assert json.loads(events[-1])["error"]["code"] == "upstream_error"
        client = gw.client()
        with pytest.raises(openai.APIError, match="went away"):
            stream = await client.chat.completions.create(model="x", messages=ASK, stream=True)  # type: ignore[arg-type]
            async for _ in stream:
                pass
        spans = await gw.spans()
        assert len(spans) == 2 and all(s.status.code == "ERROR" for s in spans)
        assert all(s.attributes[semconv.LLM_TRAINABLE] is False for s in spans)
        await client.close()

    run_gateway(backend, test)


def test_when_one_choice_fails_the_others_are_recorded_but_not_trainable() -> None:
    def script(request: GenerationRequest) -> str | Exception:
        return BackendError("choice 1 failed") if request.seed == 1 else "fine"

    backend = ScriptedBackend(script)

    async def test(gw: Gateway) -> None:
        async with httpx.AsyncClient() as http:
            body = {"messages": ASK, "n": 2, "seed": 0}
            resp = await http.post(f"{gw.base_url}/chat/completions", json=body)
        assert resp.status_code == 503
        ok, failed = await gw.spans()
        assert ok.status.code == "OK" and ok.attributes[semconv.LLM_TRAINABLE] is False
        assert "not returned" in ok.attributes[semconv.LLM_NOT_TRAINABLE_REASON]
        assert failed.status.code == "ERROR"

    run_gateway(backend, test)


# ---------------------------------------------------------------------------------------------------- refusals


def test_no_backend_is_503_saying_how_to_start_one() -> None:
    async def main() -> None:
        store = InMemoryLightningStore()
        async with serve_in_background(create_app(store)) as url:
            rollout = await store.enqueue_rollout({"q": 1})
            claimed = await store.claim_rollout("w")
            assert claimed is not None
            base = LLM(endpoint=url, model="m").for_attempt(rollout.rollout_id, claimed.attempt.attempt_id).endpoint
            client = openai.AsyncOpenAI(base_url=base, api_key="x", max_retries=0)
            with pytest.raises(openai.APIStatusError) as caught:
                await client.chat.completions.create(model="x", messages=ASK)  # type: ignore[arg-type]
            assert caught.value.status_code == 503
            assert "agentbolt serve --model" in caught.value.message
            assert await store.query_spans(rollout.rollout_id) == []
            await client.close()

    asyncio.run(main())


def test_unknown_attempt_is_404_and_finished_attempt_is_409_streamed_or_not() -> None:
    backend = ScriptedBackend(lambda r: "never")

    async def test(gw: Gateway) -> None:
        async with httpx.AsyncClient() as http:
            resp = await http.post(
                f"{gw.url}/v1/rollouts/{gw.rollout_id}/attempts/nope/v1/chat/completions", json={"messages": ASK}
            )
            assert resp.status_code == 404 and resp.json()["error"]["message"]
        await gw.finish_attempt()
        client = gw.client()
        for stream in (False, True):
            with pytest.raises(openai.ConflictError, match="already succeeded"):
                await client.chat.completions.create(model="x", messages=ASK, stream=stream)  # type: ignore[arg-type]
        assert backend.requests == [] and await gw.spans() == []
        await client.close()

    run_gateway(backend, test)
