"""The SQLite store's tables: migrations (applied in order, recorded in ``schema_version``) and row mapping.

Migrations are frozen once released: to change the schema, append a new ``Migration`` to :data:`MIGRATIONS` (never
edit an old one) and update the matching :class:`Table` column list below. ``tests/contract`` checks that every
``Table`` matches the columns the migrations create.

JSON columns hold ``json.dumps`` of the model field dumped with ``model_dump(mode="json")``; a ``None`` field is
stored as SQL ``NULL``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, PydanticSerializationError

from agentbolt.errors import ConfigError


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
        conn.execute("ROLLBACK")
        raise


@dataclass(frozen=True)
class Table:
    """How one model maps to one table: its columns (model field names) and which of them hold JSON."""

    name: str
    columns: tuple[str, ...]
    json_columns: frozenset[str] = frozenset()
    key: str | None = None

    def select(self, alias: str = "") -> str:
        """``SELECT`` of every mapped column (prefixed with ``alias.`` when given), without ``FROM``."""
        prefix = f"{alias}." if alias else ""
        return "SELECT " + ", ".join(prefix + c for c in self.columns)

    def insert_sql(self) -> str:
        """``INSERT`` of every column; with a key, an upsert that overwrites the other columns."""
        sql = (
            f"INSERT INTO {self.name} ({', '.join(self.columns)}) "
            f"VALUES ({', '.join('?' for _ in self.columns)})"
        )
        if self.key is not None:
            updates = ", ".join(f"{c} = excluded.{c}" for c in self.columns if c != self.key)
            sql += f" ON CONFLICT ({self.key}) DO UPDATE SET {updates}"
        return sql

    def to_row(self, model: BaseModel) -> tuple[Any, ...]:
        """Column values of ``model``, JSON-encoding the JSON columns.

        Raises:
            ConfigError: a value is not JSON-serializable.
        """
        try:
            data = model.model_dump(mode="json")
        except PydanticSerializationError as exc:
            raise ConfigError(f"{self.name} record is not JSON-serializable: {exc}") from None
        return tuple(
            json.dumps(data[c]) if c in self.json_columns and data[c] is not None else data[c] for c in self.columns
        )

    def from_row(self, row: Sequence[Any]) -> dict[str, Any]:
        """Field dict of one row selected with :meth:`select`, JSON columns decoded."""
        return {
            c: json.loads(v) if c in self.json_columns and v is not None else v
            for c, v in zip(self.columns, row, strict=True)
        }


ROLLOUTS = Table(
    "rollouts",
    (
        "rollout_id",
        "input",
        "mode",
        "resources_id",
        "status",
        "config",
        "metadata",
        "enqueue_time",
        "start_time",
        "end_time",
        "num_attempts",
        "final_reward",
    ),
    frozenset({"input", "config", "metadata"}),
    key="rollout_id",
)
ATTEMPTS = Table(
    "attempts",
    (
        "attempt_id",
        "rollout_id",
        "sequence_id",
        "status",
        "worker_id",
        "resources_id",
        "start_time",
        "end_time",
        "last_heartbeat_time",
        "error",
    ),
    frozenset({"error"}),
    key="attempt_id",
)
SPANS = Table(
    "spans",
    (
        "rollout_id",
        "attempt_id",
        "sequence_id",
        "span_id",
        "trace_id",
        "parent_id",
        "name",
        "start_time",
        "end_time",
        "attributes",
        "status",
    ),
    frozenset({"attributes", "status"}),
)
RESOURCES = Table(
    "resources",
    ("version", "resources_id", "resources", "create_time", "metadata"),
    frozenset({"resources", "metadata"}),
)
WORKERS = Table(
    "workers",
    ("worker_id", "status", "last_heartbeat_time", "current_rollout_id", "current_attempt_id", "metadata"),
    frozenset({"metadata"}),
    key="worker_id",
)
METRICS = Table("metrics", ("name", "train_step", "value", "time"))

TABLES: tuple[Table, ...] = (ROLLOUTS, ATTEMPTS, SPANS, RESOURCES, WORKERS, METRICS)
