"""Shared commits of the SQLite store's inline path (``agentbolt.store.sqlite_inline``), on a real file.

What must hold: a lone caller commits each call inside the call; tasks calling side by side share commits; a call
that fails in a shared transaction is undone alone; and whatever a call returns is already committed (another
connection sees it).
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from agentbolt.store import SqliteLightningStore
from agentbolt.store.sqlite_inline import SOLO_BATCHES_TO_STOP
from agentbolt.types import Span


def _count(path: Path) -> int:
    """Rollouts visible to another connection (committed ones only)."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0]
    finally:
        conn.close()


def test_a_lone_caller_commits_each_call_inside_it(tmp_path: Path) -> None:
    path = tmp_path / "lone.db"

    async def main() -> None:
        store = SqliteLightningStore(path)
        try:
            for i in range(100):
                await store.enqueue_rollout(i)
                assert _count(path) == i + 1  # committed before the call returned
            assert store._inline.shared_commits == 0
        finally:
            await store.close()

    asyncio.run(main())


def test_side_by_side_tasks_share_commits_and_see_them_done(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"

    async def main() -> None:
        store = SqliteLightningStore(path)
        try:
            await store.enqueue_rollout("first")  # opens the file

            async def producer(p: int) -> None:
                for i in range(50):
                    await store.enqueue_rollout({"p": p, "i": i})
                    # Returned, so committed: another connection sees at least this many of this producer's rows.
                    conn = sqlite3.connect(path)
                    try:
                        (mine,) = conn.execute(
                            "SELECT COUNT(*) FROM rollouts WHERE json_extract(input, '$.p') = ?", (p,)
                        ).fetchone()
                    finally:
                        conn.close()
                    assert mine >= i + 1

            await asyncio.gather(*(producer(p) for p in range(8)))
            inline = store._inline
            assert inline.shared_commits >= 1
            assert inline.shared_calls > inline.shared_commits  # several calls per commit
            assert _count(path) == 1 + 8 * 50
        finally:
            await store.close()

    asyncio.run(main())


def test_a_failing_call_in_a_shared_commit_is_undone_alone(tmp_path: Path) -> None:
    path = tmp_path / "isolated.db"

    async def main() -> None:
        store = SqliteLightningStore(path)
        try:
            await store.enqueue_rollout("x")
            claimed = await store.claim_rollout("w")
            assert claimed is not None
            rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id

            def span(i: int, attempt_id: str) -> Span:
                return Span(
                    rollout_id=rid,
                    attempt_id=attempt_id,
                    span_id=f"{i:016x}",
                    trace_id="0" * 32,
                    name="s",
                    start_time=0.0,
                    attributes={"i": i},
                )

            calls = [store.add_span(span(i, aid)) for i in range(10)]
            calls.insert(5, store.add_span(span(99, "at-missing")))
            calls += [store.enqueue_rollout({"late": i}) for i in range(10)]
            results = await asyncio.gather(*calls, return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            assert len(errors) == 1 and "at-missing" in str(errors[0])
            assert store._inline.shared_calls >= 2
        finally:
            await store.close()

        reopened = SqliteLightningStore(path)
        try:
            stored = await reopened.query_spans(rid, aid)
            assert [s.attributes["i"] for s in stored] == list(range(10))
            assert [s.sequence_id for s in stored] == list(range(1, 11))
            assert len(await reopened.query_rollouts()) == 11
        finally:
            await reopened.close()

    asyncio.run(main())


def test_sharing_stops_when_the_concurrency_stops(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "stops.db")
        try:
            await asyncio.gather(*(store.enqueue_rollout(i) for i in range(20)))
            assert store._inline._sharing
            for i in range(SOLO_BATCHES_TO_STOP + 1):  # one task alone: shared commits of one call, then none
                await store.enqueue_rollout(i)
            assert not store._inline._sharing
            before = store._inline.shared_commits
            for i in range(10):
                await store.enqueue_rollout(i)
            assert store._inline.shared_commits == before
        finally:
            await store.close()

    asyncio.run(main())
