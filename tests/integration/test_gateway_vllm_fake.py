"""The ``vllm`` backend against a FAKE vLLM server: a small FastAPI app on 127.0.0.1 that answers in vLLM's wire
format for ``return_token_ids`` (vLLM >= 0.10.2: ``prompt_token_ids`` at the top of the answer or of the first
stream chunk, ``token_ids`` per choice or per chunk, ``logprobs.content`` one entry per id). vLLM itself needs a
GPU and cannot run here.

The fake's "tokenizer" is byte-level (id = UTF-8 byte + 3; 1 and 2 are the turn start/end tokens, 2 is the stop
id), so a multi-byte character spans several ids, and its "model" answers a scripted reply. It keeps what it
generated, so the tests assert that the gateway recorded exactly the engine's ids and logprobs. Modes: ``old``
(ignores ``return_token_ids``, like vLLM < 0.10.2), ``tool_parser`` (parses ``<tool_call>`` tags into ``tool_calls``
like ``--tool-call-parser hermes``), and errors (context overflow 400, engine failure 500).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from tests.integration.test_gateway_protocol import ASK, TWO_CALLS, Gateway

from agentbolt import semconv
from agentbolt.errors import BackendError, ConfigError
from agentbolt.inference.backends import open_backend
from agentbolt.inference.base import GenerationRequest, UpstreamError
from agentbolt.inference.vllm import VLLMBackend
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.memory import InMemoryLightningStore

START, END = 1, 2
MAX_MODEL_LEN = 4096
SERVED = "Qwen/Qwen2.5-0.5B-Instruct"


def encode(text: str) -> list[int]:
    """The fake byte-level tokenizer."""
    return [byte + 3 for byte in text.encode()]


def render(messages: list[dict[str, Any]]) -> list[int]:
    """The fake chat template: ``<start>role\\ncontent[tool calls]<end>`` per message, then ``<start>assistant\\n``."""
    ids: list[int] = []
    for message in messages:
        body = f"{message['role']}\n{message.get('content') or ''}"
        for call in message.get("tool_calls") or []:
            body += f"<tool_call>{json.dumps(call['function'])}</tool_call>"
        ids += [START, *encode(body), END]
    return [*ids, START, *encode("assistant\n")]


def logprob(position: int) -> float:
    return -0.01 * (position + 1)


@dataclass
class Generated:
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


@dataclass
class FakeVLLM:
    """The fake server's behaviour and memory."""

    reply: Callable[[dict[str, Any]], str] = lambda body: "Hello from the fake engine: ✓"
    old: bool = False
    tool_parser: bool = False
    fail_with_500: bool = False
    tick_s: float = 0.0
    """Pause between streamed characters."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    generated: list[Generated] = field(default_factory=list)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": SERVED, "object": "model"}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            self.requests.append(body)
            prompt = render(body["messages"])
            max_tokens = body.get("max_tokens") or 16
            if len(prompt) + max_tokens > MAX_MODEL_LEN:
                message = (
                    f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you requested "
                    f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the "
                    "completion). Please reduce the length of the messages or completion."
                )
                error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
                return JSONResponse({"error": error}, status_code=400)
            if self.fail_with_500:
                error = {"message": "EngineCore died", "type": "InternalServerError", "param": None, "code": 500}
                return JSONResponse({"error": error}, status_code=500)
            text = self.reply(body)
            stop_reason = None
            for stop in body.get("stop") or []:  # vLLM cuts the text before a stop string; stop_reason names it
                if stop in text:
                    text, stop_reason = text[: text.index(stop)], stop
                    break
            ids = [*encode(text)][:max_tokens]
            finish = "length"
            if len(ids) < max_tokens:
                ids.append(END)
                finish = "stop"
            with_ids = bool(body.get("return_token_ids")) and not self.old
            self.generated.append(Generated(prompt, ids, [logprob(i) for i in range(len(ids))]))
            content, calls = self._parse(text) if self.tool_parser else (text, [])
            if calls and finish == "stop":
                finish = "tool_calls"
            if body.get("stream"):
                return StreamingResponse(
                    self._chunks(body, prompt, ids, content, calls, finish, with_ids), media_type="text/event-stream"
                )
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": content or None, "tool_calls": calls},
                "logprobs": {"content": [self._entry(ids, i) for i in range(len(ids))]},
                "finish_reason": finish,
                "stop_reason": stop_reason,
            }
            answer: dict[str, Any] = {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [choice],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": 0},
                "prompt_logprobs": None,
            }
            if with_ids:
                answer["prompt_token_ids"] = prompt
                choice["token_ids"] = ids
            return answer

        return app

    @staticmethod
    def _entry(ids: list[int], position: int) -> dict[str, Any]:
        return {"token": f"token_id:{ids[position]}", "logprob": logprob(position), "bytes": None, "top_logprobs": []}

    @staticmethod
    def _parse(text: str) -> tuple[str, list[dict[str, Any]]]:
        calls = []
        for index, match in enumerate(re.finditer(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.DOTALL)):
            call = json.loads(match.group(1))
            function = {"name": call["name"], "arguments": json.dumps(call["arguments"])}
            calls.append({"id": f"chatcmpl-tool-{index}", "type": "function", "function": function})
        return re.sub(r"<tool_call>.*?</tool_call>", "", text, flags=re.DOTALL).strip(), calls

    async def _chunks(
        self,
        body: dict[str, Any],
        prompt: list[int],
        ids: list[int],
        content: str,
        calls: list[dict[str, Any]],
        finish: str,
        with_ids: bool,
    ) -> AsyncIterator[str]:
        def chunk(delta: dict[str, Any], token_ids: list[int], start: int, finish_reason: str | None = None) -> str:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            if token_ids:
                choice["logprobs"] = {"content": [self._entry(ids, start + i) for i in range(len(token_ids))]}
            if with_ids:
                choice["token_ids"] = token_ids
            out: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": body["model"]}
            out["created"] = 0
            out["choices"] = [choice]
            return f"data: {json.dumps(out)}\n\n"

        first = json.loads(chunk({"role": "assistant", "content": ""}, [], 0)[6:])
        if with_ids:
            first["prompt_token_ids"] = prompt
        yield f"data: {json.dumps(first)}\n\n"
        # One chunk per character of the generated text (its 1-4 byte ids); with the tool parser on, the ids of
        # the tool-call text come in chunks without content, then the calls as deltas.
        position = 0
        text = self.reply(body)
        shown = content if self.tool_parser else text
        for char in text:
            char_ids = encode(char)
            if position + len(char_ids) > len(ids) - (1 if ids and ids[-1] == END else 0):
                break
            delta = {"content": char} if (not self.tool_parser or shown.startswith(char)) else {}
            if self.tool_parser and shown.startswith(char):
                shown = shown[1:]
            yield chunk(delta, char_ids, position)
            position += len(char_ids)
            await asyncio.sleep(self.tick_s)
        for index, call in enumerate(calls):
            name = {
                "index": index,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"]},
            }
            yield chunk({"tool_calls": [name]}, [], position)
            arguments = call["function"]["arguments"]
            for part in (arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]}, [], position)
        rest = ids[position:]
        yield chunk({}, rest, position, finish)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            }
            last = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "choices": [], "usage": usage}
            yield f"data: {json.dumps(last)}\n\n"
        yield "data: [DONE]\n\n"


def run_with_fake(fake: FakeVLLM, test: Callable[[Gateway, FakeVLLM, VLLMBackend], Any]) -> None:
    """Fake vLLM server + agentbolt server (vllm backend pointed at the fake) + one running attempt."""

    async def main() -> None:
        async with serve_in_background(fake.app()) as vllm_url:
            backend = await VLLMBackend.connect(f"{vllm_url}/v1")
            store = InMemoryLightningStore()
            try:
                async with serve_in_background(create_app(store, backend)) as url:
                    rollout = await store.enqueue_rollout({"q": 1})
                    claimed = await store.claim_rollout("w")
                    assert claimed is not None
                    gw = Gateway(store, url, rollout.rollout_id, claimed.attempt.attempt_id)
                    await test(gw, fake, backend)
            finally:
                await backend.close()

    asyncio.run(main())


def _assert_recorded_engine_ids(spans: list[Any], fake: FakeVLLM) -> None:
    assert len(spans) == len(fake.generated)
    for span, generated in zip(spans, fake.generated, strict=True):
        attrs = span.attributes
        assert span.status.code == "OK" and attrs[semconv.LLM_TRAINABLE] is True
        assert attrs[semconv.LLM_PROMPT_TOKEN_IDS] == generated.prompt_token_ids
        assert attrs[semconv.LLM_RESPONSE_TOKEN_IDS] == generated.token_ids
        assert attrs[semconv.LLM_RESPONSE_LOGPROBS] == pytest.approx(generated.logprobs)


def test_fake_vllm_ids_are_recorded_exactly_whole_and_streamed() -> None:
    async def test(gw: Gateway, fake: FakeVLLM, backend: VLLMBackend) -> None:
        assert backend.model_name == SERVED  # found with GET /v1/models
        client = gw.client()
        whole = await client.chat.completions.create(model="my-agent-model", messages=ASK, max_tokens=64)  # type: ignore[arg-type]
        assert whole.choices[0].message.content == "Hello from the fake engine: ✓"
        assert whole.model == SERVED
        sent = fake.requests[-1]
        assert sent["model"] == SERVED and sent["return_token_ids"] is True
        assert sent["logprobs"] is True and sent["top_logprobs"] == 0 and sent["max_tokens"] == 64

        stream = await client.chat.completions.create(
            model="x",
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=64,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
        )
        assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 10  # forwarded as it came
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(fake.generated[-1].token_ids)
        assert fake.requests[-1]["stream"] is True and fake.requests[-1]["return_token_ids"] is True

        spans = await gw.spans()
        _assert_recorded_engine_ids(spans, fake)
        assert [s.attributes[semconv.LLM_STREAM] for s in spans] == [False, True]
        await client.close()

    run_with_fake(FakeVLLM(), test)


def test_fake_vllm_gets_every_honoured_field_and_its_answer_comes_back_in_openais_shape() -> None:
    """stop, tool_choice, parallel_tool_calls, response_format, logprobs/top_logprobs, penalties, logit_bias, seed
    and chat_template_kwargs reach vLLM as vLLM's OpenAI server takes them (vLLM does the stop strings and the
    guided decoding itself); vLLM's stop_reason and logprobs entries come back to the client."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}

    async def test(gw: Gateway, fake: FakeVLLM, backend: VLLMBackend) -> None:
        client = gw.client()
        reply = await client.chat.completions.create(
            model="m",
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=64,
            stop=["engine"],
            tools=tools,  # type: ignore[arg-type]
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False,
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
            logprobs=True,
            top_logprobs=2,
            presence_penalty=0.5,
            frequency_penalty=0.25,
            logit_bias={"42": -100},
            seed=7,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        sent = fake.requests[-1]
        assert sent["stop"] == ["engine"]
        assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
        assert sent["parallel_tool_calls"] is False
        assert sent["response_format"] == {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
        assert sent["logprobs"] is True and sent["top_logprobs"] == 2
        assert sent["presence_penalty"] == 0.5 and sent["frequency_penalty"] == 0.25
        assert sent["logit_bias"] == {"42": -100.0} and sent["seed"] == 7
        assert sent["chat_template_kwargs"] == {"enable_thinking": False}
        assert reply.choices[0].message.content == "Hello from the fake "
        assert reply.choices[0].finish_reason == "stop"
        assert reply.choices[0].logprobs is not None
        assert [e.logprob for e in reply.choices[0].logprobs.content] == fake.generated[-1].logprobs
        (span,) = await gw.spans()
        assert span.attributes[semconv.LLM_STOP_SEQUENCE] == "engine"
        with pytest.raises(Exception) as refused:  # a raw prompt cannot be forwarded: 400 naming it
            await client.completions.create(model="m", prompt="Once upon", max_tokens=4)
        assert getattr(refused.value, "status_code", None) == 400 and "prompt" in str(refused.value)
        assert len(await gw.spans()) == 1  # the refused request recorded nothing
        await client.close()

    run_with_fake(FakeVLLM(), test)


@pytest.mark.parametrize("tool_parser", [False, True], ids=["tags-parsed-by-gateway", "vllm-tool-parser"])
def test_fake_vllm_parallel_tool_calls_come_back_with_engine_ids(tool_parser: bool) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]

    async def test(gw: Gateway, fake: FakeVLLM, backend: VLLMBackend) -> None:
        client = gw.client()
        whole = await client.chat.completions.create(model="x", messages=ASK, tools=tools, max_tokens=400)  # type: ignore[arg-type]
        calls = whole.choices[0].message.tool_calls or []
        assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Oslo"}, {"city": "Lima"}]  # type: ignore[union-attr]
        assert len({c.id for c in calls}) == 2 and whole.choices[0].finish_reason == "tool_calls"
        assert whole.choices[0].message.content == "Checking both."

        stream = await client.chat.completions.create(
            model="x",
            messages=ASK,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            max_tokens=400,
            stream=True,
        )
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Checking both."
        streamed = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        assert [json.loads(tc.function.arguments or "") for tc in streamed] == [{"city": "Oslo"}, {"city": "Lima"}]  # type: ignore[union-attr]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"

        spans = await gw.spans()
        _assert_recorded_engine_ids(spans, fake)
        for span in spans:
            assert [c["function"]["name"] for c in span.attributes[semconv.LLM_RESPONSE_MESSAGE]["tool_calls"]] == [
                "get_weather",
                "get_weather",
            ]
        await client.close()

    run_with_fake(FakeVLLM(reply=lambda body: TWO_CALLS, tool_parser=tool_parser), test)


@pytest.mark.parametrize("stream", [False, True])
def test_fake_old_vllm_without_token_ids_is_refused_with_a_clear_error(stream: bool) -> None:
    async def test(gw: Gateway, fake: FakeVLLM, backend: VLLMBackend) -> None:
        async with httpx.AsyncClient() as http:
            resp = await http.post(f"{gw.base_url}/chat/completions", json={"messages": ASK, "stream": stream})
        assert resp.status_code == 502
        error = resp.json()["error"]
        assert error["code"] == "upstream_error" and "vLLM >= 0.10.2" in error["message"]
        (span,) = await gw.spans()
        assert span.status.code == "ERROR" and span.attributes[semconv.LLM_TRAINABLE] is False

    run_with_fake(FakeVLLM(old=True), test)


@pytest.mark.parametrize("stream", [False, True])
def test_fake_vllm_context_overflow_and_engine_failure_become_openai_errors_and_failed_calls(stream: bool) -> None:
    async def test(gw: Gateway, fake: FakeVLLM, backend: VLLMBackend) -> None:
        async with httpx.AsyncClient() as http:
            url = f"{gw.base_url}/chat/completions"
            resp = await http.post(url, json={"messages": ASK, "stream": stream, "max_tokens": MAX_MODEL_LEN})
            assert resp.status_code == 400
            assert resp.json()["error"]["code"] == "context_length_exceeded"
            assert "maximum context length" in resp.json()["error"]["message"]
            fake.fail_with_500 = True
            resp = await http.post(url, json={"messages": ASK, "stream": stream})
            assert resp.status_code == 502 and "EngineCore died" in resp.json()["error"]["message"]
        overflow, failure = await gw.spans()
        assert overflow.attributes[semconv.LLM_ERROR_CODE] == "context_length_exceeded"
        assert failure.attributes[semconv.LLM_ERROR_CODE] == "upstream_error"
        assert all(
            s.status.code == "ERROR" and s.attributes[semconv.LLM_TRAINABLE] is False for s in (overflow, failure)
        )

    run_with_fake(FakeVLLM(), test)


def test_fake_vllm_stream_left_by_the_client_is_recorded_partial_and_flagged() -> None:
    async def test(gw: Gateway, fake: FakeVLLM, backend: VLLMBackend) -> None:
        url = f"{gw.base_url}/chat/completions"
        body = {"messages": ASK, "stream": True, "max_tokens": 3000}
        async with httpx.AsyncClient() as http, http.stream("POST", url, json=body) as resp:
            seen = 0
            async for line in resp.aiter_lines():
                seen += line.startswith("data: ")
                if seen == 5:
                    break
        for _ in range(200):
            spans = await gw.spans()
            if spans:
                break
            await asyncio.sleep(0.02)
        (span,) = spans
        attrs = span.attributes
        assert attrs[semconv.LLM_CLIENT_DISCONNECTED] is True and attrs[semconv.LLM_TRAINABLE] is False
        assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASON] == ["abort"]
        partial = attrs[semconv.LLM_RESPONSE_TOKEN_IDS]
        generated = fake.generated[-1]
        assert 4 <= len(partial) < len(generated.token_ids)
        assert partial == generated.token_ids[: len(partial)]  # the engine's ids, as far as they came
        assert attrs[semconv.LLM_RESPONSE_LOGPROBS] == pytest.approx(generated.logprobs[: len(partial)])
        assert attrs[semconv.LLM_PROMPT_TOKEN_IDS] == generated.prompt_token_ids

    run_with_fake(FakeVLLM(reply=lambda body: "z" * 2000, tick_s=0.005), test)


def test_fake_vllm_connect_checks_the_server_and_the_model() -> None:
    async def main() -> None:
        with pytest.raises(BackendError, match="cannot reach the vLLM server"):
            await VLLMBackend.connect("http://127.0.0.1:9/v1", timeout_s=2)
        with pytest.raises(ConfigError, match="needs the server's API root"):
            await open_backend("vllm")
        with pytest.raises(ConfigError, match="known backends: embedded, vllm, openai"):
            await open_backend("tgi", url="http://x")
        async with serve_in_background(FakeVLLM().app()) as url:
            with pytest.raises(ConfigError, match=f"it serves: {SERVED}"):
                await VLLMBackend.connect(f"{url}/v1", model="other")
            backend = await open_backend("vllm", url=f"{url}/v1", model=SERVED)
            result = await backend.generate(GenerationRequest(messages=ASK, max_tokens=3))
            assert result.finish_reason == "length" and len(result.response_token_ids) == 3
        with pytest.raises(BackendError, match="cannot reach"):  # the server went away
            await backend.generate(GenerationRequest(messages=ASK, max_tokens=3))
        await backend.close()

    asyncio.run(main())


def test_upstream_error_is_a_backend_error_answered_502() -> None:
    assert issubclass(UpstreamError, BackendError) and UpstreamError.http_status == 502
