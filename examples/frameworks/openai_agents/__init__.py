"""The calc agent with the OpenAI Agents SDK (see README.md)."""
