"""The ``LightningStore`` contract, run unchanged against every backend in ``conftest.BACKENDS``.

Pinned semantics (change them only with an explicit decision, then update every backend):
- claims hand out the oldest ``queuing``/``requeuing`` rollout by enqueue order, each to exactly one claimer;
  ``claim_many(worker, n)`` hands out up to ``n`` of them at once, by the same rule (``n < 1`` is a ConfigError);
- ``query_rollouts`` sorts by enqueue order unless ``sort_by`` names another field; missing values (``None``) come
  last in either direction, ties keep enqueue order (reversed when ``descending``); filters apply before sorting,
  paging after;
- an attempt ending failed/timeout/unresponsive requeues the rollout while attempts remain and the status is in
  ``retry_on``, else the rollout fails;
- a terminal rollout never changes again (InvalidTransitionError naming the allowed moves);
- cancelling ends the in-flight attempt as ``failed`` with ``error.type == "cancelled"``;
- spans are numbered 1, 2, 3... per attempt in arrival order; a late span of a superseded attempt is kept;
- ``final_reward`` is only accepted with ``succeeded``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from agentbolt.errors import ConfigError, InvalidTransitionError, NotFoundError
from agentbolt.store import EnqueueRequest, LightningStore, StoreCapabilities
from agentbolt.types import (
    LLM,
    AttemptedRollout,
    AttemptStatus,
    Metric,
    PromptTemplate,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Span,
)

Run = Callable[[Callable[[LightningStore], Awaitable[None]]], None]
A = AttemptStatus
R = RolloutStatus


def make_span(rollout_id: str, attempt_id: str, name: str = "agentbolt.test", **attributes: object) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        span_id="00f067aa0ba902b7",
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        name=name,
        start_time=time.time(),
        end_time=time.time(),
        attributes=dict(attributes),
    )


async def claim(store: LightningStore, worker_id: str = "w-1") -> AttemptedRollout:
    claimed = await store.claim_rollout(worker_id)
    assert claimed is not None
    return claimed


# ---------------------------------------------------------------------------- enqueue and query


def test_capabilities_and_protocol(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        assert isinstance(store, LightningStore)
        assert isinstance(store.capabilities, StoreCapabilities)

    run_with_store(body)


def test_enqueue_rollout_round_trips(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        task = {"question": "2+2?", "nested": {"numbers": [1, 2.5, None], "ok": True}}
        config = RolloutConfig(max_attempts=3, timeout_seconds=60, retry_on=(A.FAILED,))
        before = time.time()
        rollout = await store.enqueue_rollout(task, mode=RolloutMode.VAL, config=config, metadata={"task_id": "t1"})
        assert rollout.rollout_id.startswith("ro-")
        assert rollout.status is R.QUEUING
        assert rollout.num_attempts == 0 and rollout.start_time is None and rollout.end_time is None
        assert before <= rollout.enqueue_time <= time.time()
        fetched = await store.get_rollout(rollout.rollout_id)
        assert fetched == rollout
        assert fetched.input == task and fetched.mode is RolloutMode.VAL and fetched.config == config
        assert fetched.metadata == {"task_id": "t1"}

    run_with_store(body)


def test_enqueue_many_keeps_order_and_is_all_or_nothing(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        rollouts = await store.enqueue_many([EnqueueRequest(input=i) for i in range(5)])
        assert [r.input for r in rollouts] == list(range(5))
        assert len({r.rollout_id for r in rollouts}) == 5
        with pytest.raises(NotFoundError, match="rs-404"):
            await store.enqueue_many([EnqueueRequest(input="ok"), EnqueueRequest(input="bad", resources_id="rs-404")])
        assert [r.input for r in await store.query_rollouts()] == list(range(5))

    run_with_store(body)


def test_returned_records_are_copies(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        rollout = await store.enqueue_rollout({"x": 1}, metadata={"k": "v"})
        rollout.metadata["k"] = "changed"
        rollout.input["x"] = 2
        fetched = await store.get_rollout(rollout.rollout_id)
        assert fetched.metadata == {"k": "v"} and fetched.input == {"x": 1}

    run_with_store(body)


def test_query_rollouts_filters_and_pages(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        modes = [RolloutMode.TRAIN, RolloutMode.VAL] * 3
        rollouts = await store.enqueue_many([EnqueueRequest(input=i, mode=m) for i, m in enumerate(modes)])
        await claim(store)  # rollout 0 -> preparing
        ids = [r.rollout_id for r in rollouts]

        everything = await store.query_rollouts()
        assert [r.rollout_id for r in everything] == ids
        assert [r.input for r in await store.query_rollouts(mode=RolloutMode.VAL)] == [1, 3, 5]
        assert [r.input for r in await store.query_rollouts(status=[R.PREPARING])] == [0]
        queued_train = await store.query_rollouts(status=[R.QUEUING], mode=RolloutMode.TRAIN)
        assert [r.input for r in queued_train] == [2, 4]
        assert [r.input for r in await store.query_rollouts(rollout_ids=[ids[4], ids[1]])] == [1, 4]
        assert [r.input for r in await store.query_rollouts(limit=2, offset=1)] == [1, 2]
        assert [r.input for r in await store.query_rollouts(offset=4)] == [4, 5]
        assert await store.query_rollouts(limit=0) == []
        assert await store.query_rollouts(status=[]) == []
        assert await store.query_rollouts(rollout_ids=["ro-missing"]) == []
        with pytest.raises(ConfigError):
            await store.query_rollouts(limit=-1)
        with pytest.raises(ConfigError):
            await store.query_rollouts(offset=-1)

    run_with_store(body)


def test_enqueue_accepts_any_json_input_including_none(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        inputs = [None, "text", 3, 2.5, [1, "a", None], {"b": {"c": []}, "a": 1}]
        rollouts = await store.enqueue_many([EnqueueRequest(input=i) for i in inputs])
        assert [r.input for r in await store.query_rollouts()] == inputs
        assert (await store.get_rollout(rollouts[0].rollout_id)).input is None
        assert (await claim(store)).rollout.input is None

    run_with_store(body)


def test_query_rollouts_sorts_by_a_named_field(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        # r0 and r1 are claimed (r0 first), r1 succeeds, then r0 fails; r2 is claimed last; r3 stays queued.
        r0, r1, r2, r3 = await store.enqueue_many([EnqueueRequest(input=i) for i in range(4)])
        ids = [r0.rollout_id, r1.rollout_id, r2.rollout_id, r3.rollout_id]
        a0 = await claim(store)
        await asyncio.sleep(0.01)
        a1 = await claim(store)
        await asyncio.sleep(0.01)
        await store.update_attempt(r1.rollout_id, a1.attempt.attempt_id, A.SUCCEEDED, final_reward=0.5)
        await asyncio.sleep(0.01)
        await store.update_attempt(r0.rollout_id, a0.attempt.attempt_id, A.FAILED)
        await asyncio.sleep(0.01)
        await claim(store)  # r2
        # now: r0 failed (start s0, end e0), r1 succeeded (s1 > s0, e1 < e0, reward 0.5), r2 preparing (s2), r3 queuing

        async def order(**kwargs: object) -> list[int]:
            return [r.input for r in await store.query_rollouts(**kwargs)]  # type: ignore[arg-type]

        assert await order() == await order(sort_by="enqueue_time") == [0, 1, 2, 3]
        assert await order(sort_by="enqueue_time", descending=True) == [3, 2, 1, 0]
        assert await order(sort_by="start_time") == [0, 1, 2, 3]  # r3 never started: last
        assert await order(sort_by="start_time", descending=True) == [2, 1, 0, 3]  # still last
        assert await order(sort_by="end_time") == [1, 0, 2, 3]  # e1 < e0; r2, r3 unfinished, in enqueue order
        assert await order(sort_by="end_time", descending=True) == [0, 1, 3, 2]  # unfinished last, reversed ties
        # alphabetical: failed < preparing < queuing < succeeded
        assert await order(sort_by="status") == [0, 2, 3, 1]
        assert await order(sort_by="status", descending=True) == [1, 3, 2, 0]
        assert await order(sort_by="final_reward") == [1, 0, 2, 3]  # only r1 has one; the rest tie, last
        assert await order(sort_by="final_reward", descending=True) == [1, 3, 2, 0]
        by_id = sorted(range(4), key=lambda i: ids[i])
        assert await order(sort_by="rollout_id") == by_id
        assert await order(sort_by="rollout_id", descending=True) == by_id[::-1]

    run_with_store(body)


def test_query_rollouts_sorts_then_pages_within_the_filter(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        modes = [RolloutMode.TRAIN, RolloutMode.VAL] * 3  # inputs 0..5; VAL are 1, 3, 5
        await store.enqueue_many([EnqueueRequest(input=i, mode=m) for i, m in enumerate(modes)])
        claimed = [await claim(store) for _ in range(4)]  # 0, 1, 2, 3 claimed in that order
        for c in reversed(claimed):  # end them newest first: end times 3 < 2 < 1 < 0
            await asyncio.sleep(0.01)
            await store.update_attempt(c.rollout.rollout_id, c.attempt.attempt_id, A.SUCCEEDED)

        async def order(**kwargs: object) -> list[int]:
            return [r.input for r in await store.query_rollouts(**kwargs)]  # type: ignore[arg-type]

        assert await order(sort_by="end_time") == [3, 2, 1, 0, 4, 5]
        assert await order(sort_by="end_time", limit=2) == [3, 2]
        assert await order(sort_by="end_time", limit=2, offset=2) == [1, 0]
        assert await order(sort_by="end_time", offset=4) == [4, 5]
        assert await order(mode=RolloutMode.VAL, sort_by="end_time") == [3, 1, 5]
        assert await order(mode=RolloutMode.VAL, sort_by="end_time", descending=True, limit=2) == [1, 3]
        assert await order(status=[R.SUCCEEDED], sort_by="end_time", descending=True, offset=1, limit=2) == [1, 2]
        assert await order(status=[R.QUEUING], descending=True) == [5, 4]

    run_with_store(body)


def test_query_rollouts_rejects_an_unknown_sort_field(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        await store.enqueue_rollout("task")
        for bad in ("enqueue_seq", "input", "start_time; DROP TABLE rollouts", ""):
            with pytest.raises(ConfigError, match="sort_by must be one of: enqueue_time, start_time, end_time"):
                await store.query_rollouts(sort_by=bad)
        with pytest.raises(ConfigError, match="sort_by"):
            await store.query_rollouts(status=[], sort_by="bogus")  # checked even when no rollout can match
        assert len(await store.query_rollouts()) == 1

    run_with_store(body)


def test_unknown_ids_raise_not_found(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task")
        claimed = await claim(store)
        calls: list[Awaitable[object]] = [
            store.get_rollout("ro-missing"),
            store.cancel_rollout("ro-missing"),
            store.query_attempts("ro-missing"),
            store.query_spans("ro-missing"),
            store.get_attempt(rollout.rollout_id, "at-missing"),
            store.get_attempt("ro-missing", claimed.attempt.attempt_id),
            store.query_spans(rollout.rollout_id, "at-missing"),
            store.update_attempt(rollout.rollout_id, "at-missing", A.RUNNING),
            store.add_span(make_span(rollout.rollout_id, "at-missing")),
            store.add_span(make_span("ro-missing", claimed.attempt.attempt_id)),
            store.heartbeat("w-1", rollout_id=rollout.rollout_id, attempt_id="at-missing"),
            store.get_resources("rs-1"),
            store.enqueue_rollout("x", resources_id="rs-1"),
            store.wait_for_rollouts(["ro-missing"], timeout_s=0.01),
        ]
        for call in calls:
            with pytest.raises(NotFoundError):
                await call

    run_with_store(body)


# ---------------------------------------------------------------------------- claims


def test_claim_takes_oldest_first_and_returns_none_when_empty(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        assert await store.claim_rollout("w-1") is None
        first = await store.enqueue_rollout("first")
        await store.enqueue_rollout("second")
        claimed = await claim(store, "w-7")
        assert claimed.rollout.rollout_id == first.rollout_id
        assert claimed.rollout.status is R.PREPARING and claimed.rollout.num_attempts == 1
        assert claimed.rollout.start_time is not None
        attempt = claimed.attempt
        assert attempt.attempt_id.startswith("at-") and attempt.rollout_id == first.rollout_id
        assert attempt.sequence_id == 1 and attempt.status is A.PREPARING and attempt.worker_id == "w-7"
        assert (await claim(store)).rollout.input == "second"
        assert await store.claim_rollout("w-1") is None
        assert await store.get_rollout(first.rollout_id) == claimed.rollout
        assert await store.query_attempts(first.rollout_id) == [attempt]

    run_with_store(body)


def test_concurrent_claims_give_each_rollout_to_one_claimer(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        await store.enqueue_many([EnqueueRequest(input=i) for i in range(12)])
        results = await asyncio.gather(*(store.claim_rollout(f"w-{i}") for i in range(24)))
        claimed = [r for r in results if r is not None]
        assert len(claimed) == 12
        assert sorted(r.rollout.input for r in claimed) == list(range(12))
        assert len({r.attempt.attempt_id for r in claimed}) == 12

    run_with_store(body)


def test_claim_many_takes_the_oldest_n_in_enqueue_order(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        assert await store.claim_many("w-1", 3) == []
        await store.add_resources({})
        rollouts = await store.enqueue_many([EnqueueRequest(input=i) for i in range(5)])
        first = await store.claim_many("w-1", 3)
        assert [c.rollout.input for c in first] == [0, 1, 2]
        for claimed, rollout in zip(first, rollouts[:3], strict=True):
            assert claimed.rollout.rollout_id == rollout.rollout_id
            assert claimed.rollout.status is R.PREPARING and claimed.rollout.num_attempts == 1
            assert claimed.attempt.sequence_id == 1 and claimed.attempt.status is A.PREPARING
            assert claimed.attempt.worker_id == "w-1" and claimed.attempt.resources_id == "rs-1"
            assert await store.query_attempts(rollout.rollout_id) == [claimed.attempt]
        assert len({c.attempt.attempt_id for c in first}) == 3
        rest = await store.claim_many("w-2", 10)  # asks for more than are left: gets the 2 that are
        assert [c.rollout.input for c in rest] == [3, 4]
        assert await store.claim_many("w-2", 1) == []
        assert await store.claim_rollout("w-3") is None
        workers = {w.worker_id: w for w in await store.query_workers()}
        assert workers["w-1"].current_attempt_id == first[-1].attempt.attempt_id  # the last of its batch
        assert workers["w-2"].current_attempt_id == rest[-1].attempt.attempt_id

    run_with_store(body)


def test_claim_many_rejects_n_below_one(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        await store.enqueue_rollout("task")
        for n in (0, -2):
            with pytest.raises(ConfigError, match=f"n >= 1.*n={n}"):
                await store.claim_many("w-1", n)
        assert [r.status for r in await store.query_rollouts()] == [R.QUEUING]  # nothing was claimed

    run_with_store(body)


def test_claim_many_includes_requeued_rollouts_in_their_place(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        config = RolloutConfig(max_attempts=2, retry_on=(A.FAILED,))
        older = await store.enqueue_rollout("older", config=config)
        await store.enqueue_many([EnqueueRequest(input="middle"), EnqueueRequest(input="newer")])
        failed = await claim(store)
        await store.update_attempt(older.rollout_id, failed.attempt.attempt_id, A.FAILED)
        batch = await store.claim_many("w-2", 2)
        assert [c.rollout.input for c in batch] == ["older", "middle"]
        assert batch[0].attempt.sequence_id == 2 and batch[0].rollout.num_attempts == 2

    run_with_store(body)


def test_concurrent_claim_many_gives_each_rollout_to_one_claimer(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        await store.enqueue_many([EnqueueRequest(input=i) for i in range(20)])
        many = asyncio.gather(*(store.claim_many(f"w-{i}", 4) for i in range(8)))
        batches, single = await asyncio.gather(many, store.claim_rollout("w-x"))
        claimed = [c for batch in batches for c in batch] + ([single] if single is not None else [])
        assert sorted(c.rollout.input for c in claimed) == list(range(20))  # all 20, none twice
        assert len({c.attempt.attempt_id for c in claimed}) == 20

    run_with_store(body)


# ---------------------------------------------------------------------------- attempt lifecycle and retries


def test_attempt_success_moves_rollout_and_stores_final_reward(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task")
        claimed = await claim(store)
        ids = (rollout.rollout_id, claimed.attempt.attempt_id)
        running = await store.update_attempt(*ids, A.RUNNING)
        assert running.status is A.RUNNING and running.end_time is None
        assert (await store.get_rollout(rollout.rollout_id)).status is R.RUNNING
        done = await store.update_attempt(*ids, A.SUCCEEDED, final_reward=0.75)
        assert done.status is A.SUCCEEDED and done.end_time is not None
        final = await store.get_rollout(rollout.rollout_id)
        assert final.status is R.SUCCEEDED and final.final_reward == 0.75 and final.end_time is not None
        assert await store.get_attempt(*ids) == done

    run_with_store(body)


def test_illegal_attempt_moves_name_the_allowed_ones(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task")
        ids = (rollout.rollout_id, (await claim(store)).attempt.attempt_id)
        with pytest.raises(InvalidTransitionError, match="running"):
            await store.update_attempt(*ids, A.PREPARING)
        with pytest.raises(ConfigError, match="succeeded"):
            await store.update_attempt(*ids, A.FAILED, final_reward=1.0)
        await store.update_attempt(*ids, A.RUNNING)
        with pytest.raises(InvalidTransitionError, match="succeed->succeeded"):
            await store.update_attempt(*ids, A.RUNNING)
        await store.update_attempt(*ids, A.SUCCEEDED)
        with pytest.raises(InvalidTransitionError, match="terminal"):
            await store.update_attempt(*ids, A.FAILED)
        assert (await store.get_rollout(rollout.rollout_id)).status is R.SUCCEEDED

    run_with_store(body)


def test_failed_attempts_retry_until_max_attempts(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        config = RolloutConfig(max_attempts=2, retry_on=(A.FAILED,))
        rollout = await store.enqueue_rollout("task", config=config)
        first = await claim(store)
        error = {"type": "ValueError", "message": "boom", "traceback": "..."}
        ended = await store.update_attempt(rollout.rollout_id, first.attempt.attempt_id, A.FAILED, error=error)
        assert ended.error == error
        assert (await store.get_rollout(rollout.rollout_id)).status is R.REQUEUING
        second = await claim(store, "w-2")
        assert second.rollout.rollout_id == rollout.rollout_id
        assert second.attempt.sequence_id == 2 and second.rollout.num_attempts == 2
        await store.update_attempt(rollout.rollout_id, second.attempt.attempt_id, A.RUNNING)
        await store.update_attempt(rollout.rollout_id, second.attempt.attempt_id, A.FAILED)
        final = await store.get_rollout(rollout.rollout_id)
        assert final.status is R.FAILED and final.end_time is not None
        assert await store.claim_rollout("w-3") is None
        attempts = await store.query_attempts(rollout.rollout_id)
        assert [(a.sequence_id, a.status) for a in attempts] == [(1, A.FAILED), (2, A.FAILED)]

    run_with_store(body)


def test_failure_not_in_retry_on_fails_the_rollout(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task", config=RolloutConfig(max_attempts=5))  # retry_on: lease ends
        claimed = await claim(store)
        await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, A.FAILED)
        assert (await store.get_rollout(rollout.rollout_id)).status is R.FAILED

    run_with_store(body)


def test_requeued_rollout_keeps_its_place_in_the_queue(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        config = RolloutConfig(max_attempts=2, retry_on=(A.FAILED,))
        older = await store.enqueue_rollout("older", config=config)
        await store.enqueue_rollout("newer")
        claimed = await claim(store)
        await store.update_attempt(older.rollout_id, claimed.attempt.attempt_id, A.FAILED)
        assert (await claim(store)).rollout.rollout_id == older.rollout_id

    run_with_store(body)


# ---------------------------------------------------------------------------- leases


def test_timeout_requeues_then_fails(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task", config=RolloutConfig(max_attempts=2, timeout_seconds=0.3))
        first = await claim(store)
        await store.update_attempt(rollout.rollout_id, first.attempt.attempt_id, A.RUNNING)
        await asyncio.sleep(0.35)
        assert (await store.get_rollout(rollout.rollout_id)).status is R.REQUEUING
        expired = await store.get_attempt(rollout.rollout_id, first.attempt.attempt_id)
        assert expired.status is A.TIMEOUT and expired.end_time is not None
        second = await claim(store)
        assert second.attempt.sequence_id == 2
        await asyncio.sleep(0.35)
        [final] = await store.query_rollouts(rollout_ids=[rollout.rollout_id])
        assert final.status is R.FAILED
        statuses = [a.status for a in await store.query_attempts(rollout.rollout_id)]
        assert statuses == [A.TIMEOUT, A.TIMEOUT]

    run_with_store(body)


def test_heartbeats_and_spans_keep_an_attempt_alive_until_they_stop(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task", config=RolloutConfig(unresponsive_seconds=0.4))
        claimed = await claim(store)
        ids = (rollout.rollout_id, claimed.attempt.attempt_id)
        for i in range(3):
            await asyncio.sleep(0.15)
            if i % 2:
                await store.add_span(make_span(*ids))
            else:
                await store.heartbeat("w-1", rollout_id=ids[0], attempt_id=ids[1])
            attempt = await store.get_attempt(*ids)
            assert attempt.status is A.PREPARING
            assert attempt.last_heartbeat_time is not None and attempt.last_heartbeat_time > claimed.attempt.start_time
        await asyncio.sleep(0.45)
        assert (await store.get_attempt(*ids)).status is A.UNRESPONSIVE
        assert (await store.get_rollout(rollout.rollout_id)).status is R.FAILED  # max_attempts=1

    run_with_store(body)


def test_background_sweep_expires_leases_and_wakes_waiters(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task", config=RolloutConfig(timeout_seconds=0.1))
        await claim(store)
        start = time.monotonic()
        [done] = await store.wait_for_rollouts([rollout.rollout_id], timeout_s=1.0)
        assert done.status is R.FAILED
        assert time.monotonic() - start < 0.9

    run_with_store(body)


# ---------------------------------------------------------------------------- cancel and terminal states


def test_cancel_queued_and_running_rollouts(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        queued = await store.enqueue_rollout("queued")
        running = await store.enqueue_rollout("running")
        cancelled = await store.cancel_rollout(queued.rollout_id)
        assert cancelled.status is R.CANCELLED and cancelled.end_time is not None
        claimed = await claim(store)
        assert claimed.rollout.rollout_id == running.rollout_id
        ids = (running.rollout_id, claimed.attempt.attempt_id)
        await store.update_attempt(*ids, A.RUNNING)
        await store.cancel_rollout(running.rollout_id)
        attempt = await store.get_attempt(*ids)
        assert attempt.status is A.FAILED and attempt.error is not None and attempt.error["type"] == "cancelled"
        with pytest.raises(InvalidTransitionError):
            await store.update_attempt(*ids, A.SUCCEEDED, final_reward=1.0)
        final = await store.get_rollout(running.rollout_id)
        assert final.status is R.CANCELLED and final.final_reward is None
        assert await store.claim_rollout("w-2") is None

    run_with_store(body)


def test_terminal_rollout_never_changes(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task")
        claimed = await claim(store)
        await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, A.SUCCEEDED, final_reward=1.0)
        before = await store.get_rollout(rollout.rollout_id)
        with pytest.raises(InvalidTransitionError, match=r"'succeeded'.*none \(terminal state\)"):
            await store.cancel_rollout(rollout.rollout_id)
        with pytest.raises(InvalidTransitionError):
            await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, A.FAILED)
        assert await store.get_rollout(rollout.rollout_id) == before

    run_with_store(body)


def test_superseded_attempt_is_kept_but_never_moves_the_rollout(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        config = RolloutConfig(max_attempts=2, timeout_seconds=0.25)
        rollout = await store.enqueue_rollout("task", config=config)
        old = (await claim(store, "w-old")).attempt
        await store.update_attempt(rollout.rollout_id, old.attempt_id, A.RUNNING)
        await asyncio.sleep(0.3)
        new = (await claim(store, "w-new")).attempt  # the claim itself expires the old lease first
        assert new.sequence_id == 2
        await store.add_span(make_span(rollout.rollout_id, new.attempt_id, "new"))
        late = await store.add_span(make_span(rollout.rollout_id, old.attempt_id, "late"))
        assert late.sequence_id == 1  # a late span of the old attempt is kept, numbered within its attempt
        with pytest.raises(InvalidTransitionError, match="timeout"):
            await store.update_attempt(rollout.rollout_id, old.attempt_id, A.SUCCEEDED, final_reward=1.0)
        current = await store.get_rollout(rollout.rollout_id)
        assert current.status is R.PREPARING and current.final_reward is None and current.num_attempts == 2
        assert [s.name for s in await store.query_spans(rollout.rollout_id)] == ["new"]
        assert [s.name for s in await store.query_spans(rollout.rollout_id, old.attempt_id)] == ["late"]

    run_with_store(body)


# ---------------------------------------------------------------------------- spans


def test_spans_are_numbered_per_attempt_in_arrival_order(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        config = RolloutConfig(max_attempts=2, retry_on=(A.FAILED,))
        rollout = await store.enqueue_rollout("task", config=config)
        assert await store.query_spans(rollout.rollout_id) == []
        first = (await claim(store)).attempt
        sent = make_span(rollout.rollout_id, first.attempt_id, "a", tokens=[1, 2, 3]).model_copy(
            update={"sequence_id": 99}
        )
        stored = [await store.add_span(sent)]
        stored += [await store.add_span(make_span(rollout.rollout_id, first.attempt_id, n)) for n in "bc"]
        assert [s.sequence_id for s in stored] == [1, 2, 3]
        assert await store.query_spans(rollout.rollout_id) == stored
        assert stored[0].attributes == {"tokens": [1, 2, 3]}
        await store.update_attempt(rollout.rollout_id, first.attempt_id, A.FAILED)
        second = (await claim(store)).attempt
        again = await store.add_span(make_span(rollout.rollout_id, second.attempt_id, "d"))
        assert again.sequence_id == 1
        assert [s.name for s in await store.query_spans(rollout.rollout_id)] == ["d"]  # latest attempt by default
        assert [s.name for s in await store.query_spans(rollout.rollout_id, first.attempt_id)] == ["a", "b", "c"]

    run_with_store(body)


def test_concurrent_add_span_numbers_without_gaps(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task")
        attempt = (await claim(store)).attempt
        spans = [make_span(rollout.rollout_id, attempt.attempt_id, f"s{i}") for i in range(20)]
        stored = await asyncio.gather(*(store.add_span(s) for s in spans))
        assert sorted(s.sequence_id for s in stored) == list(range(1, 21))
        queried = await store.query_spans(rollout.rollout_id)
        assert [s.sequence_id for s in queried] == list(range(1, 21))
        assert {s.name: s.sequence_id for s in queried} == {s.name: s.sequence_id for s in stored}

    run_with_store(body)


def test_add_spans_batch_is_ordered_and_all_or_nothing(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        rollout = await store.enqueue_rollout("task")
        attempt = (await claim(store)).attempt
        await store.add_span(make_span(rollout.rollout_id, attempt.attempt_id, "first"))
        batch = [make_span(rollout.rollout_id, attempt.attempt_id, n) for n in ("b1", "b2", "b3")]
        stored = await store.add_spans(batch)
        assert [(s.name, s.sequence_id) for s in stored] == [("b1", 2), ("b2", 3), ("b3", 4)]
        bad = [make_span(rollout.rollout_id, attempt.attempt_id, "x"), make_span(rollout.rollout_id, "at-missing")]
        with pytest.raises(NotFoundError):
            await store.add_spans(bad)
        names = [s.name for s in await store.query_spans(rollout.rollout_id)]
        assert names == ["first", "b1", "b2", "b3"]
        assert await store.add_spans([]) == []

    run_with_store(body)


# ---------------------------------------------------------------------------- resources, workers, metrics


def test_resources_are_versioned_and_latest_is_handed_to_claims(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        assert await store.get_resources() is None
        assert await store.query_resources() == []
        llm = LLM(endpoint="http://127.0.0.1:9/v1", model="m", sampling_parameters={"temperature": 0.7})
        v1 = await store.add_resources({"llm": llm}, metadata={"train_step": 0})
        v2 = await store.add_resources({"llm": llm, "prompt": PromptTemplate(template="Q: {q}")})
        assert (v1.resources_id, v1.version, v2.resources_id, v2.version) == ("rs-1", 1, "rs-2", 2)
        assert v1.metadata == {"train_step": 0}
        assert await store.get_resources() == v2
        assert await store.get_resources("rs-1") == v1
        assert (await store.get_resources("rs-1")).resources["llm"] == llm  # type: ignore[union-attr]
        assert await store.query_resources() == [v1, v2]

        pinned = await store.enqueue_rollout("pinned", resources_id="rs-1")
        await store.enqueue_rollout("floating")
        first, second = await claim(store), await claim(store)
        assert first.rollout.rollout_id == pinned.rollout_id and first.attempt.resources_id == "rs-1"
        assert second.rollout.resources_id is None and second.attempt.resources_id == "rs-2"

    run_with_store(body)


def test_workers_register_and_follow_their_attempts(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        idle = await store.heartbeat("w-idle")
        assert idle.worker_id == "w-idle" and idle.current_attempt_id is None
        rollout = await store.enqueue_rollout("task")
        claimed = await claim(store, "w-busy")
        workers = {w.worker_id: w for w in await store.query_workers()}
        assert set(workers) == {"w-idle", "w-busy"}
        assert workers["w-busy"].current_attempt_id == claimed.attempt.attempt_id
        assert workers["w-busy"].current_rollout_id == rollout.rollout_id
        refreshed = await store.heartbeat("w-idle")
        assert refreshed.last_heartbeat_time >= idle.last_heartbeat_time
        with pytest.raises(ConfigError):
            await store.heartbeat("w-busy", rollout_id=rollout.rollout_id)
        await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, A.SUCCEEDED)
        freed = {w.worker_id: w for w in await store.query_workers()}["w-busy"]
        assert freed.current_attempt_id is None and freed.current_rollout_id is None

    run_with_store(body)


def test_metrics_are_ordered_by_train_step_then_insertion(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        now = time.time()
        await store.add_metrics(
            [
                Metric(name="loss", train_step=2, value=0.5, time=now),
                Metric(name="reward", train_step=1, value=0.1, time=now),
                Metric(name="loss", train_step=1, value=0.9, time=now),
            ]
        )
        await store.add_metrics([Metric(name="loss", train_step=1, value=0.8, time=now)])
        assert [(m.train_step, m.value) for m in await store.query_metrics("loss")] == [(1, 0.9), (1, 0.8), (2, 0.5)]
        assert len(await store.query_metrics()) == 4
        assert await store.query_metrics("missing") == []

    run_with_store(body)


# ---------------------------------------------------------------------------- waiting


def test_wait_for_rollouts_returns_partial_results_on_timeout(run_with_store: Run) -> None:
    async def body(store: LightningStore) -> None:
        fast, slow = await store.enqueue_many([EnqueueRequest(input="fast"), EnqueueRequest(input="slow")])
        assert await store.wait_for_rollouts([]) == []

        async def finish(rollout_id: str, delay_s: float) -> None:
            await asyncio.sleep(delay_s)
            await store.cancel_rollout(rollout_id)

        finisher = asyncio.create_task(finish(fast.rollout_id, 0.05))
        start = time.monotonic()
        done = await store.wait_for_rollouts([slow.rollout_id, fast.rollout_id], timeout_s=0.3)
        assert 0.25 <= time.monotonic() - start < 1.0
        assert [r.rollout_id for r in done] == [fast.rollout_id]
        await finisher

        finisher = asyncio.create_task(finish(slow.rollout_id, 0.05))
        done = await store.wait_for_rollouts([slow.rollout_id, fast.rollout_id], timeout_s=None)
        assert [r.rollout_id for r in done] == [slow.rollout_id, fast.rollout_id]
        assert all(r.status is R.CANCELLED for r in done)
        await finisher

    run_with_store(body)
