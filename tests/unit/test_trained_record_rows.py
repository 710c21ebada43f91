"""The record of what an update trained on (agentbolt.trainer.trained_record): built from the real batch code.

Every expected number is worked out in the comments from the batch's own rules (``samples_for_step``), so the test
pins the record to the batch, not to a second implementation of the estimators.
"""

from __future__ import annotations

import pytest

from agentbolt.adapter.batch import StalenessSettings, samples_for_step
from agentbolt.adapter.credit import build_credit_scheme
from agentbolt.adapter.samples import SampleCall, TrainingSample
from agentbolt.errors import AgentboltError
from agentbolt.trainer.trained_record import loss_mask_ranges, trained_samples, update_can_learn
from agentbolt.types import TrainedCall, TrainedSample, Trajectory, Transition


def _call(span_id: str, prompt: list[int], response: list[int], version: str = "base") -> Transition:
    return Transition(
        prompt_token_ids=prompt,
        response_token_ids=response,
        sampling_logprobs=[-0.5] * len(response),
        span_id=span_id,
        finish_reason="stop",
        metadata={"model_version": version},
    )


def _group(version_b: str = "base") -> list[Trajectory]:
    """Rollout a: two calls, the second's prompt extends the first's prompt + response; reward 1. Rollout b: one
    call; reward 0. One task, one resources version: one group."""
    a = Trajectory(
        rollout_id="ro-a",
        attempt_id="at-a",
        task_id="t",
        resources_id="rs-1",
        transitions=[_call("sp-a1", [1, 2], [3, 4]), _call("sp-a2", [1, 2, 3, 4, 5], [6])],
        final_reward=1.0,
    )
    b = Trajectory(
        rollout_id="ro-b",
        attempt_id="at-b",
        task_id="t",
        resources_id="rs-1",
        transitions=[_call("sp-b1", [1, 2], [7], version_b)],
        final_reward=0.0,
    )
    return [a, b]


def test_rloo_discounted_records_the_batch_advantages_and_credited_rewards() -> None:
    trajectories = _group()
    batch = samples_for_step(
        trajectories, credit=build_credit_scheme("discounted", gamma=0.5), estimator="rloo"
    ).batch.samples
    records = trained_samples(
        3, batch, trajectories, advantage_estimator="rloo", credit_assignment="discounted", staleness=None
    )
    # discounted credit: a's calls get 0.5 * 1 and 1; their advantages differ, so they are not merged: 3 samples.
    assert [(r.rollout_id, r.attempt_id, r.sample_index, r.train_step) for r in records] == [
        ("ro-a", "at-a", 0, 3),
        ("ro-a", "at-a", 1, 3),
        ("ro-b", "at-b", 2, 3),
    ]
    assert [r.advantage for r in records] == [s.advantage for s in batch]
    assert len({r.advantage for r in records}) == 3  # rloo + discounted: three different values
    assert [[c.reward for c in r.calls] for r in records] == [[0.5], [1.0], [0.0]]
    assert [[(c.span_id, c.response_start, c.response_end) for c in r.calls] for r in records] == [
        [("sp-a1", 2, 4)],
        [("sp-a2", 5, 6)],
        [("sp-b1", 2, 3)],
    ]
    assert [r.loss_mask() for r in records] == [s.loss_mask for s in batch]
    assert all(r.trained and r.token_advantages is None for r in records)
    assert {(r.advantage_estimator, r.credit_assignment) for r in records} == {("rloo", "discounted")}
    assert all(c.staleness is None and c.staleness_weight == 1.0 for r in records for c in r.calls)


def test_merged_calls_and_reweighted_stale_calls() -> None:
    # The trainer is at step-1 and accepts calls 0 versions behind; reweight halves the advantage per version beyond.
    # a's calls (version base) are 1 behind -> weight 0.5; b's (step-1) are fresh. With broadcast credit a's two calls
    # keep one advantage and merge into one sample: tokens [1, 2, 3, 4, 5, 6], trained [2, 4) and [5, 6).
    trajectories = _group(version_b="step-1")
    settings = StalenessSettings(versions=("base", "step-1"), max_staleness=0, policy="reweight", decay=0.5)
    unweighted = samples_for_step(_group(), credit=build_credit_scheme("broadcast"), estimator="grpo").batch.samples
    batch = samples_for_step(
        trajectories, credit=build_credit_scheme("broadcast"), estimator="grpo", staleness=settings
    ).batch.samples
    records = trained_samples(
        1, batch, trajectories, advantage_estimator="grpo", credit_assignment="broadcast", staleness=settings
    )
    merged, single = records
    assert [(c.span_id, c.response_start, c.response_end) for c in merged.calls] == [("sp-a1", 2, 4), ("sp-a2", 5, 6)]
    assert merged.n_tokens == 6 and merged.loss_mask_ranges == [(2, 4), (5, 6)]
    assert [(c.staleness, c.staleness_weight) for c in merged.calls] == [(1, 0.5), (1, 0.5)]
    assert [(c.staleness, c.staleness_weight) for c in single.calls] == [(0, 1.0)]
    assert merged.advantage == pytest.approx(0.5 * unweighted[0].advantage) and merged.advantage == batch[0].advantage
    assert single.advantage == batch[1].advantage == unweighted[1].advantage


def test_gae_values_are_kept_for_trained_tokens_only_and_zero_advantages_are_marked_untrained() -> None:
    trajectories = _group()
    gae = TrainingSample(
        input_ids=[1, 2, 3, 4, 5, 6],
        loss_mask=[0, 0, 1, 1, 0, 1],
        sampling_logprobs=[0.0, 0.0, -0.5, -0.5, 0.0, -0.5],
        advantage=0.0,
        rollout_id="ro-a",
        token_advantages=[0.0, 0.0, 0.3, 0.2, 0.0, 0.1],
        token_returns=[0.0, 0.0, 1.0, 1.0, 0.0, 1.0],
        calls=(SampleCall("sp-a1", 2, 4), SampleCall("sp-a2", 5, 6)),
    )
    flat = TrainingSample([1, 2, 7], [0, 0, 1], [0.0, 0.0, -0.5], 0.0, "ro-b", calls=(SampleCall("sp-b1", 2, 3),))
    (with_values, zero) = trained_samples(
        1, [gae, flat], trajectories, advantage_estimator="gae", credit_assignment="broadcast"
    )
    assert with_values.token_advantages == [0.3, 0.2, 0.1] and with_values.token_returns == [1.0, 1.0, 1.0]
    assert with_values.advantages_by_position() == {2: 0.3, 3: 0.2, 5: 0.1} and with_values.trained
    assert zero.token_advantages is None and not zero.trained  # advantage exactly 0: the update skips it
    assert not update_can_learn(flat) and update_can_learn(gae)


def test_a_batch_not_made_from_the_trajectories_is_refused() -> None:
    no_calls = TrainingSample([1, 2, 7], [0, 0, 1], [0.0, 0.0, -0.5], 1.0, "ro-b")
    with pytest.raises(AgentboltError, match="no calls"):
        trained_samples(1, [no_calls], _group(), advantage_estimator="grpo", credit_assignment="broadcast")
    stranger = TrainingSample([1, 2, 7], [0, 0, 1], [0.0, 0.0, -0.5], 1.0, "ro-b", calls=(SampleCall("sp-x", 2, 3),))
    with pytest.raises(AgentboltError, match="sp-x"):
        trained_samples(1, [stranger], _group(), advantage_estimator="grpo", credit_assignment="broadcast")


def test_loss_mask_ranges() -> None:
    assert loss_mask_ranges([0, 0, 1, 1, 0, 1]) == [(2, 4), (5, 6)]
    assert loss_mask_ranges([0, 0]) == [] and loss_mask_ranges([]) == []
    assert loss_mask_ranges([0, 1, 1, 1]) == [(1, 4)]


def test_trained_sample_checks_its_offsets() -> None:
    good = TrainedSample(
        train_step=1,
        sample_index=0,
        rollout_id="ro-1",
        attempt_id="at-1",
        calls=[
            TrainedCall(span_id="sp-1", response_start=3, response_end=5),
            TrainedCall(span_id="sp-2", response_start=7, response_end=9),
        ],
        loss_mask_ranges=[(3, 5), (7, 9)],
        advantage=0.1 + 0.2,
        advantage_estimator="rloo",
        credit_assignment="discounted",
    )
    assert good.n_tokens == 9 and good.trained_positions() == [3, 4, 7, 8]
    assert good.advantages_by_position() == dict.fromkeys([3, 4, 7, 8], 0.1 + 0.2)
    for update in (
        {"loss_mask_ranges": [(7, 9), (3, 5)]},  # not sorted
        {"loss_mask_ranges": [(3, 10)]},  # past the end
        {"loss_mask_ranges": [(0, 2)]},  # position 0 is never trained
        {"token_advantages": [1.0]},  # one per trained token
    ):
        with pytest.raises(ValueError):
            TrainedSample.model_validate({**good.model_dump(), **update})
    with pytest.raises(ValueError):
        TrainedCall(span_id="x", response_start=5, response_end=4)
