"""agentbolt.server."""
