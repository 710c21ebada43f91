"""Agents of the soak benchmark (``benchmarks/soak.py``), imported by its runner processes (``agentbolt run``).

No model: each task says what the agent does (``task["kind"]``), so the driver knows how every rollout should end:

- ``ok``: sleeps ``task["sleep_s"]``, returns ``task["reward"]`` (succeeded).
- ``spans``: emits a few messages and named rewards, then an unnamed final reward, and returns None (succeeded).
- ``raise``: raises ``ValueError`` (failed, ``agent_exception``).
- ``none``: returns None and emits no reward (failed, ``no_reward``).
- ``string``: returns the string ``"abc"`` (failed, ``bad_reward``).
- ``crash``: its process exits at once with ``os._exit(3)`` (failed, the runner names the dead process).
- ``hang``: sleeps forever; only given a ``timeout_seconds``, which the runner enforces (``timeout``).
- ``flaky``: raises or succeeds at random, by ``task["fail_p"]`` (retried when the config retries ``failed``).
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import agentbolt


def agent(task: dict[str, Any]) -> Any:
    kind = task["kind"]
    sleep_s = float(task.get("sleep_s", 0.2))
    if kind == "ok":
        time.sleep(sleep_s)
        return float(task["reward"])
    if kind == "spans":
        for i in range(int(task.get("steps", 3))):
            agentbolt.emit_message(f"step {i} of task {task['n']}")
            agentbolt.emit_reward(0.1 * i, name="progress")
            time.sleep(sleep_s / 3)
        agentbolt.emit_reward(float(task["reward"]))
        return None
    if kind == "raise":
        time.sleep(sleep_s / 2)
        raise ValueError(f"soak task {task['n']} raises on purpose")
    if kind == "none":
        time.sleep(sleep_s / 2)
        return None
    if kind == "string":
        return "abc"
    if kind == "crash":
        os._exit(3)
    if kind == "hang":
        time.sleep(10**6)
        return 1.0
    if kind == "flaky":
        time.sleep(sleep_s)
        if random.random() < float(task.get("fail_p", 0.5)):
            raise RuntimeError(f"soak task {task['n']} failed this time")
        return float(task["reward"])
    raise ValueError(f"unknown soak task kind {kind!r}")
