"""agentbolt.store."""
