"""The ``task_id`` a training rollout carries (its GRPO group key with the step, and what the dashboard and
``agentbolt rollouts`` show): the task's own, else a digest of its content, the same in every step."""

from __future__ import annotations

import hashlib

from agentbolt.trainer.loop import task_identity


def test_a_task_id_is_kept_as_text_and_a_task_without_one_gets_a_content_digest() -> None:
    assert task_identity({"task_id": "calc-7", "question": "1+1"}) == "calc-7"
    assert task_identity({"task_id": 7}) == "7"
    task = {"question": "1+1", "answer": "2"}
    digest = hashlib.sha256(b'{"answer": "2", "question": "1+1"}').hexdigest()[:12]
    assert task_identity(task) == f"task-{digest}"
    assert task_identity({"answer": "2", "question": "1+1"}) == task_identity(task)  # key order does not matter
    assert task_identity({"question": "1+2", "answer": "3"}) != task_identity(task)
