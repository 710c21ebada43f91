"""The gateway's weight-swap gate: calls wait during a swap and go on after it, up to the hold limit."""

from __future__ import annotations

import asyncio

import pytest

from agentbolt.errors import BackendError, ConfigError
from agentbolt.server.gateway.swap import WeightSwapGate


def test_calls_wait_for_the_swap_and_then_go_on() -> None:
    async def main() -> None:
        gate = WeightSwapGate(hold_limit_s=5)
        assert await gate.admit() == 0.0  # no swap: admitted at once, not counted as held
        order: list[str] = []

        async def call(name: str) -> None:
            await gate.admit()
            order.append(name)

        async with gate.swapping():
            assert gate.swapping_now
            calls = [asyncio.create_task(call(f"c{i}")) for i in range(3)]
            await asyncio.sleep(0.2)
            assert order == [] and not any(c.done() for c in calls)
            order.append("swap done")
        await asyncio.gather(*calls)
        assert order[0] == "swap done" and sorted(order[1:]) == ["c0", "c1", "c2"]
        assert gate.stats.swaps == 1 and gate.stats.held_calls == 3 and gate.stats.rejected_calls == 0
        assert 0.2 <= gate.stats.longest_hold_s < 5 and gate.stats.swap_s >= 0.2

    asyncio.run(main())


def test_a_swap_longer_than_the_hold_limit_rejects_with_backend_error() -> None:
    async def main() -> None:
        gate = WeightSwapGate(hold_limit_s=0.1)
        async with gate.swapping():
            with pytest.raises(BackendError, match="hold limit"):
                await gate.admit()
            with pytest.raises(ConfigError, match="do not nest"):
                async with gate.swapping():
                    pass
        assert gate.stats.rejected_calls == 1 and gate.stats.held_calls == 1
        assert await gate.admit() == 0.0  # open again after the swap

    asyncio.run(main())


def test_hold_limit_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="hold_limit_s"):
        WeightSwapGate(hold_limit_s=0)
