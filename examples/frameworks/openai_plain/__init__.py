"""The calc agent with the plain ``openai`` client (see README.md)."""
