"""Adapter rules after each LLM call: reward attachment, AIR signals, infrastructure failures (hand-built spans)."""

from __future__ import annotations

from typing import Any

import pytest

from agentbolt import semconv
from agentbolt.adapter import build_trajectory
from agentbolt.adapter.credit import AIRWeights, intermediate
from agentbolt.adapter.signals import air_counts, attach_rewards, infrastructure_failure, is_tool_span
from agentbolt.types import Rollout, Span, SpanStatus
from agentbolt.types.core import AttemptStatus

ROLLOUT_ID = "ro-1"
ATTEMPT_ID = "at-1"


def _span(
    sequence_id: int,
    name: str,
    attributes: dict[str, Any] | None = None,
    *,
    status: str = "UNSET",
    parent: int | None = None,
) -> Span:
    return Span(
        rollout_id=ROLLOUT_ID,
        attempt_id=ATTEMPT_ID,
        sequence_id=sequence_id,
        span_id=f"sp-{sequence_id}",
        trace_id="tr-1",
        parent_id=None if parent is None else f"sp-{parent}",
        name=name,
        start_time=1000.0,
        end_time=1000.0 + sequence_id,
        attributes=attributes or {},
        status=SpanStatus(code=status),
    )


def _llm(sequence_id: int, **extra: Any) -> Span:
    attributes: dict[str, Any] = {
        semconv.LLM_PROMPT_TOKEN_IDS: [1, 2],
        semconv.LLM_RESPONSE_TOKEN_IDS: [3],
        semconv.LLM_RESPONSE_LOGPROBS: [-0.5],
        semconv.LLM_TRAINABLE: True,
    }
    status = extra.pop("status", "OK")
    attributes.update(extra)
    return _span(sequence_id, semconv.SPAN_LLM_CALL, attributes, status=status)


def _tool(sequence_id: int, *, status: str = "OK", genai: bool = False, parent: int | None = None) -> Span:
    attrs = {semconv.GEN_AI_OPERATION_NAME: "execute_tool"} if genai else {semconv.OI_SPAN_KIND: "TOOL"}
    return _span(sequence_id, "tool", attrs, status=status, parent=parent)


def _reward(sequence_id: int, value: float) -> Span:
    return _span(sequence_id, semconv.SPAN_REWARD, {semconv.REWARD_VALUE: value})


def test_attach_rewards_to_latest_call_before_each() -> None:
    # calls at 2 and 5; reward 1 precedes every call; 3 and 4 follow call 2; 9 follows call 5.
    attached, unattached = attach_rewards([2, 5], [(9, 1.0), (1, 0.5), (3, 0.1), (4, 0.2)])
    assert attached == [[(3, 0.1), (4, 0.2)], [(9, 1.0)]]
    assert unattached == 1


def test_attach_rewards_without_calls_attaches_nothing() -> None:
    assert attach_rewards([], [(1, 1.0)]) == ([], 1)


def _trace() -> list[Span]:
    """Three trainable calls (1, 5, 12) and what each one's response led to."""
    return [
        _llm(1),
        _tool(2),  # call 1: tool ok
        _tool(3, status="ERROR"),  # call 1: tool failed
        _span(4, semconv.SPAN_EXCEPTION, status="ERROR"),  # call 1: emit_exception
        _llm(5),
        _tool(6, genai=True),  # call 5: GenAI execute_tool, ok
        # One exception raised in op 7 and propagated through op 8: counted once (innermost failing operation).
        _span(7, semconv.SPAN_OPERATION, status="ERROR", parent=8),
        _span(8, semconv.SPAN_OPERATION, status="ERROR"),
        _span(9, semconv.SPAN_OPERATION, status="OK"),  # a plain operation that worked: no signal
        _llm(10, status="ERROR", **{semconv.LLM_ERROR_CODE: "context_length_exceeded"}),  # not a call for windows
        _reward(11, 0.3),  # after the failed call 10: goes to the trainable call 5
        _llm(12),
        # An operation failing inside a tool: the tool's failure counts, the operation does not.
        _span(13, semconv.SPAN_OPERATION, status="ERROR", parent=14),
        _tool(14, status="ERROR"),
        _reward(15, 1.0),  # the final reward: attached to the last call
    ]


def test_air_counts_per_window() -> None:
    assert air_counts([1, 5, 12], _trace()) == [
        {"air.tool_calls_ok": 1, "air.tool_calls_failed": 1, "air.exceptions": 1},
        {"air.tool_calls_ok": 1, "air.exceptions": 1},
        {"air.tool_calls_failed": 1},
    ]


def test_tool_span_kinds() -> None:
    assert is_tool_span(_tool(1)) and is_tool_span(_tool(1, genai=True))
    assert not is_tool_span(_span(1, semconv.SPAN_OPERATION))


def test_build_trajectory_attaches_rewards_and_air_signals() -> None:
    trajectory = build_trajectory(
        Rollout(rollout_id=ROLLOUT_ID, input={}, enqueue_time=1.0), ATTEMPT_ID, list(reversed(_trace()))
    )
    assert trajectory.final_reward == 1.0
    assert [t.metadata for t in trajectory.transitions] == [
        {"sequence_id": 1, "air.tool_calls_ok": 1, "air.tool_calls_failed": 1, "air.exceptions": 1},
        {"sequence_id": 5, "air.tool_calls_ok": 1, "air.exceptions": 1, "rewards": [[11, 0.3]]},
        {"sequence_id": 12, "air.tool_calls_failed": 1, "rewards": [[15, 1.0]]},
    ]
    # AIR over broadcast with the default weights (failed tool -0.1, exception -0.2, ok 0):
    #   call 1: 1.0 - 0.1 - 0.2 = 0.7; call 5: 1.0 - 0.2 = 0.8; call 12: 1.0 - 0.1 = 0.9
    assert intermediate(AIRWeights())(trajectory) == pytest.approx([0.7, 0.8, 0.9])


def test_returned_value_wins_over_emitted_final_reward() -> None:
    # The agent returned 0.5 (rollout.final_reward) and also emitted an unnamed reward 1.0 last: 0.5 is the outcome.
    rollout = Rollout(rollout_id=ROLLOUT_ID, input={}, enqueue_time=1.0, final_reward=0.5)
    trajectory = build_trajectory(rollout, ATTEMPT_ID, [_llm(1), _reward(2, 1.0)])
    assert trajectory.final_reward == 0.5
    assert trajectory.transitions[0].metadata["rewards"] == [[2, 1.0]]  # the emitted reward is still attached


@pytest.mark.parametrize(
    ("status", "spans", "expected"),
    [
        (AttemptStatus.TIMEOUT, [], "attempt timeout"),
        ("unresponsive", [], "attempt unresponsive"),
        (
            AttemptStatus.SUCCEEDED,
            [_llm(1), _llm(2, status="ERROR", **{semconv.LLM_ERROR_CODE: "upstream_error"})],
            "gateway error upstream_error",
        ),
        (
            AttemptStatus.FAILED,
            [_llm(1, status="ERROR", **{semconv.LLM_ERROR_CODE: "backend_unavailable"})],
            "gateway error backend_unavailable",
        ),
        # The agent's own doing: not infrastructure.
        (
            AttemptStatus.SUCCEEDED,
            [_llm(1, status="ERROR", **{semconv.LLM_ERROR_CODE: "context_length_exceeded"})],
            None,
        ),
        (AttemptStatus.FAILED, [_llm(1)], None),
    ],
)
def test_infrastructure_failure(status: AttemptStatus | str, spans: list[Span], expected: str | None) -> None:
    assert infrastructure_failure(status, spans) == expected
