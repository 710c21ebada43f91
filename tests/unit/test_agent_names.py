"""Agent names: the extractors on the span shapes each instrumentor writes, the nearest-span rule, ``agent_match``,
and the ``agentbolt.agent(...)`` scope recorded for real (``trace_attempt``, spans in memory).

The attribute shapes are taken from the instrumentors' sources (installed in ``.venv``):
- openai-agents (``openinference/instrumentation/openai_agents/_processor.py``): the run's root span is
  ``trace.name`` (``"Agent workflow"``) of kind AGENT; an ``AgentSpanData`` span is named after the agent, kind
  AGENT, with ``graph.node.id`` and ``agent.name`` = the agent's name;
- CrewAI (``crewai/_event_listener.py`` ``_build_agent_start_spec``): ``"<role>.<task>.execute"``, kind AGENT,
  ``graph.node.id`` = the role; LLM spans ``"<model>.llm_call"``;
- LangChain/LangGraph (``langchain/_tracer.py`` ``_update_span``, ``_metadata``): span name = run name, kind AGENT
  when the run name contains "agent" (else from the run type), ``metadata`` = JSON of the run's metadata, where
  LangGraph writes ``langgraph_node`` (inherited by the runs inside the node).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from opentelemetry import trace

from agentbolt import agent, emit_message, semconv, trace_attempt
from agentbolt.adapter.agents import (
    AGENT_NAME_EXTRACTORS,
    agent_kind_span_name,
    agent_name_of,
    agent_selected,
    compile_agent_match,
    explicit_agent_name,
    graph_node_agent_name,
    langgraph_node_name,
    openinference_agent_name,
    span_agent_name,
)
from agentbolt.errors import ConfigError
from agentbolt.tracing import current_agent_name
from agentbolt.types import Span


def _span(span_id: str, name: str, attributes: dict[str, Any], parent: str | None = None) -> Span:
    return Span(
        rollout_id="ro-1",
        attempt_id="at-1",
        span_id=span_id,
        trace_id="0" * 31 + "1",
        parent_id=parent,
        name=name,
        start_time=0.0,
        attributes=attributes,
    )


def _walk(*spans: Span) -> str | None:
    """The agent name of the first span, within all of them."""
    return agent_name_of(spans[0], {s.span_id: s for s in spans})


def test_the_extractors_in_order() -> None:
    assert (
        explicit_agent_name,
        openinference_agent_name,
        graph_node_agent_name,
        langgraph_node_name,
        agent_kind_span_name,
    ) == AGENT_NAME_EXTRACTORS


def test_openai_agents_agent_span_names_its_calls() -> None:
    llm = _span("g", "generation", {"openinference.span.kind": "LLM", "llm.system": "openai"}, parent="a")
    writer = _span(
        "a",
        "SQL writer",
        {"openinference.span.kind": "AGENT", "graph.node.id": "SQL writer", "agent.name": "SQL writer"},
        parent="r",
    )
    root = _span("r", "Agent workflow", {"openinference.span.kind": "AGENT"})
    assert openinference_agent_name(writer) == "SQL writer"
    assert _walk(llm, writer, root) == "SQL writer"
    # a call made directly under the run's root span: the root names it (kind AGENT, its name)
    direct = _span("g2", "generation", {"openinference.span.kind": "LLM"}, parent="r")
    assert _walk(direct, root) == "Agent workflow"


def test_crewai_agent_role() -> None:
    agent_span = _span(
        "a",
        "Researcher.Find the number of artists.execute",
        {
            "openinference.span.kind": "AGENT",
            "graph.node.id": "Researcher",
            "agent.goal": "Answer questions about the music store",
            "task_name": "Find the number of artists",
        },
        parent="c",
    )
    llm = _span("l", "gpt-4o-mini.llm_call", {"openinference.span.kind": "LLM"}, parent="a")
    crew = _span("c", "Crew.kickoff", {"openinference.span.kind": "CHAIN"})
    assert graph_node_agent_name(agent_span) == "Researcher"  # the role, not the span name
    assert _walk(llm, agent_span, crew) == "Researcher"
    # graph.node.id on a span that is not an AGENT (a CrewAI flow method, say) names nothing
    assert graph_node_agent_name(_span("x", "m", {"openinference.span.kind": "CHAIN", "graph.node.id": "m"})) is None


def test_langgraph_node() -> None:
    metadata = {
        "langgraph_step": 2,
        "langgraph_node": "check_query",
        "langgraph_triggers": ["branch:to:check_query"],
        "langgraph_path": ["__pregel_pull", "check_query"],
        "langgraph_checkpoint_ns": "check_query:0e1c7c9e-5a1c-4c5f-9d3f-3a2b1c0d9e8f",
    }
    graph = _span("g", "LangGraph", {"openinference.span.kind": "CHAIN", "metadata": "{}"})
    node = _span("n", "check_query", {"openinference.span.kind": "CHAIN", "metadata": json.dumps(metadata)}, "g")
    llm_metadata = {**metadata, "ls_provider": "openai", "ls_model_name": "smollm2", "ls_model_type": "chat"}
    llm = _span("l", "ChatOpenAI", {"openinference.span.kind": "LLM", "metadata": json.dumps(llm_metadata)}, "n")
    assert langgraph_node_name(node) == "check_query"
    assert _walk(llm, node, graph) == "check_query"
    assert langgraph_node_name(graph) is None
    assert langgraph_node_name(_span("b", "x", {"metadata": "not json"})) is None


def test_langchain_agent_run_name() -> None:
    executor = _span("e", "sql_agent_executor", {"openinference.span.kind": "AGENT"})
    llm = _span("l", "ChatOpenAI", {"openinference.span.kind": "LLM"}, parent="e")
    assert agent_kind_span_name(executor) == "sql_agent_executor"
    assert _walk(llm, executor) == "sql_agent_executor"
    assert agent_kind_span_name(_span("c", "RunnableSequence", {"openinference.span.kind": "CHAIN"})) is None


def test_first_extractor_wins_on_one_span_and_the_nearest_span_wins_on_a_path() -> None:
    both = _span("a", "agentbolt.agent", {semconv.AGENT_NAME: "writer", "agent.name": "other"})
    assert span_agent_name(both) == "writer"
    role = _span("b", "Researcher.task.execute", {"openinference.span.kind": "AGENT", "graph.node.id": "Researcher"})
    assert span_agent_name(role) == "Researcher"  # graph.node.id before the span name
    outer = _span("o", "agentbolt.agent", {semconv.AGENT_NAME: "team"})
    inner = _span("i", "agentbolt.agent", {semconv.AGENT_NAME: "writer"}, parent="o")
    tool = _span("t", "run_sql", {"openinference.span.kind": "TOOL"}, parent="i")
    llm = _span("l", "ChatCompletion", {"openinference.span.kind": "LLM"}, parent="t")
    assert _walk(llm, tool, inner, outer) == "writer"
    assert _walk(llm, tool, outer) is None  # the walk stops where a parent is missing ("i")
    assert _walk(_span("x", "ChatCompletion", {})) is None
    loop_a = _span("p", "a", {}, parent="q")
    loop_b = _span("q", "b", {}, parent="p")
    assert _walk(loop_a, loop_b) is None  # a cycle ends the walk


def test_agent_match_compiles_and_searches() -> None:
    assert compile_agent_match(None) is None
    pattern = compile_agent_match("writer")
    assert pattern is not None
    assert agent_selected("writer", pattern) and agent_selected("sql_writer", pattern)  # re.search
    assert not agent_selected("checker", pattern) and not agent_selected(None, pattern)
    exact = compile_agent_match("^writer$")
    assert agent_selected("writer", exact) and not agent_selected("sql_writer", exact)
    compiled = re.compile("check")
    assert compile_agent_match(compiled) is compiled
    assert agent_selected(None, None) and agent_selected("anyone", None)
    with pytest.raises(ConfigError, match=r"agent_match '\[writer' is not a valid regular expression"):
        compile_agent_match("[writer")
    with pytest.raises(ConfigError, match="got int"):
        compile_agent_match(3)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------- agentbolt.agent(...)


def test_agent_scope_records_a_named_agent_span_and_nests() -> None:
    @agent("checker")
    def check() -> str:
        emit_message("checking")
        return "ok"

    with trace_attempt(instrument=False) as attempt, agent("team"):
        with agent(" writer "):
            assert current_agent_name() == "writer"
            emit_message("drafting")
        assert check() == "ok"
        assert current_agent_name() == "team"
    assert current_agent_name() is None
    spans = {s.span_id: s for s in attempt.spans}
    drafting, writer, checking, checker, team = attempt.spans
    assert [s.name for s in (writer, checker, team)] == [semconv.SPAN_AGENT] * 3
    assert writer.attributes[semconv.AGENT_NAME] == "writer"
    assert writer.attributes[semconv.OI_AGENT_NAME] == "writer"
    assert writer.attributes[semconv.OI_SPAN_KIND] == "AGENT"
    assert writer.parent_id == team.span_id and checker.parent_id == team.span_id and team.parent_id is None
    assert agent_name_of(drafting, spans) == "writer"
    assert agent_name_of(checking, spans) == "checker"
    assert all(s.status.code == "UNSET" for s in attempt.spans)


def test_agent_scope_records_an_exception_and_reraises() -> None:
    with pytest.raises(RuntimeError, match="no table"), trace_attempt(instrument=False) as attempt, agent("writer"):
        raise RuntimeError("no table")
    writer, recorded = attempt.spans
    assert writer.status.code == "ERROR" and writer.status.description == "RuntimeError: no table"
    assert writer.attributes[semconv.EXCEPTION_TYPE] == "RuntimeError"
    assert [e["name"] for e in writer.attributes[semconv.OTLP_EVENTS]] == ["exception"]
    assert recorded.name == semconv.SPAN_EXCEPTION  # what trace_attempt records for the exception leaving it


def test_async_agents_run_concurrently_under_their_own_names() -> None:
    @agent("a")
    async def first() -> str:
        await asyncio.sleep(0.01)
        emit_message("from a")
        return str(current_agent_name())

    async def second() -> str:
        async with agent("b"):
            await asyncio.sleep(0.005)
            emit_message("from b")
            return str(current_agent_name())

    async def main() -> tuple[list[str], list[Span]]:
        async with trace_attempt(instrument=False) as attempt:
            names = await asyncio.gather(first(), second())
        return list(names), list(attempt.spans)

    names, spans = asyncio.run(main())
    assert names == ["a", "b"]
    by_id = {s.span_id: s for s in spans}
    messages = {s.attributes[semconv.MESSAGE_TEXT]: s for s in spans if s.name == semconv.SPAN_MESSAGE}
    assert agent_name_of(messages["from a"], by_id) == "a"
    assert agent_name_of(messages["from b"], by_id) == "b"


def test_agent_scope_outside_an_attempt_records_nothing() -> None:
    @agent("solo")
    def work() -> str | None:
        return current_agent_name()

    assert work() == "solo"
    with agent("solo"):
        assert not trace.get_current_span().get_span_context().is_valid
    assert current_agent_name() is None


def test_agent_scope_refuses_bad_names_and_generators() -> None:
    with pytest.raises(ConfigError, match="non-empty agent name"):
        agent("  ")
    with pytest.raises(ConfigError, match="non-empty agent name"):
        agent(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="generator"):

        @agent("gen")
        def gen() -> object:
            yield 1
