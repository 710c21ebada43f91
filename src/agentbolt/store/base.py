"""The ``LightningStore`` contract: the only place where the agent side and the training side meet.

Every backend (``memory``, ``sqlite``, ``postgres``, and the HTTP client in :mod:`agentbolt.client`) implements this
Protocol and passes the same contract suite (``tests/contract``). All methods are coroutines. Timestamps are epoch
seconds.

Errors raised by every backend:
    NotFoundError: an unknown rollout, attempt, resources or worker id.
    InvalidTransitionError: an illegal status change (the message names the allowed ones).
    ConflictError: a write to an attempt that is no longer the rollout's current, non-terminal attempt.
    ConfigError: a bad argument value (negative ``limit``, unknown ``sort_by``, ``n < 1``...); the message says
        which values are allowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from agentbolt.store.search import ResourceRewardStats, RolloutSearch
from agentbolt.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    Metric,
    Resource,
    ResourcesUpdate,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Span,
    TrainedSample,
    Worker,
)


class StoreCapabilities(BaseModel):
    """What a backend guarantees. ``durable``: an acknowledged write survives a process crash."""

    durable: bool
    shared_across_processes: bool


class EnqueueRequest(BaseModel):
    """One rollout to enqueue (the batch form takes a list of these)."""

    input: Any
    mode: RolloutMode = RolloutMode.TRAIN
    resources_id: str | None = None
    config: RolloutConfig | None = None
    metadata: dict[str, Any] | None = None


@runtime_checkable
class LightningStore(Protocol):
    """The store contract. See the module docstring for the errors every method may raise."""

    capabilities: StoreCapabilities

    async def enqueue_rollout(
        self,
        input: Any,
        *,
        mode: RolloutMode = RolloutMode.TRAIN,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        """Add a rollout in state ``queuing`` and return it with its new ``rollout_id``."""
        ...

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[Rollout]:
        """Batch form of :meth:`enqueue_rollout`; all or nothing, order preserved."""
        ...

    async def claim_rollout(self, worker_id: str) -> AttemptedRollout | None:
        """Lease the oldest ``queuing``/``requeuing`` rollout to ``worker_id``, creating a new attempt.

        The rollout goes to ``preparing`` and the attempt starts in ``preparing``. Returns ``None`` if the queue is
        empty. Each rollout is handed to exactly one claimer.
        """
        ...

    async def claim_many(self, worker_id: str, n: int) -> list[AttemptedRollout]:
        """Lease up to ``n`` of the oldest ``queuing``/``requeuing`` rollouts to ``worker_id`` in one call.

        Same rules as :meth:`claim_rollout` for each rollout (each goes to exactly one claimer, even when several
        processes claim at once); results are in enqueue order, ``[]`` when the queue is empty. The worker record
        points at the last attempt of the batch.

        Raises:
            ConfigError: ``n < 1``.
        """
        ...

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: dict[str, Any] | None = None,
        final_reward: float | None = None,
    ) -> Attempt:
        """Move an attempt to ``status`` and the rollout along with it.

        ``running`` starts the rollout; ``succeeded`` ends it; ``failed``/``timeout``/``unresponsive`` ends it or
        requeues it (while ``num_attempts < max_attempts`` and the status is in ``config.retry_on``).
        Updates to a superseded attempt are stored on the attempt but do not move the rollout. ``final_reward``
        (only with ``succeeded``) becomes the rollout's reward; it must be a reward by the one reward rule
        (:mod:`agentbolt.types.rewards`).

        Raises:
            InvalidTransitionError: illegal attempt transition.
            RewardError: ``final_reward`` is not a reward (a string, NaN, an infinity...).
            ConfigError: ``final_reward`` with a status other than ``succeeded``.
        """
        ...

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a non-terminal rollout. Raises InvalidTransitionError if it is already terminal."""
        ...

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """Return one rollout. Raises NotFoundError."""
        ...

    async def query_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus] | None = None,
        mode: RolloutMode | None = None,
        rollout_ids: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
        sort_by: str = "enqueue_time",
        descending: bool = False,
    ) -> list[Rollout]:
        """Rollouts matching every given filter, sorted, then paged (``offset`` rows skipped, at most ``limit``).

        ``sort_by`` is one of :data:`agentbolt.store.rules.ROLLOUT_SORT_FIELDS`. The default, ``enqueue_time``, is
        enqueue order (oldest first). Other fields sort by value (text by code point) with missing values (``None``)
        last in either direction; ties keep enqueue order, reversed when ``descending``.

        Raises:
            ConfigError: a negative ``limit``/``offset``, or an unknown ``sort_by`` (the message lists the allowed
                fields).
        """
        ...

    async def search_rollouts(self, search: RolloutSearch) -> tuple[list[Rollout], int]:
        """One page of the rollouts matching ``search`` (filters, order and page: see
        :class:`~agentbolt.store.search.RolloutSearch`), and how many matched before paging.

        Built for the dashboard: SQL backends answer a page of 100k rollouts in milliseconds (indexes on
        ``final_reward``; text search scans).
        """
        ...

    async def reward_stats(self) -> list[ResourceRewardStats]:
        """Per (resources version, mode): how many rollouts finished (succeeded or failed), how many of those have a
        ``final_reward``, and its mean (:class:`~agentbolt.store.search.ResourceRewardStats`). Ordered by
        ``resources_id`` (``None``, rollouts enqueued for "the latest", first) then mode; groups without a finished
        rollout are absent.

        Built for the dashboard's scores: SQL backends answer it with one ``GROUP BY`` instead of reading every
        rollout.
        """
        ...

    async def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Return one attempt. Raises NotFoundError."""
        ...

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """All attempts of a rollout, by ``sequence_id``. Raises NotFoundError for an unknown rollout."""
        ...

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout_s: float | None = None) -> list[Rollout]:
        """Block until every listed rollout is terminal or ``timeout_s`` passes (``None``: no limit).

        Returns the rollouts that are terminal at return time, in the order asked.
        """
        ...

    async def add_span(self, span: Span) -> Span:
        """Store a span, assigning the next ``sequence_id`` of its attempt. Counts as a heartbeat.

        A reward span (``agentbolt.reward``) is stored with its ``agentbolt.reward.value`` as a float (``true`` is
        1.0); rules in :mod:`agentbolt.store.rules`.

        Raises:
            NotFoundError: unknown rollout or attempt.
            RewardError: a reward span whose value is missing or not a reward (a string, null, NaN...).
            ConflictError: a reward span for an attempt that has ended (a consumed result never changes).
        """
        ...

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Batch form of :meth:`add_span`; all or nothing (any error above stores none of them), order preserved."""
        ...

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of one attempt (or of the rollout's latest attempt if ``attempt_id`` is None), by sequence_id."""
        ...

    async def add_resources(
        self, resources: dict[str, Resource], *, metadata: dict[str, Any] | None = None
    ) -> ResourcesUpdate:
        """Store a new immutable resources version and make it the latest."""
        ...

    async def get_resources(self, resources_id: str | None = None) -> ResourcesUpdate | None:
        """One version, or the latest when ``resources_id`` is None (``None`` if none exists yet).

        Raises:
            NotFoundError: an explicit ``resources_id`` that does not exist.
        """
        ...

    async def query_resources(self) -> list[ResourcesUpdate]:
        """Every resources version, oldest first."""
        ...

    async def heartbeat(
        self, worker_id: str, *, rollout_id: str | None = None, attempt_id: str | None = None
    ) -> Worker:
        """Register or refresh a worker; with an attempt, also refresh that attempt's heartbeat."""
        ...

    async def query_workers(self) -> list[Worker]:
        """Every known worker."""
        ...

    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        """Append training-curve points."""
        ...

    async def query_metrics(self, name: str | None = None) -> list[Metric]:
        """Points of one curve (or all), by ``train_step`` then insertion."""
        ...

    async def put_trained_samples(self, train_step: int, samples: Sequence[TrainedSample]) -> None:
        """Record the samples the update of ``train_step`` received (:class:`~agentbolt.types.TrainedSample`),
        replacing whatever was recorded for that step before; all or nothing.

        Replacing makes the write idempotent: a resumed run that redoes a step records what it trained the second
        time, and an empty ``samples`` leaves the step with no record.

        Raises:
            ConfigError: a sample's ``train_step`` differs from ``train_step``, or two samples share a
                ``sample_index``.
            NotFoundError: a sample names an attempt that is not one of its rollout's (or an unknown rollout).
        """
        ...

    async def query_trained_samples(
        self, *, rollout_id: str | None = None, train_step: int | None = None
    ) -> list[TrainedSample]:
        """The recorded trained samples matching every given filter, by ``train_step`` then ``sample_index``.

        Filters only: an unknown rollout or a step without a record gives ``[]``.
        """
        ...

    async def close(self) -> None:
        """Release files, connections and background tasks."""
        ...
