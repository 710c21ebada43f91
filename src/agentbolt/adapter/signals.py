"""What happened after each LLM call: attached rewards, AIR signals, infrastructure failures. Pure, no I/O.

All rules order spans by the store's ``sequence_id`` (arrival order; never clocks). Spans are written when they
end (the gateway records a call once it is answered; the runner's export queue sends a tracer span as soon as it
ends, :mod:`agentbolt.tracing.export`), so sequence order is the order in which things *ended*.

**Windows.** Given the sequence ids ``c_0 < c_1 < ... < c_{T-1}`` of the trainable LLM calls of an attempt, the
window of call ``t`` is the open interval of sequence ids ``(c_t, c_{t+1})``; the last call's window is
``(c_{T-1}, +inf)``. Spans recorded before the first call (sequence id ``< c_0``) belong to no call.

**Reward attachment** (:func:`attach_rewards`): a reward span attaches to the latest trainable LLM call recorded
before it, i.e. the call whose window holds it. Rewards recorded before the first call attach to nothing (they
stay in ``Trajectory.intermediate_rewards``; :func:`attach_rewards` counts them). The final reward (emitted last)
therefore attaches to the last call. Failed or untrainable calls are not calls here: a reward that follows one goes
to the trainable call before it.

**AIR signals** (:func:`air_counts`; keys in :mod:`agentbolt.types.training`):

- a *tool call* is a span with OpenInference ``openinference.span.kind == "TOOL"`` or OpenTelemetry GenAI
  ``gen_ai.operation.name == "execute_tool"``; it failed when its status is ``ERROR``, else it succeeded. Plain
  ``@operation`` spans (``agentbolt.operation``) are not tool calls: the decorator wraps any function.
- an *exception* is an ``agentbolt.exception`` span (``emit_exception``), or an ``agentbolt.operation`` span with
  status ``ERROR`` that is the innermost failure (no ``ERROR`` child operation or exception span: one raised
  exception propagating through three nested operations counts once); spans inside a tool call (a tool span
  among their ancestors) are left out, the tool's failure already counts.
- ``air.format_valid`` is not derived from spans (the adapter cannot know the agent's expected format); it is left
  unset.

**Infrastructure failures** (:func:`infrastructure_failure`): an attempt that ended ``timeout`` or
``unresponsive``, or whose gateway recorded a call that failed for a backend reason (``agentbolt.llm.error_code``
in :data:`INFRA_ERROR_CODES`: the backend was unavailable, the upstream server failed, or the gateway itself
failed), says nothing about the policy; it is excluded from training and counted, never scored 0.
``context_length_exceeded`` and ``invalid_value`` are the agent's own doing and are not infrastructure failures.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Final

from agentbolt import semconv
from agentbolt.types import Span
from agentbolt.types.core import AttemptStatus
from agentbolt.types.training import AIR_EXCEPTIONS, AIR_TOOL_CALLS_FAILED, AIR_TOOL_CALLS_OK

OI_SPAN_KIND_TOOL: Final = "TOOL"
"""OpenInference span kind of a tool call."""
GEN_AI_OPERATION_EXECUTE_TOOL: Final = "execute_tool"
"""OpenTelemetry GenAI ``gen_ai.operation.name`` of a tool call."""
INFRA_ERROR_CODES: Final = frozenset({"upstream_error", "backend_unavailable", "internal_error"})
"""``agentbolt.llm.error_code`` values that mean the serving side failed, not the agent (502, 503, 500)."""
INFRA_ATTEMPT_STATUSES: Final = frozenset({AttemptStatus.TIMEOUT, AttemptStatus.UNRESPONSIVE})
"""Attempt statuses that mean the attempt was lost, not that the agent failed."""

_ERROR = "ERROR"


def _window_of(call_sequence_ids: Sequence[int], sequence_id: int) -> int | None:
    """Index of the call whose window holds ``sequence_id`` (``None``: before the first call)."""
    t = bisect.bisect_left(call_sequence_ids, sequence_id) - 1
    return t if t >= 0 else None


def attach_rewards(
    call_sequence_ids: Sequence[int], rewards: Sequence[tuple[int, float]]
) -> tuple[list[list[tuple[int, float]]], int]:
    """Attach each reward to the latest call recorded before it (module docstring).

    Args:
        call_sequence_ids: ``(T,)`` sequence ids of the trainable LLM calls, increasing.
        rewards: ``(sequence_id, value)`` of the reward spans, any order.

    Returns:
        ``(attached_T, unattached)``: for each call, its ``(sequence_id, value)`` rewards in sequence order, and the
        number of rewards recorded before the first call (attached to none).

    Example: calls at 2 and 5, rewards at 1, 3, 4, 9 -> ``[[(3, .), (4, .)], [(9, .)]]`` and 1 unattached.
    """
    attached: list[list[tuple[int, float]]] = [[] for _ in call_sequence_ids]
    unattached = 0
    for sequence_id, value in sorted(rewards):
        t = _window_of(call_sequence_ids, sequence_id)
        if t is None:
            unattached += 1
        else:
            attached[t].append((sequence_id, value))
    return attached, unattached


def is_tool_span(span: Span) -> bool:
    """A tool call: OpenInference kind ``TOOL`` or GenAI operation ``execute_tool``."""
    attrs = span.attributes
    return (
        attrs.get(semconv.OI_SPAN_KIND) == OI_SPAN_KIND_TOOL
        or attrs.get(semconv.GEN_AI_OPERATION_NAME) == GEN_AI_OPERATION_EXECUTE_TOOL
    )


def _exception_spans(spans: Sequence[Span]) -> list[Span]:
    """Spans counted as exceptions (module docstring): exception spans and innermost failing operations, outside
    tool calls."""
    by_id = {s.span_id: s for s in spans}
    failing_children: set[str] = set()
    for s in spans:
        if (
            s.parent_id is not None
            and s.status.code == _ERROR
            and s.name in (semconv.SPAN_OPERATION, semconv.SPAN_EXCEPTION)
        ):
            failing_children.add(s.parent_id)

    def inside_tool(span: Span) -> bool:
        seen: set[str] = set()
        parent = span.parent_id
        while parent is not None and parent in by_id and parent not in seen:
            seen.add(parent)
            if is_tool_span(by_id[parent]):
                return True
            parent = by_id[parent].parent_id
        return False

    out: list[Span] = []
    for s in spans:
        counted = s.name == semconv.SPAN_EXCEPTION or (
            s.name == semconv.SPAN_OPERATION and s.status.code == _ERROR and s.span_id not in failing_children
        )
        if counted and not is_tool_span(s) and not inside_tool(s):
            out.append(s)
    return out


def air_counts(call_sequence_ids: Sequence[int], spans: Sequence[Span]) -> list[dict[str, int]]:
    """AIR counts of each call's window (module docstring): ``air.tool_calls_ok``, ``air.tool_calls_failed`` and
    ``air.exceptions``; only non-zero counts are listed (a missing key is 0).

    Args:
        call_sequence_ids: ``(T,)`` sequence ids of the trainable LLM calls, increasing.
        spans: the attempt's spans (any order; all of them, so that ancestors can be looked up).

    Returns:
        ``(T,)`` dicts of metadata key -> count.
    """
    counts: list[dict[str, int]] = [{} for _ in call_sequence_ids]

    def add(sequence_id: int, key: str) -> None:
        t = _window_of(call_sequence_ids, sequence_id)
        if t is not None:
            counts[t][key] = counts[t].get(key, 0) + 1

    for span in spans:
        if is_tool_span(span):
            add(span.sequence_id, AIR_TOOL_CALLS_FAILED if span.status.code == _ERROR else AIR_TOOL_CALLS_OK)
    for span in _exception_spans(spans):
        add(span.sequence_id, AIR_EXCEPTIONS)
    return counts


def infrastructure_failure(attempt_status: AttemptStatus | str, spans: Sequence[Span]) -> str | None:
    """Why an attempt failed for infrastructure reasons, or ``None`` when it did not (module docstring).

    Returns:
        ``"attempt timeout"`` / ``"attempt unresponsive"``, or ``"gateway error <code>"`` naming the first (in
        sequence order) LLM span whose ``agentbolt.llm.error_code`` is in :data:`INFRA_ERROR_CODES`.
    """
    status = AttemptStatus(attempt_status)
    if status in INFRA_ATTEMPT_STATUSES:
        return f"attempt {status.value}"
    for span in sorted(spans, key=lambda s: s.sequence_id):
        if span.name == semconv.SPAN_LLM_CALL:
            code = span.attributes.get(semconv.LLM_ERROR_CODE)
            if code in INFRA_ERROR_CODES:
                return f"gateway error {code}"
    return None
