"""``search_rollouts`` (the dashboard's rollout search), run against every backend in ``conftest.BACKENDS``.

One fixed set of six rollouts; every expected page below was worked out by hand from this table (enqueue order):

| name | input question          | mode  | resources | task_id | ends      | final_reward |
|------|-------------------------|-------|-----------|---------|-----------|--------------|
| r0   | What is 2+3?            | train | rs A      | t1      | succeeded | 1.0          |
| r1   | Book a ROOM for two     | train | rs A      | t1      | succeeded | 0.0          |
| r2   | What is 7*6?            | val   | rs A      | t2      | succeeded | 0.5          |
| r3   | room with a view        | train | rs B      | t3      | failed    | None         |
| r4   | Calc 10/2               | train | rs B      | t4      | succeeded | 0.75         |
| r5   | pending                 | train | (latest)  | t5      | queuing   | None         |
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from pydantic import ValidationError

from agentbolt.store import LightningStore, ResourceRewardStats, RolloutSearch
from agentbolt.types import AttemptStatus, PromptTemplate, Rollout, RolloutConfig, RolloutMode, RolloutStatus

Run = Callable[[Callable[[LightningStore], Awaitable[None]]], None]
A = AttemptStatus
R = RolloutStatus

QUESTIONS = ("What is 2+3?", "Book a ROOM for two", "What is 7*6?", "room with a view", "Calc 10/2", "pending")


async def _fill(store: LightningStore) -> tuple[list[Rollout], str, str]:
    """The six rollouts of the module docstring, ended as listed; returns them (fresh) and the two resources ids."""
    rs_a = (await store.add_resources({"prompt": PromptTemplate(template="a {question}")})).resources_id
    rs_b = (await store.add_resources({"prompt": PromptTemplate(template="b {question}")})).resources_id
    plan = [
        (RolloutMode.TRAIN, rs_a, "t1"),
        (RolloutMode.TRAIN, rs_a, "t1"),
        (RolloutMode.VAL, rs_a, "t2"),
        (RolloutMode.TRAIN, rs_b, "t3"),
        (RolloutMode.TRAIN, rs_b, "t4"),
        (RolloutMode.TRAIN, None, "t5"),
    ]
    ids = []
    for question, (mode, resources_id, task_id) in zip(QUESTIONS, plan, strict=True):
        rollout = await store.enqueue_rollout(
            {"question": question, "answer": 0},
            mode=mode,
            resources_id=resources_id,
            config=RolloutConfig(max_attempts=1),
            metadata={"task_id": task_id, "train_step": 3},
        )
        ids.append(rollout.rollout_id)
    endings = [(A.SUCCEEDED, 1.0), (A.SUCCEEDED, 0.0), (A.SUCCEEDED, 0.5), (A.FAILED, None), (A.SUCCEEDED, 0.75)]
    for expected_id, (status, reward) in zip(ids, endings, strict=False):
        claimed = await store.claim_rollout("w-1")
        assert claimed is not None and claimed.rollout.rollout_id == expected_id
        attempt_id = claimed.attempt.attempt_id
        await store.update_attempt(expected_id, attempt_id, A.RUNNING)
        await store.update_attempt(expected_id, attempt_id, status, final_reward=reward)
    return [await store.get_rollout(i) for i in ids], rs_a, rs_b


def test_search_filters_sort_page_and_total(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        rollouts, rs_a, rs_b = await _fill(store)
        names = {r.rollout_id: f"r{i}" for i, r in enumerate(rollouts)}

        async def page(**filters: object) -> tuple[list[str], int]:
            items, total = await store.search_rollouts(RolloutSearch.model_validate(filters))
            return [names[r.rollout_id] for r in items], total

        assert await page() == (["r0", "r1", "r2", "r3", "r4", "r5"], 6)
        assert await page(descending=True) == (["r5", "r4", "r3", "r2", "r1", "r0"], 6)
        # filters
        assert await page(status=[R.SUCCEEDED, R.FAILED]) == (["r0", "r1", "r2", "r3", "r4"], 5)
        assert await page(status=[R.FAILED]) == (["r3"], 1)
        assert await page(status=[]) == ([], 0)
        assert await page(mode=RolloutMode.VAL) == (["r2"], 1)
        assert await page(resources_id=rs_b) == (["r3", "r4"], 2)
        assert await page(resources_id=rs_a, mode=RolloutMode.TRAIN) == (["r0", "r1"], 2)
        assert await page(metadata={"task_id": "t1"}) == (["r0", "r1"], 2)
        assert await page(metadata={"task_id": "t1", "train_step": 4}) == ([], 0)
        assert await page(reward_min=0.5) == (["r0", "r2", "r4"], 3)
        assert await page(reward_min=0.5, reward_max=0.75) == (["r2", "r4"], 2)
        assert await page(reward_max=0.0) == (["r1"], 1)
        # text: case-insensitive, in the input's JSON text or the rollout id
        assert await page(text="room") == (["r1", "r3"], 2)
        assert await page(text="WHAT IS") == (["r0", "r2"], 2)
        assert await page(text="10/2") == (["r4"], 1)
        assert await page(text=rollouts[4].rollout_id.upper()) == (["r4"], 1)
        assert await page(text="") == (["r0", "r1", "r2", "r3", "r4", "r5"], 6)
        assert await page(text="no such text") == ([], 0)
        # all at once
        assert await page(status=[R.SUCCEEDED], mode=RolloutMode.TRAIN, reward_min=0.1, text="is") == (["r0"], 1)
        # sort by final_reward: missing values last in either direction, ties in (reversed) enqueue order
        assert await page(sort_by="final_reward", descending=True) == (["r0", "r4", "r2", "r1", "r5", "r3"], 6)
        assert await page(sort_by="final_reward") == (["r1", "r2", "r4", "r0", "r3", "r5"], 6)
        assert await page(sort_by="final_reward", descending=True, limit=3, offset=2) == (["r2", "r1", "r5"], 6)
        assert await page(sort_by="status", status=[R.SUCCEEDED, R.FAILED]) == (["r3", "r0", "r1", "r2", "r4"], 5)
        # paging: total counts every match, whatever the page
        assert await page(status=[R.SUCCEEDED, R.FAILED], limit=2, offset=1) == (["r1", "r2"], 5)
        assert await page(limit=2, offset=5) == (["r5"], 6)
        assert await page(offset=6) == ([], 6)
        assert await page(limit=0) == ([], 6)
        # items are whole rollouts
        items, _ = await store.search_rollouts(RolloutSearch(text="7*6"))
        assert items == [rollouts[2]]

    run_with_store(body)


def test_search_rejects_bad_arguments() -> None:
    for bad in (
        {"sort_by": "input"},
        {"limit": -1},
        {"limit": 1001},
        {"offset": -1},
        {"reward_min": 1.0, "reward_max": 0.0},
        {"metadata": {"a.b": "x"}},
        {"metadata": {"flag": True}},
    ):
        with pytest.raises(ValidationError):
            RolloutSearch.model_validate(bad)


def test_reward_stats_groups_finished_rollouts(run_with_store: Run) -> None:
    """``reward_stats`` over the table above plus three more (worked out by hand):

    | name | mode  | resources | ends      | final_reward |
    |------|-------|-----------|-----------|--------------|
    | r6   | train | (latest)  | succeeded | 0.25         |
    | r7   | val   | rs A      | cancelled | None         |
    | r8   | train | rs B      | succeeded | 0.5          |

    rs A train: r0, r1 -> n 2, rewards {1, 0}, mean 0.5; rs A val: r2 -> n 1, mean 0.5 (r7 cancelled: not finished);
    rs B train: r3 (failed, no reward), r4, r8 -> n 3, n_with_reward 2, mean (0.75 + 0.5) / 2 = 0.625;
    latest (None) train: r6 -> n 1, mean 0.25 (r5 is still queuing).
    """

    async def body(store: LightningStore) -> None:
        assert await store.reward_stats() == []
        _, rs_a, rs_b = await _fill(store)
        await store.cancel_rollout(
            (await store.enqueue_rollout({"q": "r7"}, mode=RolloutMode.VAL, resources_id=rs_a)).rollout_id
        )
        for resources_id, reward in ((None, 0.25), (rs_b, 0.5)):
            rollout = await store.enqueue_rollout({"q": "more"}, resources_id=resources_id)
            claimed = await store.claim_rollout("w-1")
            # r5 (queuing since _fill) is claimed first: end it, then claim again
            while claimed is not None and claimed.rollout.rollout_id != rollout.rollout_id:
                await store.cancel_rollout(claimed.rollout.rollout_id)
                claimed = await store.claim_rollout("w-1")
            assert claimed is not None
            attempt_id = claimed.attempt.attempt_id
            await store.update_attempt(rollout.rollout_id, attempt_id, A.RUNNING)
            await store.update_attempt(rollout.rollout_id, attempt_id, A.SUCCEEDED, final_reward=reward)
        T, V = RolloutMode.TRAIN, RolloutMode.VAL
        expected = [
            ResourceRewardStats(resources_id=None, mode=T, n=1, n_with_reward=1, mean_reward=0.25),
            ResourceRewardStats(resources_id=rs_a, mode=T, n=2, n_with_reward=2, mean_reward=0.5),
            ResourceRewardStats(resources_id=rs_a, mode=V, n=1, n_with_reward=1, mean_reward=0.5),
            ResourceRewardStats(resources_id=rs_b, mode=T, n=3, n_with_reward=2, mean_reward=0.625),
        ]
        assert rs_a < rs_b  # the order of the expected list
        assert await store.reward_stats() == expected

    run_with_store(body)


def test_reward_stats_group_without_rewards(run_with_store: Run) -> None:
    """A group whose finished rollouts all lack a reward: ``n_with_reward`` 0, ``mean_reward`` None."""

    async def body(store: LightningStore) -> None:
        rs = (await store.add_resources({"prompt": PromptTemplate(template="{q}")})).resources_id
        rollout = await store.enqueue_rollout(
            {"q": 1}, mode=RolloutMode.TEST, resources_id=rs, config=RolloutConfig(max_attempts=1)
        )
        claimed = await store.claim_rollout("w-1")
        assert claimed is not None
        await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, A.RUNNING)
        await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, A.FAILED)
        assert await store.reward_stats() == [
            ResourceRewardStats(resources_id=rs, mode=RolloutMode.TEST, n=1, n_with_reward=0, mean_reward=None)
        ]

    run_with_store(body)
