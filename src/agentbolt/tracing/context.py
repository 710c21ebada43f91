"""The attempt context: which attempt the current code runs under, and where its spans go.

The runner opens one :class:`AttemptContext` per attempt and binds it to a ``contextvars`` variable with
:func:`attempt_scope`, so that every span started while it is bound (by ``emit_*``, ``@operation`` or an
instrumented framework) belongs to that attempt. The binding follows the code into coroutines, tasks and threads
started with a copy of the context (``asyncio.to_thread``, ``contextvars.copy_context().run``); a thread started
without one (a plain ``threading.Thread`` or a ``ThreadPoolExecutor``) does not see it, and what it records is not
attributed to any attempt. A span whose parent belongs to an attempt belongs to that attempt too, wherever it starts.

When a span of the attempt ends, agentbolt's span processor (:mod:`agentbolt.tracing.otel`) turns it into an
:class:`agentbolt.types.Span`, appends it to :attr:`AttemptContext.spans` and hands the OpenTelemetry span to
:attr:`AttemptContext.export`, the runner's exporter to the store. Neither step waits on the network.

Binding a context outside a runner works too: the spans are then only collected in :attr:`AttemptContext.spans`
(see :func:`agentbolt.runner.local.trace_attempt` for the debugging helper built on this).
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentbolt.types import Span

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
    from opentelemetry.trace import Tracer


def new_span_id() -> str:
    """A random 64-bit OpenTelemetry span id as 16 hex characters."""
    return os.urandom(8).hex()


def new_trace_id() -> str:
    """A random 128-bit OpenTelemetry trace id as 32 hex characters."""
    return os.urandom(16).hex()


@dataclass(eq=False)
class AttemptContext:
    """The spans of one attempt, and where they go.

    Attributes:
        rollout_id / attempt_id: the attempt; every span recorded under this context carries them as the span
            attributes ``agentbolt.rollout_id`` / ``agentbolt.attempt_id``.
        trace_id: the OpenTelemetry trace id (32 hex characters) of every root span started under this context, so
            that all spans of the attempt form one trace.
        export: an OpenTelemetry ``SpanProcessor`` that receives each finished span of the attempt (the runner's
            exporter to the store); ``None`` keeps the spans in memory only. Its ``on_end`` must not block.
        spans: every finished span of the attempt, converted, in the order the spans ended (thread-safe to read
            after the attempt; while it runs, take a copy with ``list(ctx.spans)``).
    """

    rollout_id: str
    attempt_id: str
    trace_id: str = field(default_factory=new_trace_id)
    export: SpanProcessor | None = None
    spans: list[Span] = field(default_factory=list)
    _by_span_id: dict[str, Span] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def tracer(self) -> Tracer:
        """agentbolt's OpenTelemetry tracer (from :func:`agentbolt.tracing.otel.tracer_provider`)."""
        from agentbolt.tracing.otel import agentbolt_tracer

        return agentbolt_tracer()

    def span(self, span_id: str) -> Span | None:
        """The finished span with this id (16 hex characters), or ``None`` when no such span has ended here."""
        with self._lock:
            return self._by_span_id.get(span_id)

    def finished(self, otel_span: ReadableSpan) -> Span:
        """Record a finished OpenTelemetry span of this attempt (called by agentbolt's span processor).

        Converts it with :func:`agentbolt.tracing.convert.span_from_otel`, appends it to :attr:`spans` and hands
        the original to :attr:`export`. Returns the converted span.
        """
        from agentbolt.tracing.convert import span_from_otel

        span = span_from_otel(otel_span, self.rollout_id, self.attempt_id)
        with self._lock:
            self.spans.append(span)
            self._by_span_id[span.span_id] = span
        if self.export is not None:
            self.export.on_end(otel_span)
        return span


_current: contextvars.ContextVar[AttemptContext | None] = contextvars.ContextVar(
    "agentbolt_attempt_context", default=None
)


def current_attempt() -> AttemptContext | None:
    """The attempt the caller runs under, or ``None`` outside any attempt."""
    return _current.get()


@contextmanager
def attempt_scope(ctx: AttemptContext) -> Iterator[AttemptContext]:
    """Bind ``ctx`` as the current attempt for the ``with`` block (nesting restores the outer one at exit).

    Usable outside a runner: spans recorded in the block are collected in ``ctx.spans``.
    """
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
