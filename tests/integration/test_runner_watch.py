"""A job whose runner processes all die fails with a clear error instead of waiting forever: the real embedded model
(SmolLM2-135M), SQLite store, server and a spawned runner process, killed with SIGKILL as the OS would."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from agentbolt.errors import BackendError
from agentbolt.trainer.local import LocalMachine, RunnersExited, local_serving

REPO = Path(__file__).resolve().parents[2]


def test_a_killed_runner_pool_cancels_the_job_with_backend_error(
    smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # examples.* import from the repository root (runner processes inherit sys.path)
    waited: list[float] = []
    exits: list[dict[str, object]] = []

    async def job() -> None:
        machine = LocalMachine(
            model=smollm2_dir, agent="examples.room_agent.agent:room_agent", runner_processes=2, runner_concurrency=1
        )
        async with local_serving(machine, db_path=tmp_path / "store.db") as serving:
            runners = sorted(
                (p for p in multiprocessing.active_children() if p.name.startswith("agentbolt-runner-")),
                key=lambda p: p.name,
            )
            assert len(runners) == 2 and all(p.pid is not None for p in runners)
            os.kill(runners[0].pid or 0, signal.SIGKILL)  # one dies (out of memory, say): the job goes on, named
            deadline = time.monotonic() + 10
            while not serving.runner_exits and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            exits.extend(serving.runner_exits)
            os.kill(runners[1].pid or 0, signal.SIGKILL)  # the last one dies: the job fails
            started = time.monotonic()
            try:
                await asyncio.sleep(60)  # a job waiting on rollouts that no runner will ever run
            finally:
                waited.append(time.monotonic() - started)

    with pytest.raises(RunnersExited, match=r"every runner process exited \(exit codes -9, -9\)"):
        asyncio.run(job())
    assert exits == [{"runner": "agentbolt-runner-0", "exit_code": -9, "runners_left": 1}]
    assert RunnersExited.exit_code == 1 and issubclass(RunnersExited, BackendError)
    assert waited and waited[0] < 10
    assert (tmp_path / "store.db").exists()


def test_a_second_model_loads_while_the_event_loop_keeps_answering(
    smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """model_serving loads in a worker thread: a job's server on the same loop answers its runners meanwhile (a first
    use of the 1.5B optimizer converts its GGUF for over a minute; a blocked loop made the runners time out)."""
    import agentbolt.trainer.local as local

    window: list[float] = []
    real_load = local.load_embedded

    def timed_load(*args: Any, **kwargs: Any) -> Any:  # the real loader, with its start and end recorded
        window.append(time.monotonic())
        try:
            return real_load(*args, **kwargs)
        finally:
            window.append(time.monotonic())

    monkeypatch.setattr(local, "load_embedded", timed_load)

    async def job() -> list[float]:
        beats: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                beats.append(time.monotonic())
                await asyncio.sleep(0.005)

        ticking = asyncio.create_task(ticker())
        async with local.model_serving(model=smollm2_dir) as served:
            assert served.url.startswith("http://127.0.0.1:")
        stop.set()
        await ticking
        return beats

    beats = asyncio.run(job())
    start, end = window
    during = [beat for beat in beats if start < beat < end]
    # A load run on the loop itself leaves no beat inside its window; in a thread the loop beats all along.
    assert end - start > 0.1
    assert len(during) >= 5, f"the event loop beat {len(during)} times during a {end - start:.2f} s load"
