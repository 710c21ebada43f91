"""Which sampling settings a gateway call runs with: what the agent asked for, and what its resources version says.

A rollout runs under a resources version whose ``llm`` resource carries ``sampling_parameters``
(``temperature``, ``top_p``, ``max_tokens``). The gateway resolves each call's settings from it
(:func:`resolve_sampling`):

* ``sampling_enforced: false`` (a user's own version): the agent's request wins; a field the request leaves unset
  takes the version's value, then the API default (temperature 1.0, top_p 1.0, ``DEFAULT_MAX_TOKENS``).
* ``sampling_enforced: true`` (the versions a train, eval or prompt-optimization job publishes): temperature and
  top_p are the version's whatever the agent asked, because the trainer's logprobs and the job's evaluation assume
  them; ``max_tokens`` is the version's budget, or the agent's when the agent asked for fewer tokens (a smaller
  budget changes no logprob).

So an agent that passes no sampling settings (the README's style) samples at the job's train temperature in
``train`` rollouts and at its evaluation temperature in ``val``/``test`` rollouts. The call's span records what was
applied (``gen_ai.request.temperature``, ``gen_ai.request.top_p``, ``gen_ai.request.max_tokens``) and, when the
agent set any of them, what it asked for (``agentbolt.llm.sampling_requested``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agentbolt.server.gateway.openai_format import DEFAULT_MAX_TOKENS
from agentbolt.store.base import LightningStore
from agentbolt.types import LLM

SAMPLING_KEYS = ("temperature", "top_p", "max_tokens")
"""The ``sampling_parameters`` keys the gateway applies."""


@dataclass(frozen=True)
class Sampling:
    """The settings one call runs with.

    Attributes:
        temperature: softmax temperature, ``>= 0`` (0: greedy).
        top_p: nucleus mass in ``(0, 1]``.
        max_tokens: generated-token budget, ``>= 1``.
        requested: the fields the agent set in its request (``max_tokens`` is ``max_completion_tokens`` or
            ``max_tokens``), empty when it set none.
    """

    temperature: float
    top_p: float
    max_tokens: int
    requested: dict[str, float | int] = field(default_factory=dict)


def resolve_sampling(requested: dict[str, float | int], llm: LLM | None) -> Sampling:
    """The settings a call runs with, by the rules in the module docstring. A version value that is not a number
    (a user's ``{"temperature": null}``) is not applied.

    Args:
        requested: what the agent set (``CallSpec.sampling_requested``: ``temperature``, ``top_p``, ``max_tokens``).
        llm: the ``llm`` resource of the attempt's resources version; ``None`` outside a version (the request alone
            decides).
    """
    version: dict[str, float | int] = {
        key: value
        for key, value in (llm.sampling_parameters if llm else {}).items()
        if key in SAMPLING_KEYS and isinstance(value, int | float) and not isinstance(value, bool)
    }
    enforced = llm is not None and llm.sampling_enforced
    defaults: dict[str, float | int] = {"temperature": 1.0, "top_p": 1.0, "max_tokens": DEFAULT_MAX_TOKENS}
    applied: dict[str, float | int] = {}
    for key in SAMPLING_KEYS:
        value: float | int
        if enforced and key in version:
            value = version[key]
            if key == "max_tokens" and key in requested:
                value = min(int(value), int(requested[key]))
        else:
            value = requested.get(key, version.get(key, defaults[key]))
        applied[key] = value
    return Sampling(
        temperature=float(applied["temperature"]),
        top_p=float(applied["top_p"]),
        max_tokens=int(applied["max_tokens"]),
        requested=dict(requested),
    )


def attempt_llm(resources: dict[str, Any]) -> LLM | None:
    """The ``llm`` resource of a version: the one named ``llm``, else its only LLM resource, else ``None``."""
    named = resources.get("llm")
    if isinstance(named, LLM):
        return named
    llms = [r for r in resources.values() if isinstance(r, LLM)]
    return llms[0] if len(llms) == 1 else None


class VersionLLMCache:
    """The ``llm`` resource of recently used resources versions (versions never change, so a cached entry never goes
    stale); at most ``size`` versions are kept."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._entries: OrderedDict[str, LLM | None] = OrderedDict()

    async def get(self, store: LightningStore, resources_id: str | None) -> LLM | None:
        """The ``llm`` of version ``resources_id`` (``None``: no version, or a version without one LLM)."""
        if resources_id is None:
            return None
        if resources_id in self._entries:
            self._entries.move_to_end(resources_id)
            return self._entries[resources_id]
        update = await store.get_resources(resources_id)
        llm = None if update is None else attempt_llm(dict(update.resources))
        self._entries[resources_id] = llm
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return llm
