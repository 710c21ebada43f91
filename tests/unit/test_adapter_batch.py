"""select_trajectories: which finished rollouts are trained on; infrastructure failures are excluded and counted."""

from __future__ import annotations

from typing import Any

from agentbolt import semconv
from agentbolt.adapter.batch import select_trajectories
from agentbolt.types import Attempt, Rollout, RolloutStatus, Span, SpanStatus
from agentbolt.types.core import AttemptStatus


def _rollout(rollout_id: str, status: RolloutStatus, final_reward: float | None = None) -> Rollout:
    return Rollout(rollout_id=rollout_id, input={}, enqueue_time=1.0, status=status, final_reward=final_reward)


def _attempt(rollout_id: str, status: AttemptStatus) -> Attempt:
    return Attempt(rollout_id=rollout_id, attempt_id=f"at-{rollout_id}", sequence_id=1, status=status, start_time=1.0)


def _span(rollout_id: str, sequence_id: int, name: str, attributes: dict[str, Any], status: str = "OK") -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=f"at-{rollout_id}",
        sequence_id=sequence_id,
        span_id=f"sp-{rollout_id}-{sequence_id}",
        trace_id="tr",
        name=name,
        start_time=1.0,
        attributes=attributes,
        status=SpanStatus(code=status),
    )


def _llm(rollout_id: str, sequence_id: int) -> Span:
    return _span(
        rollout_id,
        sequence_id,
        semconv.SPAN_LLM_CALL,
        {
            semconv.LLM_PROMPT_TOKEN_IDS: [1],
            semconv.LLM_RESPONSE_TOKEN_IDS: [2],
            semconv.LLM_RESPONSE_LOGPROBS: [-0.1],
            semconv.LLM_TRAINABLE: True,
        },
    )


def _failed_llm(rollout_id: str, sequence_id: int, code: str) -> Span:
    attrs = {semconv.LLM_ERROR: "x", semconv.LLM_ERROR_CODE: code, semconv.LLM_TRAINABLE: False}
    return _span(rollout_id, sequence_id, semconv.SPAN_LLM_CALL, attrs, status="ERROR")


def _reward(rollout_id: str, sequence_id: int, value: float) -> Span:
    return _span(rollout_id, sequence_id, semconv.SPAN_REWARD, {semconv.REWARD_VALUE: value})


def test_infrastructure_failures_are_excluded_and_counted_never_scored_zero() -> None:
    ok, done = RolloutStatus.SUCCEEDED, AttemptStatus.SUCCEEDED
    finished = [
        # trained
        (_rollout("r1", ok), _attempt("r1", done), [_llm("r1", 1), _reward("r1", 2, 1.0)]),
        # timed out (retries exhausted): infrastructure
        (_rollout("r2", RolloutStatus.FAILED), _attempt("r2", AttemptStatus.TIMEOUT), [_llm("r2", 1)]),
        # the agent caught a 502 and returned 0: infrastructure, not a 0 to train on
        (
            _rollout("r3", ok, final_reward=0.0),
            _attempt("r3", done),
            [_llm("r3", 1), _failed_llm("r3", 2, "upstream_error"), _reward("r3", 3, 0.0)],
        ),
        # the agent raised: failed, not infrastructure
        (_rollout("r4", RolloutStatus.FAILED), _attempt("r4", AttemptStatus.FAILED), [_llm("r4", 1)]),
        # never ran
        (_rollout("r5", RolloutStatus.CANCELLED), None, []),
        # lost worker
        (_rollout("r6", RolloutStatus.FAILED), _attempt("r6", AttemptStatus.UNRESPONSIVE), []),
        # prompt too long is the agent's doing: its scored trajectory is trained
        (
            _rollout("r7", ok),
            _attempt("r7", done),
            [_llm("r7", 1), _failed_llm("r7", 2, "context_length_exceeded"), _reward("r7", 3, 0.0)],
        ),
    ]
    selection = select_trajectories(finished)
    assert [t.rollout_id for t in selection.trajectories] == ["r1", "r7"]
    assert selection.infra_failures == {
        "attempt timeout": 1,
        "gateway error upstream_error": 1,
        "attempt unresponsive": 1,
    }
    assert selection.n_infra_failed == 3
    assert selection.n_failed == 2  # r4, r5
    assert selection.n_unmatched == 0
    # 2 trained + 3 infra + 2 failed = the 7 rollouts, each counted once
