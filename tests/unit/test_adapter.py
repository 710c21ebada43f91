"""build_trajectory: spans of one attempt -> Trajectory, built by hand."""

from __future__ import annotations

from typing import Any

import pytest

from agentbolt import semconv
from agentbolt.adapter import build_trajectory
from agentbolt.adapter.trajectory import accuracy_reward, is_correct
from agentbolt.errors import ConfigError
from agentbolt.types import Rollout, Span, SpanStatus, TrajectoryFlag

ROLLOUT_ID = "ro-1"
ATTEMPT_ID = "at-1"


def _span(
    sequence_id: int, name: str, attributes: dict[str, Any], *, status: str = "OK", attempt_id: str = ATTEMPT_ID
) -> Span:
    return Span(
        rollout_id=ROLLOUT_ID,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        span_id=f"sp-{attempt_id}-{sequence_id}",
        trace_id="tr-1",
        name=name,
        start_time=1000.0 + sequence_id,
        end_time=1000.5 + sequence_id,
        attributes=attributes,
        status=SpanStatus(code=status),
    )


def _llm(sequence_id: int, prompt: list[int], response: list[int], **extra: Any) -> Span:
    attributes: dict[str, Any] = {
        semconv.LLM_PROMPT_TOKEN_IDS: prompt,
        semconv.LLM_RESPONSE_TOKEN_IDS: response,
        semconv.LLM_RESPONSE_LOGPROBS: [-0.1 * (i + 1) for i in range(len(response))],
        semconv.LLM_TRAINABLE: True,
        semconv.LLM_MODEL_VERSION: "step-2",
        semconv.GEN_AI_RESPONSE_FINISH_REASON: ["stop"],
    }
    status = extra.pop("status", "OK")
    attributes.update(extra)
    return _span(sequence_id, semconv.SPAN_LLM_CALL, attributes, status=status)


def _reward(sequence_id: int, value: Any, name: str | None = None) -> Span:
    attributes: dict[str, Any] = {semconv.REWARD_VALUE: value}
    if name is not None:
        attributes[semconv.REWARD_NAME] = name
    return _span(sequence_id, semconv.SPAN_REWARD, attributes)


def _rollout(**kwargs: Any) -> Rollout:
    return Rollout(rollout_id=ROLLOUT_ID, input={"q": "2+2"}, enqueue_time=1.0, **kwargs)


def _spans() -> list[Span]:
    # Delivered out of order on purpose; the store's sequence_id is the truth.
    return [
        _reward(7, 1.0),  # the final (unnamed) reward
        _llm(4, [1, 2, 3, 10, 11, 4], [12, 13], **{semconv.GEN_AI_REQUEST_TEMPERATURE: 0.7}),
        _reward(5, 0.25, name="format_ok"),  # a named component: intermediate only
        _llm(3, [1, 2, 3, 10, 11], [], status="ERROR"),  # failed call (e.g. context length): never trained
        _llm(1, [1, 2, 3], [10, 11]),
        _span(2, "tool.search", {"query": "x"}),  # structure spans are ignored
        _reward(6, 0.0),  # an earlier unnamed reward: superseded by the later one
    ]


def test_transitions_follow_sequence_order_and_skip_failed_calls() -> None:
    trajectory = build_trajectory(_rollout(metadata={"task_id": "task-9"}), ATTEMPT_ID, _spans())
    assert [t.span_id for t in trajectory.transitions] == ["sp-at-1-1", "sp-at-1-4"]
    first, second = trajectory.transitions
    assert first.prompt_token_ids == [1, 2, 3]
    assert first.response_token_ids == [10, 11]
    assert first.sampling_logprobs == pytest.approx([-0.1, -0.2])
    assert first.finish_reason == "stop"
    assert first.reward is None  # credit assignment sets it, not the adapter
    assert first.metadata == {"sequence_id": 1, "model_version": "step-2"}
    assert second.metadata == {
        "sequence_id": 4,
        "model_version": "step-2",
        "temperature": 0.7,
        "rewards": [[5, 0.25], [6, 0.0], [7, 1.0]],  # every reward span after call 4 attaches to it
    }
    assert trajectory.task_id == "task-9"
    assert trajectory.rollout_id == ROLLOUT_ID and trajectory.attempt_id == ATTEMPT_ID
    assert [t.agent_name for t in trajectory.transitions] == [None, None]  # no span names an agent
    assert (trajectory.untrainable_calls, trajectory.tracer_only_calls, trajectory.excluded_calls) == (1, 0, 0)


def test_final_reward_is_last_unnamed_reward_and_all_rewards_are_intermediate() -> None:
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, _spans())
    assert trajectory.final_reward == 1.0
    assert trajectory.intermediate_rewards == [(5, 0.25), (6, 0.0), (7, 1.0)]


def test_rollout_final_reward_wins() -> None:
    trajectory = build_trajectory(_rollout(final_reward=0.5), ATTEMPT_ID, _spans())
    assert trajectory.final_reward == 0.5


def test_named_rewards_alone_give_no_final_reward() -> None:
    spans = [_llm(1, [1], [2]), _reward(2, 0.3, name="partial")]
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, spans)
    assert trajectory.final_reward is None
    assert trajectory.intermediate_rewards == [(2, 0.3)]


def test_task_id_falls_back_to_rollout_id_and_key_is_configurable() -> None:
    assert build_trajectory(_rollout(), ATTEMPT_ID, []).task_id == ROLLOUT_ID
    rollout = _rollout(metadata={"task_id": "a", "question_id": 17})
    assert build_trajectory(rollout, ATTEMPT_ID, [], task_id_key="question_id").task_id == "17"


def test_untrainable_calls_are_skipped() -> None:
    no_logprobs = _llm(2, [1], [2])
    del no_logprobs.attributes[semconv.LLM_RESPONSE_LOGPROBS]
    spans = [
        _llm(1, [1], [2], **{semconv.LLM_TRAINABLE: False}),  # e.g. served by an openai backend
        no_logprobs,
        _llm(3, [], [2], **{semconv.LLM_RESPONSE_LOGPROBS: [-0.5]}),  # no prompt ids
        _llm(4, [1, 2], [3]),  # kept; trainable flag missing would also be fine
    ]
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, spans)
    assert [t.span_id for t in trajectory.transitions] == ["sp-at-1-4"]
    assert trajectory.untrainable_calls == 3 and trajectory.flags == []


def test_spans_of_other_attempts_are_ignored() -> None:
    other = [
        _span(1, semconv.SPAN_LLM_CALL, _llm(1, [9], [9]).attributes, attempt_id="at-0"),
        _span(2, semconv.SPAN_REWARD, {semconv.REWARD_VALUE: -1.0}, attempt_id="at-0"),
    ]
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, [*other, _llm(1, [1], [2]), _reward(2, 1.0)])
    assert [t.prompt_token_ids for t in trajectory.transitions] == [[1]]
    assert trajectory.final_reward == 1.0
    assert trajectory.intermediate_rewards == [(2, 1.0)]


def test_bad_reward_values_are_ignored() -> None:
    spans = [_reward(1, "high"), _reward(2, float("nan")), _reward(3, 2)]
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, spans)
    assert trajectory.intermediate_rewards == [(3, 2.0)]
    assert trajectory.final_reward == 2.0


def test_finish_reason_may_be_a_plain_string() -> None:
    spans = [_llm(1, [1], [2], **{semconv.GEN_AI_RESPONSE_FINISH_REASON: "length"})]
    assert build_trajectory(_rollout(), ATTEMPT_ID, spans).transitions[0].finish_reason == "length"


def test_logprob_count_mismatch_is_a_gateway_bug() -> None:
    spans = [_llm(1, [1], [2, 3], **{semconv.LLM_RESPONSE_LOGPROBS: [-0.1]})]
    with pytest.raises(ConfigError, match="one logprob per generated token"):
        build_trajectory(_rollout(), ATTEMPT_ID, spans)


def test_reward_without_calls_gives_empty_trajectory() -> None:
    trajectory = build_trajectory(_rollout(), ATTEMPT_ID, [_reward(1, 1.0)])
    assert trajectory.transitions == []
    assert trajectory.final_reward == 1.0
    assert trajectory.flags == [TrajectoryFlag.REWARD_WITHOUT_CALLS] and not trajectory.trainable


def test_last_reward_reads_by_name_and_skips_invalid_values() -> None:
    from agentbolt.adapter import last_reward

    spans = [_reward(1, 0.5), _reward(2, 1.0, name="correct"), _reward(3, 0.25), _reward(4, float("nan"))]
    spans.append(_reward(5, 0.0, name="correct"))
    assert last_reward(spans) == 0.25  # seq 4 is NaN, so the unnamed 0.25 at seq 3 is the last valid one
    assert last_reward(spans, "correct") == 0.0
    assert last_reward(spans, "missing") is None
    assert last_reward([]) is None


def test_accuracy_reward_reads_the_named_reward_else_the_final_one() -> None:
    spans = sorted(_spans(), key=lambda s: s.sequence_id)  # as the store returns them: final reward 1.0 last
    assert accuracy_reward(spans, "format_ok") == 0.25
    # No reward called "correct": the README-style agent that only returns its reward is scored by it.
    assert accuracy_reward(spans, "correct") == 1.0
    assert accuracy_reward(spans, None) == 1.0
    # The rollout's final reward (set by the status call) wins over the spans, as in build_trajectory.
    assert accuracy_reward(spans, "correct", final_reward=0.0) == 0.0
    assert accuracy_reward(spans, "format_ok", final_reward=0.0) == 0.25
    assert accuracy_reward([_llm(1, [1], [2])], "correct") is None


def test_is_correct_counts_rewards_of_at_least_one() -> None:
    assert [is_correct(v) for v in (None, 0.0, 0.999, 1.0, 1.45)] == [False, False, False, True, True]
