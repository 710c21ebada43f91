"""``SyncHttpLightningStore`` against a real server on 127.0.0.1 (SQLite store): outside and inside an event loop.

The server runs in its own thread (with its own loop), as it would in another process, so the blocking client can
be called from plain code and from a coroutine alike.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbolt.client import SyncHttpLightningStore
from agentbolt.errors import InvalidTransitionError, NotFoundError
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.base import LightningStore
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import AttemptStatus, Metric, PromptTemplate, RolloutStatus, Span

TOKEN = "sync-token"


@pytest.fixture
def server_url(tmp_path: Path) -> Iterator[str]:
    """A real server with a SQLite store, served from a background thread."""
    started = threading.Event()
    url: list[str] = []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        async with serve_in_background(create_app(store, token=TOKEN)) as base_url:
            url.append(base_url)
            started.set()
            await stop.wait()
        await store.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(30), "server did not start"
    try:
        yield url[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


def _lifecycle(store: SyncHttpLightningStore) -> None:
    resources = store.add_resources({"prompt": PromptTemplate(template="{q}")}, metadata={"step": 0})
    rollout = store.enqueue_rollout({"q": "2+2"}, resources_id=resources.resources_id)
    claimed = store.claim_rollout("w-sync")
    assert claimed is not None and claimed.rollout.rollout_id == rollout.rollout_id
    rollout_id, attempt_id = rollout.rollout_id, claimed.attempt.attempt_id
    store.update_attempt(rollout_id, attempt_id, AttemptStatus.RUNNING)
    span = Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        span_id="00000000000000ab",
        trace_id="0" * 31 + "2",
        name="agentbolt.reward",
        start_time=1.0,
        attributes={"agentbolt.reward.value": 1.0},
    )
    assert store.add_span(span).sequence_id == 1
    assert [s.sequence_id for s in store.add_spans([span, span])] == [2, 3]
    done = store.update_attempt(rollout_id, attempt_id, AttemptStatus.SUCCEEDED, final_reward=1.0)
    assert done.status == AttemptStatus.SUCCEEDED

    assert [s.sequence_id for s in store.query_spans(rollout_id)] == [1, 2, 3]
    assert store.get_rollout(rollout_id).status == RolloutStatus.SUCCEEDED
    assert [r.rollout_id for r in store.query_rollouts(status=[RolloutStatus.SUCCEEDED])] == [rollout_id]
    assert [r.rollout_id for r in store.wait_for_rollouts([rollout_id], timeout_s=5)] == [rollout_id]
    assert store.get_attempt(rollout_id, attempt_id).status == AttemptStatus.SUCCEEDED
    assert len(store.query_attempts(rollout_id)) == 1
    latest = store.get_resources()
    assert latest is not None and latest.resources_id == resources.resources_id
    assert [w.worker_id for w in store.query_workers()] == ["w-sync"]
    store.add_metrics([Metric(name="loss", train_step=1, value=0.5, time=1.0)])
    assert [m.value for m in store.query_metrics("loss")] == [0.5]
    with pytest.raises(InvalidTransitionError):
        store.update_attempt(rollout_id, attempt_id, AttemptStatus.RUNNING)
    with pytest.raises(NotFoundError):
        store.get_rollout("ro-missing")


def test_sync_client_outside_an_event_loop(server_url: str) -> None:
    with SyncHttpLightningStore(server_url, token=TOKEN) as store:
        _lifecycle(store)
    with pytest.raises(RuntimeError, match="closed"):
        store.query_workers()
    store.close()  # twice is fine


def test_sync_client_inside_a_running_event_loop(server_url: str) -> None:
    async def main() -> None:
        store = SyncHttpLightningStore(server_url, token=TOKEN)
        try:
            _lifecycle(store)  # blocking calls from a coroutine still work (they block this loop meanwhile)
        finally:
            store.close()

    asyncio.run(main())


def test_sync_client_has_every_store_method_with_the_same_parameters() -> None:
    contract = {
        name: member
        for name, member in inspect.getmembers(LightningStore, inspect.iscoroutinefunction)
        if not name.startswith("_")
    }
    assert contract
    for name, method in contract.items():
        sync_method = getattr(SyncHttpLightningStore, name, None)
        assert sync_method is not None, f"SyncHttpLightningStore lacks {name}(); forward it like the others"
        assert not inspect.iscoroutinefunction(sync_method), name
        expected = [(p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()]
        got = [(p.name, p.kind, p.default) for p in inspect.signature(sync_method).parameters.values()]
        assert got == expected, f"{name}: {got} != {expected}"
