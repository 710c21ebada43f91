"""agentbolt's OpenTelemetry SDK setup: one tracer provider per process that routes spans to their attempt.

:func:`tracer_provider` creates, once per process, an SDK ``TracerProvider`` with three agentbolt parts:

- :class:`AttemptSampler` records a span only when it starts inside an attempt (an :class:`AttemptContext` is bound,
  see :mod:`agentbolt.tracing.context`) or under a parent span of an attempt; every other span is dropped
  (non-recording), so instrumented code outside a runner costs next to nothing and records nothing.
- :class:`AttemptIdGenerator` gives every root span of an attempt the attempt's ``trace_id``, so all the spans of
  one attempt form one trace without an artificial root span.
- :class:`AttemptSpanRouter` (a ``SpanProcessor``) stamps ``agentbolt.rollout_id`` / ``agentbolt.attempt_id``
  onto each span when it starts (that is what the OTLP receiver and the store read), and when it ends hands it to
  its attempt (:meth:`AttemptContext.finished`: kept in memory, and passed to the attempt's exporter). It never
  blocks.

If no global OpenTelemetry tracer provider has been set, this one becomes the global provider, so libraries that
use ``opentelemetry.trace.get_tracer`` directly are captured inside attempts. If the application already set its
own, that one is left alone: agentbolt's spans and those of the instrumentors enabled by
:func:`agentbolt.tracing.instrument` still go to agentbolt's provider (they are given it explicitly), while spans
of libraries using the global provider go to the application's. To send agentbolt's spans somewhere else too (a
Phoenix or Jaeger collector), add a processor: ``tracer_provider().add_span_processor(...)``.

Span limits: up to 4096 attributes per span (OpenInference flattens chat messages into many keys; the SDK default
of 128 would drop some), no limit on attribute length.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, Tracer
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from agentbolt import __version__, semconv
from agentbolt.errors import ConfigError
from agentbolt.tracing.context import AttemptContext, current_attempt

logger = logging.getLogger(__name__)

TRACER_NAME = "agentbolt"
"""Instrumentation scope name of the spans agentbolt itself records (``emit_*``, ``@operation``)."""
SERVICE_NAME = "agentbolt-agent"
"""Default ``service.name`` of the provider's resource (``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` win)."""
MAX_SPAN_ATTRIBUTES = 4096


class AttemptSpanRouter(SpanProcessor):
    """Stamps each attempt span with its attempt's ids at start, and hands it to its attempt at end.

    The attempt of a starting span is the bound :class:`AttemptContext`, else the attempt of its parent span (a
    span started in a thread that did not inherit the context, under a parent that did).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, AttemptContext] = {}

    def attempt_for(self, parent_context: Context | None) -> AttemptContext | None:
        """The attempt a span starting now under ``parent_context`` belongs to, or ``None``."""
        ctx = current_attempt()
        if ctx is not None:
            return ctx
        parent = trace.get_current_span(parent_context).get_span_context()
        if not parent.is_valid:
            return None
        with self._lock:
            return self._live.get(parent.span_id)

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        ctx = self.attempt_for(parent_context)
        if ctx is None or span.context is None:
            return
        span.set_attribute(semconv.ROLLOUT_ID, ctx.rollout_id)
        span.set_attribute(semconv.ATTEMPT_ID, ctx.attempt_id)
        with self._lock:
            self._live[span.context.span_id] = ctx

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None:
            return
        with self._lock:
            ctx = self._live.pop(span.context.span_id, None)
        if ctx is None:
            return
        try:
            ctx.finished(span)
        except Exception:  # recording must never break the agent
            logger.exception("agentbolt could not record span %r of attempt %s", span.name, ctx.attempt_id)

    def forget(self, ctx: AttemptContext) -> int:
        """Drop the spans of ``ctx`` that started and never ended (the attempt is over); returns how many."""
        with self._lock:
            stale = [span_id for span_id, owner in self._live.items() if owner is ctx]
            for span_id in stale:
                del self._live[span_id]
        return len(stale)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class AttemptSampler(Sampler):
    """Record and sample spans of an attempt (see :class:`AttemptSpanRouter`); drop every other span."""

    def __init__(self, router: AttemptSpanRouter) -> None:
        self._router = router

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        state = parent.trace_state if parent.is_valid else trace_state
        if self._router.attempt_for(parent_context) is None:
            return SamplingResult(Decision.DROP, None, state)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, state)

    def get_description(self) -> str:
        return "AgentboltAttemptSampler"


class AttemptIdGenerator(IdGenerator):
    """Random span ids; the bound attempt's ``trace_id`` for root spans inside an attempt, random outside."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        return self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        ctx = current_attempt()
        if ctx is not None:
            try:
                return int(ctx.trace_id, 16)
            except ValueError:
                logger.warning("attempt %s: malformed trace_id %r, using a random one", ctx.attempt_id, ctx.trace_id)
        return self._random.generate_trace_id()


_setup_lock = threading.Lock()
_provider: TracerProvider | None = None
_router: AttemptSpanRouter | None = None
_tracer: Tracer | None = None


def tracer_provider() -> TracerProvider:
    """agentbolt's tracer provider for this process, created on first use (see the module docstring).

    Also installs it as the global OpenTelemetry tracer provider when none was set before.

    Raises:
        ConfigError: ``OTEL_SDK_DISABLED=true`` is set (the SDK would record nothing, rewards included).
    """
    global _provider, _router
    with _setup_lock:
        if _provider is not None:
            return _provider
        if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            raise ConfigError(
                "OTEL_SDK_DISABLED=true turns OpenTelemetry off, and with it everything agentbolt records on the "
                "agent side (rewards included); unset it in the runner's environment"
            )
        router = AttemptSpanRouter()
        provider = TracerProvider(
            sampler=AttemptSampler(router),
            resource=Resource.create({"service.name": SERVICE_NAME}),
            id_generator=AttemptIdGenerator(),
            span_limits=SpanLimits(max_span_attributes=MAX_SPAN_ATTRIBUTES),
        )
        provider.add_span_processor(router)
        _provider, _router = provider, router
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    else:
        logger.info(
            "a global OpenTelemetry tracer provider is already set; agentbolt keeps its own, and records spans of "
            "libraries that use the global one only if they are given agentbolt.tracing.tracer_provider()"
        )
    return provider


def span_router() -> AttemptSpanRouter:
    """The router of :func:`tracer_provider` (created with it)."""
    tracer_provider()
    assert _router is not None
    return _router


def agentbolt_tracer() -> Tracer:
    """The tracer agentbolt records its own spans with (scope ``agentbolt``, the package version)."""
    global _tracer
    if _tracer is None:
        _tracer = tracer_provider().get_tracer(TRACER_NAME, __version__)
    return _tracer
