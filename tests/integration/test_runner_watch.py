"""A job whose runner processes all die fails with a clear error instead of waiting forever: the real embedded model
(SmolLM2-135M), SQLite store, server and a spawned runner process, killed with SIGKILL as the OS would."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from agentbolt.errors import BackendError
from agentbolt.trainer.local import local_serving

REPO = Path(__file__).resolve().parents[2]


def test_a_killed_runner_pool_cancels_the_job_with_backend_error(
    smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # examples.* import from the repository root (runner processes inherit sys.path)
    waited: list[float] = []

    async def job() -> None:
        async with local_serving(
            model=smollm2_dir,
            db_path=tmp_path / "store.db",
            agent="examples.room_agent.agent:room_agent",
            runner_processes=1,
            runner_concurrency=1,
        ):
            runners = [p for p in multiprocessing.active_children() if p.name == "agentbolt-runner-0"]
            assert len(runners) == 1 and runners[0].pid is not None
            os.kill(runners[0].pid, signal.SIGKILL)
            started = time.monotonic()
            try:
                await asyncio.sleep(60)  # a job waiting on rollouts that no runner will ever run
            finally:
                waited.append(time.monotonic() - started)

    with pytest.raises(BackendError, match=r"every runner process exited \(exit codes -9\)"):
        asyncio.run(job())
    assert waited and waited[0] < 10
    assert (tmp_path / "store.db").exists()
