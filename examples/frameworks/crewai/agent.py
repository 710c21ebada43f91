"""The calc agent with CrewAI: a one-agent crew with a calculator tool (see README.md).

The crew is the one of CrewAI's quickstart: an ``Agent`` (role, goal, backstory, tools), a ``Task`` assigned to it
and a sequential ``Crew`` run by ``kickoff()``. ``max_iter`` bounds the agent's loop; when it is reached CrewAI
asks the model once more for a final answer. The lines marked ``# agentbolt`` are the only ones that differ from
running it against OpenAI.

Agent name: CrewAI names an agent by its role, so the model calls are recorded under ``Calculator``.
"""

from __future__ import annotations

from crewai import LLM as CrewLLM
from crewai import Agent, Crew, Process, Task
from crewai.tools import tool
from examples.frameworks import calc_task
from examples.frameworks.calc_task import INSTRUCTIONS, MAX_TOKENS, MAX_TURNS, TEMPERATURE, score_answer

from agentbolt import LLM, emit_reward

ROLE = "Calculator"


@tool("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with numbers, + - * / ** and parentheses, e.g. (12 + 3) * 4 / 5."""
    return calc_task.calculator(expression)


def calc_agent(task: calc_task.Task, llm: LLM) -> None:
    """Solve one calc task; the runner passes the task and the LLM resource (an endpoint scoped to the attempt)."""
    model = CrewLLM(
        model=f"openai/{llm.model}",
        base_url=llm.endpoint,  # agentbolt: the gateway's URL
        api_key="agentbolt",  # agentbolt: the gateway needs no key
        max_tokens=MAX_TOKENS,
        temperature=TEMPERATURE,
    )
    solver = Agent(
        role=ROLE,
        goal="Answer arithmetic questions exactly, using the calculator.",
        backstory=INSTRUCTIONS,
        tools=[calculator],
        llm=model,
        max_iter=MAX_TURNS - 1,
        allow_delegation=False,
    )
    question = Task(
        description=task["question"],
        expected_output="The result, on a final line: Answer: <number>",
        agent=solver,
    )
    result = Crew(agents=[solver], tasks=[question], process=Process.sequential).kickoff()
    emit_reward(score_answer(result.raw, task))  # agentbolt: the reward
