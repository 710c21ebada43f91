"""``Runner``: claims rollouts from a store, runs the agent on each, and reports the outcome.

One runner holds ``concurrency`` slots; each slot loops: claim -> fetch resources -> mark running -> run the agent
(a sync agent in a thread, an async one on the loop) -> report ``succeeded`` with the final reward, or ``failed``
with the error. A heartbeat task refreshes the worker and its attempts every ``heartbeat_interval_s``.
Spans emitted by the agent are written to the store from the runner's loop; the agent never waits on the network.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import traceback
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentbolt import semconv
from agentbolt.adapter import last_reward
from agentbolt.runner.agent import LitAgent
from agentbolt.store.base import LightningStore
from agentbolt.tracing.context import AttemptContext, attempt_scope
from agentbolt.types import LLM, AttemptedRollout, AttemptStatus, Resource, Span

logger = logging.getLogger(__name__)


@dataclass
class RunnerStats:
    """Counters of one runner: attempts that succeeded, failed (agent raised), and spans written."""

    succeeded: int = 0
    failed: int = 0
    spans_written: int = 0
    span_write_errors: int = 0


@dataclass
class _Slot:
    """One concurrent rollout: its attempt, and its spans waiting to be written in emission order."""

    attempt: tuple[str, str] | None = None
    buffer: list[Span] = field(default_factory=list)
    writer: asyncio.Task[None] | None = None


def final_reward_of(ctx: AttemptContext, returned: Any) -> float | None:
    """The attempt's final reward: the agent's returned number if any, else its last unnamed ``emit_reward``."""
    if isinstance(returned, bool | int | float) and math.isfinite(float(returned)):
        return float(returned)
    return last_reward(ctx.spans)


class Runner:
    """Executes an agent on rollouts claimed from ``store``.

    Args:
        agent: the agent (``@rollout`` function or ``LitAgent``).
        store: any store backend (in a separate process: :class:`~agentbolt.client.HttpLightningStore`).
        worker_id: name reported to the store (default: random ``runner-<hex>``).
        concurrency: rollouts run at once (sync agents each take a thread).
        poll_interval_s: sleep between claims when the queue is empty.
        heartbeat_interval_s: period of worker and attempt heartbeats.
    """

    def __init__(
        self,
        agent: LitAgent,
        store: LightningStore,
        *,
        worker_id: str | None = None,
        concurrency: int = 1,
        poll_interval_s: float = 0.1,
        heartbeat_interval_s: float = 2.0,
    ) -> None:
        self.agent = agent
        self.store = store
        self.worker_id = worker_id or f"runner-{uuid.uuid4().hex[:8]}"
        self.concurrency = concurrency
        self.poll_interval_s = poll_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.stats = RunnerStats()
        self._slots = [_Slot() for _ in range(concurrency)]

    async def run(self, stop: asyncio.Event | Callable[[], bool] | None = None) -> RunnerStats:
        """Run until ``stop`` is set (an ``asyncio.Event`` or a callable returning True)."""

        def stopped() -> bool:
            if stop is None:
                return False
            return stop.is_set() if isinstance(stop, asyncio.Event) else bool(stop())

        await self.store.heartbeat(self.worker_id)
        beat = asyncio.create_task(self._heartbeat_loop(stopped))
        try:
            await asyncio.gather(*(self._slot_loop(slot, stopped) for slot in self._slots))
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        return self.stats

    async def _heartbeat_loop(self, stopped: Callable[[], bool]) -> None:
        while not stopped():
            await asyncio.sleep(self.heartbeat_interval_s)
            try:
                busy = [s.attempt for s in self._slots if s.attempt is not None]
                if not busy:
                    await self.store.heartbeat(self.worker_id)
                for rollout_id, attempt_id in busy:
                    await self.store.heartbeat(self.worker_id, rollout_id=rollout_id, attempt_id=attempt_id)
            except Exception as exc:  # a missed heartbeat must not kill the runner
                logger.warning("heartbeat failed: %r", exc)

    async def _slot_loop(self, slot: _Slot, stopped: Callable[[], bool]) -> None:
        while not stopped():
            claimed = await self.store.claim_rollout(self.worker_id)
            if claimed is None:
                await asyncio.sleep(self.poll_interval_s)
                continue
            await self.run_attempt(claimed, slot)

    async def _resources(self, claimed: AttemptedRollout) -> dict[str, Resource]:
        resources_id = claimed.attempt.resources_id or claimed.rollout.resources_id
        update = await self.store.get_resources(resources_id)
        if update is None:
            return {}
        rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        return {
            name: res.for_attempt(rollout_id, attempt_id) if isinstance(res, LLM) else res
            for name, res in update.resources.items()
        }

    async def run_attempt(self, claimed: AttemptedRollout, slot: _Slot | None = None) -> None:
        """Run the agent on one claimed attempt and report its end state. Never raises for agent errors."""
        slot = slot or _Slot()
        rollout, attempt = claimed.rollout, claimed.attempt
        loop = asyncio.get_running_loop()
        slot.attempt = (rollout.rollout_id, attempt.attempt_id)

        def sink(span: Span) -> None:
            # Called from the agent's thread or the loop: queue the span and return at once. One writer task per
            # slot sends queued spans in batches, in emission order, so the store numbers them in that order.
            def schedule() -> None:
                slot.buffer.append(span)
                if slot.writer is None or slot.writer.done():
                    slot.writer = asyncio.ensure_future(self._flush(slot))

            loop.call_soon_threadsafe(schedule)

        ctx = AttemptContext(rollout.rollout_id, attempt.attempt_id, sink=sink)
        try:
            resources = await self._resources(claimed)
            await self.store.update_attempt(rollout.rollout_id, attempt.attempt_id, AttemptStatus.RUNNING)
            returned = await self._call_agent(ctx, rollout.input, resources, claimed)
            reward = final_reward_of(ctx, returned)
            if isinstance(returned, bool | int | float):
                ctx.record(semconv.SPAN_REWARD, {semconv.REWARD_VALUE: float(returned)})
            await self._drain(slot)
            await self.store.update_attempt(
                rollout.rollout_id, attempt.attempt_id, AttemptStatus.SUCCEEDED, final_reward=reward
            )
            self.stats.succeeded += 1
        except Exception as exc:
            ctx.record(
                semconv.SPAN_EXCEPTION,
                {
                    semconv.EXCEPTION_TYPE: type(exc).__name__,
                    semconv.EXCEPTION_MESSAGE: str(exc),
                    semconv.EXCEPTION_STACKTRACE: traceback.format_exc(),
                },
            )
            await self._drain(slot)
            error = {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}
            try:
                await self.store.update_attempt(
                    rollout.rollout_id, attempt.attempt_id, AttemptStatus.FAILED, error=error
                )
            except Exception as report_exc:  # e.g. the attempt already expired; the store decides
                logger.warning("could not report failure of %s: %r", attempt.attempt_id, report_exc)
            self.stats.failed += 1
            logger.info("attempt %s failed: %s: %s", attempt.attempt_id, type(exc).__name__, exc)
        finally:
            slot.attempt = None

    async def _call_agent(
        self, ctx: AttemptContext, task: Any, resources: Mapping[str, Resource], claimed: AttemptedRollout
    ) -> Any:
        if self.agent.is_async:
            with attempt_scope(ctx):
                result = self.agent.rollout(task, resources, claimed.rollout)
                return await result if isinstance(result, Awaitable) else result

        def in_thread() -> Any:
            with attempt_scope(ctx):
                return self.agent.rollout(task, resources, claimed.rollout)

        return await asyncio.to_thread(in_thread)

    async def _flush(self, slot: _Slot) -> None:
        while slot.buffer:
            batch = list(slot.buffer)
            slot.buffer.clear()
            try:
                await self.store.add_spans(batch)
                self.stats.spans_written += len(batch)
            except Exception as exc:
                self.stats.span_write_errors += len(batch)
                logger.warning("%d spans of attempt %s were not stored: %r", len(batch), batch[0].attempt_id, exc)

    async def _drain(self, slot: _Slot) -> None:
        # Let callbacks scheduled with call_soon_threadsafe run, then wait for the writer to empty the queue.
        await asyncio.sleep(0)
        while slot.buffer or (slot.writer is not None and not slot.writer.done()):
            if slot.writer is not None and not slot.writer.done():
                await slot.writer
            elif slot.buffer:
                slot.writer = asyncio.ensure_future(self._flush(slot))
            await asyncio.sleep(0)
