"""agentbolt.trainer."""
