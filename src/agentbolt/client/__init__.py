"""agentbolt.client."""
