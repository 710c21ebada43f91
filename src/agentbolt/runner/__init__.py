"""Runners: claim rollouts from the store, run the agent, report the outcome. Agent side: never imports torch.

``trace_attempt`` runs agent code outside a runner and shows what a runner would record (for debugging).
"""

from agentbolt.runner.agent import FunctionAgent, LitAgent, rollout
from agentbolt.runner.local import LocalAttempt, trace_attempt

__all__ = ["FunctionAgent", "LitAgent", "LocalAttempt", "rollout", "trace_attempt"]
