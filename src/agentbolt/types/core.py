"""Rollouts, attempts and workers: the records the store owns.

Timestamps are float seconds since the Unix epoch (UTC). Status values are ``StrEnum`` members so that a typo is a
``ValueError`` at parse time, never a branch that silently does not match.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentbolt.types.bounds import INT64_MAX, INT64_MIN


class RolloutMode(StrEnum):
    """What a rollout is for. ``train`` rollouts feed the algorithm; ``val``/``test`` are only scored."""

    TRAIN = "train"
    VAL = "val"
    TEST = "test"


class RolloutStatus(StrEnum):
    """Rollout state machine: ``queuing -> preparing -> running -> succeeded | failed | cancelled``.

    ``requeuing`` sits between a failed attempt and the next one. The legal moves are in
    :mod:`agentbolt.store.lifecycle`.
    """

    QUEUING = "queuing"
    PREPARING = "preparing"
    RUNNING = "running"
    REQUEUING = "requeuing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class AttemptStatus(StrEnum):
    """Attempt state machine: ``preparing -> running -> succeeded | failed | timeout | unresponsive``."""

    PREPARING = "preparing"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    UNRESPONSIVE = "unresponsive"


TERMINAL_ROLLOUT_STATUSES: frozenset[RolloutStatus] = frozenset(
    {RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.CANCELLED}
)
TERMINAL_ATTEMPT_STATUSES: frozenset[AttemptStatus] = frozenset(
    {AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.TIMEOUT, AttemptStatus.UNRESPONSIVE}
)


DEFAULT_UNRESPONSIVE_S: float = 30.0
"""The lease of an attempt when its rollout's config does not set one: seconds without a heartbeat, span or gateway
call after which it is ``unresponsive``."""


class RolloutConfig(BaseModel):
    """Retry and lease settings of one rollout.

    Attributes:
        max_attempts: how many attempts may be made in total (>= 1).
        timeout_seconds: wall-clock limit of one attempt, from claim to end; ``None`` means no limit. The runner
            stops its agent at this limit and reports ``timeout``; the store expires the attempt too.
        unresponsive_seconds: an attempt with no heartbeat or span for this long is ``unresponsive`` (its lease;
            runners beat every 2 s, and the gateway refreshes it while it serves the attempt's calls). Default
            :data:`DEFAULT_UNRESPONSIVE_S`, so the rollout of a runner that died ends (or is retried) within
            seconds; ``None`` (given explicitly) means no lease.
        retry_on: attempt end states that trigger a retry while attempts remain.
    """

    model_config = ConfigDict(frozen=True)

    max_attempts: int = Field(default=1, ge=1)
    timeout_seconds: float | None = Field(default=None, gt=0)
    unresponsive_seconds: float | None = Field(default=DEFAULT_UNRESPONSIVE_S, gt=0)
    retry_on: tuple[AttemptStatus, ...] = (AttemptStatus.TIMEOUT, AttemptStatus.UNRESPONSIVE)


class Rollout(BaseModel):
    """One execution of the agent on one task.

    Attributes:
        rollout_id: store-assigned id (``ro-...``).
        input: the task, as JSON-compatible data handed to the agent unchanged.
        mode: ``train``, ``val`` or ``test``.
        resources_id: the resources version the rollout must run against; ``None`` means the latest at claim time.
        status: current :class:`RolloutStatus`.
        config: retry and lease settings.
        metadata: free-form labels; the trainer puts ``task_id`` here to form GRPO groups.
        enqueue_time: when it was enqueued (epoch seconds).
        start_time / end_time: first claim and terminal transition (epoch seconds), if any.
        num_attempts: attempts made so far.
        final_reward: the reward of the attempt that ended the rollout, once known.
    """

    rollout_id: str
    input: Any
    mode: RolloutMode = RolloutMode.TRAIN
    resources_id: str | None = None
    status: RolloutStatus = RolloutStatus.QUEUING
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)
    enqueue_time: float
    start_time: float | None = None
    end_time: float | None = None
    num_attempts: int = 0
    final_reward: float | None = None


class Attempt(BaseModel):
    """One try of a rollout by a runner.

    Attributes:
        rollout_id / attempt_id: ids; ``attempt_id`` is ``at-...``.
        sequence_id: 1 for the first attempt of a rollout, then 2, 3, ...
        status: current :class:`AttemptStatus`.
        worker_id: the runner that claimed it.
        resources_id: the resources version the attempt was handed.
        start_time / end_time / last_heartbeat_time: epoch seconds.
        error: ``{"type": ..., "message": ..., "traceback": ...}`` when the agent raised.
    """

    rollout_id: str
    attempt_id: str
    sequence_id: int = Field(ge=1)
    status: AttemptStatus = AttemptStatus.PREPARING
    worker_id: str | None = None
    resources_id: str | None = None
    start_time: float
    end_time: float | None = None
    last_heartbeat_time: float | None = None
    error: dict[str, Any] | None = None


class AttemptedRollout(BaseModel):
    """What a claim returns: the rollout and the attempt just created for it."""

    rollout: Rollout
    attempt: Attempt


class Worker(BaseModel):
    """A runner process known to the store. ``current_*`` are set while it holds an attempt."""

    worker_id: str
    status: str = "idle"
    last_heartbeat_time: float
    current_rollout_id: str | None = None
    current_attempt_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class Metric(BaseModel):
    """One point of a training curve: ``name`` at ``train_step`` has ``value`` (unit in the name, e.g. ``_s``)."""

    name: str
    train_step: int = Field(ge=INT64_MIN, le=INT64_MAX)
    value: float = Field(allow_inf_nan=False)
    time: float = Field(allow_inf_nan=False)
