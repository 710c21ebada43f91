"""agentbolt.adapter."""
