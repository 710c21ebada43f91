"""The calc agent with the OpenAI Agents SDK (``openai-agents``): one ``Agent`` with a function tool (see README.md).

The agent is the SDK's quickstart agent: ``Agent(name, instructions, tools=[calculator])`` run by ``Runner.run``
with ``max_turns`` bounding its loop. The lines marked ``# agentbolt`` are the only ones that differ from running it
against OpenAI. The SDK calls OpenAI's Responses API by default; the gateway serves Chat Completions, so the model is
given as ``OpenAIChatCompletionsModel`` over a client with the gateway's URL: the SDK's documented way to use any
OpenAI-compatible endpoint.

Agent name: the SDK records each agent run as an agent span named after the agent, so the model calls are recorded
under ``calculator_agent``.
"""

from __future__ import annotations

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelBehaviorError,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
)
from examples.frameworks import calc_task
from examples.frameworks.calc_task import INSTRUCTIONS, MAX_TOKENS, MAX_TURNS, TEMPERATURE, Task, score_answer
from openai import AsyncOpenAI

from agentbolt import LLM, emit_reward

AGENT_NAME = "calculator_agent"


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with numbers, + - * / ** and parentheses.

    Args:
        expression: for example (12 + 3) * 4 / 5.
    """
    return calc_task.calculator(expression)


async def calc_agent(task: Task, llm: LLM) -> None:
    """Solve one calc task; the runner passes the task and the LLM resource (an endpoint scoped to the attempt)."""
    client = AsyncOpenAI(base_url=llm.endpoint, api_key="agentbolt", max_retries=0)  # agentbolt: the gateway's URL
    agent = Agent(
        name=AGENT_NAME,
        instructions=INSTRUCTIONS,
        tools=[calculator],
        model=OpenAIChatCompletionsModel(model=llm.model, openai_client=client),  # agentbolt: Chat Completions
        model_settings=ModelSettings(max_tokens=MAX_TOKENS, temperature=TEMPERATURE),
    )
    try:
        result = await Runner.run(agent, task["question"], max_turns=MAX_TURNS)
        final_reply = str(result.final_output)
    except MaxTurnsExceeded:  # still calling tools after MAX_TURNS model calls
        final_reply = None
    except ModelBehaviorError:  # the model called a tool the agent does not have
        final_reply = None
    finally:
        await client.close()
    emit_reward(score_answer(final_reply, task))  # agentbolt: the reward
