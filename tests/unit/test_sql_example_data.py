"""The SQL agent example's data and reward: gold rows, bands, split, read-only execution, comparison, extraction."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from examples.sql_agent import make_gold
from examples.sql_agent.reward import Value, compare_results, extract_sql, run_sql, score_answer, score_sql
from examples.sql_agent.tasks import (
    BANDS,
    DB_PATH,
    QUESTIONS_PATH,
    Cell,
    SqlTask,
    connect_readonly,
    load_splits,
    load_tasks,
    schema_sql,
    split_tasks,
)

TASKS = load_tasks()
BY_ID = {task.task_id: task for task in TASKS}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the data --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS, ids=[task.task_id for task in TASKS])
def test_gold_sql_reruns_to_exactly_the_stored_rows(task: SqlTask) -> None:
    result = run_sql(task.gold_sql)
    assert result.error is None
    assert result.columns == task.columns
    assert result.rows == task.gold_rows
    assert score_sql(task.gold_sql, task).reward == 1.0


def test_questions_file_is_what_make_gold_writes() -> None:
    # Also re-runs make_gold's checks: no tie-dependent answer, floats with two decimals, well-separated rows.
    assert make_gold.render_jsonl(make_gold.build_tasks()) == QUESTIONS_PATH.read_text(encoding="utf-8")


def test_bands_ids_and_shapes() -> None:
    assert len(TASKS) == 60
    assert {band: sum(task.band == band for task in TASKS) for band in BANDS} == {"easy": 20, "medium": 20, "hard": 20}
    assert len(BY_ID) == len(TASKS)
    for task in TASKS:
        assert task.task_id.split("-")[0] == task.band
        assert task.gold_rows, task.task_id
        assert all(len(row) == len(task.columns) for row in task.gold_rows), task.task_id
    assert sorted(task.task_id for task in TASKS if task.order_matters) == [
        "easy-20",
        "hard-02",
        "hard-09",
        "medium-09",
    ]


def test_task_round_trips_through_json() -> None:
    task = BY_ID["hard-12"]
    assert SqlTask.model_validate(task.model_dump(mode="json")) == task


def test_load_tasks_rejects_duplicate_ids(tmp_path: Path) -> None:
    line = QUESTIONS_PATH.read_text(encoding="utf-8").splitlines()[0]
    path = tmp_path / "questions.jsonl"
    path.write_text(f"{line}\n{line}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="duplicate task_id 'easy-01'"):
        load_tasks(path)


def test_split_is_stratified_deterministic_and_pinned() -> None:
    train, val = load_splits()
    assert (len(train), len(val)) == (45, 15)
    assert {task.task_id for task in train}.isdisjoint(task.task_id for task in val)
    # Regression lock: changing the split changes every reported val score; do it on purpose only.
    assert [task.task_id for task in val] == [
        "easy-03",
        "easy-05",
        "easy-11",
        "easy-17",
        "easy-19",
        "medium-03",
        "medium-06",
        "medium-07",
        "medium-10",
        "medium-13",
        "hard-02",
        "hard-04",
        "hard-12",
        "hard-18",
        "hard-20",
    ]
    assert split_tasks(list(reversed(TASKS)))[1] == list(reversed(val))
    assert split_tasks(TASKS, 0.0) == (TASKS, [])
    with pytest.raises(ValueError, match="val_fraction"):
        split_tasks(TASKS, 1.5)


def test_make_gold_rejects_an_answer_that_depends_on_a_tie(monkeypatch: pytest.MonkeyPatch) -> None:
    # Metallica and U2 both have 10 albums: the 4th and 5th places depend on how the tie is broken.
    top5 = (
        "SELECT ar.Name, COUNT(*) AS albums FROM Artist ar JOIN Album al ON al.ArtistId = ar.ArtistId "
        "GROUP BY ar.ArtistId ORDER BY albums DESC LIMIT 5"
    )
    monkeypatch.setattr(make_gold, "QUESTIONS", [("medium-99", "Top 5 artists by albums, most first?", top5, True)])
    with pytest.raises(ValueError, match="medium-99: with renumbered ids .* how ties are broken"):
        make_gold.build_tasks()


def test_schema_sql_lists_every_table() -> None:
    schema = schema_sql()
    assert schema.count("CREATE TABLE") == 11
    assert schema.startswith("CREATE TABLE [Album]")


# --- execution -------------------------------------------------------------------------------------------------------


def test_connection_is_read_only_even_without_the_authorizer() -> None:
    connection = connect_readonly()
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            connection.execute("INSERT INTO Genre (GenreId, Name) VALUES (99, 'Polka')")
    finally:
        connection.close()
    with pytest.raises(FileNotFoundError):
        connect_readonly(DB_PATH.with_name("missing.db"))


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE Track",
        "INSERT INTO Genre (GenreId, Name) VALUES (99, 'Polka')",
        "UPDATE Track SET UnitPrice = 0",
        "DELETE FROM InvoiceLine",
        "CREATE TABLE Notes (body TEXT)",
        "ATTACH DATABASE 'other.db' AS other",
        "PRAGMA query_only = OFF",
        "VACUUM",
        "BEGIN",
    ],
)
def test_writes_are_refused_and_the_file_is_unchanged(tmp_path: Path, sql: str) -> None:
    db_path = tmp_path / "chinook.db"
    shutil.copyfile(DB_PATH, db_path)
    before = _sha256(db_path)
    score = score_sql(sql, BY_ID["easy-01"], db_path)
    assert score.reward == 0.0
    # Which authorizer action SQLite asks about first (DROP TABLE -> DELETE sqlite_master) may vary by version.
    assert score.reason.startswith("refused: only read-only queries may run (denied: ")
    assert _sha256(db_path) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["chinook.db"]
    assert run_sql("SELECT COUNT(*) FROM Track", db_path).rows == ((3503,),)


def test_refusal_names_the_denied_action() -> None:
    reason = run_sql("INSERT INTO Genre (GenreId, Name) VALUES (99, 'Polka')").error
    assert reason == "refused: only read-only queries may run (denied: INSERT Genre)"


def test_schema_pragmas_are_allowed() -> None:
    result = run_sql("PRAGMA table_info(Genre)")
    assert result.error is None
    assert [row[1] for row in result.rows] == ["GenreId", "Name"]


def test_runaway_query_stops_at_the_time_limit() -> None:
    started = time.monotonic()
    score = score_sql(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n",
        BY_ID["easy-01"],
        time_limit_s=0.3,
    )
    elapsed_s = time.monotonic() - started
    assert (score.reward, score.reason) == (0.0, "time limit of 0.3 s exceeded")
    assert elapsed_s < 3.0


def test_row_and_size_limits() -> None:
    assert run_sql("SELECT TrackId FROM Track", max_rows=10).error == "too many rows: more than 10"
    assert len(run_sql("SELECT TrackId FROM Track LIMIT 10", max_rows=10).rows) == 10
    assert run_sql("SELECT zeroblob(2000000)").error == "SQL error: string or blob too big"


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELEC COUNT(*) FROM Customer", 'SQL error: near "SELEC": syntax error'),
        ("SELECT COUNT(*) FROM Customers", "SQL error: no such table: Customers"),
        ("SELECT 1; SELECT 2", "SQL error: You can only execute one statement at a time."),
        ("-- nothing", "not a query: the statement returns no columns"),
    ],
)
def test_query_errors_score_zero_with_a_reason(sql: str, reason: str) -> None:
    score = score_sql(sql, BY_ID["easy-01"])
    assert (score.reward, score.reason) == (0.0, reason)


# --- comparison ------------------------------------------------------------------------------------------------------


def test_gold_matches_and_a_wrong_query_does_not() -> None:
    task = BY_ID["easy-03"]
    gold = score_sql(task.gold_sql, task)
    assert (gold.reward, gold.reason) == (1.0, "match")
    wrong = score_sql("SELECT FirstName, LastName FROM Customer WHERE Country = 'France'", task)
    assert (wrong.reward, wrong.reason) == (0.0, "wrong result: rows differ from the gold rows")
    fewer = score_sql("SELECT FirstName, LastName FROM Customer WHERE Country = 'Brazil' LIMIT 4", task)
    assert (fewer.reward, fewer.reason) == (0.0, "wrong result: expected 5 rows, got 4")
    wider = score_sql("SELECT FirstName, LastName, City FROM Customer WHERE Country = 'Brazil'", task)
    assert (wider.reward, wider.reason) == (0.0, "wrong result: expected 2 columns, got 3")


def test_row_order_counts_only_when_the_question_asks_for_it() -> None:
    ordered = BY_ID["easy-20"]
    assert ordered.order_matters
    shuffled = "SELECT Name FROM (SELECT Name FROM Track ORDER BY Milliseconds DESC LIMIT 5) ORDER BY Name"
    score = score_sql(shuffled, ordered)
    assert (score.reward, score.reason) == (0.0, "wrong result: the right rows in the wrong order")
    unordered = BY_ID["easy-03"]
    assert not unordered.order_matters
    reordered = "SELECT FirstName, LastName FROM Customer WHERE Country = 'Brazil' ORDER BY LastName DESC"
    assert score_sql(reordered, unordered).reward == 1.0


def test_columns_are_reordered_only_when_unambiguous() -> None:
    swapped = "SELECT LastName, FirstName FROM Customer WHERE Country = 'Brazil'"
    assert score_sql(swapped, BY_ID["easy-03"]).reward == 1.0
    # Both gold columns hold {a, b, c}: which candidate column is which is ambiguous, so no reordering is tried.
    gold = [("a", "b"), ("b", "c"), ("c", "a")]
    assert compare_results([("b", "a"), ("c", "b"), ("a", "c")], gold, order_matters=False) is not None
    assert compare_results([("b", "c"), ("a", "b"), ("c", "a")], gold, order_matters=False) is None


@pytest.mark.parametrize(
    ("value", "gold", "equal"),
    [
        (21.0, 21, True),
        (2.6749, 2.67, True),
        (2.675, 2.67, True),
        (2.68, 2.67, False),
        (2.6, 2.67, False),
        ("2009", 2009, True),
        ("03", 3, True),
        (1290, 1289, False),
        ("021", "21", False),
        ("Rock", "rock", False),
        (None, None, True),
        (None, 0, False),
        ("", None, False),
    ],
)
def test_cell_comparison(value: Value, gold: Cell, equal: bool) -> None:
    assert (compare_results([(value,)], [(gold,)], order_matters=False) is None) is equal


def test_duplicate_rows_count_as_a_multiset() -> None:
    gold = [("Music", 3290), ("Music", 3290), ("Grunge", 15)]
    assert compare_results([("Grunge", 15), ("Music", 3290), ("Music", 3290)], gold, order_matters=False) is None
    assert compare_results([("Grunge", 15), ("Grunge", 15), ("Music", 3290)], gold, order_matters=False) is not None


# --- extraction ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "sql"),
    [
        ("```sql\nSELECT COUNT(*) FROM Track;\n```", "SELECT COUNT(*) FROM Track"),
        (
            "Draft:\n```sql\nSELECT 1\n```\nFinal:\n```SQL\nSELECT Name\nFROM Genre\n```\nDone.",
            "SELECT Name\nFROM Genre",
        ),
        ("```python\nprint(1)\n```\n```\nSELECT 2;;\n```", "SELECT 2"),
        ("```sqlite\nWITH x AS (SELECT 1) SELECT * FROM x\n```", "WITH x AS (SELECT 1) SELECT * FROM x"),
        (
            "The query is:\nSELECT Name FROM Genre WHERE Name = 'a;b'; It lists genres.",
            "SELECT Name FROM Genre WHERE Name = 'a;b'",
        ),
        ("select count(*)\nfrom Track\n\nThis counts the tracks.", "select count(*)\nfrom Track"),
        ("SELECT 1 -- first; one\nFROM Track;", "SELECT 1 -- first; one\nFROM Track"),
        ("```sql\nSELECT Name FROM Track", "SELECT Name FROM Track"),
        ("  with t as (select 1) select * from t", "with t as (select 1) select * from t"),
        ("Answer: SELECT 1", None),
        ("I do not know.", None),
        ("```sql\n;\n```", None),
        ("", None),
        (None, None),
    ],
)
def test_extract_sql(answer: str | None, sql: str | None) -> None:
    assert extract_sql(answer) == sql


def test_score_answer_extracts_then_scores() -> None:
    task = BY_ID["easy-01"]
    right = score_answer(f"Here you go:\n```sql\n{task.gold_sql};\n```", task)
    assert (right.reward, right.reason) == (1.0, "match")
    none = score_answer("There are 59 customers.", task)
    assert (none.reward, none.reason, none.result) == (0.0, "no SQL found in the answer", None)
