"""The room agent example: the tool over rooms.json, the booking rule against every task, the split, the reward
parser and the tool loop with a scripted model."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from examples.room_agent.agent import (
    BASELINE_PROMPT,
    FINAL_ANSWER_REQUEST,
    MAX_TOOL_CALLS,
    compute_reward,
    feedback,
    parse_choice,
    render_prompt,
    run_episode,
    run_tool_call,
)
from examples.room_agent.rooms import NO_ROOM, best_room, get_rooms_and_availability, request_of
from examples.room_agent.tasks import SPLIT_SIZES, load_tasks, split_tasks


def test_tool_marks_bookings_as_unavailable() -> None:
    result = get_rooms_and_availability("2025-10-13", "10:15", 30)
    available = {room["id"]: room["available"] for room in result["rooms"]}  # type: ignore[union-attr]
    # Orion is booked 10:00-11:00; Lyra 09:30-10:00 (ends before) and 11:00-12:00; Quark 10:30-11:00 overlaps.
    assert available == {
        "Orion": False,
        "Lyra": True,
        "Vega": True,
        "Nova": True,
        "Quark": False,
        "Atlas": True,
        "Pulse": True,
    }
    with pytest.raises(ValueError, match="HH:MM"):
        get_rooms_and_availability("2025-10-13", "25:00", 30)
    assert run_tool_call("get_rooms_and_availability", '{"date": "2025-10-13", "time": "9:00"}').startswith("Error:")
    assert run_tool_call("book", "{}").startswith("Error: unknown tool")


def test_rule_reproduces_every_expected_choice() -> None:
    tasks = load_tasks()
    assert len(tasks) == 57
    assert [best_room(request_of(task)) for task in tasks] == [task["expected_choice"] for task in tasks]


def test_hand_checked_tasks() -> None:
    by_id = {task["task_id"]: task for task in load_tasks()}
    # s01: 12 people with projector + confphone: only Lyra has both, and it seats 10.
    assert by_id["s01"]["expected_choice"] == NO_ROOM
    # s02: 12 people, whiteboard + confphone, accessible: Nova (12 seats, never booked) is the only one big enough.
    assert by_id["s02"]["expected_choice"] == "Nova"
    # s13: 3 people, whiteboard, 15:00: Orion (4 seats) is booked 15:00-15:30, so the next smallest is Atlas (6, 10 m),
    # which beats Pulse (8 seats, though nearer at 8 m): capacity first, distance second.
    assert by_id["s13"]["expected_choice"] == "Atlas"
    assert best_room(request_of(by_id["s13"])) == "Atlas"


def test_split_is_fixed_disjoint_and_complete() -> None:
    split = split_tasks()
    assert {name: len(tasks) for name, tasks in split.items()} == SPLIT_SIZES
    ids = [task["task_id"] for tasks in split.values() for task in tasks]
    assert sorted(ids) == sorted(task["task_id"] for task in load_tasks())
    assert split_tasks() == split
    assert split_tasks(seed=1) != split


@pytest.mark.parametrize(
    ("reply", "choice"),
    [
        ("Lyra is taken, so I booked Nova.", "Nova"),
        ("Final answer: No Room", NO_ROOM),
        ("Sorry, there are no rooms available for that slot.", NO_ROOM),
        ("Answer: **Atlas** (not Pulse, which is bigger)", "Atlas"),
        ("choice: quark", "Quark"),
        ("I could not decide.", None),
        (None, None),
    ],
)
def test_parse_choice(reply: str | None, choice: str | None) -> None:
    assert parse_choice(reply) == choice


def test_reward_is_exact_match() -> None:
    task = next(task for task in load_tasks() if task["expected_choice"] == "Nova")
    assert compute_reward("Nova", task) == 1.0
    assert compute_reward("Lyra", task) == 0.0
    assert compute_reward(None, task) == 0.0
    assert feedback("Lyra", task) == "Wrong: the expected choice was Nova, the agent answered Lyra."


def test_episode_with_a_scripted_model() -> None:
    task = next(task for task in load_tasks() if task["task_id"] == "s13")
    arguments = json.dumps({"date": task["date"], "time": task["time"], "duration_min": task["duration_min"]})
    replies = [
        SimpleNamespace(
            content=None,
            tool_calls=[
                SimpleNamespace(
                    id="c1", function=SimpleNamespace(name="get_rooms_and_availability", arguments=arguments)
                )
            ],
        ),
        SimpleNamespace(content="Atlas is free and fits. Answer: Atlas", tool_calls=None),
    ]
    requests: list[dict[str, Any]] = []

    def create(**kwargs: Any) -> Any:
        requests.append(kwargs)
        return SimpleNamespace(choices=[SimpleNamespace(message=replies[len(requests) - 1])])

    episode = run_episode(create, task, model="m", prompt=BASELINE_PROMPT, sampling={"temperature": 0.0})
    assert episode.choice == "Atlas" and compute_reward(episode.choice, task) == 1.0
    assert requests[0]["messages"][0]["content"] == render_prompt(BASELINE_PROMPT, task)
    assert "Needed equipment: whiteboard" in requests[0]["messages"][0]["content"]
    tool_message = json.loads(episode.messages[2]["content"])
    assert {room["id"]: room["available"] for room in tool_message["rooms"]}["Orion"] is False


def test_episode_asks_for_an_answer_without_tools_once_the_tool_budget_is_spent() -> None:
    """A model that only ever calls the tool gets one successful result, then one request without ``tools`` after
    :data:`FINAL_ANSWER_REQUEST`; that reply (here plain text, no program) is the final one."""
    task = next(task for task in load_tasks() if task["task_id"] == "s13")
    arguments = json.dumps({"date": task["date"], "time": task["time"], "duration_min": task["duration_min"]})
    requests: list[dict[str, Any]] = []

    def create(**kwargs: Any) -> Any:
        requests.append({**kwargs, "messages": list(kwargs["messages"])})  # the agent appends to its list later
        if "tools" not in kwargs:
            message = SimpleNamespace(content="Pulse is nearest. Answer: Pulse", tool_calls=None)
        else:
            call = SimpleNamespace(
                id=f"c{len(requests)}", function=SimpleNamespace(name="get_rooms_and_availability", arguments=arguments)
            )
            message = SimpleNamespace(content=None, tool_calls=[call])
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])

    episode = run_episode(create, task, model="m", prompt=BASELINE_PROMPT, sampling={"temperature": 0.0})
    assert episode.tool_calls == 1  # the first successful call ends the tool phase
    assert len(requests) == 2 and ["tools" in request for request in requests] == [True, False]
    assert requests[1]["messages"][-1] == {"role": "user", "content": FINAL_ANSWER_REQUEST}
    roles = [message["role"] for message in episode.messages]
    assert roles == ["user", "assistant", "tool", "user", "assistant"]
    assert episode.final_text == "Pulse is nearest. Answer: Pulse"
    assert episode.choice == "Pulse" and compute_reward(episode.choice, task) == 0.0  # s13 expects Atlas


def _tool_call(call_id: str, name: str, arguments: str) -> Any:
    return SimpleNamespace(id=call_id, function=SimpleNamespace(name=name, arguments=arguments))


def test_episode_runs_the_models_program_on_the_tool_result_after_a_wrong_tool_name() -> None:
    """The 1.5B's habit: first an invented tool, then the right one after the error; then ``choose(rooms)``, which the
    agent runs on that result's rooms. The program below is "first free room in list order": for s13 the rooms in
    file order are Orion (booked at 15:00), then Lyra (free), so it returns Lyra, while the task expects Atlas."""
    task = next(task for task in load_tasks() if task["task_id"] == "s13")
    arguments = json.dumps({"date": task["date"], "time": task["time"], "duration_min": task["duration_min"]})
    program = "def choose(rooms):\n    return next((r['id'] for r in rooms if r['available']), 'No Room')\n"
    replies = [
        SimpleNamespace(content=None, tool_calls=[_tool_call("c1", "book_meeting_room", arguments)]),
        SimpleNamespace(content=None, tool_calls=[_tool_call("c2", "get_rooms_and_availability", arguments)]),
        SimpleNamespace(
            content=f"Here it is:\n```python\n{program}```\nIt picks the first free room.", tool_calls=None
        ),
    ]
    requests: list[dict[str, Any]] = []

    def create(**kwargs: Any) -> Any:
        requests.append(kwargs)
        return SimpleNamespace(choices=[SimpleNamespace(message=replies[len(requests) - 1])])

    episode = run_episode(create, task, model="m", prompt=BASELINE_PROMPT, sampling={"temperature": 0.0})
    assert MAX_TOOL_CALLS == 3 and episode.tool_calls == 2
    assert episode.messages[2]["content"].startswith("Error: unknown tool 'book_meeting_room'")
    assert ["tools" in request for request in requests] == [True, True, False]
    assert episode.program == program
    assert (episode.program_value, episode.program_error, episode.choice) == ("Lyra", None, "Lyra")
    assert compute_reward(episode.choice, task) == 0.0
    assert feedback(episode.choice, task, episode.program_error) == (
        "Wrong: the expected choice was Atlas, the agent answered Lyra."
    )


def test_a_failing_program_gives_no_choice_and_its_error_in_the_feedback() -> None:
    task = next(task for task in load_tasks() if task["task_id"] == "s13")
    arguments = json.dumps({"date": task["date"], "time": task["time"], "duration_min": task["duration_min"]})
    replies = [
        SimpleNamespace(content=None, tool_calls=[_tool_call("c1", "get_rooms_and_availability", arguments)]),
        SimpleNamespace(content="def choose(rooms):\n    return rooms[0]['name']", tool_calls=None),
    ]
    calls: list[int] = []

    def create(**kwargs: Any) -> Any:
        calls.append(1)
        return SimpleNamespace(choices=[SimpleNamespace(message=replies[len(calls) - 1])])

    episode = run_episode(create, task, model="m", prompt=BASELINE_PROMPT, sampling={})
    assert episode.choice is None and episode.program_error == "KeyError: 'name'"
    assert feedback(episode.choice, task, episode.program_error) == (
        "Wrong: the expected choice was Atlas; the agent's choose(rooms) failed: KeyError: 'name'."
    )
