"""The shared store rules (``agentbolt.store.rules``) on cases the contract suite cannot reach through the API."""

from __future__ import annotations

from agentbolt.store import rules
from agentbolt.types import DEFAULT_UNRESPONSIVE_S, Attempt, AttemptStatus, Rollout, RolloutConfig, RolloutStatus

A = AttemptStatus


def _pair(config: RolloutConfig, status: RolloutStatus = RolloutStatus.RUNNING) -> tuple[Rollout, Attempt]:
    rollout = Rollout(rollout_id="ro-1", input=None, status=status, config=config, enqueue_time=0.0, num_attempts=1)
    attempt = Attempt(rollout_id="ro-1", attempt_id="at-1", sequence_id=1, status=A.RUNNING, start_time=10.0)
    return rollout, attempt


def test_superseded_attempt_update_is_stored_but_leaves_the_rollout() -> None:
    rollout, attempt = _pair(RolloutConfig())
    new_rollout, new_attempt = rules.update_attempt(
        rollout, attempt, A.SUCCEEDED, is_latest=False, now=20.0, final_reward=1.0
    )
    assert new_rollout == rollout
    assert new_attempt.status is A.SUCCEEDED and new_attempt.end_time == 20.0
    assert attempt.status is A.RUNNING  # inputs are never mutated


def test_retry_decision_follows_retry_on_and_max_attempts() -> None:
    retrying = RolloutConfig(max_attempts=2, retry_on=(A.FAILED, A.TIMEOUT))
    rollout, _ = _pair(retrying)
    assert rules.rollout_event_for(rollout, A.FAILED).value == "retry"
    assert rules.rollout_event_for(rollout, A.UNRESPONSIVE).value == "fail"
    assert rules.rollout_event_for(rollout.model_copy(update={"num_attempts": 2}), A.FAILED).value == "fail"
    assert rules.rollout_event_for(rollout, A.SUCCEEDED).value == "succeed"
    assert rules.rollout_event_for(rollout, A.RUNNING).value == "start"


def test_lease_expiry_uses_start_then_last_heartbeat() -> None:
    config = RolloutConfig(timeout_seconds=100, unresponsive_seconds=5)
    _, attempt = _pair(config)
    assert rules.expired_status(config, attempt, 14.0) is None
    assert rules.expired_status(config, attempt, 15.0) is A.UNRESPONSIVE  # no heartbeat: counts from the start
    beating = attempt.model_copy(update={"last_heartbeat_time": 14.0})
    assert rules.expired_status(config, beating, 18.0) is None
    assert rules.expired_status(config, beating, 110.0) is A.TIMEOUT  # timeout wins when both apply
    ended = attempt.model_copy(update={"status": A.SUCCEEDED})
    assert rules.expired_status(config, ended, 1000.0) is None
    no_limits = RolloutConfig(unresponsive_seconds=None)
    assert rules.expired_status(no_limits, attempt, 1e9) is None  # no limits configured
    # the default config has a lease (DEFAULT_UNRESPONSIVE_S): an attempt that never beats ends
    assert rules.expired_status(RolloutConfig(), attempt, 10.0 + DEFAULT_UNRESPONSIVE_S) is A.UNRESPONSIVE


def test_claimable_and_active_statuses_come_from_the_tables() -> None:
    claimable, active = {RolloutStatus.QUEUING, RolloutStatus.REQUEUING}, {A.PREPARING, A.RUNNING}
    assert claimable == rules.CLAIMABLE_ROLLOUT_STATUSES
    assert active == rules.ACTIVE_ATTEMPT_STATUSES


def test_non_finite_final_reward_is_refused() -> None:
    import math

    import pytest

    from agentbolt.errors import ConfigError

    rollout, attempt = _pair(RolloutConfig())
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ConfigError, match="finite"):
            rules.update_attempt(rollout, attempt, A.SUCCEEDED, is_latest=True, now=20.0, final_reward=bad)
    done, _ = rules.update_attempt(rollout, attempt, A.SUCCEEDED, is_latest=True, now=20.0, final_reward=0.25)
    assert done.final_reward == 0.25


def test_a_status_a_runner_cannot_report_names_the_ones_it_can() -> None:
    import pytest

    from agentbolt.errors import InvalidTransitionError

    rollout, attempt = _pair(RolloutConfig())
    with pytest.raises(InvalidTransitionError, match="not a status a runner can report .*running, succeeded"):
        rules.update_attempt(rollout, attempt, A.PREPARING, is_latest=True, now=20.0)


def test_a_span_writes_the_heartbeat_once_per_resolution() -> None:
    beats = rules.span_refreshes_heartbeat
    assert beats(AttemptStatus.RUNNING, None, None, 5.0)  # never beaten: always write
    assert not beats(AttemptStatus.SUCCEEDED, None, 10.0, 5.0)  # ended: never
    assert not beats(AttemptStatus.RUNNING, 10.0, None, 10.99)  # no lease on silence: once a second
    assert beats(AttemptStatus.RUNNING, 10.0, None, 11.0)
    assert not beats(AttemptStatus.PREPARING, 10.0, 4.0, 10.125)  # 5% of 4 s = 0.2 s
    assert beats(AttemptStatus.PREPARING, 10.0, 4.0, 10.25)
    assert not beats(AttemptStatus.RUNNING, 10.0, 100.0, 10.99)  # 5% of 100 s is 5 s: capped at 1 s
    assert beats(AttemptStatus.RUNNING, 10.0, 100.0, 11.0)
