"""``PostgresLightningStore``: the store in a PostgreSQL database, shared by any number of processes and machines.

Needs ``pip install 'agentbolt[postgres]'`` (psycopg 3 and psycopg_pool). Tables and row mapping:
:mod:`agentbolt.store.postgres_schema`; the rules every backend shares: :mod:`agentbolt.store.rules`.

Concurrency: every call runs in one transaction on a pooled connection (autocommit off only inside
``conn.transaction()``), at ``READ COMMITTED``. Claims take rows with ``SELECT ... FOR UPDATE SKIP LOCKED``, so
concurrent claimers in many processes never wait on each other and never share a rollout. Other writes lock the
rows they change in one fixed order (rollout, then attempt, then worker), so they cannot deadlock with each other;
a transaction the server still aborts (deadlock or serialization failure) is retried whole, a few times.

Durability: a call returns after its ``COMMIT``; with ``synchronous_commit`` on (the server default, and forced on
for the store's sessions when the server says ``off``) the write is then on disk.

Leases: a background task ends expired attempts every ``sweep_interval_s`` (even when nobody calls the store), and
every claim, update and read ends them first too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

try:
    import psycopg  # noqa: F401  (checked here, so a missing driver fails with the install hint below)
    import psycopg_pool  # noqa: F401
except ImportError as exc:  # exercised by a test that hides psycopg
    raise ImportError(
        f"the PostgreSQL store needs psycopg 3 and psycopg_pool; install them with pip install 'agentbolt[postgres]' "
        f"({exc})",
        name="psycopg_pool" if exc.name == "psycopg_pool" else "psycopg",
    ) from exc

from agentbolt.errors import AgentboltError, ConfigError
from agentbolt.store import postgres_schema as schema
from agentbolt.store import postgres_search, rules, tables, waiting
from agentbolt.store.base import EnqueueRequest, StoreCapabilities
from agentbolt.store.postgres_pool import PostgresConnections, redact_url
from agentbolt.store.postgres_schema import Conn, sql
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

__all__ = ["PostgresLightningStore", "redact_url"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

_CLAIMABLE = sorted(s.value for s in rules.CLAIMABLE_ROLLOUT_STATUSES)
_ACTIVE = sorted(s.value for s in rules.ACTIVE_ATTEMPT_STATUSES)


class PostgresLightningStore:
    """A durable :class:`~agentbolt.store.base.LightningStore` in PostgreSQL, shareable by processes.

    Args:
        url: a libpq URL, ``postgresql://user:password@host:port/dbname`` (``postgres://`` works too). Tables go in
            the first schema of the ``search_path``; pick one with ``?options=-csearch_path%3Dname``.
        sweep_interval_s: seconds between background checks for expired leases (also checked before every claim,
            update and query). The background task starts on the first call and stops in :meth:`close`.
        poll_interval_s: how often :meth:`wait_for_rollouts` re-reads the database, in seconds (writes made through
            this object wake waiters at once; other processes' writes are seen at the next poll).
        min_connections / max_connections: size bounds of the connection pool.
        connect_timeout_s: the most seconds to wait for a connection (when the URL sets no ``connect_timeout``),
            and for a free pooled connection.

    The store opens lazily on its first call and is bound to that call's event loop; use it from one loop (a new
    loop may take it over once the old one is closed).

    Raises:
        ConfigError: a non-positive setting or a malformed URL (here); a database written by a newer schema (first
            call).
        BackendError: the server cannot be reached or fails (any call).
    """

    def __init__(
        self,
        url: str,
        *,
        sweep_interval_s: float = 0.5,
        poll_interval_s: float = 0.1,
        min_connections: int = 1,
        max_connections: int = 10,
        connect_timeout_s: float = 30.0,
    ) -> None:
        for name, value in (
            ("sweep_interval_s", sweep_interval_s),
            ("poll_interval_s", poll_interval_s),
            ("connect_timeout_s", connect_timeout_s),
        ):
            if value <= 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {value}")
        self._db = PostgresConnections(
            url, min_connections=min_connections, max_connections=max_connections, connect_timeout_s=connect_timeout_s
        )
        self.display_url = self._db.display_url
        self.capabilities = StoreCapabilities(durable=True, shared_across_processes=True)
        self.sweep_interval_s = sweep_interval_s
        self.poll_interval_s = poll_interval_s
        self._terminal_epoch = 0  # bumped whenever this object moves a rollout to a terminal state
        self._notified_epoch = 0
        self._waiters: set[asyncio.Event] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._stop_sweeping: asyncio.Event | None = None
        self._closed = False

    # ----------------------------------------------------------------- plumbing
    async def _tx(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """Run ``fn(conn)`` in one transaction (see :meth:`PostgresConnections.run` for retries and the errors
        mapped); make sure the lease sweeper runs; wake :meth:`wait_for_rollouts` callers when a rollout became
        terminal.

        Raises:
            AgentboltError: the store is closed.
        """
        if self._closed:
            raise AgentboltError(f"this PostgresLightningStore ({self.display_url}) is closed; create a new one")
        sweeper = self._sweeper
        if sweeper is None or sweeper.done() or sweeper.get_loop().is_closed():
            self._stop_sweeping = asyncio.Event()
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep_forever(self._stop_sweeping), name="agentbolt-postgres-store-sweeper"
            )
        try:
            return await self._db.run(fn)
        finally:
            if self._terminal_epoch != self._notified_epoch:
                self._notified_epoch = self._terminal_epoch
                for event in self._waiters:
                    event.set()

    async def _sweep_forever(self, stop: asyncio.Event) -> None:
        """End expired leases every ``sweep_interval_s`` until :meth:`close` sets ``stop``.

        Stopping is a flag, not a task cancellation: Python 3.11's ``asyncio.wait_for`` (used inside psycopg_pool)
        can swallow a cancellation, which would leave this loop running and :meth:`close` waiting on it forever.
        """
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.sweep_interval_s)
            if self._closed:
                return
            try:
                await self._expire()
            except Exception:  # a failed sweep (e.g. the server restarting) is logged and retried next interval
                if self._closed:
                    return
                logger.exception("lease sweep of %s failed", self.display_url)

    # ----------------------------------------------------------------- flows (inside one transaction)
    async def _save(self, conn: Conn, before: Rollout, rollout: Rollout, attempt: Attempt | None) -> None:
        """Write back a rollout and one of its existing attempts; free the attempt's worker when the attempt ended."""
        await schema.ROLLOUTS.update(conn, rollout)
        if rules.is_terminal(rollout) and before.status != rollout.status:
            self._terminal_epoch += 1
        if attempt is None:
            return
        await schema.ATTEMPTS.update(conn, attempt)
        if attempt.worker_id is not None and attempt.status not in rules.ACTIVE_ATTEMPT_STATUSES:
            worker = await schema.get_worker(conn, attempt.worker_id, lock=True)
            if worker is not None:
                freed = rules.worker_after_attempt(worker, attempt)
                if freed is not worker:
                    await schema.WORKERS.update(conn, freed)

    async def _lock_worker(self, conn: Conn, worker_id: str, now: float) -> Worker:
        """The worker's row, created (idle) if missing, locked until the transaction ends."""
        await schema.WORKERS.insert_many(conn, [rules.worker_heartbeat(None, worker_id, now=now)], skip_existing=True)
        worker = await schema.get_worker(conn, worker_id, lock=True)
        assert worker is not None
        return worker

    async def _expired_candidates(self, conn: Conn) -> list[tuple[str, str]]:
        """(rollout_id, attempt_id) of active attempts whose lease has run out now (one query; no locks)."""
        now = time.time()
        cur = await conn.execute(
            sql(
                f"{schema.ATTEMPTS.select('a')}, r.config FROM attempts a JOIN rollouts r USING (rollout_id) "
                "WHERE a.status = ANY(%s)"
            ),
            (_ACTIVE,),
        )
        expired: list[tuple[str, str]] = []
        for row in await cur.fetchall():
            attempt = schema.ATTEMPTS.from_row(row[:-1])
            if rules.expired_status(RolloutConfig.model_validate(row[-1]), attempt, now) is not None:
                expired.append((attempt.rollout_id, attempt.attempt_id))
        return expired

    async def _expire_one(self, conn: Conn, rollout_id: str, attempt_id: str) -> None:
        """End one attempt if its lease has run out, re-checked under the rollout's and attempt's row locks."""
        now = time.time()
        rollout = await schema.get_rollout(conn, rollout_id, lock=True)
        attempt = await schema.get_attempt(conn, rollout_id, attempt_id, lock=True)
        latest = await schema.latest_attempt(conn, rollout_id)
        result = rules.expire(
            rollout, attempt, is_latest=latest is not None and latest.attempt_id == attempt_id, now=now
        )
        if result is not None:
            await self._save(conn, rollout, *result)

    async def _expire(self) -> None:
        """End expired leases: find them without locks, then end each in its own short transaction."""
        for rollout_id, attempt_id in await self._tx(self._expired_candidates):
            await self._tx(functools.partial(self._expire_one, rollout_id=rollout_id, attempt_id=attempt_id))

    async def _read_after_expiry(self, read: Callable[[Conn], Awaitable[T]]) -> T:
        await self._expire()
        return await self._tx(read)

    # ----------------------------------------------------------------- rollouts
    async def enqueue_rollout(
        self,
        input: Any,
        *,
        mode: RolloutMode = RolloutMode.TRAIN,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        """Add a ``queuing`` rollout. Raises NotFoundError (unknown ``resources_id``), ConfigError (input is not
        JSON-serializable)."""
        request = EnqueueRequest(input=input, mode=mode, resources_id=resources_id, config=config, metadata=metadata)
        return (await self.enqueue_many([request]))[0]

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[Rollout]:
        """Enqueue all or none, in order, in one transaction. Raises NotFoundError, ConfigError."""
        now = time.time()
        rollouts = [
            Rollout(
                rollout_id=rules.new_rollout_id(),
                input=r.input,
                mode=r.mode,
                resources_id=r.resources_id,
                config=r.config or RolloutConfig(),
                metadata=r.metadata or {},
                enqueue_time=now,
            )
            for r in requests
        ]
        if not rollouts:
            return []

        async def write(conn: Conn) -> None:
            for resources_id in dict.fromkeys(r.resources_id for r in rollouts if r.resources_id is not None):
                await schema.get_resources(conn, resources_id)
            await schema.ROLLOUTS.insert_many(conn, rollouts)

        await self._tx(write)
        return rollouts

    async def claim_rollout(self, worker_id: str) -> AttemptedRollout | None:
        """Lease the oldest claimable rollout to ``worker_id``; ``None`` when the queue is empty."""
        claimed = await self.claim_many(worker_id, 1)
        return claimed[0] if claimed else None

    async def claim_many(self, worker_id: str, n: int) -> list[AttemptedRollout]:
        """Lease up to ``n`` of the oldest claimable rollouts to ``worker_id`` in one transaction, in enqueue order
        (rows another claimer holds are skipped, never waited for). Raises ConfigError (``n < 1``)."""
        rules.check_claim_count(n)
        await self._expire()
        return await self._tx(functools.partial(self._claim, worker_id=worker_id, n=n))

    async def _claim(self, conn: Conn, worker_id: str, n: int) -> list[AttemptedRollout]:
        now = time.time()
        rollouts = await schema.ROLLOUTS.fetch_all(
            conn, "WHERE status = ANY(%s) ORDER BY enqueue_seq LIMIT %s FOR UPDATE SKIP LOCKED", (_CLAIMABLE, n)
        )
        if not rollouts:
            return []
        latest = await schema.latest_resources(conn)
        claimed: list[AttemptedRollout] = []
        for rollout in rollouts:
            updated, attempt = rules.claim(
                rollout,
                worker_id=worker_id,
                resources_id=rollout.resources_id or (latest.resources_id if latest else None),
                now=now,
            )
            claimed.append(rules.attempted(updated, attempt))
        await schema.ROLLOUTS.update_many(conn, [c.rollout for c in claimed])
        await schema.ATTEMPTS.insert_many(conn, [c.attempt for c in claimed])
        worker = await self._lock_worker(conn, worker_id, now)
        for c in claimed:
            worker = rules.worker_heartbeat(worker, worker_id, now=now, attempt=c.attempt)
        await schema.WORKERS.update(conn, worker)
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
        status = AttemptStatus(status)

        async def write(conn: Conn) -> Attempt:
            now = time.time()
            rollout = await schema.get_rollout(conn, rollout_id, lock=True)
            attempt = await schema.get_attempt(conn, rollout_id, attempt_id, lock=True)
            latest = await schema.latest_attempt(conn, rollout_id)
            updated_rollout, updated = rules.update_attempt(
                rollout,
                attempt,
                status,
                is_latest=latest is not None and latest.attempt_id == attempt_id,
                now=now,
                error=error,
                final_reward=final_reward,
            )
            await self._save(conn, rollout, updated_rollout, updated)
            return updated

        await self._expire()
        return await self._tx(write)

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a rollout (its in-flight attempt ends ``failed``). Raises NotFoundError, InvalidTransitionError."""

        async def write(conn: Conn) -> Rollout:
            now = time.time()
            rollout = await schema.get_rollout(conn, rollout_id, lock=True)
            latest = await schema.latest_attempt(conn, rollout_id, lock=True)
            cancelled, ended = rules.cancel(rollout, latest, now=now)
            await self._save(conn, rollout, cancelled, ended)
            return cancelled

        await self._expire()
        return await self._tx(write)

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout. Raises NotFoundError."""
        return await self._read_after_expiry(functools.partial(schema.get_rollout, rollout_id=rollout_id))

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
        order_by = tables.rollout_order_by(sort_by, descending, text_collation=' COLLATE "C"')
        where: list[str] = []
        params: list[Any] = []
        for column, values in (
            ("status", None if status is None else [RolloutStatus(s).value for s in status]),
            ("mode", None if mode is None else [RolloutMode(mode).value]),
            ("rollout_id", None if rollout_ids is None else list(rollout_ids)),
        ):
            if values is not None:
                where.append(f"{column} = ANY(%s)")
                params.append(values)
        clauses = ("WHERE " + " AND ".join(where) if where else "") + f" {order_by} LIMIT %s OFFSET %s"
        params.extend([limit, offset])
        return await self._read_after_expiry(
            functools.partial(schema.ROLLOUTS.fetch_all, clauses=clauses, params=params)
        )

    async def search_rollouts(self, search: RolloutSearch) -> tuple[list[Rollout], int]:
        """One page of the rollouts matching ``search`` and the number that matched (:mod:`.postgres_search`)."""
        return await self._read_after_expiry(functools.partial(postgres_search.search_rollouts, search=search))

    async def reward_stats(self) -> list[ResourceRewardStats]:
        """Finished rollouts and mean reward per (resources version, mode) (:mod:`.postgres_search`)."""
        return await self._read_after_expiry(postgres_search.reward_stats)

    async def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt:
        """One attempt. Raises NotFoundError."""
        read = functools.partial(schema.get_attempt, rollout_id=rollout_id, attempt_id=attempt_id)
        return await self._read_after_expiry(read)

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """All attempts of a rollout by ``sequence_id``. Raises NotFoundError."""

        async def read(conn: Conn) -> list[Attempt]:
            await schema.get_rollout(conn, rollout_id)
            return await schema.ATTEMPTS.fetch_all(conn, "WHERE rollout_id = %s ORDER BY sequence_id", (rollout_id,))

        return await self._read_after_expiry(read)

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout_s: float | None = None) -> list[Rollout]:
        """Wait until all listed rollouts are terminal or ``timeout_s`` seconds pass (``None``: no limit).

        Polls every ``poll_interval_s``; a rollout this object ends wakes it at once. Returns the terminal ones, in
        the order asked. Raises NotFoundError for an unknown id.
        """
        ids = list(rollout_ids)

        async def read(conn: Conn) -> list[Rollout]:
            rows = await schema.ROLLOUTS.fetch_all(conn, "WHERE rollout_id = ANY(%s)", (list(set(ids)),))
            return waiting.in_order(ids, rows)

        event = asyncio.Event()
        self._waiters.add(event)
        try:
            return await waiting.poll_until_terminal(
                lambda: self._read_after_expiry(read),
                expected=len(ids),
                timeout_s=timeout_s,
                poll_interval_s=self.poll_interval_s,
                event=event,
                closed=lambda: self._closed,
            )
        finally:
            self._waiters.discard(event)

    # ----------------------------------------------------------------- spans
    async def add_span(self, span: Span) -> Span:
        """Store a span with the next ``sequence_id`` of its attempt; a heartbeat too. Raises NotFoundError."""
        return (await self.add_spans([span]))[0]

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Store spans all or nothing, in order, in one transaction. Raises NotFoundError, ConfigError (attributes
        not JSON-serializable), RewardError (a reward span whose value is not a reward), ConflictError (a reward span
        of an ended attempt)."""
        if not spans:
            return []
        batch = rules.check_reward_spans(spans)

        async def write(conn: Conn) -> list[Span]:
            now = time.time()
            next_seq: dict[tuple[str, str], int] = {}
            status_of: dict[tuple[str, str], AttemptStatus] = {}
            for key in sorted({(s.rollout_id, s.attempt_id) for s in batch}):  # one lock order: no deadlocks
                attempt = await schema.get_attempt(conn, *key, lock=True)  # also serializes numbering per attempt
                status_of[key] = attempt.status
                refreshed = rules.refresh_attempt(attempt, now)
                if refreshed is not attempt:
                    await schema.ATTEMPTS.update(conn, refreshed)
                cur = await conn.execute(
                    "SELECT COALESCE(MAX(sequence_id), 0) FROM spans WHERE rollout_id = %s AND attempt_id = %s", key
                )
                row = await cur.fetchone()
                next_seq[key] = (row[0] if row is not None else 0) + 1
            for span in batch:  # before anything is written: a refused batch rolls back the heartbeats too
                rules.check_span_target(span, status_of[(span.rollout_id, span.attempt_id)])
            stored: list[Span] = []
            for span in batch:
                key = (span.rollout_id, span.attempt_id)
                stored.append(span.model_copy(update={"sequence_id": next_seq[key]}))
                next_seq[key] += 1
            await schema.SPANS.insert_many(conn, stored)
            return stored

        return await self._tx(write)

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of one attempt (default: the latest) by ``sequence_id``. Raises NotFoundError."""

        async def read(conn: Conn) -> list[Span]:
            if attempt_id is None:
                await schema.get_rollout(conn, rollout_id)
                latest = await schema.latest_attempt(conn, rollout_id)
                if latest is None:
                    return []
                target = latest.attempt_id
            else:
                target = (await schema.get_attempt(conn, rollout_id, attempt_id)).attempt_id
            clauses = "WHERE rollout_id = %s AND attempt_id = %s ORDER BY sequence_id"
            return await schema.SPANS.fetch_all(conn, clauses, (rollout_id, target))

        return await self._tx(read)

    # ----------------------------------------------------------------- resources
    async def add_resources(
        self, resources: dict[str, Resource], *, metadata: dict[str, Any] | None = None
    ) -> ResourcesUpdate:
        """Store the next resources version (``rs-1``, ``rs-2``, ...) and make it the latest."""

        async def write(conn: Conn) -> ResourcesUpdate:
            # versions are numbered in commit order: one writer at a time (readers are not blocked)
            await conn.execute("LOCK TABLE resources IN SHARE ROW EXCLUSIVE MODE")
            cur = await conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM resources")
            row = await cur.fetchone()
            version = int(row[0]) if row is not None else 1
            update = ResourcesUpdate(
                resources_id=rules.resources_id_for(version),
                version=version,
                resources=resources,
                create_time=time.time(),
                metadata=metadata or {},
            )
            await schema.RESOURCES.insert_many(conn, [update])
            return update

        return await self._tx(write)

    async def get_resources(self, resources_id: str | None = None) -> ResourcesUpdate | None:
        """One version, or the latest (``None`` when there is none). Raises NotFoundError for an unknown id."""
        if resources_id is None:
            return await self._tx(schema.latest_resources)
        return await self._tx(functools.partial(schema.get_resources, resources_id=resources_id))

    async def query_resources(self) -> list[ResourcesUpdate]:
        """Every resources version, oldest first."""
        return await self._tx(functools.partial(schema.RESOURCES.fetch_all, clauses="ORDER BY version"))

    # ----------------------------------------------------------------- workers and metrics
    async def heartbeat(
        self, worker_id: str, *, rollout_id: str | None = None, attempt_id: str | None = None
    ) -> Worker:
        """Register or refresh a worker (and an attempt's heartbeat). Raises NotFoundError, ConfigError (only
        one of ``rollout_id``/``attempt_id`` given)."""
        if (rollout_id is None) != (attempt_id is None):
            raise ConfigError("heartbeat takes both rollout_id and attempt_id, or neither")

        async def write(conn: Conn) -> Worker:
            now = time.time()
            attempt = None
            if rollout_id is not None and attempt_id is not None:
                attempt = await schema.get_attempt(conn, rollout_id, attempt_id, lock=True)
                refreshed = rules.refresh_attempt(attempt, now)
                if refreshed is not attempt:
                    await schema.ATTEMPTS.update(conn, refreshed)
                attempt = refreshed
            worker = await self._lock_worker(conn, worker_id, now)
            worker = rules.worker_heartbeat(worker, worker_id, now=now, attempt=attempt)
            await schema.WORKERS.update(conn, worker)
            return worker

        return await self._tx(write)

    async def query_workers(self) -> list[Worker]:
        """Every known worker, in order of first appearance."""
        return await self._tx(functools.partial(schema.WORKERS.fetch_all, clauses="ORDER BY worker_seq"))

    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        """Append training-curve points in one transaction."""
        if metrics:
            await self._tx(functools.partial(schema.METRICS.insert_many, models=list(metrics)))

    async def query_metrics(self, name: str | None = None) -> list[Metric]:
        """Points of one curve (or all), by ``train_step`` then insertion."""
        where, params = ("WHERE name = %s", (name,)) if name is not None else ("", ())
        clauses = f"{where} ORDER BY train_step, metric_seq"
        return await self._tx(functools.partial(schema.METRICS.fetch_all, clauses=clauses, params=params))

    # ----------------------------------------------------------------- trained samples
    async def put_trained_samples(self, train_step: int, samples: Sequence[TrainedSample]) -> None:
        """Record a step's trained samples in one transaction, replacing the step's earlier record (writers of one
        step take turns on a transaction-scoped advisory lock). Raises ConfigError, NotFoundError (see the
        contract)."""
        pairs = rules.check_trained_samples(train_step, samples)

        async def write(conn: Conn) -> None:
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended('agentbolt.trained_samples', %s))", (train_step,)
            )
            for rollout_id, attempt_id in pairs:
                await schema.get_attempt(conn, rollout_id, attempt_id)
            await conn.execute("DELETE FROM trained_samples WHERE train_step = %s", (train_step,))
            await schema.TRAINED_SAMPLES.insert_many(conn, list(samples))

        await self._tx(write)

    async def query_trained_samples(
        self, *, rollout_id: str | None = None, train_step: int | None = None
    ) -> list[TrainedSample]:
        """Recorded trained samples matching the filters, by ``train_step`` then ``sample_index``."""
        clauses, params = tables.trained_samples_query(rollout_id, train_step, placeholder="%s")
        return await self._tx(functools.partial(schema.TRAINED_SAMPLES.fetch_all, clauses=clauses, params=params))

    async def close(self) -> None:
        """Stop the lease sweeper (letting a sweep in progress finish) and close the pool's connections. The store
        cannot be used afterwards; closing twice is harmless. Call it on the event loop that used the store."""
        if self._closed:
            return
        self._closed = True
        if self._stop_sweeping is not None:
            self._stop_sweeping.set()
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None and not sweeper.done() and sweeper.get_loop() is asyncio.get_running_loop():
            await asyncio.wait({sweeper}, timeout=self._db.connect_timeout_s)
            if not sweeper.done():
                sweeper.cancel()
                logger.warning("the lease sweeper of %s did not stop; cancelled it", self.display_url)
        await self._db.close()
        for event in self._waiters:
            event.set()
