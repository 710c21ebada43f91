"""``Runner``: claims rollouts from a store, runs the agent on each, and reports the outcome.

One runner holds ``concurrency`` slots; each slot loops: claim -> fetch resources -> mark running -> run the agent
(a sync agent in a thread, an async one on the loop) -> report ``succeeded`` with the final reward, or ``failed``
with the error. A heartbeat task refreshes the worker and its attempts every ``heartbeat_interval_s``.

Tracing: each attempt runs under its own :class:`~agentbolt.tracing.AttemptContext`, so every OpenTelemetry span it
records (``emit_*``, ``@operation``, instrumented frameworks) carries its rollout and attempt ids and nests as it
happened (see :mod:`agentbolt.tracing.otel`). The spans go to the store through one
:class:`~agentbolt.tracing.export.ExportQueue` per runner, in the background, as soon as each ends: over OTLP/HTTP
to ``<server>/v1/traces`` when the store is an :class:`~agentbolt.client.HttpLightningStore`, else straight into
the store with ``add_spans`` on the runner's loop. Before an attempt is reported finished, the runner waits (up to
``span_flush_timeout_s``) until every span it recorded so far has been exported, and counts spans that could not be.
The frameworks named by ``instrument`` are instrumented while the runner runs (see
:mod:`agentbolt.tracing.instrumentors`).

Final reward: the agent's returned number, else its last unnamed ``emit_reward``. A returned number is also
recorded as an unnamed reward span, after everything the agent recorded. An exception that ends the attempt is
recorded as an ``agentbolt.exception`` span. Every failed attempt names its cause in ``error["cause"]``
(:mod:`agentbolt.adapter.causes`): ``agent_exception`` (the agent raised), ``bad_reward`` (it returned something that
is not a reward, :mod:`agentbolt.types.rewards`), ``no_reward`` (it returned None and emitted no final reward),
``timeout`` (the runner stopped it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry.sdk.trace.export import SpanExporter

from agentbolt.adapter import last_reward
from agentbolt.adapter.causes import AGENT_EXCEPTION, BAD_REWARD, BAD_TASK, NO_REWARD
from agentbolt.client import HttpLightningStore
from agentbolt.errors import BackendError, ConfigError, InvalidTransitionError, RewardError
from agentbolt.runner.agent import AgentSetupError, LitAgent
from agentbolt.runner.isolation import (
    AgentTimeout,
    Isolation,
    RemoteAgentError,
    describe_exception,
    process_isolation_available,
    run_in_child,
    run_in_thread,
    timeout_error,
)
from agentbolt.store.base import LightningStore
from agentbolt.tracing import instrumentors
from agentbolt.tracing.context import AttemptContext, attempt_scope
from agentbolt.tracing.emit import emit_exception, emit_reward
from agentbolt.tracing.export import ExportQueue, StoreSpanExporter, otlp_exporter
from agentbolt.tracing.otel import span_router, tracer_provider
from agentbolt.types import LLM, AttemptedRollout, AttemptStatus, Resource, Span
from agentbolt.types.rewards import returned_reward

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class RunnerStats:
    """Counters of one runner.

    Attributes:
        succeeded / failed: attempts reported succeeded, or failed because the agent (or its setup) raised.
        timed_out: attempts the runner stopped at their ``timeout_seconds`` (reported ``timeout``).
        spans_written: spans the store acknowledged.
        span_write_errors: spans the exporter could not write (the store refused them or could not be reached).
        spans_dropped: spans never sent (the export queue was full).
    """

    succeeded: int = 0
    failed: int = 0
    timed_out: int = 0
    spans_written: int = 0
    span_write_errors: int = 0
    spans_dropped: int = 0


@dataclass
class _Slot:
    """One concurrent rollout slot: the attempt it runs now (for heartbeats)."""

    attempt: tuple[str, str] | None = None


SERVER_RETRY_MAX_S = 2.0
"""Longest wait between two tries while the server cannot be reached (a runner outlives a server restart)."""

REPORT_RETRY_S = 30.0
"""How long a runner retries an attempt's store calls while the server cannot be reached, when the rollout has no
lease (``unresponsive_seconds``); with one, it retries for the lease."""


NO_REWARD_ERROR: dict[str, Any] = {
    "type": NO_REWARD,
    "cause": NO_REWARD,
    "message": "the agent returned None and emitted no final reward: return a number (the reward), or call "
    "agentbolt.emit_reward(value) before returning",
}
"""The error of an attempt whose agent gave no final reward (reported ``failed``)."""


def _cause_of(exc: BaseException, type_name: str) -> str:
    """The failure cause of an attempt that ended with ``exc`` (for a child's error, its type's name)."""
    if isinstance(exc, RewardError):
        return BAD_REWARD
    if isinstance(exc, AgentSetupError) or type_name == AgentSetupError.__name__:
        return BAD_TASK
    return AGENT_EXCEPTION


def span_exporter_for(store: LightningStore, loop: asyncio.AbstractEventLoop) -> SpanExporter:
    """The exporter a runner uses for ``store``: OTLP/HTTP to the server behind an
    :class:`~agentbolt.client.HttpLightningStore` (with its bearer token), else a
    :class:`~agentbolt.tracing.export.StoreSpanExporter` writing into the in-process store on ``loop``."""
    if isinstance(store, HttpLightningStore):
        auth = store._headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        return otlp_exporter(store.base_url, token=token)
    return StoreSpanExporter(store, loop)


class Runner:
    """Executes an agent on rollouts claimed from ``store``.

    Args:
        agent: the agent (``@rollout`` function or ``LitAgent``).
        store: any store backend (in a separate process: :class:`~agentbolt.client.HttpLightningStore`).
        worker_id: name reported to the store (default: random ``runner-<hex>``).
        concurrency: rollouts run at once (sync agents each take a thread).
        poll_interval_s: sleep between claims when the queue is empty.
        heartbeat_interval_s: period of worker and attempt heartbeats.
        instrument: frameworks to instrument while the runner runs (:mod:`agentbolt.tracing.instrumentors`):
            ``True`` every one whose instrumentor and framework are installed, ``False`` none, or names (a named
            one that is not available makes :meth:`run` raise ``FrameworkUnavailable`` before any claim).
        span_exporter: where spans go (default: :func:`span_exporter_for` the store); shut down by :meth:`close`.
        span_flush_timeout_s: how long an attempt's end waits for its spans to be exported before reporting anyway.
        isolation: where a synchronous agent runs (:mod:`agentbolt.runner.isolation`): ``"process"``, a child
            process forked per attempt and killed at the attempt's timeout; ``"thread"``, a thread that is abandoned
            (left running) at the timeout. Default ``"thread"``: the agent shares the runner's memory, as a direct
            call would; runner processes started by a job or ``agentbolt run`` use ``"process"``. An ``async``
            agent always runs on the runner's loop and is cancelled at the timeout.

    Timeouts: an attempt whose rollout sets ``config.timeout_seconds`` is stopped by the runner when that many seconds
    have passed since its claim, reported ``timeout`` (``error.type == "timeout"``), and its slot takes the next
    rollout at once.

    Call :meth:`close` after using :meth:`run_attempt` directly (:meth:`run` closes by itself): it exports what is
    left, stops the export thread and releases the instrumentation.
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
        instrument: bool | str | Sequence[str] = True,
        span_exporter: SpanExporter | None = None,
        span_flush_timeout_s: float = 30.0,
        isolation: Isolation = "thread",
    ) -> None:
        if isolation not in ("process", "thread"):
            raise ConfigError(f"isolation must be 'process' or 'thread', got {isolation!r}")
        if isolation == "process" and not process_isolation_available():
            raise ConfigError("isolation='process' needs fork (POSIX); use isolation='thread' on this system")
        self.agent = agent
        self.isolation: Isolation = isolation
        self.store = store
        self.worker_id = worker_id or f"runner-{uuid.uuid4().hex[:8]}"
        self.concurrency = concurrency
        self.poll_interval_s = poll_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.instrument = instrument
        self.span_flush_timeout_s = span_flush_timeout_s
        self.stats = RunnerStats()
        self._span_exporter = span_exporter
        self._export: ExportQueue | None = None
        self._export_lock: asyncio.Lock | None = None  # made on the loop that first needs it
        self._frameworks: list[str] = []
        self._slots = [_Slot() for _ in range(concurrency)]
        self._logged_failures: set[tuple[str, str]] = set()

    async def run(self, stop: asyncio.Event | Callable[[], bool] | None = None) -> RunnerStats:
        """Run until ``stop`` is set (an ``asyncio.Event`` or a callable returning True), then :meth:`close`.

        Raises:
            FrameworkUnavailable: a framework named in ``instrument`` cannot be instrumented (before any claim).
            ConfigError: ``OTEL_SDK_DISABLED=true`` is set (nothing could be recorded; before any claim).
        """

        def stopped() -> bool:
            if stop is None:
                return False
            return stop.is_set() if isinstance(stop, asyncio.Event) else bool(stop())

        try:
            await self._tracing()  # a framework that cannot be instrumented fails here, before any claim
            await self.store.heartbeat(self.worker_id)
            beat = asyncio.create_task(self._heartbeat_loop(stopped))
            try:
                await asyncio.gather(*(self._slot_loop(slot, stopped) for slot in self._slots))
            finally:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat
        finally:
            await self.close()
        return self.stats

    async def close(self) -> None:
        """Export the spans still queued, stop the export thread, release the instrumented frameworks."""
        export, self._export = self._export, None
        self._export_lock = None
        if export is not None:
            if not await export.flush(self.span_flush_timeout_s):
                logger.warning("spans of runner %s were still being exported at close", self.worker_id)
            await asyncio.to_thread(export.shutdown)
        frameworks, self._frameworks = self._frameworks, []
        if frameworks:
            await asyncio.to_thread(instrumentors.release, frameworks)

    async def _tracing(self) -> ExportQueue:
        """The export queue, made (and the frameworks instrumented) on first use."""
        if self._export_lock is None:
            self._export_lock = asyncio.Lock()
        async with self._export_lock:
            if self._export is None:
                tracer_provider()  # fails here (ConfigError) when OpenTelemetry is disabled by the environment
                if self.instrument is not False and not self._frameworks:
                    wanted = None if self.instrument is True else self.instrument
                    self._frameworks = await asyncio.to_thread(instrumentors.acquire, wanted)
                exporter = self._span_exporter or span_exporter_for(self.store, asyncio.get_running_loop())
                self._export = ExportQueue(exporter, name=f"agentbolt-spans-{self.worker_id}")
            return self._export

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
        backoff_s = 0.0
        while not stopped():
            try:
                claimed = await self.store.claim_rollout(self.worker_id)
            except BackendError as exc:  # the server is down or restarting: wait for it, do not exit
                if backoff_s == 0.0:
                    logger.warning("runner %s cannot claim, retrying until the server answers: %s", self.worker_id, exc)
                backoff_s = min(max(2 * backoff_s, self.poll_interval_s, 0.1), SERVER_RETRY_MAX_S)
                await asyncio.sleep(backoff_s)
                continue
            if backoff_s:
                logger.warning("runner %s reaches the server again", self.worker_id)
                backoff_s = 0.0
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
        """Run the agent on one claimed attempt and report its end state. Never raises for agent errors.

        The agent is stopped at the rollout's ``timeout_seconds`` (counted from now) and the attempt reported
        ``timeout``; see the class docstring.

        Raises:
            FrameworkUnavailable: on the first attempt, a framework named in ``instrument`` cannot be instrumented.
        """
        slot = slot or _Slot()
        rollout, attempt = claimed.rollout, claimed.attempt
        export = await self._tracing()
        slot.attempt = (rollout.rollout_id, attempt.attempt_id)
        ctx = AttemptContext(rollout.rollout_id, attempt.attempt_id, export=export)
        deadline = None
        if rollout.config.timeout_seconds is not None:  # counted from the store's start of the attempt
            elapsed = min(max(0.0, time.time() - (attempt.start_time or time.time())), rollout.config.timeout_seconds)
            deadline = time.monotonic() + rollout.config.timeout_seconds - elapsed
        try:
            resources = await self._retrying(claimed, lambda: self._resources(claimed))
            await self._retrying(
                claimed,
                lambda: self.store.update_attempt(rollout.rollout_id, attempt.attempt_id, AttemptStatus.RUNNING),
            )
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            returned = await self._call_agent(ctx, rollout.input, resources, claimed, left)
            reward = returned_reward(returned)  # RewardError (a bad_reward failure) for a string, NaN, an object
            if reward is not None:
                with attempt_scope(ctx):
                    emit_reward(reward)
            else:
                reward = last_reward(ctx.spans)
            await self._finish_spans(ctx, export)
            if reward is None:
                await self._report_end(claimed, AttemptStatus.FAILED, NO_REWARD_ERROR)
                self.stats.failed += 1
                self._log_failure(attempt.attempt_id, NO_REWARD, NO_REWARD, NO_REWARD_ERROR["message"])
                return
            try:
                await self._retrying(
                    claimed,
                    lambda: self.store.update_attempt(
                        rollout.rollout_id, attempt.attempt_id, AttemptStatus.SUCCEEDED, final_reward=reward
                    ),
                )
            except BackendError as exc:  # the server stayed unreachable: not the agent's failure; the lease ends it
                logger.warning("could not report the success of %s: %r", attempt.attempt_id, exc)
                return
            except InvalidTransitionError as exc:  # ended meanwhile (its lease, a cancel, or a retried report)
                logger.info("the success of %s was not recorded: %s", attempt.attempt_id, exc)
                return
            self.stats.succeeded += 1
        except AgentTimeout as exc:
            with attempt_scope(ctx):
                emit_exception(exc)
            await self._finish_spans(ctx, export)
            await self._report_end(claimed, AttemptStatus.TIMEOUT, timeout_error(exc, self.worker_id))
            self.stats.timed_out += 1
            self._log_failure(attempt.attempt_id, "timeout", "timeout", str(exc))
        except Exception as exc:
            if isinstance(exc, RemoteAgentError):  # the child recorded the exception span itself
                error = {"type": exc.type_name, "message": exc.message, "traceback": exc.traceback_text}
            else:
                with attempt_scope(ctx):
                    emit_exception(exc)
                error = {
                    "type": type(exc).__name__,
                    "message": describe_exception(exc),
                    "traceback": traceback.format_exc(),
                }
            error["cause"] = _cause_of(exc, error["type"])
            await self._finish_spans(ctx, export)
            await self._report_end(claimed, AttemptStatus.FAILED, error)
            self.stats.failed += 1
            self._log_failure(attempt.attempt_id, error["cause"], error["type"], f"{error['type']}: {error['message']}")
        finally:
            slot.attempt = None

    def _log_failure(self, attempt_id: str, cause: str, kind: str, message: str) -> None:
        """Log a failed attempt: the first of each (cause, type) as a warning, the others at debug level (a job's
        step line counts them all, so the terminal is not flooded)."""
        if (cause, kind) in self._logged_failures:
            logger.debug("attempt %s failed (%s): %s", attempt_id, cause, message)
            return
        self._logged_failures.add((cause, kind))
        logger.warning(
            "attempt %s failed (%s): %s [further %s failures of this runner are logged at debug level]",
            attempt_id,
            cause,
            message,
            cause,
        )

    async def _retrying(self, claimed: AttemptedRollout, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, tried again while the server cannot be reached (``BackendError``: a restart), for at most the
        attempt's lease (``unresponsive_seconds``, else :data:`REPORT_RETRY_S`); then the last error is raised.

        So a server restart during an attempt neither loses its result nor names it the agent's failure. A retried
        write that had gone through before the connection broke is refused as a conflict, as a late write would be.
        """
        window_s = claimed.rollout.config.unresponsive_seconds or REPORT_RETRY_S
        deadline = time.monotonic() + window_s
        backoff_s = 0.2
        while True:
            try:
                return await call()
            except BackendError as exc:
                if time.monotonic() + backoff_s > deadline:
                    raise
                logger.warning("store call of attempt %s failed, retrying: %r", claimed.attempt.attempt_id, exc)
                await asyncio.sleep(backoff_s)
                backoff_s = min(2 * backoff_s, SERVER_RETRY_MAX_S)

    async def _report_end(self, claimed: AttemptedRollout, status: AttemptStatus, error: dict[str, Any]) -> None:
        """Report a failed or timed-out attempt; a refusal (e.g. the store already expired it) is only logged."""
        rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        try:
            await self._retrying(
                claimed, lambda: self.store.update_attempt(rollout_id, attempt_id, status, error=error)
            )
        except InvalidTransitionError as report_exc:  # the store ended it first (its own lease check, a cancel)
            logger.info("%s of %s not reported: %s", status.value, claimed.attempt.attempt_id, report_exc)
        except Exception as report_exc:
            logger.warning("could not report %s of %s: %r", status.value, claimed.attempt.attempt_id, report_exc)

    async def _call_agent(
        self,
        ctx: AttemptContext,
        task: Any,
        resources: Mapping[str, Resource],
        claimed: AttemptedRollout,
        timeout_s: float | None,
    ) -> Any:
        """The agent's return value; raises what the agent raised, or AgentTimeout past ``timeout_s`` seconds."""
        if self.agent.is_async:

            async def on_loop() -> Any:
                with attempt_scope(ctx):
                    result = self.agent.rollout(task, resources, claimed.rollout)
                    return await result if isinstance(result, Awaitable) else result

            limit = asyncio.timeout(timeout_s)
            try:
                async with limit:
                    return await on_loop()
            except TimeoutError:
                if not limit.expired():  # the agent's own TimeoutError
                    raise
                raise AgentTimeout(timeout_s or 0.0, "cancelled") from None

        def call() -> Any:
            return self.agent.rollout(task, resources, claimed.rollout)

        if self.isolation == "process":
            return await run_in_child(call, ctx, self._write_child_spans, timeout_s)
        return await run_in_thread(call, ctx, timeout_s)

    async def _write_child_spans(self, spans: list[Span]) -> None:
        """Write spans a child process sent back (process isolation); failures are counted, never raised."""
        try:
            await self.store.add_spans(spans)
            self.stats.spans_written += len(spans)
        except Exception as exc:
            self.stats.span_write_errors += len(spans)
            logger.warning("could not write %d spans of attempt %s: %r", len(spans), spans[0].attempt_id, exc)

    async def _finish_spans(self, ctx: AttemptContext, export: ExportQueue) -> None:
        """Wait until the attempt's spans are exported; count what was written, failed or dropped."""
        if not await export.flush(self.span_flush_timeout_s):
            logger.warning(
                "spans of attempt %s were still being exported after %.0f s; reporting the attempt anyway",
                ctx.attempt_id,
                self.span_flush_timeout_s,
            )
        counts = export.take_attempt_counts(ctx.attempt_id)
        self.stats.spans_written += counts.exported
        self.stats.span_write_errors += counts.failed
        self.stats.spans_dropped += counts.dropped
        open_spans = span_router().forget(ctx)
        if open_spans:
            logger.info("attempt %s ended with %d spans never ended; they are not recorded", ctx.attempt_id, open_spans)
