"""agentbolt.cli."""
