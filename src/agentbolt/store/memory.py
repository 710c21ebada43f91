"""``InMemoryLightningStore``: the store in a few dicts, for tests and single-process runs.

Nothing survives the process. Use one store from one thread (one event loop at a time). Every method runs without
awaiting between its reads and writes, so each one is atomic on the event loop without any lock. Records are
deep-copied on the way in and out, so a caller mutating a returned model never changes the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Sequence
from typing import Any

from pydantic_core import PydanticSerializationError

from agentbolt.errors import AgentboltError, ConfigError, NotFoundError
from agentbolt.store import rules
from agentbolt.store.base import EnqueueRequest, StoreCapabilities
from agentbolt.store.search import ResourceRewardStats, RolloutSearch, reward_stats, search_page
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

logger = logging.getLogger(__name__)


class InMemoryLightningStore:
    """A non-durable, single-process :class:`~agentbolt.store.base.LightningStore`.

    Args:
        sweep_interval_s: seconds between background checks for expired leases (the check also runs before every
            claim and query). The background task starts on the first call and stops in :meth:`close`.

    Raises:
        ConfigError: ``sweep_interval_s`` is not positive.
    """

    def __init__(self, *, sweep_interval_s: float = 0.5) -> None:
        if sweep_interval_s <= 0:
            raise ConfigError(f"sweep_interval_s must be > 0 seconds, got {sweep_interval_s}")
        self.capabilities = StoreCapabilities(durable=False, shared_across_processes=False)
        self.sweep_interval_s = sweep_interval_s
        self._rollouts: dict[str, Rollout] = {}  # insertion order == enqueue order
        self._enqueue_seq: dict[str, int] = {}
        self._queue: list[tuple[int, str]] = []  # heap of (enqueue_seq, rollout_id); stale entries skipped on pop
        self._attempts: dict[str, list[Attempt]] = {}  # rollout_id -> attempts by sequence_id
        self._active: dict[str, str] = {}  # rollout_id -> attempt_id of its in-flight attempt
        # Spans are kept as their JSON encoding: about the size of the payload (no per-int Python objects), and
        # immutable, so neither add nor query needs a deep copy.
        self._spans: dict[tuple[str, str], list[bytes]] = {}
        self._resources: list[ResourcesUpdate] = []
        self._workers: dict[str, Worker] = {}
        self._metrics: list[Metric] = []
        self._trained: dict[int, list[TrainedSample]] = {}  # train_step -> its samples, as given
        self._waiters: set[asyncio.Event] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    # ----------------------------------------------------------------- plumbing
    def _start(self) -> None:
        """Check the store is open and that the lease sweeper runs on the current event loop."""
        if self._closed:
            raise AgentboltError("this InMemoryLightningStore is closed; create a new one")
        task = self._sweeper
        loop = asyncio.get_running_loop()
        if task is None or task.done() or task.get_loop().is_closed():
            self._sweeper = loop.create_task(self._sweep_forever(), name="agentbolt-memory-store-sweeper")

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            try:
                self._expire(time.time())
            except Exception:  # a sweeper bug must not kill the sweeper; it is logged and retried
                logger.exception("lease sweep failed")

    def _notify(self) -> None:
        for event in self._waiters:
            event.set()

    def _rollout(self, rollout_id: str) -> Rollout:
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            raise NotFoundError(f"rollout '{rollout_id}' does not exist")
        return rollout

    def _attempt(self, rollout_id: str, attempt_id: str) -> Attempt:
        for attempt in self._attempts.get(self._rollout(rollout_id).rollout_id, []):
            if attempt.attempt_id == attempt_id:
                return attempt
        raise NotFoundError(f"attempt '{attempt_id}' of rollout '{rollout_id}' does not exist")

    def _is_latest(self, attempt: Attempt) -> bool:
        attempts = self._attempts[attempt.rollout_id]
        return attempts[-1].attempt_id == attempt.attempt_id

    def _save(self, rollout: Rollout, attempt: Attempt | None = None) -> None:
        """Write back a rollout (and one of its attempts), keeping the queue, active map and workers in step."""
        before = self._rollouts[rollout.rollout_id]
        self._rollouts[rollout.rollout_id] = rollout
        if rollout.status in rules.CLAIMABLE_ROLLOUT_STATUSES and before.status not in rules.CLAIMABLE_ROLLOUT_STATUSES:
            heapq.heappush(self._queue, (self._enqueue_seq[rollout.rollout_id], rollout.rollout_id))
        if attempt is not None:
            attempts = self._attempts.setdefault(rollout.rollout_id, [])
            index = attempt.sequence_id - 1
            if index == len(attempts):
                attempts.append(attempt)
            else:
                attempts[index] = attempt
            if attempt.status in rules.ACTIVE_ATTEMPT_STATUSES:
                self._active[rollout.rollout_id] = attempt.attempt_id
            else:
                if self._active.get(rollout.rollout_id) == attempt.attempt_id:
                    del self._active[rollout.rollout_id]
                if attempt.worker_id is not None and attempt.worker_id in self._workers:
                    worker = self._workers[attempt.worker_id]
                    self._workers[attempt.worker_id] = rules.worker_after_attempt(worker, attempt)
        if rules.is_terminal(rollout) and not rules.is_terminal(before):
            self._notify()

    def _expire(self, now: float) -> None:
        for rollout_id, attempt_id in list(self._active.items()):
            attempt = self._attempt(rollout_id, attempt_id)
            result = rules.expire(self._rollouts[rollout_id], attempt, is_latest=self._is_latest(attempt), now=now)
            if result is not None:
                self._save(*result)

    def _check_resources(self, resources_id: str | None) -> None:
        if resources_id is not None:
            self._resources_by_id(resources_id)

    def _resources_by_id(self, resources_id: str) -> ResourcesUpdate:
        for update in self._resources:
            if update.resources_id == resources_id:
                return update
        raise NotFoundError(f"resources '{resources_id}' do not exist")

    # ----------------------------------------------------------------- rollouts
    def _new_rollout(self, request: EnqueueRequest, now: float) -> Rollout:
        self._check_resources(request.resources_id)
        return Rollout(
            rollout_id=rules.new_rollout_id(),
            input=request.input,
            mode=request.mode,
            resources_id=request.resources_id,
            config=request.config or RolloutConfig(),
            metadata=request.metadata or {},
            enqueue_time=now,
        ).model_copy(deep=True)

    def _insert_rollouts(self, rollouts: list[Rollout]) -> list[Rollout]:
        for rollout in rollouts:
            seq = len(self._enqueue_seq)
            self._enqueue_seq[rollout.rollout_id] = seq
            self._rollouts[rollout.rollout_id] = rollout
            heapq.heappush(self._queue, (seq, rollout.rollout_id))
        return [r.model_copy(deep=True) for r in rollouts]

    async def enqueue_rollout(
        self,
        input: Any,
        *,
        mode: RolloutMode = RolloutMode.TRAIN,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        """Add a ``queuing`` rollout. Raises NotFoundError for an unknown ``resources_id``."""
        self._start()
        request = EnqueueRequest(input=input, mode=mode, resources_id=resources_id, config=config, metadata=metadata)
        return self._insert_rollouts([self._new_rollout(request, time.time())])[0]

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[Rollout]:
        """Enqueue all or none, in order. Raises NotFoundError for an unknown ``resources_id``."""
        self._start()
        now = time.time()
        rollouts = [self._new_rollout(request, now) for request in requests]
        return self._insert_rollouts(rollouts)

    async def claim_rollout(self, worker_id: str) -> AttemptedRollout | None:
        """Lease the oldest claimable rollout to ``worker_id``; ``None`` when the queue is empty."""
        claimed = await self.claim_many(worker_id, 1)
        return claimed[0] if claimed else None

    async def claim_many(self, worker_id: str, n: int) -> list[AttemptedRollout]:
        """Lease up to ``n`` of the oldest claimable rollouts to ``worker_id``, in enqueue order. Raises ConfigError
        (``n < 1``)."""
        rules.check_claim_count(n)
        self._start()
        now = time.time()
        self._expire(now)
        claimed: list[AttemptedRollout] = []
        while self._queue and len(claimed) < n:
            _, rollout_id = heapq.heappop(self._queue)
            rollout = self._rollouts[rollout_id]
            if rollout.status not in rules.CLAIMABLE_ROLLOUT_STATUSES:
                continue  # a stale heap entry (cancelled, or claimed since it was pushed)
            latest = self._resources[-1].resources_id if self._resources else None
            updated, attempt = rules.claim(
                rollout, worker_id=worker_id, resources_id=rollout.resources_id or latest, now=now
            )
            self._save(updated, attempt)
            worker = self._workers.get(worker_id)
            self._workers[worker_id] = rules.worker_heartbeat(worker, worker_id, now=now, attempt=attempt)
            claimed.append(rules.attempted(updated, attempt).model_copy(deep=True))
        return claimed

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: dict[str, Any] | None = None,
        final_reward: float | None = None,
    ) -> Attempt:
        """Move an attempt (and, if it is the latest, its rollout). Raises NotFoundError, InvalidTransitionError,
        ConfigError (``final_reward`` without ``succeeded``)."""
        self._start()
        now = time.time()
        self._expire(now)
        attempt = self._attempt(rollout_id, attempt_id)
        rollout, updated = rules.update_attempt(
            self._rollouts[rollout_id],
            attempt,
            AttemptStatus(status),
            is_latest=self._is_latest(attempt),
            now=now,
            error=error,
            final_reward=final_reward,
        )
        self._save(rollout, updated)
        return updated.model_copy(deep=True)

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a rollout (its in-flight attempt ends ``failed``). Raises NotFoundError, InvalidTransitionError."""
        self._start()
        self._expire(time.time())
        rollout = self._rollout(rollout_id)
        attempts = self._attempts.get(rollout_id)
        cancelled, ended = rules.cancel(rollout, attempts[-1] if attempts else None, now=time.time())
        self._save(cancelled, ended)
        return cancelled.model_copy(deep=True)

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout. Raises NotFoundError."""
        self._start()
        self._expire(time.time())
        return self._rollout(rollout_id).model_copy(deep=True)

    async def query_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus] | None = None,
        mode: RolloutMode | None = None,
        rollout_ids: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
        sort_by: str = rules.DEFAULT_ROLLOUT_SORT,
        descending: bool = False,
    ) -> list[Rollout]:
        """Rollouts matching every filter, sorted by ``sort_by`` (see the contract), then paged. Raises ConfigError
        (negative limit/offset, unknown ``sort_by``)."""
        rules.check_page(limit, offset)
        rules.check_sort(sort_by)
        self._start()
        self._expire(time.time())
        statuses = None if status is None else {RolloutStatus(s) for s in status}
        ids = None if rollout_ids is None else set(rollout_ids)
        found: list[Rollout] = []
        for rollout in self._rollouts.values():
            if statuses is not None and rollout.status not in statuses:
                continue
            if mode is not None and rollout.mode != mode:
                continue
            if ids is not None and rollout.rollout_id not in ids:
                continue
            found.append(rollout)
        found = rules.sort_rollouts(found, sort_by, descending)
        end = None if limit is None else offset + limit
        return [r.model_copy(deep=True) for r in found[offset:end]]

    async def search_rollouts(self, search: RolloutSearch) -> tuple[list[Rollout], int]:
        """One page of the rollouts matching ``search`` and the number that matched (see the contract)."""
        self._start()
        self._expire(time.time())
        page, total = search_page(self._rollouts.values(), search)
        return [r.model_copy(deep=True) for r in page], total

    async def reward_stats(self) -> list[ResourceRewardStats]:
        """Finished rollouts and mean reward per (resources version, mode) (see the contract)."""
        self._start()
        self._expire(time.time())
        return reward_stats(self._rollouts.values())

    async def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt:
        """One attempt. Raises NotFoundError."""
        self._start()
        self._expire(time.time())
        return self._attempt(rollout_id, attempt_id).model_copy(deep=True)

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """All attempts of a rollout by ``sequence_id``. Raises NotFoundError."""
        self._start()
        self._expire(time.time())
        self._rollout(rollout_id)
        return [a.model_copy(deep=True) for a in self._attempts.get(rollout_id, [])]

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout_s: float | None = None) -> list[Rollout]:
        """Wait until all listed rollouts are terminal or ``timeout_s`` seconds pass (``None``: no limit).

        Returns the terminal ones, in the order asked. Raises NotFoundError for an unknown id.
        """
        self._start()
        for rollout_id in rollout_ids:
            self._rollout(rollout_id)
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + max(timeout_s, 0.0)
        event = asyncio.Event()
        self._waiters.add(event)
        try:
            while True:
                self._expire(time.time())
                done = [self._rollouts[i] for i in rollout_ids if rules.is_terminal(self._rollouts[i])]
                if len(done) == len(rollout_ids) or self._closed:
                    break
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                event.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
        finally:
            self._waiters.discard(event)
        return [r.model_copy(deep=True) for r in done]

    # ----------------------------------------------------------------- spans
    def _numbered(self, spans: Sequence[Span]) -> list[tuple[Attempt, Span]]:
        """Validate every span first (its attempt exists; the reward rules of :mod:`agentbolt.store.rules`), then
        number them (all or nothing). The copies are shallow: they are encoded to JSON before anything else can
        change them."""
        spans = rules.check_reward_spans(spans)
        attempts = [self._attempt(span.rollout_id, span.attempt_id) for span in spans]
        for attempt, span in zip(attempts, spans, strict=True):
            rules.check_span_target(span, attempt.status)
        numbered: list[tuple[Attempt, Span]] = []
        counts: dict[tuple[str, str], int] = {}
        for attempt, span in zip(attempts, spans, strict=True):
            key = (span.rollout_id, span.attempt_id)
            counts[key] = counts.get(key, len(self._spans.get(key, []))) + 1
            numbered.append((attempt, span.model_copy(update={"sequence_id": counts[key]})))
        return numbered

    async def add_span(self, span: Span) -> Span:
        """Store a span with the next ``sequence_id`` of its attempt; a heartbeat too. Raises NotFoundError."""
        return (await self.add_spans([span]))[0]

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Store spans all or nothing, in order. Raises NotFoundError for an unknown rollout/attempt; ConfigError
        for an attribute value that JSON cannot hold, RewardError for a reward span whose value is not a reward,
        ConflictError for a reward span of an ended attempt (all checked before anything is stored)."""
        self._start()
        now = time.time()
        numbered = self._numbered(spans)
        try:
            encoded = [span.__pydantic_serializer__.to_json(span) for _, span in numbered]
        except PydanticSerializationError as exc:
            raise ConfigError(f"a span attribute cannot be stored as JSON: {exc}") from exc
        for (attempt, span), raw in zip(numbered, encoded, strict=True):
            self._spans.setdefault((span.rollout_id, span.attempt_id), []).append(raw)
            current = self._attempt(attempt.rollout_id, attempt.attempt_id)
            self._attempts[attempt.rollout_id][attempt.sequence_id - 1] = rules.refresh_attempt(current, now)
        return [span for _, span in numbered]

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of one attempt (default: the latest) by ``sequence_id``. Raises NotFoundError."""
        self._start()
        if attempt_id is None:
            attempts = self._attempts.get(self._rollout(rollout_id).rollout_id)
            if not attempts:
                return []
            attempt_id = attempts[-1].attempt_id
        else:
            self._attempt(rollout_id, attempt_id)
        return [Span.model_validate_json(raw) for raw in self._spans.get((rollout_id, attempt_id), [])]

    # ----------------------------------------------------------------- resources
    async def add_resources(
        self, resources: dict[str, Resource], *, metadata: dict[str, Any] | None = None
    ) -> ResourcesUpdate:
        """Store the next resources version (``rs-1``, ``rs-2``, ...) and make it the latest."""
        self._start()
        version = len(self._resources) + 1
        update = ResourcesUpdate(
            resources_id=rules.resources_id_for(version),
            version=version,
            resources=resources,
            create_time=time.time(),
            metadata=metadata or {},
        ).model_copy(deep=True)
        self._resources.append(update)
        return update.model_copy(deep=True)

    async def get_resources(self, resources_id: str | None = None) -> ResourcesUpdate | None:
        """One version, or the latest (``None`` when there is none). Raises NotFoundError for an unknown id."""
        self._start()
        if resources_id is None:
            return self._resources[-1].model_copy(deep=True) if self._resources else None
        return self._resources_by_id(resources_id).model_copy(deep=True)

    async def query_resources(self) -> list[ResourcesUpdate]:
        """Every resources version, oldest first."""
        self._start()
        return [r.model_copy(deep=True) for r in self._resources]

    # ----------------------------------------------------------------- workers and metrics
    async def heartbeat(
        self, worker_id: str, *, rollout_id: str | None = None, attempt_id: str | None = None
    ) -> Worker:
        """Register or refresh a worker (and an attempt's heartbeat). Raises NotFoundError, ConfigError (only
        one of ``rollout_id``/``attempt_id`` given)."""
        self._start()
        if (rollout_id is None) != (attempt_id is None):
            raise ConfigError("heartbeat takes both rollout_id and attempt_id, or neither")
        now = time.time()
        attempt = None
        if rollout_id is not None and attempt_id is not None:
            attempt = rules.refresh_attempt(self._attempt(rollout_id, attempt_id), now)
            self._attempts[rollout_id][attempt.sequence_id - 1] = attempt
        worker = rules.worker_heartbeat(self._workers.get(worker_id), worker_id, now=now, attempt=attempt)
        self._workers[worker_id] = worker
        return worker.model_copy(deep=True)

    async def query_workers(self) -> list[Worker]:
        """Every known worker, in order of first appearance."""
        self._start()
        return [w.model_copy(deep=True) for w in self._workers.values()]

    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        """Append training-curve points."""
        self._start()
        self._metrics.extend(m.model_copy(deep=True) for m in metrics)

    async def query_metrics(self, name: str | None = None) -> list[Metric]:
        """Points of one curve (or all), by ``train_step`` then insertion."""
        self._start()
        found = [m for m in self._metrics if name is None or m.name == name]
        return [m.model_copy(deep=True) for m in sorted(found, key=lambda m: m.train_step)]

    # ----------------------------------------------------------------- trained samples
    async def put_trained_samples(self, train_step: int, samples: Sequence[TrainedSample]) -> None:
        """Record a step's trained samples, replacing the step's earlier record. Raises ConfigError, NotFoundError
        (see the contract)."""
        self._start()
        for rollout_id, attempt_id in rules.check_trained_samples(train_step, samples):
            self._attempt(rollout_id, attempt_id)
        self._trained[train_step] = [s.model_copy(deep=True) for s in samples]

    async def query_trained_samples(
        self, *, rollout_id: str | None = None, train_step: int | None = None
    ) -> list[TrainedSample]:
        """Recorded trained samples matching the filters, by ``train_step`` then ``sample_index``."""
        self._start()
        steps = sorted(self._trained) if train_step is None else [train_step]
        return [
            s.model_copy(deep=True)
            for step in steps
            for s in sorted(self._trained.get(step, []), key=lambda s: s.sample_index)
            if rollout_id is None or s.rollout_id == rollout_id
        ]

    async def close(self) -> None:
        """Stop the lease sweeper. The store cannot be used afterwards; closing twice is harmless."""
        self._closed = True
        task, self._sweeper = self._sweeper, None
        if task is not None and not task.done():
            task.cancel()
            if task.get_loop() is asyncio.get_running_loop():
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._notify()
