"""``@operation``: record a function call of the agent (a tool, a step, a sub-agent) as a span, with its inputs and
output.

Each call inside an attempt becomes one span ``agentbolt.operation``, made the current span while the function
runs, so whatever it records (``emit_*``, LLM calls of an instrumented framework, nested operations) nests under
it. Attributes (keys in :mod:`agentbolt.semconv`):

- ``agentbolt.operation.name``: the ``name`` given, else the function's ``__qualname__``;
- ``agentbolt.operation.input``: JSON text of the bound arguments by parameter name, defaults applied, without a
  first parameter named ``self`` or ``cls``; ``*args`` / ``**kwargs`` appear under their own names;
- ``agentbolt.operation.output``: JSON text of the returned value (an ``async def`` one: the awaited value);
- on an exception (re-raised unchanged): status ``ERROR`` with ``"<type>: <message>"``, the attributes
  ``exception.type`` and ``exception.message``, and the OpenTelemetry ``exception`` event with its stack trace.

Values are converted and bounded as described in :mod:`agentbolt.tracing.serialize` (``limits``). Outside an
attempt the function is called as is and nothing is recorded. Generator functions are refused (the span would end
before the generator runs); decorate the function that consumes the generator instead.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar, overload

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from agentbolt import semconv
from agentbolt.errors import ConfigError
from agentbolt.tracing.context import current_attempt
from agentbolt.tracing.serialize import DEFAULT_LIMITS, JsonLimits, to_json_text

P = ParamSpec("P")
R = TypeVar("R")


def _bound_inputs(signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if signature is None:
        return {"args": list(args), "kwargs": kwargs}
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:  # the call itself is wrong; the function will raise, record what was passed
        return {"args": list(args), "kwargs": kwargs}
    bound.apply_defaults()
    inputs = dict(bound.arguments)
    params = list(signature.parameters)
    if params and params[0] in ("self", "cls"):
        inputs.pop(params[0], None)
    return inputs


def _record_error(span: trace.Span, exc: BaseException) -> None:
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.set_attribute(semconv.EXCEPTION_TYPE, type(exc).__name__)
    span.set_attribute(semconv.EXCEPTION_MESSAGE, str(exc))
    span.record_exception(exc)


class _OperationSpan:
    """Opens the span of one call and records its inputs, output or error."""

    def __init__(
        self,
        name: str,
        signature: inspect.Signature | None,
        record_inputs: bool,
        record_output: bool,
        limits: JsonLimits,
    ) -> None:
        self.name = name
        self.signature = signature
        self.record_inputs = record_inputs
        self.record_output = record_output
        self.limits = limits

    def attributes(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, str]:
        attrs = {semconv.OPERATION_NAME: self.name}
        if self.record_inputs:
            inputs = _bound_inputs(self.signature, args, dict(kwargs))
            attrs[semconv.OPERATION_INPUT] = to_json_text(inputs, self.limits)
        return attrs

    def output(self, span: trace.Span, result: object) -> None:
        if self.record_output:
            span.set_attribute(semconv.OPERATION_OUTPUT, to_json_text(result, self.limits))


@overload
def operation(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def operation(
    *,
    name: str | None = None,
    record_inputs: bool = True,
    record_output: bool = True,
    limits: JsonLimits = DEFAULT_LIMITS,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def operation(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    record_inputs: bool = True,
    record_output: bool = True,
    limits: JsonLimits = DEFAULT_LIMITS,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: record each call of a sync or ``async def`` function as an ``agentbolt.operation`` span.

    Use bare (``@operation``) or with options (``@operation(name="search", record_output=False)``).

    Args:
        fn: the function (when used bare).
        name: the operation's name (default: the function's ``__qualname__``).
        record_inputs: store the bound arguments as JSON (turn off for secrets or huge inputs).
        record_output: store the returned value as JSON.
        limits: size bounds of the stored JSON texts.

    Returns:
        A function with the same signature (``functools.wraps``), that records when called inside an attempt.

    Raises:
        ConfigError: at decoration time, for a generator or async generator function, or a non-callable.
    """

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        if not callable(func):
            raise ConfigError(f"@operation decorates a function, got {type(func).__name__}")
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise ConfigError(
                f"@operation cannot record generator function {getattr(func, '__qualname__', func)!r}: its span would "
                "end before the generator runs; decorate the function that consumes it instead"
            )
        try:
            signature: inspect.Signature | None = inspect.signature(func)
        except (TypeError, ValueError):
            signature = None
        op_name = name or getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
        recorder = _OperationSpan(op_name, signature, record_inputs, record_output, limits)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                ctx = current_attempt()
                if ctx is None:
                    return await func(*args, **kwargs)  # type: ignore[misc]
                attrs = recorder.attributes(args, kwargs)
                with ctx.tracer.start_as_current_span(
                    semconv.SPAN_OPERATION, attributes=attrs, record_exception=False, set_status_on_exception=False
                ) as span:
                    try:
                        result = await func(*args, **kwargs)  # type: ignore[misc]
                    except BaseException as exc:
                        _record_error(span, exc)
                        raise
                    recorder.output(span, result)
                    return result

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            ctx = current_attempt()
            if ctx is None:
                return func(*args, **kwargs)
            attrs = recorder.attributes(args, kwargs)
            with ctx.tracer.start_as_current_span(
                semconv.SPAN_OPERATION, attributes=attrs, record_exception=False, set_status_on_exception=False
            ) as span:
                try:
                    result = func(*args, **kwargs)
                except BaseException as exc:
                    _record_error(span, exc)
                    raise
                recorder.output(span, result)
                return result

        return wrapper

    if fn is not None:
        return decorate(fn)
    return decorate
