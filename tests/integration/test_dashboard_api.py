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
from agentbolt.types import (
    AttemptStatus,
    Metric,
    PromptTemplate,
    RolloutConfig,
    RolloutMode,
    Span,
    TrainedCall,
    TrainedSample,
)

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
                    {"id": 4, "text": None, "logprob": -0.5, "loss_mask": 1, "advantage": first[0]["advantage"]},
                    {"id": 5, "text": None, "logprob": -0.25, "loss_mask": 1, "advantage": first[0]["advantage"]},
                ]
                # nothing recorded by a trainer: recomputed, and labelled so
                assert {k: first[0][k] for k in ("advantage_source", "advantage_estimator", "credit_assignment")} == {
                    "advantage_source": "recomputed",
                    "advantage_estimator": "grpo",
                    "credit_assignment": "broadcast",
                }
                assert first[0]["train_step"] == 0 and first[0]["trained"] is None
                assert first[0]["model_version"] == "step-0" and first[0]["span_id"] == "0000000000000000"
                val = (await client.get(f"/v1/rollouts/{ids[2]}/transitions")).json()
                assert val[0]["advantage"] is None  # val rollouts are not trained
                assert val[0]["advantage_source"] is None and val[0]["response"][0]["loss_mask"] == 0

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


def _call_span(rollout_id: str, attempt_id: str, span_id: str, prompt: list[int], response: list[int]) -> Span:
    span = _llm_span(rollout_id, attempt_id, span_id)
    span.attributes.update(
        {
            semconv.LLM_PROMPT_TOKEN_IDS: prompt,
            semconv.LLM_RESPONSE_TOKEN_IDS: response,
            semconv.LLM_RESPONSE_LOGPROBS: [-0.5] * len(response),
        }
    )
    return span


def test_transitions_show_the_recorded_training_values(tmp_path: Path) -> None:
    """A trainer's record wins over the recomputation: its advantages (not GRPO's +-0.7071 of rewards {1, 0}), its
    credited rewards, its merged sample boundaries and masks, its per-token values under gae; a rollout of a recorded
    step that is not in the batch shows as not trained."""

    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            ids, attempts = [], []
            for i, reward in enumerate([1.0, 0.0, 1.0]):
                rollout = await store.enqueue_rollout(
                    {"q": i}, config=RolloutConfig(max_attempts=1), metadata={"task_id": "t1", "train_step": 1}
                )
                claimed = await store.claim_rollout("w-1")
                assert claimed is not None
                rid, aid = rollout.rollout_id, claimed.attempt.attempt_id
                await store.update_attempt(rid, aid, A.RUNNING)
                # two calls; the second's prompt extends the first's prompt + response (+ a tool token, 9)
                await store.add_span(_call_span(rid, aid, f"00000000000000a{i}", [1, 2, 3], [4, 5]))
                await store.add_span(_call_span(rid, aid, f"00000000000000b{i}", [1, 2, 3, 4, 5, 9], [6]))
                await store.update_attempt(rid, aid, A.SUCCEEDED, final_reward=reward)
                ids.append(rid)
                attempts.append(aid)

            def merged(step: int, index: int, i: int, **values: object) -> TrainedSample:
                calls = [
                    TrainedCall(span_id=f"00000000000000a{i}", response_start=3, response_end=5, reward=0.9 * i),
                    TrainedCall(span_id=f"00000000000000b{i}", response_start=6, response_end=7, reward=1.0),
                ]
                return TrainedSample.model_validate(
                    {
                        "train_step": step,
                        "sample_index": index,
                        "rollout_id": ids[i],
                        "attempt_id": attempts[i],
                        "calls": calls,
                        "loss_mask_ranges": [(3, 5), (6, 7)],
                        "advantage": 0.375,
                        "advantage_estimator": "rloo",
                        "credit_assignment": "discounted",
                        **values,
                    }
                )

            await store.put_trained_samples(1, [merged(1, 0, 0)])  # rollout 1 of step 1: not in the batch
            gae = merged(2, 0, 2, advantage=0.0, token_advantages=[0.5, 0.25, -0.125], token_returns=[1.0] * 3)
            await store.put_trained_samples(2, [gae])

            async with serve_in_background(create_app(store)) as url, httpx.AsyncClient(base_url=url) as client:
                first = (await client.get(f"/v1/rollouts/{ids[0]}/transitions")).json()
                assert [t["advantage"] for t in first] == [0.375, 0.375]  # as recorded, not GRPO's 0.7071
                assert [t["reward"] for t in first] == [0.0, 1.0]  # the credited rewards (0.9 * 0, 1.0)
                for t in first:
                    assert t["advantage_source"] == "trained" and t["train_step"] == 1 and t["trained"] is True
                    assert (t["advantage_estimator"], t["credit_assignment"]) == ("rloo", "discounted")
                    assert t["sample_index"] == 0 and t["sample_span_ids"] == ["00000000000000a0", "00000000000000b0"]
                assert [r["loss_mask"] for r in first[0]["response"]] == [1, 1]
                assert [r["advantage"] for r in first[1]["response"]] == [0.375]

                second = (await client.get(f"/v1/rollouts/{ids[1]}/transitions")).json()
                assert [(t["advantage_source"], t["train_step"], t["trained"]) for t in second] == [
                    ("trained", 1, False)
                ] * 2
                assert all(t["advantage"] is None and t["sample_index"] is None for t in second)
                assert all(r["loss_mask"] == 0 for t in second for r in t["response"])

                third = (await client.get(f"/v1/rollouts/{ids[2]}/transitions")).json()
                assert [t["advantage"] for t in third] == [None, None]  # gae: per token
                assert [[r["advantage"] for r in t["response"]] for t in third] == [[0.5, 0.25], [-0.125]]
                assert third[0]["train_step"] == 2
        finally:
            await store.close()

    asyncio.run(main())
