"""The calc agent: a plain ``openai`` tool-calling loop with one calculator tool, and its shaped reward.

Protocol of one rollout (:func:`run_episode`):
    1. messages = [system prompt, the task's question]; the request carries ``tools=[CALCULATOR_TOOL]``.
    2. While fewer than ``max_tool_calls`` calculator calls were made, call the model. A reply with tool calls is
       appended (assistant message with its ``tool_calls``), each call is executed by :func:`run_tool_call` and
       answered with a ``tool`` message (the result, or an ``Error: ...`` string). A reply without tool calls is the
       final reply. Calls beyond the budget in one reply are answered with an error and not executed.
    3. Budget spent and still no final reply: when ``final_answer_turn`` is on (off by default: the demo measures
       the strict protocol, where the model must answer on its own), a user message asks
       for the answer and the model is called once more *without* tools; its reply is the final reply (a "forced"
       answer). The untrained model repeats its call until the budget runs out (see the baseline study), so
       without this turn it would never answer at all; the forced answer is still scored for ``correct`` but earns
       no ``answer_line`` credit, so answering on its own is always worth more.
    4. The answer is the text after the last ``Answer:`` of the final reply (:func:`extract_answer_line`).

Reward (:func:`compute_reward`, weights in ``REWARD_WEIGHTS``), each component emitted as a named reward:
    * ``format_call`` 0.1: at least one well-formed call (name ``calculator``, JSON arguments with a string
      ``expression``);
    * ``tool_ok`` 0.1: at least one call returned a value (not an error);
    * ``answer_line`` 0.25: after at least one successful tool result, the model itself (not the forced turn)
      ended with an ``Answer:`` line holding a number or a choice letter. A bonus for any ``Answer:`` line made
      guessing without the tool a local optimum: the first demo run collapsed onto it within two steps;
    * ``correct`` 1.0: the answer is right (:func:`tasks.is_correct`). Its mean over a set is the accuracy.
    The returned final reward is their sum. The partial credits are binary, not per call, so repeating a call
    earns nothing more; the best wrong rollout (0.45) is below the worst right one (1.0); after a tool result, a
    loop without an answer (0.2) is below answering on its own (>= 0.45); a wrong guess without the tool (0) is
    below any rollout that used the tool.

This module is agent-side: it imports ``openai`` and ``agentbolt``'s client API, never torch, transformers or the
server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from openai import OpenAI
from openai.types.chat import ChatCompletion

from agentbolt import LLM, emit_reward, rollout
from agentbolt.runner.agent import FunctionAgent

from .calculator import calculate, is_error
from .tasks import Task, first_number, is_correct

MAX_TOOL_CALLS = 3
DEFAULT_TEMPERATURE = 1.0
DEFAULT_MAX_TOKENS = 192
TOOL_NAME = "calculator"

REWARD_WEIGHTS: dict[str, float] = {"format_call": 0.1, "tool_ok": 0.1, "answer_line": 0.25, "correct": 1.0}
"""Reward component name -> value when the component is earned (0 otherwise)."""

SYSTEM_PROMPT = (
    "You are a math assistant with a calculator tool.\n"
    "To compute, call the calculator once with the whole arithmetic expression, for example "
    '{"name": "calculator", "arguments": {"expression": "(12 + 3) * 4"}}.\n'
    "The tool result is the exact value: do not call the tool again for it.\n"
    "After the tool result, reply with a final line: Answer: <number>\n"
    "If the question lists lettered choices, answer with the letter."
)
TOOL_RESULT_FORMAT = (
    "{result}\nThe calculator returned the exact value. Do not call it again. Reply now with: Answer: {result}"
)
"""The ``tool`` message of a successful call. Measured on the untrained model (32 train tasks, the 10 whose first
call worked, 4 samples each): with the bare value it answers after the result in 2/40 samples (0/10 greedy); with
this reminder in 13/40 (1/10 greedy). The reminder gives GRPO answered rollouts to reinforce from the first step,
while greedy evaluation of the untrained model still almost never answers. Without it, the first demo runs learned
to call the tool every time (train reward 0.03 -> 0.2) and then never saw an answer to reinforce."""
FINAL_ANSWER_PROMPT = (
    "You have used the calculator {calls} times, the limit. Reply now with the final line: Answer: <number>"
)

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Evaluate an arithmetic expression with numbers, + - * / ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "for example (12 + 3) * 4 / 5"}},
            "required": ["expression"],
        },
    },
}

_ANSWER_RE = re.compile(r"answer\s*[:：]\s*(.*)", re.IGNORECASE)
_CHOICE_RE = re.compile(r"\(?[A-E](?![A-Za-z0-9])")
_SAMPLING_KEYS = ("temperature", "max_tokens", "top_p", "seed")

CreateCompletion = Callable[..., ChatCompletion]
"""``client.chat.completions.create`` of a sync ``openai.OpenAI`` client, or a stand-in with the same contract."""


@dataclass(frozen=True)
class CalcAgentConfig:
    """Settings of the agent's protocol.

    Attributes:
        max_tool_calls: calculator calls executed per rollout at most.
        final_answer_turn: after the budget is spent without a final reply, ask once more without tools.
        system_prompt: the system message.
        tool_result_format: the ``tool`` message of a successful call; ``{result}`` is the calculator's value.
    """

    max_tool_calls: int = MAX_TOOL_CALLS
    final_answer_turn: bool = False
    system_prompt: str = SYSTEM_PROMPT
    tool_result_format: str = TOOL_RESULT_FORMAT

    def __post_init__(self) -> None:
        if self.max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0, got {self.max_tool_calls}")


@dataclass(frozen=True)
class ToolOutcome:
    """What one tool call did.

    Attributes:
        result: the text sent back to the model as the ``tool`` message.
        well_formed: the call named ``calculator`` and its arguments were a JSON object with a string
            ``expression``.
        ok: well formed and the calculator returned a value (not an error).
    """

    result: str
    well_formed: bool
    ok: bool


@dataclass
class EpisodeFacts:
    """The facts of one rollout that the reward reads (counts are calls, not turns).

    Attributes:
        tool_calls: calls executed against the budget, malformed ones included.
        well_formed_calls: of those, the well-formed ones.
        tool_ok_calls: of those, the ones that returned a value.
        answered: the final reply has an ``Answer:`` line holding a number or a choice letter.
        forced_answer: the final reply came from the extra turn without tools (budget spent).
        correct: the answer matches the gold.
    """

    tool_calls: int = 0
    well_formed_calls: int = 0
    tool_ok_calls: int = 0
    answered: bool = False
    forced_answer: bool = False
    correct: bool = False


@dataclass
class Episode:
    """One executed rollout: the conversation, the final reply, the parsed answer and the facts."""

    messages: list[dict[str, Any]]
    final_text: str | None
    answer_text: str | None
    facts: EpisodeFacts = field(default_factory=EpisodeFacts)


def run_tool_call(name: str | None, arguments: str | Mapping[str, object] | None) -> ToolOutcome:
    """Execute one tool call (``function.name`` and ``function.arguments``, a JSON string) with the calculator.

    Never raises: a wrong name, bad JSON or a missing/non-string ``expression`` gives an ``Error: ...`` result that
    tells the model the right form, with ``well_formed=False``.
    """
    usage = 'use {"name": "calculator", "arguments": {"expression": "..."}}'
    if name != TOOL_NAME:
        return ToolOutcome(f'Error: unknown tool "{name}"; the only tool is calculator; {usage}', False, False)
    if isinstance(arguments, Mapping):
        parsed: object = dict(arguments)
    else:
        try:
            parsed = json.loads(arguments or "")
        except (json.JSONDecodeError, TypeError):
            return ToolOutcome(f"Error: the arguments are not valid JSON; {usage}", False, False)
    expression = parsed.get("expression") if isinstance(parsed, dict) else None
    if not isinstance(expression, str):
        return ToolOutcome(f"Error: the arguments need a string field expression; {usage}", False, False)
    result = calculate(expression)
    return ToolOutcome(result, True, not is_error(result))


def extract_answer_line(text: str | None) -> str | None:
    """The text after the last ``Answer:`` (case-insensitive) in ``text``, up to the end of its line, stripped."""
    if not text:
        return None
    matches = list(_ANSWER_RE.finditer(text))
    if not matches:
        return None
    return matches[-1].group(1).strip().strip("*").strip()


def parse_answer(text: str | None) -> str | None:
    """The first number or fraction of the last ``Answer:`` line of ``text`` (``"Answer: 2/3 cup"`` -> ``"2/3"``)."""
    return first_number(extract_answer_line(text))


def has_answer(answer_text: str | None) -> bool:
    """Whether an ``Answer:`` line's text holds a number/fraction or starts with a choice letter A-E."""
    if answer_text is None:
        return False
    return first_number(answer_text) is not None or _CHOICE_RE.match(answer_text) is not None


def compute_reward(facts: EpisodeFacts) -> dict[str, float]:
    """The reward components of one rollout; the final reward is their sum.

    Returns:
        ``{"format_call", "tool_ok", "answer_line", "correct"}`` -> value, each either 0.0 or its
        ``REWARD_WEIGHTS`` value. ``answer_line`` needs an answer the model gave on its own (not forced)
        after at least one successful tool result.
    """
    earned = {
        "format_call": facts.well_formed_calls > 0,
        "tool_ok": facts.tool_ok_calls > 0,
        # Only an answer given after a tool result earns the format bonus: a bonus for any Answer: line makes
        # guessing without the tool a local optimum (measured: the first demo run collapsed onto it in 2 steps).
        "answer_line": facts.answered and not facts.forced_answer and facts.tool_ok_calls > 0,
        "correct": facts.correct,
    }
    return {name: REWARD_WEIGHTS[name] if hit else 0.0 for name, hit in earned.items()}


def sampling_kwargs(sampling_parameters: Mapping[str, object]) -> dict[str, object]:
    """Request keyword arguments from ``LLM.sampling_parameters``: temperature (default 1.0), max_tokens (192),
    and top_p / seed when given. Other keys are ignored."""
    kwargs: dict[str, object] = {"temperature": DEFAULT_TEMPERATURE, "max_tokens": DEFAULT_MAX_TOKENS}
    kwargs.update({key: sampling_parameters[key] for key in _SAMPLING_KEYS if key in sampling_parameters})
    return kwargs


def run_episode(
    create: CreateCompletion,
    task: Task,
    *,
    model: str,
    sampling: Mapping[str, object] | None = None,
    config: CalcAgentConfig | None = None,
) -> Episode:
    """Run the agent's loop on one task (protocol in the module docstring) and score it.

    Args:
        create: ``client.chat.completions.create`` of a sync OpenAI client pointed at the gateway.
        task: the task; its ``question`` is the user message.
        model: the model name to request.
        sampling: request keyword arguments (see :func:`sampling_kwargs`).
        config: protocol settings; defaults to :class:`CalcAgentConfig`.

    Raises:
        openai.OpenAIError: a request failed (the runner records the attempt as failed, not scored 0).
    """
    config = config or CalcAgentConfig()
    sampling = dict(sampling or sampling_kwargs({}))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": config.system_prompt},
        {"role": "user", "content": task["question"]},
    ]
    facts = EpisodeFacts()
    final_text: str | None = None
    finished = False
    while facts.tool_calls < config.max_tool_calls:
        message = create(model=model, messages=messages, tools=[CALCULATOR_TOOL], **sampling).choices[0].message
        calls = message.tool_calls or []
        if not calls:
            final_text, finished = message.content, True
            break
        messages.append(_assistant_message(message.content, calls))
        for call in calls:
            function = getattr(call, "function", None)
            if facts.tool_calls >= config.max_tool_calls:
                result = "Error: no calculator calls left; reply with the final line: Answer: <number>"
            else:
                outcome = run_tool_call(getattr(function, "name", None), getattr(function, "arguments", None))
                facts.tool_calls += 1
                facts.well_formed_calls += outcome.well_formed
                facts.tool_ok_calls += outcome.ok
                result = config.tool_result_format.format(result=outcome.result) if outcome.ok else outcome.result
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    if not finished and config.final_answer_turn:
        messages.append({"role": "user", "content": FINAL_ANSWER_PROMPT.format(calls=facts.tool_calls)})
        message = create(model=model, messages=messages, **sampling).choices[0].message
        final_text = message.content
        facts.forced_answer = True
    if final_text is not None:
        messages.append({"role": "assistant", "content": final_text})
    answer_text = extract_answer_line(final_text)
    facts.answered = has_answer(answer_text)
    facts.correct = facts.answered and is_correct(answer_text, task)
    return Episode(messages=messages, final_text=final_text, answer_text=answer_text, facts=facts)


def make_calc_agent(config: CalcAgentConfig | None = None) -> FunctionAgent:
    """Build the ``@rollout`` agent with the given protocol settings (``calc_agent`` uses the defaults).

    The agent emits each reward component with ``emit_reward(value, name=...)`` and returns their sum.
    """
    settings = config or CalcAgentConfig()

    def calc_agent(task: Task, llm: LLM) -> float:
        client = OpenAI(base_url=llm.endpoint, api_key="agentbolt", max_retries=0)
        try:
            episode = run_episode(
                client.chat.completions.create,
                task,
                model=llm.model,
                sampling=sampling_kwargs(llm.sampling_parameters),
                config=settings,
            )
        finally:
            client.close()
        rewards = compute_reward(episode.facts)
        for name, value in rewards.items():
            emit_reward(value, name=name)
        return sum(rewards.values())

    return rollout(calc_agent)


calc_agent = make_calc_agent()
"""The calc agent with the default protocol: ``MAX_TOOL_CALLS`` calls, then one forced answer turn."""


def _assistant_message(content: str | None, calls: list[Any]) -> dict[str, Any]:
    tool_calls = []
    for call in calls:
        function = getattr(call, "function", None)
        tool_calls.append(
            {
                "id": call.id,
                "type": "function",
                "function": {"name": getattr(function, "name", ""), "arguments": getattr(function, "arguments", "")},
            }
        )
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}
