"""The calc agent with LangGraph and ``langchain-openai`` (see README.md)."""
