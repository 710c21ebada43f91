"""``SyncHttpLightningStore``: the store contract over HTTP, as blocking calls, for code that is not async.

Every method of :class:`agentbolt.store.base.LightningStore` is here with the same parameters, minus ``async``.
Each call is forwarded to an :class:`~agentbolt.client.http_store.HttpLightningStore` that lives on a private event
loop in a background thread, so it works the same outside any event loop and inside one (a Jupyter cell, a sync
function called from async code); in the latter case it blocks that loop's thread until the answer comes, as any
blocking call would. Errors are the same exception classes the async client raises.

Use it as a context manager, or call :meth:`SyncHttpLightningStore.close`::

    with SyncHttpLightningStore("http://127.0.0.1:8765", token=token) as store:
        rollout = store.enqueue_rollout({"question": "2 + 2"})
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from agentbolt.client.http_store import HttpLightningStore
from agentbolt.store.base import EnqueueRequest, StoreCapabilities
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

P = ParamSpec("P")
T = TypeVar("T")


class SyncHttpLightningStore:
    """Blocking client of a running ``agentbolt serve``; the same methods as the store contract, not coroutines.

    Args:
        base_url: server root, e.g. ``http://127.0.0.1:8765``.
        token: bearer token, if the server requires one.
        timeout_s: per-request timeout in seconds (``wait_for_rollouts`` long-polls in chunks below it).
        read_retries: retries of idempotent GETs on connection errors (not on HTTP errors).

    Raises (from every method): the store contract's errors (see :mod:`agentbolt.store.base`); ``BackendError``
    when the server cannot be reached; ``RuntimeError`` after :meth:`close`.
    """

    capabilities: StoreCapabilities = HttpLightningStore.capabilities

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 60.0, read_retries: int = 3):
        self.base_url = base_url.rstrip("/")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentbolt-sync-store", daemon=True)
        self._thread.start()
        self._closed = False

        async def build() -> HttpLightningStore:
            return HttpLightningStore(base_url, token=token, timeout_s=timeout_s, read_retries=read_retries)

        self._store = self._wait(build())

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("SyncHttpLightningStore was called from its own event loop thread; use the async client")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt while waiting: do not leave the request running
            raise

    def _call(self, method: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run one method of the async client on the private loop and wait for its result."""
        if self._closed:
            raise RuntimeError("this SyncHttpLightningStore is closed; create a new one")

        async def run() -> T:
            return await method(*args, **kwargs)

        return self._wait(run())

    def close(self) -> None:
        """Close the HTTP connections and stop the background loop. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self._wait(self._store.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> SyncHttpLightningStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------------------ the store contract, blocking

    def enqueue_rollout(
        self,
        input: Any,
        *,
        mode: RolloutMode = RolloutMode.TRAIN,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        """See :meth:`agentbolt.store.base.LightningStore.enqueue_rollout`."""
        return self._call(
            self._store.enqueue_rollout, input, mode=mode, resources_id=resources_id, config=config, metadata=metadata
        )

    def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[Rollout]:
        """See :meth:`agentbolt.store.base.LightningStore.enqueue_many`."""
        return self._call(self._store.enqueue_many, requests)

    def claim_rollout(self, worker_id: str) -> AttemptedRollout | None:
        """See :meth:`agentbolt.store.base.LightningStore.claim_rollout`."""
        return self._call(self._store.claim_rollout, worker_id)

    def claim_many(self, worker_id: str, n: int) -> list[AttemptedRollout]:
        """See :meth:`agentbolt.store.base.LightningStore.claim_many`."""
        return self._call(self._store.claim_many, worker_id, n)

    def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: dict[str, Any] | None = None,
        final_reward: float | None = None,
    ) -> Attempt:
        """See :meth:`agentbolt.store.base.LightningStore.update_attempt`."""
        return self._call(
            self._store.update_attempt, rollout_id, attempt_id, status, error=error, final_reward=final_reward
        )

    def cancel_rollout(self, rollout_id: str) -> Rollout:
        """See :meth:`agentbolt.store.base.LightningStore.cancel_rollout`."""
        return self._call(self._store.cancel_rollout, rollout_id)

    def get_rollout(self, rollout_id: str) -> Rollout:
        """See :meth:`agentbolt.store.base.LightningStore.get_rollout`."""
        return self._call(self._store.get_rollout, rollout_id)

    def query_rollouts(
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
        """See :meth:`agentbolt.store.base.LightningStore.query_rollouts`."""
        return self._call(
            self._store.query_rollouts,
            status=status,
            mode=mode,
            rollout_ids=rollout_ids,
            limit=limit,
            offset=offset,
            sort_by=sort_by,
            descending=descending,
        )

    def search_rollouts(self, search: RolloutSearch) -> tuple[list[Rollout], int]:
        """See :meth:`agentbolt.store.base.LightningStore.search_rollouts`."""
        return self._call(self._store.search_rollouts, search)

    def reward_stats(self) -> list[ResourceRewardStats]:
        """See :meth:`agentbolt.store.base.LightningStore.reward_stats`."""
        return self._call(self._store.reward_stats)

    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt:
        """See :meth:`agentbolt.store.base.LightningStore.get_attempt`."""
        return self._call(self._store.get_attempt, rollout_id, attempt_id)

    def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """See :meth:`agentbolt.store.base.LightningStore.query_attempts`."""
        return self._call(self._store.query_attempts, rollout_id)

    def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout_s: float | None = None) -> list[Rollout]:
        """See :meth:`agentbolt.store.base.LightningStore.wait_for_rollouts` (``None``: no limit)."""
        return self._call(self._store.wait_for_rollouts, rollout_ids, timeout_s)

    def add_span(self, span: Span) -> Span:
        """See :meth:`agentbolt.store.base.LightningStore.add_span`."""
        return self._call(self._store.add_span, span)

    def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """See :meth:`agentbolt.store.base.LightningStore.add_spans`."""
        return self._call(self._store.add_spans, spans)

    def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """See :meth:`agentbolt.store.base.LightningStore.query_spans`."""
        return self._call(self._store.query_spans, rollout_id, attempt_id)

    def add_resources(
        self, resources: dict[str, Resource], *, metadata: dict[str, Any] | None = None
    ) -> ResourcesUpdate:
        """See :meth:`agentbolt.store.base.LightningStore.add_resources`."""
        return self._call(self._store.add_resources, resources, metadata=metadata)

    def get_resources(self, resources_id: str | None = None) -> ResourcesUpdate | None:
        """See :meth:`agentbolt.store.base.LightningStore.get_resources`."""
        return self._call(self._store.get_resources, resources_id)

    def query_resources(self) -> list[ResourcesUpdate]:
        """See :meth:`agentbolt.store.base.LightningStore.query_resources`."""
        return self._call(self._store.query_resources)

    def heartbeat(self, worker_id: str, *, rollout_id: str | None = None, attempt_id: str | None = None) -> Worker:
        """See :meth:`agentbolt.store.base.LightningStore.heartbeat`."""
        return self._call(self._store.heartbeat, worker_id, rollout_id=rollout_id, attempt_id=attempt_id)

    def query_workers(self) -> list[Worker]:
        """See :meth:`agentbolt.store.base.LightningStore.query_workers`."""
        return self._call(self._store.query_workers)

    def add_metrics(self, metrics: Sequence[Metric]) -> None:
        """See :meth:`agentbolt.store.base.LightningStore.add_metrics`."""
        self._call(self._store.add_metrics, metrics)

    def query_metrics(self, name: str | None = None) -> list[Metric]:
        """See :meth:`agentbolt.store.base.LightningStore.query_metrics`."""
        return self._call(self._store.query_metrics, name)

    def put_trained_samples(self, train_step: int, samples: Sequence[TrainedSample]) -> None:
        """See :meth:`agentbolt.store.base.LightningStore.put_trained_samples`."""
        self._call(self._store.put_trained_samples, train_step, samples)

    def query_trained_samples(
        self, *, rollout_id: str | None = None, train_step: int | None = None
    ) -> list[TrainedSample]:
        """See :meth:`agentbolt.store.base.LightningStore.query_trained_samples`."""
        return self._call(self._store.query_trained_samples, rollout_id=rollout_id, train_step=train_step)
