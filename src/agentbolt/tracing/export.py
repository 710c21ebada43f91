"""Exporting the spans of attempts to the store: a prompt export queue, and the two ways into a store.

:class:`ExportQueue` is the span processor the runner gives each attempt (``AttemptContext.export``). It differs
from the SDK's ``BatchSpanProcessor`` on purpose:

- **Prompt.** A span is exported as soon as it ends (spans that end while an export is in flight go out together
  in the next one), not after a schedule delay. The store numbers spans in arrival order, and the adapter attaches
  each reward to the latest LLM call recorded before it by the gateway; a reward held back for seconds would arrive
  after the agent's next LLM call and be credited to the wrong call. What remains is a race of one local export
  (milliseconds) against the next LLM round trip.
- **Flush with a deadline and a result.** :meth:`ExportQueue.flush` resolves once every span queued before the
  call has been handed to the exporter, and the counts of :meth:`ExportQueue.take_attempt_counts` say how many of
  an attempt's spans were exported, failed or dropped, so a runner reports losses instead of guessing.
- **Per attempt.** Each export call carries the spans of one attempt, in the order they ended, so a store error for
  one attempt (e.g. it was already superseded) does not take the spans of another with it.

The agent never waits: ``on_end`` appends to a bounded queue (``max_queue_size``; beyond it spans are dropped and
counted) and wakes one background thread, which does the network I/O.

Exporters: :func:`otlp_exporter` is the standard OTLP/HTTP exporter posting protobuf to ``<server>/v1/traces`` of
an ``agentbolt serve`` (the runner uses it for an :class:`~agentbolt.client.HttpLightningStore`);
:class:`StoreSpanExporter` converts spans with :func:`agentbolt.tracing.convert.span_from_otel` and calls
``add_spans`` of a store that lives in this process (memory, sqlite, postgres), on the store's event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from agentbolt import semconv
from agentbolt.tracing.convert import attempt_of, span_from_otel
from agentbolt.types import Span

logger = logging.getLogger(__name__)

OTLP_TRACES_PATH = "/v1/traces"


@dataclass
class SpanCounts:
    """What happened to the spans of one attempt: ``exported`` (acknowledged by the store), ``failed`` (the
    exporter reported a failure or raised), ``dropped`` (the queue was full or already shut down)."""

    exported: int = 0
    failed: int = 0
    dropped: int = 0


class ExportQueue(SpanProcessor):
    """Exports finished spans on one background thread as soon as they end (see the module docstring).

    Args:
        exporter: where the spans go; called from the background thread only, one attempt per call.
        max_queue_size: spans waiting at most; more are dropped (counted, and logged once per attempt).
        max_batch_size: spans per export call at most.
        name: name of the background thread.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int = 65_536,
        max_batch_size: int = 512,
        name: str = "agentbolt-span-export",
    ) -> None:
        if max_queue_size < 1 or max_batch_size < 1:
            raise ValueError(f"max_queue_size and max_batch_size must be >= 1, got {max_queue_size}, {max_batch_size}")
        self.exporter = exporter
        self.max_queue_size = max_queue_size
        self.max_batch_size = max_batch_size
        self._name = name
        self._cond = threading.Condition()
        self._queue: deque[ReadableSpan] = deque()
        self._queued_total = 0  # spans ever accepted into the queue
        self._handled_total = 0  # of those, spans the exporter has finished with (exported or failed)
        self._waiters: list[tuple[int, concurrent.futures.Future[None]]] = []
        self._counts: dict[str, SpanCounts] = {}
        self._thread: threading.Thread | None = None
        self._shutdown = False
        self.totals = SpanCounts()
        """Counts over every attempt since the queue was made."""

    # ------------------------------------------------------------------ SpanProcessor
    def on_start(self, span: SdkSpan, parent_context: object = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        attempt_id = _attempt_id(span)
        with self._cond:
            if self._shutdown or len(self._queue) >= self.max_queue_size:
                counts = self._counts.setdefault(attempt_id, SpanCounts())
                if counts.dropped == 0:
                    reason = "the exporter is shut down" if self._shutdown else f"{self.max_queue_size} spans wait"
                    logger.warning("dropping spans of attempt %s: %s", attempt_id, reason)
                counts.dropped += 1
                self.totals.dropped += 1
                return
            self._queue.append(span)
            self._queued_total += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Block until every span queued before the call is exported (or failed); False on timeout."""
        try:
            self.flush_future().result(timeout=timeout_millis / 1000)
        except concurrent.futures.TimeoutError:
            return False
        return True

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Export what is queued (up to ``timeout_s``), stop the thread, shut the exporter down. Blocks."""
        with self._cond:
            if self._shutdown:
                return
            self._shutdown = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                logger.warning("span export did not finish within %.0f s of shutdown", timeout_s)
        self.exporter.shutdown()

    # ------------------------------------------------------------------ flushing and counts
    def flush_future(self) -> concurrent.futures.Future[None]:
        """A future that resolves once every span queued before this call has been handed to the exporter."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._cond:
            target = self._queued_total
            if self._handled_total >= target:
                future.set_result(None)
            else:
                self._waiters.append((target, future))
        return future

    async def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait, without blocking the event loop, for :meth:`flush_future`; False after ``timeout_s``."""
        try:
            await asyncio.wait_for(asyncio.wrap_future(self.flush_future()), timeout_s)
        except TimeoutError:
            return False
        return True

    def take_attempt_counts(self, attempt_id: str) -> SpanCounts:
        """The counts of ``attempt_id`` so far, forgetting them (spans that end later start a new count)."""
        with self._cond:
            return self._counts.pop(attempt_id, SpanCounts())

    # ------------------------------------------------------------------ worker
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._shutdown:
                    self._cond.wait()
                if not self._queue:
                    return  # shut down and drained
                batch = [self._queue.popleft() for _ in range(min(self.max_batch_size, len(self._queue)))]
            results = self._export(batch)
            with self._cond:
                for attempt_id, (n, ok) in results.items():
                    counts = self._counts.setdefault(attempt_id, SpanCounts())
                    if ok:
                        counts.exported += n
                        self.totals.exported += n
                    else:
                        counts.failed += n
                        self.totals.failed += n
                self._handled_total += len(batch)
                ready = [f for target, f in self._waiters if target <= self._handled_total]
                self._waiters = [(t, f) for t, f in self._waiters if t > self._handled_total]
            for future in ready:
                # a waiter that timed out may have cancelled its future meanwhile
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_result(None)

    def _export(self, batch: list[ReadableSpan]) -> dict[str, tuple[int, bool]]:
        groups: dict[str, list[ReadableSpan]] = {}
        for span in batch:
            groups.setdefault(_attempt_id(span), []).append(span)
        results: dict[str, tuple[int, bool]] = {}
        token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))  # the export's own HTTP calls are not traced
        try:
            for attempt_id, spans in groups.items():
                try:
                    ok = self.exporter.export(spans) is SpanExportResult.SUCCESS
                except Exception:
                    logger.exception("exporting %d spans of attempt %s raised", len(spans), attempt_id)
                    ok = False
                if not ok:
                    logger.warning("%d spans of attempt %s were not stored", len(spans), attempt_id)
                results[attempt_id] = (len(spans), ok)
        finally:
            detach(token)
        return results


def _attempt_id(span: ReadableSpan) -> str:
    value = (span.attributes or {}).get(semconv.ATTEMPT_ID)
    return value if isinstance(value, str) else ""


class SpanWriter(Protocol):
    """What :class:`StoreSpanExporter` needs of a store: the contract's ``add_spans`` (every backend has it)."""

    async def add_spans(self, spans: Sequence[Span]) -> Any: ...


class StoreSpanExporter(SpanExporter):
    """A ``SpanExporter`` that writes spans into a store living in this process, on the store's event loop.

    Args:
        store: any store backend; its coroutines run on ``loop``.
        loop: the running event loop that owns the store (the runner's loop).
        timeout_s: how long one ``add_spans`` may take before the export counts as failed.

    ``export`` must be called from another thread than ``loop``'s (the :class:`ExportQueue` thread is one); on the
    loop's own thread it would wait on itself, so it fails at once instead. Spans that name no attempt fail.
    """

    def __init__(self, store: SpanWriter, loop: asyncio.AbstractEventLoop, *, timeout_s: float = 30.0) -> None:
        self.store = store
        self.loop = loop
        self.timeout_s = timeout_s

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.loop.is_closed():
            logger.warning("cannot store %d spans: the store's event loop is closed", len(spans))
            return SpanExportResult.FAILURE
        try:
            if asyncio.get_running_loop() is self.loop:
                logger.error("StoreSpanExporter.export was called on the store's own event loop; use an ExportQueue")
                return SpanExportResult.FAILURE
        except RuntimeError:
            pass  # no loop in this thread: the normal case
        groups: dict[tuple[str, str], list[ReadableSpan]] = {}
        for span in spans:
            found = attempt_of(span)
            if found is None:
                logger.warning("span %r names no attempt (%s); not stored", span.name, semconv.ATTEMPT_ID)
                return SpanExportResult.FAILURE
            groups.setdefault(found, []).append(span)
        ok = True
        for (rollout_id, attempt_id), group in groups.items():
            converted = [span_from_otel(s, rollout_id, attempt_id) for s in group]
            future = asyncio.run_coroutine_threadsafe(self.store.add_spans(converted), self.loop)
            try:
                future.result(timeout=self.timeout_s)
            except Exception as exc:
                future.cancel()
                logger.warning("store refused %d spans of attempt %s: %r", len(group), attempt_id, exc)
                ok = False
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def otlp_exporter(base_url: str, *, token: str | None = None, timeout_s: float = 10.0) -> SpanExporter:
    """The OpenTelemetry OTLP/HTTP (protobuf) exporter to ``<base_url>/v1/traces`` of an agentbolt server.

    Args:
        base_url: server root, e.g. ``http://127.0.0.1:8765``.
        token: bearer token, when the server requires one.
        timeout_s: per-request timeout (the exporter retries transient errors within it).
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    headers = {"Authorization": f"Bearer {token}"} if token else None
    return OTLPSpanExporter(endpoint=base_url.rstrip("/") + OTLP_TRACES_PATH, headers=headers, timeout=timeout_s)
