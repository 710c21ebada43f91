"""A restarted server expires the leases a killed one left behind, before any client calls it."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from agentbolt.store import SqliteLightningStore
from agentbolt.types import RolloutConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_leases_expire_without_any_client_call(tmp_path: Path) -> None:
    path = tmp_path / "store.db"

    async def leave_a_dead_lease() -> None:
        store = SqliteLightningStore(path)
        config = RolloutConfig(unresponsive_seconds=0.5, max_attempts=2)
        await store.enqueue_rollout({"task": 1}, config=config)
        assert await store.claim_rollout("worker-that-dies") is not None
        await store.close()

    asyncio.run(leave_a_dead_lease())
    time.sleep(0.6)  # the lease has run out, but nothing is running to notice
    assert sqlite3.connect(path).execute("SELECT status FROM rollouts").fetchall() == [("preparing",)]

    cmd = [sys.executable, "-m", "agentbolt.cli.main", "serve", "--store", f"sqlite:///{path}"]
    server = subprocess.Popen([*cmd, "--port", str(_free_port())], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        status = None
        while time.monotonic() < deadline:
            with sqlite3.connect(path) as conn:  # read the file directly: no request reaches the server
                (status,) = conn.execute("SELECT status FROM rollouts").fetchone()
            if status != "preparing":
                break
            time.sleep(0.1)
        assert status == "requeuing", f"the dead lease was not expired after startup (status {status})"
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT status FROM attempts").fetchall() == [("unresponsive",)]
    finally:
        server.kill()
        server.wait()
