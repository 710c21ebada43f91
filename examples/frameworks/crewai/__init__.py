"""The calc agent with CrewAI (see README.md)."""
