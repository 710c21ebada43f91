"""Tasks of the room agent: the 57 booking requests of ``data/room_tasks.jsonl`` and their fixed split.

Every task is a :class:`Task` dict: the request's fields at the top level (so a prompt template can use
``{date}``, ``{time}``, ``{duration_min}``, ``{attendees}``, ``{needs}``, ``{accessible_required}``), plus
``task_id`` (the file's ``id``, ``s01``...) and ``expected_choice`` (a room name or ``"No Room"``).

Split (:func:`split_tasks`): the tasks are shuffled with ``random.Random(SPLIT_SEED)`` and cut into
``SPLIT_SIZES`` = 19 train, 19 validation, 19 test, each kept in file order. Train feeds the optimizer's critiques,
validation selects candidates, test is only for the before/after report.
"""

from __future__ import annotations

import json
import random
from typing import TypedDict

from .rooms import DATA_DIR

TASKS_FILE = DATA_DIR / "room_tasks.jsonl"
SPLIT_SEED = 0
SPLIT_SIZES = {"train": 19, "val": 19, "test": 19}


class Task(TypedDict):
    """One booking request and its expected choice."""

    task_id: str
    date: str
    time: str
    duration_min: int
    attendees: int
    needs: list[str]
    accessible_required: bool
    expected_choice: str


def load_tasks() -> list[Task]:
    """All 57 tasks in file order."""
    tasks: list[Task] = []
    with TASKS_FILE.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            row = json.loads(line)
            request = row["task_input"]
            tasks.append(
                Task(
                    task_id=row["id"],
                    date=request["date"],
                    time=request["time"],
                    duration_min=int(request["duration_min"]),
                    attendees=int(request["attendees"]),
                    needs=list(request["needs"]),
                    accessible_required=bool(request["accessible_required"]),
                    expected_choice=row["expected_choice"],
                )
            )
    return tasks


def split_tasks(seed: int = SPLIT_SEED) -> dict[str, list[Task]]:
    """``{"train", "val", "test"}`` -> tasks (sizes ``SPLIT_SIZES``, disjoint, together all 57, each in file order).

    Deterministic in ``seed``: the same seed gives the same split on every machine (``random.Random`` is specified).
    """
    tasks = load_tasks()
    order = list(range(len(tasks)))
    random.Random(seed).shuffle(order)
    split: dict[str, list[Task]] = {}
    start = 0
    for name, size in SPLIT_SIZES.items():
        split[name] = [tasks[index] for index in sorted(order[start : start + size])]
        start += size
    return split


def load_train_tasks(size: int | None = None) -> list[Task]:
    """The training tasks (the first ``size`` of them when given)."""
    train = split_tasks()["train"]
    return train if size is None else train[:size]


def load_val_sets(n_per_set: int | None = None) -> dict[str, list[Task]]:
    """``{"val": tasks}`` (the first ``n_per_set`` when given); the shape ``agentbolt train`` expects."""
    val = split_tasks()["val"]
    return {"val": val if n_per_set is None else val[:n_per_set]}


def load_test_tasks() -> list[Task]:
    """The held-out test tasks."""
    return split_tasks()["test"]
