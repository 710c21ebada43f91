"""The failure taxonomy (agentbolt.adapter.causes), its counts per step (select_trajectories), and what a job says
about a step and about a run that had nothing to train on (agentbolt.trainer.step_report): hand-made records."""

from __future__ import annotations

from typing import Any

from agentbolt import semconv
from agentbolt.adapter.batch import select_trajectories
from agentbolt.adapter.causes import CAUSES, HINTS, count_truncated, failure_cause
from agentbolt.trainer.loop import StepResult
from agentbolt.trainer.step_report import (
    FailureWatch,
    no_update_warning,
    skipped_update_reason,
    step_line,
    update_counts,
)
from agentbolt.types import Attempt, AttemptStatus, Rollout, RolloutStatus, Span, SpanStatus

RID = "ro-1"


def _rollout(status: RolloutStatus, final_reward: float | None = None) -> Rollout:
    return Rollout(
        rollout_id=RID, input={}, status=status, enqueue_time=0.0, final_reward=final_reward, metadata={"task_id": "t"}
    )


def _attempt(status: AttemptStatus, error: dict[str, Any] | None = None) -> Attempt:
    return Attempt(rollout_id=RID, attempt_id="at-1", sequence_id=1, status=status, start_time=1.0, error=error)


def _span(seq: int, name: str, attributes: dict[str, Any], code: str = "OK") -> Span:
    return Span(
        rollout_id=RID,
        attempt_id="at-1",
        sequence_id=seq,
        span_id=f"{seq:016x}",
        trace_id="0" * 31 + "1",
        name=name,
        start_time=float(seq),
        attributes=attributes,
        status=SpanStatus(code=code),
    )


def _call(seq: int, finish: str = "stop", trainable: bool = True) -> Span:
    return _span(
        seq,
        semconv.SPAN_LLM_CALL,
        {
            semconv.LLM_PROMPT_TOKEN_IDS: [1, 2],
            semconv.LLM_RESPONSE_TOKEN_IDS: [3, 4],
            semconv.LLM_RESPONSE_LOGPROBS: [-0.1, -0.2],
            semconv.GEN_AI_RESPONSE_FINISH_REASON: [finish],
            semconv.LLM_TRAINABLE: trainable,
        },
    )


def _reward(seq: int, value: float) -> Span:
    return _span(seq, semconv.SPAN_REWARD, {semconv.REWARD_VALUE: value})


SUCCEEDED, FAILED = RolloutStatus.SUCCEEDED, RolloutStatus.FAILED
A = AttemptStatus


def test_each_cause_is_read_from_statuses_errors_and_spans() -> None:
    def cause(rollout: Rollout, attempt: Attempt | None, spans: list[Span]) -> str | None:
        found = failure_cause(rollout, attempt, spans)
        return None if found is None else found.cause

    assert cause(_rollout(RolloutStatus.QUEUING), None, []) == "never_ran"
    assert cause(_rollout(RolloutStatus.CANCELLED), _attempt(A.RUNNING), []) == "cancelled"
    assert cause(_rollout(FAILED), _attempt(A.TIMEOUT), []) == "timeout"
    assert cause(_rollout(FAILED), _attempt(A.UNRESPONSIVE), []) == "unresponsive"
    down = _span(1, semconv.SPAN_LLM_CALL, {semconv.LLM_ERROR_CODE: "backend_unavailable"}, "ERROR")
    assert cause(_rollout(SUCCEEDED, 0.0), _attempt(A.SUCCEEDED), [down, _reward(2, 0.0)]) == "backend_unavailable"
    upstream = _span(1, semconv.SPAN_LLM_CALL, {semconv.LLM_ERROR_CODE: "upstream_error"}, "ERROR")
    assert cause(_rollout(FAILED), _attempt(A.FAILED, {"type": "X"}), [upstream]) == "gateway_error"
    raised = failure_cause(_rollout(FAILED), _attempt(A.FAILED, {"type": "ValueError", "message": "boom"}), [])
    assert raised is not None and (raised.cause, raised.detail) == ("agent_exception", "ValueError: boom")
    tagged = _attempt(A.FAILED, {"type": "RewardError", "cause": "bad_reward", "message": "'1' (str) is not"})
    assert cause(_rollout(FAILED), tagged, []) == "bad_reward"
    assert cause(_rollout(FAILED), _attempt(A.FAILED, {"type": "no_reward", "cause": "no_reward"}), []) == "no_reward"
    assert cause(_rollout(FAILED), _attempt(A.FAILED, {"type": "cancelled"}), []) == "cancelled"
    assert cause(_rollout(SUCCEEDED), _attempt(A.SUCCEEDED), [_call(1)]) == "no_reward"
    assert cause(_rollout(SUCCEEDED, 1.0), _attempt(A.SUCCEEDED), [_reward(1, 1.0)]) == "no_gateway_call"
    untrainable = [_call(1, trainable=False), _reward(2, 1.0)]
    assert cause(_rollout(SUCCEEDED, 1.0), _attempt(A.SUCCEEDED), untrainable) == "no_trainable_call"
    assert cause(_rollout(SUCCEEDED, 1.0), _attempt(A.SUCCEEDED), [_call(1), _reward(2, 1.0)]) is None
    assert set(HINTS) == set(CAUSES)


def test_a_step_counts_each_excluded_rollout_once_by_cause_and_the_truncated_calls() -> None:
    def rollout(rid: str, status: RolloutStatus, reward: float | None) -> Rollout:
        return _rollout(status, reward).model_copy(update={"rollout_id": rid})

    def attempt(rid: str, status: AttemptStatus, error: dict[str, Any] | None = None) -> Attempt:
        return _attempt(status, error).model_copy(update={"rollout_id": rid})

    def spans(rid: str, *made: Span) -> list[Span]:
        return [s.model_copy(update={"rollout_id": rid}) for s in made]

    finished = [
        (rollout("r1", SUCCEEDED, 1.0), attempt("r1", A.SUCCEEDED), spans("r1", _call(1, "length"), _reward(2, 1.0))),
        (rollout("r2", SUCCEEDED, 0.0), attempt("r2", A.SUCCEEDED), spans("r2", _call(1), _call(2), _reward(3, 0.0))),
        (rollout("r3", FAILED, None), attempt("r3", A.FAILED, {"type": "KeyError", "message": "'q'"}), []),
        (rollout("r4", FAILED, None), attempt("r4", A.FAILED, {"type": "KeyError", "message": "'x'"}), []),
        (rollout("r5", FAILED, None), attempt("r5", A.TIMEOUT), []),
        (rollout("r6", SUCCEEDED, 1.0), attempt("r6", A.SUCCEEDED), spans("r6", _reward(1, 1.0))),
    ]
    selection = select_trajectories(finished)
    assert len(selection.trajectories) == 2
    assert selection.causes == {"agent_exception": 2, "timeout": 1, "no_gateway_call": 1}
    assert selection.cause_details["agent_exception"] == "KeyError: 'q'"  # the first one met
    assert (selection.n_failed, selection.n_infra_failed) == (3, 1)  # the old counts are unchanged
    assert (selection.n_truncated, selection.n_calls) == (1, 3)
    assert count_truncated(finished[0][2]) == (1, 1)


def _result(**changes: Any) -> StepResult:
    base: dict[str, Any] = {
        "train_step": 3,
        "rewards": [1.0, 0.0],
        "n_rollouts": 4,
        "n_failed": 1,
        "n_transitions": 2,
        "rollout_s": 10.0,
        "update_s": 5.0,
        "infra_failures": {"attempt timeout": 1},
        "causes": {"agent_exception": 1, "timeout": 1},
        "cause_details": {"agent_exception": "ValueError: boom"},
        "n_samples": 2,
        "n_truncated": 1,
        "n_calls": 2,
        "update_stats": {"stepped": 1.0, "n_skipped_zero_advantage": 0.0, "grad_norm": 0.5},
    }
    return StepResult(**{**base, **changes})


def test_the_step_line_names_causes_truncation_and_a_skipped_update() -> None:
    line = step_line(_result())
    assert "failed 2/4 (agent_exception 1, timeout 1)" in line
    assert "truncated 1/2 calls at max_tokens" in line
    assert "update skipped" not in line
    zero = _result(update_stats={"stepped": 0.0, "n_skipped_zero_advantage": 2.0, "grad_norm": float("nan")})
    assert skipped_update_reason(zero) == "every advantage is 0 (2 samples: each group's rollouts had the same reward)"
    assert "update skipped: every advantage is 0" in step_line(zero)
    assert skipped_update_reason(_result(n_samples=0, n_transitions=0)) == "no samples to train on"
    nan_grad = _result(update_stats={"stepped": 0.0, "n_skipped_zero_advantage": 0.0, "grad_norm": float("inf")})
    assert skipped_update_reason(nan_grad) == "the gradient norm was not finite; the gradient was dropped"


def test_the_watch_trips_after_fail_after_empty_steps_in_a_row() -> None:
    watch = FailureWatch(fail_after=2)
    empty = {"n_transitions": 0, "n_samples": 0, "rewards": [], "causes": {"no_reward": 4}, "cause_details": {}}
    watch.add(_result(**empty))
    assert not watch.tripped
    watch.add(_result())  # a step that trained resets the streak
    watch.add(_result(**empty))
    assert not watch.tripped and watch.empty_streak == 1
    watch.add(_result(**empty))
    assert watch.tripped
    assert watch.causes == {"no_reward": 12, "agent_exception": 1, "timeout": 1}
    report = watch.report()
    assert report.splitlines()[1].startswith("  no_reward x12")
    assert HINTS["no_reward"] in report and "ValueError: boom" in report
    summary = watch.to_summary()
    assert summary["stopped_for_failures"] is True and summary["failure_causes"]["no_reward"] == 12
    assert FailureWatch(fail_after=0).tripped is False


def test_a_run_shorter_than_fail_after_that_trained_nothing_fails_too() -> None:
    empty = {"n_transitions": 0, "n_samples": 0, "rewards": [], "causes": {"no_reward": 4}, "cause_details": {}}
    watch = FailureWatch(fail_after=2)
    assert not watch.failed  # no step yet
    watch.add(_result(**empty))  # the run's only step: nothing trainable
    assert not watch.tripped and watch.nothing_trained and watch.failed
    assert watch.report().startswith("no trainable trajectory in any of the 1 steps run: nothing was trained")
    assert "no checkpoint was written by this run (nothing was trained)" in watch.report()
    assert watch.to_summary()["stopped_for_failures"] is True
    watch.add(_result())
    assert not watch.failed  # one step trained
    off = FailureWatch(fail_after=0)
    off.add(_result(**empty))
    assert not off.failed  # fail_after 0: never stop for failures


def test_a_step_with_no_scored_rollout_has_no_reward(tmp_path: Any) -> None:
    from agentbolt.trainer.loop import RLTrainer
    from agentbolt.trainer.plots import plot_reward_curve

    nothing = _result(rewards=[], n_transitions=0, n_samples=0)
    assert nothing.reward_mean is None and nothing.reward_std is None  # not a reward of 0
    assert "n/a (no rollout scored)" in step_line(nothing)
    names = {metric.name for metric in RLTrainer._metrics(nothing)}
    assert "train_reward_mean" not in names and "rollout_s" in names
    scored = _result(rewards=[1.0, 0.0])
    assert (scored.reward_mean, scored.reward_std) == (0.5, 0.5)
    assert {m.name: m.value for m in RLTrainer._metrics(scored)}["train_reward_mean"] == 0.5
    plot_reward_curve(tmp_path / "curve.png", [0.5, None, 0.25], {"val": 0.1}, {"val": 0.2})  # a gap at step 2
    assert (tmp_path / "curve.png").stat().st_size > 0


def test_untrainable_calls_of_trained_rollouts_are_counted_and_named() -> None:
    skipped = _call(2)
    skipped.attributes[semconv.LLM_TRAINABLE] = False
    skipped.attributes[semconv.LLM_NOT_TRAINABLE_REASON] = "llama.cpp gave no probability for 1 of 2 ids"
    spans = [_call(1), skipped, _call(3, trainable=False), _reward(4, 1.0)]
    selection = select_trajectories([(_rollout(SUCCEEDED, 1.0), _attempt(A.SUCCEEDED), spans)])
    assert len(selection.trajectories) == 1 and selection.n_calls == 1  # only the trainable call is trained
    assert selection.untrainable_calls == {"llama.cpp gave no probability for 1 of 2 ids": 1, "not trainable": 1}
    line = step_line(_result(untrainable_calls=selection.untrainable_calls))
    assert "untrainable calls 2 (left out; e.g. llama.cpp gave no probability for 1 of 2 ids)" in line
    assert "untrainable" not in step_line(_result())


def test_updates_are_counted_per_reason_and_a_run_without_any_is_warned_about() -> None:
    zero = "every advantage is 0 (8 samples: each group's rollouts had the same reward)"
    rows = [{"update_skipped": zero}, {"update_skipped": None}, {"update_skipped": "no samples to train on"}]
    assert update_counts(rows) == (1, {"every advantage is 0": 1, "no samples to train on": 1})
    assert no_update_warning(rows, "m") is None  # one step moved the weights
    assert no_update_warning([], "m") is None  # no step ran: nothing to say here
    warning = no_update_warning([rows[0], rows[0], rows[2]], "qwen2.5-0.5b")
    assert warning is not None
    head, *hints = warning.splitlines()
    assert head.startswith(
        "warning: no step updated the weights (3 steps, every update skipped: every advantage is 0 x2, "
        "no samples to train on x1). The checkpoints hold the weights this run started from (qwen2.5-0.5b, untrained)"
    )
    assert len(hints) == 2 and "grpo.group_size" in hints[0] and "failure causes" in hints[1]
    nan = "the gradient norm was not finite; the gradient was dropped"
    assert update_counts([{"update_skipped": nan}]) == (0, {"the gradient norm was not finite": 1})
