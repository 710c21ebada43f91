"""Backends the contract suite runs against, and the fixtures that open them.

Every test in ``tests/contract`` runs once per entry of :data:`BACKENDS`. To add a backend (e.g. the HTTP client
against a real server on ``127.0.0.1``), add an async context manager factory that takes pytest's ``tmp_path`` and
yields an open :class:`~agentbolt.store.base.LightningStore`; the factory starts and stops whatever it needs.

Tests are plain sync functions that hand an ``async def body(store)`` to the ``run_with_store`` fixture, which runs it
with ``asyncio.run`` (no pytest plugin needed).

Timing: backends built here sweep expired leases every 0.05 s, so expiry tests can use leases of 0.1-0.3 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from agentbolt.store import InMemoryLightningStore, LightningStore, SqliteLightningStore

BackendFactory = Callable[[Path], AbstractAsyncContextManager[LightningStore]]
StoreBody = Callable[[LightningStore], Awaitable[None]]

SWEEP_INTERVAL_S = 0.05


@asynccontextmanager
async def memory_backend(tmp_path: Path) -> AsyncIterator[LightningStore]:
    store = InMemoryLightningStore(sweep_interval_s=SWEEP_INTERVAL_S)
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def sqlite_backend(tmp_path: Path) -> AsyncIterator[LightningStore]:
    store = SqliteLightningStore(tmp_path / "store.db", sweep_interval_s=SWEEP_INTERVAL_S, poll_interval_s=0.02)
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def http_backend(tmp_path: Path) -> AsyncIterator[LightningStore]:
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


BACKENDS: dict[str, BackendFactory] = {
    "memory": memory_backend,
    "sqlite": sqlite_backend,
    "http": http_backend,
}
"""Backend name -> factory. Test ids carry the name, so ``pytest -k sqlite`` selects one backend."""


@pytest.fixture(params=list(BACKENDS))
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def store_factory(backend_name: str, tmp_path: Path) -> Callable[[], AbstractAsyncContextManager[LightningStore]]:
    """Opens a fresh store of the current backend (``async with store_factory() as store``)."""
    return lambda: BACKENDS[backend_name](tmp_path)


@pytest.fixture
def run_with_store(
    store_factory: Callable[[], AbstractAsyncContextManager[LightningStore]],
) -> Callable[[StoreBody], None]:
    """Run ``body(store)`` on a fresh store in a fresh event loop; the store is closed afterwards."""

    def run(body: StoreBody) -> None:
        async def main() -> None:
            async with store_factory() as store:
                await body(store)

        asyncio.run(main())

    return run
