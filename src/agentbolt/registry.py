"""Name -> implementation registries for pluggable algorithm parts (estimators, credit schemes, ...).

A name is never silently replaced, and an unknown name fails with the list of known ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from agentbolt.errors import ConfigError

T = TypeVar("T")


class Registry(dict[str, T]):
    """A dict of named implementations of one ``kind`` (e.g. ``"advantage estimator"``)."""

    def __init__(self, kind: str, entries: Mapping[str, T] | None = None) -> None:
        super().__init__(entries or {})
        self.kind = kind

    def register(self, name: str, implementation: T) -> None:
        """Add ``implementation`` as ``name``. Raises ConfigError if the name is taken."""
        if name in self:
            raise ConfigError(f"{self.kind} {name!r} is already registered; pick another name")
        self[name] = implementation

    def lookup(self, name: str) -> T:
        """The implementation called ``name``. Raises ConfigError naming the known ones."""
        try:
            return self[name]
        except KeyError:
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self))}") from None
