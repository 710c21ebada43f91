"""Runners: claim rollouts from the store, run the agent, report the outcome. Agent side: never imports torch."""

from agentbolt.runner.agent import FunctionAgent, LitAgent, rollout

__all__ = ["FunctionAgent", "LitAgent", "rollout"]
