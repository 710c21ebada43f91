"""The calc task as the framework examples share it: the instructions, the calculator tool's function and the reward.

Each example (``openai_plain``, ``langgraph``, ``openai_agents``, ``autogen``, ``crewai``) is an agent written the way
its framework's own tutorials write one, solving one task of :mod:`examples.calc_agent.tasks` with the calculator of
:mod:`examples.calc_agent.calculator`. What an agent needs from this module is what any agent has somewhere: its
instructions, its tool and how its answer is scored. Nothing here imports agentbolt or a framework.

Reward: 1.0 when the final reply's answer is right (:func:`examples.calc_agent.tasks.is_correct` on the text after
its last ``Answer:``, else on the whole reply), else 0.0.
"""

from __future__ import annotations

import re

from examples.calc_agent.calculator import calculate
from examples.calc_agent.tasks import Task, is_correct

__all__ = ["INSTRUCTIONS", "MAX_TOKENS", "MAX_TURNS", "TEMPERATURE", "Task", "calculator", "score_answer"]

INSTRUCTIONS = (
    "You are a math assistant with a calculator tool. Call the calculator once with the whole arithmetic "
    "expression. After the tool result, reply with a final line: Answer: <number>"
)
"""The system prompt (or the framework's equivalent: instructions, system message, backstory)."""

CALCULATOR_DESCRIPTION = "Evaluate an arithmetic expression with numbers, + - * / ** and parentheses."

MAX_TOKENS = 64
"""Tokens generated per LLM call at most: the answer is one short line (and keeps the examples' tests fast)."""
MAX_TURNS = 3
"""LLM calls per task at most, where the framework lets the agent bound its loop."""
TEMPERATURE = 1.0
"""Sampling temperature: RL needs sampled, varied rollouts."""

_ANSWER_RE = re.compile(r"answer\s*[:：]\s*(.*)", re.IGNORECASE)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with numbers, + - * / ** and parentheses.

    Args:
        expression: for example ``(12 + 3) * 4 / 5``.

    Returns:
        The exact value as text, or ``Error: <reason>``.
    """
    return calculate(expression)


def score_answer(final_reply: str | None, task: Task) -> float:
    """1.0 when ``final_reply`` answers ``task`` right (the text after its last ``Answer:``, else the whole reply,
    checked by :func:`~examples.calc_agent.tasks.is_correct`), else 0.0; ``None`` (no reply) scores 0.0."""
    if not final_reply:
        return 0.0
    matches = list(_ANSWER_RE.finditer(final_reply))
    answer = matches[-1].group(1) if matches else final_reply
    return 1.0 if is_correct(answer, task) else 0.0
