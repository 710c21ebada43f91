"""The store's reward rules, run unchanged against every backend in ``conftest.BACKENDS`` (memory, sqlite, the HTTP
client over a real server, postgres).

Pinned semantics (``agentbolt.store.rules``, ``agentbolt.types.rewards``):
- a reward span's value must be a finite number or a bool and is stored as a float; a string (``"1"`` too), ``None``,
  NaN, a missing value refuse the whole call with ``RewardError`` naming the value, and nothing is stored;
- ``final_reward`` follows the same rule;
- a reward span (named or not) for an attempt that has ended is refused with ``ConflictError`` and nothing of the
  call is stored; other spans of an ended attempt are still stored; the rollout's reward never changes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agentbolt import semconv
from agentbolt.adapter import build_trajectory
from agentbolt.errors import ConflictError, RewardError
from agentbolt.store import LightningStore
from agentbolt.types import AttemptStatus, RolloutConfig, RolloutStatus, Span

Run = Callable[[Callable[[LightningStore], Awaitable[None]]], None]
A = AttemptStatus


def _span(ids: tuple[str, str], name: str, span_id: str = "00f067aa0ba902b7", **attributes: Any) -> Span:
    return Span(
        rollout_id=ids[0],
        attempt_id=ids[1],
        span_id=span_id,
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        name=name,
        start_time=time.time(),
        end_time=time.time(),
        attributes=attributes,
    )


def _reward(ids: tuple[str, str], value: Any, span_id: str = "00f067aa0ba902b7", **extra: Any) -> Span:
    return _span(ids, semconv.SPAN_REWARD, span_id, **{semconv.REWARD_VALUE: value}, **extra)


async def _running(store: LightningStore, config: RolloutConfig | None = None) -> tuple[str, str]:
    rollout = await store.enqueue_rollout("task", config=config)
    claimed = await store.claim_rollout("w-1")
    assert claimed is not None
    await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, A.RUNNING)
    return rollout.rollout_id, claimed.attempt.attempt_id


def test_reward_values_are_coerced_or_refused_with_nothing_stored(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        ids = await _running(store)
        stored = await store.add_span(_reward(ids, True))
        assert stored.attributes[semconv.REWARD_VALUE] == 1.0
        await store.add_spans([_reward(ids, 0), _reward(ids, 0.25, **{semconv.REWARD_NAME: "format"})])
        for value, shown in (("1", "'1' (str)"), (None, "None (NoneType)"), (float("nan"), "nan (float)")):
            with pytest.raises(RewardError) as info:
                await store.add_spans([_span(ids, "tool.call"), _reward(ids, value, span_id="00000000000000bb")])
            assert shown in str(info.value) and "'00000000000000bb'" in str(info.value)
        with pytest.raises(RewardError, match="None"):
            await store.add_span(_span(ids, semconv.SPAN_REWARD))  # no value at all
        spans = await store.query_spans(ids[0])
        assert [(s.sequence_id, s.attributes[semconv.REWARD_VALUE]) for s in spans] == [(1, 1.0), (2, 0.0), (3, 0.25)]
        assert all(type(s.attributes[semconv.REWARD_VALUE]) is float for s in spans)

    run_with_store(body)


def test_final_reward_follows_the_same_rule(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        ids = await _running(store)
        for value in ("1", float("nan"), float("inf")):
            with pytest.raises(RewardError, match="is not a reward"):
                await store.update_attempt(*ids, A.SUCCEEDED, final_reward=value)  # type: ignore[arg-type]
        assert (await store.get_rollout(ids[0])).status is RolloutStatus.RUNNING
        await store.update_attempt(*ids, A.SUCCEEDED, final_reward=True)  # type: ignore[arg-type]
        assert (await store.get_rollout(ids[0])).final_reward == 1.0

    run_with_store(body)


def test_a_reward_after_the_end_is_refused_and_the_reward_never_changes(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        ids = await _running(store)
        await store.add_span(_reward(ids, 0.0))
        await store.update_attempt(*ids, A.SUCCEEDED)  # no final_reward: the last unnamed reward span is the outcome
        rollout = await store.get_rollout(ids[0])
        before = build_trajectory(rollout, ids[1], await store.query_spans(ids[0])).final_reward
        assert before == 0.0
        for late in ([_reward(ids, 0.9)], [_span(ids, "tool.call"), _reward(ids, 0.5, **{semconv.REWARD_NAME: "x"})]):
            with pytest.raises(ConflictError) as info:
                await store.add_spans(late)
            assert ids[1] in str(info.value) and "'succeeded'" in str(info.value)
        late_call = await store.add_span(_span(ids, "agentbolt.llm_call"))  # not a reward: still stored
        assert late_call.sequence_id == 2
        spans = await store.query_spans(ids[0])
        assert [s.name for s in spans] == [semconv.SPAN_REWARD, "agentbolt.llm_call"]
        assert build_trajectory(await store.get_rollout(ids[0]), ids[1], spans).final_reward == before

    run_with_store(body)


def test_a_reward_for_a_failed_attempt_is_refused_while_its_rollout_retries(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        ids = await _running(store, RolloutConfig(max_attempts=2, retry_on=(A.FAILED,)))
        await store.update_attempt(*ids, A.FAILED)
        assert (await store.get_rollout(ids[0])).status is RolloutStatus.REQUEUING
        with pytest.raises(ConflictError, match="'failed'"):
            await store.add_span(_reward(ids, 1.0))
        assert await store.query_spans(*ids) == []

    run_with_store(body)
