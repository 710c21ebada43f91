"""Run SQLite store calls on the caller's event loop; commit the calls of concurrent tasks together.

With ``synchronous=normal`` a ``COMMIT`` is a few ``write()`` calls (one WAL frame per changed page, plus file locks),
and it costs as much as the rest of a small call. A lone caller (one runner, one request at a time) gets each call
committed at once, inside the call, with no extra loop iteration. When several tasks call the store in the same loop
iteration (a server answering many runners, many consumers in one process), their calls share one transaction: each
runs in its own savepoint (an error undoes that call alone), and each returns only after the shared ``COMMIT``, issued
at the start of the next loop iteration. Durability is unchanged: no call returns before its write is committed.

When to share: :class:`InlineRunner` switches to shared commits when a call comes from another task than the previous
call within one loop iteration (tasks really ran side by side), and back to one commit per call after
:data:`SOLO_BATCHES_TO_STOP` shared commits in a row had a single call each. A task that calls the store without ever
yielding would keep other tasks from being seen, so in that mode every :data:`YIELD_EVERY` th call first yields once.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

T = TypeVar("T")

_NOBODY: Final = object()

SOLO_BATCHES_TO_STOP: Final = 4
"""Shared commits in a row with one call each after which calls commit one by one again."""
YIELD_EVERY: Final = 32
"""In one-by-one mode, every this many calls yield to the event loop once before running."""


class InlineBusy(Exception):
    """The inline connection is in use by another thread or event loop: nothing was done; run the call elsewhere."""


class LockedElsewhere(Exception):
    """Another connection holds the file's write lock: nothing was done; run the call where it may wait."""


def is_lock_error(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused because another connection holds a lock (``database is locked`` / ``busy``)."""
    text = str(exc)
    return "locked" in text or "busy" in text


class InlineRunner:
    """Runs ``fn(conn, *args)`` on the caller's loop over one connection that never waits for a lock.

    ``fn`` opens its own transaction with :func:`agentbolt.store.sqlite_schema.transaction`, which becomes a savepoint
    when a shared transaction is open.

    Args:
        open_connection: opens the connection (autocommit mode, ``busy_timeout`` 0) on first use.

    Attributes:
        shared_commits: shared commits so far (for tests and benchmarks).
        shared_calls: calls committed by them.
    """

    def __init__(self, open_connection: Callable[[], sqlite3.Connection]) -> None:
        self._open = open_connection
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._sharing = False
        self._solo_batches = 0
        self._calls = 0
        # The open shared transaction: its loop and the callers waiting for its COMMIT.
        self._batch_loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[asyncio.Future[None]] | None = None
        # Which task made the last call in the current loop iteration (reset at the start of the next one).
        self._iteration_task: object = _NOBODY
        self.shared_commits = 0
        self.shared_calls = 0

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` and return its result once it is committed.

        Raises:
            InlineBusy: another thread or event loop uses the connection (nothing was done).
            LockedElsewhere: another connection holds the write lock (nothing was done).
            Exception: whatever ``fn`` raised (its work is rolled back), or the error of the shared ``COMMIT`` (then
                the call's work is rolled back too).
        """
        loop = asyncio.get_running_loop()
        if not self._sharing:
            self._calls += 1
            if self._calls % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let other ready tasks run, so that concurrency can be seen
        self._note_caller(loop)
        if not self._lock.acquire(blocking=False):
            raise InlineBusy
        try:
            if self._conn is None:
                self._conn = self._open()
            conn = self._conn
            if self._waiters is not None:
                if self._batch_loop is not loop:
                    raise InlineBusy
                result = fn(conn, *args)  # in a savepoint of the open transaction
                waiter = loop.create_future()
                self._waiters.append(waiter)
            elif not self._sharing:
                return fn(conn, *args)  # its own transaction, committed before it returns
            else:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = fn(conn, *args)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                waiter = loop.create_future()
                self._waiters = [waiter]
                self._batch_loop = loop
                loop.call_soon(self._commit)
        except sqlite3.OperationalError as exc:
            if is_lock_error(exc):
                raise LockedElsewhere from exc
            raise
        finally:
            self._lock.release()
        await waiter
        return result

    def _note_caller(self, loop: asyncio.AbstractEventLoop) -> None:
        """Switch to shared commits when two tasks call in one loop iteration."""
        task = asyncio.current_task()
        if self._iteration_task is _NOBODY:
            loop.call_soon(self._new_iteration)
        elif task is not self._iteration_task and not self._sharing:
            self._sharing = True
            self._solo_batches = 0
        self._iteration_task = task

    def _new_iteration(self) -> None:
        self._iteration_task = _NOBODY

    def _commit(self) -> None:
        """Commit the shared transaction and release its callers (with the error, if the commit failed)."""
        waiters, self._waiters, self._batch_loop = self._waiters, None, None
        if waiters is None:
            return
        error: BaseException | None = None
        with self._lock:
            assert self._conn is not None
            try:
                self._conn.execute("COMMIT")
            except BaseException as exc:  # e.g. disk full: nothing of the batch is stored
                error = exc
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
        self.shared_commits += 1
        self.shared_calls += len(waiters)
        self._solo_batches = self._solo_batches + 1 if len(waiters) == 1 else 0
        if self._solo_batches >= SOLO_BATCHES_TO_STOP:
            self._sharing = False
        for waiter in waiters:
            if not waiter.done():
                if error is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(error)

    def flush(self) -> None:
        """Commit the open shared transaction now, if any (call it on the loop that opened it)."""
        self._commit()

    def close(self) -> None:
        """Commit what is pending and close the connection."""
        self._commit()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def connection(self) -> sqlite3.Connection | None:
        """The connection, once opened (for tests)."""
        return self._conn
