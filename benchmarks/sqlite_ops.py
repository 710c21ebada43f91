#!/usr/bin/env python3
"""CPU cost of each SQLite store operation, in microseconds per call, called directly (no async API around it).

Runs ``N`` rollouts one after the other (enqueue, claim, start, one span, finish) directly inside one store
call and prints the mean time of each step, then the same rollouts through the async API.
Use it to see where a change to ``agentbolt.store.sqlite`` moves the cost::

    .venv/bin/python benchmarks/sqlite_ops.py [N]
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

from agentbolt.store import SqliteLightningStore
from agentbolt.store.base import EnqueueRequest
from agentbolt.types import AttemptStatus, Span

ATTRIBUTES: dict[str, Any] = {
    "gen_ai.prompt.0.content": "q" * 120,
    "gen_ai.completion.0.content": "a" * 120,
    "prompt_token_ids": list(range(1000, 1100)),
    "response_token_ids": list(range(2000, 2100)),
}


def _span(rollout_id: str, attempt_id: str, i: int) -> Span:
    now = time.time()
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        span_id=f"{i:016x}",
        trace_id=f"{i:032x}",
        name="bench",
        start_time=now,
        end_time=now,
        attributes=ATTRIBUTES,
    )


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        store = SqliteLightningStore(f"{d}/ops.db")

        def on_thread(conn: sqlite3.Connection) -> dict[str, float]:
            spent: dict[str, float] = defaultdict(float)

            def timed(step: str, fn: Any, *args: Any) -> Any:
                t0 = time.perf_counter()
                result = fn(conn, *args)
                spent[step] += time.perf_counter() - t0
                return result

            for i in range(n):
                timed("enqueue", store._enqueue, [EnqueueRequest(input={"task_index": i})])
                claim = timed("claim", store._claim, "w", 1)[0]
                rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
                timed("start", store._update_attempt, rid, aid, AttemptStatus.RUNNING, None, None)
                timed("add_span", store._add_spans, [_span(rid, aid, i)])
                timed("finish", store._update_attempt, rid, aid, AttemptStatus.SUCCEEDED, None, None)
            return {step: round(s / n * 1e6, 1) for step, s in spent.items()}

        print(json.dumps({"per_call_us_without_the_async_api": await store._run(on_thread)}))
        t0 = time.perf_counter()
        for i in range(n):
            await store.enqueue_rollout({"task_index": i})
            claim = await store.claim_rollout("w")
            assert claim is not None
            rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
            await store.update_attempt(rid, aid, AttemptStatus.RUNNING)
            await store.add_span(_span(rid, aid, n + i))
            await store.update_attempt(rid, aid, AttemptStatus.SUCCEEDED)
        print(json.dumps({"async_api_us_per_rollout_of_5_calls": round((time.perf_counter() - t0) / n * 1e6, 1)}))
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 400))
