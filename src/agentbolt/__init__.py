"""agentbolt: train any LLM agent from its own executions.

Only the agent-side API is exported here, and lazily, so ``import agentbolt`` never pulls torch or the server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "rollout": "agentbolt.runner.agent",
    "LitAgent": "agentbolt.runner.agent",
    "emit_reward": "agentbolt.tracing.emit",
    "emit_message": "agentbolt.tracing.emit",
    "emit_object": "agentbolt.tracing.emit",
    "emit_exception": "agentbolt.tracing.emit",
    "operation": "agentbolt.tracing.operation",
    "agent": "agentbolt.tracing.agents",
    "instrument": "agentbolt.tracing.instrumentors",
    "trace_attempt": "agentbolt.runner.local",
    "LLM": "agentbolt.types",
    "PromptTemplate": "agentbolt.types",
    "Rollout": "agentbolt.types",
    "Span": "agentbolt.types",
}

if TYPE_CHECKING:
    from agentbolt.runner.agent import LitAgent, rollout
    from agentbolt.runner.local import trace_attempt
    from agentbolt.tracing.agents import agent
    from agentbolt.tracing.emit import emit_exception, emit_message, emit_object, emit_reward
    from agentbolt.tracing.instrumentors import instrument
    from agentbolt.tracing.operation import operation
    from agentbolt.types import LLM, PromptTemplate, Rollout, Span

__all__ = [
    "LLM",
    "LitAgent",
    "PromptTemplate",
    "Rollout",
    "Span",
    "agent",
    "emit_exception",
    "emit_message",
    "emit_object",
    "emit_reward",
    "instrument",
    "operation",
    "rollout",
    "trace_attempt",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentbolt' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
