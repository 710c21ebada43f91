"""The room agent: a plain ``openai`` tool loop with ``get_rooms_and_availability``, an answer written as a small
Python program, and its exact-match reward.

Protocol of one rollout (:func:`run_episode`):
    1. messages = [one user message: the ``prompt_template`` resource filled with the task's request fields];
       the request carries ``tools=[ROOMS_TOOL]``.
    2. Until one tool call succeeds or ``MAX_TOOL_CALLS`` were made, call the model. A reply with tool calls is
       appended, each call is run by :func:`run_tool_call` and answered with a ``tool`` message (JSON, or
       ``Error: ...`` saying what a correct call looks like). A reply without tool calls is the final reply.
    3. Otherwise one last call is made without ``tools`` after the user message :data:`FINAL_ANSWER_REQUEST`, which
       asks for a Python function ``choose(rooms)``; its text is the final reply. One lookup is all a task needs
       (the tool lists every room for the slot).
    4. The choice: when the final reply defines ``choose``, the agent runs it on the last tool result's ``"rooms"``
       (:func:`~examples.room_agent.program.run_program`, a separate limited process) and parses the string it
       returns; otherwise (a plain-text reply) the choice is parsed from the text. Both parse with
       :func:`parse_choice`.

Why a program (measured; see ``program.py``): asked for a room name, the small Qwen2.5-Coder models answered the same
room for every task whatever the prompt said; asked for ``choose(rooms)``, the 1.5B writes the filter the prompt
describes, so the prompt decides the choice, which is what prompt optimization needs.

Reward: 1.0 when the parsed choice equals the task's ``expected_choice`` exactly (room names compared as written in
``rooms.json``, "No Room" as is), else 0.0; emitted as ``emit_reward(value, name="correct")``, with the parsed
answer and a sentence of feedback (which includes the program's error, if any) as the span attributes
``agentbolt.reward.answer`` / ``agentbolt.reward.feedback`` (the prompt optimizers show them to their LLM), and
returned.

The baseline prompt (:data:`BASELINE_PROMPT`) only restates the request: it names no rule for choosing among free
rooms. That is what the optimizers are meant to improve.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from openai import OpenAI
from openai.types.chat import ChatCompletion

from agentbolt import LLM, PromptTemplate, emit_reward, rollout, semconv

from .program import extract_program, run_program
from .rooms import NO_ROOM, get_rooms_and_availability, room_ids
from .tasks import Task

MAX_TOOL_CALLS = 3
"""Tool calls allowed per rollout; the loop also stops at the first successful one (it lists every room). The extra
calls are for mistakes: the 1.5B often first calls an invented ``book_meeting_room`` and needs the error message."""
FINAL_ANSWER_REQUEST = (
    "No tool calls are left. Reply with a Python function choose(rooms) that returns the id of the room to book, or "
    "'No Room'. rooms is the \"rooms\" list of the tool result above: dicts with the keys id, capacity, equipment, "
    "accessible, distance_m and available. I will run your function on it."
)
DEFAULT_TEMPERATURE = 0.0
DEFAULT_MAX_TOKENS = 256
TOOL_NAME = "get_rooms_and_availability"
PROMPT_RESOURCE = "prompt_template"
"""The name of the prompt resource (and of the agent's parameter that receives it)."""

BASELINE_PROMPT = (
    "Book a meeting room on {date} at {time} for {duration_min} minutes for {attendees} people. "
    "Needed equipment: {needs}. Accessible room required: {accessible_required}."
)

ROOMS_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "List every meeting room with its capacity, equipment, accessibility, walking distance and "
        "whether it is free for the given slot.",
        "parameters": {
            "type": "object",
            "properties": {
                "date": {"type": "string", "description": "YYYY-MM-DD"},
                "time": {"type": "string", "description": "start time, HH:MM (24-hour)"},
                "duration_min": {"type": "integer", "description": "length of the meeting in minutes"},
            },
            "required": ["date", "time", "duration_min"],
        },
    },
}

_LABEL_RE = re.compile(r"(?:final\s+)?(?:answer|choice|room|booking|booked)\s*[:：]\s*(.*)", re.IGNORECASE)
_SAMPLING_KEYS = ("temperature", "max_tokens", "top_p", "seed")

CreateCompletion = Callable[..., ChatCompletion]
"""``client.chat.completions.create`` of a sync ``openai.OpenAI`` client, or a stand-in with the same contract."""


@dataclass
class Episode:
    """One executed rollout: the conversation, the final reply, the program in it (if any) and what running it gave,
    and the parsed choice."""

    messages: list[dict[str, Any]]
    final_text: str | None
    choice: str | None
    tool_calls: int
    program: str | None = None
    program_value: str | None = None
    program_error: str | None = None


def run_tool_call(name: str | None, arguments: str | Mapping[str, object] | None) -> str:
    """Run one tool call; returns the ``tool`` message text: the tool's JSON result, or ``Error: ...`` that says
    what a correct call looks like (never raises)."""
    usage = 'call get_rooms_and_availability with {"date": "YYYY-MM-DD", "time": "HH:MM", "duration_min": 30}'
    if name != TOOL_NAME:
        return f"Error: unknown tool {name!r}; {usage}"
    if isinstance(arguments, Mapping):
        parsed: object = dict(arguments)
    else:
        try:
            parsed = json.loads(arguments or "")
        except (json.JSONDecodeError, TypeError):
            return f"Error: the arguments are not valid JSON; {usage}"
    if not isinstance(parsed, dict):
        return f"Error: the arguments must be a JSON object; {usage}"
    duration = parsed.get("duration_min")
    if isinstance(duration, str) and duration.strip().isdigit():
        duration = int(duration.strip())
    try:
        result = get_rooms_and_availability(str(parsed.get("date", "")), str(parsed.get("time", "")), duration)  # type: ignore[arg-type]
    except ValueError as exc:
        return f"Error: {exc}; {usage}"
    return json.dumps(result)


def parse_choice(text: str | None) -> str | None:
    """The room chosen in the agent's final reply: a room name as spelled in ``rooms.json``, ``"No Room"``, or
    ``None``.

    Rule: a mention is a room name (whole word, any case) or "no room" (also "no rooms", "no available room"). If
    the reply has a labelled line (``Answer:``, ``Choice:``, ``Room:``, ``Final answer:``, ``Booked:``...), the
    choice is the first mention after the last label (``"Answer: Atlas (not Pulse)"`` -> Atlas); otherwise, or when
    nothing is mentioned there, the last mention in the whole reply (the conclusion of a reasoning).

    Example:
        >>> parse_choice("Lyra is taken, so I booked Nova.")
        'Nova'
        >>> parse_choice("Final answer: No Room")
        'No Room'
    """
    if not text:
        return None
    labelled = list(_LABEL_RE.finditer(text))
    scope = labelled[-1].group(1) if labelled else text
    names = [*room_ids(), NO_ROOM]
    pattern = re.compile(
        r"\b(" + "|".join(re.escape(name) for name in room_ids()) + r"|no\s+(?:available\s+)?rooms?)\b", re.IGNORECASE
    )
    in_label = list(pattern.finditer(scope)) if labelled else []
    if in_label:
        found = in_label[0].group(1)
    else:
        matches = list(pattern.finditer(text))
        if not matches:
            return None
        found = matches[-1].group(1)
    return next((name for name in names if name.lower() == found.lower()), NO_ROOM)


def compute_reward(choice: str | None, task: Task) -> float:
    """1.0 when ``choice`` is exactly the task's ``expected_choice``, else 0.0."""
    return 1.0 if choice is not None and choice == task["expected_choice"] else 0.0


def feedback(choice: str | None, task: Task, program_error: str | None = None) -> str:
    """One sentence about the outcome, for the prompt optimizer (GEPA's textual feedback); names the program's error
    when the agent's ``choose`` failed."""
    expected = task["expected_choice"]
    if choice == expected:
        return f"Correct: {expected}."
    if program_error is not None:
        return f"Wrong: the expected choice was {expected}; the agent's choose(rooms) failed: {program_error}."
    answered = "no recognisable room name" if choice is None else choice
    return f"Wrong: the expected choice was {expected}, the agent answered {answered}."


def sampling_kwargs(sampling_parameters: Mapping[str, object]) -> dict[str, object]:
    """Request keyword arguments from ``LLM.sampling_parameters``: temperature (default 0.0), max_tokens (256), and
    top_p / seed when given. Other keys are ignored."""
    kwargs: dict[str, object] = {"temperature": DEFAULT_TEMPERATURE, "max_tokens": DEFAULT_MAX_TOKENS}
    kwargs.update({key: sampling_parameters[key] for key in _SAMPLING_KEYS if key in sampling_parameters})
    return kwargs


def render_prompt(template: str, task: Task) -> str:
    """Fill the prompt template with the task's request fields (``needs`` joined with ", ", ``"none"`` if empty;
    ``accessible_required`` as ``yes``/``no``).

    Raises:
        KeyError: the template has a placeholder that is not a request field.
    """
    values = {
        "date": task["date"],
        "time": task["time"],
        "duration_min": task["duration_min"],
        "attendees": task["attendees"],
        "needs": ", ".join(task["needs"]) or "none",
        "accessible_required": "yes" if task["accessible_required"] else "no",
    }
    return PromptTemplate(template=template).format(**values)


def run_episode(
    create: CreateCompletion, task: Task, *, model: str, prompt: str, sampling: Mapping[str, object]
) -> Episode:
    """Run the protocol of the module docstring with ``prompt`` (the template text) and return the episode."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": render_prompt(prompt, task)}]
    final_text: str | None = None
    tool_calls = 0
    rooms: list[object] | None = None  # the "rooms" of the last successful tool result
    while rooms is None and tool_calls < MAX_TOOL_CALLS:
        message = create(model=model, messages=messages, tools=[ROOMS_TOOL], **sampling).choices[0].message
        calls = message.tool_calls or []
        if not calls:
            final_text = message.content
            messages.append({"role": "assistant", "content": final_text})
            break
        messages.append(_assistant_message(message.content, calls))
        for call in calls:
            function = getattr(call, "function", None)
            if rooms is not None or tool_calls >= MAX_TOOL_CALLS:
                result = "Error: no tool calls left; reply with your choice"
            else:
                result = run_tool_call(getattr(function, "name", None), getattr(function, "arguments", None))
                tool_calls += 1
                if not result.startswith("Error:"):
                    rooms = json.loads(result)["rooms"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    if final_text is None:
        messages.append({"role": "user", "content": FINAL_ANSWER_REQUEST})
        final_text = create(model=model, messages=messages, **sampling).choices[0].message.content
        messages.append({"role": "assistant", "content": final_text})
    program = extract_program(final_text)
    if program is None:
        return Episode(messages, final_text, parse_choice(final_text), tool_calls)
    outcome = run_program(program, rooms or [])
    return Episode(
        messages,
        final_text,
        parse_choice(outcome.value),
        tool_calls,
        program=program,
        program_value=outcome.value,
        program_error=outcome.error,
    )


@rollout
def room_agent(task: Task, llm: LLM, prompt_template: PromptTemplate) -> float:
    """The ``@rollout`` agent: resources ``llm`` and ``prompt_template`` (see :data:`PROMPT_RESOURCE`)."""
    client = OpenAI(base_url=llm.endpoint, api_key="agentbolt", max_retries=0)
    try:
        episode = run_episode(
            client.chat.completions.create,
            task,
            model=llm.model,
            prompt=prompt_template.template,
            sampling=sampling_kwargs(llm.sampling_parameters),
        )
    finally:
        client.close()
    reward = compute_reward(episode.choice, task)
    # The answer and a sentence of feedback travel on the reward span; prompt optimizers show them to their LLM.
    emit_reward(
        reward,
        name="correct",
        attributes={
            semconv.REWARD_ANSWER: episode.choice or "",
            semconv.REWARD_FEEDBACK: feedback(episode.choice, task, episode.program_error),
        },
    )
    return reward


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
