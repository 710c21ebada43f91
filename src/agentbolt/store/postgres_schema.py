"""The PostgreSQL store's tables: migrations (applied in order, recorded in ``schema_version``), row mapping, lookups.

Same tables and columns as SQLite (declared once in :mod:`agentbolt.store.tables`); payloads are ``JSONB`` and
timestamps ``DOUBLE PRECISION`` epoch seconds. Tables live in the first schema of the connection's ``search_path``
(choose one with ``?options=-csearch_path%3Dmyschema`` in the URL).

Migrations are frozen once released: to change the schema, append a new :class:`Migration` (never edit an old one).
Several processes may open a new database at once: :func:`migrate` holds a transaction-scoped advisory lock.

JSONB keeps JSON values, not text: object keys come back in JSONB's own order (dict equality is unaffected), and a
string holding the character ``\\u0000`` is refused (:class:`~agentbolt.errors.ConfigError`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, LiteralString, TypeVar, cast

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from agentbolt.errors import ConfigError, NotFoundError
from agentbolt.store import tables
from agentbolt.store.tables import TableSpec
from agentbolt.types import Attempt, ResourcesUpdate, Rollout, Worker

M = TypeVar("M", bound=BaseModel)
Conn = AsyncConnection[tuple[Any, ...]]

MIGRATION_LOCK_KEY: Final = 0x6167_6E62_6F6C_7401
"""``pg_advisory_xact_lock`` key that serializes migrations of one database (any 64-bit constant of ours)."""


@dataclass(frozen=True)
class Migration:
    """One schema step: ``version`` (1, 2, ...) and the statements that apply it, run in one transaction."""

    version: int
    statements: tuple[LiteralString, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        (
            """CREATE TABLE rollouts (
                enqueue_seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                rollout_id TEXT NOT NULL UNIQUE,
                input JSONB NOT NULL,
                mode TEXT NOT NULL,
                resources_id TEXT,
                status TEXT NOT NULL,
                config JSONB NOT NULL,
                metadata JSONB NOT NULL,
                enqueue_time DOUBLE PRECISION NOT NULL,
                start_time DOUBLE PRECISION,
                end_time DOUBLE PRECISION,
                num_attempts INTEGER NOT NULL,
                final_reward DOUBLE PRECISION
            )""",
            "CREATE INDEX rollouts_by_status ON rollouts (status, enqueue_seq)",
            """CREATE TABLE attempts (
                attempt_id TEXT PRIMARY KEY,
                rollout_id TEXT NOT NULL REFERENCES rollouts (rollout_id),
                sequence_id INTEGER NOT NULL,
                status TEXT NOT NULL,
                worker_id TEXT,
                resources_id TEXT,
                start_time DOUBLE PRECISION NOT NULL,
                end_time DOUBLE PRECISION,
                last_heartbeat_time DOUBLE PRECISION,
                error JSONB,
                UNIQUE (rollout_id, sequence_id)
            )""",
            "CREATE INDEX attempts_by_status ON attempts (status)",
            """CREATE TABLE spans (
                rollout_id TEXT NOT NULL,
                attempt_id TEXT NOT NULL REFERENCES attempts (attempt_id),
                sequence_id INTEGER NOT NULL,
                span_id TEXT NOT NULL,
                trace_id TEXT NOT NULL,
                parent_id TEXT,
                name TEXT NOT NULL,
                start_time DOUBLE PRECISION NOT NULL,
                end_time DOUBLE PRECISION,
                attributes JSONB NOT NULL,
                status JSONB NOT NULL,
                PRIMARY KEY (rollout_id, attempt_id, sequence_id)
            )""",
            """CREATE TABLE resources (
                version INTEGER PRIMARY KEY,
                resources_id TEXT NOT NULL UNIQUE,
                resources JSONB NOT NULL,
                create_time DOUBLE PRECISION NOT NULL,
                metadata JSONB NOT NULL
            )""",
            """CREATE TABLE workers (
                worker_seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                worker_id TEXT NOT NULL UNIQUE,
                status TEXT NOT NULL,
                last_heartbeat_time DOUBLE PRECISION NOT NULL,
                current_rollout_id TEXT,
                current_attempt_id TEXT,
                metadata JSONB NOT NULL
            )""",
            """CREATE TABLE metrics (
                metric_seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                name TEXT NOT NULL,
                train_step BIGINT NOT NULL,
                value DOUBLE PRECISION NOT NULL,
                time DOUBLE PRECISION NOT NULL
            )""",
            "CREATE INDEX metrics_by_name ON metrics (name, train_step, metric_seq)",
        ),
    ),
    # The dashboard's rollout search (agentbolt.store.postgres_search): reward ranges and the final_reward sort.
    Migration(2, ("CREATE INDEX rollouts_by_reward ON rollouts (final_reward)",)),
    # What each update trained on (agentbolt.types.TrainedSample): token ids stay in the spans; a step's rows are
    # replaced together; the dashboard reads a rollout's rows by rollout_id.
    Migration(
        3,
        (
            """CREATE TABLE trained_samples (
                train_step BIGINT NOT NULL,
                sample_index INTEGER NOT NULL,
                rollout_id TEXT NOT NULL,
                attempt_id TEXT NOT NULL REFERENCES attempts (attempt_id),
                calls JSONB NOT NULL,
                loss_mask_ranges JSONB NOT NULL,
                advantage DOUBLE PRECISION NOT NULL,
                token_advantages JSONB,
                token_returns JSONB,
                sampling_temperature DOUBLE PRECISION NOT NULL,
                trained BOOLEAN NOT NULL,
                advantage_estimator TEXT NOT NULL,
                credit_assignment TEXT NOT NULL,
                PRIMARY KEY (train_step, sample_index)
            )""",
            "CREATE INDEX trained_samples_by_rollout ON trained_samples (rollout_id)",
        ),
    ),
)


async def migrate(conn: Conn) -> int:
    """Bring the database to the newest schema in one transaction; return the version.

    ``conn`` must be in autocommit mode (the pool's connections are).

    Raises:
        ConfigError: the database was written by a newer agentbolt (its schema version is unknown here).
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version "
            "(version INTEGER PRIMARY KEY, applied_time DOUBLE PRECISION NOT NULL)"
        )
        cur = await conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version")
        (current,) = cast(tuple[int], await cur.fetchone())
        newest = MIGRATIONS[-1].version
        if current > newest:
            raise ConfigError(
                f"database has store schema version {current}, but this agentbolt knows versions up to {newest}; "
                "upgrade agentbolt or use another database/schema"
            )
        for migration in MIGRATIONS:
            if migration.version > current:
                for statement in migration.statements:
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO schema_version (version, applied_time) VALUES (%s, %s)",
                    (migration.version, time.time()),
                )
    return newest


def sql(text: str) -> LiteralString:
    """Mark SQL text as trusted for psycopg's typing. Only for SQL assembled from this package's constants (table
    and column names, fixed clauses), never from caller input: values always travel as ``%s`` parameters."""
    return cast(LiteralString, text)


class PgTable(TableSpec[M]):
    """A :class:`~agentbolt.store.tables.TableSpec` with its PostgreSQL row mapping."""

    @classmethod
    def of(cls, spec: TableSpec[M]) -> PgTable[M]:
        """The PostgreSQL mapping of ``spec``."""
        return cls(spec.name, spec.model, spec.columns, spec.json_columns, spec.nullable_json, spec.key)

    def to_params(self, model: M) -> tuple[Any, ...]:
        """Column values of ``model``; JSON columns wrapped as ``Jsonb`` (``None`` -> SQL NULL where nullable).

        Raises:
            ConfigError: a value is not JSON-serializable.
        """
        try:
            data = model.model_dump(mode="json")
        except PydanticSerializationError as exc:
            raise ConfigError(f"{self.name} record is not JSON-serializable: {exc}") from None
        return tuple(self._encode(c, data[c]) for c in self.columns)

    def _encode(self, column: str, value: Any) -> Any:
        if column not in self.json_columns or (value is None and column in self.nullable_json):
            return value
        return Jsonb(value)

    def from_row(self, row: Sequence[Any]) -> M:
        """The model of one row selected with :meth:`select` (psycopg already decoded the JSONB values)."""
        return self.model.model_validate(dict(zip(self.columns, row, strict=True)))

    async def insert_many(self, conn: Conn, models: Sequence[M], *, skip_existing: bool = False) -> None:
        """Insert rows, in order (several rows go in one pipelined round trip). ``skip_existing`` leaves a row whose
        key already exists as it is (``ON CONFLICT DO NOTHING``)."""
        if not models:
            return
        marks = ", ".join("%s" for _ in self.columns)
        conflict = f" ON CONFLICT ({self.key}) DO NOTHING" if skip_existing and self.key is not None else ""
        query = sql(f"INSERT INTO {self.name} ({', '.join(self.columns)}) VALUES ({marks}){conflict}")
        async with conn.cursor() as cur:
            await cur.executemany(query, [self.to_params(m) for m in models])

    async def update(self, conn: Conn, model: M) -> None:
        """Overwrite the row with ``model``'s key. The table must have a key."""
        await self.update_many(conn, [model])

    async def update_many(self, conn: Conn, models: Sequence[M]) -> None:
        """:meth:`update` for several models (one pipelined round trip)."""
        assert self.key is not None, f"{self.name} has no key column"
        if not models:
            return
        key = self.key
        columns = [c for c in self.columns if c != key]
        assignments = ", ".join(f"{c} = %s" for c in columns)
        query = sql(f"UPDATE {self.name} SET {assignments} WHERE {key} = %s")
        rows = [dict(zip(self.columns, self.to_params(m), strict=True)) for m in models]
        params = [[*(row[c] for c in columns), row[key]] for row in rows]
        if len(params) == 1:
            await conn.execute(query, params[0])
        else:
            async with conn.cursor() as cur:
                await cur.executemany(query, params)

    async def fetch_all(self, conn: Conn, clauses: str = "", params: Sequence[Any] = ()) -> list[M]:
        """Models of the rows matching ``clauses`` (SQL after ``FROM table``: ``WHERE ... ORDER BY ...``)."""
        cur = await conn.execute(sql(f"{self.select()} FROM {self.name} {clauses}"), params)
        return [self.from_row(r) for r in await cur.fetchall()]

    async def fetch_one(self, conn: Conn, clauses: str, params: Sequence[Any] = (), *, lock: bool = False) -> M | None:
        """The first model matching ``clauses``, or ``None``; ``lock`` takes its row lock (``FOR UPDATE``)."""
        suffix = " LIMIT 1 FOR UPDATE" if lock else " LIMIT 1"
        cur = await conn.execute(sql(f"{self.select()} FROM {self.name} {clauses}{suffix}"), params)
        row = await cur.fetchone()
        return None if row is None else self.from_row(row)


ROLLOUTS = PgTable.of(tables.ROLLOUTS)
ATTEMPTS = PgTable.of(tables.ATTEMPTS)
SPANS = PgTable.of(tables.SPANS)
RESOURCES = PgTable.of(tables.RESOURCES)
WORKERS = PgTable.of(tables.WORKERS)
METRICS = PgTable.of(tables.METRICS)
TRAINED_SAMPLES = PgTable.of(tables.TRAINED_SAMPLES)

TABLES: tuple[PgTable[Any], ...] = (ROLLOUTS, ATTEMPTS, SPANS, RESOURCES, WORKERS, METRICS, TRAINED_SAMPLES)


# ---------------------------------------------------------------------- lookups used by the store
async def get_rollout(conn: Conn, rollout_id: str, *, lock: bool = False) -> Rollout:
    """The rollout (with its row lock when ``lock``). Raises NotFoundError."""
    rollout = await ROLLOUTS.fetch_one(conn, "WHERE rollout_id = %s", (rollout_id,), lock=lock)
    if rollout is None:
        raise NotFoundError(f"rollout '{rollout_id}' does not exist")
    return rollout


async def get_attempt(conn: Conn, rollout_id: str, attempt_id: str, *, lock: bool = False) -> Attempt:
    """The attempt of that rollout (with its row lock when ``lock``). Raises NotFoundError (unknown rollout, or
    attempt not of that rollout)."""
    await get_rollout(conn, rollout_id)
    clauses = "WHERE rollout_id = %s AND attempt_id = %s"
    attempt = await ATTEMPTS.fetch_one(conn, clauses, (rollout_id, attempt_id), lock=lock)
    if attempt is None:
        raise NotFoundError(f"attempt '{attempt_id}' of rollout '{rollout_id}' does not exist")
    return attempt


async def latest_attempt(conn: Conn, rollout_id: str, *, lock: bool = False) -> Attempt | None:
    """The rollout's attempt with the highest ``sequence_id`` (with its row lock when ``lock``), or ``None``."""
    clauses = "WHERE rollout_id = %s ORDER BY sequence_id DESC"
    return await ATTEMPTS.fetch_one(conn, clauses, (rollout_id,), lock=lock)


async def get_worker(conn: Conn, worker_id: str, *, lock: bool = False) -> Worker | None:
    """The worker (with its row lock when ``lock``), or ``None``."""
    return await WORKERS.fetch_one(conn, "WHERE worker_id = %s", (worker_id,), lock=lock)


async def get_resources(conn: Conn, resources_id: str) -> ResourcesUpdate:
    """One resources version. Raises NotFoundError."""
    update = await RESOURCES.fetch_one(conn, "WHERE resources_id = %s", (resources_id,))
    if update is None:
        raise NotFoundError(f"resources '{resources_id}' do not exist")
    return update


async def latest_resources(conn: Conn) -> ResourcesUpdate | None:
    """The newest resources version, or ``None``."""
    return await RESOURCES.fetch_one(conn, "ORDER BY version DESC")
