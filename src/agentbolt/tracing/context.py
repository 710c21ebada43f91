"""The attempt context: which attempt the current code runs under, and where its spans go.

The runner opens one :class:`AttemptContext` per attempt and binds it to a ``contextvars`` variable, so that
``emit_reward`` called anywhere inside the agent (threads started with ``contextvars.copy_context`` included) knows
its attempt. Spans are handed to a sink callback that must not block (the runner's sink schedules the store write
on its event loop and returns at once).
"""

from __future__ import annotations

import contextvars
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from agentbolt.types import Span

SpanSink = Callable[[Span], None]


def new_span_id() -> str:
    """A random 64-bit OpenTelemetry span id as 16 hex characters."""
    return os.urandom(8).hex()


def new_trace_id() -> str:
    """A random 128-bit OpenTelemetry trace id as 32 hex characters."""
    return os.urandom(16).hex()


@dataclass
class AttemptContext:
    """Where the spans of one attempt go.

    Attributes:
        rollout_id / attempt_id: the attempt.
        trace_id: the OpenTelemetry trace id shared by all its spans.
        sink: called with each finished span; must return without waiting on the network.
        spans: every span emitted through this context (kept for the runner and for local debugging).
    """

    rollout_id: str
    attempt_id: str
    sink: SpanSink | None = None
    trace_id: str = field(default_factory=new_trace_id)
    spans: list[Span] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, name: str, attributes: dict[str, object], start_time: float | None = None) -> Span:
        """Build a span of this attempt, remember it and hand it to the sink."""
        now = time.time()
        span = Span(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            span_id=new_span_id(),
            trace_id=self.trace_id,
            name=name,
            start_time=start_time if start_time is not None else now,
            end_time=now,
            attributes=dict(attributes),
        )
        with self._lock:
            self.spans.append(span)
        if self.sink is not None:
            self.sink(span)
        return span


_current: contextvars.ContextVar[AttemptContext | None] = contextvars.ContextVar(
    "agentbolt_attempt_context", default=None
)


def current_attempt() -> AttemptContext | None:
    """The attempt the caller runs under, or ``None`` outside a runner."""
    return _current.get()


@contextmanager
def attempt_scope(ctx: AttemptContext) -> Iterator[AttemptContext]:
    """Bind ``ctx`` as the current attempt for the ``with`` block (usable outside a runner, for debugging)."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
