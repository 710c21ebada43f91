"""One agent that makes, per task, one of the mistakes new users make (the "mistakes" test of issue 22):
``task["kind"]`` is ``raises``, ``returns_none``, ``returns_string``, ``gateway_root`` (calls the server's root
instead of ``llm.endpoint``: nothing is recorded), ``wrong_port`` (a base URL where nothing listens), ``hangs`` or
``same_reward`` (a correct agent whose reward is the same for every answer: nothing for GRPO to prefer, so no update
moves the weights)."""

from __future__ import annotations

import time
from typing import Any

from openai import OpenAI

from agentbolt.types import LLM


def _ask(base_url: str, llm: LLM) -> None:
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
    client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4)


def broken(task: dict[str, Any], llm: LLM) -> Any:
    kind = task["kind"]
    if kind == "raises":
        raise ValueError("the agent tripped on purpose")
    if kind == "returns_none":
        return None
    if kind == "returns_string":
        return "1"
    if kind == "gateway_root":
        _ask(llm.endpoint.split("/v1/rollouts/")[0] + "/v1", llm)
        return 1.0
    if kind == "wrong_port":
        _ask(f"http://127.0.0.1:{task['port']}/v1", llm)
        return 1.0
    if kind == "same_reward":
        _ask(llm.endpoint, llm)
        return 0.5
    if kind == "hangs":
        time.sleep(10**6)
    raise AssertionError(f"unknown kind {kind!r}")
