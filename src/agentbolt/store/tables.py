"""The store's tables, declared once for every SQL backend (:mod:`.sqlite_schema`, :mod:`.postgres_schema`).

A :class:`TableSpec` names a table, the model it holds and which model fields are its columns. Each SQL backend wraps
the specs with its own row mapping and writes its own DDL (migrations); the backends' tests check that the migrated
tables have every column listed here, so the two databases cannot drift apart silently.

JSON columns hold the model field dumped with ``model_dump(mode="json")``. A ``None`` value is SQL ``NULL`` in a
column listed in ``nullable_json`` and the JSON ``null`` everywhere else (a rollout's ``input`` may be ``None``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from pydantic import BaseModel

from agentbolt.store import rules
from agentbolt.types import Attempt, Metric, ResourcesUpdate, Rollout, Span, TrainedSample, Worker

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class TableSpec(Generic[M]):
    """One table: its ``name``, the ``model`` of a row, the model fields stored as ``columns``, which of them hold
    JSON, and the ``key`` column an upsert matches on (``None``: rows are only appended)."""

    name: str
    model: type[M]
    columns: tuple[str, ...]
    json_columns: frozenset[str] = frozenset()
    nullable_json: frozenset[str] = frozenset()
    key: str | None = None

    def select(self, alias: str = "") -> str:
        """``SELECT`` of every mapped column (prefixed with ``alias.`` when given), without ``FROM``."""
        prefix = f"{alias}." if alias else ""
        return "SELECT " + ", ".join(prefix + c for c in self.columns)


ROLLOUTS: Final = TableSpec(
    "rollouts",
    Rollout,
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
ATTEMPTS: Final = TableSpec(
    "attempts",
    Attempt,
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
    nullable_json=frozenset({"error"}),
    key="attempt_id",
)
SPANS: Final = TableSpec(
    "spans",
    Span,
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
RESOURCES: Final = TableSpec(
    "resources",
    ResourcesUpdate,
    ("version", "resources_id", "resources", "create_time", "metadata"),
    frozenset({"resources", "metadata"}),
)
WORKERS: Final = TableSpec(
    "workers",
    Worker,
    ("worker_id", "status", "last_heartbeat_time", "current_rollout_id", "current_attempt_id", "metadata"),
    frozenset({"metadata"}),
    key="worker_id",
)
METRICS: Final = TableSpec("metrics", Metric, ("name", "train_step", "value", "time"))
TRAINED_SAMPLES: Final = TableSpec(
    "trained_samples",
    TrainedSample,
    (
        "train_step",
        "sample_index",
        "rollout_id",
        "attempt_id",
        "calls",
        "loss_mask_ranges",
        "advantage",
        "token_advantages",
        "token_returns",
        "sampling_temperature",
        "trained",
        "advantage_estimator",
        "credit_assignment",
    ),
    frozenset({"calls", "loss_mask_ranges", "token_advantages", "token_returns"}),
    nullable_json=frozenset({"token_advantages", "token_returns"}),
)
"""What each update trained on (:class:`~agentbolt.types.TrainedSample`); a step's rows are replaced together."""

TABLES: Final[tuple[TableSpec[Any], ...]] = (ROLLOUTS, ATTEMPTS, SPANS, RESOURCES, WORKERS, METRICS, TRAINED_SAMPLES)

ENQUEUE_SEQ: Final = "enqueue_seq"
"""The rollouts column that records enqueue order (an auto-increment key in both databases)."""

TEXT_SORT_FIELDS: Final[frozenset[str]] = frozenset({"status", "rollout_id"})
"""Sort fields held as text; they must sort by code point (SQLite's default, ``COLLATE "C"`` in PostgreSQL)."""


def rollout_order_by(sort_by: str, descending: bool, *, text_collation: str = "") -> str:
    """The ``ORDER BY`` clause for :meth:`~agentbolt.store.base.LightningStore.query_rollouts`.

    Follows :func:`agentbolt.store.rules.sort_rollouts`: ``enqueue_time`` means enqueue order; other fields sort by
    value with ``NULL`` last in either direction, ties in enqueue order (reversed when ``descending``).
    ``text_collation`` (e.g. ``' COLLATE "C"'``) is appended to text fields.

    Raises:
        ConfigError: ``sort_by`` is not one of :data:`agentbolt.store.rules.ROLLOUT_SORT_FIELDS`.
    """
    field = rules.check_sort(sort_by)
    direction = "DESC" if descending else "ASC"
    if field == rules.DEFAULT_ROLLOUT_SORT:
        return f"ORDER BY {ENQUEUE_SEQ} {direction}"
    collate = text_collation if field in TEXT_SORT_FIELDS else ""
    return f"ORDER BY {field}{collate} {direction} NULLS LAST, {ENQUEUE_SEQ} {direction}"


def trained_samples_query(rollout_id: str | None, train_step: int | None, *, placeholder: str) -> tuple[str, list[Any]]:
    """The ``WHERE ... ORDER BY`` clauses and parameters of
    :meth:`~agentbolt.store.base.LightningStore.query_trained_samples`: the filters that are set, then by
    ``train_step`` and ``sample_index``. ``placeholder`` is the driver's parameter mark (``?`` or ``%s``)."""
    where: list[str] = []
    params: list[Any] = []
    if rollout_id is not None:
        where.append(f"rollout_id = {placeholder}")
        params.append(rollout_id)
    if train_step is not None:
        where.append(f"train_step = {placeholder}")
        params.append(train_step)
    return ("WHERE " + " AND ".join(where) if where else "") + " ORDER BY train_step, sample_index", params
