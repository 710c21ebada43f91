"""The runner stops an agent at its rollout's ``timeout_seconds`` and frees the slot at once (issue 22, item 3), and
a rollout whose runner died ends by the default lease (item 2): a real ``agentbolt serve``, real runner processes
(spawned, the agents in forked children), agents that hang in four different ways."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.hanging_agents import hang_sync
from tests.integration.serve_process import start_serve

from agentbolt.client import HttpLightningStore
from agentbolt.runner.isolation import process_isolation_available
from agentbolt.runner.processes import start_runner_processes
from agentbolt.runner.worker import Runner
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import DEFAULT_UNRESPONSIVE_S, AttemptStatus, RolloutConfig, RolloutStatus

TIMEOUT_S = 2.0
SLACK_S = 2.0  # the bound: the slot takes the next rollout within timeout + 2 s

pytestmark = pytest.mark.skipif(not process_isolation_available(), reason="process isolation needs fork (POSIX)")


async def _hang_then_quick(url: str, kinds: list[str]) -> list[tuple[Any, Any, Any]]:
    """Enqueue, for each kind, a hanging rollout (timeout 2 s) and a quick one; wait for all; return
    ``(hanging rollout, its attempt, the quick rollout after it)`` per kind."""
    store = HttpLightningStore(url)
    try:
        config = RolloutConfig(timeout_seconds=TIMEOUT_S, max_attempts=1)
        pairs = []
        for kind in kinds:
            hanging = await store.enqueue_rollout({"kind": kind}, config=config)
            quick = await store.enqueue_rollout({"kind": "quick"}, config=config)
            pairs.append((hanging.rollout_id, quick.rollout_id))
        ids = [rid for pair in pairs for rid in pair]
        done = await store.wait_for_rollouts(ids, timeout_s=30 + len(kinds) * (TIMEOUT_S + SLACK_S) * 2)
        assert len(done) == len(ids), [r.status for r in done]
        by_id = {r.rollout_id: r for r in done}
        return [(by_id[h], (await store.query_attempts(h))[-1], by_id[q]) for h, q in pairs]
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("agent", "kinds"),
    [
        ("tests.integration.hanging_agents:hang_sync", ["sleep", "regex", "tool"]),
        ("tests.integration.hanging_agents:hang_async", ["async"]),
    ],
    ids=["sync", "async"],
)
def test_a_hung_agent_is_stopped_at_its_timeout_and_its_slot_freed(agent: str, kinds: list[str]) -> None:
    serve, url = start_serve("--store", "memory://", "--port", "0")
    pool = start_runner_processes(agent, url, n_processes=1, concurrency=1, instrument=False)
    try:
        results = asyncio.run(_hang_then_quick(url, kinds))
    finally:
        pool.stop()
        serve.terminate()
        serve.wait(10)
    # read from the runner's own address space (a runner imports no torch), not charged its parent's size
    peak = pool.peak_rss_mb["agentbolt-runner-0"]
    assert peak is not None and 20 < peak < 1024, pool.peak_rss_mb
    for kind, (hanging, attempt, quick) in zip(kinds, results, strict=True):
        assert hanging.status == RolloutStatus.FAILED, kind
        assert attempt.status == AttemptStatus.TIMEOUT, (kind, attempt)
        assert attempt.error is not None and attempt.error["type"] == "timeout", (kind, attempt.error)
        assert quick.status == RolloutStatus.SUCCEEDED and quick.final_reward == 1.0, (kind, quick)
        # one slot: the quick rollout could start only once the hung one's slot was free
        waited = quick.start_time - hanging.start_time
        assert waited <= TIMEOUT_S + SLACK_S, f"{kind}: the next rollout started {waited:.1f} s after the hung one"


def test_thread_isolation_abandons_the_hung_agent_and_frees_the_slot() -> None:
    async def main() -> tuple[Any, Any, Any]:
        store = InMemoryLightningStore()
        config = RolloutConfig(timeout_seconds=1.0, max_attempts=1)
        hanging = await store.enqueue_rollout({"kind": "sleep"}, config=config)
        quick = await store.enqueue_rollout({"kind": "quick"}, config=config)
        runner = Runner(agentbolt_agent(), store, concurrency=1, instrument=False, isolation="thread")
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        done = await store.wait_for_rollouts([hanging.rollout_id, quick.rollout_id], timeout_s=20)
        stop.set()
        await task
        attempt = (await store.query_attempts(hanging.rollout_id))[-1]
        await store.close()
        return done, attempt, runner.stats

    done, attempt, stats = asyncio.run(main())
    assert [r.status for r in done] == [RolloutStatus.FAILED, RolloutStatus.SUCCEEDED]
    assert attempt.status == AttemptStatus.TIMEOUT and attempt.error["type"] == "timeout"
    # the runner's report or the store's own lease check, whichever came first; the runner counted it either way
    assert done[1].start_time - done[0].start_time <= 1.0 + SLACK_S
    assert stats.timed_out == 1 and stats.succeeded == 1


def agentbolt_agent() -> Any:
    from agentbolt.runner.agent import rollout

    return rollout(hang_sync)


def test_a_rollout_without_a_config_ends_when_its_runner_dies() -> None:
    """``POST /v1/rollouts`` with only an input gets the default lease; the runner that claimed it is SIGKILLed while
    the agent hangs; the store marks the attempt unresponsive within the lease, and the rollout ends."""
    serve, url = start_serve("--store", "memory://", "--port", "0")
    pool = None
    try:
        created = httpx.post(f"{url}/v1/rollouts", json={"input": {"kind": "sleep"}}, timeout=10).json()
        assert created["config"]["unresponsive_seconds"] == DEFAULT_UNRESPONSIVE_S
        rollout_id = created["rollout_id"]
        pool = start_runner_processes(
            "tests.integration.hanging_agents:hang_sync", url, n_processes=1, concurrency=1, instrument=False
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if httpx.get(f"{url}/v1/rollouts/{rollout_id}", timeout=10).json()["status"] == "running":
                break
            time.sleep(0.2)
        else:
            raise AssertionError("no runner started the rollout")
        pid = pool.processes[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the runner dies: no more heartbeats, no report
        killed_at = time.monotonic()
        while time.monotonic() < killed_at + DEFAULT_UNRESPONSIVE_S + 15:
            rollout = httpx.get(f"{url}/v1/rollouts/{rollout_id}", timeout=10).json()
            if rollout["status"] in ("failed", "succeeded", "cancelled"):
                break
            time.sleep(0.5)
        ended_after = time.monotonic() - killed_at
        assert rollout["status"] == "failed", rollout
        attempts = httpx.get(f"{url}/v1/rollouts/{rollout_id}/attempts", timeout=10).json()
        assert attempts[-1]["status"] == "unresponsive"
        assert ended_after <= DEFAULT_UNRESPONSIVE_S + 5, ended_after
    finally:
        if pool is not None:
            pool.stop(timeout_s=2)
        serve.terminate()
        serve.wait(10)


def test_a_runner_outlives_a_server_restart_and_reports_across_it(tmp_path: Path) -> None:
    """The server is SIGKILLed while an agent runs and restarted on the same file and port: the runner keeps going,
    reports the attempt's success once the server is back (not as the agent's failure), and claims the next one."""
    db = tmp_path / "store.db"
    serve, url = start_serve("--store", f"sqlite:///{db}", "--create", "--port", "0")
    port = url.rsplit(":", 1)[1]
    pool = start_runner_processes(  # two slots: the idle one keeps claiming while the server is down
        "tests.integration.hanging_agents:hang_sync", url, n_processes=1, concurrency=2, instrument=False
    )
    try:
        first = httpx.post(f"{url}/v1/rollouts", json={"input": {"kind": "slow"}}, timeout=10).json()["rollout_id"]
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/v1/rollouts/{first}", timeout=10).json()["status"] != "running":
            assert time.monotonic() < deadline, "no runner started the rollout"
            time.sleep(0.1)
        serve.kill()  # mid-attempt: the agent sleeps 4 s
        serve.wait(10)
        time.sleep(1.0)
        serve, url = start_serve("--store", f"sqlite:///{db}", "--port", port)
        second = httpx.post(f"{url}/v1/rollouts", json={"input": {"kind": "quick"}}, timeout=10).json()["rollout_id"]
        deadline = time.monotonic() + 60
        while True:
            rollouts = [httpx.get(f"{url}/v1/rollouts/{rid}", timeout=10).json() for rid in (first, second)]
            if all(r["status"] in ("succeeded", "failed", "cancelled") for r in rollouts):
                break
            assert time.monotonic() < deadline, rollouts
            time.sleep(0.2)
        assert [(r["status"], r["final_reward"]) for r in rollouts] == [("succeeded", 1.0), ("succeeded", 1.0)]
        assert pool.alive() == 1  # the runner never exited
    finally:
        pool.stop(timeout_s=5)
        serve.terminate()
        serve.wait(10)
