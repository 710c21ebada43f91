"""Asynchronous training on a real server with the embedded SmolLM2-135M.

1. The gateway holds calls during a weight swap and answers them after it (200, the wait recorded), and answers 503
   ``backend_unavailable`` (recorded as a failed, untrainable call) when the swap outlasts the hold limit.
2. ``agentbolt train`` with ``async_rollouts: 1``: the rollouts of step s+1 are enqueued with the weights of step
   s-1 while step s updates, the staleness of every transition is counted, and every step swaps the weights once.
   It runs PPO with a value head (``gae``), so that path also runs end to end: values before the update, GAE, the
   value loss reported.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentbolt import semconv
from agentbolt.server.app import create_app
from agentbolt.server.gateway.swap import WeightSwapGate
from agentbolt.server.serving import serve_in_background
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import AttemptStatus, RolloutMode, RolloutStatus

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def backend(smollm2_dir: Path) -> Iterator[Any]:
    from agentbolt.inference.embedded import EmbeddedBackend

    served = EmbeddedBackend.load(smollm2_dir, num_threads=2, batch_wait_s=0.01)
    yield served
    asyncio.run(served.close())


def test_gateway_holds_calls_during_a_swap_and_rejects_past_the_limit(backend: Any) -> None:
    async def main() -> None:
        store = InMemoryLightningStore()
        gate = WeightSwapGate(hold_limit_s=30)
        async with serve_in_background(create_app(store, backend, swap_gate=gate)) as url:
            await store.enqueue_rollout({"q": 1})
            claimed = await store.claim_rollout("w")
            assert claimed is not None
            rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
            await store.update_attempt(rid, aid, AttemptStatus.RUNNING)
            body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
            path = f"/v1/rollouts/{rid}/attempts/{aid}/v1/chat/completions"
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                async with gate.swapping():
                    call = asyncio.create_task(client.post(path, json=body))
                    while gate.stats.held_calls == 0:  # until the call reached the gate
                        await asyncio.sleep(0.01)
                    await asyncio.sleep(0.5)
                    assert not call.done(), "the call must wait while the weights are swapped"
                reply = await call
                assert reply.status_code == 200, reply.text
                assert reply.json()["choices"][0]["message"]["role"] == "assistant"

                gate.hold_limit_s = 0.2
                async with gate.swapping():
                    refused = await client.post(path, json=body)
                    await asyncio.sleep(0)
                assert refused.status_code == 503
                assert refused.json()["error"]["code"] == "backend_unavailable"
                assert "hold limit" in refused.json()["error"]["message"]
        spans = [s for s in await store.query_spans(rid, aid) if s.name == semconv.SPAN_LLM_CALL]
        held, failed = spans
        assert held.status.code == "OK" and held.attributes[semconv.LLM_TRAINABLE] is True
        assert held.attributes[semconv.LLM_SWAP_WAIT_S] >= 0.5
        assert failed.status.code == "ERROR" and failed.attributes[semconv.LLM_TRAINABLE] is False
        assert failed.attributes[semconv.LLM_ERROR_CODE] == "backend_unavailable"
        assert gate.stats.swaps == 2 and gate.stats.held_calls == 2 and gate.stats.rejected_calls == 1

    asyncio.run(main())


def test_train_cli_with_async_rollouts(tmp_path: Path, smollm2_dir: Path) -> None:
    config = tmp_path / "async.yaml"
    config.write_text(
        "model: smollm2-135m\n"
        "val_size: 0\n"
        "runner_processes: 1\n"
        "runner_concurrency: 4\n"
        "grpo: {steps: 3, tasks_per_step: 1, group_size: 2, max_tokens: 24, async_rollouts: 1, "
        "advantage_estimator: gae}\n"
    )
    out = tmp_path / "run"
    env = {**os.environ, "AGENTBOLT_CACHE": str(smollm2_dir.parent.parent)}
    done = subprocess.run(
        [sys.executable, "-m", "agentbolt.cli.main", "train", str(config), "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["async_rollouts"] == 1 and len(summary["train_reward"]) == 3
    assert summary["val_accuracy_before"] == {} and summary["n_rollouts"] == 6
    assert summary["weight_swaps"]["swaps"] == 3 and summary["weight_swaps"]["rejected_calls"] == 0
    staleness = summary["staleness"]
    # Step 1 trains on calls of "base" with the trainer at "base": all fresh. Later steps may hold calls one behind.
    assert set(staleness[0]["by_staleness"]) == {"0"}
    for step, report in zip(summary["timing_s"]["per_step_wait"], staleness, strict=True):
        assert step >= 0 and set(report["by_staleness"]) <= {"0", "1"} and report["dropped"] == 0
    assert sum(sum(r["by_staleness"].values()) for r in staleness) == summary["n_transitions"]
    for update in summary["update_stats"]:  # the value head was trained every step
        assert update["stepped"] == 1.0 and update["value_loss"] >= 0 and update["values_s"] > 0

    async def check_store() -> None:
        store = SqliteLightningStore(out / "store.db")
        try:
            rollouts = await store.query_rollouts()
            assert all(r.status is RolloutStatus.SUCCEEDED and r.mode is RolloutMode.TRAIN for r in rollouts)
            train = [v for v in await store.query_resources() if v.metadata["purpose"] == "train"]
            # Steps 1 and 2 were enqueued before any update; step 3 after step 1's update.
            assert [v.metadata["model_version"] for v in train] == ["base", "base", "step-1"]
            assert {m.name for m in await store.query_metrics()} >= {"staleness_mean", "n_stale_dropped", "wait_s"}
        finally:
            await store.close()

    asyncio.run(check_store())
