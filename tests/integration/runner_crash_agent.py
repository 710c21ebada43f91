"""An agent whose runner processes die as they start, and its tasks (a tasks module): a train job with it fails
after its store is created and its first rollouts are enqueued, before any rollout ends (``RunnerWatch`` stops it).

The parent process imports this module too (the job checks the agent before anything starts) and must survive it;
a runner is a spawned child process, where ``multiprocessing.parent_process()`` is set.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

from agentbolt import LLM, rollout

if multiprocessing.parent_process() is not None:  # a runner process: die at once, as a broken environment would
    os._exit(3)


@rollout
def agent(task: dict, llm: LLM) -> float:
    return 0.0


def load_train_tasks(size: int = 4) -> list[dict[str, Any]]:
    return [{"task_id": f"t{i}", "question": f"{i} + 1"} for i in range(size)]


def load_val_sets(n_per_set: int | None = None) -> dict[str, list[dict[str, Any]]]:
    return {"small": load_train_tasks(2)[: n_per_set or 2]}
