"""Reward of the SQL agent: run a candidate query read-only and compare its result set with the gold one.

Execution (:func:`run_sql`), the same for the reward and for the agents' own query tool:
    * the database is opened with the SQLite URI ``mode=ro`` and ``PRAGMA query_only``, and an authorizer lets only
      reads through (``SELECT``, reading tables, functions, recursive CTEs, and the schema pragmas of
      ``READ_PRAGMAS`` as statements, e.g. ``PRAGMA table_info(Track)``); anything else (``INSERT``, ``DROP``,
      ``ATTACH``, ``VACUUM``, ``PRAGMA x = y``, transactions, the ``pragma_*`` table functions) is refused before it
      runs, with a reason such as ``refused: only read-only queries may run (denied: INSERT Genre)``;
    * a progress handler stops the query once ``time_limit_s`` of wall time have passed (checked every
      ``PROGRESS_INTERVAL_OPS`` virtual-machine instructions), so a runaway recursive CTE ends in time;
    * at most ``max_rows`` rows are fetched (more is an error, not a truncation), and no string or blob may exceed
      ``MAX_VALUE_BYTES``;
    * one statement only; a failure never raises: it comes back as ``QueryResult.error``.

Comparison (:func:`compare_results`), candidate rows against gold rows; the reward is 1.0 on a match, else 0.0:
    * **cells**: ``NULL`` equals only ``NULL``. Two numbers are equal when they differ by at most
      ``NUMBER_TOLERANCE`` (0.005, plus a relative 1e-9), so ``21`` = ``21.0`` and an unrounded ``2.6749`` matches a
      gold ``2.67``; two integers must be equal exactly. A string equals a number when it is a plain decimal
      literal (``-?digits[.digits]``) of that value (``'2009'`` = ``2009``); two strings must be equal exactly
      (case and spaces count).
    * **shape**: the candidate must have as many rows and as many columns as the gold; extra columns fail.
    * **rows**: compared as multisets (duplicates count); as lists when the task's ``order_matters``.
    * **column order**: each gold column is matched to the candidate columns whose values (as a multiset) equal its
      own. When every gold column matches exactly one candidate column, one-to-one, the candidate's columns are
      put in that order; otherwise (two columns with the same values) they are compared in the order given. So
      ``LastName, FirstName`` matches a gold ``FirstName, LastName``, and no ambiguous reordering is ever tried.
    * rows are matched greedily with this tolerance. ``make_gold.py`` checks that no two gold rows of a task are
      within twice the tolerance of each other, so the greedy matching can never pair the wrong rows.

Extraction (:func:`extract_sql`) of the query from a model's answer is documented on the function.
"""

from __future__ import annotations

import math
import re
import sqlite3
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .tasks import DB_PATH, Cell, SqlTask, connect_readonly

DEFAULT_TIME_LIMIT_S = 2.0
DEFAULT_MAX_ROWS = 1000
MAX_VALUE_BYTES = 1_000_000
PROGRESS_INTERVAL_OPS = 1000
NUMBER_TOLERANCE = 0.005
"""Absolute tolerance of a number comparison: half a cent, so rounding to two decimals or not both match."""
RELATIVE_TOLERANCE = 1e-9
READ_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo", "foreign_key_list"}
)
"""Pragmas the authorizer lets through: they only describe the schema."""

Value = Cell | bytes
"""One value of a candidate's result row (a blob comes back as ``bytes``)."""
Row = tuple[Value, ...]

_ALLOWED_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
_ACTION_NAMES = {
    getattr(sqlite3, f"SQLITE_{name}"): name
    for name in (
        "CREATE_INDEX",
        "CREATE_TABLE",
        "CREATE_TEMP_INDEX",
        "CREATE_TEMP_TABLE",
        "CREATE_TEMP_TRIGGER",
        "CREATE_TEMP_VIEW",
        "CREATE_TRIGGER",
        "CREATE_VIEW",
        "DELETE",
        "DROP_INDEX",
        "DROP_TABLE",
        "DROP_TEMP_INDEX",
        "DROP_TEMP_TABLE",
        "DROP_TEMP_TRIGGER",
        "DROP_TEMP_VIEW",
        "DROP_TRIGGER",
        "DROP_VIEW",
        "INSERT",
        "PRAGMA",
        "TRANSACTION",
        "UPDATE",
        "ATTACH",
        "DETACH",
        "ALTER_TABLE",
        "REINDEX",
        "ANALYZE",
        "CREATE_VTABLE",
        "DROP_VTABLE",
        "SAVEPOINT",
    )
}
"""Authorizer action code -> name, for the ``refused: ...`` reason."""
_DECIMAL_RE = re.compile(r"-?\d{1,20}(?:\.\d{1,20})?")
_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_SQL_FENCE_TAGS = frozenset({"sql", "sqlite", "sqlite3"})
_STATEMENT_START_RE = re.compile(r"^[ \t]*(?:SELECT|WITH)\b", re.IGNORECASE | re.MULTILINE)
_BLANK_LINE_RE = re.compile(r"\n[ \t]*\n")


@dataclass(frozen=True)
class QueryResult:
    """What one query returned: its columns and rows, or why it failed."""

    columns: tuple[str, ...] = ()
    """Column names as the query spelled them (``cursor.description``); empty on failure."""
    rows: tuple[Row, ...] = ()
    """At most ``max_rows`` rows, in the order SQLite returned them; empty on failure."""
    error: str | None = None
    """``None`` on success; else one line: ``time limit of 2.0 s exceeded``, ``refused: ...``, ``SQL error: ...``."""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class SqlScore:
    """The reward of one candidate query and why it got it."""

    reward: float
    """1.0 when the result set matches the gold, else 0.0."""
    reason: str
    """``match``, or why not: ``no SQL found in the answer``, the query's error, or the mismatch."""
    result: QueryResult | None
    """The candidate's result (``None`` when no SQL was found)."""


def run_sql(
    sql: str,
    db_path: Path = DB_PATH,
    *,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> QueryResult:
    """Run one read-only query on ``db_path`` within ``time_limit_s`` seconds and ``max_rows`` rows.

    Never raises for a bad query: errors, refused writes, timeouts and too many rows come back as
    ``QueryResult.error``. The database file is never modified (it is opened read-only and writes are refused by the
    authorizer before they run).

    Raises:
        FileNotFoundError: ``db_path`` does not exist.
        ValueError: ``time_limit_s`` is not positive or ``max_rows`` is negative.
    """
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be > 0, got {time_limit_s}")
    if max_rows < 0:
        raise ValueError(f"max_rows must be >= 0, got {max_rows}")
    connection = connect_readonly(db_path)
    refused: list[str] = []
    deadline = time.monotonic() + time_limit_s
    try:
        connection.execute("PRAGMA query_only = ON")
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        connection.set_authorizer(_make_authorizer(refused))
        connection.set_progress_handler(lambda: int(time.monotonic() > deadline), PROGRESS_INTERVAL_OPS)
        cursor = connection.execute(sql)
        if cursor.description is None:
            return QueryResult(error="not a query: the statement returns no columns")
        rows = cursor.fetchmany(max_rows + 1)
        if len(rows) > max_rows:
            return QueryResult(error=f"too many rows: more than {max_rows}")
        columns = tuple(str(column[0]) for column in cursor.description)
        return QueryResult(columns=columns, rows=tuple(tuple(row) for row in rows))
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as exc:
        return QueryResult(error=_error_reason(exc, refused, time.monotonic() > deadline, time_limit_s))
    finally:
        connection.close()


def compare_results(rows: Sequence[Row], gold_rows: Sequence[Sequence[Cell]], *, order_matters: bool) -> str | None:
    """``None`` when ``rows`` match ``gold_rows`` under the rules of this module's docstring, else why not."""
    if len(rows) != len(gold_rows):
        return f"expected {len(gold_rows)} rows, got {len(rows)}"
    if not gold_rows:
        return None
    width = len(gold_rows[0])
    if any(len(row) != width for row in rows):
        return f"expected {width} columns, got {len(rows[0])}"
    golds = [tuple(row) for row in gold_rows]
    order = _column_order(rows, golds)
    candidates = [tuple(row[k] for k in order) for row in rows] if order else list(rows)
    if order_matters:
        if all(rows_equal(row, gold) for row, gold in zip(candidates, golds, strict=True)):
            return None
        if _multiset_equal(candidates, golds):
            return "the right rows in the wrong order"
        return "rows differ from the gold rows"
    return None if _multiset_equal(candidates, golds) else "rows differ from the gold rows"


def score_sql(
    sql: str,
    task: SqlTask,
    db_path: Path = DB_PATH,
    *,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> SqlScore:
    """Run ``sql`` with :func:`run_sql` and compare its rows with ``task.gold_rows``: 1.0 on a match, else 0.0."""
    result = run_sql(sql, db_path, time_limit_s=time_limit_s, max_rows=max_rows)
    if result.error is not None:
        return SqlScore(reward=0.0, reason=result.error, result=result)
    mismatch = compare_results(result.rows, task.gold_rows, order_matters=task.order_matters)
    if mismatch is not None:
        return SqlScore(reward=0.0, reason=f"wrong result: {mismatch}", result=result)
    return SqlScore(reward=1.0, reason="match", result=result)


def score_answer(
    answer: str | None,
    task: SqlTask,
    db_path: Path = DB_PATH,
    *,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> SqlScore:
    """:func:`extract_sql` from a model's ``answer``, then :func:`score_sql`; 0.0 when no SQL is found."""
    sql = extract_sql(answer)
    if sql is None:
        return SqlScore(reward=0.0, reason="no SQL found in the answer", result=None)
    return score_sql(sql, task, db_path, time_limit_s=time_limit_s, max_rows=max_rows)


def extract_sql(answer: str | None) -> str | None:
    """The SQL query in a model's ``answer``, or ``None`` when there is none.

    Rules, first that applies:
        1. the last fenced block tagged ``sql``, ``sqlite`` or ``sqlite3`` (any case): its whole content;
        2. the last fenced block without a tag: its whole content;
        3. a bare statement: from the first line that starts with ``SELECT`` or ``WITH`` (any case) to the first
           ``;`` or blank line outside quotes and comments, or to the end (an unclosed fence lands here).
    The result is stripped of surrounding whitespace and trailing semicolons; an empty one counts as none. Blocks
    tagged with another language (``python``) are ignored.

    Example:
        >>> extract_sql("Here it is:\\n```sql\\nSELECT COUNT(*) FROM Track;\\n```")
        'SELECT COUNT(*) FROM Track'
        >>> extract_sql("select Name from Genre; -- all genres")
        'select Name from Genre'
    """
    if not answer:
        return None
    blocks = [(match.group(1).lower(), match.group(2)) for match in _FENCE_RE.finditer(answer)]
    tagged = [body for tag, body in blocks if tag in _SQL_FENCE_TAGS]
    untagged = [body for tag, body in blocks if not tag]
    if tagged or untagged:
        return _clean_sql((tagged or untagged)[-1])
    start = _STATEMENT_START_RE.search(answer)
    if start is None:
        return None
    text = answer[start.start() :]
    return _clean_sql(text[: _statement_end(text)])


def _make_authorizer(refused: list[str]):
    def authorize(action: int, arg1: str | None, arg2: str | None, db_name: str | None, source: str | None) -> int:
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and arg1 is not None and arg1.lower() in READ_PRAGMAS:
            return sqlite3.SQLITE_OK
        name = _ACTION_NAMES.get(action, f"action {action}")
        refused.append(f"{name} {arg1}" if arg1 else name)
        return sqlite3.SQLITE_DENY

    return authorize


def _error_reason(exc: Exception, refused: list[str], late: bool, time_limit_s: float) -> str:
    message = " ".join(str(exc).split())
    if late and "interrupted" in message:
        return f"time limit of {time_limit_s:g} s exceeded"
    if refused:
        return f"refused: only read-only queries may run (denied: {refused[0]})"
    if "readonly" in message or "read-only" in message:
        return f"refused: the database is read-only ({message})"
    return f"SQL error: {message}"


def _clean_sql(text: str) -> str | None:
    sql = text.strip().rstrip(";").strip()
    return sql or None


def _statement_end(text: str) -> int:
    """Index of the first ``;`` or blank line in ``text`` outside quotes and comments, else ``len(text)``."""
    index = 0
    while index < len(text):
        char = text[index]
        if char == ";":
            return index
        if char == "\n" and _BLANK_LINE_RE.match(text, index):
            return index
        if char in "'\"`":
            close = text.find(char, index + 1)
            index = len(text) if close < 0 else close + 1
        elif text.startswith("--", index):
            close = text.find("\n", index)
            index = len(text) if close < 0 else close
        elif text.startswith("/*", index):
            close = text.find("*/", index + 2)
            index = len(text) if close < 0 else close + 2
        else:
            index += 1
    return len(text)


def _as_number(value: Value) -> int | float | None:
    """The value as a number: ints and floats as they are, a decimal-literal string parsed, else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str) and _DECIMAL_RE.fullmatch(value):
        return float(value) if "." in value else int(value)
    return None


def _cells_equal(value: Value, gold: Value, tolerance: float = NUMBER_TOLERANCE) -> bool:
    if value is None or gold is None:
        return value is None and gold is None
    if isinstance(value, str) and isinstance(gold, str):
        return value == gold
    number, gold_number = _as_number(value), _as_number(gold)
    if number is None or gold_number is None:
        return value == gold
    if isinstance(number, int) and isinstance(gold_number, int):
        return number == gold_number
    return math.isclose(number, gold_number, rel_tol=RELATIVE_TOLERANCE, abs_tol=tolerance)


def rows_equal(row: Row, gold: Row, tolerance: float = NUMBER_TOLERANCE) -> bool:
    return all(_cells_equal(value, cell, tolerance) for value, cell in zip(row, gold, strict=True))


def _cell_bucket(value: Value) -> tuple[str, Value]:
    """A key that two cells share whenever :func:`_cells_equal` may hold for them."""
    if value is None:
        return ("null", None)
    if _as_number(value) is not None:
        return ("number", None)
    return (type(value).__name__, value)


def _multiset_equal(rows: Sequence[Row], golds: Sequence[Row]) -> bool:
    """Whether the rows can be paired one-to-one with the gold rows (same length assumed), greedily per bucket."""
    buckets: dict[tuple[tuple[str, Value], ...], list[Row]] = defaultdict(list)
    for row in rows:
        buckets[tuple(_cell_bucket(value) for value in row)].append(row)
    for gold in golds:
        bucket = buckets.get(tuple(_cell_bucket(value) for value in gold))
        if not bucket:
            return False
        for index, row in enumerate(bucket):
            if rows_equal(row, gold):
                del bucket[index]
                break
        else:
            return False
    return True


def _column_key(value: Value) -> tuple[int, float, str]:
    """Sort key of a cell for column signatures: nulls, then numbers (and decimal strings), then strings, blobs."""
    if value is None:
        return (0, 0.0, "")
    number = _as_number(value)
    if number is not None:
        return (1, float(number), "")
    if isinstance(value, bytes):
        return (3, 0.0, value.hex())
    return (2, 0.0, str(value))


def _columns_equal(keys: list[tuple[int, float, str]], gold_keys: list[tuple[int, float, str]]) -> bool:
    """Whether two sorted column signatures hold the same values (numbers within the tolerance)."""
    return all(
        kind == gold_kind
        and text == gold_text
        and math.isclose(number, gold_number, rel_tol=RELATIVE_TOLERANCE, abs_tol=NUMBER_TOLERANCE)
        for (kind, number, text), (gold_kind, gold_number, gold_text) in zip(keys, gold_keys, strict=True)
    )


def _column_order(rows: Sequence[Row], golds: Sequence[Row]) -> tuple[int, ...] | None:
    """For each gold column, the one candidate column with the same values; ``None`` when that is not unique."""
    width = len(golds[0])
    if width < 2:
        return None
    signatures = [sorted(_column_key(row[k]) for row in rows) for k in range(width)]
    gold_signatures = [sorted(_column_key(row[j]) for row in golds) for j in range(width)]
    order: list[int] = []
    for gold_signature in gold_signatures:
        matches = [k for k, signature in enumerate(signatures) if _columns_equal(signature, gold_signature)]
        if len(matches) != 1:
            return None
        order.append(matches[0])
    if len(set(order)) != width or order == list(range(width)):
        return None
    return tuple(order)
