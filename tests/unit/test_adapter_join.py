"""Joining gateway LLM spans (exact tokens) with tracer LLM spans (structure), agent names and ``agent_match``.

Every attempt here is written by hand in store order, with the attributes the real recorders write: the gateway's
``agentbolt.llm_call`` spans (:mod:`agentbolt.server.gateway.recording`), the openai instrumentor's LLM spans
(``input.value``/``output.value`` JSON, flattened ``llm.input_messages``), ``agentbolt.agent(...)`` spans. Store
order follows what happens in a real attempt: the gateway records a call before the client receives the answer, so
its span comes before the client's LLM span, and an agent span ends (and arrives) after the calls made inside it.

Pinned (the issue's done-when cases are marked DONE-WHEN):
- join by response id; by order plus request messages when the tracer has no id; ``n > 1`` choices share one call;
  nested tracer LLM spans are one call; two non-nested instrumentations of one call are one call;
- tracer-only calls are counted, never trained; gateway-only calls take the name the gateway recorded (header,
  ``traceparent`` parent) or none;
- ``agent_match`` keeps the selected agents' calls and counts the others; the innermost of nested agents wins;
- DONE-WHEN: a reward with zero captured calls is flagged and yields no sample; an exception in the third of five
  calls (caught, and ending the attempt); a reward emitted after the last call; an assistant message that holds
  only tool calls and no role.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from agentbolt import semconv
from agentbolt.adapter import build_trajectory, join_llm_calls
from agentbolt.adapter.join import canonical_messages, tracer_request_messages
from agentbolt.adapter.samples import samples_from_trajectories
from agentbolt.errors import ConfigError
from agentbolt.server.gateway.openai_format import backend_messages
from agentbolt.types import Rollout, Span, SpanStatus, TrajectoryFlag

ROLLOUT_ID = "ro-1"
ATTEMPT_ID = "at-1"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


class Attempt:
    """One attempt's spans in store order (sequence ids 1, 2, ...)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []

    def add(
        self,
        name: str,
        attributes: dict[str, Any],
        *,
        span_id: str | None = None,
        parent: str | None = None,
        status: str = "OK",
    ) -> Span:
        seq = len(self.spans) + 1
        span = Span(
            rollout_id=ROLLOUT_ID,
            attempt_id=ATTEMPT_ID,
            sequence_id=seq,
            span_id=span_id or f"sp-{seq}",
            trace_id=TRACE_ID,
            parent_id=parent,
            name=name,
            start_time=1000.0 + seq,
            end_time=1000.5 + seq,
            attributes=attributes,
            status=SpanStatus(code=status),
        )
        self.spans.append(span)
        return span

    def gateway(
        self,
        response_id: str,
        messages: list[dict[str, Any]],
        prompt: list[int],
        response: list[int],
        *,
        choice: int = 0,
        reply: dict[str, Any] | None = None,
        failed: bool = False,
        parent: str | None = None,
        **extra: Any,
    ) -> Span:
        """A gateway span as :class:`agentbolt.server.gateway.recording.CallRecorder` writes it."""
        attrs: dict[str, Any] = {
            semconv.GEN_AI_REQUEST_MODEL: "smollm2",
            semconv.GEN_AI_RESPONSE_MODEL: "smollm2",
            semconv.GEN_AI_REQUEST_TEMPERATURE: 1.0,
            semconv.LLM_REQUEST_MESSAGES: messages,
            semconv.LLM_STREAM: False,
            semconv.GEN_AI_RESPONSE_ID: response_id,
            semconv.LLM_CHOICE_INDEX: choice,
        }
        if failed:
            attrs.update(
                {
                    semconv.LLM_ERROR: "ContextLengthExceededError: 2100 prompt tokens, the model takes 2048",
                    semconv.LLM_ERROR_CODE: "context_length_exceeded",
                    semconv.LLM_TRAINABLE: False,
                    semconv.LLM_NOT_TRAINABLE_REASON: "the call failed",
                }
            )
        else:
            attrs.update(
                {
                    semconv.GEN_AI_RESPONSE_FINISH_REASON: [
                        "tool_calls" if reply and reply.get("tool_calls") else "stop"
                    ],
                    semconv.GEN_AI_USAGE_INPUT_TOKENS: len(prompt),
                    semconv.GEN_AI_USAGE_OUTPUT_TOKENS: len(response),
                    semconv.LLM_RESPONSE_TEXT: "text",
                    semconv.LLM_RESPONSE_MESSAGE: reply or {"role": "assistant", "content": "text"},
                    semconv.LLM_MODEL_VERSION: "step-0",
                    semconv.LLM_PROMPT_TOKEN_IDS: prompt,
                    semconv.LLM_RESPONSE_TOKEN_IDS: response,
                    semconv.LLM_RESPONSE_LOGPROBS: [-0.5] * len(response),
                    semconv.LLM_TRAINABLE: True,
                }
            )
        attrs.update(extra)
        return self.add(semconv.SPAN_LLM_CALL, attrs, parent=parent, status="ERROR" if failed else "OK")

    def openai_llm(
        self,
        span_id: str,
        messages: list[dict[str, Any]],
        *,
        response_id: str | None,
        replies: list[dict[str, Any]] | None = None,
        parent: str | None = None,
    ) -> Span:
        """An LLM span as the OpenInference openai instrumentor writes it; ``response_id=None``: the call raised, so
        there is no output and the status is ERROR."""
        attrs: dict[str, Any] = {
            semconv.OI_SPAN_KIND: "LLM",
            "llm.system": "openai",
            "llm.provider": "openai",
            "llm.model_name": "smollm2",
            "llm.invocation_parameters": json.dumps({"model": "smollm2", "max_tokens": 4}),
            semconv.OI_INPUT_VALUE: json.dumps({"messages": messages, "model": "smollm2", "max_tokens": 4}),
            "input.mime_type": "application/json",
            semconv.OTEL_SCOPE_NAME: "openinference.instrumentation.openai",
            semconv.ROLLOUT_ID: ROLLOUT_ID,
            semconv.ATTEMPT_ID: ATTEMPT_ID,
            **_flat_messages(semconv.OI_LLM_INPUT_MESSAGES, messages),
        }
        if response_id is None:
            return self.add("ChatCompletion", attrs, span_id=span_id, parent=parent, status="ERROR")
        replies = replies or [{"role": "assistant", "content": "text"}]
        output = {
            "id": response_id,
            "choices": [
                {"finish_reason": "stop", "index": i, "logprobs": None, "message": m} for i, m in enumerate(replies)
            ],
            "created": 1764519000,
            "model": "smollm2",
            "object": "chat.completion",
            "usage": {"completion_tokens": 2, "prompt_tokens": 3, "total_tokens": 5},
        }
        attrs[semconv.OI_OUTPUT_VALUE] = json.dumps(output)
        attrs["output.mime_type"] = "application/json"
        attrs.update(_flat_messages("llm.output_messages", replies))
        return self.add("ChatCompletion", attrs, span_id=span_id, parent=parent)

    def agent(self, name: str, span_id: str, *, parent: str | None = None, status: str = "UNSET") -> Span:
        """An ``agentbolt.agent(name)`` span (it ends after the calls made inside it)."""
        attrs = {
            semconv.AGENT_NAME: name,
            semconv.OI_AGENT_NAME: name,
            semconv.OI_SPAN_KIND: "AGENT",
            semconv.OTEL_SCOPE_NAME: "agentbolt",
        }
        return self.add(semconv.SPAN_AGENT, attrs, span_id=span_id, parent=parent, status=status)

    def reward(self, value: float, name: str | None = None, *, parent: str | None = None) -> Span:
        attrs: dict[str, Any] = {semconv.REWARD_VALUE: value}
        if name is not None:
            attrs[semconv.REWARD_NAME] = name
        return self.add(semconv.SPAN_REWARD, attrs, parent=parent)


def _flat_messages(prefix: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Messages flattened the way the openai instrumentor does (a key only for what the message holds)."""
    out: dict[str, Any] = {}
    for i, message in enumerate(messages):
        p = f"{prefix}.{i}.message."
        if message.get("role"):
            out[p + "role"] = message["role"]
        if message.get("tool_call_id"):
            out[p + "tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("content"), str) and message["content"]:
            out[p + "content"] = message["content"]
        for j, call in enumerate(message.get("tool_calls") or []):
            out[f"{p}tool_calls.{j}.tool_call.id"] = call["id"]
            out[f"{p}tool_calls.{j}.tool_call.function.name"] = call["function"]["name"]
            out[f"{p}tool_calls.{j}.tool_call.function.arguments"] = call["function"]["arguments"]
    return out


def _rollout(**kwargs: Any) -> Rollout:
    return Rollout(rollout_id=ROLLOUT_ID, input={"question": "How many artists?"}, enqueue_time=1.0, **kwargs)


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You write SQLite queries."}, {"role": "user", "content": text}]


def _names(spans: list[Span], **kwargs: Any) -> list[tuple[str | None, str | None]]:
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, spans, **kwargs)
    return [(t.agent_name, t.span_id) for t in trajectory.transitions]


def _writer_then_checker(final_reward: float = 1.0) -> Attempt:
    """writer: one call (seq 1-3); checker: one call (seq 4-6); the final reward (seq 7)."""
    a = Attempt()
    a.gateway("chatcmpl-w1", _user("Write SQL: how many artists?"), [1, 2, 3], [10, 11])
    a.openai_llm("llm-w1", _user("Write SQL: how many artists?"), response_id="chatcmpl-w1", parent="ag-writer")
    a.agent("writer", "ag-writer")
    a.gateway("chatcmpl-c1", _user("Check: SELECT COUNT(*) FROM artists"), [4, 5], [12])
    a.openai_llm("llm-c1", _user("Check: SELECT COUNT(*) FROM artists"), response_id="chatcmpl-c1", parent="ag-chk")
    a.agent("checker", "ag-chk")
    a.reward(final_reward)
    return a


# ------------------------------------------------------------------------------------------------------- the join


def test_join_by_response_id_names_each_call_after_its_agent() -> None:
    a = _writer_then_checker()
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, a.spans)
    assert [(t.agent_name, t.span_id, t.metadata["tracer_span_id"]) for t in trajectory.transitions] == [
        ("writer", "sp-1", "llm-w1"),
        ("checker", "sp-4", "llm-c1"),
    ]
    assert trajectory.transitions[0].prompt_token_ids == [1, 2, 3]  # tokens come from the gateway span
    assert trajectory.transitions[0].metadata == {
        "sequence_id": 1,
        "model_version": "step-0",
        "temperature": 1.0,
        "tracer_span_id": "llm-w1",
    }
    assert (trajectory.tracer_only_calls, trajectory.untrainable_calls, trajectory.excluded_calls) == (0, 0, 0)
    assert trajectory.flags == [] and trajectory.trainable


def test_join_by_order_and_messages_when_the_tracer_recorded_no_id() -> None:
    """Framework LLM spans without a response id (here errors: no output) pair with gateway requests by equal
    messages, k-th with k-th: calls 1 and 3 send the same messages under different agents."""
    a = Attempt()
    same = _user("Write SQL: how many albums?")
    a.gateway("chatcmpl-1", same, [1], [2])
    a.openai_llm("llm-1", same, response_id=None, parent="ag-1")
    a.agent("writer", "ag-1")
    a.gateway("chatcmpl-2", _user("Check it"), [3], [4])
    a.openai_llm("llm-2", _user("Check it"), response_id=None, parent="ag-2")
    a.agent("checker", "ag-2")
    a.gateway("chatcmpl-3", same, [1], [5])
    a.openai_llm("llm-3", same, response_id=None, parent="ag-3")
    a.agent("rewriter", "ag-3")
    join = join_llm_calls(a.spans)
    assert [(c.gateway.span_id, [s.span_id for s in c.tracer_spans], c.agent_name) for c in join.calls] == [
        ("sp-1", ["llm-1"], "writer"),
        ("sp-4", ["llm-2"], "checker"),
        ("sp-7", ["llm-3"], "rewriter"),
    ]
    assert join.tracer_only == []


def test_n_choices_are_one_call_with_one_agent() -> None:
    a = Attempt()
    q = _user("Write SQL: top 3 genres")
    a.gateway("chatcmpl-n", q, [1, 2], [10], choice=0)
    a.gateway("chatcmpl-n", q, [1, 2], [11, 12], choice=1)
    replies = [{"role": "assistant", "content": "A"}, {"role": "assistant", "content": "B"}]
    a.openai_llm("llm-n", q, response_id="chatcmpl-n", replies=replies, parent="ag-w")
    a.agent("writer", "ag-w")
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, a.spans)
    assert [(t.agent_name, t.response_token_ids, t.metadata["tracer_span_id"]) for t in trajectory.transitions] == [
        ("writer", [10], "llm-n"),
        ("writer", [11, 12], "llm-n"),
    ]
    assert trajectory.tracer_only_calls == 0


def test_nested_tracer_llm_spans_are_one_call() -> None:
    """openai-agents: a generation span (LLM, no response id) with the openai client's LLM span (with the id) under
    it, inside the agent span of ``writer`` and the run's root span ``Agent workflow``."""
    a = Attempt()
    q = _user("Write SQL: how many tracks?")
    a.gateway("chatcmpl-g", q, [1], [2])
    a.openai_llm("llm-client", q, response_id="chatcmpl-g", parent="gen-1")
    a.add(
        "generation",
        {
            semconv.OI_SPAN_KIND: "LLM",
            "llm.system": "openai",
            semconv.OI_INPUT_VALUE: json.dumps(q),
            semconv.OI_OUTPUT_VALUE: json.dumps([{"role": "assistant", "content": "text"}]),
            **_flat_messages(semconv.OI_LLM_INPUT_MESSAGES, q),
        },
        span_id="gen-1",
        parent="oa-writer",
    )
    a.add(
        "writer",
        {semconv.OI_SPAN_KIND: "AGENT", semconv.OI_GRAPH_NODE_ID: "writer", semconv.OI_AGENT_NAME: "writer"},
        span_id="oa-writer",
        parent="oa-root",
    )
    a.add("Agent workflow", {semconv.OI_SPAN_KIND: "AGENT"}, span_id="oa-root")
    join = join_llm_calls(a.spans)
    [call] = join.calls
    assert [s.span_id for s in call.tracer_spans] == ["llm-client", "gen-1"]  # deepest first
    assert call.agent_name == "writer"
    assert join.tracer_only == []


def test_one_call_recorded_by_two_instrumentors_that_do_not_nest() -> None:
    """LangChain's LLM span (under the LangGraph node ``writer``) and the openai client's (at the root: LangChain does
    not make its spans current) both carry the response id: one call, named after the node."""
    a = Attempt()
    q = _user("Write SQL: how many invoices?")
    node_metadata = json.dumps(
        {"langgraph_step": 1, "langgraph_node": "writer", "langgraph_path": ["__pregel_pull", "writer"]}
    )
    a.gateway("chatcmpl-lc", q, [1], [2])
    a.openai_llm("llm-openai", q, response_id="chatcmpl-lc")
    a.add(
        "ChatOpenAI",
        {
            semconv.OI_SPAN_KIND: "LLM",
            semconv.OI_METADATA: node_metadata,
            semconv.OI_OUTPUT_VALUE: json.dumps(
                {
                    "generations": [[{"text": "text", "type": "ChatGeneration", "message": {"type": "ai"}}]],
                    "llm_output": {"model_name": "smollm2", "id": "chatcmpl-lc"},
                    "type": "LLMResult",
                }
            ),
        },
        span_id="lc-llm",
        parent="lc-node",
    )
    a.add(
        "writer",
        {semconv.OI_SPAN_KIND: "CHAIN", semconv.OI_METADATA: node_metadata},
        span_id="lc-node",
        parent="lc-graph",
    )
    a.add("LangGraph", {semconv.OI_SPAN_KIND: "CHAIN", semconv.OI_METADATA: "{}"}, span_id="lc-graph")
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, a.spans)
    assert [(t.agent_name, t.metadata["tracer_span_id"]) for t in trajectory.transitions] == [("writer", "lc-llm")]
    assert trajectory.tracer_only_calls == 0


def test_tracer_only_calls_are_counted_and_never_trained() -> None:
    a = _writer_then_checker()
    # a judge called another endpoint (its response id is not the gateway's), and a call failed before any server
    a.openai_llm("llm-judge", _user("Grade this"), response_id="chatcmpl-elsewhere", parent="ag-judge")
    a.agent("judge", "ag-judge")
    a.openai_llm("llm-lost", _user("Never arrived"), response_id=None)
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, a.spans)
    assert [t.agent_name for t in trajectory.transitions] == ["writer", "checker"]
    assert trajectory.tracer_only_calls == 2
    assert [[s.span_id for s in c.spans] for c in join_llm_calls(a.spans).tracer_only] == [["llm-judge"], ["llm-lost"]]


def test_gateway_only_calls_take_the_name_the_gateway_recorded() -> None:
    """No instrumented client: the agent header, or a ``traceparent`` parent inside an agent scope, names the call."""
    a = Attempt()
    a.gateway("chatcmpl-h", _user("a"), [1], [2], **{semconv.AGENT_NAME: "judge"})  # x-agentbolt-agent: judge
    a.gateway("chatcmpl-t", _user("b"), [1], [3], parent="ag-plan")  # traceparent: ...-<ag-plan>-01
    a.agent("planner", "ag-plan")
    a.gateway("chatcmpl-none", _user("c"), [1], [4])
    # joined to a tracer span under "writer": the tracer's structure wins over the header
    a.gateway("chatcmpl-both", _user("d"), [1], [5], **{semconv.AGENT_NAME: "judge"})
    a.openai_llm("llm-d", _user("d"), response_id="chatcmpl-both", parent="ag-w")
    a.agent("writer", "ag-w")
    assert _names(a.spans) == [("judge", "sp-1"), ("planner", "sp-2"), (None, "sp-4"), ("writer", "sp-5")]


def test_agent_match_selects_one_of_two_agents() -> None:
    spans = _writer_then_checker().spans
    writer = build_trajectory(_rollout(), ATTEMPT_ID, spans, agent_match="^writer$")
    assert [(t.agent_name, t.span_id) for t in writer.transitions] == [("writer", "sp-1")]
    assert writer.excluded_calls == 1 and writer.flags == [] and writer.trainable
    assert writer.final_reward == 1.0  # the other agent still ran; the outcome is the rollout's
    checker = build_trajectory(_rollout(), ATTEMPT_ID, spans, agent_match=re.compile("check"))
    assert [(t.agent_name, t.span_id) for t in checker.transitions] == [("checker", "sp-4")]
    both = build_trajectory(_rollout(), ATTEMPT_ID, spans, agent_match="writer|checker")
    assert len(both.transitions) == 2 and both.excluded_calls == 0
    nobody = build_trajectory(_rollout(), ATTEMPT_ID, spans, agent_match="^judge$")
    assert nobody.transitions == [] and nobody.excluded_calls == 2
    assert nobody.flags == [TrajectoryFlag.NO_MATCHING_AGENT] and not nobody.trainable


def test_agent_match_never_selects_an_unnamed_call_and_rejects_bad_patterns() -> None:
    a = Attempt()
    a.gateway("chatcmpl-x", _user("x"), [1], [2])
    assert _names(a.spans) == [(None, "sp-1")]
    assert _names(a.spans, agent_match=".*") == []
    with pytest.raises(ConfigError, match=r"agent_match 'writer\(' is not a valid regular expression"):
        build_trajectory(_rollout(), ATTEMPT_ID, a.spans, agent_match="writer(")


def test_nested_agents_inner_wins() -> None:
    a = Attempt()
    a.gateway("chatcmpl-1", _user("draft"), [1], [2])
    a.openai_llm("llm-1", _user("draft"), response_id="chatcmpl-1", parent="ag-writer")
    a.agent("writer", "ag-writer", parent="ag-team")
    a.gateway("chatcmpl-2", _user("merge"), [1], [3])
    a.openai_llm("llm-2", _user("merge"), response_id="chatcmpl-2", parent="ag-team")
    a.agent("team", "ag-team")
    assert _names(a.spans) == [("writer", "sp-1"), ("team", "sp-4")]
    assert _names(a.spans, agent_match="^team$") == [("team", "sp-4")]


# ------------------------------------------------------------------------------------------ the done-when cases


def test_reward_with_zero_captured_calls_is_flagged_and_not_trained() -> None:
    """DONE-WHEN: the agent called some other endpoint only (the tracer saw it, the gateway did not), then emitted a
    reward: no transition, flagged ``reward_without_calls``, not trainable, and it yields no training sample."""
    a = Attempt()
    a.openai_llm("llm-x", _user("How many artists?"), response_id="chatcmpl-elsewhere", parent="ag-w")
    a.agent("writer", "ag-w")
    a.reward(1.0)
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, a.spans)
    assert trajectory.transitions == []
    assert trajectory.final_reward == 1.0
    assert trajectory.flags == [TrajectoryFlag.REWARD_WITHOUT_CALLS]
    assert trajectory.tracer_only_calls == 1 and trajectory.untrainable_calls == 0
    assert trajectory.trainable is False
    assert samples_from_trajectories([trajectory], {ROLLOUT_ID: 0.5}) == []

    # every call failed: also nothing captured to train on
    failed = Attempt()
    failed.gateway("chatcmpl-f", _user("x"), [1], [], failed=True)
    failed.reward(0.0)
    flagged = build_trajectory(_rollout(), ATTEMPT_ID, failed.spans)
    assert flagged.flags == [TrajectoryFlag.REWARD_WITHOUT_CALLS] and flagged.untrainable_calls == 1

    # no reward, no call: nothing to flag (the trainer skips it as unscored)
    assert build_trajectory(_rollout(), ATTEMPT_ID, []).flags == []


def _five_calls_third_fails(*, caught: bool) -> Attempt:
    """writer, checker, writer (raises: context length), then, if caught, writer retries the same messages and
    checker checks; if not caught, the exception ends the attempt."""
    a = Attempt()
    a.gateway("chatcmpl-1", _user("q1"), [1], [10])
    a.openai_llm("llm-1", _user("q1"), response_id="chatcmpl-1", parent="ag-w1")
    a.agent("writer", "ag-w1")
    a.gateway("chatcmpl-2", _user("q2"), [2], [20])
    a.openai_llm("llm-2", _user("q2"), response_id="chatcmpl-2", parent="ag-c1")
    a.agent("checker", "ag-c1")
    a.gateway("chatcmpl-3", _user("q3 long"), [3] * 8, [], failed=True)  # seq 7
    a.openai_llm("llm-3", _user("q3 long"), response_id=None, parent="ag-w2")  # seq 8: BadRequestError, no output
    exception = {
        semconv.EXCEPTION_TYPE: "BadRequestError",
        semconv.EXCEPTION_MESSAGE: "Error code: 400 - context_length_exceeded",
    }
    if not caught:
        a.agent("writer", "ag-w2", status="ERROR")  # seq 9
        a.add(semconv.SPAN_EXCEPTION, exception, status="ERROR")  # seq 10: the runner records what ended it
        return a
    a.add(semconv.SPAN_EXCEPTION, exception, parent="ag-w2", status="ERROR")  # seq 9: emit_exception(exc)
    a.gateway("chatcmpl-4", _user("q3 long"), [3] * 4, [40])  # seq 10: the retry, same messages
    a.openai_llm("llm-4", _user("q3 long"), response_id="chatcmpl-4", parent="ag-w2")
    a.agent("writer", "ag-w2")
    a.gateway("chatcmpl-5", _user("q4"), [5], [50])  # seq 13
    a.openai_llm("llm-5", _user("q4"), response_id="chatcmpl-5", parent="ag-c2")
    a.agent("checker", "ag-c2")
    a.reward(1.0)
    return a


def test_exception_in_the_third_of_five_calls_caught() -> None:
    """DONE-WHEN: the third call raises and the agent carries on: four transitions in order with their agents; the
    failed call is paired with its failed gateway span by messages (the retry took the id), counted untrainable."""
    a = _five_calls_third_fails(caught=True)
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, a.spans)
    assert [(t.agent_name, t.span_id, t.response_token_ids) for t in trajectory.transitions] == [
        ("writer", "sp-1", [10]),
        ("checker", "sp-4", [20]),
        ("writer", "sp-10", [40]),
        ("checker", "sp-13", [50]),
    ]
    assert (trajectory.untrainable_calls, trajectory.tracer_only_calls, trajectory.flags) == (1, 0, [])
    assert trajectory.final_reward == 1.0
    failed = join_llm_calls(a.spans).calls[2]
    assert (failed.gateway.span_id, [s.span_id for s in failed.tracer_spans], failed.agent_name) == (
        "sp-7",
        ["llm-3"],
        "writer",
    )
    assert [
        t.agent_name for t in build_trajectory(_rollout(), ATTEMPT_ID, a.spans, agent_match="^writer$").transitions
    ] == [
        "writer",
        "writer",
    ]


def test_exception_in_the_third_of_five_calls_ends_the_attempt() -> None:
    """DONE-WHEN: the exception leaves the agent, calls 4 and 5 never happen: the two calls made are transitions,
    the failed one is untrainable, and without a reward the trajectory is not trainable (and not flagged)."""
    a = _five_calls_third_fails(caught=False)
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, a.spans)
    assert [(t.agent_name, t.span_id) for t in trajectory.transitions] == [("writer", "sp-1"), ("checker", "sp-4")]
    assert (trajectory.untrainable_calls, trajectory.tracer_only_calls) == (1, 0)
    assert trajectory.final_reward is None and trajectory.flags == [] and trajectory.trainable is False


def test_reward_emitted_after_the_last_call() -> None:
    """DONE-WHEN: the final reward comes after the last call (of the agent not trained); it is the trajectory's final
    reward and an intermediate one at its sequence id. Here it even reaches the store before the last call's tracer
    span (a later export batch): the join does not depend on that order."""
    a = Attempt()
    a.gateway("chatcmpl-w", _user("write"), [1], [2])
    a.openai_llm("llm-w", _user("write"), response_id="chatcmpl-w", parent="ag-w")
    a.agent("writer", "ag-w")
    a.reward(0.5, name="executes")  # seq 4
    a.gateway("chatcmpl-c", _user("check"), [3], [4])  # seq 5: the last call
    a.reward(0.75)  # seq 6: emitted after it
    a.openai_llm("llm-c", _user("check"), response_id="chatcmpl-c", parent="ag-c")
    a.agent("checker", "ag-c")
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, a.spans, agent_match="^writer$")
    assert [(t.agent_name, t.span_id) for t in trajectory.transitions] == [("writer", "sp-1")]
    assert trajectory.final_reward == 0.75
    assert trajectory.intermediate_rewards == [(4, 0.5), (6, 0.75)]
    assert trajectory.excluded_calls == 1 and trajectory.tracer_only_calls == 0 and trajectory.trainable
    everyone = build_trajectory(_rollout(), ATTEMPT_ID, a.spans)
    assert [(t.agent_name, t.span_id) for t in everyone.transitions] == [("writer", "sp-1"), ("checker", "sp-5")]


TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "run_sql", "arguments": '{"query": "SELECT 1"}'}}


def test_assistant_message_with_only_tool_calls_and_no_role() -> None:
    """DONE-WHEN: the writer answers with a tool call only; its next request carries that turn as a message with
    ``tool_calls`` and neither ``role`` nor ``content``. Both calls become transitions of the writer, the second
    paired by messages (its framework span records no response id)."""
    a = Attempt()
    first = _user("How many artists?")
    reply = {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}
    a.gateway("chatcmpl-t1", first, [1, 2], [30, 31], reply=reply)
    a.openai_llm("llm-t1", first, response_id="chatcmpl-t1", replies=[reply], parent="ag-w")
    second = [*first, {"tool_calls": [TOOL_CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": "275"}]
    a.gateway("chatcmpl-t2", second, [1, 2, 30, 31, 5], [40])
    a.add(  # a framework LLM span whose output is messages only (no response id)
        "generation",
        {
            semconv.OI_SPAN_KIND: "LLM",
            semconv.OI_OUTPUT_VALUE: json.dumps([{"role": "assistant", "content": "275 artists"}]),
            **_flat_messages(semconv.OI_LLM_INPUT_MESSAGES, second),
        },
        span_id="gen-t2",
        parent="ag-w",
    )
    a.agent("writer", "ag-w")
    assert "llm.input_messages.2.message.role" not in a.spans[3].attributes  # recorded without a role, as sent
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, a.spans)
    assert [
        (t.agent_name, t.span_id, t.finish_reason, t.metadata["tracer_span_id"]) for t in trajectory.transitions
    ] == [
        ("writer", "sp-1", "tool_calls", "llm-t1"),
        ("writer", "sp-3", "stop", "gen-t2"),
    ]
    assert trajectory.tracer_only_calls == 0


def test_role_less_tool_call_message_is_an_assistant_message() -> None:
    roleless = {"tool_calls": [TOOL_CALL]}
    spaced = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "other", "function": {"name": "run_sql", "arguments": '{"query":"SELECT 1"}'}}],
    }
    assert (
        canonical_messages([roleless])
        == canonical_messages([spaced])
        == (("assistant", "", (("run_sql", '{"query":"SELECT 1"}'),)),)
    )
    assert canonical_messages([roleless]) != canonical_messages([{**spaced, "role": "user"}])
    # the tracer's flattened form of the same message (no role key) reads back the same
    flat = Span(
        rollout_id=ROLLOUT_ID,
        attempt_id=ATTEMPT_ID,
        span_id="x",
        trace_id=TRACE_ID,
        name="ChatCompletion",
        start_time=0.0,
        attributes={semconv.OI_SPAN_KIND: "LLM", **_flat_messages(semconv.OI_LLM_INPUT_MESSAGES, [roleless])},
    )
    assert tracer_request_messages(flat) == canonical_messages([roleless])
    # the gateway hands the backend an assistant message, and records the request as sent
    sent = [{"role": "user", "content": "hi"}, roleless, {"content": "no role, no tool calls"}]
    assert backend_messages(sent) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [TOOL_CALL]},
        {"content": "no role, no tool calls"},
    ]
    assert "role" not in sent[1]


def test_autogen_developer_role_and_grouped_tool_results_read_as_the_wire_messages() -> None:
    """AutoGen's instrumentor records the system message as ``developer`` and one ``function`` message holding
    the K tool results as JSON (``llm.input_messages.<i>.function.<k>``); the gateway saw K ``tool`` messages."""
    prefix = semconv.OI_LLM_INPUT_MESSAGES
    recorded = Span(
        rollout_id=ROLLOUT_ID,
        attempt_id=ATTEMPT_ID,
        span_id="ag",
        trace_id=TRACE_ID,
        name="OpenAIChatCompletionClient.create",
        start_time=0.0,
        attributes={
            semconv.OI_SPAN_KIND: "LLM",
            f"{prefix}.0.message.role": "developer",
            f"{prefix}.0.message.content": "You are a calculator.",
            f"{prefix}.1.message.role": "user",
            f"{prefix}.1.message.content": "2-9?",
            f"{prefix}.2.message.role": "assistant",
            f"{prefix}.2.message.tool_calls.0.tool_call.function.name": "calc",
            f"{prefix}.2.message.tool_calls.0.tool_call.function.arguments": '{"e": "2-9"}',
            f"{prefix}.2.message.tool_calls.1.tool_call.function.name": "calc",
            f"{prefix}.2.message.tool_calls.1.tool_call.function.arguments": '{"e": "1+1"}',
            f"{prefix}.3.message.role": "function",
            f"{prefix}.3.function.0": '{"name": "calc", "content": "-7", "call_id": "c1", "is_error": false}',
            f"{prefix}.3.function.1": '{"name": "calc", "content": "2", "call_id": "c2", "is_error": false}',
        },
    )
    on_the_wire = [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "2-9?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"e":"2-9"}'}},
                {"id": "c2", "type": "function", "function": {"name": "calc", "arguments": '{"e":"1+1"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "-7"},
        {"role": "tool", "tool_call_id": "c2", "content": "2"},
    ]
    assert (
        tracer_request_messages(recorded)
        == canonical_messages(on_the_wire)
        == (
            ("system", "You are a calculator.", ()),
            ("user", "2-9?", ()),
            ("assistant", "", (("calc", '{"e":"2-9"}'), ("calc", '{"e":"1+1"}'))),
            ("tool", "-7", ()),
            ("tool", "2", ()),
        )
    )
