"""Agents for ``test_ray_runners.py``, in their own module so Ray worker processes can import them cheaply
(``ray_agents:tagging_agent`` with this folder on ``sys.path``). They need no model."""

from __future__ import annotations

import time

from agentbolt import emit_reward, rollout


@rollout
def tagging_agent(task: dict) -> float:
    """Emits a named partial reward span, sleeps a little (so both actors get work), returns ``x`` as the reward."""
    emit_reward(0.5, name="partial")
    time.sleep(0.1)
    return float(task["x"])
