"""SQLite-only guarantees: durability across reopen, several store objects and processes on one file, the schema."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbolt.errors import AgentboltError, ConfigError
from agentbolt.store import EnqueueRequest, SqliteLightningStore
from agentbolt.store import sqlite_schema as schema
from agentbolt.types import LLM, AttemptStatus, Metric, RolloutConfig, RolloutStatus, Span


def _span(rollout_id: str, attempt_id: str, name: str) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        span_id="00f067aa0ba902b7",
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        name=name,
        start_time=time.time(),
        attributes={"prompt_token_ids": [1, 2, 3], "nested": {"a": None}},
    )


def test_reopening_the_file_sees_everything(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "store.db"

    async def write() -> tuple[str, str]:
        store = SqliteLightningStore(path)
        await store.add_resources({"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")})
        done, waiting = await store.enqueue_many([EnqueueRequest(input={"q": 1}), EnqueueRequest(input={"q": 2})])
        claimed = await store.claim_rollout("w-1")
        assert claimed is not None
        await store.add_spans([_span(done.rollout_id, claimed.attempt.attempt_id, n) for n in ("a", "b")])
        await store.update_attempt(done.rollout_id, claimed.attempt.attempt_id, AttemptStatus.SUCCEEDED, final_reward=1)
        await store.add_metrics([Metric(name="loss", train_step=1, value=0.5, time=time.time())])
        await store.close()
        return done.rollout_id, waiting.rollout_id

    async def read(done_id: str, waiting_id: str) -> None:
        store = SqliteLightningStore(path)
        try:
            done = await store.get_rollout(done_id)
            assert done.status is RolloutStatus.SUCCEEDED and done.final_reward == 1.0 and done.input == {"q": 1}
            [attempt] = await store.query_attempts(done_id)
            assert attempt.status is AttemptStatus.SUCCEEDED and attempt.resources_id == "rs-1"
            spans = await store.query_spans(done_id)
            assert [(s.name, s.sequence_id) for s in spans] == [("a", 1), ("b", 2)]
            assert spans[0].attributes == {"prompt_token_ids": [1, 2, 3], "nested": {"a": None}}
            latest = await store.get_resources()
            assert latest is not None and latest.resources_id == "rs-1"
            assert [w.worker_id for w in await store.query_workers()] == ["w-1"]
            assert [m.value for m in await store.query_metrics("loss")] == [0.5]
            newer = await store.enqueue_rollout({"q": 3})
            assert [r.rollout_id for r in await store.query_rollouts()][-1] == newer.rollout_id
            claimed = await store.claim_rollout("w-2")
            assert claimed is not None and claimed.rollout.rollout_id == waiting_id
            assert (await store.add_resources({})).resources_id == "rs-2"
        finally:
            await store.close()

    ids = asyncio.run(write())
    asyncio.run(read(*ids))


def test_two_store_objects_on_one_file_never_share_a_claim(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "shared.db"
        first, second = SqliteLightningStore(path), SqliteLightningStore(path)
        try:
            await first.enqueue_many([EnqueueRequest(input=i) for i in range(20)])
            claims = [store.claim_rollout(f"w-{i}") for i in range(20) for store in (first, second)]
            results = [r for r in await asyncio.gather(*claims) if r is not None]
            assert sorted(r.rollout.input for r in results) == list(range(20))
            # a rollout finished through one object is seen (and waited for) through the other
            rollout_id = results[0].rollout.rollout_id
            await second.update_attempt(rollout_id, results[0].attempt.attempt_id, AttemptStatus.SUCCEEDED)
            [seen] = await first.wait_for_rollouts([rollout_id], timeout_s=2)
            assert seen.status is RolloutStatus.SUCCEEDED
        finally:
            await first.close()
            await second.close()

    asyncio.run(main())


_CLAIMER = """
import asyncio, sys
from agentbolt.store import SqliteLightningStore

async def main():
    store = SqliteLightningStore(sys.argv[1])
    got = []
    while (claimed := await store.claim_rollout(sys.argv[2])) is not None:
        got.append(claimed.rollout.rollout_id)
    await store.close()
    print(" ".join(got))

asyncio.run(main())
"""


def test_two_processes_never_share_a_claim(tmp_path: Path) -> None:
    path = tmp_path / "procs.db"

    async def enqueue() -> list[str]:
        store = SqliteLightningStore(path)
        rollouts = await store.enqueue_many([EnqueueRequest(input=i) for i in range(40)])
        await store.close()
        return [r.rollout_id for r in rollouts]

    ids = asyncio.run(enqueue())
    procs = [
        subprocess.Popen([sys.executable, "-c", _CLAIMER, str(path), f"w-{i}"], stdout=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    claimed = [rollout_id for out in outputs for rollout_id in out.split()]
    assert sorted(claimed) == sorted(ids)  # every rollout claimed exactly once


def test_schema_matches_tables_and_is_applied_once(tmp_path: Path) -> None:
    path = tmp_path / "schema.db"

    async def open_and_close(synchronous: str = "normal") -> int:
        store = SqliteLightningStore(path, synchronous=synchronous)
        await store.query_rollouts()
        level = await store._run(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0])
        await store.close()
        return level

    assert asyncio.run(open_and_close()) == 1  # NORMAL (WAL: survives a process crash)
    assert asyncio.run(open_and_close("full")) == 2  # FULL: one fsync per commit
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        applied = conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        assert applied == [(m.version,) for m in schema.MIGRATIONS]  # each applied once, in order
        for table in schema.TABLES:
            columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table.name})")}
            assert set(table.columns) <= columns, f"{table.name} lacks {set(table.columns) - columns}"
        conn.execute("INSERT INTO schema_version (version, applied_time) VALUES (999, 0)")
        conn.commit()
    finally:
        conn.close()

    with pytest.raises(ConfigError, match="schema version 999"):
        asyncio.run(open_and_close())


def test_input_that_is_not_json_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "s.db")
        try:
            with pytest.raises(ConfigError, match="JSON"):
                await store.enqueue_rollout(object())
            assert await store.query_rollouts() == []
        finally:
            await store.close()

    asyncio.run(main())


def test_closed_store_refuses_calls_and_rejects_bad_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="poll_interval_s"):
        SqliteLightningStore(tmp_path / "s.db", poll_interval_s=0)

    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "s.db", sweep_interval_s=0.01)
        await store.enqueue_rollout("x", config=RolloutConfig())
        await asyncio.sleep(0.05)  # let the sweeper run a few times
        await store.close()
        await store.close()
        with pytest.raises(AgentboltError, match="closed"):
            await store.query_rollouts()

    asyncio.run(main())


def test_unknown_synchronous_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="synchronous must be one of normal, full"):
        SqliteLightningStore(tmp_path / "s.db", synchronous="off")


def test_group_commit_isolates_a_failing_call(tmp_path: Path) -> None:
    """Calls queued together share one COMMIT; one that raises is rolled back alone and the others are stored."""
    path = tmp_path / "group.db"

    async def main() -> None:
        store = SqliteLightningStore(path, synchronous="full")  # full: every call goes to the group-commit thread
        first = await store.enqueue_rollout({"i": -1})
        claimed = await store.claim_rollout("w")
        assert claimed is not None and claimed.rollout.rollout_id == first.rollout_id
        aid = claimed.attempt.attempt_id
        spans = [
            Span(
                rollout_id=first.rollout_id,
                attempt_id=aid,
                span_id=f"{i:016x}",
                trace_id="0" * 32,
                name="s",
                start_time=0.0,
                attributes={"i": i},
            )
            for i in range(20)
        ]
        bad = Span(
            rollout_id=first.rollout_id,
            attempt_id="at-missing",
            span_id="f" * 16,
            trace_id="0" * 32,
            name="bad",
            start_time=0.0,
        )
        calls = [store.enqueue_rollout({"i": i}) for i in range(40)] + [store.add_span(s) for s in spans]
        calls.insert(25, store.add_span(bad))
        results = await asyncio.gather(*calls, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1 and "at-missing" in str(errors[0])
        assert store._writer.batches >= 1  # some calls really were committed together
        await store.close()

        reopened = SqliteLightningStore(path)
        assert len(await reopened.query_rollouts()) == 41
        stored = await reopened.query_spans(first.rollout_id, aid)
        assert [s.attributes["i"] for s in stored] == list(range(20))
        assert [s.sequence_id for s in stored] == list(range(1, 21))
        await reopened.close()

    asyncio.run(main())


def test_normal_mode_runs_inline_and_waits_on_the_thread_when_the_file_is_locked(tmp_path: Path) -> None:
    """synchronous=normal runs calls on the caller's loop; while another connection holds the write lock, a write
    is handed to the writer thread, which waits for the lock instead of failing."""
    path = tmp_path / "inline.db"

    async def main() -> None:
        store = SqliteLightningStore(path)
        await store.enqueue_rollout({"i": 0})
        assert store._inline.connection is not None and store._writer.batches == 0

        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process's write transaction, held for 0.3 s
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, blocker.execute, "COMMIT")
        t0 = time.monotonic()
        rollout = await store.enqueue_rollout({"i": 1})  # must wait for the lock, not fail
        assert time.monotonic() - t0 >= 0.25
        assert [r.rollout_id for r in await store.query_rollouts()][-1] == rollout.rollout_id
        blocker.close()
        await store.close()

    asyncio.run(main())


def test_a_version_1_file_is_migrated_with_its_data(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_time REAL NOT NULL)")
    for statement in schema.MIGRATIONS[0].statements:
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (1, 0)")
    conn.execute("COMMIT")
    conn.close()

    async def fill(version_1_only: bool) -> list[str]:
        store = SqliteLightningStore(path)
        try:
            if version_1_only:  # written through the version-1 indexes by a store that stops after migration 1
                await store.enqueue_many([EnqueueRequest(input=i) for i in range(3)])
                claimed = await store.claim_rollout("w")
                assert claimed is not None
                return [claimed.rollout.rollout_id]
            queued = await store.query_rollouts(status=[RolloutStatus.QUEUING])
            again = await store.claim_rollout("w")  # through the new partial index, in enqueue order
            assert again is not None and again.rollout.rollout_id == queued[0].rollout_id
            return [r.rollout_id for r in queued]
        finally:
            await store.close()

    original = schema.MIGRATIONS
    schema.MIGRATIONS = original[:1]
    try:
        first = asyncio.run(fill(True))
    finally:
        schema.MIGRATIONS = original
    remaining = asyncio.run(fill(False))
    assert len(remaining) == 2 and first[0] not in remaining
    conn = sqlite3.connect(path)
    try:
        indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"rollouts_claimable", "attempts_active"} <= indexes
        assert not {"rollouts_by_status", "attempts_by_status"} & indexes
    finally:
        conn.close()


def test_claims_and_lease_checks_use_the_partial_indexes(tmp_path: Path) -> None:
    from agentbolt.store import sqlite as sqlite_module

    async def plans() -> tuple[str, str]:
        store = SqliteLightningStore(tmp_path / "plan.db")
        try:
            await store.enqueue_rollout("x")

            def explain(conn: sqlite3.Connection) -> tuple[str, str]:
                claim = conn.execute(
                    f"EXPLAIN QUERY PLAN {schema.ROLLOUTS.select()} FROM rollouts {sqlite_module._OLDEST_CLAIMABLE}",
                    (1,),
                ).fetchall()
                lease = conn.execute(
                    f"EXPLAIN QUERY PLAN SELECT attempt_id FROM attempts WHERE status IN ({schema.ACTIVE_SQL})"
                ).fetchall()
                return " ".join(r[-1] for r in claim), " ".join(r[-1] for r in lease)

            return await store._run(explain)
        finally:
            await store.close()

    claim_plan, lease_plan = asyncio.run(plans())
    assert "rollouts_claimable" in claim_plan and "TEMP B-TREE" not in claim_plan  # no sort of the queue
    assert "attempts_active" in lease_plan


def test_a_stream_of_spans_refreshes_the_heartbeat_at_its_resolution(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "hb.db")
        try:
            rollout = await store.enqueue_rollout("x", config=RolloutConfig(unresponsive_seconds=2.0))
            claimed = await store.claim_rollout("w")
            assert claimed is not None
            ids = (rollout.rollout_id, claimed.attempt.attempt_id)

            def span(i: int) -> Span:
                return Span(
                    rollout_id=ids[0],
                    attempt_id=ids[1],
                    span_id=f"{i:016x}",
                    trace_id="0" * 32,
                    name="s",
                    start_time=0.0,
                )

            await store.add_span(span(0))  # the first span of a claimed attempt always beats (no heartbeat yet)
            first = (await store.get_attempt(*ids)).last_heartbeat_time
            assert first is not None
            await store.add_span(span(1))  # 5% of 2 s = 0.1 s have not passed: nothing written
            assert (await store.get_attempt(*ids)).last_heartbeat_time == first
            await asyncio.sleep(0.12)
            await store.add_span(span(2))
            later = (await store.get_attempt(*ids)).last_heartbeat_time
            assert later is not None and later >= first + 0.1
            assert [s.sequence_id for s in await store.query_spans(ids[0])] == [1, 2, 3]
        finally:
            await store.close()

    asyncio.run(main())
