"""``agentbolt.agent(name)``: run part of the agent under an agent name, so that its LLM calls are attributed to it.

In a multi-agent system the trainer can train one agent and let the others run as they are (``agent_match``, see
:mod:`agentbolt.adapter.agents`). Frameworks usually name their agents themselves (LangGraph nodes, openai-agents
agents, CrewAI roles); for plain code, name them with::

    with agentbolt.agent("writer"):
        draft = client.chat.completions.create(...)

    @agentbolt.agent("checker")            # each call of the function runs under "checker"
    async def check(draft: str) -> bool: ...

Inside an attempt each scope is one span ``agentbolt.agent`` of OpenInference kind ``AGENT`` with
``agentbolt.agent.name`` and ``agent.name`` set to the name, made the current span, so what is recorded inside it
(an instrumented client's LLM spans, ``emit_*``, ``@operation``, nested agents) nests under it; the innermost agent
owns a call. An exception raised through the scope is re-raised unchanged and recorded on the span (status
``ERROR``, ``exception.type``, ``exception.message`` and the ``exception`` event). Outside an attempt nothing is
recorded, and :func:`current_agent_name` still answers.

The gateway sees the agent name of a call only through the tracer (an instrumented client, e.g.
``agentbolt.instrument(["openai"])``, whose LLM spans nest under the scope), or when the call itself carries it: the
``x-agentbolt-agent`` header (``openai.OpenAI(..., default_headers={"x-agentbolt-agent": "writer"})``) or a
``traceparent`` header naming a span inside the scope.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from agentbolt import semconv
from agentbolt.errors import ConfigError
from agentbolt.tracing.context import current_attempt

P = ParamSpec("P")
R = TypeVar("R")

_Entry = tuple["AgentScope", "AbstractContextManager[trace.Span] | None", "trace.Span | None"]
_open_scopes: contextvars.ContextVar[tuple[_Entry, ...]] = contextvars.ContextVar("agentbolt_agent_scopes", default=())


class AgentScope:
    """A named agent scope: a context manager (``with`` / ``async with``) and a decorator (sync and ``async def``).

    One instance may be entered many times, nested, and from concurrent tasks or threads: each entry opens its own
    span. Build it with :func:`agent`.

    Attributes:
        name: the agent name.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"agentbolt.agent({self.name!r})"

    def __enter__(self) -> AgentScope:
        cm: AbstractContextManager[trace.Span] | None = None
        span: trace.Span | None = None
        ctx = current_attempt()
        if ctx is not None:
            attributes = {
                semconv.AGENT_NAME: self.name,
                semconv.OI_AGENT_NAME: self.name,
                semconv.OI_SPAN_KIND: semconv.OI_SPAN_KIND_AGENT,
            }
            cm = ctx.tracer.start_as_current_span(
                semconv.SPAN_AGENT, attributes=attributes, record_exception=False, set_status_on_exception=False
            )
            span = cm.__enter__()
        _open_scopes.set((*_open_scopes.get(), (self, cm, span)))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack = _open_scopes.get()
        index = next((i for i in range(len(stack) - 1, -1, -1) if stack[i][0] is self), None)
        if index is None:  # exited in another context than it was entered in: nothing of ours to close here
            return
        _, cm, span = stack[index]
        _open_scopes.set(stack[:index] + stack[index + 1 :])
        if span is not None and exc is not None:
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            span.set_attribute(semconv.EXCEPTION_TYPE, type(exc).__name__)
            span.set_attribute(semconv.EXCEPTION_MESSAGE, str(exc))
            span.record_exception(exc)
        if cm is not None:
            cm.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> AgentScope:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        """Decorate ``func`` so that each call runs inside this scope.

        Raises:
            ConfigError: ``func`` is not callable, or is a generator function (the scope would close before the
                generator runs; decorate the function that consumes it).
        """
        if not callable(func):
            raise ConfigError(f"agentbolt.agent({self.name!r}) decorates a function, got {type(func).__name__}")
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise ConfigError(
                f"agentbolt.agent({self.name!r}) cannot decorate generator function "
                f"{getattr(func, '__qualname__', func)!r}: the scope would close before the generator runs; decorate "
                "the function that consumes it instead"
            )
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                with self:
                    return await func(*args, **kwargs)  # type: ignore[misc]

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return func(*args, **kwargs)

        return wrapper


def agent(name: str) -> AgentScope:
    """A scope that runs code under the agent name ``name`` (see the module docstring).

    Args:
        name: the agent's name, as ``agent_match`` will see it (surrounding whitespace is removed).

    Returns:
        An :class:`AgentScope`: use it as ``with agent("writer"):``, ``async with``, or ``@agent("writer")``.

    Raises:
        ConfigError: ``name`` is not a non-empty string.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"agentbolt.agent needs a non-empty agent name, got {name!r}")
    return AgentScope(name.strip())


def current_agent_name() -> str | None:
    """The name of the innermost :func:`agent` scope the caller runs in, or ``None`` outside any."""
    stack = _open_scopes.get()
    return stack[-1][0].name if stack else None
