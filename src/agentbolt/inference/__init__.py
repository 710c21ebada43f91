"""Inference backends behind the gateway (contract: :mod:`agentbolt.inference.base`).

- ``embedded`` (:mod:`~agentbolt.inference.embedded`): transformers in this process, CPU or one GPU, batched,
  token-by-token streaming; imports torch, so only the server side imports it, lazily.
- ``vllm`` (:mod:`~agentbolt.inference.vllm`): any vLLM server; exact ids through ``return_token_ids``.
- ``openai`` (:mod:`~agentbolt.inference.openai_compat`): any OpenAI-compatible URL; no ids, not trainable by RL.

:func:`~agentbolt.inference.backends.open_backend` builds one by name.
"""
