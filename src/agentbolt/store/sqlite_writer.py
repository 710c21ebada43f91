"""One thread that owns a SQLite connection and commits the jobs queued behind each other together (group commit).

Every store call becomes a job ``fn(conn, *args)`` run on this thread. When several jobs are waiting, the thread runs
them inside one ``BEGIN IMMEDIATE`` ... ``COMMIT``, each job in its own savepoint
(:func:`agentbolt.store.sqlite_schema.transaction` turns into a savepoint inside an open transaction), so:

- a job that raises is rolled back alone, and its caller gets the exception;
- the jobs that succeeded are acknowledged only after the shared ``COMMIT`` returned, so an acknowledged write is as
  durable as with one commit per job;
- if the ``COMMIT`` itself fails (disk full, I/O error), every job of the batch gets that error and nothing of the
  batch is stored.

Under concurrency this turns N commits (N fsyncs with ``synchronous=FULL``) into one; a lone job runs as before.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

MAX_BATCH = 128
"""Most jobs committed together."""

_STOP = object()


class _Job:
    __slots__ = ("fn", "args", "loop", "future")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop) -> None:
        self.fn = fn
        self.args = args
        self.loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()


def _resolve(outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, error in outcomes:
        if future.cancelled():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _deliver(batch: list[_Job], outcomes: list[tuple[Any, BaseException | None]]) -> None:
    """Hand each job its outcome with one wake-up per event loop (not one per job)."""
    per_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]] = {}
    for job, (result, error) in zip(batch, outcomes, strict=True):
        per_loop.setdefault(job.loop, []).append((job.future, result, error))
    for loop, items in per_loop.items():
        if not loop.is_closed():
            loop.call_soon_threadsafe(_resolve, items)


class GroupCommitThread:
    """Runs jobs on one thread over one connection, committing queued jobs together.

    Args:
        connect: opens the connection (called once, on the thread, before the first job; an exception it raises is
            given to that job and the next job tries again).
        name: the thread's name.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], name: str) -> None:
        self._connect = connect
        self._conn: sqlite3.Connection | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._started = False
        self._lock = threading.Lock()
        self.batches = 0
        """Transactions committed for more than one job (a counter, for tests and benchmarks)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Queue ``fn(conn, *args)``; the returned future (of the running loop) resolves after its commit."""
        job = _Job(fn, args, asyncio.get_running_loop())
        with self._lock:
            if not self._started:
                self._thread.start()
                self._started = True
        self._queue.put(job)
        return job.future

    def stop(self) -> None:
        """Finish the queued jobs, close the connection and end the thread (blocks until it ended)."""
        with self._lock:
            started, self._started = self._started, True
        if not started:
            return
        self._queue.put(_STOP)
        self._thread.join()

    # ----------------------------------------------------------------- the thread
    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                break
            batch: list[_Job] = [first]
            stop_after = False
            while len(batch) < MAX_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop_after = True
                    break
                batch.append(nxt)
            self._run_batch(batch)
            if stop_after:
                break
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._connect()
        return self._conn

    def _run_batch(self, batch: list[_Job]) -> None:
        try:
            conn = self._connection()
        except BaseException as exc:  # cannot open the file: every job learns why
            _deliver(batch, [(None, exc)] * len(batch))
            return
        if len(batch) == 1:
            job = batch[0]
            try:
                outcome: tuple[Any, BaseException | None] = (job.fn(conn, *job.args), None)
            except BaseException as exc:
                outcome = (None, exc)
            _deliver(batch, [outcome])
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            _deliver(batch, [(None, exc)] * len(batch))
            return
        outcomes: list[tuple[Any, BaseException | None]] = []
        for job in batch:
            try:
                outcomes.append((job.fn(conn, *job.args), None))
            except BaseException as exc:
                outcomes.append((None, exc))
        try:
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            outcomes = [(None, exc)] * len(batch)
        self.batches += 1
        _deliver(batch, outcomes)
