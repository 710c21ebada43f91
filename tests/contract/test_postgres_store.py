"""PostgreSQL-only guarantees, against a real server (``postgres_url``: a fresh schema; skipped when no server):
durability across store objects, claims shared by objects and processes (``FOR UPDATE SKIP LOCKED``), the schema,
the background lease sweep, durable commits, and the errors for a bad URL or an unreachable server. (A missing driver:
tests/unit/test_store_urls.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed; run pip install -e '.[postgres]'")

from agentbolt.errors import AgentboltError, BackendError, ConfigError  # noqa: E402
from agentbolt.store import EnqueueRequest, build_store  # noqa: E402
from agentbolt.store import postgres_schema as schema  # noqa: E402
from agentbolt.store.postgres import PostgresLightningStore, redact_url  # noqa: E402
from agentbolt.types import LLM, AttemptStatus, Metric, RolloutConfig, RolloutStatus, Span  # noqa: E402


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


def _rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read the database directly, around the store."""
    with psycopg.connect(url) as conn:
        return conn.execute(query, params).fetchall()  # type: ignore[arg-type]


def test_a_new_store_object_sees_everything(postgres_url: str) -> None:
    async def write() -> tuple[str, str]:
        store = PostgresLightningStore(postgres_url)
        assert store.capabilities.durable and store.capabilities.shared_across_processes
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
        store = PostgresLightningStore(postgres_url)
        try:
            done = await store.get_rollout(done_id)
            assert done.status is RolloutStatus.SUCCEEDED and done.final_reward == 1.0 and done.input == {"q": 1}
            [attempt] = await store.query_attempts(done_id)
            assert attempt.status is AttemptStatus.SUCCEEDED and attempt.resources_id == "rs-1"
            spans = await store.query_spans(done_id)
            assert [(s.name, s.sequence_id) for s in spans] == [("a", 1), ("b", 2)]
            assert spans[0].attributes == {"prompt_token_ids": [1, 2, 3], "nested": {"a": None}}
            assert [w.worker_id for w in await store.query_workers()] == ["w-1"]
            assert [m.value for m in await store.query_metrics("loss")] == [0.5]
            claimed = await store.claim_rollout("w-2")
            assert claimed is not None and claimed.rollout.rollout_id == waiting_id
            assert (await store.add_resources({})).resources_id == "rs-2"
        finally:
            await store.close()

    ids = asyncio.run(write())
    asyncio.run(read(*ids))


def test_two_store_objects_never_share_a_claim(postgres_url: str) -> None:
    async def main() -> None:
        first = PostgresLightningStore(postgres_url, poll_interval_s=0.02)
        second = PostgresLightningStore(postgres_url, poll_interval_s=0.02)
        try:
            await first.enqueue_many([EnqueueRequest(input=i) for i in range(30)])
            singles = [s.claim_rollout(f"w-{i}") for i in range(6) for s in (first, second)]
            batches = [s.claim_many(f"b-{i}", 3) for i in range(4) for s in (first, second)]
            single_results, batch_results = await asyncio.gather(asyncio.gather(*singles), asyncio.gather(*batches))
            claimed = [c for c in single_results if c is not None] + [c for b in batch_results for c in b]
            assert sorted(c.rollout.input for c in claimed) == list(range(30))  # 12 + 24 asked for: all 30, once
            # a rollout finished through one object is seen (and waited for) through the other
            rollout_id = claimed[0].rollout.rollout_id
            await second.update_attempt(rollout_id, claimed[0].attempt.attempt_id, AttemptStatus.SUCCEEDED)
            [seen] = await first.wait_for_rollouts([rollout_id], timeout_s=2)
            assert seen.status is RolloutStatus.SUCCEEDED
        finally:
            await first.close()
            await second.close()

    asyncio.run(main())


_CLAIMER = """
import asyncio, sys
from agentbolt.store.postgres import PostgresLightningStore

async def main():
    store = PostgresLightningStore(sys.argv[1])
    got = []
    while batch := await store.claim_many(sys.argv[2], 3):
        got.extend(c.rollout.rollout_id for c in batch)
    await store.close()
    print(" ".join(got))

asyncio.run(main())
"""


def test_processes_claiming_at_once_never_share_a_claim(postgres_url: str) -> None:
    async def enqueue() -> list[str]:
        store = PostgresLightningStore(postgres_url)
        rollouts = await store.enqueue_many([EnqueueRequest(input=i) for i in range(60)])
        await store.close()
        return [r.rollout_id for r in rollouts]

    ids = asyncio.run(enqueue())
    procs = [
        subprocess.Popen([sys.executable, "-c", _CLAIMER, postgres_url, f"w-{i}"], stdout=subprocess.PIPE, text=True)
        for i in range(3)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    claimed = [rollout_id for out in outputs for rollout_id in out.split()]
    assert sorted(claimed) == sorted(ids)  # every rollout claimed exactly once
    [(attempts,)] = _rows(postgres_url, "SELECT count(*) FROM attempts")
    assert attempts == 60


def test_schema_is_versioned_uses_jsonb_and_is_applied_once(postgres_url: str) -> None:
    async def open_and_close() -> None:
        store = PostgresLightningStore(postgres_url)
        try:
            await store.query_rollouts()
        finally:
            await store.close()

    asyncio.run(open_and_close())
    asyncio.run(open_and_close())
    applied = [v for (v,) in _rows(postgres_url, "SELECT version FROM schema_version ORDER BY version")]
    assert applied == [m.version for m in schema.MIGRATIONS]  # each applied once, in order
    columns = _rows(
        postgres_url,
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = current_schema()",
    )
    types = {(table, column): data_type for table, column, data_type in columns}
    for table in schema.TABLES:
        missing = [c for c in table.columns if (table.name, c) not in types]
        assert not missing, f"{table.name} lacks {missing}"
        for column in table.json_columns:
            assert types[(table.name, column)] == "jsonb"
    assert types[("rollouts", "enqueue_time")] == "double precision"

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_version (version, applied_time) VALUES (999, 0)")
    with pytest.raises(ConfigError, match="schema version 999"):
        asyncio.run(open_and_close())


def test_sweep_ends_leases_while_nobody_calls_the_store(postgres_url: str) -> None:
    async def main() -> None:
        store = PostgresLightningStore(postgres_url, sweep_interval_s=0.05)
        try:
            rollout = await store.enqueue_rollout("task", config=RolloutConfig(timeout_seconds=0.1))
            claimed = await store.claim_rollout("w-1")
            assert claimed is not None
            await asyncio.sleep(0.6)  # no store call meanwhile: only the background task can end the lease
            query = "SELECT status FROM rollouts WHERE rollout_id = %s"
            [(rollout_status,)] = _rows(postgres_url, query, rollout.rollout_id)
            [(attempt_status, error)] = _rows(
                postgres_url, "SELECT status, error FROM attempts WHERE attempt_id = %s", claimed.attempt.attempt_id
            )
            assert (rollout_status, attempt_status) == ("failed", "timeout")
            assert error["type"] == "timeout"
            [(worker_attempt,)] = _rows(postgres_url, "SELECT current_attempt_id FROM workers")
            assert worker_attempt is None  # the worker was freed too
        finally:
            await store.close()

    asyncio.run(main())


def test_pooled_sessions_commit_durably_and_refuse_nul_characters(postgres_url: str) -> None:
    async def main() -> None:
        store = PostgresLightningStore(f"{postgres_url}%20-csynchronous_commit%3Doff")  # a server set to 'off'
        try:

            async def show(conn: schema.Conn) -> str:
                cur = await conn.execute("SHOW synchronous_commit")
                row = await cur.fetchone()
                assert row is not None
                return row[0]

            assert await store._tx(show) == "on"
            with pytest.raises(ConfigError, match="refused a value"):
                await store.enqueue_rollout({"text": "a\x00b"})
            assert await store.query_rollouts() == []
        finally:
            await store.close()

    asyncio.run(main())


def test_closed_store_refuses_calls_and_bad_settings_are_refused(postgres_url: str) -> None:
    with pytest.raises(ConfigError, match="poll_interval_s"):
        PostgresLightningStore(postgres_url, poll_interval_s=0)
    with pytest.raises(ConfigError, match="max_connections"):
        PostgresLightningStore(postgres_url, min_connections=3, max_connections=2)

    async def main() -> None:
        store = PostgresLightningStore(postgres_url, sweep_interval_s=0.01)
        await store.enqueue_rollout("x")
        await asyncio.sleep(0.05)  # let the sweeper run a few times
        await store.close()
        await store.close()
        with pytest.raises(AgentboltError, match="closed"):
            await store.query_rollouts()

    asyncio.run(main())


# ---------------------------------------------------------------------------- no server needed


def test_build_store_picks_postgres_for_both_url_schemes() -> None:
    for url in ("postgresql://u:secret@127.0.0.1:5/db", "postgres://u:secret@127.0.0.1:5/db?connect_timeout=3"):
        store = build_store(url)
        assert isinstance(store, PostgresLightningStore)
        assert "secret" not in store.display_url
    with pytest.raises(ConfigError, match="not a valid PostgreSQL URL"):
        build_store("postgresql://127.0.0.1:5/db?bogus_option=1")
    assert redact_url("postgresql://u:pw@h/db?password=pw2") == "postgresql://u:***@h/db?password=***"


def test_unreachable_server_is_a_backend_error_naming_it() -> None:
    async def main() -> None:
        store = PostgresLightningStore("postgresql://agentbolt:pw@127.0.0.1:1/nowhere", connect_timeout_s=2)
        try:
            with pytest.raises(BackendError, match=r"cannot connect to PostgreSQL at postgresql://agentbolt:\*\*\*@"):
                await store.enqueue_rollout("x")
        finally:
            await store.close()

    asyncio.run(main())
