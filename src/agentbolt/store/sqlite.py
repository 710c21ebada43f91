"""``SqliteLightningStore``: the embedded default store, one SQLite file in WAL mode.

Durability: a call returns only after its ``COMMIT``. In WAL mode with ``synchronous=normal`` (the default) a
committed write survives a crash or ``kill -9`` of the process; ``synchronous=full`` (``sqlite:///x.db?synchronous=full``)
also survives a power loss or OS crash, at one fsync per commit.

Concurrency: with ``synchronous=normal`` a call runs on the caller's event loop over a connection that never waits for
a lock (a commit is a ``write()``; no thread switch, no GIL ping-pong), and the calls of tasks running side by side
share one commit (:mod:`agentbolt.store.sqlite_inline`); when another connection or process holds the write lock, the
call goes to the store's writer thread instead, which waits up to ``busy_timeout_s``. With
``synchronous=full`` every call goes to the writer thread (:mod:`agentbolt.store.sqlite_writer`), which commits the
calls queued behind each other together (one ``COMMIT`` and fsync for many calls, each call in its own savepoint).
Every write takes ``BEGIN IMMEDIATE``, which SQLite serializes across connections and processes, so several processes
may share the file and a rollout is never claimed twice. Schema and row mapping: :mod:`agentbolt.store.sqlite_schema`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from agentbolt.errors import AgentboltError, ConfigError
from agentbolt.store import rules, sqlite_search, tables, waiting
from agentbolt.store import sqlite_schema as schema
from agentbolt.store.base import EnqueueRequest, StoreCapabilities
from agentbolt.store.search import ResourceRewardStats, RolloutSearch
from agentbolt.store.sqlite_inline import InlineBusy, InlineRunner, LockedElsewhere, is_lock_error
from agentbolt.store.sqlite_lock import StoreFileLock
from agentbolt.store.sqlite_writer import GroupCommitThread
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
T = TypeVar("T")


WAL_AUTOCHECKPOINT_PAGES = 10_000
"""WAL pages (4 KiB each) after which a commit checkpoints the WAL into the database file."""

SYNCHRONOUS_MODES: tuple[str, ...] = ("normal", "full")
"""SQLite ``PRAGMA synchronous`` settings the store accepts (WAL mode)."""

# The oldest claimable rollouts, through the partial index ``rollouts_claimable`` (in enqueue order already).
_OLDEST_CLAIMABLE = f"WHERE status IN ({schema.CLAIMABLE_SQL}) ORDER BY enqueue_seq LIMIT ?"
# What a span needs from its attempt: status and heartbeat (to refresh the heartbeat), the lease setting that decides
# how often, and the attempt's last span number.
_SPAN_TARGET = (
    "SELECT a.status, a.last_heartbeat_time, json_extract(r.config, '$.unresponsive_seconds'),"
    " (SELECT COALESCE(MAX(s.sequence_id), 0) FROM spans s WHERE s.rollout_id = a.rollout_id"
    " AND s.attempt_id = a.attempt_id)"
    " FROM attempts a JOIN rollouts r ON r.rollout_id = a.rollout_id WHERE a.rollout_id = ? AND a.attempt_id = ?"
)


class SqliteLightningStore:
    """A durable :class:`~agentbolt.store.base.LightningStore` in one SQLite file, shareable by processes.

    Args:
        path: the database file; created (with its parent folders) if missing. From the first call to :meth:`close`
            the store holds a shared lock on ``.<name>.lock`` beside it, so the file is never moved aside under it
            (:mod:`agentbolt.store.sqlite_lock`).
        sweep_interval_s: seconds between background checks for expired leases (also checked before every claim
            and query). The background task starts on the first call and stops in :meth:`close`.
        poll_interval_s: how often :meth:`wait_for_rollouts` re-reads the file, in seconds (writes by this object
            wake waiters at once; writes by other processes are seen at the next poll).
        busy_timeout_s: how long a write waits for another connection's write lock, in seconds.
        synchronous: ``"normal"`` (a committed write survives a process crash) or ``"full"`` (also a power loss; one
            fsync per commit, about 4x slower on this project's benchmark machine).

    Raises:
        ConfigError: a non-positive interval, an unknown ``synchronous``, or a file written by a newer schema
            (raised on the first call).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        sweep_interval_s: float = 0.5,
        poll_interval_s: float = 0.1,
        busy_timeout_s: float = 30.0,
        synchronous: str = "normal",
    ) -> None:
        if synchronous not in SYNCHRONOUS_MODES:
            raise ConfigError(
                f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}, got {synchronous!r}: 'normal' survives a "
                "crash of the process (kill -9), 'full' also a power loss or OS crash, at one fsync per commit"
            )
        for name, value in (
            ("sweep_interval_s", sweep_interval_s),
            ("poll_interval_s", poll_interval_s),
            ("busy_timeout_s", busy_timeout_s),
        ):
            if value <= 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {value}")
        self.capabilities = StoreCapabilities(durable=True, shared_across_processes=True)
        self.path = Path(path)
        self.sweep_interval_s = sweep_interval_s
        self.poll_interval_s = poll_interval_s
        self.busy_timeout_s = busy_timeout_s
        self.synchronous = synchronous
        # With synchronous=normal a commit is a write() without fsync, so a call runs faster on the caller's event loop
        # than handed to a thread: no thread switch, and no GIL ping-pong between the loop and the writer (measured:
        # 2x in-process at C=1, +50-70% through the server at C=8-32). With synchronous=full every commit is an
        # fsync, so calls go to the writer thread, which commits queued calls together.
        self._inline_allowed = synchronous == "normal"
        self._owner = StoreFileLock(self.path)  # held from the first call to close(): sqlite_lock
        self._inline = InlineRunner(functools.partial(self._open_connection, busy_timeout_s=0.0))
        self._writer = GroupCommitThread(self._open_connection, name=f"agentbolt-sqlite-{self.path.name}")
        self._terminal_epoch = 0  # bumped on the executor thread whenever a rollout becomes terminal
        self._notified_epoch = 0
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    # ----------------------------------------------------------------- plumbing
    def _open_connection(self, busy_timeout_s: float | None = None) -> sqlite3.Connection:
        """Open the file (WAL, the chosen ``synchronous``) and migrate its schema. ``busy_timeout_s``: how long a
        statement waits for another connection's lock (default: the store's ``busy_timeout_s``).

        Raises:
            ConfigError: the path is not a SQLite database, or cannot be created or opened, or another process is
                moving it aside (:mod:`agentbolt.store.sqlite_lock`).
        """
        timeout = self.busy_timeout_s if busy_timeout_s is None else busy_timeout_s
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._owner.acquire()  # others see the file is open (agentbolt train --overwrite refuses to move it)
            conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA schema_version").fetchone()  # reads the header: "not a database" shows here
        except (OSError, sqlite3.DatabaseError) as exc:
            if isinstance(exc, sqlite3.OperationalError) and is_lock_error(exc):
                raise
            raise ConfigError(
                f"cannot open the SQLite store file {self.path}: {exc}; give the path of a new file or of a store "
                "file written by agentbolt, in a folder you can write to"
            ) from exc
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
            conn.execute("PRAGMA foreign_keys=ON")
            # Checkpoint every ~40 MB of WAL instead of SQLite's ~4 MB: pages rewritten many times between two
            # checkpoints are copied to the database once (5-8% more rollouts/s on the store benchmark).
            conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
            schema.migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` on the store's thread (committed together with other queued calls); wake waiters
        if a rollout became terminal."""
        if self._closed:
            raise AgentboltError(f"this SqliteLightningStore ({self.path}) is closed; create a new one")
        loop = asyncio.get_running_loop()
        task = self._sweeper
        if task is None or task.done() or task.get_loop().is_closed():
            self._sweeper = loop.create_task(self._sweep_forever(), name="agentbolt-sqlite-store-sweeper")
        try:
            if self._inline_allowed:
                try:
                    return await self._inline.run(fn, *args)
                except (InlineBusy, LockedElsewhere):
                    pass  # in use by another thread or loop, or locked by another connection: use the writer thread
            return await self._writer.submit(fn, *args)
        finally:
            if self._terminal_epoch != self._notified_epoch:
                self._notified_epoch = self._terminal_epoch
                self._wake_waiters()

    def _wake_waiters(self) -> None:
        """Wake every :meth:`wait_for_rollouts` call, on whichever event loop it waits."""
        current = asyncio.get_running_loop()
        for loop, event in list(self._waiters):
            if loop is current:
                event.set()
            elif not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            try:
                await self._run(self._expire)
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed sweep (e.g. a busy file) is logged and retried next interval
                logger.exception("lease sweep of %s failed", self.path)

    # ----------------------------------------------------------------- flows (executor thread only)
    def _save(
        self,
        conn: sqlite3.Connection,
        rollout: Rollout,
        attempt: Attempt | None,
        *,
        previous: Rollout | None = None,
        new_attempt: bool = False,
    ) -> None:
        """Write back a rollout and one of its attempts; free the attempt's worker when the attempt ended.

        ``previous`` is the rollout as read in this transaction (``None``: read it here); ``new_attempt``: the attempt
        is not stored yet. An existing rollout row only has its scalar columns rewritten: input, config and metadata
        never change after enqueue.
        """
        if previous is None:
            row = conn.execute("SELECT status FROM rollouts WHERE rollout_id = ?", (rollout.rollout_id,)).fetchone()
            before = None if row is None else RolloutStatus(row[0])
        else:
            before = previous.status
        if before is None:
            schema.ROLLOUTS.put(conn, rollout)
        else:
            schema.ROLLOUTS.update_scalars(conn, rollout)
        if rules.is_terminal(rollout) and before != rollout.status:
            self._terminal_epoch += 1
        if attempt is None:
            return
        if new_attempt:
            schema.ATTEMPTS.insert(conn, [attempt])
        else:
            schema.ATTEMPTS.update(conn, attempt)
        if attempt.worker_id is not None and attempt.status not in rules.ACTIVE_ATTEMPT_STATUSES:
            worker = schema.get_worker(conn, attempt.worker_id)  # only an ended attempt can free its worker
            if worker is not None:
                freed = rules.worker_after_attempt(worker, attempt)
                if freed is not worker:
                    schema.WORKERS.update(conn, freed)

    def _expired_candidates(self, conn: sqlite3.Connection, now: float) -> list[Attempt]:
        """Active attempts whose lease has run out at ``now``.

        SQL keeps only the attempts whose lease may have run out (a superset: a microsecond of slack), so the cost
        does not grow with the number of healthy active attempts; :func:`rules.expired_status` then decides exactly.
        """
        rows = conn.execute(
            f"{schema.ATTEMPTS.select('a')}, r.config FROM attempts a JOIN rollouts r USING (rollout_id) "
            f"WHERE a.status IN ({schema.ACTIVE_SQL}) AND ("
            "(json_extract(r.config, '$.timeout_seconds') IS NOT NULL"
            " AND ? - a.start_time >= json_extract(r.config, '$.timeout_seconds') - 1e-6)"
            " OR (json_extract(r.config, '$.unresponsive_seconds') IS NOT NULL"
            " AND ? - COALESCE(a.last_heartbeat_time, a.start_time)"
            " >= json_extract(r.config, '$.unresponsive_seconds') - 1e-6))",
            (now, now),
        ).fetchall()
        expired: list[Attempt] = []
        for row in rows:
            attempt = schema.ATTEMPTS.from_row(row[:-1])
            if rules.expired_status(RolloutConfig.model_validate_json(row[-1]), attempt, now) is not None:
                expired.append(attempt)
        return expired

    def _expire_locked(self, conn: sqlite3.Connection, now: float) -> None:
        """End expired leases; the caller holds the write transaction."""
        for attempt in self._expired_candidates(conn, now):
            rollout = schema.get_rollout(conn, attempt.rollout_id)
            latest = schema.latest_attempt(conn, attempt.rollout_id)
            is_latest = latest is not None and latest.attempt_id == attempt.attempt_id
            result = rules.expire(rollout, attempt, is_latest=is_latest, now=now)
            if result is not None:
                self._save(conn, *result, previous=rollout)

    def _expire(self, conn: sqlite3.Connection) -> None:
        """End expired leases. Reads first and takes the write lock only when something has expired."""
        now = time.time()
        if self._expired_candidates(conn, now):
            with schema.transaction(conn, write=True):
                self._expire_locked(conn, now)

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
        return await self._run(self._enqueue, list(requests))

    def _enqueue(self, conn: sqlite3.Connection, requests: list[EnqueueRequest]) -> list[Rollout]:
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
        with schema.transaction(conn, write=True):
            for rollout in rollouts:
                if rollout.resources_id is not None:
                    schema.get_resources(conn, rollout.resources_id)
                schema.ROLLOUTS.put(conn, rollout)
        return rollouts

    async def claim_rollout(self, worker_id: str) -> AttemptedRollout | None:
        """Lease the oldest claimable rollout to ``worker_id``; ``None`` when the queue is empty."""
        claimed = await self.claim_many(worker_id, 1)
        return claimed[0] if claimed else None

    async def claim_many(self, worker_id: str, n: int) -> list[AttemptedRollout]:
        """Lease up to ``n`` of the oldest claimable rollouts to ``worker_id`` in one transaction, in enqueue order.
        Raises ConfigError (``n < 1``)."""
        return await self._run(self._claim, worker_id, rules.check_claim_count(n))

    def _claim(self, conn: sqlite3.Connection, worker_id: str, n: int) -> list[AttemptedRollout]:
        now = time.time()
        claimed: list[AttemptedRollout] = []
        with schema.transaction(conn, write=True):
            self._expire_locked(conn, now)
            rollouts = schema.ROLLOUTS.fetch_all(conn, _OLDEST_CLAIMABLE, (n,))
            if not rollouts:
                return []
            latest = None if all(r.resources_id for r in rollouts) else schema.latest_resources(conn)
            worker = schema.get_worker(conn, worker_id)
            for rollout in rollouts:
                updated, attempt = rules.claim(
                    rollout,
                    worker_id=worker_id,
                    resources_id=rollout.resources_id or (latest.resources_id if latest else None),
                    now=now,
                )
                self._save(conn, updated, attempt, previous=rollout, new_attempt=True)
                worker = rules.worker_heartbeat(worker, worker_id, now=now, attempt=attempt)
                claimed.append(rules.attempted(updated, attempt))
            assert worker is not None
            schema.WORKERS.put(conn, worker)
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
        return await self._run(self._update_attempt, rollout_id, attempt_id, AttemptStatus(status), error, final_reward)

    def _update_attempt(
        self,
        conn: sqlite3.Connection,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        error: dict[str, Any] | None,
        final_reward: float | None,
    ) -> Attempt:
        now = time.time()
        with schema.transaction(conn, write=True):
            attempt = schema.get_attempt(conn, rollout_id, attempt_id)
            before = schema.get_rollout(conn, rollout_id)
            is_latest = attempt.sequence_id == before.num_attempts  # attempts are numbered 1..num_attempts
            # Only this attempt's lease decides the outcome of this call (other leases are the sweeper's business).
            expired = rules.expire(before, attempt, is_latest=is_latest, now=now)
            if expired is not None:
                self._save(conn, *expired, previous=before)
                before, attempt = expired
            rollout, updated = rules.update_attempt(
                before, attempt, status, is_latest=is_latest, now=now, error=error, final_reward=final_reward
            )
            self._save(conn, rollout, updated, previous=before)
        return updated

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a rollout (its in-flight attempt ends ``failed``). Raises NotFoundError, InvalidTransitionError."""
        return await self._run(self._cancel, rollout_id)

    def _cancel(self, conn: sqlite3.Connection, rollout_id: str) -> Rollout:
        now = time.time()
        with schema.transaction(conn, write=True):
            self._expire_locked(conn, now)
            rollout = schema.get_rollout(conn, rollout_id)
            cancelled, ended = rules.cancel(rollout, schema.latest_attempt(conn, rollout_id), now=now)
            self._save(conn, cancelled, ended, previous=rollout)
        return cancelled

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout. Raises NotFoundError."""
        return await self._run(self._read_after_expiry, schema.get_rollout, rollout_id)

    def _read_after_expiry(self, conn: sqlite3.Connection, read: Callable[..., T], *args: Any) -> T:
        self._expire(conn)
        with schema.transaction(conn, write=False):
            return read(conn, *args)

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
        order_by = tables.rollout_order_by(sort_by, descending)
        where: list[str] = []
        params: list[Any] = []
        for column, values in (
            ("status", None if status is None else [RolloutStatus(s).value for s in status]),
            ("mode", None if mode is None else [RolloutMode(mode).value]),
            ("rollout_id", None if rollout_ids is None else list(rollout_ids)),
        ):
            if values is not None:
                where.append(f"{column} IN ({schema.marks(values)})" if values else "0")
                params.extend(values)
        clauses = ("WHERE " + " AND ".join(where) if where else "") + f" {order_by} LIMIT ? OFFSET ?"
        params.extend([-1 if limit is None else limit, offset])
        read = functools.partial(schema.ROLLOUTS.fetch_all, clauses=clauses, params=params)
        return await self._run(self._read_after_expiry, read)

    async def search_rollouts(self, search: RolloutSearch) -> tuple[list[Rollout], int]:
        """One page of the rollouts matching ``search`` and the number that matched (:mod:`.sqlite_search`)."""
        return await self._run(self._read_after_expiry, sqlite_search.search_rollouts, search)

    async def reward_stats(self) -> list[ResourceRewardStats]:
        """Finished rollouts and mean reward per (resources version, mode): one ``GROUP BY`` (:mod:`.sqlite_search`)."""
        return await self._run(self._read_after_expiry, sqlite_search.reward_stats)

    async def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt:
        """One attempt. Raises NotFoundError."""
        return await self._run(self._read_after_expiry, schema.get_attempt, rollout_id, attempt_id)

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """All attempts of a rollout by ``sequence_id``. Raises NotFoundError."""

        def read(conn: sqlite3.Connection) -> list[Attempt]:
            schema.get_rollout(conn, rollout_id)
            return schema.ATTEMPTS.fetch_all(conn, "WHERE rollout_id = ? ORDER BY sequence_id", (rollout_id,))

        return await self._run(self._read_after_expiry, read)

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout_s: float | None = None) -> list[Rollout]:
        """Wait until all listed rollouts are terminal or ``timeout_s`` seconds pass (``None``: no limit).

        Returns the terminal ones, in the order asked. Raises NotFoundError for an unknown id.
        """
        ids = list(rollout_ids)
        loop = asyncio.get_running_loop()

        def read(conn: sqlite3.Connection) -> list[Rollout]:
            found: list[Rollout] = []
            unique = list(dict.fromkeys(ids))
            for start in range(0, len(unique), 500):  # stay far below SQLite's bound-parameter limit
                chunk = unique[start : start + 500]
                found += schema.ROLLOUTS.fetch_all(conn, f"WHERE rollout_id IN ({schema.marks(chunk)})", chunk)
            return waiting.in_order(ids, found)

        event = asyncio.Event()
        waiter = (loop, event)
        self._waiters.add(waiter)
        try:
            return await waiting.poll_until_terminal(
                lambda: self._run(self._read_after_expiry, read),
                expected=len(ids),
                timeout_s=timeout_s,
                poll_interval_s=self.poll_interval_s,
                event=event,
                closed=lambda: self._closed,
            )
        finally:
            self._waiters.discard(waiter)

    # ----------------------------------------------------------------- spans
    async def add_span(self, span: Span) -> Span:
        """Store a span with the next ``sequence_id`` of its attempt; a heartbeat too. Raises NotFoundError."""
        return (await self.add_spans([span]))[0]

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Store spans all or nothing, in order, in one transaction. Raises NotFoundError, ConfigError (attributes
        not JSON-serializable), RewardError (a reward span whose value is not a reward), ConflictError (a reward span
        of an ended attempt)."""
        return await self._run(self._add_spans, rules.check_reward_spans(spans))

    def _add_spans(self, conn: sqlite3.Connection, spans: list[Span]) -> list[Span]:
        now = time.time()
        stored: list[Span] = []
        next_seq: dict[tuple[str, str], int] = {}
        status_of: dict[tuple[str, str], AttemptStatus] = {}
        with schema.transaction(conn, write=True):
            for span in spans:
                key = (span.rollout_id, span.attempt_id)
                seq = next_seq.get(key)
                if seq is not None:
                    rules.check_span_target(span, status_of[key])
                else:
                    row = conn.execute(_SPAN_TARGET, key).fetchone()
                    if row is None:
                        schema.get_attempt(conn, *key)  # raises NotFoundError naming what is missing
                        raise AssertionError("unreachable: the attempt exists but was not found")
                    status, last_heartbeat, unresponsive_s, last_seq = row
                    status_of[key] = AttemptStatus(status)
                    rules.check_span_target(span, status_of[key])
                    if rules.span_refreshes_heartbeat(status_of[key], last_heartbeat, unresponsive_s, now):
                        conn.execute("UPDATE attempts SET last_heartbeat_time = ? WHERE attempt_id = ?", (now, key[1]))
                    seq = last_seq + 1
                next_seq[key] = seq + 1
                stored.append(span.model_copy(update={"sequence_id": seq}))
            schema.SPANS.insert(conn, stored)
        return stored

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of one attempt (default: the latest) by ``sequence_id``. Raises NotFoundError."""

        def read(conn: sqlite3.Connection) -> list[Span]:
            if attempt_id is None:
                schema.get_rollout(conn, rollout_id)
                latest = schema.latest_attempt(conn, rollout_id)
                if latest is None:
                    return []
                target = latest.attempt_id
            else:
                target = schema.get_attempt(conn, rollout_id, attempt_id).attempt_id
            clauses = "WHERE rollout_id = ? AND attempt_id = ? ORDER BY sequence_id"
            return schema.SPANS.fetch_all(conn, clauses, (rollout_id, target))

        return await self._run(self._read, read)

    def _read(self, conn: sqlite3.Connection, read: Callable[[sqlite3.Connection], T]) -> T:
        with schema.transaction(conn, write=False):
            return read(conn)

    # ----------------------------------------------------------------- resources
    async def add_resources(
        self, resources: dict[str, Resource], *, metadata: dict[str, Any] | None = None
    ) -> ResourcesUpdate:
        """Store the next resources version (``rs-1``, ``rs-2``, ...) and make it the latest."""

        def write(conn: sqlite3.Connection) -> ResourcesUpdate:
            with schema.transaction(conn, write=True):
                (version,) = conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM resources").fetchone()
                update = ResourcesUpdate(
                    resources_id=rules.resources_id_for(version),
                    version=version,
                    resources=resources,
                    create_time=time.time(),
                    metadata=metadata or {},
                )
                schema.RESOURCES.put(conn, update)
            return update

        return await self._run(write)

    async def get_resources(self, resources_id: str | None = None) -> ResourcesUpdate | None:
        """One version, or the latest (``None`` when there is none). Raises NotFoundError for an unknown id."""
        if resources_id is None:
            return await self._run(self._read, schema.latest_resources)
        return await self._run(self._read, functools.partial(schema.get_resources, resources_id=resources_id))

    async def query_resources(self) -> list[ResourcesUpdate]:
        """Every resources version, oldest first."""
        return await self._run(self._read, functools.partial(schema.RESOURCES.fetch_all, clauses="ORDER BY version"))

    # ----------------------------------------------------------------- workers and metrics
    async def heartbeat(
        self, worker_id: str, *, rollout_id: str | None = None, attempt_id: str | None = None
    ) -> Worker:
        """Register or refresh a worker (and an attempt's heartbeat). Raises NotFoundError, ConfigError (only
        one of ``rollout_id``/``attempt_id`` given)."""
        if (rollout_id is None) != (attempt_id is None):
            raise ConfigError("heartbeat takes both rollout_id and attempt_id, or neither")

        def write(conn: sqlite3.Connection) -> Worker:
            now = time.time()
            with schema.transaction(conn, write=True):
                attempt = None
                if rollout_id is not None and attempt_id is not None:
                    attempt = rules.refresh_attempt(schema.get_attempt(conn, rollout_id, attempt_id), now)
                    schema.ATTEMPTS.put(conn, attempt)
                worker = rules.worker_heartbeat(schema.get_worker(conn, worker_id), worker_id, now=now, attempt=attempt)
                schema.WORKERS.put(conn, worker)
            return worker

        return await self._run(write)

    async def query_workers(self) -> list[Worker]:
        """Every known worker, in order of first appearance."""
        return await self._run(self._read, functools.partial(schema.WORKERS.fetch_all, clauses="ORDER BY worker_seq"))

    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        """Append training-curve points in one transaction."""

        def write(conn: sqlite3.Connection) -> None:
            with schema.transaction(conn, write=True):
                schema.METRICS.put_many(conn, metrics)

        await self._run(write)

    async def query_metrics(self, name: str | None = None) -> list[Metric]:
        """Points of one curve (or all), by ``train_step`` then insertion."""
        where, params = ("WHERE name = ?", (name,)) if name is not None else ("", ())
        read = functools.partial(
            schema.METRICS.fetch_all, clauses=f"{where} ORDER BY train_step, metric_seq", params=params
        )
        return await self._run(self._read, read)

    # ----------------------------------------------------------------- trained samples
    async def put_trained_samples(self, train_step: int, samples: Sequence[TrainedSample]) -> None:
        """Record a step's trained samples in one transaction, replacing the step's earlier record. Raises
        ConfigError, NotFoundError (see the contract)."""
        pairs = rules.check_trained_samples(train_step, samples)

        def write(conn: sqlite3.Connection) -> None:
            with schema.transaction(conn, write=True):
                for rollout_id, attempt_id in pairs:
                    schema.get_attempt(conn, rollout_id, attempt_id)
                conn.execute("DELETE FROM trained_samples WHERE train_step = ?", (train_step,))
                schema.TRAINED_SAMPLES.insert(conn, samples)

        await self._run(write)

    async def query_trained_samples(
        self, *, rollout_id: str | None = None, train_step: int | None = None
    ) -> list[TrainedSample]:
        """Recorded trained samples matching the filters, by ``train_step`` then ``sample_index``."""
        clauses, params = tables.trained_samples_query(rollout_id, train_step, placeholder="?")
        read = functools.partial(schema.TRAINED_SAMPLES.fetch_all, clauses=clauses, params=params)
        return await self._run(self._read, read)

    async def close(self) -> None:
        """Stop the lease sweeper and close the file. The store cannot be used afterwards; closing twice is
        harmless."""
        if self._closed:
            return
        self._closed = True
        task, self._sweeper = self._sweeper, None
        if task is not None and not task.done():
            task.cancel()
            if task.get_loop() is asyncio.get_running_loop():
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        self._inline.close()
        await asyncio.to_thread(self._writer.stop)
        self._owner.release()
        self._wake_waiters()
