"""Write (or check) ``data/questions.jsonl``: the questions below with the gold rows their ``gold_sql`` returns.

Usage (from the repository root)::

    python -m examples.sql_agent.make_gold          # rewrite data/questions.jsonl
    python -m examples.sql_agent.make_gold --check  # exit 1 when the file differs from what would be written

Gold rows are never typed by hand: each ``gold_sql`` is run on ``data/chinook.db`` through ``reward.run_sql`` (the
scorer's own read-only executor). Every question is checked before anything is written:
    * the result is not empty, has at most 100 rows, and each float in it has at most two decimals (money and
      averages are rounded in the SQL, so re-running gives the same bytes);
    * the rows do not depend on how ties happen to be broken: the query is also run on ``SHUFFLE_SEEDS`` in-memory
      copies of the database whose integer primary keys (and the foreign keys pointing at them) are renumbered by
      a random permutation, with ``PRAGMA reverse_unordered_selects = ON``, and must match the gold under the
      reward's own comparison each time (as a list when ``order_matters``). Scans, groups and sorts then meet tied
      rows in another order, so a top-k whose cut falls inside a tie, or an ordering with ties inside, fails;
    * no two gold rows are within twice the reward's number tolerance of each other (see ``reward.py``), so the
      reward's greedy row matching is exact;
    * the gold SQL scores 1.0 with ``reward.score_sql``.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
from collections import Counter
from pathlib import Path

from .reward import NUMBER_TOLERANCE, compare_results, rows_equal, run_sql, score_sql
from .tasks import DB_PATH, QUESTIONS_PATH, SqlTask, connect_readonly

MAX_GOLD_ROWS = 100
SHUFFLE_SEEDS = (1, 2, 3)

# (task_id, question, gold_sql, order_matters); the band is the prefix of the task_id.
QUESTIONS: list[tuple[str, str, str, bool]] = [
    # --- easy: one table; filters, counts, DISTINCT, simple ORDER BY ... LIMIT -------------------------------------
    ("easy-01", "How many customers are there?", "SELECT COUNT(*) FROM Customer", False),
    ("easy-02", "How many tracks cost 1.99?", "SELECT COUNT(*) FROM Track WHERE UnitPrice = 1.99", False),
    (
        "easy-03",
        "List the first and last names of all customers who live in Brazil.",
        "SELECT FirstName, LastName FROM Customer WHERE Country = 'Brazil'",
        False,
    ),
    ("easy-04", "What are the names of all the media types?", "SELECT Name FROM MediaType", False),
    (
        "easy-05",
        "How many invoices were billed to Germany?",
        "SELECT COUNT(*) FROM Invoice WHERE BillingCountry = 'Germany'",
        False,
    ),
    (
        "easy-06",
        "List the titles of all albums whose title starts with 'Greatest'.",
        "SELECT Title FROM Album WHERE Title LIKE 'Greatest%'",
        False,
    ),
    (
        "easy-07",
        "How many employees have the job title 'Sales Support Agent'?",
        "SELECT COUNT(*) FROM Employee WHERE Title = 'Sales Support Agent'",
        False,
    ),
    ("easy-08", "What is the largest invoice total?", "SELECT MAX(Total) FROM Invoice", False),
    (
        "easy-09",
        "How many different countries do our customers live in?",
        "SELECT COUNT(DISTINCT Country) FROM Customer",
        False,
    ),
    (
        "easy-10",
        "List the first and last names of the employees who were hired in 2003.",
        "SELECT FirstName, LastName FROM Employee WHERE strftime('%Y', HireDate) = '2003'",
        False,
    ),
    (
        "easy-11",
        "What is the average unit price of a track, rounded to two decimal places?",
        "SELECT ROUND(AVG(UnitPrice), 2) FROM Track",
        False,
    ),
    (
        "easy-12",
        "How many tracks are longer than 10 minutes?",
        "SELECT COUNT(*) FROM Track WHERE Milliseconds > 600000",
        False,
    ),
    (
        "easy-13",
        "List the playlist names, each name only once.",
        "SELECT DISTINCT Name FROM Playlist",
        False,
    ),
    (
        "easy-14",
        "How many customers have no company listed?",
        "SELECT COUNT(*) FROM Customer WHERE Company IS NULL",
        False,
    ),
    (
        "easy-15",
        "What is the name of the longest track?",
        "SELECT Name FROM Track ORDER BY Milliseconds DESC LIMIT 1",
        False,
    ),
    (
        "easy-16",
        "What are the email addresses of the customers who live in Paris?",
        "SELECT Email FROM Customer WHERE City = 'Paris'",
        False,
    ),
    (
        "easy-17",
        "How many tracks have no composer listed?",
        "SELECT COUNT(*) FROM Track WHERE Composer IS NULL",
        False,
    ),
    (
        "easy-18",
        "What is the sum of all invoice totals, rounded to two decimal places?",
        "SELECT ROUND(SUM(Total), 2) FROM Invoice",
        False,
    ),
    (
        "easy-19",
        "How many invoices were issued in 2011?",
        "SELECT COUNT(*) FROM Invoice WHERE strftime('%Y', InvoiceDate) = '2011'",
        False,
    ),
    (
        "easy-20",
        "What are the names of the 5 longest tracks, longest first?",
        "SELECT Name FROM Track ORDER BY Milliseconds DESC LIMIT 5",
        True,
    ),
    # --- medium: joins, GROUP BY, aggregates ------------------------------------------------------------------------
    (
        "medium-01",
        "How many tracks does each genre have? Return the genre name and its number of tracks.",
        "SELECT g.Name, COUNT(*) FROM Genre g JOIN Track t ON t.GenreId = g.GenreId GROUP BY g.GenreId",
        False,
    ),
    (
        "medium-02",
        "List the titles of the albums by AC/DC.",
        "SELECT al.Title FROM Album al JOIN Artist ar ON ar.ArtistId = al.ArtistId WHERE ar.Name = 'AC/DC'",
        False,
    ),
    (
        "medium-03",
        "How many albums does Iron Maiden have?",
        "SELECT COUNT(*) FROM Album al JOIN Artist ar ON ar.ArtistId = al.ArtistId WHERE ar.Name = 'Iron Maiden'",
        False,
    ),
    (
        "medium-04",
        "What are the total sales per billing country? Return the country and the sum of its invoice totals, "
        "rounded to two decimal places.",
        "SELECT BillingCountry, ROUND(SUM(Total), 2) FROM Invoice GROUP BY BillingCountry",
        False,
    ),
    (
        "medium-05",
        "How many tracks are there of each media type? Return the media type name and the number of tracks.",
        "SELECT m.Name, COUNT(*) FROM MediaType m JOIN Track t ON t.MediaTypeId = m.MediaTypeId GROUP BY m.MediaTypeId",
        False,
    ),
    (
        "medium-06",
        "List the names of the tracks on the album 'Big Ones'.",
        "SELECT t.Name FROM Track t JOIN Album al ON al.AlbumId = t.AlbumId WHERE al.Title = 'Big Ones'",
        False,
    ),
    (
        "medium-07",
        "How many customers does each support rep look after? Return the employee's first name, last name and "
        "number of customers.",
        "SELECT e.FirstName, e.LastName, COUNT(*) FROM Employee e JOIN Customer c ON c.SupportRepId = e.EmployeeId "
        "GROUP BY e.EmployeeId",
        False,
    ),
    (
        "medium-08",
        "What is the average track length in minutes for each genre? Return the genre name and the average length "
        "in minutes, rounded to two decimal places.",
        "SELECT g.Name, ROUND(AVG(t.Milliseconds) / 60000.0, 2) FROM Genre g JOIN Track t ON t.GenreId = g.GenreId "
        "GROUP BY g.GenreId",
        False,
    ),
    (
        "medium-09",
        "Which 3 artists have the most albums? Return the artist name and the number of albums, most albums first.",
        "SELECT ar.Name, COUNT(*) AS albums FROM Artist ar JOIN Album al ON al.ArtistId = ar.ArtistId "
        "GROUP BY ar.ArtistId ORDER BY albums DESC LIMIT 3",
        True,
    ),
    (
        "medium-10",
        "How many Rock tracks have been sold in total? Count the quantities of all invoice lines for tracks of the "
        "genre Rock.",
        "SELECT SUM(il.Quantity) FROM InvoiceLine il JOIN Track t ON t.TrackId = il.TrackId "
        "JOIN Genre g ON g.GenreId = t.GenreId WHERE g.Name = 'Rock'",
        False,
    ),
    (
        "medium-11",
        "How many tracks are in the playlist 'Grunge'?",
        "SELECT COUNT(*) FROM PlaylistTrack pt JOIN Playlist p ON p.PlaylistId = pt.PlaylistId WHERE p.Name = 'Grunge'",
        False,
    ),
    (
        "medium-12",
        "How many invoices does each customer from Canada have? Return the customer's first name, last name and "
        "number of invoices.",
        "SELECT c.FirstName, c.LastName, COUNT(*) FROM Customer c JOIN Invoice i ON i.CustomerId = c.CustomerId "
        "WHERE c.Country = 'Canada' GROUP BY c.CustomerId",
        False,
    ),
    (
        "medium-13",
        "What was the total revenue in each year? Return the year as a number and the sum of the invoice totals "
        "of that year, rounded to two decimal places.",
        "SELECT CAST(strftime('%Y', InvoiceDate) AS INTEGER), ROUND(SUM(Total), 2) FROM Invoice "
        "GROUP BY strftime('%Y', InvoiceDate)",
        False,
    ),
    (
        "medium-14",
        "Who is Jane Peacock's manager? Return the manager's first and last name.",
        "SELECT m.FirstName, m.LastName FROM Employee e JOIN Employee m ON m.EmployeeId = e.ReportsTo "
        "WHERE e.FirstName = 'Jane' AND e.LastName = 'Peacock'",
        False,
    ),
    (
        "medium-15",
        "How many tracks does each Led Zeppelin album have? Return the album title and its number of tracks.",
        "SELECT al.Title, COUNT(*) FROM Album al JOIN Artist ar ON ar.ArtistId = al.ArtistId "
        "JOIN Track t ON t.AlbumId = al.AlbumId WHERE ar.Name = 'Led Zeppelin' GROUP BY al.AlbumId",
        False,
    ),
    (
        "medium-16",
        "How much has each customer from Germany spent in total? Return the first name, last name and the sum of "
        "their invoice totals, rounded to two decimal places.",
        "SELECT c.FirstName, c.LastName, ROUND(SUM(i.Total), 2) FROM Customer c "
        "JOIN Invoice i ON i.CustomerId = c.CustomerId WHERE c.Country = 'Germany' GROUP BY c.CustomerId",
        False,
    ),
    (
        "medium-17",
        "Which artists have at least one track in the playlist 'Grunge'? List each artist name once.",
        "SELECT DISTINCT ar.Name FROM Playlist p JOIN PlaylistTrack pt ON pt.PlaylistId = p.PlaylistId "
        "JOIN Track t ON t.TrackId = pt.TrackId JOIN Album al ON al.AlbumId = t.AlbumId "
        "JOIN Artist ar ON ar.ArtistId = al.ArtistId WHERE p.Name = 'Grunge'",
        False,
    ),
    (
        "medium-18",
        "What is the average invoice total in each billing city in France? Return the city and the average, "
        "rounded to two decimal places.",
        "SELECT BillingCity, ROUND(AVG(Total), 2) FROM Invoice WHERE BillingCountry = 'France' GROUP BY BillingCity",
        False,
    ),
    (
        "medium-19",
        "How many tracks by Queen are there?",
        "SELECT COUNT(*) FROM Track t JOIN Album al ON al.AlbumId = t.AlbumId "
        "JOIN Artist ar ON ar.ArtistId = al.ArtistId WHERE ar.Name = 'Queen'",
        False,
    ),
    (
        "medium-20",
        "How much revenue did each media type bring in? Return the media type name and the sum of unit price "
        "times quantity over its invoice lines, rounded to two decimal places.",
        "SELECT m.Name, ROUND(SUM(il.UnitPrice * il.Quantity), 2) FROM MediaType m "
        "JOIN Track t ON t.MediaTypeId = m.MediaTypeId JOIN InvoiceLine il ON il.TrackId = t.TrackId "
        "GROUP BY m.MediaTypeId",
        False,
    ),
    # --- hard: multi-joins, HAVING, subqueries, anti-joins, window functions, date logic ---------------------------
    (
        "hard-01",
        "Which customers have spent more than 45 in total? Return their first name, last name and the sum of their "
        "invoice totals, rounded to two decimal places.",
        "SELECT c.FirstName, c.LastName, ROUND(SUM(i.Total), 2) FROM Customer c "
        "JOIN Invoice i ON i.CustomerId = c.CustomerId GROUP BY c.CustomerId HAVING SUM(i.Total) > 45",
        False,
    ),
    (
        "hard-02",
        "Who are the 3 customers who spent the most? Return their first name, last name and total spent "
        "(rounded to two decimal places), highest first.",
        "SELECT c.FirstName, c.LastName, ROUND(SUM(i.Total), 2) AS spent FROM Customer c "
        "JOIN Invoice i ON i.CustomerId = c.CustomerId GROUP BY c.CustomerId ORDER BY SUM(i.Total) DESC LIMIT 3",
        True,
    ),
    (
        "hard-03",
        "What are the total sales of each sales support agent, counting the invoices of the customers they support? "
        "Return the agent's first name, last name and the sum of those invoice totals, rounded to two decimal "
        "places.",
        "SELECT e.FirstName, e.LastName, ROUND(SUM(i.Total), 2) FROM Employee e "
        "JOIN Customer c ON c.SupportRepId = e.EmployeeId JOIN Invoice i ON i.CustomerId = c.CustomerId "
        "GROUP BY e.EmployeeId",
        False,
    ),
    (
        "hard-04",
        "Which genre brought in the second-highest revenue in 2012 (unit price times quantity of its invoice "
        "lines)? Return the genre name.",
        "SELECT g.Name FROM InvoiceLine il JOIN Invoice i ON i.InvoiceId = il.InvoiceId "
        "JOIN Track t ON t.TrackId = il.TrackId JOIN Genre g ON g.GenreId = t.GenreId "
        "WHERE strftime('%Y', i.InvoiceDate) = '2012' GROUP BY g.GenreId "
        "ORDER BY SUM(il.UnitPrice * il.Quantity) DESC LIMIT 1 OFFSET 1",
        False,
    ),
    (
        "hard-05",
        "Which artists have tracks in at least 3 different genres? Return the artist names.",
        "SELECT ar.Name FROM Artist ar JOIN Album al ON al.ArtistId = ar.ArtistId "
        "JOIN Track t ON t.AlbumId = al.AlbumId GROUP BY ar.ArtistId HAVING COUNT(DISTINCT t.GenreId) >= 3",
        False,
    ),
    (
        "hard-06",
        "How many tracks have never been sold?",
        "SELECT COUNT(*) FROM Track t WHERE NOT EXISTS (SELECT 1 FROM InvoiceLine il WHERE il.TrackId = t.TrackId)",
        False,
    ),
    (
        "hard-07",
        "For each country, what is the most that a single customer from that country has spent in total? Return "
        "the country and that amount, rounded to two decimal places.",
        "WITH spent AS (SELECT c.Country, SUM(i.Total) AS total FROM Customer c "
        "JOIN Invoice i ON i.CustomerId = c.CustomerId GROUP BY c.CustomerId) "
        "SELECT Country, ROUND(MAX(total), 2) FROM spent GROUP BY Country",
        False,
    ),
    (
        "hard-08",
        "Which month of 2010 had the highest revenue? Return the month as text in the form YYYY-MM and the sum of "
        "that month's invoice totals, rounded to two decimal places.",
        "SELECT strftime('%Y-%m', InvoiceDate) AS month, ROUND(SUM(Total), 2) FROM Invoice "
        "WHERE strftime('%Y', InvoiceDate) = '2010' GROUP BY month ORDER BY SUM(Total) DESC LIMIT 1",
        False,
    ),
    (
        "hard-09",
        "For each year, show the revenue of that year and the running total of revenue up to and including that "
        "year, ordered by year. Return the year as a number, the yearly revenue and the running total, both "
        "rounded to two decimal places.",
        "WITH yearly AS (SELECT CAST(strftime('%Y', InvoiceDate) AS INTEGER) AS year, SUM(Total) AS revenue "
        "FROM Invoice GROUP BY year) SELECT year, ROUND(revenue, 2), "
        "ROUND(SUM(revenue) OVER (ORDER BY year), 2) FROM yearly ORDER BY year",
        True,
    ),
    (
        "hard-10",
        "Which employees were born before their manager? Return the employee's first and last name.",
        "SELECT e.FirstName, e.LastName FROM Employee e JOIN Employee m ON m.EmployeeId = e.ReportsTo "
        "WHERE e.BirthDate < m.BirthDate",
        False,
    ),
    (
        "hard-11",
        "List the first and last names of the employees who do not manage anyone.",
        "SELECT e.FirstName, e.LastName FROM Employee e "
        "WHERE NOT EXISTS (SELECT 1 FROM Employee r WHERE r.ReportsTo = e.EmployeeId)",
        False,
    ),
    (
        "hard-12",
        "How many tracks does each playlist have? Return one row per playlist (some playlists share a name) with "
        "the playlist name and its number of tracks, including playlists with no tracks (count 0).",
        "SELECT p.Name, COUNT(pt.TrackId) FROM Playlist p "
        "LEFT JOIN PlaylistTrack pt ON pt.PlaylistId = p.PlaylistId GROUP BY p.PlaylistId",
        False,
    ),
    (
        "hard-13",
        "On average, how many invoice lines does an invoice have? Round to two decimal places.",
        "SELECT ROUND(AVG(lines), 2) FROM (SELECT COUNT(*) AS lines FROM InvoiceLine GROUP BY InvoiceId)",
        False,
    ),
    (
        "hard-14",
        "How many customers have never bought a track of the genre Metal?",
        "SELECT COUNT(*) FROM Customer c WHERE NOT EXISTS (SELECT 1 FROM Invoice i "
        "JOIN InvoiceLine il ON il.InvoiceId = i.InvoiceId JOIN Track t ON t.TrackId = il.TrackId "
        "JOIN Genre g ON g.GenreId = t.GenreId WHERE i.CustomerId = c.CustomerId AND g.Name = 'Metal')",
        False,
    ),
    (
        "hard-15",
        "For each year, which genre had the highest revenue (unit price times quantity)? Return the year as a "
        "number, the genre name and that revenue rounded to two decimal places.",
        "WITH revenue AS (SELECT CAST(strftime('%Y', i.InvoiceDate) AS INTEGER) AS year, g.Name AS genre, "
        "SUM(il.UnitPrice * il.Quantity) AS amount, RANK() OVER (PARTITION BY strftime('%Y', i.InvoiceDate) "
        "ORDER BY SUM(il.UnitPrice * il.Quantity) DESC) AS place FROM InvoiceLine il "
        "JOIN Invoice i ON i.InvoiceId = il.InvoiceId JOIN Track t ON t.TrackId = il.TrackId "
        "JOIN Genre g ON g.GenreId = t.GenreId GROUP BY year, g.GenreId) "
        "SELECT year, genre, ROUND(amount, 2) FROM revenue WHERE place = 1",
        False,
    ),
    (
        "hard-16",
        "How many customers bought something in every year from 2009 to 2013?",
        "SELECT COUNT(*) FROM (SELECT CustomerId FROM Invoice "
        "WHERE strftime('%Y', InvoiceDate) BETWEEN '2009' AND '2013' GROUP BY CustomerId "
        "HAVING COUNT(DISTINCT strftime('%Y', InvoiceDate)) = 5)",
        False,
    ),
    (
        "hard-17",
        "Which album has sold the most tracks (sum of invoice line quantities)? Return the album title and the "
        "artist name.",
        "SELECT al.Title, ar.Name FROM InvoiceLine il JOIN Track t ON t.TrackId = il.TrackId "
        "JOIN Album al ON al.AlbumId = t.AlbumId JOIN Artist ar ON ar.ArtistId = al.ArtistId "
        "GROUP BY al.AlbumId ORDER BY SUM(il.Quantity) DESC LIMIT 1",
        False,
    ),
    (
        "hard-18",
        "For each customer in Germany, how many days passed between their first and their last invoice? Return the "
        "first name, last name and the number of days.",
        "SELECT c.FirstName, c.LastName, "
        "CAST(julianday(MAX(i.InvoiceDate)) - julianday(MIN(i.InvoiceDate)) AS INTEGER) FROM Customer c "
        "JOIN Invoice i ON i.CustomerId = c.CustomerId WHERE c.Country = 'Germany' GROUP BY c.CustomerId",
        False,
    ),
    (
        "hard-19",
        "How many invoices have a total above the average invoice total of their own billing country?",
        "SELECT COUNT(*) FROM Invoice i WHERE i.Total > "
        "(SELECT AVG(o.Total) FROM Invoice o WHERE o.BillingCountry = i.BillingCountry)",
        False,
    ),
    (
        "hard-20",
        "What percentage of the total revenue (unit price times quantity) comes from each media type? Return the "
        "media type name and its percentage, rounded to two decimal places.",
        "SELECT m.Name, ROUND(100.0 * SUM(il.UnitPrice * il.Quantity) / "
        "(SELECT SUM(UnitPrice * Quantity) FROM InvoiceLine), 2) FROM MediaType m "
        "JOIN Track t ON t.MediaTypeId = m.MediaTypeId JOIN InvoiceLine il ON il.TrackId = t.TrackId "
        "GROUP BY m.MediaTypeId",
        False,
    ),
]


def build_tasks(db_path: Path = DB_PATH) -> list[SqlTask]:
    """Run every question's gold SQL and return the tasks, after the checks of the module docstring.

    Raises:
        ValueError: a question fails a check (the message names it and says which).
    """
    ids = [task_id for task_id, _, _, _ in QUESTIONS]
    duplicates = sorted(task_id for task_id, count in Counter(ids).items() if count > 1)
    if duplicates:
        raise ValueError(f"duplicate task ids: {duplicates}")
    shuffled_copies = [shuffled_copy(db_path, seed) for seed in SHUFFLE_SEEDS]
    try:
        return [_build_task(*question, db_path=db_path, shuffled_copies=shuffled_copies) for question in QUESTIONS]
    finally:
        for copy in shuffled_copies:
            copy.close()


def _build_task(
    task_id: str,
    question: str,
    gold_sql: str,
    order_matters: bool,
    *,
    db_path: Path,
    shuffled_copies: list[sqlite3.Connection],
) -> SqlTask:
    """Run ``gold_sql`` with the scorer's executor and check the task (see the module docstring)."""
    result = run_sql(gold_sql, db_path)
    if not result.ok:
        raise ValueError(f"{task_id}: gold SQL failed: {result.error}")
    task = SqlTask.model_validate(
        {
            "task_id": task_id,
            "band": task_id.split("-")[0],
            "question": question,
            "gold_sql": gold_sql,
            "columns": list(result.columns),
            "gold_rows": [list(row) for row in result.rows],
            "order_matters": order_matters,
        }
    )
    _check_task(task, db_path, shuffled_copies)
    return task


def render_jsonl(tasks: list[SqlTask]) -> str:
    """One JSON object a line, keys in model order, non-ASCII kept as is."""
    return "".join(json.dumps(task.model_dump(mode="json"), ensure_ascii=False) + "\n" for task in tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 when the file is out of date")
    parser.add_argument("--out", type=Path, default=QUESTIONS_PATH)
    args = parser.parse_args(argv)
    text = render_jsonl(build_tasks())
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        if current != text:
            print(f"{args.out} is out of date: run python -m examples.sql_agent.make_gold", file=sys.stderr)
            return 1
        print(f"{args.out}: {len(QUESTIONS)} tasks, up to date")
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {len(QUESTIONS)} tasks to {args.out}")
    return 0


def _check_task(task: SqlTask, db_path: Path, shuffled_copies: list[sqlite3.Connection]) -> None:
    rows = task.gold_rows
    if not rows or len(rows) > MAX_GOLD_ROWS:
        raise ValueError(f"{task.task_id}: {len(rows)} gold rows, want 1..{MAX_GOLD_ROWS}")
    for row in rows:
        for value in row:
            if isinstance(value, float) and round(value, 2) != value:
                raise ValueError(f"{task.task_id}: float {value!r} has more than two decimals; round it in the SQL")
    for seed, shuffled in enumerate(shuffled_copies, start=1):
        other_rows = [tuple(row) for row in shuffled.execute(task.gold_sql).fetchall()]
        mismatch = compare_results(other_rows, rows, order_matters=task.order_matters)
        if mismatch is not None:
            raise ValueError(
                f"{task.task_id}: with renumbered ids (seed {seed}) {mismatch}: the answer depends on how ties are "
                "broken; reword the question so that one result is right"
            )
    for index, row in enumerate(rows):
        for other in rows[index + 1 :]:
            if row != other and rows_equal(row, other, tolerance=2 * NUMBER_TOLERANCE):
                raise ValueError(f"{task.task_id}: gold rows {row} and {other} are too close to tell apart")
    score = score_sql(task.gold_sql, task, db_path)
    if score.reward != 1.0:
        raise ValueError(f"{task.task_id}: the gold SQL scores {score.reward} ({score.reason})")


def shuffled_copy(db_path: Path, seed: int) -> sqlite3.Connection:
    """An in-memory copy of the database with every single-column integer primary key renumbered.

    Each table's ids are permuted by ``random.Random(seed)`` (tables in name order); the foreign keys that point at
    them (``PRAGMA foreign_key_list``, self-references included) are rewritten with the same permutation, so every
    join, count and sum is unchanged while scan and group order are not. ``reverse_unordered_selects`` is on.
    """
    source = connect_readonly(db_path)
    copy = sqlite3.connect(":memory:")
    try:
        source.backup(copy)
    finally:
        source.close()
    rng = random.Random(seed)
    tables = [row[0] for row in copy.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    referrers: dict[str, list[tuple[str, str]]] = {table: [] for table in tables}
    for child in tables:
        for foreign_key in copy.execute(f"PRAGMA foreign_key_list([{child}])"):
            referrers[foreign_key[2]].append((child, foreign_key[3]))
    copy.execute("CREATE TEMP TABLE id_map (old INTEGER PRIMARY KEY, new INTEGER NOT NULL)")
    for table in tables:
        key = [row[1] for row in copy.execute(f"PRAGMA table_info([{table}])") if row[5] > 0]
        if len(key) != 1:
            continue
        ids = [row[0] for row in copy.execute(f"SELECT [{key[0]}] FROM [{table}] ORDER BY 1")]
        copy.execute("DELETE FROM id_map")
        copy.executemany("INSERT INTO id_map VALUES (?, ?)", zip(ids, rng.sample(ids, len(ids)), strict=True))
        for owner, column in [(table, key[0]), *referrers[table]]:
            # Negate first so that no intermediate state repeats a primary key, then flip the sign back.
            copy.execute(
                f"UPDATE [{owner}] SET [{column}] = -(SELECT new FROM id_map WHERE old = [{column}]) "
                f"WHERE [{column}] IS NOT NULL"
            )
            copy.execute(f"UPDATE [{owner}] SET [{column}] = -[{column}] WHERE [{column}] IS NOT NULL")
    copy.commit()
    copy.execute("PRAGMA reverse_unordered_selects = ON")
    return copy


if __name__ == "__main__":
    raise SystemExit(main())
