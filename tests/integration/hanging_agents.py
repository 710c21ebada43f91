"""Agents that never finish, each in its own way, for the runner-timeout tests (imported by runner processes).

``task["kind"]`` picks the way: ``sleep`` (a sync agent asleep forever), ``regex`` (a sync agent stuck in a C call
that holds the GIL: catastrophic backtracking in ``re``), ``tool`` (a sync agent whose tool waits forever on a socket
that never answers), ``async`` (an async agent awaiting forever); ``quick`` returns 1.0 at once, ``slow`` after 4 s.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from typing import Any

import agentbolt


@agentbolt.operation
def lookup(query: str) -> str:
    """A tool whose server accepted the call and never answers."""
    ours, theirs = socket.socketpair()
    ours.sendall(query.encode())
    return ours.recv(1024).decode()  # nobody ever writes to ``theirs``


def hang_sync(task: dict[str, Any]) -> float:
    kind = task["kind"]
    if kind == "sleep":
        time.sleep(10**6)
    elif kind == "regex":
        re.match(r"(a+)+$", "a" * 64 + "b")  # exponential: holds the GIL for far longer than any test
    elif kind == "tool":
        lookup("2 + 2")
    elif kind == "slow":
        time.sleep(4)
    return 1.0


async def hang_async(task: dict[str, Any]) -> float:
    if task["kind"] == "async":
        await asyncio.sleep(10**6)
    return 1.0
