"""Random walks: seeded enqueue/claim/update/cancel sequences on the memory store keep the store's invariants.

(A seeded walk rather than a hypothesis state machine, so the test needs nothing beyond pytest; a failing seed is
in the test id and replays exactly.)

Invariants checked after every step (leases are left out: no timeouts, so runs are deterministic):
- a terminal rollout never changes again, and a refused call changes nothing;
- ``num_attempts`` equals the attempts made and never exceeds ``max_attempts``;
- a rollout is ``preparing``/``running`` exactly when its latest attempt is, and has no other active attempt.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from agentbolt.errors import InvalidTransitionError
from agentbolt.store import InMemoryLightningStore
from agentbolt.store.rules import ACTIVE_ATTEMPT_STATUSES
from agentbolt.types import TERMINAL_ROLLOUT_STATUSES, AttemptStatus, Rollout, RolloutConfig, RolloutStatus

REPORTABLE = [AttemptStatus.RUNNING, AttemptStatus.SUCCEEDED, AttemptStatus.FAILED]
STEPS = 60


async def _check(store: InMemoryLightningStore, terminal: dict[str, Rollout]) -> list[Rollout]:
    rollouts = await store.query_rollouts()
    for rollout in rollouts:
        if rollout.rollout_id in terminal:
            assert rollout == terminal[rollout.rollout_id]
        elif rollout.status in TERMINAL_ROLLOUT_STATUSES:
            terminal[rollout.rollout_id] = rollout
        attempts = await store.query_attempts(rollout.rollout_id)
        assert rollout.num_attempts == len(attempts) <= rollout.config.max_attempts
        active = [a for a in attempts if a.status in ACTIVE_ATTEMPT_STATUSES]
        if rollout.status in (RolloutStatus.PREPARING, RolloutStatus.RUNNING):
            assert active == [attempts[-1]] and attempts[-1].status.value == rollout.status.value
        else:
            assert active == []
    return rollouts


async def _walk(rng: random.Random) -> None:
    store = InMemoryLightningStore(sweep_interval_s=60)
    rollout_ids: list[str] = []
    attempts: list[tuple[str, str]] = []
    terminal: dict[str, Rollout] = {}
    try:
        for _ in range(STEPS):
            before = await _check(store, terminal)
            action = rng.choice(["enqueue", "claim", "update", "update", "cancel"])
            try:
                if action == "enqueue" or not rollout_ids:
                    retry_on = (AttemptStatus.FAILED,) if rng.random() < 0.5 else ()
                    config = RolloutConfig(max_attempts=rng.randint(1, 3), retry_on=retry_on)
                    rollout_ids.append((await store.enqueue_rollout("task", config=config)).rollout_id)
                elif action == "claim":
                    claimed = await store.claim_rollout("w")
                    if claimed is not None:
                        attempts.append((claimed.rollout.rollout_id, claimed.attempt.attempt_id))
                elif action == "update" and attempts:
                    await store.update_attempt(*rng.choice(attempts), rng.choice(REPORTABLE))
                elif action == "cancel":
                    await store.cancel_rollout(rng.choice(rollout_ids))
            except InvalidTransitionError:
                assert await store.query_rollouts() == before
        await _check(store, terminal)
    finally:
        await store.close()


@pytest.mark.parametrize("seed", range(20))
def test_random_walk_keeps_invariants(seed: int) -> None:
    asyncio.run(_walk(random.Random(seed)))
