"""``agentbolt demo`` end to end with SmolLM2-135M: server, runner processes, gateway, GRPO step, outputs.

SmolLM2 cannot do arithmetic, so rewards are expected to be 0; what is checked is the plumbing: every output file,
every summary number computed by the run, and rollouts in the store with their spans and exact token ids.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from agentbolt import semconv
from agentbolt.config import GRPOConfig
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import RolloutMode, RolloutStatus

pytestmark = pytest.mark.slow


def test_demo_one_step_with_smollm2(tmp_path: Path, smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from agentbolt.trainer.job import run_training
    from agentbolt.trainer.job_config import TrainConfig

    monkeypatch.setenv("AGENTBOLT_CACHE", str(smollm2_dir.parent.parent))  # reuse the converted model
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the demo imports examples/ from the repo root
    out = tmp_path / "demo"
    config = TrainConfig(
        out_dir=out,
        model="smollm2-135m",
        grpo=GRPOConfig(steps=1, tasks_per_step=2, group_size=2, max_tokens=48),
        val_size=1,
        runner_processes=1,
        runner_concurrency=4,
        report_to=("tensorboard",),
    )
    summary = asyncio.run(run_training(config))

    assert (out / "reward_curve.png").stat().st_size > 10_000
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["steps"] == 1 and len(on_disk["train_reward"]) == 1
    assert set(on_disk["val_accuracy_before"]) == {"rg_basic_arithmetic", "rg_chain_sum", "calc_x", "gsm_hard"}
    assert set(on_disk["val_accuracy_after"]) == set(on_disk["val_accuracy_before"])
    assert on_disk["n_rollouts"] == 4 + 4 + 2 * 2  # val before + val after + one step of 2 tasks x 2
    assert on_disk["n_transitions"] >= 4 and on_disk["wall_seconds"] > 0
    assert on_disk == json.loads(json.dumps(summary))
    assert all(math.isfinite(x) for x in on_disk["train_reward"])
    assert [c["step"] for c in on_disk["checkpoints"]] == [1]
    assert on_disk["checkpoints"][0]["val_accuracy"] == on_disk["val_accuracy_after"]
    # the runner's own peak memory (no torch in it), not the trainer's size it was forked from
    (runner_mb,) = on_disk["peak_rss"]["runners_mb"].values()
    assert 20 < runner_mb < 1024 < on_disk["peak_rss"]["trainer_and_server_mb"], on_disk["peak_rss"]

    # the same metrics reach TensorBoard, read back with its own reader
    events = EventAccumulator(str(out / "tensorboard" / "demo"))
    events.Reload()
    reward = events.Scalars("train_reward_mean")
    assert [(e.step, e.value) for e in reward] == [(1, pytest.approx(on_disk["train_reward"][0]))]
    assert {"val_accuracy/calc_x", "update_s"} <= set(events.Tags()["scalars"])

    async def check_store() -> None:
        store = SqliteLightningStore(out / "store.db")
        try:
            rollouts = await store.query_rollouts()
            assert len(rollouts) == on_disk["n_rollouts"]
            assert all(r.status is RolloutStatus.SUCCEEDED for r in rollouts)
            train = [r for r in rollouts if r.mode is RolloutMode.TRAIN]
            assert len(train) == 4
            # step 1's rollouts are queued alongside the evaluation before training, right after its own
            before = [r for r in rollouts if r.metadata.get("eval") == "before"]
            assert len(before) == 4
            assert max(r.enqueue_time for r in before) <= min(r.enqueue_time for r in train)
            assert min(r.enqueue_time for r in train) < max(r.end_time or 0.0 for r in before)
            spans = await store.query_spans(train[0].rollout_id)
            llm = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
            assert llm, "the train rollout recorded no LLM call"
            ids = llm[0].attributes[semconv.LLM_RESPONSE_TOKEN_IDS]
            assert ids and all(isinstance(i, int) for i in ids)
            assert len(llm[0].attributes[semconv.LLM_RESPONSE_LOGPROBS]) == len(ids)
            assert llm[0].attributes[semconv.LLM_PROMPT_TOKEN_IDS]
            rewards = [s for s in spans if s.name == semconv.SPAN_REWARD]
            assert {s.attributes.get(semconv.REWARD_NAME) for s in rewards} >= {"correct", None}
            versions = await store.query_resources()
            assert [v.metadata["purpose"] for v in versions] == ["run", "before", "train", "checkpoint", "after"]
            assert versions[-1].metadata["model_version"] == "step-1"
            assert (
                versions[-1].metadata["checkpoint"]
                == versions[3].metadata["checkpoint"]
                == on_disk["checkpoints"][0]["path"]
            )
            assert {m.name for m in await store.query_metrics()} >= {"train_reward_mean", "update_s"}
        finally:
            await store.close()

    asyncio.run(check_store())
