"""Example: a two-agent text-to-SQL system on the Chinook database; only the writer agent is trained (see README.md).

Modules:
    * ``tasks``: the 60 questions with gold result sets (``data/questions.jsonl``), the train/val split, and the
      read-only connection to ``data/chinook.db``;
    * ``reward``: read-only execution with a time and row limit, result-set comparison, SQL extraction;
    * ``make_gold``: regenerates and checks ``data/questions.jsonl`` from the gold SQL (never typed by hand);
    * ``agents``: the writer and the checker, each under its ``agentbolt.agent(...)`` name, and the agent
      ``sql_agents`` that runs them;
    * ``train``: trains the writer only (``agent_match="writer"``), ``python -m examples.sql_agent.train``.

The names below are loaded lazily, so importing the package costs nothing until one is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "SqlTask": "tasks",
    "load_tasks": "tasks",
    "load_splits": "tasks",
    "split_tasks": "tasks",
    "schema_sql": "tasks",
    "QueryResult": "reward",
    "SqlScore": "reward",
    "run_sql": "reward",
    "score_sql": "reward",
    "score_answer": "reward",
    "extract_sql": "reward",
    "sql_agents": "agents",
    "make_sql_agents": "agents",
    "SqlAgentsConfig": "agents",
    "run_system": "agents",
}

if TYPE_CHECKING:
    from .agents import SqlAgentsConfig, make_sql_agents, run_system, sql_agents
    from .reward import QueryResult, SqlScore, extract_sql, run_sql, score_answer, score_sql
    from .tasks import SqlTask, load_splits, load_tasks, schema_sql, split_tasks

__all__ = [
    "QueryResult",
    "SqlAgentsConfig",
    "SqlScore",
    "SqlTask",
    "extract_sql",
    "load_splits",
    "load_tasks",
    "make_sql_agents",
    "run_sql",
    "run_system",
    "schema_sql",
    "score_answer",
    "score_sql",
    "split_tasks",
    "sql_agents",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
