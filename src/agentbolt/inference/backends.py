"""Build the inference backend behind the gateway by name: ``embedded``, ``vllm`` or ``openai``.

The embedded backend imports torch and transformers, so it is imported only when asked for.
"""

from __future__ import annotations

from typing import Literal

from agentbolt.errors import ConfigError
from agentbolt.inference.base import InferenceBackend

BackendKind = Literal["embedded", "vllm", "openai"]
BACKEND_KINDS: tuple[BackendKind, ...] = ("embedded", "vllm", "openai")


async def open_backend(
    kind: str,
    *,
    model: str | None = None,
    url: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 600.0,
) -> InferenceBackend:
    """Start or connect the backend ``kind``.

    Args:
        kind: ``embedded`` (``model``: an embedded model name such as ``smollm2-135m``, or a model directory),
            ``vllm`` (``url`` of a running vLLM server's API root; ``model`` optional, default its first model) or
            ``openai`` (``url`` of any OpenAI-compatible API root; ``model``, and ``api_key`` if it needs one).
        timeout_s: for remote backends, the longest wait for an answer or for the next chunk of a stream.

    Raises:
        ConfigError: unknown kind, or a missing or wrong option (the message says which).
        BackendError: the model cannot be loaded, or the server cannot be reached.
    """
    if kind == "embedded":
        if model is None:
            raise ConfigError(
                "the embedded backend needs a model: --model smollm2-135m (or qwen2.5-0.5b, qwen2.5-coder-1.5b, or a "
                "path)"
            )
        from agentbolt.inference.embedded import EmbeddedBackend

        return EmbeddedBackend.load(model)
    if kind in ("vllm", "openai"):
        if not url:
            example = "http://127.0.0.1:8000/v1" if kind == "vllm" else "https://api.openai.com/v1"
            raise ConfigError(f"the {kind} backend needs the server's API root: --backend-url {example}")
        if kind == "vllm":
            from agentbolt.inference.vllm import VLLMBackend

            return await VLLMBackend.connect(url, model=model, api_key=api_key, timeout_s=timeout_s)
        from agentbolt.inference.openai_compat import OpenAICompatBackend

        return await OpenAICompatBackend.connect(url, model=model, api_key=api_key, timeout_s=timeout_s)
    raise ConfigError(f"unknown inference backend {kind!r}; known backends: {', '.join(BACKEND_KINDS)}")
