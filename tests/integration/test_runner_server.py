"""Runner <-> real server on 127.0.0.1 <-> SQLite store, with agents that need no model.

Checks the runner's contract: rewards emitted by the agent land as spans in order, a returned float is the final
reward, an exception fails the attempt with the error recorded, and workers heartbeat.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentbolt import emit_reward, rollout, semconv
from agentbolt.client import HttpLightningStore
from agentbolt.errors import NotFoundError
from agentbolt.runner.worker import Runner
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import LLM, AttemptStatus, RolloutStatus


@rollout
def scoring_agent(task: dict, llm: LLM) -> float | None:
    """Emits two named rewards; returns a float unless told to only emit."""
    assert "/v1/rollouts/" in llm.endpoint and llm.endpoint.endswith("/v1")
    emit_reward(0.25, name="format")
    emit_reward(task["x"] * 0.5, name="partial")
    if task.get("raise"):
        raise ValueError(f"bad task {task['x']}")
    if task.get("emit_only"):
        emit_reward(7.0)
        return None
    return float(task["x"])


async def _run(tmp_path: Path, tasks: list[dict]) -> tuple[list, SqliteLightningStore, dict]:
    store = SqliteLightningStore(tmp_path / "store.db")
    await store.add_resources({"llm": LLM(endpoint="http://127.0.0.1:1", model="m")})
    async with serve_in_background(create_app(store)) as url:
        client = HttpLightningStore(url)
        rollouts = [await client.enqueue_rollout(t) for t in tasks]
        runner = Runner(scoring_agent, client, worker_id="w-test", concurrency=2, heartbeat_interval_s=0.1)
        stop = asyncio.Event()
        run_task = asyncio.create_task(runner.run(stop=stop))
        done = await client.wait_for_rollouts([r.rollout_id for r in rollouts], timeout_s=30)
        await asyncio.sleep(0.3)  # let at least one heartbeat go out
        stop.set()
        await run_task
        workers = {w.worker_id: w for w in await client.query_workers()}
        await client.close()
    return done, store, workers


def test_runner_records_rewards_and_outcomes(tmp_path: Path) -> None:
    async def main() -> None:
        tasks = [{"x": 1}, {"x": 2, "raise": True}, {"x": 3, "emit_only": True}]
        done, store, workers = await _run(tmp_path, tasks)
        try:
            assert [r.status for r in done] == [RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.SUCCEEDED]
            ok, failed, emit_only = done
            assert ok.final_reward == 1.0
            assert emit_only.final_reward == 7.0  # the last unnamed emit_reward

            spans = await store.query_spans(ok.rollout_id)
            assert [s.sequence_id for s in spans] == [1, 2, 3]
            assert [s.attributes.get(semconv.REWARD_NAME) for s in spans] == ["format", "partial", None]
            assert [s.attributes[semconv.REWARD_VALUE] for s in spans] == [0.25, 0.5, 1.0]

            attempts = await store.query_attempts(failed.rollout_id)
            assert attempts[-1].status is AttemptStatus.FAILED
            assert attempts[-1].error is not None
            assert attempts[-1].error["type"] == "ValueError" and "bad task 2" in attempts[-1].error["message"]
            fspans = await store.query_spans(failed.rollout_id)
            assert fspans[-1].name == semconv.SPAN_EXCEPTION

            assert "w-test" in workers
        finally:
            await store.close()

    asyncio.run(main())


def test_http_errors_map_to_exceptions(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "s.db")
        async with serve_in_background(create_app(store)) as url:
            client = HttpLightningStore(url)
            with pytest.raises(NotFoundError, match="ro-missing"):
                await client.get_rollout("ro-missing")
            await client.close()
        await store.close()

    asyncio.run(main())
