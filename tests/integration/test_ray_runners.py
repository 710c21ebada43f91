"""Runner fan-out on Ray: ``RayRunnerPool`` and ``agentbolt run --ray-runners`` against a real server on 127.0.0.1
(SQLite store file), on one small local Ray (2 CPUs, no dashboard), with an agent that needs no model.

Pinned: the actors import the agent from a folder on ``python_path``, share the queue (12 rollouts end succeeded,
each with its reward spans, run by at least two actors), stop cleanly with summed counters; a bad agent reference,
an unreachable server and a missing Ray each fail ``start`` with a clear error; the CLI fans out and exits after
``--exit-after`` attempts per runner.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from agentbolt import semconv  # noqa: E402
from agentbolt.client import HttpLightningStore  # noqa: E402
from agentbolt.errors import BackendError, ConfigError  # noqa: E402
from agentbolt.runner.ray_runners import RayRunnerPool  # noqa: E402
from agentbolt.server.app import create_app  # noqa: E402
from agentbolt.server.serving import serve_in_background  # noqa: E402
from agentbolt.store.sqlite import SqliteLightningStore  # noqa: E402
from agentbolt.types import RolloutStatus  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
HERE = str(Path(__file__).resolve().parent)
AGENT = "ray_agents:tagging_agent"  # tests/integration/ray_agents.py


@pytest.fixture(scope="module")
def local_ray() -> Iterator[str]:
    """A small local Ray for this module; yields its GCS address (for ``--ray-address``)."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 1024 * 1024,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def test_pool_fans_out_rollouts_over_actors(tmp_path: Path, local_ray: str) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            async with serve_in_background(create_app(store)) as url:
                client = HttpLightningStore(url)
                pool = RayRunnerPool(AGENT, url, runners=2, concurrency=2, python_path=[HERE], instrument=False)
                await asyncio.to_thread(pool.start)
                try:
                    rollouts = [await client.enqueue_rollout({"x": x}) for x in range(12)]
                    done = await client.wait_for_rollouts([r.rollout_id for r in rollouts], timeout_s=40)
                    assert [r.status for r in done] == [RolloutStatus.SUCCEEDED] * 12
                    assert [r.final_reward for r in done] == [float(x) for x in range(12)]
                    live = await asyncio.to_thread(pool.stats)
                    assert live.succeeded == 12
                    with pytest.raises(TimeoutError):  # no exit_after: the runners wait for more work
                        await asyncio.to_thread(pool.wait, 0.3)
                finally:
                    stats = await asyncio.to_thread(pool.stop)
                assert (stats.succeeded, stats.failed, stats.spans_written) == (12, 0, 24)
                assert pool.stats() == stats == pool.wait() and pool.done()

                ran_by = set()
                for r in done:
                    spans = await store.query_spans(r.rollout_id)
                    assert [s.attributes.get(semconv.REWARD_NAME) for s in spans] == ["partial", None]
                    assert [s.attributes[semconv.REWARD_VALUE] for s in spans] == [0.5, r.final_reward]
                    ran_by |= {a.worker_id for a in await store.query_attempts(r.rollout_id)}
                assert ran_by <= set(pool.worker_ids) and len(ran_by) >= 2, ran_by
                assert all(w.startswith("ray-") for w in pool.worker_ids)
                await client.close()
        finally:
            await store.close()

    asyncio.run(main())


def test_pool_start_fails_clearly(tmp_path: Path, local_ray: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="runners must be >= 1"):
        RayRunnerPool(AGENT, "http://127.0.0.1:1", runners=0)
    with pytest.raises(ConfigError, match="exit_after must be >= 1"):
        RayRunnerPool(AGENT, "http://127.0.0.1:1", exit_after=0)

    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            async with serve_in_background(create_app(store)) as url:
                for agent, message in [
                    ("no_such_module:agent", "cannot import agent module 'no_such_module'"),
                    ("ray_agents:no_such_agent", "has no attribute 'no_such_agent'"),
                ]:
                    pool = RayRunnerPool(agent, url, runners=1, python_path=[HERE], instrument=False)
                    with pytest.raises(ConfigError, match=message):
                        await asyncio.to_thread(pool.start)
        finally:
            await store.close()

    asyncio.run(main())
    unreachable = RayRunnerPool(AGENT, "http://127.0.0.1:1", runners=1, python_path=[HERE], instrument=False)
    with pytest.raises(BackendError, match="cannot reach the agentbolt server at http://127.0.0.1:1"):
        unreachable.start()
    assert ray.is_initialized()  # the pool did not start Ray, so it leaves it running

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ConfigError, match=r"pip install 'agentbolt\[ray\]'"):
        RayRunnerPool(AGENT, "http://127.0.0.1:1", runners=1).start()


def test_cli_run_fans_out_on_ray(tmp_path: Path, local_ray: str) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            async with serve_in_background(create_app(store)) as url:
                client = HttpLightningStore(url)
                for x in range(4):
                    await client.enqueue_rollout({"x": x})
                cmd = [
                    sys.executable,
                    "-m",
                    "agentbolt.cli.main",
                    "run",
                    "--agent",
                    AGENT,
                    "--app-dir",
                    HERE,
                    "--store",
                    url,
                    "--ray-runners",
                    "2",
                    "--ray-address",
                    local_ray,
                    "--exit-after",
                    "1",
                    "--no-instrument",
                ]
                proc = await asyncio.create_subprocess_exec(
                    *cmd, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
                )
                out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
                assert proc.returncode == 0, out.decode()
                # each runner exits after its own first attempt: 2 of the 4 rollouts ran
                assert "2 Ray runners stopped: 2 succeeded, 0 failed" in out.decode(), out.decode()
                ended = await client.query_rollouts(status=[RolloutStatus.SUCCEEDED])
                assert len(ended) == 2
                workers = {a.worker_id for r in ended for a in await client.query_attempts(r.rollout_id)}
                assert len(workers) == 2 and all(w.startswith("ray-") for w in workers)
                await client.close()
        finally:
            await store.close()

    asyncio.run(main())
    bad = subprocess.run(
        [sys.executable, "-m", "agentbolt.cli.main", "run", "--agent", AGENT, "--ray-address", "auto"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--ray-address needs --ray-runners N" in bad.stdout + bad.stderr
