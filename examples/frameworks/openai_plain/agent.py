"""The calc agent with the plain ``openai`` client: a chat-completions tool-calling loop (see README.md).

The agent is the loop of OpenAI's function-calling guide: call the model with ``tools``; run each tool call it makes
and answer it with a ``tool`` message; stop at the first reply without tool calls, or after ``MAX_TURNS`` calls.
The lines marked ``# agentbolt`` are the only ones that differ from running it against OpenAI.
"""

from __future__ import annotations

import json
from typing import Any

from examples.frameworks.calc_task import (
    CALCULATOR_DESCRIPTION,
    INSTRUCTIONS,
    MAX_TOKENS,
    MAX_TURNS,
    TEMPERATURE,
    Task,
    calculator,
    score_answer,
)
from openai import OpenAI

import agentbolt
from agentbolt import LLM, emit_reward

AGENT_NAME = "calculator"
"""The name its LLM calls are recorded under (``agentbolt.agent``): plain ``openai`` code has no agent names."""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": CALCULATOR_DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "for example (12 + 3) * 4 / 5"}},
                "required": ["expression"],
            },
        },
    }
]


def run_tool(name: str, arguments: str) -> str:
    """Run one tool call; a wrong name or bad arguments are answered with an error the model can read."""
    if name != "calculator":
        return f"Error: unknown tool {name!r}; the only tool is calculator"
    try:
        expression = json.loads(arguments)["expression"]
    except (ValueError, KeyError, TypeError):
        return 'Error: the arguments must be JSON like {"expression": "1 + 2"}'
    return calculator(str(expression))


def solve(client: OpenAI, model: str, question: str) -> str | None:
    """Answer ``question``; returns the final reply, or ``None`` when ``MAX_TURNS`` calls gave none."""
    messages: list[Any] = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": question}]
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=MAX_TOKENS, temperature=TEMPERATURE
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            if call.type == "function":
                result = run_tool(call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None


def calc_agent(task: Task, llm: LLM) -> None:
    """Solve one calc task; the runner passes the task and the LLM resource (an endpoint scoped to the attempt)."""
    client = OpenAI(base_url=llm.endpoint, api_key="agentbolt", max_retries=0)  # agentbolt: the gateway's URL
    try:
        with agentbolt.agent(AGENT_NAME):  # agentbolt (optional): name the calls; frameworks name them themselves
            final_reply = solve(client, llm.model, task["question"])
    finally:
        client.close()
    emit_reward(score_answer(final_reply, task))  # agentbolt: the reward
