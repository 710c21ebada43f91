"""agentbolt.adapter: spans -> trajectories -> training samples. Pure functions, no I/O.

- :mod:`~agentbolt.adapter.trajectory`: :func:`build_trajectory` (one attempt's spans -> a trajectory), and
  :func:`last_reward`.
- :mod:`~agentbolt.adapter.join`: joins the gateway's LLM spans (exact tokens) with the tracer's (structure).
- :mod:`~agentbolt.adapter.agents`: the agent name of a call, and ``agent_match``.
- :mod:`~agentbolt.adapter.signals`: what follows each call: attached rewards, AIR signals (tool calls, exceptions),
  and infrastructure failures of an attempt.
"""

from agentbolt.adapter.agents import AGENT_NAME_EXTRACTORS, agent_name_of, compile_agent_match, span_agent_name
from agentbolt.adapter.join import CallJoin, JoinedCall, TracerCall, join_llm_calls
from agentbolt.adapter.trajectory import build_trajectory, last_reward

__all__ = [
    "AGENT_NAME_EXTRACTORS",
    "CallJoin",
    "JoinedCall",
    "TracerCall",
    "agent_name_of",
    "build_trajectory",
    "compile_agent_match",
    "join_llm_calls",
    "last_reward",
    "span_agent_name",
]
