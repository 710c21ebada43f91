"""The agent API: a ``@rollout`` function decorator and the ``LitAgent`` base class.

An agent receives the task (``rollout.input``) and its resources by name. A resource is passed to a parameter of the
same name (``llm``, ``prompt_template``, ...); a parameter named ``resources`` receives the whole dict. The agent
records its reward with :func:`agentbolt.emit_reward`, or simply returns a float.

Example::

    @rollout
    def calc_agent(task: dict, llm: LLM) -> float:
        client = OpenAI(base_url=llm.endpoint, api_key="unused")
        ...
        return 1.0 if correct else 0.0
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from agentbolt.errors import ConfigError
from agentbolt.types import Resource, Rollout

AgentFunction = Callable[..., Any]


class LitAgent:
    """Base class of an agent. Override :meth:`rollout` (sync or ``async def``).

    ``rollout(task, resources, rollout)`` returns ``None`` (rewards emitted with ``emit_reward``) or a float, the final
    reward. Runs inside a runner; may also be called directly for debugging.
    """

    name: str = "agent"

    def rollout(self, task: Any, resources: Mapping[str, Resource], rollout: Rollout) -> float | None:
        """Run the agent on one task. Must be overridden."""
        raise NotImplementedError(f"{type(self).__name__} must override rollout(task, resources, rollout)")

    @property
    def is_async(self) -> bool:
        """True when :meth:`rollout` is a coroutine function (run on the runner's loop, not in a thread)."""
        return inspect.iscoroutinefunction(self.rollout)


class AgentSetupError(ConfigError):
    """The agent could not be started on a task: a parameter it asks for is not a resource of the version it got.
    A runner reports the attempt failed with cause ``bad_task`` (:mod:`agentbolt.adapter.causes`)."""


class FunctionAgent(LitAgent):
    """A :class:`LitAgent` made from a plain function by :func:`rollout`."""

    def __init__(self, fn: AgentFunction) -> None:
        self.fn = fn
        self.name = getattr(fn, "__name__", "agent")
        self._params = inspect.signature(fn).parameters
        if not self._params:
            raise ConfigError(f"agent function {self.name} must take at least the task as its first parameter")
        self._task_param = next(iter(self._params))

    def _kwargs(self, resources: Mapping[str, Resource], rollout: Rollout) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        for pname in list(self._params)[1:]:
            if pname == "resources":
                kwargs[pname] = dict(resources)
            elif pname == "rollout":
                kwargs[pname] = rollout
            elif pname in resources:
                kwargs[pname] = resources[pname]
            elif self._params[pname].default is inspect.Parameter.empty:
                raise AgentSetupError(
                    f"agent {self.name} needs resource '{pname}', but the resources version only has "
                    f"{sorted(resources)}; add it with store.add_resources or rename the parameter"
                )
        return kwargs

    def rollout(self, task: Any, resources: Mapping[str, Resource], rollout: Rollout) -> Any:
        return self.fn(task, **self._kwargs(resources, rollout))

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function directly (handy in tests and notebooks)."""
        return self.fn(*args, **kwargs)


def rollout(fn: AgentFunction) -> FunctionAgent:
    """Decorator: turn ``fn(task, <resource params>...) -> float | None`` into an agent a runner can execute."""
    return FunctionAgent(fn)
