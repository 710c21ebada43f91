"""Spans: one recorded operation of an attempt (OpenTelemetry's model, kept flat for storage).

Attribute keys are the constants of :mod:`agentbolt.semconv`. The store numbers spans per attempt with
``sequence_id`` (1, 2, ...) in arrival order; order by it, never by clocks.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from agentbolt.types.bounds import INT64_MAX


class SpanStatus(BaseModel):
    """OpenTelemetry span status: ``UNSET``, ``OK`` or ``ERROR`` with an optional description."""

    code: str = "UNSET"
    description: str | None = None


class Span(BaseModel):
    """One recorded operation.

    Attributes:
        rollout_id / attempt_id: the attempt the span belongs to.
        sequence_id: assigned by the store on insert (0 before that).
        span_id / trace_id / parent_id: OpenTelemetry-style ids (hex strings).
        name: span name; agentbolt's own are ``agentbolt.llm_call``, ``agentbolt.reward``, ...
        start_time / end_time: epoch seconds.
        attributes: flat map of JSON-compatible values (token id lists are lists of int).
        status: OpenTelemetry status.
    """

    rollout_id: str
    attempt_id: str
    sequence_id: int = Field(default=0, ge=0, le=INT64_MAX)
    span_id: str
    trace_id: str
    parent_id: str | None = None
    name: str
    start_time: float = Field(allow_inf_nan=False)
    end_time: float | None = Field(default=None, allow_inf_nan=False)
    attributes: dict[str, Any] = Field(default_factory=dict)
    status: SpanStatus = Field(default_factory=SpanStatus)
