"""The record of what each update trained on (``put_trained_samples`` / ``query_trained_samples``), run against every
backend in ``conftest.BACKENDS``.

Pinned semantics:
- a write holds one step's samples and replaces whatever that step held before (an empty write leaves it empty);
  other steps are untouched;
- all or nothing: a sample naming an unknown rollout, or an attempt of another rollout, is a NotFoundError and
  nothing of the write is stored; a sample of another step or a repeated ``sample_index`` is a ConfigError;
- reads filter by rollout and/or step (``[]`` when nothing matches, unknown rollouts included) and come back by
  ``train_step`` then ``sample_index``, equal to what was written (floats exact, ``gae`` token lists included).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from agentbolt.errors import ConfigError, NotFoundError
from agentbolt.store import LightningStore
from agentbolt.types import TrainedCall, TrainedSample

Run = Callable[[Callable[[LightningStore], Awaitable[None]]], None]


async def _attempt(store: LightningStore) -> tuple[str, str]:
    rollout = await store.enqueue_rollout({"q": 1})
    claimed = await store.claim_rollout("w-1")
    assert claimed is not None and claimed.rollout.rollout_id == rollout.rollout_id
    return rollout.rollout_id, claimed.attempt.attempt_id


def _sample(
    train_step: int, sample_index: int, rollout_id: str, attempt_id: str, *, advantage: float = 0.1 + 0.2
) -> TrainedSample:
    """Two merged calls: prompt [0, 3) + response [3, 5), then tool tokens [5, 7) + response [7, 9)."""
    return TrainedSample(
        train_step=train_step,
        sample_index=sample_index,
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        calls=[
            TrainedCall(span_id="00000000000000a1", response_start=3, response_end=5, reward=0.81),
            TrainedCall(
                span_id="00000000000000a2",
                response_start=7,
                response_end=9,
                reward=0.9,
                staleness=1,
                staleness_weight=0.5,
            ),  # fmt: skip
        ],
        loss_mask_ranges=[(3, 5), (7, 9)],
        advantage=advantage,
        sampling_temperature=0.7,
        advantage_estimator="rloo",
        credit_assignment="discounted",
    )


def test_trained_samples_round_trip_and_filter(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        (r1, a1), (r2, a2) = await _attempt(store), await _attempt(store)
        gae = _sample(2, 0, r1, a1, advantage=0.0).model_copy(
            update={"token_advantages": [0.25, -1 / 3, 1e-300, 2.5], "token_returns": [1.0, 0.5, 0.0, -0.125]}
        )
        step1 = [_sample(1, 1, r2, a2, advantage=-0.0625), _sample(1, 0, r1, a1)]  # stored by sample_index
        await store.put_trained_samples(1, step1)
        await store.put_trained_samples(2, [gae])

        everything = await store.query_trained_samples()
        assert everything == [step1[1], step1[0], gae]  # by step, then sample_index; floats exact
        assert everything[2].token_advantages == [0.25, -1 / 3, 1e-300, 2.5]
        assert await store.query_trained_samples(rollout_id=r1) == [step1[1], gae]
        assert await store.query_trained_samples(train_step=1) == [step1[1], step1[0]]
        assert await store.query_trained_samples(rollout_id=r2, train_step=1) == [step1[0]]
        assert await store.query_trained_samples(rollout_id=r2, train_step=2) == []
        assert await store.query_trained_samples(rollout_id="ro-unknown") == []
        assert await store.query_trained_samples(train_step=7) == []
        assert everything[0].loss_mask() == [0, 0, 0, 1, 1, 0, 0, 1, 1]
        assert everything[0].calls[1].staleness == 1 and everything[0].trained is True

    run_with_store(body)


def test_a_step_is_replaced_whole(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        (r1, a1), (r2, a2) = await _attempt(store), await _attempt(store)
        await store.put_trained_samples(1, [_sample(1, 0, r1, a1), _sample(1, 1, r2, a2)])
        await store.put_trained_samples(2, [_sample(2, 0, r2, a2)])
        redo = _sample(1, 0, r2, a2, advantage=1.5)
        await store.put_trained_samples(1, [redo])  # a resumed run redoing step 1
        assert await store.query_trained_samples(train_step=1) == [redo]
        assert await store.query_trained_samples(rollout_id=r1) == []
        await store.put_trained_samples(1, [])
        assert [s.train_step for s in await store.query_trained_samples()] == [2]

    run_with_store(body)


def test_bad_writes_store_nothing(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        (r1, a1), (r2, a2) = await _attempt(store), await _attempt(store)
        kept = _sample(1, 0, r1, a1)
        await store.put_trained_samples(1, [kept])
        for bad in (
            [_sample(1, 0, r2, a2), _sample(1, 1, "ro-unknown", a1)],
            [_sample(1, 0, r2, a2), _sample(1, 1, r2, a1)],  # an attempt of another rollout
            [_sample(1, 0, r2, "at-unknown")],
        ):
            with pytest.raises(NotFoundError):
                await store.put_trained_samples(1, bad)
        with pytest.raises(ConfigError, match="of step 2, not of step 1"):
            await store.put_trained_samples(1, [_sample(2, 0, r2, a2)])
        with pytest.raises(ConfigError, match="sample_index 0"):
            await store.put_trained_samples(1, [_sample(1, 0, r2, a2), _sample(1, 0, r1, a1)])
        assert await store.query_trained_samples() == [kept]

    run_with_store(body)
