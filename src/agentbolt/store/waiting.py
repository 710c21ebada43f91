"""The waiting loop of ``wait_for_rollouts`` that the database backends share (SQLite and PostgreSQL).

A backend hands over how to read the rollouts; this loop re-reads them until all are terminal, the timeout passes, or
the store closes. It sleeps on ``event`` between reads, at most ``poll_interval_s``: the backend sets the event when
it ends a rollout itself, so waiters in the same process wake at once, and writes by other processes are seen at the
next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence

from agentbolt.errors import NotFoundError
from agentbolt.store import rules
from agentbolt.types import Rollout


def in_order(ids: Sequence[str], found: Iterable[Rollout]) -> list[Rollout]:
    """``found`` arranged in the order of ``ids`` (repeats included).

    Raises:
        NotFoundError: some ids are not in ``found`` (the message names up to five).
    """
    by_id = {r.rollout_id: r for r in found}
    missing = [i for i in dict.fromkeys(ids) if i not in by_id]
    if missing:
        raise NotFoundError(f"rollouts {missing[:5]} do not exist" + (" (and more)" if len(missing) > 5 else ""))
    return [by_id[i] for i in ids]


async def poll_until_terminal(
    read: Callable[[], Awaitable[list[Rollout]]],
    *,
    expected: int,
    timeout_s: float | None,
    poll_interval_s: float,
    event: asyncio.Event,
    closed: Callable[[], bool],
) -> list[Rollout]:
    """Re-read until ``expected`` rollouts are terminal or ``timeout_s`` seconds pass (``None``: no limit).

    Returns the terminal rollouts of the last read, in the order ``read`` gives them.
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + max(timeout_s, 0.0)
    done: list[Rollout] = []
    while not closed():
        event.clear()
        done = [r for r in await read() if rules.is_terminal(r)]
        remaining = None if deadline is None else deadline - loop.time()
        if len(done) == expected or (remaining is not None and remaining <= 0):
            return done
        wait_s = poll_interval_s if remaining is None else min(poll_interval_s, remaining)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), wait_s)
    return done
