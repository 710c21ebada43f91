"""Staleness of off-policy samples: hand-computed weights, drop and reweight on a small batch, through
samples_for_step (loss masks and advantages of the merged samples)."""

from __future__ import annotations

import pytest

from agentbolt.adapter.batch import StalenessSettings, samples_for_step
from agentbolt.adapter.credit import BROADCAST
from agentbolt.adapter.staleness import apply_staleness, staleness_weight, version_staleness
from agentbolt.errors import ConfigError
from agentbolt.types import Trajectory, Transition

VERSIONS = ("base", "step-1", "step-2")
A = 0.5 / (0.5**0.5 + 1e-6)


def test_version_staleness_counts_versions_behind_the_newest() -> None:
    assert version_staleness("step-2", VERSIONS) == 0
    assert version_staleness("step-1", VERSIONS) == 1
    assert version_staleness("base", VERSIONS) == 2
    assert version_staleness("other-run", VERSIONS) is None
    assert version_staleness(None, VERSIONS) is None
    assert version_staleness("a", ("a", "b", "a")) == 0  # a version served again counts at its latest position
    with pytest.raises(ConfigError, match="no weights version"):
        version_staleness("base", ())


def test_staleness_weight_by_hand() -> None:
    assert staleness_weight(0, 1, "drop", 0.5) == 1.0
    assert staleness_weight(1, 1, "drop", 0.5) == 1.0
    assert staleness_weight(2, 1, "drop", 0.5) == 0.0
    assert staleness_weight(2, 1, "reweight", 0.5) == 0.5  # 0.5 ** (2 - 1)
    assert staleness_weight(4, 1, "reweight", 0.5) == 0.125  # 0.5 ** 3
    assert staleness_weight(3, 0, "reweight", 0.8) == pytest.approx(0.512)  # 0.8 ** 3
    assert staleness_weight(None, 5, "reweight", 0.5) == 0.0  # unknown version: always dropped
    for bad in (lambda: staleness_weight(0, -1, "drop", 0.5), lambda: staleness_weight(0, 1, "keep", 0.5)):
        with pytest.raises(ConfigError):
            bad()
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        staleness_weight(0, 1, "reweight", 0.0)


def _t(prompt: list[int], response: list[int], version: str | None) -> Transition:
    metadata = {} if version is None else {"model_version": version}
    return Transition(
        prompt_token_ids=prompt,
        response_token_ids=response,
        sampling_logprobs=[-0.5] * len(response),
        metadata=metadata,
    )


def _batch() -> list[Trajectory]:
    # Rollout a spanned a weight swap: its first call was made by "base" (2 behind), its second by "step-2" (fresh);
    # the second call's prompt extends the first call's prompt + response, so without staleness they merge.
    a = Trajectory(
        rollout_id="a",
        attempt_id="at",
        task_id="t",
        final_reward=1.0,
        transitions=[_t([1, 2], [3], "base"), _t([1, 2, 3, 4], [5], "step-2")],
    )
    b = Trajectory(
        rollout_id="b", attempt_id="at", task_id="t", final_reward=0.0, transitions=[_t([1, 2], [6], "step-1")]
    )
    c = Trajectory(rollout_id="c", attempt_id="at", task_id="u", final_reward=1.0, transitions=[_t([7], [8], None)])
    return [a, b, c]


def test_apply_staleness_drop_and_reweight_in_place() -> None:
    trajectories = _batch()
    advantages = {"a": [1.0, 1.0], "b": [-1.0], "c": [0.5]}
    trained = {"a": [True, True], "b": [True], "c": [True]}
    report = apply_staleness(trajectories, advantages, trained, versions=VERSIONS, max_staleness=1, policy="drop")
    assert report.by_staleness == {-1: 1, 0: 1, 1: 1, 2: 1}
    assert (report.n_dropped, report.n_reweighted, report.n_unknown_version) == (2, 0, 1)
    assert trained == {"a": [False, True], "b": [True], "c": [False]}
    assert advantages == {"a": [1.0, 1.0], "b": [-1.0], "c": [0.5]}
    assert report.mean_staleness == 1.0  # (2 + 0 + 1) / 3 known transitions

    advantages = {"a": [1.0, 1.0], "b": [-1.0], "c": [0.5]}
    trained = {"a": [True, True], "b": [True], "c": [True]}
    report = apply_staleness(
        trajectories, advantages, trained, versions=VERSIONS, max_staleness=0, policy="reweight", decay=0.5
    )
    # a[0]: 2 behind -> 0.5 ** 2 = 0.25; b: 1 behind -> 0.5; c: unknown -> dropped.
    assert advantages == {"a": [0.25, 1.0], "b": [-0.5], "c": [0.5]}
    assert trained == {"a": [True, True], "b": [True], "c": [False]}
    assert (report.n_dropped, report.n_reweighted) == (1, 2)


def test_samples_for_step_applies_staleness_before_merging() -> None:
    # GRPO group "t" = rewards [1, 0]: mean 0.5, sample std sqrt(0.5) -> A_a = 0.5 / (sqrt(0.5) + 1e-6) = 0.7071058,
    # A_b = -0.7071058; group "u" has one rollout -> A_c = 0.
    settings = StalenessSettings(versions=VERSIONS, max_staleness=1, policy="drop")
    step = samples_for_step(_batch(), credit=BROADCAST, estimator="grpo", staleness=settings)
    assert step.staleness is not None and step.staleness.n_dropped == 2
    # Rollout a is still one merged sample, but the stale first response (token 3) is context only now; c (unknown
    # version) has no trained token left, so it makes no sample (its tokens still count as unmerged).
    a, b = step.batch.samples
    assert a.input_ids == [1, 2, 3, 4, 5] and a.loss_mask == [0, 0, 0, 0, 1]
    assert a.advantage == pytest.approx(A)
    assert b.loss_mask == [0, 0, 1] and b.advantage == pytest.approx(-A)
    assert step.batch.tokens_unmerged == 3 + 5 + 3 + 2

    reweight = StalenessSettings(versions=VERSIONS, max_staleness=1, policy="reweight", decay=0.5)
    step = samples_for_step(_batch(), credit=BROADCAST, estimator="grpo", staleness=reweight)
    # a's first call is 2 behind, 1 over the bound: A / 2 = 0.3535529; the calls' advantages differ, so they no
    # longer merge.
    a1, a2, b = step.batch.samples
    assert (a1.input_ids, a1.loss_mask, a1.advantage) == ([1, 2, 3], [0, 0, 1], pytest.approx(A / 2))
    assert (a2.input_ids, a2.loss_mask, a2.advantage) == ([1, 2, 3, 4, 5], [0, 0, 0, 0, 1], pytest.approx(A))
    assert b.advantage == pytest.approx(-A)

    plain = samples_for_step(_batch(), credit=BROADCAST, estimator="grpo")
    assert plain.staleness is None and plain.batch.samples[0].loss_mask == [0, 0, 1, 0, 1]
