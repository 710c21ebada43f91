"""``agentbolt run``: a runner process against a real server on 127.0.0.1, with an agent that needs no model.

Pinned: it imports the agent by ``module:attribute`` from the current folder, runs the queued rollouts (the returned
float is the final reward), exits by itself after ``--exit-after`` attempts, stops cleanly on SIGTERM, and refuses
bad options with exit code 2.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentbolt import emit_reward, rollout
from agentbolt.client import HttpLightningStore
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import LLM, RolloutStatus

REPO = Path(__file__).resolve().parents[2]
AGENT = "tests.integration.test_cli_run:doubling_agent"


@rollout
def doubling_agent(task: dict, llm: LLM) -> float:
    assert "/v1/rollouts/" in llm.endpoint
    emit_reward(0.5, name="partial")
    return 2.0 * task["x"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentbolt.cli.main", "run", *args]


def test_run_serves_rollouts_then_exits(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        await store.add_resources({"llm": LLM(endpoint="http://127.0.0.1:1", model="m")})
        try:
            async with serve_in_background(create_app(store)) as url:
                client = HttpLightningStore(url)
                rollouts = [await client.enqueue_rollout({"x": x}) for x in (1, 2)]
                cmd = _cli("--store", url, "--agent", AGENT, "--exit-after", "2", "--worker-id", "cli-runner")
                proc = await asyncio.create_subprocess_exec(
                    *cmd, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
                )
                out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
                assert proc.returncode == 0, out.decode()
                assert "2 succeeded, 0 failed" in out.decode()
                done = await client.wait_for_rollouts([r.rollout_id for r in rollouts], timeout_s=10)
                assert [r.status for r in done] == [RolloutStatus.SUCCEEDED] * 2
                assert [r.final_reward for r in done] == [2.0, 4.0]
                assert "cli-runner" in {w.worker_id for w in await client.query_workers()}

                # no --exit-after: runs until SIGTERM, then stops cleanly
                idle = subprocess.Popen(
                    _cli("--store", url, "--agent", AGENT, "--no-instrument"),
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env={**os.environ, "COLUMNS": "200"},
                )
                assert idle.stdout is not None
                started = await asyncio.to_thread(idle.stdout.readline)
                assert "running tests.integration.test_cli_run:doubling_agent" in started
                time.sleep(0.3)
                idle.send_signal(signal.SIGTERM)
                rest, _ = await asyncio.to_thread(idle.communicate, timeout=30)
                assert idle.returncode == 0 and "0 succeeded, 0 failed" in rest
                await client.close()
        finally:
            await store.close()

    asyncio.run(main())


def test_run_refuses_bad_options() -> None:
    for args, message in [
        (["--agent", AGENT, "--exit-after", "0"], "--exit-after must be >= 1"),
        (["--agent", AGENT, "--concurrency", "0"], "--concurrency must be >= 1"),
        (["--agent", AGENT, "--no-instrument", "--instrument", "openai"], "exclude each other"),
        (["--agent", "no_such_module:agent", "--store", "http://127.0.0.1:1"], "cannot import agent module"),
    ]:
        done = subprocess.run(_cli(*args), cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stdout + done.stderr, (args, done.stdout, done.stderr)
