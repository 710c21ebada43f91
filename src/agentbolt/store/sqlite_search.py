"""SQL of :meth:`~agentbolt.store.base.LightningStore.search_rollouts` for the SQLite store.

Semantics: :mod:`agentbolt.store.search`. A page is found in two steps: the ordered ``enqueue_seq`` keys of the page
(``LIMIT``/``OFFSET`` over the filtered rows; the sorter carries only keys, not whole rows), then those rows; the
total is a ``COUNT(*)`` with the same filters, in the same read snapshot. Indexes (migration 3 in
:mod:`agentbolt.store.sqlite_schema`): ``rollouts_by_reward`` serves reward ranges and the ``final_reward`` sort.
Text search is a scan: ``instr(lower(...))`` is ASCII case folding, like :func:`agentbolt.store.search.ascii_lower`.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from agentbolt.store import sqlite_schema as schema
from agentbolt.store import tables
from agentbolt.store.search import FINISHED_STATUSES, ResourceRewardStats, RolloutSearch, reward_stats_order
from agentbolt.types import Rollout, RolloutMode


def where_clause(search: RolloutSearch) -> tuple[str, list[Any]]:
    """``WHERE ...`` (or ``""``) for the filters of ``search``, and its parameters."""
    where: list[str] = []
    params: list[Any] = []
    if search.status is not None:
        values = [s.value for s in search.status]
        where.append(f"status IN ({schema.marks(values)})" if values else "0")
        params.extend(values)
    if search.mode is not None:
        where.append("mode = ?")
        params.append(search.mode.value)
    if search.resources_id is not None:
        where.append("resources_id = ?")
        params.append(search.resources_id)
    for key, value in (search.metadata or {}).items():  # keys are identifiers (checked by RolloutSearch)
        where.append(f"json_extract(metadata, '$.{key}') = ?")
        params.append(value)
    if search.reward_min is not None:
        where.append("final_reward >= ?")
        params.append(search.reward_min)
    if search.reward_max is not None:
        where.append("final_reward <= ?")
        params.append(search.reward_max)
    needle = search.needle
    if needle is not None:
        where.append("(instr(lower(rollout_id), ?) > 0 OR instr(lower(input), ?) > 0)")
        params.extend([needle, needle])
    return ("WHERE " + " AND ".join(where) if where else ""), params


def search_rollouts(conn: sqlite3.Connection, search: RolloutSearch) -> tuple[list[Rollout], int]:
    """The page of ``search`` and the number of matching rollouts; run inside one read transaction."""
    where, params = where_clause(search)
    (total,) = conn.execute(f"SELECT COUNT(*) FROM rollouts {where}", params).fetchone()
    if search.limit == 0 or search.offset >= total:
        return [], total
    order_by = tables.rollout_order_by(search.sort_by, search.descending)
    keys = f"SELECT {tables.ENQUEUE_SEQ} FROM rollouts {where} {order_by} LIMIT ? OFFSET ?"
    clauses = f"WHERE {tables.ENQUEUE_SEQ} IN ({keys}) {order_by}"
    page = schema.ROLLOUTS.fetch_all(conn, clauses, [*params, search.limit, search.offset])
    return page, total


REWARD_STATS_SQL = (
    "SELECT resources_id, mode, COUNT(*), COUNT(final_reward), AVG(final_reward) FROM rollouts"
    f" WHERE status IN ({schema.marks(FINISHED_STATUSES)}) GROUP BY resources_id, mode"
)


def reward_stats(conn: sqlite3.Connection) -> list[ResourceRewardStats]:
    """:meth:`~agentbolt.store.base.LightningStore.reward_stats`: one ``GROUP BY`` over the finished rollouts."""
    rows = conn.execute(REWARD_STATS_SQL, [s.value for s in FINISHED_STATUSES]).fetchall()
    return reward_stats_order(
        ResourceRewardStats(resources_id=r, mode=RolloutMode(m), n=n, n_with_reward=k, mean_reward=mean)
        for r, m, n, k, mean in rows
    )
