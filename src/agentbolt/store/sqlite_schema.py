"""The SQLite store's tables: migrations (applied in order, recorded in ``schema_version``), row mapping, lookups.

Migrations are frozen once released: to change the schema, append a new ``Migration`` to :data:`MIGRATIONS` (never
edit an old one) and update the column lists in :mod:`agentbolt.store.tables`. ``tests/contract`` checks that every
``Table`` matches the columns the migrations create.

JSON columns hold ``json.dumps`` of the model field dumped with ``model_dump(mode="json")``; a ``None`` value is SQL
``NULL`` in a nullable JSON column (``attempts.error``) and the JSON text ``null`` elsewhere.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final, TypeVar

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_json

from agentbolt.errors import ConfigError, NotFoundError
from agentbolt.store import rules, tables
from agentbolt.store.tables import TableSpec
from agentbolt.types import Attempt, ResourcesUpdate, Rollout, Worker

M = TypeVar("M", bound=BaseModel)

CLAIMABLE_SQL: Final = ", ".join(f"'{s.value}'" for s in sorted(rules.CLAIMABLE_ROLLOUT_STATUSES))
"""The claimable rollout statuses as SQL literals: ``'queuing', 'requeuing'``, the condition of the partial index
``rollouts_claimable`` (SQLite uses a partial index only for a query that spells out its condition)."""
ACTIVE_SQL: Final = ", ".join(f"'{s.value}'" for s in sorted(rules.ACTIVE_ATTEMPT_STATUSES))
"""The active (lease-holding) attempt statuses as SQL literals: ``'preparing', 'running'``, the condition of the partial
index ``attempts_active``."""


@dataclass(frozen=True)
class Migration:
    """One schema step: ``version`` (1, 2, ...) and the statements that apply it, run in one transaction."""

    version: int
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        (
            """CREATE TABLE rollouts (
                enqueue_seq INTEGER PRIMARY KEY AUTOINCREMENT,
                rollout_id TEXT NOT NULL UNIQUE,
                input TEXT NOT NULL,
                mode TEXT NOT NULL,
                resources_id TEXT,
                status TEXT NOT NULL,
                config TEXT NOT NULL,
                metadata TEXT NOT NULL,
                enqueue_time REAL NOT NULL,
                start_time REAL,
                end_time REAL,
                num_attempts INTEGER NOT NULL,
                final_reward REAL
            )""",
            "CREATE INDEX rollouts_by_status ON rollouts (status, enqueue_seq)",
            """CREATE TABLE attempts (
                attempt_id TEXT PRIMARY KEY,
                rollout_id TEXT NOT NULL REFERENCES rollouts (rollout_id),
                sequence_id INTEGER NOT NULL,
                status TEXT NOT NULL,
                worker_id TEXT,
                resources_id TEXT,
                start_time REAL NOT NULL,
                end_time REAL,
                last_heartbeat_time REAL,
                error TEXT,
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
                start_time REAL NOT NULL,
                end_time REAL,
                attributes TEXT NOT NULL,
                status TEXT NOT NULL
            )""",
            "CREATE UNIQUE INDEX spans_by_attempt ON spans (rollout_id, attempt_id, sequence_id)",
            """CREATE TABLE resources (
                version INTEGER PRIMARY KEY,
                resources_id TEXT NOT NULL UNIQUE,
                resources TEXT NOT NULL,
                create_time REAL NOT NULL,
                metadata TEXT NOT NULL
            )""",
            """CREATE TABLE workers (
                worker_seq INTEGER PRIMARY KEY AUTOINCREMENT,
                worker_id TEXT NOT NULL UNIQUE,
                status TEXT NOT NULL,
                last_heartbeat_time REAL NOT NULL,
                current_rollout_id TEXT,
                current_attempt_id TEXT,
                metadata TEXT NOT NULL
            )""",
            """CREATE TABLE metrics (
                metric_seq INTEGER PRIMARY KEY AUTOINCREMENT,
                name TEXT NOT NULL,
                train_step INTEGER NOT NULL,
                value REAL NOT NULL,
                time REAL NOT NULL
            )""",
            "CREATE INDEX metrics_by_name ON metrics (name, train_step)",
        ),
    ),
    # Status indexes hold only the rows the hot paths look up: claimable rollouts (claims) and active attempts
    # (lease expiry). A full status index moved an entry on every status change, two more page writes per commit.
    Migration(
        2,
        (
            "DROP INDEX rollouts_by_status",
            "CREATE INDEX rollouts_claimable ON rollouts (enqueue_seq) WHERE status IN ('queuing', 'requeuing')",
            "DROP INDEX attempts_by_status",
            "CREATE INDEX attempts_active ON attempts (rollout_id) WHERE status IN ('preparing', 'running')",
        ),
    ),
    # The dashboard's rollout search (agentbolt.store.sqlite_search): reward ranges and the final_reward sort read
    # this index instead of sorting every row. A rollout's reward is written once, when it ends.
    Migration(3, ("CREATE INDEX rollouts_by_reward ON rollouts (final_reward)",)),
    # What each update trained on (agentbolt.types.TrainedSample): token ids stay in the spans; a step's rows are
    # replaced together; the dashboard reads a rollout's rows by rollout_id.
    Migration(
        4,
        (
            """CREATE TABLE trained_samples (
                train_step INTEGER NOT NULL,
                sample_index INTEGER NOT NULL,
                rollout_id TEXT NOT NULL,
                attempt_id TEXT NOT NULL REFERENCES attempts (attempt_id),
                calls TEXT NOT NULL,
                loss_mask_ranges TEXT NOT NULL,
                advantage REAL NOT NULL,
                token_advantages TEXT,
                token_returns TEXT,
                sampling_temperature REAL NOT NULL,
                trained INTEGER NOT NULL,
                advantage_estimator TEXT NOT NULL,
                credit_assignment TEXT NOT NULL,
                PRIMARY KEY (train_step, sample_index)
            )""",
            "CREATE INDEX trained_samples_by_rollout ON trained_samples (rollout_id)",
        ),
    ),
)


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the file to the newest schema in one ``BEGIN IMMEDIATE`` transaction; return the version.

    Safe when several processes open a new file at once (the second waits, then finds nothing to do).

    Raises:
        ConfigError: the file was written by a newer agentbolt (its schema version is unknown here).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_time REAL NOT NULL)"
        )
        (current,) = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()
        newest = MIGRATIONS[-1].version
        if current > newest:
            raise ConfigError(
                f"store file has schema version {current}, but this agentbolt knows versions up to {newest}; "
                "upgrade agentbolt or use another file"
            )
        for migration in MIGRATIONS:
            if migration.version > current:
                for statement in migration.statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_version (version, applied_time) VALUES (?, ?)",
                    (migration.version, time.time()),
                )
        conn.execute("COMMIT")
        return newest
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def marks(values: Sequence[object]) -> str:
    """``?, ?, ?``: one SQL placeholder per value."""
    return ", ".join("?" for _ in values)


@contextmanager
def transaction(conn: sqlite3.Connection, *, write: bool) -> Iterator[None]:
    """One transaction: ``BEGIN IMMEDIATE`` (takes the write lock now) for writes, a snapshot ``BEGIN`` for reads.

    Inside a transaction that is already open (the group commit of :mod:`agentbolt.store.sqlite_writer`), it is a
    savepoint instead: an exception rolls back this block only, and the outer ``COMMIT`` makes it durable.
    The connection must be in autocommit mode (``isolation_level=None``). Any exception rolls back.
    """
    if conn.in_transaction:
        conn.execute("SAVEPOINT agentbolt_job")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK TO agentbolt_job")
            conn.execute("RELEASE agentbolt_job")
            raise
        conn.execute("RELEASE agentbolt_job")
        return
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class Table(TableSpec[M]):
    """A :class:`~agentbolt.store.tables.TableSpec` with its SQLite row mapping."""

    @classmethod
    def of(cls, spec: TableSpec[M]) -> Table[M]:
        """The SQLite mapping of ``spec``."""
        return cls(spec.name, spec.model, spec.columns, spec.json_columns, spec.nullable_json, spec.key)

    @cached_property
    def _json_flags(self) -> tuple[tuple[str, bool, bool], ...]:
        """``(column, is_json, nullable_json)`` for each column, in order."""
        return tuple((c, c in self.json_columns, c in self.nullable_json) for c in self.columns)

    def to_row(self, model: M) -> tuple[Any, ...]:
        """Column values of ``model``, JSON-encoding the JSON columns (see the module docstring for ``None``).

        Scalar columns are read off the model as they are (str, int, float, None and str enums bind as text); JSON
        columns are encoded by pydantic's serializer straight from the field value (no intermediate dicts).

        Raises:
            ConfigError: a value is not JSON-serializable.
        """
        row: list[Any] = []
        try:
            for column, is_json, nullable in self._json_flags:
                value = getattr(model, column)
                if is_json and not (value is None and nullable):
                    value = to_json(value).decode()
                row.append(value)
        except PydanticSerializationError as exc:
            raise ConfigError(f"{self.name} record is not JSON-serializable: {exc}") from None
        return tuple(row)

    def from_row(self, row: Sequence[Any]) -> M:
        """The model of one row selected with :meth:`select`.

        The row becomes one JSON document (JSON columns spliced in as stored) validated by pydantic in one pass,
        which is several times cheaper than decoding the JSON columns to Python objects first.
        """
        scalars: dict[str, Any] = {}
        spliced: list[str] = []
        for column, value in zip(self.columns, row, strict=True):
            if value is not None and column in self.json_columns:
                spliced.append(f',"{column}":{value}')
            else:
                scalars[column] = value
        return self.model.model_validate_json(to_json(scalars)[:-1] + "".join(spliced).encode() + b"}")

    @cached_property
    def _update_scalars_sql(self) -> tuple[str, tuple[int, ...]]:
        columns = [c for c in self.columns if c not in self.json_columns and c != self.key]
        sql = f"UPDATE {self.name} SET {', '.join(f'{c} = ?' for c in columns)} WHERE {self.key} = ?"
        return sql, tuple(self.columns.index(c) for c in [*columns, self.key])

    @cached_property
    def _update_sql(self) -> tuple[str, tuple[int, ...]]:
        columns = [c for c in self.columns if c != self.key]
        sql = f"UPDATE {self.name} SET {', '.join(f'{c} = ?' for c in columns)} WHERE {self.key} = ?"
        return sql, tuple(self.columns.index(c) for c in [*columns, self.key])

    @cached_property
    def _insert_sql(self) -> str:
        return f"INSERT INTO {self.name} ({', '.join(self.columns)}) VALUES ({marks(self.columns)})"

    @cached_property
    def _upsert_sql(self) -> str:
        updates = ", ".join(f"{c} = excluded.{c}" for c in self.columns if c != self.key)
        return f"{self._insert_sql} ON CONFLICT ({self.key}) DO UPDATE SET {updates}"

    def update_scalars(self, conn: sqlite3.Connection, model: M) -> None:
        """Rewrite the non-JSON columns of the existing row with ``model``'s key (the JSON columns stay as stored)."""
        assert self.key is not None, f"{self.name} has no key column"
        sql, order = self._update_scalars_sql
        values = [getattr(model, self.columns[i]) for i in order]
        conn.execute(sql, values)

    def update(self, conn: sqlite3.Connection, model: M) -> None:
        """Rewrite every column of the existing row with ``model``'s key."""
        assert self.key is not None, f"{self.name} has no key column"
        sql, order = self._update_sql
        row = self.to_row(model)
        conn.execute(sql, [row[i] for i in order])

    def insert(self, conn: sqlite3.Connection, models: Sequence[M]) -> None:
        """Insert ``models`` as new rows, in order (a duplicate key raises ``sqlite3.IntegrityError``)."""
        conn.executemany(self._insert_sql, [self.to_row(m) for m in models])

    def put(self, conn: sqlite3.Connection, model: M) -> None:
        """Insert ``model``; with a key, overwrite the row that has the same key (an upsert)."""
        self.put_many(conn, [model])

    def put_many(self, conn: sqlite3.Connection, models: Sequence[M]) -> None:
        """:meth:`put` for several models, in order."""
        sql = self._insert_sql if self.key is None else self._upsert_sql
        conn.executemany(sql, [self.to_row(m) for m in models])

    @cached_property
    def _select_from(self) -> str:
        return f"{self.select()} FROM {self.name}"

    def fetch_all(self, conn: sqlite3.Connection, clauses: str = "", params: Sequence[Any] = ()) -> list[M]:
        """Models of the rows matching ``clauses`` (SQL after ``FROM table``: ``WHERE ... ORDER BY ...``)."""
        rows = conn.execute(f"{self._select_from} {clauses}", params).fetchall()
        return [self.from_row(r) for r in rows]

    def fetch_one(self, conn: sqlite3.Connection, clauses: str, params: Sequence[Any] = ()) -> M | None:
        """The first model matching ``clauses``, or ``None``."""
        row = conn.execute(f"{self._select_from} {clauses} LIMIT 1", params).fetchone()
        return None if row is None else self.from_row(row)


ROLLOUTS = Table.of(tables.ROLLOUTS)
ATTEMPTS = Table.of(tables.ATTEMPTS)
SPANS = Table.of(tables.SPANS)
RESOURCES = Table.of(tables.RESOURCES)
WORKERS = Table.of(tables.WORKERS)
METRICS = Table.of(tables.METRICS)
TRAINED_SAMPLES = Table.of(tables.TRAINED_SAMPLES)

TABLES: tuple[Table[Any], ...] = (ROLLOUTS, ATTEMPTS, SPANS, RESOURCES, WORKERS, METRICS, TRAINED_SAMPLES)


# ---------------------------------------------------------------------- lookups used by the store
def get_rollout(conn: sqlite3.Connection, rollout_id: str) -> Rollout:
    """The rollout. Raises NotFoundError."""
    rollout = ROLLOUTS.fetch_one(conn, "WHERE rollout_id = ?", (rollout_id,))
    if rollout is None:
        raise NotFoundError(f"rollout '{rollout_id}' does not exist")
    return rollout


def get_attempt(conn: sqlite3.Connection, rollout_id: str, attempt_id: str) -> Attempt:
    """The attempt of that rollout. Raises NotFoundError (unknown rollout, or attempt not of that rollout)."""
    attempt = ATTEMPTS.fetch_one(conn, "WHERE rollout_id = ? AND attempt_id = ?", (rollout_id, attempt_id))
    if attempt is None:
        get_rollout(conn, rollout_id)  # names the rollout when it is the rollout that is unknown
        raise NotFoundError(f"attempt '{attempt_id}' of rollout '{rollout_id}' does not exist")
    return attempt


def latest_attempt(conn: sqlite3.Connection, rollout_id: str) -> Attempt | None:
    """The rollout's attempt with the highest ``sequence_id``, or ``None``."""
    return ATTEMPTS.fetch_one(conn, "WHERE rollout_id = ? ORDER BY sequence_id DESC", (rollout_id,))


def get_worker(conn: sqlite3.Connection, worker_id: str) -> Worker | None:
    """The worker, or ``None``."""
    return WORKERS.fetch_one(conn, "WHERE worker_id = ?", (worker_id,))


def get_resources(conn: sqlite3.Connection, resources_id: str) -> ResourcesUpdate:
    """One resources version. Raises NotFoundError."""
    update = RESOURCES.fetch_one(conn, "WHERE resources_id = ?", (resources_id,))
    if update is None:
        raise NotFoundError(f"resources '{resources_id}' do not exist")
    return update


def latest_resources(conn: sqlite3.Connection) -> ResourcesUpdate | None:
    """The newest resources version, or ``None``."""
    return RESOURCES.fetch_one(conn, "ORDER BY version DESC")
