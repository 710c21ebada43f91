"""The rollout and attempt state machines, as tables (DESIGN.md, "The store").

Every backend calls :func:`rollout_transition` and :func:`attempt_transition`; no backend spells out status lists of
its own. An illegal move raises :class:`~agentbolt.errors.InvalidTransitionError` naming the allowed ones.

Rollout::

    queuing --claim--> preparing --start--> running --succeed--> succeeded
                           |                  |------fail-------> failed      (no attempts left / not retryable)
                           |                  |------retry------> requeuing --claim--> preparing ...
                           +----(same from preparing)
    any non-terminal --cancel--> cancelled

Attempt::

    preparing --start--> running --succeed--> succeeded
        |                   |----fail-------> failed
        |                   |----timeout----> timeout
        |                   |----unresponsive-> unresponsive
        +---- fail / timeout / unresponsive (before it started running)
"""

from __future__ import annotations

from enum import StrEnum

from agentbolt.errors import InvalidTransitionError
from agentbolt.types import AttemptStatus, RolloutStatus


class RolloutEvent(StrEnum):
    """What can happen to a rollout."""

    CLAIM = "claim"
    START = "start"
    SUCCEED = "succeed"
    FAIL = "fail"
    RETRY = "retry"
    CANCEL = "cancel"


class AttemptEvent(StrEnum):
    """What can happen to an attempt."""

    START = "start"
    SUCCEED = "succeed"
    FAIL = "fail"
    TIMEOUT = "timeout"
    UNRESPONSIVE = "unresponsive"


R = RolloutStatus
A = AttemptStatus

ROLLOUT_TRANSITIONS: dict[tuple[RolloutStatus, RolloutEvent], RolloutStatus] = {
    (R.QUEUING, RolloutEvent.CLAIM): R.PREPARING,
    (R.REQUEUING, RolloutEvent.CLAIM): R.PREPARING,
    (R.PREPARING, RolloutEvent.START): R.RUNNING,
    (R.PREPARING, RolloutEvent.SUCCEED): R.SUCCEEDED,
    (R.RUNNING, RolloutEvent.SUCCEED): R.SUCCEEDED,
    (R.PREPARING, RolloutEvent.FAIL): R.FAILED,
    (R.RUNNING, RolloutEvent.FAIL): R.FAILED,
    (R.PREPARING, RolloutEvent.RETRY): R.REQUEUING,
    (R.RUNNING, RolloutEvent.RETRY): R.REQUEUING,
    (R.QUEUING, RolloutEvent.CANCEL): R.CANCELLED,
    (R.PREPARING, RolloutEvent.CANCEL): R.CANCELLED,
    (R.RUNNING, RolloutEvent.CANCEL): R.CANCELLED,
    (R.REQUEUING, RolloutEvent.CANCEL): R.CANCELLED,
}
"""(state, event) -> next state. A pair not in the table is illegal."""

ATTEMPT_TRANSITIONS: dict[tuple[AttemptStatus, AttemptEvent], AttemptStatus] = {
    (A.PREPARING, AttemptEvent.START): A.RUNNING,
    (A.PREPARING, AttemptEvent.SUCCEED): A.SUCCEEDED,
    (A.RUNNING, AttemptEvent.SUCCEED): A.SUCCEEDED,
    (A.PREPARING, AttemptEvent.FAIL): A.FAILED,
    (A.RUNNING, AttemptEvent.FAIL): A.FAILED,
    (A.PREPARING, AttemptEvent.TIMEOUT): A.TIMEOUT,
    (A.RUNNING, AttemptEvent.TIMEOUT): A.TIMEOUT,
    (A.PREPARING, AttemptEvent.UNRESPONSIVE): A.UNRESPONSIVE,
    (A.RUNNING, AttemptEvent.UNRESPONSIVE): A.UNRESPONSIVE,
}
"""(state, event) -> next state. A pair not in the table is illegal."""

ATTEMPT_EVENT_FOR_STATUS: dict[AttemptStatus, AttemptEvent] = {
    A.RUNNING: AttemptEvent.START,
    A.SUCCEEDED: AttemptEvent.SUCCEED,
    A.FAILED: AttemptEvent.FAIL,
    A.TIMEOUT: AttemptEvent.TIMEOUT,
    A.UNRESPONSIVE: AttemptEvent.UNRESPONSIVE,
}
"""A runner reports the status it wants; this maps it to the event that produces it."""


def rollout_transition(state: RolloutStatus, event: RolloutEvent) -> RolloutStatus:
    """Return the rollout status after ``event``.

    Raises:
        InvalidTransitionError: the pair is not in :data:`ROLLOUT_TRANSITIONS`; the message lists the legal events.
    """
    nxt = ROLLOUT_TRANSITIONS.get((state, event))
    if nxt is None:
        allowed = sorted(f"{ev.value}->{to.value}" for (st, ev), to in ROLLOUT_TRANSITIONS.items() if st == state)
        raise InvalidTransitionError(
            f"rollout in state '{state.value}' cannot '{event.value}'; allowed from '{state.value}': "
            f"{', '.join(allowed) if allowed else 'none (terminal state)'}"
        )
    return nxt


def attempt_transition(state: AttemptStatus, event: AttemptEvent) -> AttemptStatus:
    """Return the attempt status after ``event``.

    Raises:
        InvalidTransitionError: the pair is not in :data:`ATTEMPT_TRANSITIONS`; the message lists the legal events.
    """
    nxt = ATTEMPT_TRANSITIONS.get((state, event))
    if nxt is None:
        allowed = sorted(f"{ev.value}->{to.value}" for (st, ev), to in ATTEMPT_TRANSITIONS.items() if st == state)
        raise InvalidTransitionError(
            f"attempt in state '{state.value}' cannot '{event.value}'; allowed from '{state.value}': "
            f"{', '.join(allowed) if allowed else 'none (terminal state)'}"
        )
    return nxt
