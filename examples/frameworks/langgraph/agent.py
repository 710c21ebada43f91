"""The calc agent with LangGraph and ``langchain-openai``: a two-node tool-calling graph (see README.md).

The graph is the one of LangGraph's tool-calling tutorials: a ``solver`` node calls the chat model with the
calculator bound as a tool, a ``tools`` node (``ToolNode``) runs the calls, and ``tools_condition`` loops back
until the model replies without a tool call. The recursion limit bounds the loop (``MAX_TURNS`` model calls).
The lines marked ``# agentbolt`` are the only ones that differ from running it against OpenAI.

Agent name: LangGraph records each node's name in its runs' metadata (``langgraph_node``), so the model calls are
recorded under ``solver``.
"""

from __future__ import annotations

from examples.frameworks import calc_task
from examples.frameworks.calc_task import INSTRUCTIONS, MAX_TOKENS, MAX_TURNS, TEMPERATURE, Task, score_answer
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agentbolt import LLM, emit_reward

RECURSION_LIMIT = 2 * MAX_TURNS - 1
"""Graph steps at most: solver, tools, solver, ... -- ``MAX_TURNS`` solver steps."""


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with numbers, + - * / ** and parentheses, e.g. (12 + 3) * 4 / 5."""
    return calc_task.calculator(expression)


def build_graph(model: ChatOpenAI) -> CompiledStateGraph:
    """The solver/tools graph around ``model``."""
    model_with_tools = model.bind_tools([calculator])

    def solver(state: MessagesState) -> dict:
        return {"messages": [model_with_tools.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("solver", solver)
    graph.add_node("tools", ToolNode([calculator]))
    graph.add_edge(START, "solver")
    graph.add_conditional_edges("solver", tools_condition)
    graph.add_edge("tools", "solver")
    return graph.compile()


def calc_agent(task: Task, llm: LLM) -> None:
    """Solve one calc task; the runner passes the task and the LLM resource (an endpoint scoped to the attempt)."""
    model = ChatOpenAI(
        model=llm.model,
        base_url=llm.endpoint,  # agentbolt: the gateway's URL
        api_key="agentbolt",  # agentbolt: the gateway needs no key
        max_tokens=MAX_TOKENS,
        temperature=TEMPERATURE,
        max_retries=0,
    )
    graph = build_graph(model)
    messages = [SystemMessage(INSTRUCTIONS), HumanMessage(task["question"])]
    try:
        state = graph.invoke({"messages": messages}, {"recursion_limit": RECURSION_LIMIT})
        final_reply = str(state["messages"][-1].text)
    except GraphRecursionError:  # still calling tools after MAX_TURNS model calls
        final_reply = None
    emit_reward(score_answer(final_reply, task))  # agentbolt: the reward
