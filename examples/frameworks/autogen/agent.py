"""The calc agent with AutoGen AgentChat: one ``AssistantAgent`` with a function tool (see README.md).

The agent is AgentChat's quickstart agent: ``AssistantAgent(name, model_client, tools=[calculator])`` run with
``agent.run(task=...)``. It makes up to ``MAX_TURNS - 1`` rounds of tool calls (``max_tool_iterations``), then one
more model call reflects on the tool results (``reflect_on_tool_use``) to write the final reply. The lines marked
``# agentbolt`` are the only ones that differ from running it against OpenAI. The model client needs ``model_info``
for any model name OpenAI does not serve (here the gateway's), as for every OpenAI-compatible endpoint.

Agent name: the agent's ``name``, ``calculator_agent``.
"""

from __future__ import annotations

from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelFamily, ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient
from examples.frameworks import calc_task
from examples.frameworks.calc_task import INSTRUCTIONS, MAX_TOKENS, MAX_TURNS, TEMPERATURE, Task, score_answer

from agentbolt import LLM, emit_reward

AGENT_NAME = "calculator_agent"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with numbers, + - * / ** and parentheses, e.g. (12 + 3) * 4 / 5."""
    return calc_task.calculator(expression)


async def calc_agent(task: Task, llm: LLM) -> None:
    """Solve one calc task; the runner passes the task and the LLM resource (an endpoint scoped to the attempt)."""
    model_client = OpenAIChatCompletionClient(
        model=llm.model,
        base_url=llm.endpoint,  # agentbolt: the gateway's URL
        api_key="agentbolt",  # agentbolt: the gateway needs no key
        model_info=ModelInfo(  # agentbolt: what the (non-OpenAI) model behind the URL can do
            vision=False, function_calling=True, json_output=False, family=ModelFamily.UNKNOWN, structured_output=False
        ),
        max_tokens=MAX_TOKENS,
        temperature=TEMPERATURE,
        max_retries=0,
    )
    agent = AssistantAgent(
        name=AGENT_NAME,
        model_client=model_client,
        tools=[calculator],
        system_message=INSTRUCTIONS,
        max_tool_iterations=MAX_TURNS - 1,
        reflect_on_tool_use=True,
    )
    try:
        result = await agent.run(task=task["question"])
    finally:
        await model_client.close()
    final_reply = result.messages[-1].to_text() if result.messages else None
    emit_reward(score_answer(final_reply, task))  # agentbolt: the reward
