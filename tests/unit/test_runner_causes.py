"""The runner names the cause of each failed attempt on ``error["cause"]`` (agentbolt.adapter.causes), whether the
agent runs in a thread or in a forked child process: a real in-memory store and a real runner."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentbolt.runner.agent import rollout
from agentbolt.runner.isolation import process_isolation_available
from agentbolt.runner.worker import Runner
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import LLM


@rollout
def picky(task: dict[str, Any], llm: LLM, calculator: Any) -> Any:  # "calculator" is no resource of the version
    return 1.0


@rollout
def by_task(task: dict[str, Any]) -> Any:
    return {"raise": lambda: 1 / 0, "none": lambda: None, "string": lambda: "1", "nan": lambda: float("nan")}[
        task["do"]
    ]()


ISOLATIONS = ["thread", pytest.param("process", marks=pytest.mark.skipif(not process_isolation_available(), reason=""))]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_each_failed_attempt_names_its_cause(isolation: str) -> None:
    async def run(agent: Any, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        store = InMemoryLightningStore()
        await store.add_resources({"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")})
        ids = [(await store.enqueue_rollout(task)).rollout_id for task in inputs]
        runner = Runner(agent, store, concurrency=1, instrument=False, isolation=isolation)  # type: ignore[arg-type]
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        await store.wait_for_rollouts(ids, timeout_s=30)
        stop.set()
        await task
        errors = [(await store.query_attempts(rid))[-1].error or {} for rid in ids]
        await store.close()
        return errors

    errors = asyncio.run(run(by_task, [{"do": d} for d in ("raise", "none", "string", "nan")]))
    assert [(e["cause"], e["type"]) for e in errors] == [
        ("agent_exception", "ZeroDivisionError"),
        ("no_reward", "no_reward"),
        ("bad_reward", "RewardError"),
        ("bad_reward", "RewardError"),
    ]
    assert "'1' (str) is not a reward" in errors[2]["message"]
    [setup] = asyncio.run(run(picky, [{"q": 1}]))
    assert (setup["cause"], setup["type"]) == ("bad_task", "AgentSetupError")
    assert "needs resource 'calculator'" in setup["message"]
