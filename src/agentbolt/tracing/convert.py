"""OpenTelemetry SDK span -> :class:`agentbolt.types.Span`, the same span the OTLP receiver would store.

A span that reaches the store in-process (``store.add_spans``) must not differ from the same span sent over
OTLP/HTTP and decoded by :mod:`agentbolt.server.otlp`, so this mirrors the receiver's rules:

- ids as lowercase hex (trace 32 characters, span and parent 16); no parent -> ``parent_id=None``;
- times: integer nanoseconds / 10^9 -> float epoch seconds (an unset end time -> ``None``);
- attributes as JSON values (OpenTelemetry's tuples become lists);
- instrumentation scope -> ``otel.scope.name`` / ``otel.scope.version``, kind other than ``INTERNAL`` ->
  ``agentbolt.otlp.span_kind``, resource attributes -> ``agentbolt.otlp.resource``, events -> ``agentbolt.otlp.events``,
  links -> ``agentbolt.otlp.links`` (each only when present);
- status -> ``UNSET``/``OK``/``ERROR`` with its description (``None`` when empty).

``tests/integration/test_tracing_runner.py`` checks that both paths store equal spans.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue

from agentbolt import semconv
from agentbolt.types import Span, SpanStatus

_NS_PER_S = 1_000_000_000  # int / int is correctly rounded, as in agentbolt.server.otlp


def attribute_to_json(value: AttributeValue | Any) -> Any:
    """One OpenTelemetry attribute value as JSON (sequences become lists)."""
    if isinstance(value, tuple | list):
        return [attribute_to_json(v) for v in value]
    return value


def attributes_to_json(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """OpenTelemetry attributes as a JSON dict (``None`` -> ``{}``)."""
    if not attributes:
        return {}
    return {key: attribute_to_json(value) for key, value in attributes.items()}


def attempt_of(span: ReadableSpan) -> tuple[str, str] | None:
    """``(rollout_id, attempt_id)`` from the span's ``agentbolt.*`` attributes (then its resource's), or ``None``."""
    span_attrs = span.attributes or {}
    resource_attrs = span.resource.attributes if span.resource is not None else {}
    found: list[str] = []
    for key in (semconv.ROLLOUT_ID, semconv.ATTEMPT_ID):
        value = span_attrs.get(key, resource_attrs.get(key))
        if not isinstance(value, str) or not value:
            return None
        found.append(value)
    return found[0], found[1]


def span_from_otel(span: ReadableSpan, rollout_id: str | None = None, attempt_id: str | None = None) -> Span:
    """Convert a finished SDK span (rules in the module docstring).

    Args:
        span: a finished span (``end_time`` may be unset for a span converted early).
        rollout_id / attempt_id: the attempt; when omitted, read from the span's ``agentbolt.rollout_id`` /
            ``agentbolt.attempt_id`` attributes (or its resource's).

    Raises:
        ValueError: the span has no valid context, or no attempt was given and its attributes name none.
    """
    context = span.context
    if context is None or not context.is_valid:
        raise ValueError(f"span {span.name!r} has no valid span context")
    if rollout_id is None or attempt_id is None:
        found = attempt_of(span)
        if found is None:
            raise ValueError(
                f"span {span.name!r} names no attempt: set {semconv.ROLLOUT_ID!r} and {semconv.ATTEMPT_ID!r}"
            )
        rollout_id, attempt_id = found
    attributes = attributes_to_json(span.attributes)
    scope = span.instrumentation_scope
    if scope is not None and scope.name:
        attributes[semconv.OTEL_SCOPE_NAME] = scope.name
    if scope is not None and scope.version:
        attributes[semconv.OTEL_SCOPE_VERSION] = scope.version
    resource_attrs = attributes_to_json(span.resource.attributes) if span.resource is not None else {}
    if resource_attrs:
        attributes[semconv.OTLP_RESOURCE] = resource_attrs
    if span.kind is not SpanKind.INTERNAL:
        attributes[semconv.OTLP_SPAN_KIND] = span.kind.name
    if span.events:
        attributes[semconv.OTLP_EVENTS] = [
            {"name": e.name, "time": e.timestamp / _NS_PER_S, "attributes": attributes_to_json(e.attributes)}
            for e in span.events
        ]
    if span.links:
        attributes[semconv.OTLP_LINKS] = [
            {
                "trace_id": format(link.context.trace_id, "032x"),
                "span_id": format(link.context.span_id, "016x"),
                "attributes": attributes_to_json(link.attributes),
            }
            for link in span.links
        ]
    parent = span.parent
    status = span.status
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        span_id=format(context.span_id, "016x"),
        trace_id=format(context.trace_id, "032x"),
        parent_id=format(parent.span_id, "016x") if parent is not None and parent.is_valid else None,
        name=span.name,
        start_time=(span.start_time or 0) / _NS_PER_S,
        end_time=span.end_time / _NS_PER_S if span.end_time else None,
        attributes=attributes,
        status=SpanStatus(code=status.status_code.name, description=status.description or None),
    )
