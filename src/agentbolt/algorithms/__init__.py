"""agentbolt.algorithms."""
