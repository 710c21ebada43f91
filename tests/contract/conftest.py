"""Backends the contract suite runs against, and the fixtures that open them.

Every test in ``tests/contract`` runs once per entry of :data:`BACKENDS`. A backend is a factory that gets the test's
``pytest.FixtureRequest`` at setup (to pull what it needs: ``tmp_path``, the ``postgres_url`` of a real server...)
and returns an opener: a no-argument async context manager factory that yields an open
:class:`~agentbolt.store.base.LightningStore` and closes it afterwards. A backend whose server is unavailable skips
at setup, with the reason (see ``postgres_server_url`` in ``tests/conftest.py``).

Tests are plain sync functions that hand an ``async def body(store)`` to the ``run_with_store`` fixture, which runs it
with ``asyncio.run`` (no pytest plugin needed).

Timing: backends built here sweep expired leases every 0.05 s, so expiry tests can use leases of 0.1-0.3 s.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from agentbolt.store import InMemoryLightningStore, LightningStore, SqliteLightningStore

StoreOpener = Callable[[], AbstractAsyncContextManager[LightningStore]]
BackendFactory = Callable[[pytest.FixtureRequest], StoreOpener]
StoreBody = Callable[[LightningStore], Awaitable[None]]

SWEEP_INTERVAL_S = 0.05


@asynccontextmanager
async def _open_memory() -> AsyncIterator[LightningStore]:
    store = InMemoryLightningStore(sweep_interval_s=SWEEP_INTERVAL_S)
    try:
        yield store
    finally:
        await store.close()


def memory_backend(request: pytest.FixtureRequest) -> StoreOpener:
    return _open_memory


@asynccontextmanager
async def _open_sqlite(tmp_path: Path) -> AsyncIterator[LightningStore]:
    store = SqliteLightningStore(tmp_path / "store.db", sweep_interval_s=SWEEP_INTERVAL_S, poll_interval_s=0.02)
    try:
        yield store
    finally:
        await store.close()


def sqlite_backend(request: pytest.FixtureRequest) -> StoreOpener:
    return functools.partial(_open_sqlite, request.getfixturevalue("tmp_path"))


@asynccontextmanager
async def _open_http(tmp_path: Path) -> AsyncIterator[LightningStore]:
    """The HTTP client against a real ``agentbolt`` server on 127.0.0.1 (any free port) over a SQLite file."""
    from agentbolt.client import HttpLightningStore
    from agentbolt.server.app import create_app
    from agentbolt.server.serving import serve_in_background

    inner = SqliteLightningStore(tmp_path / "served.db", sweep_interval_s=SWEEP_INTERVAL_S, poll_interval_s=0.02)
    try:
        async with serve_in_background(create_app(inner)) as url:
            client = HttpLightningStore(url)
            try:
                yield client
            finally:
                await client.close()
    finally:
        await inner.close()


def http_backend(request: pytest.FixtureRequest) -> StoreOpener:
    return functools.partial(_open_http, request.getfixturevalue("tmp_path"))


@asynccontextmanager
async def _open_postgres(url: str) -> AsyncIterator[LightningStore]:
    from agentbolt.store.postgres import PostgresLightningStore

    store = PostgresLightningStore(url, sweep_interval_s=SWEEP_INTERVAL_S, poll_interval_s=0.02)
    try:
        yield store
    finally:
        await store.close()


def postgres_backend(request: pytest.FixtureRequest) -> StoreOpener:
    """A real PostgreSQL server; each test gets a fresh schema (``postgres_url``). Skips when there is no server."""
    return functools.partial(_open_postgres, request.getfixturevalue("postgres_url"))


BACKENDS: dict[str, BackendFactory] = {
    "memory": memory_backend,
    "sqlite": sqlite_backend,
    "http": http_backend,
    "postgres": postgres_backend,
}
"""Backend name -> factory. Test ids carry the name, so ``pytest -k sqlite`` selects one backend."""


@pytest.fixture(params=list(BACKENDS))
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def store_factory(backend_name: str, request: pytest.FixtureRequest) -> StoreOpener:
    """Opens a fresh store of the current backend (``async with store_factory() as store``)."""
    return BACKENDS[backend_name](request)


@pytest.fixture
def run_with_store(store_factory: StoreOpener) -> Callable[[StoreBody], None]:
    """Run ``body(store)`` on a fresh store in a fresh event loop; the store is closed afterwards."""

    def run(body: StoreBody) -> None:
        async def main() -> None:
            async with store_factory() as store:
                await body(store)

        asyncio.run(main())

    return run
