"""select_trajectories: which finished rollouts are trained on; infrastructure failures are excluded and counted."""

from __future__ import annotations

import math
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


def test_lightning_rl_batch_selects_credits_and_scores_a_group() -> None:
    """Two rollouts of one task (one group, rewards 1 and 0) and a failed one: GRPO advantages
    (R - mean) / (std + 1e-6) with the sample std sqrt(0.5) (Shao et al. 2024, arXiv:2402.03300; ddof=1 as in
    agentbolt.adapter.advantages), so +-0.5 / (0.7071068 + 1e-6); broadcast credit gives each call its rollout's
    reward; the staleness bound applies only under asynchronous training."""
    from agentbolt.adapter.lightning_rl import LightningRL
    from agentbolt.config import GRPOConfig

    ok, done = RolloutStatus.SUCCEEDED, AttemptStatus.SUCCEEDED
    r1, r2 = (_rollout(r, ok).model_copy(update={"metadata": {"task_id": "t"}}) for r in ("r1", "r2"))
    finished = [
        (r1, _attempt("r1", done), [_llm("r1", 1), _llm("r1", 2), _reward("r1", 3, 1.0)]),
        (r2, _attempt("r2", done), [_llm("r2", 1), _reward("r2", 2, 0.0)]),
        (_rollout("r3", RolloutStatus.FAILED), _attempt("r3", AttemptStatus.FAILED), [_llm("r3", 1)]),
    ]
    algorithm = LightningRL(GRPOConfig(merge_samples=False), agent_match=None)
    batch = algorithm.batch(finished, versions=["base"])
    assert [t.rollout_id for t in batch.trajectories] == ["r1", "r2"] and batch.selection.n_failed == 1
    assert batch.rewards == [1.0, 0.0] and batch.n_transitions == 3
    assert [t.reward for t in batch.trajectories[0].transitions] == [1.0, 1.0]  # broadcast credit
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert [(s.rollout_id, s.advantage) for s in batch.samples] == [("r1", a), ("r1", a), ("r2", -a)]
    assert batch.batch_span_ids == ["sp-r1-1", "sp-r1-2", "sp-r2-1"]
    assert batch.kept_by_agent == {"(unnamed)": 3} and batch.staleness is None and not algorithm.needs_values
    assert LightningRL(GRPOConfig(async_rollouts=1)).staleness_settings(["base", "step-1"]) is not None
