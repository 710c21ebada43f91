"""How the gateway records a call: one ``agentbolt.llm_call`` span per choice (semconv keys).

Every span of one request shares ``gen_ai.response.id`` and a trace id, and carries the request (messages, tools,
model asked for, temperature), ``agentbolt.llm.choice_index`` and ``agentbolt.llm.stream``. Then:

- a generated choice: status OK, the exact prompt/response token ids and sampling logprobs (when the backend has
  them), the decoded text, the assistant message as returned, finish reason, usage, model version, and
  ``agentbolt.llm.trainable`` (False, with ``agentbolt.llm.not_trainable_reason``, when the backend has no ids,
  when the client went away mid-stream, or when the answer was not delivered because another choice failed);
- a failed choice: status ERROR, ``agentbolt.llm.error`` and ``agentbolt.llm.error_code``, never trainable.

The adapter (:mod:`agentbolt.adapter.trajectory`) skips ERROR spans and spans with ``trainable = False``, so
failures and untrainable calls never become training samples.

While a call is served, the recorder keeps its attempt's lease alive (:meth:`CallRecorder.keepalive`): an agent
waiting on a long generation is not taken for dead, whoever runs it (a runner, or a client that claimed the rollout
over REST and sends no heartbeats).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Final

from agentbolt import semconv
from agentbolt.inference.base import GenerationResult
from agentbolt.server.gateway.openai_format import ErrorInfo
from agentbolt.store.base import LightningStore
from agentbolt.tracing.context import new_span_id, new_trace_id
from agentbolt.types import Span, SpanStatus

logger = logging.getLogger(__name__)

KEEPALIVE_INTERVAL_S: Final = 2.0
"""How often a call in progress refreshes its attempt's heartbeat (seconds; the runners' own period)."""


def keepalive_interval(unresponsive_s: float | None) -> float:
    """The keepalive period for an attempt whose lease is ``unresponsive_s`` seconds: :data:`KEEPALIVE_INTERVAL_S`,
    or a third of a shorter lease."""
    if unresponsive_s is None:
        return KEEPALIVE_INTERVAL_S
    return min(KEEPALIVE_INTERVAL_S, unresponsive_s / 3)


GATEWAY_WORKER_ID: Final = "gateway"
"""The worker a keepalive names when the attempt has none."""

REASON_NO_TOKEN_IDS = "the backend returns no token ids (openai backend): usable for prompt optimization and evaluation"
REASON_CLIENT_GONE = "the client disconnected mid-stream: it never received the whole answer"
REASON_FAILED = "the call failed"
REASON_NOT_DELIVERED = "another choice of the request failed, so this answer was not returned to the agent"


class CallRecorder:
    """Builds and stores the spans of one chat completion request (all its choices).

    Args:
        store: where spans go.
        rollout_id / attempt_id: the attempt named in the URL.
        request_attributes: attributes every span of the request carries (see the module docstring).
        response_id: the ``chatcmpl-...`` id returned to the client.
        parent: ``(trace_id, span_id)`` of the caller's span, from the request's ``traceparent`` header: the spans
            join that trace as its children. ``None``: a new trace per request, no parent.
        worker_id: the worker that claimed the attempt (named by :meth:`keepalive`'s heartbeats).
        keepalive_s: the period of :meth:`keepalive`'s heartbeats (:func:`keepalive_interval` of the lease).
    """

    def __init__(
        self,
        store: LightningStore,
        rollout_id: str,
        attempt_id: str,
        request_attributes: dict[str, Any],
        response_id: str,
        parent: tuple[str, str] | None = None,
        worker_id: str | None = None,
        keepalive_s: float = KEEPALIVE_INTERVAL_S,
    ) -> None:
        self.store = store
        self.worker_id = worker_id or GATEWAY_WORKER_ID
        self.keepalive_s = keepalive_s
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.response_id = response_id
        self.start_s = time.time()
        self._request_attributes = {**request_attributes, semconv.GEN_AI_RESPONSE_ID: response_id}
        self._trace_id = parent[0] if parent is not None else new_trace_id()
        self._parent_id = parent[1] if parent is not None else None

    @contextlib.asynccontextmanager
    async def keepalive(self) -> AsyncIterator[None]:
        """Refresh the attempt's heartbeat every ``keepalive_s`` seconds until the block ends (a call being
        generated is proof the agent lives). A failed heartbeat (the attempt ended meanwhile) is only logged."""

        async def beat() -> None:
            while True:
                await asyncio.sleep(self.keepalive_s)
                try:
                    await self.store.heartbeat(self.worker_id, rollout_id=self.rollout_id, attempt_id=self.attempt_id)
                except Exception as exc:
                    logger.debug("keepalive of attempt %s failed: %r", self.attempt_id, exc)

        task = asyncio.get_running_loop().create_task(beat(), name=f"agentbolt-keepalive-{self.attempt_id}")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def result_span(
        self,
        index: int,
        result: GenerationResult,
        message: dict[str, Any],
        finish: str,
        *,
        not_trainable_reason: str | None = None,
        client_disconnected: bool = False,
    ) -> Span:
        """The span of choice ``index`` that generated ``result`` and was answered as ``message`` (status OK).

        ``not_trainable_reason`` marks it untrainable; a result without exact ids is untrainable anyway.
        """
        attributes = dict(self._request_attributes)
        attributes.update(
            {
                semconv.LLM_CHOICE_INDEX: index,
                semconv.GEN_AI_RESPONSE_FINISH_REASON: [finish],
                semconv.GEN_AI_USAGE_INPUT_TOKENS: result.num_prompt_tokens,
                semconv.GEN_AI_USAGE_OUTPUT_TOKENS: result.num_completion_tokens,
                semconv.LLM_RESPONSE_TEXT: result.text,
                semconv.LLM_RESPONSE_MESSAGE: message,
                semconv.LLM_MODEL_VERSION: result.model_version,
            }
        )
        if result.stop_sequence is not None:
            attributes[semconv.LLM_STOP_SEQUENCE] = result.stop_sequence
        if result.prompt_token_ids or result.response_token_ids:
            attributes[semconv.LLM_PROMPT_TOKEN_IDS] = result.prompt_token_ids
            attributes[semconv.LLM_RESPONSE_TOKEN_IDS] = result.response_token_ids
            attributes[semconv.LLM_RESPONSE_LOGPROBS] = result.response_logprobs
        if client_disconnected:
            attributes[semconv.LLM_CLIENT_DISCONNECTED] = True
            not_trainable_reason = not_trainable_reason or REASON_CLIENT_GONE
        if not result.trainable:
            why = result.extra.get("not_trainable_reason")
            not_trainable_reason = not_trainable_reason or (str(why) if why else REASON_NO_TOKEN_IDS)
        attributes[semconv.LLM_TRAINABLE] = not_trainable_reason is None
        if not_trainable_reason is not None:
            attributes[semconv.LLM_NOT_TRAINABLE_REASON] = not_trainable_reason
        return self._span(attributes, SpanStatus(code="OK"))

    def error_span(self, index: int, error: ErrorInfo, exc: BaseException) -> Span:
        """The span of choice ``index`` that failed with ``exc`` (answered as ``error``): status ERROR."""
        attributes = dict(self._request_attributes)
        attributes.update(
            {
                semconv.LLM_CHOICE_INDEX: index,
                semconv.LLM_ERROR: f"{type(exc).__name__}: {exc}",
                semconv.LLM_ERROR_CODE: error.code or error.type,
                semconv.LLM_TRAINABLE: False,
                semconv.LLM_NOT_TRAINABLE_REASON: REASON_FAILED,
            }
        )
        return self._span(attributes, SpanStatus(code="ERROR", description=error.message))

    async def record(self, spans: list[Span]) -> None:
        """Store the spans (one write)."""
        if len(spans) == 1:
            await self.store.add_span(spans[0])
        elif spans:
            await self.store.add_spans(spans)

    def _span(self, attributes: dict[str, Any], status: SpanStatus) -> Span:
        return Span(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            span_id=new_span_id(),
            trace_id=self._trace_id,
            parent_id=self._parent_id,
            name=semconv.SPAN_LLM_CALL,
            start_time=self.start_s,
            end_time=time.time(),
            attributes=attributes,
            status=status,
        )


class UnrecordedCall(CallRecorder):
    """A :class:`CallRecorder` that stores nothing and keeps no attempt alive: the plain ``/v1`` routes, outside any
    rollout, serve through the same code as the recorded ones (:mod:`agentbolt.server.gateway.plain_routes`)."""

    def __init__(self, store: LightningStore, response_id: str) -> None:
        super().__init__(store, "", "", {}, response_id)

    @contextlib.asynccontextmanager
    async def keepalive(self) -> AsyncIterator[None]:
        """No attempt to keep alive."""
        yield

    async def record(self, spans: list[Span]) -> None:
        """Nothing is stored."""
