"""Framework instrumentation with the OpenInference instrumentors from PyPI, wired to agentbolt's tracer provider.

Known frameworks (name -> PyPI package of the instrumentor -> what it records):

- ``openai``: ``openinference-instrumentation-openai``; every ``openai`` client request (LLM spans with messages,
  tool calls, token counts).
- ``langchain``: ``openinference-instrumentation-langchain``; LangChain / LangGraph runs: chains, agents, tools,
  LLM calls.
- ``openai-agents``: ``openinference-instrumentation-openai-agents``; OpenAI Agents SDK agents, handoffs, tools.
- ``autogen-agentchat``: ``openinference-instrumentation-autogen-agentchat``; AutoGen AgentChat agents and teams.
- ``crewai``: ``openinference-instrumentation-crewai``; CrewAI crews, agents, tasks, tools.
- ``litellm``: ``openinference-instrumentation-litellm``; ``litellm`` completion calls.

The spans use the OpenInference semantic conventions (``openinference.span.kind`` = ``LLM``, ``AGENT``,
``TOOL``, ``CHAIN``...; ``llm.*``, ``tool.*``, ``input.value``, ``output.value``; agent names under
``agent.name`` or in the span name, depending on the framework). They go to
:func:`agentbolt.tracing.otel.tracer_provider`, so inside an attempt they are recorded and nested like any other
span, and outside one they are dropped.

Instrumentation is process-wide (the instrumentors patch the framework's classes). :func:`instrument` keeps it
until :func:`uninstrument`; the runner uses :func:`acquire` / :func:`release`, which count users so that a framework
is uninstrumented when the last runner that asked for it closes (unless :func:`instrument` asked for it too).
A framework instrumented by someone else (``SomeInstrumentor().instrument()`` in the application) is left alone and
reported: its spans go to the tracer provider it was given, not necessarily to agentbolt's.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agentbolt.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Framework:
    """One supported framework: its instrumentor's module, class and PyPI package, and the framework's package."""

    name: str
    module: str
    class_name: str
    package: str
    framework_package: str


FRAMEWORKS: dict[str, Framework] = {
    f.name: f
    for f in (
        Framework(
            "openai",
            "openinference.instrumentation.openai",
            "OpenAIInstrumentor",
            "openinference-instrumentation-openai",
            "openai",
        ),
        Framework(
            "langchain",
            "openinference.instrumentation.langchain",
            "LangChainInstrumentor",
            "openinference-instrumentation-langchain",
            "langchain-core",
        ),
        Framework(
            "openai-agents",
            "openinference.instrumentation.openai_agents",
            "OpenAIAgentsInstrumentor",
            "openinference-instrumentation-openai-agents",
            "openai-agents",
        ),
        Framework(
            "autogen-agentchat",
            "openinference.instrumentation.autogen_agentchat",
            "AutogenAgentChatInstrumentor",
            "openinference-instrumentation-autogen-agentchat",
            "autogen-agentchat",
        ),
        Framework(
            "crewai",
            "openinference.instrumentation.crewai",
            "CrewAIInstrumentor",
            "openinference-instrumentation-crewai",
            "crewai",
        ),
        Framework(
            "litellm",
            "openinference.instrumentation.litellm",
            "LiteLLMInstrumentor",
            "openinference-instrumentation-litellm",
            "litellm",
        ),
    )
}
"""The frameworks :func:`instrument` knows, by name."""

_lock = threading.RLock()
_ours: set[str] = set()  # instrumented by agentbolt (and so uninstrumented by it)
_kept: set[str] = set()  # asked for by instrument(): stays until uninstrument()
_leases: Counter[str] = Counter()  # asked for by acquire(): one count per caller


class FrameworkUnavailable(ConfigError):
    """A requested framework cannot be instrumented: its instrumentor or the framework is missing or conflicts."""


def _framework(name: str) -> Framework:
    framework = FRAMEWORKS.get(name)
    if framework is None:
        raise ConfigError(f"unknown framework {name!r}; agentbolt can instrument {', '.join(sorted(FRAMEWORKS))}")
    return framework


def _instance(framework: Framework) -> Any:
    """The instrumentor instance (OpenTelemetry instrumentors are singletons). Raises FrameworkUnavailable."""
    try:
        module = importlib.import_module(framework.module)
    except ImportError as exc:
        raise FrameworkUnavailable(
            f"cannot instrument {framework.name}: {framework.package} is not installed ({exc}); "
            f"pip install {framework.package}"
        ) from exc
    return getattr(module, framework.class_name)()


def _instrumentor(framework: Framework) -> Any:
    """The instrumentor instance, once its framework is known to be installed in a supported version.

    Raises:
        FrameworkUnavailable: the instrumentor package is not installed, or the framework is missing or conflicts.
    """
    instrumentor = _instance(framework)
    from opentelemetry.instrumentation.dependencies import get_dependency_conflicts

    conflict = get_dependency_conflicts(instrumentor.instrumentation_dependencies())
    if conflict is not None:
        found = getattr(conflict, "found", None)
        required = getattr(conflict, "required", None) or str(conflict)
        if found is None:
            raise FrameworkUnavailable(
                f"cannot instrument {framework.name}: {framework.package} needs {required}, which is not installed; "
                f"pip install {framework.framework_package} (or drop {framework.name!r} from the frameworks)"
            )
        raise FrameworkUnavailable(
            f"cannot instrument {framework.name}: {framework.package} needs {required}, but {found} is installed; "
            f"install a matching version of {framework.framework_package} or of {framework.package}"
        )
    return instrumentor


def _activate(name: str) -> None:
    """Instrument ``name`` with agentbolt's provider unless it already is (caller holds the lock)."""
    if name in _ours:
        return
    instrumentor = _instrumentor(_framework(name))
    if instrumentor.is_instrumented_by_opentelemetry:
        logger.warning(
            "%s was already instrumented outside agentbolt; its spans go to the tracer provider it was given. To "
            "record them in agentbolt, call %s().uninstrument() first, or pass it "
            "tracer_provider=agentbolt.tracing.tracer_provider()",
            name,
            _framework(name).class_name,
        )
        return
    from agentbolt.tracing.otel import tracer_provider

    instrumentor.instrument(tracer_provider=tracer_provider(), skip_dep_check=True)
    _ours.add(name)
    logger.debug("instrumented %s", name)


def _deactivate(name: str) -> None:
    if name not in _ours:
        return
    _instance(_framework(name)).uninstrument()
    _ours.discard(name)


def available_frameworks() -> list[str]:
    """Names of the known frameworks whose instrumentor and framework are both installed (importable, no conflict)."""
    names = []
    for name, framework in FRAMEWORKS.items():
        try:
            _instrumentor(framework)
        except FrameworkUnavailable:
            continue
        names.append(name)
    return names


def _resolve(frameworks: str | Iterable[str] | None) -> list[str]:
    """The names asked for, checked; ``None`` means every available framework."""
    if frameworks is None:
        return available_frameworks()
    names = [frameworks] if isinstance(frameworks, str) else list(frameworks)
    for name in names:
        _framework(name)
    return list(dict.fromkeys(names))


def instrument(frameworks: str | Iterable[str] | None = None) -> list[str]:
    """Instrument frameworks so that their spans are recorded in attempts; stays until :func:`uninstrument`.

    Args:
        frameworks: names from :data:`FRAMEWORKS` (one name or several); ``None``: every framework whose
            instrumentor and framework are both installed, silently skipping the others.

    Returns:
        The names instrumented by agentbolt now (including those that already were).

    Raises:
        ConfigError: an unknown name (the message lists the known ones).
        FrameworkUnavailable: a framework named explicitly whose instrumentor or framework is not installed, or
            whose installed version the instrumentor does not support (the message says what to pip install).
    """
    with _lock:
        names = _resolve(frameworks)
        for name in names:
            _activate(name)
            if name in _ours:
                _kept.add(name)
        return [n for n in names if n in _ours]


def uninstrument(frameworks: str | Iterable[str] | None = None) -> None:
    """Undo :func:`instrument` (and leases) for ``frameworks`` (``None``: all that agentbolt instrumented)."""
    with _lock:
        names = sorted(_ours) if frameworks is None else _resolve(frameworks)
        for name in names:
            _kept.discard(name)
            _leases.pop(name, None)
            _deactivate(name)


def acquire(frameworks: str | Iterable[str] | None = None) -> list[str]:
    """Like :func:`instrument`, but counted: pass the returned names to :func:`release` when done.

    Raises: as :func:`instrument`.
    """
    with _lock:
        names = _resolve(frameworks)
        taken = []
        for name in names:
            _activate(name)
            if name in _ours:
                _leases[name] += 1
                taken.append(name)
        return taken


def release(names: Iterable[str]) -> None:
    """Give back names from :func:`acquire`; a framework nobody holds any more (and not kept by
    :func:`instrument`) is uninstrumented."""
    with _lock:
        for name in names:
            if _leases[name] > 0:
                _leases[name] -= 1
            if _leases[name] == 0:
                del _leases[name]
                if name not in _kept:
                    _deactivate(name)


def instrumented() -> list[str]:
    """Names of the frameworks agentbolt has instrumented now."""
    with _lock:
        return sorted(_ours)
