"""Holding LLM calls while the serving weights are swapped.

Under asynchronous training (:mod:`agentbolt.trainer.pipeline`) the agents keep calling the gateway while the trainer
updates the policy. Generation goes on during the update itself (it runs on the serving copy of the model); only the
short swap, writing the new weights into the serving model, must not overlap a generation. The trainer runs the swap
inside ``async with gate.swapping():``. While it does, every new gateway call waits at :meth:`WeightSwapGate.admit`
instead of being rejected, and goes on as soon as the swap ends; calls already inside the backend finish first
(the embedded backend's ``paused()`` waits for its running batch). A call that would wait longer than
``hold_limit_s`` is answered 503 ``backend_unavailable`` (and recorded as a failed call, so its rollout is counted
as an infrastructure failure, never trained as reward 0). A swap that lasts longer than the limit is a bug or an
overloaded machine; the limit keeps agents from hanging forever on it.

The gate lives in the server process and is driven from the same event loop as the gateway (the trainer of
:func:`agentbolt.trainer.local.local_training` runs there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from agentbolt.errors import BackendError, ConfigError

DEFAULT_HOLD_LIMIT_S = 300.0
"""How long a call may wait for a swap to end before it is answered 503 (seconds)."""


@dataclass
class SwapStats:
    """Counters of a :class:`WeightSwapGate` since it was made.

    Attributes:
        swaps: swaps finished.
        swap_s: wall seconds spent inside swaps, all together.
        held_calls: calls that waited for a swap to end (admitted or not).
        held_s: wall seconds those calls waited, all together.
        longest_hold_s: the longest wait of one call (seconds).
        rejected_calls: calls answered 503 because the swap outlasted ``hold_limit_s``.
    """

    swaps: int = 0
    swap_s: float = 0.0
    held_calls: int = 0
    held_s: float = 0.0
    longest_hold_s: float = 0.0
    rejected_calls: int = 0


class WeightSwapGate:
    """Admits gateway calls, or holds them while a weight swap runs (module docstring).

    Args:
        hold_limit_s: the longest a call waits for a swap to end (seconds, > 0); longer: :class:`BackendError`.

    Raises:
        ConfigError: ``hold_limit_s`` is not > 0.
    """

    def __init__(self, *, hold_limit_s: float = DEFAULT_HOLD_LIMIT_S) -> None:
        if not hold_limit_s > 0:
            raise ConfigError(f"hold_limit_s must be > 0 seconds, got {hold_limit_s}")
        self.hold_limit_s = hold_limit_s
        self.stats = SwapStats()
        self._open = asyncio.Event()
        self._open.set()

    @property
    def swapping_now(self) -> bool:
        """True while a swap runs."""
        return not self._open.is_set()

    async def admit(self) -> float:
        """Return at once when no swap runs; otherwise wait until it ends.

        Returns:
            Seconds waited (0.0 when no swap was running).

        Raises:
            BackendError: the swap did not end within ``hold_limit_s``; the message says so.
        """
        if self._open.is_set():
            return 0.0
        start = time.monotonic()
        self.stats.held_calls += 1
        try:
            await asyncio.wait_for(self._open.wait(), timeout=self.hold_limit_s)
        except TimeoutError:
            self.stats.rejected_calls += 1
            raise BackendError(
                f"the model's weights were being swapped for more than {self.hold_limit_s:g} s, the gateway's hold "
                "limit; retry the call, or raise the hold limit (WeightSwapGate(hold_limit_s=...))"
            ) from None
        finally:
            waited = time.monotonic() - start
            self.stats.held_s += waited
            self.stats.longest_hold_s = max(self.stats.longest_hold_s, waited)
        return waited

    @asynccontextmanager
    async def swapping(self) -> AsyncIterator[None]:
        """Hold new calls for the duration of the ``async with`` block (the swap).

        Raises:
            ConfigError: a swap is already running (swaps do not nest).
        """
        if not self._open.is_set():
            raise ConfigError("a weight swap is already running; swaps do not nest")
        self._open.clear()
        start = time.monotonic()
        try:
            yield
        finally:
            self.stats.swaps += 1
            self.stats.swap_s += time.monotonic() - start
            self._open.set()
