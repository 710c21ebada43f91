"""``trace_attempt``: run agent code outside a runner and see what a runner would record, for debugging.

Example::

    with agentbolt.trace_attempt() as attempt:
        attempt.returned(calc_agent(task, llm))  # emit_*, @operation, LLM calls and the returned reward are recorded
    for span in attempt.spans:
        print(span.name, span.attributes)
    print(attempt.final_reward, attempt.reward("correct"))

The block runs under a fresh :class:`~agentbolt.tracing.AttemptContext` (ids ``ro-local-<hex>`` /
``at-local-<hex>`` unless given), with the same OpenTelemetry setup and framework instrumentation as a runner;
spans are kept in memory, in the order they ended. An exception leaving the block is recorded as an
``agentbolt.exception`` span (as the runner does) and propagates. Given a ``store`` (and the ids of an existing
attempt of it), the spans are also written to it when the block ends: an async store (every backend, and
:class:`~agentbolt.client.HttpLightningStore`) with ``async with``, a blocking one
(:class:`~agentbolt.client.SyncHttpLightningStore`) with ``with``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from agentbolt.adapter import last_reward
from agentbolt.errors import ConfigError
from agentbolt.tracing import instrumentors as instrumentation
from agentbolt.tracing.context import AttemptContext, attempt_scope
from agentbolt.tracing.emit import emit_exception


@dataclass(eq=False)
class LocalAttempt(AttemptContext):
    """An :class:`AttemptContext` that reads rewards by the adapter's rule (:func:`agentbolt.adapter.last_reward`)."""

    @property
    def final_reward(self) -> float | None:
        """The last unnamed reward emitted so far (``None`` if none)."""
        return last_reward(self.spans)

    def reward(self, name: str) -> float | None:
        """The last reward emitted so far under ``name`` (``None`` if none)."""
        return last_reward(self.spans, name)

    def returned(self, value: Any) -> float | None:
        """Treat ``value`` as the agent's return value, as a runner does; call it inside the ``with`` block, e.g.
        ``attempt.returned(my_agent(task, llm))``. A reward is recorded as the final reward span (so
        :attr:`final_reward` and :attr:`spans` show what a runner records); ``None`` keeps the last emitted reward.

        Returns:
            The attempt's final reward; ``None`` means a runner would fail the attempt with cause ``no_reward``.

        Raises:
            RewardError: ``value`` is not a reward (a string, NaN, an object): a runner fails the attempt with cause
                ``bad_reward`` (:mod:`agentbolt.types.rewards`).
        """
        from agentbolt.tracing.emit import emit_reward
        from agentbolt.types.rewards import returned_reward

        reward = returned_reward(value)
        if reward is not None:
            with attempt_scope(self):
                emit_reward(reward)
        return self.final_reward


class AttemptTrace:
    """The context manager of :func:`trace_attempt`; ``with`` or ``async with`` yields a :class:`LocalAttempt`."""

    def __init__(
        self,
        rollout_id: str | None,
        attempt_id: str | None,
        store: Any,
        instrument: bool | str | Sequence[str],
    ) -> None:
        if store is not None and (not rollout_id or not attempt_id):
            raise ConfigError(
                "trace_attempt(store=...) writes the spans to an existing attempt: pass its rollout_id and attempt_id "
                "(e.g. from store.claim_rollout(...)), or drop store= to keep the spans in memory only"
            )
        if store is not None and not callable(getattr(store, "add_spans", None)):
            raise ConfigError(f"trace_attempt(store=...) needs a store with add_spans, got {type(store).__name__}")
        suffix = os.urandom(4).hex()
        self.attempt = LocalAttempt(rollout_id or f"ro-local-{suffix}", attempt_id or f"at-local-{suffix}")
        self.store = store
        self._frameworks: list[str] = []
        self._instrument = instrument
        self._scope: Any = None

    def _open(self) -> LocalAttempt:
        if self._instrument is not False:
            self._frameworks = instrumentation.acquire(None if self._instrument is True else self._instrument)
        self._scope = attempt_scope(self.attempt)
        self._scope.__enter__()
        return self.attempt

    def _close(self, exc: BaseException | None) -> None:
        from agentbolt.tracing.otel import span_router

        try:
            if isinstance(exc, Exception):
                emit_exception(exc)
        finally:
            self._scope.__exit__(None, None, None)
            span_router().forget(self.attempt)
            instrumentation.release(self._frameworks)
            self._frameworks = []

    def __enter__(self) -> LocalAttempt:
        if self.store is not None and inspect.iscoroutinefunction(self.store.add_spans):
            raise ConfigError(
                f"{type(self.store).__name__} is an async store: use 'async with trace_attempt(store=...)', or a "
                "blocking store (agentbolt.client.SyncHttpLightningStore) with a plain 'with'"
            )
        return self._open()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close(exc)
        if self.store is not None and self.attempt.spans:
            self.store.add_spans(list(self.attempt.spans))

    async def __aenter__(self) -> LocalAttempt:
        if self.store is not None and not inspect.iscoroutinefunction(self.store.add_spans):
            raise ConfigError(
                f"{type(self.store).__name__} is a blocking store: use a plain 'with trace_attempt(store=...)'"
            )
        return self._open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close(exc)
        if self.store is not None and self.attempt.spans:
            await self.store.add_spans(list(self.attempt.spans))


def trace_attempt(
    rollout_id: str | None = None,
    attempt_id: str | None = None,
    *,
    store: Any = None,
    instrument: bool | str | Sequence[str] = True,
) -> AttemptTrace:
    """Record what the code in a ``with`` / ``async with`` block does, as a runner would (see the module docstring).

    Args:
        rollout_id / attempt_id: ids stamped on the spans (default: fresh ``ro-local-*`` / ``at-local-*``); required
            with ``store``, where they must name an existing attempt.
        store: optional store to write the spans to when the block ends (async store: ``async with``; blocking
            store: ``with``).
        instrument: frameworks to instrument for the block (as in :func:`agentbolt.tracing.instrument`): ``True``
            every installed one, ``False`` none, or names. Frameworks instrumented only for the block are
            uninstrumented at its end.

    Returns:
        The context manager; entering it yields the :class:`LocalAttempt` (``.spans``, ``.final_reward``).

    Raises:
        ConfigError: ``store`` without both ids, an object without ``add_spans``, or the wrong kind of ``with``
            for the store; ``FrameworkUnavailable`` (a ConfigError) for a named framework that is not installed.
        Errors of ``store.add_spans`` at the end of the block (e.g. NotFoundError for an unknown attempt).
    """
    return AttemptTrace(rollout_id, attempt_id, store, instrument)
