"""agentbolt.adapter: spans -> trajectories -> training samples. Pure functions, no I/O, no torch.

Everything from an attempt's spans to the samples a policy update consumes lives here, below the server, so the
dashboard and ``agentbolt export`` show training data with the ``[server]`` extra alone; the losses and the trainer
backends that need torch stay in :mod:`agentbolt.algorithms.rl`.

Spans -> trajectories:

- :mod:`~agentbolt.adapter.trajectory`: :func:`build_trajectory` (one attempt's spans -> a trajectory), and
  :func:`last_reward`.
- :mod:`~agentbolt.adapter.join`: joins the gateway's LLM spans (exact tokens) with the tracer's (structure).
- :mod:`~agentbolt.adapter.agents`: the agent name of a call, and ``agent_match``.
- :mod:`~agentbolt.adapter.signals`: what follows each call: attached rewards, AIR signals (tool calls, exceptions),
  and infrastructure failures of an attempt.

Trajectories -> training samples (LightningRL steps 2 to 4):

- :mod:`~agentbolt.adapter.credit`: credit assignment, one reward per transition.
- :mod:`~agentbolt.adapter.advantages`: advantage estimators, one advantage per rollout.
- :mod:`~agentbolt.adapter.per_transition`: one advantage per transition, the max_tokens policy, ``gae`` step
  rewards.
- :mod:`~agentbolt.adapter.staleness`: stale calls under asynchronous training.
- :mod:`~agentbolt.adapter.samples`: training samples and the merge of transitions that extend each other.
- :mod:`~agentbolt.adapter.batch`: which rollouts of a step are trained on, and their samples.
- :mod:`~agentbolt.adapter.export_rows`: the ``rl`` rows shared by ``agentbolt export`` and the dashboard.
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
