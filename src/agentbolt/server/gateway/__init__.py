"""agentbolt.server.gateway."""
