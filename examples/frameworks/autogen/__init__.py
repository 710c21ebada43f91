"""The calc agent with AutoGen AgentChat (see README.md)."""
