"""The dashboard API over a real SQLite store and a real server on 127.0.0.1 (no tokenizer: token texts are null)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from agentbolt import semconv
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store import SqliteLightningStore
from agentbolt.types import AttemptStatus, Metric, PromptTemplate, RolloutConfig, RolloutMode, Span

A = AttemptStatus


def _llm_span(rollout_id: str, attempt_id: str, span_id: str) -> Span:
    now = time.time()
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        span_id=span_id,
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        name=semconv.SPAN_LLM_CALL,
        start_time=now,
        end_time=now,
        attributes={
            semconv.LLM_PROMPT_TOKEN_IDS: [1, 2, 3],
            semconv.LLM_RESPONSE_TOKEN_IDS: [4, 5],
            semconv.LLM_RESPONSE_LOGPROBS: [-0.5, -0.25],
            semconv.LLM_MODEL_VERSION: "step-0",
        },
    )


def test_dashboard_endpoints(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            rs = (await store.add_resources({"prompt": PromptTemplate(template="{q}")})).resources_id
            ids = []
            # two train rollouts of task t1 (rewards 1 and 0), one val rollout (reward 1), one that raises KeyError
            for i, (mode, reward) in enumerate(
                [(RolloutMode.TRAIN, 1.0), (RolloutMode.TRAIN, 0.0), (RolloutMode.VAL, 1.0), (RolloutMode.TRAIN, None)]
            ):
                rollout = await store.enqueue_rollout(
                    {"question": f"What is {i}+1?"},
                    mode=mode,
                    resources_id=rs,
                    config=RolloutConfig(max_attempts=1),
                    metadata={"task_id": "t1", "train_step": 0},
                )
                claimed = await store.claim_rollout("w-1")
                assert claimed is not None
                attempt_id = claimed.attempt.attempt_id
                await store.update_attempt(rollout.rollout_id, attempt_id, A.RUNNING)
                await store.add_span(_llm_span(rollout.rollout_id, attempt_id, f"00000000000000{i:02d}"))
                if reward is None:
                    error = {"type": "KeyError", "message": "'x'"}
                    await store.update_attempt(rollout.rollout_id, attempt_id, A.FAILED, error=error)
                else:
                    await store.update_attempt(rollout.rollout_id, attempt_id, A.SUCCEEDED, final_reward=reward)
                ids.append(rollout.rollout_id)
            await store.add_metrics([Metric(name="train_reward_mean", train_step=1, value=0.5, time=time.time())])

            async with serve_in_background(create_app(store)) as url, httpx.AsyncClient(base_url=url) as client:
                page = (await client.get("/v1/rollouts/search", params={"status": "succeeded", "q": "what IS"})).json()
                assert page["total"] == 3 and [r["rollout_id"] for r in page["items"]] == ids[:3]
                page = (await client.get("/v1/rollouts/search", params={"sort_by": "final_reward", "limit": 1})).json()
                assert page["total"] == 4 and page["items"][0]["rollout_id"] == ids[1]  # reward 0 first ascending
                assert (await client.get("/v1/rollouts/search", params={"sort_by": "nope"})).status_code == 422
                # bad parameters: a clear 4xx, never a 500 (nan/inf bounds would match nothing, or break JSON)
                for bad in ({"limit": -1}, {"offset": -1}, {"reward_min": "abc"}, {"reward_min": "nan"},
                            {"reward_max": "inf"}, {"reward_min": 2, "reward_max": 1}, {"status": "nope"},
                            {"metadata": "[1]"}):  # fmt: skip
                    assert (await client.get("/v1/rollouts/search", params=bad)).status_code == 422, bad
                for bucket in ("0", "-1", "nan", "inf"):
                    resp = await client.get("/v1/errors/summary", params={"bucket_s": bucket})
                    assert resp.status_code == 422, bucket
                assert (await client.get("/v1/rollouts/nope/transitions")).status_code == 404
                assert (await client.get(f"/v1/rollouts/{ids[0]}/transitions?attempt_id=nope")).status_code == 404

                # GRPO over the group {1, 0}: mean 0.5, sample std sqrt(0.5) -> advantages +-0.5/0.7071 = +-0.7071
                first = (await client.get(f"/v1/rollouts/{ids[0]}/transitions")).json()
                second = (await client.get(f"/v1/rollouts/{ids[1]}/transitions")).json()
                assert first[0]["advantage"] == pytest.approx(0.70711, abs=1e-4)
                assert second[0]["advantage"] == pytest.approx(-0.70711, abs=1e-4)
                assert first[0]["reward"] == 1.0 and second[0]["reward"] == 0.0
                assert [t["id"] for t in first[0]["prompt"]] == [1, 2, 3]
                assert first[0]["response"] == [
                    {"id": 4, "text": None, "logprob": -0.5, "loss_mask": 1},
                    {"id": 5, "text": None, "logprob": -0.25, "loss_mask": 1},
                ]
                assert first[0]["model_version"] == "step-0" and first[0]["span_id"] == "0000000000000000"
                val = (await client.get(f"/v1/rollouts/{ids[2]}/transitions")).json()
                assert val[0]["advantage"] is None  # val rollouts are not trained

                scores = (await client.get("/v1/resources/scores")).json()
                assert scores == {
                    rs: {
                        "n": 3,
                        "mean_reward": pytest.approx(2 / 3),
                        "by_mode": {"train": {"n": 2, "mean_reward": 0.5}, "val": {"n": 1, "mean_reward": 1.0}},
                    }
                }
                errors = (await client.get("/v1/errors/summary", params={"bucket_s": 60})).json()["kinds"]
                assert [(k["kind"], k["count"]) for k in errors] == [("agent_exception:KeyError", 1)]
                assert errors[0]["example"]["rollout_id"] == ids[3] and errors[0]["series"][0][1] == 1
                assert (await client.get("/v1/metrics/names")).json() == ["train_reward_mean"]
        finally:
            await store.close()

    asyncio.run(main())
