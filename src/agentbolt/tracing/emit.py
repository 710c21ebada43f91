"""Agent-side recording API: ``emit_reward``, ``emit_message``, ``emit_object``, ``emit_exception``.

Each call records one OpenTelemetry span of the current attempt, started and ended at once, as a child of the
current span (an ``@operation``, or a framework span from an instrumentor), so it lands where it happened in the
trace. None of them waits on the network: the span is handed to the attempt's exporter, which writes it in the
background. Outside an attempt they record nothing and log one warning per function, so an agent runs unchanged
outside a runner (use :func:`agentbolt.runner.local.trace_attempt` to see what it would record).

Span names and attribute keys are in :mod:`agentbolt.semconv`. Extra ``attributes`` must be OpenTelemetry
attribute values (str, bool, int, float, or a list of one of these); other values are dropped by OpenTelemetry
with a warning.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping

from opentelemetry.trace import Status, StatusCode
from opentelemetry.util.types import AttributeValue

from agentbolt import semconv
from agentbolt.errors import ConfigError
from agentbolt.tracing.context import current_attempt
from agentbolt.tracing.serialize import DEFAULT_LIMITS, JsonLimits, to_json_text
from agentbolt.types import Span
from agentbolt.types.rewards import coerce_reward

logger = logging.getLogger(__name__)
_warned_outside: set[str] = set()

Attributes = Mapping[str, AttributeValue]


def _record(
    function: str,
    span_name: str,
    attributes: dict[str, AttributeValue],
    extra: Attributes | None,
    status: Status | None = None,
) -> Span | None:
    ctx = current_attempt()
    if ctx is None:
        if function not in _warned_outside:
            _warned_outside.add(function)
            logger.warning(
                "%s called outside a rollout attempt; nothing is recorded (wrap the code in "
                "agentbolt.trace_attempt() to record it while debugging)",
                function,
            )
        return None
    if extra:
        attributes = {**extra, **attributes}
    span = ctx.tracer.start_span(span_name, attributes=attributes)
    if status is not None:
        span.set_status(status)
    span.end()
    return ctx.span(format(span.get_span_context().span_id, "016x"))


def emit_reward(value: float, name: str | None = None, *, attributes: Attributes | None = None) -> Span | None:
    """Record a reward for the current attempt (span ``agentbolt.reward``).

    An attempt may emit many rewards. Named ones (``name="format"``) are components or intermediate signals; the
    attempt's final reward is its last *unnamed* one, unless the agent function returns a number, which wins.

    Args:
        value: a finite number; a bool is 1.0 or 0.0. Strings (``"1"`` too), ``None``, NaN and infinities are
            refused: the one reward rule of :mod:`agentbolt.types.rewards`, the same on every path.
        name: optional name of the reward; ``None`` for the final reward.
        attributes: extra span attributes.

    Returns:
        The recorded span, or ``None`` when called outside an attempt.

    Raises:
        RewardError: ``value`` is not a reward (the message names it and its type); a ``ConfigError``.
        ConfigError: ``name`` is not a non-empty string.
    """
    reward = coerce_reward(value, where="emit_reward")
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigError(f"emit_reward's name must be a non-empty string or None, got {name!r}")
    attrs: dict[str, AttributeValue] = {semconv.REWARD_VALUE: reward}
    if name is not None:
        attrs[semconv.REWARD_NAME] = name
    return _record("emit_reward", semconv.SPAN_REWARD, attrs, attributes)


def emit_message(message: str, *, attributes: Attributes | None = None) -> Span | None:
    """Record a text message (a log line, a thought, a note for whoever reads the trace; span ``agentbolt.message``).

    Args:
        message: the text, stored whole.
        attributes: extra span attributes.

    Returns:
        The recorded span, or ``None`` outside an attempt.

    Raises:
        ConfigError: ``message`` is not a string (use :func:`emit_object` for other values).
    """
    if not isinstance(message, str):
        raise ConfigError(
            f"emit_message needs a str, got {type(message).__name__}; use emit_object for structured values"
        )
    return _record("emit_message", semconv.SPAN_MESSAGE, {semconv.MESSAGE_TEXT: message}, attributes)


def emit_object(
    obj: object, *, attributes: Attributes | None = None, limits: JsonLimits = DEFAULT_LIMITS
) -> Span | None:
    """Record any value as JSON (span ``agentbolt.object``): a parsed answer, a tool result, a state snapshot.

    The value is stored as JSON text under ``agentbolt.object.json`` (bounded by ``limits``; the conversion rules
    are in :mod:`agentbolt.tracing.serialize`: pydantic models, dataclasses, containers; anything else by ``repr``)
    and its Python type name under ``agentbolt.object.type``.

    Args:
        obj: the value; never raises on an unserializable one.
        attributes: extra span attributes.
        limits: size bounds of the stored JSON text.

    Returns:
        The recorded span, or ``None`` outside an attempt.
    """
    if current_attempt() is None:  # skip the serialization when nothing is recorded
        return _record("emit_object", semconv.SPAN_OBJECT, {}, None)
    attrs: dict[str, AttributeValue] = {
        semconv.OBJECT_JSON: to_json_text(obj, limits),
        semconv.OBJECT_TYPE: type(obj).__qualname__,
    }
    return _record("emit_object", semconv.SPAN_OBJECT, attrs, attributes)


def exception_attributes(exc: BaseException) -> dict[str, AttributeValue]:
    """``exception.type`` (class name), ``exception.message`` and ``exception.stacktrace`` (OpenTelemetry keys)."""
    return {
        semconv.EXCEPTION_TYPE: type(exc).__name__,
        semconv.EXCEPTION_MESSAGE: str(exc),
        semconv.EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exc)),
    }


def emit_exception(exc: BaseException, *, attributes: Attributes | None = None) -> Span | None:
    """Record an exception (span ``agentbolt.exception``, status ``ERROR``), e.g. one the agent caught and survived.

    The runner records the exception that ends an attempt itself; ``@operation`` records one raised through it on
    its own span. Use this for the others.

    Args:
        exc: the exception; its traceback (if it was raised) is stored under ``exception.stacktrace``.
        attributes: extra span attributes.

    Returns:
        The recorded span, or ``None`` outside an attempt.

    Raises:
        ConfigError: ``exc`` is not an exception instance.
    """
    if not isinstance(exc, BaseException):
        raise ConfigError(f"emit_exception needs an exception instance, got {type(exc).__name__}")
    status = Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
    return _record("emit_exception", semconv.SPAN_EXCEPTION, exception_attributes(exc), attributes, status)
