"""Every (state, event) pair of both state machines: legal pairs give the table's value, illegal ones raise
InvalidTransitionError naming every allowed move from that state."""

from __future__ import annotations

import itertools

import pytest

from agentbolt.errors import InvalidTransitionError
from agentbolt.store.lifecycle import (
    ATTEMPT_EVENT_FOR_STATUS,
    ATTEMPT_TRANSITIONS,
    ROLLOUT_TRANSITIONS,
    AttemptEvent,
    RolloutEvent,
    attempt_transition,
    rollout_transition,
)
from agentbolt.types import TERMINAL_ATTEMPT_STATUSES, TERMINAL_ROLLOUT_STATUSES, AttemptStatus, RolloutStatus


def _allowed(table: dict, state: object) -> list[str]:
    return [f"{event.value}->{target.value}" for (st, event), target in table.items() if st == state]


@pytest.mark.parametrize(("state", "event"), list(itertools.product(RolloutStatus, RolloutEvent)))
def test_rollout_pair(state: RolloutStatus, event: RolloutEvent) -> None:
    expected = ROLLOUT_TRANSITIONS.get((state, event))
    if expected is not None:
        assert rollout_transition(state, event) is expected
        return
    with pytest.raises(InvalidTransitionError) as info:
        rollout_transition(state, event)
    message = str(info.value)
    assert f"'{state.value}'" in message and f"'{event.value}'" in message
    allowed = _allowed(ROLLOUT_TRANSITIONS, state)
    assert all(move in message for move in allowed)
    assert ("terminal" in message) == (not allowed)


@pytest.mark.parametrize(("state", "event"), list(itertools.product(AttemptStatus, AttemptEvent)))
def test_attempt_pair(state: AttemptStatus, event: AttemptEvent) -> None:
    expected = ATTEMPT_TRANSITIONS.get((state, event))
    if expected is not None:
        assert attempt_transition(state, event) is expected
        return
    with pytest.raises(InvalidTransitionError) as info:
        attempt_transition(state, event)
    message = str(info.value)
    assert f"'{state.value}'" in message and f"'{event.value}'" in message
    allowed = _allowed(ATTEMPT_TRANSITIONS, state)
    assert all(move in message for move in allowed)
    assert ("terminal" in message) == (not allowed)


def test_terminal_states_have_no_way_out_and_others_do() -> None:
    for state in RolloutStatus:
        assert (not _allowed(ROLLOUT_TRANSITIONS, state)) == (state in TERMINAL_ROLLOUT_STATUSES)
    for state in AttemptStatus:
        assert (not _allowed(ATTEMPT_TRANSITIONS, state)) == (state in TERMINAL_ATTEMPT_STATUSES)


def test_every_reportable_attempt_status_maps_to_the_event_that_produces_it() -> None:
    for status, event in ATTEMPT_EVENT_FOR_STATUS.items():
        assert status in {target for (_, ev), target in ATTEMPT_TRANSITIONS.items() if ev == event}
    assert AttemptStatus.PREPARING not in ATTEMPT_EVENT_FOR_STATUS  # only a claim creates a preparing attempt
