"""SQL of :meth:`~agentbolt.store.base.LightningStore.search_rollouts` for the PostgreSQL store.

Same plan as :mod:`agentbolt.store.sqlite_search`: a ``COUNT(*)`` with the filters, then the page's ``enqueue_seq``
keys (``LIMIT``/``OFFSET``), then those rows, in one transaction. Text search lower-cases under ``COLLATE "C"``,
which folds ASCII letters only (like :func:`agentbolt.store.search.ascii_lower`); ``input::text`` is jsonb's text
form. Metadata filters use jsonb containment (``metadata @> {"task_id": ...}``).
"""

from __future__ import annotations

from typing import Any, cast

from psycopg.types.json import Jsonb

from agentbolt.store import postgres_schema as schema
from agentbolt.store import tables
from agentbolt.store.search import FINISHED_STATUSES, ResourceRewardStats, RolloutSearch, reward_stats_order
from agentbolt.types import Rollout, RolloutMode


def where_clause(search: RolloutSearch) -> tuple[str, list[Any]]:
    """``WHERE ...`` (or ``""``) for the filters of ``search``, and its parameters."""
    where: list[str] = []
    params: list[Any] = []
    if search.status is not None:
        where.append("status = ANY(%s)")
        params.append([s.value for s in search.status])
    if search.mode is not None:
        where.append("mode = %s")
        params.append(search.mode.value)
    if search.resources_id is not None:
        where.append("resources_id = %s")
        params.append(search.resources_id)
    if search.metadata:
        where.append("metadata @> %s")
        params.append(Jsonb(search.metadata))
    if search.reward_min is not None:
        where.append("final_reward >= %s")
        params.append(search.reward_min)
    if search.reward_max is not None:
        where.append("final_reward <= %s")
        params.append(search.reward_max)
    needle = search.needle
    if needle is not None:
        where.append(
            '(strpos(lower(rollout_id COLLATE "C"), %s) > 0 OR strpos(lower(input::text COLLATE "C"), %s) > 0)'
        )
        params.extend([needle, needle])
    return ("WHERE " + " AND ".join(where) if where else ""), params


async def search_rollouts(conn: schema.Conn, search: RolloutSearch) -> tuple[list[Rollout], int]:
    """The page of ``search`` and the number of matching rollouts; run inside one transaction."""
    where, params = where_clause(search)
    cur = await conn.execute(schema.sql(f"SELECT COUNT(*) FROM rollouts {where}"), params)
    (total,) = cast(tuple[int], await cur.fetchone())
    if search.limit == 0 or search.offset >= total:
        return [], total
    order_by = tables.rollout_order_by(search.sort_by, search.descending, text_collation=' COLLATE "C"')
    keys = f"SELECT {tables.ENQUEUE_SEQ} FROM rollouts {where} {order_by} LIMIT %s OFFSET %s"
    clauses = f"WHERE {tables.ENQUEUE_SEQ} IN ({keys}) {order_by}"
    page = await schema.ROLLOUTS.fetch_all(conn, clauses, [*params, search.limit, search.offset])
    return page, total


REWARD_STATS_SQL = (
    "SELECT resources_id, mode, COUNT(*), COUNT(final_reward), AVG(final_reward) FROM rollouts"
    " WHERE status = ANY(%s) GROUP BY resources_id, mode"
)


async def reward_stats(conn: schema.Conn) -> list[ResourceRewardStats]:
    """:meth:`~agentbolt.store.base.LightningStore.reward_stats`: one ``GROUP BY`` over the finished rollouts."""
    cur = await conn.execute(schema.sql(REWARD_STATS_SQL), [[s.value for s in FINISHED_STATUSES]])
    rows = await cur.fetchall()
    return reward_stats_order(
        ResourceRewardStats(
            resources_id=r, mode=RolloutMode(m), n=n, n_with_reward=k, mean_reward=None if mean is None else float(mean)
        )
        for r, m, n, k, mean in rows
    )
