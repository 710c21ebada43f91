"""Agent-side tracing: the attempt context, ``emit_*``, ``@operation``, framework instrumentation.

- :mod:`~agentbolt.tracing.context`: which attempt the code runs under (:class:`AttemptContext`, :func:`attempt_scope`).
- :mod:`~agentbolt.tracing.emit`: ``emit_reward``, ``emit_message``, ``emit_object``, ``emit_exception``.
- :mod:`~agentbolt.tracing.operation`: ``@operation`` records a function call with its inputs and output.
- :mod:`~agentbolt.tracing.agents`: ``agent("writer")`` runs code under an agent name (``agent_match`` selects by it).
- :mod:`~agentbolt.tracing.instrumentors`: ``instrument(["openai", "langchain", ...])`` (OpenInference instrumentors).
- :mod:`~agentbolt.tracing.otel`: the OpenTelemetry SDK setup (one tracer provider per process, routing spans to
  their attempt); :mod:`~agentbolt.tracing.export`: exporting them to the store; :mod:`~agentbolt.tracing.convert`:
  SDK span -> :class:`agentbolt.types.Span`.

Importing this package does not import the OpenTelemetry SDK; the first span recorded does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentbolt.tracing.agents import AgentScope, agent, current_agent_name
from agentbolt.tracing.context import AttemptContext, attempt_scope, current_attempt
from agentbolt.tracing.emit import emit_exception, emit_message, emit_object, emit_reward
from agentbolt.tracing.instrumentors import FRAMEWORKS, FrameworkUnavailable, instrument, uninstrument
from agentbolt.tracing.operation import operation
from agentbolt.tracing.serialize import JsonLimits

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = [
    "FRAMEWORKS",
    "AgentScope",
    "AttemptContext",
    "FrameworkUnavailable",
    "JsonLimits",
    "agent",
    "attempt_scope",
    "current_agent_name",
    "current_attempt",
    "emit_exception",
    "emit_message",
    "emit_object",
    "emit_reward",
    "instrument",
    "operation",
    "tracer_provider",
    "uninstrument",
]


def tracer_provider() -> TracerProvider:
    """agentbolt's OpenTelemetry ``TracerProvider`` (see :func:`agentbolt.tracing.otel.tracer_provider`)."""
    from agentbolt.tracing.otel import tracer_provider as _tracer_provider

    return _tracer_provider()
