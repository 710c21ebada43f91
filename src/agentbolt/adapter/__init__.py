"""agentbolt.adapter: spans -> trajectories -> training samples. Pure functions, no I/O."""

from agentbolt.adapter.trajectory import build_trajectory, last_reward

__all__ = ["build_trajectory", "last_reward"]
