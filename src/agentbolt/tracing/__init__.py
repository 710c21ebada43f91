"""Agent-side tracing: the attempt context and the ``emit_*`` functions."""

from agentbolt.tracing.context import AttemptContext, attempt_scope, current_attempt
from agentbolt.tracing.emit import emit_reward

__all__ = ["AttemptContext", "attempt_scope", "current_attempt", "emit_reward"]
