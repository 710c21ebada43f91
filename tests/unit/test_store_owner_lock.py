"""A store file is never moved or removed while another process has it open (``store/sqlite_lock.py``), and
``--overwrite`` moves a previous run's files aside instead of deleting them (``trainer/local.py``)."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agentbolt.errors import ConfigError
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.store.sqlite_lock import exclusive_store, lock_path
from agentbolt.trainer.local import discard_unused_store, fresh_db_path
from agentbolt.types import AttemptStatus, RolloutStatus


async def _store_with_rollouts(db: Path, n: int, *, end: bool = False) -> None:
    store = SqliteLightningStore(db)
    try:
        for i in range(n):
            rollout = await store.enqueue_rollout({"i": i})
            if end:
                await store.cancel_rollout(rollout.rollout_id)
    finally:
        await store.close()


def _rollouts(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0]


def test_a_store_open_in_another_process_is_refused_with_its_pid(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    asyncio.run(_store_with_rollouts(db, 2))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import asyncio, sys\n"
            "from agentbolt.store.sqlite import SqliteLightningStore\n"
            "async def main():\n"
            "    store = SqliteLightningStore(sys.argv[1])\n"
            "    await store.query_workers()\n"
            "    print('open', flush=True)\n"
            "    sys.stdin.readline()\n"
            "    await store.close()\n"
            "asyncio.run(main())\n",
            str(db),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        with pytest.raises(ConfigError, match=f"open in another process \\(pid {holder.pid}: .*SqliteLightningStore"):
            fresh_db_path(tmp_path, overwrite=True)
        assert not discard_unused_store(db)  # never under a live process, whatever the store holds
        assert _rollouts(db) == 2 and not list(tmp_path.glob(".overwritten-*"))
    finally:
        holder.communicate("\n", timeout=30)
    fresh_db_path(tmp_path, overwrite=True)  # the holder closed the store: its lock is gone
    assert not db.exists()


def test_the_lock_is_released_when_the_holder_is_killed(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import asyncio, sys, time\n"
            "from agentbolt.store.sqlite import SqliteLightningStore\n"
            "asyncio.run(SqliteLightningStore(sys.argv[1]).query_workers())\n"
            "print('open', flush=True)\n"
            "time.sleep(60)\n",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "open\n"
    with pytest.raises(ConfigError, match="open in another process"), exclusive_store(db, action="test"):
        pass
    holder.kill()
    holder.wait()
    with exclusive_store(db, action="test"):
        pass
    assert lock_path(db).name == ".store.db.lock"


def test_overwrite_moves_the_previous_run_aside(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "store.db"
    asyncio.run(_store_with_rollouts(db, 3))
    (tmp_path / "checkpoints" / "step-1").mkdir(parents=True)
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(ConfigError, match="already exists; pass --resume"):
        fresh_db_path(tmp_path, overwrite=False)
    assert fresh_db_path(tmp_path, overwrite=True) == db
    (moved,) = tmp_path.glob(".overwritten-*")
    assert _rollouts(moved / "store.db") == 3
    assert (moved / "checkpoints" / "step-1").is_dir() and (moved / "summary.json").is_file()
    assert not db.exists() and not (tmp_path / "checkpoints").exists()
    assert f"to {moved}" in " ".join(capsys.readouterr().out.split())


def test_a_store_without_rollouts_blocks_nothing(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    asyncio.run(_store_with_rollouts(db, 0))  # schema only: no record at all, removed
    fresh_db_path(tmp_path, overwrite=False)
    assert not db.exists() and not list(tmp_path.glob(".overwritten-*"))

    async def resources_only() -> None:
        store = SqliteLightningStore(db)
        await store.add_resources({})
        await store.close()

    asyncio.run(resources_only())  # records but no rollout: moved aside, never deleted
    fresh_db_path(tmp_path, overwrite=False)
    (moved,) = tmp_path.glob(".overwritten-*")
    assert (moved / "store.db").is_file() and not db.exists()


def test_discard_keeps_a_store_where_a_rollout_ended(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    asyncio.run(_store_with_rollouts(db, 2, end=True))  # cancelled: ended without a result
    assert discard_unused_store(db) and not db.exists()

    async def one_succeeded() -> None:
        store = SqliteLightningStore(db)
        await store.enqueue_rollout({"i": 0})
        claimed = await store.claim_rollout("w")
        assert claimed is not None
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        await store.update_attempt(rid, aid, AttemptStatus.RUNNING)
        await store.update_attempt(rid, aid, AttemptStatus.SUCCEEDED, final_reward=1.0)
        assert (await store.get_rollout(rid)).status == RolloutStatus.SUCCEEDED
        await store.close()

    asyncio.run(one_succeeded())
    assert not discard_unused_store(db) and _rollouts(db) == 1
