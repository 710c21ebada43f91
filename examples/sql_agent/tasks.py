"""Tasks of the SQL agent: questions over the Chinook database with gold result sets, the split, and the database.

Every task is a :class:`SqlTask` (a frozen pydantic model, so it travels through the store as JSON with
``task.model_dump(mode="json")`` and comes back with ``SqlTask.model_validate(data)``). The 60 questions live in
``data/questions.jsonl``, one task a line, 20 per band:

    * ``easy``: one table; filters, counts, ``DISTINCT``, a simple ``ORDER BY ... LIMIT``;
    * ``medium``: joins of two to five tables, ``GROUP BY`` and aggregates, a self-join;
    * ``hard``: multi-table joins with ``HAVING``, (correlated) subqueries, anti-joins, window functions, date logic.

The gold rows of each task are what its ``gold_sql`` returns on ``data/chinook.db``: they are generated and checked by
``make_gold.py``, never typed by hand. ``order_matters`` is true only when the question asks for an order (``highest
first``, ``ordered by year``).

The database is opened read-only (SQLite URI ``mode=ro``) by :func:`connect_readonly`; agents and the reward run
queries through ``reward.run_sql``, which adds a time limit, a row limit and a read-only authorizer on top.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

DATA_DIR = Path(__file__).resolve().parent / "data"
DB_PATH = DATA_DIR / "chinook.db"
"""The Chinook sample database (SQLite, 913,408 bytes, MIT license; see README.md)."""
QUESTIONS_PATH = DATA_DIR / "questions.jsonl"
VAL_FRACTION = 0.25
"""Share of each band held out for validation by :func:`split_tasks` (5 of 20)."""

Band = Literal["easy", "medium", "hard"]
BANDS: tuple[Band, ...] = ("easy", "medium", "hard")
Cell = str | int | float | None
"""One value of a result row, as SQLite returns it and JSON stores it (the Chinook database holds no blobs)."""


class SqlTask(BaseModel):
    """One question over the Chinook database with its gold result set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    """Unique, ``<band>-<nn>``, e.g. ``easy-01``, ``hard-17``."""
    band: Band
    """Difficulty band."""
    question: str
    """The question in plain English, as a user would ask it; it names the columns to return."""
    gold_sql: str
    """A SQLite query that answers the question; ``gold_rows`` is its result."""
    columns: tuple[str, ...]
    """Column names of the gold result, for readers only: the reward never compares column names."""
    gold_rows: tuple[tuple[Cell, ...], ...]
    """The gold result set: every row has ``len(columns)`` values. Never empty."""
    order_matters: bool
    """Whether the row order is part of the answer (the question asks for an ordering or a top-k)."""


def load_tasks(path: Path = QUESTIONS_PATH) -> list[SqlTask]:
    """All tasks of ``path`` (default ``data/questions.jsonl``), in file order.

    Raises:
        pydantic.ValidationError: a line is not a valid task.
        ValueError: two tasks share a ``task_id``.
    """
    with path.open(encoding="utf-8") as handle:
        tasks = [SqlTask.model_validate(json.loads(line)) for line in handle if line.strip()]
    seen: set[str] = set()
    for task in tasks:
        if task.task_id in seen:
            raise ValueError(f"duplicate task_id {task.task_id!r} in {path}")
        seen.add(task.task_id)
    return tasks


def split_tasks(tasks: Sequence[SqlTask], val_fraction: float = VAL_FRACTION) -> tuple[list[SqlTask], list[SqlTask]]:
    """Split ``tasks`` into ``(train, val)``, stratified by band, deterministically.

    Within each band the tasks are ranked by the SHA-256 of their ``task_id``; the first ``ceil(n * val_fraction)``
    go to val, the rest to train. Both lists keep the input order. The split of a task depends only on its id and
    on its band's size, so it is the same on every machine and every run.

    Raises:
        ValueError: ``val_fraction`` is not in ``[0, 1]``.
    """
    if not 0.0 <= val_fraction <= 1.0:
        raise ValueError(f"val_fraction must be in [0, 1], got {val_fraction}")
    val_ids: set[str] = set()
    for band in {task.band for task in tasks}:
        ranked = sorted((task for task in tasks if task.band == band), key=lambda task: _id_hash(task.task_id))
        val_ids.update(task.task_id for task in ranked[: math.ceil(len(ranked) * val_fraction)])
    train = [task for task in tasks if task.task_id not in val_ids]
    val = [task for task in tasks if task.task_id in val_ids]
    return train, val


def load_splits(val_fraction: float = VAL_FRACTION) -> tuple[list[SqlTask], list[SqlTask]]:
    """``split_tasks(load_tasks(), val_fraction)``: 45 training and 15 validation tasks by default."""
    return split_tasks(load_tasks(), val_fraction)


def readonly_uri(path: Path = DB_PATH) -> str:
    """The SQLite URI that opens ``path`` read-only, e.g. ``file:///.../chinook.db?mode=ro``."""
    return f"{path.resolve().as_uri()}?mode=ro"


def connect_readonly(path: Path = DB_PATH) -> sqlite3.Connection:
    """Open ``path`` read-only (URI ``mode=ro``): any write fails with ``attempt to write a readonly database``.

    Raises:
        FileNotFoundError: ``path`` does not exist (``mode=ro`` never creates a file).
    """
    if not path.is_file():
        raise FileNotFoundError(f"no SQLite database at {path}")
    return sqlite3.connect(readonly_uri(path), uri=True)


def schema_sql(path: Path = DB_PATH) -> str:
    """The ``CREATE TABLE`` statements of the database, in table-name order, separated by blank lines.

    Meant for the agents' prompts: the Chinook schema is about 4,200 characters.
    """
    connection = connect_readonly(path)
    try:
        rows = connection.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL ORDER BY name"
        ).fetchall()
    finally:
        connection.close()
    return "\n\n".join(row[0] for row in rows)


def _id_hash(task_id: str) -> str:
    return hashlib.sha256(task_id.encode("utf-8")).hexdigest()
