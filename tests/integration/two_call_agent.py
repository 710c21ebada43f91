"""An agent for ``test_trained_record.py``: two chat calls per rollout (the second continues the first's conversation)
and a reward that depends on what was generated, so the rollouts of a group score differently and every reward is
above 0 (``discounted`` credit then gives the two calls different rewards). Imported by runner processes as
``tests.integration.two_call_agent:two_call_agent`` (the repository root is on their ``sys.path``)."""

from __future__ import annotations

from typing import Any

from openai import OpenAI

from agentbolt import LLM, rollout


@rollout
def two_call_agent(task: dict[str, Any], llm: LLM) -> float:
    """Ask ``task["question"]``, then ask to say it again; reward ``0.1 + (characters generated mod 7) / 6``."""
    sampling = {k: llm.sampling_parameters[k] for k in ("temperature", "max_tokens") if k in llm.sampling_parameters}
    client = OpenAI(base_url=llm.endpoint, api_key="agentbolt", max_retries=0)
    try:
        messages: list[Any] = [{"role": "user", "content": task["question"]}]
        first = client.chat.completions.create(model=llm.model, messages=messages, **sampling)
        text = first.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Say it again."}]
        second = client.chat.completions.create(model=llm.model, messages=messages, **sampling)
        text += second.choices[0].message.content or ""
    finally:
        client.close()
    return 0.1 + (len(text) % 7) / 6
