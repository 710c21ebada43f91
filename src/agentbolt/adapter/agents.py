"""Agent names: which agent of a (multi-agent) system an LLM call was made under. Pure: no I/O.

**The rule.** The agent name of a span is found by walking up from it through ``parent_id`` links, within the spans
of its attempt, starting with the span itself: the *nearest* span that names an agent wins, so an agent nested in
another one owns its own calls. The walk stops at a span whose parent is not among the attempt's spans.

**What names an agent.** A span names an agent when one of these extractors, tried in this order, returns a
non-empty name (:data:`AGENT_NAME_EXTRACTORS`):

1. ``agentbolt.agent.name``: set by ``agentbolt.agent("writer")`` (:mod:`agentbolt.tracing.agents`) on its span,
   and by the gateway on a call that sent the ``x-agentbolt-agent`` header.
2. ``agent.name`` (OpenInference): openai-agents agent spans (``AgentSpanData.name``).
3. ``graph.node.id`` on a span of OpenInference kind ``AGENT``: CrewAI agent spans (the agent's role; their span
   names are ``"<role>.<task>.execute"``), openai-agents agent spans.
4. ``langgraph_node`` in the JSON object under ``metadata`` (the LangChain instrumentor copies the run's metadata
   there; LangGraph puts the node's name in it, on the node's span and on every span recorded inside the node).
5. The span's name, on a span of OpenInference kind ``AGENT``: LangChain runs whose name contains "agent",
   the openai-agents root span of a run (``"Agent workflow"`` unless named), other OpenInference agents.

A span with none of these does not name an agent; a call with no naming span on its path has agent name ``None``.

**Selecting agents.** :func:`compile_agent_match` turns ``agent_match`` into a regular expression applied with
``re.search`` to the agent name (so ``"writer"`` also selects ``"sql_writer"``; anchor it, ``"^writer$"``, to select
one name exactly). ``None`` selects every call, named or not; a pattern never selects a call whose name is ``None``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from agentbolt import semconv
from agentbolt.errors import ConfigError
from agentbolt.types import Span

AgentNameExtractor = Callable[[Span], str | None]
"""Reads the agent name a span itself declares, or ``None``."""


def _nonempty(value: object) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def _is_agent_kind(span: Span) -> bool:
    return span.attributes.get(semconv.OI_SPAN_KIND) == semconv.OI_SPAN_KIND_AGENT


def explicit_agent_name(span: Span) -> str | None:
    """``agentbolt.agent.name`` (``agentbolt.agent(...)`` spans; gateway spans of a call with the agent header)."""
    return _nonempty(span.attributes.get(semconv.AGENT_NAME))


def openinference_agent_name(span: Span) -> str | None:
    """OpenInference ``agent.name`` (openai-agents agent spans)."""
    return _nonempty(span.attributes.get(semconv.OI_AGENT_NAME))


def graph_node_agent_name(span: Span) -> str | None:
    """``graph.node.id`` of an OpenInference ``AGENT`` span (CrewAI: the agent's role)."""
    if not _is_agent_kind(span):
        return None
    return _nonempty(span.attributes.get(semconv.OI_GRAPH_NODE_ID))


def langgraph_node_name(span: Span) -> str | None:
    """``langgraph_node`` of the span's OpenInference ``metadata`` JSON (LangGraph node spans and their children)."""
    raw = span.attributes.get(semconv.OI_METADATA)
    metadata: Any = raw
    if isinstance(raw, str):
        try:
            metadata = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(metadata, Mapping):
        return None
    return _nonempty(metadata.get("langgraph_node"))


def agent_kind_span_name(span: Span) -> str | None:
    """The name of a span of OpenInference kind ``AGENT``."""
    if not _is_agent_kind(span):
        return None
    return _nonempty(span.name)


AGENT_NAME_EXTRACTORS: tuple[AgentNameExtractor, ...] = (
    explicit_agent_name,
    openinference_agent_name,
    graph_node_agent_name,
    langgraph_node_name,
    agent_kind_span_name,
)
"""The extractors of the module docstring, in the order they are tried on each span."""


def span_agent_name(span: Span, extractors: tuple[AgentNameExtractor, ...] = AGENT_NAME_EXTRACTORS) -> str | None:
    """The agent name ``span`` itself declares (the first extractor that finds one), or ``None``."""
    for extract in extractors:
        name = extract(span)
        if name is not None:
            return name
    return None


def agent_name_of(
    span: Span,
    spans_by_id: Mapping[str, Span],
    extractors: tuple[AgentNameExtractor, ...] = AGENT_NAME_EXTRACTORS,
) -> str | None:
    """The agent ``span`` was recorded under: the nearest span on its path to the root that names one.

    Args:
        span: where the walk starts (it may name the agent itself).
        spans_by_id: the attempt's spans by ``span_id``; the walk stops at a parent that is not in it.
        extractors: what names an agent (default: :data:`AGENT_NAME_EXTRACTORS`).

    Returns:
        The name, or ``None`` when no span on the path names an agent.
    """
    seen: set[str] = set()
    current: Span | None = span
    while current is not None and current.span_id not in seen:
        seen.add(current.span_id)
        name = span_agent_name(current, extractors)
        if name is not None:
            return name
        current = spans_by_id.get(current.parent_id) if current.parent_id else None
    return None


AgentMatch = str | re.Pattern[str] | None
"""``agent_match``: a regular expression (text or compiled) searched in agent names, or ``None`` for all calls."""


def compile_agent_match(agent_match: AgentMatch) -> re.Pattern[str] | None:
    """``agent_match`` as a compiled pattern (``None`` stays ``None``: every call is selected).

    Raises:
        ConfigError: ``agent_match`` is not a valid regular expression, or is neither text, a pattern nor ``None``.
    """
    if agent_match is None or isinstance(agent_match, re.Pattern):
        return agent_match
    if not isinstance(agent_match, str):
        raise ConfigError(
            f"agent_match must be a regular expression (str or re.Pattern) or None, got {type(agent_match).__name__}"
        )
    try:
        return re.compile(agent_match)
    except re.error as exc:
        raise ConfigError(
            f"agent_match {agent_match!r} is not a valid regular expression ({exc}); e.g. '^writer$' selects the "
            "agent named 'writer', 'writer|checker' two agents"
        ) from exc


def agent_selected(agent_name: str | None, pattern: re.Pattern[str] | None) -> bool:
    """Whether a call made under ``agent_name`` is selected by ``pattern`` (``re.search``; ``None`` selects all)."""
    if pattern is None:
        return True
    return agent_name is not None and pattern.search(agent_name) is not None
