"""Example: train Qwen2.5-Coder-0.5B-Instruct with GRPO to use a calculator tool (see README.md).

Modules:
    * ``calculator``: the safe ``ast``-based arithmetic evaluator (the tool);
    * ``tasks``: training tasks, validation sets and the correctness checker;
    * ``agent``: the ``@rollout`` agent ``calc_agent`` and its shaped reward.

The names below are loaded lazily, so importing the tasks does not import ``openai``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "calc_agent": "agent",
    "make_calc_agent": "agent",
    "CalcAgentConfig": "agent",
    "load_train_tasks": "tasks",
    "load_val_sets": "tasks",
    "is_correct": "tasks",
    "calculate": "calculator",
}

if TYPE_CHECKING:
    from .agent import CalcAgentConfig, calc_agent, make_calc_agent
    from .calculator import calculate
    from .tasks import is_correct, load_train_tasks, load_val_sets

__all__ = [
    "CalcAgentConfig",
    "calc_agent",
    "calculate",
    "is_correct",
    "load_train_tasks",
    "load_val_sets",
    "make_calc_agent",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
