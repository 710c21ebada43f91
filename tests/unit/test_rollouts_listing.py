"""``agentbolt rollouts``' task column: the label of a task, and the row's JSON and table (a real SQLite store)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.console import Console

from agentbolt.cli.rollouts_cmd import TASK_LABEL_CHARS, list_rollouts, render_rows, task_label
from agentbolt.store.sqlite import SqliteLightningStore


def test_task_label_names_a_task_by_its_question_or_else_the_whole_task() -> None:
    assert task_label({"id": 7, "question": "What is  2+3?\n", "answer": "5"}) == "What is 2+3?"
    assert task_label({"id": 7, "prompt": "", "query": "Add two numbers"}) == "Add two numbers"  # empty prompt skipped
    # no naming field: the whole task, so that tasks that share a unit do not look the same
    assert task_label({"value": 5, "from": "km", "to": "mile"}) == '{"value":5,"from":"km","to":"mile"}'
    assert task_label({"a": 1, "b": [2, 3]}) == '{"a":1,"b":[2,3]}'
    assert task_label("plain  text") == "plain text"
    assert task_label(None) == "null"
    long = task_label({"question": "x" * 500})
    assert len(long) == TASK_LABEL_CHARS and long.endswith("...")


def test_listing_carries_each_rollouts_task(tmp_path: Path) -> None:
    async def run() -> list:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            await store.enqueue_rollout({"question": "How many legs has a spider?", "answer": "8"})
            await store.enqueue_rollout({"expression": "12*7"})
            return await list_rollouts(store)
        finally:
            await store.close()

    rows = asyncio.run(run())
    assert [row.to_json()["task"] for row in rows] == [
        '{"expression":"12*7"}',
        "How many legs has a spider?",
    ]  # newest first
    console = Console(width=200, record=True)
    console.print(render_rows(rows))
    text = console.export_text()
    assert "task" in text and "How many legs has a spider?" in text
