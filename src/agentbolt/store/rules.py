"""The store's business rules as pure functions on the record models, shared by every backend.

A backend loads the records it needs, calls one of these functions and writes back what it returns, all inside one
transaction (or one uninterrupted stretch of code on the event loop, for the memory backend). The functions never
mutate their arguments; they return updated copies. Status moves go through :mod:`agentbolt.store.lifecycle`.

Rules (DESIGN.md, "The store"):
    - a claim creates a new attempt (``preparing``) and moves the rollout to ``preparing``;
    - an attempt ending ``failed``/``timeout``/``unresponsive`` requeues its rollout while
      ``num_attempts < max_attempts`` and the status is in ``config.retry_on``; otherwise the rollout fails;
    - updates to a superseded attempt (not the rollout's latest) are kept on the attempt and never move the rollout;
    - a lease expires: ``timeout_seconds`` after the attempt's start, or ``unresponsive_seconds`` after its last
      heartbeat (or span, or its start when it never sent one);
    - cancelling a rollout ends its in-flight attempt as ``failed`` with ``error.type == "cancelled"``;
    - **one reward rule** (:mod:`agentbolt.types.rewards`): ``final_reward`` of a status change and the value of every
      reward span (``agentbolt.reward``, attribute ``agentbolt.reward.value``) must be a finite number or a bool
      (stored as a float); a string (numeric or not), ``None``, NaN or an infinity is refused with
      :class:`~agentbolt.errors.RewardError` (422) naming the span and the value, and nothing of the call is stored
      (:func:`check_reward_spans`);
    - **no late rewards**: a reward span (named or not) for an attempt that has ended (``succeeded``, ``failed``,
      ``timeout``, ``unresponsive``) is refused with :class:`~agentbolt.errors.ConflictError` (409) naming the
      attempt and its status, and nothing of the call is stored (:func:`check_span_target`). A consumed result
      never changes: the reward a trainer read when the rollout ended is the reward a dashboard reads later. Other
      spans of an ended attempt (an LLM call the gateway finished recording late, an exception) are still stored.
      A runner records the returned reward span *before* it reports the attempt ended, and ``final_reward`` in the
      status call sets the rollout's reward directly, so neither is late.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any, Final

from agentbolt import semconv
from agentbolt.errors import ConfigError, ConflictError, InvalidTransitionError
from agentbolt.store.lifecycle import (
    ATTEMPT_EVENT_FOR_STATUS,
    ROLLOUT_TRANSITIONS,
    RolloutEvent,
    attempt_transition,
    rollout_transition,
)
from agentbolt.types import (
    TERMINAL_ATTEMPT_STATUSES,
    TERMINAL_ROLLOUT_STATUSES,
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    Rollout,
    RolloutConfig,
    RolloutStatus,
    Span,
    TrainedSample,
    Worker,
)
from agentbolt.types.rewards import coerce_reward

CLAIMABLE_ROLLOUT_STATUSES: Final[frozenset[RolloutStatus]] = frozenset(
    state for (state, event) in ROLLOUT_TRANSITIONS if event == RolloutEvent.CLAIM
)
"""Rollout states a claim may take (derived from the lifecycle table: ``queuing``, ``requeuing``)."""

ACTIVE_ATTEMPT_STATUSES: Final[frozenset[AttemptStatus]] = frozenset(AttemptStatus) - TERMINAL_ATTEMPT_STATUSES
"""Attempt states that hold a lease (``preparing``, ``running``)."""

WORKER_IDLE: Final = "idle"
WORKER_BUSY: Final = "busy"

CANCELLED_ERROR_TYPE: Final = "cancelled"

SPAN_HEARTBEAT_RESOLUTION_S: Final = 1.0
"""A span refreshes its attempt's heartbeat at most this often (seconds), or every
:data:`SPAN_HEARTBEAT_RESOLUTION_FRACTION` of ``unresponsive_seconds`` when that is shorter."""
SPAN_HEARTBEAT_RESOLUTION_FRACTION: Final = 0.05


def _time_ordered_hex() -> str:
    """24 hex characters: the time in milliseconds (12), then 48 random bits (12).

    Ids made later sort later (like UUIDv7), so the ids written together sit together at the end of every index on
    them: a commit touches a few index pages instead of one random page per record.
    """
    return f"{time.time_ns() // 1_000_000:012x}{secrets.randbits(48):012x}"


def new_rollout_id() -> str:
    """A fresh rollout id: ``ro-`` and 24 hex characters, time-ordered (see :func:`_time_ordered_hex`)."""
    return f"ro-{_time_ordered_hex()}"


def new_attempt_id() -> str:
    """A fresh attempt id: ``at-`` and 24 hex characters, time-ordered (see :func:`_time_ordered_hex`)."""
    return f"at-{_time_ordered_hex()}"


def resources_id_for(version: int) -> str:
    """The id of resources version ``version`` (1, 2, ...): ``rs-<version>``."""
    return f"rs-{version}"


def check_page(limit: int | None, offset: int) -> None:
    """Raise ConfigError for a negative ``limit`` or ``offset``."""
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0 or None, got {limit}")
    if offset < 0:
        raise ConfigError(f"offset must be >= 0, got {offset}")


def check_claim_count(n: int) -> int:
    """Return ``n``, the most rollouts one :meth:`claim_many` call may take.

    Raises:
        ConfigError: ``n`` is below 1.
    """
    if n < 1:
        raise ConfigError(f"claim_many takes n >= 1 (the most rollouts to claim in one call), got n={n}")
    return n


ROLLOUT_SORT_FIELDS: Final[tuple[str, ...]] = (
    "enqueue_time",
    "start_time",
    "end_time",
    "status",
    "rollout_id",
    "final_reward",
)
"""Rollout fields ``query_rollouts`` can sort by (``sort_by``)."""

DEFAULT_ROLLOUT_SORT: Final = "enqueue_time"
"""The default ``sort_by``: enqueue order, oldest first."""


def check_sort(sort_by: str) -> str:
    """Return ``sort_by`` if rollouts can be sorted by it.

    Raises:
        ConfigError: an unknown field; the message lists :data:`ROLLOUT_SORT_FIELDS`.
    """
    if sort_by not in ROLLOUT_SORT_FIELDS:
        allowed = ", ".join(ROLLOUT_SORT_FIELDS)
        raise ConfigError(f"cannot sort rollouts by {sort_by!r}; sort_by must be one of: {allowed}")
    return sort_by


def sort_rollouts(rollouts_in_enqueue_order: Sequence[Rollout], sort_by: str, descending: bool) -> list[Rollout]:
    """Sort rollouts for ``query_rollouts`` (the SQL backends' ``ORDER BY`` does the same).

    ``enqueue_time`` keeps enqueue order (rollouts of one batch share an enqueue time but keep their batch order).
    Any other field sorts by its value; text (``status``, ``rollout_id``) by code point. Rollouts without a value
    (``start_time``/``end_time``/``final_reward`` of ``None``) come last in either direction. Ties keep enqueue
    order, reversed when ``descending`` (so ``descending`` on distinct values is the exact reverse).

    Raises:
        ConfigError: unknown ``sort_by`` (see :func:`check_sort`).
    """
    field = check_sort(sort_by)
    ordered = list(reversed(rollouts_in_enqueue_order)) if descending else list(rollouts_in_enqueue_order)
    if field == DEFAULT_ROLLOUT_SORT:
        return ordered
    values = [(getattr(r, field), r) for r in ordered]
    present = [(value, r) for value, r in values if value is not None]
    present.sort(key=lambda pair: pair[0], reverse=descending)  # stable: ties keep the order built above
    return [r for _, r in present] + [r for value, r in values if value is None]


def is_terminal(rollout: Rollout) -> bool:
    """Whether the rollout is ``succeeded``, ``failed`` or ``cancelled`` (it never changes again)."""
    return rollout.status in TERMINAL_ROLLOUT_STATUSES


def claim(rollout: Rollout, *, worker_id: str, resources_id: str | None, now: float) -> tuple[Rollout, Attempt]:
    """Lease ``rollout`` to ``worker_id``: a new ``preparing`` attempt numbered ``num_attempts + 1``.

    ``resources_id`` is the version handed to the attempt (the rollout's own, or the latest at claim time).

    Raises:
        InvalidTransitionError: the rollout is not ``queuing``/``requeuing``.
    """
    status = rollout_transition(rollout.status, RolloutEvent.CLAIM)
    sequence_id = rollout.num_attempts + 1
    attempt = Attempt(
        rollout_id=rollout.rollout_id,
        attempt_id=new_attempt_id(),
        sequence_id=sequence_id,
        status=AttemptStatus.PREPARING,
        worker_id=worker_id,
        resources_id=resources_id,
        start_time=now,
    )
    updated = rollout.model_copy(
        update={
            "status": status,
            "num_attempts": sequence_id,
            "start_time": rollout.start_time if rollout.start_time is not None else now,
        }
    )
    return updated, attempt


def attempted(rollout: Rollout, attempt: Attempt) -> AttemptedRollout:
    """Pair a rollout with its attempt (the claim result)."""
    return AttemptedRollout(rollout=rollout, attempt=attempt)


def rollout_event_for(rollout: Rollout, attempt_status: AttemptStatus) -> RolloutEvent:
    """The rollout event caused by its latest attempt moving to ``attempt_status``.

    ``running`` starts the rollout, ``succeeded`` ends it, and any other end retries or fails it (see module rules).
    """
    if attempt_status == AttemptStatus.RUNNING:
        return RolloutEvent.START
    if attempt_status == AttemptStatus.SUCCEEDED:
        return RolloutEvent.SUCCEED
    config = rollout.config
    if attempt_status in config.retry_on and rollout.num_attempts < config.max_attempts:
        return RolloutEvent.RETRY
    return RolloutEvent.FAIL


def update_attempt(
    rollout: Rollout,
    attempt: Attempt,
    status: AttemptStatus,
    *,
    is_latest: bool,
    now: float,
    error: dict[str, Any] | None = None,
    final_reward: float | None = None,
) -> tuple[Rollout, Attempt]:
    """Move ``attempt`` to ``status``; move ``rollout`` too when the attempt is its latest.

    The attempt's ``last_heartbeat_time`` is refreshed; a terminal status sets its ``end_time``; ``error`` (when
    given) is stored on the attempt. ``final_reward`` is stored on the rollout when the latest attempt succeeds.

    Raises:
        RewardError: ``final_reward`` is not a reward (:func:`~agentbolt.types.rewards.coerce_reward`: a string,
            NaN, an infinity...).
        ConfigError: ``final_reward`` given with a status other than ``succeeded``.
        InvalidTransitionError: the attempt (or its rollout) cannot make that move; the message names the allowed
            ones.
    """
    final_reward = check_final_reward(final_reward, rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id)
    if final_reward is not None and status != AttemptStatus.SUCCEEDED:
        raise ConfigError(
            f"final_reward is only accepted with status 'succeeded', got status '{status.value}'; "
            "report the reward with emit_reward instead, or drop it"
        )
    event = ATTEMPT_EVENT_FOR_STATUS.get(status)
    label = f"attempt {attempt.attempt_id} of rollout {rollout.rollout_id}"
    if event is None:
        reportable = ", ".join(s.value for s in ATTEMPT_EVENT_FOR_STATUS)
        raise InvalidTransitionError(
            f"{label}: '{status.value}' is not a status a runner can report (it can report: {reportable}; "
            f"which of them are allowed now depends on the attempt's state, '{attempt.status.value}')"
        )
    try:
        new_status = attempt_transition(attempt.status, event)
    except InvalidTransitionError as exc:
        raise InvalidTransitionError(f"{label}: {exc}") from None
    terminal = new_status in TERMINAL_ATTEMPT_STATUSES
    new_attempt = attempt.model_copy(
        update={
            "status": new_status,
            "end_time": now if terminal else attempt.end_time,
            "last_heartbeat_time": now,
            "error": error if error is not None else attempt.error,
        }
    )
    if not is_latest:
        return rollout, new_attempt
    rollout_event = rollout_event_for(rollout, new_status)
    try:
        new_rollout_status = rollout_transition(rollout.status, rollout_event)
    except InvalidTransitionError as exc:
        raise InvalidTransitionError(f"rollout {rollout.rollout_id}: {exc}") from None
    changes: dict[str, Any] = {"status": new_rollout_status}
    if new_rollout_status in TERMINAL_ROLLOUT_STATUSES:
        changes["end_time"] = now
    if new_rollout_status == RolloutStatus.SUCCEEDED and final_reward is not None:
        changes["final_reward"] = final_reward
    return rollout.model_copy(update=changes), new_attempt


def cancel(rollout: Rollout, latest: Attempt | None, *, now: float) -> tuple[Rollout, Attempt | None]:
    """Cancel ``rollout``; its in-flight latest attempt (if any) ends ``failed`` with ``error.type == "cancelled"``.

    Returns the rollout and the changed attempt (``None`` when no attempt changed).

    Raises:
        InvalidTransitionError: the rollout is already terminal.
    """
    try:
        status = rollout_transition(rollout.status, RolloutEvent.CANCEL)
    except InvalidTransitionError as exc:
        raise InvalidTransitionError(f"rollout {rollout.rollout_id}: {exc}") from None
    new_rollout = rollout.model_copy(update={"status": status, "end_time": now})
    if latest is None or latest.status not in ACTIVE_ATTEMPT_STATUSES:
        return new_rollout, None
    _, ended = update_attempt(
        rollout,
        latest,
        AttemptStatus.FAILED,
        is_latest=False,
        now=now,
        error={"type": CANCELLED_ERROR_TYPE, "message": f"rollout {rollout.rollout_id} was cancelled"},
    )
    return new_rollout, ended


def expired_status(config: RolloutConfig, attempt: Attempt, now: float) -> AttemptStatus | None:
    """``timeout`` or ``unresponsive`` if the attempt's lease has run out at ``now``, else ``None``.

    Timeout wins when both apply. Terminal attempts never expire.
    """
    if attempt.status not in ACTIVE_ATTEMPT_STATUSES:
        return None
    if config.timeout_seconds is not None and now - attempt.start_time >= config.timeout_seconds:
        return AttemptStatus.TIMEOUT
    if config.unresponsive_seconds is not None:
        last = attempt.last_heartbeat_time if attempt.last_heartbeat_time is not None else attempt.start_time
        if now - last >= config.unresponsive_seconds:
            return AttemptStatus.UNRESPONSIVE
    return None


def expire(rollout: Rollout, attempt: Attempt, *, is_latest: bool, now: float) -> tuple[Rollout, Attempt] | None:
    """End an attempt whose lease ran out (see :func:`expired_status`); ``None`` when it has not.

    The rollout is requeued or failed by the same rule as :func:`update_attempt`.
    """
    status = expired_status(rollout.config, attempt, now)
    if status is None:
        return None
    if is_terminal(rollout):
        is_latest = False
    config = rollout.config
    if status is AttemptStatus.TIMEOUT:
        message = f"the attempt ran past its timeout_seconds ({config.timeout_seconds:g} s); the store ended it"
    else:
        message = (
            f"no heartbeat, span or gateway call for unresponsive_seconds ({config.unresponsive_seconds:g} s): its "
            "runner stopped (died, or was killed); the store ended it"
        )
    error = {"type": status.value, "cause": status.value, "message": message}
    return update_attempt(rollout, attempt, status, is_latest=is_latest, now=now, error=error)


def refresh_attempt(attempt: Attempt, now: float) -> Attempt:
    """The attempt with its heartbeat set to ``now`` (unchanged when it is terminal)."""
    if attempt.status not in ACTIVE_ATTEMPT_STATUSES:
        return attempt
    return attempt.model_copy(update={"last_heartbeat_time": now})


def span_refreshes_heartbeat(
    status: AttemptStatus, last_heartbeat_time: float | None, unresponsive_seconds: float | None, now: float
) -> bool:
    """Whether a span arriving at ``now`` must write the attempt's heartbeat.

    A span is a heartbeat, but writing the heartbeat on every span costs a page write per span in the SQL stores.
    The heartbeat is written when the attempt is active and its recorded heartbeat is at least
    ``min(SPAN_HEARTBEAT_RESOLUTION_S, SPAN_HEARTBEAT_RESOLUTION_FRACTION * unresponsive_seconds)`` old (or missing),
    so a stream of spans can make an attempt look older than it is by at most 5% of its ``unresponsive_seconds``
    (and its ``last_heartbeat_time`` stale by at most one second). Explicit :meth:`heartbeat` calls always write.
    """
    if status not in ACTIVE_ATTEMPT_STATUSES:
        return False
    if last_heartbeat_time is None:
        return True
    resolution = SPAN_HEARTBEAT_RESOLUTION_S
    if unresponsive_seconds is not None:
        resolution = min(resolution, SPAN_HEARTBEAT_RESOLUTION_FRACTION * unresponsive_seconds)
    return now - last_heartbeat_time >= resolution


def worker_heartbeat(worker: Worker | None, worker_id: str, *, now: float, attempt: Attempt | None = None) -> Worker:
    """Register or refresh a worker; with an active ``attempt``, mark the worker busy with it."""
    if worker is None:
        worker = Worker(worker_id=worker_id, last_heartbeat_time=now)
    changes: dict[str, Any] = {"last_heartbeat_time": now}
    if attempt is not None and attempt.status in ACTIVE_ATTEMPT_STATUSES:
        changes.update(status=WORKER_BUSY, current_rollout_id=attempt.rollout_id, current_attempt_id=attempt.attempt_id)
    return worker.model_copy(update=changes)


def worker_after_attempt(worker: Worker, attempt: Attempt) -> Worker:
    """The worker freed (``idle``) if ``attempt`` is its current one and has ended; else unchanged."""
    if worker.current_attempt_id != attempt.attempt_id or attempt.status in ACTIVE_ATTEMPT_STATUSES:
        return worker
    return worker.model_copy(update={"status": WORKER_IDLE, "current_rollout_id": None, "current_attempt_id": None})


def check_trained_samples(train_step: int, samples: Sequence[TrainedSample]) -> list[tuple[str, str]]:
    """Check a step's trained samples before :meth:`~agentbolt.store.base.LightningStore.put_trained_samples`
    stores them; return the distinct ``(rollout_id, attempt_id)`` pairs they name, in first-seen order (each backend
    checks that these attempts exist).

    Raises:
        ConfigError: ``train_step < 0``, a sample of another step, or two samples with the same ``sample_index``.
    """
    if train_step < 0:
        raise ConfigError(f"train_step must be >= 0, got {train_step}")
    seen: set[int] = set()
    pairs: dict[tuple[str, str], None] = {}
    for sample in samples:
        if sample.train_step != train_step:
            raise ConfigError(
                f"trained sample {sample.sample_index} is of step {sample.train_step}, not of step {train_step}; "
                "record each step's samples with that step"
            )
        if sample.sample_index in seen:
            raise ConfigError(f"two trained samples of step {train_step} have sample_index {sample.sample_index}")
        seen.add(sample.sample_index)
        pairs[(sample.rollout_id, sample.attempt_id)] = None
    return list(pairs)


def check_final_reward(final_reward: object, *, rollout_id: str, attempt_id: str) -> float | None:
    """``final_reward`` of a status change as a float by the reward rule, or ``None`` when none is given. Pure.

    Raises:
        RewardError: ``final_reward`` is not a reward (a string, NaN, an infinity...); the message names the value
            and the attempt.
    """
    if final_reward is None:
        return None
    return coerce_reward(final_reward, where=f"final_reward of attempt {attempt_id} of rollout {rollout_id}")


def is_reward_span(span: Span) -> bool:
    """Whether ``span`` is a reward (name ``agentbolt.reward``, named or not)."""
    return span.name == semconv.SPAN_REWARD


def check_reward_spans(spans: Sequence[Span]) -> list[Span]:
    """The spans to store, each reward span's value coerced to a float by the reward rule (see module rules); other
    spans unchanged (the same objects). Pure; call it before storing anything.

    Raises:
        RewardError: a reward span whose ``agentbolt.reward.value`` is missing or not a reward (a string, ``None``,
            NaN, an infinity, another type); the message names the span, its attempt and the value.
    """
    checked: list[Span] = []
    for span in spans:
        if is_reward_span(span):
            where = (
                f"reward span {span.span_id!r} of attempt {span.attempt_id} of rollout {span.rollout_id} "
                f"(attribute {semconv.REWARD_VALUE})"
            )
            raw = span.attributes.get(semconv.REWARD_VALUE)
            value = coerce_reward(raw, where=where)
            if type(raw) is not float:  # true, 1, a NumPy scalar: stored as the float they stand for
                span = span.model_copy(update={"attributes": {**span.attributes, semconv.REWARD_VALUE: value}})
        checked.append(span)
    return checked


def check_span_target(span: Span, attempt_status: AttemptStatus) -> None:
    """Refuse a reward span for an attempt that has ended (the "no late rewards" rule in the module docstring);
    every other span may be stored.

    Raises:
        ConflictError: ``span`` is a reward span and ``attempt_status`` is terminal; the message names the span, the
            attempt, its status and what to do instead.
    """
    if attempt_status in ACTIVE_ATTEMPT_STATUSES or not is_reward_span(span):
        return
    raise ConflictError(
        f"reward span {span.span_id!r} of attempt {span.attempt_id} of rollout {span.rollout_id} arrived after the "
        f"attempt ended ('{AttemptStatus(attempt_status).value}'); a reward of an ended attempt is refused so that a "
        "result already read never changes: emit rewards before the agent returns, or send final_reward with the "
        "status call that ends the attempt"
    )
