"""``agentbolt rollouts``: list a store's rollouts with their status, reward and failure cause.

The cause is the failure taxonomy's (:mod:`agentbolt.adapter.causes`), read from each rollout's last attempt and its
spans, so a cause filter reads the spans of every rollout it looks at: rollouts are read newest first, a page at a
time, until ``limit`` rows match.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from agentbolt.adapter.causes import CAUSES, failure_cause
from agentbolt.errors import ConfigError
from agentbolt.store.base import LightningStore
from agentbolt.types import TERMINAL_ROLLOUT_STATUSES, RolloutMode, RolloutStatus

PAGE_SIZE = 200
"""Rollouts read per store query."""

TASK_KEYS = ("question", "prompt", "query", "task", "instruction", "input", "text")
"""Fields of a task dict that name it, first found first (:func:`task_label`)."""

TASK_LABEL_CHARS = 200
"""Most characters of a task label (the table shows fewer)."""


def task_label(task: Any) -> str:
    """A one-line name for a rollout's task (its ``input``): the first of :data:`TASK_KEYS` a dict has, else the
    task as compact JSON (a dict's first string field alone, e.g. a unit, would make different tasks look the
    same); whitespace runs made one space, cut to :data:`TASK_LABEL_CHARS` characters (``...`` at the end when
    cut)."""
    value: Any = task
    if isinstance(task, dict):
        value = next((task[k] for k in TASK_KEYS if isinstance(task.get(k), str) and task[k].strip()), None)
        if value is None:
            value = task
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    label = " ".join(value.split())
    return label if len(label) <= TASK_LABEL_CHARS else label[: TASK_LABEL_CHARS - 3] + "..."


@dataclass(frozen=True)
class RolloutRow:
    """One listed rollout. ``cause`` is ``""`` for a rollout that trained fine or is not finished."""

    rollout_id: str
    status: str
    mode: str
    attempts: int
    final_reward: float | None
    cause: str
    detail: str
    task: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "task": self.task,
            "status": self.status,
            "mode": self.mode,
            "attempts": self.attempts,
            "final_reward": self.final_reward,
            "cause": self.cause or None,
            "detail": self.detail or None,
        }


def parse_filters(
    status: str | None, mode: str | None, cause: str | None
) -> tuple[list[RolloutStatus] | None, RolloutMode | None, str | None]:
    """The filters of the command line, checked.

    Raises:
        ConfigError: an unknown status, mode or cause (the message lists the known ones).
    """
    statuses = None
    if status is not None:
        try:
            statuses = [RolloutStatus(s.strip()) for s in status.split(",") if s.strip()]
        except ValueError:
            raise ConfigError(
                f"unknown --status {status!r}; use one or more of {', '.join(s.value for s in RolloutStatus)}"
            ) from None
    parsed_mode = None
    if mode is not None:
        try:
            parsed_mode = RolloutMode(mode)
        except ValueError:
            raise ConfigError(f"unknown --mode {mode!r}; use train, val or test") from None
    if cause is not None and cause not in CAUSES:
        raise ConfigError(f"unknown --cause {cause!r}; use one of {', '.join(CAUSES)}")
    return statuses, parsed_mode, cause


async def list_rollouts(
    store: LightningStore,
    *,
    statuses: list[RolloutStatus] | None = None,
    mode: RolloutMode | None = None,
    cause: str | None = None,
    limit: int = 50,
) -> list[RolloutRow]:
    """Up to ``limit`` rollouts matching the filters, newest first, each with its cause."""
    rows: list[RolloutRow] = []
    offset = 0
    while len(rows) < limit:
        page = await store.query_rollouts(
            status=statuses, mode=mode, limit=PAGE_SIZE, offset=offset, sort_by="enqueue_time", descending=True
        )
        if not page:
            break
        offset += len(page)
        for rollout in page:
            found = None
            attempts = await store.query_attempts(rollout.rollout_id) if rollout.num_attempts else []
            if rollout.status in TERMINAL_ROLLOUT_STATUSES:
                last = attempts[-1] if attempts else None
                spans = await store.query_spans(rollout.rollout_id, last.attempt_id) if last is not None else []
                found = failure_cause(rollout, last, spans)
            if cause is not None and (found is None or found.cause != cause):
                continue
            rows.append(
                RolloutRow(
                    rollout.rollout_id,
                    rollout.status.value,
                    rollout.mode.value,
                    len(attempts),
                    rollout.final_reward,
                    found.cause if found is not None else "",
                    found.detail if found is not None else "",
                    task_label(rollout.input),
                )
            )
            if len(rows) >= limit:
                break
    return rows


def render_rows(rows: list[RolloutRow], *, more: bool = False) -> Table:
    """The rows as a table, with a caption counting the causes; ``more``: more rollouts match than are shown (the
    caption says so, and how to see them)."""
    table = Table(show_lines=False, caption=_caption(rows, more))
    table.add_column("rollout", no_wrap=True, min_width=27)  # whole: the id is what `agentbolt inspect` takes
    table.add_column("task", no_wrap=True, max_width=40, overflow="ellipsis")
    for column in ("status", "mode", "attempts", "reward", "cause", "detail"):
        table.add_column(column, overflow="fold" if column == "detail" else "ellipsis")
    for row in rows:
        reward = "" if row.final_reward is None else f"{row.final_reward:g}"
        table.add_row(
            row.rollout_id, row.task, row.status, row.mode, str(row.attempts), reward, row.cause, row.detail[:120]
        )
    return table


def _caption(rows: list[RolloutRow], more: bool) -> str:
    counts = Counter(row.cause for row in rows if row.cause)
    listed = f"{len(rows)} rollouts, newest first"
    if more:
        listed = f"the newest {len(rows)} rollouts; more match (raise --limit to see them)"
    if not counts:
        return listed
    return listed + "; causes: " + ", ".join(f"{cause} {n}" for cause, n in counts.most_common())
