"""The OpenAI-compatible gateway: ``routes`` (the endpoint), ``openai_format`` (wire format), ``streaming`` (SSE),
``recording`` (spans), ``toolcalls`` (tool calls out of generated text)."""
