"""agentbolt.inference."""
