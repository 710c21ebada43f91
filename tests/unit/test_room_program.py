"""The room agent's answer step: extracting ``choose(rooms)`` from a reply and running it in a limited child process
(real ``python -I`` subprocesses)."""

from __future__ import annotations

import time

import pytest
from examples.room_agent.agent import parse_choice
from examples.room_agent.program import ProgramResult, check_program, extract_program, run_program
from examples.room_agent.rooms import get_rooms_and_availability
from examples.room_agent.tasks import load_tasks

# The booking rule of rooms.best_room written as the model would have to write it for one request.
RULE_PROGRAM = """
def choose(rooms):
    needed = {needs!r}
    qualifying = [
        r for r in rooms
        if r['available'] and r['capacity'] >= {attendees}
        and all(item in r['equipment'] for item in needed)
        and (r['accessible'] or not {accessible})
    ]
    if not qualifying:
        return 'No Room'
    return min(qualifying, key=lambda r: (r['capacity'], r['distance_m']))['id']
"""


def test_the_rule_written_as_a_program_reproduces_every_expected_choice() -> None:
    """All 57 tasks through the real child process: the pipeline (tool result -> program -> parse) loses nothing."""
    for task in load_tasks():
        source = RULE_PROGRAM.format(
            needs=list(task["needs"]), attendees=task["attendees"], accessible=task["accessible_required"]
        )
        rooms = get_rooms_and_availability(task["date"], task["time"], task["duration_min"])["rooms"]
        result = run_program(source, rooms)  # type: ignore[arg-type]
        assert result.error is None, (task["task_id"], result.error)
        assert parse_choice(result.value) == task["expected_choice"], task["task_id"]


@pytest.mark.parametrize(
    ("reply", "program"),
    [
        ("```python\ndef choose(rooms):\n    return 'Nova'\n```", "def choose(rooms):\n    return 'Nova'\n"),
        (
            "```python\nx = 1\n```\nthen\n```py\ndef choose(rooms):\n    return 'A'\n```",
            "def choose(rooms):\n    return 'A'\n",
        ),
        ("def choose(rooms):\n    return 'Nova'", "def choose(rooms):\n    return 'Nova'"),
        ("Answer: Nova", None),
        ("", None),
        (None, None),
    ],
)
def test_extract_program(reply: str | None, program: str | None) -> None:
    assert extract_program(reply) == program


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("def choose(rooms):\n    import os\n    return 'x'", "import is not allowed: use the builtins only"),
        ("def choose(rooms):\n    return ().__class__", "names starting with '_' are not allowed (__class__)"),
        ("def choose(rooms):\n    return __builtins__", "names starting with '_' are not allowed (__builtins__)"),
        ("def pick(rooms):\n    return 'x'", "the program defines no top-level function choose(rooms)"),
        ("def choose(rooms)\n    return 'x'", "SyntaxError: expected ':' (line 1)"),
    ],
)
def test_refused_programs_do_not_run(source: str, error: str) -> None:
    assert check_program(source) == error
    assert run_program(source, []) == ProgramResult(value=None, error=error)


def test_run_program_reports_the_models_mistakes() -> None:
    rooms = [{"id": "Nova", "capacity": 12}, {"id": "Lyra", "capacity": 10}]
    smallest = "def choose(rooms):\n    return min(rooms, key=lambda r: r['capacity'])['id']\nprint(choose(rooms))\n"
    assert run_program(smallest, rooms) == ProgramResult(value="Lyra", error=None)
    assert run_program("def choose(rooms):\n    return needed", rooms) == ProgramResult(
        None, "NameError: name 'needed' is not defined"
    )
    assert run_program("def choose(rooms):\n    return rooms[0]", rooms) == ProgramResult(
        None, "choose returned dict, not a string (the room id)"
    )
    assert run_program("def choose(rooms):\n    return open('/etc/passwd').read()", rooms) == ProgramResult(
        None, "NameError: name 'open' is not defined"
    )


def test_an_endless_program_is_stopped_by_the_timeout() -> None:
    start = time.monotonic()
    result = run_program("def choose(rooms):\n    while True:\n        pass", [], timeout_s=1.0)
    assert result == ProgramResult(value=None, error="the program ran longer than 1 s")
    assert time.monotonic() - start < 5.0
