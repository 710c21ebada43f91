"""Connections of the PostgreSQL store: the URL, a lazily opened pool bound to one event loop, and transactions.

:class:`PostgresConnections` is the transport under :class:`~agentbolt.store.postgres.PostgresLightningStore`: it
knows nothing of rollouts. Its :meth:`~PostgresConnections.run` executes one function in one transaction and retries
it whole only when the server aborted it for a deadlock or a serialization failure (the only failures that say
"nothing happened, try again"); every other error surfaces at once, mapped to agentbolt's error classes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from agentbolt.errors import AgentboltError, BackendError, ConfigError
from agentbolt.store import postgres_schema as schema
from agentbolt.store import redact_url
from agentbolt.store.postgres_schema import Conn

T = TypeVar("T")

RETRYABLE: Final = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)
"""Server aborts after which a transaction is retried whole: nothing of it was applied."""

TX_TRIES: Final = 5
"""How many times :meth:`PostgresConnections.run` tries a transaction the server keeps aborting (see RETRYABLE)."""


class PostgresConnections:
    """A pool of autocommit connections to one database, opened on first use, with the schema migrated first.

    Args:
        url: a libpq URL (``postgresql://`` or ``postgres://``; any libpq parameter).
        min_connections / max_connections: size bounds of the pool.
        connect_timeout_s: the most seconds to wait for a new connection (when the URL sets no ``connect_timeout``)
            and for a free pooled one.

    Raises:
        ConfigError: a malformed URL, or bad pool bounds.
    """

    def __init__(self, url: str, *, min_connections: int, max_connections: int, connect_timeout_s: float) -> None:
        if not 1 <= min_connections <= max_connections:
            raise ConfigError(
                f"need 1 <= min_connections <= max_connections, got {min_connections} and {max_connections}"
            )
        self.display_url = redact_url(url)
        try:
            params = conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise ConfigError(f"store URL {self.display_url!r} is not a valid PostgreSQL URL: {exc}") from None
        self.min_connections = min_connections
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s
        self._url = url
        self._connect_kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params:
            self._connect_kwargs["connect_timeout"] = max(1, round(connect_timeout_s))
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Task[AsyncConnectionPool[Conn]] | None = None

    async def _connect(self) -> AsyncConnectionPool[Conn]:
        """Migrate the schema over one direct connection (it reports connection errors clearly), then open the pool.

        Raises:
            BackendError: the server cannot be reached or refuses the login.
            ConfigError: the database holds a newer schema.
        """
        try:
            conn = await psycopg.AsyncConnection.connect(self._url, **self._connect_kwargs)
        except psycopg.OperationalError as exc:
            raise BackendError(f"cannot connect to PostgreSQL at {self.display_url}: {str(exc).strip()}") from exc
        async with conn:
            await schema.migrate(conn)
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self._url,
            min_size=self.min_connections,
            max_size=self.max_connections,
            kwargs=self._connect_kwargs,
            configure=self._configure,
            timeout=self.connect_timeout_s,
            open=False,
            name="agentbolt-postgres-store",
        )
        try:
            await pool.open(wait=True, timeout=self.connect_timeout_s)
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, PoolTimeout):
                raise BackendError(f"cannot open connections to PostgreSQL at {self.display_url}: {exc}") from exc
            raise
        return pool

    @staticmethod
    async def _configure(conn: Conn) -> None:
        """Make each pooled session acknowledge a commit only once it is durable (``synchronous_commit`` not off)."""
        cur = await conn.execute("SHOW synchronous_commit")
        row = await cur.fetchone()
        if row is not None and row[0] == "off":
            await conn.execute("SET synchronous_commit TO on")

    async def pool(self) -> AsyncConnectionPool[Conn]:
        """The pool, opened on the first call (concurrent first calls share one opening).

        Raises:
            AgentboltError: called from another event loop while the one that opened the pool still runs.
            BackendError, ConfigError: see :meth:`_connect` (a failed opening is retried on the next call).
        """
        loop = asyncio.get_running_loop()
        if self._pool_loop is not None and self._pool_loop is not loop:
            if not self._pool_loop.is_closed():
                raise AgentboltError(
                    "this PostgreSQL store is in use on another event loop; create one store per event loop"
                )
            self._pool = self._opening = self._pool_loop = None  # its connections went with the old loop
        if self._pool is None:
            task = self._opening
            if task is None:
                task = self._opening = loop.create_task(self._connect(), name="agentbolt-postgres-store-connect")
            try:
                pool = await asyncio.shield(task)
            except BaseException:
                if task.done() and self._opening is task:
                    self._opening = None
                raise
            self._pool, self._pool_loop = pool, loop
        return self._pool

    async def run(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """Run ``fn(conn)`` in one transaction and commit; retry it whole (up to :data:`TX_TRIES` times, after a
        short random pause) when the server aborts it for a deadlock or a serialization failure.

        Raises:
            ConfigError: the server refused a value (e.g. a NUL character in a JSON string).
            BackendError: the server is unreachable or failed, or no pooled connection freed up in
                ``connect_timeout_s``.
            Whatever ``fn`` raises (the transaction is rolled back).
        """
        pool = await self.pool()
        try:
            for tries in range(1, TX_TRIES + 1):
                try:
                    async with pool.connection() as conn, conn.transaction():
                        return await fn(conn)
                except RETRYABLE:
                    if tries == TX_TRIES:
                        raise
                    await asyncio.sleep(random.uniform(0, 0.01 * tries))
            raise AssertionError("unreachable")
        except psycopg.DataError as exc:
            raise ConfigError(f"PostgreSQL refused a value: {str(exc).strip()}") from exc
        except PoolTimeout as exc:
            raise BackendError(f"no free connection to PostgreSQL at {self.display_url}: {exc}") from exc
        except psycopg.OperationalError as exc:
            raise BackendError(f"PostgreSQL at {self.display_url} failed: {str(exc).strip()}") from exc

    async def close(self) -> None:
        """Close the pool (or stop an opening in progress). Call it on the event loop that used the pool."""
        loop = asyncio.get_running_loop()
        task, self._opening = self._opening, None
        if task is not None and not task.done() and task.get_loop() is loop:
            task.cancel()
            await asyncio.wait({task}, timeout=self.connect_timeout_s)
        pool, self._pool = self._pool, None
        if pool is not None and self._pool_loop is loop:
            await pool.close()
