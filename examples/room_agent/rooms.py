"""The tool ``get_rooms_and_availability(date, time, duration_min)`` over ``data/rooms.json``, and the booking rule
the tasks' expected choices follow.

``rooms.json``: ``{"rooms": [{"id", "capacity", "equipment": [...], "accessible", "distance_m",
"booked": [[date "YYYY-MM-DD", start "HH:MM", duration_min], ...]}], "booked_fields": [...]}``. A booking occupies
``[start, start + duration_min)`` minutes of its day; two intervals overlap when each starts before the other ends.

The rule (:func:`best_room`) was read off the data and reproduces all 57 ``expected_choice`` values of
``room_tasks.jsonl`` (``tests/unit/test_room_example.py`` checks every one): among the rooms that are free for the
whole slot, seat at least the attendees, have every needed piece of equipment and, when required, are accessible,
take the one with the smallest capacity, then the shortest walk (``distance_m``); when none qualifies, "No Room".
Choosing the nearest room instead disagrees on 12 tasks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TypedDict

DATA_DIR = Path(__file__).resolve().parent / "data"
ROOMS_FILE = DATA_DIR / "rooms.json"
NO_ROOM = "No Room"

_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIME_RE = re.compile(r"([01]?\d|2[0-3]):([0-5]\d)")


class Room(TypedDict):
    """One room of ``rooms.json``."""

    id: str
    capacity: int
    equipment: list[str]
    accessible: bool
    distance_m: int
    booked: list[list[str | int]]


class Request(TypedDict):
    """What a task asks for (``task_input`` of ``room_tasks.jsonl``)."""

    date: str
    time: str
    duration_min: int
    attendees: int
    needs: list[str]
    accessible_required: bool


@lru_cache(maxsize=1)
def load_rooms() -> tuple[Room, ...]:
    """The rooms of ``data/rooms.json``, in file order."""
    with ROOMS_FILE.open(encoding="utf-8") as handle:
        return tuple(json.load(handle)["rooms"])


def room_ids() -> tuple[str, ...]:
    """The room names, in file order (``Orion``, ``Lyra``, ...)."""
    return tuple(room["id"] for room in load_rooms())


def minutes(clock: str) -> int:
    """``"13:45"`` -> 825 (minutes after midnight). Raises ValueError for anything but ``H:MM``/``HH:MM``."""
    match = _TIME_RE.fullmatch(clock.strip())
    if match is None:
        raise ValueError(f"time must be HH:MM (24-hour), got {clock!r}")
    return int(match.group(1)) * 60 + int(match.group(2))


def is_free(room: Room, date: str, time: str, duration_min: int) -> bool:
    """Whether ``room`` has no booking overlapping ``[time, time + duration_min)`` on ``date``."""
    start = minutes(time)
    end = start + duration_min
    for booked_date, booked_time, booked_duration in room["booked"]:
        if booked_date != date:
            continue
        booked_start = minutes(str(booked_time))
        if start < booked_start + int(booked_duration) and booked_start < end:
            return False
    return True


def get_rooms_and_availability(date: str, time: str, duration_min: int) -> dict[str, object]:
    """The tool: every room with its facts and whether it is free for the whole slot.

    Returns:
        ``{"date", "time", "duration_min", "rooms": [{"id", "capacity", "equipment", "accessible", "distance_m",
        "available"}]}`` in file order.

    Raises:
        ValueError: ``date`` is not ``YYYY-MM-DD``, ``time`` not ``HH:MM``, or ``duration_min`` not a positive int.
    """
    if not isinstance(date, str) or _DATE_RE.fullmatch(date.strip()) is None:
        raise ValueError(f"date must be YYYY-MM-DD, got {date!r}")
    if isinstance(duration_min, bool) or not isinstance(duration_min, int) or duration_min <= 0:
        raise ValueError(f"duration_min must be a positive whole number of minutes, got {duration_min!r}")
    date = date.strip()
    rooms = [
        {
            "id": room["id"],
            "capacity": room["capacity"],
            "equipment": list(room["equipment"]),
            "accessible": room["accessible"],
            "distance_m": room["distance_m"],
            "available": is_free(room, date, time, duration_min),
        }
        for room in load_rooms()
    ]
    return {"date": date, "time": time.strip(), "duration_min": duration_min, "rooms": rooms}


def qualifying_rooms(request: Request, rooms: Sequence[Room] | None = None) -> list[Room]:
    """The rooms that are free, big enough, equipped and (when required) accessible, in file order."""
    return [
        room
        for room in (rooms if rooms is not None else load_rooms())
        if room["capacity"] >= request["attendees"]
        and set(request["needs"]) <= set(room["equipment"])
        and (room["accessible"] or not request["accessible_required"])
        and is_free(room, request["date"], request["time"], request["duration_min"])
    ]


def best_room(request: Request, rooms: Sequence[Room] | None = None) -> str:
    """The choice the tasks expect (see the module docstring): smallest qualifying capacity, then shortest
    ``distance_m``; ``NO_ROOM`` when nothing qualifies."""
    candidates = qualifying_rooms(request, rooms)
    if not candidates:
        return NO_ROOM
    return min(candidates, key=lambda room: (room["capacity"], room["distance_m"]))["id"]


def request_of(task: Mapping[str, object]) -> Request:
    """The :class:`Request` fields of a task dict."""
    return Request(
        date=str(task["date"]),
        time=str(task["time"]),
        duration_min=int(str(task["duration_min"])),
        attendees=int(str(task["attendees"])),
        needs=[str(need) for need in task["needs"]] if isinstance(task["needs"], list) else [],
        accessible_required=bool(task["accessible_required"]),
    )
