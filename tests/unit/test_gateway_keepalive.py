"""While the gateway serves a call, it keeps the attempt's lease alive (issue 22: the default lease must not end an
agent that waits on a long generation). A real SQLite store; the "generation" is the time spent inside the block."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentbolt.server.gateway.recording import KEEPALIVE_INTERVAL_S, CallRecorder, keepalive_interval
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import AttemptStatus, RolloutConfig


def test_the_keepalive_period_fits_the_lease() -> None:
    assert keepalive_interval(None) == KEEPALIVE_INTERVAL_S == 2.0
    assert keepalive_interval(30.0) == 2.0
    assert keepalive_interval(1.5) == 0.5


def test_a_call_in_progress_keeps_its_attempt_alive_past_the_lease(tmp_path: Path) -> None:
    async def main() -> tuple[AttemptStatus, AttemptStatus]:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            lease = 1.0
            config = RolloutConfig(unresponsive_seconds=lease)
            kept = await store.enqueue_rollout({"q": 1}, config=config)
            idle = await store.enqueue_rollout({"q": 2}, config=config)
            claimed = [await store.claim_rollout("rest-client") for _ in range(2)]
            assert all(c is not None for c in claimed)
            by_id = {c.rollout.rollout_id: c for c in claimed if c is not None}
            serving = by_id[kept.rollout_id].attempt
            recorder = CallRecorder(
                store,
                kept.rollout_id,
                serving.attempt_id,
                {},
                "chatcmpl-test",
                worker_id=serving.worker_id,
                keepalive_s=keepalive_interval(lease),
            )
            async with recorder.keepalive():
                await asyncio.sleep(3 * lease)  # a generation three leases long; nobody else sends heartbeats
            kept_status = (await store.get_attempt(kept.rollout_id, serving.attempt_id)).status
            idle_attempt = by_id[idle.rollout_id].attempt
            idle_status = (await store.get_attempt(idle.rollout_id, idle_attempt.attempt_id)).status
            return kept_status, idle_status
        finally:
            await store.close()

    kept_status, idle_status = asyncio.run(main())
    assert kept_status is AttemptStatus.PREPARING  # alive: the keepalive beat for it
    assert idle_status is AttemptStatus.UNRESPONSIVE  # the same lease, no call in progress: it expired


def test_a_result_that_says_why_it_is_not_trainable_is_recorded_with_that_reason() -> None:
    """``extra["not_trainable_reason"]`` (a token engine that lost a logprob) is the span's reason; without it an
    untrainable result gets the no-token-ids reason."""
    from agentbolt import semconv
    from agentbolt.inference.base import GenerationResult
    from agentbolt.server.gateway.recording import REASON_NO_TOKEN_IDS
    from agentbolt.store.memory import InMemoryLightningStore

    recorder = CallRecorder(InMemoryLightningStore(), "ro-1", "at-1", {}, "chatcmpl-test")
    why = "llama.cpp gave no probability for 1 of 4 generated ids"
    lost = GenerationResult([1], [], [], "x", "stop", "v", extra={"not_trainable_reason": why}, trainable=False)
    span = recorder.result_span(0, lost, {"role": "assistant", "content": "x"}, "stop")
    assert span.attributes[semconv.LLM_TRAINABLE] is False
    assert span.attributes[semconv.LLM_NOT_TRAINABLE_REASON] == why
    plain = GenerationResult([], [], [], "x", "stop", "v", trainable=False)
    span = recorder.result_span(0, plain, {"role": "assistant", "content": "x"}, "stop")
    assert span.attributes[semconv.LLM_NOT_TRAINABLE_REASON] == REASON_NO_TOKEN_IDS
