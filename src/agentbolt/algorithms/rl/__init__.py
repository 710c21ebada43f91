"""agentbolt.algorithms.rl."""
